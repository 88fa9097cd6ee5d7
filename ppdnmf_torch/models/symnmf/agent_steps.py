"""One outer iteration of symmetric NMF across agents: the agents' variables
(:class:`AgentsState`), the X-step (the engine's consensus ADMM with this model's local solve),
the Y-step, and the adaptive penalty's sums (docs/SYMMETRIC_NMF.md, last section;
:mod:`.agents` describes the model).

Shapes: ``T`` trials, ``N`` agents (slots, over ranks), ``n`` nodes, ``m`` the largest part,
``r`` the rank. ``idx (T, N, m)`` holds each agent's nodes ``S_i``, padded with ``n``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...consensus.xstep import ConsensusVars, consensus_admm
from ...exchange import Exchange
from ...penalties import PenaltySampler
from .agent_columns import local_product, local_t_product

__all__ = ["AgentsState", "x_step", "y_step", "auto_mu", "gather_rows", "scatter_rows", "own_rows", "lambda_terms",
           "lambda_from_sums", "adaptive_lambda", "stationarity_terms", "stationarity_from_sums", "STATE_NAMES"]

#: the agents' variables, each ``(T, N, ...)`` (``g`` and ``lam`` are not per agent)
STATE_NAMES = ("Xc", "U", "P", "Q", "Q_prev", "V")


@dataclass
class AgentsState:
    """The agents' variables, ``(T, N, ...)``: ``Xc`` the nonnegative copies (ALGORITHM.md's
    ``X_i``), ``U`` the unconstrained ones, ``P``, ``Q``, ``Q_prev`` the duals ``(T, N, n, r)``;
    ``V (T, N, m_max, r)``; ``g (2E,)`` the penalty draws; ``lam (T,)``; ``mu (T, N, 1, 1)``
    each agent's last X-step penalty under ``mu="auto"`` (None before the first)."""

    Xc: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor
    V: torch.Tensor
    g: torch.Tensor
    lam: torch.Tensor
    mu: torch.Tensor | None = None


def gather_rows(U: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``U[..., S_i, :]`` per agent: ``U (T, N, n, r)``, ``idx (T, N, m)`` padded with ``n`` (zero rows)."""
    pad = torch.cat([U, U.new_zeros(*U.shape[:-2], 1, U.shape[-1])], dim=-2)
    return torch.gather(pad, -2, idx[..., None].expand(*idx.shape, U.shape[-1]))


def scatter_rows(V: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """``E_i^T V_i``: ``V (T, N, m, r)`` at the rows ``S_i`` of an ``(T, N, n, r)`` zero matrix."""
    out = V.new_zeros(*V.shape[:-2], n + 1, V.shape[-1])
    out.scatter_(-2, idx[..., None].expand(*idx.shape, V.shape[-1]), V)
    return out[..., :n, :]


def own_rows(st: AgentsState, idx) -> torch.Tensor:
    """``U_i[S_i]`` for every agent, ``(T, N, m, r)`` (zero on padded rows)."""
    return gather_rows(st.Xc, idx)


def auto_mu(st: AgentsState) -> torch.Tensor:
    """``mu_i = trace(V_i^T V_i) / r + lambda`` per agent, ``(T, N, 1, 1)``: the mean eigenvalue of
    the local system (eq. 9), so that the ADMM of ``X_i = U_i`` is equally fast at every scale
    of the data and of ``V_i`` (a fixed ``mu`` stalls when ``V_i`` is far larger or smaller)."""
    r = st.V.shape[-1]
    return (st.V.square().sum(dim=(-2, -1)) / r + st.lam[:, None]).clamp_min(torch.finfo(st.V.dtype).tiny)[..., None, None]


def x_step(Z, st: AgentsState, idx, mask, sampler: PenaltySampler, exchange: Exchange, *, mu, x_iters: int,
           bcd_iter: int) -> None:
    """The X-step: ``x_iters`` iterations of the engine's consensus ADMM
    (:func:`~ppdnmf_torch.consensus.xstep.consensus_admm`, ALGORITHM.md steps 1-6, eqs. 8-11),
    whose local solve (step 3, eq. 9) gains the coupling term; updates ``st`` in place.

    Step 3 per agent and row ``l``::

        U_i[l] = (Z_i V_i + lambda E_i^T V_i + mu (X_i - P_i) + rho_i U_i + 2 Q_i - Q_i_prev)[l]
                 (V_i^T V_i + (mu + rho_i + lambda [l in S_i]) I)^-1

    with ``V_i^T V_i = E diag(ev) E^T`` decomposed once per X-step.

    Parameters
    ----------
    Z : Tensor (T, N, n, m) or SparseColumns
        ``X_i``, padded with zero columns (:func:`~.agent_columns.agent_columns`).
    idx : LongTensor (T, N, m)
        ``S_i``, padded with ``n``. ``mask (T, N, n, 1)``: 1 on the rows ``S_i``.
    """
    T, N, n, r = st.U.shape
    lam = st.lam.view(T, 1, 1, 1)
    if mu == "auto":
        mu = auto_mu(st)
        if st.mu is not None:  # the scaled dual P belongs to the last mu
            st.P = st.P * (st.mu / mu)
        st.mu = mu
    fixed_rhs = local_product(Z, st.V) + lam * scatter_rows(st.V, idx, n)
    ev, E = torch.linalg.eigh(st.V.mT @ st.V)
    ev = ev.clamp_min(0.0)[..., None, :]
    shift = mu + lam * mask  # (T, N, n, 1), plus rho_i below

    def local(U, X, P, Q, Q_prev, rho):  # eq. 9, a scalar shift per row
        rhs = fixed_rhs + mu * (X - P) + rho * U + 2 * Q - Q_prev
        return ((rhs @ E) / (ev + shift + rho)) @ E.mT

    v = consensus_admm(ConsensusVars(U=st.U, Q=st.Q, Q_prev=st.Q_prev, g=st.g, X=st.Xc, P=st.P), local, sampler,
                       exchange, n_iters=x_iters, bcd_iter=bcd_iter)
    st.Xc, st.U, st.P, st.Q, st.Q_prev, st.g = v.X, v.U, v.P, v.Q, v.Q_prev, v.g


def y_step(Z, st: AgentsState, idx, *, y_iters: int) -> tuple:
    """The Y-step: ``y_iters`` HALS sweeps of eq. (17) over the columns of every ``V_i``
    (padded rows stay zero), against the agent's own copy ``U_i``; local, updates ``st.V``.
    ``Z``: as :func:`x_step`.

    ``v_c <- max(0, v_c + (A[:, c] - V B[:, c]) / B_cc)`` with ``A = X_i^T U_i + lambda U_i[S_i]``
    and ``B = U_i^T U_i + lambda I`` (the exact minimizer of each column's block).

    Returns
    -------
    XtU : Tensor (T, N, m, r)
        ``X_i^T U_i`` (the rows ``S_i`` of ``X U_i``).
    UtU : Tensor (T, N, r, r)
        ``U_i^T U_i``: with ``XtU``, what :func:`stationarity_terms` needs (the copies do not
        change in the Y-step).
    """
    r = st.V.shape[-1]
    lam = st.lam.view(-1, 1, 1, 1)
    XtU, UtU = local_t_product(Z, st.Xc), st.Xc.mT @ st.Xc
    A = XtU + lam * gather_rows(st.Xc, idx)
    B = UtU + lam * torch.eye(r, dtype=st.V.dtype, device=st.V.device)
    diag = B.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(B.dtype).tiny)
    V = st.V.clone()
    for _ in range(y_iters):
        for c in range(r):  # HALS: one column at a time, each an exact block minimizer
            step = (A[..., c] - (V @ B[..., c, None])[..., 0]) / diag[..., c, None]
            V[..., c] = (V[..., c] + step).clamp_min(0.0)
    st.V = V
    return XtU, UtU


def stationarity_terms(U_own: torch.Tensor, UtU: torch.Tensor, XtU: torch.Tensor) -> torch.Tensor:
    """Each agent's share of the stationarity residual of (2), ``(T, N, 2)``:
    ``||P(G_i)||_F^2`` and ``||U_i[S_i]||_F^2``, from what agent ``i`` holds.

    ``G_i = U_i[S_i] (U_i^T U_i) - X_i^T U_i`` is the rows ``S_i`` of the gradient
    ``(U U^T - X) U`` of ``1/4 ||X - U U^T||_F^2`` at the agent's copy (``X_i^T = X[S_i, :]``:
    ``X`` is symmetric); ``P`` keeps an entry where ``U_i[S_i] > 0`` and its negative part where it
    is 0, as :func:`~.objective.stationarity`. Padded rows are zero in ``U_own`` and ``XtU`` and
    add nothing. When every copy is one ``U``, the sums over agents are ``||P[(U U^T - X) U]||^2``
    and ``||U||^2``: :func:`stationarity_from_sums` is then :func:`~.objective.stationarity`.

    Parameters
    ----------
    U_own : Tensor (T, N, m, r)
        ``U_i[S_i]`` (:func:`own_rows`).
    UtU : Tensor (T, N, r, r)
        ``U_i^T U_i``.
    XtU : Tensor (T, N, m, r)
        ``X_i^T U_i``.
    """
    G = U_own @ UtU - XtU
    P = torch.where(U_own > 0, G, G.clamp_max(0))
    return torch.stack([P.square().sum(dim=(-2, -1)), U_own.square().sum(dim=(-2, -1))], dim=-1)


def stationarity_from_sums(x_norm2: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """The scaled projected-gradient residual ``||P[(U U^T - X) U]||_F / (||X||_F ||U||_F)``,
    ``(T,)``, from the network-wide sums ``(T, 2)`` of :func:`stationarity_terms` and
    ``||X||_F^2`` ``(T,)``."""
    den = (x_norm2 * sums[..., 1]).sqrt().clamp_min(torch.finfo(sums.dtype).tiny)
    return sums[..., 0].sqrt() / den


def lambda_terms(U_own: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Each agent's share of the three sums of the adaptive rule (20), ``(T, N, 3)``:
    ``||U_i[S_i]||^2``, ``||V_i||^2`` and ``<U_i[S_i], V_i>`` from ``U_own, V (T, N, m, r)``."""
    return torch.stack([U_own.square().sum(dim=(-2, -1)), V.square().sum(dim=(-2, -1)),
                        (U_own * V).sum(dim=(-2, -1))], dim=-1)


def lambda_from_sums(lam: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """Eq. (20) from the network-wide sums ``(T, 3)`` of :func:`lambda_terms`:
    ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)``, ``(T,)``; the ratio is clamped at 1 (so
    ``lambda`` never decreases), and a nonpositive ``<U, V>`` keeps ``lambda``."""
    num = sums[..., 0] + sums[..., 1]
    den = 2 * sums[..., 2]
    return torch.where(den > 0, lam * (num / den.where(den > 0, 1.0)).clamp_min(1.0), lam)


def adaptive_lambda(lam: torch.Tensor, U_own: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Eq. (20) as docs/SYMMETRIC_NMF.md reconstructs it, from per-agent pieces:
    ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` with ``U`` the agents' own rows
    ``(T, N, m, r)`` and ``V`` their ``V_i``; ``(T,)``. The ratio is >= 1 (so ``lambda``
    never decreases) and 1 exactly when ``U = V``; a nonpositive ``<U, V>`` keeps ``lambda``.
    The same bits as :func:`lambda_from_sums` of the ``plain`` aggregation of
    :func:`lambda_terms`."""
    return lambda_from_sums(lam, lambda_terms(U_own, V).sum(dim=1))
