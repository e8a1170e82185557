"""threads = 0: each rank takes its node's cores divided by the node's ranks (dslide.comm.node)."""

import pytest

from dslide.comm import node as C


@pytest.mark.parametrize("node, own, ranks, want", [
    (2, 2, 1, 2),    # one process: every core
    (2, 2, 2, 1),    # mpiexec -n 2 on 2 cores: one each
    (2, 2, 3, 1),    # more ranks than cores: still one
    (16, 16, 4, 4),  # 4 ranks on 16 cores
    (16, 4, 4, 4),   # bound by the launcher to 4 cores: its own 4
    (16, 1, 16, 1),  # bound to one core
])
def test_default_threads_divide_the_node(node, own, ranks, want, monkeypatch):
    monkeypatch.setattr(C.os, "cpu_count", lambda: node)
    monkeypatch.setattr(C, "cores", lambda: own)
    monkeypatch.setattr(C, "_NODE_RANKS", [ranks])
    assert C.default_threads() == want


def test_notice_only_when_the_threads_exceed_the_cores(monkeypatch):
    monkeypatch.setattr(C.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(C, "cores", lambda: 2)
    monkeypatch.setattr(C, "_NODE_RANKS", [2])
    assert C.oversubscription(1) is None
    assert C.oversubscription(2) == ("dslide: notice: 2 thread(s) x 2 rank(s) on this node on 2 core(s): threads "
                                     "will take turns on the cores (threads = 0 gives each rank its share, 1)")
    monkeypatch.setattr(C, "_NODE_RANKS", [1])
    assert C.oversubscription(2) is None and C.oversubscription(3) is not None


def test_training_threads_follow_the_split_and_numba_caps_them(monkeypatch):
    import numba

    from dslide.config import Config
    from dslide.train import loop as T

    monkeypatch.setattr(T, "default_threads", lambda: 1)
    assert T.rank_threads(Config()) == 1
    assert T.rank_threads(Config(threads=1024)) == numba.config.NUMBA_NUM_THREADS
