"""The two ADMM steps of Algorithm 1, for every agent (and trial) at once.

:func:`x_step` is lines 4-17 of the paper's Algorithm 1 (eqs. 8-11), :func:`y_step` lines
19-23 (eqs. 12-14). Each loop iteration is one call per step of ALGORITHM.md; how the
calls reach the hardware (eager, compiled, grouped) is the plan's business
(:mod:`.plans`), chosen once per step.

The systems of the U-update (eq. 9) differ across an X-step's ADMM iterations only by
the diagonal shift ``mu + rho_i``: each X-step decomposes ``Y_i Y_i^T`` once (``eigh``)
and every iteration applies ``E diag(1 / (lam + mu + rho_i)) E^T``. Without a stopping
rule to track, the penalties of a whole X-step (and, for exchanges whose step 1 costs
nothing, their sums ``rho_i``) are drawn up front in a few batched operations.
"""
from __future__ import annotations

import torch

from ....consensus.xstep import neighbour_sums, penalty_sums
from ....exchange.base import Exchange
from ....penalties import PenaltySampler
from ..problem import Problem
from . import kernels
from .eager import spectral_factors
from .hals import hals_loop
from .kernels import (Workspace, agent_group, agent_rows, agent_slices, bmm, column_gram, eigh_psd, is_large,
                      residuals_sq, spd_inverse, where_active)
from .plans import XFixed, XVars, x_plan, y_plan
from .state import SolverParams, SolverState
from .stopping import StopRule

__all__ = ["x_step", "y_step", "y_loop", "hals_y_step"]


class _Step1:
    """Step 1 of the X-step: each ADMM iteration's penalty draws ``g (2E,)``, their sums
    ``rho_i`` as the agent obtains them (``(T, N, 1, 1)``), and the spectral factors ``d``
    of eq. 9. With ``ahead`` (no stopping rule), the whole X-step's draws at once."""

    def __init__(self, sampler: PenaltySampler, exchange: Exchange, topology, g, fixed: XFixed, *, n_iters: int,
                 shape, dtype, bcd_iter: int, ahead: bool):
        self.sampler, self.exchange, self.topology, self.g = sampler, exchange, topology, g
        self.f, self.shape, self.dtype, self.bcd_iter = fixed, shape, dtype, bcd_iter
        self.G_rows = self.rho_block = self.D_block = None
        if ahead:
            G = sampler.steps(g, n_iters)
            rho_block = exchange.penalty_block(G, bcd_iter=bcd_iter)
            self.G_rows = G.unbind(0)
            if rho_block is not None:
                self.rho_block = rho_block.to(dtype).view(n_iters, *shape, 1, 1)
                self.D_block = spectral_factors(fixed.lam, self.rho_block, fixed.mu)  # (n_iters, T, N, K)

    def at(self, m: int, active):
        """``(g, rho, d)`` of ADMM iteration ``m`` (0-based); stopped agents keep their draws."""
        if self.G_rows is not None:
            self.g = self.G_rows[m]
        else:
            active_edges = None if active is None else active.reshape(-1)[self.topology.src]
            self.g = self.sampler.step(self.g, m, active_edges)
        if self.rho_block is not None:
            return self.g, self.rho_block[m], self.D_block[m]
        rho = penalty_sums(self.exchange, self.g, bcd_iter=self.bcd_iter, admm_iter=m + 1, shape=self.shape,
                           dtype=self.dtype)
        return self.g, rho, spectral_factors(self.f.lam, rho, self.f.mu)


def _secure_sums(exchange: Exchange, v: XVars, g, ws: Workspace, *, bcd_iter: int, admm_iter: int):
    """Step 5 (eq. 11, lines 10-16): ``Q + S`` with ``S_i = sum_j rho_ij (U_j - U_i)`` from the exchange
    (:func:`~ppdnmf_torch.consensus.xstep.neighbour_sums`), into a reused buffer where it can."""
    S_buf = ws.take("S", v.U, (v.Q, v.Q_prev))  # None below the workspace's size
    return neighbour_sums(exchange, v.U, g, bcd_iter=bcd_iter, admm_iter=admm_iter, out=S_buf).add_(v.Q)


def x_step(problem: Problem, state: SolverState, params: SolverParams, exchange: Exchange,
           sampler: PenaltySampler, *, bcd_iter: int = 1, ws: Workspace | None = None):
    """X-step: ``x_iters`` ADMM iterations with secure consensus (eqs. 8-11, lines 4-17).

    Updates ``state`` in place.

    Returns
    -------
    dict
        ``iters`` ``(T, N)`` ADMM iterations per agent, ``primal`` and ``dual`` residuals
        ``(T,)``, ``first_bad`` ``(T, N)``: the first ADMM iteration (1-based) at which an
        agent's ``U_i`` stopped being finite (0: never), ``residuals_sq`` ``(2, T, N)``: the
        residuals' squares per agent before the sum over agents (a distributed run sums
        them across ranks; both unscaled: ``dual`` carries ``mu``, or each agent's ``mu_i``);
        ``rho`` ``(T, N)``: the penalty sums ``rho_i`` of the last ADMM iteration, as each
        agent obtained them.
    """
    Z, topo = problem.Z, problem.topology
    T, N = Z.shape[:2]
    ws = ws if ws is not None else Workspace()
    # fixed during the X-step: Z Y^T (into a buffer kept from the last X-step; "rhs" is the
    # loop's scratch, free until then) and Y Y^T = E diag(lam) E^T (eq. 9)
    ZYt = column_gram(Z, state.Y, out=ws.take("ZYt", state.U), scratch=ws.take("rhs", state.U))
    lam, E = eigh_psd(column_gram(state.Y, state.Y))
    # the schedule's mu_i per agent, or the one mu of the paper
    mu = params.mu if state.mu is None else state.mu.to(state.U.dtype).view(T, N, 1, 1)
    fixed = XFixed(ZYt, lam, E, E.mT.contiguous(), mu, params.consensus_form == "derived")
    # agreed: the X-step exchanges, so no agent stops while its neighbours go on (.stopping)
    stop = StopRule(state.frozen, params.inner_tol, params.x_iters, topo, (T, N), Z.device, agreed=True)
    # per-iteration sums of U_i: NaN/Inf anywhere in U_i makes its sum non-finite; inspected
    # once after the loop (no device synchronization per iteration)
    u_sums = torch.empty((params.x_iters, T, N), dtype=state.U.dtype, device=Z.device)
    sampler.begin_bcd_iteration()
    plan = x_plan(fixed, ws, u_sums, fuse=params.fuse, track=stop.track, n_iters=params.x_iters)
    step1 = _Step1(sampler, exchange, topo, state.g, fixed, n_iters=params.x_iters, shape=(T, N),
                   dtype=state.U.dtype, bcd_iter=bcd_iter, ahead=not stop.track)
    if step1.D_block is not None:
        plan.prepare(step1.D_block)
    v = XVars(state.X, state.U, state.P, state.Q, state.Q_prev)
    active = stop.active
    rho = None
    for m in range(params.x_iters):
        g, rho, d = step1.at(m, active)  # 1. penalties and rho_i
        op = plan.neighbour_operator(exchange, g, active)  # steps 5-6 inside the plan, where it can
        it = plan.iterate(m, v, rho, d, op, active)  # 2.-4. eqs. 8, 9, 10
        U_prev = v.U
        v.X, v.U, v.P = where_active(active, it.X, v.X), where_active(active, it.U, v.U), where_active(active, it.P, v.P)
        if not it.sums_done or active is not None:
            torch.sum(v.U, dim=(-2, -1), out=u_sums[m])
        if it.deferred:  # steps 5-6 run in the next iteration's pass
            continue
        Q_new = it.Q_new
        if Q_new is None:  # 5. secure exchange (eq. 11)
            Q_new = _secure_sums(exchange, v, g, ws, bcd_iter=bcd_iter, admm_iter=m + 1)
        v.Q_prev, v.Q = where_active(active, v.Q, v.Q_prev), where_active(active, Q_new, v.Q)  # 6.
        if stop.after(m, v.U, U_prev):
            break
        active = stop.active
    plan.finish(v, m)
    bad = ~torch.isfinite(u_sums[: m + 1])
    first_bad = torch.where(bad.any(0), bad.to(torch.int8).argmax(0) + 1, 0)
    state.X, state.U, state.P, state.Q, state.Q_prev, state.g = v.X, v.U, v.P, v.Q, v.Q_prev, step1.g
    # the differences in the loop's scratch, free again; dummy agents add exact zeros
    per_agent = residuals_sq(v.X, v.U, U_prev, ws.take("rhs", v.U, (v.X, v.U, U_prev)))
    sq = per_agent.sum(-1).sqrt()
    if state.mu is None:
        dual = params.mu * sq[1]
    else:  # each agent's own mu_i weighs its dual residual
        dual = (state.mu.to(per_agent.dtype).square() * per_agent[1]).sum(-1).sqrt()
    return {"iters": stop.counts, "primal": sq[0], "dual": dual, "first_bad": first_bad,
            "residuals_sq": per_agent, "rho": rho.view(T, N)}


def y_loop(Y, V, R, plan, stop: StopRule | None, active):
    """The Y-step's ADMM iterations (eqs. 12-14) on ``Y, V, R (..., K, M)``; returns ``Y, V, R, V_prev``.

    ``stop`` (None: fixed counts) ends the loop early.
    """
    V_prev = V
    for k in range(plan.n_iters):
        Y_new, V_new, R_new = plan.iterate(k, Y, V, R)
        V_prev = V
        Y, V, R = where_active(active, Y_new, Y), where_active(active, V_new, V), where_active(active, R_new, R)
        if stop is not None:
            if stop.after(k, V, V_prev):
                break
            active = stop.active
    return Y, V, plan.finish(V, R), V_prev


def y_group(n_agents: int, V: torch.Tensor, allowed: bool) -> int:
    """Agents per group of a grouped Y-step (0: not grouped): :data:`~.kernels.Y_TILE_BYTES` over
    the six ``(K, M)`` tensors an iteration touches per agent (see :func:`~.kernels.agent_group`)."""
    if not allowed:
        return 0
    return agent_group(n_agents, 6 * V[0, 0].numel() * V.element_size(), kernels.Y_TILE_BYTES)


def y_step(problem: Problem, state: SolverState, params: SolverParams, *, ws: Workspace | None = None):
    """Y-step: ``y_iters`` local ADMM iterations, no communication (eqs. 12-14, lines 19-23).

    Updates ``state`` in place; returns iteration counts and residuals like :func:`x_step`.
    Large problems with fixed iteration counts run in groups of agents
    (:data:`~.kernels.Y_TILE_BYTES`), each group through all its iterations while it is in
    the cache: the agents do not communicate in the Y-step, so the bits are the same.
    """
    if params.y_solver == "hals":
        return hals_y_step(problem, state, params, ws=ws)
    Z, topo = problem.Z, problem.topology
    T, N = Z.shape[:2]
    K, eta = params.rank, params.eta
    X, Y, V, R = state.X, state.Y, state.V, state.R
    eye = torch.eye(K, dtype=X.dtype, device=X.device)
    G_inv = spd_inverse(bmm(X.mT, X) + eta * eye)  # (X^T X + eta I)^-1 of eq. 13, fixed during the Y-step
    ws = ws if ws is not None else Workspace()
    XtZ = bmm(X.mT, Z, out=ws.take("XtZ", V))  # (T, N, K, M) like V; kept from the last Y-step
    stop = StopRule(state.frozen, params.inner_tol, params.y_iters, topo, (T, N), Z.device)
    large = is_large(V)
    fixed = large and not stop.track  # fixed counts, no flags: agents independent
    plan_kw = dict(eta=eta, n_iters=params.y_iters, fuse=params.fuse, large=large, fixed=fixed, width=problem.width)
    # CPU only (a GPU would run many small kernels instead of one), and only where the
    # state's flat views write through (contiguous tensors)
    group = y_group(T * N, V, fixed and V.device.type == "cpu" and all(t.is_contiguous() for t in (Y, V, R)))
    if group:
        A = T * N
        flat = agent_rows(Y, V, R, XtZ, G_inv)  # views that write through
        sq = torch.empty((2, A), dtype=V.dtype, device=V.device)
        tile_ws = ws.child("y_groups")
        for sl in agent_slices(A, group):
            Yg, Vg, Rg, Xg, Gg = (t[sl] for t in flat)
            Yn, Vn, Rn, Vp = y_loop(Yg, Vg, Rg, y_plan(Xg, Gg, tile_ws, **plan_kw), None, None)
            sq[:, sl] = residuals_sq(Yn, Vn, Vp)
            # this group's slices of the state are read by this group only: overwrite them
            Yg.copy_(Yn), Vg.copy_(Vn), Rg.copy_(Rn)
        sq = sq.view(2, T, N)
    else:
        Y, V, R, V_prev = y_loop(Y, V, R, y_plan(XtZ, G_inv, ws, **plan_kw), stop, stop.active)
        state.Y, state.V, state.R = Y, V, R
        sq = residuals_sq(Y, V, V_prev)
    per_agent, sq = sq, sq.sum(-1).sqrt()
    return {"iters": stop.counts, "primal": sq[0], "dual": eta * sq[1], "residuals_sq": per_agent}


def hals_y_step(problem: Problem, state: SolverState, params: SolverParams, *, ws: Workspace | None = None):
    """The Y-step by ``y_iters`` HALS sweeps (``y_solver="hals"``, :mod:`.hals`), warm-started
    from the last ``Y``; no communication, eager whatever ``fuse`` says.

    Updates ``state.Y`` (``V`` and ``R``, the ADMM variables, stay unused). Returns iteration
    counts like :func:`y_step`, ``primal`` 0 (every sweep's ``Y`` is feasible), ``dual`` the
    last sweep's change ``||Y - Y_prev||`` summed over agents, per trial, and
    ``residuals_sq`` ``(2, T, N)`` (zeros, and each agent's ``||Y - Y_prev||^2``: what a
    distributed run sums across ranks).
    """
    Z, topo = problem.Z, problem.topology
    T, N = Z.shape[:2]
    ws = ws if ws is not None else Workspace()
    X = state.X
    G = bmm(X.mT, X)
    C = bmm(X.mT, Z, out=ws.take("XtZ", state.Y))
    stop = StopRule(state.frozen, params.inner_tol, params.y_iters, topo, (T, N), Z.device)
    Y, Y_prev = hals_loop(state.Y, G, C, params.y_iters, problem.width, stop if stop.track else None)
    state.Y = Y
    per_agent = torch.linalg.matrix_norm(Y - Y_prev).square()
    change = per_agent.sum(-1).sqrt()
    return {"iters": stop.counts, "primal": torch.zeros_like(change), "dual": change,
            "residuals_sq": torch.stack([torch.zeros_like(per_agent), per_agent])}
