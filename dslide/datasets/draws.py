"""Random draws shared by the generator families (synthetic, baskets, amazon670k).

A splitmix64 stream per point (`_next`, `_uniform`: an explicit uint64[1]
state, dslide.rng), alias tables (`_alias_table`, `_alias_pick`), and the
Zipf-like law over ranks that every family draws features and labels from:
its mass (`_zipf_mass`), its O(1) sampler by inverting the CDF
(`_powerlaw_const`, `_powerlaw_rank`) and its vectorised form for building a
world (`_draw_features`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dslide.rng import splitmix_next, unit

_S32 = np.uint64(32)
_LO32 = np.uint64(0xFFFFFFFF)
_INV32 = 1.0 / 4294967296.0


@njit(cache=True)
def _next(state):
    """Next uint64 of a splitmix64 stream; state: uint64[1], advanced in place."""
    return splitmix_next(state, 0)


@njit(cache=True)
def _uniform(state):
    """Next float64 in [0, 1) (53 random bits) of the stream in `state`."""
    return unit(_next(state))


@njit(cache=True)
def _alias_pick(u, prob, alias):
    """Index drawn from the alias table (prob float64 [K], alias int64 [K]) with one uniform u."""
    x = u * prob.shape[0]
    i = min(np.int64(x), prob.shape[0] - 1)
    if x - i < prob[i]:
        return i
    return alias[i]


def _powerlaw_const(n: int, a: float) -> float:
    """The constant c of `_powerlaw_rank` for n items and exponent a."""
    if a == 1.0:
        return float(np.log(n + 1.0))
    return float((n + 1.0) ** (1.0 - a) - 1.0)


@njit(cache=True)
def _powerlaw_rank(u, n, a, c):
    """Rank r in [0, n) with P(r) = ∫_{r+1}^{r+2} x^-a dx / Z, by inverting the CDF at u.

    x = (1 + u c)^(1 / (1 - a)) with c = (n + 1)^(1 - a) - 1, or x = exp(u c) with
    c = ln(n + 1) when a = 1; r = floor(x) - 1. O(1), no table.
    """
    if a == 1.0:
        x = np.exp(u * c)
    else:
        x = (1.0 + u * c) ** (1.0 / (1.0 - a))
    r = np.int64(x) - 1
    if r < 0:
        r = 0
    if r > n - 1:
        r = n - 1
    return r


@njit(cache=True)
def _alias_table(weights):
    """Walker/Vose alias table of weights (float64 [K], >= 0, positive sum).

    Returns prob float64 [K] and alias int64 [K]: with x = u K (u uniform), item
    i = floor(x) is kept when x - i < prob[i], else replaced by alias[i]; then
    P(item j) = weights[j] / sum(weights).
    """
    k = weights.shape[0]
    scaled = weights * (k / weights.sum())
    prob = np.ones(k, dtype=np.float64)
    alias = np.arange(k)
    small = np.empty(k, dtype=np.int64)
    large = np.empty(k, dtype=np.int64)
    ns = 0
    nl = 0
    for i in range(k):
        if scaled[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        nl -= 1
        g = large[nl]
        prob[s] = scaled[s]
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        if scaled[g] < 1.0:
            small[ns] = g
            ns += 1
        else:
            large[nl] = g
            nl += 1
    # Whatever is left is 1 up to rounding: it keeps prob 1 and aliases itself.
    return prob, alias


def _compact_alias(prob, alias):
    # Halves the memory the hot loop touches per background draw (F can be ~1e5-1e6).
    return prob.astype(np.float32), alias.astype(np.int32)


def _zipf_mass(n: int, a: float) -> np.ndarray:
    """float64 [n]: P(rank = r) ∝ ∫_{r+1}^{r+2} x^-a dx, the law `_powerlaw_rank` samples."""
    r1 = np.arange(n, dtype=np.float64) + 1.0
    t = np.log1p(1.0 / r1)  # ln((r+2)/(r+1))
    if a == 1.0:
        return t
    # ((r+2)^(1-a) - (r+1)^(1-a)) / (1-a), written to stay accurate near a = 1.
    return r1 ** (1.0 - a) * np.expm1((1.0 - a) * t) / (1.0 - a)


def _draw_features(rng, shape, feature_of_rank, a) -> np.ndarray:
    """int32 array of `shape`: features drawn by background rank with Zipf-like exponent a."""
    F = len(feature_of_rank)
    u = rng.random(size=shape)
    c = _powerlaw_const(F, a)
    x = np.exp(u * c) if a == 1.0 else (1.0 + u * c) ** (1.0 / (1.0 - a))
    rank = np.clip(x.astype(np.int64) - 1, 0, F - 1)
    return feature_of_rank[rank]
