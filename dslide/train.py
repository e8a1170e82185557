"""Training and inference: `fit`, `predict_topk`, `evaluate`.

Every rank runs the same loop over the same batches (the order comes from
the seed and the epoch); the network's layers are split over the ranks.
With one process and no MPI launcher the same code runs on a stand-in
communicator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from dslide import kernels as K
from dslide.comm import Comm
from dslide.config import Config
from dslide.data import XMCData
from dslide.network import Batch, LSHLayer, Network, merge_topk


@dataclass
class Model:
    """A trained (or training) network with what inference needs to read new data."""

    network: Network
    config: Config
    comm: Comm
    history: list = field(default_factory=list)

    @property
    def n_features(self) -> int:
        return self.network.n_features

    @property
    def n_labels(self) -> int:
        return self.network.n_labels


def normalise_inputs(X: sp.csr_matrix, how: str, dtype) -> sp.csr_matrix:
    """Rows scaled to unit L2 norm ("l2") or left as they are ("none"); float `dtype`, sorted indices."""
    X = sp.csr_matrix(X, dtype=dtype, copy=True)
    X.sort_indices()
    if how == "l2":
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        X.data /= np.repeat(norms, np.diff(X.indptr)).astype(dtype)
    return X


def _csr_parts(M: sp.csr_matrix, dtype=None):
    indptr = M.indptr.astype(np.int64, copy=False)
    indices = M.indices.astype(np.int32, copy=False)
    data = M.data if dtype is None else M.data.astype(dtype, copy=False)
    return indptr, indices, data


def make_batch(X_parts, Y_parts, rows: np.ndarray, step: int) -> Batch:
    xp, xi, xd = K.gather_rows(*X_parts, rows)
    if Y_parts is None:
        yp, yi = np.zeros(rows.shape[0] + 1, dtype=np.int64), np.empty(0, dtype=np.int32)
    else:
        yp, yi, _ = K.gather_rows(*Y_parts, rows)
    return Batch((xp, xi, xd), (yp, yi), rows.astype(np.int64), step)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of an epoch: a permutation from (seed, epoch) alone, the same on every rank."""
    return np.random.default_rng([seed, 0x5EED, epoch]).permutation(n)


def _threads(config: Config) -> int:
    n = numba.config.NUMBA_NUM_THREADS
    return min(config.threads, n) if config.threads else numba.get_num_threads()


def _blas_threads(net: Network, threads: int) -> int:
    """BLAS threads for training steps.

    numba's and OpenBLAS's thread pools both spin while they wait for work;
    sharing the cores, each step's small BLAS products made numba's kernels
    wait for spinning BLAS threads (measured here: 3x slower steps). Networks
    with an LSH layer run their BLAS products single-threaded; all-dense ones,
    whose time is BLAS, give it every thread.
    """
    return 1 if any(isinstance(layer, LSHLayer) for layer in net.layers) else threads


def fit(train: XMCData, config: Config | None = None, test: XMCData | None = None, *,
        comm: Comm | None = None, callback=None, verbose: bool = False) -> tuple[Model, list]:
    """Train a network on `train`; returns (model, history).

    history: a list of dicts, one per logging point: step, epoch, samples,
    wall_s (training time, evaluation excluded), loss (mean over the last
    steps), and p@1/p@3/p@5 at evaluation points (every `eval_every` steps
    and at the end, on the first `eval_points` test points).
    callback(model, record) is called at each logging point (progress bars).
    """
    config = config or Config()
    comm = comm or Comm.world()
    threads = _threads(config)
    numba.set_num_threads(threads)
    dtype = np.dtype(config.dtype)
    net = Network(config, train.n_features, train.n_labels, comm)
    with threadpool_limits(_blas_threads(net, threads), user_api="blas"):
        return _fit(net, train, config, test, comm, callback, verbose, threads)


def _fit(net, train, config, test, comm, callback, verbose, threads):
    dtype = net.dtype
    model = Model(net, config, comm)
    X = normalise_inputs(train.X, config.input_norm, dtype)
    X_parts = _csr_parts(X)
    Y_parts = _csr_parts(sp.csr_matrix(train.Y), np.float32)
    n = X.shape[0]
    B = config.batch_size
    steps_per_epoch = max(1, -(-n // B))
    total_steps = max(1, int(round(config.epochs * steps_per_epoch)))
    eval_set = None
    if test is not None:
        m = min(config.eval_points, test.n_points)
        eval_set = XMCData(test.X[:m], test.Y[:m])

    history = model.history
    loss_acc, loss_n, step = 0.0, 0, 0
    train_time = 0.0
    t0 = time.perf_counter()
    for step in range(1, total_steps + 1):
        epoch, pos = divmod(step - 1, steps_per_epoch)
        if pos == 0:
            order = epoch_order(config.seed, epoch, n)
        rows = order[pos * B:(pos + 1) * B]
        batch = make_batch(X_parts, Y_parts, rows, step)
        loss_acc += net.train_step(batch)
        loss_n += 1
        last = step == total_steps
        do_eval = eval_set is not None and (last or (config.eval_every and step % config.eval_every == 0))
        if last or do_eval or step % config.log_every == 0:
            train_time += time.perf_counter() - t0
            loss = float(comm.allreduce_sum(np.array([loss_acc]))[0]) / loss_n
            record = {"step": step, "epoch": step / steps_per_epoch, "samples": min(step * B, total_steps * B),
                      "wall_s": train_time, "loss": loss}
            loss_acc, loss_n = 0.0, 0
            if do_eval:
                with threadpool_limits(threads, user_api="blas"):
                    record.update(evaluate(model, eval_set, k=5, exact=True))
            history.append(record)
            if verbose and comm.rank == 0:
                print(_format_record(record), flush=True)
            if callback is not None:
                callback(model, record)
            t0 = time.perf_counter()
    return model, history


def _format_record(r: dict) -> str:
    s = f"step {r['step']:6d}  epoch {r['epoch']:6.2f}  {r['wall_s']:7.1f}s  loss {r['loss']:.4f}"
    if "p@1" in r:
        s += f"  P@1 {r['p@1']:.4f}  P@3 {r['p@3']:.4f}  P@5 {r['p@5']:.4f}"
    return s


def predict_topk_scores(model: Model, X: sp.csr_matrix, k: int, exact: bool = True, batch_size: int = 1024):
    """Top k labels per point and their scores (logits): (ids int64 [n, k], scores float64 [n, k]).

    exact: every output neuron scored; otherwise an LSH output layer scores
    only what its tables retrieve. With P ranks each scores its own slice and
    the candidates (B x k per rank) are merged, so every rank gets the result.
    """
    net = model.network
    if X.shape[1] != net.n_features:
        raise ValueError(f"data has {X.shape[1]} features but the model was trained on {net.n_features}")
    Xn = normalise_inputs(X, model.config.input_norm, net.dtype)
    parts = _csr_parts(Xn)
    n = Xn.shape[0]
    ids = np.empty((n, k), dtype=np.int64)
    scores = np.empty((n, k), dtype=np.float64)
    for s in range(0, n, batch_size):
        rows = np.arange(s, min(n, s + batch_size))
        batch = make_batch(parts, None, rows, net.step)
        ls, li = net.local_topk(batch, k, exact)
        all_s = model.comm.allgather_rows(ls)
        all_i = model.comm.allgather_rows(li)
        ms, mi = merge_topk(all_s, all_i, k)
        scores[rows], ids[rows] = ms, mi
    return ids, scores


def predict_topk(model: Model, X: sp.csr_matrix, k: int, exact: bool = True) -> np.ndarray:
    """Top k label indices per point, best first: int64 [n, k] (-1 where fewer than k were scored)."""
    return predict_topk_scores(model, X, k, exact)[0]


def evaluate(model: Model, data: XMCData, k: int = 5, exact: bool = True, inv_prop=None) -> dict:
    """P@k, nDCG@k (and PSP@k when inverse propensities are given) on `data`, as a dict."""
    from dslide import metrics

    pred = predict_topk(model, data.X, k, exact)
    return metrics.evaluate(sp.csr_matrix(data.Y), pred, k=k, inv_prop=inv_prop)


def lsh_layers(model: Model) -> list[LSHLayer]:
    return [layer for layer in model.network.layers if isinstance(layer, LSHLayer)]
