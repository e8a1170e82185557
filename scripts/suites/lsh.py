"""Part "lsh": what the hash tables buy, at the same training-time budget and constant learning rate.

The default output layer (anchor candidates + uniform negatives) against
uniform negatives only (sampled softmax: as many as the old default, as many
as the defaults draw, and about as many active neurons as the defaults
compute), candidates only, SLIDE's DWTA hashing in place of the anchor
tables, and each sample's own candidates (lsh.scope "sample"), 1 rank x 2
threads: samples/s, active neurons per step, P@1 half-way and at the end,
P@5 and PSP@5 at the end, seconds to the old default's final P@1. With
--labels N (a narrower layer; the issue's "20,000 labels" case) the
comparison is the defaults (uniform negatives only at that width: the
target), the same uniform negatives with the batch's candidates and with
each sample's own, and the full softmax. Then inference on the defaults'
model (670,091 labels only), at 1 rank and at 2 ranks: exact scoring against
`--lsh` (the index built from the final weights) and against a static
shortlist of the highest-bias labels of the same size: share scored,
seconds, recall of the exact top-10, P@1, P@5, PSP@5.
"""

from __future__ import annotations

import time

from .. import _bench as B
from .. import measure as M
from . import common as C

UNIFORM_OLD = 16384  # the uniform negatives of dslide's defaults before anchor candidates
UNIFORM_EQUAL = 12288  # about the active neurons the defaults compute per step at 670,091 labels
OWN_PER_SAMPLE = 64  # lsh.scope "sample": each sample's own candidates


def uniform_default() -> int:
    """The uniform negatives dslide's defaults draw per step at 670,091 labels."""
    return C.wide_defaults().lsh.random_count(C.WIDE)


def candidates_wide() -> int:
    """The candidates per sample dslide's defaults give a layer of 670,091 neurons."""
    return C.wide_defaults().lsh.active_count(C.WIDE)


def lsh_systems(suite: dict) -> list[dict]:
    """The output layers compared (1 rank x 2 threads, constant lr, the same budget)."""
    cfg = {**C.common(), "eval_every": suite["eval_every"][0], "eval_points": suite["eval_points"]}
    rows = [
        ("uniform negatives only, as many as the old default", {"max_active": 0, "min_active": UNIFORM_OLD}),
        ("uniform negatives only, about the defaults' active neurons", {"max_active": 0, "min_active": UNIFORM_EQUAL}),
        ("anchor candidates only (no uniform negatives)", {"min_active": 0}),
        ("SLIDE's DWTA candidates + the default uniform negatives", {"family": "dwta"}),
        ("the defaults: anchor candidates + uniform negatives", {}),
        ("uniform negatives only, as many as the defaults draw", {"max_active": 0, "min_active": uniform_default()}),
        ("each sample's own 64 anchor candidates (scope 'sample') + the default uniform negatives",
         {"scope": "sample", "max_active": OWN_PER_SAMPLE}),
    ]
    return [{"name": name, "ranks": 1, "threads": 2, "config": {**cfg, "lsh": lc}} for name, lc in rows]


def narrow_lsh_rows(suite: dict, notes: list) -> list[dict]:
    """--labels: the defaults (at this width uniform negatives only: the target), then the same
    uniform negatives with the batch's anchor candidates (the wide layers' defaults), with each
    sample's own candidates (scope "sample", 64 and 256), and the full softmax."""
    cfg = {**C.common(), "eval_every": suite["eval_every"][0], "eval_points": suite["eval_points"]}

    def case(name, lc, kind="lsh"):  # the kind forced: "auto" turns a wide uniform block dense
        return {"name": name, "label": name, "ranks": 1, "threads": 2, "data": suite["data"],
                "time_budget": suite["budget"], "config": {**cfg, "lsh": lc, "kinds": ["dense", kind]}}

    rows = B.run_cases([case("the defaults (here: uniform negatives only): the target", {})], notes)
    if not rows or not rows[0].get("block"):
        return rows
    u = {"min_active": int(round(rows[0]["block"]["random"])), "min_active_share": 1.0}
    wide = candidates_wide()
    rows += B.run_cases([
        case(f"the wide layers' defaults: the batch's anchor candidates ({wide} per sample) + the same uniform",
             {**u, "max_active": wide}),
        case(f"each sample's own {OWN_PER_SAMPLE} anchor candidates (scope 'sample') + the same uniform",
             {**u, "scope": "sample", "max_active": OWN_PER_SAMPLE}),
        case("each sample's own 256 anchor candidates (scope 'sample') + the same uniform",
             {**u, "scope": "sample", "max_active": 256}),
        case("every label (dense output layer, full softmax)", {}, kind="dense"),
    ], notes)
    return rows


def run(a, suite: dict) -> None:
    t0 = time.time()
    notes: list[str] = []
    if a.labels:
        rows = narrow_lsh_rows(suite, notes)
    else:
        cases = [{**case, "label": case["name"], "data": suite["data"], "time_budget": suite["budget"]}
                 for case in lsh_systems(suite)]
        rows = B.run_cases(cases, notes)
    # inference on the defaults' model, at 1 rank and at 2 ranks (index built after training)
    inf = []
    for ranks, threads in ((1, 2), (2, 1)) if not a.labels else ():
        case = {"name": "the defaults", "label": f"inference, {ranks} x {threads}", "ranks": ranks,
                "threads": threads, "data": suite["data"], "time_budget": suite["budget"], "inference": True,
                "config": {**C.common(), "eval_every": 0, "eval_points": suite["eval_points"]}}
        r = B.run_cases([case], notes)
        if r:
            inf.append((ranks, threads, r[0]))
    old = next((r for r in rows if r["config"]["lsh"].get("min_active") == UNIFORM_OLD
                or "the target" in r["name"]), None)
    target = old["curve"][-1]["p@1"] if old and old["curve"] else None
    half = suite["budget"] / 2

    def block(r):
        b = r.get("block")
        return f"{b['labels']:,.0f} + {b['candidates']:,.0f} + {b['random']:,.0f}" if b else "-"

    def t_to(r):
        t = M.time_to(r["curve"], target) if target is not None else None
        return "not reached" if t is None else f"{t:.1f}"

    cols = [("output layer", "name"), ("active per step: labels + candidates + uniform", block),
            ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            (f"P@1 at {half:g} s", lambda r: fmt(p1_at_curve(r, half))),
            ("P@1", lambda r: f"{r['p@1']:.4f}"), ("P@5", lambda r: f"{r['p@5']:.4f}"),
            ("PSP@5", lambda r: f"{r.get('psp@5', float('nan')):.4f}"),
            (f"s to P@1 {target:.4f}" if target is not None else "s to target", t_to),
            ("upkeep s", lambda r: f"{r.get('lsh_upkeep_s', 0.0):.1f}")]
    d = suite["data"]
    shape = C.synthetic_shape(d)
    cmd = M.command("bench", [f"--suite {a.suite} --parts lsh" + C.preset_flag(a)])
    base = C.common()
    text = (f"command: `{cmd}`\n\nmachine: {M.machine()}\n\ncode: {M.code_version()}\n\n"
            f"data: {shape}; every output layer 1 rank x 2 threads, hidden {', '.join(map(str, base['hidden']))}, "
            f"batch {base['batch_size']}, lr {base['lr']:g} held constant, "
            f"{suite['budget']} s of training; P@1 curves on the first {suite['eval_points']:,} test points, the rest "
            f"on all of them (PSP@5: propensities from the training labels); 'upkeep s': refilling or re-hashing "
            f"the tables, inside the training time\n\n" + M.table(rows, cols) + "\n")
    for ranks, threads, r in inf:
        text += "\n" + C.inference_table(r, f"Inference, {ranks} rank(s) x {threads} thread(s), the defaults' model "
                                           f"after {r['train_s']:.0f} s of training", d["n_test"])
    text += C.notes_text(notes)
    text += f"\n({time.time() - t0:.0f} s in all)\n"
    C.publish(a, "lsh", text, rows, f"P@1 against training time by output layer ({shape})",
             {"train": rows, "inference": [r for *_, r in inf]})


def p1_at_curve(r: dict, t: float):
    """P@1 of the last evaluation at or before training time t (None if none)."""
    pts = [c for c in r.get("curve", []) if c["wall_s"] <= t + 1e-9]
    return pts[-1]["p@1"] if pts else None


def fmt(v) -> str:
    return "-" if v is None else f"{v:.4f}"
