"""Bad inputs, table-driven: data files, settings, manifests, run directories.

Every case is a `dslide` command a careless or hostile user could type. For
each one: exit status 2, exactly one line on stderr that names the culprit
(the file, the setting, the field, the directory), nothing on stdout, no
traceback, and nothing written: no file or directory created, changed or
removed anywhere under the case's directory or the shared data and run
(compared entry by entry: type, size, mtime, mode, content of small files).
"""

import gzip
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dslide import cli
from tests.conftest import run_cli  # noqa: E402
from dslide.io.data import read_xmc

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
    knn_run = d / "knn_run"  # with a neighbour store (knn.*) and an inference index (index.*, nn.*)
    assert cli.main(["train", "--train", str(d / "t_train.txt"), "--out", str(knn_run), *S, "--set", "knn=5", "--set", "knn_weight=0.6", "--set", "proto_weight=0.5",
                     "--set", 'kinds=["dense","lsh"]', "--set", "lsh.index_anchors=16",
                     "--set", "lsh.index_points=300", "--set", "lsh.index_min_width=0"]) == 0
    for f in (d / "t_train.txt", d / "t_test.txt", other):
        read_xmc(f)  # the caches exist before any case runs
    sleeper = subprocess.Popen(["sleep", "600"])  # a live process for the lock cases
    yield {"dir": d, "train": d / "t_train.txt", "test": d / "t_test.txt", "other": other, "run": run,
           "knn_run": knn_run, "live_pid": sleeper.pid}
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


def _npz(tmp, change, name="X.bad.npz", labels=None):
    """A features file (save_npz's csr arrays, 2 points of 1000 features) edited by change(parts)
    and, beside it, its labels file (`labels`: its csr parts over 500 labels)."""
    parts = {"data": np.ones(3, np.float32), "indices": np.array([1, 5, 7], np.int32),
             "indptr": np.array([0, 2, 3], np.int32), "format": np.array(b"csr"), "shape": np.array([2, 1000])}
    change(parts)
    np.savez(tmp / name, **parts)
    y = {"data": np.ones(2, np.float32), "indices": np.array([3, 4], np.int32), "indptr": np.array([0, 1, 2], np.int32),
         "format": np.array(b"csr"), "shape": np.array([2, 500]), **(labels or {})}
    np.savez(tmp / ("Y" + name[1:]), **y)
    return tmp / name


def _set(key, value):
    return lambda p: p.__setitem__(key, value) if not callable(value) else value(p[key])


def _tamper(w, tmp, key, change):
    """A copy of the run with neighbours whose array `key` is edited by change(a) and its manifest's
    SHA-256 rewritten to match: the hash proves the files match the manifest, not that they are sane."""
    run = tmp / "run"
    shutil.copytree(w["knn_run"], run)
    ckpt = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    m = json.loads((ckpt / "manifest.json").read_text())
    entry = m["ranks"][0]["arrays"][key]
    f = ckpt / m["ranks"][0]["dir"] / entry["file"]
    a = np.load(f).copy()
    out = change(a)
    a = a if out is None else out
    np.save(f, a)
    entry.update(sha256=hashlib.sha256(f.read_bytes()).hexdigest(), shape=list(a.shape),
                 dtype=np.lib.format.dtype_to_descr(a.dtype))
    (ckpt / "manifest.json").write_text(json.dumps(m))
    return run


def _edit(index, value):
    def change(a):
        a[index] = value
    return change


def _not_a_run(tmp):
    """A project directory that never held a dslide run, with files named as a run's are."""
    (tmp / "proj" / "checkpoints").mkdir(parents=True)
    (tmp / "proj" / "checkpoints" / "model.pt").write_text("w")
    (tmp / "proj" / "config.toml").write_text("c")
    return tmp / "proj"


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
    # -- npz data: checked before any kernel reads an index (dslide.validate) ------------------
    ("npz-feature-index-1e7", lambda w, t: _train(w, _npz(t, lambda p: p["indices"].__setitem__(0, 10**7))),
     "X.bad.npz: feature index 10000000 (row 0) is not in [0, 1000)"),
    ("npz-feature-index-negative", lambda w, t: _train(w, _npz(t, lambda p: p["indices"].__setitem__(0, -5))),
     "X.bad.npz: feature index -5 (row 0) is not in [0, 1000)"),
    ("npz-indptr-decreasing", lambda w, t: _train(w, _npz(t, lambda p: p["indptr"].__setitem__(1, 4))),
     "X.bad.npz: indptr decreases at row 1"),
    ("npz-indptr-past-the-end", lambda w, t: _train(w, _npz(t, lambda p: p["indptr"].__setitem__(2, 9))),
     "X.bad.npz: indptr ends at 9; expected 3"),
    ("npz-nan-value", lambda w, t: _train(w, _npz(t, lambda p: p["data"].__setitem__(1, np.nan))),
     "X.bad.npz: value nan (entry 1) is not a finite number"),
    ("npz-float64-beyond-float32", lambda w, t: _train(w, _npz(t, lambda p: p.__setitem__("data", np.array([1, 1e39, 1])))),
     "X.bad.npz: value 1e+39 (entry 1) is beyond float32's range"),
    ("npz-label-id-range", lambda w, t: _train(w, _npz(t, lambda p: None, labels={"indices": np.array([3, 10**6])})),
     "Y.bad.npz: label id 1000000 (row 1) is not in [0, 500)"),
    ("npz-eval-feature-index", lambda w, t: _eval(w, w["run"], _npz(t, lambda p: p["indices"].__setitem__(2, 10**7))),
     "X.bad.npz: feature index 10000000 (row 1)"),
    # -- model directories: every array a kernel indexes with is checked, whatever its hash ------
    *[(f"model-{key.replace('/', '.')}", (lambda key, ch: lambda w, t: _eval(w, _tamper(w, t, key, ch)))(key, ch), m)
      for key, ch, m in [
          ("neighbours/post_ptr", _edit(3, 10**6), "the neighbour store: knn.post_ptr decreases at row 3"),
          ("neighbours/post_pt", _edit(0, 10**6), "the neighbour store: knn.post_pt: point id 1000000 (entry 0) is not in [0, 300)"),
          ("neighbours/y_idx", _edit(0, -1), "the neighbour store: knn.y_idx: label id -1 (entry 0) is not in [0, 500)"),
          ("neighbours/share", _edit(0, np.nan), "the neighbour store: knn.share: value nan (entry 0) is not a finite number"),
          ("index/nn.graph", _edit((0, 0), 10**6), "nn.graph: point id 1000000 (entry 0) is not in [-1, 300)"),
          ("index/nn.cell_ptr", _edit(2, 10**6), "nn.cell_ptr decreases at row 2"),
          ("index/buckets", _edit((0, 0, 0), 10**6), "index.buckets: id 1000000 (entry 0) is not in [0, 500)"),
          ("index/fill", _edit((0, 0), 10**6), "index.fill: bucket fill 1000000 (entry 0)"),
      ]],
    ("model-knn.share-above-1", lambda w, t: _eval(w, _tamper(w, t, "neighbours/share", lambda a: np.array([2.0]))),
     "the neighbour store: knn.share = 2.0 is not in [0.0, 1.0]"),
    ("model-knn.temperature-0", lambda w, t: _eval(w, _tamper(w, t, "neighbours/temperature", lambda a: np.array([0.0]))),
     "the neighbour store: knn.temperature = 0.0 is not in [0.01, 100.0]"),
    # -- nothing destroys what is not its own ---------------------------------------------------
    ("overwrite-not-a-run", lambda w, t: ["train", "--train", str(w["train"]), "--out", str(_not_a_run(t)), *S,
                                          "--overwrite"], "--out {case}/proj is not empty (checkpoints, config.toml) "
                                                          "and holds no dslide run"),
    ("convert-onto-own-labels", lambda w, t: ["data", "convert", str(_npz(t, lambda p: None, name="X.in.npz")),
                                              str(t / "Y.in.npz")], "output {case}/Y.in.npz is also an input"),
    ("convert-onto-itself", lambda w, t: ["data", "convert", str(_text(t, "s.svm", "1 0:1\n")), str(t / "s.svm"),
                                          "--out-format", "xmc"], "output {case}/s.svm is also an input"),
    ("predict-out-is-data", lambda w, t: ["predict", "--model", str(w["run"]), "--data", str(w["test"]), "--k", "3",
                                          "--out", str(w["test"])], "--out {test} is also an input"),
    ("predict-out-is-latest", lambda w, t: ["predict", "--model", str(w["run"]), "--data", str(w["test"]), "--k", "3",
                                            "--out", str(w["run"] / "checkpoints" / "LATEST")],
     "lies in the checkpoints of the run in {run}"),
    ("eval-out-is-a-manifest", lambda w, t: _eval(w, w["run"], None, "--out", str(
        next((w["run"] / "checkpoints").glob("step-*")) / "manifest.json")), "lies in the checkpoints of the run"),
    ("eval-out-is-config", lambda w, t: _eval(w, w["run"], None, "--out", str(w["run"] / "config.toml")),
     "--out {run}/config.toml is also an input"),
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
    # -- refused before the run directory is made: the layout, data without labels -------------
    ("set-replicas-2-on-1-rank", lambda w, t: _train(w, w["train"], "--set", "replicas=2"),
     "world size (1) is not divisible by replicas (2)"),
    ("set-shard-weights-3-on-1-rank", lambda w, t: _train(w, w["train"], "--set", "shard_weights=1,2,3"),
     "shard_weights has 3 entries but a replica has 1 ranks"),
    ("split-without-labels", lambda w, t: _train(w, _text(t, "trn_X_Xf.txt", "2 5\n0:1 1:0.5\n2:1\n")),
     "--train {case}/trn_X_Xf.txt has 0 labels (its labels file trn_X_Y.txt is missing beside it)"),
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
    ("manifest-bad-config", lambda w, t: _eval(w, _manifest(w, t, lambda m: {
        **m, "config": {**m["config"], "train": {**m["config"]["train"], "lr": "x"}}})),
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
    ("run-resume-0-steps", lambda w, t: ["train", "--train", str(w["train"]), "--resume", str(_run_copy(w, t)[0]),
                                         "--quiet"], "the run is at step 10 and 1 epoch(s) of 300 points end at step 10, "
                                                     "so it would train no step; give more epochs"),
    ("run-resume-fewer-epochs", lambda w, t: ["train", "--train", str(w["train"]), "--resume",
                                              str(_run_copy(w, t)[0]), "--set", "epochs=0.5", "--quiet"],
     "so it would train no step; give more epochs to continue it (--set epochs=2 or more)"),
    ("run-lock-is-a-directory", lambda w, t: ((t / "r" / "dslide.lock").mkdir(parents=True),
                                              ["train", "--train", str(w["train"]), "--out", str(t / "r"), *S])[1],
     "{case}/r/dslide.lock is a directory, not a lock dslide wrote; if no run uses {case}/r, remove it"),
    ("data-device", lambda w, t: _train(w, "/dev/null"), "--train /dev/null is not a regular file (a pipe or a device)"),
    ("predict-out-no-directory", lambda w, t: ["predict", "--model", str(w["run"]), "--data", str(w["test"]), "--k", "3",
                                               "--out", str(t / "nodir" / "p.txt")],
     "--out {case}/nodir/p.txt: its directory {case}/nodir does not exist"),
    ("convert-into-no-directory", lambda w, t: ["data", "convert", str(w["test"]), str(t / "nodir" / "trn_X_Xf.txt")],
     "output {case}/nodir/trn_X_Xf.txt: its directory {case}/nodir does not exist"),
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
    code, out, err = run_cli(argv, capsys)
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("dslide: error: "), err
    want = culprit.format(case=tmp_path, other=world["other"], live_pid=world["live_pid"], run=world["run"],
                          test=world["test"])
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


# -- the API: matrices, label lists, the communicator, save -------------------------------------


@pytest.fixture(scope="module")
def model(world):
    import dslide

    return dslide.Model.load(world["run"])


def _csr(values, indices, indptr, shape=(2, 1000)):
    return sp.csr_matrix((np.asarray(values), np.asarray(indices), np.asarray(indptr)), shape=shape)


@pytest.mark.parametrize("X, message", [
    (_csr(np.ones(2, np.float32), [5, 10**7], [0, 1, 2]), "X: feature index 10000000 (row 1) is not in [0, 1000)"),
    (_csr(np.ones(2, np.float32), [5, -5], [0, 1, 2]), "X: feature index -5 (row 1) is not in [0, 1000)"),
    (_csr([1.0, np.nan], [5, 6], [0, 1, 2]), "X: value nan (entry 1) is not a finite number"),
    (_csr([1.0, np.inf], [5, 6], [0, 1, 2]), "X: value inf (entry 1) is not a finite number"),
    (_csr([1.0, 1e39], [5, 6], [0, 1, 2]), "beyond float32's range"),
    (_csr([1.0, 1j], [5, 6], [0, 1, 2]), "X is complex"),
    (_csr(np.ones(2, np.float32), [5, 6], [0, 1, 2], shape=(2, 2000)), "data has 2000 features"),
], ids=["index-1e7", "index-negative", "nan", "inf", "beyond-float32", "complex", "wider"])
def test_predict_refuses_a_crafted_matrix(model, X, message):
    with pytest.raises(ValueError) as e:
        model.predict(X, k=3)
    assert message in str(e.value)


def test_predict_refuses_a_crafted_indptr(model):
    X = _csr(np.ones(2, np.float32), [5, 6], [0, 1, 2])
    X.indptr[1] = 5  # past the entries: the kernel would read beyond them
    with pytest.raises(ValueError, match=r"X: indptr decreases at row 1 \(5 -> 2\)"):
        model.predict(X, k=3)


def test_predict_sums_duplicates_as_scipy_means_them(model, world):
    from dslide.io.data import read_xmc

    X = sp.csr_matrix(read_xmc(world["test"]).X[:40])
    # every row's entries twice, the copies reversed (unsorted): scipy's meaning is their sum, 2 X
    halves = [(X.indices[a:b], X.data[a:b]) for a, b in zip(X.indptr[:-1], X.indptr[1:])]
    dup = sp.csr_matrix((np.concatenate([np.concatenate([v, v[::-1] * 0.5]) for _, v in halves]),
                         np.concatenate([np.concatenate([i, i[::-1]]) for i, _ in halves]), X.indptr * 2),
                        shape=X.shape)
    ref = dup.copy()
    ref.sum_duplicates()
    want_ids, want_scores = model.predict(ref, k=5)
    ids, scores = model.predict(dup, k=5)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(scores, want_scores)


@pytest.mark.parametrize("Y, message", [
    (["499"], "Y[0] = '499' is a string"),
    ([[1.7, 2.2]], "holds a label that is not an integer"),
    ([[True, False]], "got booleans"),
    ([[2**40]], "labels are integers in [0, 2147483646]"),
    ([[-1]], "holds label -1"),
], ids=["string", "fractions", "booleans", "2**40", "negative"])
def test_label_lists_are_refused_not_converted(Y, message):
    from dslide.api import labels_matrix

    with pytest.raises(ValueError) as e:
        labels_matrix(Y, 1)
    assert message in str(e.value)


def test_stored_zeros_in_Y_are_no_labels_and_duplicates_count_once(tmp_path):
    from dslide.api import labels_matrix
    from dslide.io import formats

    Y = sp.csr_matrix((np.array([1.0, 0.0, 2.0, 0.0]), np.array([3, 1, 3, 4]), np.array([0, 3, 4])), shape=(2, 5))
    ref = Y.copy()
    ref.sum_duplicates()
    ref.eliminate_zeros()  # scipy's matrix: labels where it is non-zero
    want = (ref != 0).astype(np.float32).toarray()
    np.testing.assert_array_equal(labels_matrix(Y, 2).toarray(), want)
    sp.save_npz(tmp_path / "Y.z.npz", Y)
    sp.save_npz(tmp_path / "X.z.npz", sp.csr_matrix(np.eye(2, 3, dtype=np.float32)))
    np.testing.assert_array_equal(formats.read_data(str(tmp_path / "X.z.npz")).Y.toarray(), want)


def test_api_arguments_of_the_wrong_kind_are_value_errors(world):
    import dslide
    from dslide.io.data import read_xmc

    with pytest.raises(ValueError, match="comm = 'world' must be a dslide.comm.Comm"):
        dslide.Model(comm="world")
    train = read_xmc(world["train"])
    with pytest.raises(ValueError, match=r"n_labels = 500.7 must be an integer"):
        dslide.Model(hidden=[16], epochs=1).fit(train.X, [[1]] * train.n_points, n_labels=500.7)


def test_save_over_a_run_refuses_unless_told_and_never_replaces_what_is_not_a_run(model, world, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    before = _snapshot(run)
    with pytest.raises(ValueError, match=r"run_dir .* already holds a run .*overwrite=True"):
        model.save(run)
    assert _snapshot(run) == before  # not a byte changed, no lock left
    proj = _not_a_run(tmp_path)
    before = _snapshot(proj)
    with pytest.raises(ValueError, match="holds no dslide run"):
        model.save(proj, overwrite=True)
    assert _snapshot(proj) == before
    (run / "notes.txt").write_text("mine")
    model.save(run, overwrite=True)  # a run: replaced, its old log and metrics gone, other files kept
    assert not (run / "log.jsonl").exists() and not (run / "metrics.json").exists()
    assert (run / "notes.txt").read_text() == "mine" and len(list((run / "checkpoints").glob("step-*"))) == 1


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_a_bad_thread_count_is_one_line(value, world):
    env = {**os.environ, "NUMBA_NUM_THREADS": value}
    p = subprocess.run([sys.executable, "-m", "dslide", "eval", "--model", str(world["run"]), "--data",
                        str(world["test"])], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [f"dslide: error: NUMBA_NUM_THREADS={value!r} must be a positive "
                                             f"integer (the threads of each process); unset it for one per core"]
