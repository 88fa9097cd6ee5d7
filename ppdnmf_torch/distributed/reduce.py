"""Metrics across ranks: :class:`RankReduction`, the BCD loop's reduction over agents when each
rank holds some of them; and :func:`gather_agents`, a rank's agents' tensors on rank 0.

Every metric of one process reduces over the agent dimension (a mean, a sum, a maximum).
To give the same bits, the ranks first bring the per-agent values together in the
single-process order (a few numbers per agent, every BCD iteration), then every rank runs
the single-process reduction on them. The consensus error needs the agents' mean
``Xbar``, whose sum over agents torch orders its own way: rank 0 gathers ``X``
(``N L K`` values per BCD iteration), computes ``Xbar`` exactly as one process does and
shares it; each rank then measures its agents' ``||X_i - Xbar||`` itself.
"""
from __future__ import annotations

import torch

from .. import metrics
from ..errors import DataError
from ..solver import AgentReduction
from ..solver.bcd import nonfinite_agents, raise_nonfinite
from ..solver.refit import farthest_agent, refit_errors
from .comm import Comm
from .layout import RankLayout

__all__ = ["RankReduction", "gather_agents"]

TAG_GATHER = 21


def gather_agents(comm: Comm, layout: RankLayout, t: torch.Tensor, counts: list, agents_of, *, what: str,
                  category: str = "output"):
    """Rank 0: ``(T, N, ...)`` with every rank's agents' rows of ``t (T, n_slots, ...)`` in their
    global places; other ranks: None (they send theirs). ``counts[r]`` and ``agents_of(r)``:
    each rank's agent count and agents."""
    own = t[:, layout.slots.to(t.device)]
    if comm.rank != 0:
        comm.send(own, 0, category=category, what=what, tag=TAG_GATHER)
        return None
    T, N = t.shape[0], layout.n_agents
    out = torch.empty((T, N) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
    out[:, layout.agents.to(t.device)] = own
    for r in range(1, comm.world_size):
        got = comm.recv((T, counts[r]) + tuple(t.shape[2:]), t.dtype, r, what=what, tag=TAG_GATHER)
        out[:, torch.as_tensor(agents_of(r), device=t.device)] = got
    return out


class RankReduction(AgentReduction):
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
        self.layout, self.comm, self.partition = layout, comm, partition
        self.mu, self.eta = mu, eta
        self.y_scale = eta if y_solver == "admm" else None
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
            agents = sorted({a for _, a in torch.nonzero(z == 0).tolist()})
            raise DataError(
                f"Z: the blocks of agents {agents} have Frobenius norm 0 in {problem.Z.dtype} (all zeros, or "
                "entries too small to square); the NMSE (sum_i ||Z_i - X_i Y_i|| / ||Z_i||) is undefined for them: "
                "give every agent some nonzero data, or rescale it")
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
        x_sq_own = xi["residuals_sq"]
        if state.mu is not None:  # each agent's dual residual weighed by its mu_i^2, as x_step does
            x_sq_own = torch.stack([x_sq_own[0], state.mu.to(x_sq_own.dtype).square() * x_sq_own[1]])
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
            "x_primal": x_sq[0],
            "x_dual": self.mu * x_sq[1] if state.mu is None else x_sq[1],
            "y_primal": y_sq[0],
            "y_dual": y_sq[1] if self.y_scale is None else self.y_scale * y_sq[1],
        }
        return values, g[6].to(xi["iters"].dtype), g[7].to(yi["iters"].dtype)
