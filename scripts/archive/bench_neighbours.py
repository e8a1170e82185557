"""The neighbour stage at the end of training, part by part, on suite members.

    python -m scripts.archive.bench_neighbours [--members amazon-like,a670k-tail,baskets-tail-40k]
                                               [--points 5000] [--tag NAME] [--no-record]

Where a wide output fuses the neighbours' labels (dslide.infer.fusion), training
ends by building the neighbour store with its label prototypes and by
choosing the neighbour count and the prototypes' share from leave-one-out
predictions on `--points` training points. This times
those parts one after another, in this process, on one thread: the store's
build, the points' leave-one-out search, and the prototypes' leave-one-out
search twice, with the labels renumbered by frequency (the store as built)
and with the labels as they are (a store saved before the renumbering),
checking that both give the same ids and similarities. The member files are
the suite's (scripts/suites/shapes.py, generated once under runs/bench_data/).
"""

from __future__ import annotations

import argparse
import sys
import time

from .. import measure as M

DEFAULT_MEMBERS = ("amazon-like", "a670k-tail", "baskets-tail-40k")


def unrenumbered(store):
    """The same store with its prototypes' labels as they are, as stores were saved before the
    renumbering (pr_lab holding the labels, no pr_perm)."""
    import numpy as np

    from dslide.infer import fusion

    a = dict(store.state_arrays())
    perm = a.pop("pr_perm")
    lab, ptr = perm[a["pr_lab"]], a["pr_ptr"]
    order = np.concatenate([ptr[f] + np.argsort(lab[ptr[f]:ptr[f + 1]], kind="stable")
                            for f in range(len(ptr) - 1)])
    a["pr_lab"], a["pr_val"] = lab[order].astype(np.int32), a["pr_val"][order]
    return fusion.NeighbourLabels.from_state(a)


def measure_member(name: str, points: int, k: int, pr_k: int) -> dict:
    import numpy as np

    from dslide import rng
    from dslide.infer import fusion
    from dslide.io.data import read_xmc

    from ..suites.shapes import member_files

    train = read_xmc(member_files(name, None, None)[0])
    t0 = time.perf_counter()
    store = fusion.NeighbourLabels.build(train.X, train.Y, prototypes=True)
    build_s = time.perf_counter() - t0
    pick = np.random.default_rng(rng.lsh_seed(0, rng.NEIGHBOURS))
    rows = np.sort(pick.choice(train.n_points, min(train.n_points, points), replace=False))
    t0 = time.perf_counter()
    store.left_out_neighbours(train.X, rows, k)
    nn_s = time.perf_counter() - t0
    old = unrenumbered(store)
    t0 = time.perf_counter()
    new_ids, new_sims = store.left_out_prototypes(train.X, train.Y, rows, pr_k)
    pr_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    old_ids, old_sims = old.left_out_prototypes(train.X, train.Y, rows, pr_k)
    pr_old_s = time.perf_counter() - t0
    same = bool(np.array_equal(new_ids, old_ids) and np.array_equal(new_sims, old_sims))
    return {"member": name,
            "shape": f"{train.n_points:,} points, {train.n_features:,} features, {train.n_labels:,} labels",
            "queries": f"{rows.size:,}", "build s": f"{build_s:.2f}", "neighbours s": f"{nn_s:.2f}",
            "prototypes s (renumbered)": f"{pr_s:.2f}", "prototypes s (labels as they are)": f"{pr_old_s:.2f}",
            "renumbered / as they are": f"{pr_s / pr_old_s:.2f}x", "same ids and similarities": "yes" if same else "NO",
            "store MB": f"{store.nbytes() / 2**20:,.0f}", "prototype entries": f"{store.arrays['pr_lab'].size:,}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--members", default=",".join(DEFAULT_MEMBERS), help="comma-separated suite members")
    ap.add_argument("--points", type=int, default=5000, help="leave-one-out queries")
    ap.add_argument("--no-record", action="store_true", help="do not update docs/benchmarks.md")
    ap.add_argument("--tag", default="", help="a name for this run's section in docs/benchmarks.md")
    args = ap.parse_args(argv)
    import numba

    import dslide  # noqa: F401  (first: the thread variables)
    from dslide.config import KNN_CHOICES, Config

    from ..suites.shapes import members

    known = members()
    names = [m for m in args.members.split(",") if m]
    for m in names:
        if m not in known or m == "bibtex":
            ap.error(f"unknown or narrow member {m!r}; valid: {', '.join(x for x in known if x != 'bibtex')}")
    numba.set_num_threads(1)
    code = M.code_version()
    rows = []
    for m in names:
        print(f"running: {m} ...", file=sys.stderr, flush=True)
        rows.append(measure_member(m, args.points, max(KNN_CHOICES), Config().proto_candidates))
    cols = [(c, c) for c in rows[0]] if rows else []
    text = M.report("archive.bench_neighbours", argv if argv is not None else sys.argv[1:], rows, cols, None, False)
    if not args.no_record:
        head, sep, table = text.partition("\n\n")
        M.record("bench_neighbours.py" + (f" ({args.tag})" if args.tag else ""), f"{head}\ncode: {code}{sep}{table}")
    return 0 if all(r["same ids and similarities"] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
