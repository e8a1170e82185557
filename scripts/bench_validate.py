"""What the validation layer (dslide.validate) costs against one training epoch.

    python -m scripts.bench_validate [--only wordnet_hypernyms,debian_depends] [--out FILE.md]

For each real data set (../shared/data/NAME_train.txt): the seconds dslide.validate
takes to check its X and Y (`features` and `labels`: what every npz file and API
matrix passes; best of three, the data already in memory), the seconds of one
training epoch at the defaults (`dslide train --set epochs=1`, metrics.json's
train_s: the training steps alone, in a process of its own), and the share
validation / epoch. The XMC text reader checks while it parses and is not
counted here. Figures go to stdout (and --out); nothing is recorded elsewhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from . import measure as M

SETS = ("wordnet_hypernyms", "debian_depends", "debian_tags")


def validation_seconds(path: Path, repeats: int = 3) -> tuple[float, dict]:
    """(best seconds of validate.features(X) + validate.labels(Y), the data's sizes)."""
    import scipy.sparse as sp

    from dslide import validate
    from dslide.io.data import read_xmc

    data = read_xmc(path)
    X, Y = data.X, data.Y
    best = float("inf")
    for _ in range(repeats):
        # fresh matrices over the same arrays, as an npz file or an API caller hands them over:
        # nothing scipy knows about them (their canonical form) is taken on trust
        t0 = time.perf_counter()
        validate.csr(X.data, X.indices, X.indptr, X.shape, "X")
        validate.labels(sp.csr_matrix((Y.data, Y.indices, Y.indptr), shape=Y.shape))
        best = min(best, time.perf_counter() - t0)
    return best, {"points": data.n_points, "features": data.n_features, "labels": data.n_labels,
                  "nnz": int(data.X.nnz + data.Y.nnz)}


def epoch_seconds(path: Path) -> float:
    """train_s of one epoch at the defaults, in a process of its own."""
    with tempfile.TemporaryDirectory(prefix="bench_validate.") as tmp:
        out = Path(tmp) / "run"
        proc, _ = M.run([sys.executable, "-m", "dslide", "train", "--train", str(path), "--out", str(out),
                         "--set", "epochs=1", "--quiet"])
        if proc.returncode != 0:
            raise RuntimeError(f"training on {path} failed: {proc.stderr.strip()[-500:]}")
        return float(json.loads((out / "metrics.json").read_text())["train_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SETS[:2]), help="data sets, comma-separated (of %s)" % ", ".join(SETS))
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    rows = []
    for name in args.only.split(","):
        path = M.SHARED_DATA / f"{name}_train.txt"
        if not path.exists():
            print(f"skipped {name}: {path} is missing", file=sys.stderr)
            continue
        v, sizes = validation_seconds(path)
        e = epoch_seconds(path)
        rows.append({"data": name, **sizes, "validation_s": v, "epoch_s": e, "share": f"{100 * v / e:.3f}%"})
    cols = [("data", "data"), ("points", "points"), ("labels", "labels"), ("nnz (X + Y)", "nnz"),
            ("validation s", "validation_s"), ("one epoch s", "epoch_s"), ("share", "share")]
    M.report("bench_validate", sys.argv[1:] if argv is None else argv, rows, cols, args.out, record_it=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
