"""The faults the tests inject into a run, through the hook points of dslide.hooks
(the product holds no fault logic).

DSLIDE_FAULT names the fault:

    raise-rank<r>-step<s>      rank r raises RuntimeError after step s ("injected fault ...")
    stop-rank<r>-step<s>       rank r stops itself (SIGSTOP) after step s: a rank that stops answering
    nan-step<s>                the output layer's biases become NaN after step s, on every rank
    checkpoint-rank-file       the process dies inside a checkpoint save (exit status 75, as a
    checkpoint-before-latest   kill would), once its rank file is written / before LATEST names it
    replace-rank<r>-times<n>   as eval, predict or Model.load is about to read the checkpoint it resolved,
                               rank r replaces it, the first n times, as a run still training does
                               (`replace_checkpoint`); with DSLIDE_FAULT_NEWER naming a checkpoint
                               directory, the newer checkpoint is a copy of that one

In a subprocess of the dslide command (mpiexec's included): `env.update(faults.env(fault))`;
the command imports this module (DSLIDE_TEST_PLUGIN) and the import installs the hooks.
In the test's own process: `faults.inject(monkeypatch, fault)`, undone after the test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

from dslide import hooks

ROOT = Path(__file__).resolve().parents[1]
VARIABLE = "DSLIDE_FAULT"
NEWER = "DSLIDE_FAULT_NEWER"

#: the checkpoints this process's replace fault replaced, in order
replaced: list = []


def on_step(comm, model, step: int) -> None:
    fault = os.environ.get(VARIABLE, "")
    if fault == f"raise-rank{comm.rank}-step{step}":
        raise RuntimeError(f"injected fault on rank {comm.rank} at step {step}")
    if fault == f"stop-rank{comm.rank}-step{step}":
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault == f"nan-step{step}":
        model.network.layers[-1].b[:] = float("nan")


def on_checkpoint(point: str) -> None:
    if os.environ.get(VARIABLE) == f"checkpoint-{point}":
        os._exit(75)


def on_load(comm, path: Path) -> None:
    m = re.fullmatch(r"replace-rank(\d+)-times(\d+)", os.environ.get(VARIABLE, ""))
    if m and comm.rank == int(m[1]) and len(replaced) < int(m[2]):
        replaced.append(path)
        replace_checkpoint(path, os.environ.get(NEWER) or path)


def replace_checkpoint(path: Path, source) -> Path:
    """What a training run's save does to a reader of checkpoint `path`: a newer checkpoint (a
    copy of `source`) under a later step's name, LATEST naming it, `path` deleted. Returns it."""
    path = Path(path)
    step = int(path.name.split("-")[1].split(".")[0]) + 1
    while (path.parent / f"step-{step:09d}").exists():
        step += 1
    newer = path.parent / f"step-{step:09d}"
    shutil.copytree(source, newer)
    (path.parent / "LATEST.tmp").write_text(newer.name + "\n")
    os.replace(path.parent / "LATEST.tmp", path.parent / "LATEST")
    shutil.rmtree(path)
    return newer


def env(fault: str) -> dict:
    """The environment variables that make a dslide command started now inject `fault`
    (this module on its import path, named as its plugin)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {VARIABLE: fault, hooks.PLUGIN_VARIABLE: __name__, "PYTHONPATH": path}


def inject(monkeypatch, fault: str) -> None:
    """Inject `fault` into the dslide commands this test runs in its own process."""
    monkeypatch.setenv(VARIABLE, fault)
    monkeypatch.setattr(hooks, "STEP", [*hooks.STEP, on_step])
    monkeypatch.setattr(hooks, "CHECKPOINT", [*hooks.CHECKPOINT, on_checkpoint])
    monkeypatch.setattr(hooks, "LOAD", [*hooks.LOAD, on_load])
    replaced.clear()


if os.environ.get(hooks.PLUGIN_VARIABLE) == __name__:  # imported as the command's plugin
    hooks.STEP.append(on_step)
    hooks.CHECKPOINT.append(on_checkpoint)
    hooks.LOAD.append(on_load)
