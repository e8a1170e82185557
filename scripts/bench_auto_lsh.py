"""When an LSH output layer beats a dense one: the measurement behind auto_lsh_ratio and auto_lsh_min_width.

    python -m scripts.bench_auto_lsh [--labels 5120,10000,14000,20000] [--threads 2] [--no-record]

For each label count, the `small` preset with that many labels (20,000 training and
2,000 test points, 50,000 features) is trained twice, each in its own process, one
after the other: with an LSH output layer (kinds dense,lsh: the default LSH settings)
and with a dense one (kinds dense,dense). Everything else is the data-driven default
(hidden 128, 5 epochs, batch 128, lr 1e-2 decayed), 1 rank x `--threads` threads.
Prints samples/s of each and their ratio, P@1 on the test set of each and the
difference, the neurons an LSH layer computes per sample at that width
(random_count + max_active) and what `kinds = "auto"` picks for it with the current
defaults (auto_lsh_ratio, auto_lsh_min_width).
"""

from __future__ import annotations

import argparse
import sys

from . import _bench as B
from . import measure as M


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--labels", default="5120,10000,14000,20000", help="comma-separated label counts")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    a = p.parse_args(argv)
    from dslide.config import Config  # noqa: PLC0415  (pure Python: no kernels in this process)

    cases = []
    for n in (int(x) for x in a.labels.split(",")):
        data = {"preset": "small", "n_labels": n, "seed": 0}
        for kind in ("lsh", "dense"):
            cases.append({"name": f"{n} {kind}", "label": f"{n:,} labels, {kind} output", "data": data,
                          "threads": a.threads, "config": {"kinds": ["dense", kind], "eval_points": 2000},
                          "n_labels": n, "kind": kind})
    failures = []
    results = {r["name"]: r for r in B.run_cases(cases, failures)}
    rows = []
    for n in (int(x) for x in a.labels.split(",")):
        lsh, dense = results.get(f"{n} lsh"), results.get(f"{n} dense")
        if lsh is None or dense is None:
            continue
        cfg = Config().resolve(n)
        active = cfg.lsh.random_count(n) + cfg.lsh.active_count(n)
        rows.append({"labels": f"{n:,}", "auto": cfg.layer_kind(1, n), "active": f"{active:,}",
                     "width_ratio": f"{n / active:.2f}",
                     "lsh_sps": f"{lsh['samples_per_s']:,.0f}", "dense_sps": f"{dense['samples_per_s']:,.0f}",
                     "speed": f"{lsh['samples_per_s'] / dense['samples_per_s']:.2f}",
                     "lsh_p1": f"{lsh['p@1']:.4f}", "dense_p1": f"{dense['p@1']:.4f}",
                     "dp1": f"{100 * (lsh['p@1'] - dense['p@1']):+.1f}"})
    cols = [("labels", "labels"), ("auto picks", "auto"), ("LSH neurons/sample", "active"),
            ("width / those", "width_ratio"), ("LSH samples/s", "lsh_sps"), ("dense samples/s", "dense_sps"),
            ("LSH/dense speed", "speed"), ("P@1 LSH", "lsh_p1"), ("P@1 dense", "dense_p1"),
            ("P@1 LSH - dense (points)", "dp1")]
    M.report("bench_auto_lsh", argv if argv is not None else sys.argv[1:], rows, cols, None, not a.no_record)
    for f in failures:
        print(f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
