"""Threads per rank by default: `mpiexec -n P dslide train` without `--set threads` against
`--set threads=1` and against every core per rank (what threads = 0 meant before).

    python -m scripts.bench_threads [--ranks 2] [--points 20000] [--epochs 1] [--repeat 2]

The environment is the user's, less NUMBA_NUM_THREADS and the BLAS thread variables
(numba and OpenBLAS then see every core, as in a fresh shell). The cases alternate,
`--repeat` rounds of each, so a change in the machine's load touches them alike.
Columns: the threads each rank ran, training samples/s (metrics.json, first step
left out) and the process's wall seconds, the median of the rounds with every
round's figure beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import measure as M


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--points", type=int, default=20000)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    args = ap.parse_args(argv)

    work = M.ROOT / "runs" / "bench_threads"
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / f"{args.preset}-{args.points}"
    dslide = [sys.executable, "-m", "dslide"]
    if not Path(f"{prefix}_train.txt").exists():
        subprocess.run([*dslide, "data", "gen", "--preset", args.preset, "--points", str(args.points),
                        "--test-points", "100", "--out", str(prefix)], check=True)
    cores = os.cpu_count() or 1
    cases = [("default (no --set threads)", []), ("--set threads=1", ["--set", "threads=1"]),
             (f"--set threads={cores} (every core per rank: the old default)", ["--set", f"threads={cores}"])]
    env = {k: v for k, v in os.environ.items() if k not in M.THREAD_VARS}
    got = {name: [] for name, _ in cases}
    for r in range(args.repeat):
        for i, (name, sets) in enumerate(cases):
            out = work / f"run-{i}-{r}"
            cmd = [M.mpiexec(), "-n", str(args.ranks), *dslide, "train", "--train", f"{prefix}_train.txt",
                   "--out", str(out), "--quiet", "--set", f"epochs={args.epochs}", *sets]
            t0 = time.perf_counter()
            p = subprocess.run(cmd, env=env, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
            m = json.loads((out / "metrics.json").read_text())
            got[name].append((m["threads"], m["samples_per_s"], wall))
            print(f"  {name}, round {r + 1}: {m['threads']} thread(s), {m['samples_per_s']:,.0f} samples/s, "
                  f"{wall:.1f} s", file=sys.stderr, flush=True)
    lines = [f"command: `{M.command('bench_threads', argv if argv is not None else sys.argv[1:])}`", "",
             f"machine: {M.machine()}; `mpiexec -n {args.ranks} dslide train` on the `{args.preset}` preset, "
             f"{args.points:,} points, {args.epochs:g} epoch(s), defaults otherwise, NUMBA_NUM_THREADS and the BLAS "
             f"variables unset; {args.repeat} alternating round(s), medians (each round in brackets)", "",
             "| setting | threads per rank | samples/s | wall s |", "|---|---|---|---|"]
    for name, _ in cases:
        rows = got[name]
        sps, wall = [x[1] for x in rows], [x[2] for x in rows]
        lines.append(f"| {name} | {rows[0][0]} | {statistics.median(sps):,.0f} "
                     f"({', '.join(f'{x:,.0f}' for x in sps)}) | {statistics.median(wall):.1f} "
                     f"({', '.join(f'{x:.1f}' for x in wall)}) |")
    text = "\n".join(lines)
    print(text, flush=True)
    if not args.no_record:
        M.record("bench_threads.py", text)


if __name__ == "__main__":
    main()
