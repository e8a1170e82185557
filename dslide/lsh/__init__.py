"""Locality-sensitive hash families and fixed-capacity hash tables (numba kernels).

Kernels import nothing of dslide but its SplitMix64 (`dslide.rng`) and the
numba cache key (`dslide._numba_cache`).

Families (one module each) share one interface: `Family(dim, K, L, seed, **params)`
draws its parameter arrays from `np.random.default_rng(seed)` alone;
attributes name, dim, K, L, code_bits; `hash(vectors float32 [n, dim],
range_pow=None) -> int32 [n, L]` bucket codes (parallel over rows);
`hash_values(vectors) -> int32 [n, K*L]` the individual hash values.

    srp      signed random projections (SimHash), sparse +-1 projections
    dwta     densified winner-take-all (SLIDE's choice for ReLU activations)
    wta      winner-take-all over random permutations
    minhash  densified one-permutation MinHash of the non-zero set (also CSR input)

`HashTables(family, range_pow, capacity, policy)` stores the tables as flat
int32 arrays of fixed-capacity buckets and offers build / update / query;
`CompactTables(family, range_pow)` does the same with buckets sized to what
they hold (lsh.compact).

`AnchorTables` (lsh.anchors) is the data-dependent alternative for maximum
inner product search with biases: queries hash to their nearest k-means
anchor (lsh.kmeans), whose bucket holds the items scoring highest there; what
a query's buckets retrieve is re-ranked exactly (lsh.rerank). `NeighborIndex`
(lsh.neighbors) finds a query's nearest training points on a k-NN graph; an
output layer's inference index adds their labels to the query's bucket.

MinHash hashes the non-zero set of a vector, and a dslide layer's weight rows
are dense (every row's set is every input), so it applies to sparse inputs
only (CSR `hash_csr`); what a layer picks its neurons with is
dslide.model.candidates.SOURCES.
"""

from __future__ import annotations

from ._common import HashFamily
from .dwta import DWTA
from .minhash import MinHash
from .srp import SRP
from . import anchors, kmeans, neighbors, rerank
from .anchors import AnchorTables
from .compact import CompactTables
from .neighbors import NeighborIndex
from .tables import HashTables
from .wta import WTA

FAMILIES = {"srp": SRP, "dwta": DWTA, "wta": WTA, "minhash": MinHash}


def make_family(name: str, dim: int, K: int, L: int, seed: int, **params) -> HashFamily:
    """The hash family `name` with K hashes per table, L tables, parameters from `seed`.

    Raises ValueError for an unknown name or a parameter the family does not take.
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown hash family {name!r}; valid: {', '.join(FAMILIES)}")
    cls = FAMILIES[name]
    unknown = sorted(set(params) - set(cls.PARAMS))
    if unknown:
        valid = ", ".join(cls.PARAMS) or "none"
        raise ValueError(f"hash family {name!r} takes no parameter {', '.join(map(repr, unknown))}; "
                         f"valid parameters: {valid}")
    return cls(dim, K, L, seed, **params)


__all__ = ["FAMILIES", "AnchorTables", "CompactTables", "NeighborIndex", "make_family", "HashFamily", "HashTables", "SRP", "DWTA", "WTA", "MinHash"]
