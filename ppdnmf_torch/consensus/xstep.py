"""The consensus ADMM X-step (docs/ALGORITHM.md, X-step steps 1-6, eqs. 8-11), for every model
whose agents agree on a variable through the secure exchange, with the local solve (step 3) as
a hook.

Every agent ``i`` holds a copy ``U_i`` of the consensus variable, the duals ``Q_i`` and
``Q_i_prev`` of the consensus constraints, and, for a nonnegative variable, the split
``X_i = max(0, U_i + P_i)`` with its scaled dual ``P_i``. One ADMM iteration ``m``:

1. the penalties: each directed edge's draw ``g`` (:class:`~ppdnmf_torch.penalties.PenaltySampler`)
   and the sums ``rho_i = sum_j rho_ij`` as the agent obtains them from the exchange
   (:func:`draw_penalties`);
2. ``X_i = max(0, U_i + P_i)`` (eq. 8; nonnegative variables only);
3. the local solve (eq. 9's form), the model's: ``U_i <- local(U, X, P, Q, Q_prev, rho)``;
4. ``P_i <- P_i - (X_i - U_i)`` (eq. 10; nonnegative variables only);
5. the secure sums ``S_i = sum_j rho_ij (U_j - U_i)`` from the exchange (eq. 11,
   :func:`neighbour_sums`);
6. ``Q_i_prev, Q_i <- Q_i, Q_i + S_i`` (:func:`carry_duals`).

The penalties' draws carry over between X-steps (ALGORITHM.md's warm start). PPDNMF's solver
runs the same steps through its execution plans (fused and grouped), calling steps 1, 5 and 6
from here where that gives the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ConsensusVars", "consensus_admm", "draw_penalties", "penalty_sums", "neighbour_sums", "carry_duals"]


def penalty_sums(exchange, g: torch.Tensor, *, bcd_iter: int, admm_iter: int, shape, dtype) -> torch.Tensor:
    """The second half of step 1: each agent's ``rho_i = sum_j rho_ij`` of the draws ``g (2E,)`` as it
    obtains it from the exchange, ``(*shape, 1, 1)`` in ``dtype``."""
    return exchange.penalty_sums(g, bcd_iter=bcd_iter, admm_iter=admm_iter).to(dtype).view(*shape, 1, 1)


def draw_penalties(sampler, exchange, g: torch.Tensor, m: int, *, bcd_iter: int, shape, dtype,
                   active_edges=None) -> tuple:
    """Step 1 of ADMM iteration ``m`` (0-based): the draws ``g (2E,)`` from the last ones and the
    sums ``rho_i`` (:func:`penalty_sums`). Edges whose source has stopped (``active_edges`` False)
    keep their draw (:meth:`~ppdnmf_torch.penalties.PenaltySampler.step`)."""
    g = sampler.step(g, m, active_edges)
    return g, penalty_sums(exchange, g, bcd_iter=bcd_iter, admm_iter=m + 1, shape=shape, dtype=dtype)


def neighbour_sums(exchange, U: torch.Tensor, g: torch.Tensor, *, bcd_iter: int, admm_iter: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Step 5 (eq. 11): ``S_i = sum_j rho_ij (U_j - U_i)`` from the exchange, shaped and typed like
    ``U (T, N, ...)``; ``out``: a buffer of ``U``'s shape the exchange may write into."""
    T, N = U.shape[:2]
    A = T * N
    kw = {} if out is None else {"out": out.view(A, -1)}
    S = exchange.exchange(U.reshape(A, -1), g, bcd_iter=bcd_iter, admm_iter=admm_iter, **kw).S
    return S.view(U.shape).to(U.dtype)


def carry_duals(Q: torch.Tensor, S: torch.Tensor) -> tuple:
    """Step 6: ``(Q_prev, Q) <- (Q, Q + S)``."""
    return Q, Q + S


@dataclass
class ConsensusVars:
    """The X-step's variables per agent, ``(T, N, ...)``: the copies ``U``, the duals ``Q`` and
    ``Q_prev``, the draws ``g (2E,)``; for a nonnegative variable also ``X`` and ``P`` (else None)."""

    U: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor
    g: torch.Tensor
    X: torch.Tensor | None = None
    P: torch.Tensor | None = None


def consensus_admm(v: ConsensusVars, local, sampler, exchange, *, n_iters: int, bcd_iter: int) -> ConsensusVars:
    """``n_iters`` ADMM iterations of the X-step (steps 1-6, see the module) on ``v``, in place.

    Parameters
    ----------
    v : ConsensusVars
        ``X`` and ``P`` not None: the nonnegative split (steps 2 and 4, and ``X = max(0, U + P)``
        once more after the last iteration).
    local : callable
        Step 3: ``local(U, X, P, Q, Q_prev, rho) -> U``, ``rho (T, N, 1, 1)``.
    sampler : PenaltySampler
        Its draws for this X-step are made here (``begin_bcd_iteration``).
    exchange : Exchange
        Bound to the agents' topology.
    n_iters : int
    bcd_iter : int
        The outer iteration (for the exchange's records).

    Returns
    -------
    ConsensusVars
        ``v``.
    """
    split = v.X is not None
    shape = tuple(v.U.shape[:2])
    sampler.begin_bcd_iteration()
    for m in range(n_iters):
        v.g, rho = draw_penalties(sampler, exchange, v.g, m, bcd_iter=bcd_iter, shape=shape, dtype=v.U.dtype)  # 1.
        if split:
            v.X = (v.U + v.P).clamp_min(0.0)  # 2. eq. 8
        v.U = local(v.U, v.X, v.P, v.Q, v.Q_prev, rho)  # 3. eq. 9
        if split:
            v.P = v.P - (v.X - v.U)  # 4. eq. 10
        S = neighbour_sums(exchange, v.U, v.g, bcd_iter=bcd_iter, admm_iter=m + 1)  # 5. eq. 11
        v.Q_prev, v.Q = carry_duals(v.Q, S)  # 6.
    if split:
        v.X = (v.U + v.P).clamp_min(0.0)
    return v
