"""The paper's experiments (Sec. IV) as batched trials: :func:`run_experiment`.

Each trial has its own data draw, graph, column split and penalty draws, all derived
from one integer seed (trial ``t`` of a run with ``seed=s`` uses ``s + t``). With
``trials=1`` a run is exactly the single run of the CLI with the same seed.
"""
from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field

import torch

from . import data as data_mod
from ._utils import ConfigError, resolve_device, resolve_dtype
from .api import TrialsResult, fit_trials
from .graph import make_graph

__all__ = ["PAPER_EXPERIMENTS", "ExperimentResult", "make_trial", "run_experiment", "DEFAULT_CBCL_PATH"]

#: where the tests and scripts look for the CBCL file unless told otherwise
DEFAULT_CBCL_PATH = "../shared/data/cbcl_faces_train.mat"

#: The paper's parameters (Sec. IV). ``conf/experiment/*.yaml`` carry the same values
#: (tests/test_config.py checks that they agree).
PAPER_EXPERIMENTS = {
    "paper_synthetic": {
        "n_agents": 10,
        "graph": {"kind": "random", "avg_degree": 3.0},
        "data": {"kind": "synthetic", "L": 30, "M": 200, "K": 5, "x_mean": 0.033, "y_mean": 0.8,
                 "noise_var": 3.6e-4, "negative": "allow"},
        "columns": {"lo": 4, "hi": 40},
        "solver": {"rank": 5, "mu": 0.1, "eta": 1.0, "g_max": 0.033, "bcd_iters": 100, "x_iters": 30,
                   "y_iters": 30,
                   "penalty_schedule": "paper", "init": "ones", "y_solver": "admm"},
    },
    "paper_cbcl": {
        "n_agents": 10,
        "graph": {"kind": "random", "avg_degree": 3.0},
        "data": {"kind": "cbcl", "path": DEFAULT_CBCL_PATH, "negative": "error"},
        "columns": {"lo": 224, "hi": 245},
        "solver": {"rank": 49, "mu": 2.0, "eta": 2.0, "g_max": 0.05, "bcd_iters": 100, "x_iters": 30,
                   "y_iters": 30,
                   "penalty_schedule": "paper", "init": "ones", "y_solver": "admm"},
    },
}

_FIT_KEYS = {"rank", "mu", "eta", "g_max", "bcd_iters", "x_iters", "y_iters", "tol", "admm_tol", "exchange",
             "protocol", "n_max", "key_bits", "g_bits", "penalty", "consensus_form", "exchange_options", "fuse",
             "penalty_schedule", "init", "y_solver"}


def make_trial(spec: dict, seed: int, Z=None):
    """Data blocks and graph of one trial.

    Parameters
    ----------
    spec : dict
        An entry of :data:`PAPER_EXPERIMENTS` (or the same layout).
    seed : int
        The trial's seed: data draw, column split and graph all derive from it.
    Z : Tensor (L, M), optional
        A fixed data matrix (CBCL), loaded once for all trials.

    Returns
    -------
    blocks : list of N Tensors (L, M_i)
    graph : Graph
    """
    n = spec["n_agents"]
    d = spec["data"]
    if Z is None:
        if d["kind"] != "synthetic":
            raise ConfigError(f"data.kind: {d['kind']!r} needs a loaded matrix Z")
        Z = data_mod.synthetic(L=d["L"], M=d["M"], K=d["K"], x_mean=d["x_mean"], y_mean=d["y_mean"],
                               noise_var=d["noise_var"], seed=seed).Z
    cols = spec.get("columns") or {}
    counts = data_mod.split_counts(Z.shape[1], n, cols.get("lo"), cols.get("hi"), seed=seed)
    blocks = data_mod.split_columns(Z, counts)
    gspec = dict(spec["graph"])
    kind = gspec.pop("kind")
    graph = make_graph(kind, n, seed=seed, **gspec)
    return blocks, graph


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
    spec : dict
        The resolved experiment parameters.
    seconds : dict
        Wall time of the distributed and centralized runs.
    """

    name: str
    history: dict
    distributed: TrialsResult
    centralized: TrialsResult | None
    spec: dict
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


def _resolve_spec(name: str, overrides: dict) -> tuple[dict, dict]:
    if name not in PAPER_EXPERIMENTS:
        raise ConfigError(f"name: unknown experiment {name!r}; use one of {sorted(PAPER_EXPERIMENTS)}")
    spec = copy.deepcopy(PAPER_EXPERIMENTS[name])
    fit_kw = dict(spec["solver"])
    for key, value in overrides.items():
        if key in _FIT_KEYS:
            fit_kw[key] = value
        elif key == "n_agents":
            spec["n_agents"] = value
        elif key in ("avg_degree",):
            spec["graph"][key] = value
        elif key == "graph":
            spec["graph"] = dict(value)
        elif key == "columns":
            spec["columns"] = None if value is None else {"lo": value[0], "hi": value[1]}
        elif key in ("data_path", "path"):
            spec["data"]["path"] = value
            spec["data"]["path_given"] = True
        else:
            raise ConfigError(
                f"{key}: not an option of run_experiment; use one of "
                f"{sorted(_FIT_KEYS | {'n_agents', 'avg_degree', 'graph', 'columns', 'data_path'})}"
            )
    spec["solver"] = fit_kw
    return spec, fit_kw


def run_experiment(name: str, trials: int = 1, seed: int = 0, *, centralized: bool = True,
                   device="auto", dtype=torch.float64, callback=None, **overrides) -> ExperimentResult:
    """Run one of the paper's experiments as ``trials`` batched independent trials.

    Parameters
    ----------
    name : {"paper_synthetic", "paper_cbcl"}
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
        Receives the distributed run's :class:`~ppdnmf_torch.solver.IterationInfo`.
    **overrides
        These keywords of :func:`ppdnmf_torch.fit`: ``rank``, ``mu``, ``eta``, ``g_max``,
        ``bcd_iters``, ``x_iters``, ``y_iters``, ``tol``, ``admm_tol``, ``exchange``,
        ``protocol``, ``n_max``, ``key_bits``, ``g_bits``, ``penalty``, ``consensus_form``,
        ``exchange_options``, ``fuse``, ``penalty_schedule``, ``init``, ``y_solver`` (the
        presets keep the paper's ``"paper"``, ``"ones"``, ``"admm"``; trial ``t``'s seeded start
        uses its seed ``seed + t``); and ``n_agents``, ``avg_degree``, ``graph`` (a graph
        spec dict, e.g. ``{"kind": "ring"}``), ``columns=(lo, hi)``, ``data_path``. Others
        (``negative``, checkpoints) raise :class:`~ppdnmf_torch.ConfigError`.

    Returns
    -------
    ExperimentResult
    """
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise ConfigError(f"trials: must be an integer >= 1, got {trials!r}")
    spec, fit_kw = _resolve_spec(name, overrides)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype)
    seeds = [int(seed) + t for t in range(trials)]
    Z_fixed = None
    if spec["data"]["kind"] == "cbcl":
        path = spec["data"]["path"]
        if not spec["data"].get("path_given"):  # not given: the environment's, as the CLI's default does
            path = os.environ.get("PPDNMF_CBCL", path)
        Z_fixed = data_mod.load_cbcl(path)
    pairs = [make_trial(spec, s, Z_fixed) for s in seeds]
    block_lists = [p[0] for p in pairs]
    graphs = [p[1] for p in pairs]
    negative = spec["data"].get("negative", "error")
    rank = fit_kw.pop("rank")
    t0 = time.perf_counter()
    dist = fit_trials(block_lists, graphs, rank, seeds=seeds, negative=negative, device=device, dtype=dtype,
                      callback=callback, **fit_kw)
    seconds = {"distributed": time.perf_counter() - t0}
    history = dict(dist.history)
    cent = None
    if centralized:
        from .graph import complete

        central_kw = {k: v for k, v in fit_kw.items()
                      if k not in ("exchange", "protocol", "n_max", "key_bits", "g_bits", "exchange_options")}
        whole = [[torch.cat(b, dim=1)] for b in block_lists]
        t0 = time.perf_counter()
        # one agent per trial would be padded to 8 to align the trials (8x the work): the
        # baseline runs unaligned, equal to single centralized runs up to rounding
        cent = fit_trials(whole, [complete(1)] * trials, rank, seeds=seeds, negative=negative, device=device,
                          dtype=dtype, align_trials=False, **central_kw)
        seconds["centralized"] = time.perf_counter() - t0
        history["centralized_nmse"] = cent.history["nmse"]
    fit_kw["rank"] = rank
    return ExperimentResult(name=name, history=history, distributed=dist, centralized=cent, spec=spec,
                            seconds=seconds)
