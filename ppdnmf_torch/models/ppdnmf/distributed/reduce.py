"""Metrics across ranks: :class:`RankReduction`, the BCD loop's reduction over agents when each
rank holds some of them (the agents' tensors gathered on rank 0 by the engine's
:func:`~ppdnmf_torch.distributed.layout.gather_agents`).

Every metric of one process reduces over the agent dimension (a mean, a sum, a maximum).
To give the same bits, the ranks first bring the per-agent values together in the
single-process order (a few numbers per agent, every BCD iteration), then every rank runs
the single-process reduction on them. The consensus error needs the agents' mean
``Xbar``, whose sum over agents torch orders its own way: rank 0 gathers ``X``
(``N L K`` values per BCD iteration), computes ``Xbar`` exactly as one process does and
shares it; each rank then measures its agents' ``||X_i - Xbar||`` itself.

:class:`RankSums` is the deployment's reduction (``fit_rank(..., share="sums")``): no
per-agent value leaves its rank. Each rank sums (or takes the maximum of) its own agents'
scalars and the ranks add those partial results: under ``exchange="secagg"`` in a masked
all-reduce (:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`: only the totals are
revealed), else the plain ``Comm.all_reduce``; the metrics that need other agents' ``X_i`` (the
consensus error, ``nmse_worst``) are not measured.
"""
from __future__ import annotations

import torch

from .... import metrics
from ....errors import DataError
from ..solver import AgentReduction
from ..solver.bcd import NumericalError, nonfinite_agents, raise_nonfinite, zero_norm_error
from ..solver.refit import farthest_agent, refit_errors
from ....distributed.comm import Comm
from ....distributed.layout import RankLayout, gather_agents
from ....distributed.masked_sum import PlainSums

__all__ = ["RankReduction", "RankSums", "SUMS_KEYS"]

#: the history keys of a ``share="sums"`` run (per BCD iteration, one value per trial)
SUMS_KEYS = ("nmse", "objective", "x_primal", "x_dual", "y_primal", "y_dual", "x_iters_mean", "x_iters_max",
             "y_iters_mean", "y_iters_max")

class _RankMetrics(AgentReduction):
    """What both reductions across ranks share: the scales of the ADMM residuals."""

    def __init__(self, *, mu: float, eta: float, y_solver: str):
        self.mu, self.eta = mu, eta
        self.y_scale = eta if y_solver == "admm" else None

    @staticmethod
    def _x_sq(xi: dict, state) -> torch.Tensor:
        """The X-step's squared residuals per agent ``(2, T, n_slots)``; with the adaptive
        schedule each agent's dual one weighed by its ``mu_i^2``, as ``x_step`` does."""
        x_sq = xi["residuals_sq"]
        if state.mu is not None:
            x_sq = torch.stack([x_sq[0], state.mu.to(x_sq.dtype).square() * x_sq[1]])
        return x_sq

    def _residuals(self, x_r, y_r, state) -> dict:
        """The ADMM residual norms ``x_r, y_r`` (primal, dual) as one process reports them: the
        dual ones scaled by ``mu`` (unless already weighed per agent) and ``eta`` (ADMM Y-step)."""
        return {"x_primal": x_r[0], "x_dual": self.mu * x_r[1] if state.mu is None else x_r[1],
                "y_primal": y_r[0], "y_dual": y_r[1] if self.y_scale is None else self.y_scale * y_r[1]}


class RankReduction(_RankMetrics):
    """The metrics of a rank's agents, reduced across ranks in the single-process order.

    Parameters
    ----------
    layout : RankLayout
    comm : Comm
    partition : Partition
    mu, eta : float
        The ADMM penalties that scale the dual residuals (``SolverParams``); with the
        adaptive schedule each agent's ``mu_i`` (``state.mu``) weighs its own.
    y_solver : {"admm", "hals"}
        The Y-step's solver: HALS reports its last sweep's change unscaled (no ``eta``).
    """

    def __init__(self, layout: RankLayout, comm: Comm, partition, *, mu: float, eta: float, y_solver: str = "admm"):
        super().__init__(mu=mu, eta=eta, y_solver=y_solver)
        self.layout, self.comm, self.partition = layout, comm, partition
        self.counts = partition.counts()
        self._agents = {r: partition.agents(r) for r in range(partition.world_size)}
        self._width = max(self.counts)

    def _all_agents(self, fields: torch.Tensor, what: str) -> torch.Tensor:
        """``fields (F, T, n_slots)`` -> ``(F, T, N)``: every rank's agents' values, in global order
        (float64 carries every field exactly: the run's floats and small integer counts)."""
        own = fields[..., self.layout.slots.to(fields.device)].to(torch.float64)
        pad = torch.zeros(own.shape[:-1] + (self._width,), dtype=torch.float64, device=own.device)
        pad[..., : own.shape[-1]] = own
        parts = self.comm.all_gather(pad, category="metrics", what=what)
        out = torch.empty(own.shape[:-1] + (self.layout.n_agents,), dtype=torch.float64, device=own.device)
        for r, part in enumerate(parts):
            out[..., torch.as_tensor(self._agents[r], device=own.device)] = part[..., : self.counts[r]]
        return out

    def block_norms(self, problem):
        z = torch.linalg.matrix_norm(problem.Z)  # per agent; dummies 0
        z = self._all_agents(z[None], "the data norms")[0].to(problem.Z.dtype)
        if not bool((z > 0).all()):
            raise zero_norm_error(torch.nonzero(z == 0).tolist(), problem.Z.dtype, False)
        return z

    def _mean(self, X, bcd_iter: int):
        """``Xbar (T, 1, L, K)`` and ``X_w (T, L, K)``: rank 0's mean of every agent's ``X_i`` and
        the farthest agent's ``X_i`` (the worst-agent metric's factor), shared."""
        what = f"the consensus metric of BCD iteration {bcd_iter}"
        Xg = gather_agents(self.comm, self.layout, X, self.counts, self._agents.__getitem__, what=what,
                           category="metrics")
        T = X.shape[0]
        if Xg is not None:
            both = torch.cat([Xg.mean(dim=-3, keepdim=True),
                              Xg[torch.arange(T, device=Xg.device), farthest_agent(Xg)][:, None]], dim=1)
        else:
            both = torch.empty((T, 2) + tuple(X.shape[2:]), dtype=X.dtype, device=X.device)
        both = self.comm.broadcast(both, 0, category="metrics", what=what)
        return both[:, :1], both[:, 1]

    def metrics(self, problem, state, xi, yi, ws, z_norms, bcd_iter):
        dtype = state.X.dtype
        res = metrics.residual_norms(problem.Z, state.X, state.Y, scratch=ws.take("metrics_XY", problem.Z))
        xbar, xw = self._mean(state.X, bcd_iter)
        num = torch.linalg.matrix_norm(torch.sub(state.X, xbar, out=ws.take("rhs", state.X)))
        z_own = torch.linalg.matrix_norm(problem.Z)  # the halo slots' 0 are dropped below
        worst = refit_errors(problem.Z, xw, state.Y, torch.where(z_own > 0, z_own, 1.0), problem.width)
        bad = nonfinite_agents(state.U) | nonfinite_agents(state.Y)
        x_sq_own = self._x_sq(xi, state)
        fields = torch.stack([res.to(torch.float64), num.to(torch.float64), *x_sq_own.to(torch.float64),
                              *yi["residuals_sq"].to(torch.float64), xi["iters"].to(torch.float64),
                              yi["iters"].to(torch.float64), bad.to(torch.float64),
                              xi["first_bad"].to(torch.float64), worst.to(torch.float64)])
        g = self._all_agents(fields, f"the metrics of BCD iteration {bcd_iter}")
        res_g, num_g = g[0].to(dtype), g[1].to(dtype)
        nm, per_agent, obj = metrics.from_residuals(res_g, z_norms)
        raise_nonfinite(~torch.isfinite(per_agent) | (g[8] > 0), g[9].to(torch.int64), bcd_iter, False)
        den = torch.linalg.matrix_norm(xbar).clamp_min(torch.finfo(dtype).tiny)
        x_sq = g[2:4].to(xi["residuals_sq"].dtype).sum(-1).sqrt()
        y_sq = g[4:6].to(yi["residuals_sq"].dtype).sum(-1).sqrt()
        values = {
            "nmse": nm,
            "consensus": (num_g / den).amax(dim=-1),
            "nmse_worst": g[10].to(dtype).mean(dim=-1),
            "objective": obj,
            **self._residuals(x_sq, y_sq, state),
        }
        return values, g[6].to(xi["iters"].dtype), g[7].to(yi["iters"].dtype)


class RankSums(_RankMetrics):
    """The metrics of a rank's agents from per-rank partial results: nothing per agent leaves
    the rank (``fit_rank(..., share="sums")``).

    Each BCD iteration a rank sends two small vectors to the all-reduces, per trial: the sums
    over its agents of ``||Z_i - X_i Y_i|| / ||Z_i||``, ``||Z_i - X_i Y_i||^2``, the squared
    ADMM residuals of both steps (the dual ones weighed as :class:`RankReduction` does), the
    ADMM iteration counts and the count of agents with a NaN or Inf (summed over the ranks;
    masked under ``exchange="secagg"``, one public scale per quantity: ``sums``), and the
    largest ADMM iteration counts (their maximum, in the clear: a max over sites). Before
    the first iteration the count of the rank's data blocks of norm 0 is summed in the clear
    (an integer: a count of flagged agents). The history then holds
    :data:`SUMS_KEYS`: the NMSE and objective (eq. 1) and the ADMM residual norms as one
    process computes them but summed in another order (equal to the last bits: about
    ``1e-16`` relative; masked: about ``2^-60`` of each quantity's largest per-rank value),
    and per step the mean and the largest per-agent ADMM iteration count (exact) in place of
    the per-agent ``x_iters``/``y_iters``. The consensus error and ``nmse_worst`` need other
    agents' ``X_i`` and are left out of the history.

    Parameters
    ----------
    layout : RankLayout
    comm : Comm
    mu, eta, y_solver
        As :class:`RankReduction`.
    sums : MaskedSums or PlainSums, optional
        The SUM all-reduce (:func:`~ppdnmf_torch.distributed.masked_sum.rank_sums` of the run's
        exchange kind); default the plain one.
    """

    def __init__(self, layout: RankLayout, comm: Comm, *, mu: float, eta: float, y_solver: str = "admm",
                 sums=None):
        super().__init__(mu=mu, eta=eta, y_solver=y_solver)
        self.layout, self.comm = layout, comm
        self.sums = sums if sums is not None else PlainSums(comm)

    def _own(self, t: torch.Tensor) -> torch.Tensor:
        """``t (..., n_slots)`` -> ``(..., n_own)``: the rank's agents (the dummy slots dropped)."""
        return t[..., self.layout.slots.to(t.device)]

    def _raise_bad(self, own_bad, first_bad, n_bad: int, bcd_iter: int, what: str, error, dtype=None) -> None:
        """Every rank raises when any rank's agents are hit; the ranks that hold them name them
        (``dtype``: the data's, for a :class:`DataError`)."""
        if n_bad == 0:
            return
        T = own_bad.shape[0]
        if bool(own_bad.any()):
            if error is DataError:
                where = [(t, int(self.layout.agents[a])) for t, a in torch.nonzero(own_bad).tolist()]
                raise zero_norm_error(where, dtype, False)
            n = self.layout.n_agents
            bad = torch.zeros((T, n), dtype=torch.bool, device=own_bad.device)
            fb = torch.zeros((T, n), dtype=first_bad.dtype, device=own_bad.device)
            idx = self.layout.agents.to(own_bad.device)
            bad[:, idx], fb[:, idx] = own_bad, first_bad
            raise_nonfinite(bad, fb, bcd_iter, False)
        raise error(f"{what}: {n_bad} agent(s) of other ranks (share='sums': the ranks that hold them name them)")

    def block_norms(self, problem):
        z = torch.linalg.matrix_norm(problem.Z)  # (T, n_slots); the dummy slots' 0 are never used
        zero = self._own(z) == 0
        n_bad = self.comm.all_reduce(zero.sum().reshape(1).to(torch.int64), category="metrics",
                                     what="the check of the data norms")
        self._raise_bad(zero, None, int(n_bad[0]), 0, "Z: blocks of Frobenius norm 0", DataError,
                        dtype=problem.Z.dtype)
        return torch.where(z > 0, z, torch.ones((), dtype=z.dtype, device=z.device))

    def metrics(self, problem, state, xi, yi, ws, z_norms, bcd_iter):
        import torch.distributed as dist

        dtype = state.X.dtype
        res = self._own(metrics.residual_norms(problem.Z, state.X, state.Y,
                                               scratch=ws.take("metrics_XY", problem.Z)))
        rel = res / self._own(z_norms)
        bad = ~torch.isfinite(rel) | self._own(nonfinite_agents(state.U) | nonfinite_agents(state.Y))
        x_sq = self._x_sq(xi, state)
        x_it, y_it = self._own(xi["iters"]).to(torch.float64), self._own(yi["iters"]).to(torch.float64)
        f64 = torch.float64
        sums = torch.stack([rel.to(f64).sum(-1), res.to(f64).square().sum(-1),
                            *self._own(x_sq).to(f64).sum(-1), *self._own(yi["residuals_sq"]).to(f64).sum(-1),
                            x_it.sum(-1), y_it.sum(-1), bad.to(f64).sum(-1)])  # (9, T)
        what = f"the metrics of BCD iteration {bcd_iter}"
        sums = self.sums.all_reduce(sums, category="metrics", what=what, split=[sums.shape[1]] * sums.shape[0])
        peaks = torch.stack([x_it.amax(-1), y_it.amax(-1)]) if x_it.shape[-1] else torch.zeros(
            (2, x_it.shape[0]), dtype=f64, device=x_it.device)
        peaks = self.comm.all_reduce(peaks, category="metrics", what=what, op=dist.ReduceOp.MAX)
        self._raise_bad(bad, self._own(xi["first_bad"]), int(sums[8].sum()), bcd_iter,
                        f"NaN or Inf in the iterates at BCD iteration {bcd_iter}", NumericalError)
        n = self.layout.n_agents
        x_r, y_r = sums[2:4].sqrt(), sums[4:6].sqrt()
        values = {
            "nmse": (sums[0] / n).to(dtype),
            "objective": (0.5 * sums[1]).to(dtype),
            **{k: v.to(dtype) for k, v in self._residuals(x_r, y_r, state).items()},
            "x_iters_mean": sums[6] / n,
            "x_iters_max": peaks[0],
            "y_iters_mean": sums[7] / n,
            "y_iters_max": peaks[1],
        }
        return values, None, None
