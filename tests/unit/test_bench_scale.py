"""The scale suite's harness (scripts/suites/scale.py, scripts/_bench.Curve): the curve's points are
taken at the epochs asked for, with the run's own training times; the member is generated once and
then read from its files; the last line answers against omikuji's P@1."""

from __future__ import annotations

import pytest

from scripts import _bench as B
from scripts.suites import scale as SC
from scripts.suites import shapes as S


def _curve_run(preset: str, n_train: int, epochs: float, at):
    from dslide import train as T
    from dslide.infer.predict import predict_topk
    from dslide.config import Config, points_per_label
    from dslide.datasets.synthetic import generate_split
    from dslide.metrics import evaluate, inverse_propensity

    tr, te = generate_split(preset, n_train, 100, seed=3)
    config = Config.from_dict({"hidden": [16], "epochs": epochs, "threads": 1}).resolve(
        tr.n_labels, points_per_label(tr.Y), tr.n_points)
    config = config.replace(log_every=B.steps_per_epoch(config, tr))
    last = T.total_steps(config, tr.n_points - B.validation_size(config, tr))
    curve = B.Curve(at, config, tr, te, inverse_propensity(tr.Y), None, last_step=last)

    def cb(event, model, info):
        if event == "log":
            curve.at_log(model, info)

    model, history = T.fit(tr, config, comm=None, callback=cb, index=False)
    final = evaluate(te.Y, predict_topk(model, te.X, 5), k=5)  # the model as used: fused where it fuses
    curve.finish(model, final)
    return curve, history, model, final


@pytest.mark.parametrize("preset, n_train", [("tiny", 600), ("small", 2400)])
def test_the_curve_is_read_off_the_runs_history_at_the_epochs_asked(preset, n_train):
    # tiny: a narrow output, no validation split; small: wide, its fusion chosen on a split
    curve, history, model, final = _curve_run(preset, n_train, 4.0, (1, 2, 4))
    pts = curve.points
    assert [p["epoch"] for p in pts] == [1.0, 2.0, 4.0]  # log points fall on the epochs' ends
    by_step = {r["step"]: r for r in history}
    for p in pts:
        assert p["wall_s"] == by_step[p["step"]]["wall_s"]  # the run's clock, evaluations left out
        # the last point also carries the end of training's choices (finish_s)
        end = model.index_info["finish_s"] if p is pts[-1] else 0.0
        assert p["train_s"] == pytest.approx(p["wall_s"] + p["neighbours_s"] + end + curve.probe_s)
        assert 0.0 <= p["p@1"] <= 1.0 and 0.0 <= p["network"]["p@1"] <= 1.0
    assert (curve.split is not None) == (preset == "small")
    if preset == "small":
        assert all(p["neighbours_s"] > 0.0 for p in pts) and all("fusion" in p for p in pts)
    else:
        assert all(p["neighbours_s"] == 0.0 for p in pts)
    # the run's last point is the final model, its store the end of training's own
    assert pts[-1]["step"] == history[-1]["step"] and "pending" not in pts[-1]
    assert pts[-1]["p@1"] == final["p@1"] and pts[-1]["p@5"] == final["p@5"]
    assert pts[-1]["neighbours_s"] == model.index_info.get("neighbours_s", 0.0) + model.index_info.get("hidden_s", 0.0)


def test_the_training_time_counts_every_stage_of_fit_outside_the_steps(monkeypatch):
    # a run with a split: the probe before the steps; early stopping's end, the prior shift's
    # choice, the neighbour store and the hidden neighbours after them. A stage that takes 0.3 s
    # (the prior shift's choice, slowed here) must land in the time the benchmark counts.
    import time

    from dslide import train as T
    from dslide.config import Config, points_per_label
    from dslide.datasets.synthetic import generate_split
    from dslide.train import loop

    real = loop.apply_prior_shift

    def slow(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)

    monkeypatch.setattr(loop, "apply_prior_shift", slow)
    tr, _ = generate_split("small", 2400, 100, seed=3)
    config = Config.from_dict({"hidden": [16], "threads": 1}).resolve(
        tr.n_labels, points_per_label(tr.Y), tr.n_points)
    assert config.early_stop  # a wide output with a split: every stage runs
    t0 = time.perf_counter()
    model, history = T.fit(tr, config, comm=None, index=False)
    wall = time.perf_counter() - t0
    info = model.index_info
    assert info["finish_s"] >= 0.3 and info["probe_s"] > 0 and info["neighbours_s"] > 0
    counted = sum(r["wall_s_delta"] for r in history) + B.train_outside_steps(info)
    assert counted == pytest.approx(sum(r["wall_s_delta"] for r in history) + info["probe_s"] + info["finish_s"]
                                    + info["neighbours_s"] + info.get("hidden_s", 0.0))
    # what is left uncounted (the split, the loop's set-up) is far less than the slowed stage
    assert 0.0 <= wall - counted < 0.3


def test_the_member_is_generated_once_then_read_from_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(S.M, "ROOT", tmp_path)
    monkeypatch.setitem(SC.MEMBERS, "t", {"preset": "a670k-tail-40k", "n_train": 300, "n_test": 40,
                                           "overrides": {"design_points": 300}})
    paths, made = SC.member_files("t")
    assert made is not None and all(p.exists() for p in paths)
    stamp = [p.stat().st_mtime_ns for p in paths]

    def no_generation(*a, **k):
        raise AssertionError("generated again")

    from dslide.datasets import amazon670k

    monkeypatch.setattr(amazon670k, "generate_split", no_generation)
    again, made = SC.member_files("t")
    assert again == paths and made is None and [p.stat().st_mtime_ns for p in paths] == stamp
    from dslide.io.data import read_xmc

    assert read_xmc(paths[0]).n_points == 300 and read_xmc(paths[1]).n_points == 40


def _rows(curve_p1, ref_p1=0.50, ref_s=100.0):
    curve = [{"epoch": e, "train_s": 10.0 * e, "p@1": p, "p@5": 0.1, "psp@5": 0.1, "net_p@1": p}
             for e, p in zip((1, 2, 4, 8), curve_p1)]
    return [{"system": "dslide", "curve": curve},
            {"system": "omikuji1", "label": "omikuji, 1 tree", "p@1": ref_p1, "p@5": 0.2, "train_s": ref_s}]


def test_the_last_line_answers_when_dslide_reaches_omikujis_p1():
    line = SC.reach_line(_rows([0.30, 0.45, 0.52, 0.55]))
    assert line.startswith("dslide reaches omikuji, 1 tree's P@1 (0.5000) at 40.0 s (epoch 4")
    assert "= 40% of omikuji, 1 tree's time" in line
    line = SC.reach_line(_rows([0.30, 0.45, 0.48, 0.47]))
    assert "does not reach" in line and "best P@1 0.4800 (epoch 4" in line and "-2.0 points" in line
    table = SC.curve_table(_rows([0.30, 0.45, 0.52, 0.55]))
    assert "| dslide, epoch 8 | 80.0 |" in table and "| 80% |" in table and "| omikuji, 1 tree |" in table


def test_a_variant_row_is_dslide_with_its_settings_on_top_and_no_curve(monkeypatch):
    cases = []

    def fake_run(case, timeout):
        cases.append(case)
        return {"train_s": 1.0, "p@1": 0.5, "p@5": 0.2, "predict_s": 0.1, "peak_rss_mb": 10.0, "epochs": 8.0,
                "fusion_choice": "off"}

    monkeypatch.setattr(SC.B, "run_case", fake_run)
    paths = ("tr.txt", "te.txt")
    plain = SC.dslide_row(paths, 10)
    variant = SC.dslide_row(paths, 10, "t1", {"knn_temperature": 1.0, "epochs": 2.0})
    assert (plain["system"], variant["system"]) == ("dslide", "dslide t1")
    assert cases[0]["curve_epochs"] == list(SC.CURVE_EPOCHS) and "knn_temperature" not in cases[0]["config"]
    assert cases[1]["curve_epochs"] == [] and cases[1]["config"]["knn_temperature"] == 1.0
    assert cases[1]["config"]["epochs"] == SC.EPOCHS  # the suite's fixed epochs are not a variant's to change
    assert cases[1]["data"] == cases[0]["data"]
