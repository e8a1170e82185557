"""`dslide warm`: compile the numba kernels once after an install (dslide.warm), and the
heartbeat the other commands run under while numba compiles."""

from __future__ import annotations

import contextlib

from dslide import warm


def add_parser(command) -> None:
    command("warm", "compile dslide's numba kernels now (once after an install), with progress lines") \
        .add_argument("--verbose", action="store_true", help="list every kernel")


def run(args, comm, *, run_command) -> int:
    """run_command: the dslide command's entry point (dslide.cli.main), which warming runs."""
    warm.warm(verbose=args.verbose, run_command=run_command)
    return 0


def notice(command: str, rank: int, quiet: bool):
    """The dslide command's heartbeat: on rank 0 of the commands that run kernels, unless --quiet."""
    if rank != 0 or quiet or command in ("plot", "config", "warm"):
        return contextlib.nullcontext()
    return warm.heartbeat()
