"""The data-shape suite's plumbing (scripts/suites/shapes.py): every system gets the same files and
one evaluator, and the last line names dslide's worst member against omikuji (3 trees).

No training and no tree library here: the runners are replaced by stand-ins that record what
they were given and return predictions fixed in advance; the scores are recounted by numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scripts.suites import shapes as S


def _files(tmp_path):
    from dslide.datasets.synthetic import generate_split
    from dslide.io.data import write_xmc

    tr, te = generate_split("tiny", 200, 40, seed=1)
    paths = tmp_path / "m_train.txt", tmp_path / "m_test.txt"
    for p, d in zip(paths, (tr, te)):
        write_xmc(p, d.X, d.Y)
    return paths, tr, te


def test_every_system_reads_the_same_files_and_is_scored_by_one_evaluator(tmp_path, monkeypatch):
    from scripts import bench_trees as TR

    paths, tr, te = _files(tmp_path)
    seen = []
    top = np.argsort(-np.asarray(te.Y.todense()), axis=1, kind="stable")[:, :5]  # its labels first
    top[::2] = np.arange(5)  # every other point: labels 0..4, mostly wrong

    def fake_tree(system, train_path, test_path, **kw):
        seen.append((system, Path(train_path), Path(test_path)))
        return {"available": True, "topk": top, "train_s": 1.0, "predict_s": 0.5, "peak_rss_mb": 1.0,
                "version": "x", "params": {}}

    monkeypatch.setattr(TR, "run_tree", fake_tree)
    rows = [S.tree_row(s, paths, tmp_path) for s in ("omikuji3", "omikuji1", "napkinxc")]
    assert [s[1:] for s in seen] == [paths] * 3
    # the recount: P@1 is the share of points whose first prediction is one of their labels
    Y = np.asarray(te.Y.todense()) > 0
    p1 = float(np.mean(Y[np.arange(len(top)), top[:, 0]]))
    p5 = float(np.mean(Y[np.arange(len(top))[:, None], top].sum(axis=1) / 5))
    for r in rows:
        assert r["p@1"] == pytest.approx(p1) and r["p@5"] == pytest.approx(p5)


def test_dslide_rows_pass_the_files_and_settings_to_the_case(tmp_path, monkeypatch):
    paths, _, _ = _files(tmp_path)
    cases = []

    def fake_case(case):
        cases.append(case)
        return {"train_s": 2.0, "predict_s": 1.0, "p@1": 0.5, "p@5": 0.2, "psp@5": 0.1, "samples_per_s": 10.0,
                "bytes_per_step": 0.0, "peak_rss_mb": 1.0, "kinds": ["dense", "dense"], "epochs": 1.0}

    monkeypatch.setattr(S.B, "run_case", fake_case)
    S.dslide_row("dslide wide", paths, {"hidden": [256]}, lsh_inference=False)
    assert cases[0]["data"] == {"train": str(paths[0]), "test": str(paths[1])}
    assert cases[0]["config"]["hidden"] == [256] and cases[0]["ranks"] == 2 and cases[0]["threads"] == 1


def test_gaps_and_the_worst_member_line():
    rows = [
        {"member": "a", "system": "omikuji3", "p@1": 0.50, "p@5": 0.30, "train_s": 10.0},
        {"member": "a", "system": "dslide", "p@1": 0.55, "p@5": 0.29, "train_s": 12.0},
        {"member": "b", "system": "omikuji3", "p@1": 0.80, "p@5": 0.60, "train_s": 5.0},
        {"member": "b", "system": "dslide", "p@1": 0.74, "p@5": 0.61, "train_s": 6.0},
    ]
    S.add_gaps(rows)
    assert rows[1]["gap"] == "+5.0 / -1.0" and rows[3]["gap"] == "-6.0 / +1.0" and rows[0]["gap"] == "-"
    line = S.worst_line(rows)
    assert line.startswith("dslide's worst member against the best library: b, P@1 0.7400 against omikuji3's "
                           "0.8000 (-6.0")
    # the best library by P@1 on each member is the reference, whichever it is
    rows.append({"member": "a", "system": "pecos", "p@1": 0.60, "p@5": 0.31, "train_s": 3.0})
    S.add_gaps(rows)
    assert rows[1]["gap"] == "-5.0 / -2.0" and rows[0]["gap"] == "-10.0 / -1.0" and rows[4]["gap"] == "-"
    assert S.worst_line(rows).startswith("dslide's worst member against the best library: b,")
    assert S.worst_line(rows, real=True).endswith("not measured (no member has both rows)")


def test_variants_must_be_json_objects():
    assert S.parse_variants(['wide={"hidden": [256]}']) == {"wide": {"hidden": [256]}}
    for bad in ("wide", 'wide=[1]', "wide={nope"):
        with pytest.raises(SystemExit):
            S.parse_variants([bad])


def test_a_member_suite_keeps_its_rows_as_they_come_and_notes_failures(tmp_path):
    from types import SimpleNamespace
    import json

    from scripts.suites import common as C

    rows, notes, out = [], [], tmp_path / "rows.json"
    good = {"train_s": 1.0, "p@1": 0.5, "p@5": 0.2, "psp@5": float("nan")}
    assert C.keep_row(good, "tiny", "dslide", "shape", rows, notes, out)
    assert not C.keep_row({"error": "boom"}, "tiny", "omikuji1", "shape", rows, notes, out)
    assert [r["member"] for r in rows] == ["tiny"] and rows[0]["shape"] == "shape"
    assert json.loads(out.read_text())[0]["p@1"] == 0.5
    assert notes == ["tiny: omikuji1 failed: boom"]
    a = SimpleNamespace(no_record=True, tag="x")
    assert C.finish(a, "bench.py --suite shapes", "table\n", notes, 0.0) == 0


def test_the_inference_comparison_of_a_model_without_an_index_is_exact_scoring():
    """An output narrower than lsh.index_min_width has no index: the comparison's --lsh row scores
    every label (the exact top 10, without fusion) and its table says there is no index."""
    from dslide import train as T
    from dslide.config import Config, LSHConfig
    from dslide.datasets.synthetic import generate_split
    from scripts._lsh_eval import compare_inference
    from scripts.suites.common import inference_table

    train, test = generate_split("tiny", n_train=400, n_test=60, seed=1, n_labels=300, n_features=60)
    cfg = Config(hidden=(16,), kinds=("dense", "lsh"), epochs=1, batch_size=50, threads=1, seed=4, knn=0,
                 lsh=LSHConfig(min_active=40, max_active=20, index_anchors=8, index_points=300))
    model, _ = T.fit(train, cfg)
    assert model.index is None
    rows = compare_inference(model, test, None)
    assert [r["method"] for r in rows] == ["exact", "--lsh (every label: no index)"]
    assert rows[1]["share"] == 1.0 and rows[1]["recall@10"] == 1.0 and rows[1]["p@5"] == rows[0]["p@5"]
    text = inference_table({"inference": rows, "index": model.index_info}, "t", test.n_points)
    title = text.splitlines()[0]
    assert "no index" in title and "nan" not in title


def test_rounds_run_every_system_one_after_another_and_report_medians(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from scripts import measure as M
    from scripts.suites import common as C

    paths, _, _ = _files(tmp_path)
    order, times = [], {"dslide": iter([12.0, 9.0, 18.0]), "omikuji3": iter([5.0, 7.0, 4.0])}

    def fake_dslide(system, paths_, cfg, lsh_inference):
        order.append(system)
        return {"system": system, "train_s": next(times[system]), "predict_s": 1.0, "p@1": 0.5, "p@5": 0.2,
                "psp@5": 0.1}

    p1 = iter([0.40, 0.41, 0.40])

    def fake_tree(system, paths_, workdir):
        order.append(system)
        return {"system": system, "train_s": next(times[system]), "predict_s": 2.0, "p@1": next(p1), "p@5": 0.2,
                "psp@5": 0.1}

    monkeypatch.setattr(S, "member_files", lambda *a: paths)
    monkeypatch.setattr(S, "shape_of", lambda p: "shape")
    monkeypatch.setattr(S, "output_is_lsh", lambda p: False)
    monkeypatch.setattr(S, "dslide_row", fake_dslide)
    monkeypatch.setattr(S, "tree_row", fake_tree)
    monkeypatch.setattr(C, "warm_kernels", lambda notes: None)
    monkeypatch.setattr(M, "ROOT", tmp_path)
    printed = []
    monkeypatch.setattr(C, "finish", lambda a, key, text, notes, t0: printed.append((text, notes)) or 0)
    a = SimpleNamespace(suite="real", members="bibtex", systems="dslide,omikuji3", variant=[], points=None,
                        test_points=None, no_lsh=True, tag="", no_record=True, repeat=3)
    assert S.run(a) == 0
    assert order == ["dslide", "omikuji3"] * 3  # rounds, not one system's runs back to back
    text, notes = printed[0]
    # medians 12.0 and 5.0 (means 13.0 and 5.33); the rounds' own ratios 2.4, 1.29 and 4.5
    assert "| bibtex | shape | dslide | 12.0 (9.0-18.0) |" in text
    assert "| bibtex | shape | omikuji3 | 5.0 (4.0-7.0) |" in text
    assert "dslide's training time against the best library's: bibtex 2.40x omikuji3 (rounds 1.29x-4.50x)" in text
    assert "--repeat 3" in text and "3 rounds" in text
    assert notes == ["bibtex: omikuji3: p@1 moved between rounds: 0.4000 to 0.4100 (the first round's shown)"]


def test_one_round_keeps_the_row_and_a_failed_round_fails_the_row():
    row, notes = S.merge_rounds([{"train_s": 3.0, "p@1": 0.5}])
    assert row == {"train_s": 3.0, "p@1": 0.5} and notes == [] and S.train_cell(row) == "3.0"
    row, notes = S.merge_rounds([{"train_s": 3.0, "psp@5": float("nan")}, {"train_s": 5.0, "psp@5": float("nan")}])
    assert row["train_s"] == 4.0 and notes == [] and S.train_cell(row) == "4.0 (3.0-5.0)"
    row, _ = S.merge_rounds([{"train_s": 3.0, "p@1": 0.5}, {"error": "boom"}])
    assert row == {"error": "boom"}
    rows = [{"member": "m", "system": "pecos", "p@1": 0.6, "p@5": 0.3, "train_s": 2.0},
            {"member": "m", "system": "dslide", "p@1": 0.6, "p@5": 0.3, "train_s": 5.0}]
    assert S.time_line(rows) == "dslide's training time against the best library's: m 2.50x pecos"


def test_repeat_wants_rounds_and_a_member_suite():
    from scripts import bench

    for bad in (["--repeat", "0"], ["--repeat", "two"], ["--suite", "quick", "--repeat", "2"]):
        with pytest.raises(SystemExit):
            bench.main(bad)
