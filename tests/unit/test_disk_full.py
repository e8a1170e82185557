"""A full disk: log.jsonl stays valid line by line, a failed checkpoint leaves no partial
step-* directory, and the one-line error names the file.

A full disk is simulated with RLIMIT_FSIZE (SIGXFSZ ignored): a write past the limit is
cut short and the next one fails (EFBIG), as a write onto a full file system would be
(ENOSPC); no mount is needed. The unit test of the log cuts a write with a monkeypatch.
"""

import errno
import json
import os
import resource
import signal
import subprocess
import sys

import pytest

from dslide import cli
from dslide.io import rundir

S = ["--set", "hidden=16", "--set", "batch_size=32", "--quiet"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("disk_full")
    assert cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "60",
                     "--out", str(d / "t")]) == 0
    cli.main(["data", "stats", str(d / "t_train.txt")])  # the cache exists: the limit is for the run
    return d / "t_train.txt"


def _train_limited(limit: int, out, data, *extra):
    def limit_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "dslide", "train", "--train", str(data), "--out", str(out), *S,
                           *extra], capture_output=True, text=True, timeout=300, preexec_fn=limit_files)


def _records(path):
    text = path.read_text()
    assert text.endswith("\n"), text[-200:]
    return [json.loads(line) for line in text.splitlines()]


def test_a_log_that_cannot_grow_keeps_whole_lines_and_the_error_names_it(data, tmp_path):
    out = tmp_path / "r"
    p = _train_limited(12_000, out, data, "--set", "epochs=60", "--set", "log_every=1",
                       "--set", "checkpoint_every=100000")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "log.jsonl" in lines[0] and "Traceback" not in p.stderr
    records = _records(out / "log.jsonl")
    assert records and records[-1]["step"] == len(records)  # every record whole, none lost before the cut


def test_a_checkpoint_that_cannot_be_written_leaves_no_step_directory_and_names_the_file(data, tmp_path):
    out = tmp_path / "r"
    p = _train_limited(40_000, out, data, "--set", "epochs=1")  # layer0.W (1000 x 16 float32) is larger
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert ".npy" in lines[0] and "step-" in lines[0], lines[0]
    assert sorted(os.listdir(out / "checkpoints")) == []  # no partial step-*, no LATEST naming one
    _records(out / "log.jsonl")


def test_an_append_cut_short_is_undone(tmp_path, monkeypatch):
    path = tmp_path / "log.jsonl"
    log = rundir.open_append(path)
    log.write('{"step": 1}\n')
    real = os.write
    calls = []

    def full(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[:5])  # part of the line fits
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as e:
        log.write('{"step": 2, "loss": 1.0}\n')
    monkeypatch.undo()
    assert e.value.errno == errno.ENOSPC and str(path) in str(e.value)
    assert path.read_text() == '{"step": 1}\n'
    log.write('{"step": 2}\n')  # room again: appending goes on after the last whole line
    log.close()
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_an_atomic_write_that_fails_names_its_file(tmp_path, monkeypatch):
    target = tmp_path / "config.toml"
    target.write_text("old")

    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(OSError) as e:
        with rundir.replacing(target) as f:
            f.write(b"new")
            Full().write(b"more")
    assert str(target) in str(e.value) and e.value.errno == errno.ENOSPC
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["config.toml"]
