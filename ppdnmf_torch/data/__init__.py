"""Data matrices (synthetic, MIT-CBCL faces, .npy, .csv) and their column split.

The data matrix ``Z (L x M)`` is split by columns over ``N`` agents,
``Z = [Z_1, ..., Z_N]``. numpy, scipy and PIL are imported inside the file
loaders only, so the numerical core stays plain torch.

* :mod:`.synthetic`: the paper's synthetic data and sparse Poisson counts;
* :mod:`.cbcl`: the MIT-CBCL faces;
* :mod:`.files`: ``.npy`` and ``.csv`` matrices and :func:`load_matrix` by kind;
* :mod:`.split`: the split of the columns over the agents.
"""
from __future__ import annotations

from .cbcl import CBCL_HINT, CBCL_SHAPE, load_cbcl
from .files import DATA_KINDS, load_csv, load_matrix, load_npy, matrix_shape
from .split import split_columns, split_counts
from .synthetic import SyntheticData, sparse_poisson, synthetic

__all__ = [
    "SyntheticData",
    "synthetic",
    "sparse_poisson",
    "load_cbcl",
    "load_npy",
    "load_csv",
    "load_matrix",
    "matrix_shape",
    "split_counts",
    "split_columns",
    "DATA_KINDS",
    "CBCL_SHAPE",
    "CBCL_HINT",
]
