"""The `dslide` command: train, eval, predict, data.

The same command runs on one process and under `mpiexec -n P`:

    dslide train --train F --test F [--config C.toml] [--set key=value ...] [--out RUN_DIR [--overwrite]]
    dslide train --resume RUN_DIR --train F --test F
    dslide eval --model RUN_DIR --data F [--k 5] [--exact | --lsh] [--out METRICS.json]
    dslide predict --model RUN_DIR --data F --k K --out PRED.txt
    dslide export --model RUN_DIR --out NEW_RUN_DIR     weights only, for deployment
    dslide data gen --preset NAME [--points N] --out PREFIX   NAME: tiny, small or a suite member
                                             (dslide.datasets.suite.all_presets())
    dslide data convert IN OUT
    dslide data stats F
    dslide plot RUN_DIR [RUN_DIR ...] --out PNG     P@1 and loss against time (needs matplotlib)
    dslide warm                              compile the kernels once after an install, with progress

Errors (a missing file, malformed data, a bad setting, an incompatible
checkpoint, a model larger than the memory available, a run directory in
use or holding another run) print one line and exit with status 2, without
a traceback unless --debug, and write nothing. Under MPI an error on any
rank ends every rank (`MPI_Abort`), so a failure never hangs the job; so
does a rank that stops answering, with `--set stall_timeout=SECONDS`.

A run directory has one writer (dslide.rundir: a lock file naming it) and
is never written over silently: `train --out` refuses a directory holding
a run unless `--overwrite` (which deletes that run's files) or `--resume`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import time
import traceback
from pathlib import Path

from dslide import hooks
from dslide.session import (Progress, UsageError, check_k, check_lsh, config_toml, load_model,
                            normalise_values)
from dslide.session import check_memory as _check_memory
from dslide.session import model_bytes as _model_bytes
from dslide.session import notice_threads as _notice_threads
from dslide.session import on_rank0 as _on_rank0
from dslide.session import say as _say

EXIT_USAGE = 2
EXIT_CRASH = 1


# ----------------------------------------------------------------------------
# configuration: TOML files and --set
# ----------------------------------------------------------------------------


def _toml_load(path: str) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"configuration file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML: {e}") from None


def _parse_value(text: str):
    """A --set value: a TOML value if it parses as one ("3", "1e-3", "true", "[128, 64]",
    "'dwta'"), a list for comma-separated items ("128,64"), else the bare string."""
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    if "," in text:
        return [_parse_value(t.strip()) for t in text.split(",") if t.strip()]
    return text


def apply_sets(values: dict, sets: list[str]) -> dict:
    """Overlay `key=value` strings on a configuration dict; dotted keys reach tables (lsh.K=8)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in values.items()}
    for item in sets or []:
        if "=" not in item:
            raise UsageError(f"--set {item!r}: expected key=value, e.g. --set lr=1e-3 or --set lsh.K=8")
        key, text = item.split("=", 1)
        key = key.strip()
        value = _parse_value(text.strip())
        if "." in key:
            table, sub = key.split(".", 1)
            out.setdefault(table, {})
            if not isinstance(out[table], dict):
                raise UsageError(f"--set {key}: {table!r} is not a table of settings")
            out[table][sub] = value
        else:
            out[key] = value
    return out


def make_config(config_file: str | None, sets: list[str]):
    from dslide.config import Config

    values = _toml_load(config_file) if config_file else {}
    values = apply_sets(values, sets)
    return Config.from_dict(normalise_values(values))


# ----------------------------------------------------------------------------
# shared pieces
# ----------------------------------------------------------------------------


def _read(path: str, what: str, fmt: str | None = None, n_features: int | None = None,
          n_labels: int | None = None, comm=None, points: bool = True, quiet: bool = False):
    """Read data argument `path` (dslide.formats: a file or FEATURES,LABELS; `fmt` or by name);
    points: refuse data without data points. A file of LOUD_READ_BYTES or more shows, on rank 0
    and unless quiet, a bar of the bytes parsed (stderr a terminal) or a line before and after."""
    from dslide import formats

    if not path:
        raise UsageError(f"{what} is required")
    first, second = formats.split_pair(path)
    for p in (first, second) if second else (first,):
        if not os.path.exists(p):
            raise UsageError(f"{what} {p} does not exist")
        if os.path.isdir(p):
            raise UsageError(f"{what} {p} is a directory, expected a data file")
        if not os.access(p, os.R_OK):
            raise UsageError(f"{what} {p} is not readable")
        if not stat.S_ISREG(os.stat(p).st_mode):  # a pipe cannot be read twice (format, then data)
            raise UsageError(f"{what} {p} is not a regular file (a pipe or a device); dslide reads data "
                             f"files more than once: save it to a file first")
    size = sum(os.path.getsize(p) for p in (first, second) if p)
    t0 = time.perf_counter()
    loud = comm is not None and comm.rank == 0 and size >= LOUD_READ_BYTES and not quiet
    bar = None
    if loud and sys.stderr.isatty():
        from tqdm import tqdm

        # the bytes of text parsed (a file's cache, when it has one, loads at once and moves no bar)
        bar = tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"reading {what}",
                   dynamic_ncols=True, leave=False)
    elif loud:
        print(f"reading {what} {path} ({size / 2**20:,.0f} MiB)...", file=sys.stderr, flush=True)
    try:
        data = formats.read_data(path, fmt, n_features=n_features, n_labels=n_labels,
                                 progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    if loud:
        print(f"read {what} {path}: {data.n_points:,} points in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr, flush=True)
    if points and data.n_points == 0:
        raise UsageError(f"{what} {path} holds no data points")
    return data


#: data files at least this large are announced on stderr before and after reading
LOUD_READ_BYTES = 64 << 20


def _read_accepted(path: str, what: str, accept, fmt: str | None = None, n_features: int | None = None,
                   n_labels: int | None = None, comm=None, quiet: bool = False):
    """_read, the file's cache written only once accept(data) (checks that raise) has passed."""
    from dslide.data import caches_held, write_caches

    with caches_held() as held:
        data = _read(path, what, fmt, n_features, n_labels, comm=comm, quiet=quiet)
        accept(data)
        write_caches(held)
    return data


def _data_shape(train) -> tuple:
    from dslide import memory

    return memory.data_shape(train.X, train.Y)


# ----------------------------------------------------------------------------
# train
# ----------------------------------------------------------------------------

RESUME_SETTABLE = {"epochs", "eval_every", "eval_points", "log_every", "checkpoint_every", "checkpoint_moments",
                   "threads", "replicas", "sync", "sync_every", "shard_weights",  # the layout: any, on resume
                   "stall_timeout"}

def _out_hint(run_dir: Path) -> str:
    return f"continue it with --resume {run_dir}, replace it with --overwrite, or choose another --out"


def _check_new_run(run_dir: Path, overwrite: bool) -> None:
    """Before anything is read or written: `--out` must be new, empty, or (with --overwrite)
    a dslide run (its marker: dslide.rundir.MARKER) that may be replaced; never one in use."""
    from dslide import rundir

    rundir.check_new(run_dir, overwrite, "--out", _out_hint(run_dir))


def _open_run(run_dir: Path, resume: bool, overwrite: bool):
    """On rank 0: the run directory made and locked (dslide.rundir.RunLock, returned); for a
    new run, checked again under the lock, with --overwrite emptied of the old run's files,
    and marked as a run (dslide.rundir.open_new)."""
    from dslide import rundir

    if not resume:
        return rundir.open_new(run_dir, overwrite, "dslide train", "--out", _out_hint(run_dir))
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: run directory {run_dir} does not exist")
    return rundir.RunLock.acquire(run_dir, "dslide train --resume")


def cmd_train(args, comm) -> int:
    from dslide.data import caches_held

    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in RUN_DIR and --overwrite replaces one: give one of them")
    if args.resume and args.out and os.path.abspath(args.out) != os.path.abspath(args.resume):
        raise UsageError(f"--resume {args.resume} continues that run in its own directory; --out {args.out} "
                         f"names another (leave --out out)")
    lock = None
    try:
        if args.resume:  # locked first: its checkpoint must not change while it is read
            lock = _on_rank0(comm, lambda: _open_run(Path(args.resume), True, False))
        with caches_held() as held:  # the data's caches are written once the run is accepted
            return _cmd_train(args, comm, held)
    finally:
        if lock is not None:
            lock.release()


def _cmd_train(args, comm, held) -> int:
    from dslide import checkpoint as ck
    from dslide import train as T
    from dslide.data import checksum as data_checksum
    from dslide.data import write_caches

    path = None
    if args.resume:
        path = ck.latest(args.resume)
        base = ck.config_of(path)
        changes = apply_sets({}, args.set)
        bad = sorted(set(changes) - RESUME_SETTABLE)
        if bad or args.config:
            raise UsageError(f"--resume continues a run with its own configuration; only "
                             f"{', '.join(sorted(RESUME_SETTABLE))} may change (got {', '.join(bad) or '--config'})")
        config = base.replace(**changes) if changes else base
        run_dir = Path(args.resume)
        _check_layout(config, comm)
    else:
        config = make_config(args.config, args.set)
        run_dir = Path(args.out) if args.out else None
        if run_dir is None:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            run_dir = Path("runs") / f"run-{stamp}"
            n = 1
            while run_dir.exists():  # another run started in the same second
                n += 1
                run_dir = Path("runs") / f"run-{stamp}-{n}"
            run_dir = Path(comm.bcast_object(str(run_dir)))
        _check_layout(config, comm)
        _on_rank0(comm, lambda: _check_new_run(run_dir, args.overwrite))  # before the data is even read
    comm.stall_timeout = config.stall_timeout
    train = _read(args.train, "--train", args.format, comm=comm, quiet=args.quiet)
    _check_labels(train, args.train)
    test = _read(args.test, "--test", args.format, train.n_features, train.n_labels, comm=comm,
                 quiet=args.quiet) if args.test else None
    if test is not None and (test.n_features, test.n_labels) != (train.n_features, train.n_labels):
        raise UsageError(f"--test {args.test} has {test.n_features} features and {test.n_labels} labels, "
                         f"--train {args.train} has {train.n_features} and {train.n_labels}")
    if args.resume:
        saved = ck.read_manifest(path)
        if (saved["n_features"], saved["n_labels"]) != (train.n_features, train.n_labels):
            raise UsageError(f"--train {args.train} has {train.n_features:,} features and {train.n_labels:,} "
                             f"labels; the run in {args.resume} was trained on {saved['n_features']:,} and "
                             f"{saved['n_labels']:,}")
    config = config.resolve(train.n_labels, T.points_per_label(train.Y), train.n_points)
    train_checksum = comm.bcast_object(data_checksum(train) if comm.rank == 0 else None)
    if args.resume:
        _resume_plan(comm, args, saved, {k: (getattr(base, k), getattr(config, k)) for k in changes},
                     config, train, train_checksum)
    _check_memory(comm, _model_bytes(config, train.n_features, train.n_labels, comm,
                                     data=_data_shape(train)),
                  f"a model of {train.n_features:,} features, hidden {list(config.hidden)} and "
                  f"{train.n_labels:,} labels")
    if args.resume:
        write_caches(held)
        return _train(args, comm, config, run_dir, train, test, path, checksum=train_checksum)
    lock = _on_rank0(comm, lambda: _open_run(run_dir, False, args.overwrite))  # nothing was written before
    begun, written = [], []
    try:
        written = write_caches(held)
        return _train(args, comm, config, run_dir, train, test, None, begun, checksum=train_checksum)
    except BaseException:
        if not begun:  # refused before its first step: a rerun must find nothing of this one
            from dslide import rundir
            from dslide.xmc_cache import remove_caches

            remove_caches(written)
            if lock is not None:
                rundir.discard_new(lock, run_dir)
        raise
    finally:
        if lock is not None:
            lock.release()


def _resume_plan(comm, args, saved: dict, changed: dict, config, train, checksum: str) -> None:
    """Before a resume rewrites anything: refuse one that would train no step; say what it
    will do when its settings (changed: {key: (saved, now)}) or its data differ from the run's."""
    from dslide import train as T

    step, total = int(saved["step"]), T.total_steps(config, train.n_points)
    if step >= total:
        per_epoch = max(1, -(-train.n_points // config.batch_size))
        raise UsageError(f"--resume {args.resume}: the run is at step {step:,} and {config.epochs:g} epoch(s) of "
                         f"{train.n_points:,} points end at step {total:,}, so it would train no step; give more "
                         f"epochs to continue it (--set epochs={step // per_epoch + 1} or more)")
    moved = [f"{k} {a!r} -> {b!r}" for k, (a, b) in sorted(changed.items()) if a != b]
    if moved:
        _say(comm, f"resuming {args.resume} with changed settings: {', '.join(moved)}; the others as saved",
             file=sys.stderr)
    before = (saved.get("extra") or {}).get("train_checksum")
    if before is not None and before != checksum:
        _say(comm, f"--train {args.train} has the run's shape but not the content it was trained on (data "
                   f"checksum {checksum[:12]}, the run's {before[:12]}): resuming trains the saved model further "
                   f"on this data", file=sys.stderr)


def _check_layout(config, comm) -> None:
    """The ranks form the configuration's replicas and shard weights: checked before any file
    is written (dslide.sharding.check_layout)."""
    from dslide.sharding import check_layout

    check_layout(comm.size, config.replicas, config.shard_weights)


def _check_labels(train, path: str) -> None:
    """Training data must have labels: a features file read without its labels file has none."""
    from dslide import formats

    if train.n_labels == 0:
        first, second = formats.split_pair(path)
        hint = ("its labels file " + os.path.basename(first).replace("X_Xf", "X_Y") + " is missing beside it"
                if second is None and "X_Xf" in os.path.basename(first) else "the data has no labels")
        raise UsageError(f"--train {path} has 0 labels ({hint}); training needs labels: give FEATURES,LABELS "
                         f"or a file with labels")


def _train(args, comm, config, run_dir: Path, train, test, path, begun=None, checksum=None) -> int:
    """Train and save the run; begun (a list) gets an entry once the first step is done;
    checksum: the training data's (dslide.data.checksum), kept in every checkpoint."""
    import dslide
    from dslide import checkpoint as ck
    from dslide import train as T
    from dslide.infer.parts import sections
    from dslide.rundir import dumps, write_atomic

    if comm.rank == 0:
        write_atomic(run_dir / "config.toml", config_toml(config))
    comm.barrier()
    inv_prop = _run_propensities(run_dir, train, config, comm)
    layout = (f"{config.replicas} replicas ({config.sync} sync every {config.sync_every} steps) x "
              f"{comm.size // config.replicas} shard(s)" if config.replicas > 1 else f"{comm.size} rank(s)")
    _say(comm, f"dslide {__import__('dslide').__version__}: training on {train.n_points:,} points, "
               f"{train.n_features:,} features, {train.n_labels:,} labels; {layout} x "
               f"{T._threads(config)} thread(s); run directory {run_dir}")
    _notice_threads(comm, config)
    if args.verbose:
        _say(comm, "effective configuration:\n" + "\n".join("  " + l for l in config_toml(config).splitlines() if l))

    model = T.build_network((train.n_features, train.n_labels), config, comm)
    if not args.resume:
        T.init_from_data(model, train)
    if args.resume:
        manifest = ck.load_into(model.network, path, comm)
        model.history = [r for r in manifest["extra"].get("history", [])]
        _say(comm, f"resumed from {path} at step {model.network.step} (saved by {manifest['world_size']} rank(s))")
    total = T.total_steps(config, train.n_points)
    progress = Progress(comm, total, model.network.step, args.quiet, run_dir / "log.jsonl", config.batch_size)
    # also without a terminal: the index and the neighbours' choice take tens of seconds in silence
    index_bar = comm.rank == 0 and not args.quiet

    first_step_done = [] if begun is None else begun

    def callback(event, m, info):
        if event == "step" and not first_step_done:
            first_step_done.append(time.perf_counter())
        if event == "step":
            hooks.call(hooks.STEP, comm, m, info)
        progress(event, m, info)
        return None

    def save(m, c):
        ck.save(m.network, run_dir, c, extra={"history": m.history, "train_checksum": checksum}, sections=sections(m))

    t0 = time.perf_counter()
    try:
        model, history = T.fit(train, config, test, model=model, callback=callback, checkpoint=save,
                               index_progress=index_bar)
    finally:
        progress.close()
    wall = time.perf_counter() - t0
    T.save_model(model, save)
    metrics = _final_metrics(model, history, test, wall, inv_prop)
    # seconds from the process's start to the end of its first step: imports, data, the
    # network's construction, and the first step, in which numba loads (or compiles) its kernels
    startup = comm.allgather_object(first_step_done[0] - dslide.IMPORTED_AT if first_step_done else None)
    if None not in startup:
        metrics["startup_s"] = max(startup)
    if comm.rank == 0:
        if test is not None:  # the file the figures above are of
            metrics["test_data"] = data_files(args.test)
        write_atomic(run_dir / "metrics.json", dumps(metrics, indent=1) + "\n")
    _say(comm, _summary(metrics, run_dir))
    return 0


def _run_propensities(run_dir: Path, train, config, comm):
    """Inverse label propensities of the run (float64 [n_labels]), or None without PSP@k.

    They come from the training labels with the configuration's A, B and are
    saved with the run (dslide.propensity), so `dslide eval` weighs labels as
    training's metrics did. A resumed run keeps the ones it saved.
    """
    from dslide import propensity

    # rank 0 decides: a rank that looked only after rank 0 had saved them below would skip
    # the barrier that the others wait in
    if comm.bcast_object(propensity.load(run_dir, train.n_labels) is not None if comm.rank == 0 else None):
        return propensity.load(run_dir, train.n_labels)["inv_prop"]
    if train.n_points < 3:  # ln N - 1 <= 0: the weights have no meaning
        _say(comm, f"PSP@k left out: {train.n_points} training point(s); propensities need at least 3")
        return None
    props = propensity.compute(train.Y, *config.propensity_constants)
    if comm.rank == 0:
        propensity.save(run_dir, props)
    comm.barrier()
    return props["inv_prop"]


def _final_metrics(model, history, test, wall, inv_prop) -> dict:
    import numpy as np
    import scipy.sparse as sp

    from dslide import train as T

    comm, net = model.comm, model.network
    steps = [r for r in history]
    train_s = sum(r.get("wall_s_delta", 0.0) for r in steps)
    n_steps = steps[-1]["step"] if steps else 0
    out = {}
    if test is not None:
        from dslide.metrics import evaluate

        pred = T.predict_topk(model, test.X, 5, exact=True)
        out.update(evaluate(sp.csr_matrix(test.Y), pred, k=5, inv_prop=inv_prop))
    own = comm.allreduce_sum(np.array([sum(r["bytes_per_step"] * 1.0 for r in steps) / max(1, len(steps))]))[0]
    out.update({
        "samples_per_s": T.throughput(history, model.config.batch_size),
        "warmup_s": sum(r.get("warmup_s", 0.0) for r in history),
        "bytes_per_step": float(own) / comm.size,
        "bytes_per_step_data_parallel": T.data_parallel_bytes(net, comm.size),
        "peak_rss_mb": comm.allgather_object(round(T.peak_rss_mb(), 1)),
        "wall_s": wall,
        "train_s": train_s,
        "steps": n_steps,
        "world_size": comm.size,
        "threads": T._threads(model.config),
        "parallel": model.config.parallel,
        "timers_s": {k: round(v, 3) for k, v in net.timers.items()},
        "index": model.index_info,
    })
    if model.replicas is not None:
        out["replicas"] = comm.allgather_object(model.replicas.stats())
    return out


def _summary(m: dict, run_dir: Path) -> str:
    s = []
    choices = choice_lines(m.get("index") or {})
    if "p@1" in m:
        what = choices[0] if choices else ""
        s.append(f"P@1 {m['p@1']:.4f}  P@3 {m['p@3']:.4f}  P@5 {m['p@5']:.4f}  "
                 f"nDCG@5 {m['ndcg@5']:.4f}  PSP@5 {m.get('psp@5', float('nan')):.4f}" + (f"  ({what})" if what else ""))
    s.extend(choices[1:])
    ratio = m["bytes_per_step"] / m["bytes_per_step_data_parallel"] if m["bytes_per_step_data_parallel"] else 0.0
    s.append(f"{m['samples_per_s']:,.0f} samples/s over {m['steps']} steps ({m['world_size']} rank(s) x "
             f"{m['threads']} thread(s)); {m['bytes_per_step']:,.0f} bytes/step per rank"
             + (f" ({100 * ratio:.3f}% of a data-parallel all-reduce)" if m["world_size"] > 1 else ""))
    if "startup_s" in m:
        s.append(f"start-up {m['startup_s']:.1f}s (process start to the end of the first step, "
                 f"{m['warmup_s']:.1f}s of it in that step)")
    s.append(f"run directory: {run_dir} (metrics.json, log.jsonl, config.toml, propensity.npz, checkpoints/)")
    return "\n".join(s)


def choice_lines(info: dict) -> list[str]:
    """What the end-of-training summary says of the choices made on the validation split
    (`model.index_info`): first what the final scores are ("network alone" or "with neighbour
    labels ..."), then a line per choice with its validation figures."""
    fc, es = info.get("fusion_choice"), info.get("early_stop")
    out = []
    if fc is not None:
        c = fc["chosen"]
        out.append("network alone" if c == "off" else
                   f"with neighbour labels: knn {c['knn']}, prototypes' share {c['proto_weight']}, weight {c['knn_weight']}")
        figs = fc.get("p@1/p@5") or {}
        off = figs.get("knn 0 share 0.0 weight 0.0")
        if off is not None:
            key = "knn 0 share 0.0 weight 0.0" if c == "off" else \
                f"knn {c['knn']} share {float(c['proto_weight'])} weight {float(c['knn_weight'])}"
            got = figs.get(key, off)
            out.append(f"fusion chosen on {fc['validation_points']:,} validation points: network alone P@1 "
                       f"{off[0]:.4f} P@5 {off[1]:.4f}; chosen P@1 {got[0]:.4f} P@5 {got[1]:.4f}")
        else:
            out.append(f"neighbour labels off: {fc.get('why', 'chosen on the validation split')}")
    if es is not None and es.get("curve"):
        best = next((c for c in es["curve"] if c[0] == es["kept_step"]), es["curve"][-1])
        out.append(f"early stopping: kept step {es['kept_step']} of {es['curve'][-1][0]} (validation P@1 "
                   f"{best[1]:.4f} P@5 {best[2]:.4f}, network alone)")
    return out


# ----------------------------------------------------------------------------
# eval / predict
# ----------------------------------------------------------------------------

#: how eval and predict load a model (dslide.session.load_model); a test may replace it
_load_model = load_model


def cmd_export(args, comm) -> int:
    from dslide import checkpoint as ck

    if comm.rank == 0:
        target = ck.export(args.model, args.out)
        manifest = ck.read_manifest(target)
        print(f"wrote {args.out}: the weights of {manifest.get('n_params', 0):,} parameters at step {manifest['step']} "
              f"({ck.size_bytes(target) / 2**20:,.1f} MiB, {manifest['world_size']} rank(s)); "
              f"use it with eval/predict --model {args.out}")
    comm.barrier()
    return 0


def cmd_eval(args, comm) -> int:
    import scipy.sparse as sp

    import dslide
    from dslide import propensity
    from dslide import train as T
    from dslide.metrics import evaluate

    _check_out(args)
    t_load = time.perf_counter()
    model = _load_model(args.model, comm, args.k)
    load_s = time.perf_counter() - t_load
    _check_scoring(model, args)
    data = _read_accepted(args.data, "--data", lambda d: _check_shape(d, model, args.data), args.format,
                          model.n_features, model.n_labels, comm=comm, quiet=getattr(args, "quiet", False))
    # the training labels' propensities, saved with the run: never the evaluated file's
    props = propensity.load(args.model, model.n_labels)
    if props is not None and (args.propensity or args.propensity_a is not None or args.propensity_b is not None):
        from dslide.config import PROPENSITY_PRESETS

        a, b = PROPENSITY_PRESETS[args.propensity or "default"] if args.propensity else (props["A"], props["B"])
        a = a if args.propensity_a is None else args.propensity_a
        b = b if args.propensity_b is None else args.propensity_b
        props = propensity.with_constants(props, a, b)  # from the saved training counts
    t0 = time.perf_counter()
    stats = {}
    bar = _points_bar(comm, data.n_points, args, "scoring")
    pred = T.predict_topk_scores(model, data.X, args.k, exact=not args.lsh, stats=stats,
                                 progress=bar.update if bar else None)[0]
    if bar:
        bar.close()
    dt = time.perf_counter() - t0
    m = evaluate(sp.csr_matrix(data.Y), pred, k=args.k, inv_prop=None if props is None else props["inv_prop"])
    m.update({"propensity": None if props is None else propensity.describe(props),
              "mode": "lsh" if args.lsh else "exact", "points": data.n_points, "predict_s": dt,
              "scored_share": stats["scored_share"],
              "samples_per_s": data.n_points / max(dt, 1e-9), "world_size": comm.size,
              # seconds from the process's start until scoring began, and of it loading the model
              "startup_s": max(comm.allgather_object(t0 - dslide.IMPORTED_AT)),
              "load_model_s": max(comm.allgather_object(load_s)),
              "peak_rss_mb": comm.allgather_object(round(T.peak_rss_mb(), 1))})
    if comm.rank == 0:  # the figures first: writing them down may fail
        ks = range(1, args.k + 1)
        print("  ".join(f"P@{k} {m[f'p@{k}']:.4f}" for k in ks))
        print("  ".join(f"nDCG@{k} {m[f'ndcg@{k}']:.4f}" for k in ks))
        if "psp@1" in m:
            print("  ".join(f"PSP@{k} {m[f'psp@{k}']:.4f}" for k in ks) + f"  ({m['propensity']})")
        else:
            print(f"PSP@k left out: {propensity.path_in(args.model)} is missing (the run was trained on "
                  f"fewer than 3 points, or before runs saved their training labels' propensities)")
        print(f"{data.n_points:,} points in {dt:.2f}s ({m['mode']} scoring: "
              f"{100 * m['scored_share']:.2f}% of the labels scored per point), after {m['startup_s']:.1f}s of "
              f"start-up ({m['load_model_s']:.1f}s loading the model)", flush=True)
        _save_eval(args, m)
    return 0


def _check_out(args) -> None:
    """eval's and predict's --out: never one of their inputs (the data, a pair's labels file,
    the model's files) nor inside a run's checkpoints; checked before anything is read."""
    from dslide import formats, rundir

    rundir.check_output(args.out, [*formats.split_pair(args.data or ""), *rundir.run_inputs(args.model)])


def data_files(path: str) -> dict:
    """What a data argument (FILE or FEATURES,LABELS) names: {"data": path, "files": [{"path":
    absolute path, "sha256": hex digest}, ...]}, features file first, so that figures saved from
    it say which data they are of."""
    import hashlib

    from dslide import formats

    files = []
    for p in (q for q in formats.split_pair(path) if q):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        files.append({"path": os.path.abspath(p), "sha256": h.hexdigest()})
    return {"data": path, "files": files}


def _save_eval(args, m: dict) -> None:
    """The evaluation into --out, or into the model's metrics.json where that can be written
    (the directory writable, no run holding its lock); otherwise a note on stderr.

    metrics.json keeps one evaluation per data file under "evals" (keyed by its absolute path,
    "FEATURES,LABELS" for a pair), and the latest under "eval": an eval of another file never
    replaces the figures of the test file. Each names its file(s) and their sha256."""
    from dslide import rundir

    m = {**data_files(args.data), **m}
    if args.out:
        rundir.write_atomic(args.out, rundir.dumps({"model": str(args.model), "eval": m}, indent=1) + "\n")
        return
    target = Path(args.model, "metrics.json")
    why = None
    if not os.access(args.model, os.W_OK):
        why = f"{args.model} is not writable"
    else:
        try:
            with rundir.RunLock.acquire(args.model, "dslide eval"):
                old = _old_metrics(args.model)
                evals = old.get("evals") if isinstance(old.get("evals"), dict) else {}
                key = ",".join(f["path"] for f in m["files"])
                new = {**old, "eval": m, "evals": {**evals, key: m}}
                rundir.write_atomic(target, rundir.dumps(new, indent=1) + "\n")
        except (ValueError, OSError) as e:
            why = str(e)
    if why is not None:
        print(f"dslide: the metrics above are not saved in {target} ({why}); --out FILE saves them elsewhere",
              file=sys.stderr, flush=True)


def _old_metrics(run_dir) -> dict:
    p = Path(run_dir, "metrics.json")
    try:
        old = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return {k: v for k, v in old.items() if k != "eval"} if isinstance(old, dict) else {}


def _check_shape(data, model, path):
    if data.n_features != model.n_features:
        raise UsageError(f"{path} has {data.n_features} features; the model was trained on {model.n_features}")
    if data.n_labels != model.n_labels:
        raise UsageError(f"{path} has {data.n_labels} labels; the model was trained on {model.n_labels}")


def cmd_predict(args, comm) -> int:
    from dslide import formats
    from dslide import train as T

    import dslide

    _check_out(args)
    from dslide import rundir

    _on_rank0(comm, lambda: rundir.check_writable(args.out))  # before the model and the scoring
    t_load = time.perf_counter()
    model = _load_model(args.model, comm, args.k)
    load_s = time.perf_counter() - t_load
    _check_scoring(model, args)
    out_fmt = args.out_format or ("npz" if args.out.endswith(".npz") else "text")

    def accept(data):
        if data.n_features != model.n_features:
            raise UsageError(f"{args.data} has {data.n_features} features; the model was trained on "
                             f"{model.n_features}")
        # the top-k ids and scores of every point (int64 and float64)
        _check_memory(comm, 16 * data.n_points * args.k, f"the top {args.k:,} labels of {data.n_points:,} points")

    data = _read_accepted(args.data, "--data", accept, args.format, model.n_features, model.n_labels, comm=comm,
                          quiet=getattr(args, "quiet", False))
    stats = {}
    bar = _points_bar(comm, data.n_points, args, "predicting")
    t0 = time.perf_counter()
    ids, scores = T.predict_topk_scores(model, data.X, args.k, exact=not args.lsh, stats=stats,
                                        progress=bar.update if bar else None)
    dt = time.perf_counter() - t0
    if bar:
        bar.close()
    # seconds from the process's start until scoring began, and of it loading the model
    startup = max(comm.allgather_object(t0 - dslide.IMPORTED_AT))
    load_s = max(comm.allgather_object(load_s))
    if comm.rank == 0:
        # a fresh temporary file renamed into place, never through a planted link (dslide.rundir)
        formats.write_predictions(args.out, ids, scores, model.n_labels, out_fmt)
        what = ("a CSR matrix of the top-k scores, scipy.sparse.load_npz" if out_fmt == "npz" else
                "a header line 'points labels', then label:score pairs in label order per line, pyxclib's "
                "read_sparse_file")
        print(f"wrote the top {args.k} labels of {data.n_points:,} points to {args.out} ({what}; "
              f"{100 * stats['scored_share']:.2f}% of the labels scored per point)")
        print(f"{data.n_points:,} points in {dt:.2f}s ({'lsh' if args.lsh else 'exact'} scoring), after "
              f"{startup:.1f}s of start-up ({load_s:.1f}s loading the model)")
    return 0


def _check_scoring(model, args) -> None:
    """--k in [1, n_labels]; --lsh only with an inference index (dslide.session)."""
    try:
        check_k(args.k, model.n_labels)
        check_lsh(model, args.lsh)
    except ValueError as e:
        raise UsageError(str(e).replace("k = ", "--k ").replace("lsh scoring", "--lsh")) from None


def _points_bar(comm, n: int, args, what: str):
    """A tqdm bar of scored points on rank 0 when stderr is a terminal and not --quiet, else None."""
    if comm.rank != 0 or getattr(args, "quiet", False) or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=n, unit="point", desc=what, dynamic_ncols=True, leave=False)


# ----------------------------------------------------------------------------
# data
# ----------------------------------------------------------------------------


def cmd_data(args, comm) -> int:
    from dslide.datasets import suite, synthetic

    if comm.rank != 0:
        return 0
    if args.data_cmd == "gen":
        train, test = suite.generate_split(args.preset, n_train=args.points, n_test=args.test_points, seed=args.seed)
        paths = synthetic.write(args.out, train, test)
        print(f"wrote {paths[0]} ({train.n_points:,} points) and {paths[1]} ({test.n_points:,} points): "
              f"{train.n_features:,} features, {train.n_labels:,} labels")
        return 0
    if args.data_cmd == "stats":
        data = _read(args.file, "data file", args.format, points=False)  # (statistics of nothing are zeros)
        print(synthetic.format_stats(synthetic.stats(data)))
        return 0
    if args.data_cmd == "convert":
        return _convert(args)
    raise UsageError("dslide data needs a command: gen, convert or stats")


def _convert(args) -> int:
    from dslide import formats
    from dslide.data import cache_path, read_xmc, write_xmc

    src, dst = args.input, args.output
    if not os.path.exists(formats.split_pair(src)[0]):
        raise UsageError(f"input {src} does not exist")
    _check_convert_outputs(src, dst, args)
    if src.endswith(".arff") or src.endswith(".arff.gz"):
        from dslide.datasets.arff import read_arff

        if args.labels is None and args.labels_xml is None:
            raise UsageError("converting ARFF needs the number of labels (--labels N, the last N attributes) "
                             "or the mulan label file (--labels-xml F)")
        data = read_arff(src, args.labels, labels_xml=args.labels_xml) if args.labels_xml is None \
            else read_arff(src, labels_xml=args.labels_xml)
        write_xmc(dst, data.X, data.Y)
        print(f"wrote {dst}: {data.n_points:,} points, {data.n_features:,} features, {data.n_labels:,} labels")
        return 0
    if dst == "cache" or os.path.normpath(dst) == os.path.normpath(cache_path(src)):
        data = read_xmc(src, cache=True)
        print(f"cached {src} as {cache_path(src)} ({data.n_points:,} points)")
        return 0
    data = _read(src, "input", args.format, points=False)
    paths = formats.write_data(dst, data, args.out_format)
    print(f"wrote {' and '.join(paths)}: {data.n_points:,} points, {data.n_features:,} features, "
          f"{data.n_labels:,} labels")
    return 0


def _check_convert_outputs(src: str, dst: str, args) -> None:
    """Every file convert would write (a pair format's two: dslide.formats.write_data) is none of
    its inputs (a pair's second file included) and lies in no run's checkpoints."""
    from dslide import formats, rundir

    inputs = [*formats.split_pair(src), getattr(args, "labels_xml", None)]
    outputs = [dst]
    name = dst.split(",", 1)[0].lower()
    fmt = args.out_format or ("npz" if name.endswith(".npz") else "libsvm" if name.endswith(formats.LIBSVM_SUFFIXES)
                              else "split" if ("x_xf" in os.path.basename(name) or "," in dst) else "xmc")
    is_arff = src.endswith(".arff") or src.endswith(".arff.gz")
    if fmt in ("npz", "split") and not is_arff and dst != "cache":
        outputs = list(formats._pair_names(dst))
    for out in outputs:
        rundir.check_output(out, inputs, "output")
        if dst != "cache":
            rundir.check_writable(out, "output")  # before the input is read


# ----------------------------------------------------------------------------
# entry point
# ----------------------------------------------------------------------------


class _Help(argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help (where it has one and the help does not say it);
    examples (the epilog) kept as written."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if "default" in text or d is None or d is False or d == [] or d == argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return f"{text} (default: {d})"


_FORMAT_HELP = ("data format: xmc (one file with header 'points features labels'), split (the repository's "
                "X_Xf.txt + X_Y.txt), libsvm (headerless 'l1,l2 f:v ...'), npz (scipy CSR pair X.npz,Y.npz); "
                "default: by the file's name and first line")
_DATA_HELP = ("FEATURES[,LABELS]: an XMC file, or a pair (the labels file is found beside X_Xf / X* / NAME files by "
              "name: X_Y / Y* / NAME_Y)")

_EXAMPLES = {
    "dslide": """examples:
  dslide data gen --preset small --out data/small
  dslide train --train data/small_train.txt --test data/small_test.txt --out runs/small
  mpiexec -n 2 dslide train --train trn_X_Xf.txt --test tst_X_Xf.txt --set propensity=amazon --out runs/amz
  dslide eval --model runs/small --data data/small_test.txt --lsh
  dslide predict --model runs/small --data data/small_test.txt --k 10 --out pred.npz
  dslide config show --data data/small_train.txt""",
    "train": """examples:
  dslide train --train data/small_train.txt --test data/small_test.txt --out runs/small
  dslide train --train X.trn.npz,Y.trn.npz --set epochs=10 --set lsh.index_share=0.05
  mpiexec -n 4 dslide train --train trn.txt --set replicas=2 --set sync=partial
  dslide train --resume runs/small --train data/small_train.txt --set epochs=8
  dslide train --train data/small_train.txt --out runs/small --overwrite   (replaces the run there)
every setting, its default and range: dslide config show""",
    "eval": """examples:
  dslide eval --model runs/small --data data/small_test.txt
  dslide eval --model runs/amz --data tst_X_Xf.txt --lsh --k 5 --propensity amazon
  dslide eval --model deploy/small --data data/small_test.txt --out small_eval.json""",
    "predict": """examples:
  dslide predict --model runs/small --data data/small_test.txt --k 5 --out pred.txt
  dslide predict --model runs/small --data tst.svm --lsh --k 100 --out pred.npz   (CSR of top-k scores)""",
    "export": """example:
  dslide export --model runs/small --out deploy/small""",
    "data": """examples:
  dslide data gen --preset tiny --out data/tiny
  dslide data convert trn_X_Xf.txt data/trn.txt
  dslide data stats data/tiny_train.txt""",
    "config": """examples:
  dslide config show
  dslide config show --data data/small_train.txt --set hidden=256""",
}


def parser() -> argparse.ArgumentParser:
    from dslide.config import PROPENSITY_PRESETS
    from dslide.formats import FORMATS, PREDICTION_FORMATS

    p = argparse.ArgumentParser(prog="dslide", description="Distributed SLIDE: LSH-sparse, model-parallel training "
                                "of very wide networks on CPU clusters. Run under mpiexec -n P for P ranks.",
                                epilog=_EXAMPLES["dslide"], formatter_class=_Help)
    p.add_argument("--version", action="version", version=f"dslide {__import__('dslide').__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name, help_text):
        c = sub.add_parser(name, help=help_text, description=help_text, epilog=_EXAMPLES.get(name),
                           formatter_class=_Help)
        c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return c

    def add_sets(c):
        c.add_argument("--config", help="TOML configuration file (the keys of --set)")
        c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting (repeatable), e.g. --set lr=1e-3 --set lsh.K=8 --set hidden=256,128; "
                            "all of them: dslide config show")

    t = command("train", "train a model")
    t.add_argument("--train", required=True, metavar="DATA", help="training data: " + _DATA_HELP + "; .gz allowed")
    t.add_argument("--test", metavar="DATA", help="test data, evaluated during and after training")
    t.add_argument("--format", choices=FORMATS, help=_FORMAT_HELP)
    add_sets(t)
    t.add_argument("--out", metavar="RUN_DIR",
                   help="run directory (default: runs/run-<time>); refused if it holds a run (see --overwrite, --resume)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out (its config, logs, metrics, propensities and checkpoints)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar and no log lines; the final figures only")
    t.add_argument("--verbose", action="store_true", help="also print the effective configuration first")

    def add_in_format(c, what):
        # the input's format beside an output's (--out-format): named apart; --format, its old
        # name, still works but is not listed
        c.add_argument("--in-format", dest="format", choices=FORMATS,
                       help=f"format of {what}, the input (--format is the same option; the output's is "
                            f"--out-format): " + _FORMAT_HELP)
        c.add_argument("--format", dest="format", choices=FORMATS, help=argparse.SUPPRESS)

    def model_command(name, help_text, exact_flag):
        c = command(name, help_text)
        c.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory of dslide train (or export)")
        c.add_argument("--data", required=True, metavar="DATA", help=_DATA_HELP)
        add_in_format(c, "--data")
        c.add_argument("--k", type=int, default=5, help="labels per point: P@1..k, or the top k written")
        g = c.add_mutually_exclusive_group()
        if exact_flag:
            g.add_argument("--exact", action="store_true", help="score every label (the default)")
        g.add_argument("--lsh", action="store_true",
                       help="score only the labels the output layer's inference index retrieves (LSH output only)")
        c.add_argument("--quiet", action="store_true", help="no progress bar; the final figures only")
        return c

    e = model_command("eval", "evaluate a trained model: P@k, nDCG@k, PSP@k", exact_flag=True)
    e.add_argument("--propensity", choices=tuple(PROPENSITY_PRESETS),
                   help="PSP@k with this preset's A, B, recomputed from the training labels' counts saved with "
                        "the run (default: the constants the run was trained with)")
    e.add_argument("--propensity-a", type=float, metavar="A", help="PSP@k with this A (with --propensity-b)")
    e.add_argument("--propensity-b", type=float, metavar="B", help="PSP@k with this B")
    e.add_argument("--out", metavar="METRICS.json",
                   help="write the metrics here (default: the model's metrics.json, where it can be written)")
    r = model_command("predict", "write the top-k labels of each point", exact_flag=False)
    r.add_argument("--out", required=True, metavar="PRED",
                   help="output file: text ('points labels' header, then the top k's label:score pairs per line "
                        "in label order, as pyxclib's read_sparse_file reads them) or, for .npz, a scipy CSR "
                        "matrix of the top-k scores; ranked by score, ties to the lower label id")
    r.add_argument("--out-format", choices=PREDICTION_FORMATS,
                   help="format of --out, the output (the input's is --in-format; default: npz for a .npz name)")

    x = command("export", "copy a run's latest checkpoint without optimiser state (for eval/predict)")
    x.add_argument("--model", required=True, metavar="RUN_DIR", help="run directory to export")
    x.add_argument("--out", required=True, metavar="NEW_RUN_DIR", help="new run directory")

    d = command("data", "generate, convert and inspect data sets")
    dsub = d.add_subparsers(dest="data_cmd", required=True, metavar="DATA_COMMAND")

    def data_command(name, help_text):
        c = dsub.add_parser(name, help=help_text, description=help_text, formatter_class=_Help)
        c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return c

    gen = data_command("gen", "write a synthetic data set (PREFIX_train.txt, PREFIX_test.txt)")
    # Checked by dslide.datasets.suite (its message names every preset): importing the
    # generators here would load numba for every command.
    gen.add_argument("--preset", required=True, metavar="NAME",
                     help="tiny, small, amazon-like, amazon-tail, baskets-*, a670k-* (the suite's members)")
    gen.add_argument("--points", type=int, help="training points (default: the preset's)")
    gen.add_argument("--test-points", type=int, help="test points (default: the preset's)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the generator: the same seed, the same files")
    gen.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX_train.txt and PREFIX_test.txt")
    conv = data_command("convert", "between the data formats (xmc, split, libsvm, npz), mulan ARFF -> XMC text, "
                                   "or XMC text -> binary cache")
    conv.add_argument("input", metavar="IN", help="input: " + _DATA_HELP + ", or a mulan .arff file")
    conv.add_argument("output", metavar="OUT", help="output (format by name: .npz, .svm, X_Xf, else XMC text), "
                                                    "or 'cache' for IN's binary cache")
    add_in_format(conv, "IN")
    conv.add_argument("--out-format", choices=FORMATS, help="format of OUT (default: by its name)")
    conv.add_argument("--labels", type=int, help="ARFF: the last N attributes are the labels")
    conv.add_argument("--labels-xml", help="ARFF: mulan's XML file naming the labels")
    st = data_command("stats", "statistics of a data file")
    st.add_argument("file", metavar="DATA", help=_DATA_HELP)
    st.add_argument("--format", choices=FORMATS, help=_FORMAT_HELP)

    from dslide.plot import add_parser as add_plot

    add_plot(sub, command)
    command("warm", "compile dslide's numba kernels now (once after an install), with progress lines") \
        .add_argument("--verbose", action="store_true", help="list every kernel")

    c = command("config", "list the settings: default, valid range, and the value for a data set")
    csub = c.add_subparsers(dest="config_cmd", required=True, metavar="CONFIG_COMMAND")
    show = csub.add_parser("show", help="every setting with its default and valid range (and with --data the value "
                                        "the data resolves it to)", formatter_class=_Help, epilog=_EXAMPLES["config"])
    show.add_argument("--data", metavar="DATA", help="resolve the settings taken from the data for this training set")
    show.add_argument("--format", choices=FORMATS, help=_FORMAT_HELP)
    add_sets(show)
    show.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def cmd_config(args, comm) -> int:
    from dslide import settings

    config = make_config(args.config, args.set)
    shape = (None, None, None, None)
    if args.data:
        from dslide import train as T

        data = _read(args.data, "--data", args.format, comm=comm)
        shape = (data.n_features, data.n_labels, T.points_per_label(data.Y), data.n_points)
    if comm.rank == 0:
        if args.data:
            print(f"{args.data}: {shape[0]:,} features, {shape[1]:,} labels, "
                  f"{shape[2]:.2f} training points per label")
        print(settings.format_table(settings.table(config, *shape), with_value=bool(args.data or args.set
                                                                                     or args.config)))
    return 0


def _thread_setting_error() -> str | None:
    """What is wrong with NUMBA_NUM_THREADS (numba refuses it with a traceback on import), or None."""
    raw = os.environ.get("NUMBA_NUM_THREADS")
    if raw is None or raw.strip() == "":
        return None
    try:
        n = int(raw)
    except ValueError:
        n = None
    if n is None or n < 1:
        return (f"NUMBA_NUM_THREADS={raw!r} must be a positive integer (the threads of each process); "
                f"unset it for one per core")
    return None


def main(argv=None) -> int:
    bad = _thread_setting_error()  # before anything imports numba, which would raise on it
    if bad is not None:
        print(f"dslide: error: {bad}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE)
    for stream in (sys.stdout, sys.stderr):  # a path the terminal's encoding lacks is escaped, not an error
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="backslashreplace")
    args = parser().parse_args(argv)
    hooks.load_plugin()  # a test's hooks (dslide.hooks), before the command runs
    from dslide.comm import Comm, StallError

    comm = Comm.world()
    from dslide import plot, warm

    commands = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "export": cmd_export,
                "data": cmd_data, "config": cmd_config, "plot": plot.cmd_plot,
                "warm": lambda a, c: warm.main(["--verbose"] if a.verbose else [], run_command=main)}
    try:
        with warm.notice(args.cmd, comm.rank, getattr(args, "quiet", False)):
            return commands[args.cmd](args, comm)
    except KeyboardInterrupt:
        _fail(comm, "interrupted", EXIT_CRASH)
    except StallError as e:  # another rank stopped answering: every live rank says which, then all end
        if args.debug:
            traceback.print_exc()
        _fail(comm, f"error: {e}", EXIT_CRASH, delay=3.0)
    except (ValueError, OSError) as e:  # user errors: bad data, settings, files, checkpoints
        if args.debug:
            traceback.print_exc()
        _fail(comm, f"error: {e}", EXIT_USAGE)
    except MemoryError as e:  # an allocation the memory check did not foresee
        if args.debug:
            traceback.print_exc()
        _fail(comm, f"error: out of memory{': ' + str(e) if str(e) else ''} (see dslide.memory.account)",
              EXIT_USAGE)
    except Exception as e:  # a bug: say so, with the traceback
        traceback.print_exc()
        _fail(comm, f"internal error: {type(e).__name__}: {e}", EXIT_CRASH)
    return 0


def _fail(comm, message: str, code: int, delay: float = 0.5) -> None:
    where = f" (rank {comm.rank} of {comm.size})" if comm.size > 1 else ""
    print(f"dslide{where}: {message}", file=sys.stderr, flush=True)
    if comm.size > 1:
        # ends every rank: the others may be waiting in a collective (after a stall, a longer
        # delay lets every live rank print its own message first)
        comm.abort(code, delay=delay)
    raise SystemExit(code)


if __name__ == "__main__":
    sys.exit(main())
