"""Counter-based random numbers: every draw is a pure function of its coordinates.

A draw is `uniform(key, counter)`, where `key` mixes the seed with what the
draw is for (layer, step, sample, ...). Nothing depends on the thread that
computes it or on how many ranks share the work, which is what lets neuron
j of a layer start with the same weights whatever the number of ranks, and
lets a resumed run draw exactly what the uninterrupted one would have.

The mixer is SplitMix64's finaliser (Steele, Lea, Flood 2014), applied to a
64-bit combination of the inputs; it passes BigCrush as a counter-based
generator, which is plenty for initialisation, dropout and negative sampling.

This module is SplitMix64's one home: the sequential streams of the hash
tables' reservoir policy (dslide.lsh.tables) and of the synthetic data
(dslide.datasets.synthetic) draw through `splitmix_next` and `unit`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53

# Purposes: the second word of a key, so streams for different uses never meet
# (4 and 5 belonged to draws that no longer exist: leave them unused).
INIT, DROPOUT, NEGATIVES, ROUNDING = 1, 2, 3, 6
# The seeds of an LSH layer's candidate source (its hash family or anchors; its
# tables' own draws) and of its inference index (`lsh_seed`).
CANDIDATES, TABLES, INDEX = 7, 8, 9
# The training points on which the neighbour count is chosen (dslide.infer.fusion.choose_k).
NEIGHBOURS = 10
# The held-out validation rows (dslide.train.validation.validation_rows).
VALIDATION = 11


@njit(cache=True, inline="always")
def mix64(x):
    """SplitMix64 finaliser of a uint64."""
    z = x + GOLDEN
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@njit(cache=True, inline="always")
def splitmix_next(state, i):
    """The next output of the SplitMix64 stream held in state[i] (uint64 array), advanced in place.

    SplitMix64 adds GOLDEN to its state and returns the finaliser of the sum,
    which is mix64 of the state before the addition.
    """
    z = mix64(state[i])
    state[i] += GOLDEN
    return z


@njit(cache=True, inline="always")
def unit(z):
    """A float64 in [0, 1) from the top 53 bits of the uint64 z."""
    return float(z >> _S11) * _INV53


@njit(cache=True, inline="always")
def key(a, b):
    """Combine two integers into a 64-bit stream key (order matters)."""
    return mix64(mix64(np.uint64(a)) ^ np.uint64(b))


@njit(cache=True, inline="always")
def uniform(k, counter):
    """A float64 in [0, 1) for stream key k at position counter."""
    return unit(mix64(k ^ mix64(np.uint64(counter))))


@njit(cache=True, inline="always")
def randbelow(k, counter, n):
    """An integer in [0, n) for stream key k at position counter (n < 2**53)."""
    return np.int64(uniform(k, counter) * n)


def stream_key(seed: int, *words: int) -> np.uint64:
    """The key of the stream for (seed, *words), as the kernels compute it."""
    k = np.uint64(int(seed) & 0xFFFFFFFFFFFFFFFF)
    for w in words:
        k = np.uint64(key(k, np.uint64(w & 0xFFFFFFFFFFFFFFFF)))
    return np.uint64(k)


def lsh_seed(*words) -> int:
    """A non-negative 63-bit seed for the lsh package from stream_key(*words)."""
    return int(stream_key(*words) >> np.uint64(1))


@njit(parallel=True, cache=True)
def init_neuron_major(k, start, W, scale):
    """W[j - start, f] = U(-scale, scale) drawn at (key k, neuron j, input f).

    W: float [n_local, d_in], neuron-major; rows are neurons start..start+n_local-1.
    """
    n, d = W.shape
    for r in prange(n):
        kj = key(k, start + r)
        for f in range(d):
            W[r, f] = (2.0 * uniform(kj, f) - 1.0) * scale


@njit(parallel=True, cache=True)
def init_input_major(k, start, W, scale):
    """W[f, j - start] = U(-scale, scale) drawn at (key k, neuron j, input f).

    W: float [d_in, n_local], input-major; the same numbers as
    `init_neuron_major` would give, transposed.
    """
    d, n = W.shape
    for f in prange(d):
        for r in range(n):
            W[f, r] = (2.0 * uniform(key(k, start + r), f) - 1.0) * scale


@njit(parallel=True, cache=True)
def init_input_rows(k, row0, W, scale):
    """W[f - row0, j] = U(-scale, scale) drawn at (key k, neuron j, input f): inputs
    row0..row0+m-1 of every neuron (W float [m, n], input-major), the same numbers as
    `init_input_major` gives those rows."""
    m, n = W.shape
    for r in prange(m):
        for j in range(n):
            W[r, j] = (2.0 * uniform(key(k, j), row0 + r) - 1.0) * scale
