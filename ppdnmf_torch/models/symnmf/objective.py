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

__all__ = ["inner", "fit_sq", "split_objective", "fitting_error", "gap_sq", "stationarity", "metrics"]


def inner(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``<A, B>`` per trial for ``A, B (T, n, r)``: ``(T,)``."""
    return (A * B).sum(dim=(-2, -1))


def fit_sq(sq_norm_X: torch.Tensor, U: torch.Tensor, V: torch.Tensor, XV: torch.Tensor, UtU=None,
           VtV=None) -> torch.Tensor:
    """``||X - U V^T||_F^2`` per trial, ``(T,)``, from ``XV = X V`` (clamped at 0 against rounding).

    Parameters
    ----------
    sq_norm_X : torch.Tensor
        ``||X||_F^2``, ``(T,)``.
    U, V, XV : torch.Tensor
        ``(T, n, r)``.
    UtU, VtV : torch.Tensor, optional
        ``U^T U`` and ``V^T V`` ``(T, r, r)`` when the caller has them (the same numbers).
    """
    UtU = U.transpose(-2, -1) @ U if UtU is None else UtU
    VtV = V.transpose(-2, -1) @ V if VtV is None else VtV
    return _fit_sq(sq_norm_X, inner(XV, U), UtU, VtV)


def _fit_sq(sq_norm_X, xvu, UtU, VtV):
    return (sq_norm_X - 2 * xvu + inner(UtU, VtV)).clamp_min(0)


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


def stationarity(sq_norm_X: torch.Tensor, U: torch.Tensor, XU: torch.Tensor) -> torch.Tensor:
    """The scaled projected-gradient (KKT) residual of the symmetric problem (2) at ``U``, ``(T,)``.

    ``R(U) = ||P_U[(U U^T - X) U]||_F / (||X||_F ||U||_F)``, with ``(U U^T - X) U`` the gradient
    of ``1/4 ||X - U U^T||_F^2`` and ``P_U`` keeping an entry where ``U > 0`` and its negative
    part where ``U = 0``: zero exactly at the critical points of (2), the points the paper's
    Theorems 1 and 3 say the split methods reach (``U* = V*``, a critical point of (2)). The
    gradient scales as ``c^{3/2}`` under ``X -> c X`` (``U -> sqrt(c) U``), as does the
    denominator, and both grow as ``n^2`` for entries of a fixed size, so one tolerance means the
    same at any scale and size. Measured on the noise-free ``X = U* U*^T`` (n = 150, r = 6, 12
    starts of the estimator), ``R <= 1e-5`` came with ``E <= 6e-7`` (``1e-4``: up to ``1.4e-6``;
    docs/SYMNMF.md, "Stopping").

    Parameters
    ----------
    sq_norm_X : torch.Tensor
        ``||X||_F^2``, ``(T,)``.
    U, XU : torch.Tensor
        ``(T, n, r)``: the factor and ``X U``.
    """
    G = U @ (U.transpose(-2, -1) @ U) - XU
    P = torch.where(U > 0, G, G.clamp_max(0))
    den = (sq_norm_X * inner(U, U)).sqrt().clamp_min(torch.finfo(U.dtype).tiny)
    return inner(P, P).sqrt() / den


def metrics(sq_norm_X, U, V, XU, XV, lam) -> dict:
    """Every per-iteration metric, each ``(T,)``: ``E`` (2)'s normalized error,
    ``objective`` (3), ``gap`` ``||U - V||_F^2``, ``rel_gap`` ``||U - V||_F / ||V||_F`` and
    ``lam``. The Gram matrices are formed once for both fits (the numbers of
    :func:`fitting_error` and :func:`split_objective`)."""
    UtU = U.transpose(-2, -1) @ U
    VtV = V.transpose(-2, -1) @ V
    g2 = gap_sq(U, V)
    vn = inner(V, V).sqrt().clamp_min(torch.finfo(U.dtype).tiny)
    return {
        "E": _fit_sq(sq_norm_X, inner(XU, U), UtU, UtU) / sq_norm_X,
        "objective": 0.5 * _fit_sq(sq_norm_X, inner(XV, U), UtU, VtV) + 0.5 * lam * g2,
        "gap": g2,
        "rel_gap": g2.sqrt() / vn,
        "lam": lam.clone(),
    }
