"""Training benchmark of the one-rank SLIDE core: speed, accuracy, memory.

    python -m scripts.bench_train [--quick] [--only amazon,small,bibtex] [--out FILE.md]

Rows (each in its own process, one after the other):
- amazon-like synthetic data, 670,091 labels, hidden 128, batch 256, DWTA K=6
  L=50 on the output, 50,000 training and 5,000 test points: one epoch at 1
  and 2 threads; the same network in exact mode (every output neuron, BLAS)
  for a fixed time budget, for the speed-up and the accuracy cost;
- the `small` preset (50,000 features, 20,000 labels, the shape of SLIDE's
  reference run): samples/s and the training time to reach P@1 0.75, with
  the defaults (an LSH output with 4,000 shared random negatives) and with a
  dense output;
- BibTeX (../shared/data/bibtex_*.txt, when present) with the defaults.
"""

from __future__ import annotations

import argparse
import sys

from . import _bench as B
from . import measure as M

SHARED = M.SHARED_DATA
AMAZON = {"preset": "amazon-like", "n_train": 50000, "n_test": 5000, "seed": 0}
SMALL = {"preset": "small", "seed": 0}
SLIDE_LSH = {"family": "dwta", "K": 6, "L": 50, "bin_size": 8}


def cases(quick: bool, only: set[str]) -> list[dict]:
    out = []
    if "amazon" in only:
        amazon = dict(AMAZON, n_train=20000, n_test=2000) if quick else AMAZON
        base = {"hidden": [128], "batch_size": 256, "epochs": 1.0, "eval_every": 50, "eval_points": 2000,
                "lsh": SLIDE_LSH}
        for t in (1, 2):
            out.append({"name": f"dslide LSH, {t} thread(s)", "data": amazon, "threads": t, "config": base})
        out.append({"name": "dslide exact (dense softmax), 2 threads", "data": amazon, "threads": 2,
                    "config": {**base, "exact": True, "eval_every": 25}, "time_budget": 120 if quick else 600})
    if "small" in only:
        for t in (1, 2):
            out.append({"name": f"defaults (LSH output, 4,000 random), {t} thread(s)", "data": SMALL,
                        "threads": t, "config": {"eval_every": 20, "eval_points": 2000}})
        out.append({"name": "dense output (kinds dense,dense), 2 threads", "data": SMALL, "threads": 2,
                    "config": {"kinds": ["dense", "dense"], "eval_every": 20, "eval_points": 2000}})
    if "bibtex" in only and (SHARED / "bibtex_train.txt").exists():
        data = {"train": str(SHARED / "bibtex_train.txt"), "test": str(SHARED / "bibtex_test.txt")}
        out.append({"name": "BibTeX, defaults, 2 threads", "data": data, "threads": 2,
                    "config": {"eval_every": 230, "eval_points": 2515}})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller amazon-like run and budgets")
    p.add_argument("--only", default="amazon,small,bibtex")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    p.add_argument("--out", help="also write the table to this markdown file")
    a = p.parse_args(argv)
    rows = B.run_cases(cases(a.quick, set(a.only.split(","))))
    for r in rows:
        t75 = M.time_to(r["curve"], 0.75)
        r["t75"] = "-" if t75 is None else f"{t75:.1f}"
    cols = [
        ("run", "name"),
        ("data (train/test, features, labels)", lambda r: f"{r['data']['n_train']:,}/{r['data']['n_test']:,}, "
                                                          f"{r['data']['n_features']:,}, {r['data']['n_labels']:,}"),
        ("layers", lambda r: "+".join(r["kinds"])),
        ("epochs", lambda r: f"{r['epochs']:.2f}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        ("P@1", lambda r: f"{r['p@1']:.4f}"),
        ("P@3", lambda r: f"{r['p@3']:.4f}"),
        ("P@5", lambda r: f"{r['p@5']:.4f}"),
        ("s to P@1 0.75", "t75"),
        ("peak MB", lambda r: f"{r['peak_rss_mb']:,.0f}"),
        ("fwd / bwd / LSH query / upkeep s", lambda r: " / ".join(
            f"{r['timers_s'].get(k, 0):.1f}" for k in ("forward", "backward", "lsh_query", "lsh_upkeep"))),
    ]
    M.report("bench_train", argv if argv is not None else sys.argv[1:], rows, cols, a.out, not a.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
