"""FSSPCA without a server as the run driver sees it (:class:`ServerlessRun`, a
:class:`~ppdnmf_torch.driver.LoopModel`): one ADMM iteration is the workers' local steps, step 2
agreed over the graph through the exchange (``inner_iters`` consensus iterations: the engine's
consensus ADMM X-step, or Laplacian averaging with tracking), and the workers' dual steps
(:mod:`.serverless` describes the method). A checkpoint holds the iterates, the consensus
variables and draws, the generators' states and the counters."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...consensus.xstep import ConsensusVars, consensus_admm, draw_penalties, neighbour_sums
from ...driver import LoopModel
from . import admm

__all__ = ["ServerlessRun", "ServerlessOptions", "WorkerSums", "admm_local_step", "laplacian_step", "laplacian_eps"]


def admm_local_step(v, z, Q, Q_prev, rho_i, tau):
    """Step 3 of the X-step (eq. 9's form) on ``f_i(z) = 1/2 ||z - v_i||^2 + tau ||z||_1``.

    ``argmin_z f_i(z) + rho_i/2 ||z||^2 - <z, rho_i z_i + 2 Q_i - Q_i_prev>``, a soft threshold.

    Parameters
    ----------
    v, z, Q, Q_prev : Tensor (T, K, d, r)
    rho_i : Tensor (T, K, 1, 1)
        ``sum_j rho_ij`` as the exchange's step 1 gives it.
    tau : Tensor (T, 1, 1, 1)
        ``lambda_1 / (K rho)``.
    """
    den = 1.0 + 2 * rho_i
    return admm.soft_threshold((v + 2 * rho_i * z + 2 * Q - Q_prev) / den, tau / den)


def laplacian_step(x, S, eps):
    """One Laplacian averaging step ``x_i <- x_i + eps S_i`` (``S_i = sum_j rho_ij (x_j - x_i)``);
    keeps ``sum_i x_i`` and contracts the disagreement for ``eps max_ij rho_ij (d_max + 1) <= 1``."""
    return x + eps * S


def laplacian_eps(graph, g_cap: float) -> float:
    """The step of :func:`laplacian_step` at the contraction bound: ``1 / (g^2 (d_max + 1))``
    (every ``rho_ij <= g^2``)."""
    return 1.0 / (g_cap ** 2 * (int(graph.degree.max()) + 1))


class WorkerSums:
    """The sums and maxima over every worker that the run needs beyond the exchange (the penalty's
    ``rho="auto"`` and ``alpha_scale="gram"`` means, the stopping test, the history): in one
    process over the worker dimension of its tensors. A run over ranks reduces across the ranks
    instead (:class:`~.serverless_ranks.RankSums`)."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``(T, K) -> (T,)``: the sum over the workers."""
        return t.sum(1)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """``(T, K) -> (T,)``: the mean over the workers."""
        return t.mean(dim=1)

    def largest(self, t: torch.Tensor) -> torch.Tensor:
        """The largest entry of ``t (S, ...)`` over every worker (a 0-dim tensor)."""
        return t.amax()

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """``(T, K) -> (T,)``: the largest value over the workers."""
        return t.amax(1)

    def disagreement(self, z: torch.Tensor):
        """``max_i ||z_i - mean_j z_j||`` ``(T,)`` of ``z (T, K, d, r)`` (evaluation only)."""
        return torch.linalg.matrix_norm(z - z.mean(1, keepdim=True)).amax(1)


@dataclass(frozen=True)
class ServerlessOptions:
    """The method's settings as :class:`ServerlessRun` takes them (:func:`~.serverless.fit_serverless`
    resolves them).

    Attributes
    ----------
    lam1, lam2, rho : Tensor (T,)
    method : {"admm", "laplacian"}
    inner_iters : int
    g_cap : float
    smoothing : Smoothing
    mu : float
    line_search, local_solver : str
    inner_steps : int
    tol : float
    n_workers : int
        ``K``, every worker of the run (a rank's tensors hold its own).
    """

    lam1: torch.Tensor
    lam2: torch.Tensor
    rho: torch.Tensor
    method: str
    inner_iters: int
    g_cap: float
    smoothing: object
    mu: float
    line_search: str
    inner_steps: int
    local_solver: str
    tol: float
    n_workers: int


class ServerlessRun(LoopModel):
    """The driver's hooks of :func:`~.serverless.fit_serverless` (see the module).

    Parameters
    ----------
    problem : FSSPCAProblem
        ``(T, S, ...)``: the workers this process holds (every worker in one process).
    z0 : Tensor (T, d, r)
        The common start.
    exchange, sampler
        The bound exchange and the agreed penalties' sampler.
    graph : Graph
    options : ServerlessOptions
    start : dict
        The centring's ``calls`` and ``bytes``.
    settings : dict
    inputs : callable
    sums : WorkerSums, optional
        The reductions over every worker (default: over this process's workers).
    """

    name = "fsspca_serverless"
    step_name = "ADMM iteration"

    def __init__(self, problem, z0, exchange, sampler, graph, options: ServerlessOptions, *, start: dict,
                 settings: dict, inputs, sums: WorkerSums | None = None):
        o = options
        T, S, d, _ = problem.gram.shape
        self.problem, self.exch, self.sampler, self.graph = problem, exchange, sampler, graph
        self.lam1, self.lam2, self.rho, self.method, self.M = o.lam1, o.lam2, o.rho, o.method, o.inner_iters
        self.psi, self.mu, self.line_search, self.inner_steps, self.tol = (o.smoothing, o.mu, o.line_search,
                                                                           o.inner_steps, o.tol)
        self.local_solver, self.n_workers = o.local_solver, int(o.n_workers)
        self.sums = WorkerSums() if sums is None else sums
        self._settings, self._inputs = settings, inputs
        scale = 2.0 * torch.linalg.matrix_norm(problem.gram) + o.rho[:, None] + o.lam2[:, None] / o.mu
        zk = z0[:, None].expand(T, S, d, z0.shape[-1]).clone()
        self.st = admm.ADMMState(w=zk.clone(), u=torch.zeros_like(zk), z=zk, theta=1.0 / scale)
        self.Q, self.Q_prev = torch.zeros_like(zk), torch.zeros_like(zk)  # admm: the X-step's duals
        self.x, self.v_prev = torch.zeros_like(zk), torch.zeros_like(zk)  # laplacian: the tracked averages
        self.g = sampler.initial()
        self.eps = laplacian_eps(graph, o.g_cap)
        self.tau = (o.lam1 / (self.n_workers * o.rho))[:, None, None, None]
        self.active = torch.ones(T, dtype=torch.bool, device=z0.device)
        self.n_iter = torch.zeros(T, dtype=torch.long, device=z0.device)
        self.conv = torch.zeros(T, dtype=torch.bool, device=z0.device)
        self.calls, self.plain_bytes = start["calls"], start["bytes"]
        self._values = None

    def _agree(self, v, k: int) -> torch.Tensor:
        """Step 2 over the graph: the workers' ``z_i`` after ``inner_iters`` consensus iterations."""
        T, K = v.shape[:2]
        if self.method == "admm":
            tau = self.tau
            cv = consensus_admm(ConsensusVars(U=self.st.z, Q=self.Q, Q_prev=self.Q_prev, g=self.g),
                                lambda U, X, P, Q, Q_prev, rho: admm_local_step(v, U, Q, Q_prev, rho, tau),
                                self.sampler, self.exch, n_iters=self.M, bcd_iter=k)
            self.Q, self.Q_prev, self.g = cv.Q, cv.Q_prev, cv.g
            return cv.U
        self.sampler.begin_bcd_iteration()
        self.x, self.v_prev = self.x + (v - self.v_prev), v
        for m in range(self.M):  # rounds of communication, sequential by nature
            self.g, _ = draw_penalties(self.sampler, self.exch, self.g, m, bcd_iter=k, shape=(T, K), dtype=v.dtype)
            S = neighbour_sums(self.exch, self.x, self.g, bcd_iter=k, admm_iter=m + 1)
            self.x = laplacian_step(self.x, S, self.eps)
        return admm.soft_threshold(self.x, self.tau)

    def step(self, k: int, clock) -> dict:
        p, st, active, rho, sums = self.problem, self.st, self.active, self.rho, self.sums
        K, (d, r) = self.n_workers, st.z.shape[2:]
        w = admm.local_step(p, st, self.lam2, rho, self.psi, self.mu, line_search=self.line_search,
                            inner_steps=self.inner_steps, active=active, solver=self.local_solver)  # step 1, eq. (14)
        v = w + st.u / rho[:, None, None, None]
        z = self._agree(v, k)
        self.calls += self.M
        self.plain_bytes += self.M * 2 * self.graph.n_edges * d * r * st.z.element_size()
        a4 = active[:, None, None, None]
        z_new = torch.where(a4, z, st.z)
        u_new = torch.where(a4, admm.dual_step(st.u, w, z_new, rho), st.u)  # step 3, per worker
        # the server's stopping rule with each worker's own z_i (equal to it when the z_i agree)
        gap = torch.linalg.matrix_norm(w - z_new)
        primal = sums.sum(gap.square()).sqrt()
        dual = rho * sums.sum(torch.linalg.matrix_norm(z_new - st.z).square()).sqrt()
        st.w, st.z, st.u = w, z_new, u_new
        spread = sums.disagreement(z_new)
        row = {} if spread is None else {"disagreement": spread}
        row["consensus"] = sums.max(gap)
        self.n_iter = torch.where(active, self.n_iter + 1, self.n_iter)
        done = (primal / math.sqrt(K * r) <= self.tol) & (dual / (rho * math.sqrt(K * r)) <= self.tol) & active
        self.conv = self.conv | done
        self.active = active & ~done
        self._values = dict(v=v, z=z_new, w=w, **row)
        return row

    def converged(self, k: int, row: dict) -> bool:
        return not bool(self.active.any())

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(k, self._values))

    def not_converged(self, k: int, tol: float) -> str:
        return (f"FSSPCA (serverless): trials {torch.nonzero(~self.conv).flatten().tolist()} did not reach "
                f"tol={tol} in {k} iterations")

    # -- what a checkpoint holds ----------------------------------------------------------
    def state(self) -> dict:
        st = self.st
        return {"w": st.w, "u": st.u, "z": st.z, "theta": st.theta, "Q": self.Q, "Q_prev": self.Q_prev, "x": self.x,
                "v_prev": self.v_prev, "g": self.g, "active": self.active, "converged": self.conv,
                "n_iter": self.n_iter}

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev, st = self.st.z.device, self.st
        st.w, st.u, st.z, st.theta = (tensors[k].to(dev) for k in ("w", "u", "z", "theta"))
        self.Q, self.Q_prev, self.x, self.v_prev, self.g = (tensors[k].to(dev)
                                                             for k in ("Q", "Q_prev", "x", "v_prev", "g"))
        self.active, self.conv, self.n_iter = (tensors[k].to(dev) for k in ("active", "converged", "n_iter"))
        st.line_search_evals, st.line_search_failures = int(extra["evals"]), int(extra["failures"])
        self.calls, self.plain_bytes = int(extra["calls"]), float(extra["plain_bytes"])

    def resumed(self, done: int, history) -> None:
        self.st.iteration = done

    def rng_state(self):
        return self.sampler.state_dict()

    def load_rng_state(self, state) -> None:
        self.sampler.load_state_dict(state)

    def extra(self) -> dict:
        st = self.st
        return {"evals": int(st.line_search_evals), "failures": int(st.line_search_failures), "calls": int(self.calls),
                "plain_bytes": float(self.plain_bytes)}

    def settings(self) -> dict:
        return self._settings

    def inputs(self) -> dict:
        return self._inputs()
