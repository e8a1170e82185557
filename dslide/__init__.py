"""dslide: Distributed SLIDE for CPU clusters.

LSH-sparse layers pick, per sample, the few neurons of a huge layer that
matter; wide layers are split column-wise over MPI ranks and only sparse
activations and gradients cross the network.
"""

__version__ = "0.1.0"
