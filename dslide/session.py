"""What the command line and the Python interface share: the application layer under both.

dslide.cli (the `dslide` command) and dslide.api (`dslide.Model`) import this module and
never each other:

    configuration     normalise_values (settings as TOML, --set or keywords give them, in
                      Config's types); config_toml (a Config as the TOML of a run directory)
    arguments         check_k, check_lsh: the top k and LSH scoring a model allows
    a trained model   load_model: a run directory's checkpoint split over the ranks, after
                      the memory check (check_memory, model_bytes)
    reporting         Progress (a bar or log lines), notice_threads, say (rank 0 prints)
    errors            UsageError; on_rank0 (a step on rank 0 only, its error on every rank)

Importing it loads none of numpy, numba, scipy or MPI: `dslide --help` stays quick, and
dslide.cli.main checks NUMBA_NUM_THREADS before numba loads. So the modules that load
them (dslide.comm, dslide.io.checkpoint, dslide.train, dslide.memory) are imported where
they are used.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from pathlib import Path

from dslide import hooks
from dslide.config.tomlio import config_toml, toml_value as _toml_value  # noqa: F401 (the API and the CLI write it)
from dslide.io import rundir


class UsageError(ValueError):
    """A mistake in how dslide was called."""


def normalise_values(values: dict) -> dict:
    """Settings as TOML or --set give them, in the types Config takes (an int or a list of
    hidden widths, lists for tuples)."""
    values = dict(values)
    if "hidden" in values and isinstance(values["hidden"], int) and not isinstance(values["hidden"], bool):
        values["hidden"] = [values["hidden"]]
    for key in ("hidden", "kinds"):
        if key in values and isinstance(values[key], list):
            values[key] = tuple(values[key])
    return values


def on_rank0(comm, fn):
    """fn() on rank 0 only (the file system's state: run directories, locks); its user error
    is raised on every rank, so that all of them end alike. Returns fn()'s result on rank 0,
    None elsewhere."""
    result, error = None, None
    if comm.rank == 0:
        try:
            result = fn()
        except (ValueError, OSError) as e:
            error = str(e)
    error = comm.bcast_object(error)
    if error is not None:
        raise UsageError(error)
    return result


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def check_memory(comm, need: int, what: str) -> None:
    """Refuse (UsageError, every rank) when the ranks on a host need more memory than it has
    available (dslide.memory.available_bytes), before anything is allocated.
    DSLIDE_MEMORY_CHECK=off skips the check (the account is an estimate)."""
    from dslide import memory

    if os.environ.get("DSLIDE_MEMORY_CHECK", "").strip().lower() in ("0", "off", "false", "no"):
        return
    host = socket.gethostname()
    needs = comm.allgather_object((host, int(need), memory.available_bytes()))
    mine = [(n, a) for h, n, a in needs if h == host]
    total, avail = sum(n for n, _ in mine), mine[0][1]
    if avail is not None and total > avail:
        ranks = f" by its {len(mine)} ranks" if len(mine) > 1 else ""
        raise UsageError(f"{what} needs {_gib(total)} of memory on {host}{ranks} (dslide.memory.account) but "
                         f"{_gib(avail)} is available (MemAvailable in /proc/meminfo): use a smaller model, more "
                         f"hosts, or DSLIDE_MEMORY_CHECK=off to try anyway")


def _threads_of(config) -> int:
    from dslide import train as T

    return T.rank_threads(config)


def model_bytes(config, n_features: int, n_labels: int, comm, inference: bool = False, data=None) -> int:
    """What one rank allocates for the model (dslide.memory.account; for inference without
    Adam's moments, which stay unallocated), and the per-label arrays of its set-up."""
    from dslide import memory

    try:
        acc = memory.account(config, n_features, n_labels, comm.size, comm.rank, threads=_threads_of(config),
                             data=data)
    except MemoryError:  # even a hash family of that width cannot be drawn
        return 1 << 62
    except (ValueError, ZeroDivisionError):  # a layout the network itself refuses, with its own message
        return 0
    if inference:
        return sum(acc[k] for k in ("weights", "tables", "index", "scratch", "step"))
    return acc["peak"] + 4 * 8 * n_labels  # label counts, the bias prior, the propensities


def say(comm, *parts, file=None):
    """print(*parts) on rank 0 (default: stdout), flushed."""
    if comm.rank == 0:
        print(*parts, file=file or sys.stdout, flush=True)


class Progress:
    """A tqdm bar on rank 0 when stderr is a terminal, else plain log lines."""

    def __init__(self, comm, total: int, start: int, quiet: bool, log_path: Path | None, batch: int,
                 lines: bool = True, bar: bool | None = None):
        """quiet: no bar and no log lines (the log file is still written); lines: plain
        log lines where there is no bar; bar: show one (None: when stderr is a terminal)."""
        self.rank0 = comm.rank == 0
        self.bar = None
        self.lines = lines and not quiet
        self.log = None
        if log_path and self.rank0:
            self.log = rundir.open_append(log_path)  # never through a symlink planted there
        self.batch = batch
        self.last_t = time.perf_counter()
        self.last_step = start
        if self.rank0 and not quiet and (sys.stderr.isatty() if bar is None else bar):
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, unit="step", dynamic_ncols=True, smoothing=0.1,
                            desc="training")

    def __call__(self, event, model, info):
        if not self.rank0:
            return None
        if event == "step":
            if self.bar is not None and info > self.bar.n:
                self.bar.update(info - self.bar.n)  # the global step (replicas take turns)
            return None
        record = {k: v for k, v in info.items() if k != "wall_s_delta"}
        if self.log is not None:
            self.log.write(rundir.dumps(record) + "\n")  # strict JSON: a NaN is written null; whole or not at all
        now = time.perf_counter()
        rate = (record["step"] - self.last_step) * self.batch / max(now - self.last_t, 1e-9)
        self.last_t, self.last_step = now, record["step"]
        if self.bar is not None:
            post = {"samples/s": f"{rate:,.0f}", "loss": f"{record['loss']:.3f}"}
            if "p@1" in record:
                post["P@1"] = f"{record['p@1']:.4f}"
            self.bar.set_postfix(post)
        elif self.lines:
            from dslide.train import format_record

            print(format_record(record) + f"  {rate:8,.0f} samples/s", flush=True)
        return None

    def close(self):
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()


def notice_threads(comm, config) -> None:
    """One line on stderr (rank 0) when the threads asked for exceed this node's cores."""
    from dslide.comm import oversubscription

    if config.threads:
        notice = oversubscription(config.threads)
        if notice:
            say(comm, notice, file=sys.stderr)


def _check_k(k: int, n_labels: int) -> None:
    """--k in [1, n_labels] (check_k), as a UsageError naming --k."""
    try:
        check_k(k, n_labels)
    except ValueError as e:
        raise UsageError(str(e).replace("k = ", "--k ")) from None


def load_model(run_dir: str, comm, k: int | None = None):
    """The trained model of a run directory (dslide.train.Model), split over `comm`'s ranks
    for inference, with this process's threads. k: the --k to check against the model's
    labels first, before anything is allocated."""
    from dslide.io import checkpoint as ck

    # a run still training replaces its checkpoint: LATEST may name a newer one by the time the
    # one resolved is read (its files then gone). Every rank reads the one rank 0 resolved; a
    # read that fails on any rank fails on all of them alike (ck.ReadFailed), and when LATEST
    # names a newer checkpoint by then, they all try that one
    for _ in range(LOAD_TRIES):
        path = _newest(comm, run_dir)
        hooks.call(hooks.LOAD, comm, path)
        try:
            return _load_checkpoint(run_dir, path, comm, k)
        except ck.ReadFailed:
            if _newest(comm, run_dir, missing_ok=True) in (None, path):
                raise  # not replaced meanwhile: the checkpoint itself is at fault
    raise ck.CheckpointError(f"{run_dir} is still training and replaced its newest checkpoint while it was being "
                             f"read, {LOAD_TRIES} times in a row; try again, or read a copy (dslide export)")


#: how many checkpoints load_model tries while a run replaces them (each attempt reads the newest)
LOAD_TRIES = 5


def _newest(comm, run_dir, missing_ok: bool = False):
    """The checkpoint LATEST names, as rank 0 reads it, on every rank (missing_ok: None when
    there is none, else a UsageError on every rank)."""
    from dslide.io import checkpoint as ck

    def read():
        try:
            return str(ck.latest(run_dir))
        except ck.CheckpointError:
            if missing_ok:
                return None
            raise

    found = comm.bcast_object(on_rank0(comm, read))
    return None if found is None else Path(found)


def _load_checkpoint(run_dir, path, comm, k):
    from dslide import train as T
    from dslide.infer.parts import sections
    from dslide.io import checkpoint as ck

    # the layout it was trained on is not the model's: eval and predict split it over every rank,
    # each with the threads this process has (NUMBA_NUM_THREADS), not those of the training run
    config, manifest = ck.read_together(comm, lambda: (ck.config_of(path), ck.read_manifest(path)), path)
    config = config.replace(replicas=1, shard_weights=(), threads=0)
    if k is not None:
        _check_k(k, manifest["n_labels"])
    comm.stall_timeout = config.stall_timeout
    check_memory(comm, model_bytes(config, manifest["n_features"], manifest["n_labels"], comm, inference=True),
                 f"the model in {run_dir}")
    model = T.build_network((manifest["n_features"], manifest["n_labels"]), config, comm)
    # inference needs the weights and the index only: Adam's moments are never read (nor
    # allocated: their zero pages stay unmapped)
    manifest = ck.load_into(model.network, path, comm, weights_only=True, sections=sections(model))
    model.history = list(manifest.get("extra", {}).get("history", []))
    return model


def check_k(k, n_labels: int) -> int:
    """k of the top-k: an integer in [1, n_labels], else ValueError naming the range."""
    import numpy as np  # loaded by then, with the model or its checkpoint

    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= max(1, n_labels):
        raise ValueError(f"k = {k!r} must be an integer in [1, {n_labels}] (the model has {n_labels} labels)")
    return int(k)


def check_lsh(model, lsh: bool) -> None:
    """Refuse LSH scoring of a model whose output layer has no inference index."""
    if not lsh:
        return
    out = model.network.layers[-1]
    if out.kind != "lsh":
        raise ValueError("lsh scoring needs an LSH output layer, and this model's output layer is dense "
                         "(every label is scored exactly anyway); score without lsh, or train with "
                         "kinds ending in 'lsh'")
    if out.lc.index_anchors == 0:
        raise ValueError("lsh scoring needs the output layer's inference index, and this model was trained "
                         "with lsh.index_anchors = 0 (no index); score without lsh")
