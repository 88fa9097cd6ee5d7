"""The solver's data types: parameters, the state of Algorithm 1, the initial state, and
what the callback receives.

All agents' variables are stacked, trial dimension first, agent dimension second:

* ``X, U, P, Q, Q_prev``: ``(T, N, L, K)``
* ``Y, V, R``: ``(T, N, K, M_max)``; columns beyond an agent's ``M_i`` are padding and
  stay exactly zero (``Z``'s padding is zero, so every update maps zeros to zeros).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from ...._utils import derive_seed
from ....errors import ConfigError
from ....penalties import PenaltySampler
from ..config import INITS, SolverConfig
from ..problem import Problem

__all__ = ["SolverParams", "SolverState", "IterationInfo", "init_state", "initial_factor", "make_sampler",
           "solver_params"]


@dataclass(frozen=True)
class SolverParams:
    """Algorithm 1's parameters as the solver reads them: made from a checked
    :class:`~ppdnmf_torch.models.ppdnmf.config.SolverConfig` by :meth:`of` (its defaults and
    rules are the spec's; nothing here is checked again).

    Attributes
    ----------
    rank : int
        ``K``.
    mu, eta : float
        ADMM penalties of the X-step (eqs. 8-11) and the Y-step (eqs. 12-14).
    bcd_iters, x_iters, y_iters : int
        Iteration caps of the BCD loop and of the two ADMM loops.
    tol : float
        Relative-change tolerance of the stopping rule (Sec. II-C); ``0`` runs the
        fixed iteration counts.
    admm_tol : float or None
        Tolerance of the two ADMM loops; ``None`` uses ``tol`` (:attr:`inner_tol`).
    penalty : {"random", "fixed"}
    consensus_form : {"derived", "paper_literal"}
    fuse : bool
        Compile the ADMM iterations with TorchInductor (see :mod:`.fused`).
    penalty_schedule : {"paper", "adaptive", "agreed"}
        The penalty caps (:mod:`.schedule`, :mod:`ppdnmf_torch.penalties`).
    init : {"ones", "random"}
        The start ``X_0 = U_0`` (:func:`initial_factor`).
    y_solver : {"admm", "hals"}
    x_solver : {"admm", "i_admm", "pi_admm", "pi_admm2"}
        The X-step: the paper's decentralized ADMM, or the incremental consensus engine
        (:mod:`.incremental`, docs/INCREMENTAL.md).
    x_rho, x_gamma_spread, x_sigma : float
        The incremental methods' penalty, PI-ADMM1's step spread, PI-ADMM2's noise.
    x_rounds : int or None
        Rounds of the token per X-step; None: ``x_iters``.
    x_start : (low, high) or None
        Algorithm 2's private start offsets (:attr:`x_start_range`).
    x_walk : {"auto", "cycle"}
    """

    rank: int
    mu: float
    eta: float
    bcd_iters: int
    x_iters: int
    y_iters: int
    tol: float
    penalty: str
    consensus_form: str
    admm_tol: float | None
    fuse: bool
    penalty_schedule: str
    init: str
    y_solver: str
    x_solver: str
    x_rho: float
    x_gamma_spread: float
    x_sigma: float
    x_rounds: int | None
    x_start: tuple | None
    x_walk: str

    @classmethod
    def of(cls, config: SolverConfig) -> "SolverParams":
        """The solver's parameters of a spec (``g_max`` and ``init_seed`` go to the problem)."""
        values = {f.name: getattr(config, f.name) for f in fields(cls)}
        if config.x_start is not None:
            values["x_start"] = tuple(float(v) for v in config.x_start)
        return cls(**values)

    @property
    def inner_tol(self) -> float:
        return self.tol if self.admm_tol is None else self.admm_tol

    @property
    def x_start_range(self) -> tuple:
        """``(low, high)`` of the incremental start's private offsets (``x_start`` resolved)."""
        if self.x_start is not None:
            return self.x_start
        return (0.0, 0.0) if self.x_solver == "i_admm" else (-1.0, 1.0)


def solver_params(rank: int, **settings) -> SolverParams:
    """:class:`SolverParams` of ``SolverConfig(rank=rank, **settings)``: the spec's defaults
    and rules (a bad value raises the spec's :class:`~ppdnmf_torch.ConfigError`)."""
    return SolverParams.of(SolverConfig(rank=rank, **settings))


@dataclass
class SolverState:
    """Every variable of Algorithm 1 (the warm start carries all of them across BCD iterations)."""

    X: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor
    Y: torch.Tensor
    V: torch.Tensor
    R: torch.Tensor
    g: torch.Tensor  # (2E,) float64 penalty draws, carried over
    bcd_done: int = 0  # completed BCD iterations
    frozen: torch.Tensor | None = None  # (T, N) bool, agents stopped by the BCD-level rule (whole trials)
    stop_flags: torch.Tensor | None = None  # (T, N) bool, the agents that have the stop flag (.stopping)
    # the incremental X-step's own variables (x_solver != "admm"; its x_i are U): the
    # multipliers y_i (T, N, L, K), the token z (T, L, K), each trial's visiting order (T, n)
    inc_y: torch.Tensor | None = None
    inc_z: torch.Tensor | None = None
    inc_cycle: torch.Tensor | None = None
    # penalty_schedule="adaptive" or "agreed" only (None otherwise): the agents' caps g_i (T * N,) and
    # X-step penalties mu_i (T, N), both float64 (see .schedule)
    caps: torch.Tensor | None = None
    mu: torch.Tensor | None = None

    def tensors(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}


def initial_factor(seed: int, L: int, rank: int) -> torch.Tensor:
    """The seeded start ``X_0 (L, K)`` of one trial, float64 on the CPU.

    Entries i.i.d. uniform on ``[0, 2)`` (mean 1, the all-ones start's scale), from
    ``torch.rand((L, K), generator=torch.Generator().manual_seed(derive_seed(seed, "init")),
    dtype=torch.float64) * 2``. Every agent of the trial draws it from the same seed (agreed
    on like the graph, no data involved), so the local copies start equal and no agent
    shares anything; unlike the all-ones start, the ``K`` columns differ, so the symmetry
    that only rounding breaks is gone.
    """
    gen = torch.Generator().manual_seed(derive_seed(int(seed), "init"))
    return torch.rand((L, rank), generator=gen, dtype=torch.float64).mul_(2.0)


def init_state(problem: Problem, rank: int, dtype=None, init: str = "ones") -> SolverState:
    """Algorithm 1's initial values: ``X = U = X_0``, ``P = Q = Q_prev = 0``, ``Y = V = R = 0``, ``g = 0``.

    ``init="ones"``: ``X_0 = 1`` (the paper); ``"random"``: trial ``t``'s agents all start from
    :func:`initial_factor` of ``problem.init_seeds[t]``.
    """
    Z = problem.Z
    dtype = dtype or Z.dtype
    T, N, L, M = Z.shape
    if init == "ones":
        start = torch.ones((T, N, L, rank), dtype=dtype, device=Z.device)
    elif init == "random":
        X0 = torch.stack([initial_factor(s, L, rank) for s in problem.init_seeds])  # (T, L, K)
        start = X0[:, None].expand(T, N, L, rank).to(device=Z.device, dtype=dtype).contiguous()
    else:
        raise ConfigError(f"init: unknown value {init!r}; use one of {INITS}")
    zx = torch.zeros_like(start)
    zy = torch.zeros((T, N, rank, M), dtype=dtype, device=Z.device)
    g = torch.zeros(problem.topology.n_directed_edges, dtype=torch.float64, device=Z.device)
    return SolverState(
        X=start.clone(), U=start, P=zx, Q=zx.clone(), Q_prev=zx.clone(),
        Y=zy, V=zy.clone(), R=zy.clone(), g=g,
    )


@dataclass
class IterationInfo:
    """What the callback receives after every BCD iteration.

    ``metrics`` maps names to Tensors of shape ``(T,)`` (one value per trial);
    ``state`` is the live solver state (do not modify it; its tensors are reused buffers
    that later iterations overwrite: copy what you keep); ``costs`` is the exchange's
    :meth:`~ppdnmf_torch.exchange.Exchange.costs` after this iteration (cumulative).
    """

    iteration: int
    n_iter: int
    metrics: dict
    state: SolverState
    elapsed: float
    costs: dict = field(default_factory=dict)
    iteration_costs: list = field(default_factory=list)


def make_sampler(problem: Problem, params: SolverParams) -> PenaltySampler:
    """The penalty sampler of a problem, seeded from its per-trial seeds."""
    T, N = problem.Z.shape[:2]
    device = problem.Z.device
    edges_per_trial = torch.bincount(
        torch.div(problem.topology.src, N, rounding_mode="floor").cpu(), minlength=T
    ).tolist()
    return PenaltySampler(
        problem.caps.reshape(-1).to(device=device, dtype=torch.float64),
        problem.topology.src.to(device), edges_per_trial, problem.seeds, params.penalty, params.x_iters,
        shared=params.penalty_schedule == "agreed",
    )

