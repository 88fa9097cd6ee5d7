"""A metric that cannot hide disagreement: the NMSE of the whole data under one agent's ``X_i``.

The paper's NMSE, ``(1/N) sum_j ||Z_j - X_j Y_j|| / ||Z_j||``, scores every block with its
own agent's left factor: agents that fit their own ``X_j`` to their own data score *below*
the centralized run while their copies disagree. Here every block ``Z_j`` is scored with
the left factor ``X_w`` of the agent farthest from the mean (the agent of the consensus
error, ``w = argmax_i ||X_i - Xbar||``), its right factor refit locally: ``REFIT_SWEEPS``
HALS sweeps (:mod:`.hals`) on ``min_{Y >= 0} ||Z_j - X_w Y||`` warm-started from ``Y_j``.
Each sweep lowers the error, so a few sweeps give an upper bound of the refit optimum
that equals the paper's NMSE (or falls below it) when the copies agree, and exceeds it
when ``X_w`` does not serve the other agents' data. It is a diagnostic of the simulation
(it reads every agent's factors), not a step of the protocol.
"""
from __future__ import annotations

import torch

from ..problem import COLUMN_CHUNK
from .hals import hals_loop
from .kernels import bmm

__all__ = ["REFIT_SWEEPS", "farthest_agent", "refit_errors", "worst_agent_nmse"]

#: HALS sweeps of each block's refit (warm-started from the block's own right factor)
REFIT_SWEEPS = 2


def _column_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over the last (padded) axis in chunks of :data:`COLUMN_CHUNK`, added in order:
    the same bits whatever zero padding follows (a trial alone or in a batch)."""
    acc = t[..., :COLUMN_CHUNK].sum(-1)
    for c in range(COLUMN_CHUNK, t.shape[-1], COLUMN_CHUNK):
        acc = acc + t[..., c:c + COLUMN_CHUNK].sum(-1)
    return acc


def worst_agent_nmse(Z: torch.Tensor, X: torch.Tensor, Y: torch.Tensor, z_norms: torch.Tensor, width: int,
                     sweeps: int = REFIT_SWEEPS) -> torch.Tensor:
    """The NMSE of every block under the farthest agent's ``X_w``, right factors refit (module docstring).

    Parameters
    ----------
    Z : Tensor (T, N, L, M)
        The real agents' (zero-padded) blocks.
    X, Y : Tensor (T, N, L, K), (T, N, K, M)
        Their factors (not modified).
    z_norms : Tensor (T, N)
        ``||Z_j||_F``.
    width : int
        The widest agent's columns (the refit leaves the padding beyond it zero).
    sweeps : int

    Returns
    -------
    Tensor (T,)
        ``(1/N) sum_j ||Z_j - X_w Y_j'||_F / ||Z_j||_F``.
    """
    T = X.shape[0]
    Xw = X[torch.arange(T, device=X.device), farthest_agent(X)]  # (T, L, K)
    return refit_errors(Z, Xw, Y, z_norms, width, sweeps).mean(dim=-1)


def farthest_agent(X: torch.Tensor) -> torch.Tensor:
    """``w (T,)``: the agent whose ``X_i (T, N, L, K)`` is farthest from the agents' mean."""
    return torch.linalg.matrix_norm(X - X.mean(dim=1, keepdim=True)).argmax(dim=1)


def refit_errors(Z: torch.Tensor, Xw: torch.Tensor, Y: torch.Tensor, z_norms: torch.Tensor, width: int,
                 sweeps: int = REFIT_SWEEPS) -> torch.Tensor:
    """``||Z_j - X_w Y_j'||_F / ||Z_j||_F (T, N)`` of every block ``Z (T, N, L, M)`` under one left
    factor ``Xw (T, L, K)``, each right factor refit by ``sweeps`` HALS sweeps from ``Y (T, N, K, M)``
    (a block's refit is its own: an agent computes its entry alone)."""
    T, N, L, M = Z.shape
    K = Xw.shape[-1]
    G = bmm(Xw.mT, Xw)[:, None].expand(T, N, K, K)
    C = bmm(Xw[:, None].expand(T, N, L, K).mT, Z)  # (T, N, K, M)
    Yr, _ = hals_loop(Y, G, C, sweeps, width)
    # ||Z_j - X_w Y'||^2 = ||Z_j||^2 + <Y', G Y' - 2 C>: no product of Z's size
    quad = _column_sum(((bmm(G, Yr) - 2.0 * C) * Yr).sum(-2))
    res = (z_norms.square() + quad).clamp_min(0).sqrt()
    return res / z_norms
