"""The alpha-beta step-time model (scripts/_costmodel.py) against hand-worked numbers and its
defining properties. Its bytes per step are checked against dslide.comm's counters of real
training steps under MPI in tests/mpi/test_checkpoint_and_bytes.py."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dslide.comm import allreduce_bytes
from scripts import _costmodel as C

# ----------------------------------------------------------------------------
# Hand-worked cases
# ----------------------------------------------------------------------------


def test_dslide_step_by_hand():
    # P = 4, 100 MB/s, 100 us, B = 256, d = 128, float32; split 0.2 s, fixed 0.01 s.
    # compute 0.2 / 4 + 0.01 = 0.06
    # all-gather of 256*128*4 = 131072 B: 3 * 1e-4 + 3/4 * 131072 / 1e8 = 3e-4 + 9.8304e-4
    # reduce-scatter: the same
    # normaliser 16 * 256 = 4096 B: ring 6e-4 + 1.5 * 4096 / 1e8 = 6.6144e-4,
    #   recursive doubling 2 * (1e-4 + 4.096e-5) = 2.8192e-4 -> 2.8192e-4
    # with the label weights (one softmax per label, the default): 8 * 256 = 2048 B more,
    #   recursive doubling 2 * (1e-4 + 2.048e-5) = 2.4096e-4 (ring 6e-4 + 1.5 * 2048 / 1e8)
    parts = C.dslide_step_breakdown(4, 1e8, 1e-4, 256, 128, 0.2, 0.01, label_weights=False)
    assert parts["compute"] == pytest.approx(0.06, rel=1e-12)
    assert parts["allgather"] == pytest.approx(1.28304e-3, rel=1e-12)
    assert parts["reduce_scatter"] == pytest.approx(1.28304e-3, rel=1e-12)
    assert parts["allreduce"] == pytest.approx(2.8192e-4, rel=1e-12)
    assert C.dslide_step_time(4, 1e8, 1e-4, 256, 128, 0.2, 0.01, label_weights=False) == pytest.approx(0.062848,
                                                                                                        rel=1e-12)
    assert C.dslide_step_breakdown(4, 1e8, 1e-4, 256, 128, 0.2, 0.01)["allreduce"] == pytest.approx(
        2.8192e-4 + 2.4096e-4, rel=1e-12)
    assert C.dslide_step_time(4, 1e8, 1e-4, 256, 128, 0.2, 0.01) == pytest.approx(0.062848 + 2.4096e-4, rel=1e-12)


def test_dslide_normaliser_takes_the_ring_when_latency_is_free():
    # latency 0: ring 2 * 1/2 * 4096 / 1e6 = 4.096e-3 < recursive doubling 1 * 4096 / 1e6... equal at P = 2;
    # at P = 8: ring 2 * 7/8 * 4096e-6 = 7.168e-3, recursive doubling 3 * 4096e-6 = 12.288e-3
    assert C.dslide_step_breakdown(8, 1e6, 0.0, 256, 128, 0.0, label_weights=False)["allreduce"] == pytest.approx(
        7.168e-3, rel=1e-12)


def test_data_parallel_step_by_hand():
    # P = 4, 100 MB/s, 100 us, M = 100 MB, compute 2 s:
    # 2 / 4 + 2 * 3/4 * 1e8 / 1e8 + 2 * 3 * 1e-4 = 0.5 + 1.5 + 6e-4
    assert C.data_parallel_step_time(4, 1e8, 1e-4, 1e8, 2.0) == pytest.approx(2.0006, rel=1e-12)
    # with a part every replica does whole (its optimizer update): + 0.3
    assert C.data_parallel_step_time(4, 1e8, 1e-4, 1e8, 2.0, 0.3) == pytest.approx(2.3006, rel=1e-12)


def test_collectives_by_hand():
    assert C.allgather_time(5, 1000, 100.0, 0.5) == pytest.approx(4 * 0.5 + 0.8 * 10.0)
    assert C.reduce_scatter_time(5, 1000, 100.0, 0.5) == pytest.approx(4 * 0.5 + 0.8 * 10.0)
    assert C.allreduce_time(5, 1000, 100.0, 0.5, "ring") == pytest.approx(8 * 0.5 + 1.6 * 10.0)
    # 5 is not a power of two: floor(log2 5) + 2 = 4 exchanges of (0.5 + 10)
    assert C.allreduce_time(5, 1000, 100.0, 0.5, "recursive_doubling") == pytest.approx(42.0)
    assert C.allreduce_time(5, 1000, 100.0, 0.5, "best") == pytest.approx(20.0)


@pytest.mark.parametrize("P, steps", [(1, 0), (2, 1), (3, 3), (4, 2), (6, 4), (8, 3), (48, 7), (64, 6)])
def test_recursive_doubling_steps(P, steps):
    assert C.recursive_doubling_steps(P) == steps


def test_shared_medium_divides_the_bandwidth_by_P():
    # P = 2 on one shared 100 MB/s link: each rank gets 50 MB/s; M = 100 MB:
    # 2 * 1/2 * 1e8 / 5e7 = 2 s
    assert C.data_parallel_step_time(2, 1e8, 0.0, 1e8, 0.0, shared_medium=True) == pytest.approx(2.0)
    assert C.data_parallel_step_time(2, 1e8, 0.0, 1e8, 0.0) == pytest.approx(1.0)


def test_infinite_bandwidth_leaves_latency_only():
    t = C.dslide_step_time(4, math.inf, 1e-3, 256, 128, 0.0)
    # all-gather 3 + reduce-scatter 3 + two recursive doublings (normaliser, label weights) 2 start-ups each
    assert t == pytest.approx(10e-3)
    assert C.dslide_step_time(4, math.inf, 1e-3, 256, 128, 0.0, label_weights=False) == pytest.approx(8e-3)


# ----------------------------------------------------------------------------
# Bytes: the same accounting as dslide.comm
# ----------------------------------------------------------------------------


def test_data_parallel_bytes_match_comm_accounting():
    for P in (2, 3, 4, 64):
        assert C.data_parallel_bytes_per_step(P, 415_000_000) == pytest.approx(allreduce_bytes(415_000_000, P), abs=1)


# ----------------------------------------------------------------------------
# Properties
# ----------------------------------------------------------------------------

bandwidths = st.floats(1e5, 1e11)
latencies = st.floats(0.0, 1e-2)
Ps = st.integers(1, 64)


@settings(max_examples=200, deadline=None)
@given(P=Ps, b1=bandwidths, b2=bandwidths, lat=latencies, split=st.floats(0, 10), fixed=st.floats(0, 1),
       shared=st.booleans())
def test_more_bandwidth_is_never_slower(P, b1, b2, lat, split, fixed, shared):
    lo, hi = min(b1, b2), max(b1, b2)
    assert C.dslide_step_time(P, hi, lat, 256, 128, split, fixed, shared_medium=shared) <= \
        C.dslide_step_time(P, lo, lat, 256, 128, split, fixed, shared_medium=shared)
    assert C.data_parallel_step_time(P, hi, lat, 4e8, split, fixed, shared_medium=shared) <= \
        C.data_parallel_step_time(P, lo, lat, 4e8, split, fixed, shared_medium=shared)


@settings(max_examples=100, deadline=None)
@given(P=Ps, bw=bandwidths, l1=latencies, l2=latencies)
def test_more_latency_is_never_faster(P, bw, l1, l2):
    lo, hi = min(l1, l2), max(l1, l2)
    assert C.dslide_step_time(P, bw, lo, 256, 128, 0.1) <= C.dslide_step_time(P, bw, hi, 256, 128, 0.1)
    assert C.data_parallel_step_time(P, bw, lo, 4e8, 0.1) <= C.data_parallel_step_time(P, bw, hi, 4e8, 0.1)


@settings(max_examples=100, deadline=None)
@given(bw=bandwidths, lat=latencies, split=st.floats(0, 10), fixed=st.floats(0, 1))
def test_one_node_has_no_communication(bw, lat, split, fixed):
    parts = C.dslide_step_breakdown(1, bw, lat, 256, 128, split, fixed)
    assert parts["comm"] == 0.0
    assert parts["total"] == split + fixed
    assert C.data_parallel_step_time(1, bw, lat, 4e8, split, fixed) == split + fixed
    assert C.dslide_bytes_per_step(1, 256, 128) == 0.0
    assert C.data_parallel_bytes_per_step(1, 4e8) == 0.0


def test_data_parallel_grows_with_the_model_and_dslide_does_not():
    ds, dp = C.Step(0.2, 0.01), C.Step(3.0)
    rows_by_m = [C.predict_table([1, 2, 8, 64], 1.25e8, 5e-5, batch=256, hidden=128, model_bytes=m,
                                 dslide=ds, data_parallel=dp) for m in (1e6, 1e8, 4e8, 4e9)]
    for i, P in enumerate([1, 2, 8, 64]):
        d_times = [rows[i]["dslide_s"] for rows in rows_by_m]
        p_times = [rows[i]["dp_s"] for rows in rows_by_m]
        assert len(set(d_times)) == 1
        if P == 1:
            assert len(set(p_times)) == 1
        else:
            assert all(a < b for a, b in zip(p_times, p_times[1:]))


def test_predict_table_rows():
    rows = C.predict_table([2, 4], 1e8, 1e-4, batch=256, hidden=128, model_bytes=1e8,
                           dslide=C.Step(0.2, 0.01), data_parallel=C.Step(2.0))
    assert [r["P"] for r in rows] == [2, 4]
    r4 = rows[1]
    t4 = 0.062848 + 2.4096e-4  # test_dslide_step_by_hand, label weights included
    assert r4["dslide_s"] == pytest.approx(t4)
    assert r4["dp_s"] == pytest.approx(2.0006)
    assert r4["dslide_samples_per_s"] == pytest.approx(256 / t4)
    assert r4["speedup"] == pytest.approx(2.0006 / t4)
    assert r4["dp_bytes"] == pytest.approx(1.5e8)
    assert r4["dslide_bytes"] == pytest.approx(1.5 * 131072 + 1.5 * 4096 + 1.5 * 2048)


# ----------------------------------------------------------------------------
# Fitting the compute terms
# ----------------------------------------------------------------------------


def test_fit_step_recovers_split_and_fixed():
    step = C.fit_step([1, 2, 4], [0.2 / p + 0.03 for p in (1, 2, 4)])
    assert step.compute_split_s == pytest.approx(0.2)
    assert step.compute_fixed_s == pytest.approx(0.03)


def test_fit_step_edge_cases():
    assert C.fit_step([2], [0.1]) == C.Step(0.2, 0.0)
    # compute that does not shrink with P: all fixed
    flat = C.fit_step([1, 2], [0.1, 0.12])
    assert flat.compute_split_s == 0.0
    assert flat.compute_fixed_s == pytest.approx(0.11)
    # would need a negative fixed part: through the origin, t = s / P, s = sum(t/P) / sum(1/P^2)
    s = C.fit_step([1, 2], [0.2, 0.05])
    assert s.compute_fixed_s == 0.0
    assert s.compute_split_s == pytest.approx((0.2 + 0.025) / 1.25)


# ----------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------


@pytest.mark.parametrize("call, word", [
    (lambda: C.dslide_step_time(0, 1e8, 0.0, 256, 128, 0.1), "P = 0"),
    (lambda: C.dslide_step_time(2.5, 1e8, 0.0, 256, 128, 0.1), "P = 2.5"),
    (lambda: C.dslide_step_time(2, 0.0, 0.0, 256, 128, 0.1), "bandwidth = 0.0"),
    (lambda: C.dslide_step_time(2, 1e8, -1.0, 256, 128, 0.1), "latency = -1.0"),
    (lambda: C.dslide_step_time(2, 1e8, 0.0, 0, 128, 0.1), "batch = 0"),
    (lambda: C.dslide_step_time(2, 1e8, 0.0, 256, 12.5, 0.1), "hidden = 12.5"),
    (lambda: C.dslide_step_time(2, None, 0.0, 256, 128, 0.1), "bandwidth = None"),
    (lambda: C.dslide_step_time(2, 1e8, 0.0, 256, 128, -0.1), "compute_split_s = -0.1"),
    (lambda: C.data_parallel_step_time(2, 1e8, 0.0, float("nan"), 0.1), "model_bytes = nan"),
    (lambda: C.allreduce_time(2, 10, 1e8, 0.0, "tree"), "'tree' is not valid; choose one of 'ring'"),
    (lambda: C.Step("fast"), "compute_split_s = 'fast'"),
])
def test_bad_inputs_name_the_value(call, word):
    with pytest.raises(ValueError, match=word.replace("(", r"\(").replace(".", r"\.")):
        call()
