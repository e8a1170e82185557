"""Model-parallel benchmark: the same training on P = 1, 2 (and 4, oversubscribed) ranks.

    python -m scripts.bench_dist [--quick] [--out FILE.md]

Amazon-like data (670,091 labels, hidden 128, batch 256, DWTA K=6 L=50 on the
output), one thread per rank, the same number of samples for every P. For
each P: samples/s, bytes sent per step and rank (dslide's exchanges, and what
a data-parallel all-reduce of every gradient would send for the same model),
their ratio, peak memory per rank, P@1/P@5 at the end. This machine has 2
cores: P = 4 shares them and is marked oversubscribed (its speed means nothing;
its bytes and memory do).
"""

from __future__ import annotations

import argparse
import os
import sys

from . import _bench as B
from . import measure as M

LSH = {"family": "dwta", "K": 6, "L": 50, "bin_size": 8}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--ranks", default="1,2,4")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    p.add_argument("--out")
    a = p.parse_args(argv)
    data = {"preset": "amazon-like", "n_train": 20000 if a.quick else 50000, "n_test": 2000 if a.quick else 5000}
    config = {"hidden": [128], "batch_size": 256, "epochs": 1.0, "eval_every": 0, "eval_points": 2000, "lsh": LSH}
    cores = os.cpu_count() or 1
    cases = []
    for P in [int(x) for x in a.ranks.split(",")]:
        name = f"dslide, {P} rank(s) x 1 thread" + (" (oversubscribed)" if P > cores else "")
        cases.append({"name": name, "data": data, "ranks": P, "threads": 1, "config": config})
    rows = B.run_cases(cases)
    cols = [
        ("run", "name"),
        ("data", lambda r: f"{r['data']['n_train']:,} x {r['data']['n_features']:,} -> {r['data']['n_labels']:,}"),
        ("samples", lambda r: f"{r['steps'] * 256:,}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        ("bytes/step/rank", lambda r: f"{r['bytes_per_step']:,.0f}"),
        ("data-parallel bytes/step/rank", lambda r: f"{r['bytes_per_step_data_parallel']:,.0f}"),
        ("ratio", lambda r: f"{100 * r['bytes_per_step'] / r['bytes_per_step_data_parallel']:.4f}%"
         if r["bytes_per_step_data_parallel"] else "-"),
        ("peak MB/rank", lambda r: f"{r['peak_rss_mb']:,.0f}"),
        ("P@1", lambda r: f"{r['p@1']:.4f}"),
        ("P@5", lambda r: f"{r['p@5']:.4f}"),
    ]
    M.report("bench_dist", argv if argv is not None else sys.argv[1:], rows, cols, a.out, not a.no_record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
