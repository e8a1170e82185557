"""A whole training step does not depend on numba's thread count, and a layer built at
fewer threads than it later trains with stays in bounds.

Each case runs in a fresh process with NUMBA_NUM_THREADS=2 and BLAS held to one thread
(the BLAS products may round differently with another thread count; numba's kernels
must not). numba checks no bounds inside prange bodies (not even with
NUMBA_BOUNDSCHECK=1), so a scratch row written past its array shows only in the
results: built at 1 thread and trained at 2, the old per-build scratch changed them.
"""

import json
import os
import subprocess
import sys

import pytest

_CASE = r"""
import hashlib, json, sys
import numba
import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

from dslide import train as T
from dslide.config import Config, LSHConfig
from dslide.datasets.synthetic import generate_split
from dslide.model import inputs as I
from dslide.model.network import Network

kind = sys.argv[1]
data, _ = generate_split("tiny", n_train=300, n_test=10, seed=1)
base = dict(hidden=(24,), batch_size=64, lr=1e-2, epochs=1, seed=3, dropout=0.25)
if kind == "dense":
    cfg = Config(kinds=("dense", "dense"), **base)
else:
    cfg = Config(kinds=("dense", "lsh"), lsh=LSHConfig(K=3, L=8, range_pow=6, capacity=16, min_active=40,
                 min_active_share=0.5, max_active=24, rehash_every=2, rebuild_every=3), **base)
cfg = cfg.resolve(data.n_labels)
numba.set_num_threads(1)
from dslide.model import kernels as K
assert K.thread_scratch(5, np.float32).shape == (2, 5)  # a row for every thread numba may run later
out = {}
with threadpool_limits(1, user_api="blas"):
    for build, run in ((1, 2), (2, 2), (1, 1), (2, 1)):
        numba.set_num_threads(build)
        net = Network(cfg, data.n_features, data.n_labels)
        X = I.normalise_inputs(data.X, cfg.input_norm, net.dtype)
        Xp, Yp = I.csr_parts(X), I.csr_parts(sp.csr_matrix(data.Y), np.float32)
        net.set_total_steps(5)
        numba.set_num_threads(run)
        losses = [net.train_step(I.make_batch(Xp, Yp, T.batch_rows(cfg, X.shape[0], s), s)) for s in range(1, 6)]
        h = hashlib.sha256(np.array(losses).tobytes())
        for layer in net.layers:
            for name, a in sorted(layer.state().items()):
                h.update(name.encode() + np.ascontiguousarray(a).tobytes())
        out[f"{build}->{run}"] = h.hexdigest()
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["dense", "lsh"])
def test_training_steps_are_identical_at_1_and_2_threads_and_stay_in_bounds(kind):
    env = {**os.environ, "NUMBA_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _CASE, kind], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    digests = json.loads(p.stdout.strip().splitlines()[-1])
    # built at 1 thread and trained at 2 (the scratch rows were sized at build time), at 2 and 2,
    # at 1 and 1, at 2 and 1: the same losses, weights, moments and hash tables
    assert len(set(digests.values())) == 1, digests
