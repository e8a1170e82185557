"""Re-sharding a network over new shares: its parameters, moments and step moved to their new owners."""

from __future__ import annotations

import numpy as np

from dslide.comm import Comm
from dslide.model.network import Network
from dslide.model.sharding import moves


def reshard(net: Network, weights) -> Network:
    """The network `net` re-split over its communicator with shares `weights` (float [P]):
    a new Network holding the same parameters, moments and step, each rank's new columns
    received from their old owners (one all-to-all per array: only the moving slices
    travel). Derived state (hash tables) is rebuilt as when a checkpoint is loaded on
    another layout."""
    comm = net.comm
    new = Network(net.config, net.n_features, net.n_labels, comm, total_steps=net.total_steps,
                  shard_weights=weights, timings=net.timings)
    for old_layer, new_layer in zip(net.layers, new.layers):
        state = old_layer.state()
        arrays = {}
        for key, axis in old_layer.shard_axes().items():
            if key not in state:
                continue
            arr = np.asarray(state[key])
            if axis is None:
                arrays[key] = arr.copy()
                continue
            arrays[key] = redistribute(comm, arr, axis, old_layer.bounds, new_layer.bounds)
        new_layer.load_state(arrays, same_layout=False)
    new.step = net.step
    return new


def redistribute(comm: Comm, arr: np.ndarray, axis: int, old_bounds, new_bounds) -> np.ndarray:
    """This rank's slice [new_lo, new_hi) along `axis` of an array split by old_bounds
    (each rank holding its old slice `arr`), gathered from the old owners
    (dslide.model.sharding.moves: what goes where)."""
    r = comm.rank
    a = np.moveaxis(arr, axis, 0)
    rest = a.shape[1:]
    per = int(np.prod(rest, dtype=np.int64))
    olo = int(old_bounds[r])
    nlo, nhi = int(new_bounds[r]), int(new_bounds[r + 1])
    send_ranges, recv = moves(old_bounds, new_bounds, r)
    send = [np.ascontiguousarray(a[lo - olo:hi - olo]).reshape(-1) for lo, hi in send_ranges]
    sc = [(hi - lo) * per for lo, hi in send_ranges]
    rc = [n * per for n in recv]
    got = comm.alltoallv(np.concatenate(send) if send else np.empty(0, arr.dtype), sc, rc)
    out = got.reshape((nhi - nlo,) + rest)
    return np.ascontiguousarray(np.moveaxis(out, 0, axis))
