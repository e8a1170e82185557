"""Label propensities of a run: computed once from its training labels, kept in the run directory.

PSP@k and PSnDCG@k weight each label by its inverse propensity
(:func:`dslide.metrics.inverse_propensity`), which depends on how often the
label occurs in the *training* data. Computed from whatever file is being
evaluated, the same model on the same file would score differently in
`dslide eval` and in training's metrics.json (measured: PSP@1 0.305 against
0.064); so training writes them once, and every later evaluation of the run
reads them.

The file, `propensity.npz` in the run directory (numpy savez, written under a
fresh temporary name and renamed, so a reader never sees half of it):

    inv_prop   float64 [n_labels]  1/p_l = 1 + C (N_l + B)^(-A), C = (ln N - 1)(B + 1)^A
    counts     int64   [n_labels]  N_l: training points having label l
    n_points   int64   []          N: training points
    A, B       float64 []          the constants used (Config.propensity_constants)

The counts are kept so the weights can be recomputed with other constants
(:func:`with_constants`; `dslide eval --propensity amazon` or `--set
propensity_a=...`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from dslide.metrics import inverse_propensity, inverse_propensity_from_counts

FILE = "propensity.npz"
KEYS = ("inv_prop", "counts", "n_points", "A", "B")


def path_in(run_dir) -> Path:
    return Path(run_dir) / FILE


def compute(Y_train, A: float = 0.55, B: float = 1.5) -> dict:
    """The file's arrays (see the module docstring) for training labels Y_train (scipy sparse [N, L])."""
    Y = sp.csr_matrix(Y_train)
    inv = inverse_propensity(Y, A=A, B=B)  # validates A, B and N >= 3
    Yb = Y.copy()
    Yb.sum_duplicates()
    Yb.eliminate_zeros()
    counts = np.bincount(Yb.indices, minlength=Y.shape[1]).astype(np.int64)
    return {"inv_prop": inv, "counts": counts, "n_points": np.int64(Y.shape[0]),
            "A": np.float64(A), "B": np.float64(B)}


def save(run_dir, props: dict) -> Path:
    """Write `props` (from :func:`compute`) as run_dir/propensity.npz, atomically."""
    from dslide.io.rundir import replacing

    out = path_in(run_dir)
    # a fresh temporary file (never opened through a planted link), renamed into place;
    # a file object: np.savez would append ".npz" to a bare name
    with replacing(out) as f:
        np.savez(f, **{k: props[k] for k in KEYS})
    return out


def load(run_dir, n_labels: int) -> dict | None:
    """The run's propensities (the dict of :func:`compute`, A/B/n_points as Python numbers), or None
    when the run has none (trained before they were saved, or on fewer than 3 points).

    Raises ValueError naming the file when it is unreadable or not for `n_labels` labels."""
    p = path_in(run_dir)
    if not p.exists():
        return None
    try:
        with np.load(p) as f:
            out = {k: f[k] for k in f.files}
    except (OSError, EOFError, ValueError, AttributeError) as e:  # np.load: not an .npz archive
        raise ValueError(f"{p}: not a readable propensity file ({e})") from None
    missing = [k for k in KEYS if k not in out]
    if missing:
        raise ValueError(f"{p}: missing {', '.join(missing)} (expected {', '.join(KEYS)})")
    inv = np.asarray(out["inv_prop"], dtype=np.float64)
    if inv.shape != (n_labels,) or out["counts"].shape != (n_labels,):
        raise ValueError(f"{p}: holds {inv.shape[0] if inv.ndim == 1 else inv.shape} label weights; "
                         f"the model has {n_labels} labels")
    if not np.all(np.isfinite(inv)) or np.any(inv < 1):
        raise ValueError(f"{p}: inverse propensities must be finite and >= 1")
    out["inv_prop"] = inv
    out.update(A=float(out["A"]), B=float(out["B"]), n_points=int(out["n_points"]))
    return out


def with_constants(props: dict, A: float, B: float) -> dict:
    """`props` (from :func:`load`) with inv_prop recomputed from its saved counts and
    n_points for the constants A, B (1/p_l = 1 + C (N_l + B)^(-A), C = (ln N - 1)(B + 1)^A)."""
    inv = inverse_propensity_from_counts(props["counts"], props["n_points"], A, B)
    return {**props, "inv_prop": inv, "A": float(A), "B": float(B)}


def describe(props: dict) -> str:
    return (f"propensities of the {props['n_points']:,} training points, A = {props['A']:g}, "
            f"B = {props['B']:g}")
