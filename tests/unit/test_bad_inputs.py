"""Bad inputs, table-driven: data files, settings, manifests, run directories.

Every case is a `dslide` command a careless or hostile user could type. For
each one: exit status 2, exactly one line on stderr that names the culprit
(the file, the setting, the field, the directory), nothing on stdout, no
traceback, and nothing written: no file or directory created, changed or
removed anywhere under the case's directory or the shared data and run
(compared entry by entry: type, size, mtime, mode, content of small files).
"""

import gzip
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dslide import cli
from dslide.data import read_xmc

S = ["--set", "hidden=16", "--set", "epochs=1", "--set", "batch_size=32", "--quiet"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Shared inputs: tiny data (caches warm, so reading them writes nothing) and a trained run."""
    d = tmp_path_factory.mktemp("bad_inputs_world")
    assert cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "60",
                     "--out", str(d / "t")]) == 0
    other = d / "other.txt"  # 7 features: another shape than the model's
    other.write_text("1 7 500\n0 1:1\n")
    run = d / "run"
    assert cli.main(["train", "--train", str(d / "t_train.txt"), "--test", str(d / "t_test.txt"),
                     "--out", str(run), *S]) == 0
    for f in (d / "t_train.txt", d / "t_test.txt", other):
        read_xmc(f)  # the caches exist before any case runs
    sleeper = subprocess.Popen(["sleep", "600"])  # a live process for the lock cases
    yield {"dir": d, "train": d / "t_train.txt", "test": d / "t_test.txt", "other": other, "run": run,
           "live_pid": sleeper.pid}
    sleeper.kill()
    sleeper.wait()


def _text(tmp, name, text):
    p = tmp / name
    p.write_text(text)
    return p


def _run_copy(w, tmp):
    """A copy of the trained run to tamper with, and its checkpoint directory."""
    run = tmp / "run"
    shutil.copytree(w["run"], run)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    return run, ckpt


def _manifest(w, tmp, change):
    run, ckpt = _run_copy(w, tmp)
    m = json.loads((ckpt / "manifest.json").read_text())
    m = change(m)
    (ckpt / "manifest.json").write_text(json.dumps(m) if not isinstance(m, str) else m)
    return run


def _lock(run, **holder):
    run.mkdir(exist_ok=True)
    (run / "dslide.lock").write_text(json.dumps({"command": "dslide train", "since": "earlier", **holder}))


def _first_array(m):
    return next(iter(m["ranks"][0]["arrays"].values()))


def _set_file(m, value):
    _first_array(m)["file"] = value
    return m


def _set_dir(m, value):
    m["ranks"][0]["dir"] = value
    return m


def _truncated_gzip(w, tmp):
    raw = gzip.compress(w["train"].read_bytes())
    p = tmp / "t.txt.gz"
    p.write_bytes(raw[: len(raw) // 2])
    return p


def _train(w, data, *extra):
    return ["train", "--train", str(data), "--out", str(w["case"] / "new"), *S, *extra]


def _eval(w, model, data=None, *extra):
    return ["eval", "--model", str(model), "--data", str(data or w["test"]), *extra]


def _predict(w, model, k="3"):
    return ["predict", "--model", str(model), "--data", str(w["test"]), "--k", k, "--out", str(w["case"] / "p.txt")]


def _export(w, model):
    return ["export", "--model", str(model), "--out", str(w["case"] / "exported")]


# (case id, argv from the world and the case's directory, what the one line must name)
CASES = [
    # -- data files -------------------------------------------------------------------------
    ("data-missing", lambda w, t: _train(w, t / "nope.txt"), "--train {case}/nope.txt does not exist"),
    ("data-directory", lambda w, t: _train(w, t), "is a directory, expected a data file"),
    # (--format xmc: by its first line a file without an XMC header is read as headerless libsvm)
    ("data-empty-file", lambda w, t: _train(w, _text(t, "e.txt", ""), "--format", "xmc"), "e.txt:1: expected header"),
    ("data-bad-header", lambda w, t: _train(w, _text(t, "h.txt", "3 x 5\n"), "--format", "xmc"),
     "h.txt:1: expected header"),
    ("data-empty-file-detected", lambda w, t: _train(w, _text(t, "e.txt", "")), "--train {case}/e.txt holds no data points"),
    ("data-bad-header-detected", lambda w, t: _train(w, _text(t, "h.txt", "3 x 5\n")),
     "h.txt:1: expected 'feature:value', got 'x'"),
    ("data-bad-token", lambda w, t: _train(w, _text(t, "b.txt", "1 5 3\n0 1:abc\n")), "b.txt:2: expected 'feature:value'"),
    ("data-nan-value", lambda w, t: _train(w, _text(t, "n.txt", "1 5 3\n0 1:nan\n")), "n.txt:2"),
    ("data-huge-value", lambda w, t: _train(w, _text(t, "v.txt", "1 5 3\n0 1:1e39\n")), "v.txt:2: value in '1:1e39'"),
    ("data-label-range", lambda w, t: _train(w, _text(t, "l.txt", "1 5 3\n7 1:1\n")), "l.txt:2: label index 7"),
    ("data-feature-range", lambda w, t: _train(w, _text(t, "f.txt", "1 5 3\n0 9:1\n")), "f.txt:2: feature index 9"),
    ("data-header-count", lambda w, t: _train(w, _text(t, "c.txt", "3 5 3\n0 1:1\n")), "c.txt:1: the header says 3 points"),
    ("data-truncated-gzip", lambda w, t: _train(w, _truncated_gzip(w, t)), "t.txt.gz: corrupt or truncated gzip"),
    ("data-no-points", lambda w, t: _train(w, _text(t, "z.txt", "0 1000 500\n")), "--train {case}/z.txt holds no data points"),
    ("data-1e11-features", lambda w, t: _train(w, _text(t, "F.txt", "1 100000000000 5\n0 1:1\n")),
     "100,000,000,000 features"),
    ("data-4e9-labels", lambda w, t: _train(w, _text(t, "L.txt", "1 5 4000000000\n0 1:1\n")), "4,000,000,000 labels"),
    ("data-test-shape", lambda w, t: _train(w, w["train"], "--test", str(w["other"])), "--test {other} has 7 features"),
    ("data-eval-shape", lambda w, t: _eval(w, w["run"], w["other"]), "{other} has 7 features; the model was trained on 1000"),
    ("data-eval-no-points", lambda w, t: _eval(w, w["run"], _text(t, "z.txt", "0 1000 500\n")),
     "--data {case}/z.txt holds no data points"),
    # -- settings ---------------------------------------------------------------------------
    *[(f"set-{s.split('=')[0]}-{s.split('=')[1]}", (lambda s: lambda w, t: _train(w, w["train"], "--set", s))(s), m)
      for s, m in [
          ("lr=nan", "lr = nan must be a finite number in (0.0, 10.0]"),
          ("lr=inf", "lr = inf must be a finite number"),
          ("beta1=nan", "beta1 = nan must be a finite number"),
          ("eps=nan", "eps = nan must be a finite number"),
          ("dropout=nan", "dropout = nan must be a finite number"),
          ("propensity_a=nan", "propensity_a = nan must be a finite number"),
          ("lsh.growth=nan", "lsh.growth = nan must be a finite number"),
          ("auto_lsh_ratio=nan", "auto_lsh_ratio = nan must be a finite number"),
          ("stall_timeout=nan", "stall_timeout = nan must be a finite number"),
          ("stall_timeout=-1", "stall_timeout = -1 must be in [0.0, 1000000.0]"),
          ("exact=yes", "exact = 'yes' must be true or false (or 1 / 0)"),
          ("exact=2", "exact = 2 must be true or false"),
          ("checkpoint_moments=maybe", "checkpoint_moments = 'maybe' must be true or false"),
          ("hidden=1.5", "hidden = 1.5 must be a list of layer widths"),
          ("hidden=abc", "hidden = 'abc' must be a list of layer widths"),
          ("hidden=1000000000", "hidden [1000000000]"),
          ("lsh=5", "lsh = 5 must be a table of LSH settings"),
          ("lsh_layers=5", "lsh_layers = 5 must be a list"),
          ("kinds=5", "kinds = 5 must be a list of layer kinds"),
          ("lrr=1e-3", "unknown configuration key 'lrr'; did you mean 'lr'?"),
          ("lsh.KK=3", "unknown configuration key 'lsh.KK'"),
      ]],
    ("set-no-equals", lambda w, t: _train(w, w["train"], "--set", "lr"), "--set 'lr': expected key=value"),
    ("config-missing", lambda w, t: _train(w, w["train"], "--config", str(t / "c.toml")), "c.toml does not exist"),
    ("config-not-toml", lambda w, t: _train(w, w["train"], "--config", str(_text(t, "c.toml", "lr = = 3\n"))),
     "c.toml: not valid TOML"),
    ("k-zero", lambda w, t: _predict(w, w["run"], "0"), "--k 0 must be an integer in [1, 500]"),
    ("k-negative", lambda w, t: _predict(w, w["run"], "-1"), "--k -1 must be an integer in [1, 500]"),
    ("k-too-large", lambda w, t: _predict(w, w["run"], "100000000"), "--k 100000000 must be an integer in [1, 500]"),
    ("k-eval-zero", lambda w, t: _eval(w, w["run"], None, "--k", "0"), "--k 0 must be an integer in [1, 500]"),
    # -- manifests --------------------------------------------------------------------------
    ("manifest-list", lambda w, t: _eval(w, _manifest(w, t, lambda m: [1, 2])), "manifest.json is not a checkpoint manifest"),
    ("manifest-format-only", lambda w, t: _eval(w, _manifest(w, t, lambda m: {"format": 2})), "manifest.json lacks 'step'"),
    ("manifest-not-json", lambda w, t: _eval(w, _manifest(w, t, lambda m: "{not json")), "manifest.json is unreadable"),
    ("manifest-format-1", lambda w, t: _eval(w, _manifest(w, t, lambda m: {**m, "format": 1})), "has checkpoint format 1"),
    ("manifest-world-size", lambda w, t: _eval(w, _manifest(w, t, lambda m: {**m, "world_size": 3})),
     "says 3 ranks but lists 1"),
    ("manifest-step-type", lambda w, t: _eval(w, _manifest(w, t, lambda m: {**m, "step": "x"})), "step = \"x\" is not valid"),
    ("manifest-bad-config", lambda w, t: _eval(w, _manifest(w, t, lambda m: {**m, "config": {**m["config"], "lr": "x"}})),
     "its configuration is not valid: lr = 'x' must be a number"),
    ("manifest-dir-escape-export", lambda w, t: _export(w, _manifest(w, t, lambda m: _set_dir(m, "../../../escape"))),
     "ranks[0].dir '../../../escape' is not a plain name"),
    ("manifest-dir-absolute-export", lambda w, t: _export(w, _manifest(w, t, lambda m: _set_dir(m, str(t / "abs")))),
     "is not a plain name inside the checkpoint directory"),
    ("manifest-file-escape-eval", lambda w, t: _eval(w, _manifest(w, t, lambda m: _set_file(m, "../../x.npy"))),
     "file '../../x.npy' is not a plain name"),
    ("manifest-file-escape-predict", lambda w, t: _predict(w, _manifest(w, t, lambda m: _set_file(m, "../../x.npy"))),
     "file '../../x.npy' is not a plain name"),
    ("manifest-dtype", lambda w, t: _eval(w, _manifest(w, t, lambda m: (_first_array(m).update(dtype="|O"), m)[1])),
     "is not valid; expected a plain numpy dtype"),
    ("latest-escape", lambda w, t: (lambda run: (_text(run / "checkpoints", "LATEST", "../../elsewhere\n"),
                                                  _eval(w, run))[1])(_run_copy(w, t)[0]),
     "LATEST: the checkpoint name '../../elsewhere' is not a plain name"),
    ("latest-missing-checkpoint", lambda w, t: (lambda run: (_text(run / "checkpoints", "LATEST", "step-000000999\n"),
                                                              _eval(w, run))[1])(_run_copy(w, t)[0]),
     "LATEST names step-000000999, which has no manifest.json"),
    ("rank-dir-symlink-out", lambda w, t: (lambda rc: (shutil.move(str(rc[1] / "rank-0000"), str(t / "outside")),
                                                      os.symlink(t / "outside", rc[1] / "rank-0000"),
                                                      _eval(w, rc[0]))[2])(_run_copy(w, t)),
     "rank directory 'rank-0000' leads outside"),
    ("array-file-missing", lambda w, t: (lambda rc: (os.unlink(rc[1] / "rank-0000" / "layer0.W.npy"),
                                                    _eval(w, rc[0]))[1])(_run_copy(w, t)),
     "lists rank-0000/layer0.W.npy, which is missing"),
    # -- run directories --------------------------------------------------------------------
    ("run-exists", lambda w, t: ["train", "--train", str(w["train"]), "--out", str(_run_copy(w, t)[0]), *S],
     "--out {case}/run already holds a run"),
    ("run-locked-live", lambda w, t: (_lock(t / "r", pid=w["live_pid"], host=socket.gethostname()),
                                      ["train", "--train", str(w["train"]), "--out", str(t / "r"), *S])[1],
     "{case}/r is in use by dslide train (pid {live_pid}"),
    ("run-locked-other-host", lambda w, t: (_lock(t / "r", pid=1, host="elsewhere.example"),
                                            ["train", "--train", str(w["train"]), "--out", str(t / "r"), *S])[1],
     "on host elsewhere.example"),
    ("run-resume-locked", lambda w, t: (lambda run: (_lock(run, pid=w["live_pid"], host=socket.gethostname()),
                                                     ["train", "--train", str(w["train"]), "--resume", str(run),
                                                      "--quiet"])[1])(_run_copy(w, t)[0]),
     "{case}/run is in use by dslide train"),
    ("run-out-is-a-file", lambda w, t: _train(w, w["train"])[:4] + [str(_text(t, "f", "x"))] + S,
     "--out {case}/f exists and is not a directory"),
    ("run-resume-and-overwrite", lambda w, t: ["train", "--train", str(w["train"]), "--resume", str(w["run"]),
                                               "--overwrite"], "--resume continues the run"),
    ("run-resume-other-out", lambda w, t: ["train", "--train", str(w["train"]), "--resume", str(w["run"]),
                                           "--out", str(t / "x")], "names another"),
    ("run-resume-missing", lambda w, t: ["train", "--train", str(w["train"]), "--resume", str(t / "gone")],
     "run directory {case}/gone does not exist"),
    ("run-resume-changes-shape", lambda w, t: ["train", "--train", str(w["train"]), "--resume", str(w["run"]),
                                               "--set", "hidden=32"], "only checkpoint_every"),
    ("run-resume-other-data", lambda w, t: ["train", "--train", str(w["other"]), "--resume", str(w["run"])],
     "--train {other} has 7 features and 500 labels; the run in {run} was trained on 1,000 and 500"),
    ("eval-no-checkpoint", lambda w, t: _eval(w, (t / "empty").mkdir() or t / "empty"), "holds no checkpoint"),
    ("export-not-empty", lambda w, t: (_text((t / "exported").mkdir() or t / "exported", "x", "x"),
                                       _export(w, w["run"]))[1], "{case}/exported exists and is not empty"),
]


def _snapshot(*roots) -> dict:
    """Every entry under the roots: type, size, mode, and for files mtime and (small ones) content."""
    out = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                entry = (stat.S_IFMT(st.st_mode), st.st_mode)
                if stat.S_ISREG(st.st_mode):
                    entry += (st.st_size, st.st_mtime_ns, Path(p).read_bytes() if st.st_size < 1 << 16 else None)
                elif stat.S_ISLNK(st.st_mode):
                    entry += (os.readlink(p),)
                out[p] = entry
    return out


@pytest.mark.parametrize("case, argv_of, culprit", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_exits_2_with_one_line_naming_it_and_writes_nothing(case, argv_of, culprit, world, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a default output (runs/...) would land here, inside the snapshot
    w = {**world, "case": tmp_path}
    argv = argv_of(w, tmp_path)
    before = _snapshot(tmp_path, world["dir"])
    capsys.readouterr()
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dslide: error: "), err
    want = culprit.format(case=tmp_path, other=world["other"], live_pid=world["live_pid"], run=world["run"])
    assert want in lines[0], (want, lines[0])
    assert out == "", out
    after = _snapshot(tmp_path, world["dir"])
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, changed
    assert not any(p.name == "escape" for p in tmp_path.parents[0].iterdir())  # nothing beside the case either


def test_the_suite_holds_in_a_process_of_its_own(world, tmp_path):
    """The same contract from the outside: a fresh `python -m dslide` (warnings, exit status and all)."""
    p = subprocess.run([sys.executable, "-m", "dslide", "train", "--train", str(world["train"]), "--out",
                        str(tmp_path / "r"), "--set", "lr=nan"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == ["dslide: error: lr = nan must be a finite number in (0.0, 10.0]"]
    assert not (tmp_path / "r").exists()
