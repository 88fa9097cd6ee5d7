"""The outer BCD loop of Algorithm 1 (lines 3-24), its metrics and its finiteness checks."""
from __future__ import annotations

import time
import warnings

import torch

from .... import metrics
from ...._utils import caller_stacklevel, plain_number
from ....errors import ConvergenceWarning, DataError, PPDNMFError
from ....checkpoint import good_point, snapshot
from ....driver import RunInterrupted
from ....exchange.base import Exchange
from ....penalties import PenaltySampler
from ..problem import Problem
from .admm import x_step, y_step
from .incremental import incremental_x_step
from .kernels import Workspace, rel_change, sync
from .refit import worst_agent_nmse
from .schedule import adapt, adapt_agreed, disagreement, init_schedule
from .state import IterationInfo, SolverParams, SolverState, init_state, make_sampler
from .stopping import stop_flags

__all__ = ["run_bcd", "ConvergenceWarning", "NumericalError", "RunInterrupted", "AgentReduction", "raise_nonfinite"]


class NumericalError(PPDNMFError):
    """NaN or Inf appeared in the iterates."""


def _block_norms(problem: Problem) -> torch.Tensor:
    """``||Z_i||_F (T, N)`` of the real agents; refuses a block of norm 0, whose NMSE is undefined."""
    Z, n_real = problem.Z, problem.n_agents
    z_norms = torch.linalg.matrix_norm(Z[:, :n_real])
    if not bool((z_norms > 0).all()):
        # the paper's NMSE divides by ||Z_i||: refuse before any work rather than fail on 0/0
        raise zero_norm_error(torch.nonzero(z_norms == 0).tolist(), Z.dtype, Z.shape[0] > 1)
    return z_norms


def zero_norm_error(where, dtype, batched: bool) -> DataError:
    """The error for data blocks of Frobenius norm 0, ``where`` their ``(trial, agent)`` pairs
    (global agent ids; ``batched``: name the trials too)."""
    agents = sorted({a for _, a in where})
    trials = sorted({t for t, _ in where})
    return DataError(
        f"Z: the blocks of agents {agents}" + (f" in trials {trials}" if batched else "")
        + f" have Frobenius norm 0 in {dtype} (all zeros, or entries too small to square); "
        "the NMSE (sum_i ||Z_i - X_i Y_i|| / ||Z_i||) is undefined for them: give every agent "
        "some nonzero data, or rescale it"
    )


def nonfinite_agents(t: torch.Tensor) -> torch.Tensor:
    """``(T, N)`` bool: the agents whose block of ``t (T, N, ...)`` holds a NaN or an Inf.

    One reduction pass instead of ``isfinite``'s temporaries of ``t``'s size: a NaN or Inf
    entry makes its agent's sum non-finite, and only agents whose sums are not finite
    (which finite entries can also give, by overflow) are checked entry by entry.
    """
    bad = ~torch.isfinite(t.flatten(2).sum(-1))
    if bool(bad.any()):
        bad[bad.clone()] = ~torch.isfinite(t[bad]).flatten(1).all(-1)
    return bad


def check_finite(problem, state, bcd_iter, per_agent_nmse, first_bad):
    """Raise :class:`NumericalError` naming the BCD/ADMM iteration and the agents hit."""
    n = problem.n_agents
    bad = ~torch.isfinite(per_agent_nmse)
    for name in ("U", "Y"):
        bad |= nonfinite_agents(getattr(state, name)[:, :n])
    raise_nonfinite(bad, first_bad[:, :n], bcd_iter, problem.Z.shape[0] > 1)


def raise_nonfinite(bad, first_bad, bcd_iter, batched: bool) -> None:
    """Raise :class:`NumericalError` if any agent of ``bad (T, N)`` is hit; ``first_bad (T, N)``
    as :func:`~.admm.x_step` returns it (the agents' columns only)."""
    if bool(bad.any()):
        where = torch.nonzero(bad).tolist()
        agents = sorted({a for _, a in where})
        trials = sorted({t for t, _ in where})
        fb = first_bad[bad]
        fb = fb[fb > 0]
        step = (f"X-step ADMM iteration {int(fb.min())}" if fb.numel() else "Y-step")
        raise NumericalError(
            f"NaN or Inf in the iterates at BCD iteration {bcd_iter}, {step}: agents {agents}"
            + (f" in trials {trials}" if batched else "")
            + "; check the data scale, mu/eta and the penalty caps (checkpoints written so far are kept)"
        )


class AgentReduction:
    """How the BCD loop reduces over the agent dimension: here, over every agent of the
    problem in this process. A rank of a distributed run (:mod:`ppdnmf_torch.distributed`)
    holds some agents only and overrides both methods to reduce across ranks, in this order."""

    def block_norms(self, problem: Problem) -> torch.Tensor:
        """``||Z_i||_F (T, N)`` of the real agents (a block of norm 0 is refused)."""
        return _block_norms(problem)

    def metrics(self, problem: Problem, state: SolverState, xi: dict, yi: dict, ws: Workspace, z_norms, bcd_iter):
        """One BCD iteration's metrics ``{name: Tensor (T,)}`` and the per-agent ADMM counts
        ``(T, N)`` of both steps (None for either: not logged as ``x_iters``/``y_iters``, the
        reduction's metrics carry a summary instead); raises :class:`NumericalError` on NaN or Inf."""
        n_real = problem.n_agents
        Zr, Xr, Yr = problem.Z[:, :n_real], state.X[:, :n_real], state.Y[:, :n_real]
        res = metrics.residual_norms(Zr, Xr, Yr, scratch=ws.take("metrics_XY", Zr))
        nm, per_agent, obj = metrics.from_residuals(res, z_norms)
        check_finite(problem, state, bcd_iter, per_agent, xi["first_bad"])
        values = {
            "nmse": nm,
            "consensus": metrics.consensus_error(Xr, scratch=ws.take("rhs", Xr)),
            "nmse_worst": worst_agent_nmse(Zr, Xr, Yr, z_norms, problem.width),
            "objective": obj,
            "x_primal": xi["primal"],
            "x_dual": xi["dual"],
            "y_primal": yi["primal"],
            "y_dual": yi["dual"],
        }
        return values, xi["iters"][:, :n_real], yi["iters"][:, :n_real]


def _bcd_iteration(problem, state, params, exchange, sampler, bcd_iter, ws, z_norms, history,
                   agents: AgentReduction) -> tuple[dict, dict]:
    """One BCD iteration: the X-step, the Y-step, the metrics (logged into ``history``).

    Returns the metrics ``{name: Tensor (T,)}`` on the CPU, float64, and the X-step's report
    (its ``rho`` feeds the stopping rule's agreement test).
    """
    device = problem.Z.device

    def log(key, value):
        history.setdefault(key, []).append(value)

    sync(device)
    t0 = time.perf_counter()
    step = x_step if params.x_solver == "admm" else incremental_x_step
    xi = step(problem, state, params, exchange, sampler, bcd_iter=bcd_iter, ws=ws)
    sync(device)
    t1 = time.perf_counter()
    yi = y_step(problem, state, params, ws=ws)
    sync(device)
    t2 = time.perf_counter()
    values, x_iters, y_iters = agents.metrics(problem, state, xi, yi, ws, z_norms, bcd_iter)
    values = {k: v.detach().to("cpu", torch.float64) for k, v in values.items()}
    # each agent's caps and mu_i for the next BCD iteration (the ADMM X-step's: the token has neither)
    if params.penalty_schedule != "paper" and params.x_solver == "admm":
        (adapt_agreed if params.penalty_schedule == "agreed" else adapt)(problem, state, xi["rho"])
        sampler.set_caps(state.caps)
    t3 = time.perf_counter()
    for k, v in values.items():
        log(k, v)
    if x_iters is not None:  # a reduction that keeps per-agent counts on their ranks logs its own summary
        log("x_iters", x_iters.cpu())
    for k, v in xi.get("history", {}).items():  # a solver's own counters (the incremental X-step's messages)
        log(k, v)
    if y_iters is not None:
        log("y_iters", y_iters.cpu())
    log("time_x", t1 - t0)
    log("time_y", t2 - t1)
    log("time_metrics", t3 - t2)
    return values, xi


def _log_costs(exchange: Exchange, history: dict) -> dict:
    """The exchange's cumulative costs after this BCD iteration as ``crypto_<counter>`` history
    keys (so that a checkpoint carries them into a resumed run); returns the costs."""
    costs = exchange.costs()
    for k, v in costs.items():
        v = plain_number(v)
        if v is not None:
            v = float(v)  # the history holds floats (checkpoints store them so)
            vals = history.setdefault(f"crypto_{k}", [])
            # a counter the checkpoint's segment did not log (an older checkpoint, or
            # another exchange kind): NaN for its iterations, so rows stay aligned
            vals.extend([float("nan")] * (len(history["nmse"]) - 1 - len(vals)))
            vals.append(v)
    return costs


def run_bcd(problem: Problem, params: SolverParams, exchange: Exchange, *, state: SolverState | None = None,
            sampler: PenaltySampler | None = None, callback=None, history: dict | None = None,
            checkpointer=None, fingerprint: str = "", agents: AgentReduction | None = None):
    """The outer BCD loop (Algorithm 1, lines 3-24) on a batch of problems.

    Parameters
    ----------
    problem : Problem
    params : SolverParams
    exchange : Exchange
        Already bound to ``problem.topology``.
    state, sampler : optional
        To resume: the state and penalty sampler of a previous run.
    callback : callable, optional
        Called as ``callback(info: IterationInfo)`` after every BCD iteration; returning
        ``True`` stops the run after that iteration.
    history : dict, optional
        Metric history to append to (when resuming).
    checkpointer : ppdnmf_torch.checkpoint.Checkpointer, optional
        Writes a checkpoint on its schedule, and on Ctrl-C (then :class:`RunInterrupted`
        is raised).
    fingerprint : str
        Stored in checkpoints to match them to this run.
    agents : AgentReduction, optional
        How the metrics reduce over the agents (default: every agent of ``problem``, in
        this process; a rank of a distributed run passes its own).

    Returns
    -------
    state : SolverState
    history : dict of lists
        Per BCD iteration: Tensors ``(T,)`` for ``nmse``, ``consensus``, ``nmse_worst``
        (:func:`~.refit.worst_agent_nmse`), ``objective``,
        ``x_primal``, ``x_dual``, ``y_primal``, ``y_dual``; floats for ``time_x``,
        ``time_y``, ``time_metrics``; Tensors ``(T, N)`` for ``x_iters``, ``y_iters``.
    info : dict
        ``converged`` (bool; always False with ``tol == 0``), ``n_iter``, ``sampler``.
    """
    T, N = problem.Z.shape[:2]
    if state is None:
        state = init_state(problem, params.rank, init=params.init)
    if sampler is None:
        sampler = make_sampler(problem, params)
    if params.penalty_schedule != "paper":
        if state.caps is None:
            init_schedule(problem, state, params.mu)
        sampler.set_caps(state.caps)  # a resumed run continues with the checkpoint's caps
    history = history if history is not None else {}
    agents = agents if agents is not None else AgentReduction()
    z_norms = agents.block_norms(problem)
    tol = params.tol
    bflags = state.frozen if state.frozen is not None else torch.zeros((T, N), dtype=torch.bool,
                                                                       device=problem.Z.device)
    converged = False
    t_start = time.perf_counter()
    ws = Workspace()
    keep = checkpointer is not None  # only a checkpoint needs a copy of the last good state
    good = good_point(state, sampler, history, keep, exchange)
    try:
        for n in range(state.bcd_done, params.bcd_iters):
            bcd_iter = n + 1
            # the workspace overwrites state buffers: the stopping rule keeps its own copy
            X_before, Y_before = (state.X.clone(), state.Y.clone()) if tol > 0 else (None, None)
            values, xi_last = _bcd_iteration(problem, state, params, exchange, sampler, bcd_iter, ws, z_norms,
                                             history, agents)
            state.bcd_done = bcd_iter
            if tol > 0 and bcd_iter > 1:
                # both factors: X alone can sit still while Y moves. Not on the first BCD
                # iteration: there the "previous iterate" is the start, which X = max(0, U + P)
                # and Y = max(0, V + R) still equal after one ADMM iteration each
                raised = torch.maximum(rel_change(state.X, X_before), rel_change(state.Y, Y_before)) < tol
                if "rho" in xi_last:  # and agreement: stationary copies that still disagree go on
                    # each agent's delta_i, the adaptive schedules' signal (schedule.disagreement)
                    raised &= disagreement(state, xi_last["rho"]).view_as(xi_last["rho"]) < tol
                bflags = stop_flags(bflags, raised & ~bflags, problem.topology)
                state.frozen = bflags if problem.topology.any_set(bflags) else None
            costs = _log_costs(exchange, history)
            good = good_point(state, sampler, history, keep, exchange)
            if checkpointer is not None and checkpointer.due(bcd_iter):
                checkpointer.write(snapshot(good, history, fingerprint, checkpointer.packer))
            stop = False
            if callback is not None:
                stop = bool(callback(IterationInfo(bcd_iter, params.bcd_iters, values, state,
                                                   time.perf_counter() - t_start, costs=costs)))
            if tol > 0 and problem.topology.all_set(bflags):
                converged = True
                break
            if stop:
                break
    except KeyboardInterrupt:
        path = None
        if checkpointer is not None:
            path = checkpointer.write(snapshot(good, history, fingerprint, checkpointer.packer))
        raise RunInterrupted(path, good["bcd_done"], "BCD iteration") from None
    if tol > 0 and not converged and state.bcd_done >= params.bcd_iters:
        warnings.warn(
            f"PPDNMF did not converge to tol={tol:g} within bcd_iters={params.bcd_iters} (scikit-learn's "
            "max_iter); the factors of the last iteration are returned", ConvergenceWarning,
            stacklevel=caller_stacklevel())
    return state, history, {"converged": converged, "n_iter": state.bcd_done, "sampler": sampler}
