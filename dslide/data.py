"""Extreme-classification (XMC) data: the text format, a fast reader and writer.

(Placeholder: the reader lands with the foundation issue.)
"""

from __future__ import annotations

from dataclasses import dataclass

import scipy.sparse as sp


@dataclass
class XMCData:
    """A multi-label data set.

    X: csr_matrix float32 [n_points, n_features], the features.
    Y: csr_matrix float32 [n_points, n_labels], ones where a label applies.
    """

    X: sp.csr_matrix
    Y: sp.csr_matrix

    @property
    def n_points(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]

    @property
    def n_labels(self) -> int:
        return self.Y.shape[1]


class XMCFormatError(ValueError):
    """Malformed XMC text: the message names the file, the line and what was expected."""
