"""The generators' data, byte for byte: a digest of each split's CSR arrays, pinned.

The digests were computed at 0f62d34, before synthetic.py was split into
presets.py, draws.py and stats.py; a change of any generated array (a kernel,
a random stream, a preset) changes them. Each family is covered, since the
three share the moved kernels.
"""

import hashlib

import numpy as np
import pytest

from dslide.datasets import suite

PINNED = [
    (("tiny", None, None, 0), "56f7f90d62df3c6894126e9cc933fc4c"),
    (("tiny", None, None, 1), "bd9f71b0bac7127ebb30cf3f6e499a79"),
    (("small", 3000, 300, 0), "e8dc8d4404486b6e591f8fa101ca3c46"),
    (("amazon-like", 500, 50, 3), "c71f1281ea20a7644289a46e2fed7232"),
    (("baskets-head", 500, 50, 0), "a7bdceb2c94c1a5428b134d79414f0b4"),
    (("a670k-head", 500, 50, 2), "9bab08276bad3355a5c5caf6cbce3ef6"),
]


def digest(pair) -> str:
    """sha256 (first 32 hex digits) of both splits' X and Y: shape, indptr, indices, data."""
    h = hashlib.sha256()
    for d in pair:
        for m in (d.X, d.Y):
            h.update(np.asarray(m.shape, np.int64).tobytes())
            for a in (m.indptr, m.indices, m.data):
                h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:32]


@pytest.mark.parametrize("case, expected", PINNED, ids=[f"{c[0]}-s{c[3]}" for c, _ in PINNED])
def test_generated_data_are_byte_identical(case, expected):
    assert digest(suite.generate_split(*case)) == expected
