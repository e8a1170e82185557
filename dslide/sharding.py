"""Column sharding arithmetic: which neurons of a layer each rank owns.

A layer of `n` neurons is split over `world` ranks into contiguous ranges.
The first `n % world` ranks own one neuron more than the others:

    base, extra = divmod(n, world)
    rank r owns [r * base + min(r, extra), (r + 1) * base + min(r + 1, extra))

Nothing here talks to MPI; every function is plain integer arithmetic so that
tests and tools can reason about any world size without launching one.
"""

from __future__ import annotations

import numpy as np


def _check(n: int, world: int) -> None:
    if world < 1:
        raise ValueError(f"world size ({world}) must be >= 1")
    if n < world:
        raise ValueError(f"a layer of {n} neurons cannot be split over {world} ranks: every rank needs >= 1 neuron")


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """[start, stop) of the neurons of an n-wide layer owned by `rank` of `world`."""
    _check(n, world)
    if not 0 <= rank < world:
        raise ValueError(f"rank ({rank}) must be in [0, {world})")
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_bounds(n: int, world: int) -> np.ndarray:
    """int64 [world + 1]: rank r owns [bounds[r], bounds[r + 1])."""
    _check(n, world)
    base, extra = divmod(n, world)
    r = np.arange(world + 1, dtype=np.int64)
    return r * base + np.minimum(r, extra)


def scaled_count(total: int, n_local: int, n: int) -> int:
    """A per-layer budget (active neurons, say) scaled to a shard of n_local of n neurons.

    ceil(total * n_local / n), at least 1, so the budgets of all shards add up
    to about `total` whatever the number of ranks.
    """
    return max(1, -(-total * n_local // n))
