"""The data-shape suite: dslide's defaults against the tree libraries on every member, one after another.

    python -m scripts.bench --suite shapes                       (every member; about 40 minutes)
    python -m scripts.bench --suite shapes --members baskets-tail,bibtex --systems dslide,omikuji3
    python -m scripts.bench --suite shapes --variant wide='{"hidden": [256]}'   (a lever beside the defaults)

Members are the synthetic generators' suite presets (`dslide.datasets.suite.MEMBERS`:
structurally different families, each head-heavy and long-tailed, at 670,091 and
about 40,000 labels) plus BibTeX from ../shared/data when present. Every system
reads the same files (written once under runs/bench_data/) and is scored by one
evaluator (`dslide.metrics.evaluate`; PSP@k with propensities from the training
labels, A = 0.55, B = 1.5): dslide with its defaults at 2 ranks x 1 thread,
omikuji (Parabel) with 3 and 1 trees and napkinXC (PLT) at 2 threads with theirs.
`--variant NAME=JSON` adds a dslide row per member with those settings on top of
the defaults, so that a candidate default is judged on every member in the same
run as the defaults it would replace. Where dslide's output layer is LSH-sparse,
its `--lsh` inference is compared with exact scoring on the same model (recall of
the exact top-10, P@5 lost).

The table has one row per member and system; the last line names dslide's worst
member against omikuji (3 trees) on P@1. The section is recorded in
docs/benchmarks.md (`measure.record`) and the rows kept as JSON in
runs/bench_shapes.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from .. import _bench as B
from .. import measure as M
from . import common as C
from .common import fmt

#: dslide-net: dslide's defaults with the neighbours' labels off (knn 0), the network alone
SYSTEMS = ("dslide", "dslide-net", "pecos", "omikuji3", "omikuji1", "napkinxc")
LIBRARIES = ("pecos", "omikuji3", "omikuji1", "napkinxc")
#: --suite real: every real set of ../shared/data present, these systems unless --systems says otherwise
REAL_SYSTEMS = ("dslide", "dslide-net", "pecos", "omikuji3")
THREADS = 2
#: real sets, read from ../shared/data (NAME_train.txt / NAME_test.txt); skipped with a line where absent
REAL = ("bibtex", "debian_depends", "wordnet_hypernyms", "debian_tags", "delicious")


def members(real_only: bool = False) -> list[str]:
    from dslide.datasets import suite

    return list(REAL) if real_only else list(suite.MEMBERS) + list(REAL)


def real_files(name: str) -> tuple[Path, Path] | None:
    """A real set's training and test files in ../shared/data, None when absent."""
    paths = M.SHARED_DATA / f"{name}_train.txt", M.SHARED_DATA / f"{name}_test.txt"
    return paths if all(p.exists() for p in paths) else None


def cached_files(stem: str, make) -> tuple[Path, Path]:
    """runs/bench_data/STEM_train.txt and STEM_test.txt, written from make() -> (train, test) XMCData
    when either is missing, else left as they are (make is not called)."""
    from dslide.io.data import write_xmc

    d = M.ROOT / "runs" / "bench_data"
    paths = d / f"{stem}_train.txt", d / f"{stem}_test.txt"
    if not all(p.exists() for p in paths):
        d.mkdir(parents=True, exist_ok=True)
        for path, data in zip(paths, make()):
            write_xmc(path, data.X, data.Y)  # written under a temporary name, then renamed
    return paths


def member_files(name: str, n_train: int | None, n_test: int | None, seed: int = 0) -> tuple[Path, Path] | None:
    """The member's XMC text files (generated once under runs/bench_data/); None if a real set is absent."""
    if name in REAL:
        return real_files(name)
    from dslide.datasets import suite

    return cached_files(f"{name}-{n_train or 'default'}-{n_test or 'default'}-s{seed}",
                        lambda: suite.generate_member(name, n_train, n_test, seed))


def dslide_row(name: str, paths, config: dict, lsh_inference: bool) -> dict:
    case = {"name": name, "ranks": 2, "threads": 1, "data": {"train": str(paths[0]), "test": str(paths[1])},
            "config": {"eval_every": 0, **config}, "inference": lsh_inference}
    r = B.run_case(case)
    if "error" in r:
        return {"system": name, "error": r["error"]}
    row = {"system": name, "train_s": r["train_s"], "index_s": r.get("index_s"), "p@1": r["p@1"], "p@5": r["p@5"],
           "psp@5": r.get("psp@5"),
           "predict_s": r["predict_s"], "samples_per_s": r["samples_per_s"], "bytes_per_step": r["bytes_per_step"],
           "peak_rss_mb": r["peak_rss_mb"], "kinds": r["kinds"], "epochs": r["epochs"],
           "hidden": r.get("hidden_choice"), "hidden_s": r.get("hidden_s") or 0.0}
    inf = r.get("inference") or []
    exact = next((x for x in inf if x["method"].startswith("exact")), None)
    lsh = next((x for x in inf if x["method"].startswith("--lsh")), None)
    if exact and lsh:
        row["lsh"] = {"recall@10": lsh["recall@10"], "p@5_lost": exact["p@5"] - lsh["p@5"],
                      "speedup": exact["seconds"] / max(lsh["seconds"], 1e-9)}
    return row


def tree_row(system: str, paths, workdir: Path, timeout: float | None = None) -> dict:
    from .. import bench_trees as TR
    from dslide.io.data import read_xmc
    from dslide.metrics import inverse_propensity

    lib, trees = ("omikuji", int(system[-1])) if system.startswith("omikuji") else (system, 1)
    train, test = read_xmc(paths[0]), read_xmc(paths[1])
    try:
        r = TR.run_tree(lib, paths[0], paths[1], n_test=test.n_points, n_labels=test.n_labels, threads=THREADS,
                        trees=trees, workdir=workdir, timeout=timeout)
    except (RuntimeError, ValueError, OSError) as e:
        return {"system": system, "error": str(e).splitlines()[0]}
    if not r["available"]:
        return {"system": system, "error": r["reason"]}
    m = TR.score(r["topk"], test.Y, inverse_propensity(train.Y))
    return {"system": system, "train_s": r["train_s"], "predict_s": r["predict_s"], "p@1": m["p@1"], "p@5": m["p@5"],
            "psp@5": m["psp@5"],
            "peak_rss_mb": r["peak_rss_mb"], "version": r["version"]}


def output_is_lsh(paths) -> bool:
    """Whether dslide's defaults make this member's output layer LSH-sparse (then --lsh is compared)."""
    from dslide.config import Config
    from dslide.io.data import read_xmc

    n_labels = read_xmc(paths[1]).n_labels
    cfg = Config().resolve(n_labels)
    return cfg.layer_kind(len(cfg.hidden), n_labels) == "lsh"


def shape_of(paths) -> str:
    from dslide.io.data import read_xmc

    tr, te = read_xmc(paths[0]), read_xmc(paths[1])
    return f"{tr.n_points:,} / {te.n_points:,} points, {tr.n_features:,} features, {tr.n_labels:,} labels"


def train_cell(r: dict) -> str:
    """'train s' of a row: the median of its rounds with their range where there were several."""
    runs = r.get("train_s_runs")
    if not runs or len(runs) < 2:
        return fmt(r.get("train_s"), ".1f")
    return f"{r['train_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def merge_rounds(runs: list[dict]) -> tuple[dict, list[str]]:
    """One system's rows on one member from its rounds (`--repeat`), in the order they ran: the
    first round's row with each time (train_s, predict_s, index_s) the median of the rounds, and
    the rounds' training times as train_s_runs; (row, notes). The first failed round's row where
    one failed. A P@k that moved between rounds (a library's threads may change its sums) is noted."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0], []
    row = dict(runs[0])
    if len(runs) == 1:
        return row, []
    for key in ("train_s", "predict_s", "index_s"):
        vals = [r.get(key) for r in runs]
        if all(v is not None for v in vals):
            row[key] = float(np.median(vals))
    row["train_s_runs"] = [float(r["train_s"]) for r in runs]
    notes = []
    for key in ("p@1", "p@5", "psp@5"):
        vals = [r.get(key) for r in runs]
        if all(v is not None and v == v for v in vals) and max(vals) != min(vals):  # NaN: not reported
            notes.append(f"{key} moved between rounds: {min(vals):.4f} to {max(vals):.4f} (the first round's shown)")
    return row, notes


def time_line(rows: list[dict], system: str = "dslide") -> str:
    """`system`'s training time against the best library's (by P@1) on each member: the ratio of
    the medians and, with several rounds, the range of the rounds' own ratios (each round runs
    every system one after another, so a round's two times share the machine's state)."""
    ref = best_library(rows)
    parts = []
    for r in rows:
        o = ref.get(r["member"])
        if r["system"] != system or o is None or not r.get("train_s") or not o.get("train_s"):
            continue
        text = f"{r['member']} {r['train_s'] / o['train_s']:.2f}x {o['system']}"
        mine, theirs = r.get("train_s_runs") or [], o.get("train_s_runs") or []
        if len(mine) > 1 and len(mine) == len(theirs):
            ratios = [a / b for a, b in zip(mine, theirs)]
            text += f" (rounds {min(ratios):.2f}x-{max(ratios):.2f}x)"
        parts.append(text)
    if not parts:
        return f"{system}'s training time against the best library's: not measured"
    return f"{system}'s training time against the best library's: " + ", ".join(parts)


def suite_table(rows: list[dict]) -> str:
    cols = [("member", "member"), ("shape", "shape"), ("system", "system"),
            ("train s", train_cell),
            ("+ index s", lambda r: fmt(r.get("index_s"), ".1f")),
            ("predict s", lambda r: fmt(r.get("predict_s"), ".1f")),
            ("P@1", lambda r: fmt(r.get("p@1"))),
            ("P@5", lambda r: fmt(r.get("p@5"))), ("PSP@5", lambda r: fmt(r.get("psp@5"))),
            ("vs best library: P@1 / P@5 points", "gap"),
            ("samples/s", lambda r: fmt(r.get("samples_per_s"), ",.0f")),
            ("bytes/step/rank", lambda r: fmt(r.get("bytes_per_step"), ",.0f")),
            ("--lsh: recall@10 / P@5 lost", lambda r: (f"{r['lsh']['recall@10']:.3f} / {100 * r['lsh']['p@5_lost']:+.2f}"
                                                       if r.get("lsh") else "-")),
            ("peak MB/rank", lambda r: fmt(r.get("peak_rss_mb"), ",.0f"))]
    return M.table(rows, cols)


def best_library(rows: list[dict]) -> dict:
    """Per member, the library row of highest P@1."""
    ref = {}
    for r in rows:
        if r["system"] in LIBRARIES and "p@1" in r and (r["member"] not in ref or r["p@1"] > ref[r["member"]]["p@1"]):
            ref[r["member"]] = r
    return ref


def add_gaps(rows: list[dict]) -> None:
    """Each row's P@1 / P@5 difference to the best library (by P@1) on its member, in points."""
    ref = best_library(rows)
    for r in rows:
        o = ref.get(r["member"])
        r["gap"] = (f"{100 * (r['p@1'] - o['p@1']):+.1f} / {100 * (r['p@5'] - o['p@5']):+.1f}"
                    if o is not None and "p@1" in r and r is not o else "-")


def worst_line(rows: list[dict], system: str = "dslide", real: bool | None = None) -> str:
    """dslide's worst member against the best library there (by P@1); real: only real (True) or
    synthetic (False) members, None for all."""
    ref = best_library(rows)
    kind = {True: "real ", False: "synthetic ", None: ""}[real]
    gaps = [(r["p@1"] - ref[r["member"]]["p@1"], r) for r in rows
            if r["system"] == system and "p@1" in r and r["member"] in ref
            and (real is None or (r["member"] in REAL) == real)]
    if not gaps:
        return f"{system}'s worst {kind}member against the best library: not measured (no member has both rows)"
    g, r = min(gaps, key=lambda t: t[0])
    o = ref[r["member"]]
    return (f"{system}'s worst {kind}member against the best library: {r['member']}, P@1 {r['p@1']:.4f} against "
            f"{o['system']}'s {o['p@1']:.4f} ({100 * g:+.1f} points), P@5 {100 * (r['p@5'] - o['p@5']):+.1f} "
            f"points, training {r['train_s']:.1f} s against {o['train_s']:.1f} s")


def tables(rows: list[dict]) -> str:
    """The real members' table, then the synthetic members' (each only if it has rows), each
    followed by dslide's worst member against the best library."""
    out = []
    for real, title in ((True, "Real members"), (False, "Synthetic members (speed, memory and scale only)")):
        part = [r for r in rows if (r["member"] in REAL) == real]
        if part:
            out.append(f"{title}:\n\n" + suite_table(part) + "\n\n" + worst_line(rows, real=real) + "\n"
                       + worst_line(rows, "dslide-net", real=real) + "\n" + time_line(part) + "\n")
    return "\n".join(out)


def parse_variants(items: list[str]) -> dict[str, dict]:
    out = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variant {item!r}: expected NAME=JSON, e.g. wide='{{\"hidden\": [256]}}'")
        try:
            cfg = json.loads(text)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--variant {item!r}: {text!r} is not JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise SystemExit(f"--variant {item!r}: the settings must be a JSON object")
        out[name] = cfg
    return out


def variant_args(variants: dict[str, dict]) -> str:
    """The `--variant` arguments of a recorded command line (what `parse_variants` read)."""
    return "".join(f" --variant {n}='{json.dumps(c)}'" for n, c in variants.items())


def run(a) -> int:
    t0 = time.time()
    real_only = a.suite == "real"
    names = members(real_only) if not a.members else [m.strip() for m in a.members.split(",") if m.strip()]
    valid = members(real_only)
    bad = [m for m in names if m not in valid]
    if bad:
        raise SystemExit(f"--members: unknown {', '.join(bad)}; valid: {', '.join(valid)}")
    default_systems = REAL_SYSTEMS if real_only else SYSTEMS
    systems = default_systems if not a.systems else tuple(s.strip() for s in a.systems.split(","))
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        raise SystemExit(f"--systems: unknown {', '.join(bad)}; valid: {', '.join(SYSTEMS)}")
    variants = parse_variants(a.variant)
    rows, notes = [], []
    suite_name = "real" if real_only else "shapes"
    out_json = M.ROOT / "runs" / f"bench_{suite_name}{('_' + a.tag) if a.tag else ''}.json"
    out_json.parent.mkdir(exist_ok=True)
    C.warm_kernels(notes)
    for name in names:
        paths = member_files(name, a.points, a.test_points)
        if paths is None:
            notes.append(f"{name}: its files are not in ../shared/data, skipped")
            print(f"skipped: {name}: its files are not in ../shared/data", file=sys.stderr, flush=True)
            continue
        shape = shape_of(paths)
        lsh_out = output_is_lsh(paths)
        work = M.ROOT / "runs" / "bench_shapes" / name
        todo = [(s, None) for s in systems] + [(f"dslide {v}", cfg) for v, cfg in variants.items()]
        runs = {system: [] for system, _ in todo}
        for round_ in range(a.repeat):  # each round runs every system, one after another
            for system, cfg in todo:
                of = f" (round {round_ + 1} of {a.repeat})" if a.repeat > 1 else ""
                print(f"running: {name}: {system}{of} ...", file=sys.stderr, flush=True)
                if system in ("dslide", "dslide-net") or cfg is not None:
                    cfg = {"knn": 0} if system == "dslide-net" else cfg
                    runs[system].append(dslide_row(system, paths, cfg or {}, lsh_inference=lsh_out and not a.no_lsh))
                else:
                    runs[system].append(tree_row(system, paths, work / system))
        for system, _ in todo:
            r, moved = merge_rounds(runs[system])
            notes.extend(f"{name}: {system}: {m}" for m in moved)
            if C.keep_row(r, name, system, shape, rows, notes, out_json) and "hidden" in r:
                notes.append(f"{name}: {system}: hidden neighbours {r['hidden'] or 'off'} (chosen in "
                             f"{r['hidden_s']:.1f} s, counted in its train s)")
    add_gaps(rows)
    cmd = M.command("bench", [f"--suite {suite_name}"]) + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in (("members", a.members), ("systems", a.systems),
                                                      ("points", a.points), ("test_points", a.test_points)) if v)
    cmd += variant_args(variants) + (" --no-lsh" if a.no_lsh else "") + (f" --repeat {a.repeat}" if a.repeat > 1 else "")
    text = (f"command: `{cmd}`\n\nmachine: {M.machine()}\n\ncode: {M.code_version()}\n\n"
            f"every system on {THREADS} cores (dslide 2 ranks x 1 thread) with its own defaults, one after "
            f"another; P@k and PSP@5 on all test points by dslide.metrics (propensities from the training "
            f"labels, A 0.55, B 1.5); 'train s' leaves out reading the data, compiling and predicting; "
            f"'+ index s': dslide's inference index for --lsh, built after training"
            + (f"; {a.repeat} rounds, each running every system one after another: the times are the "
               f"rounds' medians, 'train s' with their range, P@k the first round's" if a.repeat > 1 else "")
            + "\n\n"
            + tables(rows))
    kinds = sorted({r["member"] in REAL for r in rows}, reverse=True)  # real first, as the tables
    for v in variants:
        text += "".join(worst_line(rows, f"dslide {v}", real=real) + "\n" for real in kinds)
    return C.finish(a, f"bench.py --suite {suite_name}", text, notes, t0)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--members", default="", help="comma-separated suite members (default: all)")
    p.add_argument("--systems", default="", help=f"comma-separated, from {', '.join(SYSTEMS)} (default: all)")
    p.add_argument("--points", type=int, default=None, help="training points of each synthetic member "
                                                             "(default: the preset's)")
    p.add_argument("--test-points", type=int, default=None, help="test points (default: the preset's)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                   help="a dslide row with these settings on top of the defaults (repeatable)")
    p.add_argument("--no-lsh", action="store_true", help="skip the --lsh inference comparison")
    p.add_argument("--tag", default="", help="a name for this run's section in docs/benchmarks.md")
    p.add_argument("--repeat", type=_rounds, default=1, metavar="N",
                   help="run every system N times, in rounds of one after another; times are medians")


def _rounds(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of rounds, 1 or more")
    return n
