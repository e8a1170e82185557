"""dslide.comm without MPI: the softmax normaliser's merge operator against a float64 reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dslide.comm import Comm, _lse_merge

NEG = -np.inf


def _merge(a, b):
    """_lse_merge as MPI calls it: a (in) merged into b (inout), both [B, 2] float64 (max, sum)."""
    a = np.ascontiguousarray(a, dtype=np.float64)
    out = np.ascontiguousarray(b, dtype=np.float64).copy()
    _lse_merge(a.tobytes(), memoryview(out).cast("B"), None)
    return out


def _reference(pairs):
    """(M, S) of one sample's (m_r, s_r) pairs, by hand: M = max m_r, S = sum s_r e^(m_r - M), e^-inf = 0."""
    M = max(m for m, _ in pairs)
    if M == NEG:
        return NEG, 0.0
    return M, sum(s * np.exp(m - M) for m, s in pairs if m != NEG)


def test_a_row_empty_on_one_rank_takes_the_other_ranks_statistics():
    # rank a: sample 0 has no active slot (-inf, 0); sample 1 has; sample 2 is empty on both ranks
    a = [[NEG, 0.0], [1.0, 2.0], [NEG, 0.0], [3.0, 1.5]]
    b = [[2.0, 3.0], [NEG, 0.0], [NEG, 0.0], [1.0, 4.0]]
    out = _merge(a, b)
    assert out[0].tolist() == [2.0, 3.0]
    assert out[1].tolist() == [1.0, 2.0]
    assert out[2].tolist() == [NEG, 0.0]  # no NaN from -inf - -inf
    assert out[3, 0] == 3.0 and out[3, 1] == pytest.approx(1.5 + 4.0 * np.exp(-2.0), rel=1e-15)
    assert np.array_equal(_merge(b, a), out)  # commutes (the op is created with commute=True)


pairs = st.one_of(st.just((NEG, 0.0)), st.tuples(st.floats(-80, 80), st.floats(1e-30, 1e6)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(pairs, min_size=3, max_size=3), min_size=2, max_size=5))
def test_merging_ranks_in_any_order_gives_the_reference(ranks):
    """ranks: P ranks' (max, sum) for 3 samples; fold them as MPI would, left to right."""
    acc = np.array(ranks[0], dtype=np.float64)
    for r in ranks[1:]:
        acc = _merge(np.array(r, dtype=np.float64), acc)
    for i in range(3):
        M, S = _reference([r[i] for r in ranks])
        assert acc[i, 0] == M
        assert acc[i, 1] == pytest.approx(S, rel=1e-12, abs=0.0)
        assert not np.isnan(acc[i]).any()


def test_the_single_process_stand_in_returns_its_own_statistics():
    m = np.array([NEG, 2.5], dtype=np.float32)
    s = np.array([0.0, 3.0], dtype=np.float32)
    M, S = Comm().allreduce_logsumexp(m, s)
    assert M.dtype == S.dtype == np.float64 and M.tolist() == [NEG, 2.5] and S.tolist() == [0.0, 3.0]


def test_only_the_comm_package_imports_mpi4py():
    """The house rule (dslide/comm/__init__.py): every MPI call goes through dslide.comm."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    importers = set()
    for d in ("dslide", "lsh", "datasets"):
        for f in (root / d).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                if any(n == "mpi4py" or n.startswith("mpi4py.") for n in names):
                    importers.add(f.relative_to(root).as_posix())
    assert importers and all(f.startswith("dslide/comm/") for f in importers), sorted(importers)
