"""Numba kernels of the training step: pure functions over flat arrays.

Shapes use B for the batch, d for a layer's input width, n for the neurons a
rank owns in a layer, A for the most active neurons per sample. Arrays are
float32 in training and float64 in gradient checks: the kernels are generic
in the float type, they allocate nothing of their own in hot loops.

Denormals: a float32 softmax over many neurons produces exp() values and
squared gradients below 1e-38 that make every later multiply slow (x86
handles subnormals in microcode). Exponents below -80 are flushed to zero
and Adam moments below 1e-30 likewise, so no subnormal ever enters a loop.

Determinism: every sum runs in sample order inside one thread, so results
do not depend on the number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import get_num_threads, get_thread_id, njit, prange

from dslide import rng

EXP_FLOOR = -80.0  # exp(-80) = 1.8e-35: still a normal float32
TINY = 1e-30


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


# ----------------------------------------------------------------------------
# dense layers over sparse inputs: z[i] = b + sum_f x[i, f] W[f]
# ----------------------------------------------------------------------------


@njit(parallel=True, fastmath=True)
def csr_times_rows(indptr, indices, data, W, b, out):
    """out[i, :] = b + sum_{e in row i} data[e] * W[indices[e], :].

    indptr int64 [B+1], indices int32, data float [nnz]; W float [d_in, n]
    (input-major), b float [n], out float [B, n].
    """
    B = indptr.shape[0] - 1
    n = W.shape[1]
    for i in prange(B):
        for k in range(n):
            out[i, k] = b[k]
        for e in range(indptr[i], indptr[i + 1]):
            f = indices[e]
            x = data[e]
            for k in range(n):
                out[i, k] += x * W[f, k]


@njit(parallel=True, fastmath=True)
def rows_dot_csr(indptr, indices, W, dz, out):
    """out[e] = W[indices[e], :] . dz[i, :] for every entry e of row i.

    The gradient of a sparse input's stored values: W float [d_in, n],
    dz float [B, n], out float [nnz].
    """
    B = indptr.shape[0] - 1
    n = W.shape[1]
    for i in prange(B):
        for e in range(indptr[i], indptr[i + 1]):
            f = indices[e]
            acc = 0.0
            for k in range(n):
                acc += W[f, k] * dz[i, k]
            out[e] = acc


# ----------------------------------------------------------------------------
# sparse (LSH) layers: z[i, a] = b[j] + W[j] . x[i] for j = ids[i, a]
# ----------------------------------------------------------------------------


@njit(parallel=True, fastmath=True)
def active_forward(x, W, b, ids, cnt, z):
    """z[i, a] = b[ids[i, a]] + W[ids[i, a], :] . x[i, :] for a < cnt[i].

    x float [B, d]; W float [n, d] (neuron-major); b float [n];
    ids int32 [B, A] (local neuron ids, padded); cnt int32 [B]; z float [B, A].
    """
    B = x.shape[0]
    d = x.shape[1]
    for i in prange(B):
        for a in range(cnt[i]):
            j = ids[i, a]
            acc = 0.0
            for k in range(d):
                acc += W[j, k] * x[i, k]
            z[i, a] = acc + b[j]


@njit(parallel=True, fastmath=True)
def active_backward_input(W, ids, cnt, dz, dx):
    """dx[i, :] = sum_a dz[i, a] W[ids[i, a], :]: the partial gradient of the layer input."""
    B = dx.shape[0]
    d = dx.shape[1]
    for i in prange(B):
        for k in range(d):
            dx[i, k] = 0.0
        for a in range(cnt[i]):
            j = ids[i, a]
            g = dz[i, a]
            for k in range(d):
                dx[i, k] += g * W[j, k]


@njit(parallel=True)
def relu_active(z, cnt):
    """In place: z[i, a] = max(z[i, a], 0) for a < cnt[i]."""
    for i in prange(z.shape[0]):
        for a in range(cnt[i]):
            if z[i, a] < 0.0:
                z[i, a] = 0.0


# ----------------------------------------------------------------------------
# softmax cross-entropy, split over ranks
#
# An LSH layer's logits come in two blocks: z [B, A] over each sample's own
# active neurons (cnt[i] of them) and zR [B, R] over the shared random
# neurons every sample of the batch scores (R may be 0).
# ----------------------------------------------------------------------------


@njit(parallel=True)
def softmax_local_stats(z, cnt, zR, mx, sumexp):
    """Per sample: mx[i] = max of its logits here, sumexp[i] = sum exp(z - mx[i]) (float64).

    A sample with no active neuron here gets (-inf, 0), the identity of the merge.
    """
    R = zR.shape[1]
    for i in prange(z.shape[0]):
        m = -np.inf
        for a in range(cnt[i]):
            if z[i, a] > m:
                m = z[i, a]
        for a in range(R):
            if zR[i, a] > m:
                m = zR[i, a]
        s = 0.0
        for a in range(cnt[i]):
            t = z[i, a] - m
            if t > EXP_FLOOR:
                s += np.exp(t)
        for a in range(R):
            t = zR[i, a] - m
            if t > EXP_FLOOR:
                s += np.exp(t)
        mx[i] = m
        sumexp[i] = s


@njit(inline="always")
def _xent_entry(zv, y, gmax, gsum, logS, labelled, scale):
    """(dz, loss) of one logit: dz = scale (p - y), loss = -y log p."""
    t = zv - gmax
    p = np.exp(t) / gsum if t > EXP_FLOOR and labelled else 0.0
    if p < TINY:
        p = 0.0
    loss = y * (logS - t) if y != 0.0 else 0.0
    return scale * (p - y), loss


@njit(parallel=True)
def softmax_xent_grad(z, cnt, zC, targetC, lab_ptr, gmax, gsum, scale, dz, dzC):
    """dz = scale * (p - y) over both blocks, p = exp(z - M) / S from the global (M, S).

    z [B, A] holds each sample's own candidates (never labels, target 0); zC
    [B, C] the shared block with targetC [B, C], each sample's label weights
    (1/|labels|, summing to 1 over all ranks); lab_ptr int64 [B+1] of the
    batch's labels (a sample without labels has zero loss and zero gradient);
    gmax, gsum float64 [B]. Returns the partial loss sum -y log p over this
    rank's neurons.
    """
    B = z.shape[0]
    C = zC.shape[1]
    part = np.zeros(B)
    for i in prange(B):
        logS = np.log(gsum[i]) if gsum[i] > 0.0 else 0.0
        labelled = lab_ptr[i + 1] > lab_ptr[i]
        acc = 0.0
        for a in range(cnt[i]):
            g, l = _xent_entry(z[i, a], 0.0, gmax[i], gsum[i], logS, labelled, scale)
            dz[i, a] = g
        for a in range(C):
            g, l = _xent_entry(zC[i, a], targetC[i, a], gmax[i], gsum[i], logS, labelled, scale)
            dzC[i, a] = g
            acc += l
        part[i] = acc
    return part.sum()


@njit(parallel=True)
def relu_backward_active(dz, z, cnt):
    """In place: dz[i, a] = 0 where the ReLU output z[i, a] is 0."""
    for i in prange(dz.shape[0]):
        for a in range(cnt[i]):
            if z[i, a] <= 0.0:
                dz[i, a] = 0.0


# ----------------------------------------------------------------------------
# Adam (Kingma & Ba 2015) with bias correction, lazy over rows
# ----------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _adam_elem(w, m, v, g, b1, b2, lr_t, eps_t):
    """One Adam update of a scalar; returns (w, m, v).

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
    w -= lr_t m / (sqrt(v) + eps_t), with lr_t = lr sqrt(1 - b2^t) / (1 - b1^t) and
    eps_t = eps sqrt(1 - b2^t): algebraically w -= lr m_hat / (sqrt(v_hat) + eps).
    """
    m = b1 * m + (1.0 - b1) * g
    v = b2 * v + (1.0 - b2) * g * g
    if abs(m) < TINY:
        m = 0.0
    if v < TINY:
        v = 0.0
    w = w - lr_t * m / (np.sqrt(v) + eps_t)
    return w, m, v


def adam_factors(lr: float, b1: float, b2: float, eps: float, t: int) -> tuple[float, float]:
    """(lr_t, eps_t) of step t >= 1, for `_adam_elem`."""
    c2 = np.sqrt(1.0 - b2**t)
    return lr * c2 / (1.0 - b1**t), eps * c2


@njit(parallel=True, fastmath=True)
def adam_dense(W, M, V, G, b1, b2, lr_t, eps_t):
    """Adam on every element of W (flat views of the same size)."""
    w = W.reshape(-1)
    m = M.reshape(-1)
    v = V.reshape(-1)
    g = G.reshape(-1)
    for e in prange(w.shape[0]):
        w[e], m[e], v[e] = _adam_elem(w[e], m[e], v[e], g[e], b1, b2, lr_t, eps_t)


@njit(cache=True)
def group_by_row(rows, n_rows, count, order):
    """Counting sort of entry indices by their row, stable in entry order.

    rows int32 [E] in [0, n_rows); count int32 [n_rows] all zero on entry
    (scratch, zero again on return). Returns (touched int32 [T]: the rows
    seen, in order of first appearance; start int64 [T + 1]) and fills
    order int64 [E] so that entries of touched[t] are order[start[t]:start[t+1]].
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


@njit(parallel=True, fastmath=True)
def rows_grad_adam(touched, start, order, samples, coefs, V, W, M, Vm, bias, bM, bV,
                   b1, b2, lr_t, eps_t, gbuf, dirty):
    """Lazy Adam on the rows of W that received gradient.

    The gradient of row r is g_r = sum_{e: rows[e] = r} coefs[e] * V[samples[e], :]
    (and, when bias has rows, g_b[r] = sum_e coefs[e]). For a sparse layer the
    rows are active neurons, coefs the logit gradients and V the layer input;
    for a dense layer over a sparse input the rows are input features, coefs
    the input values and V the output gradients.

    touched int32 [T], start int64 [T+1], order int64 [E] from `group_by_row`;
    samples int32 [E]; coefs float [E]; V float [B, d]; W, M, Vm float [R, d];
    bias, bM, bV float [R] or empty; gbuf float [threads, d] scratch;
    dirty uint8 [R] set to 1 for every updated row.
    """
    d = W.shape[1]
    has_bias = bias.shape[0] > 0
    for t in prange(touched.shape[0]):
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
        for k in range(d):
            W[r, k], M[r, k], Vm[r, k] = _adam_elem(W[r, k], M[r, k], Vm[r, k], g[k], b1, b2, lr_t, eps_t)
        if has_bias:
            bias[r], bM[r], bV[r] = _adam_elem(bias[r], bM[r], bV[r], gb, b1, b2, lr_t, eps_t)
        dirty[r] = 1


# ----------------------------------------------------------------------------
# active sets
# ----------------------------------------------------------------------------


@njit(cache=True)
def shared_sample(k, n, size):
    """`size` distinct integers of [0, n), sorted, from stream k (Floyd's algorithm, O(size log size))."""
    size = min(size, n)
    chosen = np.empty(size, dtype=np.int32)
    seen = set()
    c = 0
    for j in range(n - size, n):
        t = rng.randbelow(k, j, j + 1)
        v = t if t not in seen else j
        seen.add(v)
        chosen[c] = v
        c += 1
    chosen.sort()
    return chosen


@njit(parallel=True)
def select_active(q_ptr, q_ids, max_active, shared_pos, ids, cnt):
    """Each sample's own active neurons: its LSH candidates (q_ptr/q_ids, local
    ids, best first) that are not in the shared block (shared_pos[j] >= 0),
    at most max_active. Outputs ids int32 [B, max_active], cnt int32 [B].
    """
    B = q_ptr.shape[0] - 1
    for i in prange(B):
        c = 0
        for e in range(q_ptr[i], q_ptr[i + 1]):
            if c >= max_active:
                break
            j = q_ids[e]
            if shared_pos[j] < 0:
                ids[i, c] = j
                c += 1
        cnt[i] = c


@njit(parallel=True)
def shared_targets(lab_ptr, lab_ids, lo, hi, shared_pos, target):
    """target[i, shared_pos[g - lo]] = 1 / |labels of i| for each label g of sample i owned here.

    Every owned label of the batch is in the shared block. target float [B, C], zeroed.
    """
    for i in prange(lab_ptr.shape[0] - 1):
        n_lab = lab_ptr[i + 1] - lab_ptr[i]
        if n_lab == 0:
            continue
        w = 1.0 / n_lab
        for e in range(lab_ptr[i], lab_ptr[i + 1]):
            g = lab_ids[e]
            if lo <= g < hi:
                target[i, shared_pos[g - lo]] = w


@njit(parallel=True, fastmath=True)
def adam_rows(rows, G, gb, W, M, Vm, bias, bM, bV, b1, b2, lr_t, eps_t, dirty):
    """Adam on rows `rows` of W (and bias) with their gradients G [len(rows), d], gb [len(rows)]."""
    d = W.shape[1]
    for t in prange(rows.shape[0]):
        r = rows[t]
        for k in range(d):
            W[r, k], M[r, k], Vm[r, k] = _adam_elem(W[r, k], M[r, k], Vm[r, k], G[t, k], b1, b2, lr_t, eps_t)
        bias[r], bM[r], bV[r] = _adam_elem(bias[r], bM[r], bV[r], gb[t], b1, b2, lr_t, eps_t)
        dirty[r] = 1


def thread_scratch(n: int, dtype) -> np.ndarray:
    """A zeroed [threads, n] scratch array, one row per numba thread."""
    return np.zeros((get_num_threads(), n), dtype=dtype)


# ----------------------------------------------------------------------------
# dropout and dense helpers
# ----------------------------------------------------------------------------


@njit(parallel=True)
def dropout_mask(k, sample_ids, n, rate, out):
    """out[i, j] = 1 / (1 - rate) with probability 1 - rate, else 0, from stream k at (sample, j)."""
    keep = 1.0 / (1.0 - rate)
    for i in prange(sample_ids.shape[0]):
        ks = rng.key(k, sample_ids[i])
        for j in range(n):
            out[i, j] = keep if rng.uniform(ks, j) >= rate else 0.0


@njit(parallel=True)
def dense_softmax_xent(z, lab_ptr, lab_ids, lo, hi, dz_scale, gmax, gsum, dz):
    """Full softmax over a rank's column slice z [B, n] (all neurons active).

    dz = scale * (p - y) where y spreads 1/|labels| over the sample's labels
    in [lo, hi); dz may be z itself (overwritten). Returns the partial loss
    sum_i sum_{y in [lo, hi)} -w_i log p_iy over this rank's labels.
    """
    B, n = z.shape
    part = np.zeros(B)
    for i in prange(B):
        logS = np.log(gsum[i]) if gsum[i] > 0.0 else 0.0
        n_lab = lab_ptr[i + 1] - lab_ptr[i]
        w = 1.0 / n_lab if n_lab > 0 else 0.0
        acc = 0.0
        for e in range(lab_ptr[i], lab_ptr[i + 1]):  # before dz may overwrite z
            g = lab_ids[e]
            if lo <= g < hi:
                acc += w * (logS - (z[i, g - lo] - gmax[i]))
        for a in range(n):
            t = z[i, a] - gmax[i]
            p = np.exp(t) / gsum[i] if t > EXP_FLOOR and n_lab > 0 else 0.0
            dz[i, a] = dz_scale * (p if p >= TINY else 0.0)
        for e in range(lab_ptr[i], lab_ptr[i + 1]):
            g = lab_ids[e]
            if lo <= g < hi:
                dz[i, g - lo] -= dz_scale * w
        part[i] = acc
    return part.sum()


@njit(parallel=True)
def dense_local_stats(z, mx, sumexp):
    """Per row of z [B, n]: max and sum of exp(z - max) (float64)."""
    for i in prange(z.shape[0]):
        m = -np.inf
        for a in range(z.shape[1]):
            if z[i, a] > m:
                m = z[i, a]
        s = 0.0
        for a in range(z.shape[1]):
            t = z[i, a] - m
            if t > EXP_FLOOR:
                s += np.exp(t)
        mx[i] = m
        sumexp[i] = s
