"""The paper's experiments (Sec. IV) as batched trials: :func:`run_experiment`.

An experiment is a :class:`~ppdnmf_torch.models.ppdnmf.config.RunConfig`, the same typed config the CLI
runs: the paper's two setups are the presets :data:`PAPER_EXPERIMENTS` (``conf/experiment/``
composes to the same values; a test checks it), with ``incremental_*`` beside them: the same
setups with the incremental X-step (``x_solver="pi_admm"``). Each trial has its own data draw, graph,
column split and penalty draws, all derived from one integer seed (trial ``t`` of a run
with ``seed=s`` uses ``s + t``), exactly as a CLI run with ``seed=s + t`` builds them
(:func:`~ppdnmf_torch.app.runner.build_inputs`). With ``trials=1`` a run is the single run of
the CLI with the same seed.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ... import data as data_mod
from ..._utils import resolve_device, resolve_dtype
from .api import fit_trials
from .config import (OPTION_DEFAULTS as _O, PAPER_SETTINGS, SYNTHETIC_DEFAULTS, X_SOLVER_KEYS, DataConfig,
                     FitOptions, GraphConfig, RunConfig, SolverConfig, SplitConfig, from_dict, to_dict)
from ...errors import ConfigError
from ...exchange import PlainSpec, exchange_spec
from ...graph import complete
from .inputs import build_graph, load_data, make_split
from .problem import MAX_SEED, as_seed
from ...specs import check_value
from .result import TrialsResult
from .memory import check_run

__all__ = ["PAPER_EXPERIMENTS", "ExperimentResult", "make_trial", "run_experiment", "CBCL_ENV", "default_cbcl_path"]

#: the environment variable that names the CBCL file when no path is given (as in the CLI)
CBCL_ENV = "PPDNMF_CBCL"


def default_cbcl_path() -> str | None:
    """The CBCL file named by ``$PPDNMF_CBCL``, or None: there is no default path (the error
    that follows says where to get the file)."""
    return os.environ.get(CBCL_ENV) or None


#: The paper's parameters (Sec. IV) as run configs; ``conf/experiment/*.yaml`` compose to the
#: same values (tests/test_experiments.py checks that they agree).
PAPER_EXPERIMENTS = {
    "paper_synthetic": RunConfig(
        name="paper_synthetic", n_agents=10, graph=GraphConfig(kind="random", avg_degree=3.0),
        data=DataConfig(kind="synthetic", negative="allow", split=SplitConfig(lo=4, hi=40), **SYNTHETIC_DEFAULTS),
        solver=SolverConfig(rank=5, mu=0.1, eta=1.0, g_max=0.033, bcd_iters=100, x_iters=30, y_iters=30,
                            **PAPER_SETTINGS),
        exchange=PlainSpec(),  # the paper's schedule draws a penalty per edge: not a plain sum
    ),
    "paper_cbcl": RunConfig(
        name="paper_cbcl", n_agents=10, graph=GraphConfig(kind="random", avg_degree=3.0),
        data=DataConfig(kind="cbcl", path=None, negative="error", image_shape=[19, 19],
                        split=SplitConfig(lo=224, hi=245)),
        solver=SolverConfig(rank=49, mu=2.0, eta=2.0, g_max=0.05, bcd_iters=100, x_iters=30, y_iters=30,
                            **PAPER_SETTINGS),
        exchange=PlainSpec(),
    ),
}
# The same setups with the X-step of the privacy-preserving incremental ADMM (arXiv 2003.10615,
# PI-ADMM1; docs/INCREMENTAL.md): one token on a Hamiltonian cycle (or a relaying closed walk),
# 30 rounds per X-step (the ADMM X-step's local work), rho = 0.1 (a sweep on both data sets),
# gamma in [0.5, 1.5]; exchange plain (nothing else is sent).
for _name in ("synthetic", "cbcl"):
    _base = PAPER_EXPERIMENTS[f"paper_{_name}"]
    PAPER_EXPERIMENTS[f"incremental_{_name}"] = dataclasses.replace(
        _base, name=f"incremental_{_name}",
        solver=dataclasses.replace(_base.solver, x_solver="pi_admm", x_rho=0.1, x_gamma_spread=0.05))

_SOLVER_KEYS = tuple(f.name for f in dataclasses.fields(SolverConfig))
_EXCHANGE_KEYS = ("exchange", "protocol", "n_max", "key_bits", "g_bits")
_OTHER_KEYS = ("n_agents", "avg_degree", "graph", "columns", "data_path", "exchange_options")


def make_trial(cfg: RunConfig, seed: int, Z=None):
    """Data blocks and graph of one trial: what a CLI run of ``cfg`` with ``seed`` builds.

    Parameters
    ----------
    cfg : RunConfig
        An entry of :data:`PAPER_EXPERIMENTS`, or any run config.
    seed : int
        The trial's seed: data draw, column split and graph all derive from it.
    Z : Tensor (L, M), optional
        A fixed data matrix (CBCL), loaded once for all trials.

    Returns
    -------
    blocks : list of N Tensors (L, M_i)
    graph : Graph
    """
    trial = dataclasses.replace(cfg, seed=int(seed))
    if Z is None:
        Z = load_data(trial)[0]
    counts = make_split(trial, Z.shape[1])
    return data_mod.split_columns(Z, counts), build_graph(trial)


@dataclass
class ExperimentResult:
    """What :func:`run_experiment` returns.

    Attributes
    ----------
    name : str
    history : dict of numpy arrays
        ``nmse``, ``consensus`` (and every other solver metric) of shape
        ``(bcd_iters, T)``, plus ``centralized_nmse`` ``(bcd_iters, T)`` when the
        centralized baseline ran.
    distributed : TrialsResult
    centralized : TrialsResult or None
    config : RunConfig
        The resolved experiment.
    seconds : dict
        Wall time of the distributed and centralized runs.
    """

    name: str
    history: dict
    distributed: TrialsResult
    centralized: TrialsResult | None
    config: RunConfig
    seconds: dict = field(default_factory=dict)

    @property
    def n_trials(self) -> int:
        return self.distributed.n_trials

    def summary(self) -> dict:
        """Mean and standard deviation over trials of the final NMSE and consensus error."""
        out = {}
        for key in ("nmse", "consensus", "centralized_nmse"):
            if key in self.history:
                last = self.history[key][-1]
                out[key] = {"mean": float(last.mean()), "std": float(last.std(ddof=1)) if last.size > 1 else 0.0,
                            "min": float(last.min()), "max": float(last.max())}
        return out


def _resolve(experiment, overrides: dict) -> RunConfig:
    """The experiment's run config with ``overrides`` applied (the exchange's as its spec:
    switching ``exchange`` to another kind starts from that kind's defaults)."""
    check_value("name", experiment, str | RunConfig)
    if isinstance(experiment, RunConfig):
        cfg = copy.deepcopy(experiment)
    elif experiment in PAPER_EXPERIMENTS:
        cfg = copy.deepcopy(PAPER_EXPERIMENTS[experiment])
    else:
        raise ConfigError(f"name: unknown experiment {experiment!r}; use one of {sorted(PAPER_EXPERIMENTS)} "
                          "or a RunConfig")
    solver_keys = {k: v for k, v in overrides.items() if k in _SOLVER_KEYS}
    if solver_keys:  # the spec's rules, strictly (a config's text values are converted; these are not)
        cfg.solver = dataclasses.replace(cfg.solver, **solver_keys)
    FitOptions(**{k: v for k, v in overrides.items() if k in _EXCHANGE_KEYS or k == "exchange_options"})
    d = to_dict(cfg)
    flat, options = {}, {}
    for key, value in overrides.items():
        if key in _SOLVER_KEYS:
            continue
        elif key in _EXCHANGE_KEYS:
            flat[key] = value
        elif key == "exchange_options":
            options = dict(value or {})
        elif key == "n_agents":
            d["n_agents"] = value
        elif key == "avg_degree":
            d["graph"]["avg_degree"] = value
        elif key == "graph":
            d["graph"] = dict(value)
        elif key == "columns":
            d["data"]["split"] = ({"lo": None, "hi": None, "counts": None} if value is None
                                  else {"lo": value[0], "hi": value[1], "counts": None})
        elif key == "data_path":
            d["data"]["path"] = value
        else:
            raise ConfigError(f"{key}: not an option of run_experiment; use one of "
                              f"{sorted(set(_SOLVER_KEYS) | set(_EXCHANGE_KEYS) | set(_OTHER_KEYS))}")
    if d["data"]["kind"] == "cbcl" and "data_path" not in overrides and d["data"]["path"] is None:
        # not given: the environment's, as the CLI's default does
        d["data"]["path"] = default_cbcl_path()
    kind = flat.pop("exchange", cfg.exchange.kind)
    base = {k: v for k, v in d.pop("exchange").items() if k != "kind"} if kind == cfg.exchange.kind else {}
    spec = exchange_spec(kind, **flat, options={**base, **options})
    resolved = from_dict(d)
    resolved.exchange = spec
    return resolved


def run_experiment(name, trials: int = 1, seed: int = _O.seed, *, centralized: bool = True,
                   device=_O.device, dtype=_O.dtype, callback=_O.callback, threads=_O.threads,
                   central_callback=None, **overrides) -> ExperimentResult:
    """Run an experiment as ``trials`` batched independent trials.

    Parameters
    ----------
    name : {"paper_synthetic", "paper_cbcl"} or RunConfig
        A preset of :data:`PAPER_EXPERIMENTS`, or a run config of the CLI's kind (its data,
        split, graph, solver and exchange sections are used; ``seed``, ``device``, ``dtype``
        and ``centralized`` come from the keywords here).
    trials : int
        ``T``; all trials run as one batched computation.
    seed : int
        Trial ``t`` uses seed ``seed + t`` for its data, graph, split and penalties.
    centralized : bool
        Also run the centralized baseline (one agent, whole matrix) on every trial's data
        (batched without trial alignment: it equals single centralized runs up to rounding;
        the distributed trials are bit-identical to single runs).
    device, dtype
        As in :func:`ppdnmf_torch.fit`.
    callback : callable, optional
        Receives the distributed run's :class:`~ppdnmf_torch.models.ppdnmf.solver.IterationInfo`.
    threads : int, optional
        As in :func:`ppdnmf_torch.fit` (None: the package's default).
    central_callback : callable, optional
        Receives the centralized baseline's :class:`~ppdnmf_torch.models.ppdnmf.solver.IterationInfo`
        (its trials batched, as ``callback``'s).
    **overrides
        The solver keywords of :func:`ppdnmf_torch.fit` (``rank``, ``mu``, ``eta``,
        ``g_max``, ``bcd_iters``, ``x_iters``, ``y_iters``, ``tol``, ``admm_tol``,
        ``penalty``, ``consensus_form``, ``fuse``, ``penalty_schedule``, ``init``,
        ``init_seed``, ``y_solver``, ...; the presets keep the paper's ``"paper"``, ``"ones"``,
        ``"admm"``), its exchange keywords (``exchange``, ``protocol``, ``n_max``,
        ``key_bits``, ``g_bits``, ``exchange_options``); and ``n_agents``, ``avg_degree``,
        ``graph`` (a graph section, e.g. ``{"kind": "ring"}``), ``columns=(lo, hi)``,
        ``data_path``. Others (``negative``, checkpoints) raise
        :class:`~ppdnmf_torch.ConfigError`.

    Returns
    -------
    ExperimentResult
    """
    check_value("trials", trials, int, {"ge": 1})
    seed = as_seed(seed)
    check_value("centralized", centralized, bool)
    for key, fn in (("callback", callback), ("central_callback", central_callback)):
        check_value(key, fn, Callable | None)
    cfg = _resolve(name, overrides)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    check_run(cfg, trials=trials, device=device, dtype=dtype)
    seeds = [seed + t for t in range(trials)]
    if seeds[-1] > MAX_SEED:
        raise ConfigError(f"seed: trial seeds run from seed to seed + trials - 1 = {seeds[-1]}, above 2**63 - 1")
    # a file's matrix is the same in every trial: loaded (and normalized) once
    Z_fixed = load_data(cfg)[0] if cfg.data.kind != "synthetic" else None
    pairs = [make_trial(cfg, s, Z_fixed) for s in seeds]
    block_lists, graphs = [p[0] for p in pairs], [p[1] for p in pairs]
    solver = {f.name: getattr(cfg.solver, f.name) for f in dataclasses.fields(SolverConfig)}  # the spec as it is
    rank, init_seed = solver.pop("rank"), solver.pop("init_seed")
    # a CLI run with seed s + t and a given init_seed starts every trial from that seed
    common = dict(seeds=seeds, init_seeds=None if init_seed is None else [init_seed] * trials,
                  negative=cfg.data.negative, device=device, dtype=dtype, threads=threads, **solver)
    t0 = time.perf_counter()
    dist = fit_trials(block_lists, graphs, rank, exchange=cfg.exchange, callback=callback, **common)
    seconds = {"distributed": time.perf_counter() - t0}
    history = dict(dist.history)
    cent = None
    if centralized:
        whole = [[torch.cat(b, dim=1)] for b in block_lists]
        t0 = time.perf_counter()
        # one agent per trial would be padded to 8 to align the trials (8x the work): the
        # baseline runs unaligned, equal to single centralized runs up to rounding
        # the ADMM X-step: one reference curve whatever the distributed X-step
        cent_kw = {k: v for k, v in common.items() if k not in X_SOLVER_KEYS}
        cent = fit_trials(whole, [complete(1)] * trials, rank, align_trials=False, callback=central_callback,
                          exchange="plain", **cent_kw)  # one agent: nothing is exchanged
        seconds["centralized"] = time.perf_counter() - t0
        history["centralized_nmse"] = cent.history["nmse"]
    return ExperimentResult(name=cfg.name, history=history, distributed=dist, centralized=cent, config=cfg,
                            seconds=seconds)
