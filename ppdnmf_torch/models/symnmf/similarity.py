"""The similarity matrix of Kuang, Ding and Park (SymNMF, 2015, Sec. 7.1 steps 1-3).

As docs/SYMMETRIC_NMF.md ("Graph clustering") gives it, and as the authors' MATLAB
``calcu_similarity_matrix.m`` (with Kuang's ``scale_dist3_knn``) computes it, for samples
``M (n, p)`` (one sample per row):

1. ``D_ij = ||m_i - m_j||^2`` (squared Euclidean distances);
2. each point's ``kk = floor(log2 n) + 1`` nearest neighbours (not itself) give a kNN
   graph made symmetric: ``i ~ j`` if either is among the other's neighbours;
   ``A_ij = exp(-D_ij / (sigma_i sigma_j))`` on its edges, ``sigma_i`` the (unsquared)
   distance of ``i`` to its 7th nearest neighbour, ``A_ii = 0``, zero elsewhere;
3. ``A <- D^{-1/2} A D^{-1/2}`` with the degrees the column sums of ``A``, then
   ``(A + A^T) / 2``.

The neighbour search runs in torch on the samples' device (the GPU when there is one),
a block of rows at a time, so that memory stays ``O(n kk + block n)``; the output is a
dense tensor or a torch sparse CSR matrix of ``O(n kk)`` entries.

Choices (each pinned by a test in ``tests/test_symnmf_clustering.py``):

* **self first**: a point is its own 0th neighbour even when another point coincides
  with it (Kuang's code sorts a column of ``D`` and drops the point itself; with ties the
  sort may put a duplicate first, and this construction keeps the point's duplicate as a
  neighbour instead of the point itself);
* **values from differences**: ``D_ij`` on an edge, and ``sigma_i^2``, are recomputed as
  ``sum_k (m_ik - m_jk)^2``, exactly symmetric, free of the cancellation of
  ``|m_i|^2 + |m_j|^2 - 2 m_i . m_j`` (which serves only to rank the neighbours) and
  independent of the block size;
* **coincident points**: ``sigma_i sigma_j = 0`` (seven or more copies of a point) gives
  ``A_ij = 1`` when ``D_ij = 0`` (the limit of the kernel along equal points) and ``0``
  otherwise, where Kuang's code would give ``NaN``.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from ..._utils import resolve_device, resolve_dtype, sparse_csr
from ...errors import ConfigError, DataError, DegenerateResultWarning

__all__ = ["similarity_matrix", "knn_graph", "default_neighbors", "SCALE_NEIGHBOR", "DENSE_MAX_N"]

#: ``sigma_i`` is the distance of point ``i`` to this nearest neighbour (Kuang et al.'s 7)
SCALE_NEIGHBOR = 7
#: ``sparse="auto"`` returns a dense matrix up to this many points, sparse CSR beyond
DENSE_MAX_N = 5000
#: bytes of one block of the distance rows (the neighbour search's working memory)
_BLOCK_BYTES = 256 * 2**20


def default_neighbors(n: int) -> int:
    """``kk = floor(log2 n) + 1``, the number of nearest neighbours per point (Kuang et al.)."""
    return int(math.floor(math.log2(n))) + 1


def _as_samples(M, device, dtype) -> torch.Tensor:
    if isinstance(M, torch.Tensor):
        if M.layout != torch.strided:
            raise DataError("M: the samples must be a dense matrix (n_samples, n_features)")
        t = M
    else:
        try:
            arr = np.asarray(M)
            t = torch.as_tensor(arr if arr.flags.writeable else arr.copy())
        except (TypeError, ValueError) as exc:
            raise DataError(f"M: cannot read the samples as a matrix ({exc})") from None
    if t.dim() != 2:
        raise DataError(f"M: expected a 2-D matrix (n_samples, n_features), got shape {tuple(t.shape)}")
    if not (t.is_floating_point() or t.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)):
        raise DataError(f"M: expected numbers, got dtype {t.dtype}")
    dtype = dtype if dtype is not None else (t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float64)
    t = t.to(device=device, dtype=resolve_dtype(dtype))
    if not bool(torch.isfinite(t).all()):
        raise DataError("M: the samples hold NaN or Inf")
    return t


def knn_graph(M: torch.Tensor, k: int, *, block_rows: int | None = None):
    """The ``k`` nearest neighbours of every row of ``M (n, p)``, itself excluded.

    Parameters
    ----------
    M : Tensor (n, p)
    k : int
        ``1 <= k <= n - 1``.
    block_rows : int, optional
        Rows of the distance matrix formed at once (default: 256 MiB worth).

    Returns
    -------
    dist : Tensor (n, k)
        Squared distances in increasing order (ties in index order), from the expanded
        form ``|m_i|^2 + |m_j|^2 - 2 m_i . m_j`` clamped at 0.
    idx : LongTensor (n, k)
        The neighbours' indices.
    """
    n = M.shape[0]
    sq = M.square().sum(1)
    if block_rows is None:
        block_rows = max(1, _BLOCK_BYTES // max(1, n * M.element_size()))
    dists, idxs = [], []
    for lo in range(0, n, block_rows):
        hi = min(n, lo + block_rows)
        D = torch.addmm(sq[lo:hi, None] + sq[None, :], M[lo:hi], M.T, alpha=-2.0).clamp_min_(0.0)
        rows = torch.arange(lo, hi, device=M.device)
        D[rows - lo, rows] = -1.0  # the point itself first, even among coincident points
        d, i = torch.topk(D, k + 1, dim=1, largest=False, sorted=True)
        dists.append(d[:, 1:])
        idxs.append(i[:, 1:])
    return torch.cat(dists), torch.cat(idxs)


def _edge_sq_dist(M: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``sum_k (M[i, k] - M[j, k])^2`` per edge, a block of edges at a time."""
    out = torch.empty(i.numel(), dtype=M.dtype, device=M.device)
    step = max(1, _BLOCK_BYTES // max(1, M.shape[1] * M.element_size()))
    for lo in range(0, i.numel(), step):
        hi = min(i.numel(), lo + step)
        out[lo:hi] = (M[i[lo:hi]] - M[j[lo:hi]]).square().sum(1)
    return out


def similarity_matrix(M, *, n_neighbors: int | None = None, scale_neighbor: int = SCALE_NEIGHBOR,
                      sparse="auto", device="auto", dtype=None, block_rows: int | None = None) -> torch.Tensor:
    """Kuang et al.'s normalized self-tuned kNN similarity ``X (n, n)`` of the rows of ``M``.

    Parameters
    ----------
    M : array-like or Tensor (n, p)
        One sample per row (integers are converted to ``dtype``).
    n_neighbors : int, optional
        ``kk``, neighbours per point (default ``floor(log2 n) + 1``; at most ``n - 1``).
    scale_neighbor : int
        ``sigma_i`` is the distance to this neighbour (default 7; at most ``n - 1``).
    sparse : {"auto", True, False}
        A torch sparse CSR result (True), dense (False), or dense up to
        :data:`DENSE_MAX_N` points (``"auto"``).
    device : {"auto", "cpu", "cuda"} or torch.device
        Where the neighbour search runs; ``"auto"``: ``M``'s device for a tensor on CUDA,
        else CUDA when there is one.
    dtype : torch dtype or name, optional
        Default: ``M``'s floating dtype, float64 for integers.
    block_rows : int, optional
        Rows of the distance matrix formed at once (:func:`knn_graph`).

    Returns
    -------
    X : Tensor (n, n), dense or sparse CSR
        Symmetric, nonnegative, zero diagonal.

    Raises
    ------
    DataError
        ``M`` is not a finite 2-D matrix of at least 3 rows.
    ConfigError
        A bad ``n_neighbors``, ``scale_neighbor`` or ``sparse``.
    """
    if isinstance(M, torch.Tensor) and M.is_cuda and device == "auto":
        dev = M.device
    else:
        dev = resolve_device(device)
    M = _as_samples(M, dev, dtype)
    n = M.shape[0]
    if n < 3:
        raise DataError(f"M: need at least 3 samples, got {n}")
    if bool((M == M[0]).all()):
        what = "all zero" if not bool(M[0].any()) else "the same sample"
        warnings.warn(f"M: all {n} samples are identical ({what}): every pair of neighbours gets the same "
                      "similarity, so the clusters say nothing about the data", DegenerateResultWarning, stacklevel=2)
    kk = default_neighbors(n) if n_neighbors is None else n_neighbors
    for key, v in (("n_neighbors", kk), ("scale_neighbor", scale_neighbor)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{key}: expected an integer >= 1, got {v!r}")
    # Kuang's code lowers both to n - 1 on small data
    kk, nn = min(int(kk), n - 1), min(int(scale_neighbor), n - 1)
    if sparse not in ("auto", True, False):
        raise ConfigError(f"sparse: expected 'auto', True or False, got {sparse!r}")
    dist, idx = knn_graph(M, max(kk, nn), block_rows=block_rows)
    nodes = torch.arange(n, device=dev)
    # sigma from the exact difference as well: the expanded form's rounding depends on the block
    sigma = _edge_sq_dist(M, nodes, idx[:, nn - 1]).sqrt()
    # step 2: the symmetric kNN graph, each undirected edge once per direction
    rows = nodes.repeat_interleave(kk)
    cols = idx[:, :kk].reshape(-1)
    keys = torch.unique(torch.cat([rows * n + cols, cols * n + rows]))  # sorted: CSR order
    i, j = keys // n, keys % n
    d = _edge_sq_dist(M, i, j)
    scale = sigma[i] * sigma[j]
    ratio = torch.where(scale > 0, d / scale.clamp_min(torch.finfo(M.dtype).tiny),
                        torch.where(d > 0, torch.inf, 0.0))
    a = torch.exp(-ratio)
    # step 3: D^{-1/2} A D^{-1/2} with column sums, then (A + A^T) / 2 (the reverse edge's value)
    deg = torch.zeros(n, dtype=M.dtype, device=dev).index_add_(0, j, a)
    dd = torch.where(deg > 0, deg, 1.0).rsqrt()  # a column of zeros stays zero
    a = a * dd[j] * dd[i]
    rev = torch.searchsorted(keys, j * n + i)
    a = 0.5 * (a + a[rev])
    crow = torch.searchsorted(i, torch.arange(n + 1, device=dev))
    want_sparse = sparse is True or (sparse == "auto" and n > DENSE_MAX_N)
    if want_sparse:
        return sparse_csr(crow, j, a, n)
    X = torch.zeros((n, n), dtype=M.dtype, device=dev)
    X[i, j] = a
    return X
