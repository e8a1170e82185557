"""What a model costs in memory, from its configuration and shape alone (before allocating it).

`account(config, n_features, n_labels, world_size, rank)` gives one rank's
bytes by part, each layer reporting its own slice (`estimate` of the layer
kinds in dslide.model.layers, which ask their candidate source for theirs, and of
the inference index, dslide.infer.index, over an output layer that can have
one); this module adds them up:

    weights     W and b of every layer slice
    moments     Adam's m and v (2 bytes a value for bfloat16)
    tables      the training candidates of LSH layers
    index       the output layer's inference index
    scratch     per-layer arrays of the step kernels (marks, positions, thread
                rows) and, with replicas, their marks of changed rows
    step        the largest transient of a training step (or of a table's upkeep
                between steps)
    index_build the transient of building the inference index at the end of
                training

`data_bytes` adds the training set's CSR arrays. What no formula gives is the
interpreter with numpy, scipy, numba and its compiled kernels (and MPI),
measured by scripts/bench_scale.py before the model is built
(docs/benchmarks.md). tests/unit/test_memory.py checks the account against
the arrays of a built network and against measured resident memory.

Bytes per parameter, the figure the benchmarks quote, is the sum over ranks
of their peak resident memory divided by the model's parameters.
"""

from __future__ import annotations

from dslide.config import Config
from dslide.config.rules import hidden_store_fits
from dslide.infer.index import InferenceIndex
from dslide.model.sharding import shard_bounds

PARTS = ("weights", "moments", "tables", "index", "scratch", "neighbours", "step", "index_build")


def account(config: Config, n_features: int, n_labels: int, world_size: int = 1, rank: int = 0,
            threads: int = 1, data: tuple[int, int, int] | None = None) -> dict:
    """Expected bytes of rank `rank` of `world_size` (model parallel) by part, and their "total"
    (index_build is a transient at the end of training, not counted in the total: it falls
    when the step's buffers are free; `peak` is the larger of total and the index build's).

    Each layer kind reports its own slice's bytes (`Layer.estimate`); this sums them,
    takes the largest transient, and adds the replicas' marks.
    data: (n_points, nnz of X, nnz of Y[, sum over points of nnz(x_i) |y_i|]) of the training
    set, for the neighbour store every rank holds where the neighbours' labels are fused
    (`neighbour_bytes`, with the label prototypes where proto_weight is on, and `search_bytes`;
    0 without data, or where knn resolves to 0), and the hidden neighbours (`hidden_bytes`) unless
    hidden_knn is 0 or the network has no hidden layer."""
    from dslide.model.layers import KINDS as LAYER_KINDS
    from dslide.model.layers.dense import RowDenseLayer

    config = config.resolve(n_labels)
    # replicas: each replica's P ranks split the model; rank w is shard w % P (dslide.train.replicas)
    P = 1 if config.parallel == "data" else world_size // config.replicas
    rank = rank % P
    weights = config.shard_weights if isinstance(config.shard_weights, tuple) and config.shard_weights else None
    widths = [n_features, *config.hidden, n_labels]
    out = dict.fromkeys(PARTS, 0)
    for i in range(len(widths) - 1):
        d, n = widths[i], widths[i + 1]
        rows = i == len(widths) - 2 and config.output_rows(n_labels)  # n_local: its rows of W
        bounds = shard_bounds(d if rows else n, P, weights)
        n_local = int(bounds[rank + 1] - bounds[rank])
        kind = RowDenseLayer if rows else LAYER_KINDS[config.layer_kind(i, n)]
        part = kind.estimate(config, i, d, n, n_local, i == len(widths) - 2, threads)
        lc = config.layer_lsh(i)
        if i == len(widths) - 2 and kind.indexable and lc.builds_index(n):
            part.update(InferenceIndex.estimate(lc, d, n, n_local))
        for k in ("weights", "moments", "tables", "index", "scratch"):
            out[k] += part.get(k, 0)
        for k in ("step", "index_build"):  # transients: the largest
            out[k] = max(out[k], part.get(k, 0))
        if config.replicas > 1:  # the replicas' marks of recent and changed rows, uint8 each
            out["scratch"] += 2 * part["rows"]
    if data is not None and config.knn != 0:  # None: the rule turned it on, or the data's shape was not given
        n_points, nnz_x, nnz_y = data[:3]
        protos = config.proto_weight != 0  # None: built, then kept unless the chosen share is 0
        nnz_xy = data[3] if len(data) > 3 else (nnz_x * nnz_y // max(1, n_points))
        out["neighbours"] = (neighbour_bytes(n_features, n_points, nnz_x, nnz_y, n_labels if protos else 0,
                                             nnz_xy if protos else 0) + search_bytes(n_features, n_points, nnz_x))
    if data is not None and config.hidden_knn != 0 and config.hidden:  # None: kept where the split chooses it
        if config.hidden_knn is not None or hidden_store_fits(data[0], config.hidden[-1]):
            out["neighbours"] += hidden_bytes(data[0], config.hidden[-1], data[2])
    out["total"] = sum(out[k] for k in ("weights", "moments", "tables", "index", "scratch", "neighbours", "step"))
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


def hidden_bytes(n_points: int, width: int, nnz_y: int) -> int:
    """The hidden neighbours (dslide.infer.hidden_knn.HiddenNeighbours): the unit hidden vectors
    (float32 [N, width]) and the labels (int64 pointers, int32 ids). Their cells, derived under
    --lsh (`cells`), add ceil(sqrt(N)) centres and a cell id a point, outside the account."""
    return 4 * n_points * width + 8 * (n_points + 1) + 4 * nnz_y


def neighbour_bytes(n_features: int, n_points: int, nnz_x: int, nnz_y: int, n_labels: int = 0,
                    nnz_xy: int = 0) -> int:
    """The neighbour store (dslide.infer.fusion.NeighbourLabels): the training rows by feature (int64
    pointers, int32 point ids, float32 values) and their labels (int64 pointers, int32 ids);
    with n_labels > 0 also the label prototypes by feature (int64 pointers, int32 label ids,
    float32 values), their norms (float32) and the labels' renumbering (int32), counting
    nnz_xy entries: at most the sum over points of nnz(x_i) |y_i|, which it is where no two
    points of a label share a feature."""
    points = 8 * (n_features + 1) + 8 * nnz_x + 8 * (n_points + 1) + 4 * nnz_y
    return points + (8 * (n_features + 1) + 8 * nnz_xy + 8 * n_labels if n_labels else 0)


def search_bytes(n_features: int, n_points: int, nnz_x: int) -> int:
    """What the neighbour store's exact search derives on first use (dslide.infer.fusion,
    `search_bounded`): the points' rows (int64 pointers, int32 features, float32 values) and each
    feature's largest value (float32)."""
    return 8 * (n_points + 1) + 8 * nnz_x + 4 * n_features


def data_shape(X, Y) -> tuple[int, int, int, int]:
    """`account`'s data: (n_points, nnz of X, nnz of Y, sum over points of nnz(x_i) |y_i|)."""
    import numpy as np

    per_x = np.diff(X.indptr).astype(np.int64)
    per_y = np.diff(Y.indptr).astype(np.int64)
    return int(X.shape[0]), int(X.nnz), int(Y.nnz), int(per_x @ per_y)


def data_bytes(n_points: int, nnz_x: int, nnz_y: int, value_bytes: int = 4) -> int:
    """The CSR arrays of a training set: X (int64 indptr, int32 indices, float values) and Y."""
    return 2 * 8 * (n_points + 1) + nnz_x * (4 + value_bytes) + nnz_y * (4 + value_bytes)
