"""Training: `fit`, the model it trains, and its one training loop.

`fit` runs the one training loop (`_Loop`): which global step comes next,
when to checkpoint, log, evaluate and stop. Every rank runs it over the same
batches (the order comes from the seed and the step); the network's layers
are split over the ranks. With one process and no MPI launcher the same code
runs on a stand-in communicator. Two things plug into the loop:

- a synchronisation schedule, which deals the global steps: `Alone` (one
  replica trains every step in order), or with `replicas = R` the world's R
  replicas of the sharded model, which train on disjoint batches and average
  what they changed (dslide.train.replicas.Replicas);
- the network's gradient hook, chosen when it is built: in data-parallel mode
  (`parallel = "data"`) every rank holds the whole model, takes its own slice
  of each batch and all-reduces the gradients (dslide.model.network).

The run's timings (dslide.timings) live in one object, `Model.timings`. After
the loop, `fit` has the model's inference parts built (dslide.train.infer_build);
prediction is dslide.infer.predict's.
"""

from __future__ import annotations

import functools
import math
import resource
import time
from dataclasses import dataclass, field

import numba
import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

import dslide
from dslide.comm import Comm, allreduce_bytes, default_threads
from dslide.config import Config, resolve_shape
from dslide.io.data import XMCData
from dslide.train import validation
from dslide.train.infer_build import (EpochScorer, apply_prior_shift, build_hidden_neighbours, build_index,
                                     build_neighbours, fusion_pending, fusion_probe, kept_scoring, label_counts)
# the command line takes prediction from here until its split (issue 37, move 1) takes it from dslide.infer
from dslide.infer.predict import evaluate
from dslide.model.inputs import csr_parts, input_norms, make_batch
from dslide.model.network import Network
from dslide.timings import Timings
from dslide.train.replicas import Replicas

#: byte counters that belong to training steps (the rest: evaluation, logging, checks)
STEP_KINDS = ("allgather", "reduce_scatter", "allgather_block", "softmax_stats", "output_rows", "gradients")


@dataclass
class Model:
    """A trained (or training) network with what inference needs to read new data: its
    neighbour store and inference index (dslide.infer; None until built or loaded)."""

    network: Network
    config: Config
    comm: Comm
    history: list = field(default_factory=list)
    index_info: dict = field(default_factory=dict)
    replicas: Replicas | None = None  # the world's layout when replicas > 1 or shard_weights = "auto"
    neighbours: object = None  # dslide.infer.fusion.NeighbourLabels
    index: object = None  # dslide.infer.index.InferenceIndex, this rank's
    hidden_neighbours: object = None  # dslide.infer.hidden_knn.HiddenNeighbours

    @property
    def n_features(self) -> int:
        return self.network.n_features

    @property
    def n_labels(self) -> int:
        return self.network.n_labels

    @property
    def timings(self) -> Timings:
        """The run's timings (made with the model, shared by its network, layers and replicas)."""
        return self.network.timings


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite: training stopped there, and no checkpoint holds that state."""


@functools.lru_cache(maxsize=2)
def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The sample order of an epoch: a permutation from (seed, epoch) alone, the same on every
    rank. Read-only, and kept for the epoch's steps (drawing it is a large share of a small step)."""
    order = np.random.default_rng([seed, 0x5EED, epoch]).permutation(n)
    order.setflags(write=False)
    return order


def batch_rows(config: Config, n: int, step: int) -> np.ndarray:
    """Data rows of global step `step` (1-based): a function of (seed, step) only, so a
    resumed run reads exactly the batches the uninterrupted one would have."""
    B = config.batch_size
    epoch, pos = divmod(step - 1, epoch_steps(config, n))
    return epoch_order(config.seed, epoch, n)[pos * B:(pos + 1) * B]


def epoch_steps(config: Config, n: int) -> int:
    """Training steps of an epoch over n points (the last batch may be short)."""
    return max(1, -(-n // config.batch_size))


def total_steps(config: Config, n: int) -> int:
    return max(1, int(round(config.epochs * epoch_steps(config, n))))


def rank_threads(config: Config) -> int:
    """numba threads of this rank: `threads`, or for 0 the node's cores divided by its ranks
    (dslide.comm.default_threads); never more than NUMBA_NUM_THREADS."""
    n = numba.config.NUMBA_NUM_THREADS
    return min(config.threads or default_threads(), n)


def _blas_threads(net: Network, threads: int) -> int:
    """BLAS threads for training steps.

    numba's kernels and the BLAS products take turns on the same cores. When
    idle OpenBLAS threads sleep (dslide.BLAS_THREADS_SLEEP: importing dslide
    before numpy arranges it), the products get every thread. When they spin,
    an LSH network's many numba kernels wait for them (much slower steps:
    docs/benchmarks.md), so its products run on one thread; all-dense
    networks, whose time is BLAS, get every thread either way.
    """
    if dslide.BLAS_THREADS_SLEEP:
        return threads
    return 1 if any(layer.kernel_bound for layer in net.layers) else threads


def peak_rss_mb() -> float:
    """This process's peak resident set, MB: VmHWM of /proc/self/status (ru_maxrss of
    RUSAGE_SELF where /proc is missing; it also counts a parent's size inherited at fork)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_network(train_shape: tuple[int, int], config: Config, comm: Comm | None = None) -> Model:
    """A fresh model for data of (n_features, n_labels) on `comm` (default: the MPI world).

    With replicas (or shard_weights = "auto") the world is split first: the network
    then lives on this rank's replica (Model.replicas.model), Model.comm stays the world.
    """
    comm = comm or Comm.world()
    comm.stall_timeout = config.stall_timeout  # before the split: sub-communicators inherit it
    numba.set_num_threads(rank_threads(config))
    timings = Timings()
    rep = Replicas(config, comm, timings) if (config.replicas > 1 or config.shard_weights == "auto") else None
    net = Network(config, train_shape[0], train_shape[1], rep.model if rep else comm, timings=timings)
    return Model(net, net.config, comm, replicas=rep)


def save_model(model: Model, save) -> None:
    """Call save(model, comm) on the ranks that write a checkpoint, with the communicator
    its files are split over: every rank, or with replicas replica 0's ranks on their
    model communicator (the replicas hold the same parameters after `fit`); the others
    wait for it."""
    rep = model.replicas
    if rep is None or rep.n_replicas == 1:
        save(model, model.comm if rep is None else rep.model)
        return
    if rep.replica == 0:
        save(model, rep.model)
    rep.world.barrier()


def init_from_data(model: Model, train: XMCData) -> None:
    """The parts of a fresh model's initialisation that come from the training data."""
    if model.config.output_bias_init == "log_prior":
        model.network.init_output_bias(label_counts(train), train.n_points)


def fit(train: XMCData, config: Config | None = None, test: XMCData | None = None, *,
        comm: Comm | None = None, model: Model | None = None, callback=None,
        verbose: bool = False, stop_at: int | None = None, index: bool = True,
        checkpoint=None, index_progress: bool = False) -> tuple[Model, list]:
    """Train a network on `train`; returns (model, history).

    history: a list of dicts, one per logging point: step, epoch, samples,
    wall_s (training time, evaluation excluded), loss (mean over the steps
    since the last point), bytes_per_step, and p@1/p@3/p@5 at evaluation
    points (every `eval_every` steps and at the end, on the first
    `eval_points` test points). The record covering the first step of this
    call has warmup_s, that step's time (numba compiles the kernels there).
    model: continue training this model (restored from a checkpoint: it
    resumes after `model.network.step`).
    callback(event, model, info): "step" after every step (info: the step),
    "log" at each logging point (info: the record); it may return "stop"
    (under MPI every rank must return it at the same step: agree through
    `model.comm`, e.g. `comm.allreduce_max`; with replicas each replica's
    ranks are made to agree, and the run ends at the next synchronisation
    (allreduce) or global point (partial)).
    stop_at: end after this global step (the rest of the schedule is kept).
    index: at the end, build the LSH output layer's inference index from the
    final weights (`build_index`; its timings land in model.index_info).
    checkpoint(model, comm): called every `checkpoint_every` global steps (not
    at the last) on the ranks that write a checkpoint (see `save_model`).
    index_progress: a progress bar (tqdm, stderr) for the index build.

    The seconds of training outside the steps' clock (history's wall_s) land in
    model.index_info: probe_s (the validation probe, before the steps), finish_s (early
    stopping's end and the prior shift's choice), neighbours_s and hidden_s (the neighbour
    stores and their choices); the inference index's build is not training.
    """
    if model is None:
        config = (config or Config()).resolve(*resolve_shape(train))
        model = build_network((train.n_features, train.n_labels), config, comm)
        init_from_data(model, train)
    config = model.config  # resolved: every setting has its value
    net = model.network
    if (train.n_features, train.n_labels) != (net.n_features, net.n_labels):
        raise ValueError(f"the data has {train.n_features} features and {train.n_labels} labels, "
                         f"the model {net.n_features} and {net.n_labels}")
    threads = rank_threads(config)
    numba.set_num_threads(threads)
    # the held-out points that judge the choices made from the data (dslide.train.validation)
    fit_data, val = train, None
    fusing = fusion_pending(config, train)
    if config.early_stop or fusing:
        fit_data, val, _ = validation.split(train, config.seed)
    early = probe = scorer = kept = scored = None
    per_epoch = epoch_steps(config, fit_data.n_points)
    if val is not None and fusing:
        probe = fusion_probe(model, fit_data, val)
    if config.early_stop and val is not None and model.replicas is None:
        scorer = EpochScorer(model, val, probe)
        early = validation.EarlyStop(scorer, per_epoch)
        callback = early.callback(callback)
    if net.prior_shift:  # a finished run's shifted biases: training goes on from the trained ones
        net.shift_output_prior(0.0, label_counts(train), train.n_points)
    with threadpool_limits(_blas_threads(net, threads), user_api="blas"):
        model, history = _fit(model, fit_data, test, callback, verbose, threads, stop_at, checkpoint,
                              negative_share(config.middle_negatives, per_epoch, early))
        model.network.set_negative_share(1.0)
        t0 = time.perf_counter()
        if early is not None:
            model.index_info["early_stop"] = early.finish(model)
            kept = kept_scoring(model.index_info["early_stop"], scorer)  # the weights kept, already scored
        if stop_at is None or stop_at >= total_steps(config, fit_data.n_points) or model.network.step < stop_at:
            # the run is over: the biases as inference uses them
            scored = apply_prior_shift(model, train, val, probe, scorer, kept)
        # training time outside the steps' clock, as probe_s, neighbours_s and hidden_s are
        model.index_info["finish_s"] = time.perf_counter() - t0
    if index:
        with threadpool_limits(threads, user_api="blas"):
            build_index(model, train, progress=index_progress)
    with threadpool_limits(threads, user_api="blas"):
        base = build_neighbours(model, train, progress=index_progress, val=val, fit_data=fit_data, probe=probe,
                                scored=scored)
        build_hidden_neighbours(model, train, val=val, fit_data=fit_data, base=base)
    return model, history


class Alone:
    """The trivial synchronisation schedule: one replica (the whole world) trains every global
    step in order; every step boundary is a global point.

    The protocol of a synchronisation schedule, which the loop (`_Loop`) calls:
        network                       the network to train (a schedule may replace it, as
                                      shard_weights = "auto" re-shards once)
        start(net, base, last, checkpoints, at_checkpoint) -> int | None
                                      deal global steps base + 1 .. last; the first one this
                                      rank trains (None: nothing to train). checkpoints: the
                                      global steps the loop wants checkpoints at;
                                      at_checkpoint(network, step): the loop's checkpoint, to
                                      call at a global point where every step up to `step` is
                                      trained and the model is the same everywhere
        agree_stop(stop) -> bool      a stop asked by the loop's callback, the same on every
                                      rank that trains this step
        after_step(step, stop) -> int | None
                                      after global step `step`: synchronise and checkpoint when
                                      due; the next global step this rank trains, or None (the
                                      run is over, the model final and `network.step` its step)
        stop_at_log() -> bool         a stop asked at a logging point: True ends the run there,
                                      False passes it to the next after_step
        record() -> dict              what a logging record adds (replicas: sync_bytes, syncs)
        close()                       release what it holds (collective), after the run
    """

    def __init__(self):
        self.network = None
        self.last = 0
        self.checkpoints: list[int] = []
        self.at_checkpoint = None

    def start(self, net, base: int, last: int, checkpoints=(), at_checkpoint=None) -> int | None:
        self.network, self.last = net, int(last)
        self.checkpoints = [int(c) for c in checkpoints if base < c <= last]
        self.at_checkpoint = at_checkpoint
        return base + 1 if base < last else None

    def agree_stop(self, stop: bool) -> bool:
        return stop

    def after_step(self, step: int, stop: bool = False) -> int | None:
        if self.checkpoints and self.checkpoints[0] == step:
            self.checkpoints.pop(0)
            if self.at_checkpoint is not None:
                self.at_checkpoint(self.network, step)
        return step + 1 if (step < self.last and not stop) else None

    def stop_at_log(self) -> bool:
        return True

    def record(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def checkpoint_steps(config: Config, base: int, total: int) -> list[int]:
    """The global steps after `base` and before the schedule's last step (`total`) that end
    with a checkpoint: every `checkpoint_every` steps (none for 0)."""
    every = config.checkpoint_every
    return list(range(every * (base // every + 1), total, every)) if every else []


class _Loop:
    """The training loop of one `fit` call: trains the global steps its schedule deals,
    checkpoints when the schedule reaches a checkpoint step, logs every `log_every`
    steps, evaluates every `eval_every` and at the end, and stops when the schedule
    runs out, at `stop_at`, or when the callback asks."""

    def __init__(self, model: Model, train: XMCData, test, callback, verbose: bool, threads: int,
                 stop_at, checkpoint, negatives=None):
        self.model, self.config, self.comm = model, model.config, model.comm
        self.negatives = negatives  # share(step) of the output's uniform negatives (`negative_share`)
        self.callback, self.verbose, self.threads, self.checkpoint = callback, verbose, threads, checkpoint
        self.schedule = model.replicas if model.replicas is not None else Alone()
        X = sp.csr_matrix(train.X)
        self.X_parts = csr_parts(X, model.network.dtype)  # no copy: normalised batch by batch
        self.norms = input_norms(X, self.config.input_norm)
        self.Y_parts = csr_parts(sp.csr_matrix(train.Y), np.float32)
        self.n = X.shape[0]
        self.total = total_steps(self.config, self.n)
        self.last = self.total if stop_at is None else min(self.total, stop_at)
        self.eval_set = None
        if test is not None:
            m = min(self.config.eval_points, test.n_points)
            self.eval_set = XMCData(test.X[:m], test.Y[:m])
        self.timings = model.timings
        # since the last logging point
        self.loss_acc, self.loss_n, self.steps_done = 0.0, 0, 0
        self.bytes0 = 0
        self.t0 = 0.0
        # training seconds of the earlier records (a resumed model's), and the timings' then
        self.wall0 = sum(r.get("wall_s_delta", 0.0) for r in model.history)
        self.train0 = self.timings["train"]
        self.warmup = None  # the first step of the call compiles the kernels: timed apart
        self.warmup_pending = True
        self.stop_logged = False  # a "log" stop the schedule takes at the next after_step
        self.bad_step, self.bad_loss = None, None  # this rank's first step whose loss was NaN or inf

    def run(self) -> list:
        model, schedule = self.model, self.schedule
        net = model.network
        net.set_total_steps(self.total)
        self.bytes0 = _step_bytes(net.comm)
        self.t0 = time.perf_counter()
        step = schedule.start(net, net.step, self.last, checkpoint_steps(self.config, net.step, self.total),
                              self._at_checkpoint)
        while step is not None:
            self._train(model.network, step)
            stop = (self.callback is not None and self.callback("step", model, step) == "stop") or self.stop_logged
            if self.callback is not None:
                stop = schedule.agree_stop(stop)
            nxt = schedule.after_step(step, stop)  # synchronisations, checkpoints; None: the run is over
            model.network = schedule.network
            if self._log_point(step, nxt is None) == "stop":
                if schedule.stop_at_log():
                    break
                self.stop_logged = True
            step = nxt
        schedule.close()
        return model.history

    def _train(self, net: Network, step: int) -> None:
        rows = batch_rows(self.config, self.n, step)
        n_global = rows.shape[0]
        batch = make_batch(self.X_parts, self.Y_parts, net.grad_hook.local_rows(rows), step, n_global, self.norms)
        net.set_negative_share(1.0 if self.negatives is None else self.negatives(step))
        if self.warmup is None:
            t = self.timings["warmup"]
            with self.timings.time("warmup"):
                step_loss = net.train_step(batch)
            self.warmup = self.timings["warmup"] - t
        else:
            step_loss = net.train_step(batch)
        if self.bad_step is None and not math.isfinite(step_loss):
            self.bad_step, self.bad_loss = step, step_loss
        self.loss_acc += step_loss
        self.loss_n += 1
        self.steps_done += 1

    def _at_checkpoint(self, net: Network, step: int) -> None:
        """The checkpoint of global step `step` (called by the schedule, on every rank of the
        world): never of a diverged state; written by the ranks `save_model` picks."""
        if self.checkpoint is None:
            return
        self.model.network = net
        net.step = step
        _stop_if_diverged(self.comm, self.bad_step, self.bad_loss)
        save_model(self.model, self.checkpoint)

    def _log_point(self, step: int, is_last: bool):
        """A logging record when due (every log_every steps, evaluations, the last step);
        returns what the callback returned for it."""
        cfg, net = self.config, self.model.network
        do_eval = self.eval_set is not None and (is_last or (cfg.eval_every and step % cfg.eval_every == 0))
        if not (is_last or do_eval or step % cfg.log_every == 0):
            return None
        dt = time.perf_counter() - self.t0
        self.timings.add("train", dt)
        loss_comm = net.world  # the ranks that share a step's loss
        loss = float(loss_comm.allreduce_sum(np.array([self.loss_acc]))[0]) / self.loss_n
        if not math.isfinite(loss):  # every rank of loss_comm sees it: they stop together
            _stop_if_diverged(loss_comm, self.bad_step, self.bad_loss if self.bad_loss is not None else loss)
        sent = _step_bytes(net.comm) - self.bytes0
        # the last record is the model's: with replicas every replica holds the average of all
        # global steps up to net.step (this replica's own last step may be earlier)
        at = net.step if is_last else step
        record = {"step": at, "epoch": at / epoch_steps(cfg, self.n),
                  "samples": at * cfg.batch_size, "wall_s": self.wall0 + self.timings["train"] - self.train0,
                  "wall_s_delta": dt, "loss": loss, "bytes_per_step": sent / max(1, self.steps_done),
                  "peak_rss_mb": peak_rss_mb()}
        if self.warmup_pending:
            record["warmup_s"] = self.warmup
            self.warmup_pending = False
        record.update(self.schedule.record())
        self.loss_acc, self.loss_n, self.steps_done, self.bytes0 = 0.0, 0, 0, _step_bytes(net.comm)
        if do_eval:
            with threadpool_limits(self.threads, user_api="blas"):
                record.update(evaluate(self.model, self.eval_set, k=5, exact=True))
        self.model.history.append(record)
        if self.verbose and self.comm.rank == 0:
            print(format_record(record), flush=True)
        out = self.callback("log", self.model, record) if self.callback is not None else None
        self.t0 = time.perf_counter()
        return out


def _fit(model, train, test, callback, verbose, threads, stop_at, checkpoint, negatives=None):
    history = _Loop(model, train, test, callback, verbose, threads, stop_at, checkpoint, negatives).run()
    return model, history


def negative_share(middle: float, steps_per_epoch: int, early=None):
    """share(step) -> the share of the output's uniform negatives global step `step` draws
    (Config.middle_negatives = `middle`): every one in the first epoch (steps 1 ..
    steps_per_epoch) and once early stopping (`early`, a validation.EarlyStop, or None) has
    lowered the learning rate; `middle` between. A function of the step and of the
    decay alone, so every rank draws the same share. `middle` None (a model resolved before
    the setting existed, resumed): every negative throughout, as it trained."""
    middle = 1.0 if middle is None else float(middle)

    def share(step: int) -> float:
        if middle >= 1.0 or step <= steps_per_epoch or (early is not None and early.decayed_at):
            return 1.0
        return middle

    return share


def _stop_if_diverged(comm: Comm, bad_step, loss) -> None:
    """Raise TrainingDiverged on every rank of `comm` when any of them saw a loss that is not
    finite (collective: one all-reduce); `bad_step`: this rank's first such step, or None."""
    first = -comm.allreduce_max(-float(bad_step) if bad_step is not None else -math.inf)
    if math.isfinite(first):
        what = f"{loss}" if loss is not None and int(first) == bad_step else "NaN or inf"
        raise TrainingDiverged(
            f"training stopped: the loss became {what} at step {int(first)} (diverged); no checkpoint holds "
            f"that state (the last one written, if any, is kept). Try a smaller lr, or input_norm = 'l2' "
            f"for large feature values")


def _step_bytes(comm: Comm) -> int:
    return sum(comm.bytes_sent.get(k, 0) for k in STEP_KINDS)


def data_parallel_bytes(net: Network, world: int) -> int:
    """Bytes per rank per step that a data-parallel all-reduce of every gradient sends."""
    return allreduce_bytes(net.n_params * net.dtype.itemsize, world)


def throughput(history: list, batch_size: int) -> float:
    """Training samples per second over `history`, leaving out each process's first
    step (numba compiles the kernels there)."""
    if not history:
        return 0.0
    secs = sum(r.get("wall_s_delta", 0.0) - r.get("warmup_s", 0.0) for r in history)
    steps = history[-1]["step"] - sum(1 for r in history if "warmup_s" in r)
    return steps * batch_size / secs if secs > 0 else 0.0


def format_record(r: dict) -> str:
    s = f"step {r['step']:7d}  epoch {r['epoch']:6.2f}  {r['wall_s']:7.1f}s  loss {r['loss']:.4f}"
    if "p@1" in r:
        s += f"  P@1 {r['p@1']:.4f}  P@3 {r['p@3']:.4f}  P@5 {r['p@5']:.4f}"
    return s
