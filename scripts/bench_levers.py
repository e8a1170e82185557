"""The neighbour-label fusion's levers on suite members: epochs, neighbours, power, weight.

    python -m scripts.bench_levers --members amazon-tail,baskets-tail-40k --epochs 1,5

With --shares, the label prototypes (dslide.infer.fusion) share the neighbour
term: one more row per share (0: the points alone).

For each member (dslide.datasets.suite, or bibtex from ../shared/data) the
network is trained once per epoch count with knn = 0 (1 process, 2 threads),
its 100 best labels per test point scored exactly, and the nearest training
points found once (dslide.infer.fusion); then the fused top 5 is computed for every
(knn, knn_power, knn_weight) of the grid from those same candidates, so each
row differs from the next by the fusion setting alone. Weight 0 is the
network alone, weight 1 the neighbours' labels alone. P@1 / P@5 / PSP@5 on
all test points by dslide.metrics (propensities from the training labels).
The table is recorded in docs/benchmarks.md unless --no-record.
"""

from __future__ import annotations

import argparse
import sys
import time

from . import measure as M

NEIGHBOURS = (5, 10, 20, 50)
POWERS = (1.0, 4.0)
WEIGHTS = (0.0, 0.3, 0.5, 0.7, 0.85, 1.0)
SHARES = (0.0,)  # proto_weight rows: the label prototypes' share of the neighbour term
PROTO_POWER = 16.0
PROTO_CANDIDATES = 20
CANDIDATES = 100


def load(name: str):
    from dslide.datasets import suite
    from dslide.io.data import read_xmc

    if name == "bibtex":
        return read_xmc(M.SHARED_DATA / "bibtex_train.txt"), read_xmc(M.SHARED_DATA / "bibtex_test.txt")
    return suite.generate_member(name)


def member_rows(name: str, epochs: list[float], threads: int, settings: dict | None = None) -> list[dict]:
    import dslide  # noqa: F401  (first: the thread variables)
    import scipy.sparse as sp

    from dslide import train as T
    from dslide.infer.predict import predict_topk_scores
    from dslide.config import Config, points_per_label
    from dslide.infer import fusion
    from dslide.metrics import evaluate, inverse_propensity

    tr, te = load(name)
    inv = inverse_propensity(tr.Y)
    Y = sp.csr_matrix(te.Y)
    protos = any(SHARES)
    store = fusion.NeighbourLabels.build(tr.X, tr.Y, prototypes=protos)
    t0 = time.perf_counter()
    nn_ids, nn_sims = store.neighbours(te.X, max(NEIGHBOURS))
    pr_ids, pr_sims = store.prototypes(te.X, PROTO_CANDIDATES) if protos else (None, None)
    search_s = time.perf_counter() - t0
    ppl = points_per_label(tr.Y)
    rows = []
    for ep in epochs:
        model, hist = T.fit(tr, Config.from_dict({**(settings or {}), "threads": threads, "epochs": ep, "knn": 0}),
                            index=False)
        train_s = sum(r["wall_s_delta"] for r in hist)
        mi, ms = predict_topk_scores(model, te.X, CANDIDATES)
        for k in NEIGHBOURS:
            for power in POWERS:
                for share in SHARES:
                    cells = {}
                    for w in WEIGHTS:
                        ids, _ = store.fuse(mi, ms, nn_ids[:, :k], nn_sims[:, :k], w, power, 5,
                                            pr_ids, pr_sims, share, PROTO_POWER)
                        m = evaluate(Y, ids, k=5, inv_prop=inv)
                        cells[w] = f"{m['p@1']:.4f} / {m['p@5']:.4f} / {m['psp@5']:.4f}"
                    rows.append({"member": name, "points/label": f"{ppl:.2f}", "epochs": f"{ep:g}",
                                 "train s": f"{train_s:.1f}", "search s": f"{search_s:.1f}", "knn": k,
                                 "power": f"{power:g}", **({"share": f"{share:g}"} if protos else {}),
                                 **{f"w {w:g}": c for w, c in cells.items()}})
                    print(" | ".join(str(v) for v in rows[-1].values()), file=sys.stderr, flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", required=True, help="comma-separated suite members (or bibtex)")
    ap.add_argument("--epochs", default="1,5", help="comma-separated epoch counts")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", default="", metavar="JSON", help='settings of the network, e.g. \'{"lsh": {"max_active": 0}}\'')
    ap.add_argument("--weights", default="", help="comma-separated knn_weight columns (default: 0,0.3,0.5,0.7,0.85,1)")
    ap.add_argument("--neighbours", default="", help="comma-separated knn rows (default: 5,10,20,50)")
    ap.add_argument("--powers", default="", help="comma-separated knn_power rows (default: 1,4)")
    ap.add_argument("--shares", default="", help="comma-separated proto_weight rows (default: 0, no prototypes)")
    ap.add_argument("--proto-power", type=float, default=16.0)
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.time()
    import json

    global WEIGHTS, NEIGHBOURS, POWERS, SHARES, PROTO_POWER
    SHARES = tuple(float(x) for x in a.shares.split(",")) if a.shares else SHARES
    PROTO_POWER = a.proto_power
    WEIGHTS = tuple(float(w) for w in a.weights.split(",")) if a.weights else WEIGHTS
    NEIGHBOURS = tuple(int(k) for k in a.neighbours.split(",")) if a.neighbours else NEIGHBOURS
    POWERS = tuple(float(p) for p in a.powers.split(",")) if a.powers else POWERS
    settings = json.loads(a.set) if a.set else {}
    epochs = [float(e) for e in a.epochs.split(",")]
    rows = []
    for name in [m.strip() for m in a.members.split(",") if m.strip()]:
        rows += member_rows(name, epochs, a.threads, settings)
    cols = [(c, c) for c in rows[0]] if rows else []
    flags = "".join(f" --{k} {v}" for k, v in (("weights", a.weights), ("neighbours", a.neighbours),
                                                 ("powers", a.powers), ("shares", a.shares)) if v) + (
        f" --proto-power {a.proto_power:g}" if a.shares and a.proto_power != 16.0 else "") + (f" --set '{a.set}'" if a.set else "")
    text = (f"command: `{M.command('bench_levers', [f'--members {a.members} --epochs {a.epochs}{flags}'])}`\n\n"
            f"machine: {M.machine()}\n\n1 process x {a.threads} threads; each cell P@1 / P@5 / PSP@5 of the fused "
            f"top 5 at knn_weight w (w 0: the network alone; w 1: the neighbours' labels alone)\n\n"
            + M.table(rows, cols) + f"\n\n({time.time() - t0:.0f} s in all)\n")
    print(text)
    if not a.no_record:
        M.record("bench_levers.py" + flags, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
