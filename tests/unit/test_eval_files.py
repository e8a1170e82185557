"""metrics.json names the data each evaluation scored, with its sha256, one entry per file.

Caught: `dslide eval` on the training data replaced the test figures in metrics.json, and
nothing there said which file the figures were of."""

import hashlib
import json
import os

import pytest

from dslide import cli


def _sha256(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("evalfiles")
    assert cli.main(["data", "gen", "--preset", "tiny", "--points", "300", "--test-points", "100",
                     "--out", str(d / "t")]) == 0
    assert cli.main(["train", "--train", str(d / "t_train.txt"), "--test", str(d / "t_test.txt"), "--out",
                     str(d / "run"), "--quiet", "--set", "epochs=1", "--set", "hidden=16"]) == 0
    return d


def test_training_names_the_file_its_figures_are_of(run):
    m = json.loads((run / "run" / "metrics.json").read_text())
    test = run / "t_test.txt"
    assert m["test_data"] == {"data": str(test), "files": [{"path": str(test), "sha256": _sha256(test)}]}


def test_an_eval_of_other_data_keeps_the_test_figures_and_each_names_its_file(run, capsys):
    model, test, train = run / "run", run / "t_test.txt", run / "t_train.txt"
    assert cli.main(["eval", "--model", str(model), "--data", str(test), "--quiet"]) == 0
    first = json.loads((model / "metrics.json").read_text())
    on_test = first["eval"]
    assert on_test["data"] == str(test)
    assert on_test["files"] == [{"path": os.path.abspath(test), "sha256": _sha256(test)}]
    assert cli.main(["eval", "--model", str(model), "--data", str(train), "--quiet"]) == 0
    m = json.loads((model / "metrics.json").read_text())
    assert m["eval"]["data"] == str(train) and m["eval"]["files"][0]["sha256"] == _sha256(train)
    assert set(m["evals"]) == {os.path.abspath(test), os.path.abspath(train)}
    assert m["evals"][os.path.abspath(test)] == on_test  # the test figures kept
    assert m["p@1"] == first["p@1"]  # and training's own
    # the same file again: its one entry replaced, not added
    assert cli.main(["eval", "--model", str(model), "--data", str(test), "--quiet", "--k", "3"]) == 0
    m = json.loads((model / "metrics.json").read_text())
    assert len(m["evals"]) == 2 and "p@3" in m["evals"][os.path.abspath(test)]
    assert "p@5" not in m["evals"][os.path.abspath(test)]
    capsys.readouterr()


def test_eval_out_names_the_file(run, tmp_path, capsys):
    test = run / "t_test.txt"
    out = tmp_path / "e.json"
    assert cli.main(["eval", "--model", str(run / "run"), "--data", str(test), "--out", str(out), "--quiet"]) == 0
    e = json.loads(out.read_text())["eval"]
    assert e["data"] == str(test) and e["files"][0]["sha256"] == _sha256(test)
    capsys.readouterr()
