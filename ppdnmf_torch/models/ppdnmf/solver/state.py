"""The solver's data types: parameters, the state of Algorithm 1, the initial state, and
what the callback receives.

All agents' variables are stacked, trial dimension first, agent dimension second:

* ``X, U, P, Q, Q_prev``: ``(T, N, L, K)``
* ``Y, V, R``: ``(T, N, K, M_max)``; columns beyond an agent's ``M_i`` are padding and
  stay exactly zero (``Z``'s padding is zero, so every update maps zeros to zeros).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch

from ...._utils import ConfigError, derive_seed
from ....penalties import PENALTY_MODES, PENALTY_SCHEDULES, PenaltySampler
from ..problem import Problem

__all__ = ["CONSENSUS_FORMS", "X_SOLVERS", "X_WALKS", "INITS", "Y_SOLVERS", "PAPER_SETTINGS", "DEFAULTS", "SolverParams", "SolverState",
           "IterationInfo", "init_state", "initial_factor", "make_sampler"]

CONSENSUS_FORMS = ("derived", "paper_literal")
#: starts of Algorithm 1: the paper's all-ones ``X_0``, or one drawn from a seed all agents share
INITS = ("ones", "random")
#: solvers of the Y-step's NNLS: the paper's ADMM (eqs. 12-14) or HALS (:mod:`.hals`)
Y_SOLVERS = ("admm", "hals")
#: the paper's caps, start and Y-step (``experiment=paper_*``, the per-agent reference in
#: tests/, and :class:`SolverParams`' defaults)
PAPER_SETTINGS = {"penalty_schedule": "paper", "init": "ones", "y_solver": "admm", "tol": 0.0}
#: the library's defaults of the same keywords (``fit``, ``fit_trials``, conf/solver/default.yaml):
#: the schedule whose equal weights keep a receiver's sums from revealing any one neighbour
#: (issue 32, docs/SECURE_EXCHANGE.md); it meets the agreement target on every data set
#: tried, the NMSE target (within 2 % of centralized) on all but CBCL (docs/RESULTS.md)
DEFAULTS = {"penalty_schedule": "agreed", "init": "random", "y_solver": "admm"}
#: the public entry points' stopping defaults (``fit``, ``fit_trials``, the estimator, the CLI):
#: stop on the Sec. II-C rule (stationary and agreeing) with ``bcd_iters`` as the cap, ADMM
#: loops at their fixed counts (early-stopped ADMM loops slowed the agreement: docs/RESULTS.md,
#: "Stopping by default"). The paper's presets run fixed counts (``tol=0`` in PAPER_SETTINGS).
STOPPING = {"bcd_iters": 1000, "tol": 1e-4, "admm_tol": 0.0}
#: the X-step's solvers: the paper's decentralized ADMM (eqs. 8-11), or the incremental
#: consensus engine (:mod:`.incremental`): I-ADMM, PI-ADMM1 (perturbed step), PI-ADMM2 (noise)
X_SOLVERS = ("admm", "i_admm", "pi_admm", "pi_admm2")
#: the incremental X-step's walk: a Hamiltonian cycle when one is found, else a closed walk
#: that relays the token ("auto"), or a Hamiltonian cycle only ("cycle")
X_WALKS = ("auto", "cycle")


@dataclass(frozen=True)
class SolverParams:
    """Algorithm parameters (validated on construction).

    Parameters
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
        Tolerance of the two ADMM loops; ``None`` uses ``tol``. ``admm_tol=0`` with
        ``tol > 0`` runs fixed ADMM counts inside a BCD loop that stops on convergence
        (inner loops cut short too early can keep the outer loop from settling).
    penalty : {"random", "fixed"}
    consensus_form : {"derived", "paper_literal"}
    fuse : bool
        Compile the ADMM iterations with TorchInductor (see :mod:`.fused`; a
        compilation per new shape; rounding differs slightly). The HALS Y-step runs
        eager either way.
    penalty_schedule : {"paper", "adaptive", "agreed"}
        The penalty caps: the paper's fixed ``g_i``, each agent's own consensus-seeking
        rule, or one cap and one draw per ADMM iteration for every edge, grown by a rule all
        agents agree on (:mod:`ppdnmf_torch.solver.schedule`, :mod:`ppdnmf_torch.penalties`).
    init : {"ones", "random"}
        The start ``X_0 = U_0``: all ones (the paper), or drawn from each trial's
        ``init_seeds`` entry (:func:`initial_factor`).
    y_solver : {"admm", "hals"}
        The Y-step: ``y_iters`` ADMM iterations (eqs. 12-14) or ``y_iters`` HALS sweeps
        (:mod:`.hals`).
    x_solver : {"admm", "i_admm", "pi_admm", "pi_admm2"}
        The X-step: the paper's decentralized ADMM (default), or the incremental consensus
        engine (:mod:`.incremental`, docs/INCREMENTAL.md): I-ADMM, PI-ADMM1 (``gamma``
        drawn per activation), PI-ADMM2 (Gaussian noise on every new ``x_i``).
    x_rho : float
        The incremental methods' penalty ``rho`` (``mu`` is the ADMM X-step's).
    x_gamma_spread : float
        ``pi_admm``: ``gamma ~ U(1 - s / rho, 1 + s / rho)``; needs ``s < x_rho``.
    x_sigma : float
        ``pi_admm2``: the noise's standard deviation.
    x_rounds : int or None
        Rounds of the token per X-step (each agent solves once per round); None: ``x_iters``
        (equal local work with the ADMM X-step).
    x_start : (low, high) or None
        Algorithm 2's private start around the solver's ``X^0``: ``x_i^0 = X^0 + v_i``,
        ``v_i ~ U(low, high)``, ``y_i^0 = x_rho v_i``, ``z^0 = X^0``. None: ``(0, 0)`` for
        ``i_admm`` (the public start), ``(-1, 1)`` for the PI-ADMMs.
    x_walk : {"auto", "cycle"}
        See :data:`X_WALKS`.
    """

    rank: int
    mu: float = 0.1
    eta: float = 1.0
    bcd_iters: int = 100
    x_iters: int = 30
    y_iters: int = 30
    tol: float = 0.0
    penalty: str = "random"
    consensus_form: str = "derived"
    admm_tol: float | None = None
    fuse: bool = False
    penalty_schedule: str = "paper"
    init: str = "ones"
    y_solver: str = "admm"
    x_solver: str = "admm"
    x_rho: float = 0.1
    x_gamma_spread: float = 0.05
    x_sigma: float = 1e-3
    x_rounds: int | None = None
    x_start: tuple | None = None
    x_walk: str = "auto"

    @property
    def inner_tol(self) -> float:
        return self.tol if self.admm_tol is None else self.admm_tol

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ConfigError(f"rank: must be an integer >= 1, got {self.rank!r}")
        for name in ("mu", "eta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name}: must be a finite number > 0, got {v!r}")
        for name in ("bcd_iters", "x_iters", "y_iters"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
        if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and self.tol >= 0):
            raise ConfigError(f"tol: must be a finite number >= 0, got {self.tol!r}")
        if self.admm_tol is not None and not (
            isinstance(self.admm_tol, (int, float)) and math.isfinite(self.admm_tol) and self.admm_tol >= 0
        ):
            raise ConfigError(f"admm_tol: must be None or a finite number >= 0, got {self.admm_tol!r}")
        if self.penalty not in PENALTY_MODES:
            raise ConfigError(f"penalty: unknown mode {self.penalty!r}; use one of {PENALTY_MODES}")
        if self.consensus_form not in CONSENSUS_FORMS:
            raise ConfigError(
                f"consensus_form: unknown form {self.consensus_form!r}; use one of {CONSENSUS_FORMS}"
            )
        for name, choices in (("penalty_schedule", PENALTY_SCHEDULES), ("init", INITS), ("y_solver", Y_SOLVERS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{name}: unknown value {getattr(self, name)!r}; use one of {choices}")
        _check_x_solver(self)

    @property
    def x_start_range(self) -> tuple:
        """``(low, high)`` of the incremental start's private offsets (``x_start`` resolved)."""
        if self.x_start is not None:
            return self.x_start
        return (0.0, 0.0) if self.x_solver == "i_admm" else (-1.0, 1.0)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_x_solver(p: "SolverParams") -> None:
    """The incremental X-step's parameters (checked whatever ``x_solver``: a bad value is a bad value)."""
    if p.x_solver not in X_SOLVERS:
        raise ConfigError(f"x_solver: unknown solver {p.x_solver!r}; use one of {X_SOLVERS}")
    if p.x_walk not in X_WALKS:
        raise ConfigError(f"x_walk: unknown walk {p.x_walk!r}; use one of {X_WALKS}")
    for name, low in (("x_rho", None), ("x_gamma_spread", 0.0), ("x_sigma", 0.0)):
        v = getattr(p, name)
        if not _finite(v) or (v <= 0 if low is None else v < low):
            raise ConfigError(f"{name}: must be a finite number {'> 0' if low is None else '>= 0'}, got {v!r}")
    if p.x_solver == "pi_admm" and not p.x_gamma_spread < p.x_rho:
        raise ConfigError(f"x_gamma_spread: gamma ~ U(1 - s / rho, 1 + s / rho) needs s < {{x_rho}} = {p.x_rho} "
                          f"to keep gamma > 0, got {p.x_gamma_spread}")
    if p.x_rounds is not None and (not isinstance(p.x_rounds, int) or isinstance(p.x_rounds, bool)
                                   or p.x_rounds < 1):
        raise ConfigError(f"x_rounds: must be None or an integer >= 1, got {p.x_rounds!r}")
    if p.x_start is not None:
        try:
            lo, hi = p.x_start
        except (TypeError, ValueError):
            raise ConfigError(f"x_start: expected None or a pair (low, high), got {p.x_start!r}") from None
        if not (_finite(lo) and _finite(hi) and lo <= hi):
            raise ConfigError(f"x_start: expected finite low <= high, got {p.x_start!r}")
        object.__setattr__(p, "x_start", (float(lo), float(hi)))


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
    frozen: torch.Tensor | None = None  # (T, N) bool, agents stopped by the BCD-level rule
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

