"""The baselines' own venv: PyTorch, omikuji, napkinXC and PECOS, installed on demand, never into the project's .venv.

    python -m scripts._baselines            (installs what is missing, prints what each import gives)

`.venv-baselines/` beside `.venv/` is made with `python -m venv` the first
time a benchmark needs one of the libraries, and each library is installed
into it by pip with the versions pinned below (torch 2.13.0: a CPU wheel of
that version is on this machine's disk, where an unpinned `torch` would fetch
a multi-GB CUDA build; omikuji 0.5.2 and napkinxc 0.7.2: the newest on PyPI,
both with cp311 manylinux wheels). A library that cannot be had is reported
as `(None, reason)`, so a suite goes on without it and says why.

Only the standard library is imported here: the benchmark scripts import this
module from the project's venv, the trainers run under the baselines' python,
as modules of this package (`python -m scripts._tree_train`, with the
repository root as the working directory: see `trainer_cmd`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from . import measure as M

VENV = M.ROOT / ".venv-baselines"
REQUIREMENTS = {
    "torch": ("torch==2.13.0", "numpy"),
    "omikuji": ("omikuji==0.5.2", "numpy"),
    "napkinxc": ("napkinxc==0.7.2", "numpy", "scipy"),
    # PECOS brings torch (about 6 GB, 10 minutes): installed once into this venv and kept
    "pecos": ("libpecos==1.2.8", "numpy", "scipy", "scikit-learn"),
}
INSTALL_TIMEOUT_S = 1800
PROBE_TIMEOUT_S = 300


def child_env(threads: int | None = None, **extra: str) -> dict:
    """The environment of a baseline's process: no user site, no PYTHONPATH, with `threads` threads
    (measure.thread_env) and `extra` variables. Its working directory is the repository root
    (`trainer_cmd`), so the checkout's folders are importable there too: the trainers import none."""
    env = dict(os.environ, PYTHONNOUSERSITE="1")
    env.pop("PYTHONPATH", None)
    return M.thread_env(threads, env, **extra) if threads is not None else {**env, **extra}


def trainer_cmd(python, module: str, *args) -> list[str]:
    """A baseline trainer of this package (`_tree_train`, `_torch_train`) under `python`; run it with
    cwd=measure.ROOT and env=child_env(...)."""
    return M.module_cmd(module, *args, python=str(python))


def last_line(text: str) -> str:
    """The last line of a tool's output that says something (pip's warnings and notices left out)."""
    lines = [ln.strip() for ln in text.splitlines()
             if ln.strip() and not ln.lstrip().startswith(("WARNING:", "[notice]"))]
    return lines[-1] if lines else "(no output)"


def probe(python, module: str) -> tuple[bool, str]:
    """(True, version) when `python` imports numpy and `module`, else (False, why not)."""
    code = f"import numpy, {module} as m; print(getattr(m, '__version__', '?'))"
    try:
        r = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=child_env(),
                           timeout=PROBE_TIMEOUT_S, cwd=M.ROOT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{python} could not be run: {e}"
    if r.returncode != 0:
        return False, f"{python} cannot import {module} and numpy: {last_line(r.stderr)}"
    return True, r.stdout.strip()


def python_with(module: str, venv=VENV, *, requirements=None, install: bool = True,
                quiet: bool = False) -> tuple[str | None, str]:
    """The python of `venv` with `module` importable, installing it on demand: (path, version) or (None, reason).

    requirements: what pip installs for it (default REQUIREMENTS[module]).
    """
    venv = Path(venv)
    py = venv / "bin" / "python"
    if py.exists():
        ok, info = probe(py, module)
        if ok:
            return str(py), info
        if not install:
            return None, info
    elif not install:
        return None, f"{venv} does not exist"
    reqs = tuple(requirements if requirements is not None else REQUIREMENTS[module])
    if not quiet:
        print(f"[baselines] installing {' '.join(reqs)} into {venv} (one-off)", file=sys.stderr, flush=True)
    steps = []
    if not py.exists():
        steps.append(("python -m venv", [sys.executable, "-m", "venv", str(venv)]))
    steps.append(("pip install", [str(py), "-m", "pip", "install", "--quiet", *reqs]))
    for what, cmd in steps:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=INSTALL_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{what} failed: {e}"
        if r.returncode != 0:
            return None, f"{what} failed (exit {r.returncode}): {last_line(r.stderr or r.stdout)}"
    ok, info = probe(py, module)
    return (str(py), info) if ok else (None, info)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description="Install into .venv-baselines what is missing of "
                                        f"{', '.join(REQUIREMENTS)}; print what each import gives.").parse_args()
    for name in REQUIREMENTS:
        got, what = python_with(name)
        print(f"{name}: {what}" + (f" ({got})" if got else ""))
