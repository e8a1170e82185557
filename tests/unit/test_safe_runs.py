"""Issue 27: runs that cannot clobber each other, refuse what is not a number, and never
write outside where they were told. One test (or a few) per item of the issue; the
table of bad inputs is tests/unit/test_bad_inputs.py."""

import dataclasses
import json
import math
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli, session
from dslide.cli import common
from dslide.cli import train as cli_train
from dslide.comm import Comm
from dslide.config import Config, LSHConfig
from dslide.io import checkpoint as ck
from dslide.io import checkpoint_files as ckf
from dslide.io import data as D
from dslide.io import rundir
from dslide.io import xmc_cache as C
from dslide.io.data import XMCCacheWarning, cache_path, read_xmc, write_xmc
from tests import faults

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")
S = ["--set", "hidden=16", "--set", "batch_size=32", "--quiet"]


def run(argv, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity (what the JSON standard allows)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("safe_runs")
    for name, seed in (("a", 0), ("b", 1)):
        assert cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "60", "--seed",
                         str(seed), "--out", str(d / name)]) == 0
    return SimpleNamespace(dir=d, a=d / "a_train.txt", a_test=d / "a_test.txt", b=d / "b_train.txt",
                           b_test=d / "b_test.txt")


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "r"
    assert cli.main(["train", "--train", str(data.a), "--test", str(data.a_test), "--out", str(run_dir),
                     "--set", "epochs=1", *S]) == 0
    return run_dir


def _files(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


# -- 1. --out never overwrites another run silently ---------------------------------------------


def test_train_out_refuses_an_existing_run_and_overwrite_replaces_it_whole(data, tmp_path, capsys):
    out = tmp_path / "pa"
    assert cli.main(["train", "--train", str(data.a), "--test", str(data.a_test), "--out", str(out),
                     "--set", "epochs=1", *S]) == 0
    (out / "notes.txt").write_text("mine")
    before = _files(out)
    b = ["train", "--train", str(data.b), "--test", str(data.b_test), "--out", str(out), "--set", "epochs=1", *S,
         "--set", "propensity_a=0.6", "--set", "propensity_b=2.6"]
    code, _, err = run(b, capsys)
    assert code == 2 and f"--out {out} already holds a run" in err and "--resume" in err and "--overwrite" in err
    assert _files(out) == before  # not a byte changed
    code, _, err = run(b + ["--overwrite"], capsys)
    assert code == 0, err
    assert "propensity_a = 0.6" in (out / "config.toml").read_text()
    with np.load(out / "propensity.npz") as f:
        assert float(f["A"]) == 0.6 and float(f["B"]) == 2.6  # not the other run's propensities
    steps = [strict_json(l)["step"] for l in (out / "log.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps))  # one run's log, not two appended
    assert (out / "notes.txt").read_text() == "mine"  # not dslide's: kept
    assert not (out / rundir.LOCK_NAME).exists()  # released
    # --resume continues it, in its own directory
    code, _, err = run(["train", "--train", str(data.b), "--resume", str(out), "--set", "epochs=2", "--quiet"], capsys)
    assert code == 0, err


def test_the_default_run_directory_is_never_one_already_there(data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    monkeypatch.setattr(cli_train.time, "strftime", lambda fmt: stamp)
    (tmp_path / "runs" / f"run-{stamp}").mkdir(parents=True)
    (tmp_path / "runs" / f"run-{stamp}" / "config.toml").write_text("x")
    code, _, err = run(["train", "--train", str(data.a), "--set", "epochs=1", *S], capsys)
    assert code == 0, err
    assert (tmp_path / "runs" / f"run-{stamp}-2" / "metrics.json").exists()
    assert (tmp_path / "runs" / f"run-{stamp}" / "config.toml").read_text() == "x"


# -- 2. NaN and infinity are no numbers; a diverging run stops -----------------------------------


def _float_fields():
    for cls, prefix in ((Config, ""), (LSHConfig, "lsh.")):
        for f in dataclasses.fields(cls):
            if isinstance(f.default, float) or f.type in ("float | None", "float"):
                yield prefix + f.name


@pytest.mark.parametrize("name", list(_float_fields()))
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_setting_refuses_nan_and_infinity(name, value):
    with pytest.raises(ValueError, match=rf"{name.replace('.', '[.]')} = {value} must be a finite number"):
        if name.startswith("lsh."):
            Config(lsh={name[4:]: value})
        else:
            Config(**{name: value})


def test_the_float_settings_are_all_checked():
    names = set(_float_fields())
    assert {"lr", "beta1", "beta2", "eps", "dropout", "propensity_a", "propensity_b", "auto_lsh_ratio",
            "epochs", "init_input_scale", "stall_timeout", "lsh.growth", "lsh.min_active_share",
            "lsh.index_share", "lsh.index_shrink", "lsh.index_spread"} <= names


def test_a_loss_that_becomes_nan_stops_training_naming_the_step_and_keeps_the_last_good_checkpoint(
        data, tmp_path, capsys, monkeypatch):
    out = tmp_path / "nan"
    faults.inject(monkeypatch, "nan-step7")  # the output biases become NaN after step 7
    # 300 points, batch 32: 10 steps an epoch; checkpoints at 5, 10, 15
    code, _, err = run(["train", "--train", str(data.a), "--out", str(out), "--set", "epochs=2",
                        "--set", "checkpoint_every=5", "--set", "log_every=1", *S], capsys)
    assert code == 2, err
    assert "the loss became nan at step 8" in err and "Traceback" not in err
    assert (out / "checkpoints" / "LATEST").read_text().strip() == "step-000000005"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["LATEST", "step-000000005"]
    assert not (out / "metrics.json").exists()
    log = [strict_json(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(1, 8))  # up to the last finite step, all strict JSON
    net = _network_of(out)
    assert all(np.isfinite(l.W).all() and np.isfinite(l.b).all() for l in net.layers)
    assert not (out / rundir.LOCK_NAME).exists()


def _network_of(run_dir):
    from dslide.model.network import Network

    path = ck.latest(run_dir)
    manifest = ck.read_manifest(path)
    net = Network(ck.config_of(path), manifest["n_features"], manifest["n_labels"], Comm())
    ck.load_into(net, path, Comm())
    return net


def test_a_checkpoint_of_non_finite_parameters_is_refused_and_latest_kept(trained, tmp_path):
    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir)
    before = (run_dir / "checkpoints" / "LATEST").read_text()
    net = _network_of(run_dir)
    net.layers[0].W[3, 1] = np.inf
    with pytest.raises(ck.CheckpointError, match=r"step \d+: layer0/W on rank 0 holds non-finite values"):
        ck.save(net, run_dir, Comm())
    assert (run_dir / "checkpoints" / "LATEST").read_text() == before
    assert len(list((run_dir / "checkpoints").glob("step-*"))) == 1


def test_log_and_metrics_are_strict_json():
    assert rundir.dumps({"loss": math.nan, "x": [1.0, math.inf], "y": np.float32("nan"), "ok": 0.5}) == \
        '{"loss": null, "x": [1.0, null], "y": null, "ok": 0.5}'


# -- 3. one writer per run directory ----------------------------------------------------------------


def _dslide(*args, **kw):
    env = {k: v for k, v in os.environ.items() if k not in (faults.VARIABLE, "DSLIDE_TEST_PLUGIN")}
    return subprocess.Popen([sys.executable, "-m", "dslide", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kw)


def test_a_second_writer_is_refused_naming_the_holder_and_the_first_run_is_intact(data, tmp_path):
    out = tmp_path / "conc"
    first = _dslide("train", "--train", str(data.a), "--out", str(out), "--set", "epochs=30", "--set", "hidden=64",
                    "--set", "checkpoint_every=1", "--set", "batch_size=32", "--quiet")
    lock = out / rundir.LOCK_NAME
    t0 = time.monotonic()
    while not lock.exists() and first.poll() is None and time.monotonic() - t0 < 240:
        time.sleep(0.05)
    assert lock.exists(), first.communicate()
    second = _dslide("train", "--train", str(data.a), "--out", str(out), "--set", "epochs=1", "--set", "hidden=32",
                     "--set", "checkpoint_every=1", "--set", "batch_size=32", "--quiet")
    _, err2 = second.communicate(timeout=240)
    _, err1 = first.communicate(timeout=600)
    assert first.returncode == 0, err1
    assert second.returncode == 2, err2
    assert f"{out} is in use by dslide train (pid {first.pid} on host {socket.gethostname()}" in err2 \
        or f"--out {out} already holds a run" in err2  # (had the first one finished already)
    assert "hidden = [64]" in (out / "config.toml").read_text()
    assert ck.config_of(ck.latest(out)).hidden == (64,)
    assert not lock.exists()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write_lock(d: Path, **holder):
    d.mkdir(exist_ok=True)
    (d / rundir.LOCK_NAME).write_text(json.dumps({"command": "dslide train", "since": "then", **holder}))


def test_a_stale_lock_is_taken_over_and_a_live_or_foreign_one_is_not(tmp_path):
    host = socket.gethostname()
    d = tmp_path / "r"
    _write_lock(d, pid=_dead_pid(), host=host)
    with rundir.RunLock.acquire(d, "test") as lock:  # the holder is gone: taken over
        held = json.loads((d / rundir.LOCK_NAME).read_text())
        assert held["pid"] == os.getpid() and held["host"] == host and held["command"] == "test"
        with pytest.raises(rundir.RunDirError, match=f"is in use by test \\(pid {os.getpid()} on host {host}"):
            rundir.RunLock.acquire(d, "again")
    assert not (d / rundir.LOCK_NAME).exists()  # released
    # a pid reused by another process (its start time differs): stale
    _write_lock(d, pid=os.getppid(), host=host, start_ticks=1)
    rundir.RunLock.acquire(d, "test").release()
    # a zombie: dead, only not reaped yet
    zombie = subprocess.Popen(["true"])
    time.sleep(0.5)
    _write_lock(d, pid=zombie.pid, host=host)
    rundir.RunLock.acquire(d, "test").release()
    zombie.wait()
    # alive: refused, naming it
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        _write_lock(d, pid=sleeper.pid, host=host)
        with pytest.raises(rundir.RunDirError, match=f"in use by dslide train \\(pid {sleeper.pid} on host {host}"):
            rundir.RunLock.acquire(d, "test")
    finally:
        sleeper.kill()
        sleeper.wait()
    # another host: cannot be checked from here
    _write_lock(d, pid=1, host="elsewhere.example")
    with pytest.raises(rundir.RunDirError, match=f"on host elsewhere.example.*delete {d / rundir.LOCK_NAME}"):
        rundir.RunLock.acquire(d, "test")
    # not a lock dslide wrote
    (d / rundir.LOCK_NAME).write_text("garbage")
    with pytest.raises(rundir.RunDirError, match="not a lock dslide can read"):
        rundir.RunLock.acquire(d, "test")


_TAKER = """
import sys, time
from dslide.io import rundir
try:
    lock = rundir.RunLock.acquire(sys.argv[1], "taker")
except rundir.RunDirError:
    print("lost")
else:
    print("won", flush=True)
    time.sleep(3)
    lock.release()
"""


def test_processes_taking_over_one_stale_lock_at_once_leave_it_to_exactly_one(tmp_path):
    d = tmp_path / "r"
    _write_lock(d, pid=_dead_pid(), host=socket.gethostname())
    procs = [subprocess.Popen([sys.executable, "-c", _TAKER, str(d)], stdout=subprocess.PIPE, text=True)
             for _ in range(6)]
    results = sorted(p.communicate(timeout=120)[0].strip() for p in procs)
    assert results == ["lost"] * 5 + ["won"], results
    assert not (d / rundir.LOCK_NAME).exists()


def test_a_lock_is_released_when_its_process_exits_without_releasing_it(tmp_path):
    code = f"from dslide.io import rundir; lock = rundir.RunLock.acquire({str(tmp_path)!r}, 't'); print('held')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.strip() == "held", p.stderr
    assert not (tmp_path / rundir.LOCK_NAME).exists()  # atexit


# -- 4. manifests and LATEST cannot lead outside the checkpoint ------------------------------------


def _tampered(trained, tmp_path, change):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    path = ck.latest(run_dir)
    m = json.loads((path / "manifest.json").read_text())
    change(m)
    (path / "manifest.json").write_text(json.dumps(m))
    return run_dir


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_export_never_writes_outside_out_whatever_the_manifest_says(trained, tmp_path, capsys, where):
    escape = tmp_path / "escape" if where == "absolute" else "../../../escape"
    run_dir = _tampered(trained, tmp_path, lambda m: m["ranks"][0].update(dir=str(escape)))
    out = tmp_path / "sub" / "exported"
    code, _, err = run(["export", "--model", str(run_dir), "--out", str(out)], capsys)
    assert code == 2 and "is not a plain name inside the checkpoint directory" in err
    assert not (tmp_path / "escape").exists() and not out.exists() and not (tmp_path / "sub").exists()


def test_a_manifest_file_outside_its_rank_directory_is_never_read(trained, tmp_path, capsys, data):
    secret = tmp_path / "x.npy"
    np.save(secret, np.zeros(3))
    run_dir = _tampered(trained, tmp_path, lambda m: m["ranks"][0]["arrays"]["layer0/W"].update(file="../../x.npy"))
    code, _, err = run(["eval", "--model", str(run_dir), "--data", str(data.a_test)], capsys)
    assert code == 2 and "file '../../x.npy' is not a plain name" in err


def test_export_copies_a_good_checkpoint_and_locks_its_target_while_it_writes(trained, tmp_path, capsys, data):
    out = tmp_path / "exported"
    code, o, err = run(["export", "--model", str(trained), "--out", str(out)], capsys)
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.toml", "metrics.json"]
    code, o, err = run(["eval", "--model", str(out), "--data", str(data.a_test), "--out", str(tmp_path / "m.json")],
                       capsys)
    assert code == 0, err


# -- 5. no temporary file is opened through a symlink -----------------------------------------------


def test_predict_writes_neither_through_a_planted_temporary_nor_through_a_link_at_its_output(
        trained, data, tmp_path, capsys):
    victim, victim2 = tmp_path / "victim", tmp_path / "victim2"
    victim.write_text("precious")
    victim2.write_text("precious too")
    pred = tmp_path / "PRED.txt"
    os.symlink(victim, tmp_path / "PRED.txt.tmp")  # the name predict used to write through
    os.symlink(victim2, pred)
    code, _, err = run(["predict", "--model", str(trained), "--data", str(data.a_test), "--k", "2",
                        "--out", str(pred)], capsys)
    assert code == 0, err
    assert victim.read_text() == "precious" and victim2.read_text() == "precious too"
    assert not pred.is_symlink() and len(pred.read_text().splitlines()) == 1 + 60  # the header, 60 points


def test_run_files_are_never_written_through_symlinks(trained, data, tmp_path, capsys):
    run_dir = tmp_path / "r"
    shutil.copytree(trained, run_dir)
    victims = {}
    for name in ("config.toml", "metrics.json", "propensity.npz", "propensity.npz.tmp"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text(name)
        (run_dir / name).unlink(missing_ok=True)
        os.symlink(victims[name], run_dir / name)
    code, _, err = run(["train", "--train", str(data.a), "--out", str(run_dir), "--set", "epochs=1", *S,
                        "--overwrite"], capsys)
    assert code == 0, err
    assert all(v.read_text() == name for name, v in victims.items())
    for name in ("config.toml", "metrics.json", "propensity.npz"):
        assert not (run_dir / name).is_symlink() and (run_dir / name).stat().st_size > 0
    # a link planted as log.jsonl: appending through it is refused
    (run_dir / "log.jsonl").unlink()
    os.symlink(victims["config.toml"], run_dir / "log.jsonl")
    code, _, err = run(["train", "--train", str(data.a), "--resume", str(run_dir), "--set", "epochs=2", "--quiet"],
                       capsys)
    assert code == 2 and "log.jsonl is a symbolic link" in err
    assert victims["config.toml"].read_text() == "config.toml"


def test_an_array_file_is_written_under_a_fresh_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / ".a.npy.tmp")  # write_npy's old temporary name
    ckf.write_npy(tmp_path / "a.npy", np.arange(5.0))
    assert victim.read_text() == "precious" and np.array_equal(np.load(tmp_path / "a.npy"), np.arange(5.0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".a.npy.tmp", "a.npy", "victim"]


# -- 6. the data cache: as private as its source, never stale, checked ------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_the_cache_is_as_private_as_its_source(tmp_path, mode):
    p = tmp_path / "s.txt"
    p.write_text("2 10 5\n0,2 1:0.5 4:2\n 0:1 9:3\n")
    p.chmod(mode)
    read_xmc(p)
    c = Path(cache_path(p))
    files = [c / n for n in os.listdir(c)]
    want = mode & ~rundir._umask()
    assert {stat.S_IMODE(f.stat().st_mode) for f in files} == {want}
    assert stat.S_IMODE(c.stat().st_mode) == want | (want & 0o444) >> 2  # searchable where readable


def test_the_cache_takes_the_sources_group_or_drops_the_group_bits(tmp_path, monkeypatch):
    p = tmp_path / "s.txt"
    p.write_text("2 10 5\n0,2 1:0.5 4:2\n 0:1 9:3\n")
    p.chmod(0o640)
    other = os.getgid() + 4242
    try:
        os.chown(p, -1, other)
    except PermissionError:
        pytest.skip("cannot give the file another group here (not root)")
    read_xmc(p)
    c = Path(cache_path(p))
    assert {f.stat().st_gid for f in c.iterdir()} | {c.stat().st_gid} == {other}
    shutil.rmtree(c)

    def refuse(*a, **k):
        raise PermissionError("not a member of that group")

    monkeypatch.setattr(C.os, "chown", refuse)  # a user who is not in the source's group
    read_xmc(p)
    assert {stat.S_IMODE(f.stat().st_mode) & 0o070 for f in c.iterdir()} == {0}  # that group cannot read it


def test_a_same_size_rewrite_with_its_mtime_restored_is_not_served_from_the_cache(tmp_path):
    p = tmp_path / "s.txt"
    p.write_text("2 10 5\n0,2 1:0.5 4:2\n 0:1 9:3\n")
    assert read_xmc(p).X[0, 1] == np.float32(0.5)
    st = os.stat(p)
    p.write_text("2 10 5\n0,2 1:0.7 4:2\n 0:1 9:3\n")  # same size (cp -p, touch -r)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(p).st_size == st.st_size and os.stat(p).st_mtime_ns == st.st_mtime_ns
    assert read_xmc(p).X[0, 1] == np.float32(0.7)
    # and even with every time stamp alike (a file system that does not keep ctime), the digest of
    # its head and tail tells: the cache of the old bytes is not the new file's
    old = SimpleNamespace(st_size=st.st_size, st_mtime_ns=st.st_mtime_ns, st_ctime_ns=st.st_ctime_ns,
                          st_mode=st.st_mode, st_gid=st.st_gid)
    arrays, _ = D._parse(str(p), str(p))
    shutil.rmtree(cache_path(p))
    C._save_cache(cache_path(p), old, arrays)  # keyed on the new bytes' digest
    assert C._load_cache(cache_path(p), old) is not None
    p.write_text("2 10 5\n0,2 1:0.9 4:2\n 0:1 9:3\n")
    assert C._load_cache(cache_path(p), old) is None


@pytest.mark.parametrize("damage", ["nan", "inf", "unsorted", "repeated"])
def test_a_cache_with_non_finite_values_or_unsorted_indices_is_refused(tmp_path, damage):
    p = tmp_path / "s.txt"
    p.write_text("2 10 5\n0,2 1:0.5 4:2 7:1\n 0:1 9:3\n")
    good = read_xmc(p)
    c = Path(cache_path(p))
    if damage in ("nan", "inf"):
        x = np.load(c / "x_data.npy")
        x[1] = np.nan if damage == "nan" else np.inf
        np.save(c / "x_data.npy", x)
    else:
        i = np.load(c / "x_indices.npy")
        i[[0, 1]] = i[[1, 0]] if damage == "unsorted" else i[[0, 0]]
        np.save(c / "x_indices.npy", i)
    with pytest.warns(XMCCacheWarning, match="ignoring the unreadable cache"):
        d = read_xmc(p)
    assert np.array_equal(d.X.toarray(), good.X.toarray())


# -- 7. booleans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [("false", False), ("False", False), ("FALSE", False), ("0", False),
                                         ("true", True), ("True", True), ("1", True)])
def test_booleans_take_true_false_in_any_case_and_1_0(text, value, tmp_path):
    assert common.make_config(None, [f"exact={text}"]).exact is value
    assert common.make_config(None, [f"checkpoint_moments={text}"]).checkpoint_moments is value
    f = tmp_path / "c.toml"
    f.write_text(f'exact = "{text}"\n')
    assert common.make_config(str(f), []).exact is value


@pytest.mark.parametrize("text", ["yes", "no", "2", "-1", "0.0", "'maybe'", "[1]", "''"])
def test_anything_else_is_no_boolean(text):
    with pytest.raises(ValueError, match="exact = .* must be true or false"):
        common.make_config(None, [f"exact={text}"])


def test_exact_false_keeps_the_lsh_output_layer(data, tmp_path):
    cfg = common.make_config(None, ["exact=False", "kinds=dense,lsh", "hidden=16"]).resolve(500)
    assert cfg.exact is False and cfg.layer_kind(1, 500) == "lsh"


# -- 8. user errors are one line, and memory is checked before allocating -----------------------------


def test_a_model_larger_than_the_memory_available_is_refused_with_both_figures(data, tmp_path, capsys, monkeypatch):
    from dslide import memory

    cfg = common.make_config(None, ["hidden=16", "batch_size=32", "epochs=1"]).resolve(500)
    need = memory.account(cfg, 1000, 500, threads=session._threads_of(cfg))["peak"] + 4 * 8 * 500
    monkeypatch.setattr(memory, "available_bytes", lambda: need // 2)
    code, _, err = run(["train", "--train", str(data.a), "--out", str(tmp_path / "r"), "--set", "epochs=1", *S],
                       capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"needs {need / 2**20:,.1f} MiB of memory on {socket.gethostname()}" in err
    assert f"but {need // 2 / 2**20:,.1f} MiB is available" in err
    assert not (tmp_path / "r").exists()
    monkeypatch.setenv("DSLIDE_MEMORY_CHECK", "off")
    code, _, err = run(["train", "--train", str(data.a), "--out", str(tmp_path / "r"), "--set", "epochs=1", *S],
                       capsys)
    assert code == 0, err


# -- 9. eval prints first and writes only where it can -------------------------------------------------


def test_eval_prints_its_figures_even_where_it_cannot_write_them(trained, data, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained, model)
    (model / "metrics.json").unlink()
    (model / "metrics.json").mkdir()  # where the file would go, nothing can be written
    code, out, err = run(["eval", "--model", str(model), "--data", str(data.a_test)], capsys)
    assert code == 0
    assert out.startswith("P@1 ") and "nDCG@1" in out
    assert f"not saved in {model / 'metrics.json'}" in err and "--out FILE" in err
    assert sorted(p.name for p in model.iterdir()) == sorted(p.name for p in trained.iterdir())  # no leftovers
    code, out2, err = run(["eval", "--model", str(model), "--data", str(data.a_test), "--out",
                           str(tmp_path / "m.json")], capsys)
    assert code == 0 and out2.splitlines()[0] == out.splitlines()[0]
    saved = strict_json((tmp_path / "m.json").read_text())
    assert saved["model"] == str(model) and f"P@1 {saved['eval']['p@1']:.4f}" in out


def test_eval_does_not_write_into_a_run_another_process_holds(trained, data, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained, model)
    before = (model / "metrics.json").read_bytes()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        _write_lock(model, pid=sleeper.pid, host=socket.gethostname())
        code, out, err = run(["eval", "--model", str(model), "--data", str(data.a_test)], capsys)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 0 and out.startswith("P@1 ") and "is in use by dslide train" in err
    assert (model / "metrics.json").read_bytes() == before


# -- 10. row norms in float64 ---------------------------------------------------------------------------


def test_rows_near_float32s_maximum_are_normalised_not_zeroed():
    from dslide.model import inputs as I

    X = sp.csr_matrix(np.array([[3.0e38, 3.0e38, 0.0], [1.0, 0.0, 2.0]], dtype=np.float32))
    norms = I.input_norms(X, "l2")
    assert norms.dtype == np.float64 and np.isfinite(norms).all()
    batch = I.make_batch(I.csr_parts(X), None, np.arange(2), 1, norms=norms)
    xp, _, xd = batch.X
    for r in range(2):
        assert np.sqrt(np.sum(xd[xp[r]:xp[r + 1]].astype(np.float64) ** 2)) == pytest.approx(1.0, rel=1e-6)
    ref = I.normalise_inputs(X, "l2", np.float32)
    np.testing.assert_allclose(ref.data, xd, rtol=1e-7)


def test_huge_values_without_normalisation_stop_training_instead_of_ending_well(tmp_path, capsys):
    X = sp.csr_matrix(np.full((64, 20), 3.0e38, dtype=np.float32))
    Y = sp.csr_matrix(np.eye(64, 8, dtype=np.float32))
    f = tmp_path / "huge.txt"
    write_xmc(f, X, Y)
    code, _, err = run(["train", "--train", str(f), "--out", str(tmp_path / "none"), "--set", "input_norm=none",
                        "--set", "epochs=1", *S], capsys)
    assert code == 2 and re.search(r"the loss became (nan|inf|-inf) at step \d+ \(diverged\)", err), err
    code, _, err = run(["train", "--train", str(f), "--out", str(tmp_path / "l2"), "--set", "epochs=1", *S], capsys)
    assert code == 0, err
    assert math.isfinite(strict_json((tmp_path / "l2" / "log.jsonl").read_text().splitlines()[-1])["loss"])


# -- 11. a kernel cached under another module name is not loaded ------------------------------------


_WRONG_NAME = """
import sys, types
import numpy as np
pkg = types.ModuleType("lsh")  # the folder imported under a name not its own
pkg.__path__ = [sys.argv[1]]
sys.modules["lsh"] = pkg
import lsh.dwta
print(lsh.dwta.DWTA(16, 2, 3, 0).hash(np.ones((4, 16), np.float32)).shape)
"""

_RIGHT_NAME = """
import json
import numpy as np
import dslide.lsh as lsh
from dslide.lsh import dwta
codes = lsh.make_family("dwta", 16, 2, 3, 0).hash(np.ones((4, 16), np.float32))
f = dwta.dwta_hash
print(json.dumps([list(codes.shape), sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values())]))
"""


def test_a_kernel_cached_under_another_module_name_is_not_loaded(tmp_path):
    import importlib.util

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    folder = Path(importlib.util.find_spec("dslide.lsh").origin).parent  # the very files dslide.lsh runs
    p = subprocess.run([sys.executable, "-c", _WRONG_NAME, str(folder)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0 and p.stdout.strip() == "(4, 3)", p.stderr
    results = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", _RIGHT_NAME], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]  # not "No module named 'lsh'"
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
    assert results[0] == [[4, 3], 0, 1]  # the entry of module `lsh` was not loaded: compiled anew
    assert results[1] == [[4, 3], 1, 0]  # and that one is loaded next time


# -- 12. a stopped rank ends the run, named --------------------------------------------------------------


def _procs_with(marker: str) -> list:
    found = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and marker in (d / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(d.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
@pytest.mark.parametrize("ranks, stopped", [(2, 1), (3, 0)])
def test_a_stopped_rank_ends_every_rank_with_a_message_naming_it(data, tmp_path, ranks, stopped):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI_"))}
    env.update(faults.env(f"stop-rank{stopped}-step3"), NUMBA_NUM_THREADS="1")
    out = tmp_path / f"stall-{ranks}"
    t0 = time.monotonic()
    p = subprocess.run([str(MPIEXEC), "-n", str(ranks), sys.executable, "-m", "dslide", "train", "--train",
                        str(data.a), "--out", str(out), "--set", "stall_timeout=4", "--set", "epochs=3", *S],
                       env=env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0, p.stderr
    live = [r for r in range(ranks) if r != stopped]
    for r in live:
        assert (f"dslide (rank {r} of {ranks}): error: rank {stopped} stopped answering: " in p.stderr
                and "within stall_timeout = 4 s" in p.stderr), p.stderr
    assert "Traceback" not in p.stderr
    assert elapsed < 120
    time.sleep(1)
    assert not _procs_with(str(out)), "a rank is still there"


def test_without_a_stall_timeout_the_collectives_are_the_blocking_ones():
    assert Config().stall_timeout == 0.0 and Comm().stall_timeout == 0.0
    assert "stall_timeout" in cli_train.RESUME_SETTABLE
