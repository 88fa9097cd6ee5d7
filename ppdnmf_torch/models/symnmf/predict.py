"""Clusters of new samples on a fitted symmetric NMF (``SymmetricNMF.predict``).

A fit gives ``S ~ U U^T``: row ``i`` of the similarity is ``s_i ~ U u_i`` with ``u_i >= 0`` the
sample's row of ``U``, and its label is ``argmax_c u_ic``. A new sample ``q`` gets the same rule
out of sample: its similarity row to the fitted samples, ``s_q (n,)``, is projected on the fixed
basis ``U``, ``w_q = argmin_{w >= 0} ||s_q - U w||`` (HALS sweeps, as NMF's ``transform`` does),
and its label is ``argmax_c w_qc``. On a fitted sample this recovers ``u_i`` (so its training
label) as far as ``U U^T`` fits ``S``.

The row ``s_q`` is Kuang et al.'s construction (:mod:`.similarity`) seen from ``q``: its ``kk``
nearest fitted samples, the kernel ``exp(-D_qj / (sigma_q sigma_j))`` with ``sigma_q`` the
distance to its ``scale_neighbor``-th nearest fitted sample and ``sigma_j`` the fitted samples'
own, each entry times ``deg_j^{-1/2}`` (the fitted samples' degrees). The query's own
``deg_q^{-1/2}`` is left out: a positive factor on ``s_q`` scales ``w_q`` and keeps its argmax.
"""
from __future__ import annotations

import torch

from .similarity import SCALE_NEIGHBOR, default_neighbors, knn_graph

__all__ = ["KnnReference", "knn_reference", "query_rows", "project_rows", "SWEEPS"]

#: elements of one block of differences (:func:`_sq_dist`)
_BLOCK = 1 << 24
#: HALS sweeps of the projection: a fixed count, so that a sample's label never depends on
#: the other samples predicted with it
SWEEPS = 100


class KnnReference:
    """What a query's similarity row needs of the fitted samples ``M (n, p)``: ``M``, the
    neighbour counts ``kk`` and ``nn`` the fit used, ``sigma (n,)`` and ``deg (n,)``."""

    def __init__(self, M: torch.Tensor, kk: int, nn: int, sigma: torch.Tensor, deg: torch.Tensor):
        self.M, self.kk, self.nn, self.sigma, self.deg = M, kk, nn, sigma, deg


def _sq_dist(A: torch.Tensor, B: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """``sum_k (A[i, k] - B[j, k])^2`` per pair, from the differences (as :mod:`.similarity` takes
    its values), a block of pairs at a time."""
    out = torch.empty(i.numel(), dtype=A.dtype, device=A.device)
    step = max(1, _BLOCK // max(1, A.shape[1]))
    for lo in range(0, i.numel(), step):
        out[lo:lo + step] = (A[i[lo:lo + step]] - B[j[lo:lo + step]]).square().sum(1)
    return out


def _kernel(d: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``exp(-d / scale)``, with :mod:`.similarity`'s rule for coincident points (``scale = 0``)."""
    ratio = torch.where(scale > 0, d / scale.clamp_min(torch.finfo(d.dtype).tiny),
                        torch.where(d > 0, torch.inf, 0.0))
    return torch.exp(-ratio)


def knn_reference(M: torch.Tensor, n_neighbors: int | None) -> KnnReference:
    """The fitted samples' ``sigma`` and degrees, as :func:`.similarity.similarity_matrix` forms them."""
    n = M.shape[0]
    kk = min(int(default_neighbors(n) if n_neighbors is None else n_neighbors), n - 1)
    nn = min(SCALE_NEIGHBOR, n - 1)
    _, idx = knn_graph(M, max(kk, nn))
    nodes = torch.arange(n, device=M.device)
    sigma = _sq_dist(M, M, nodes, idx[:, nn - 1]).sqrt()
    rows = nodes.repeat_interleave(kk)
    cols = idx[:, :kk].reshape(-1)
    keys = torch.unique(torch.cat([rows * n + cols, cols * n + rows]))
    i, j = keys // n, keys % n
    a = _kernel(_sq_dist(M, M, i, j), sigma[i] * sigma[j])
    deg = torch.zeros(n, dtype=M.dtype, device=M.device).index_add_(0, j, a)
    return KnnReference(M, kk, nn, sigma, deg)


def query_rows(ref: KnnReference, Q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Similarity rows ``(m, n)`` of the queries ``Q (m, p)`` to the fitted samples, and each
    query's nearest fitted sample ``(m,)``."""
    M = ref.M
    sq = M.square().sum(1)
    D = torch.addmm(Q.square().sum(1)[:, None] + sq[None, :], Q, M.T, alpha=-2.0).clamp_min_(0.0)
    _, idx = torch.topk(D, max(ref.kk, ref.nn), dim=1, largest=False, sorted=True)
    m = Q.shape[0]
    q = torch.arange(m, device=M.device).repeat_interleave(ref.kk)
    j = idx[:, :ref.kk].reshape(-1)
    d = _sq_dist(Q, M, q, j)
    sigma_q = _sq_dist(Q, M, torch.arange(m, device=M.device), idx[:, ref.nn - 1]).sqrt()
    a = _kernel(d, sigma_q[q] * ref.sigma[j])
    r = torch.where(ref.deg > 0, ref.deg, 1.0).rsqrt()
    rows = torch.zeros((m, M.shape[0]), dtype=M.dtype, device=M.device)
    rows[q, j] = a * r[j]
    return rows, idx[:, 0]


def project_rows(rows: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """``W (m, r) = argmin_{W >= 0} ||rows - W U^T||_F`` by :data:`SWEEPS` HALS sweeps from zero."""
    G = U.T @ U  # (r, r)
    C = rows @ U  # (m, r)
    W = torch.zeros_like(C)
    diag = torch.diagonal(G).clamp_min(torch.finfo(U.dtype).tiny)
    for _ in range(SWEEPS):
        for c in range(U.shape[1]):
            W[:, c] = torch.clamp(W[:, c] + (C[:, c] - W @ G[:, c]) / diag[c], min=0.0)
    return W
