"""What a run directory guarantees: one writer, whole files, nothing through a planted link.

Files: every file dslide writes is written under a fresh temporary name in
the target's directory, created exclusively (`tempfile.mkstemp`: O_EXCL, so
a symlink planted at any name cannot be opened through), fsynced and moved
into place with `os.replace`, which replaces a symlink at the target rather
than writing through it. A reader sees the old file or the new one, never
half of one. Appending (log.jsonl) opens with O_NOFOLLOW: a symlink there is
an error, not a way to write elsewhere; each line is appended whole or not at
all (a full disk cuts the file back to its last whole line). An error writing
a file names it.

The lock: `RunLock.acquire(run_dir, command)` creates RUN_DIR/dslide.lock
holding the holder's pid, host, start time and command (written to a
temporary file first and hard-linked into place, so the lock appears whole
or not at all; where hard links are unsupported, exclusive creation). A
second writer is refused with a message naming the holder. A lock whose
process is gone (no such pid, a zombie, or a pid since reused by another
process: its start time differs) is stale and taken over; two processes
taking over the same stale lock are serialised by an flock on the old file,
so only one of them wins. A lock held on another host cannot be checked
from here: it is reported with that host and the file to delete if the run
there is over. `release` (and, as a backstop, an atexit hook) removes it;
a killed process leaves a stale lock that the next run takes over.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

LOCK_NAME = "dslide.lock"


class RunDirError(ValueError):
    """A run directory that cannot be used: in use by another process, or not ours to write."""


# ----------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------


def _umask() -> int:
    umask = os.umask(0)  # the only way to read it; restored at once
    os.umask(umask)
    return umask


def default_mode() -> int:
    """The mode an ordinary new file gets: 0666 less the umask (mkstemp alone makes 0600)."""
    return 0o666 & ~_umask()


@contextlib.contextmanager
def replacing(path, binary: bool = True, mode: int | None = None):
    """Write `path` atomically: yields a file object on a fresh temporary file in the same
    directory (exclusive creation, never through a link), fsynced and renamed over `path`
    when the block ends without an exception; removed otherwise."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name + ".", suffix=".tmp")
    try:
        os.fchmod(fd, default_mode() if mode is None else mode)
        with os.fdopen(fd, "wb" if binary else "w", closefd=True) as f:
            fd = None
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if fd is not None:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:  # a full disk names no file
            raise type(e)(e.errno, e.strerror, str(path)) from None
        raise


def write_atomic(path, data, mode: int | None = None) -> None:
    """`path` holds `data` (bytes or str) whole, or keeps what it held (see `replacing`)."""
    with replacing(path, mode=mode) as f:
        f.write(data.encode() if isinstance(data, str) else data)


class LineLog:
    """A file of whole lines, appended to by this process alone (the run's lock): `write(line)`
    appends one line whole or not at all; after a short or failed write (a full disk) the file
    is cut back to where it was and the OSError names it."""

    def __init__(self, fd: int, path):
        self.fd, self.path = fd, str(path)

    def write(self, line: str) -> None:
        data = line.encode()
        start = os.fstat(self.fd).st_size
        done = 0
        try:
            while done < len(data):
                done += os.write(self.fd, data[done:])  # O_APPEND: at the end, whatever the offset
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, start)  # no cut record: the file ends with its last whole line
            raise OSError(e.errno, f"{e.strerror} (the record was not written; the file keeps its whole "
                                   f"lines)", self.path) from None

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)


def open_append(path) -> LineLog:
    """`path` opened for appending lines (LineLog), created if missing; a symlink there is refused."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a symbolic link; dslide does not write through links") from None
        raise
    return LineLog(fd, path)


def json_safe(obj):
    """`obj` with every non-finite float (NaN, inf) as None: strict JSON (null), which
    json.dumps would otherwise write as the bare, non-JSON NaN / Infinity."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and hasattr(obj, "dtype") and getattr(obj, "ndim", 1) == 0:  # numpy scalars
        return json_safe(obj.item())
    return obj


def dumps(obj, **kw) -> str:
    """json.dumps of json_safe(obj), refusing whatever would still not be JSON."""
    return json.dumps(json_safe(obj), allow_nan=False, **kw)


# ----------------------------------------------------------------------------
# the lock
# ----------------------------------------------------------------------------


def _start_ticks(pid: int):
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("latin-1")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _state(pid: int):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("latin-1")
        return stat[stat.rfind(")") + 2:].split()[0]
    except (OSError, IndexError):
        return None


def _alive(holder: dict) -> bool:
    """Whether the lock's process (on this host) still runs."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    if _state(pid) in ("Z", "X"):  # a zombie: dead, only not reaped yet
        return False
    ticks = _start_ticks(pid)
    if ticks is not None and holder.get("start_ticks") is not None and ticks != holder["start_ticks"]:
        return False  # the pid was reused by another process
    return True


def describe(holder: dict) -> str:
    """A lock's holder as messages name it: command, pid, host and since when."""
    return (f"{holder.get('command', 'dslide')} (pid {holder.get('pid')} on host {holder.get('host')}, "
            f"since {holder.get('since', '?')})")


def _read(path: Path):
    """The lock file's holder (a dict), or None when it is missing or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RunDirError(f"{path} is a symbolic link, not a lock dslide wrote; remove it") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a directory, a pipe: not the errno of a read on a bare fd
        os.close(fd)
        raise RunDirError(f"{path} is {'a directory' if stat.S_ISDIR(mode) else 'not a regular file'}, not a "
                          f"lock dslide wrote; if no run uses {path.parent}, remove it")
    with os.fdopen(fd, "rb") as f:
        raw = f.read(4096)
    try:
        holder = json.loads(raw.decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """The lock of one run directory, held by this process (see the module docstring)."""

    made_dir = False  #: open_new made the directory (discard_new then removes it)

    def __init__(self, path: Path, holder: dict):
        self.path, self.holder = path, holder
        self._ino = os.stat(path, follow_symlinks=False).st_ino
        atexit.register(self.release)

    @classmethod
    def acquire(cls, run_dir, command: str) -> "RunLock":
        """Lock `run_dir` (which must exist) for `command`; RunDirError naming the holder when
        another live process has it."""
        path = Path(run_dir) / LOCK_NAME
        me = {"pid": os.getpid(), "host": socket.gethostname(), "start_ticks": _start_ticks(os.getpid()),
              "since": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command}
        for _ in range(20):
            if cls._create(path, me):
                return cls(path, me)
            holder = _read(path)
            if holder is None:
                continue  # released meanwhile: try again
            if not holder:  # not JSON: someone else's file, or a lock of an older format
                raise RunDirError(f"{run_dir} is locked by {path}, which is not a lock dslide can read; "
                                  f"if no run uses {run_dir}, delete {path}")
            if holder.get("host") != me["host"]:
                raise RunDirError(f"{run_dir} is in use by {describe(holder)}; that host's processes cannot "
                                  f"be checked from {me['host']}: if that run is over, delete {path}")
            if _alive(holder):
                raise RunDirError(f"{run_dir} is in use by {describe(holder)}; wait for it to end "
                                  f"(one run directory has one writer)")
            cls._remove_stale(path, holder)
        raise RunDirError(f"could not lock {run_dir}: its lock {path} keeps changing hands")

    @staticmethod
    def _create(path: Path, me: dict) -> bool:
        """Make the lock file with our holder record, whole; False when it exists."""
        data = (json.dumps(me) + "\n").encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + LOCK_NAME + ".", suffix=".tmp")
        try:
            os.fchmod(fd, 0o644 & ~_umask())
            os.write(fd, data)
            os.fsync(fd)
            os.close(fd)
            fd = None
            try:
                os.link(tmp, path)  # atomic, and fails when the lock exists: it appears whole or not at all
                return True
            except FileExistsError:
                return False
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                    raise
            # no hard links on this file system: exclusive creation (a reader may briefly see it empty)
            try:
                lfd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except FileExistsError:
                return False
            try:
                os.write(lfd, data)
                os.fsync(lfd)
            finally:
                os.close(lfd)
            return True
        finally:
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)

    @staticmethod
    def _remove_stale(path: Path, holder: dict) -> None:
        """Delete a stale lock, unless another process replaced it meanwhile: whoever holds the
        flock of the old file checks that the path still is that file, with that holder."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                return
            if same and _read(path) == holder:
                os.unlink(path)
        finally:
            os.close(fd)  # releases the flock

    def release(self) -> None:
        """Remove the lock if it still is ours (idempotent)."""
        if self.path is None:
            return
        path, self.path = self.path, None
        try:
            if os.stat(path, follow_symlinks=False).st_ino == self._ino and _read(path) == self.holder:
                os.unlink(path)
        except (OSError, RunDirError):
            pass
        with contextlib.suppress(Exception):
            atexit.unregister(self.release)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def holder_of(run_dir):
    """The live holder of run_dir's lock (its record), or None when it is not locked (or the
    lock is stale); RunDirError naming the lock when it is not a file dslide wrote (a link,
    a directory)."""
    holder = _read(Path(run_dir) / LOCK_NAME)
    if holder is None:
        return None
    if holder and holder.get("host") == socket.gethostname() and not _alive(holder):
        return None
    return holder or {"command": "an unknown process"}


# ----------------------------------------------------------------------------
# what is a run, and what may be written where
# ----------------------------------------------------------------------------

#: the file that marks a directory as a dslide run (written when the run directory is opened):
#: only a directory holding it is ever emptied by `--overwrite` or `Model.save(overwrite=True)`
MARKER = "dslide-run.json"
#: what a run directory holds, all of it written by dslide (an overwrite deletes these)
RUN_FILES = ("config.toml", "log.jsonl", "metrics.json", "propensity.npz", "checkpoints", MARKER)


def ours(name: str) -> bool:
    """A run directory's entry that dslide wrote: RUN_FILES, the lock, a temporary file."""
    return name in RUN_FILES or name == LOCK_NAME or (name.startswith(".") and name.endswith(".tmp"))


def holds_run(run_dir) -> bool:
    """Whether run_dir holds a dslide run: its marker (a regular file, not a link), or, for a
    run from before markers, checkpoints/LATEST naming a checkpoint with a manifest."""
    run_dir = Path(run_dir)
    marker = run_dir / MARKER
    if marker.is_file() and not marker.is_symlink():
        return True
    latest = run_dir / "checkpoints" / "LATEST"
    try:
        name = latest.read_text().strip() if latest.is_file() and not latest.is_symlink() else ""
    except (OSError, UnicodeDecodeError):
        return False
    return bool(name) and "/" not in name and (run_dir / "checkpoints" / name / "manifest.json").is_file()


def mark(run_dir) -> None:
    """Mark run_dir as a dslide run (MARKER, written whole)."""
    write_atomic(Path(run_dir) / MARKER, dumps({"dslide": "run", "since": time.strftime("%Y-%m-%d %H:%M:%S")}) + "\n")


def check_new(run_dir, overwrite: bool, what: str, hint: str, locked: bool = False) -> None:
    """A run directory to write a new run into: new, empty, or (overwrite) a dslide run not in use.
    what: how the caller names it (`--out`); hint: how to continue or replace a run there;
    locked: this process holds its lock (the check is repeated under it)."""
    run_dir = Path(run_dir)
    if not run_dir.exists() and not run_dir.is_symlink():
        return
    if not run_dir.is_dir():
        raise RunDirError(f"{what} {run_dir} exists and is not a directory")
    holder = None if locked else holder_of(run_dir)
    if holder is not None:
        raise RunDirError(f"{run_dir} is in use by {describe(holder)}; wait for it to end "
                          f"(one run directory has one writer)")
    entries = sorted(p.name for p in run_dir.iterdir() if p.name != LOCK_NAME)
    if not entries:
        return
    listed = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    if not holds_run(run_dir):
        raise RunDirError(f"{what} {run_dir} is not empty ({listed}) and holds no dslide run (no {MARKER}); "
                          f"dslide replaces only its own runs: choose another directory")
    if not overwrite:
        raise RunDirError(f"{what} {run_dir} already holds a run ({listed}): {hint}")


def open_new(run_dir, overwrite: bool, command: str, what: str, hint: str) -> RunLock:
    """run_dir made (parents too) and locked for a new run: checked again under the lock
    (`check_new`), with overwrite emptied of the old run's files (never through a link; files
    dslide did not write are kept), and marked. Returns the lock; on an error nothing this
    call created is left."""
    run_dir = Path(run_dir)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock.acquire(run_dir, command)
    except BaseException:
        if created:
            _rmdir_quietly(run_dir)
        raise
    try:
        check_new(run_dir, overwrite, what, hint, locked=True)  # another run may have finished here since
        _remove_run(run_dir)
        mark(run_dir)
    except BaseException:
        lock.release()
        if created:
            _rmdir_quietly(run_dir)
        raise
    lock.made_dir = created
    return lock


def _remove_run(run_dir: Path) -> None:
    """Delete the run files in run_dir (RUN_FILES and temporaries, never through a link) but its
    marker and lock; someone else's file (a plot, notes) is kept. The caller holds the lock."""

    for p in sorted(run_dir.iterdir()):
        if p.name == LOCK_NAME or not ours(p.name) or p.name == MARKER:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def begin_build(run_dir) -> Path:
    """A fresh private directory beside run_dir (its parents made) to build a whole run in, so
    that a failure midway leaves no half-built run_dir: `finish_build` moves it into place,
    `abandon_build` removes it."""
    run_dir = Path(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=run_dir.parent, prefix="." + run_dir.name + ".", suffix=".tmp"))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 becomes an ordinary directory's mode
    return tmp


def abandon_build(tmp) -> None:
    """Remove a directory of `begin_build` and all in it."""

    shutil.rmtree(tmp, ignore_errors=True)


def finish_build(tmp, run_dir, command: str, replace=None) -> None:
    """Put the run built in `tmp` at run_dir: one rename when run_dir is new or empty; else,
    under run_dir's lock, replace(run_dir) checks that it may be replaced (raising if not; None:
    never), the old run's files go and the new ones are moved in. On an error tmp is removed
    and run_dir keeps what it held."""
    tmp, run_dir = Path(tmp), Path(run_dir)
    try:
        if not run_dir.is_symlink():  # a link is kept, its directory filled below
            try:
                os.rename(tmp, run_dir)  # atomic; replaces only an empty directory
                return
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
        if replace is None:
            raise RunDirError(f"{run_dir} exists and is not empty; a new run directory was expected")
        with RunLock.acquire(run_dir, command):
            replace(run_dir)
            _remove_run(run_dir)
            for p in sorted(tmp.iterdir()):
                os.replace(p, run_dir / p.name)
        tmp.rmdir()
    except BaseException:
        abandon_build(tmp)
        raise


def discard_new(lock: RunLock, run_dir) -> None:
    """Undo `open_new` for a run refused before it began: the run's files removed (RUN_FILES;
    a link is removed, never followed; files dslide did not write are kept), the lock
    released, and the directory removed when open_new made it."""

    run_dir = Path(run_dir)
    for name in RUN_FILES:
        p = run_dir / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
    lock.release()
    if lock.made_dir:
        _rmdir_quietly(run_dir)


def _rmdir_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()  # only when empty: what this call made and nothing else


def check_output(out, inputs, what: str = "--out") -> None:
    """Refuse to write `out` onto any of `inputs` (compared as resolved paths, links followed)
    or into a run's checkpoints (a run's files are its own: dslide.io.checkpoint)."""
    if not out:
        return
    target = os.path.realpath(out)
    for p in inputs:
        if p and os.path.realpath(p) == target:
            raise RunDirError(f"{what} {out} is also an input ({p}); writing it would destroy it: choose another file")
    for d in Path(target).parents:
        if d.name == "checkpoints" and holds_run(d.parent):
            raise RunDirError(f"{what} {out} lies in the checkpoints of the run in {d.parent}; they are that "
                              f"run's own files: choose a file outside {d}")


def check_writable(out, what: str = "--out") -> None:
    """Refuse, before any work, an output whose directory is missing or cannot be written (a
    read-only directory or file system): a trial file is made there and removed at once."""
    if not out:
        return
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise RunDirError(f"{what} {out}: its directory {parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix="." + os.path.basename(out) + ".", suffix=".tmp")
    except OSError as e:
        raise RunDirError(f"{what} {out} cannot be written: {parent}: {e.strerror}; choose a writable "
                          f"directory") from None
    os.close(fd)
    os.unlink(tmp)


def run_inputs(run_dir) -> list:
    """The files of a run that reading its model uses or that belong to the run (eval's and
    predict's inputs): its RUN_FILES and lock (metrics.json is eval's own default target)."""
    return [os.path.join(run_dir, n) for n in RUN_FILES + (LOCK_NAME,) if n not in ("metrics.json", "checkpoints")]
