"""The outer BCD loop of Algorithm 1 (lines 3-24), its metrics and its finiteness checks.

The loop is the engine's driver (:func:`~ppdnmf_torch.driver.drive`) over this model's hooks
(:class:`BCDRun`): one BCD iteration (the X-step, the Y-step, the metrics, the stopping rule's
flags), its history row, its state and its settings; the driver runs the iterations, the
callback, the checkpoints and resume, the exchange's cost ledger and Ctrl-C.
"""
from __future__ import annotations

import time
from dataclasses import asdict

import torch

from .... import metrics
from ...._utils import plain_number
from ....checkpoint import digest
from ....driver import Ledgers, LoopModel, RunInterrupted, drive
from ....errors import ConvergenceWarning, DataError, PPDNMFError
from ....exchange.base import Exchange
from ....penalties import PenaltySampler
from ..problem import Problem
from .admm import x_step, y_step
from .incremental import incremental_x_step
from .kernels import Workspace, sync
from .refit import worst_agent_nmse
from .schedule import adapt, adapt_agreed, disagreement, init_schedule
from .state import IterationInfo, SolverParams, SolverState, init_state, make_sampler
from .stopping import agreed_stop, model_change, trial_mask

__all__ = ["run_bcd", "BCDRun", "ConvergenceWarning", "NumericalError", "RunInterrupted", "AgentReduction",
           "raise_nonfinite"]


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


def _bcd_iteration(problem, state, params, exchange, sampler, bcd_iter, ws, z_norms,
                   agents: AgentReduction) -> tuple[dict, dict, dict]:
    """One BCD iteration: the X-step, the Y-step, the metrics.

    Returns the metrics ``{name: Tensor (T,)}`` on the CPU, float64, the X-step's report (its
    ``rho`` feeds the stopping rule's agreement test) and the history's row (the metrics, the
    ADMM counts per agent, the solver's own counters and the steps' times).
    """
    device = problem.Z.device
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
    row = dict(values)
    if x_iters is not None:  # a reduction that keeps per-agent counts on their ranks logs its own summary
        row["x_iters"] = x_iters.cpu()
    row.update(xi.get("history", {}))  # a solver's own counters (the incremental X-step's messages)
    if y_iters is not None:
        row["y_iters"] = y_iters.cpu()
    row.update(time_x=t1 - t0, time_y=t2 - t1, time_metrics=t3 - t2)
    return values, xi, row


def _cost_row(exchange: Exchange) -> tuple[dict, dict]:
    """The exchange's cumulative costs after a BCD iteration, and the history's ``crypto_<counter>``
    entries (floats; a checkpoint carries them into a resumed run, whose rows the history pads
    with NaN where a counter starts late)."""
    costs = exchange.costs()
    row = {}
    for k, v in costs.items():
        v = plain_number(v)
        if v is not None:
            row[f"crypto_{k}"] = float(v)  # the history holds floats (checkpoints store them so)
    return costs, row


class BCDRun(LoopModel):
    """The driver's hooks of Algorithm 1 on a batch of problems (see the module).

    Parameters
    ----------
    problem : Problem
    params : SolverParams
    exchange : Exchange
        Already bound to ``problem.topology``.
    state, sampler : optional
        The start (default: :func:`~.state.init_state`, :func:`~.state.make_sampler`).
    agents : AgentReduction, optional
        How the metrics reduce over the agents (a rank of a run over ranks passes its own).
    settings : dict, optional
        More settings a checkpoint compares by name (a rank's partition and share).
    """

    name = "ppdnmf"
    step_name = "BCD iteration"
    cap_key = "bcd_iters"
    fresh_state = False  # the workspace reuses the state's buffers in later iterations
    partial_keys = ("crypto_",)

    def __init__(self, problem: Problem, params: SolverParams, exchange: Exchange, *, state: SolverState | None = None,
                 sampler: PenaltySampler | None = None, agents: AgentReduction | None = None,
                 settings: dict | None = None):
        self.problem, self.params, self.exchange = problem, params, exchange
        self.st = state if state is not None else init_state(problem, params.rank, init=params.init)
        self.sampler = sampler if sampler is not None else make_sampler(problem, params)
        self._more = dict(settings or {})
        self._start_schedule()
        self.agents = agents if agents is not None else AgentReduction()
        self.z_norms = self.agents.block_norms(problem)
        # the stopping rule's: each agent's own ||Z_i|| (a padding slot's 0), in this process
        self.z_own = torch.linalg.matrix_norm(problem.Z[:, :problem.n_agents])
        self.ws = Workspace()
        self._values = self._costs = None

    def _start_schedule(self) -> None:
        """The adaptive schedules' caps (a resumed run continues with the checkpoint's) and the
        stopping rule's flags."""
        st, p = self.st, self.problem
        if self.params.penalty_schedule != "paper":
            if st.caps is None:
                init_schedule(p, st, self.params.mu)
            self.sampler.set_caps(st.caps)
        T, N = p.Z.shape[:2]
        # the agents' flags (a checkpoint of the earlier rule, which froze agents, has them as frozen)
        flags = st.stop_flags if st.stop_flags is not None else st.frozen
        self.bflags = flags if flags is not None else torch.zeros((T, N), dtype=torch.bool, device=p.Z.device)
        self.done = agreed_stop(self.bflags, p.topology) if flags is not None else torch.zeros(
            T, dtype=torch.bool, device=p.Z.device)

    def step(self, k: int, clock) -> dict:
        st, params, problem = self.st, self.params, self.problem
        tol = params.tol
        # the workspace overwrites state buffers: the stopping rule keeps its own copy
        X_before, Y_before = (st.X.clone(), st.Y.clone()) if tol > 0 else (None, None)
        values, xi, row = _bcd_iteration(problem, st, params, self.exchange, self.sampler, k, self.ws, self.z_norms,
                                         self.agents)
        st.bcd_done = k
        if tol > 0 and k > 1:
            # the model X_i Y_i, against ||Z_i|| (.stopping.model_change: the factors drift along
            # X D, D^-1 Y). Not on the first BCD iteration: there the "previous iterate" is the
            # start, which X = max(0, U + P) and Y = max(0, V + R) still equal after one ADMM
            # iteration each
            raised = self._model_change(X_before, Y_before) < tol
            if "rho" in xi:  # and agreement: stationary copies that still disagree go on
                # each agent's delta_i, the adaptive schedules' signal (schedule.disagreement)
                raised &= disagreement(st, xi["rho"]).view_as(xi["rho"]) < tol
            # the stop decided network-wide (.stopping): a trial stops, all its agents at once, at
            # the first iteration at which every agent's own test holds. The flags do not travel as
            # Sec. II-C's do: a travelling flag stays up, so the first agent whose step happens to be
            # small (one agent of ten, on scikit-learn's checks' data) stopped the whole network
            self.bflags = raised
            st.stop_flags = self.bflags
            self.done = agreed_stop(self.bflags, problem.topology)
            st.frozen = trial_mask(self.done, self.bflags.shape)
        self._costs, costs_row = _cost_row(self.exchange)
        self._values = values
        row.update(costs_row)
        return row

    def _model_change(self, X_before, Y_before) -> torch.Tensor:
        """:func:`~.stopping.model_change` of every slot ``(T, N)``: the real agents' own, 0 for
        the isolated padding agents after them (no data, nothing to converge)."""
        st, n = self.st, self.problem.n_agents
        change = torch.zeros(self.bflags.shape, dtype=self.z_own.dtype, device=self.z_own.device)
        scratch = self.ws.take("metrics_XY", self.problem.Z[:, :n])  # free once the metrics are taken
        change[:, :n] = model_change(st.X[:, :n], st.Y[:, :n], X_before[:, :n], Y_before[:, :n], self.z_own,
                                     scratch=scratch)
        return change

    def converged(self, k: int, row: dict) -> bool:
        return self.params.tol > 0 and bool(self.done.all())

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(IterationInfo(k, self.params.bcd_iters, self._values, self.st, clock(),
                                           costs=self._costs)))

    def not_converged(self, k: int, tol: float) -> str:
        return (f"PPDNMF did not converge to tol={tol:g} within bcd_iters={self.params.bcd_iters} (scikit-learn's "
                "max_iter); the factors of the last iteration are returned")

    # -- what a checkpoint holds ----------------------------------------------------------
    def state(self) -> dict:
        return self.st.tensors()

    def state_spec(self) -> dict:
        T, N, L, M = self.problem.Z.shape
        dt, rank, params = self.problem.Z.dtype, self.params.rank, self.params
        xs, ys = ((T, N, L, rank), dt), ((T, N, rank, M), dt)
        out = {"X": xs, "U": xs, "P": xs, "Q": xs, "Q_prev": xs, "Y": ys, "V": ys, "R": ys,
               "g": ((int(self.problem.topology.n_directed_edges),), torch.float64)}
        if params.penalty_schedule != "paper":
            out.update(caps=((T * N,), torch.float64), mu=((T, N), torch.float64))
        if params.x_solver != "admm":  # the token's state; its walk's length is the run's own
            out.update(inc_y=xs, inc_z=((T, L, rank), dt), inc_cycle=(None, torch.int64))
        spec = {k: (shape, dtype, False) for k, (shape, dtype) in out.items()}
        spec["frozen"] = ((T, N), torch.bool, True)  # the trials stopped by the BCD-level rule, once any is
        spec["stop_flags"] = ((T, N), torch.bool, True)  # the agents' own flags, once the rule runs
        return spec

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev = self.problem.Z.device
        t = {k: v.to(dev) for k, v in tensors.items()}
        frozen, flags = t.pop("frozen", None), t.pop("stop_flags", None)
        self.st = SolverState(**t, frozen=frozen, stop_flags=flags)
        self._start_schedule()

    def resumed(self, done: int, history) -> None:
        self.st.bcd_done = done

    def rng_state(self):
        return self.sampler.state_dict()

    def load_rng_state(self, state) -> None:
        self.sampler.load_state_dict(state)

    def settings(self) -> dict:
        """The solver's parameters (``bcd_iters`` aside: a resumed run may run longer), the seeds
        and the exchange's arithmetic (``plain``, or the integer codec's ``n_max`` and ``g_bits``:
        ``quantized`` and ``paillier`` compute the same numbers, so either resumes the other)."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self.params).items() if k != "bcd_iters"}
        codec = getattr(self.exchange, "codec", None)
        out.update(arithmetic=None if codec is None else [float(codec.n_max), int(codec.g_bits)],
                   seeds=[int(s) for s in self.problem.seeds], **self._more)
        if self.params.init == "random":
            out["init_seeds"] = [int(s) for s in self.problem.init_seeds]
        return out

    def inputs(self) -> dict:
        p = self.problem
        return {"Z": digest(p.Z), "columns": digest(p.counts), "graph": digest(p.topology.src, p.topology.dst),
                "caps": digest(p.caps)}


def run_bcd(problem: Problem, params: SolverParams, exchange: Exchange, *, state: SolverState | None = None,
            sampler: PenaltySampler | None = None, callback=None, checkpoints=None,
            agents: AgentReduction | None = None, ranks=None, settings: dict | None = None):
    """The outer BCD loop (Algorithm 1, lines 3-24) on a batch of problems: the engine's driver
    over :class:`BCDRun`.

    Parameters
    ----------
    problem : Problem
    params : SolverParams
    exchange : Exchange
        Already bound to ``problem.topology``; its cost counters continue a resumed run's.
    state, sampler : optional
        The start (default: :func:`~.state.init_state`, :func:`~.state.make_sampler`).
    callback : callable, optional
        Called as ``callback(info: IterationInfo)`` after every BCD iteration; returning
        ``True`` stops the run after that iteration.
    checkpoints : ppdnmf_torch.driver.Checkpoints, optional
        Where checkpoints go and what to resume (Ctrl-C writes one, then
        :class:`~ppdnmf_torch.driver.RunInterrupted`).
    agents : AgentReduction, optional
        How the metrics reduce over the agents (default: every agent of ``problem``, in
        this process; a rank of a distributed run passes its own).
    ranks : ppdnmf_torch.driver.RankCoordinator, optional
        On a rank of a run over ranks.
    settings : dict, optional
        More settings a checkpoint compares by name.

    Returns
    -------
    state : SolverState
    history : dict of lists
        Per BCD iteration: Tensors ``(T,)`` for ``nmse``, ``consensus``, ``nmse_worst``
        (:func:`~.refit.worst_agent_nmse`), ``objective``,
        ``x_primal``, ``x_dual``, ``y_primal``, ``y_dual``; floats for ``time_x``,
        ``time_y``, ``time_metrics`` and the exchange's ``crypto_<counter>``; Tensors ``(T, N)``
        for ``x_iters``, ``y_iters``.
    info : dict
        ``converged`` (bool; always False with ``tol == 0``), ``n_iter``, ``sampler``, ``start``
        (the BCD iterations a resumed run's checkpoint had done).
    """
    run = BCDRun(problem, params, exchange, state=state, sampler=sampler, agents=agents, settings=settings)
    out = drive(run, max_iter=params.bcd_iters, tol=params.tol, callback=callback, checkpoints=checkpoints,
                ledgers=Ledgers(exchange=exchange), ranks=ranks)
    return run.st, out.history, {"converged": out.converged, "n_iter": run.st.bcd_done, "sampler": run.sampler,
                                 "start": out.start}
