"""Every agent's columns ``X_i = X[:, S_i]`` of the similarity, for symmetric NMF across agents
(:mod:`.agents`): dense, or sparse without ever making ``X`` dense, and the two local products
the agents' steps need, ``X_i V_i`` and ``X_i^T U_i``, batched over trials and agents.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._utils import sparse_matmul
from .operator import Similarity

__all__ = ["SparseColumns", "agent_columns", "local_product", "local_t_product"]


@dataclass
class SparseColumns:
    """Every agent's ``X_i = X[:, S_i]`` of a sparse ``X``, for all trials and agents at once.

    Two block-diagonal CSR matrices over the stacked agents (``A = T N`` blocks, ``m`` the
    padded part size): ``cols (A n, A m)`` with block ``a`` equal to ``X_a = X[:, S_a]``
    ``(n, m)``, and ``rows (A m, A n)``, its transpose ``X_a^T``. Agent ``a``'s block holds only
    its own columns (padding columns empty), so one sparse product serves every agent and no
    agent's product touches another's data; together they cost ``O(T nnz(X))`` memory.

    Attributes
    ----------
    cols, rows : torch.sparse_csr Tensor
    shape : tuple
        ``(T, N, n, m)``, the shape of the dense ``Z`` it stands for.
    """

    cols: torch.Tensor
    rows: torch.Tensor
    shape: tuple


def agent_columns(sim: Similarity, idx: torch.Tensor):
    """Every agent's columns ``X[:, S_i]``: dense ``Z (T, N, n, m)`` (zero columns on padding) for a
    dense ``X``, :class:`SparseColumns` for a sparse one. Built once, before the run."""
    T, N, m = idx.shape
    n = sim.n
    if not sim.sparse:
        Xpad = torch.cat([sim.data, sim.data.new_zeros(n, 1)], dim=1)
        return Xpad[:, idx].permute(1, 2, 0, 3).contiguous()
    # X^T's rows are X's columns: block a of ``rows`` is X^T[S_a, :], built by index arithmetic
    csc = sim.data.to_sparse_csc()
    crow, col, val = csc.ccol_indices(), csc.row_indices(), csc.values()
    dev = val.device
    starts = torch.cat([crow[:-1], crow.new_zeros(1)])  # a padding slot (node n) is an empty row
    lens = torch.cat([crow[1:] - crow[:-1], crow.new_zeros(1)])
    flat = idx.reshape(-1)
    row_len = lens[flat]
    row_ptr = torch.cat([row_len.new_zeros(1), row_len.cumsum(0)])
    owner = torch.repeat_interleave(torch.arange(flat.numel(), device=dev), row_len)
    src = starts[flat][owner] + (torch.arange(owner.numel(), device=dev) - row_ptr[owner])
    block = torch.div(owner, m, rounding_mode="floor")
    A = T * N
    rows = torch.sparse_csr_tensor(row_ptr, col[src] + block * n, val[src], size=(A * m, A * n),
                                   check_invariants=False)
    t = rows.to_sparse_csc()  # the transpose's CSR
    cols = torch.sparse_csr_tensor(t.ccol_indices(), t.row_indices(), t.values(), size=(A * n, A * m),
                                   check_invariants=False)
    return SparseColumns(cols=cols, rows=rows, shape=(T, N, n, m))


def local_product(Z, V: torch.Tensor) -> torch.Tensor:
    """``X_i V_i`` for every agent, ``(T, N, n, r)``, from ``V (T, N, m, r)``."""
    if isinstance(Z, SparseColumns):
        T, N, n, m = Z.shape
        return sparse_matmul(Z.cols, V.reshape(T * N * m, -1)).view(T, N, n, -1)
    return Z @ V


def local_t_product(Z, U: torch.Tensor) -> torch.Tensor:
    """``X_i^T U_i`` for every agent, ``(T, N, m, r)``, from ``U (T, N, n, r)``."""
    if isinstance(Z, SparseColumns):
        T, N, n, m = Z.shape
        return sparse_matmul(Z.rows, U.reshape(T * N * n, -1)).view(T, N, m, -1)
    return Z.mT @ U
