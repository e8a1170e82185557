"""Narrow outputs (at most 4,096 labels): dslide's defaults against explicit schedules, side by side.

    python -m scripts.bench_narrow [--sets bibtex,tiny,topics-4k,baskets-3k] [--ranks 2]
                                   [--variant NAME=JSON ...] [--tag NAME] [--no-record]

The narrow-output defaults (`config.NARROW_*`, Config.resolve) were chosen on
more shapes than BibTeX: besides it (when ../shared/data holds it), the
`tiny` preset (2,000 points: the batch rule's case), a 4,000-label
prototype set shaped like EURLex-4K and a 3,000-label topic-basket set. Each
case is one process (scripts/_bench.py) at `--ranks` ranks x 1 thread; the
variants run one after another on each set. Columns: training seconds
(compiling and prediction left out), P@1, P@5, PSP@5 (propensities from the
training labels) and each variant's points against the first variant.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import _bench
from . import measure as M
from .suites.shapes import parse_variants

SHARED = M.ROOT.parent / "shared" / "data"

#: name -> the data spec of scripts/_bench.load_data
SETS = {
    "bibtex": {"train": str(SHARED / "bibtex_train.txt"), "test": str(SHARED / "bibtex_test.txt")},
    "tiny": {"preset": "tiny"},
    "topics-4k": {"preset": "small", "n_train": 15_000, "n_test": 3_000, "n_labels": 4_000,
                  "n_features": 5_000, "labels_mean": 5.0, "labels_max": 8},
    "baskets-3k": {"preset": "baskets-head-40k", "n_train": 15_000, "n_test": 3_000, "n_labels": 3_000,
                   "n_features": 8_000, "n_parents": 30, "topics_per_parent": 10},
}

#: the defaults these replaced: a 1,024-wide layer, 30 epochs of 64 at 1e-3, and the same at
#: the new defaults' training time on BibTeX
DEFAULT_VARIANTS = {
    "defaults": {},
    "before": {"hidden": [1024], "batch_size": 64, "lr": 1e-3, "epochs": 30},
    "before, 6 epochs": {"hidden": [1024], "batch_size": 64, "lr": 1e-3, "epochs": 6},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=JSON",
                    help="settings to compare (repeatable); default: the defaults and those they replaced")
    ap.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--tag", default="", help="a name for this run's section in docs/benchmarks.md")
    args = ap.parse_args(argv)
    code = M.code_version()
    names = [s for s in args.sets.split(",") if s]
    for s in names:
        if s not in SETS:
            ap.error(f"unknown set {s!r}; valid sets: {', '.join(SETS)}")
    variants = parse_variants(args.variant) if args.variant else DEFAULT_VARIANTS
    rows, failures = [], []
    for s in names:
        spec = SETS[s]
        if "train" in spec and not all(Path(spec[k]).exists() for k in ("train", "test")):
            print(f"skipping {s}: {spec['train']} or {spec['test']} is missing", file=sys.stderr)
            continue
        first = None
        for vname, settings in variants.items():
            case = {"name": f"{s} {vname}", "data": spec, "config": {"eval_every": 0, "checkpoint_every": 0, **settings},
                    "ranks": args.ranks, "threads": 1}
            got = _bench.run_cases([case], failures)
            if not got:
                continue
            r = got[0]
            first = first or r
            d = r["data"]
            rows.append({"set": s, "shape": f"{d['n_train']:,} / {d['n_test']:,} points, {d['n_features']:,} features, "
                                             f"{d['n_labels']:,} labels",
                         "variant": vname, "settings": json.dumps(settings) if settings else "-",
                         "batch / epochs / hidden": f"{r['config']['batch_size']} / {r['config']['epochs']:g} / "
                                                    f"{','.join(map(str, r['config']['hidden']))}",
                         "train s": f"{r['train_s']:.1f}", "P@1": f"{r['p@1']:.4f}", "P@5": f"{r['p@5']:.4f}",
                         "PSP@5": f"{r.get('psp@5', float('nan')):.4f}",
                         "vs first: P@1 / P@5 points": "-" if r is first else
                         f"{100 * (r['p@1'] - first['p@1']):+.1f} / {100 * (r['p@5'] - first['p@5']):+.1f}"})
    cols = [(c, c) for c in ("set", "shape", "variant", "settings", "batch / epochs / hidden", "train s", "P@1", "P@5",
                             "PSP@5", "vs first: P@1 / P@5 points")]
    text = M.report("bench_narrow", argv if argv is not None else sys.argv[1:], rows, cols, None, False)
    if not args.no_record:
        head, sep, table = text.partition("\n\n")
        M.record("bench_narrow.py" + (f" ({args.tag})" if args.tag else ""), f"{head}\ncode: {code}{sep}{table}")
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
