"""dslide: Distributed SLIDE for CPU clusters.

LSH-sparse layers pick, per sample, the few neurons of a huge layer that
matter; wide layers are split column-wise over MPI ranks and only sparse
activations and gradients cross the network.
"""

__version__ = "0.1.0"

import os as _os

# numba's parallel kernels (GNU OpenMP) and the BLAS products (OpenBLAS)
# take turns on the same cores. By default both keep their idle threads
# spinning for a while after each call, so with 2 threads each steals the
# cores from the other: measured on the `small` preset, 2 threads ran at 2,588
# samples/s against 4,532 for 1 thread; with idle threads sleeping, 6,306.
# Set before numba or OpenBLAS start their threads; a user's own setting wins.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
