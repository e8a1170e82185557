"""Hook points: where code from outside the product (a test's faults) may run inside a run.

A hook point is a list of callables, called in order; append to install one, remove it
to uninstall. The product calls them and knows nothing of what they do.

    STEP         fn(comm, model, step): after each training step of `dslide train`
                 (comm: dslide.comm.Comm; model: dslide.train.Model; step: the global
                 step just trained), before its progress is shown
    CHECKPOINT   fn(point): inside dslide.io.checkpoint.save, at "rank-file" (this rank's
                 file written, the manifest not yet) and "before-latest" (the checkpoint
                 whole, LATEST not yet naming it)
    LOAD         fn(comm, path): in dslide.session.load_model (eval, predict, Model.load),
                 once every rank has the checkpoint rank 0 resolved (path), before any
                 rank reads it

A process of the `dslide` command installs hooks by importing the module named by the
environment variable DSLIDE_TEST_PLUGIN (`load_plugin`, before the command runs): the
tests inject their faults this way (tests/faults.py), in subprocesses and under mpiexec.
"""

from __future__ import annotations

import importlib
import os

STEP: list = []
CHECKPOINT: list = []
LOAD: list = []

#: the environment variable naming a module to import before a command runs (its import installs hooks)
PLUGIN_VARIABLE = "DSLIDE_TEST_PLUGIN"


def call(point: list, *args) -> None:
    """Every hook of `point` (STEP, CHECKPOINT or LOAD), in order, with `args`."""
    for fn in list(point):
        fn(*args)


def load_plugin() -> None:
    """Import the module named by DSLIDE_TEST_PLUGIN, if it is set (an import error is not caught)."""
    name = os.environ.get(PLUGIN_VARIABLE, "").strip()
    if name:
        importlib.import_module(name)
