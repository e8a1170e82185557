"""Adam's moments in reduced precision: bfloat16 as uint16 bit patterns.

bfloat16 is the upper half of a float32 (sign, the same 8 exponent bits, 7
mantissa bits), so widening is exact and the range is float32's: TINY
(dslide.model.kernels) is a normal bfloat16 and the kernels' flush keeps
subnormals out as before. numpy
has no bfloat16, so moments are stored as uint16 [same shape] and every
Adam kernel widens them to float32, updates in float32 and narrows back.

Narrowing: m rounds to nearest (ties to even). v rounds stochastically:
with beta2 = 0.999 (the wide outputs' default) one step changes v by 0.1%,
under half a bfloat16 unit (2^-8 = 0.4%), so rounded to nearest v would never decay and would grow
only for gradients 3x its size; stochastically rounded it follows float32's
v (tests/unit/test_adam_bfloat16.py compares both with float32 Adam over
shrinking gradients). The random bits are a function of (key, step, the
element's global position) only: results do not depend on threads or ranks.

The Adam kernels (dslide.model.kernels) read and write moments through `load`,
`store_nearest` and `store_stochastic`, which compile to plain loads and stores
for moments in a float type; `rounding_key` gives them the random bits' stream
of one parameter array. Every function here inlines into those kernels: numba
keys their cache by dslide/model/kernels.py, so after editing this file delete its
__pycache__/*.nbi and *.nbc files (or touch dslide/model/kernels.py).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)
from dslide import rng


@intrinsic
def _f32_bits(typingctx, x):
    """The IEEE bit pattern of a float32 as uint32 (a bit cast, no conversion)."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, u):
    """The float32 whose bit pattern is the low 32 bits of unsigned integer u
    (numba widens uint32 arithmetic to 64 bits)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        x = args[0]
        if u.bitwidth > 32:
            x = builder.trunc(x, ir.IntType(32))
        elif u.bitwidth < 32:
            x = builder.zext(x, ir.IntType(32))
        return builder.bitcast(x, ir.FloatType())

    return types.float32(u), codegen


@njit(cache=True, inline="always")
def bf16_to_f32(h):
    """A bfloat16 (uint16 bits) widened exactly to float32."""
    return _bits_f32(np.uint32(h) << np.uint32(16))


@njit(cache=True, inline="always")
def f32_to_bf16(x):
    """float32 -> bfloat16 bits (uint16), rounded to nearest, ties to even.

    No branch for NaN (it would stop the loops vectorising): a quiet NaN, the only
    kind arithmetic produces, has bit 22 set and stays a NaN; a value that rounds
    past the largest finite bfloat16 becomes inf, as in IEEE rounding.
    """
    u = _f32_bits(np.float32(x))
    return np.uint16((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(cache=True, inline="always")
def f32_to_bf16_stochastic(x, r):
    """float32 -> bfloat16 bits rounded up with probability (the dropped low 16 bits) / 2^16,
    given r uniform in [0, 2^16): unbiased, E[result] = x. A quiet NaN stays a NaN."""
    u = _f32_bits(np.float32(x))
    return np.uint16((u + np.uint32(r)) >> np.uint32(16))


def load(a, i):
    """a[i] widened to the compute type (float32 for bfloat16 bits)."""
    raise NotImplementedError  # numba only


@overload(load, inline="always", jit_options={"cache": True})
def _load_impl(a, i):
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        return lambda a, i: bf16_to_f32(a[i])
    return lambda a, i: a[i]


def store_nearest(a, i, x):
    """a[i] = x, narrowed to nearest for bfloat16 bits."""
    raise NotImplementedError


@overload(store_nearest, inline="always", jit_options={"cache": True})
def _store_nearest_impl(a, i, x):
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        def impl(a, i, x):
            a[i] = f32_to_bf16(x)
        return impl

    def impl(a, i, x):
        a[i] = x
    return impl


@njit(cache=True, inline="always")
def fmix32(x):
    """MurmurHash3's 32-bit finaliser (a bijection with full avalanche); 32-bit multiplies
    vectorise where SplitMix64's 64-bit ones do not (with 64-bit rounding bits, Adam on
    bfloat16 moments was slower than on float32 ones; with these it is not)."""
    x = np.uint32(x ^ (x >> np.uint32(16)))
    x = np.uint32(x * np.uint32(0x85EBCA6B))
    x = np.uint32(x ^ (x >> np.uint32(13)))
    x = np.uint32(x * np.uint32(0xC2B2AE35))
    return np.uint32(x ^ (x >> np.uint32(16)))


@njit(cache=True, inline="always")
def row_seed(key, pos):
    """32-bit seed of the elements from global position pos (uint64) on, for stream key
    (uint64): element pos + k draws `fmix32(seed + k)` (folded once per row, so the inner
    loop is 32-bit arithmetic)."""
    x = np.uint32(np.uint32(key) ^ np.uint32(key >> np.uint64(32)))
    return np.uint32(x + np.uint32(pos) + np.uint32(pos >> np.uint64(32)) * np.uint32(0x9E3779B9))


def store_stochastic(a, i, x, seed):
    """a[i] = x, narrowed stochastically for bfloat16 bits with 16 bits of `fmix32(seed)`
    (seed uint32 from `row_seed`); plain stores ignore the seed."""
    raise NotImplementedError


@overload(store_stochastic, inline="always", jit_options={"cache": True})
def _store_stochastic_impl(a, i, x, seed):
    if isinstance(a, types.Array) and a.dtype == types.uint16:
        def impl(a, i, x, seed):
            a[i] = f32_to_bf16_stochastic(x, fmix32(seed) >> np.uint32(16))
        return impl

    def impl(a, i, x, seed):
        a[i] = x
    return impl


def to_bfloat16(x) -> np.ndarray:
    """float array -> bfloat16 bits uint16 (nearest, ties to even), for checks and conversions."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16(h) -> np.ndarray:
    """bfloat16 bits uint16 -> float32 (exact)."""
    return (np.asarray(h, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def rounding_key(seed_key, step: int, r0: int, c0: int, stride: int) -> np.ndarray:
    """What the Adam kernels need for stochastic rounding of one parameter array, uint64 [4]:
    [stream key of this step, r0, c0, stride]; element (r, c) of the local array is global
    position (r + r0) * stride + c + c0, so the bits do not depend on the layout over ranks."""
    return np.array([rng.stream_key(int(seed_key), step), r0, c0, stride], dtype=np.uint64)
