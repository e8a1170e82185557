#!/usr/bin/env python
"""dslide against what a user would run otherwise, on the same data and machine, in one run.

From the repository root:

    python -m scripts.bench --suite shapes                     (every data shape against the trees; suites/shapes.py)
    python -m scripts.bench --suite real                       (the real sets of ../shared/data against PECOS and omikuji)
    python -m scripts.bench --suite scale                      (300,000 training points: dslide's P@1 against time; 45 minutes)
    python -m scripts.bench --suite quick                      (both parts, about 10 minutes)
    python -m scripts.bench --suite full --parts main          (about 25 minutes on 2 cores)
    python -m scripts.bench --suite full --parts peers         (about 15 minutes)
    python -m scripts.bench --suite full --parts peers --preset amazon-tail
    python -m scripts.bench --suite full --parts lsh           (what LSH buys; about 25 minutes)
    python -m scripts.bench --suite full --parts schedule      (the same with the default schedule; 15 minutes)

(`python scripts/bench.py ...` runs the same.) On a shared machine run each
under the bench lock (flock /tmp/dslide-bench.lock ...); the full suite's
parts are separate commands so that none holds it past ~30 minutes.
`--preset amazon-tail` takes the longer-tailed variant of the synthetic data
(dslide/datasets/synthetic.py) instead of amazon-like.

Each part is a module of scripts/suites/, whose docstring says what it runs:
main (the same network by dslide, dense, data-parallel and PyTorch, the same
training-time budget each), peers (dslide's defaults against omikuji,
napkinXC and a PyTorch sampled softmax with theirs), lsh (what the hash
tables buy, and --lsh inference), schedule (the same with the default
schedule); --suite shapes is suites/shapes.py. This module only reads the
command line and calls them.

Each part prints a markdown table, writes a PNG of P@1 against training time
(docs/bench_<suite>[_peers][_<preset>].png), and records both, with the
command and the machine, in docs/benchmarks.md (scripts/measure.py record).
"""

if __name__ == "__main__" and not __package__:  # `python scripts/bench.py ...`: run as the package's module
    import os
    import sys

    _root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.execve(sys.executable, [sys.executable, "-m", "scripts.bench", *sys.argv[1:]],
              {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_root, os.environ.get("PYTHONPATH")]))})

import argparse  # noqa: E402
import sys  # noqa: E402

from .suites import common, lsh, main as main_part, peers, scale, schedule, shapes  # noqa: E402

PARTS = {"main": main_part.run, "peers": peers.run, "lsh": lsh.run, "schedule": schedule.run}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=sorted(common.SUITES) + ["shapes", "real", "scale"], default="quick",
                   help="quick, full, or shapes: the data-shape suite (scripts/suites/shapes.py), "
                        "dslide against the tree libraries on every member; real: the real sets; scale: "
                        "an Amazon-670K-shaped member at 300,000 training points (scripts/suites/scale.py)")
    p.add_argument("--parts", default="main,peers",
                   help="comma-separated: main (the same network by dslide, dense, data-parallel, PyTorch), "
                        "peers (dslide's defaults against omikuji, napkinXC, PyTorch sampled softmax), "
                        "lsh (what the hash tables buy: candidates against uniform negatives, --lsh inference), "
                        "schedule (the same with the default schedule: epochs and a decaying lr)")
    p.add_argument("--preset", choices=common.PRESETS, default="amazon-like", help="the synthetic data set")
    p.add_argument("--labels", type=int, default=0,
                   help="parts lsh and schedule only: generate the preset with this many labels "
                        "(default: the preset's)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-trees", action="store_true", help="leave omikuji and napkinXC out")
    p.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    shapes.add_arguments(p)
    return p


def main(argv=None) -> int:
    p = parser()
    a = p.parse_args(argv)
    if a.repeat > 1 and a.suite not in ("shapes", "real"):
        p.error(f"--repeat {a.repeat}: goes with --suite shapes and real (their rows run in rounds)")
    if a.suite in ("shapes", "real"):
        return shapes.run(a)
    if a.suite == "scale":
        return scale.run(a)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = sorted(set(parts) - set(PARTS))
    if bad or not parts:
        p.error(f"--parts {a.parts!r}: choose from {', '.join(PARTS)} (comma-separated)")
    if a.labels and (a.labels < 1000 or not set(parts) <= {"lsh", "schedule"}):
        p.error(f"--labels {a.labels}: must be >= 1000 and goes with --parts lsh and schedule alone")
    suite = {**common.SUITES[a.suite], "data": {**common.SUITES[a.suite]["data"], "preset": a.preset}}
    if a.labels:
        suite["data"]["n_labels"] = a.labels
    for name in PARTS:  # in this order, whatever the order given
        if name in parts:
            PARTS[name](a, suite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
