"""The run's timings object, the trivial synchronisation schedule of the loop, and the
owners of the layers' masks (touched: the layer; dirty: the candidate source)."""

import numpy as np
import scipy.sparse as sp

from dslide.config import Config, LSHConfig
from dslide.model.inputs import csr_parts, make_batch
from dslide.model.network import Network
from dslide.timings import STEP_PHASES, Timings, upkeep_name
from dslide.train import Alone, checkpoint_steps


def test_timings_add_by_name_and_time_a_block():
    t = Timings()
    assert t["forward"] == 0.0 and "forward" not in t
    t.add("forward", 1.5)
    t.add("forward", 0.25)
    with t.time("backward"):
        pass
    assert t["forward"] == 1.75 and t["backward"] >= 0.0
    assert list(t.subset(("backward", "lsh_query", "forward"))) == ["backward", "forward"]


def test_alone_deals_every_step_in_order_and_checkpoints_at_its_steps():
    saved = []
    s = Alone()
    net = object()
    step = s.start(net, 3, 9, checkpoint_steps(Config(checkpoint_every=4), 3, 12),
                   lambda n, t: saved.append((n, t)))
    got = []
    while step is not None:
        got.append(step)
        step = s.after_step(step, stop=False)
    assert got == [4, 5, 6, 7, 8, 9] and saved == [(net, 4), (net, 8)]
    assert s.start(net, 9, 9) is None
    s.start(net, 0, 9)
    assert s.after_step(1, stop=True) is None and s.stop_at_log() and s.record() == {}


def test_checkpoint_steps_leave_out_the_last_step_of_the_schedule():
    assert checkpoint_steps(Config(checkpoint_every=5), 0, 15) == [5, 10]
    assert checkpoint_steps(Config(checkpoint_every=5), 7, 16) == [10, 15]
    assert checkpoint_steps(Config(checkpoint_every=0), 0, 15) == []


def _lsh_net():
    cfg = Config(hidden=(8,), kinds=("dense", "lsh"), input_norm="none", seed=2, dropout=0.0,
                 lr_schedule="constant", lsh=LSHConfig(family="dwta", K=2, L=4, bin_size=4, min_active=6,
                                                       max_active=4, rehash_every=1000))
    return Network(cfg, 30, 40)


def test_take_touched_gives_the_changed_rows_once():
    rs = np.random.default_rng(0)
    X = sp.random(20, 30, density=0.4, format="csr", random_state=0, dtype=np.float32)
    Y = sp.csr_matrix((rs.random((20, 40)) < 0.05) | (np.arange(40)[None] == rs.integers(0, 40, 20)[:, None]),
                      dtype=np.float32)
    net = _lsh_net()
    net.train_step(make_batch(csr_parts(X), csr_parts(Y, np.float32), np.arange(20), 1))
    for layer in net.layers:
        ids = layer.take_touched()
        assert ids.size > 0 and ids.dtype == np.int64 and np.all(np.diff(ids) > 0)
        assert layer.take_touched().size == 0 and not layer.touched.any()
    out = net.layers[1]
    assert out.candidates.dirty.any(), "the update kernel marked its rows stale"


def test_the_candidate_source_owns_dirty_and_clears_it_at_upkeep():
    net = _lsh_net()
    out = net.layers[1]
    src = out.candidates
    out.rows_synced(np.array([1, 3], dtype=np.int64))
    assert src.stale_mask() is src.dirty and np.flatnonzero(src.dirty).tolist() == [1, 3]
    assert out.state()["dirty"] is src.dirty
    assert src.maintain(src.rehash.next, out.W, out.b) in ("rehash", "rebuild") and not src.dirty.any()


def test_the_network_layers_and_upkeep_share_one_timings_object():
    t = Timings()
    net = Network(_lsh_net().config, 30, 40, timings=t)
    assert all(layer.timings is t for layer in net.layers)
    assert upkeep_name(1) in t and net.layers[1].upkeep_s == t[upkeep_name(1)]
    assert set(net.timers) <= set(STEP_PHASES)
