"""The consensus-seeking penalty schedules: ``penalty_schedule="agreed"`` (the library's
default: one cap for every edge, grown on one bit all agents agree on) and ``"adaptive"``
(each agent's own cap ``g_i``); both adapt each agent's X-step penalty ``mu_i`` after every
BCD iteration from what the agent holds.

Why. The consensus coupling of the X-step is ``rho_ij = g_{i->j} g_{j->i}``; with the
paper's fixed caps it is small against ``mu`` and against the local curvature
``Y_i Y_i^T`` (about ``2.5e-3`` against ``mu = 2`` on CBCL), and the local copies ``X_i``
do not agree within 100 BCD iterations. Raising it from the start slows the fit, and
raising it past ``mu`` makes the X-step's two splittings (the nonnegativity split with
``mu``, the consensus split with ``rho``) unstable. The rule below raises each agent's
cap only while that agent still disagrees with its neighbours, and only up to a bound
tied to its ``mu_i``; it follows the idea of the adaptive penalty of the symmetric-NMF
splitting paper (Zhu et al., Sec. on the adaptive lambda: the coupling grows until the
copies agree, and stays finite) with Boyd et al. (2011, Sec. 3.4.1)'s per-iteration
balancing signal replaced by the agent's own consensus residual.

The rule, for agent ``i`` after BCD iteration ``n`` (``S_i`` and ``rho_i`` are what the
secure exchange gave it in the X-step's last ADMM iteration, ``S_i = Q_i - Q_prev_i``):

1. ``mu_i <- max(mu_i, KAPPA ||Y_i||_F^2 / K)``: a floor at a fraction of the
   AO-ADMM penalty ``tr(Y_i Y_i^T) / K`` (Huang, Sidiropoulos and Liavas 2016), so
   that a ``mu`` far too small for the data's scale is raised; the scaled dual ``P_i``
   is rescaled by ``mu_old / mu_new`` (the unscaled multiplier ``mu P`` is kept);
2. ``delta_i = ||S_i||_F / (rho_i ||U_i||_F)``: the relative distance of ``U_i`` to the
   ``rho``-weighted mean of its neighbours' copies (agent ``i`` sees only the sum);
3. if ``delta_i > TOL``: ``g_i <- min(GROWTH g_i, bound_i)``, with
   ``bound_i = min(MAX_RATIO g_i^(0), max(g_i^(0), sqrt(STABILITY mu_i / d_i)))``:
   ``rho_i <= STABILITY mu_i`` when the neighbours' caps are alike, and never more than
   ``MAX_RATIO`` times the configured cap (the bound the integer codec is checked
   against before the run, :func:`~ppdnmf_torch.penalties.cap_bounds`).

``penalty_schedule="agreed"`` (:func:`adapt_agreed`). Under ``adaptive`` the weights
``rho_ij = g_{i->j} g_{j->i}`` of a receiver's sum differ across its neighbours, and a
receiver that knows its own draws can solve ``rho_int_i = sum_j w_j`` and
``S_int_i = sum_j w_j (q_j - q_i)`` for its neighbours' values (issue 32; a degree-2
receiver by integer arithmetic). The agreed rule keeps every weight equal: every agent of a
trial holds the same cap ``g`` (the configured ``g_max``, one number), draws the same
``g^(m)`` from a stream all agents agree on (:class:`~ppdnmf_torch.penalties.PenaltySampler`
with ``shared=True``), so ``rho_ij = g^(m)^2`` on every edge. After a BCD iteration:
step 2 as above; the cap grows, ``g <- min(GROWTH g, MAX_RATIO g^(0))``, iff
``OR_i (delta_i > TOL)``; and step 1 takes the stability bound the other way round: each
agent raises its own ``mu_i`` to ``d_i g^2 / STABILITY`` when the common cap needs it
(``rho_i = d_i g^2 <= STABILITY mu_i``), instead of holding back its cap. (A first version
held the common cap back while any agent's bound forbade growth, an AND of a second bit: the
weakest agent then capped every edge, and on the sparse Poisson data the copies did not
agree within 100 BCD iterations; docs/RESULTS.md.) The one bit per BCD iteration is all an
agent reveals of its state (the stopping rule's flags travel the same way); ``mu_i`` stays
private and per agent (it enters no sum).

Caps and ``mu_i`` only grow and stay bounded, so the draws ``g_{i->j}`` in
``(g_prev, g_i]`` (:class:`~ppdnmf_torch.penalties.PenaltySampler`) stay random,
monotone and bounded, and each agent still knows only its own. Both live in the solver
state (``caps``, ``mu``), so checkpoints carry them. ``quantized`` and ``paillier``
return the same ``S_i`` and ``rho_i``, so they adapt the same caps, bit for bit.
"""
from __future__ import annotations

import torch

from ....penalties import MAX_CAP_RATIO
from ..problem import Problem
from .state import SolverState

__all__ = ["GROWTH", "TOL", "STABILITY", "KAPPA", "init_schedule", "adapt", "adapt_agreed", "disagreement"]

#: factor of one growth step of a cap (one per BCD iteration at most)
GROWTH = 1.2
#: relative disagreement ``delta_i`` below which an agent's cap stops growing
TOL = 1e-4
#: the caps' bound keeps ``rho_i`` at about this fraction of ``mu_i``
STABILITY = 0.5
#: ``mu_i`` is kept at least this fraction of ``tr(Y_i Y_i^T) / K``
KAPPA = 0.25


def init_schedule(problem: Problem, state: SolverState, mu: float) -> None:
    """Put the schedule's start into ``state``: ``caps`` (the configured ``g_i``, flat
    ``(T * N,)`` float64) and ``mu`` (``(T, N)`` float64, all ``mu``)."""
    T, N = problem.Z.shape[:2]
    state.caps = problem.caps.reshape(-1).to(torch.float64).clone()
    state.mu = torch.full((T, N), float(mu), dtype=torch.float64, device=problem.Z.device)


def _mu_floor(state: SolverState, need: torch.Tensor | None = None) -> torch.Tensor:
    """Step 1 of both rules: ``mu_i <- max(mu_i, KAPPA ||Y_i||_F^2 / K)`` (and ``need_i``, flat
    ``(T * N,)``, when given) with ``P_i`` rescaled by ``mu_old / mu_new``, in place on
    ``state``; returns the new ``mu`` flat ``(T * N,)``."""
    T, N, L, K = state.U.shape
    f64 = torch.float64
    curv = state.Y.reshape(T * N, -1).to(f64).square().sum(-1).div_(K)
    mu_old = state.mu.reshape(T * N)
    mu_new = torch.maximum(mu_old, KAPPA * curv)
    if need is not None:
        mu_new = torch.maximum(mu_new, need)
    state.P.mul_((mu_old / mu_new).to(state.P.dtype).view(T, N, 1, 1))  # exactly 1 where mu_i stays
    state.mu = mu_new.view(T, N)
    return mu_new


def disagreement(state: SolverState, rho: torch.Tensor) -> torch.Tensor:
    """Step 2 of both rules: ``delta_i = ||S_i||_F / (rho_i ||U_i||_F)`` flat ``(T * N,)``
    float64, from what the exchange gave each agent (0 for an agent without a neighbour)."""
    T, N = state.U.shape[:2]
    f64 = torch.float64
    S = (state.Q - state.Q_prev).reshape(T * N, -1).to(f64)
    u_norm = state.U.reshape(T * N, -1).to(f64).norm(dim=-1)
    r = rho.reshape(T * N).to(f64)
    linked = (r > 0) & (u_norm > 0)
    return torch.where(linked, S.norm(dim=-1) / torch.where(linked, r * u_norm, 1.0), 0.0)


def adapt(problem: Problem, state: SolverState, rho: torch.Tensor) -> None:
    """One step of the rule (module docstring) after a BCD iteration, in place on ``state``
    (``caps``, ``mu`` and the rescaled ``P``).

    Parameters
    ----------
    problem : Problem
    state : SolverState
        After the BCD iteration's X-step and Y-step.
    rho : Tensor (T, N)
        ``rho_i`` of the X-step's last ADMM iteration, as each agent obtained it.
    """
    f64 = torch.float64
    mu_new = _mu_floor(state)  # 1.
    delta = disagreement(state, rho)  # 2.
    # 3. grow the caps of the agents that still disagree, up to their bounds
    caps0 = problem.caps.reshape(-1).to(f64)
    degree = problem.topology.degree.to(f64).clamp_min(1.0)
    bound = torch.minimum(MAX_CAP_RATIO * caps0, torch.maximum(caps0, (STABILITY * mu_new / degree).sqrt()))
    grown = torch.minimum(GROWTH * state.caps, bound)
    state.caps = torch.where(delta > TOL, torch.maximum(grown, state.caps), state.caps)


def adapt_agreed(problem: Problem, state: SolverState, rho: torch.Tensor) -> None:
    """One step of the agreed rule (``penalty_schedule="agreed"``, module docstring) after a
    BCD iteration, in place on ``state``: the trial's one cap ``g`` becomes
    ``min(GROWTH g, MAX_RATIO g^(0))`` iff some agent still disagrees (``delta_i > TOL``, an
    OR over the trial's agents); then each agent keeps its consensus coupling within its
    stability bound by its own ``mu_i``: ``mu_i <- max(mu_i, KAPPA ||Y_i||_F^2 / K,
    d_i g^2 / STABILITY)`` (``rho_i = d_i g^2 <= STABILITY mu_i``), ``P_i`` rescaled.

    The one bit is all that leaves an agent (:meth:`~ppdnmf_torch.graph.topology.Topology.trial_counts`:
    the stopping rule's flags and decisions carry it the same way); every agent of a trial
    then holds the same cap, and every edge's penalty stays equal. ``mu_i`` enters no sum:
    it stays each agent's own.

    Parameters
    ----------
    problem, state, rho
        As :func:`adapt`.
    """
    T, N = state.U.shape[:2]
    f64 = torch.float64
    delta = disagreement(state, rho)  # 2.
    caps0 = problem.caps.reshape(-1).to(f64)
    disagree = problem.topology.trial_counts((delta > TOL).view(1, T, N))[0] > 0  # (T,): OR over agents
    grown = torch.maximum(torch.minimum(GROWTH * state.caps, MAX_CAP_RATIO * caps0), state.caps)
    state.caps = torch.where(disagree.view(T, 1).expand(T, N).reshape(-1), grown, state.caps)
    degree = problem.topology.degree.to(f64)
    _mu_floor(state, need=degree * state.caps.square() / STABILITY)  # 1., with the stability bound
