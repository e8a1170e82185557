"""P@1 and loss against training time: what `dslide plot RUN [RUN ...] --out progress.png`
draws (the command: dslide.cli.plot).

The figures come from each run directory's log.jsonl (a record every
`log_every` steps: wall_s, loss; P@k every `eval_every` steps, the network
alone on a test subset) and metrics.json (the final figures, with the
neighbours' labels where training chose them). `series` extracts them; `draw`
needs matplotlib, which dslide does not depend on (`pip install
'dslide[plot]'`): without it the command says so in one line, exit status 2.
"""

from __future__ import annotations

import json
from pathlib import Path


class PlotUnavailable(ValueError):
    """matplotlib is not installed."""


def read_log(run_dir) -> list[dict]:
    """The records of RUN_DIR/log.jsonl, in order."""
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        raise ValueError(f"{path} does not exist (is {run_dir} a run directory of dslide train?)")
    records = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON record: {e}") from None
    return records


def series(run_dir) -> dict:
    """What `draw` plots for one run: {"wall_s", "loss"} (every logged step), {"eval_wall_s",
    "p@1"} (the steps evaluated during training: the network alone) and "final": (wall_s,
    P@1, what) from metrics.json, or None before the run ended. `what` is "network alone" or
    "with neighbour labels"."""
    recs = read_log(run_dir)
    ev = [r for r in recs if r.get("p@1") is not None]
    out = {"wall_s": [r["wall_s"] for r in recs], "loss": [r["loss"] for r in recs],
           "eval_wall_s": [r["wall_s"] for r in ev], "p@1": [r["p@1"] for r in ev], "final": None}
    path = Path(run_dir) / "metrics.json"
    if path.is_file() and recs:
        m = json.loads(path.read_text())
        if m.get("p@1") is not None:
            choice = ((m.get("index") or {}).get("fusion_choice") or {}).get("chosen", "off")
            what = "network alone" if choice == "off" else "with neighbour labels"
            out["final"] = (recs[-1]["wall_s"], m["p@1"], what)
    return out


def draw(runs: dict[str, dict], out, title: str | None = None) -> None:
    """Write a PNG of P@1 (left) and loss (right) against training seconds, one line per
    entry of `runs` (legend label -> `series`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("dslide plot needs matplotlib, which is not installed: "
                              "pip install 'dslide[plot]' (or pip install matplotlib)") from None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in runs.items():
        line, = ax1.plot(s["eval_wall_s"], s["p@1"], marker="o", ms=3, label=f"{label}: network alone")
        if s["final"] is not None:
            wall, p1, what = s["final"]
            ax1.plot([wall], [p1], marker="*", ms=12, ls="", color=line.get_color(), label=f"{label}: final, {what}")
        ax2.plot(s["wall_s"], s["loss"], label=label)
    ax1.set_xlabel("training time (s)")
    ax1.set_ylabel("P@1 (test data)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    ax2.set_xlabel("training time (s)")
    ax2.set_ylabel("training loss")
    ax2.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(out)

