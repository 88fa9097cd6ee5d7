"""FSSPCA with a server as the run driver sees it (:class:`ServerRun`, a
:class:`~ppdnmf_torch.driver.LoopModel`): one ADMM iteration of Algorithm 1 (the workers' local
steps, the server's aggregated z-step, the workers' dual steps) and its metrics, trials batched; a
trial that meets ``tol`` is frozen (its history repeats its last values) while the others go on.
A checkpoint holds the iterates, each worker's step size, the trials' flags and counts, and the
line search's counters."""
from __future__ import annotations

import math

import torch

from ...driver import LoopModel
from . import admm
from .centring import aggregate
from .result import HISTORY_KEYS, IterationInfo

__all__ = ["ServerRun"]


class ServerRun(LoopModel):
    """The driver's hooks of :func:`~.fit.fit_fsspca` (see the module).

    Parameters
    ----------
    problem : FSSPCAProblem
    state : ADMMState
        The start.
    aggregation : "plain" or an aggregator
        How the server sums the workers' uploads.
    lam1, lam2, rho, rho_bar : Tensor
        ``lambda_1 (T,)``, ``lambda_2 (T,)``, ``rho`` ``(T,)`` or ``(T, K)``, and the mean ``rho``.
    smoothing, mu, line_search, inner_steps, local_solver
        The local step's (:func:`.admm.local_step`).
    tol : float
    settings : dict
        What a checkpoint compares by name on resume.
    inputs : callable
        ``inputs() -> {name: digest}`` (called only with checkpoints).
    """

    name = "fsspca"
    step_name = "ADMM iteration"

    def __init__(self, problem, state, aggregation, *, lam1, lam2, rho, rho_bar, smoothing, mu, line_search,
                 inner_steps, local_solver, tol, settings: dict, inputs):
        self.problem, self.st, self.aggregation = problem, state, aggregation
        self.lam1, self.lam2, self.rho, self.rho_bar = lam1, lam2, rho, rho_bar
        self.psi, self.mu, self.line_search, self.inner_steps, self.tol = smoothing, mu, line_search, inner_steps, tol
        self.local_solver = local_solver
        self._settings, self._inputs = settings, inputs
        T, dev = state.z.shape[0], state.z.device
        self.active = torch.ones(T, dtype=torch.bool, device=dev)
        self.conv = torch.zeros(T, dtype=torch.bool, device=dev)
        self.n_iter = torch.zeros(T, dtype=torch.long, device=dev)
        self.pooled = problem.pooled_gram()
        self._last = None  # the last row of the history (a stopped trial repeats it)
        self._values = None
        self._full = True  # every trial running (the host's copy of active.all())
        self._smooth = bool((lam2 != 0).any())  # the polar step's smooth term, known once per fit

    def step(self, k: int, clock) -> dict:
        p, st, active = self.problem, self.st, self.active
        K, r = p.n_workers, st.z.shape[-1]
        st.iteration = k
        # every trial still running (known on the host from the last stopping test): no masking,
        # the same numbers as torch.where with an all-true mask, a dozen calls fewer
        full = self._full
        # the polar steps hand back C_i w_i, computed while C_i is in the cache (the objective's bits)
        w, Cw = admm.local_step(p, st, self.lam2, self.rho, self.psi, self.mu, line_search=self.line_search,
                                inner_steps=self.inner_steps, solver=self.local_solver, smooth=self._smooth,
                                active=None if full and self.local_solver == "polar" else active, product=True)
        total = aggregate(self.aggregation, admm.upload(w, st.u, self.rho, self.rho_bar), 2)
        z_new = admm.z_step(total, K, self.lam1, self.rho_bar)
        u_new = admm.dual_step(st.u, w, z_new, self.rho)
        if not full:
            z_new = torch.where(active[:, None, None], z_new, st.z)
            u_new = torch.where(active[:, None, None, None], u_new, st.u)
        values, change = admm.iteration_values(p, self.pooled, w, z_new, st.z, u_new, self.lam1, self.lam2, self.rho,
                                               self.psi, self.mu, Cw)
        primal = values["primal_residual"]
        if full:
            row = dict(values)
            self.n_iter = self.n_iter + 1
        else:
            last = self._last if self._last is not None else values
            row = {key: torch.where(active, values[key], last[key]) for key in HISTORY_KEYS}
            self.n_iter = torch.where(active, self.n_iter + 1, self.n_iter)
        st.w, st.z, st.u = w, z_new, u_new
        done = (primal / math.sqrt(K * r) <= self.tol) & (change <= self.tol) & active
        self.conv = self.conv | done
        self.active = active & ~done
        self._last, self._values = row, values
        return row

    def converged(self, k: int, row: dict) -> bool:
        running = int(self.active.sum())
        self._full = running == self.active.shape[0]
        return running == 0

    @property
    def converged_trials(self) -> torch.Tensor:
        """Which trials met ``tol``, ``(T,)`` bool."""
        return self.conv

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(IterationInfo(k, self._values, self.active.clone())))

    def not_converged(self, k: int, tol: float) -> str:
        bad = torch.nonzero(~self.conv).flatten().tolist()
        return f"FSSPCA: trials {bad} did not reach tol={tol} in {k} iterations"

    # -- what a checkpoint holds ----------------------------------------------------------
    def state(self) -> dict:
        st = self.st
        return {"w": st.w, "u": st.u, "z": st.z, "theta": st.theta, "active": self.active, "converged": self.conv,
                "n_iter": self.n_iter}

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev, st = self.st.z.device, self.st
        st.w, st.u, st.z, st.theta = (tensors[k].to(dev) for k in ("w", "u", "z", "theta"))
        self.active, self.conv, self.n_iter = (tensors[k].to(dev) for k in ("active", "converged", "n_iter"))
        self._full = bool(self.active.all())
        st.line_search_evals, st.line_search_failures = int(extra["evals"]), int(extra["failures"])

    def resumed(self, done: int, history) -> None:
        """The last row of a resumed run (a stopped trial repeats it)."""
        self.st.iteration = done
        if history.get(HISTORY_KEYS[0]):
            self._last = {key: history[key][-1] for key in HISTORY_KEYS}

    def extra(self) -> dict:
        return {"evals": int(self.st.line_search_evals), "failures": int(self.st.line_search_failures)}

    def settings(self) -> dict:
        return self._settings

    def inputs(self) -> dict:
        return self._inputs()
