"""Seconds of each stage of `--lsh` scoring, per rank, twice (the first call compiles what
numba's cache lacks; the second is the warm cost).

    mpiexec -n 2 python -m mpi4py -m scripts.lsh_stages RUN_DIR TEST_DATA
    NUMBA_CACHE_DIR=$(mktemp -d) python -m scripts.lsh_stages RUN_DIR TEST_DATA   (an empty cache)

Stages (dslide.network.LSHLayer.topk): the hidden vectors, the anchor codes, the
nearest training points (each rank a share, then one all-gather), their labels
(extras), the re-ranking of the buckets (topk_by_anchor), then a barrier (how long
a rank waits for the slowest).
"""

import argparse
import time

import numpy as np
import scipy.sparse as sp

import dslide
from dslide import inputs as I
from dslide.comm import Comm
from dslide.infer.index import _nearest_points
from dslide.session import load_model


def main(run_dir: str, data_path: str) -> None:
    comm = Comm.world()
    t0 = time.perf_counter()
    model = load_model(run_dir, comm)
    load_s = time.perf_counter() - t0
    data = dslide.read_data(data_path)
    net, out, index = model.network, model.network.layers[-1], model.index
    parts = I.csr_parts(sp.csr_matrix(data.X), net.dtype)
    batch = I.make_batch(parts, None, np.arange(data.n_points), net.step,
                         norms=I.input_norms(data.X, model.config.input_norm))
    for rep in ("first", "second"):
        comm.barrier()
        tm = {}
        t = time.perf_counter()
        x = np.ascontiguousarray(net.hidden(batch).dense(), dtype=np.float32)
        tm["hidden"] = time.perf_counter() - t
        t = time.perf_counter()
        codes = index.tables.codes(x, out.lc.index_probes)
        tm["codes"] = time.perf_counter() - t
        t = time.perf_counter()
        nn = _nearest_points(index.neighbors, x, codes[:, 0], out.lc.index_search, out.lc.index_neighbors, comm)
        tm["nearest"] = time.perf_counter() - t
        t = time.perf_counter()
        extras = index.neighbors.extras(nn, out.lo, out.lo + out.n_local)
        tm["extras"] = time.perf_counter() - t
        t = time.perf_counter()
        index.tables.topk(x, out.W, out.b, 5, out.lc.index_probes, extras=extras, codes=codes)
        tm["topk"] = time.perf_counter() - t
        t = time.perf_counter()
        comm.barrier()
        tm["barrier"] = time.perf_counter() - t
        print(f"rank {comm.rank} ({rep} call; model loaded in {load_s:.1f} s): "
              + ", ".join(f"{k} {v:.2f} s" for k, v in tm.items()), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a run directory with an LSH output layer and its inference index")
    ap.add_argument("test_data", help="the points to score")
    a = ap.parse_args()
    main(a.run_dir, a.test_data)
