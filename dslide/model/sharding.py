"""Column sharding arithmetic: which neurons of a layer each rank owns.

A layer of `n` neurons is split over `world` ranks into contiguous ranges.
Evenly (no weights), the first `n % world` ranks own one neuron more than
the others:

    base, extra = divmod(n, world)
    rank r owns [r * base + min(r, extra), (r + 1) * base + min(r + 1, extra))

With weights w_0 .. w_{P-1} > 0 (uneven machines: shares proportional to
each rank's speed), rank r owns about n * w_r / sum(w) neurons: every rank
first gets one neuron (no rank may be empty), the other n - P are shared in
proportion to the weights by largest remainders (ties to the lower rank),
so each share is within 1 of (n - P) w_r / sum(w) + 1. Equal weights give
exactly the even split.

Replicas: a world of R x P ranks is R replicas of P shards, world rank w being
shard w % P of replica w // P (`replica_place`); shard p covers the same
neurons in every replica. A re-split moves each rank's neurons that another
rank owns after it (`moves`).

Nothing here talks to MPI; every function is plain integer arithmetic so that
tests and tools can reason about any world size without launching one.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np


def _check(n: int, world: int) -> None:
    if world < 1:
        raise ValueError(f"world size ({world}) must be >= 1")
    if n < world:
        raise ValueError(f"a layer of {n} neurons cannot be split over {world} ranks: every rank needs >= 1 neuron")


def check_weights(weights, world: int) -> np.ndarray:
    """The weights as float64 [world], or a ValueError naming what is wrong."""
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    if w.shape[0] != world:
        raise ValueError(f"shard_weights has {w.shape[0]} entries but a replica has {world} ranks; "
                         f"give one weight per rank of a replica, 'auto' or none (even shares)")
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"shard_weights = {list(map(float, w))} must all be finite numbers > 0")
    return w


def check_layout(world: int, replicas: int, weights=()) -> None:
    """Whether `world` ranks form `replicas` replicas of world / replicas ranks each, with
    `weights` (empty, "auto" or one weight per rank of a replica): a ValueError naming the
    valid choices otherwise. Arithmetic only, so a command can check it before it writes."""
    if replicas < 1 or world % replicas:
        raise ValueError(f"world size ({world}) is not divisible by replicas ({replicas}): a world of "
                         f"R x P ranks forms R replicas of P shards; use replicas in "
                         f"{[r for r in range(1, world + 1) if world % r == 0]}")
    if weights is not None and len(weights) and not isinstance(weights, str):
        check_weights(weights, world // replicas)


def replica_place(rank: int, world: int, replicas: int) -> tuple[int, int]:
    """(replica g, shard p) of world rank `rank` when `world` ranks form `replicas`
    replicas of P = world / replicas shards: rank = g P + p (check_layout first).
    Shard p covers the same neurons in every replica."""
    check_layout(world, replicas)
    return divmod(rank, world // replicas)


def moves(old_bounds, new_bounds, rank: int) -> tuple[list[tuple[int, int]], list[int]]:
    """Re-sharding from old_bounds to new_bounds (int [P + 1] each): for every rank q, the
    range [lo, hi) of neurons that `rank` sends q (the part of its old slice q owns after;
    lo == hi when none), and how many neurons `rank` receives from q."""
    olo, ohi = int(old_bounds[rank]), int(old_bounds[rank + 1])
    nlo, nhi = int(new_bounds[rank]), int(new_bounds[rank + 1])
    send, recv = [], []
    for q in range(len(old_bounds) - 1):
        lo, hi = max(olo, int(new_bounds[q])), min(ohi, int(new_bounds[q + 1]))
        send.append((lo, lo + max(0, hi - lo)))
        lo, hi = max(nlo, int(old_bounds[q])), min(nhi, int(old_bounds[q + 1]))
        recv.append(max(0, hi - lo))
    return send, recv


def shard_bounds(n: int, world: int, weights=None) -> np.ndarray:
    """int64 [world + 1]: rank r owns [bounds[r], bounds[r + 1]).

    weights: None (even shares) or `world` positive numbers (shares in proportion).
    """
    _check(n, world)
    if weights is None:
        base, extra = divmod(n, world)
        r = np.arange(world + 1, dtype=np.int64)
        return r * base + np.minimum(r, extra)
    w = [Fraction(float(x)) for x in check_weights(weights, world)]
    # one neuron each, the rest by largest remainders, in exact rational arithmetic
    # (floats could floor 2 - 1e-16 to 1 and make equal weights differ from the even split)
    rest, total = n - world, sum(w)
    ideal = [rest * x / total for x in w]
    sizes = [int(q) for q in ideal]  # floor: every q >= 0
    short = rest - sum(sizes)
    # ties go to the lower rank, as in the even split
    order = sorted(range(world), key=lambda r: (-(ideal[r] - sizes[r]), r))
    for r in order[:short]:
        sizes[r] += 1
    return np.concatenate(([0], np.cumsum(np.array(sizes, dtype=np.int64) + 1))).astype(np.int64)


def shard_range(n: int, rank: int, world: int, weights=None) -> tuple[int, int]:
    """[start, stop) of the neurons of an n-wide layer owned by `rank` of `world`."""
    if not 0 <= rank < max(world, 1):
        raise ValueError(f"rank ({rank}) must be in [0, {world})")
    b = shard_bounds(n, world, weights)
    return int(b[rank]), int(b[rank + 1])


def row_share(n: int, rank: int, size: int) -> tuple[int, int, int]:
    """(per, lo, hi): rank's contiguous share [lo, hi) of n rows (queries, points) shared over
    `size` ranks in blocks of per = ceil(n / size) rows, the last shares short or empty (per = 0
    for n = 0). Padded to per rows, the ranks' blocks all-gathered hold the n rows in order first."""
    per = -(-n // size) if n else 0
    return per, min(n, rank * per), min(n, (rank + 1) * per)


def scaled_count(total: int, n_local: int, n: int) -> int:
    """A per-layer budget (active neurons, say) scaled to a shard of n_local of n neurons.

    ceil(total * n_local / n), at least 1, so the budgets of all shards add up
    to about `total` whatever the number of ranks.
    """
    return max(1, -(-total * n_local // n))


def speed_weights(seconds, sizes) -> np.ndarray:
    """Shard weights from measured work: rank r computed sizes[r] neurons' share in
    seconds[r] (float [P] each), so its speed is sizes[r] / seconds[r] and its new
    share is proportional to that speed (float64 [P], summing to 1).

    With replicas, `seconds` and `sizes` may be [R, P] (every replica's rank at
    shard position p): position p then gets the slowest of its replicas' speeds,
    so no replica's step is slower than the slowest position allows
    (min over r of max over p of share_p / speed_rp is what this maximises).
    """
    s = np.atleast_2d(np.asarray(seconds, dtype=np.float64))
    z = np.atleast_2d(np.asarray(sizes, dtype=np.float64))
    if s.shape != z.shape or np.any(~np.isfinite(s)) or np.any(s <= 0) or np.any(z <= 0):
        raise ValueError(f"speed_weights needs positive seconds and sizes of one shape, got {s.tolist()} "
                         f"and {z.tolist()}")
    speed = (z / s).min(axis=0)
    return speed / speed.sum()
