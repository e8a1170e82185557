"""Part "schedule": what the candidates buy with the default schedule (its epochs, lr decaying to zero).

The wide layers' defaults, fewer refills, and uniform negatives alone for the
same epochs and for as many epochs as fit in the defaults' training time
(measured in their run) and 1.5x that; 1 rank x 2 threads, dslide's default
settings otherwise.
"""

from __future__ import annotations

import time

from .. import _bench as B
from .. import measure as M
from . import common as C
from .lsh import candidates_wide


def run(a, suite: dict) -> None:
    t0 = time.time()
    notes: list[str] = []

    def case(name, lc, **cfg):
        return {"name": name, "ranks": 1, "threads": 2, "data": suite["data"], "config": {"lsh": lc, **cfg}}

    wide = candidates_wide()
    rows = B.run_cases([case(f"{wide} candidates per sample + uniform (the wide layers' defaults)",
                             {"max_active": wide}),
                        case("the same, refill period x2.0", {"max_active": wide, "growth": 2.0}),
                        case("uniform negatives only, the same epochs", {"max_active": 0})], notes)
    if len(rows) == 3:
        ratio = rows[0]["train_s"] / rows[2]["train_s"]
        rows += B.run_cases([case(f"uniform negatives only, {e:.1f} epochs", {"max_active": 0}, epochs=e)
                             for e in (round(rows[2]["epochs"] * ratio, 1), round(rows[2]["epochs"] * ratio * 1.5, 1))],
                            notes)
    cols = [("output layer", "name"), ("epochs", lambda r: f"{r['epochs']:.1f}"),
            ("training s", lambda r: f"{r['train_s']:.1f}"), ("upkeep s", lambda r: f"{r.get('lsh_upkeep_s', 0.0):.1f}"),
            ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"), ("P@1", lambda r: f"{r['p@1']:.4f}"),
            ("P@3", lambda r: f"{r.get('p@3', float('nan')):.4f}"), ("P@5", lambda r: f"{r['p@5']:.4f}"),
            ("PSP@5", lambda r: f"{r.get('psp@5', float('nan')):.4f}"),
            ("peak MB", lambda r: f"{r.get('peak_rss_mb', float('nan')):,.0f}")]
    shape = C.synthetic_shape(suite["data"])
    cmd = M.command("bench", [f"--suite {a.suite} --parts schedule" + C.preset_flag(a)])
    text = (f"command: `{cmd}`\n\nmachine: {M.machine()}\n\ncode: {M.code_version()}\n\n"
            f"data: {shape}; 1 rank x 2 threads, dslide's default settings otherwise (hidden layer, batch, lr "
            f"decaying linearly to zero over the run's epochs); P@k and PSP@5 on all test points after training; "
            f"'upkeep s': refilling the anchor buckets, inside the training time\n\n" + M.table(rows, cols) + "\n")
    text += C.notes_text(notes)
    text += f"\n({time.time() - t0:.0f} s in all)\n"
    print(text)
    if not a.no_record:
        M.record(f"bench.py --suite {a.suite} --parts schedule" + C.preset_flag(a), text)
    C.keep(f"bench_{a.suite}_schedule{C.preset_flag(a).replace(' --', '_').replace(' ', '')}", rows)
