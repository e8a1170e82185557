"""Replicas and uneven shards: the arithmetic, the group choice, the configuration,
and the MPI tests of tests/mpi/test_replicas.py at 4 ranks (layouts 2x2 and 4x1),
launched here because scripts/test.sh runs tests/mpi at 1, 2 and 3 ranks only."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dslide.comm import Comm
from dslide.config import Config
from dslide.model.sharding import moves, replica_place, row_share, shard_bounds, shard_range, speed_weights
from dslide.train.replicas import Replicas
from dslide.train.replicas.board import STEP_BITS, pub_word
from dslide.train.replicas.partial import fresh_partners, stale_limit

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


# -- shard weights give the asked shares ------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(P=st.integers(1, 8), extra=st.integers(0, 5000), data=st.data())
def test_weighted_shares_are_within_one_neuron_of_the_asked_proportion(P, extra, data):
    n = P + extra
    w = np.array(data.draw(st.lists(st.floats(1e-3, 1e3), min_size=P, max_size=P)))
    b = shard_bounds(n, P, w)
    sizes = np.diff(b)
    assert b[0] == 0 and b[-1] == n and np.all(sizes >= 1)
    # every rank one neuron, the other n - P in proportion (largest remainders)
    ideal = (n - P) * w / w.sum() + 1
    assert np.all(np.abs(sizes - ideal) < 1)
    assert [shard_range(n, r, P, w) for r in range(P)] == [(int(b[r]), int(b[r + 1])) for r in range(P)]


@given(P=st.integers(1, 8), extra=st.integers(0, 5000), c=st.floats(1e-3, 1e3))
def test_equal_weights_give_the_even_split(P, extra, c):
    n = P + extra
    assert shard_bounds(n, P, [c] * P).tolist() == shard_bounds(n, P).tolist()


@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_row_shares_padded_and_gathered_hold_every_row_in_order(size):
    # what the query searches and the fusion choice do with them: pad each share to `per` rows,
    # all-gather, keep the first n
    for n in range(0, 23):
        blocks = []
        for rank in range(size):
            per, lo, hi = row_share(n, rank, size)
            assert per == int(np.ceil(n / size)) and 0 <= lo <= hi <= n and hi - lo <= per
            blocks.append(np.concatenate([np.arange(lo, hi), np.full(per - (hi - lo), -1)]))
        gathered = np.concatenate(blocks) if blocks else np.empty(0)
        np.testing.assert_array_equal(gathered[:n], np.arange(n))


def test_shares_in_numbers():
    assert np.diff(shard_bounds(100, 2, [3, 1])).tolist() == [75, 25]
    # 1 + 7 * (.25, .25, .5) = 1 + (1.75, 1.75, 3.5): floors 1, 1, 3; the 2 left go to the largest remainders
    assert np.diff(shard_bounds(10, 3, [1, 1, 2])).tolist() == [3, 3, 4]


def test_speed_weights_are_proportional_to_speed_and_take_a_positions_slowest_replica():
    # rank 1 did its half of the work in twice the time: half the speed
    assert speed_weights([1.0, 2.0], [0.5, 0.5]).tolist() == pytest.approx([2 / 3, 1 / 3])
    # rank 0 computed 3/4 of the layer in the time rank 1 took for 1/4: speeds 3 : 1
    assert speed_weights([1.0, 1.0], [0.75, 0.25]).tolist() == pytest.approx([0.75, 0.25])
    # two replicas: position 0 is slow in replica 1, position 1 in replica 0
    w = speed_weights([[1.0, 2.0], [3.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]])
    assert w.tolist() == pytest.approx([(1 / 6) / (1 / 6 + 1 / 4), (1 / 4) / (1 / 6 + 1 / 4)])
    with pytest.raises(ValueError, match="positive seconds"):
        speed_weights([1.0, 0.0], [0.5, 0.5])


def test_wrong_number_of_weights_is_refused():
    with pytest.raises(ValueError, match="shard_weights has 3 entries but a replica has 2 ranks"):
        shard_bounds(10, 2, [1, 2, 3])
    with pytest.raises(ValueError, match="must all be finite numbers > 0"):
        shard_bounds(10, 2, [1, 0])


# -- partial: which published versions a replica uses ------------------------------------------


@settings(max_examples=200, deadline=None)
@given(P=st.integers(1, 6), extra=st.integers(0, 300), data=st.data())
def test_a_re_split_moves_each_neuron_from_its_old_owner_to_its_new_one(P, extra, data):
    """moves against the owner of every neuron before and after (numpy)."""
    n = P + extra
    weights = [data.draw(st.lists(st.floats(0.1, 10.0), min_size=P, max_size=P)) for _ in range(2)]
    old, new = shard_bounds(n, P, weights[0]), shard_bounds(n, P, weights[1])
    owner_old = np.searchsorted(old, np.arange(n), side="right") - 1
    owner_new = np.searchsorted(new, np.arange(n), side="right") - 1
    for r in range(P):
        send, recv = moves(old, new, r)
        for q in range(P):
            ids = np.flatnonzero((owner_old == r) & (owner_new == q))
            lo, hi = send[q]
            assert hi - lo == ids.size and (ids.size == 0 or (lo, hi) == (ids[0], ids[-1] + 1))
            assert recv[q] == np.count_nonzero((owner_old == q) & (owner_new == r))


def test_world_rank_w_is_shard_w_mod_p_of_replica_w_div_p():
    assert [replica_place(w, 6, 2) for w in range(6)] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [replica_place(w, 4, 4) for w in range(4)] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    with pytest.raises(ValueError, match="not divisible by replicas"):
        replica_place(0, 6, 4)


def test_a_replica_uses_every_fresh_version_once_and_skips_stale_ones():
    limit = stale_limit(4, 8)
    assert limit == 4 * 4 * 8
    words = [pub_word(9, 0), pub_word(3, 100), pub_word(5, 120), pub_word(0, 0)]
    # replica 0 (its own word ignored) has used version 2 of replica 1 and nothing else
    use, stale = fresh_partners(words, 0, [7, 2, 0, 0], counter=130, limit=limit)
    assert use == [(1, 3, 1), (2, 5, 5)] and stale == []  # replica 3 published nothing
    # nothing newer than what was used: a group of one
    assert fresh_partners(words, 0, [0, 3, 5, 0], counter=130, limit=limit) == ([], [])
    # published when the counter was 100: usable up to counter 100 + limit, not beyond
    assert fresh_partners(words, 0, [0, 2, 5, 0], counter=100 + limit, limit=limit) == ([(1, 3, 1)], [])
    assert fresh_partners(words, 0, [0, 2, 5, 0], counter=101 + limit, limit=limit) == ([], [(1, 3)])


def test_pub_word_packs_version_and_counter():
    w = pub_word(123456, (1 << STEP_BITS) - 1)
    assert w >> STEP_BITS == 123456 and w & ((1 << STEP_BITS) - 1) == (1 << STEP_BITS) - 1
    assert w < 1 << 63


# -- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize("kw,message", [
    (dict(replicas=0), "replicas"),
    (dict(replicas=61), "replicas"),
    (dict(sync="ring"), "sync = 'ring' is not valid; choose one of 'allreduce', 'partial'"),
    (dict(sync_every=0), "sync_every"),
    (dict(replicas=2, parallel="data"), "replicas = 2 needs parallel = 'model'"),
    (dict(shard_weights="fast"), "shard_weights = 'fast' is not valid; give 'auto', 'even' or one positive"),
    (dict(shard_weights=(1.0, -2.0)), r"shard_weights\[1\] = -2.0 must be a number > 0"),
    (dict(shard_weights=(1.0, True)), r"shard_weights\[1\] = True must be a number > 0"),
    (dict(shard_weights=(2.0, 1.0), parallel="data"), "parallel = 'data' does not"),
])
def test_bad_layouts_are_refused_with_the_valid_choices(kw, message):
    with pytest.raises(ValueError, match=message):
        Config(**kw)


def test_shard_weights_spellings():
    assert Config(shard_weights="even").shard_weights == ()
    assert Config(shard_weights=[2, 1]).shard_weights == (2.0, 1.0)
    assert Config(shard_weights=3).shard_weights == (3.0,)
    assert Config(shard_weights="auto").shard_weights == "auto"


def test_a_world_that_replicas_do_not_divide_is_refused():
    with pytest.raises(ValueError, match=r"world size \(1\) is not divisible by replicas \(2\)"):
        Replicas(Config(replicas=2), Comm())


# -- the MPI tests at 4 ranks -------------------------------------------------------------------


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
def test_mpi_replica_tests_at_four_ranks():
    """2 x 2 and 4 x 1: identical replicas, means of touched rows, partial groups, random
    delays without deadlock (the timeout fails a hang), uneven shards = 1 rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI_"))}
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    p = subprocess.run([str(MPIEXEC), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "pytest", "-q",
                        "-p", "no:cacheprovider", str(ROOT / "tests" / "mpi" / "test_replicas.py")],
                       env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert " passed" in p.stdout and "skipped" not in p.stdout.splitlines()[-1], p.stdout[-2000:]


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec beside {sys.executable}")
def test_dslide_train_with_replicas_then_eval_on_one_rank_and_resume_on_another_layout(tmp_path):
    """`dslide train --set replicas=2 --set sync=partial` at 2 x 2 with checkpoints; `dslide eval`
    on one process reads the final checkpoint and gives the P@1 training reported; the run
    resumes as 1 x 2 (the layout may change on resume)."""
    import json

    from dslide.datasets.synthetic import generate_split, write

    train, test = generate_split("tiny", n_train=1024, n_test=200, seed=0)
    tr, te = write(str(tmp_path / "t"), train, test)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI_"))}
    env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    run = tmp_path / "run"
    dslide = [sys.executable, "-m", "mpi4py", "-m", "dslide"]
    p = subprocess.run([str(MPIEXEC), "-n", "4", *dslide, "train", "--train", tr, "--test", te, "--out", str(run),
                        "--quiet", "--set", "replicas=2", "--set", "sync=partial", "--set", "sync_every=2",
                        "--set", "batch_size=32", "--set", "epochs=2", "--set", "checkpoint_every=20",
                        "--set", "hidden=[32]"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 replicas (partial sync every 2 steps) x 2 shard(s)" in p.stdout
    m = json.loads((run / "metrics.json").read_text())
    assert m["steps"] == 64 and len(m["replicas"]) == 4
    assert all(r["syncs"] > 0 and r["sync_bytes"] > 0 for r in m["replicas"])
    assert sum(r["local_steps"] for r in m["replicas"][::2]) == 64  # shard 0 of each replica
    e = subprocess.run([sys.executable, "-m", "dslide", "eval", "--model", str(run), "--data", te], env=env,
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 0 and f"P@1 {m['p@1']:.4f}" in e.stdout, e.stdout + e.stderr
    r = subprocess.run([str(MPIEXEC), "-n", "2", *dslide, "train", "--train", tr, "--resume", str(run), "--quiet",
                        "--set", "epochs=3", "--set", "replicas=1"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "at step 64" in r.stdout
    assert json.loads((run / "metrics.json").read_text())["steps"] == 96


def test_memory_account_follows_the_replica_layout_and_the_shard_weights():
    from dslide import memory

    cfg = Config(hidden=(64,), exact=True)
    one = memory.account(cfg, 1000, 4000, world_size=2, rank=1)
    rep = memory.account(cfg.replace(replicas=2), 1000, 4000, world_size=4, rank=3)  # shard 1 of replica 1
    assert rep["weights"] == one["weights"] and rep["moments"] == one["moments"]
    assert rep["scratch"] == one["scratch"] + 2 * (1000 + 64)  # hop budgets and change marks per row
    heavy = memory.account(cfg.replace(shard_weights=(1, 3)), 1000, 4000, world_size=2, rank=1)
    n1 = [int(np.diff(shard_bounds(n, 2, [1, 3]))[1]) for n in (64, 4000)]
    assert heavy["weights"] == 4 * (1000 * n1[0] + n1[0] + 64 * n1[1] + n1[1])
