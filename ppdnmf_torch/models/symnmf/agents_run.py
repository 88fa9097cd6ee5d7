"""Symmetric NMF across agents as the run driver sees it (:class:`AgentsRun`, a
:class:`~ppdnmf_torch.driver.LoopModel`): one outer iteration is the X-step, the Y-step, the
adaptive penalty and the metrics; a checkpoint holds the agents' variables, the penalties'
draws and generators, ``lambda`` and the plain byte count.

**Stopping** (``tol > 0``): after outer iteration ``k`` when, in every trial, the scaled
projected-gradient residual of (2) that the agents compute from what they hold is ``<= tol``
(:func:`~.agent_steps.stationarity_terms`: agent ``i``'s rows ``S_i`` of the gradient at its own
copy ``U_i``; the network-wide sums through :meth:`AgentsRun.stationarity_sums`; the history's
``stationarity``) and the copies agree, the history's ``consensus``
``max_i ||U_i - Ubar||_F / ||Ubar||_F <= tol`` (the residual alone looks at each agent's rows
at its own copy: copies that disagree can each be stationary on their own rows).

The run over ranks (:mod:`.distributed`) is the same model on a rank's agents: it overrides the
penalty's sums, the residual's sums, the metrics and which slots a checkpoint holds
(:class:`AgentsRun`'s hooks :meth:`~AgentsRun.update_lambda`, :meth:`~AgentsRun.stationarity_sums`,
:meth:`~AgentsRun.metrics`, :meth:`~AgentsRun.slots`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...driver import LoopModel
from ...metrics import consensus_error
from .agent_steps import (STATE_NAMES, AgentsState, lambda_from_sums, lambda_terms, own_rows, scatter_rows,
                          stationarity_from_sums, stationarity_terms, x_step, y_step)
from .objective import fitting_error, gap_sq, split_objective

__all__ = ["AgentsRun", "AgentsSetup", "HISTORY_KEYS"]

#: the history's keys, in the result's order
HISTORY_KEYS = ("E", "objective", "uv_dist", "consensus", "stationarity", "lambda", "time", "bytes")


@dataclass
class AgentsSetup:
    """What stays fixed during a run across agents.

    Attributes
    ----------
    Z : Tensor (T, N, n, m) or SparseColumns
        The agents' columns (:func:`~.agent_columns.agent_columns`).
    idx : LongTensor (T, N, m)
        ``S_i``, padded with ``n``; ``mask (T, N, n, 1)``: 1 on the rows ``S_i``.
    n : int
        Nodes.
    x_norm2 : Tensor (T,)
        ``||X||_F^2``.
    sim : Similarity or None
        The whole ``X`` for the single process's metrics (a rank keeps its columns only).
    mu : "auto" or float
    x_iters, y_iters : int
    adaptive : bool
        ``lambda`` by eq. (20) (else fixed).
    tol : float
        The stopping rule's (see the module; 0: never).
    sampler, exchange, aggregator
        The penalties, the exchange (bound), the lambda sums' aggregation (None: fixed ``lambda``).
    plain_bytes : int
        What ``plain`` sends per outer iteration over all directed edges (``n r`` floats per
        edge and ADMM iteration).
    """

    Z: object
    idx: torch.Tensor
    mask: torch.Tensor
    n: int
    x_norm2: torch.Tensor
    sim: object
    mu: object
    x_iters: int
    y_iters: int
    adaptive: bool
    tol: float
    sampler: object
    exchange: object
    aggregator: object
    plain_bytes: int


class AgentsRun(LoopModel):
    """The driver's hooks of symmetric NMF across agents (see the module).

    Parameters
    ----------
    setup : AgentsSetup
    state : AgentsState
        The start.
    settings : dict
        What a checkpoint compares by name on resume.
    inputs : callable
        ``inputs() -> {name: digest}`` (called only when a checkpoint is written or read: the
        digests cost a pass over the data).
    """

    name = "symnmf_agents"
    step_name = "outer iteration"

    def __init__(self, setup: AgentsSetup, state: AgentsState, *, settings: dict, inputs):
        self.s, self.st = setup, state
        self._settings, self._inputs = settings, inputs
        self.plain_bytes = 0

    # -- the iteration --------------------------------------------------------------------
    def update_lambda(self, k: int) -> torch.Tensor:
        """Eq. (20) from the three sums, through the aggregation."""
        st = self.st
        return lambda_from_sums(st.lam, self.s.aggregator.total(lambda_terms(own_rows(st, self.s.idx), st.V), dim=1))

    def stationarity_sums(self, terms: torch.Tensor, k: int) -> torch.Tensor:
        """The sums over agents ``(T, 2)`` of :func:`~.agent_steps.stationarity_terms`' ``(T, N, 2)``."""
        return terms.sum(dim=1)

    def metrics(self, k: int) -> tuple:
        """The history's ``E``, ``objective``, ``uv_dist``, ``consensus``, ``lambda`` of outer
        iteration ``k`` and the mean copy ``Ubar (T, n, r)`` (evaluation only: no agent computes it)."""
        s, st = self.s, self.st
        Ubar = st.Xc.mean(1)
        Vall = scatter_rows(st.V, s.idx, s.n).sum(1)
        uv2 = gap_sq(Ubar, Vall)
        return {"E": fitting_error(s.x_norm2, Ubar, s.sim.matmul(Ubar)),
                "objective": split_objective(s.x_norm2, Ubar, Vall, s.sim.matmul(Vall), st.lam),
                "uv_dist": uv2.sqrt(), "consensus": consensus_error(st.Xc), "lambda": st.lam}, Ubar

    def step(self, k: int, clock) -> dict:
        s, st = self.s, self.st
        x_step(s.Z, st, s.idx, s.mask, s.sampler, s.exchange, mu=s.mu, x_iters=s.x_iters, bcd_iter=k)
        XtU, UtU = y_step(s.Z, st, s.idx, y_iters=s.y_iters)
        if s.adaptive:
            st.lam = self.update_lambda(k)
        row, _ = self.metrics(k)
        terms = stationarity_terms(own_rows(st, s.idx), UtU, XtU)
        row["stationarity"] = stationarity_from_sums(s.x_norm2, self.stationarity_sums(terms, k))
        self.plain_bytes += s.plain_bytes
        counted = sum(s.exchange.bytes_per_edge().values())
        row.update(time=clock(), bytes=float(counted if counted else self.plain_bytes))
        return {key: v.detach().to("cpu").clone() if isinstance(v, torch.Tensor) else v for key, v in row.items()}

    def converged(self, k: int, row: dict) -> bool:
        """Every trial's ``stationarity`` and ``consensus`` ``<= tol`` (see the module; ``tol = 0``: never)."""
        tol = self.s.tol
        return tol > 0 and bool(((row["stationarity"] <= tol) & (row["consensus"] <= tol)).all())

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(k, {key: v.numpy() if isinstance(v, torch.Tensor) else v for key, v in row.items()}))

    def not_converged(self, k: int, tol: float) -> str:
        return (f"fit_symnmf_agents: the stationarity residual and the consensus error did not both reach tol={tol} "
                f"in {k} outer iterations")

    # -- what a checkpoint holds ----------------------------------------------------------
    def slots(self, t: torch.Tensor) -> torch.Tensor:
        """The agents' rows of a ``(T, N, ...)`` tensor that this process checkpoints: all."""
        return t

    def state(self) -> dict:
        st = self.st
        out = {key: self.slots(getattr(st, key)) for key in STATE_NAMES}
        out.update(g=st.g, lam=st.lam)
        if st.mu is not None:
            out["mu"] = self.slots(st.mu)
        return out

    def state_spec(self) -> dict:
        spec = {k: (tuple(v.shape), v.dtype, False) for k, v in self.state().items()}
        mu_shape = tuple(self.slots(self.st.Xc).shape[:-2]) + (1, 1)
        spec["mu"] = (mu_shape, self.st.Xc.dtype, True)  # set by the first X-step under mu="auto"
        return spec

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev = self.st.Xc.device
        self.st = AgentsState(**{k: v.to(dev) for k, v in tensors.items()})
        self.plain_bytes = int(extra["plain_bytes"])

    def rng_state(self):
        return self.s.sampler.state_dict()

    def load_rng_state(self, state) -> None:
        self.s.sampler.load_state_dict(state)

    def extra(self) -> dict:
        return {"plain_bytes": int(self.plain_bytes)}

    def settings(self) -> dict:
        return self._settings

    def inputs(self) -> dict:
        return self._inputs()
