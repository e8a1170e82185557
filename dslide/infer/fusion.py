"""Neighbour-label fusion: the labels of a query's nearest training points, fused into the model's scores.

A network with a narrow hidden layer learns the head of a label distribution
well and its tail badly: a label seen once or twice in training gets a few
gradient steps, and its weight row stays close to where it started. The
training points themselves remember those labels exactly. So at inference a
query also looks up its `k` nearest training points (cosine of the
L2-normalised input rows, the features the tree libraries split on) and
their labels vote:

    v_j(q) = sum_{i in kNN(q)} w_i y_ij,   w_i = max(cos(q, x_i), 0)^power / sum_i' (same)

and the model's softmax at temperature T, taken over its `candidates`
highest-scoring labels (the full softmax's mass sits there), is mixed with the
votes:

    p_j(q) = exp(z_j(q) / T) / sum_j' exp(z_j'(q) / T),
    score_j(q) = (1 - weight) p_j(q) + weight v_j(q).

The top k of `score` are the predictions. Both terms are distributions over
labels (the softmax sums to 1, the votes to the neighbours' mean label count),
so `weight` trades them on one scale. A softmax trained on points with several
labels puts most of its mass on the one it is surest of and leaves the others a
few hundredths or less, which the smallest vote outweighs: at T = 1 the
network decides the first label and the votes the rest. A temperature above 1
flattens the softmax (the order of its labels unchanged), so that a small
weight lets the votes lift the labels the network ranks low without reordering
those it ranks high. The kernels take the logits already divided by T
(`tempered`).

Label prototypes. A label's training points also vote as one: its prototype
is the normalised sum of their normalised rows, c_j = S_j / |S_j| with
S_j = sum_{i: y_ij = 1} x_i / |x_i| (a nearest-centroid classifier). A
query's `candidates` prototypes of largest cosine share the neighbour term
with the points:

    v = (1 - share) v_points + share v_protos,
    v_protos,j(q) = cos(q, c_j)^power / sum_j' (same, over the query's candidates).

A label seen in 2 to 5 training points, each noisy, has one point of its
own among a query's neighbours at best; its prototype averages the noise
away. The prototypes are posting lists too (for each feature the labels whose
prototype holds it, and their values), so one search kernel serves both.

The store is what a query needs, built once at the end of training: the
training rows as posting lists (CSC: for each feature the points holding it,
sorted, and their normalised values) and the training labels (CSR). Every
rank holds it whole (it is a function of the training data alone); each rank
searches a contiguous share of a batch's queries and the neighbours (k ids
and similarities per query) are all-gathered, so the search costs 1/P of its
time at P ranks and every rank fuses the same numbers. The prototypes' sums
are shared out the same way, each rank a range of the labels, all gathered.

Kernels: `search` accumulates a query's dot products with every training
point sharing one of its features (the posting lists of its features) into a
per-thread dense accumulator and keeps the k best in a sorted insertion
list; ties go to the lower point id, and the sums run over the query's
features in index order, so the result does not depend on the thread count.
`search_bounded` returns what `search` does, bit for bit, reading less of the
commonest features' lists (a feature in nearly every point holds most of a
query's reads): their contributions are bounded by each list's largest value,
the other features' sums bound every point's score from below, and where
those bounds leave a point in no doubt only the points that can still enter
the top k are scored, exactly, from their rows; a query they do not settle
goes through `search`'s loop.
`fuse` merges the model's candidates and the neighbours' labels per query;
`fuse_grid_hits` does it for a grid of (share, weight) at once, sharing the
per-query work, and tells which of each cell's predictions are true labels.

How many neighbours. Left to the data (`knn` None), training picks `k` from
a few choices by leave-one-out on its own points (`choose_k`): a sample of
training points, chosen by the seed, each looks up its nearest *other*
training points, and the count whose votes alone give the best P@5 of the
points' own labels is kept with the store. Points with many near-duplicates
want few neighbours, points whose labels are spread over a topic want more;
one count does not serve both.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import get_num_threads, njit, prange

from dslide import _numba_cache  # noqa: F401  (before any kernel: the cache is keyed by module name)
from dslide.infer.lists import row_dot, transpose_lists, work_cuts
from dslide.model.sharding import row_share

#: the arrays of a store, as saved in checkpoints (every rank holds them whole); "k" (the
#: neighbours a query takes, int64 [1]) is absent from stores saved before it was kept, the
#: label prototypes ("pr_*": ptr int64 [F + 1], label ids int32, values float32, and each
#: prototype's norm |S_j| float32 [L]) from stores built without them, "share" (the
#: prototypes' share training chose, float64 [1]) where none was chosen, and "pr_perm"
#: (int32 [L]: the label each of pr_lab's ids stands for) from stores whose pr_lab holds the
#: labels themselves; "weight" (the fusion weight chosen on the validation split, float64 [1])
#: and "temperature" (the softmax's temperature chosen with it, float64 [1]) where none was chosen
KEYS = ("post_ptr", "post_pt", "post_val", "y_ptr", "y_idx", "k", "pr_ptr", "pr_lab", "pr_val", "pr_norm", "share",
        "pr_perm", "weight", "temperature")
_REQUIRED = KEYS[:5]
_PROTOTYPES = KEYS[6:10]
_NO_PERM = np.empty(0, np.int32)


@njit(cache=True, inline="always")
def _insert(ids, sims, k, pid, s):
    """Put (pid, s) into the sorted top-k lists ids/sims (best first; ties: lower id first)."""
    if s < sims[k - 1] or (s == sims[k - 1] and (ids[k - 1] >= 0 and pid > ids[k - 1])):
        return
    j = k - 1
    while j > 0 and (sims[j - 1] < s or (sims[j - 1] == s and ids[j - 1] > pid)):
        sims[j] = sims[j - 1]
        ids[j] = ids[j - 1]
        j -= 1
    sims[j] = s
    ids[j] = pid


@njit(cache=True, inline="always")
def _touch(seen, touched, m, j):
    """Mark item j seen, appending it to touched[:m] the first time: the new m."""
    if seen[j] == 0:
        seen[j] = 1
        touched[m] = j
        return m + 1
    return m


#: `search_bounded`: a feature is common where its posting list holds at least 1/BOUND_DIVISOR of
#: the points and at least BOUND_MIN_LIST of them (on the wide real members about the fastest;
#: any choice gives the same neighbours); the bounds' relative slack against float32 rounding
BOUND_DIVISOR = 8
BOUND_MIN_LIST = 1024
BOUND_SLACK = 1e-3


def bound_list(n_points: int) -> int:
    """The shortest posting list `search_bounded` bounds rather than reads, over n_points points."""
    return max(BOUND_MIN_LIST, int(n_points) // BOUND_DIVISOR)


@njit(cache=True, inline="always")
def _scratch(n_points):
    """A chunk's accumulator, first-touch marks and touched list over n_points points."""
    return np.zeros(n_points, np.float32), np.zeros(n_points, np.uint8), np.empty(n_points, np.int32)


@njit(cache=True, inline="always")
def _take(acc, seen, p):
    """Point p's sum, its accumulator and mark cleared for the next query."""
    s = acc[p]
    acc[p] = 0.0
    seen[p] = 0
    return s


@njit(cache=True, inline="always")
def _add_list(post_ptr, post_pt, post_val, f, v, acc, seen, touched, m):
    """acc[p] += v x_pf for every point p of feature f's list, marking each first touch: the new m."""
    for b in range(post_ptr[f], post_ptr[f + 1]):
        p = post_pt[b]
        m = _touch(seen, touched, m, p)
        acc[p] += v * post_val[b]
    return m


@njit(cache=True, inline="always")
def _search_query(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, q, k, perm, acc, seen, touched, ids, sims):
    """`search` of query row q into ids / sims [k] (acc, seen and touched: the chunk's, all clear)."""
    mapped = perm.shape[0] > 0
    m = 0
    for a in range(q_ptr[q], q_ptr[q + 1]):
        m = _add_list(post_ptr, post_pt, post_val, q_idx[a], q_val[a], acc, seen, touched, m)
    ids[:] = -1
    sims[:] = -np.inf
    for t in range(m):
        p = touched[t]
        s = _take(acc, seen, p)
        if s >= sims[k - 1]:  # (below it cannot enter: no need for its id)
            _insert(ids, sims, k, perm[p] if mapped else p, s)


@njit(cache=True, parallel=True)
def search(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, n_points, k, n_chunks, perm, out_ids, out_sims):
    """The k training points with the largest dot product with each query row.

    q_*: CSR of the queries (int64 ptr [n + 1], int32 idx, float32 val: L2-normalised rows);
    post_*: the store's posting lists (int64 ptr [F + 1], int32 point ids sorted per feature,
    float32 values); out_ids int32 [n, k] (-1 where fewer than k points share a feature),
    out_sims float32 [n, k], best first. The queries are cut into n_chunks contiguous
    chunks, each with its own accumulator of n_points floats. perm int32 [n_points]: the id
    each posting id stands for, in the output and its ties (empty: the posting ids).
    """
    n = q_ptr.shape[0] - 1
    for c in prange(n_chunks):
        acc, seen, touched = _scratch(n_points)
        lo = c * n // n_chunks
        hi = (c + 1) * n // n_chunks
        for q in range(lo, hi):
            _search_query(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, q, k, perm, acc, seen, touched,
                          out_ids[q], out_sims[q])


@njit(cache=True, parallel=True)
def search_bounded(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, r_ptr, r_idx, r_val, top_val, common, n_points,
                   k, n_chunks, perm, out_ids, out_sims):
    """`search`'s result (the same ids and float32 sums), reading the lists of a query's common
    features (at least `common` entries) only where its other features do not settle it.

    The arrays as in `search`, the query's features sorted; r_*: the points' rows (CSR: int64
    ptr [n_points + 1], int32 features ascending per row, float32 values), the lists'
    transpose; top_val float32 [F]: each list's largest value. Every value must be >= 0 (the
    bounds need it; a query with a negative value goes through `search`'s loop). Per query:
    U = sum over its common features of q_f top_val[f] bounds what they add to any point; the
    other features' sums L_p (read from their lists) bound each point's score from below, so the
    k-th largest L_p, theta, is at most the k-th score. Where U < theta, a point no other feature
    reaches cannot enter the top k, nor can one with L_p + U < theta: the others are scored
    from their rows, over the features both hold in the query's order (`search`'s float32
    sum). Bounds compare with BOUND_SLACK of room for float32 rounding."""
    n = q_ptr.shape[0] - 1
    mapped = perm.shape[0] > 0
    for c in prange(n_chunks):
        acc, seen, touched = _scratch(n_points)
        low_ids = np.empty(k, np.int32)
        low = np.empty(k, np.float32)
        lo = c * n // n_chunks
        hi = (c + 1) * n // n_chunks
        for q in range(lo, hi):
            a0, a1 = q_ptr[q], q_ptr[q + 1]
            ids = out_ids[q]
            sims = out_sims[q]
            upper = 0.0
            n_common = 0
            negative = False
            for a in range(a0, a1):
                f = q_idx[a]
                negative = negative or q_val[a] < 0
                if post_ptr[f + 1] - post_ptr[f] >= common:
                    upper += float(q_val[a]) * float(top_val[f])
                    n_common += 1
            if n_common == 0 or negative:
                _search_query(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, q, k, perm, acc, seen, touched,
                              ids, sims)
                continue
            m = 0
            for a in range(a0, a1):
                f = q_idx[a]
                if post_ptr[f + 1] - post_ptr[f] < common:
                    m = _add_list(post_ptr, post_pt, post_val, f, q_val[a], acc, seen, touched, m)
            low_ids[:] = -1
            low[:] = -np.inf
            for t in range(m):
                p = touched[t]
                if acc[p] >= low[k - 1]:
                    _insert(low_ids, low, k, p, acc[p])
            theta = float(low[k - 1]) * (1.0 - BOUND_SLACK)
            upper = upper * (1.0 + BOUND_SLACK) + 1e-7
            if m < k or upper >= theta:  # not settled: every list read
                for t in range(m):
                    _take(acc, seen, touched[t])
                _search_query(q_ptr, q_idx, q_val, post_ptr, post_pt, post_val, q, k, perm, acc, seen, touched,
                              ids, sims)
                continue
            ids[:] = -1
            sims[:] = -np.inf
            for t in range(m):
                p = touched[t]
                partial = _take(acc, seen, p)
                if float(partial) * (1.0 + BOUND_SLACK) + upper < theta:
                    continue
                s = row_dot(q_idx, q_val, a0, a1, r_idx, r_val, r_ptr[p], r_ptr[p + 1])
                if s >= sims[k - 1]:
                    _insert(ids, sims, k, perm[p] if mapped else p, s)


@njit(cache=True, parallel=True)
def label_rows(x_ptr, x_idx, x_val, l_ptr, l_pt, n_features, cuts, fill, out_ptr, out_f, out_val):
    """The labels' sums of their training rows, by label, for the labels cuts[0] <= j < cuts[-1].
    x_*: the training rows (CSR: int64 ptr, int32 features, float32 values); l_ptr int64 /
    l_pt int32: each label's points, ascending. fill False: out_ptr[j - cuts[0] + 1] = how
    many features j's points hold (the first pass). fill True: for each label j its features f
    (ascending) and S_jf = sum over j's points, ascending, of their value of f, into out_f /
    out_val from out_ptr[j - cuts[0]] (the cumulated counts). Chunk c is the labels
    cuts[c] <= j < cuts[c + 1]; a label's sums run in point order, whatever the chunks."""
    j0 = cuts[0]
    for c in prange(cuts.shape[0] - 1):
        seen = np.zeros(n_features, np.uint8)
        touched = np.empty(n_features, np.int32)
        acc = np.zeros(n_features if fill else 0, np.float64)
        for j in range(cuts[c], cuts[c + 1]):
            m = 0
            for b in range(l_ptr[j], l_ptr[j + 1]):
                p = l_pt[b]
                for a in range(x_ptr[p], x_ptr[p + 1]):
                    f = x_idx[a]
                    m = _touch(seen, touched, m, f)
                    if fill:
                        acc[f] += x_val[a]
            if not fill:
                out_ptr[j - j0 + 1] = m
                for t in range(m):
                    seen[touched[t]] = 0
                continue
            fs = np.sort(touched[:m])
            o = out_ptr[j - j0]
            for t in range(m):
                f = fs[t]
                out_f[o + t] = f
                out_val[o + t] = acc[f]
                acc[f] = 0.0
                seen[f] = 0


@njit(cache=True, parallel=True)
def _unit_rows(ptr, val, norm, out):
    """norm[r] = sqrt(sum of val[a] * val[a] over row r's entries, in order) and out[a] =
    val[a] / norm[r] (float64, then out's type)."""
    for r in prange(ptr.shape[0] - 1):
        s = 0.0
        for a in range(ptr[r], ptr[r + 1]):
            s += val[a] * val[a]
        norm[r] = np.sqrt(s)
        for a in range(ptr[r], ptr[r + 1]):
            out[a] = val[a] / norm[r]


@njit(cache=True, inline="always")
def _offer_sum(best, best_ids, s, j):
    """Offer label j's summed score s to a top k (best float64, best_ids int64 [k], larger first).
    Labels come in ascending order, so an equal score keeps the earlier, lower label in front;
    a missing entry (id -1) gives way to an equal score."""
    k = best.shape[0]
    if s > best[k - 1] or (s == best[k - 1] and best_ids[k - 1] < 0):
        r = k - 1
        while r > 0 and best[r - 1] < s:
            best[r] = best[r - 1]
            best_ids[r] = best_ids[r - 1]
            r -= 1
        best[r] = s
        best_ids[r] = j


@njit(cache=True, inline="always")
def _vote_sums(nn_ids, nn_sims, y_ptr, pr_ids, pr_sims, power, pr_power):
    """One query's sums behind its votes: (the neighbours' weight sum, the labels they hold, the
    prototypes' weight sum)."""
    wsum = 0.0
    n_lab = 0
    for i in range(nn_ids.shape[0]):
        p = nn_ids[i]
        if p >= 0 and nn_sims[i] > 0:
            wsum += float(nn_sims[i]) ** power
            n_lab += y_ptr[p + 1] - y_ptr[p]
    psum = 0.0
    for i in range(pr_ids.shape[0]):
        if pr_ids[i] >= 0 and pr_sims[i] > 0:
            psum += float(pr_sims[i]) ** pr_power
    return wsum, n_lab, psum


@njit(cache=True, inline="always")
def _query_sums(m_ids, m_logits, nn_ids, nn_sims, y_ptr, pr_ids, pr_sims, power, pr_power):
    """One query's sums behind its fused scores: (the largest model logit, the softmax's
    normaliser over the model's candidates, the neighbours' weight sum, the labels they hold,
    the prototypes' weight sum); the rows of `fuse`'s arrays."""
    mx = -np.inf
    for j in range(m_ids.shape[0]):
        if m_ids[j] >= 0 and m_logits[j] > mx:
            mx = m_logits[j]
    z = 0.0
    for j in range(m_ids.shape[0]):
        if m_ids[j] >= 0:
            z += np.exp(m_logits[j] - mx)
    wsum, n_lab, psum = _vote_sums(nn_ids, nn_sims, y_ptr, pr_ids, pr_sims, power, pr_power)
    return mx, z, wsum, n_lab, psum


@njit(cache=True, inline="always")
def _vote_contributions(nn_ids, nn_sims, y_ptr, y_idx, power, pr_ids, pr_sims, pr_power, wsum, psum, lab, src, base,
                        c):
    """Append one query's votes from position c on: each neighbour's labels (source 1, base its
    similarity ** power) where wsum > 0, then its prototypes (source 2, base similarity **
    pr_power) where psum > 0; the new count. A vote's value is its base times its cell's factor
    over wsum or psum (`fuse`)."""
    if wsum > 0:
        for i in range(nn_ids.shape[0]):
            p = nn_ids[i]
            if p >= 0 and nn_sims[i] > 0:
                b = float(nn_sims[i]) ** power
                for a in range(y_ptr[p], y_ptr[p + 1]):
                    lab[c] = y_idx[a]
                    src[c] = 1
                    base[c] = b
                    c += 1
    if psum > 0:
        for i in range(pr_ids.shape[0]):
            if pr_ids[i] >= 0 and pr_sims[i] > 0:
                lab[c] = pr_ids[i]
                src[c] = 2
                base[c] = float(pr_sims[i]) ** pr_power
                c += 1
    return c


@njit(cache=True, parallel=True)
def fuse(m_ids, m_logits, nn_ids, nn_sims, y_ptr, y_idx, weight, power, pr_ids, pr_sims, share, pr_power,
         k, out_ids, out_scores):
    """Per query: (1 - weight) softmax over its model candidates + weight ((1 - share) neighbour
    votes + share prototype votes), top k.

    m_ids int64 [n, K] (-1: none), m_logits float64 [n, K]; nn_ids int32 [n, kn] (-1: none),
    nn_sims float32 [n, kn]; y_ptr int64 / y_idx int32: the training labels (CSR); pr_ids
    int32 [n, kp] (-1: none; kp may be 0), pr_sims float32 [n, kp]: the query's prototypes.
    out_ids int64 [n, k] (-1 where fewer than k labels have a score), out_scores float64 [n, k].
    """
    n, K = m_ids.shape
    kp = pr_ids.shape[1]
    for q in prange(n):
        mx, z, wsum, n_lab, psum = _query_sums(m_ids[q], m_logits[q], nn_ids[q], nn_sims[q], y_ptr, pr_ids[q],
                                               pr_sims[q], power, pr_power)
        points_w = weight * (1.0 - share) if psum > 0 else weight
        lab = np.empty(K + n_lab + kp, np.int64)
        src = np.empty(K + n_lab + kp, np.uint8)
        val = np.empty(K + n_lab + kp, np.float64)
        c = 0
        for j in range(K):
            if m_ids[q, j] >= 0:
                lab[c] = m_ids[q, j]
                val[c] = (1.0 - weight) * np.exp(m_logits[q, j] - mx) / z
                c += 1
        votes = c
        c = _vote_contributions(nn_ids[q], nn_sims[q], y_ptr, y_idx, power, pr_ids[q], pr_sims[q], pr_power, wsum,
                                psum, lab, src, val, c)
        for a in range(votes, c):  # the bases times the weights of their sources
            if src[a] == 1:
                val[a] = points_w * val[a] / wsum
            else:
                val[a] = weight * share * val[a] / psum
        # sum the contributions of each label (sorted by label id), then take the k best
        order = np.argsort(lab[:c], kind="mergesort")
        best_ids = out_ids[q]
        best = out_scores[q]
        best_ids[:] = -1
        best[:] = -np.inf
        t = 0
        while t < c:
            j = lab[order[t]]
            s = 0.0
            while t < c and lab[order[t]] == j:
                s += val[order[t]]
                t += 1
            _offer_sum(best, best_ids, s, j)


@njit(cache=True, inline="always")
def _holds(idx, lo, hi, j):
    """Whether the ascending idx[lo:hi] holds j."""
    pos = lo + np.searchsorted(idx[lo:hi], j)
    return pos < hi and idx[pos] == j


#: the largest fusion weight under which `fuse_grid_hits` drops model candidates that cannot reach
#: a top k (`_outranked_floor`): the model's share 1 - weight stays far above the subnormals
PRUNE_MAX_WEIGHT = 1.0 - 1e-6
#: a model-only candidate whose base is below (1 - this) x the k-th largest such base scores below
#: it under any weight: the rounding of a product and a quotient moves a score by far less
PRUNE_MARGIN = 1e-14
#: bases below this are left in: their products could be subnormal, where rounding is not relative
PRUNE_MIN_BASE = 1e-290


#: `fuse_grid_hits` splits its queries into at most GRID_CHUNKS chunks of at least GRID_ROWS (the
#: threads' shares), each with its scratch arrays (a marker per label among them) made once
GRID_ROWS = 32
GRID_CHUNKS = 64


@njit(cache=True, inline="always")
def _model_bases(m_ids, m_logits, bases):
    """The model candidates' factors exp(logit - max) into bases (in candidate order, ids >= 0
    only), and their count and sum z: `_query_sums`' normaliser, the same terms summed in the
    same order."""
    mx = -np.inf
    for j in range(m_ids.shape[0]):
        if m_ids[j] >= 0 and m_logits[j] > mx:
            mx = m_logits[j]
    z = 0.0
    c = 0
    for j in range(m_ids.shape[0]):
        if m_ids[j] >= 0:
            e = np.exp(m_logits[j] - mx)
            z += e
            bases[c] = e
            c += 1
    return c, z


@njit(cache=True, inline="always")
def _outranked_floor(m_ids, bases, mark, k, top):
    """The base under which a model candidate that no other contribution's label holds (its
    label marked once, mark == 1: "model-only") can rank in no cell's top k: such a label scores
    (1 - weight) base / z in every cell, rounded, so never above another of a larger base, and one
    whose base is below the k-th largest of them by more than rounding can move (PRUNE_MARGIN) has
    k labels scoring strictly more in every cell. -inf (drop nothing) where at most k are
    model-only or the k-th base is under PRUNE_MIN_BASE. top: float64 [k] scratch."""
    top[:] = -np.inf
    n_only = 0
    c = 0
    for j in range(m_ids.shape[0]):
        if m_ids[j] < 0:
            continue
        b = bases[c]
        c += 1
        if mark[m_ids[j]] != 1:
            continue
        n_only += 1
        if b > top[k - 1]:
            r = k - 1
            while r > 0 and top[r - 1] < b:
                top[r] = top[r - 1]
                r -= 1
            top[r] = b
    if n_only <= k or not top[k - 1] >= PRUNE_MIN_BASE:
        return -np.inf
    return top[k - 1] * (1.0 - PRUNE_MARGIN)


@njit(cache=True)
def _max_label(m_ids, y_idx, pr_ids) -> int:
    """The largest label id among the model's candidates, the training labels and the prototypes."""
    top = -1
    for v in m_ids.ravel():
        top = v if v > top else top
    for v in y_idx:
        top = v if v > top else top
    for v in pr_ids.ravel():
        top = v if v > top else top
    return top


@njit(cache=True, parallel=True)
def fuse_grid_hits(m_ids, m_logits, nn_ids, nn_sims, y_ptr, y_idx, power, pr_ids, pr_sims, pr_power, cells, t_ptr,
                   t_idx, out_hits, out_scores):
    """`fuse`'s top k under every (share, weight, temperature) of a grid, looked up in the queries'
    true labels: out_hits[g, q, r] = 1 where the r-th label of query q fused with cells[g] is one of
    q's, else 0.

    The arrays as in `fuse`, but m_logits float64 [T, n, K]: the model's logits at each of T
    temperatures (divided by it: `tempered`); cells float64 [m, 3]: (share, weight, the index of
    its temperature in m_logits), a share of 0 leaving the prototypes out (`fuse` given kp = 0);
    t_ptr int64 [n + 1], t_idx int32: the true labels (CSR, ascending within a row); out_hits
    uint8 [m, n, k]; out_scores float64 [m, n, k]: the cells' top-k scores (`fuse`'s out_scores),
    or [0, 0, 0] for none. Per query the softmax normaliser of each temperature, the weight sums,
    the contributions' labels and one stable sort by label are computed once; each cell's
    contributions are `fuse`'s float expressions summed in `fuse`'s order (by label, then model,
    neighbours, prototypes) and ranked by its rule, so each cell's top k is `fuse`'s. Where every
    cell's weight is at most PRUNE_MAX_WEIGHT, the labels only the model holds that no cell can
    rank in its top k at any of the temperatures are dropped before the sort (`_outranked_floor`);
    the order of what stays is kept, so each cell's sums and offers are those of the whole list.
    """
    n, K = m_ids.shape
    T = m_logits.shape[0]
    kn = nn_ids.shape[1]
    kp = pr_ids.shape[1]
    m = cells.shape[0]
    k = out_hits.shape[2]
    prune = k > 0
    for g in range(m):
        if not cells[g, 1] <= PRUNE_MAX_WEIGHT:
            prune = False
    n_marks = _max_label(m_ids, y_idx, pr_ids) + 1 if prune else 0
    chunks = max(1, min((n + GRID_ROWS - 1) // GRID_ROWS, GRID_CHUNKS))
    per = (n + chunks - 1) // chunks
    for ch in prange(chunks):
        q0 = ch * per
        q1 = min(n, q0 + per)
        cap = 0
        for q in range(q0, q1):
            n_lab = 0
            for i in range(kn):
                p = nn_ids[q, i]
                if p >= 0:
                    n_lab += y_ptr[p + 1] - y_ptr[p]
            cap = max(cap, n_lab)
        cap += K + kp
        lab = np.empty(cap, np.int64)
        src = np.empty(cap, np.uint8)
        base = np.empty(cap, np.float64)  # a vote's factor; a model candidate's place in `bases`
        slab = np.empty(cap, np.int64)
        ssrc = np.empty(cap, np.uint8)
        sbase = np.empty(cap, np.float64)
        smodel = np.empty((T, cap), np.float64)  # the model's factors in the sorted order, by temperature
        bases = np.empty((T, K), np.float64)
        zs = np.empty(T, np.float64)
        floors = np.empty(T, np.float64)
        mark = np.zeros(n_marks, np.int32)  # per label: model candidates + 2 x other contributions
        top = np.empty(max(k, 1), np.float64)
        best = np.empty(k, np.float64)
        best_ids = np.empty(k, np.int64)
        for q in range(q0, q1):
            n_model = 0
            for ti in range(T):
                n_model, zs[ti] = _model_bases(m_ids[q], m_logits[ti, q], bases[ti])
            wsum, _, psum = _vote_sums(nn_ids[q], nn_sims[q], y_ptr, pr_ids[q], pr_sims[q], power, pr_power)
            # the votes after the model's place: label, source and the factor of their value that
            # does not depend on the cell
            c = _vote_contributions(nn_ids[q], nn_sims[q], y_ptr, y_idx, power, pr_ids[q], pr_sims[q], pr_power,
                                    wsum, psum, lab, src, base, K)
            if prune:
                for j in range(K):
                    if m_ids[q, j] >= 0:
                        mark[m_ids[q, j]] += 1
                for a in range(K, c):
                    mark[lab[a]] += 2
                for ti in range(T):
                    floors[ti] = _outranked_floor(m_ids[q], bases[ti], mark, k, top)
            # the model's contributions that stay, in their order, just before the others
            first = K
            t = n_model
            for j in range(K - 1, -1, -1):
                if m_ids[q, j] < 0:
                    continue
                t -= 1
                if prune:
                    only = mark[m_ids[q, j]] == 1
                    mark[m_ids[q, j]] = 0
                    if only:
                        out = True  # outranked at every temperature
                        for ti in range(T):
                            out &= bases[ti, t] < floors[ti]
                        if out:
                            continue
                first -= 1
                lab[first] = m_ids[q, j]
                src[first] = 0
                base[first] = t
            if prune:
                for a in range(K, c):
                    mark[lab[a]] = 0
            order = np.argsort(lab[first:c], kind="mergesort")
            nc = order.shape[0]
            for t in range(nc):
                e = order[t] + first
                slab[t] = lab[e]
                ssrc[t] = src[e]
                sbase[t] = base[e]
                if src[e] == 0:
                    for ti in range(T):
                        smodel[ti, t] = bases[ti, int(base[e])]
            for g in range(m):
                share = cells[g, 0]
                weight = cells[g, 1]
                ti = int(cells[g, 2])
                z = zs[ti]
                use_protos = share > 0 and psum > 0
                points_w = weight * (1.0 - share) if use_protos else weight
                best_ids[:] = -1
                best[:] = -np.inf
                t = 0
                while t < nc:
                    j = slab[t]
                    v = 0.0
                    held = False  # a label only the prototypes hold has no score where they are left out
                    while t < nc and slab[t] == j:
                        if ssrc[t] == 0:
                            v += (1.0 - weight) * smodel[ti, t] / z
                            held = True
                        elif ssrc[t] == 1:
                            v += points_w * sbase[t] / wsum
                            held = True
                        elif use_protos:
                            v += weight * share * sbase[t] / psum
                            held = True
                        t += 1
                    if held:
                        _offer_sum(best, best_ids, v, j)
                for r in range(k):
                    j = best_ids[r]
                    out_hits[g, q, r] = 1 if j >= 0 and _holds(t_idx, t_ptr[q], t_ptr[q + 1], j) else 0
                if out_scores.shape[0] > 0:
                    out_scores[g, q] = best


def _shared_search(Xq, k: int, comm, ptr, pt, val, n_items: int, perm=_NO_PERM,
                   approx=None, bounded=None) -> tuple[np.ndarray, np.ndarray]:
    """`search` of posting lists (ptr, pt, val) over n_items (their ids standing for perm's),
    each rank taking a contiguous share of the query rows, all gathered. approx: an approximate
    search of the same lists instead, approx(rows, k) -> (ids, sims, ...) (dslide.infer.approx);
    bounded: (r_ptr, r_idx, r_val, top_val, common), `search_bounded`'s arrays, the same result
    as `search`'s read faster."""
    if Xq.shape[1] != ptr.shape[0] - 1:  # the kernel reads ptr[f + 1] for each feature f of a query
        raise ValueError(f"queries have {Xq.shape[1]} features but the neighbour store holds {ptr.shape[0] - 1}")
    Xq = l2_rows(Xq)
    n = Xq.shape[0]
    size = 1 if comm is None else comm.size
    per, lo, hi = row_share(n, 0 if comm is None else comm.rank, size)
    ids = np.full((per, k), -1, np.int32)  # per = n on one rank
    sims = np.full(ids.shape, -np.inf, np.float32)
    if hi > lo and approx is not None:
        ids[:hi - lo], sims[:hi - lo] = approx(Xq[lo:hi], k)[:2]
    elif hi > lo and bounded is not None:
        part = Xq[lo:hi]
        search_bounded(part.indptr.astype(np.int64), part.indices.astype(np.int32), part.data, ptr, pt, val,
                       *bounded, n_items, k, min(hi - lo, 4 * get_num_threads()), perm, ids[:hi - lo], sims[:hi - lo])
    elif hi > lo:
        part = Xq[lo:hi]
        search(part.indptr.astype(np.int64), part.indices.astype(np.int32), part.data, ptr, pt, val, n_items, k,
               min(hi - lo, 4 * get_num_threads()), perm, ids[:hi - lo], sims[:hi - lo])
    if size == 1:
        return ids, sims
    all_ids = comm.allgather_rows(ids, kind="evaluation").reshape(size * per, k)[:n]
    all_sims = comm.allgather_rows(sims, kind="evaluation").reshape(size * per, k)[:n]
    return np.ascontiguousarray(all_ids), np.ascontiguousarray(all_sims)


def label_prototypes(store: dict, n_labels: int, comm=None) -> dict:
    """The labels' prototypes from a store's posting lists and labels (module docstring):
    {"pr_ptr", "pr_lab", "pr_val", "pr_norm", "pr_perm"}; a label without points has norm 0
    and no entries. pr_lab holds the labels renumbered by falling frequency (pr_perm maps
    them back; pr_norm is by label): a search's accumulator then finds the labels most
    posting lists hold close together in memory, about a third faster on 670,091 labels.
    The sums run by label (`label_rows`: a label's points' rows, read whole, into an
    accumulator of the features), then go to posting lists by feature (`transpose_lists`).
    With a communicator each rank sums a contiguous range of the labels (about 1/P of the
    row entries) and all gather them: every label's sums are its own, so the store is the
    same at any number of ranks."""
    ptr, pt, val, y_ptr, y_idx = (store[k] for k in _REQUIRED)
    perm = np.argsort(-np.bincount(y_idx, minlength=n_labels), kind="stable").astype(np.int32)
    rank = np.empty(n_labels, np.int32)
    rank[perm] = np.arange(n_labels, dtype=np.int32)
    F, N = ptr.shape[0] - 1, y_ptr.shape[0] - 1
    # the training rows, and each (renumbered) label's points, ascending
    x_ptr, x_idx, x_val = transpose_lists(ptr, pt, val, N)
    l_ptr, l_pt, _ = transpose_lists(y_ptr, rank[y_idx], np.empty(y_idx.shape[0], np.uint8), n_labels)
    # each label's work: the row entries of its points
    total = np.concatenate(([0], np.cumsum(np.diff(x_ptr)[l_pt])))
    work = total[l_ptr[1:]] - total[l_ptr[:-1]]
    size = 1 if comm is None else comm.size
    ranks = work_cuts(work, size)
    j0, j1 = (0, n_labels) if size == 1 else (int(ranks[comm.rank]), int(ranks[comm.rank + 1]))
    cuts = j0 + work_cuts(work[j0:j1], max(1, min(j1 - j0, 4 * get_num_threads())))
    counts = np.zeros(j1 - j0 + 1, np.int64)
    f_ids, sums = np.empty(0, np.int32), np.empty(0, np.float64)
    label_rows(x_ptr, x_idx, x_val, l_ptr, l_pt, F, cuts, False, counts, f_ids, sums)
    np.cumsum(counts, out=counts)
    f_ids = np.empty(counts[-1], np.int32)
    sums = np.empty(counts[-1], np.float64)
    label_rows(x_ptr, x_idx, x_val, l_ptr, l_pt, F, cuts, True, counts, f_ids, sums)
    if size > 1:  # the label ranges end to end, in label order
        sizes = comm.allgather_rows(np.array([counts[-1]], np.int64), kind="neighbours")[:, 0]
        bounds = np.concatenate(([0], np.cumsum(sizes)))
        f_ids = comm.allgather_columns(f_ids[None, :], bounds, kind="neighbours")[0]
        sums = comm.allgather_columns(sums[None, :], bounds, kind="neighbours")[0]
        per_l = comm.allgather_columns(np.diff(counts)[None, :], ranks, kind="neighbours")[0]
        counts = np.concatenate(([0], np.cumsum(per_l)))
    norm = np.empty(n_labels, np.float64)
    unit = np.empty(sums.shape[0], np.float32)
    _unit_rows(counts, sums, norm, unit)
    del sums
    # by feature, each feature's labels ascending
    pr_ptr, lab, pr_val = transpose_lists(counts, f_ids, unit, F)
    return {"pr_ptr": pr_ptr, "pr_lab": lab, "pr_val": pr_val, "pr_norm": norm[rank].astype(np.float32),
            "pr_perm": perm}


def tempered(logits, temperature: float):
    """The network's candidate logits as the fused score's softmax takes them: divided by its
    temperature (module docstring), the array itself at 1."""
    t = float(temperature)
    return logits if t == 1.0 else np.asarray(logits, np.float64) / t


def l2_rows(X: sp.csr_matrix) -> sp.csr_matrix:
    """X with every row scaled to unit L2 norm (norms in float64; all-zero rows stay zero), float32."""
    X = sp.csr_matrix(X, dtype=np.float32, copy=True)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    sq = np.bincount(rows, weights=X.data.astype(np.float64) ** 2, minlength=X.shape[0])
    inv = np.divide(1.0, np.sqrt(sq), out=np.zeros_like(sq), where=sq > 0)
    # scaled in float64: 1 / norm of a row near float32's maximum is below float32's normal range
    X.data = (X.data * np.repeat(inv, np.diff(X.indptr))).astype(np.float32)
    X.sort_indices()
    return X


class NeighbourLabels:
    """The training points' posting lists and labels, the labels' prototypes, and the fused prediction.

    post_ptr int64 [F + 1], post_pt int32 [nnz], post_val float32 [nnz]: the L2-normalised
    training rows by feature (CSC); y_ptr int64 [N + 1], y_idx int32: their labels (CSR).
    Optionally (`build(prototypes=True)`) pr_ptr int64 [F + 1], pr_lab int32, pr_val float32:
    the label prototypes by feature (renumbered labels ascending), pr_norm float32 [L]: |S_j|,
    and pr_perm int32 [L]: the label of each renumbered id (`label_prototypes`).
    """

    def __init__(self, arrays: dict, n_points: int, k: int | None = None, share: float | None = None,
                 weight: float | None = None, temperature: float | None = None):
        missing = [name for name in _REQUIRED if name not in arrays]
        if missing:
            raise ValueError(f"neighbour labels lack {', '.join(missing)}")
        held = [name for name in _PROTOTYPES if name in arrays]
        if held and len(held) < len(_PROTOTYPES):
            raise ValueError(f"neighbour labels hold {', '.join(held)} but lack "
                             f"{', '.join(n for n in _PROTOTYPES if n not in held)}")
        self.arrays = {name: np.ascontiguousarray(arrays[name]) for name in _REQUIRED + (_PROTOTYPES if held else ())}
        if held and "pr_perm" in arrays:  # absent from stores saved before the renumbering
            self.arrays["pr_perm"] = np.ascontiguousarray(arrays["pr_perm"], np.int32)
        self.n_points = int(n_points)
        if k is None and "k" in arrays:
            k = int(np.asarray(arrays["k"]).reshape(-1)[0])
        #: the neighbours a query takes (None: not chosen; the configuration's knn decides)
        self.k = k
        if share is None and "share" in arrays:
            share = float(np.asarray(arrays["share"]).reshape(-1)[0])
        #: the prototypes' share of the neighbour term (None: not chosen; proto_weight decides)
        self.share = share
        if weight is None and "weight" in arrays:
            weight = float(np.asarray(arrays["weight"]).reshape(-1)[0])
        #: the neighbours' weight in the fused score (None: not chosen; knn_weight decides)
        self.weight = weight
        if temperature is None and "temperature" in arrays:
            temperature = float(np.asarray(arrays["temperature"]).reshape(-1)[0])
        #: the temperature of the network's softmax in the fused score (None: not chosen;
        #: knn_temperature decides, else 1)
        self.temperature = temperature
        self._derived = {}  # derived from the arrays on first use (`rows`, `_bounded`, `_search`)

    @classmethod
    def build(cls, X, Y, prototypes: bool = False, comm=None) -> "NeighbourLabels":
        """From the training features X csr [N, F] and labels Y csr [N, L]; prototypes: with
        the labels' prototypes (module docstring), their sums shared out over `comm`'s ranks."""
        C = l2_rows(X).tocsc()
        C.sort_indices()
        Y = sp.csr_matrix(Y)
        Y.sort_indices()
        arrays = {"post_ptr": C.indptr.astype(np.int64), "post_pt": C.indices.astype(np.int32),
                  "post_val": C.data.astype(np.float32), "y_ptr": Y.indptr.astype(np.int64),
                  "y_idx": Y.indices.astype(np.int32)}
        if prototypes:
            arrays.update(label_prototypes(arrays, Y.shape[1], comm))
        return cls(arrays, X.shape[0])

    @property
    def has_prototypes(self) -> bool:
        return "pr_ptr" in self.arrays

    @property
    def n_labels(self) -> int:
        """The labels of the prototypes (0 without them)."""
        return int(self.arrays["pr_norm"].shape[0]) if self.has_prototypes else 0

    @classmethod
    def from_state(cls, arrays: dict, n_labels: int | None = None, where: str = "neighbour store") -> "NeighbourLabels":
        """The store of `state_arrays()` output (a checkpoint's), checked first (dslide.validate:
        pointers, ids below n_labels, finite values, k and share in range), whatever its hash."""
        from dslide import validate

        missing = [name for name in _REQUIRED if name not in arrays]
        if missing:
            raise ValueError(f"{where}: neighbour labels lack {', '.join(missing)}")
        validate.neighbour_store(arrays, where, n_labels)
        return cls(arrays, len(arrays["y_ptr"]) - 1)

    def state_arrays(self) -> dict:
        out = dict(self.arrays)
        if self.k is not None:
            out["k"] = np.array([self.k], np.int64)
        if self.share is not None:
            out["share"] = np.array([self.share], np.float64)
        if self.weight is not None:
            out["weight"] = np.array([self.weight], np.float64)
        if self.temperature is not None:
            out["temperature"] = np.array([self.temperature], np.float64)
        return out

    def drop_derived(self) -> None:
        """Forget what the searches derived (the rows, the pruned lists): a store that will not be
        searched again need not hold them; a later search derives them anew."""
        self._derived.clear()

    def drop_prototypes(self) -> None:
        """Forget the label prototypes (a store whose chosen share is 0 need not hold them)."""
        for name in _PROTOTYPES + ("pr_perm",):
            self.arrays.pop(name, None)
        for key in [key for key in self._derived if isinstance(key, tuple) and key[0] == "prototypes"]:
            del self._derived[key]

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def neighbours(self, Xq: sp.csr_matrix, k: int, comm=None, approx=False) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest training points of each query row (cosine): (ids int32 [n, k], sims float32 [n, k]).
        With a communicator, each rank searches a contiguous share of the rows and all gather them.
        approx: an approx.Bound (True: the default one), a search bounded whatever the points."""
        a = self.arrays
        search = self._search("points", approx)
        return _shared_search(Xq, k, comm, a["post_ptr"], a["post_pt"], a["post_val"], self.n_points,
                              approx=search, bounded=self._bounded() if search is None else None)

    def prototypes(self, Xq: sp.csr_matrix, k: int, comm=None, approx=False) -> tuple[np.ndarray, np.ndarray]:
        """The k label prototypes of largest cosine with each query row, as `neighbours`."""
        if not self.has_prototypes:
            raise ValueError("this neighbour store has no label prototypes (built with prototypes=False)")
        a = self.arrays
        return _shared_search(Xq, k, comm, a["pr_ptr"], a["pr_lab"], a["pr_val"], self.n_labels,
                              a.get("pr_perm", _NO_PERM),
                              approx=self._search("prototypes", approx))

    def search_reads(self, Xq: sp.csr_matrix, which: str = "points") -> int:
        """The posting entries the exact search of the query rows Xq reads in the points' lists
        (which="points") or the prototypes' ("prototypes"): the sum over every stored feature of
        each query of its list's length."""
        if which not in ("points", "prototypes"):
            raise ValueError(f"which is {which!r}; expected 'points' or 'prototypes'")
        ptr = self.arrays["post_ptr" if which == "points" else "pr_ptr"]
        Xq = sp.csr_matrix(Xq)
        if Xq.shape[1] != ptr.shape[0] - 1:
            raise ValueError(f"queries have {Xq.shape[1]} features but the neighbour store holds {ptr.shape[0] - 1}")
        return int(np.diff(ptr)[Xq.indices].sum())

    def rows(self) -> tuple:
        """The training points' rows, the transpose of their posting lists (CSR: int64 ptr, int32
        features ascending, float32 values), derived on first use and kept."""
        if "rows" not in self._derived:
            from dslide.infer.approx import transpose

            a = self.arrays
            self._derived["rows"] = transpose(a["post_ptr"], a["post_pt"], a["post_val"], self.n_points)
        return self._derived["rows"]

    def _bounded(self):
        """`search_bounded`'s arrays for the points' lists: (rows..., each list's largest value, the
        shortest list bounded), derived on first use and kept; None where a value is negative or no
        list is long enough to bound (the plain `search`)."""
        if "bounded" not in self._derived:
            ptr, val = self.arrays["post_ptr"], self.arrays["post_val"]
            lengths = np.diff(ptr)
            common = bound_list(self.n_points)
            if val.size == 0 or val.min() < 0 or lengths.max(initial=0) < common:
                self._derived["bounded"] = None
            else:
                top = np.zeros(lengths.size, np.float32)
                held = np.flatnonzero(lengths > 0)
                top[held] = np.maximum.reduceat(val, ptr[held])
                self._derived["bounded"] = (*self.rows(), top, common)
        return self._derived["bounded"]

    def _search(self, which: str, approx):
        """The pruned search (dslide.infer.approx) of the points or the prototypes under `approx`
        (False: None, the exact one; True: the default Bound), its lists derived on first use."""
        from dslide.infer.approx import ApproxPostings, Bound

        if approx is False or approx is None:
            return None
        bound = Bound() if approx is True else approx
        key = (which, bound.postings)
        if key not in self._derived:
            a = self.arrays
            lists = ((a["post_ptr"], a["post_pt"], a["post_val"], self.n_points, _NO_PERM) if which == "points" else
                     (a["pr_ptr"], a["pr_lab"], a["pr_val"], self.n_labels, a.get("pr_perm", _NO_PERM)))
            self._derived[key] = ApproxPostings(*lists, bound.postings,
                                                     rows=self.rows() if which == "points" else None)
        pruned = self._derived[key]
        return lambda rows, k: pruned.search(rows, k, bound.query_features, bound.candidates)

    def fuse(self, m_ids, m_logits, nn_ids, nn_sims, weight: float, power: float, k: int,
             pr_ids=None, pr_sims=None, share: float = 0.0, pr_power: float = 1.0):
        """Top k of the fused scores (module docstring): (ids int64 [n, k], scores float64 [n, k]).
        pr_ids / pr_sims: the queries' prototypes (`prototypes`), sharing the neighbour term."""
        n = m_ids.shape[0]
        out_ids = np.empty((n, k), np.int64)
        out_scores = np.empty((n, k), np.float64)
        if pr_ids is None:
            pr_ids, pr_sims, share = np.empty((n, 0), np.int32), np.empty((n, 0), np.float32), 0.0
        fuse(np.ascontiguousarray(m_ids, np.int64), np.ascontiguousarray(m_logits, np.float64),
             np.ascontiguousarray(nn_ids, np.int32), np.ascontiguousarray(nn_sims, np.float32),
             self.arrays["y_ptr"], self.arrays["y_idx"], float(weight), float(power),
             np.ascontiguousarray(pr_ids, np.int32), np.ascontiguousarray(pr_sims, np.float32), float(share),
             float(pr_power), int(k), out_ids, out_scores)
        return out_ids, out_scores

    def fuse_grid_hits(self, m_ids, m_logits, nn_ids, nn_sims, power: float, pr_ids, pr_sims, pr_power: float,
                       cells, truth: sp.csr_matrix, k: int) -> np.ndarray:
        """Which of the top k fused labels are true (truth: csr [n, L], sorted unique indices,
        no stored zeros) for every (share, weight) of cells (float64 [m, 2]): uint8 [m, n, k],
        1 where label r of query q under cell g, `fuse(..., weight, power, k, pr_ids, pr_sims,
        share, pr_power)` (the prototypes left out where share is 0), is one of q's labels.
        Several temperatures in one pass: m_logits float [T, n, K], the logits divided by each
        (`tempered`), and cells [m, 3], (share, weight, the index of the temperature)."""
        n = m_ids.shape[0]
        if truth.shape[0] != n:
            raise ValueError(f"truth has {truth.shape[0]} rows but there are {n} queries")
        if not truth.has_canonical_format or (truth.data == 0).any():
            raise ValueError("truth must have sorted, unique indices and no stored zeros "
                             "(sum_duplicates(), then eliminate_zeros())")
        m_logits = np.asarray(m_logits, np.float64)
        cells = np.asarray(cells, np.float64).reshape(len(cells), -1)
        if m_logits.ndim == 2:
            m_logits = m_logits[None]
        if cells.shape[1] == 2:
            cells = np.concatenate([cells, np.zeros((cells.shape[0], 1))], axis=1)
        if m_logits.shape[1:] != m_ids.shape or cells.shape[1] != 3:
            raise ValueError(f"m_logits {m_logits.shape} and cells {cells.shape}: expected [T, n, K] with m_ids "
                             f"{m_ids.shape} and [m, 3]")
        if cells.shape[0] and not ((cells[:, 2] >= 0) & (cells[:, 2] < m_logits.shape[0])
                                   & (cells[:, 2] == np.round(cells[:, 2]))).all():
            raise ValueError(f"cells name temperatures outside 0..{m_logits.shape[0] - 1}")
        if pr_ids is None:
            pr_ids, pr_sims = np.empty((n, 0), np.int32), np.empty((n, 0), np.float32)
        out = np.empty((len(cells), n, k), np.uint8)
        fuse_grid_hits(np.ascontiguousarray(m_ids, np.int64), np.ascontiguousarray(m_logits),
                       np.ascontiguousarray(nn_ids, np.int32), np.ascontiguousarray(nn_sims, np.float32),
                       self.arrays["y_ptr"], self.arrays["y_idx"], float(power),
                       np.ascontiguousarray(pr_ids, np.int32), np.ascontiguousarray(pr_sims, np.float32),
                       float(pr_power), np.ascontiguousarray(cells),
                       truth.indptr.astype(np.int64), truth.indices.astype(np.int32), out, np.empty((0, 0, 0)))
        return out

    def left_out_neighbours(self, X, rows: np.ndarray, k: int, comm=None) -> tuple[np.ndarray, np.ndarray]:
        """The k nearest *other* training points of the training points `rows` (X: the training
        features the store was built from), as `neighbours`."""
        rows = np.asarray(rows, np.int64)
        n = rows.size
        ids, sims = self.neighbours(sp.csr_matrix(X)[rows], k + 1, comm)
        # leave each point out: drop its own entry, or the last one where it is not among them
        # (other points with the same features tie with it and may come first)
        own = ids == rows[:, None].astype(ids.dtype)
        own[~own.any(axis=1), -1] = True
        own &= np.cumsum(own, axis=1) == 1  # one entry per row, should a point repeat
        return np.ascontiguousarray(ids[~own].reshape(n, k)), np.ascontiguousarray(sims[~own].reshape(n, k))

    def left_out_prototypes(self, X, Y, rows: np.ndarray, k: int, comm=None) -> tuple[np.ndarray, np.ndarray]:
        """The k best label prototypes of the training points `rows`, each point taken out of its
        own labels' prototypes (X, Y: the training data the store was built from), as
        `prototypes`. Without point i, label j's sum is S_j - x_i, so its cosine with x_i is
        (|S_j| c - 1) / sqrt(|S_j|^2 - 2 |S_j| c + 1), c the cosine with i included; a label
        with no other point has no prototype left."""
        rows = np.asarray(rows, np.int64)
        n = rows.size
        Xr = sp.csr_matrix(X)[rows]
        Yr = sp.csr_matrix(Y)[rows]
        extra = int(np.diff(Yr.indptr).max()) if n else 0
        ids, sims = self.prototypes(Xr, k + extra, comm)  # own labels may fall out of the first k
        K = ids.shape[1]
        # (row, label) keys of every candidate and of every point's own labels
        L = np.int64(self.n_labels)
        keys = np.repeat(np.arange(n, dtype=np.int64), K).reshape(n, K) * L + ids
        own_keys = np.repeat(np.arange(n, dtype=np.int64), np.diff(Yr.indptr)) * L + Yr.indices
        own = (ids >= 0) & np.isin(keys, own_keys)
        c = sims.astype(np.float64)
        nj = self.arrays["pr_norm"].astype(np.float64)[ids[own]]
        co = c[own]
        rest = nj * nj - 2.0 * nj * co + 1.0  # |S_j - x_i|^2
        # float32 sums: a label of this point alone leaves a rounding residue, not a prototype
        c[own] = np.where(rest > 1e-4, (nj * co - 1.0) / np.sqrt(np.maximum(rest, 1e-300)), -np.inf)
        c[ids < 0] = -np.inf
        # per row: best first, ties to the lower label id; the dropped (-inf) last
        order = np.lexsort((ids.ravel(), -c.ravel(), np.repeat(np.arange(n), K))).reshape(n, K)[:, :k]
        order -= (np.arange(n) * K)[:, None]
        out_ids = np.take_along_axis(ids, order, axis=1).astype(np.int32)
        out_sims = np.take_along_axis(c, order, axis=1).astype(np.float32)
        gone = ~np.isfinite(out_sims)
        out_ids[gone], out_sims[gone] = -1, -np.inf
        return np.ascontiguousarray(out_ids), np.ascontiguousarray(out_sims)

    def choose_k(self, X, Y, rows: np.ndarray, choices, power: float, margin: float = 0.0,
                 comm=None, left_out=None) -> tuple[int, dict]:
        """The neighbour count, from `choices`, whose votes alone best predict the labels of the
        training points `rows` (X, Y: the training data the store was built from), each point
        left out of its own neighbours: (the count, {count: (P@1, P@5)}). The first of
        `choices` is kept unless another's P@5 beats it by more than `margin` (a sample's
        noise must not move it); then the highest P@5 wins (ties: the earlier count). With a
        communicator the search is shared out as in `neighbours`; every rank gets the same answer.
        left_out: `left_out_neighbours` of `rows`, at least max(choices) of them, if at hand."""
        from dslide.metrics import evaluate

        choices = [int(c) for c in choices]
        if not choices or min(choices) < 1:
            raise ValueError(f"choices = {choices!r}: give at least one neighbour count >= 1")
        rows = np.asarray(rows, np.int64)
        n = rows.size
        ids, sims = left_out if left_out is not None else self.left_out_neighbours(X, rows, max(choices), comm)
        no_model = np.empty((n, 0), np.int64), np.empty((n, 0), np.float64)
        truth = sp.csr_matrix(Y)[rows]
        scores = {}
        for c in choices:
            pred, _ = self.fuse(*no_model, ids[:, :c], sims[:, :c], 1.0, power, 5)
            r = evaluate(truth, pred, k=5)
            scores[c] = (float(r["p@1"]), float(r["p@5"]))
        best = max(choices, key=lambda c: (scores[c][1], -choices.index(c)))
        if scores[best][1] <= scores[choices[0]][1] + margin:
            best = choices[0]
        return best, scores

    def choose_share(self, X, Y, rows: np.ndarray, k: int, power: float, choices, pr_k: int, pr_power: float,
                     tolerance: float = 0.0, comm=None, left_out=None) -> tuple[float, dict]:
        """The prototypes' share, from `choices`, for the votes of `k` neighbours and of `pr_k`
        prototypes, by leave-one-out on the training points `rows` (each left out of its own
        neighbours and of its labels' prototypes): (the share, {share: (P@1, P@5)}). The first
        of `choices` is the reference; the share with the highest P@5 among those whose P@1
        is at most `tolerance` below the reference's wins (ties: the earlier). Where a label's
        near-duplicates are its best evidence, the prototypes buy P@5 with P@1; the tolerance
        bounds that trade. left_out: `left_out_neighbours` of `rows` (at least k), if at hand."""
        from dslide.metrics import evaluate

        choices = [float(c) for c in choices]
        if not choices or min(choices) < 0 or max(choices) > 1:
            raise ValueError(f"choices = {choices!r}: give at least one share in [0, 1]")
        rows = np.asarray(rows, np.int64)
        n = rows.size
        ids, sims = left_out if left_out is not None else self.left_out_neighbours(X, rows, k, comm)
        ids, sims = np.ascontiguousarray(ids[:, :k]), np.ascontiguousarray(sims[:, :k])
        pr_ids, pr_sims = self.left_out_prototypes(X, Y, rows, pr_k, comm)
        no_model = np.empty((n, 0), np.int64), np.empty((n, 0), np.float64)
        truth = sp.csr_matrix(Y)[rows]
        scores = {}
        for a in choices:
            pred, _ = self.fuse(*no_model, ids, sims, 1.0, power, 5, pr_ids, pr_sims, a, pr_power)
            r = evaluate(truth, pred, k=5)
            scores[a] = (float(r["p@1"]), float(r["p@5"]))
        floor = scores[choices[0]][0] - tolerance
        allowed = [a for a in choices if scores[a][0] >= floor]
        best = max(allowed, key=lambda a: (scores[a][1], -choices.index(a)))
        return best, scores
