"""The `dslide` command: train, eval, predict, export, data, plot, warm, config.

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
    dslide config show [--data F]            every setting, its default and range

Each command is one module of this package, with the same two functions:
`add_parser(command)` adds its options (`command(name, help, examples)` makes
its sub-parser) and `run(args, comm)` runs it and returns the exit status
(warm's also takes `run_command`, this package's `main`, which it runs). A new
command is one module and one entry in COMMANDS. What several commands
share is dslide.cli.common; what the Python interface (dslide.api) shares with
them, dslide.session.

Errors (a missing file, malformed data, a bad setting, an incompatible
checkpoint, a model larger than the memory available, a run directory in
use or holding another run) print one line and exit with status 2, without
a traceback unless --debug, and write nothing. Under MPI an error on any
rank ends every rank (`MPI_Abort`), so a failure never hangs the job; so
does a rank that stops answering, with `--set stall_timeout=SECONDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import traceback

from dslide import hooks
# eval: the command's module (this module calls no builtin eval)
from dslide.cli import common, config, data, eval, export, plot, predict, train, warm

EXIT_USAGE = 2
EXIT_CRASH = 1

#: the commands in the order `dslide --help` lists them
COMMANDS = {"train": train, "eval": eval, "predict": predict, "export": export, "data": data, "plot": plot,
            "warm": warm, "config": config}

EXAMPLES = """examples:
  dslide data gen --preset small --out data/small
  dslide train --train data/small_train.txt --test data/small_test.txt --out runs/small
  mpiexec -n 2 dslide train --train trn_X_Xf.txt --test tst_X_Xf.txt --set propensity=amazon --out runs/amz
  dslide eval --model runs/small --data data/small_test.txt --lsh
  dslide predict --model runs/small --data data/small_test.txt --k 10 --out pred.npz
  dslide config show --data data/small_train.txt"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dslide", description="Distributed SLIDE: LSH-sparse, model-parallel training "
                                "of very wide networks on CPU clusters. Run under mpiexec -n P for P ranks.",
                                epilog=EXAMPLES, formatter_class=common.Help)
    p.add_argument("--version", action="version", version=f"dslide {__import__('dslide').__version__}")
    p.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(name, help_text, examples=None):
        c = sub.add_parser(name, help=help_text, description=help_text, epilog=examples,
                           formatter_class=common.Help)
        common.add_debug(c)
        return c

    for module in COMMANDS.values():
        module.add_parser(command)
    return p


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
    run = COMMANDS[args.cmd].run
    if args.cmd == "warm":  # warming runs the other commands, through this entry point
        run = functools.partial(run, run_command=main)
    try:
        with warm.notice(args.cmd, comm.rank, getattr(args, "quiet", False)):
            return run(args, comm)
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

