"""Draw P@1 and loss against training time from one or more dslide runs.

    python -m scripts.plot_run RUN_DIR [RUN_DIR ...] --out progress.png [--labels a,b]

Reads each run's log.jsonl (written by `dslide train`). Needs matplotlib,
an optional extra: `pip install -e '.[plot]'`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def read_log(run_dir: str) -> list[dict]:
    path = Path(run_dir) / "log.jsonl"
    if not path.exists():
        raise SystemExit(f"plot_run: {path} does not exist (is {run_dir} a dslide run directory?)")
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot_run: {path}:{i}: not a JSON record: {e}") from None
    return records


def plot(series: dict[str, list[dict]], out: str, title: str | None = None) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("plot_run: matplotlib is not installed; install the optional extra: "
                         "pip install -e '.[plot]'") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, recs in series.items():
        ev = [r for r in recs if "p@1" in r]
        if ev:
            ax1.plot([r["wall_s"] for r in ev], [r["p@1"] for r in ev], marker="o", ms=3, label=label)
        ax2.plot([r["wall_s"] for r in recs], [r["loss"] for r in recs], label=label)
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("P@1 (test subset)")
    ax1.grid(alpha=0.3)
    ax2.set_xlabel("training time (s)")
    ax2.set_ylabel("training loss")
    ax2.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    tmp = str(out) + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    Path(tmp).replace(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--labels", help="comma-separated legend labels (default: the run directories' names)")
    p.add_argument("--title")
    a = p.parse_args(argv)
    labels = a.labels.split(",") if a.labels else [Path(r).name for r in a.runs]
    if len(labels) != len(a.runs):
        raise SystemExit(f"plot_run: {len(labels)} labels for {len(a.runs)} runs")
    plot({lab: read_log(r) for lab, r in zip(labels, a.runs)}, a.out, a.title)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
