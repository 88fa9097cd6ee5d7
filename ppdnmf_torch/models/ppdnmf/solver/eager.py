"""The ADMM updates as eager torch operations, one function per equation group.

In-place operations on workspace buffers: the iterations are memory bound, and a fresh
large tensor costs its page faults (see :class:`~ppdnmf_torch.models.ppdnmf.solver.kernels.Workspace`).
Equation numbers refer to arXiv 2403.18326; the consensus term follows ALGORITHM.md
("derived" by default, "paper_literal" as printed).
"""
from __future__ import annotations

import torch

from .kernels import Workspace, agent_rows, agent_slices, bmm

__all__ = ["x_pre", "x_pre_into", "spectral_factors", "inverse_factors", "u_update", "dual_update",
           "x_post_grouped", "y_iteration"]


def x_pre(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, ws: Workspace, X_old, group: int = 0):
    """Eq. 8 and the right-hand side of eq. 9.

    ``X = max(0, U + P)``; ``rhs = Z Y^T + mu (X - P) + c`` with the consensus term
    ``c = rho U + 2 Q - Q_prev`` (derived) or ``rho (U + 2 Q - Q_prev)`` (as printed).
    ``mu``: a float, or one per agent ``(T, N, 1, 1)`` (``penalty_schedule="adaptive"``).
    ``group > 0`` (large problems, see :data:`~.kernels.X_TILE_BYTES`): the chain runs on
    ``group`` agents at a time.

    Returns
    -------
    X, rhs : Tensor (T, N, L, K)
    """
    X_new, rhs = ws.take("X", U, (X_old,)), ws.take("rhs", U)
    if not group:
        return x_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived, X_new, rhs, ws.take("tmp_lk", U))
    Uf, Pf, Zf, Qf, Qpf, rf, Xf, Rf = agent_rows(U, P, ZYt, Q, Q_prev, rho, X_new, rhs)
    mf = agent_rows(mu)[0] if isinstance(mu, torch.Tensor) else None
    tmp = ws.child("x_groups").take("tmp_lk", Uf[:group])
    for sl in agent_slices(Uf.shape[0], group):
        x_pre_into(Uf[sl], Pf[sl], Zf[sl], Qf[sl], Qpf[sl], rf[sl], mu if mf is None else mf[sl], derived, Xf[sl],
                   Rf[sl], tmp[: sl.stop - sl.start])
    return X_new, rhs


def x_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, X_out, rhs_out, tmp):
    """:func:`x_pre` into ``X_out`` and ``rhs_out`` (fresh tensors where None), ``tmp`` a scratch."""
    X_new = torch.add(U, P, out=X_out).clamp_(min=0)
    if isinstance(mu, torch.Tensor):  # one mu_i per agent
        rhs = torch.addcmul(ZYt, torch.sub(X_new, P, out=tmp), mu, out=rhs_out)
    else:
        rhs = torch.add(ZYt, torch.sub(X_new, P, out=tmp), alpha=mu, out=rhs_out)
    if derived:
        rhs.addcmul_(rho, U).add_(Q, alpha=2.0).sub_(Q_prev)
    else:
        rhs.addcmul_(rho, torch.add(U, Q, alpha=2.0, out=tmp).sub_(Q_prev))
    return X_new, rhs


def spectral_factors(lam, rho, mu):
    """``d = 1 / (lam + mu + rho_i)``, ``(..., T, N, K)`` from ``rho (..., T, N, 1, 1)`` and ``mu``
    (a float, or ``(T, N, 1, 1)``)."""
    return torch.add(lam, rho[..., 0] + (mu[..., 0] if isinstance(mu, torch.Tensor) else mu)).reciprocal_()


def inverse_factors(E, Et, d, ws: Workspace | None = None):
    """``E diag(d) E^T``: ``(..., T, N, K, K)`` for ``d (..., T, N, K)``: one iteration's (into
    the workspace ``ws``), or, without ``ws``, several iterations' at once."""
    if ws is None:
        Ed = E * d.unsqueeze(-2)
        return bmm(Ed, Et.expand_as(Ed))
    return bmm(torch.mul(E, d.unsqueeze(-2), out=ws.take("Ed", E)), Et, out=ws.take("Minv", E))


def u_update(rhs, E, Et, d, ws: Workspace, U_old, Minv=None):
    """Eq. 9: ``rhs (Y Y^T + (mu + rho_i) I)^-1 = rhs (E diag(d) E^T)``, ``d = 1 / (lam + mu + rho_i)``
    (``Minv``: ``E diag(d) E^T`` computed ahead)."""
    if Minv is None:
        Minv = inverse_factors(E, Et, d, ws)
    return bmm(rhs, Minv, out=ws.take("U", rhs, (U_old,)))


def dual_update(P, X_new, U_new, ws: Workspace, name: str):
    """Eqs. 10 and 14: the scaled dual update ``P - (X - U)``."""
    return torch.sub(P, X_new, out=ws.take(name, P, (P,))).add_(U_new)


def x_post_grouped(P, X_new, U_new, ws: Workspace, group: int, u_sums):
    """Eq. 10 (:func:`dual_update`) on ``group`` agents at a time, each group's sums of ``U_i``
    into ``u_sums (T, N)`` (the finiteness check) while its ``U_i`` is in the cache."""
    P_new = ws.take("P", P, (P,))
    Pf, Xf, Uf, Pn = agent_rows(P, X_new, U_new, P_new)
    sums = u_sums.view(-1)
    for sl in agent_slices(Pf.shape[0], group):
        torch.sub(Pf[sl], Xf[sl], out=Pn[sl]).add_(Uf[sl])
        torch.sum(Uf[sl], dim=(-2, -1), out=sums[sl])
    return P_new


def y_iteration(V, R, XtZ, G_inv, eta: float, Mw: int, ws: Workspace, live):
    """One Y-step ADMM iteration (eqs. 12-14) into zero-padded buffers, elementwise work on
    the first ``Mw`` columns only (the padding beyond the widest agent's ``M_i`` stays zero in
    buffers zeroed once; the product of eq. 13 keeps the full padded width, whose rounding
    does not depend on the batch). Returns ``Y, B, V, R`` (full width)."""
    Yb, Bb = ws.take_padded("Y", V, live), ws.take_padded("B", V, live)
    Vb, Rb = ws.take_padded("V", V, live), ws.take_padded("R", V, live)
    Vn, Rn = V[..., :Mw], R[..., :Mw]
    Yn = torch.add(Vn, Rn, out=Yb[..., :Mw]).clamp_(min=0)  # eq. 12
    tmp = torch.sub(Yn, Rn, out=ws.take("tmp_km", Yn))
    torch.add(XtZ[..., :Mw], tmp, alpha=eta, out=Bb[..., :Mw])
    bmm(G_inv, Bb, out=Vb)  # eq. 13
    torch.sub(Rn, Yn, out=Rb[..., :Mw]).add_(Vb[..., :Mw])  # eq. 14
    return Yb, Bb, Vb, Rb
