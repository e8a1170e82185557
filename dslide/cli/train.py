"""`dslide train`: train a model into a run directory, or continue one (--resume).

A run directory has one writer (dslide.io.rundir: a lock file naming it) and is
never written over silently: `--out` refuses a directory holding a run unless
`--overwrite` (which deletes that run's files) or `--resume`. A run refused
before its first step leaves nothing behind: neither its directory's files nor
the data's caches.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dslide import hooks
from dslide.cli import common
from dslide.session import Progress, UsageError, check_memory, config_toml, model_bytes, notice_threads, on_rank0, say

EXAMPLES = """examples:
  dslide train --train data/small_train.txt --test data/small_test.txt --out runs/small
  dslide train --train X.trn.npz,Y.trn.npz --set epochs=10 --set lsh.index_share=0.05
  mpiexec -n 4 dslide train --train trn.txt --set replicas=2 --set sync=partial
  dslide train --resume runs/small --train data/small_train.txt --set epochs=8
  dslide train --train data/small_train.txt --out runs/small --overwrite   (replaces the run there)
every setting, its default and range: dslide config show"""


def add_parser(command) -> None:
    from dslide.io.formats import FORMATS

    t = command("train", "train a model", EXAMPLES)
    t.add_argument("--train", required=True, metavar="DATA",
                   help="training data: " + common.DATA_HELP + "; .gz allowed")
    t.add_argument("--test", metavar="DATA", help="test data, evaluated during and after training")
    t.add_argument("--format", choices=FORMATS, help=common.FORMAT_HELP)
    common.add_sets(t)
    t.add_argument("--out", metavar="RUN_DIR",
                   help="run directory (default: runs/run-<time>); refused if it holds a run (see --overwrite, --resume)")
    t.add_argument("--overwrite", action="store_true",
                   help="replace the run in --out (its config, logs, metrics, propensities and checkpoints)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--quiet", action="store_true", help="no progress bar and no log lines; the final figures only")
    t.add_argument("--verbose", action="store_true", help="also print the effective configuration first")


RESUME_SETTABLE = {"epochs", "eval_every", "eval_points", "log_every", "checkpoint_every", "checkpoint_moments",
                   "threads", "replicas", "sync", "sync_every", "shard_weights",  # the layout: any, on resume
                   "stall_timeout"}


def _out_hint(run_dir: Path) -> str:
    return f"continue it with --resume {run_dir}, replace it with --overwrite, or choose another --out"


def _check_new_run(run_dir: Path, overwrite: bool) -> None:
    """Before anything is read or written: `--out` must be new, empty, or (with --overwrite)
    a dslide run (its marker: dslide.io.rundir.MARKER) that may be replaced; never one in use."""
    from dslide.io import rundir

    rundir.check_new(run_dir, overwrite, "--out", _out_hint(run_dir))


def _open_run(run_dir: Path, resume: bool, overwrite: bool):
    """On rank 0: the run directory made and locked (dslide.io.rundir.RunLock, returned); for a
    new run, checked again under the lock, with --overwrite emptied of the old run's files,
    and marked as a run (dslide.io.rundir.open_new)."""
    from dslide.io import rundir

    if not resume:
        return rundir.open_new(run_dir, overwrite, "dslide train", "--out", _out_hint(run_dir))
    if not run_dir.is_dir():
        raise UsageError(f"--resume {run_dir}: run directory {run_dir} does not exist")
    return rundir.RunLock.acquire(run_dir, "dslide train --resume")


def run(args, comm) -> int:
    from dslide.io.data import caches_held

    if args.resume and args.overwrite:
        raise UsageError("--resume continues the run in RUN_DIR and --overwrite replaces one: give one of them")
    if args.resume and args.out and os.path.abspath(args.out) != os.path.abspath(args.resume):
        raise UsageError(f"--resume {args.resume} continues that run in its own directory; --out {args.out} "
                         f"names another (leave --out out)")
    lock = None
    try:
        if args.resume:  # locked first: its checkpoint must not change while it is read
            lock = on_rank0(comm, lambda: _open_run(Path(args.resume), True, False))
        with caches_held() as held:  # the data's caches are written once the run is accepted
            return _run(args, comm, held)
    finally:
        if lock is not None:
            lock.release()


def _run(args, comm, held) -> int:
    from dslide import train as T
    from dslide.config import resolve_shape
    from dslide.io import checkpoint as ck
    from dslide.io.data import checksum as data_checksum
    from dslide.io.data import write_caches

    path = None
    if args.resume:
        path = ck.latest(args.resume)
        base = ck.config_of(path)
        changes = common.apply_sets({}, args.set)
        bad = sorted(set(changes) - RESUME_SETTABLE)
        if bad or args.config:
            raise UsageError(f"--resume continues a run with its own configuration; only "
                             f"{', '.join(sorted(RESUME_SETTABLE))} may change (got {', '.join(bad) or '--config'})")
        config = base.replace(**changes) if changes else base
        run_dir = Path(args.resume)
        _check_layout(config, comm)
    else:
        config = common.make_config(args.config, args.set)
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
        on_rank0(comm, lambda: _check_new_run(run_dir, args.overwrite))  # before the data is even read
    comm.stall_timeout = config.stall_timeout
    train = common.read(args.train, "--train", args.format, comm=comm, quiet=args.quiet)
    _check_labels(train, args.train)
    test = common.read(args.test, "--test", args.format, train.n_features, train.n_labels, comm=comm,
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
    config = config.resolve(*resolve_shape(train))
    train_checksum = comm.bcast_object(data_checksum(train) if comm.rank == 0 else None)
    if args.resume:
        _resume_plan(comm, args, saved, {k: (getattr(base, k), getattr(config, k)) for k in changes},
                     config, train, train_checksum)
    check_memory(comm, model_bytes(config, train.n_features, train.n_labels, comm,
                                   data=_data_shape(train)),
                 f"a model of {train.n_features:,} features, hidden {list(config.hidden)} and "
                 f"{train.n_labels:,} labels")
    if args.resume:
        write_caches(held)
        return _train(args, comm, config, run_dir, train, test, path, checksum=train_checksum)
    lock = on_rank0(comm, lambda: _open_run(run_dir, False, args.overwrite))  # nothing was written before
    begun, written = [], []
    try:
        written = write_caches(held)
        return _train(args, comm, config, run_dir, train, test, None, begun, checksum=train_checksum)
    except BaseException:
        if not begun:  # refused before its first step: a rerun must find nothing of this one
            from dslide.io import rundir
            from dslide.io.xmc_cache import remove_caches

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
        say(comm, f"resuming {args.resume} with changed settings: {', '.join(moved)}; the others as saved",
            file=sys.stderr)
    before = (saved.get("extra") or {}).get("train_checksum")
    if before is not None and before != checksum:
        say(comm, f"--train {args.train} has the run's shape but not the content it was trained on (data "
                  f"checksum {checksum[:12]}, the run's {before[:12]}): resuming trains the saved model further "
                  f"on this data", file=sys.stderr)


def _check_layout(config, comm) -> None:
    """The ranks form the configuration's replicas and shard weights: checked before any file
    is written (dslide.model.sharding.check_layout)."""
    from dslide.model.sharding import check_layout

    check_layout(comm.size, config.replicas, config.shard_weights)


def _check_labels(train, path: str) -> None:
    """Training data must have labels: a features file read without its labels file has none."""
    from dslide.io import formats

    if train.n_labels == 0:
        first, second = formats.split_pair(path)
        hint = ("its labels file " + os.path.basename(first).replace("X_Xf", "X_Y") + " is missing beside it"
                if second is None and "X_Xf" in os.path.basename(first) else "the data has no labels")
        raise UsageError(f"--train {path} has 0 labels ({hint}); training needs labels: give FEATURES,LABELS "
                         f"or a file with labels")


def _train(args, comm, config, run_dir: Path, train, test, path, begun=None, checksum=None) -> int:
    """Train and save the run; begun (a list) gets an entry once the first step is done;
    checksum: the training data's (dslide.io.data.checksum), kept in every checkpoint."""
    import dslide
    from dslide import train as T
    from dslide.infer.parts import sections
    from dslide.io import checkpoint as ck
    from dslide.io.rundir import dumps, write_atomic

    if comm.rank == 0:
        write_atomic(run_dir / "config.toml", config_toml(config))
    comm.barrier()
    inv_prop = _run_propensities(run_dir, train, config, comm)
    layout = (f"{config.replicas} replicas ({config.sync} sync every {config.sync_every} steps) x "
              f"{comm.size // config.replicas} shard(s)" if config.replicas > 1 else f"{comm.size} rank(s)")
    say(comm, f"dslide {__import__('dslide').__version__}: training on {train.n_points:,} points, "
              f"{train.n_features:,} features, {train.n_labels:,} labels; {layout} x "
              f"{T.rank_threads(config)} thread(s); run directory {run_dir}")
    notice_threads(comm, config)
    if args.verbose:
        say(comm, "effective configuration:\n" + "\n".join("  " + l for l in config_toml(config).splitlines() if l))

    model = T.build_network((train.n_features, train.n_labels), config, comm)
    if not args.resume:
        T.init_from_data(model, train)
    if args.resume:
        manifest = ck.load_into(model.network, path, comm)
        model.history = [r for r in manifest["extra"].get("history", [])]
        say(comm, f"resumed from {path} at step {model.network.step} (saved by {manifest['world_size']} rank(s))")
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
            metrics["test_data"] = common.data_files(args.test)
        write_atomic(run_dir / "metrics.json", dumps(metrics, indent=1) + "\n")
    say(comm, _summary(metrics, run_dir))
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
        say(comm, f"PSP@k left out: {train.n_points} training point(s); propensities need at least 3")
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
    from dslide.infer.predict import predict_topk

    comm, net = model.comm, model.network
    steps = [r for r in history]
    train_s = sum(r.get("wall_s_delta", 0.0) for r in steps)
    n_steps = steps[-1]["step"] if steps else 0
    out = {}
    if test is not None:
        from dslide.metrics import evaluate

        pred = predict_topk(model, test.X, 5, exact=True)
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
        "threads": T.rank_threads(model.config),
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
    labels ..."), then a line per choice with its validation figures (the hidden neighbours'
    against the scores before them)."""
    from dslide.train.validation import grid_key

    fc, es = info.get("fusion_choice"), info.get("early_stop")
    out = []
    if fc is not None:
        c = fc["chosen"]
        t = 1.0 if c == "off" else float(c.get("knn_temperature", 1.0))
        out.append("network alone" if c == "off" else
                   f"with neighbour labels: knn {c['knn']}, prototypes' share {c['proto_weight']}, weight {c['knn_weight']}"
                   + (f", softmax temperature {t:g}" if t != 1.0 else ""))
        figs = fc.get("p@1/p@5") or {}
        off = figs.get(grid_key(0, 0.0, 0.0))
        if off is not None:
            key = grid_key(0, 0.0, 0.0) if c == "off" else grid_key(c["knn"], c["proto_weight"], c["knn_weight"], t)
            got = figs.get(key, off)
            ps = info.get("probe_search") or {}
            how = (f" (their neighbours by the bounded search: the exact one would read "
                   f"{ps['exact_reads']:,} posting entries)" if ps.get("search") == "bounded" else "")
            out.append(f"fusion chosen on {fc['validation_points']:,} validation points{how}: network alone P@1 "
                       f"{off[0]:.4f} P@5 {off[1]:.4f}; chosen P@1 {got[0]:.4f} P@5 {got[1]:.4f}")
        else:
            out.append(f"neighbour labels off: {fc.get('why', 'chosen on the validation split')}")
    hc = info.get("hidden_choice")
    if hc is not None and "p@1/p@5" in hc:
        from dslide.train.validation import hidden_key

        c, figs = hc["chosen"], hc["p@1/p@5"]
        off = figs[hidden_key(0, 0.0, 0.0)]
        got = off if c == "off" else figs[hidden_key(c["hidden_knn"], c["hidden_knn_power"], c["hidden_knn_weight"])]
        what = ("off" if c == "off" else f"{c['hidden_knn']} of them, cosine^{c['hidden_knn_power']:g}, "
                f"weight {c['hidden_knn_weight']:g}")
        out.append(f"hidden neighbours ({what}) chosen on {hc['validation_points']:,} validation points: off P@1 "
                   f"{off[0]:.4f} P@5 {off[1]:.4f}; chosen P@1 {got[0]:.4f} P@5 {got[1]:.4f}")
    elif hc is not None:
        out.append(f"hidden neighbours off: {hc['why']}")
    ps = info.get("prior_shift")
    if ps is not None and "p@1/p@5" in ps:
        figs = ps["p@1/p@5"]
        off, got = figs.get("0"), figs.get(f"{ps['chosen']:g}")
        out.append(f"prior shift {ps['chosen']:g} chosen on {ps['validation_points']:,} validation points: "
                   f"off P@1 {off[0]:.4f} P@5 {off[1]:.4f}; chosen P@1 {got[0]:.4f} P@5 {got[1]:.4f}")
    elif ps is not None and ps["chosen"]:
        out.append(f"prior shift {ps['chosen']:g}, {ps['why']}")
    if es is not None and es.get("curve"):
        best = next((c for c in es["curve"] if c[0] == es["kept_step"]), es["curve"][-1])
        out.append(f"early stopping: kept step {es['kept_step']} of {es['curve'][-1][0]} (validation P@1 "
                   f"{best[1]:.4f} P@5 {best[2]:.4f}, network alone)")
    return out


def _data_shape(train) -> tuple:
    from dslide import memory

    return memory.data_shape(train.X, train.Y)
