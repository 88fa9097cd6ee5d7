"""Typed run configuration: plain dataclasses and a validating converter.

The Hydra app (:mod:`ppdnmf_torch.app.cli`) composes ``conf/`` into a nested dict and
hands it to :func:`from_dict` once; scripts and tests can build a :class:`RunConfig`
directly, or from a dict. Nothing here imports Hydra or OmegaConf.

Every bad value raises :class:`~ppdnmf_torch._utils.ConfigError` with a message that
starts with the dotted key, e.g. ``"solver.mu: must be > 0, got -1"``.
"""
from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, is_dataclass

from ...errors import ConfigError, PPDNMFError
from ...data import CBCL_HINT, DATA_KINDS
from ...exchange.spec import EXCHANGE_KINDS, SPECS, ExchangeSpec, PlainSpec
from ...graph import GRAPH_KINDS, GRAPH_PARAMS
from ...graph import GRAPH_ALIASES as _GRAPH_ALIASES, GRAPH_REQUIRED as _GRAPH_REQUIRED
from ...penalties import PENALTY_MODES
from .problem import NEGATIVE_MODES, check_rank
from .solver import CONSENSUS_FORMS, X_SOLVERS, X_WALKS
from ...penalties import PENALTY_SCHEDULES
from ...threads import resolve_threads
from .solver.state import DEFAULTS as _FIT_DEFAULTS, INITS, PAPER_SETTINGS as _PAPER_SETTINGS, Y_SOLVERS

__all__ = [
    "RunConfig",
    "DataConfig",
    "SplitConfig",
    "GraphConfig",
    "SolverConfig",
    "exchange_keys",
    "exchange_to_dict",
    "LoggerConfig",
    "from_dict",
    "to_dict",
    "LOGGER_KINDS",
    "DTYPES",
    "GRAPH_PARAMS",
    "SYNTHETIC_DEFAULTS",
]

LOGGER_KINDS = ("tensorboard", "none")
DTYPES = ("float64", "float32")


#: defaults of the synthetic data's parameters (the paper's Sec. IV)
SYNTHETIC_DEFAULTS = {"L": 30, "M": 200, "K": 5, "x_mean": 0.033, "y_mean": 0.8, "noise_var": 3.6e-4}
_FILE_KINDS = ("cbcl", "npy", "csv")


def _spec(default=MISSING, *, default_factory=MISSING, gt=None, ge=None, le=None, choices=None, doc=""):
    """A dataclass field carrying its range/choices for :func:`from_dict`."""
    meta = {"gt": gt, "ge": ge, "le": le, "choices": choices, "doc": doc}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# --------------------------------------------------------------------------------------
# The dataclasses
# --------------------------------------------------------------------------------------


@dataclass
class SplitConfig:
    """How the columns of ``Z`` are split over the agents.

    ``counts`` (one per agent) fixes the split; else ``lo``/``hi`` bound uniform
    draws (:func:`ppdnmf_torch.data.split_counts`); all None splits equally.
    """

    lo: int | None = _spec(None, ge=1)
    hi: int | None = _spec(None, ge=1)
    counts: list[int] | None = _spec(None, ge=1)


@dataclass
class DataConfig:
    """The data matrix ``Z``.

    ``L, M, K, x_mean, y_mean, noise_var`` apply to ``kind="synthetic"`` only (None
    there means the paper's value, :data:`SYNTHETIC_DEFAULTS`); ``path`` to the file
    kinds; ``delimiter`` to ``csv`` (None: ``","``).
    """

    kind: str = _spec("synthetic", choices=DATA_KINDS)
    path: str | None = None
    L: int | None = _spec(None, ge=1)
    M: int | None = _spec(None, ge=1)
    K: int | None = _spec(None, ge=1)
    x_mean: float | None = _spec(None, gt=0)
    y_mean: float | None = _spec(None, gt=0)
    noise_var: float | None = _spec(None, ge=0)
    delimiter: str | None = None
    negative: str = _spec("error", choices=NEGATIVE_MODES)
    # divide Z by its largest absolute entry before the run (mu, eta and g_max are absolute:
    # data far from unit scale can leave the factors at zero or at their start)
    normalize: bool = False
    image_shape: list[int] | None = _spec(None, ge=1)
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

    kind: str = _spec("random", choices=GRAPH_KINDS)
    avg_degree: float | None = _spec(None, gt=0)
    rows: int | None = _spec(None, ge=1)
    cols: int | None = _spec(None, ge=1)
    p: float | None = _spec(None, gt=0, le=1)
    radius: float | None = _spec(None, gt=0)
    max_tries: int | None = _spec(None, ge=1)
    path: str | None = None
    min_degree: int | None = _spec(None, ge=1)

    def params(self) -> dict:
        """The keyword arguments of ``make_graph`` for this kind (nulls left out)."""
        return {k: getattr(self, k) for k in GRAPH_PARAMS[self.kind] if getattr(self, k) is not None}


@dataclass
class SolverConfig:
    """Algorithm 1's parameters (the arguments of :func:`ppdnmf_torch.fit`)."""

    rank: int = _spec(5, ge=1)
    mu: float = _spec(0.1, gt=0)
    eta: float = _spec(1.0, gt=0)
    g_max: float | list[float] = _spec(0.033, gt=0)
    bcd_iters: int = _spec(1000, ge=1)
    x_iters: int = _spec(30, ge=1)
    y_iters: int = _spec(30, ge=1)
    tol: float = _spec(1e-4, ge=0)
    admm_tol: float | None = _spec(0.0, ge=0)
    penalty: str = _spec("random", choices=PENALTY_MODES)
    consensus_form: str = _spec("derived", choices=CONSENSUS_FORMS)
    # compile the ADMM iterations with TorchInductor (faster for long runs; see fit)
    fuse: bool = False
    # the caps g_i: agreed (one cap for every edge, grown by a rule all agents agree on) |
    # adaptive (each agent's consensus-seeking rule) | paper (fixed); see fit
    penalty_schedule: str = _spec(_FIT_DEFAULTS["penalty_schedule"], choices=PENALTY_SCHEDULES)
    # the start X_0: ones (the paper) | random (drawn from a seed every agent shares)
    init: str = _spec(_FIT_DEFAULTS["init"], choices=INITS)
    # seed of init=random (null: the run's seed)
    init_seed: int | None = _spec(None, ge=0)
    # the Y-step: admm (eqs. 12-14) | hals (y_iters HALS sweeps)
    y_solver: str = _spec(_FIT_DEFAULTS["y_solver"], choices=Y_SOLVERS)
    # the X-step's solver: the paper's ADMM, or the incremental consensus engine (see fit)
    x_solver: str = _spec("admm", choices=X_SOLVERS)
    x_rho: float = _spec(0.1, gt=0)
    x_gamma_spread: float = _spec(0.05, ge=0)
    x_sigma: float = _spec(1e-3, ge=0)
    x_rounds: int | None = _spec(None, ge=1)
    x_start: list[float] | None = None
    x_walk: str = _spec("auto", choices=X_WALKS)


#: exchange settings that only the Python API takes (pre-made keys, test hooks, transcripts)
API_ONLY_EXCHANGE_KEYS = ("keypairs", "pool_audit", "record_transcript")


def exchange_keys(kind: str) -> tuple:
    """The config keys of exchange kind ``kind`` besides ``kind`` (its spec's settings, less
    :data:`API_ONLY_EXCHANGE_KEYS`); ``conf/exchange/<kind>.yaml`` holds exactly these."""
    return tuple(k for k in SPECS[kind].keys() if k not in API_ONLY_EXCHANGE_KEYS)


def exchange_to_dict(spec: ExchangeSpec) -> dict:
    """The config section of an exchange spec: ``kind`` and its config keys."""
    return {"kind": spec.kind, **{k: getattr(spec, k) for k in exchange_keys(spec.kind)}}


def _build_exchange(data, prefix: str = "exchange") -> ExchangeSpec:
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
    hints = _hints(cls)
    values = {}
    for k, v in d.items():
        if k not in keys:
            raise ConfigError(f"{prefix}.{k}: does not apply to {prefix}.kind={kind} "
                              f"(its keys: {', '.join(keys) if keys else 'none'})")
        values[k] = _coerce(f"{prefix}.{k}", v, hints[k], {})
    try:
        return cls(**values)
    except PPDNMFError as exc:
        raise exc.within(prefix) from None


@dataclass
class LoggerConfig:
    """TensorBoard logging."""

    kind: str = _spec("tensorboard", choices=LOGGER_KINDS)
    images: bool = True
    n_samples: int = _spec(2, ge=1)
    image_scale: int = _spec(4, ge=1, le=32)
    flush_secs: int = _spec(30, ge=1)


def _paper_synthetic_data() -> DataConfig:
    return DataConfig(kind="synthetic", negative="allow", split=SplitConfig(lo=4, hi=40), **SYNTHETIC_DEFAULTS)


def _paper_solver() -> SolverConfig:
    """The solver of the paper's experiments: the library's defaults but the paper's caps, start,
    Y-step and fixed 100 BCD iterations."""
    return SolverConfig(bcd_iters=100, **_PAPER_SETTINGS)


@dataclass
class RunConfig:
    """One run of the app: the paper's synthetic experiment by default (as ``ppdnmf`` with no
    arguments, which composes ``experiment=paper_synthetic``)."""

    # the app's task that runs this config (conf/task/ppdnmf.yaml; ppdnmf_torch.app.tasks)
    task: str = _spec("ppdnmf", choices=("ppdnmf",))
    name: str = "custom"
    seed: int = _spec(0, ge=0)
    device: str = "auto"
    dtype: str = _spec("float64", choices=DTYPES)
    centralized: bool = True
    n_agents: int = _spec(10, ge=1)
    progress: bool = True
    # off a terminal: seconds between two progress lines in the log
    progress_interval: float = _spec(5.0, gt=0)
    # CPU threads of torch's intra-op pool (None: the package's default, threads.default_threads)
    threads: int | None = _spec(None, ge=1)
    # independent trials (seeds seed, seed + 1, ...) run as one batched computation
    trials: int = _spec(1, ge=1)
    # crash-safe checkpoints in <run dir>/checkpoints every this many BCD iterations (0: only on Ctrl-C)
    checkpoint_every: int = _spec(10, ge=0)
    # keep the checkpoints of a run that finished (default: removed once the outputs are written)
    keep_checkpoints: bool = False
    # a previous run's folder: continue it from its newest checkpoint (its own config is used)
    resume: str | None = None
    data: DataConfig = field(default_factory=_paper_synthetic_data)
    graph: GraphConfig = field(default_factory=lambda: GraphConfig(avg_degree=3.0))
    solver: SolverConfig = field(default_factory=_paper_solver)
    exchange: ExchangeSpec = field(default_factory=PlainSpec)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def validate(self) -> "RunConfig":
        """Check every field and the cross-field rules; returns ``self``.

        Raises
        ------
        ConfigError
            Naming the dotted key of the first bad value.
        """
        _check_dataclass(self, "")
        _check_cross(self)
        return self


# --------------------------------------------------------------------------------------
# Conversion and validation
# --------------------------------------------------------------------------------------


def _key(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _type_name(v) -> str:
    return type(v).__name__


def _hints(cls):
    return typing.get_type_hints(cls)


def _split_optional(tp):
    """``(inner types, nullable)`` of an annotation such as ``int | None``."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = tuple(a for a in args if a is not type(None))
        return inner, len(inner) != len(args)
    return (tp,), False


def _check_range(key, v, meta):
    gt, ge, le = meta.get("gt"), meta.get("ge"), meta.get("le")
    if gt is not None and not v > gt:
        raise ConfigError(f"{key}: must be > {gt:g}, got {v!r}")
    if ge is not None and not v >= ge:
        raise ConfigError(f"{key}: must be >= {ge:g}, got {v!r}")
    if le is not None and not v <= le:
        raise ConfigError(f"{key}: must be <= {le:g}, got {v!r}")


def _coerce_scalar(key, v, tp, meta):
    """Check ``v`` against one scalar type; returns the (possibly converted) value or raises."""
    if tp is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{key}: must be true or false, got {v!r}")
        return v
    if tp is int:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and math.isfinite(v) and v.is_integer():
                v = int(v)
            else:
                raise ConfigError(f"{key}: must be an integer, got {v!r} ({_type_name(v)})")
        _check_range(key, v, meta)
        return v
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ConfigError(f"{key}: must be a number, got {v!r} ({_type_name(v)})")
        if not math.isfinite(v):
            raise ConfigError(f"{key}: must be a finite number, got {v!r}")
        _check_range(key, v, meta)
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ConfigError(f"{key}: must be a string, got {v!r} ({_type_name(v)})")
        choices = meta.get("choices")
        if choices is not None and v not in choices:
            raise ConfigError(f"{key}: unknown value {v!r}; use one of {', '.join(choices)}")
        return v
    raise TypeError(f"unsupported config type {tp!r}")  # programming error, not user input


def _coerce(key, v, tp, meta):
    inner, nullable = _split_optional(tp)
    if v is None:
        if nullable:
            return None
        raise ConfigError(f"{key}: is required (got null)")
    if isinstance(v, (list, tuple)):
        list_types = [t for t in inner if typing.get_origin(t) is list]
        if not list_types:
            raise ConfigError(f"{key}: must be a single value, got a list {list(v)!r}")
        (elem,) = typing.get_args(list_types[0])
        if not v:
            raise ConfigError(f"{key}: the list is empty")
        return [_coerce_scalar(f"{key}[{i}]", x, elem, meta) for i, x in enumerate(v)]
    if isinstance(v, Mapping):
        raise ConfigError(f"{key}: must be a single value, got a mapping")
    scalars = [t for t in inner if typing.get_origin(t) is not list]
    if not scalars:
        raise ConfigError(f"{key}: must be a list, got {v!r}")
    return _coerce_scalar(key, v, scalars[0], meta)


def _build(cls, data, prefix: str):
    if is_dataclass(data) and isinstance(data, cls):
        data = {f.name: getattr(data, f.name) for f in fields(data)}
    if not isinstance(data, Mapping):
        where = prefix or "config"
        raise ConfigError(f"{where}: must be a mapping of keys to values, got {data!r}")
    names = [f.name for f in fields(cls)]
    unknown = [k for k in data if k not in names]
    if unknown:
        raise ConfigError(
            f"{_key(prefix, str(unknown[0]))}: unknown key; known keys here: {', '.join(names)}"
        )
    hints = _hints(cls)
    kwargs = {}
    for f in fields(cls):
        key = _key(prefix, f.name)
        tp = hints[f.name]
        if tp is ExchangeSpec:
            if f.name in data and data[f.name] is not None:
                kwargs[f.name] = _build_exchange(data[f.name], key)
            continue
        if isinstance(tp, type) and is_dataclass(tp):
            if f.name in data and data[f.name] is not None:
                kwargs[f.name] = _build(tp, data[f.name], key)
            continue
        if f.name in data:
            kwargs[f.name] = _coerce(key, data[f.name], tp, f.metadata)
    return cls(**kwargs)


def _check_dataclass(obj, prefix: str):
    """Re-check the values of an already built dataclass (types, ranges, choices)."""
    hints = _hints(type(obj))
    for f in fields(obj):
        key = _key(prefix, f.name)
        v = getattr(obj, f.name)
        tp = hints[f.name]
        if tp is ExchangeSpec:
            setattr(obj, f.name, _build_exchange(v, key))
            continue
        if isinstance(tp, type) and is_dataclass(tp):
            if not isinstance(v, tp):
                raise ConfigError(f"{key}: must be a {tp.__name__}, got {_type_name(v)}")
            _check_dataclass(v, key)
        else:
            setattr(obj, f.name, _coerce(key, v, tp, f.metadata))


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
    if cfg.solver.x_start is not None and len(cfg.solver.x_start) != 2:
        raise ConfigError(f"solver.x_start: expected [low, high] or null, got {cfg.solver.x_start!r}")
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
    for k in _GRAPH_REQUIRED.get(g.kind, ()):
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
        raise ConfigError(f"config: must be a mapping of keys to values, got {_type_name(d)}")
    d = {k: v for k, v in d.items() if k != "hydra"}
    if isinstance(d.get("graph"), Mapping) and d["graph"].get("kind") in _GRAPH_ALIASES:
        d["graph"] = dict(d["graph"], kind=_GRAPH_ALIASES[d["graph"]["kind"]])
    cfg = _build(RunConfig, d, "")
    _check_cross(cfg)
    return cfg


def to_dict(cfg: RunConfig) -> dict:
    """Plain nested dict of a :class:`RunConfig` (YAML/JSON-serialisable)."""
    d = asdict(cfg)
    d["exchange"] = exchange_to_dict(cfg.exchange)
    return d
