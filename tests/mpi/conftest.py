"""MPI tests run as `mpiexec -n P python -m mpi4py -m pytest tests/mpi`.

Every rank runs every test; tests compute expected values from rank and size
so one suite serves any rank count. Only rank 0 prints pytest's report; the
other ranks keep theirs and print it only when something failed on them.
"""

import io
import sys

import pytest
from _pytest.config import create_terminal_writer
from mpi4py import MPI

_buffer = io.StringIO()


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if MPI.COMM_WORLD.rank != 0:
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            reporter._tw = create_terminal_writer(config, file=_buffer)


def pytest_unconfigure(config):
    rank = MPI.COMM_WORLD.rank
    text = _buffer.getvalue()
    if rank != 0 and ("FAILED" in text or "ERROR" in text or "Error" in text):
        sys.stdout.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stdout.flush()
