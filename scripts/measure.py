"""What every benchmark measures and records, in one place: threads, peak memory, time to a target, the record.

    python -m scripts.measure record KEY FILE    (FILE's text as the section KEY of docs/benchmarks.md)

- `thread_env(n)`: the environment of a child process limited to n threads
  (numba, OpenMP, every BLAS, rayon): the one place the thread variables are
  listed.
- `module_cmd(name, ...)` and `run`: a child process running a module of this
  package, `python -m scripts.NAME` with the repository root as its working
  directory (under `mpiexec` and `python -m mpi4py` for several ranks), so
  the child imports the package as this process does.
- Peak memory. `peak_rss_mb()`: this process's own peak resident set, VmHWM
  of /proc/self/status; not ru_maxrss of RUSAGE_SELF, which Linux carries
  over from the parent through fork and exec (a child of a large benchmark
  process reports at least the parent's size). `run` measures a child's
  whole process tree (mpiexec, its proxies and ranks): while the tree lives,
  it reads each process's VmHWM from /proc every `interval` seconds (a
  process's own high-water mark, so a peak between two reads is not missed;
  only growth after the last read before a process ends is). A tree that
  ended before the first read gets `resource.getrusage(RUSAGE_CHILDREN)
  .ru_maxrss` instead, the largest peak of any one finished descendant
  (waited for by us or by its own parent), where the run raised it: it is a
  maximum over this process's whole life, and a direct child's includes our
  own size when it was started (the fork/exec carry-over above), so it is
  an upper bound. Results: `TreePeak` (the largest process, the sum over
  processes, how many were seen). psutil is not a dependency.
- `time_to(curve, target)`: training seconds until P@1 first reached a target.
- `machine()`, `code_version()`: the lines every recorded section starts with;
  `table`, `report` and `record`: a markdown table, a script's printed
  section, and that section put into docs/benchmarks.md.

Only the standard library is imported at module level: the baselines'
trainers, which run under `.venv-baselines`' python (numpy and their library,
no dslide), import `peak_rss_mb` from here.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "scripts"  # run from ROOT: python -m scripts.NAME
SHARED_DATA = ROOT.parent / "shared" / "data"  # real data sets beside the checkout (bibtex_train.txt, ...)

#: the variables that set a thread count: numba, OpenMP (torch, MKL's), OpenBLAS, MKL, rayon (omikuji)
THREAD_VARS = ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "RAYON_NUM_THREADS")


# --------------------------------------------------------------------------- threads


def thread_env(threads: int, base: dict | None = None, **extra: str) -> dict:
    """`base` (default: this process's environment) with every THREAD_VARS set to `threads`, then `extra`.

    thread_env(2, {}) gives the variables alone (to show them, or to set them in this process)."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads ({threads!r}) must be an integer >= 1")
    env = dict(os.environ if base is None else base)
    env.update({v: str(threads) for v in THREAD_VARS})
    env.update(extra)
    return env


# --------------------------------------------------------------------------- child processes


def mpiexec() -> str:
    """The mpiexec beside this python (the venv's), else the one on PATH."""
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if here.exists() else "mpiexec"


def module_cmd(name: str, *args, ranks: int = 1, mpi: bool | None = None, python: str | None = None) -> list[str]:
    """The command line of this package's module `name` (e.g. "_bench"): `python -m scripts.NAME ARGS`,
    under `mpiexec -n RANKS python -m mpi4py` when `mpi` (default: ranks > 1). Run it with cwd=ROOT
    (see `run`)."""
    py = python or sys.executable
    cmd = [py, "-m", f"{PACKAGE}.{name}", *map(str, args)]
    if ranks > 1 if mpi is None else mpi:
        cmd = [mpiexec(), "-n", str(ranks), py, "-m", "mpi4py", *cmd[1:]]
    return cmd


@dataclass
class TreePeak:
    """The peak resident memory of a process tree, MB: of its largest process (`largest_mb`) and the sum of
    every process's own peak (`total_mb`, an upper bound of what the tree held at once); `processes` seen."""

    largest_mb: float = 0.0
    total_mb: float = 0.0
    processes: int = 0


def _status_kb(pid, field: str) -> int | None:
    """A memory field of /proc/PID/status (VmHWM: peak, VmRSS: now) in KiB; None if unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def status_bytes(field: str) -> int:
    """This process's /proc/self/status memory field (e.g. "VmRSS:", "VmHWM:") in bytes; 0 where unreadable."""
    kb = _status_kb("self", field)
    return 0 if kb is None else kb * 1024


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM), MB; None where /proc is missing (see the module docstring)."""
    kb = _status_kb("self", "VmHWM:")
    return None if kb is None else kb / 1024.0


def tree_pids(root: int) -> list[int]:
    """`root` and its live descendants, from each task's /proc/PID/task/TID/children."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except (OSError, ValueError):
                pass
    return out


def children_peak_mb() -> float:
    """ru_maxrss of RUSAGE_CHILDREN, MB: the largest peak of any finished descendant (see the module docstring)."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


class _Sampler(threading.Thread):
    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.peaks: dict[int, int] = {}  # pid -> its VmHWM, KiB
        self.done = threading.Event()

    def sample(self) -> None:
        for pid in tree_pids(self.pid):
            kb = _status_kb(pid, "VmHWM:")
            if kb is not None and kb > self.peaks.get(pid, 0):
                self.peaks[pid] = kb

    def run(self) -> None:
        while not self.done.is_set():
            self.sample()
            self.done.wait(self.interval)


def run(cmd: list, *, env: dict | None = None, timeout: float | None = None, cwd=ROOT, interval: float = 0.5,
        **popen) -> tuple[subprocess.CompletedProcess, TreePeak]:
    """Run `cmd` (cwd: the repository root) to its end, measuring its process tree's peak memory
    (see the module docstring); (its CompletedProcess, TreePeak). stdout and stderr are captured as text
    unless `popen` says otherwise. Raises subprocess.TimeoutExpired (the tree killed) after `timeout` s."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    before = children_peak_mb()
    with subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, **popen) as p:
        sampler = _Sampler(p.pid, interval)
        sampler.start()
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise
        finally:
            sampler.done.set()
            sampler.join()
    peaks = [kb / 1024.0 for kb in sampler.peaks.values()]
    largest = max(peaks, default=0.0)
    after = children_peak_mb()
    if not peaks and after > before:  # ended before the first read: a finished descendant's peak
        largest = after
    return (subprocess.CompletedProcess(p.args, p.returncode, out, err),
            TreePeak(largest_mb=largest, total_mb=max(sum(peaks), largest), processes=len(peaks)))


# --------------------------------------------------------------------------- time to a target


def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds (`wall_s`) at the first record whose P@1 reached `target` (None if none did);
    records without a P@1 (logging points between evaluations) are passed over."""
    for r in curve:
        if r.get("p@1") is not None and r["p@1"] >= target:
            return r["wall_s"]
    return None


# --------------------------------------------------------------------------- what a record says


def machine() -> str:
    """Cores, memory, processor (with its CPU and widest vector instructions where /proc/cpuinfo
    tells), and the versions of Python, numpy and numba."""
    import platform

    import numba
    import numpy

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    cpu = cpu_model()
    return (f"{os.cpu_count()} cores, {mem:.0f} GiB, {platform.processor() or platform.machine()}"
            f"{f' ({cpu})' if cpu else ''}, "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, numba {numba.__version__}")


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name and its widest vector instructions ("AMD EPYC, AVX2"; "..., AVX-512, AMX"):
    a float32 product's speed, and its rounding (OpenBLAS picks its kernel by them), differ between
    them. From /proc/cpuinfo's first processor (`cpuinfo`: its text instead); "" where unreadable."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return ""
    name, flags = "", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not name:
            name = " ".join(value.split())
        elif key == "flags" and not flags:
            flags = set(value.split())
    vector = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "AVX" if "avx" in flags else ""
    extras = [vector] if vector else []
    if "amx_tile" in flags:
        extras.append("AMX")
    return ", ".join(filter(None, [name, *extras]))


def code_version() -> str:
    """The checkout's commit (and whether tracked files differ from it): dslide's defaults change over time."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return (head or "unknown") + (" with uncommitted changes" if dirty else "")


def command(module: str, argv) -> str:
    """How a module of this package was run: `python -m scripts.MODULE ARGS`."""
    return " ".join([f"python -m {PACKAGE}.{module}", *map(str, argv)])


def table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A markdown table of `rows` with (header, key-or-callable) columns."""
    out = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        cells = []
        for _, key in columns:
            v = key(r) if callable(key) else r.get(key, "")
            cells.append(v if isinstance(v, str) else (f"{v:,.4g}" if isinstance(v, float) else str(v)))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def report(module: str, argv: list[str], rows: list[dict], cols, out: str | None, record_it: bool) -> str:
    """Print a module's table with its command and the machine; also to `out`, and to docs/benchmarks.md
    (as the section "MODULE.py", with " --quick" when run so)."""
    text = f"command: {command(module, argv)}\nmachine: {machine()}\n\n" + table(rows, cols) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    if record_it:
        record(module + ".py" + (" --quick" if "--quick" in argv else ""), text)
    return text


#: where docs/benchmarks.md's list of older runs (docs/benchmarks-history.md) starts: new sections go above it
HISTORY = "<!-- history -->"


def record(key: str, text: str) -> None:
    """Put `text` in docs/benchmarks.md as the section of `key`: in place of the previous one, or
    else last before the History list (HISTORY), or at the end of a page without one."""
    doc = ROOT / "docs" / "benchmarks.md"
    head, tail = f"<!-- {key} -->", f"<!-- end {key} -->"
    body = f"{head}\n## `scripts/{key}`\n\n{text.strip()}\n{tail}\n"
    old = doc.read_text() if doc.exists() else "# Benchmarks\n\nEvery figure here was printed by the command above it.\n\n"
    if head in old and tail in old:
        new = old[:old.index(head)] + body + old[old.index(tail) + len(tail) + 1:]
    elif HISTORY in old:
        at = old.index(HISTORY)
        new = old[:at].rstrip("\n") + "\n\n" + body + "\n" + old[at:]
    else:
        new = old.rstrip("\n") + "\n\n" + body
    doc.parent.mkdir(exist_ok=True)
    tmp = doc.with_suffix(".md.tmp")
    tmp.write_text(new)
    tmp.replace(doc)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "record":
        record(sys.argv[2], Path(sys.argv[3]).read_text())
    else:
        print(__doc__)
        sys.exit(0 if sys.argv[1:] in ([], ["--help"], ["-h"]) else 2)
