"""The first run's compilation: `dslide warm`, and a heartbeat while numba compiles.

numba compiles each kernel on its first call and keeps it on disk (`cache=True`,
beside the source in __pycache__ or under NUMBA_CACHE_DIR, keyed by the source
file: dslide._numba_cache). On a fresh install, or after the code changed, the
first run therefore spends minutes compiling, and a `dslide train` prints
nothing meanwhile; under `mpiexec -n P` every rank compiles the same kernels
at once, P times the CPU.

`dslide warm` compiles them once, in one process, before anything else: it
runs the pipeline of scripts/demo.sh (generate, write and read a data file,
train with an LSH output and the neighbours' labels, evaluate, predict) on a
few thousand generated points in a temporary directory, then the exact
neighbour search over a feature every point holds (which those points lack),
with a progress line per stage. Later runs load every kernel from the cache.

`heartbeat()` prints a line at least every `every` seconds while numba is
compiling (numba's "numba:compile" event, fired only on a cache miss), naming
the kernel: the dslide command runs under it on rank 0 (dslide.cli.warm.notice),
so a first run that was not warmed is not silent either.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

#: the packages whose kernels `warm` reports
PACKAGES = ("dslide",)
_active = False  # a heartbeat is running in this process


def _say(out, text: str) -> None:
    print(text, file=out, flush=True)


@contextlib.contextmanager
def heartbeat(out=None, every: float = 6.0, prefix: str = "[dslide]", always: bool = False):
    """While the block runs, print to `out` (default stderr) a line every `every` seconds
    (6: well within the 10 s a terminal may stay silent) for as long as numba keeps compiling,
    naming the kernel it compiles and the seconds compiled so far. Nothing is printed while
    nothing compiles, nor for a compile within `every` seconds of the last line; with `always`
    (`dslide warm`, whose stages print nothing of their own) a line also while nothing compiles."""
    global _active
    if _active:  # one heartbeat at a time (`dslide warm` runs dslide commands under its own)
        yield
        return
    from numba.core import event as ev

    out = sys.stderr if out is None else out
    # said: when the last line was printed (or the block began): a line is due `every` seconds
    # later if numba is compiling then, or was within the last second
    state = {"depth": 0, "name": "", "idle_since": None, "said": time.monotonic(), "total": 0.0,
             "started": None}
    lock = threading.Lock()

    class Listener(ev.Listener):
        def on_start(self, event):
            now = time.monotonic()
            d = (event.data or {}).get("dispatcher")
            name = getattr(getattr(d, "py_func", None), "__module__", "?") + "." + \
                getattr(getattr(d, "py_func", None), "__qualname__", "?") if d is not None else "?"
            with lock:
                if state["depth"] == 0:
                    state["started"] = now
                    state["name"] = name  # the outermost kernel, not numba's helpers it compiles
                state["depth"] += 1

        def on_end(self, event):
            now = time.monotonic()
            with lock:
                state["depth"] -= 1
                if state["depth"] == 0:
                    state["total"] += now - state["started"]
                    state["idle_since"] = now

    stop = threading.Event()

    def beat():
        while not stop.wait(min(1.0, every / 4)):
            now = time.monotonic()
            with lock:
                if state["started"] is None:
                    if always and now - state["said"] >= every:
                        state["said"] = now
                        _say(out, f"{prefix} still working")
                    continue
                busy = state["depth"] > 0 or now - state["idle_since"] <= 1.0
                if always and not busy and now - state["said"] >= every:
                    state["said"] = now
                    _say(out, f"{prefix} still working ({state['total']:.0f}s of compiling so far)")
                    continue
                if not busy or now - state["said"] < every:
                    continue
                state["said"] = now
                total = state["total"] + (now - state["started"] if state["depth"] > 0 else 0.0)
                name = state["name"]
            _say(out, f"{prefix} compiling numba kernels (once after an install or a code change; "
                      f"{total:.0f}s so far): {name}")

    listener = Listener()
    ev.register("numba:compile", listener)
    thread = threading.Thread(target=beat, name="dslide-heartbeat", daemon=True)
    thread.start()
    _active = True
    try:
        yield
    finally:
        _active = False
        stop.set()
        thread.join()
        ev.unregister("numba:compile", listener)


@dataclass(frozen=True)
class Kernel:
    """One cached kernel after `warm`: its name (module.qualname), the signatures
    compiled in this process and those loaded from the disk cache."""

    name: str
    compiled: int
    loaded: int


def kernels() -> dict[str, object]:
    """Every numba dispatcher defined in the loaded modules of PACKAGES, by module.qualname."""
    from numba.core.registry import CPUDispatcher

    found = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or not any(mod_name == p or mod_name.startswith(p + ".") for p in PACKAGES):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ == mod_name:
                found[f"{mod_name}.{value.py_func.__qualname__}"] = value
    return found


def _counts(d) -> tuple[int, int]:
    stats = d.stats
    return sum(stats.cache_misses.values()), sum(stats.cache_hits.values())


def _stages(tmp: Path, run_command):
    """(what, function) of the demo's pipeline on a small generated data set in `tmp`: the
    kinds of data, layers and inference the demo uses (an LSH output, the neighbours' labels
    chosen by training, the inference index), in a few seconds once compiled. run_command:
    the dslide command's entry point (dslide.cli.main: argv -> exit status)."""
    prefix = tmp / "warm"
    train, test = f"{prefix}_train.txt", f"{prefix}_test.txt"
    run = tmp / "run"

    def generate():
        from dslide.datasets import synthetic

        # more than NARROW_OUTPUT labels and few points per label: the neighbours' labels are on,
        # as in the demo's `small`; `kinds` makes the output LSH below auto_lsh_min_width
        pair = synthetic.generate_split("tiny", 3000, 300, seed=0, n_labels=5000, n_features=2000)
        synthetic.write(str(prefix), *pair)

    def command(*argv):
        return lambda: run_command(list(argv))

    def bounded_search():
        # the exact search's bounds take lists of at least fusion.bound_list(n) points, which the
        # small set's have not: a store whose feature 0 every point holds
        import numpy as np
        import scipy.sparse as sp

        from dslide.infer import fusion

        n = fusion.BOUND_MIN_LIST + 64
        rng = np.random.default_rng(0)
        X = sp.random(n, 50, density=0.1, format="lil", random_state=rng, dtype=np.float32)
        X[:, 0] = 0.1
        store = fusion.NeighbourLabels.build(sp.csr_matrix(X), sp.csr_matrix((n, 2), dtype=np.float32))
        store.neighbours(sp.csr_matrix(X[:8]), 3)

    def hidden_votes():
        # whether training keeps the hidden neighbours depends on its validation figures: their
        # kernels on a store of four points, both ways
        import numpy as np
        import scipy.sparse as sp

        from dslide.infer.hidden_knn import HiddenNeighbours

        H = np.eye(4, 3, dtype=np.float32)
        Y = sp.csr_matrix(np.eye(4, 2, dtype=np.float32))
        store = HiddenNeighbours.build(H, Y)
        nn_ids, nn_sims = store.search(H[:2], 2)
        store.search(H[:2], 2, probes=1)  # --lsh's cells
        b_ids, b_p = np.array([[0, 1], [1, -1]], np.int64), np.array([[0.6, 0.4], [1.0, 0.0]])
        store.fuse(b_ids, b_p, nn_ids, nn_sims, 4.0, 0.1, 2)
        store.grid_hits(b_ids, b_p, nn_ids, nn_sims, 4.0, [0.1], Y[:2], 2)

    # lsh.index_min_width=0: an index over these 5,000 labels, for the kernels a wider output's takes
    sets = ["--set", "kinds=dense,lsh", "--set", "epochs=1", "--set", "eval_every=10", "--set", "log_every=10",
            "--set", "lsh.index_min_width=0"]
    return [
        ("generating and writing a data set", generate),
        ("reading it (the parser, the binary cache)", command("data", "stats", train)),
        ("training: the step's kernels, candidate tables, inference index, neighbours' labels",
         command("train", "--train", train, "--test", test, "--out", str(run), "--quiet", *sets)),
        ("evaluating, exact and through the index", command("eval", "--model", str(run), "--data", test, "--lsh",
                                                            "--quiet", "--out", str(tmp / "eval.json"))),
        ("predicting", command("predict", "--model", str(run), "--data", test, "--k", "5", "--quiet",
                               "--out", str(tmp / "pred.txt"))),
        ("the exact neighbour search over common features", bounded_search),
        ("the hidden neighbours' votes", hidden_votes),
    ]


def warm(out=None, verbose: bool = False, *, run_command) -> list[Kernel]:
    """Compile (or load from numba's cache) the kernels of the demo's pipeline, with a line
    per stage on `out` (default stdout) and a heartbeat while compiling. Returns every
    dslide kernel used, with the signatures compiled and loaded. run_command: the dslide
    command's entry point, dslide.cli.main (whose `dslide warm`, dslide.cli.warm, calls this)."""
    import io

    out = sys.stdout if out is None else out
    t0 = time.perf_counter()
    _say(out, "[dslide warm] compiling dslide's kernels, or loading them from numba's cache "
              "(minutes once after an install or a code change, seconds afterwards)")
    with tempfile.TemporaryDirectory(prefix="dslide-warm-") as tmp, heartbeat(out, prefix="[dslide warm]", always=True):
        for what, run in _stages(Path(tmp), run_command):
            t = time.perf_counter()
            _say(out, f"[dslide warm] {what} ...")
            captured = io.StringIO()  # the commands' own figures are not the point here
            with contextlib.redirect_stdout(captured):
                code = run()
            if code not in (None, 0):
                raise RuntimeError(f"dslide warm: {what} ended with status {code}: {captured.getvalue()[-500:]}")
            _say(out, f"[dslide warm] {what}: {time.perf_counter() - t:.1f}s")
    report = []
    for name, d in sorted(kernels().items()):
        compiled, loaded = _counts(d)
        if compiled or loaded:
            report.append(Kernel(name, compiled, loaded))
    n_compiled = sum(1 for k in report if k.compiled)
    if verbose:
        for k in report:
            _say(out, f"  {k.name}: {k.compiled} compiled, {k.loaded} loaded")
    _say(out, f"[dslide warm] {len(report)} kernels ready in {time.perf_counter() - t0:.1f}s "
              f"({n_compiled} compiled now, {len(report) - n_compiled} loaded from the cache)")
    return report

