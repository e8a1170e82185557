"""Numba kernels of the training step: pure functions over flat arrays.

Shapes use B for the batch, d for a layer's input width, n for the neurons a
rank owns in a layer, A for the most active neurons per sample. Arrays are
float32 in training and float64 in gradient checks: the kernels are generic
in the float type, they allocate nothing of their own in hot loops.

Denormals: a float32 softmax over many neurons produces exp() values and
squared gradients below 1e-38 that make every later multiply slow (x86
handles subnormals in microcode). exp() values below TINY are flushed to zero
(the float32 softmax's own exp clamps its argument at EXP32_MIN_X, so none is
ever subnormal) and Adam moments below TINY likewise: no subnormal enters a loop.

Determinism: every sum runs in sample order inside one thread, and the
threads split the rows of an array, never a row, so each element takes the
same (vectorised or scalar: under fastmath they may round differently) code
path whatever the thread count; these kernels' results do not depend on the
number of threads (tests/unit/test_threads.py checks whole training steps at
1 and 2 threads). The BLAS products beside them may round differently with
another thread count: a run is reproducible for a given seed and thread count.

Compilation: every kernel here, in dslide.rng and in dslide.lsh is cached on
disk (cache=True), the parallel ones too, so only a process's first run after
a change compiles. numba 0.68 loads a cached parallel kernel at any thread
count (tests/unit/test_numba_cache.py; older numba versions crashed). numba keys
its cache by the file that defines a kernel: after editing dslide/rng.py,
dslide/model/bfloat16.py, dslide/model/prefetch.py, dslide/lsh/_common.py or dslide/lsh/_topk.py,
whose functions other files' kernels inline, delete the __pycache__/*.nbi and *.nbc files (or
touch those files).

Memory: a lazy Adam's rows, a step's block of output rows and the first layer's rows of a
batch's features lie scattered over arrays far larger than the core's caches; the kernels that
walk them ask for the rows ROWS_AHEAD iterations on (dslide.model.prefetch), so that their loads
overlap.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import get_thread_id, njit, prange

from dslide import rng
from dslide.lsh.anchors import union_per_query
from dslide.model.bfloat16 import load, row_seed, store_nearest, store_stochastic
from dslide.model.prefetch import prefetch_row

TINY = 1e-30
#: rows ahead of the one a kernel reads whose cache lines it asks for (dslide.model.prefetch:
#: rows scattered over arrays larger than the caches then load side by side; the same results)
ROWS_AHEAD = 4


# ----------------------------------------------------------------------------
# batches
# ----------------------------------------------------------------------------


@njit(cache=True)
def gather_rows(indptr, indices, data, rows):
    """CSR rows `rows` of a matrix: (indptr int64 [len(rows)+1], indices int32, data)."""
    n = rows.shape[0]
    out_ptr = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        r = rows[i]
        out_ptr[i + 1] = out_ptr[i] + indptr[r + 1] - indptr[r]
    out_idx = np.empty(out_ptr[n], dtype=np.int32)
    out_val = np.empty(out_ptr[n], dtype=data.dtype)
    for i in range(n):
        r = rows[i]
        s = indptr[r]
        o = out_ptr[i]
        for e in range(indptr[r + 1] - s):
            out_idx[o + e] = indices[s + e]
            out_val[o + e] = data[s + e]
    return out_ptr, out_idx, out_val


@njit(cache=True)
def row_norms(indptr, data, out):
    """out[i] = sqrt(sum of data[e]^2 over row i), squared and summed in float64 (out: float64;
    float32 values near float32's maximum would overflow their own type); 1 for a row of zeros."""
    for i in range(indptr.shape[0] - 1):
        s = 0.0
        for e in range(indptr[i], indptr[i + 1]):
            v = np.float64(data[e])  # (numba's float() of a float32 stays float32)
            s += v * v
        out[i] = np.sqrt(s) if s > 0.0 else 1.0


@njit(cache=True)
def take_rows(W, rows, out):
    """out[t] = W[rows[t]] (W[rows] without numpy's fancy indexing: the rows ahead are asked
    of the caches while one is copied). W, out C-contiguous [., d]; rows int [m] in range."""
    m = rows.shape[0]
    for t in range(m):
        if t + ROWS_AHEAD < m:
            prefetch_row(W, rows[t + ROWS_AHEAD])
        r = rows[t]
        for k in range(W.shape[1]):
            out[t, k] = W[r, k]
    return out


# ----------------------------------------------------------------------------
# dense layers over sparse inputs: z[i] = b + sum_f x[i, f] W[f]
# ----------------------------------------------------------------------------


@njit(parallel=True, fastmath=True, cache=True)
def csr_times_rows(indptr, indices, data, W, b, out):
    """out[i, :] = b + sum_{e in row i} data[e] * W[indices[e], :].

    indptr int64 [B+1], indices int32, data float [nnz]; W float [d_in, n]
    (input-major), b float [n], out float [B, n].
    """
    B = indptr.shape[0] - 1
    n = W.shape[1]
    end = indptr[B]
    for i in prange(B):
        for k in range(n):
            out[i, k] = b[k]
        for e in range(indptr[i], indptr[i + 1]):
            if e + ROWS_AHEAD < end:
                prefetch_row(W, indices[e + ROWS_AHEAD])
            f = indices[e]
            x = data[e]
            for k in range(n):
                out[i, k] += x * W[f, k]


# ----------------------------------------------------------------------------
# softmax cross-entropy, split over ranks (the exponentials are numpy's SIMD
# np.exp; these kernels are the fused passes around them)
# ----------------------------------------------------------------------------


@njit(cache=True)
def label_columns(cols, labels, pos):
    """The targets' local label ids `cols` as their columns in a step's block, whose first entries
    are `labels` (distinct local ids, every target's among them): int64 [len(cols)]. pos int32
    [n_local]: scratch, every entry -1 on entry and again on return."""
    for j in range(labels.shape[0]):
        pos[labels[j]] = j
    out = np.empty(cols.shape[0], np.int64)
    for t in range(cols.shape[0]):
        out[t] = pos[cols[t]]
    for j in range(labels.shape[0]):
        pos[labels[j]] = -1
    return out


@njit(cache=True)
def label_targets(yp, yi, lo, hi):
    """The batch's labels (CSR yp int64 [B + 1], yi int [nnz]) in columns [lo, hi): (rows int64,
    local cols int64, weights float64), in the labels' order; a sample's labels share its unit of
    target mass, weight 1 / |its labels|."""
    B = yp.shape[0] - 1
    n = 0
    for e in range(yp[0], yp[B]):
        n += 1 if (yi[e] >= lo and yi[e] < hi) else 0
    rows = np.empty(n, np.int64)
    cols = np.empty(n, np.int64)
    w = np.empty(n, np.float64)
    t = 0
    for i in range(B):
        c = yp[i + 1] - yp[i]
        for e in range(yp[i], yp[i + 1]):
            y = np.int64(yi[e])
            if y >= lo and y < hi:
                rows[t] = i
                cols[t] = y - lo
                w[t] = 1.0 / c
                t += 1
    return rows, cols, w


@njit(parallel=True, cache=True)
def shift_rows(z, m):
    """In place: z[i, :] -= m[i] (m float64 [B]; rows of -inf stay -inf).

    No fastmath: unused slots hold -inf, and fastmath lets LLVM assume no value
    is infinite (its result on -inf is then undefined).
    """
    for i in prange(z.shape[0]):
        mi = z.dtype.type(m[i])
        for a in range(z.shape[1]):
            z[i, a] -= mi


SUM_LANES = 8
"""Partial sums of a row in `flush_sum_rows` and in the binary loss's sums (dslide.model.loss).
`_lane_sum` spells its 8 lanes out as scalars: change both together."""


#: rows a thread of `flush_sum_rows` takes at once (one float64 scratch row serves them)
FLUSH_ROWS = 16


@njit(cache=True, inline="always")
def _lane_sum(buf, n):
    """The sum of buf[:n] (float64) in SUM_LANES partial sums, column a into lane a % SUM_LANES,
    added in lane order, then the tail: the 8 lanes as scalars (an array of lanes stays in
    memory), so LLVM keeps them in registers and vectorises them."""
    body = n - n % SUM_LANES
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0.0
    for a in range(0, body, SUM_LANES):
        l0 += buf[a]
        l1 += buf[a + 1]
        l2 += buf[a + 2]
        l3 += buf[a + 3]
        l4 += buf[a + 4]
        l5 += buf[a + 5]
        l6 += buf[a + 6]
        l7 += buf[a + 7]
    s = 0.0
    s += l0
    s += l1
    s += l2
    s += l3
    s += l4
    s += l5
    s += l6
    s += l7
    for a in range(body, n):
        s += buf[a]
    return s


@njit(cache=True)
def _flush_sum_chunk(e, out, lo, hi):
    """`flush_sum_rows` of rows lo..hi-1: each row flushed into a float64 copy, written back, and
    the copy summed in lanes. A function of its own, not the body of the prange loop: LLVM
    vectorises its loops here, and did not in the loop's outlined body. Every store is
    unconditional: a flush in place (`row[a] = v if v >= tiny else zero`) compiles to masked
    stores, microcoded on some CPUs (AMD's)."""
    tiny = e.dtype.type(TINY)
    zero = e.dtype.type(0.0)
    n = e.shape[1]
    buf = np.empty(n)
    for i in range(lo, hi):
        row = e[i]
        for a in range(n):
            v = row[a]
            buf[a] = np.float64(v if v >= tiny else zero)
        for a in range(n):
            row[a] = e.dtype.type(buf[a])  # exact: buf holds e's own values
        out[i] += _lane_sum(buf, n)


@njit(parallel=True, cache=True)
def flush_sum_rows(e, out):
    """In place: e[i, a] = 0 where e < TINY (no subnormal leaves); out[i] += sum_a e[i, a] (float64).

    Each row sums in SUM_LANES float64 partial sums, column a into lane a % SUM_LANES,
    added together in lane order, then its tail: a fixed order whatever the CPU's vector width
    (strict float semantics, no fastmath), which LLVM can still vectorise lane by lane. The
    flush is a pass of its own before the sums: as one loop the two did not vectorise. Threads
    take FLUSH_ROWS rows at a time (`_flush_sum_chunk`); a row's result does not depend on which.
    """
    B = e.shape[0]
    chunks = (B + FLUSH_ROWS - 1) // FLUSH_ROWS
    for q in prange(chunks):
        _flush_sum_chunk(e, out, q * FLUSH_ROWS, min(B, (q + 1) * FLUSH_ROWS))


# exp in float32 for `exp_flush_sum_rows` (Cephes' expf: x = k ln2 + r, |r| <= ln2 / 2, exp(r) a
# polynomial, 2^k from its exponent bits); within 1 ulp of the float64 exp rounded for x <= 88
EXP32_LOG2E = np.float32(1.44269504088896341)
EXP32_LN2_HI = np.float32(0.693359375)  # ln 2 = HI + LO; k * HI is exact for |k| <= 128
EXP32_LN2_LO = np.float32(-2.12194440e-4)
EXP32_P = (np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3),
           np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1))
#: below it exp is under TINY (flushed): the argument is clamped there (and a NaN with it), so 2^k
#: stays a normal float
EXP32_MIN_X = np.float32(-87.0)
#: x + 1.5 * 2^23 - 1.5 * 2^23 rounds x to an integer (|x| < 2^22)
EXP32_ROUND = np.float32(12582912.0)


@njit(cache=True)
def _exp_flush_sum_chunk(z, m, out, lo, hi):
    """`exp_flush_sum_rows` of rows lo..hi-1: each argument's reduced r and its 2^k (as a float,
    then as exponent bits) into scratch rows, the polynomial of r written over the row, the
    product flushed into a float64 copy, written back and the copy summed in `flush_sum_rows`'s
    lanes. Each loop vectorises; every store is unconditional (`_flush_sum_chunk`). The reduction
    and the polynomial are loops of their own: as one loop (a long chain of dependent operations
    per element) they ran slower on an AVX2 CPU, the same bits either way."""
    P0, P1, P2, P3, P4, P5 = EXP32_P
    tiny = np.float32(TINY)
    n = z.shape[1]
    two_k = np.empty(n, np.float32)
    two_k_bits = two_k.view(np.int32)
    rr = np.empty(n, np.float32)
    buf = np.empty(n)
    for i in range(lo, hi):
        row = z[i]
        mi = np.float32(m[i])
        for a in range(n):
            x = row[a] - mi  # shift_rows' subtraction
            x = x if x > EXP32_MIN_X else EXP32_MIN_X
            k = x * EXP32_LOG2E + EXP32_ROUND - EXP32_ROUND
            k = k if k < np.float32(127.0) else np.float32(127.0)  # exp(x >= 88.72) overflows to inf
            r = x - k * EXP32_LN2_HI
            rr[a] = r - k * EXP32_LN2_LO
            two_k[a] = k + np.float32(127.0)
        for a in range(n):
            r = rr[a]
            p = P0 * r + P1
            p = p * r + P2
            p = p * r + P3
            p = p * r + P4
            p = p * r + P5
            row[a] = p * (r * r) + r + np.float32(1.0)
        for a in range(n):
            two_k_bits[a] = np.int32(two_k[a]) << 23
        for a in range(n):
            v = row[a] * two_k[a]
            buf[a] = np.float64(v if v >= tiny else np.float32(0.0))
        for a in range(n):
            row[a] = np.float32(buf[a])
        out[i] += _lane_sum(buf, n)


@njit(parallel=True, cache=True)
def exp_flush_sum_rows(z, m, out):
    """In place on float32 z [B, n]: z[i, a] = exp(z[i, a] - m[i]) (the difference in float32, as
    `shift_rows`), 0 where that is below TINY or NaN; out[i] += the row's sum in float64, in
    `flush_sum_rows`'s lanes: `shift_rows`, an exp and `flush_sum_rows` in one pass.

    The exp is this module's own (EXP32_*, within 1 ulp of the float64 exp rounded for x <= 88;
    numpy's float32 exp is a scalar call per element on some CPUs, an AVX2 one among them), in
    strict float arithmetic: the same bits on any CPU, vectorised or not. An argument of -inf
    gives 0, +inf gives inf. m float64 [B] (no NaN; rows of -inf pass m = 0). Threads take
    FLUSH_ROWS rows at a time; a row's result does not depend on which."""
    B = z.shape[0]
    chunks = (B + FLUSH_ROWS - 1) // FLUSH_ROWS
    for q in prange(chunks):
        _exp_flush_sum_chunk(z, m, out, q * FLUSH_ROWS, min(B, (q + 1) * FLUSH_ROWS))


@njit(parallel=True, cache=True)
def scale_flush_rows(e, scale):
    """In place: e[i, :] *= scale[i], flushing results below TINY to zero."""
    tiny = e.dtype.type(TINY)
    zero = e.dtype.type(0.0)
    for i in prange(e.shape[0]):
        c = e.dtype.type(scale[i])
        for a in range(e.shape[1]):
            v = e[i, a] * c
            e[i, a] = v if v >= tiny else zero


# ----------------------------------------------------------------------------
# Adam (Kingma & Ba 2015) with bias correction, lazy over rows; moments in a float
# type or in bfloat16 (dslide.model.bfloat16)
# ----------------------------------------------------------------------------

MOMENT_DTYPES = {"float32": np.float32, "float64": np.float64, "bfloat16": np.uint16}
"""Storage of Adam's moments by configuration name (bfloat16: uint16 bit patterns)."""


@njit(cache=True, inline="always")
def _adam_elem(w, m, v, g, hp):
    """One Adam update of a scalar; returns (w, m, v). hp from `adam_params`.

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    w -= lr_t m / (sqrt(v) + eps_t), with lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) and
    eps_t = eps sqrt(1 - b2^t): algebraically w -= lr m_hat / (sqrt(v_hat) + eps).
    Everything stays in the arrays' float type (a float64 constant would
    promote the whole update and stop it vectorising well).
    """
    m = hp[0] * m + hp[1] * g
    v = hp[2] * v + hp[3] * g * g
    m = m if abs(m) >= hp[6] else hp[7]
    v = v if v >= hp[6] else hp[7]
    return w - hp[4] * m / (np.sqrt(v) + hp[5]), m, v


@njit(cache=True, inline="always")
def _prefetch_rows(W, M, Vm, r):
    """Hint: row r of the weights and of both moments will be read and written soon."""
    prefetch_row(W, r)
    prefetch_row(M, r)
    prefetch_row(Vm, r)


@njit(cache=True, inline="always")
def _adam_row(w, m, v, g, hp, rk, r):
    """Adam on row views w, m, v (moments float or bfloat16 bits) with gradient row g;
    r: the row's local index (its stochastic-rounding position, see `rounding_key`)."""
    seed = row_seed(rk[0], (np.uint64(r) + rk[1]) * rk[3] + rk[2])
    for k in range(w.shape[0]):
        wk, mk, vk = _adam_elem(w[k], load(m, k), load(v, k), g[k], hp)
        w[k] = wk
        store_nearest(m, k, mk)
        store_stochastic(v, k, vk, np.uint32(seed + np.uint32(k)))


@njit(cache=True, inline="always")
def _adam_one(w, m, v, i, g, hp, rk):
    """Adam on element i of 1-D w, m, v (a bias), global position i + rk[2] (row 0)."""
    wk, mk, vk = _adam_elem(w[i], load(m, i), load(v, i), g, hp)
    w[i] = wk
    store_nearest(m, i, mk)
    store_stochastic(v, i, vk, row_seed(rk[0], rk[1] * rk[3] + rk[2] + np.uint64(i)))


def adam_params(lr: float, b1: float, b2: float, eps: float, t: int, dtype) -> np.ndarray:
    """Adam's constants at step t >= 1 as an array of `dtype` for the kernels:
    [b1, 1 - b1, b2, 1 - b2, lr_t, eps_t, TINY, 0]."""
    c2 = np.sqrt(1.0 - b2**t)
    return np.array([b1, 1.0 - b1, b2, 1.0 - b2, lr * c2 / (1.0 - b1**t), eps * c2, TINY, 0.0], dtype=dtype)


NO_ROUNDING = np.zeros(4, dtype=np.uint64)
"""`rounding_key` stand-in for moments stored in a float type (nothing is drawn). Callers pass
it explicitly: an omitted array argument is typed by its value, which numba's on-disk cache
cannot match across processes (the kernel would compile in every run)."""


@njit(parallel=True, fastmath=True, cache=True)
def adam_dense(W, M, V, G, hp, rk=NO_ROUNDING):
    """Adam on every element of W (W, M, V, G: C-contiguous, same shape, 1-D or 2-D;
    M, V float or bfloat16 bits; rk from `rounding_key` for W's layout).

    Rows in parallel, each row's elements in one loop, so an element takes the
    same (vectorised or scalar) path whatever the thread count. A 1-D array is one row.
    """
    C = W.shape[-1]
    w = W.reshape((-1, C))
    m = M.reshape((-1, C))
    v = V.reshape((-1, C))
    g = G.reshape((-1, C))
    for r in prange(w.shape[0]):
          _adam_row(w[r], m[r], v[r], g[r], hp, rk, r)


#: the bits of a digit in `sort_ids`' passes (a pass counts 2^SORT_DIGIT_BITS buckets)
SORT_DIGIT_BITS = 11


@njit(cache=True)
def sort_ids(a, tmp):
    """Sort the non-negative int32 a in place, ascending: least significant digit first, one
    stable counting pass per SORT_DIGIT_BITS bits of the largest value (at most three), O(len(a))
    where a comparison sort takes O(len(a) log len(a)). tmp int32 [len(a)]: scratch."""
    n = a.shape[0]
    top = 0
    for i in range(n):
        top = a[i] if a[i] > top else top
    size = 1 << SORT_DIGIT_BITS
    mask = size - 1
    cnt = np.empty(size, np.int64)
    src, dst = a, tmp
    shift = 0
    passes = 0
    while passes == 0 or (top >> shift) > 0:
        cnt[:] = 0
        for i in range(n):
            cnt[(src[i] >> shift) & mask] += 1
        total = 0
        for b in range(size):
            c = cnt[b]
            cnt[b] = total
            total += c
        for i in range(n):
            d = (src[i] >> shift) & mask
            dst[cnt[d]] = src[i]
            cnt[d] += 1
        src, dst = dst, src
        shift += SORT_DIGIT_BITS
        passes += 1
    if passes % 2 == 1:  # the last pass wrote tmp
        for i in range(n):
            a[i] = tmp[i]


@njit(cache=True)
def group_by_row(rows, n_rows, count, order):
    """Counting sort of entry indices by their row, stable in entry order.

    rows int32 [E] in [0, n_rows); count int32 [n_rows] all zero on entry
    (scratch, zero again on return). Returns (touched int32 [T]: the rows
    seen, ascending; start int64 [T + 1]) and fills order int64 [E] so that
    entries of touched[t] are order[start[t]:start[t+1]], in entry order.
    Ascending rows: an update of them (`rows_grad_adam`) walks the weights and
    both moments through memory in one direction, which the caches and page
    tables serve better than a random order of the same rows.
    """
    E = rows.shape[0]
    touched = np.empty(min(E, n_rows), dtype=np.int32)
    T = 0
    for e in range(E):
          r = rows[e]
          if count[r] == 0:
                touched[T] = r
                T += 1
          count[r] += 1
    sort_ids(touched[:T], np.empty(T, dtype=np.int32))
    start = np.empty(T + 1, dtype=np.int64)
    start[0] = 0
    for t in range(T):
          r = touched[t]
          start[t + 1] = start[t] + count[r]
          count[r] = np.int32(start[t])  # becomes the write cursor of row r
    for e in range(E):
          r = rows[e]
          order[count[r]] = e
          count[r] += 1
    for t in range(T):
          count[touched[t]] = 0
    return touched[:T], start


@njit(parallel=True, fastmath=True, cache=True)
def rows_grad_adam(touched, start, order, samples, coefs, V, W, M, Vm, bias, bM, bV, hp, gbuf, dirty,
                       rk=NO_ROUNDING, rkb=NO_ROUNDING):
    """Lazy Adam on the rows of W that received gradient.

    The gradient of row r is g_r = sum_{e: rows[e] = r} coefs[e] * V[samples[e], :]
    (and, when bias has rows, g_b[r] = sum_e coefs[e]). For a sparse layer the
    rows are active neurons, coefs the logit gradients and V the layer input;
    for a dense layer over a sparse input the rows are input features, coefs
    the input values and V the output gradients.

    touched int32 [T], start int64 [T+1], order int64 [E] from `group_by_row`;
    samples int32 [E]; coefs float [E]; V float [B, d]; W float [R, d], M, Vm [R, d] float
    or bfloat16 bits; bias, bM, bV [R] or empty; hp from `adam_params`; gbuf float
    [threads, d] scratch; dirty uint8 [R] set to 1 for every updated row; rk, rkb:
    `rounding_key` of W and of the bias.
    """
    d = W.shape[1]
    has_bias = bias.shape[0] > 0
    T = touched.shape[0]
    for t in prange(T):
          if t + ROWS_AHEAD < T:
                _prefetch_rows(W, M, Vm, touched[t + ROWS_AHEAD])
          r = touched[t]
          g = gbuf[get_thread_id()]
          for k in range(d):
                g[k] = 0.0
          gb = 0.0
          for q in range(start[t], start[t + 1]):
                e = order[q]
                c = coefs[e]
                s = samples[e]
                gb += c
                for k in range(d):
                    g[k] += c * V[s, k]
          _adam_row(W[r], M[r], Vm[r], g, hp, rk, r)
          if has_bias:
                _adam_one(bias, bM, bV, r, gb, hp, rkb)
          dirty[r] = 1


# ----------------------------------------------------------------------------
# active sets
# ----------------------------------------------------------------------------


@njit(cache=True)
def batch_labels(y, lo, hi, mark):
    """The distinct ids of y (int32) in [lo, hi), less lo, ascending (int32): the labels a rank's
    slice of an output owns in a batch. mark uint8 [hi - lo]: all zero on entry (scratch, zero
    again on return)."""
    out = np.empty(y.shape[0], np.int32)
    n = 0
    for e in range(y.shape[0]):
        j = y[e]
        if j >= lo and j < hi:
            loc = j - lo
            if mark[loc] == 0:
                mark[loc] = 1
                out[n] = loc
                n += 1
    for t in range(n):
        mark[out[t]] = 0
    labels = out[:n]
    sort_ids(labels, np.empty(n, np.int32))
    return labels


@njit(cache=True)
def drop_taken(drawn, taken, mark):
    """drawn's ids that are not in taken, in drawn's order. mark uint8 [n]: all zero on entry
    (scratch, zero again on return)."""
    for t in range(taken.shape[0]):
        mark[taken[t]] = 1
    out = np.empty(drawn.shape[0], drawn.dtype)
    n = 0
    for t in range(drawn.shape[0]):
        if mark[drawn[t]] == 0:
            out[n] = drawn[t]
            n += 1
    for t in range(taken.shape[0]):
        mark[taken[t]] = 0
    return out[:n]


@njit(parallel=True, fastmath=True, cache=True)
def rows_grad(touched, start, order, samples, coefs, V, G):
    """G[r, :] = sum_{e: rows[e] = r} coefs[e] * V[samples[e], :] for the touched rows
    (the gradient `rows_grad_adam` applies, written out densely; other rows untouched)."""
    d = G.shape[1]
    for t in prange(touched.shape[0]):
          r = touched[t]
          for k in range(d):
                G[r, k] = 0.0
          for q in range(start[t], start[t + 1]):
                e = order[q]
                c = coefs[e]
                s = samples[e]
                for k in range(d):
                    G[r, k] += c * V[s, k]


#: `shared_sample` reads its draws back in order from the markers (a pass over n bytes) rather
#: than sorting them where n is at most this many times the draws
SAMPLE_SCAN = 32


@njit(cache=True)
def shared_sample(k, n, size, mark):
    """`size` distinct integers of [0, n), sorted, from stream k.

    Rejection against a marker array (mark uint8 [n], all zero; zero again on
    return): O(size) draws while size <= n / 2; past that it takes every
    neuron but a random few, equally uniform.
    """
    size = min(size, n)
    take = size if 2 * size <= n else n - size
    out = np.empty(take, dtype=np.int32)
    c = 0
    draw = 0
    while c < take:
          j = rng.randbelow(k, draw, n)
          draw += 1
          if mark[j] == 0:
                mark[j] = 1
                out[c] = j
                c += 1
    if take == size:
          if n <= SAMPLE_SCAN * take:  # read back in order from the markers: no sort
                c = 0
                for j in range(n):
                      out[c] = j  # written past the last one only while c < take
                      c += np.int64(mark[j])
                      mark[j] = 0
                      if c == take:
                            break
                return out
          for a in range(take):
                mark[out[a]] = 0
          out.sort()
          return out
    keep = np.empty(size, dtype=np.int32)  # the complement of the few drawn
    c = 0
    for j in range(n):
          if mark[j] == 0:
                keep[c] = j
                c += 1
          else:
                mark[j] = 0
    return keep



@njit(parallel=True, fastmath=True, cache=True)
def adam_rows(rows, G, gb, W, M, Vm, bias, bM, bV, hp, dirty, rk=NO_ROUNDING, rkb=NO_ROUNDING):
    """Adam on rows `rows` of W (and bias) with their gradients G [len(rows), d], gb [len(rows)]
    (moments float or bfloat16 bits; rk, rkb: `rounding_key` of W and of the bias)."""
    n = rows.shape[0]
    for t in prange(n):
          if t + ROWS_AHEAD < n:
                _prefetch_rows(W, M, Vm, rows[t + ROWS_AHEAD])
          r = rows[t]
          _adam_row(W[r], M[r], Vm[r], G[t], hp, rk, r)
          _adam_one(bias, bM, bV, r, gb[t], hp, rkb)
          dirty[r] = 1


@njit(parallel=True, fastmath=True, cache=True)
def adam_rows_nobias(rows, G, W, M, Vm, hp, rk=NO_ROUNDING):
    """Adam on rows `rows` of W with their gradients G [len(rows), d] (distinct rows)."""
    n = rows.shape[0]
    for t in prange(n):
          if t + ROWS_AHEAD < n:
                _prefetch_rows(W, M, Vm, rows[t + ROWS_AHEAD])
          r = rows[t]
          _adam_row(W[r], M[r], Vm[r], G[t], hp, rk, r)


def thread_scratch(n: int, dtype) -> np.ndarray:
    """A zeroed [NUMBA_NUM_THREADS, n] scratch array, one row per numba thread.

    Kernels index it by get_thread_id(), which is below the thread count in
    force when they run: sized by the most threads numba can ever run
    (set_num_threads cannot exceed NUMBA_NUM_THREADS), not by the count when
    the layer was built, so a later set_num_threads(more) stays in bounds.
    """
    return np.zeros((numba.config.NUMBA_NUM_THREADS, n), dtype=dtype)


# ----------------------------------------------------------------------------
# dropout and dense helpers
# ----------------------------------------------------------------------------


@njit(parallel=True, cache=True)
def dropout_mask(k, sample_ids, j0, n, rate, out):
    """out[i, j] = 1 / (1 - rate) with probability 1 - rate, else 0, from stream k at (sample,
    column j0 + j): columns j0..j0+n-1 of the whole layer's mask."""
    keep = 1.0 / (1.0 - rate)
    for i in prange(sample_ids.shape[0]):
          ks = rng.key(k, sample_ids[i])
          for j in range(n):
                out[i, j] = keep if rng.uniform(ks, j0 + j) >= rate else 0.0


# ----------------------------------------------------------------------------
# each sample's own candidates (lsh.scope = "sample"): scored by gathers beside
# the shared block, a few per sample
# ----------------------------------------------------------------------------


#: per sample i, the first k distinct ids of its buckets not marked (scored for every
#: sample already), in rank order: lsh.anchors' union of buckets, per query. The name is
#: the one dslide.model.candidates.anchor calls.
own_candidates = union_per_query


@njit(parallel=True, fastmath=True, cache=True)
def own_scores(X, W, b, P, out):
    """out[i, t] = W[P[i, t]] . X[i] + b[P[i, t]] (-inf where P[i, t] < 0)."""
    B, k = P.shape
    d = X.shape[1]
    for i in prange(B):
        for t in range(k):
            j = P[i, t]
            if j < 0:
                out[i, t] = -np.inf
                continue
            s = 0.0
            for c in range(d):
                s += W[j, c] * X[i, c]
            out[i, t] = s + b[j]


@njit(parallel=True, fastmath=True, cache=True)
def own_dx(G, W, P, dx):
    """dx[i] += sum_t G[i, t] W[P[i, t]] (entries with P[i, t] < 0 skipped)."""
    B, k = P.shape
    d = W.shape[1]
    for i in prange(B):
        for t in range(k):
            j = P[i, t]
            if j < 0:
                continue
            g = G[i, t]
            if g == 0:
                continue
            for c in range(d):
                dx[i, c] += g * W[j, c]


@njit(parallel=True, fastmath=True, cache=True)
def own_dw(start, order, G, X, k, out, gb):
    """out[u] = sum of G.flat[o] X[o // k] and gb[u] = sum of G.flat[o], over the occurrences
    o = order[start[u]:start[u + 1]] of row u (out [U, d], gb [U])."""
    U = start.shape[0] - 1
    d = X.shape[1]
    for u in prange(U):
        for c in range(d):
            out[u, c] = 0.0
        s = 0.0
        for q in range(start[u], start[u + 1]):
            o = order[q]
            i = o // k
            g = G[i, o - i * k]
            s += g
            for c in range(d):
                out[u, c] += g * X[i, c]
        gb[u] = s
