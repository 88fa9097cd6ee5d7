"""The quantities the solvers report: the split objective (3), the symmetric fitting error
``E^k`` and the gap ``||U - V||``.

All come from products the solvers form anyway (``X U`` and ``X V``), through
``||X - U V^T||_F^2 = ||X||_F^2 - 2 <X V, U> + <U^T U, V^T V>``, so a metric costs
``O(T n r^2)`` and never ``O(n^2)``: a sparse ``X`` stays sparse. The price is the floor of
the expansion: ``E^k`` is resolved down to about the dtype's epsilon (``1e-16`` in float64),
not below.
"""
from __future__ import annotations

import torch

__all__ = ["inner", "fit_sq", "split_objective", "fitting_error", "gap_sq", "metrics"]


def inner(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``<A, B>`` per trial for ``A, B (T, n, r)``: ``(T,)``."""
    return (A * B).sum(dim=(-2, -1))


def fit_sq(sq_norm_X: torch.Tensor, U: torch.Tensor, V: torch.Tensor, XV: torch.Tensor) -> torch.Tensor:
    """``||X - U V^T||_F^2`` per trial, ``(T,)``, from ``XV = X V`` (clamped at 0 against rounding).

    Parameters
    ----------
    sq_norm_X : torch.Tensor
        ``||X||_F^2``, ``(T,)``.
    U, V, XV : torch.Tensor
        ``(T, n, r)``.
    """
    UtU = U.transpose(-2, -1) @ U
    VtV = V.transpose(-2, -1) @ V
    return (sq_norm_X - 2 * inner(XV, U) + inner(UtU, VtV)).clamp_min(0)


def gap_sq(U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``||U - V||_F^2`` per trial, ``(T,)``."""
    D = U - V
    return inner(D, D)


def split_objective(sq_norm_X, U, V, XV, lam) -> torch.Tensor:
    """The split objective (3), ``g(U, V) = 1/2 ||X - U V^T||_F^2 + lambda/2 ||U - V||_F^2``, ``(T,)``."""
    return 0.5 * fit_sq(sq_norm_X, U, V, XV) + 0.5 * lam * gap_sq(U, V)


def fitting_error(sq_norm_X, U, XU) -> torch.Tensor:
    """The normalized fitting error of the symmetric problem (2),
    ``E^k = ||X - U U^T||_F^2 / ||X||_F^2``, ``(T,)`` (spec choice: ``U``, not ``V``)."""
    return fit_sq(sq_norm_X, U, U, XU) / sq_norm_X


def metrics(sq_norm_X, U, V, XU, XV, lam) -> dict:
    """Every per-iteration metric, each ``(T,)``: ``E`` (2)'s normalized error,
    ``objective`` (3), ``gap`` ``||U - V||_F^2``, ``rel_gap`` ``||U - V||_F / ||V||_F`` and
    ``lam``."""
    g2 = gap_sq(U, V)
    vn = inner(V, V).sqrt().clamp_min(torch.finfo(U.dtype).tiny)
    return {
        "E": fitting_error(sq_norm_X, U, XU),
        "objective": 0.5 * fit_sq(sq_norm_X, U, V, XV) + 0.5 * lam * g2,
        "gap": g2,
        "rel_gap": g2.sqrt() / vn,
        "lam": lam.clone(),
    }
