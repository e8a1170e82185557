"""Locality-sensitive hash families and fixed-capacity hash tables (numba kernels)."""
