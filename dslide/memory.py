"""What a model costs in memory, from its configuration and shape alone (before allocating it).

`account(config, n_features, n_labels, world_size, rank)` gives one rank's
bytes by kind:

    weights     W and b of every layer slice: (d_in + 1) n_r values of `dtype`
    moments     Adam's m and v: twice that, of `adam_dtype` (2 bytes for bfloat16)
    tables      the training candidates of LSH layers: anchor tables (anchors,
                counts, buckets of max_active ids) or item-hashing tables
                (compact: L x (2^range_pow + 1) offsets and L x n_r ids; fixed
                capacity: L x 2^range_pow x capacity slots and counters; item codes)
    index       the output layer's inference index: index_anchors anchors and
                their buckets, room for min(T, n_r) ids each (T = index_share of
                the labels; a rank fills its share of the T); with
                index_neighbors, every rank's copy of the index_points points
                (unit hidden vectors as int8, graph of 2 x index_degree links, cells,
                ~5 labels a point)
    scratch     per-layer arrays of the step kernels (marks, positions, thread rows)
    step        the largest transient of a training step: an LSH layer's block
                (its weights copied, their gradient, logits), dense activations,
                or an anchor-table refill between steps (one block of scores)
    index_build the transient of building the inference index at the end of
                training (hidden vectors of index_points points, then k-means'
                distances, one block of scores and a chunk of anchors' candidates,
                or a block of the neighbour graph's similarities)

`data_bytes` adds the training set's CSR arrays. What no formula gives is the
interpreter with numpy, scipy, numba and its compiled kernels (and MPI):
about 0.15 GB per process, measured by scripts/bench_scale.py before the model
is built (153 MB in its recorded run). tests/unit/test_memory.py checks the account against the arrays of
a built network and against measured resident memory.

Bytes per parameter, the figure the benchmarks quote, is the sum over ranks
of their peak resident memory divided by the model's parameters.
"""

from __future__ import annotations

import numpy as np

from dslide.config import Config
from dslide.kernels import MOMENT_DTYPES
from dslide.lsh.anchors import kmeans_block, score_block
from dslide.lsh.neighbors import GRAPH_BLOCK
from dslide.sharding import scaled_count, shard_bounds


def n_params(n_features: int, n_labels: int, hidden) -> int:
    """Parameters of the whole model: sum over layers of d_in * n + n."""
    widths = [n_features, *hidden, n_labels]
    return sum(d * n + n for d, n in zip(widths[:-1], widths[1:]))


def _anchor_union(B: int, A: int, T: int, n_local: int) -> int:
    """Expected size of the union of a batch's buckets: B queries over A anchors hit
    A (1 - (1 - 1/A)^B) distinct ones (uniformly, an upper estimate of distinct-ness
    for clustered data), each bucket T ids, at most n_local."""
    distinct = A * (1.0 - (1.0 - 1.0 / A) ** B)
    return int(min(n_local, distinct * T))


def account(config: Config, n_features: int, n_labels: int, world_size: int = 1, rank: int = 0,
            threads: int = 1) -> dict:
    """Expected bytes of rank `rank` of `world_size` (model parallel) by kind, and their "total"
    (index_build is a transient at the end of training, not counted in the total: it falls
    when the step's buffers are free; `peak` is the larger of total and the index build's)."""
    from dslide.candidates import auto_range_pow
    from dslide.network import INDEX_CHUNK

    config = config.resolve(n_labels)
    # replicas: each replica's P ranks split the model; rank w is shard w % P (dslide.replicas)
    P = 1 if config.parallel == "data" else world_size // config.replicas
    rank = rank % P
    weights = config.shard_weights if isinstance(config.shard_weights, tuple) and config.shard_weights else None
    item = np.dtype(config.dtype).itemsize
    m_item = np.dtype(MOMENT_DTYPES[config.moment_dtype]).itemsize
    widths = [n_features, *config.hidden, n_labels]
    B = config.batch_size
    out = dict.fromkeys(("weights", "moments", "tables", "index", "scratch", "step", "index_build"), 0)
    step_peak = 0
    for i in range(len(widths) - 1):
        d, n = widths[i], widths[i + 1]
        bounds = shard_bounds(n, P, weights)
        n_local = int(bounds[rank + 1] - bounds[rank])
        vals = d * n_local + n_local
        out["weights"] += vals * item
        out["moments"] += 2 * vals * m_item
        is_out = i == len(widths) - 2
        if config.layer_kind(i, n) == "dense":
            # _count int32 [d], touched uint8 [d], _gbuf [threads, n_local]; with replicas the
            # hop budgets and change marks, uint8 [d] each
            out["scratch"] += d * (5 + (2 if config.replicas > 1 else 0)) + threads * n_local * item
            # activations [B, n] (all ranks' columns after the gather) and the gradient alike
            step_peak = max(step_peak, 3 * B * n * item + 2 * B * n_local * item)
            continue
        lc = config.layer_lsh(i)
        per = lc.active_count(n)
        per = min(scaled_count(per, n_local, n), n_local) if per else 0
        n_rand = lc.random_count(n)
        n_rand = min(scaled_count(n_rand, n_local, n), n_local) if n_rand else 0
        # _pos int32, _mark, dirty, touched, the candidates' mark: uint8 each [n_local]; with
        # replicas the hop budgets and change marks
        out["scratch"] += n_local * (4 + 4 + (2 if config.replicas > 1 else 0))
        if lc.family == "anchor":
            T = max(1, min(per, n_local))
            out["tables"] += lc.L * lc.anchors * (d * 4 + 8 + 4 + T * 4)
            cand = _anchor_union(B, lc.anchors, per, n_local) if per else 0
            # a refill (between steps): one block of scores and a table's [A, T] ids and scores
            step_peak = max(step_peak, score_block(n_local) * n_local * item + lc.anchors * T * 8)
        else:
            from dslide import lsh

            fam = lsh.make_family(lc.family, d, lc.K, lc.L, 0,
                                  **({"bin_size": lc.bin_size} if lc.family == "dwta" else {}))
            rp = lc.range_pow or auto_range_pow(n_local, lc.capacity, fam.code_bits)
            if lc.capacity:  # fixed-capacity buckets, fill and policy counters, item codes
                counters = 1 if lc.policy == "fifo" else 3
                out["tables"] += lc.L * (1 << rp) * (lc.capacity + 1 + counters) * 4 + lc.L * n_local * 4
            else:  # compact: bucket offsets, ids and item codes
                out["tables"] += lc.L * ((1 << rp) + 1) * 4 + 2 * lc.L * n_local * 4
            cand = min(n_local, B * per)
        labels = min(n_local, int(np.ceil(B * 5 * n_local / n))) if is_out else 0  # ~5 labels a point
        m = min(n_local, labels + cand + n_rand)
        # W[C] copied and its gradient [m, d]; the logits [B, m] float (softmax_stats
        # exponentiates them in place, the gradient is written over them);
        # the dense input [B, d]
        step_peak = max(step_peak, 2 * m * d * item + B * m * item + 2 * B * d * item)
        if is_out and lc.index_anchors:
            A = min(lc.index_anchors, lc.index_points)
            T = max(1, int(np.ceil(lc.index_share * n)))
            t_local = min(T, n_local)
            # every rank's buckets have room for min(T, n_local) ids an anchor (filled
            # with its share of the T, the rest padding)
            out["index"] += A * d * 4 + A * (8 + 4) + A * t_local * 4
            pts = lc.index_points
            graph = 0
            if lc.index_neighbors:
                # points int8 [pts, d], graph int32 [pts, 2 degree], cells (A + 1) int64 and
                # pts int32, labels (pts + 1) int64 and ~5 int32 a point
                out["index"] += pts * d + pts * 2 * lc.index_degree * 4 + (A + 1) * 8 + pts * 4 \
                    + (pts + 1) * 8 + 5 * pts * 4
                graph = GRAPH_BLOCK * pts * 4 + pts * d * 4  # a block's similarities; the unit rows
            # the hidden vectors of the sampled points, and the larger of k-means (a block of
            # distances, the seeding subset, float64 sums) and fill_index (one block of
            # scores, and per chunk of anchors the top-T ids and scores with keys in place,
            # a key temporary and a mask)
            kmeans = kmeans_block(A) * A * 4 + 4 * A * d * 4 + A * d * 8
            fill = score_block(n_local) * n_local * 4 + min(A, INDEX_CHUNK) * t_local * (4 + 4 + 4 + 1)
            out["index_build"] = pts * d * 4 + max(kmeans, fill, graph)
    out["step"] = step_peak
    out["total"] = sum(out[k] for k in ("weights", "moments", "tables", "index", "scratch", "step"))
    resident = out["total"] - out["step"]
    out["peak"] = max(out["total"], resident + out["index_build"])
    return out


def available_bytes() -> int | None:
    """Bytes new allocations can get on this host without swapping: MemAvailable of
    /proc/meminfo, or less where a cgroup caps this process's memory (memory.max less
    memory.current, cgroup v2; the v1 limit and usage alike); None where neither is known."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit) as f:
                cap = f.read().strip()
            with open(usage) as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if cap.isdigit() and int(cap) < 1 << 60:  # "max", or v1's huge "no limit"
            room = max(0, int(cap) - used)
            avail = room if avail is None else min(avail, room)
        break
    return avail


def data_bytes(n_points: int, nnz_x: int, nnz_y: int, value_bytes: int = 4) -> int:
    """The CSR arrays of a training set: X (int64 indptr, int32 indices, float values) and Y."""
    return 2 * 8 * (n_points + 1) + nnz_x * (4 + value_bytes) + nnz_y * (4 + value_bytes)
