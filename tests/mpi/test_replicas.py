"""Replicas of the sharded model (dslide.train.replicas) and uneven shards, on COMM_WORLD.

Run at 1, 2 and 3 ranks by scripts/test.sh and at 4 ranks by
tests/unit/test_replicas.py (which launches this file under `mpiexec -n 4`):
every layout R x P with R a divisor of the world size is tried. References
are independent: a network trained alone on the same batches (no replicas),
numpy means of the gathered rows, the 1-rank stand-in.
"""

import tempfile
import time

import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from dslide.comm import Comm
from dslide.config import Config, LSHConfig
from dslide.io import checkpoint as ck
from dslide.io.data import XMCData
from dslide.model.inputs import csr_parts, make_batch
from dslide.model.network import Network, full_parameters
from dslide.model.sharding import shard_bounds
from dslide.train import epoch_order, fit
from dslide.train.replicas import Replicas, reshard
from dslide.train.replicas.partial import DEPTH

WORLD = Comm(MPI.COMM_WORLD)
LAYOUTS = [r for r in range(2, WORLD.size + 1) if WORLD.size % r == 0]  # replicas R > 1 that fit
needs_replicas = pytest.mark.skipif(not LAYOUTS, reason="replicas need >= 2 ranks")


def _data(seed=0, n=128, F=40, L=23):
    rs = np.random.default_rng(seed)
    X = sp.random(n, F, density=0.2, format="csr", random_state=seed, dtype=np.float32)
    X.data = rs.uniform(0.1, 1.0, X.nnz).astype(np.float32)
    Y = (rs.random((n, L)) < min(0.1, 2 / L)).astype(np.float32)
    Y[np.arange(n), rs.integers(0, L, n)] = 1.0
    return X, sp.csr_matrix(Y)


CONFIGS = {
    "dense": dict(hidden=(7,), exact=True),
    # an LSH output layer: rows of W and b marked by the block of each step
    "lsh": dict(hidden=(8,), kinds=("dense", "lsh"),
                lsh_layers=(None, LSHConfig(K=2, L=4, bin_size=4, range_pow=4, min_active=6, max_active=4))),
    # an output narrower than its hidden layer (23 or 300 labels): split by rows, biases whole
    "rows": dict(hidden=(320,), exact=True),
}


def _cfg(kind, **kw):
    return Config(**CONFIGS[kind], batch_size=16, input_norm="none", seed=7, lr=1e-2, dropout=0.0, **kw)


def _batches(X, seed):
    order = epoch_order(seed, 0, X.shape[0])
    return lambda k: order[(k * 16) % X.shape[0]:][:16]


def _peer_stack(rep, arr):
    """[R, ...] every replica's copy of this rank's shard of `arr`."""
    return np.stack(rep.peer.allgather_object(np.array(arr))) if rep.n_replicas > 1 else np.array(arr)[None]


@needs_replicas
@pytest.mark.parametrize("mode", ["allreduce", "partial"])
@pytest.mark.parametrize("kind", ["dense", "lsh", "rows"])
@pytest.mark.parametrize("R", LAYOUTS)
def test_replicas_fed_identical_data_and_synced_every_step_stay_identical(R, kind, mode):
    """Every replica trains the same batches and averages after each step: every replica
    must equal, bit for bit, a network trained alone on those batches (no averaging)."""
    X, Y = _data()
    cfg = _cfg(kind, replicas=R, sync=mode)
    rep = Replicas(cfg, WORLD)
    net = Network(cfg, X.shape[1], Y.shape[1], rep.model, total_steps=10)
    alone = Network(cfg.replace(replicas=1), X.shape[1], Y.shape[1], rep.model, total_steps=10)
    rep.attach(net)
    assert (net.layers[-1].split == "rows") == (kind == "rows")
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 1)
    for k in range(10):
        net.train_step(make_batch(xp, yp, rows(k), k + 1))
        alone.train_step(make_batch(xp, yp, rows(k), k + 1))
        if mode == "allreduce":
            rep.sync_all()
        else:  # every version is out before anyone pulls, and pulled before the next is out
            rep.publish()
            WORLD.barrier()
            assert rep.pull() == R - 1
            WORLD.barrier()
    assert rep.sync_bytes() > 0, "rows travelled"
    for (W, b), (W1, b1) in zip(full_parameters(net), full_parameters(alone)):
        assert np.array_equal(W, W1) and np.array_equal(b, b1)
    for layer in net.layers:
        stack = _peer_stack(rep, layer.W)
        assert all(np.array_equal(stack[0], s) for s in stack)
    rep.close()


@needs_replicas
@pytest.mark.parametrize("kind", ["dense", "lsh", "rows"])
@pytest.mark.parametrize("R", LAYOUTS)
def test_allreduce_sets_the_touched_rows_to_their_mean_and_leaves_the_others(R, kind):
    """Replicas train different batches; sync_all must give every replica the numpy mean
    over replicas on the union of the touched rows, keep every other row, and so keep
    the mean over replicas of every parameter."""
    X, Y = _data(L=300)  # wide enough that the LSH blocks of 2 steps leave rows untouched
    cfg = _cfg(kind, replicas=R)
    rep = Replicas(cfg, WORLD)
    net = Network(cfg, X.shape[1], Y.shape[1], rep.model, total_steps=10)
    rep.attach(net)
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 2)
    for k in range(2):  # replica g trains batches g, g + R, ...: different rows touched
        net.train_step(make_batch(xp, yp, rows(k * R + rep.replica), k + 1))
    before = [[_peer_stack(rep, a) for a in rows_ + whole] for rows_, whole in (l.sync_arrays() for l in net.layers)]
    masks = [_peer_stack(rep, l.touched) for l in net.layers]
    moments = [[a.copy() for a in (l.opt_W.m, l.opt_W.v, l.opt_b.m, l.opt_b.v)] for l in net.layers]
    rep.sync_all()
    # Adam's moments are not averaged: each replica keeps its own (docs/replicas.md)
    for l, mom in zip(net.layers, moments):
        assert all(np.array_equal(a, b) for a, b in zip((l.opt_W.m, l.opt_W.v, l.opt_b.m, l.opt_b.v), mom))
    if R > 1:
        m_out = _peer_stack(rep, net.layers[-1].opt_W.m)
        assert not np.array_equal(m_out[0], m_out[1]), "replicas' moments differ (different batches)"
    for layer, pre, mask in zip(net.layers, before, masks):
        U = mask.any(axis=0)
        assert 0 < U.sum() and (kind != "lsh" or U.sum() < U.size or layer.index == 0)
        n_rows = len(layer.sync_arrays()[0])
        for i, (a, b) in enumerate(zip(layer.sync_arrays()[0] + layer.sync_arrays()[1], pre)):
            mean = b.astype(np.float64).mean(axis=0)
            sel = U if i < n_rows else np.ones(b.shape[1], bool)
            np.testing.assert_allclose(a[sel], mean[sel], rtol=1e-6, atol=1e-7)
            assert np.array_equal(a[~sel], b[rep.replica][~sel]), "untouched rows are left as they were"
            after = _peer_stack(rep, a).astype(np.float64).mean(axis=0)
            np.testing.assert_allclose(after, mean, rtol=1e-6, atol=1e-7)  # the law: the mean is kept
        assert not layer.touched.any()


def _partial(R, L=300, total_steps=10):
    X, Y = _data(L=L)
    cfg = _cfg("lsh", replicas=R, sync="partial")
    rep = Replicas(cfg, WORLD)
    net = Network(cfg, X.shape[1], Y.shape[1], rep.model, total_steps=total_steps)
    rep.attach(net)
    xp, yp = csr_parts(X), csr_parts(Y, np.float32)
    return rep, net, lambda rows, step: net.train_step(make_batch(xp, yp, rows, step))


def _arrays(net):
    return [rows + whole for rows, whole in (l.sync_arrays() for l in net.layers)]


@needs_replicas
@pytest.mark.parametrize("kind", ["dense", "lsh", "rows"])
@pytest.mark.parametrize("R", LAYOUTS)
def test_partial_pull_averages_each_row_with_the_partners_that_sent_it(R, kind):
    """Replicas train different batches, publish, then (after a barrier) pull every other
    replica's version: on each row, the numpy mean of this replica's value and those of
    the replicas that changed the row; rows no other replica changed stay as they were;
    the replicas' mean is kept on rows every replica changed; moments are untouched."""
    X, Y = _data(L=300)
    cfg = _cfg(kind, replicas=R, sync="partial")
    rep = Replicas(cfg, WORLD)
    net = Network(cfg, X.shape[1], Y.shape[1], rep.model, total_steps=10)
    rep.attach(net)
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 3)
    for k in range(2):
        net.train_step(make_batch(xp, yp, rows(k * R + rep.replica), k + 1))
    before = [[_peer_stack(rep, a) for a in arrs] for arrs in _arrays(net)]
    masks = [_peer_stack(rep, l.touched).astype(bool) for l in net.layers]
    moments = [[a.copy() for a in (l.opt_W.m, l.opt_W.v, l.opt_b.m, l.opt_b.v)] for l in net.layers]
    rep.publish()
    WORLD.barrier()
    assert rep.pull() == R - 1 and rep.group_sizes == [R]
    for l, mom in zip(net.layers, moments):
        assert all(np.array_equal(a, b) for a, b in zip((l.opt_W.m, l.opt_W.v, l.opt_b.m, l.opt_b.v), mom))
    g = rep.replica
    for layer, pre, mask, arrs in zip(net.layers, before, masks, _arrays(net)):
        n_rows = len(layer.sync_arrays()[0])
        others = np.delete(mask, g, axis=0)  # [R - 1, rows]: which partner sent which row
        sent = others.any(axis=0)
        assert sent.any() and (kind != "lsh" or not sent.all() or layer.index == 0)
        for i, (a, b) in enumerate(zip(arrs, pre)):
            b64 = b.astype(np.float64)
            if i < n_rows:
                w = np.concatenate([np.ones((1, mask.shape[1])), np.delete(mask, g, axis=0)]).astype(np.float64)
                stack = np.concatenate([b64[g:g + 1], np.delete(b64, g, axis=0)])
                w = w.reshape(w.shape + (1,) * (b.ndim - 2))
                expect = (stack * w).sum(axis=0) / w.sum(axis=0)
                np.testing.assert_allclose(a[sent], expect[sent], rtol=1e-6, atol=1e-7)
                assert np.array_equal(a[~sent], b[g][~sent]), "rows no partner sent are left alone"
                everyone = mask.all(axis=0)
                after = _peer_stack(rep, a).astype(np.float64).mean(axis=0)
                np.testing.assert_allclose(after[everyone], b64.mean(axis=0)[everyone], rtol=1e-6, atol=1e-7)
            else:  # whole arrays: the mean over every replica
                np.testing.assert_allclose(a, b64.mean(axis=0), rtol=1e-6, atol=1e-7)
    assert rep.sync_bytes() > 0
    rep.close()


@needs_replicas
@pytest.mark.parametrize("R", LAYOUTS)
def test_partial_reader_gets_the_rows_of_every_interval_it_missed(R):
    """Replica 1 trains and publishes three times; replica 0 pulls once: it must average
    every row replica 1 changed in any of the three intervals (levels 1..3), with replica
    1's values at its last version. Then replica 1 publishes once more: a pull now brings
    only the rows of that last interval (gap 1). Replicas >= 2 publish nothing."""
    rep, net, train = _partial(R)
    X, _ = _data(L=300)
    rows = _batches(X, 8)
    out = net.layers[-1]
    masks = []
    for k in range(3):
        if rep.replica == 1:
            train(rows(k), k + 1)
            masks.append(out.touched.astype(bool).copy())
            rep.publish()
    W1 = rep.peer.bcast_object(out.W.copy() if rep.replica == 1 else None, root=1)
    union = rep.peer.bcast_object(np.logical_or.reduce(masks) if rep.replica == 1 else None, root=1)
    last = rep.peer.bcast_object(masks[-1] if rep.replica == 1 else None, root=1)
    assert union.sum() > last.sum() > 0
    WORLD.barrier()
    if rep.replica == 0:
        W0 = out.W.copy()
        assert rep.pull() == 1 and rep.missed == 0
        np.testing.assert_allclose(out.W[union], (W0[union].astype(np.float64) + W1[union]) / 2, rtol=1e-6)
        assert np.array_equal(out.W[~union], W0[~union])
    WORLD.barrier()
    if rep.replica == 1:
        train(rows(3), 4)
        only = out.touched.astype(bool).copy()
        n_rows = [int(l.touched.sum()) for l in net.layers]
        rep.publish()
    W1 = rep.peer.bcast_object(out.W.copy() if rep.replica == 1 else None, root=1)
    only = rep.peer.bcast_object(only if rep.replica == 1 else None, root=1)
    n_rows = rep.peer.bcast_object(n_rows if rep.replica == 1 else None, root=1)
    WORLD.barrier()
    if rep.replica == 0:
        W0 = out.W.copy()
        b0 = rep.sync_bytes()
        assert rep.pull() == 1
        # bytes received: the part lengths, the level counts, then per layer ids and rows of
        # the last interval and the whole arrays
        arrays = [l.sync_arrays() for l in net.layers]
        n_parts = 1 + len(arrays) + sum(len(r) + len(w) for r, w in arrays)
        expect = 8 * n_parts + 8 * len(arrays) * DEPTH + sum(
            8 * n + sum(n * a.nbytes // a.shape[0] for a in r) + sum(a.nbytes for a in w)
            for n, (r, w) in zip(n_rows, arrays))
        assert rep.sync_bytes() - b0 == expect
        np.testing.assert_allclose(out.W[only], (W0[only].astype(np.float64) + W1[only]) / 2, rtol=1e-6)
        assert np.array_equal(out.W[~only], W0[~only]), "rows of intervals already seen do not travel again"
        assert rep.pull() == 0 and rep.group_sizes[-1] == 1, "a version is used once"
    WORLD.barrier()
    rep.close()


@needs_replicas
@pytest.mark.parametrize("R", LAYOUTS)
def test_partial_skips_a_version_older_than_the_staleness_bound(R):
    """A version published when the global counter was c is used while counter - c <=
    stale_limit(R, sync_every), and skipped (never used later) beyond it."""
    from dslide.train.replicas.board import COUNTER
    from dslide.train.replicas.partial import stale_limit

    rep, net, train = _partial(R)
    X, _ = _data(L=300)
    rows = _batches(X, 9)
    limit = stale_limit(R, rep.config.sync_every)
    train(rows(rep.replica), 1)
    rep.publish()
    WORLD.barrier()
    if WORLD.rank == 0:
        rep.board.add(COUNTER, limit + 1)  # more steps dealt since than the bound allows
    WORLD.barrier()
    out_before = net.layers[-1].W.copy()
    assert rep.pull() == 0 and rep.stale_skips == (R - 1 if rep.leader else 0)  # the leader chooses
    assert np.array_equal(net.layers[-1].W, out_before)
    WORLD.barrier()
    assert rep.pull() == 0 and rep.stale_skips == (R - 1 if rep.leader else 0), "a skipped version is not looked at again"
    WORLD.barrier()
    train(rows(R + rep.replica), 2)
    rep.publish()  # published at the current counter: within the bound
    WORLD.barrier()
    W = net.layers[-1].W.copy()
    assert rep.pull() == R - 1
    assert not np.array_equal(net.layers[-1].W, W)
    WORLD.barrier()
    rep.close()


@needs_replicas
@pytest.mark.parametrize("R", LAYOUTS)
def test_partial_sync_never_waits_for_a_replica_that_is_computing(R):
    """Every replica but 0 computes for 2 s without any MPI call (a sleep); meanwhile
    replica 0 synchronises three times: it uses the others' versions published before
    (once), then goes on alone, each synchronisation in well under the 2 s."""
    rep, net, train = _partial(R)
    X, _ = _data(L=300)
    rows = _batches(X, 10)
    train(rows(rep.replica), 1)
    rep.publish()
    WORLD.barrier()
    if rep.replica == 0:
        times, used = [], []
        for k in range(3):
            train(rows(R * (k + 1)), k + 2)
            t0 = time.perf_counter()
            rep.publish()
            used.append(rep.pull())
            times.append(time.perf_counter() - t0)
        assert used == [R - 1, 0, 0] and max(times) < 0.5, (used, times)
    else:
        time.sleep(2.0)
    WORLD.barrier()
    rep.close()


def test_mailbox_gives_the_published_parts_and_refuses_an_overwritten_version():
    """Every rank publishes versions 1..3 of two parts; every rank reads every other's
    version 3 (equal to what was published), version 2 (still in its slot), and version 1
    (overwritten by 3: refused, not torn)."""
    from dslide.comm import Mailbox

    box = Mailbox(WORLD, 1 << 12)

    def parts(rank, v):
        return [np.arange(5 + v, dtype=np.int64) * (rank + 1), np.full(3 * v, rank + v / 4, dtype=np.float32)]

    for v in (1, 2, 3):
        box.publish(v, parts(WORLD.rank, v))
    WORLD.barrier()
    for r in range(WORLD.size):
        for v in (3, 2):
            lengths = box.lengths(r, v, 2)
            assert lengths.tolist() == [8 * (5 + v), 4 * 3 * v]
            got = box.get(r, v, lengths, [(0, int(lengths[0])), (1, 8)], "test")
            want = parts(r, v)
            assert np.array_equal(got[0].view(np.int64), want[0])
            assert np.array_equal(got[1].view(np.float32), want[1][:2])  # a prefix of part 1
        assert box.lengths(r, 1, 2) is None
    WORLD.barrier()
    if WORLD.size > 1:  # a reader that saw version 2's lengths, then the publisher wrote 4 over it
        lengths = box.lengths(1, 2, 2) if WORLD.rank == 0 else None
        WORLD.barrier()
        if WORLD.rank == 1:
            box.publish(4, parts(1, 4))
        WORLD.barrier()
        if WORLD.rank == 0:
            assert box.get(1, 2, lengths, [(0, 8)], "test") is None
    with pytest.raises(ValueError, match="more than its capacity"):
        box.publish(5, [np.zeros(2 << 12, np.uint8)])
    WORLD.barrier()
    box.free()


def _fit_with_delays(R, mode, sync_every, seed):
    """fit() at R replicas on tiny data, every rank sleeping a random time after each step
    (one replica 4x slower); returns (model, global steps this rank trained)."""
    from dslide.datasets.synthetic import generate_split

    train, _ = generate_split("tiny", n_train=480, n_test=10, seed=0)
    cfg = Config(hidden=(16,), batch_size=16, epochs=2, seed=3, replicas=R, sync=mode, sync_every=sync_every,
                 threads=1, log_every=1000)
    rs = np.random.default_rng([seed, WORLD.rank])
    slow = 4.0 if WORLD.rank // (WORLD.size // R) == R - 1 else 1.0
    steps = []

    def callback(event, model, info):
        if event == "step":
            steps.append(info)
            time.sleep(slow * rs.exponential(0.002))

    model, _ = fit(train, cfg, comm=WORLD, callback=callback, index=False)
    return model, steps, 2 * (480 // 16)


@needs_replicas
@pytest.mark.parametrize("mode,sync_every", [("partial", 1), ("partial", 3), ("allreduce", 2)])
@pytest.mark.parametrize("R", LAYOUTS)
def test_replica_runs_finish_under_random_delays_with_every_step_trained_once(R, mode, sync_every):
    """No deadlock (the MPI run has a timeout), every global step trained by exactly one
    replica, and every replica holds the same parameters at the end."""
    t0 = time.monotonic()
    model, steps, T = _fit_with_delays(R, mode, sync_every, seed=sync_every)
    assert time.monotonic() - t0 < 60
    rep = model.replicas
    got = WORLD.allgather_object((rep.replica, rep.shard, steps))
    per_replica = [s for g, p, s in got if p == 0]
    # ranks of one replica train the same steps
    assert all(s == per_replica[g] for g, p, s in got)
    assert sorted(t for s in per_replica for t in s) == list(range(1, T + 1))
    assert model.network.step == T
    for layer in model.network.layers:
        for a in layer.sync_arrays()[0] + layer.sync_arrays()[1]:
            stack = _peer_stack(rep, a)
            assert all(np.array_equal(stack[0], s) for s in stack), "replicas differ after the final point"
    if mode == "partial":
        assert rep.syncs > 0
        # the slow replica takes fewer steps: nobody waited for it at every step
        counts = [len(s) for s in per_replica]
        assert counts[-1] < np.mean(counts[:-1])
    else:
        assert max(map(len, per_replica)) - min(map(len, per_replica)) <= 1


def _uneven(P):
    return tuple(float(1 + 2 * r) for r in range(P))


@pytest.mark.parametrize("hidden", [(7,), (9, 5)])
def test_exact_mode_p_uneven_ranks_equal_one_rank(hidden):
    X, Y = _data()
    P = WORLD.size
    w = _uneven(P)
    cfg = Config(hidden=hidden, exact=True, batch_size=32, input_norm="none", seed=11, lr=1e-2, dropout=0.25,
                 shard_weights=w)
    net_p = Network(cfg, X.shape[1], Y.shape[1], WORLD, total_steps=6)
    net_1 = Network(cfg.replace(shard_weights=()), X.shape[1], Y.shape[1], Comm(), total_steps=6)
    for layer in net_p.layers:  # the asked shares: n_r within 1 of (n - P) w_r / sum(w) + 1
        sizes = WORLD.allgather_object(layer.hi - layer.lo)
        ideal = (layer.n - P) * np.array(w) / sum(w) + 1
        assert sum(sizes) == layer.n and np.all(np.abs(np.array(sizes) - ideal) < 1)
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 4)
    for k in range(6):
        lp = net_p.train_step(make_batch(xp, yp, rows(k), k + 1))
        l1 = net_1.train_step(make_batch(xp, yp, rows(k), k + 1))
        assert float(WORLD.allreduce_sum(np.array([lp]))[0]) == pytest.approx(l1, rel=1e-5)
    for (Wp, bp), (W1, b1) in zip(full_parameters(net_p), full_parameters(net_1)):
        assert np.abs(Wp - W1).max() <= 1e-5 and np.abs(bp - b1).max() <= 1e-5
    assert np.abs(full_parameters(net_1)[0][0] - full_parameters(
        Network(cfg.replace(shard_weights=()), X.shape[1], Y.shape[1], Comm()))[0][0]).max() > 1e-3  # trained


def test_uneven_checkpoint_loads_on_one_rank_and_on_another_split():
    X, Y = _data()
    P = WORLD.size
    cfg = Config(hidden=(9,), exact=True, batch_size=32, input_norm="none", seed=2, lr=1e-2,
                 shard_weights=_uneven(P))
    net = Network(cfg, X.shape[1], Y.shape[1], WORLD, total_steps=3)
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 5)
    for k in range(3):
        net.train_step(make_batch(xp, yp, rows(k), k + 1))
    d = WORLD.bcast_object(tempfile.mkdtemp(prefix="dslide-rep-") if WORLD.rank == 0 else None)
    ck.save(net, d, WORLD)
    path = ck.latest(d)
    ref = full_parameters(net)
    moments = [WORLD.allgather_columns(np.ascontiguousarray(l.opt_W.m), l.bounds, kind="checks") for l in net.layers]
    for comm, weights in ((Comm(), ()), (WORLD, tuple(reversed(_uneven(P)))), (WORLD, ())):
        other = Network(cfg.replace(shard_weights=weights), X.shape[1], Y.shape[1], comm)
        ck.load_into(other, path, comm)
        for (W, b), (W1, b1) in zip(full_parameters(other), ref):
            assert np.array_equal(W, W1) and np.array_equal(b, b1)
        for l, m in zip(other.layers, moments):
            assert np.array_equal(comm.allgather_columns(np.ascontiguousarray(l.opt_W.m), l.bounds, kind="checks"), m)


@pytest.mark.parametrize("kind", ["dense", "lsh", "rows"])
def test_reshard_moves_parameters_and_moments_to_new_shares(kind):
    X, Y = _data()
    cfg = _cfg(kind)
    net = Network(cfg, X.shape[1], Y.shape[1], WORLD, total_steps=4)
    xp, yp, rows = csr_parts(X), csr_parts(Y, np.float32), _batches(X, 6)
    for k in range(3):
        net.train_step(make_batch(xp, yp, rows(k), k + 1))
    w = np.array(_uneven(WORLD.size))[::-1] / sum(_uneven(WORLD.size))
    new = reshard(net, w)
    # the split axis: neurons, or a row-split output's rows (its hidden layer's columns)
    assert [l.bounds.tolist() for l in new.layers] == [shard_bounds(int(l.bounds[-1]), WORLD.size, w).tolist()
                                                       for l in net.layers]
    for (W, b), (W1, b1) in zip(full_parameters(new), full_parameters(net)):
        assert np.array_equal(W, W1) and np.array_equal(b, b1)
    for lo, ln in zip(net.layers, new.layers):
        for key in ("W.m", "W.v"):
            a, b = lo.state()[key], ln.state()[key]
            axis = lo.shard_axes()[key]
            ga = np.concatenate(WORLD.allgather_object(np.array(a)), axis=axis)
            gb = np.concatenate(WORLD.allgather_object(np.array(b)), axis=axis)
            assert np.array_equal(ga, gb)
    if kind == "lsh":
        return  # an LSH layer's blocks depend on its split (tables rebuilt, per-rank samples)
    # exact: it trains on from there like the old layout
    l_new = new.train_step(make_batch(xp, yp, rows(3), 4))
    l_old = net.train_step(make_batch(xp, yp, rows(3), 4))
    assert float(WORLD.allreduce_sum(np.array([l_new]))[0]) == pytest.approx(
        float(WORLD.allreduce_sum(np.array([l_old]))[0]), rel=1e-5)


@pytest.mark.parametrize("hidden", [(16,), (600,)])
def test_auto_shard_weights_reshard_after_measuring(hidden):
    """shard_weights = "auto": after AUTO_STEPS steps every replica is re-split by the
    measured speeds; the run goes on and ends with equal replicas. (600,) over 500 labels:
    the output split by rows, whose shares are of its rows."""
    from dslide.datasets.synthetic import generate_split

    train, _ = generate_split("tiny", n_train=800, n_test=10, seed=0)
    R = LAYOUTS[0] if LAYOUTS else 1
    cfg = Config(hidden=hidden, batch_size=16, epochs=2, seed=3, replicas=R, shard_weights="auto", threads=1)
    model, _ = fit(train, cfg, comm=WORLD, index=False)
    rep = model.replicas
    w = np.array(model.network.shard_weights)
    assert w.shape == (rep.n_shards,) and w.sum() == pytest.approx(1.0) and np.all(w > 0)
    assert model.network.layers[-1].split == ("rows" if hidden == (600,) else "columns")
    for layer in model.network.layers:
        assert layer.bounds.tolist() == shard_bounds(int(layer.bounds[-1]), rep.n_shards, w).tolist()
    assert model.network.step == 2 * (800 // 16)


@needs_replicas
def test_a_replica_run_checkpoint_loads_on_one_rank():
    """fit at R replicas, then the run's checkpoint (replica 0's ranks write it, T.save_model):
    on one rank it holds the replicas' common parameters and replica 0's moments."""
    from dslide.datasets.synthetic import generate_split
    from dslide.train import save_model

    train, _ = generate_split("tiny", n_train=320, n_test=10, seed=1)
    R = LAYOUTS[-1]
    cfg = Config(hidden=(16,), batch_size=16, epochs=1, seed=5, replicas=R, sync="partial", sync_every=2, threads=1)
    model, _ = fit(train, cfg, comm=WORLD, index=False)
    d = WORLD.bcast_object(tempfile.mkdtemp(prefix="dslide-rep-") if WORLD.rank == 0 else None)
    save_model(model, lambda m, c: ck.save(m.network, d, c))
    path = ck.latest(d)
    assert ck.read_manifest(path)["world_size"] == WORLD.size // R
    mine = full_parameters(model.network)
    net = model.network
    m0 = [net.comm.allgather_columns(np.ascontiguousarray(l.opt_W.m.T if l.kind == "lsh" else l.opt_W.m),
                                     l.bounds, kind="checks") for l in net.layers]
    m0 = model.replicas.peer.bcast_object(m0) if R > 1 else m0  # replica 0's
    one = Network(cfg.replace(replicas=1), train.n_features, train.n_labels, Comm())
    ck.load_into(one, path, Comm())
    assert one.step == 2 * 0 + 320 // 16
    for (W, b), (W1, b1) in zip(full_parameters(one), mine):
        assert np.array_equal(W, W1) and np.array_equal(b, b1)
    for l, m in zip(one.layers, m0):
        assert np.array_equal(l.opt_W.m.T if l.kind == "lsh" else l.opt_W.m, m)


def test_board_atomics_lose_no_update_under_contention():
    """Every rank adds 1 to word 0 and increments word 1 by compare-and-swap retries, 300
    times each, interleaved with reads: the totals are exact and every old value seen by
    fetch-and-add is distinct (each was returned to exactly one caller)."""
    from dslide.comm import Board

    board = Board(WORLD, 3)
    seen = []
    for i in range(300):
        seen.append(board.add(0, 1))
        while True:
            old = board.read(1)
            if board.cas(1, old, old + 1) == old:
                break
    WORLD.barrier()
    assert board.read(0) == 300 * WORLD.size and board.read(1) == 300 * WORLD.size
    everyone = sorted(sum(WORLD.allgather_object(seen), []))
    assert everyone == list(range(300 * WORLD.size))
    # swaps: each rank puts its id + 1 in word 2; the old values seen are 0 and all ids but the last
    olds = WORLD.allgather_object(board.swap(2, WORLD.rank + 1))
    WORLD.barrier()
    last = board.read(2)
    assert sorted(olds + [last]) == list(range(WORLD.size + 1))
    WORLD.barrier()
    board.free()


def test_exchange_among_a_subset_returns_every_members_array_in_member_order():
    members = list(range(0, WORLD.size, 2))  # ranks 0, 2, ...: the others go on without calling it
    if WORLD.rank in members:
        mine = np.arange(WORLD.rank + 3, dtype=np.int64) * (WORLD.rank + 1)
        got = WORLD.exchange(members, mine, 0x77, "test")
        for m, arr in zip(members, got):
            assert np.array_equal(arr, np.arange(m + 3, dtype=np.int64) * (m + 1))
    WORLD.barrier()
