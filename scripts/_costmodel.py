"""Time per training step on P nodes: dslide (model parallel) against data parallelism.

Used by scripts/bench_slownet.py to fit and predict; not part of the dslide package.

An alpha-beta model. A message of n bytes between two nodes costs
alpha + n * beta, with alpha the latency (s) and beta = 1 / bandwidth
(s per byte, bandwidth of one node's link). Collectives over P nodes of n
bytes in all (Thakur, Rabenseifner & Gropp 2005; Chan et al. 2007):

    all-gather (ring)                 (P - 1) alpha + (P - 1) / P * n * beta
    reduce-scatter (ring)             (P - 1) alpha + (P - 1) / P * n * beta
    all-reduce (ring, or Rabenseifner:
        reduce-scatter + all-gather)  2 (P - 1) alpha + 2 (P - 1) / P * n * beta
    all-reduce (recursive doubling)   s (alpha + n * beta),
        s = log2 P when P is a power of two, else floor(log2 P) + 2 (the
        extra exchange before and after, folding the ranks beyond the largest
        power of two in and out, as MPICH does)

Which all-reduce: the ring moves the fewest bytes and has the most start-ups;
recursive doubling the reverse. MPI libraries pick by message size (MPICH:
recursive doubling below a few KiB). dslide's all-reduces per step are the
softmax normaliser, B (max, sum) float64 pairs = 16 B bytes (4 KiB at B = 256),
and with one softmax per label (the default loss) each sample's label weights, B
float64 = 8 B bytes; latency-bound on a cluster, each is costed as the cheaper of
the two (`algorithm="best"`). The data-parallel gradient all-reduce (hundreds of MB)
is costed as a ring, as Horovod, NCCL and Gloo do it.

Per step, with B the batch, d the last hidden width, s the float size:

    dslide (model parallel: each rank owns 1/P of every layer's neurons)
        T = compute_split / P + compute_fixed
          + all-gather(B d s)             hidden activations, rank r gives [B, d_r]
          + all-reduce(16 B)              softmax normaliser (max, sum) per sample
          + all-reduce(8 B)               label weights (one softmax per label; label_weights)
          + reduce-scatter(B d s)         gradient wrt the hidden activations
    data parallel (each rank the whole model and B / P samples)
        T = compute / P + compute_fixed
          + ring all-reduce(M) = 2 (P - 1) / P * M * beta + 2 (P - 1) alpha
      with M the model's bytes (every gradient, every step).

compute_split is the single-node time of what divides over the ranks (the
output layer and its LSH work, or the batch in data parallelism); compute_fixed
what every rank does whole (e.g. a layer computed redundantly, or an
optimizer update of the whole model in data parallelism). At P = 1 there is no
communication. dslide's bytes do not depend on the model's width (the labels);
data parallelism's grow with it.

Shared medium. When all P ranks' traffic crosses one link of bandwidth b (as on
the capped loopback of scripts/slownet.sh, where every rank sends at once in
these collectives), each rank gets b / P: `shared_medium=True` divides the
bandwidth by P. A switched cluster gives every node its own link (the default).

Bytes per step per rank (`*_bytes_per_step`) are the beta terms' bytes, the
same accounting as dslide.comm (what each rank sends under ring algorithms).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

ALLREDUCE_ALGORITHMS = ("ring", "recursive_doubling", "best")


def _check_P(P) -> int:
    return _check_pos_int("P", P)


def _check_nonneg(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} = {value!r} must be a number >= 0") from None
    if not v >= 0:
        raise ValueError(f"{name} = {value!r} must be a number >= 0")
    return v


def _beta(bandwidth, P: int, shared_medium: bool) -> float:
    """Seconds per byte of one rank's traffic; 0 for an infinite bandwidth."""
    try:
        b = float(bandwidth)
    except (TypeError, ValueError):
        b = math.nan
    if not b > 0:
        raise ValueError(f"bandwidth = {bandwidth!r} must be > 0 bytes/s (math.inf for no limit)")
    if math.isinf(b):
        return 0.0
    return (P if shared_medium else 1) / b


@dataclass(frozen=True)
class Step:
    """The compute of one training step, measured on one node.

    compute_split_s: seconds of the part that divides over P ranks.
    compute_fixed_s: seconds of the part every rank does whole.
    """

    compute_split_s: float
    compute_fixed_s: float = 0.0

    def __post_init__(self):
        _check_nonneg("compute_split_s", self.compute_split_s)
        _check_nonneg("compute_fixed_s", self.compute_fixed_s)

    def compute(self, P: int) -> float:
        """compute_split_s / P + compute_fixed_s."""
        return self.compute_split_s / _check_P(P) + self.compute_fixed_s


# -- collectives --------------------------------------------------------------------------


def allgather_time(P: int, nbytes: float, bandwidth: float, latency: float, shared_medium: bool = False) -> float:
    """Ring all-gather of n bytes in all: (P - 1) alpha + (P - 1) / P * n * beta."""
    P = _check_P(P)
    n, a = _check_nonneg("nbytes", nbytes), _check_nonneg("latency", latency)
    return (P - 1) * a + (P - 1) / P * n * _beta(bandwidth, P, shared_medium)


def reduce_scatter_time(P: int, nbytes: float, bandwidth: float, latency: float, shared_medium: bool = False) -> float:
    """Ring reduce-scatter of n bytes in all: (P - 1) alpha + (P - 1) / P * n * beta."""
    return allgather_time(P, nbytes, bandwidth, latency, shared_medium)


def recursive_doubling_steps(P: int) -> int:
    """Exchanges of a recursive-doubling all-reduce: log2 P, or floor(log2 P) + 2 when P is not a power of two."""
    P = _check_P(P)
    if P == 1:
        return 0
    k = P.bit_length() - 1
    return k if P == 1 << k else k + 2


def allreduce_time(P: int, nbytes: float, bandwidth: float, latency: float, algorithm: str = "ring",
                   shared_medium: bool = False) -> float:
    """All-reduce of n bytes (each rank's buffer).

    ring: 2 (P - 1) alpha + 2 (P - 1) / P * n * beta;
    recursive_doubling: s (alpha + n beta), s = `recursive_doubling_steps(P)`;
    best: the smaller of the two.
    """
    if algorithm not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"algorithm = {algorithm!r} is not valid; choose one of "
                         f"{', '.join(map(repr, ALLREDUCE_ALGORITHMS))}")
    P = _check_P(P)
    n, a = _check_nonneg("nbytes", nbytes), _check_nonneg("latency", latency)
    beta = _beta(bandwidth, P, shared_medium)
    ring = 2 * (P - 1) * a + 2 * (P - 1) / P * n * beta
    rd = recursive_doubling_steps(P) * (a + n * beta)
    return {"ring": ring, "recursive_doubling": rd, "best": min(ring, rd)}[algorithm]


# -- bytes per step -------------------------------------------------------------------------


def dslide_bytes_per_step(P: int, batch: int, hidden: int, itemsize: int = 4, label_weights: bool = True) -> float:
    """Bytes one rank sends per dslide step (ring accounting, as dslide.comm counts them):
    2 (P - 1) / P * B d s (all-gather + reduce-scatter) + 2 (P - 1) / P * 16 B (normaliser)
    + 2 (P - 1) / P * 8 B (label_weights: one softmax per label's weights, the default loss)."""
    P = _check_P(P)
    B, d = _check_pos_int("batch", batch), _check_pos_int("hidden", hidden)
    s = _check_pos_int("itemsize", itemsize)
    return 2 * (P - 1) / P * B * d * s + 2 * (P - 1) / P * (24 if label_weights else 16) * B


def data_parallel_bytes_per_step(P: int, model_bytes: float) -> float:
    """Bytes one rank sends per data-parallel step: 2 (P - 1) / P * M (ring all-reduce)."""
    P = _check_P(P)
    return 2 * (P - 1) / P * _check_nonneg("model_bytes", model_bytes)


def _check_pos_int(name: str, value) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1") from None
    if v < 1:
        raise ValueError(f"{name} = {value!r} must be an integer >= 1")
    return v


# -- step times -------------------------------------------------------------------------------


def dslide_step_breakdown(P: int, bandwidth: float, latency: float, batch: int, hidden: int,
                          compute_split_s: float, compute_fixed_s: float = 0.0, *, itemsize: int = 4,
                          shared_medium: bool = False, label_weights: bool = True) -> dict:
    """Seconds per dslide step by part: compute, allgather, allreduce, reduce_scatter, comm, total
    (allreduce: the normaliser's, plus the label weights' where label_weights)."""
    P = _check_P(P)
    B, d = _check_pos_int("batch", batch), _check_pos_int("hidden", hidden)
    s = _check_pos_int("itemsize", itemsize)
    compute = Step(compute_split_s, compute_fixed_s).compute(P)
    ag = allgather_time(P, B * d * s, bandwidth, latency, shared_medium)
    ar = allreduce_time(P, 16 * B, bandwidth, latency, "best", shared_medium)
    if label_weights:
        ar += allreduce_time(P, 8 * B, bandwidth, latency, "best", shared_medium)
    rs = reduce_scatter_time(P, B * d * s, bandwidth, latency, shared_medium)
    comm = ag + ar + rs
    return {"compute": compute, "allgather": ag, "allreduce": ar, "reduce_scatter": rs,
            "comm": comm, "total": compute + comm}


def dslide_step_time(P: int, bandwidth: float, latency: float, batch: int, hidden: int,
                     compute_split_s: float, compute_fixed_s: float = 0.0, *, itemsize: int = 4,
                     shared_medium: bool = False, label_weights: bool = True) -> float:
    """Seconds per dslide step on P nodes (see the module docstring).

    bandwidth: bytes/s of a node's link (math.inf: no limit); latency: seconds;
    batch B, hidden d: the all-gathered activations are B x d floats of `itemsize` bytes.
    """
    return dslide_step_breakdown(P, bandwidth, latency, batch, hidden, compute_split_s, compute_fixed_s,
                                 itemsize=itemsize, shared_medium=shared_medium,
                                 label_weights=label_weights)["total"]


def data_parallel_step_breakdown(P: int, bandwidth: float, latency: float, model_bytes: float, compute_s: float,
                                 compute_fixed_s: float = 0.0, *, shared_medium: bool = False) -> dict:
    """Seconds per data-parallel step by part: compute, allreduce (= comm), total."""
    P = _check_P(P)
    compute = Step(compute_s, compute_fixed_s).compute(P)
    ar = allreduce_time(P, _check_nonneg("model_bytes", model_bytes), bandwidth, latency, "ring", shared_medium)
    return {"compute": compute, "allreduce": ar, "comm": ar, "total": compute + ar}


def data_parallel_step_time(P: int, bandwidth: float, latency: float, model_bytes: float, compute_s: float,
                            compute_fixed_s: float = 0.0, *, shared_medium: bool = False) -> float:
    """Seconds per data-parallel step on P nodes:
    compute_s / P + compute_fixed_s + 2 (P - 1) / P * M / bandwidth + 2 (P - 1) latency."""
    return data_parallel_step_breakdown(P, bandwidth, latency, model_bytes, compute_s, compute_fixed_s,
                                        shared_medium=shared_medium)["total"]


def fit_step(Ps, compute_s) -> Step:
    """Least-squares Step from per-step compute seconds measured at several P.

    Fits t_P = split / P + fixed (both >= 0). One point gives split = t P, fixed = 0.
    """
    Ps = [_check_P(p) for p in Ps]
    ts = [_check_nonneg("compute_s", t) for t in compute_s]
    if len(Ps) != len(ts) or not Ps:
        raise ValueError(f"need as many compute times ({len(ts)}) as P values ({len(Ps)}), at least one")
    if len(set(Ps)) == 1:
        return Step(sum(ts) / len(ts) * Ps[0], 0.0)
    x = [1.0 / p for p in Ps]
    n = len(x)
    mx, mt = sum(x) / n, sum(ts) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    split = sum((xi - mx) * (ti - mt) for xi, ti in zip(x, ts)) / sxx
    fixed = mt - split * mx
    if split < 0:  # compute that grows with P: no part divides
        return Step(0.0, mt)
    if fixed < 0:  # through the origin: all of it divides
        return Step(sum(xi * ti for xi, ti in zip(x, ts)) / sum(xi * xi for xi in x), 0.0)
    return Step(split, fixed)


def predict_table(Ps, bandwidth: float, latency: float, *, batch: int, hidden: int, model_bytes: float,
                  dslide: Step, data_parallel: Step, itemsize: int = 4, shared_medium: bool = False) -> list[dict]:
    """One row per P: seconds per step, samples/s and bytes per step per rank of both schemes.

    Keys: P, dslide_s, dslide_comm_s, dslide_samples_per_s, dslide_bytes, dp_s, dp_comm_s,
    dp_samples_per_s, dp_bytes, speedup (dp_s / dslide_s).
    """
    rows = []
    for P in Ps:
        P = _check_P(P)
        ds = dslide_step_breakdown(P, bandwidth, latency, batch, hidden, dslide.compute_split_s,
                                   dslide.compute_fixed_s, itemsize=itemsize, shared_medium=shared_medium)
        dp = data_parallel_step_breakdown(P, bandwidth, latency, model_bytes, data_parallel.compute_split_s,
                                          data_parallel.compute_fixed_s, shared_medium=shared_medium)
        rows.append({
            "P": P,
            "dslide_s": ds["total"], "dslide_comm_s": ds["comm"], "dslide_samples_per_s": _rate(batch, ds["total"]),
            "dslide_bytes": dslide_bytes_per_step(P, batch, hidden, itemsize),
            "dp_s": dp["total"], "dp_comm_s": dp["comm"], "dp_samples_per_s": _rate(batch, dp["total"]),
            "dp_bytes": data_parallel_bytes_per_step(P, model_bytes),
            "speedup": dp["total"] / ds["total"] if ds["total"] > 0 else math.inf,
        })
    return rows


def _rate(batch: int, seconds: float) -> float:
    return batch / seconds if seconds > 0 else math.inf
