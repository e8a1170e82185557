"""numba's on-disk cache of parallel kernels survives a change of thread count.

STYLE.md kept parallel=True kernels uncached because cache=True on them once crashed
when the thread count changed (pynndescent's history, an old numba). With numba 0.68
a cached parallel kernel, compiled at one thread count, loads from the cache and
computes the same in fresh processes at another; dslide's kernels are cached, so a
run's start-up no longer compiles them.
"""

import json
import os
import subprocess
import sys

import pytest

_KERNEL = '''
import numpy as np
from numba import get_thread_id, njit, prange


@njit(parallel=True, cache=True)
def rowsum(x, scratch):
    out = np.empty(x.shape[0])
    for i in prange(x.shape[0]):
        s = scratch[get_thread_id()]
        s[0] = 0.0
        for k in range(x.shape[1]):
            s[0] += x[i, k]
        out[i] = s[0]
    return out
'''

_RUN = '''
import json, sys
import numba
import numpy as np
sys.path.insert(0, sys.argv[1])
import cached_kernel as m
if sys.argv[2] != "-":
    numba.set_num_threads(int(sys.argv[2]))
x = np.arange(60000.0).reshape(10000, 6)
out = m.rowsum(x, np.zeros((numba.config.NUMBA_NUM_THREADS, 1)))
print(json.dumps({"right": bool(np.array_equal(out, x.sum(axis=1))), "threads": numba.get_num_threads(),
                  "hits": sum(m.rowsum.stats.cache_hits.values()),
                  "misses": sum(m.rowsum.stats.cache_misses.values())}))
'''


def _fresh(code, *args, threads):
    env = {**os.environ, "NUMBA_NUM_THREADS": str(threads)}
    env.pop("NUMBA_CACHE_DIR", None)
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("first", [1, 2])
def test_a_cached_parallel_kernel_loads_and_runs_at_another_thread_count(tmp_path, first):
    (tmp_path / "cached_kernel.py").write_text(_KERNEL)
    r = _fresh(_RUN, tmp_path, "-", threads=first)
    assert r == {"right": True, "threads": first, "hits": 0, "misses": 1}  # compiled and saved
    for threads, set_to in ((3 - first, "-"), (2, 1), (2, 2), (first, "-")):
        r = _fresh(_RUN, tmp_path, set_to, threads=threads)
        want_threads = threads if set_to == "-" else set_to
        assert r == {"right": True, "threads": want_threads, "hits": 1, "misses": 0}, (threads, set_to)


_STEP = '''
import json
import numba
import numpy as np
import scipy.sparse as sp
from numba.core.registry import CPUDispatcher

import dslide
from dslide import train as T
from dslide.infer.predict import predict_topk
from dslide.config import Config, LSHConfig
from dslide.datasets.synthetic import generate_split

data, _ = generate_split("tiny", n_train=200, n_test=10, seed=2)
for kinds in (("dense", "dense"), ("dense", "lsh")):
    cfg = Config(hidden=(16,), kinds=kinds, batch_size=64, epochs=1, threads=0, dropout=0.5, lr=1e-2,
                 lsh=LSHConfig(K=2, L=4, range_pow=5, capacity=8, min_active=20, max_active=8, rehash_every=1,
                               rebuild_every=2))
    model, _ = T.fit(data, cfg)
    predict_topk(model, data.X, 3)
    predict_topk(model, data.X, 3, exact=False)
import sys
stats = {}
for name, mod in list(sys.modules.items()):
    if name.startswith("dslide"):
        for attr, f in vars(mod).items():
            if isinstance(f, CPUDispatcher) and f.signatures:
                stats[f"{name}.{attr}"] = [sum(f.stats.cache_hits.values()), sum(f.stats.cache_misses.values()),
                                           bool(f.targetoptions.get("parallel"))]
print(json.dumps(stats))
'''


def test_a_training_run_compiles_no_dslide_kernel_when_the_cache_is_warm():
    """After one run (at 1 thread), a fresh run at 2 threads loads every kernel it uses -
    the parallel ones included - from numba's cache: no compilation."""
    _fresh(_STEP, threads=1)
    stats = _fresh(_STEP, threads=2)
    assert sum(1 for _, _, parallel in stats.values() if parallel) >= 8  # the step's parallel kernels ran
    compiled = {k: v for k, v in stats.items() if v[1]}
    assert not compiled, compiled
