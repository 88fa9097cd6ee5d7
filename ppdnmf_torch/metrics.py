"""Per-iteration metrics of the paper (Sec. IV) on batched, padded tensors.

Shapes follow the package convention: a trial dimension ``T`` before the agent
dimension ``N``. ``Z (T, N, L, M_max)``, ``X (T, N, L, K)``, ``Y (T, N, K, M_max)``.
Padded columns of ``Z`` and ``Y`` are exactly zero, so they add nothing to any norm.
"""
from __future__ import annotations

import torch

__all__ = ["residual_norms", "from_residuals", "nmse", "consensus_error", "objective"]


def residual_norms(Z: torch.Tensor, X: torch.Tensor, Y: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Frobenius norms ``||Z_i - X_i Y_i||_F`` for every trial and agent, shape ``(T, N)``.

    ``scratch`` (optional, contiguous, of ``Z``'s shape) receives ``X_i Y_i - Z_i``: a reused
    buffer spares a large problem a fresh allocation (the same bits either way).
    """
    out = None if scratch is None else scratch.view(-1, *Z.shape[-2:])
    XY = torch.bmm(X.reshape(-1, *X.shape[-2:]), Y.reshape(-1, *Y.shape[-2:]), out=out).reshape(Z.shape)
    return torch.linalg.matrix_norm(XY.sub_(Z))


def from_residuals(res: torch.Tensor, z_norms: torch.Tensor):
    """NMSE ``(T,)``, per-agent relative residuals ``(T, N)`` and objective ``(T,)`` from the
    residual norms of :func:`residual_norms` (one pass over the data serves all three)."""
    per_agent = res / z_norms
    return per_agent.mean(dim=-1), per_agent, 0.5 * res.square().sum(dim=-1)


def nmse(Z: torch.Tensor, X: torch.Tensor, Y: torch.Tensor, z_norms: torch.Tensor | None = None):
    """The paper's NMSE, ``(1/N) sum_i ||Z_i - X_i Y_i||_F / ||Z_i||_F`` (not squared).

    Returns
    -------
    nmse : Tensor (T,)
    per_agent : Tensor (T, N)
        ``||Z_i - X_i Y_i||_F / ||Z_i||_F``.
    """
    if z_norms is None:
        z_norms = torch.linalg.matrix_norm(Z)
    per_agent = residual_norms(Z, X, Y) / z_norms
    return per_agent.mean(dim=-1), per_agent


def consensus_error(X: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``max_i ||X_i - Xbar||_F / ||Xbar||_F`` with ``Xbar`` the mean over agents, shape ``(T,)``.

    ``scratch`` (optional, of ``X``'s shape) receives ``X_i - Xbar`` (the same bits either way).
    """
    xbar = X.mean(dim=-3, keepdim=True)
    num = torch.linalg.matrix_norm(torch.sub(X, xbar, out=scratch))
    den = torch.linalg.matrix_norm(xbar).clamp_min(torch.finfo(X.dtype).tiny)
    return (num / den).amax(dim=-1)


def objective(Z: torch.Tensor, X: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """``1/2 sum_i ||Z_i - X_i Y_i||_F^2`` (eq. 1 evaluated at the local copies), shape ``(T,)``."""
    return 0.5 * residual_norms(Z, X, Y).square().sum(dim=-1)
