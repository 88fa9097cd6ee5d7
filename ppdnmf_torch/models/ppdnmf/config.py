"""PPDNMF's spec: every setting of a fit and of a run, its default and its rule, written once.

* :class:`SolverConfig` (frozen): Algorithm 1's settings. :func:`~.api.fit`,
  :func:`~.api.fit_trials`, :func:`~.distributed.fit_rank`, :class:`~.estimator.PPDNMF` and
  the CLI's ``solver`` section (``conf/solver/default.yaml``) take their defaults from it
  (tests/test_spec.py checks by introspection), and its construction checks every value.
* :class:`FitOptions` (frozen): the rest of ``fit``'s keywords (the exchange, the data's and
  the graph's checks, seeds, placement, callback, checkpoints), the same way.
* :class:`RunConfig`: one run of the app (the CLI's whole config), of sections
  (:class:`DataConfig`, :class:`GraphConfig`, :class:`SolverConfig`, the exchange's spec,
  :class:`LoggerConfig`), converted once from Hydra's dict by :func:`from_dict`.

The rules are the fields' (:func:`ppdnmf_torch.specs.rule`): a value of the wrong type is
refused by name, never converted (``fit(fuse="no")``, ``fit(bcd_iters=2.0)``); a config's text
values are converted first (:func:`ppdnmf_torch.specs.build`: ``1e3`` for an integer). Errors
start with the (dotted) key: ``"solver.mu: must be > 0, got -1.0"``. Nothing here imports
Hydra or OmegaConf.
"""
from __future__ import annotations

import numbers
import os
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

import torch

from ...errors import ConfigError, PPDNMFError
from ...data import CBCL_HINT, DATA_KINDS
from ...exchange.base import Exchange
from ...exchange.spec import EXCHANGE_KINDS, SPECS, ExchangeSpec, SecAggSpec
from ...graph import GRAPH_ALIASES, GRAPH_KINDS, GRAPH_PARAMS, GRAPH_REQUIRED
from ...penalties import PENALTY_MODES, PENALTY_SCHEDULES
from ...specs import build, check_dataclass, check_fields, coerce, rule, to_plain
from ...threads import resolve_threads
from .problem import MAX_SEED, NEGATIVE_MODES, as_seed, check_rank

__all__ = [
    "SolverConfig",
    "FitOptions",
    "settings",
    "RunConfig",
    "DataConfig",
    "SplitConfig",
    "GraphConfig",
    "LoggerConfig",
    "exchange_keys",
    "exchange_to_dict",
    "build_exchange",
    "from_dict",
    "to_dict",
    "PAPER_SETTINGS",
    "CONSENSUS_FORMS",
    "INITS",
    "Y_SOLVERS",
    "X_SOLVERS",
    "X_WALKS",
    "X_SOLVER_KEYS",
    "MAX_ITERATIONS",
    "LOGGER_KINDS",
    "DTYPES",
    "GRAPH_PARAMS",
    "SYNTHETIC_DEFAULTS",
]

LOGGER_KINDS = ("tensorboard", "none")
DTYPES = ("float64", "float32")
#: the consensus term of step 3 (docs/ALGORITHM.md, "The consensus term in step 3")
CONSENSUS_FORMS = ("derived", "paper_literal")
#: starts of Algorithm 1: the paper's all-ones ``X_0``, or one drawn from a seed all agents share
INITS = ("ones", "random")
#: solvers of the Y-step's NNLS: the paper's ADMM (eqs. 12-14) or HALS (``solver/hals.py``)
Y_SOLVERS = ("admm", "hals")
#: the X-step's solvers: the paper's decentralized ADMM (eqs. 8-11), or the incremental
#: consensus engine (``solver/incremental.py``): I-ADMM, PI-ADMM1 (perturbed step), PI-ADMM2 (noise)
X_SOLVERS = ("admm", "i_admm", "pi_admm", "pi_admm2")
#: the incremental X-step's walk: a Hamiltonian cycle when one is found, else a closed walk
#: that relays the token ("auto"), or a Hamiltonian cycle only ("cycle")
X_WALKS = ("auto", "cycle")
#: the incremental X-step's settings (the centralized baseline keeps the ADMM X-step)
X_SOLVER_KEYS = ("x_solver", "x_rho", "x_gamma_spread", "x_sigma", "x_rounds", "x_start", "x_walk")
#: the paper's caps, start, Y-step and fixed iteration counts (``experiment=paper_*``,
#: :func:`~.experiments.run_experiment`'s presets, the per-agent reference in tests/)
PAPER_SETTINGS = {"penalty_schedule": "paper", "init": "ones", "y_solver": "admm", "tol": 0.0}
#: the most iterations a loop may be asked for: a count beyond it cannot end (an ADMM or
#: HALS iteration takes microseconds at least), so it is refused up front, as a count whose
#: history or buffers cannot fit in memory is (:func:`~.memory.check_fit`)
MAX_ITERATIONS = 2**31 - 1

#: defaults of the synthetic data's parameters (the paper's Sec. IV)
SYNTHETIC_DEFAULTS = {"L": 30, "M": 200, "K": 5, "x_mean": 0.033, "y_mean": 0.8, "noise_var": 3.6e-4}
_FILE_KINDS = ("cbcl", "npy", "csv")


def _caps(key: str, v):
    """``g_max``: one number > 0, or one per agent (a list, an array, a tensor; ``(T, N)`` for
    :func:`~.api.fit_trials`), whose entries :func:`~.problem.as_caps` checks against the agents."""
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        if not (v > 0 and v < float("inf")):
            raise ConfigError(f"{key}: must be a finite number > 0, got {v!r}")
        return v
    if isinstance(v, (bool, str, bytes, Mapping)) or not hasattr(v, "__len__"):
        raise ConfigError(f"{key}: must be a number > 0 or a list of numbers (one per agent), got {v!r} "
                          f"({type(v).__name__})")
    return list(v) if isinstance(v, tuple) else v


def _seed(key: str, v) -> int:
    """A seed: an integer from 0 to 2**63 - 1 (a float, a bool or None refused, never truncated)."""
    return as_seed(v, key)


def _folder(key: str, v):
    """A folder or file path: a string or ``os.PathLike``, not empty (``""`` would be the
    current directory)."""
    if not isinstance(v, (str, os.PathLike)):
        raise ConfigError(f"{key}: must be a path (a string or os.PathLike) or None, got {v!r} ({type(v).__name__})")
    if not str(os.fspath(v)).strip():
        raise ConfigError(f"{key}: is empty; give a folder (an empty path would be the current directory), "
                          "or None")
    return v


# --------------------------------------------------------------------------------------
# The spec: Algorithm 1's settings, and the rest of fit's keywords
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SolverConfig:
    """Algorithm 1's settings: the single source of their defaults and rules.

    Every value is checked on construction (types refused, not converted). The meaning of each
    is :func:`~ppdnmf_torch.fit`'s parameter of the same name; ``rank`` is the CLI's
    ``solver.rank`` (``fit`` takes it as an argument, the estimator as ``n_components``).
    """

    rank: int = rule(5, ge=1, doc="the inner rank K")
    mu: float = rule(0.1, gt=0, doc="the X-step's ADMM penalty (eqs. 8-11)")
    eta: float = rule(1.0, gt=0, doc="the Y-step's ADMM penalty (eqs. 12-14)")
    g_max: float | list[float] = rule(0.033, gt=0, check=_caps, doc="the penalty caps g_i")
    bcd_iters: int = rule(1000, ge=1, le=MAX_ITERATIONS, doc="the cap on BCD iterations")
    x_iters: int = rule(30, ge=1, le=MAX_ITERATIONS, doc="ADMM iterations per X-step")
    y_iters: int = rule(30, ge=1, le=MAX_ITERATIONS, doc="ADMM iterations (HALS sweeps) per Y-step")
    tol: float = rule(1e-4, ge=0, doc="the BCD stop: every agent's model change and disagreement below it (0: fixed counts)")
    admm_tol: float | None = rule(0.0, ge=0, doc="the ADMM loops' tolerance (None: tol; 0: fixed counts)")
    penalty: str = rule("random", choices=PENALTY_MODES, doc="random monotone draws or fixed g_i")
    consensus_form: str = rule("derived", choices=CONSENSUS_FORMS, doc="step 3's consensus term")
    fuse: bool = rule(False, doc="compile the ADMM iterations with TorchInductor")
    penalty_schedule: str = rule("agreed", choices=PENALTY_SCHEDULES, doc="how the caps evolve")
    init: str = rule("random", choices=INITS, doc="the start X_0 = U_0")
    init_seed: int | None = rule(None, check=_seed, doc="seed of init='random' (None: the run's seed)")
    y_solver: str = rule("admm", choices=Y_SOLVERS, doc="the Y-step's solver")
    x_solver: str = rule("admm", choices=X_SOLVERS, doc="the X-step's solver")
    x_rho: float = rule(0.1, gt=0, doc="the incremental methods' penalty rho")
    x_gamma_spread: float = rule(0.05, ge=0, doc="pi_admm: gamma ~ U(1 - s / rho, 1 + s / rho)")
    x_sigma: float = rule(1e-3, ge=0, doc="pi_admm2: the noise's standard deviation")
    x_rounds: int | None = rule(None, ge=1, le=MAX_ITERATIONS, doc="token rounds per X-step (None: x_iters)")
    x_start: list[float] | None = rule(None, doc="[low, high] of the private start offsets")
    x_walk: str = rule("auto", choices=X_WALKS, doc="the token's walk")

    def __post_init__(self):
        check_fields(self)
        if self.x_start is not None and (len(self.x_start) != 2 or self.x_start[0] > self.x_start[1]):
            raise ConfigError(f"x_start: expected a pair [low, high] with low <= high, or None, got {self.x_start!r}")
        if self.x_solver == "pi_admm" and not self.x_gamma_spread < self.x_rho:
            raise ConfigError(f"x_gamma_spread: gamma ~ U(1 - s / rho, 1 + s / rho) needs s < {{x_rho}} = "
                              f"{self.x_rho} to keep gamma > 0, got {self.x_gamma_spread}")


@dataclass(frozen=True)
class FitOptions:
    """The rest of :func:`~ppdnmf_torch.fit`'s keywords (its inputs ``Z``, ``adjacency``,
    ``rank`` and ``columns`` aside): the single source of their defaults and types.

    The exchange's own values are its spec's to check (:func:`~ppdnmf_torch.exchange.exchange_spec`);
    the device's and dtype's names :func:`~ppdnmf_torch.resolve_device`'s and
    :func:`~ppdnmf_torch.resolve_dtype`'s.
    """

    exchange: str | ExchangeSpec | Exchange = rule("secagg", doc="the exchange kind, a spec or an exchange")
    protocol: str | None = rule(None, doc="the integer kinds' protocol (None: the spec's default)")
    n_max: float | None = rule(None, doc="the quantization scale N_max (None: the spec's default)")
    key_bits: int | None = rule(None, doc="the Paillier key size (None: the spec's default)")
    g_bits: int | None = rule(None, doc="the penalties' scale 2^g_bits (None: the spec's default)")
    exchange_options: Mapping | None = rule(None, doc="further settings of the kind's spec")
    negative: str = rule("error", choices=NEGATIVE_MODES, doc="what to do with negative entries of Z")
    min_degree: int | None = rule(None, ge=1, doc="refuse graphs with an agent of fewer neighbours")
    seed: int = rule(0, check=_seed, doc="seeds the penalty draws (and the seeded start)")
    device: str | torch.device = rule("auto", doc="auto, cpu, cuda or cuda:<k>")
    dtype: str | torch.dtype = rule("float64", doc="float64 or float32")
    threads: int | None = rule(None, ge=1, doc="torch's intra-op threads for the call (None: the default)")
    callback: Callable | None = rule(None, doc="called after each BCD iteration; True stops")
    checkpoint_dir: str | os.PathLike | None = rule(None, check=_folder, doc="where checkpoints go")
    checkpoint_every: int = rule(1, ge=0, doc="BCD iterations between checkpoints (0: on Ctrl-C only)")
    resume_from: str | os.PathLike | None = rule(None, check=_folder, doc="a checkpoint, or its folder")

    def __post_init__(self):
        check_fields(self)


def settings(namespace: Mapping, **given) -> tuple[SolverConfig, FitOptions]:
    """The spec of an entry point's call: its parameters (``locals()`` at its first line)
    that are fields of :class:`SolverConfig` or :class:`FitOptions`, and ``given``; the
    others take the spec's defaults. Every value is checked here, once."""
    values = {**namespace, **given}
    solver = SolverConfig(**{f.name: values[f.name] for f in fields(SolverConfig) if f.name in values})
    options = FitOptions(**{f.name: values[f.name] for f in fields(FitOptions) if f.name in values})
    return solver, options


#: the defaults: what an entry point's signature shows
SOLVER_DEFAULTS = SolverConfig()
OPTION_DEFAULTS = FitOptions()


# --------------------------------------------------------------------------------------
# The app's run: its sections
# --------------------------------------------------------------------------------------


@dataclass
class SplitConfig:
    """How the columns of ``Z`` are split over the agents.

    ``counts`` (one per agent) fixes the split; else ``lo``/``hi`` bound uniform
    draws (:func:`ppdnmf_torch.data.split_counts`); all None splits equally.
    """

    lo: int | None = rule(None, ge=1)
    hi: int | None = rule(None, ge=1)
    counts: list[int] | None = rule(None, ge=1)


@dataclass
class DataConfig:
    """The data matrix ``Z``.

    ``L, M, K, x_mean, y_mean, noise_var`` apply to ``kind="synthetic"`` only (None
    there means the paper's value, :data:`SYNTHETIC_DEFAULTS`); ``path`` to the file
    kinds; ``delimiter`` to ``csv`` (None: ``","``).
    """

    kind: str = rule("synthetic", choices=DATA_KINDS)
    path: str | None = None
    L: int | None = rule(None, ge=1)
    M: int | None = rule(None, ge=1)
    K: int | None = rule(None, ge=1)
    x_mean: float | None = rule(None, gt=0)
    y_mean: float | None = rule(None, gt=0)
    noise_var: float | None = rule(None, ge=0)
    delimiter: str | None = None
    negative: str = rule(OPTION_DEFAULTS.negative, choices=NEGATIVE_MODES)
    # divide Z by its largest absolute entry before the run (mu, eta and g_max are absolute:
    # data far from unit scale can leave the factors at zero or at their start)
    normalize: bool = False
    image_shape: list[int] | None = rule(None, ge=1)
    split: SplitConfig = field(default_factory=SplitConfig)

    def synthetic_kwargs(self) -> dict:
        """Arguments of :func:`ppdnmf_torch.data.synthetic`, paper defaults filled in."""
        return {k: (getattr(self, k) if getattr(self, k) is not None else v) for k, v in SYNTHETIC_DEFAULTS.items()}


@dataclass
class GraphConfig:
    """The communication graph (:func:`ppdnmf_torch.graph.make_graph`); see :data:`GRAPH_PARAMS`.

    Parameters left at None take make_graph's defaults (e.g. ``avg_degree=3``).
    ``min_degree`` (not a generator parameter) refuses a graph with an agent of fewer
    neighbours (``2``: no agent whose exchange sums are a single neighbour's term).
    """

    kind: str = rule("random", choices=GRAPH_KINDS)
    avg_degree: float | None = rule(None, gt=0)
    rows: int | None = rule(None, ge=1)
    cols: int | None = rule(None, ge=1)
    p: float | None = rule(None, gt=0, le=1)
    radius: float | None = rule(None, gt=0)
    max_tries: int | None = rule(None, ge=1)
    path: str | None = None
    min_degree: int | None = rule(OPTION_DEFAULTS.min_degree, ge=1)

    def params(self) -> dict:
        """The keyword arguments of ``make_graph`` for this kind (nulls left out)."""
        return {k: getattr(self, k) for k in GRAPH_PARAMS[self.kind] if getattr(self, k) is not None}



#: exchange settings that only the Python API takes (pre-made keys, test hooks, transcripts)
API_ONLY_EXCHANGE_KEYS = ("keypairs", "pool_audit", "record_transcript")


def exchange_keys(kind: str) -> tuple:
    """The config keys of exchange kind ``kind`` besides ``kind`` (its spec's settings, less
    :data:`API_ONLY_EXCHANGE_KEYS`); ``conf/exchange/<kind>.yaml`` holds exactly these."""
    return tuple(k for k in SPECS[kind].keys() if k not in API_ONLY_EXCHANGE_KEYS)


def exchange_to_dict(spec: ExchangeSpec) -> dict:
    """The config section of an exchange spec: ``kind`` and its config keys."""
    return {"kind": spec.kind, **{k: getattr(spec, k) for k in exchange_keys(spec.kind)}}


def build_exchange(data, prefix: str = "exchange") -> ExchangeSpec:
    """The ``exchange`` section as its kind's spec (:mod:`ppdnmf_torch.exchange.spec`), whose
    rules check the values; errors name ``exchange.<key>``."""
    if isinstance(data, ExchangeSpec):
        data = exchange_to_dict(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix}: must be a mapping of keys to values, got {data!r}")
    d = dict(data)
    kind = d.pop("kind", "plain")
    if kind not in SPECS:
        raise ConfigError(f"{prefix}.kind: unknown value {kind!r}; use one of {', '.join(EXCHANGE_KINDS)}")
    cls, keys = SPECS[kind], exchange_keys(kind)
    hints = typing.get_type_hints(cls)
    values = {}
    for k, v in d.items():
        if k not in keys:
            raise ConfigError(f"{prefix}.{k}: does not apply to {prefix}.kind={kind} "
                              f"(its keys: {', '.join(keys) if keys else 'none'})")
        values[k] = coerce(f"{prefix}.{k}", v, hints[k])
    try:
        return cls(**values)
    except PPDNMFError as exc:
        raise exc.within(prefix) from None


@dataclass
class LoggerConfig:
    """TensorBoard logging."""

    kind: str = rule("tensorboard", choices=LOGGER_KINDS)
    images: bool = True
    n_samples: int = rule(2, ge=1)
    image_scale: int = rule(4, ge=1, le=32)
    flush_secs: int = rule(30, ge=1)



def _paper_synthetic_data() -> DataConfig:
    return DataConfig(kind="synthetic", negative="allow", split=SplitConfig(lo=4, hi=40), **SYNTHETIC_DEFAULTS)


def _paper_solver() -> SolverConfig:
    """The solver of the paper's experiments: the library's defaults but the paper's caps, start,
    Y-step and fixed 100 BCD iterations."""
    return SolverConfig(bcd_iters=100, **PAPER_SETTINGS)


@dataclass
class RunConfig:
    """One run of the app: the paper's synthetic experiment by default (as ``ppdnmf`` with no
    arguments, which composes ``experiment=paper_synthetic``)."""

    # the app's task that runs this config (conf/task/ppdnmf.yaml; ppdnmf_torch.app.tasks)
    task: str = rule("ppdnmf", choices=("ppdnmf",))
    name: str = "custom"
    seed: int = rule(OPTION_DEFAULTS.seed, ge=0, le=MAX_SEED)
    device: str = "auto"
    dtype: str = rule("float64", choices=DTYPES)
    centralized: bool = True
    n_agents: int = rule(10, ge=1)
    progress: bool = True
    # off a terminal: seconds between two progress lines in the log
    progress_interval: float = rule(5.0, gt=0)
    # CPU threads of torch's intra-op pool (None: the package's default, threads.default_threads)
    threads: int | None = rule(None, ge=1)
    # independent trials (seeds seed, seed + 1, ...) run as one batched computation
    trials: int = rule(1, ge=1)
    # crash-safe checkpoints in <run dir>/checkpoints every this many BCD iterations (0: only on Ctrl-C)
    checkpoint_every: int = rule(10, ge=0)
    # keep the checkpoints of a run that finished (default: removed once the outputs are written)
    keep_checkpoints: bool = False
    # a previous run's folder: continue it from its newest checkpoint (its own config is used)
    resume: str | None = None
    data: DataConfig = field(default_factory=_paper_synthetic_data)
    graph: GraphConfig = field(default_factory=lambda: GraphConfig(avg_degree=3.0))
    solver: SolverConfig = field(default_factory=_paper_solver)
    exchange: ExchangeSpec = rule(default_factory=SecAggSpec, build=build_exchange)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def validate(self) -> "RunConfig":
        """Check every field and the cross-field rules; returns ``self``.

        Raises
        ------
        ConfigError
            Naming the dotted key of the first bad value.
        """
        check_dataclass(self, "")
        _check_cross(self)
        return self


# --------------------------------------------------------------------------------------
# Rules across a run's sections
# --------------------------------------------------------------------------------------


_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def _check_cross(cfg: RunConfig):
    """Rules that involve more than one value."""
    if cfg.resume is not None and not cfg.resume.strip():
        raise ConfigError("resume: is empty; give the folder of the run to continue (resume=outputs/<date>/<time>), "
                          "or leave resume out for a fresh run")
    if cfg.trials > 1 and cfg.resume is not None:
        raise ConfigError("trials: batched trials keep no checkpoints, so there is nothing to resume; "
                          "resume a single run (trials=1)")
    if cfg.threads is not None:
        resolve_threads(cfg.threads)  # the upper bound, before any thread is made
    if not _DEVICE_RE.match(cfg.device.strip().lower()):
        raise ConfigError(f"device: unknown device {cfg.device!r}; use auto, cpu, cuda or cuda:<k>")
    N = cfg.n_agents
    d = cfg.data
    # data: which keys apply to which kind
    synth_keys = tuple(SYNTHETIC_DEFAULTS)
    if d.kind == "synthetic":
        if d.path is not None:
            raise ConfigError("data.path: synthetic data takes no path (set it to null)")
    else:
        for k in synth_keys:
            if getattr(d, k) is not None:
                raise ConfigError(f"data.{k}: applies to data.kind=synthetic only (kind is {d.kind!r})")
        if d.path is None or not str(d.path).strip():
            if d.kind == "cbcl":
                raise ConfigError(f"data.path: no CBCL data file given; {CBCL_HINT}")
            raise ConfigError(f"data.path: data.kind={d.kind} needs a file path (data.path=...)")
    if d.delimiter is not None and d.kind != "csv":
        raise ConfigError(f"data.delimiter: applies to data.kind=csv only (kind is {d.kind!r})")
    if d.delimiter is not None and d.delimiter == "":
        raise ConfigError("data.delimiter: must not be empty")
    if d.image_shape is not None and len(d.image_shape) != 2:
        raise ConfigError(f"data.image_shape: must be [height, width], got {d.image_shape!r}")
    L = M = None
    if d.kind == "synthetic":
        sk = d.synthetic_kwargs()
        L, M = sk["L"], sk["M"]
        if d.image_shape is not None and d.image_shape[0] * d.image_shape[1] != L:
            raise ConfigError(
                f"data.image_shape: {d.image_shape[0]}x{d.image_shape[1]} pixels do not match data.L = {L}"
            )
    elif d.kind == "cbcl":
        L = 361
    # column split
    s = d.split
    if s.counts is not None:
        if s.lo is not None or s.hi is not None:
            raise ConfigError("data.split.counts: give either counts or lo/hi bounds, not both")
        if len(s.counts) != N:
            raise ConfigError(f"data.split.counts: got {len(s.counts)} counts but n_agents = {N}")
        if M is not None and sum(s.counts) != M:
            raise ConfigError(f"data.split.counts: sum to {sum(s.counts)} but data.M = {M}")
    else:
        lo = 1 if s.lo is None else s.lo
        if s.lo is not None and s.hi is not None and s.lo > s.hi:
            raise ConfigError(f"data.split.lo: lo = {s.lo} is greater than data.split.hi = {s.hi}")
        if M is not None:
            if M < N:
                raise ConfigError(f"data.M: {M} columns cannot give each of the n_agents = {N} agents one column")
            if s.lo is not None and N * lo > M:
                raise ConfigError(f"data.split.lo: {N} agents x lo = {lo} columns exceeds data.M = {M}")
            if s.hi is not None and N * s.hi < M:
                raise ConfigError(f"data.split.hi: {N} agents x hi = {s.hi} columns is less than data.M = {M}")
    # rank
    if L is not None:
        try:
            check_rank(cfg.solver.rank, L)  # the rule fit applies, before any data is loaded
        except ConfigError as exc:
            raise exc.within("solver") from None
    if cfg.solver.x_solver != "admm" and cfg.exchange.kind != "plain":
        raise ConfigError(f"exchange.kind: solver.x_solver={cfg.solver.x_solver} passes a token and sends no "
                          f"secure sums; use exchange=plain (got {cfg.exchange.kind})")
    if isinstance(cfg.solver.g_max, list) and len(cfg.solver.g_max) != N:
        raise ConfigError(f"solver.g_max: got {len(cfg.solver.g_max)} caps but n_agents = {N}")
    # graph: the parameters of the kind, and only those
    g = cfg.graph
    allowed = GRAPH_PARAMS[g.kind]
    for k in ("avg_degree", "rows", "cols", "p", "radius", "max_tries", "path"):
        if k not in allowed and getattr(g, k) is not None:
            raise ConfigError(
                f"graph.{k}: does not apply to graph.kind={g.kind} "
                f"(its parameters: {', '.join(allowed) if allowed else 'none'})"
            )
    for k in GRAPH_REQUIRED.get(g.kind, ()):
        if getattr(g, k) is None or (k == "path" and not str(g.path).strip()):
            raise ConfigError(f"graph.{k}: graph.kind={g.kind} needs {k}")
    if g.kind == "grid":
        rows, cols = g.rows, g.cols
        if rows is not None and cols is not None and rows * cols != N:
            raise ConfigError(f"graph.rows: rows x cols = {rows} x {cols} = {rows * cols} but n_agents = {N}")
        for name, v in (("rows", rows), ("cols", cols)):
            if v is not None and N % v:
                raise ConfigError(f"graph.{name}: {v} does not divide n_agents = {N}")
    if g.kind == "random" and N > 1 and g.avg_degree is not None and g.avg_degree > N - 1:
        raise ConfigError(f"graph.avg_degree: {g.avg_degree:g} is more than n_agents - 1 = {N - 1}")


def from_dict(d: Mapping) -> RunConfig:
    """Convert a nested dict (e.g. Hydra's resolved config) into a validated :class:`RunConfig`.

    Missing keys take the dataclass defaults; unknown keys are errors. A top-level
    ``hydra`` node, if present, is ignored.

    Raises
    ------
    ConfigError
        Naming the dotted key, e.g. ``"solver.mu: must be > 0, got -1.0"``.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(f"config: must be a mapping of keys to values, got {type(d).__name__}")
    d = {k: v for k, v in d.items() if k != "hydra"}
    if isinstance(d.get("graph"), Mapping) and d["graph"].get("kind") in GRAPH_ALIASES:
        d["graph"] = dict(d["graph"], kind=GRAPH_ALIASES[d["graph"]["kind"]])
    solver = d.get("solver")
    if "exchange" not in d and isinstance(solver, Mapping) and solver.get("x_solver", "admm") != "admm":
        d["exchange"] = {"kind": "plain"}  # the default secure sum is the ADMM X-step's: a token sends no sums
    cfg = build(RunConfig, d)
    _check_cross(cfg)
    return cfg


def to_dict(cfg: RunConfig) -> dict:
    """Plain nested dict of a :class:`RunConfig` (YAML/JSON-serialisable)."""
    d = to_plain(cfg)
    d["exchange"] = exchange_to_dict(cfg.exchange)
    return d

