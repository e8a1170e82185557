"""`dslide plot`: the figures it draws come from log.jsonl and metrics.json; without matplotlib
it refuses in one line with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dslide import cli, plot


def _run(tmp_path, choice):
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"step": 20, "wall_s": 1.0, "loss": 7.5},
            {"step": 40, "wall_s": 2.0, "loss": 6.9, "p@1": 0.33},
            {"step": 60, "wall_s": 3.0, "loss": 6.4},
            {"step": 80, "wall_s": 4.0, "loss": 6.2, "p@1": 0.41}]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (run / "metrics.json").write_text(json.dumps({"p@1": 0.85, "index": {"fusion_choice": {"chosen": choice}}}))
    return run


@pytest.mark.parametrize("choice, what", [({"knn": 20, "proto_weight": 0.25, "knn_weight": 0.9},
                                            "with neighbour labels"), ("off", "network alone")])
def test_series_holds_the_logged_figures_and_names_the_final_one(tmp_path, choice, what):
    s = plot.series(_run(tmp_path, choice))
    assert s["wall_s"] == [1.0, 2.0, 3.0, 4.0] and s["loss"] == [7.5, 6.9, 6.4, 6.2]
    assert s["eval_wall_s"] == [2.0, 4.0] and s["p@1"] == [0.33, 0.41]
    assert s["final"] == (4.0, 0.85, what)


def test_a_run_without_metrics_has_no_final_point_and_a_bad_log_is_named(tmp_path):
    run = _run(tmp_path, "off")
    (run / "metrics.json").unlink()
    assert plot.series(run)["final"] is None
    (run / "log.jsonl").write_text('{"step": 1}\nnot json\n')
    with pytest.raises(ValueError, match=r"log.jsonl:2: not a JSON record"):
        plot.read_log(run)
    with pytest.raises(ValueError, match="does not exist"):
        plot.read_log(tmp_path / "nothing")


def test_without_matplotlib_dslide_plot_says_so_in_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    run = _run(tmp_path, "off")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit) as e:
        cli.main(["plot", str(run), "--out", str(tmp_path / "p.png")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "matplotlib" in err and "not installed" in err, err
    assert not (tmp_path / "p.png").exists()


def test_dslide_plot_draws_where_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "off")
    p = subprocess.run([sys.executable, "-m", "dslide", "plot", str(run), "--out", str(tmp_path / "p.png"),
                        "--labels", "demo"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "p.png").stat().st_size > 10_000
    # the old command still works
    p = subprocess.run([sys.executable, "-m", "scripts.plot_run", str(run), "--out", str(tmp_path / "q.png")],
                       capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert p.returncode == 0 and (tmp_path / "q.png").is_file(), p.stderr
