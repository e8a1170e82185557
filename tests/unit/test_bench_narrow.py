"""scripts/bench_narrow.py: its data sets are the shapes it names, and bad arguments are refused."""

import pytest

from scripts import _bench, bench_narrow


@pytest.mark.parametrize("name,shape", [
    ("tiny", (2_000, 500, 1_000, 500)),
    ("topics-4k", (15_000, 3_000, 5_000, 4_000)),
    ("baskets-3k", (15_000, 3_000, 8_000, 3_000)),
])
def test_each_synthetic_set_has_the_shape_it_is_named_for(name, shape):
    train, test = _bench.load_data(bench_narrow.SETS[name])
    assert (train.n_points, test.n_points, train.n_features, train.n_labels) == shape
    assert test.n_labels == train.n_labels
    # every point of these sets has labels: the narrow output is learned, not empty
    assert (train.Y.getnnz(axis=1) > 0).mean() > 0.99


def test_unknown_sets_and_bad_variants_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_narrow.main(["--sets", "bibtex,nope", "--no-record"])
    assert "unknown set 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="is not JSON"):
        bench_narrow.main(["--sets", "tiny", "--variant", "x={epochs: 2}", "--no-record"])
