"""dslide: Distributed SLIDE for CPU clusters.

LSH-sparse layers pick, per sample, the few neurons of a huge layer that
matter; wide layers are split column-wise over MPI ranks and only sparse
activations and gradients cross the network.
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys
import time as _time

#: time.perf_counter() when dslide was first imported. For the dslide command that is
#: the process's start but for the interpreter's own (its imports of numpy, scipy and
#: numba come later): the origin of the start-up times in metrics.json.
IMPORTED_AT = _time.perf_counter()

# numba's parallel kernels (GNU OpenMP) and the BLAS products (OpenBLAS)
# take turns on the same cores. By default both keep their idle threads
# spinning for a while after each call, so with 2 threads each steals the
# cores from the other: measured on the `small` preset, 2 threads ran at 2,588
# samples/s against 4,532 for 1 thread; with idle threads sleeping, 6,306.
# Set before numba or OpenBLAS start their threads; a user's own setting wins.
# OpenBLAS reads its variable when it loads, with numpy: a program that
# imported numpy before dslide keeps spinning BLAS threads (unless it set the
# variable itself), and training then runs its BLAS products on one thread
# when it has LSH layers (dslide.train.loop._blas_threads).
BLAS_THREADS_SLEEP = "OPENBLAS_THREAD_TIMEOUT" in _os.environ or "numpy" not in _sys.modules
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")


# The public surface, imported on first use (PEP 562): `import dslide` stays cheap (no numpy,
# numba or scipy yet), and the environment above is set before any of them loads.
_PUBLIC = {"Model": "dslide.api", "labels_matrix": "dslide.api", "XMCData": "dslide.io.data",
           "read_xmc": "dslide.io.data", "write_xmc": "dslide.io.data", "read_data": "dslide.io.formats",
           "write_data": "dslide.io.formats", "write_predictions": "dslide.io.formats",
           "evaluate": "dslide.metrics", "inverse_propensity": "dslide.metrics"}
__all__ = ["Model", "XMCData", "read_data", "write_data", "read_xmc", "write_xmc", "write_predictions",
           "labels_matrix", "evaluate", "inverse_propensity", "__version__"]


def __getattr__(name):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dslide' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
