"""The PyTorch reference (scripts/bench_vs_torch.py, scripts/_torch_train.py).

The data exchange needs no torch. The trainer's checks run only where
`.venv-baselines` already imports torch (the tests never install it): a few Adam
steps of the PyTorch network must equal a plain-numpy forward, backward and
Adam from the same initial weights, and its P@k must equal a numpy top-k.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from dslide.io.data import XMCData

from scripts import bench_vs_torch as bvt
from scripts import measure as M

ROOT = Path(__file__).resolve().parents[2]


def _torch_python():
    py, info = bvt.torch_python(install=False)
    if py is None:
        pytest.skip(f"no usable {bvt.TORCH_VENV} ({info}); `python -m scripts.bench_vs_torch` makes it")
    return py


def _random_data(rng, n, n_features, n_labels, empty_x=(), empty_y=()) -> XMCData:
    """Points with 1-6 features (positive values) and 1-3 labels; rows in `empty_x`/`empty_y` have none."""
    X = np.zeros((n, n_features), dtype=np.float32)
    Y = np.zeros((n, n_labels), dtype=np.float32)
    for i in range(n):
        if i not in empty_x:
            f = rng.choice(n_features, size=rng.integers(1, 7), replace=False)
            X[i, f] = rng.uniform(0.5, 3.0, size=f.size)
        if i not in empty_y:
            Y[i, rng.choice(n_labels, size=rng.integers(1, 4), replace=False)] = 1
    return XMCData(sp.csr_matrix(X), sp.csr_matrix(Y))


# --------------------------------------------------------------------------- data exchange (no torch)


def test_npz_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(3)
    n, F, L = 40, 300, 70
    X = sp.random(n, F, density=0.05, format="csr", random_state=4, dtype=np.float32)
    # arbitrary float32 bit patterns (subnormals, huge, negative), no NaN/inf
    bits = rng.integers(0, 2**32, size=X.nnz, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    vals[~np.isfinite(vals)] = 1.5
    X.data = vals
    keep = np.ones(n, dtype=np.float32)
    keep[7] = 0  # a point without features
    X = (sp.diags(keep) @ X).tocsr()
    X.eliminate_zeros()
    Y = sp.random(n, L, density=0.04, format="csr", random_state=5, dtype=np.float32)
    Y.data[:] = 1
    keep[:] = 1
    keep[9] = 0  # a point without labels
    Y = (sp.diags(keep) @ Y).tocsr()
    Y.eliminate_zeros()
    data = XMCData(X, Y)
    path = tmp_path / "d.npz"
    bvt.export_npz(data, path)

    with np.load(path) as f:
        assert sorted(f.files) == ["data", "indices", "indptr", "shape", "y_indices", "y_indptr"]
        assert f["shape"].tolist() == [n, F, L]
        assert f["data"].dtype == np.float32 and f["indptr"].dtype == np.int64
    back = bvt.import_npz(path)
    assert (back.n_points, back.n_features, back.n_labels) == (n, F, L)
    for a, b in ((back.X, X), (back.Y, Y)):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_array_equal(a.indptr, b.indptr)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.data.view(np.uint32), b.data.view(np.uint32))
    assert back.X.getnnz(axis=1)[7] == 0 and back.Y.getnnz(axis=1)[9] == 0


def test_export_rejects_non_binary_labels(tmp_path):
    Y = sp.csr_matrix(np.array([[0, 2.0], [1, 0]], dtype=np.float32))
    X = sp.csr_matrix(np.eye(2, dtype=np.float32))
    with pytest.raises(ValueError, match="2.0"):
        bvt.export_npz(XMCData(X, Y), tmp_path / "bad.npz")
    with pytest.raises(ValueError, match="rows"):
        bvt.export_npz(XMCData(X, Y[:1]), tmp_path / "bad.npz")


def test_run_torch_without_torch_is_unavailable(tmp_path):
    # The project's own venv must not have torch; that is the point of .venv-baselines.
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{sys.executable} imports torch")
    data = _random_data(np.random.default_rng(0), 8, 10, 3)
    r = bvt.run_torch(data, data, workdir=tmp_path, python=sys.executable)
    assert r["available"] is False
    assert "torch" in r["reason"] and sys.executable in r["reason"]
    assert not list(tmp_path.iterdir())  # nothing exported when there is nothing to run
    json.dumps(r)  # machine-readable


def test_run_torch_checks_options(tmp_path):
    data = _random_data(np.random.default_rng(0), 8, 10, 3)
    with pytest.raises(ValueError, match=r"batch_size \(0\)"):
        bvt.run_torch(data, data, batch_size=0, workdir=tmp_path, python=sys.executable)
    with pytest.raises(ValueError, match=r"dropout \(1.0\)"):
        bvt.run_torch(data, data, dropout=1.0, workdir=tmp_path, python=sys.executable)
    with pytest.raises(ValueError, match="PASSIVE"):
        bvt.run_torch(data, data, omp_wait_policy="passive", workdir=tmp_path, python=sys.executable)


def test_time_to():
    log = [{"wall_s": 1.0, "loss": 3.0}, {"wall_s": 2.0, "p@1": 0.5}, {"wall_s": 3.5, "p@1": 0.8},
           {"wall_s": 4.0, "p@1": 0.9}]
    assert M.time_to(log, 0.75) == 3.5
    assert M.time_to(log, 0.95) is None


# --------------------------------------------------------------------------- the trainer vs numpy


def _numpy_adam_steps(X, Y, W, *, steps, batch_size, lr, seed, beta1=0.9, beta2=0.999, eps=1e-8):
    """Plain-numpy replay of the trainer: returns (losses per step, final weights).

    X dense float64 [n, F] (rows already L2-normalised), Y dense 0/1 [n, L];
    W: W1 [F, H], b1 [H], W2 [L, H], b2 [L]. Full softmax, targets 1/|labels|,
    loss mean over the batch; dense Adam with bias correction.
    """
    W = {k: v.astype(np.float64).copy() for k, v in W.items()}
    m = {k: np.zeros_like(v) for k, v in W.items()}
    v = {k: np.zeros_like(v) for k, v in W.items()}
    n = X.shape[0]
    per_epoch = -(-n // batch_size)
    losses = []
    for t in range(1, steps + 1):
        epoch, pos = divmod(t - 1, per_epoch)
        ids = np.random.default_rng([seed, 0x5EED, epoch]).permutation(n)[pos * batch_size:(pos + 1) * batch_size]
        x, y = X[ids], Y[ids]
        B = len(ids)
        count = y.sum(axis=1, keepdims=True)
        T = np.divide(y, count, out=np.zeros_like(y), where=count > 0)
        pre = x @ W["W1"] + W["b1"]
        h = np.maximum(pre, 0.0)
        z = h @ W["W2"].T + W["b2"]
        zmax = z.max(axis=1, keepdims=True)
        logp = z - zmax - np.log(np.exp(z - zmax).sum(axis=1, keepdims=True))
        losses.append(-(T * logp).sum() / B)
        dz = (np.exp(logp) * T.sum(axis=1, keepdims=True) - T) / B
        dpre = (dz @ W["W2"]) * (pre > 0)
        grads = {"W2": dz.T @ h, "b2": dz.sum(axis=0), "W1": x.T @ dpre, "b1": dpre.sum(axis=0)}
        for k, g in grads.items():
            m[k] = beta1 * m[k] + (1 - beta1) * g
            v[k] = beta2 * v[k] + (1 - beta2) * g * g
            mhat = m[k] / (1 - beta1 ** t)
            vhat = v[k] / (1 - beta2 ** t)
            W[k] -= lr * mhat / (np.sqrt(vhat) + eps)
    return losses, W


def _numpy_precision(X, Y, W, k_max=5):
    z = np.maximum(X @ W["W1"] + W["b1"], 0) @ W["W2"].T + W["b2"]
    top = np.argsort(-z, axis=1, kind="stable")[:, :k_max]
    hits = np.take_along_axis(Y, top, axis=1) > 0
    return {f"p@{k}": float(np.mean(hits[:, :k].sum(axis=1) / k)) for k in (1, 3, 5)}


@pytest.mark.parametrize("first_layer,adam", [("embedding_bag", "fused"), ("sparse_mm", "default")])
def test_trainer_steps_equal_numpy(tmp_path, first_layer, adam):
    py = _torch_python()
    rng = np.random.default_rng(11)
    n, F, L, H = 64, 30, 10, 8
    # point 5 has no features (its hidden layer is relu(b1)); points 7 and 11 have no labels
    train = _random_data(rng, n, F, L, empty_x={5}, empty_y={7, 11})
    test = _random_data(rng, 20, F, L, empty_y={3})
    bvt.export_npz(train, tmp_path / "train.npz")
    bvt.export_npz(test, tmp_path / "test.npz")
    # Large enough weights that the ReLU cuts some units and the softmax is far from uniform.
    W0 = {"W1": rng.uniform(-0.8, 0.8, (F, H)), "b1": rng.uniform(-0.2, 0.2, H),
          "W2": rng.uniform(-1.0, 1.0, (L, H)), "b2": rng.uniform(-0.5, 0.5, L)}
    np.savez(tmp_path / "init.npz", **W0)
    lr, seed, batch, steps = 0.01, 7, 24, 4  # 64 / 24: batches of 24, 24, 16, then epoch 1 begins
    cmd = bvt.trainer_cmd(py, "--train", str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz"),
           "--dtype", "float64", "--hidden", str(H), "--lr", str(lr), "--batch-size", str(batch),
           "--seed", str(seed), "--max-steps", str(steps), "--epochs", "100", "--log-every", "1",
           "--eval-points", "15", "--eval-block", "4", "--load-init", str(tmp_path / "init.npz"),
           "--save-final", str(tmp_path / "final.npz"), "--log", str(tmp_path / "log.jsonl"),
           "--first-layer", first_layer, "--adam", adam)
    r = subprocess.run(cmd, capture_output=True, text=True, env=bvt._child_env(1), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    log = [json.loads(line) for line in open(tmp_path / "log.jsonl")]

    Xd = train.X.toarray().astype(np.float64)
    norms = np.linalg.norm(Xd, axis=1, keepdims=True)
    Xn = Xd / np.where(norms > 0, norms, 1)
    losses, W_ref = _numpy_adam_steps(Xn, train.Y.toarray().astype(np.float64), W0,
                                      steps=steps, batch_size=batch, lr=lr, seed=seed)
    assert [rec["step"] for rec in log] == [1, 2, 3, 4]
    assert [rec["samples"] for rec in log] == [24, 48, 64, 88]
    np.testing.assert_allclose([rec["loss"] for rec in log], losses, rtol=1e-6)
    with np.load(tmp_path / "final.npz") as f:
        W_torch = {k: f[k] for k in W0}
    for k in W0:
        assert W_torch[k].dtype == np.float64
        np.testing.assert_allclose(W_torch[k], W_ref[k], rtol=1e-6, err_msg=k)
        # the updates themselves (about lr in size), which the weights' own size would hide
        np.testing.assert_allclose(W_torch[k] - W0[k], W_ref[k] - W0[k], rtol=1e-6, atol=1e-9, err_msg=k)
        assert np.count_nonzero(W_torch[k] - W0[k]) > 0

    # Evaluation: exact top 5 of the final model on the first 15 test points, in blocks of 4.
    Xt = test.X.toarray().astype(np.float64)[:15]
    Xt /= np.linalg.norm(Xt, axis=1, keepdims=True)
    want = _numpy_precision(Xt, test.Y.toarray()[:15], W_torch)
    for k in ("p@1", "p@3", "p@5"):
        assert log[-1][k] == pytest.approx(want[k], abs=1e-12)
        assert summary[k] == log[-1][k]
    assert summary["steps"] == steps and summary["samples"] == 88
    assert summary["eval_points"] == 15 and summary["warmup_steps_excluded"] == 3
    assert summary["threads"] == 1 and summary["first_layer"] == first_layer


def test_run_torch_end_to_end(tmp_path):
    py = _torch_python()
    rng = np.random.default_rng(5)
    train = _random_data(rng, 300, 40, 12)
    test = _random_data(rng, 50, 40, 12)
    r = bvt.run_torch(train, test, hidden=16, lr=1e-2, batch_size=32, epochs=2.0, threads=1,
                      eval_every=5, eval_points=30, workdir=tmp_path, omp_wait_policy="PASSIVE")
    assert r["available"] is True and r["torch_version"].startswith("2.")  # the baselines' venv's torch
    steps = 2 * 10  # ceil(300 / 32) = 10 per epoch
    assert r["steps"] == steps and r["samples"] == 600 and r["stopped_by"] == "steps"
    assert [rec["step"] for rec in r["log"] if "p@1" in rec] == [5, 10, 15, 20]
    assert r["log"][-1]["samples"] == 600
    walls = [rec["wall_s"] for rec in r["log"]]
    assert walls == sorted(walls) and r["train_s"] == pytest.approx(walls[-1])
    assert r["samples_per_s"] > 0 and r["peak_rss_mb"] > 0 and r["threads"] == 1
    assert r["p@1"] == r["log"][-1]["p@1"] and r["eval_points"] == 30
    assert py in r["command"] and "--threads 1" in r["command"]
    assert r["command"].startswith(" ".join(f"{v}=1" for v in M.THREAD_VARS) + " OMP_WAIT_POLICY=PASSIVE ")
    table = bvt.format_table([{**r, "data": "x"}], target_p1=0.5)
    assert "| 1 |" in table and "`OMP_WAIT_POLICY=PASSIVE _torch_train.py --hidden 16 " in table


def test_script_without_torch_says_so_and_exits_0(tmp_path, capsys):
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"{sys.executable} imports torch")
    out = tmp_path / "r.json"
    assert bvt.main(["--data", "tiny", "--python", sys.executable, "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and "PyTorch is not available" in lines[0]
    assert json.loads(lines[1])["available"] is False
    assert json.loads(out.read_text())[0]["available"] is False


def test_failed_install_gives_a_reason(tmp_path, monkeypatch):
    # A requirement pip cannot satisfy offline stands for "no wheel": the venv is made,
    # pip fails at once, and the reason names the step and pip's last words.
    monkeypatch.setattr(bvt, "TORCH_REQUIREMENTS", (str(tmp_path / "missing-0.0-py3-none-any.whl"),))
    py, reason = bvt.torch_python(tmp_path / "venv", quiet=True)
    assert py is None
    assert reason.startswith("pip install failed (exit ") and "missing-0.0" in reason
    assert (tmp_path / "venv" / "bin" / "python").exists()


# --------------------------------------------------------------------------- the sampled softmax vs numpy


def _sampled_block(y_ids, L, S, seed, step):
    """The trainer's documented candidate set: batch labels, then S uniform draws without them."""
    pos = np.unique(y_ids)
    drawn = np.random.default_rng([seed, 0x4E6, step]).choice(L, min(S, L), replace=False)
    neg = np.setdiff1d(drawn, pos)
    corr = np.r_[np.zeros(len(pos)), np.full(len(neg), np.log((L - len(pos)) / len(neg)))]
    return np.r_[pos, neg].astype(np.int64), corr


def _numpy_sampled_steps(X, Y, W, *, steps, batch_size, lr, seed, S, total, beta1=0.9, beta2=0.999, eps=1e-8):
    """Plain-numpy replay of `--output sampled --lr-schedule linear`: (losses, final weights).

    Lazy Adam (torch's SparseAdam: m, v and the weights move only in the rows a step
    touches; step size lr sqrt(1 - beta2^t) / (1 - beta1^t), eps added to sqrt(v)) for
    W1 (the batch's features), W2 and b2 (the candidates); ordinary Adam for b1.
    """
    W = {k: v.astype(np.float64).copy() for k, v in W.items()}
    m = {k: np.zeros_like(v) for k, v in W.items()}
    v = {k: np.zeros_like(v) for k, v in W.items()}
    n, L = Y.shape
    per_epoch = -(-n // batch_size)
    losses = []
    for t in range(1, steps + 1):
        a = lr * max(0.0, 1 - (t - 1) / total)
        epoch, p = divmod(t - 1, per_epoch)
        ids = np.random.default_rng([seed, 0x5EED, epoch]).permutation(n)[p * batch_size:(p + 1) * batch_size]
        x, y = X[ids], Y[ids]
        B = len(ids)
        C, corr = _sampled_block(np.nonzero(y)[1], L, S, seed, t)
        count = y.sum(axis=1, keepdims=True)
        T = np.divide(y, count, out=np.zeros_like(y), where=count > 0)[:, C]
        pre = x @ W["W1"] + W["b1"]
        h = np.maximum(pre, 0.0)
        z = h @ W["W2"][C].T + W["b2"][C] + corr
        zmax = z.max(axis=1, keepdims=True)
        logp = z - zmax - np.log(np.exp(z - zmax).sum(axis=1, keepdims=True))
        losses.append(-(T * logp).sum() / B)
        dz = (np.exp(logp) * T.sum(axis=1, keepdims=True) - T) / B
        dpre = (dz @ W["W2"][C]) * (pre > 0)
        feats = np.unique(np.nonzero(x)[1])
        touched = {"W1": (feats, (x.T @ dpre)[feats]), "W2": (C, dz.T @ h), "b2": (C, dz.sum(axis=0))}
        for k, (rows, g) in touched.items():
            m[k][rows] = beta1 * m[k][rows] + (1 - beta1) * g
            v[k][rows] = beta2 * v[k][rows] + (1 - beta2) * g * g
            W[k][rows] -= a * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t) * m[k][rows] / (np.sqrt(v[k][rows]) + eps)
        g = dpre.sum(axis=0)
        m["b1"] = beta1 * m["b1"] + (1 - beta1) * g
        v["b1"] = beta2 * v["b1"] + (1 - beta2) * g * g
        W["b1"] -= a * (m["b1"] / (1 - beta1 ** t)) / (np.sqrt(v["b1"] / (1 - beta2 ** t)) + eps)
    return losses, W


def test_sampled_softmax_steps_equal_numpy(tmp_path):
    py = _torch_python()
    rng = np.random.default_rng(12)
    n, F, L, H, S = 64, 30, 40, 8, 10
    train = _random_data(rng, n, F, L, empty_x={5}, empty_y={7})
    test = _random_data(rng, 20, F, L)
    bvt.export_npz(train, tmp_path / "train.npz")
    bvt.export_npz(test, tmp_path / "test.npz")
    W0 = {"W1": rng.uniform(-0.8, 0.8, (F, H)), "b1": rng.uniform(-0.2, 0.2, H),
          "W2": rng.uniform(-1.0, 1.0, (L, H)), "b2": rng.uniform(-0.5, 0.5, L)}
    np.savez(tmp_path / "init.npz", **W0)
    lr, seed, batch, steps = 0.01, 3, 24, 4   # 3 steps per epoch, 2 epochs: the rate decays over 6 steps
    cmd = bvt.trainer_cmd(py, "--train", str(tmp_path / "train.npz"), "--test", str(tmp_path / "test.npz"),
           "--dtype", "float64", "--hidden", str(H), "--lr", str(lr), "--batch-size", str(batch),
           "--seed", str(seed), "--max-steps", str(steps), "--epochs", "2", "--log-every", "1",
           "--output", "sampled", "--negatives", str(S), "--lr-schedule", "linear",
           "--load-init", str(tmp_path / "init.npz"), "--save-final", str(tmp_path / "final.npz"),
           "--save-topk", str(tmp_path / "top.npy"), "--log", str(tmp_path / "log.jsonl"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=bvt._child_env(1), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["output"] == "sampled" and summary["negatives"] == S and summary["predict_s"] is not None
    log = [json.loads(line) for line in open(tmp_path / "log.jsonl")]
    Xd = train.X.toarray().astype(np.float64)
    norms = np.linalg.norm(Xd, axis=1, keepdims=True)
    losses, W_ref = _numpy_sampled_steps(Xd / np.where(norms > 0, norms, 1), train.Y.toarray().astype(np.float64),
                                         W0, steps=steps, batch_size=batch, lr=lr, seed=seed, S=S, total=6)
    np.testing.assert_allclose([rec["loss"] for rec in log], losses, rtol=1e-6)
    with np.load(tmp_path / "final.npz") as f:
        W_torch = {k: f[k] for k in W0}
    for k in W0:
        np.testing.assert_allclose(W_torch[k] - W0[k], W_ref[k] - W0[k], rtol=1e-6, atol=1e-10, err_msg=k)
        # lazy: some rows of the sparse tables never moved (L = 40 labels, at most 24 * 3 + 10 a step)
        if k in ("W2", "W1"):
            assert 0 < np.count_nonzero(np.any(W_torch[k] != W0[k], axis=1)) <= W0[k].shape[0]
    # the saved top 5: every label scored by the final weights
    Xt = test.X.toarray().astype(np.float64)
    Xt /= np.linalg.norm(Xt, axis=1, keepdims=True)
    z = np.maximum(Xt @ W_torch["W1"] + W_torch["b1"], 0) @ W_torch["W2"].T + W_torch["b2"]
    np.testing.assert_array_equal(np.load(tmp_path / "top.npy"), np.argsort(-z, axis=1, kind="stable")[:, :5])


def test_log_prior_output_bias(tmp_path):
    py = _torch_python()
    train = _random_data(np.random.default_rng(2), 30, 12, 9)
    bvt.export_npz(train, tmp_path / "train.npz")
    cmd = bvt.trainer_cmd(py, "--train", str(tmp_path / "train.npz"), "--hidden", "4", "--max-steps", "1",
           "--output", "sampled", "--negatives", "3", "--output-bias", "log_prior",
           "--save-init", str(tmp_path / "init.npz"))
    r = subprocess.run(cmd, capture_output=True, text=True, env=bvt._child_env(1), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    counts = np.asarray(train.Y.sum(axis=0)).ravel()
    with np.load(tmp_path / "init.npz") as f:
        np.testing.assert_allclose(f["b2"], np.log((counts + 1) / (30 + 9)), rtol=1e-6)
