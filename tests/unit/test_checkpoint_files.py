"""Checkpoint files array by array: .npy round trips and slices against numpy, bounded
memory, weights-only checkpoints (predict like the full one, refuse resume), export."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from dslide import train as T
from dslide.infer.predict import predict_topk
from dslide.comm import Comm
from dslide.config import Config, LSHConfig
from dslide.datasets.synthetic import generate_split
from dslide.infer.parts import sections
from dslide.io import checkpoint as ck
from dslide.io import checkpoint_files as ckf


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.int64, np.bool_])
def test_npy_round_trip_and_slices_match_numpy(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(ckf, "CHUNK", 40)  # many chunks, and chunk edges inside rows
    rs = np.random.default_rng(0)
    a = (rs.random((13, 7)) * 1000).astype(dtype)
    digest = ckf.write_npy(tmp_path / "a.npy", a)
    assert digest == ckf.sha256(tmp_path / "a.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "a.npy"), a)  # numpy reads it
    f = ckf.NpyFile(tmp_path / "a.npy")
    out = np.empty_like(a)
    import hashlib

    h = hashlib.sha256()
    f.read_all(out, h)
    np.testing.assert_array_equal(out, a)
    assert h.hexdigest() == digest
    for axis, (lo, hi) in ((0, (3, 11)), (1, (2, 6)), (0, (0, 13)), (1, (6, 7))):
        sl = [slice(None)] * 2
        sl[axis] = slice(lo, hi)
        want = a[tuple(sl)]
        got = np.empty_like(want)
        f.read_slice(axis, lo, hi, got)
        np.testing.assert_array_equal(got, want)
        # into a strided view of a larger array (columns of an input-major matrix)
        big = np.zeros((13, 20), dtype) if axis == 1 else np.zeros((20, 7), dtype)
        tgt = big[:, 5:5 + hi - lo] if axis == 1 else big[4:4 + hi - lo]
        f.read_slice(axis, lo, hi, tgt)
        np.testing.assert_array_equal(tgt, want)
        assert not big[:, :5].any() if axis == 1 else not big[:4].any()
    f.close()
    # a strided source is written like its contiguous copy
    ckf.write_npy(tmp_path / "t.npy", a.T)
    np.testing.assert_array_equal(np.load(tmp_path / "t.npy"), a.T)
    # a truncated file is an error naming it
    raw = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "cut.npy").write_bytes(raw[:-5])
    with pytest.raises(ck.CheckpointError, match="cut.npy is truncated"):
        ckf.NpyFile(tmp_path / "cut.npy").read_all(np.empty_like(a))


def test_save_and_load_need_about_one_chunk_of_extra_memory(tmp_path):
    """A process holding a 256 MiB array saves it and loads it back into the same array:
    its peak resident memory grows by less than 2 chunks (np.save + np.load would add a
    whole copy on load)."""
    code = textwrap.dedent(f"""
        import resource, numpy as np
        from pathlib import Path
        from dslide.io import checkpoint_files as ckf
        a = np.arange(64 << 20, dtype=np.float32)  # 256 MiB, every page touched
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        ckf.write_npy(Path({str(tmp_path)!r}) / "big.npy", a)
        f = ckf.NpyFile(Path({str(tmp_path)!r}) / "big.npy")
        a[:] = 0
        f.read_all(a)
        f.read_slice(0, 1000, 2000, a[:1000])
        ok = bool(a[5] == 1005 and a[-1] == np.float32((64 << 20) - 1) and a[999] == 1999)
        grow = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
        print(ok, grow)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) * 1024 < 2 * ckf.CHUNK + (16 << 20), f"peak RSS grew by {int(out[1]) / 1024:.0f} MiB"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    train, test = generate_split("tiny", n_train=500, n_test=120, seed=2)
    cfg = Config(hidden=(16,), kinds=("dense", "lsh"), epochs=1, batch_size=50, threads=1, seed=4, lr=1e-2,
                 adam_dtype="bfloat16", knn=0,  # the byte ratios below are of weights and moments
                 lsh=LSHConfig(min_active=40, max_active=20, index_anchors=8, index_share=0.2, index_min_width=0))
    model, _ = T.fit(train, cfg)
    run = tmp_path_factory.mktemp("run")
    ck.save(model.network, run, Comm(), weights_only=False, sections=sections(model))
    return train, test, cfg, model, run


def test_weights_only_checkpoint_predicts_like_the_full_one_and_refuses_resume(trained, tmp_path):
    train, test, cfg, model, run = trained
    full = ck.latest(run)
    slim_run = tmp_path / "slim"
    slim = ck.save(model.network, slim_run, Comm(), weights_only=True, sections=sections(model))
    man_full, man_slim = ck.read_manifest(full), ck.read_manifest(slim)
    assert man_full["contents"] == "full" and man_slim["contents"] == "weights"
    names = set(man_slim["ranks"][0]["arrays"])
    assert {"layer0/W", "layer0/b", "layer1/W", "layer1/b"} <= names
    assert any(n.startswith("index/") for n in names)  # the model's inference index, beside the layers'
    assert not any(n.startswith(("layer1/index.", "layer1/nn.", "layer1/knn.")) for n in names)
    assert not any(n.endswith((".m", ".v")) or "anchor." in n or "dirty" in n for n in names)
    # moments are 2 of every 3 bytes of W at float32 weights with bfloat16 moments: 8 vs 4 bytes
    assert ck.size_bytes(slim) < 0.6 * ck.size_bytes(full)
    preds = {}
    for name, path in (("full", full), ("slim", slim)):
        m = T.build_network((train.n_features, train.n_labels), cfg, Comm())
        ck.load_into(m.network, path, Comm(), weights_only=True, sections=sections(m))
        assert not m.network.layers[1].opt_W.v.any()  # moments not read
        preds[name] = (predict_topk(m, test.X, 5, exact=True), predict_topk(m, test.X, 5, exact=False))
    want = (predict_topk(model, test.X, 5, exact=True), predict_topk(model, test.X, 5, exact=False))
    for name in preds:
        for got, ref in zip(preds[name], want):
            np.testing.assert_array_equal(got, ref)
    m = T.build_network((train.n_features, train.n_labels), cfg, Comm())
    with pytest.raises(ck.CheckpointError, match="holds weights only.*cannot resume"):
        ck.load_into(m.network, slim, Comm())
    # a full checkpoint restores the moments too (bfloat16 bits, exactly)
    ck.load_into(m.network, full, Comm())
    np.testing.assert_array_equal(m.network.layers[1].opt_W.v, model.network.layers[1].opt_W.v)
    assert m.network.layers[1].opt_W.v.dtype == np.uint16


def test_export_and_the_cli_refusal(trained, tmp_path, capsys):
    from dslide import cli

    train, test, cfg, model, run = trained
    out = tmp_path / "exported"
    assert cli.main(["export", "--model", str(run), "--out", str(out)]) == 0
    path = ck.latest(out)
    man = ck.read_manifest(path)
    assert man["contents"] == "weights" and man["extra"]["exported_from"] == str(ck.latest(run))
    assert all(v["inference"] for v in man["ranks"][0]["arrays"].values())
    m = T.build_network((train.n_features, train.n_labels), cfg, Comm())
    ck.load_into(m.network, path, Comm(), weights_only=True, sections=sections(m))
    np.testing.assert_array_equal(predict_topk(m, test.X, 5), predict_topk(model, test.X, 5))
    with pytest.raises(ck.CheckpointError, match="not empty"):
        ck.export(run, out)
    # a corrupted weight file is caught on load
    wfile = path / "rank-0000" / "layer1.W.npy"
    raw = bytearray(wfile.read_bytes())
    raw[-3] ^= 0xFF
    wfile.write_bytes(bytes(raw))
    with pytest.raises(ck.CheckpointError, match="does not match the checksum"):
        ck.load_into(T.build_network((train.n_features, train.n_labels), cfg, Comm()).network, path, Comm(),
                     weights_only=True)
    # an old-format checkpoint is named as such
    bad = json.loads((path / "manifest.json").read_text())
    bad["format"] = 1
    (path / "manifest.json").write_text(json.dumps(bad))
    with pytest.raises(ck.CheckpointError, match="format 1.*reads format 2"):
        ck.read_manifest(path)
