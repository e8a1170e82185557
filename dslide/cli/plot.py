"""`dslide plot RUN [RUN ...] --out progress.png`: P@1 and loss against training time
(the figures and the drawing: dslide.plot)."""

from __future__ import annotations

from pathlib import Path

from dslide import plot


def add_parser(command) -> None:
    c = command("plot", "draw P@1 and loss against training time from run directories (needs matplotlib)")
    c.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories of dslide train (their log.jsonl)")
    c.add_argument("--out", required=True, metavar="PNG", help="image file to write")
    c.add_argument("--labels", help="comma-separated legend labels (default: the run directories' names)")
    c.add_argument("--title", help="a title above both panels")


def run(args, comm) -> int:
    labels = args.labels.split(",") if args.labels else [Path(r).name for r in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels names {len(labels)} runs but {len(args.runs)} are given")
    if comm.rank == 0:
        plot.draw({lab: plot.series(r) for lab, r in zip(labels, args.runs)}, args.out, args.title)
        print(f"wrote {args.out}")
    return 0
