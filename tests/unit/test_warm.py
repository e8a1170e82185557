"""`dslide warm` compiles (or loads) the kernels of the demo's pipeline and says so as it goes;
the heartbeat prints while numba compiles, and only then."""

import io
import re
import time
from types import SimpleNamespace

from numba.core import event as ev

from dslide import cli, warm

# kernels every demo run calls: the parser, the step, the candidate tables, the inference
# index and the neighbours' labels
DEMO_KERNELS = ("dslide.io.xmc_parse._parse_body", "dslide.model.kernels.csr_times_rows", "dslide.model.kernels.rows_grad_adam",
                "dslide.model.kernels.adam_dense", "dslide.lsh.anchors.top_rows", "dslide.lsh.rerank.topk_by_anchor",
                "dslide.lsh.neighbors.beam_search", "dslide.infer.fusion.search", "dslide.infer.fusion.fuse",
                "dslide.datasets.synthetic._draw_points", "dslide.lsh.kmeans.kmeanspp_seed",
                "dslide.lsh.neighbors.cell_rows", "dslide.lsh.neighbors.add_reverse",
                "dslide.infer.fusion.search_bounded", "dslide.infer.hidden_knn.fuse",
                "dslide.infer.hidden_knn.grid_hits", "dslide.infer.hidden_knn.push_rows")


def _compile(name, seconds):
    """What numba signals around compiling a kernel named `name`, for `seconds`."""
    def kernel():
        pass

    kernel.__qualname__ = name
    with ev.trigger_event("numba:compile", data={"dispatcher": SimpleNamespace(py_func=kernel)}):
        time.sleep(seconds)


def test_the_heartbeat_prints_while_numba_compiles_and_names_the_kernel():
    out = io.StringIO()
    with warm.heartbeat(out, every=0.3, prefix="[hb]"):
        _compile("slow_kernel", 1.5)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3, lines
    assert all(line.startswith("[hb] compiling numba kernels") and line.endswith("slow_kernel") for line in lines)


def test_the_heartbeat_is_silent_when_nothing_compiles_or_a_compile_is_short():
    out = io.StringIO()
    with warm.heartbeat(out, every=0.5):
        time.sleep(1.2)
    with warm.heartbeat(out, every=1.0):
        _compile("quick_kernel", 0.1)
    assert out.getvalue() == ""


def test_the_heartbeat_of_warm_also_beats_while_nothing_compiles():
    """`dslide warm`'s stages print nothing of their own: on a loaded machine a stage that
    only runs (its kernels cached) must not leave the terminal silent either."""
    out = io.StringIO()
    with warm.heartbeat(out, every=0.3, prefix="[hb]", always=True):
        time.sleep(1.0)
        _compile("k", 0.05)
        time.sleep(1.0)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 5, lines  # a line every 0.3 s of the 2 s, compiling or not
    assert all(line.startswith(("[hb] still working", "[hb] compiling numba kernels")) for line in lines), lines
    assert lines[0] == "[hb] still working", lines


def test_warm_loads_or_compiles_the_kernels_it_names_and_prints_each_stage():
    out = io.StringIO()
    report = warm.warm(out, verbose=True, run_command=cli.main)
    text = out.getvalue()
    stages = re.findall(r"^\[dslide warm\] (.+) \.\.\.$", text, re.M)
    assert len(stages) == 7, text
    for stage in stages:  # each stage's line when it starts and when it ends
        assert re.search(rf"^\[dslide warm\] {re.escape(stage)}: [0-9.]+s$", text, re.M), stage
    named = {k.name: k for k in report}
    assert set(DEMO_KERNELS) <= set(named), sorted(set(DEMO_KERNELS) - set(named))
    dispatchers = warm.kernels()
    for k in report:
        assert k.compiled + k.loaded >= 1, k
        assert dispatchers[k.name].signatures, k  # compiled or loaded: callable without compiling
        assert f"  {k.name}: {k.compiled} compiled, {k.loaded} loaded" in text
    n_compiled = sum(1 for k in report if k.compiled)
    assert re.search(rf"^\[dslide warm\] {len(report)} kernels ready in [0-9.]+s \({n_compiled} compiled now, "
                     rf"{len(report) - n_compiled} loaded from the cache\)$", text, re.M), text
