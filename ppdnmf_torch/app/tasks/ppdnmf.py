"""The PPDNMF task: how the app runs :mod:`ppdnmf_torch.models.ppdnmf` (:class:`PPDNMFTask`).

1. :func:`~ppdnmf_torch.models.ppdnmf.inputs.build_inputs`: the data, the column split, the
   graph, the device and dtype;
2. :func:`fit_run`: the centralized baseline and the distributed fit, reporting to one
   :class:`~ppdnmf_torch.app.loggers.RunLogger` (TensorBoard or none) and to
   :class:`~ppdnmf_torch.app.progress.Progress` (a bar on a terminal, log lines elsewhere);
3. :func:`write_outputs`: the files of :mod:`ppdnmf_torch.app.outputs` and the logger's end.

With ``trials > 1`` the run is :func:`~ppdnmf_torch.models.ppdnmf.experiments.run_experiment`'s
batched trials instead (:func:`run_trials`). The folder, its lock, ``config.yaml``,
``summary.json`` and the checkpoints' removal are the runner's (:mod:`ppdnmf_torch.app.runner`).

Nothing here prints: the progress and the Paillier estimate go to the logger
``ppdnmf_torch`` (the CLI's Hydra handlers show and keep them). Errors name the config's keys
(``exchange.g_bits``, not the API's ``g_bits``): :data:`CONFIG_KEYS`, applied by the runner.
"""
from __future__ import annotations

import io
import json
import logging
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from ..._utils import resolve_device
from ...errors import ConfigError
from ...diagnostics import degenerate_reasons, x_sketch
from ...exchange.spec import SPECS
from ...checkpoint import CheckpointError, checkpoint_iteration, latest_checkpoint
from ...models.ppdnmf.api import fit, fit_centralized
from ...models.ppdnmf.config import X_SOLVER_KEYS, RunConfig, SolverConfig, from_dict, to_dict
from ...models.ppdnmf.result import FitResult
from ...models.ppdnmf.inputs import RunInputs, build_graph, build_inputs, load_data
from ...driver import RunInterrupted
from ..costs import format_estimate, paillier_estimate, seconds_per_iteration
from ..loggers import RunLogger
from ..outputs import (dataset_name, format_summary, run_name, summary_of, trials_summary, write_factors,
                       write_histories, write_trials)
from ..progress import Progress
from .base import Task

__all__ = ["TASK", "PPDNMFTask", "fit_run", "write_outputs", "run_trials", "RunFits", "CONFIG_KEYS"]

log = logging.getLogger("ppdnmf_torch.runner")

#: the API's parameter names and the config keys they come from
CONFIG_KEYS = {
    **{f.name: f"solver.{f.name}" for f in fields(SolverConfig)},
    **{k: f"exchange.{k}" for spec in SPECS.values() for k in spec.keys()},
    "exchange": "exchange.kind", "Z": "data", "negative": "data.negative", "columns": "data.split.counts",
    "adjacency": "graph",
}


# --------------------------------------------------------------------------------------
# 2. The fits
# --------------------------------------------------------------------------------------


@dataclass
class RunFits:
    """The distributed result, the centralized baseline's (or None), their wall times, and what
    is degenerate about the distributed result (:func:`~ppdnmf_torch.diagnostics.degenerate_reasons`)."""

    result: FitResult
    central: FitResult | None
    seconds: dict = field(default_factory=dict)
    degenerate: list = field(default_factory=list)


def _solver_kwargs(cfg: RunConfig, inputs: RunInputs) -> dict:
    """The keywords of ``fit`` (and the centralized baseline's, and ``fit_rank``'s) from the
    config: the solver section as it is (its spec is ``fit``'s), but ``rank``, ``g_max`` and the
    incremental X-step's settings (:func:`_x_solver_kwargs`), and the run's keys."""
    skip = ("rank", "g_max", *X_SOLVER_KEYS)
    kw = {f.name: getattr(cfg.solver, f.name) for f in fields(SolverConfig) if f.name not in skip}
    kw.update(negative=cfg.data.negative, seed=cfg.seed, device=inputs.device, dtype=inputs.dtype,
              threads=cfg.threads)
    return kw


def _x_solver_kwargs(cfg: RunConfig) -> dict:
    """The distributed fit's X-step solver (the centralized baseline keeps the ADMM X-step: one
    reference curve whatever the distributed X-step)."""
    return {k: getattr(cfg.solver, k) for k in X_SOLVER_KEYS}


def _fit_centralized(cfg: RunConfig, inputs: RunInputs, common: dict, show: bool) -> FitResult:
    s = cfg.solver
    # one agent has no neighbours: its penalty cap never enters the updates
    g_c = s.g_max if isinstance(s.g_max, float) else float(s.g_max[0])
    with Progress(show, s.bcd_iters, "centralized", interval=cfg.progress_interval) as bar:
        try:
            return fit_centralized(inputs.Z, s.rank, g_max=g_c, callback=lambda info: bar.update(
                info.iteration, {"nmse": info.metrics["nmse"]}), **common)
        except RunInterrupted as exc:
            # the baseline keeps no checkpoints: say so, rather than "checkpoint: None"
            raise KeyboardInterrupt(
                f"during the centralized baseline (after its BCD iteration {exc.done}), before the "
                "distributed run started: there is nothing to resume; run again (centralized=false skips "
                "the baseline)"
            ) from None


def _announce(cfg: RunConfig, inputs: RunInputs, resumed_at: int) -> float | None:
    """Log what takes time before the first BCD iteration: the Paillier cost, a compilation.
    Returns the Paillier estimate's seconds per BCD iteration (the progress ETA's start), or None."""
    s, e = cfg.solver, cfg.exchange
    per_iteration = None
    if e.kind == "paillier":
        est = paillier_estimate(e, inputs.graph, inputs.Z.shape[0], s.rank, s.x_iters, s.bcd_iters - resumed_at)
        log.info(format_estimate(e, est))
        per_iteration = seconds_per_iteration(est, s.bcd_iters - resumed_at)
    if s.fuse:
        log.info("fuse=true: compiling the solver's iterations with TorchInductor before the first BCD iteration "
                 "(seconds per new problem shape; later runs of the same shape in this process reuse it)")
    return per_iteration


#: the centralized baseline of a run, kept beside its checkpoints so that a resumed run need not
#: fit it again (removed with them)
BASELINE_NAME = "centralized.pt"
#: the config keys that do not change the baseline (how the run reports and checkpoints)
_NOT_BASELINE = ("progress", "progress_interval", "threads", "checkpoint_every", "keep_checkpoints", "resume",
                 "logger", "name")


def _baseline_key(cfg: RunConfig) -> str:
    return json.dumps({k: v for k, v in to_dict(cfg).items() if k not in _NOT_BASELINE}, sort_keys=True, default=str)


def _save_baseline(folder: Path, cfg: RunConfig, central: FitResult, seconds: float) -> None:
    from ...checkpoint import write_atomically

    body = {"key": _baseline_key(cfg), "X": central.X.detach().cpu(), "Y": [y.detach().cpu() for y in central.Y],
            "U": central.U.detach().cpu(), "history": central.history, "columns": list(central.columns),
            "n_iter": int(central.n_iter), "converged": bool(central.converged), "seconds": float(seconds)}
    buf = io.BytesIO()
    torch.save(body, buf)
    write_atomically(str(folder / BASELINE_NAME), lambda fh: fh.write(buf.getvalue()))


def _load_baseline(folder: Path, cfg: RunConfig, inputs: RunInputs):
    """``(FitResult, seconds)`` of the baseline this run saved, or None (none, another config's,
    or unreadable: then it is fitted again)."""
    from ...graph import Graph

    path = folder / BASELINE_NAME
    if not path.is_file():
        return None
    try:
        body = torch.load(path, map_location=inputs.device, weights_only=True)
        if body.get("key") != _baseline_key(cfg):
            return None
        result = FitResult(X=body["X"], Y=list(body["Y"]), U=body["U"], history=body["history"], graph=Graph(1, []),
                           columns=list(body["columns"]), n_iter=int(body["n_iter"]), converged=bool(body["converged"]))
        return result, float(body["seconds"])
    except Exception as exc:  # noqa: BLE001 - a damaged file costs a refit, never the run
        log.warning("the saved centralized baseline %s is not readable (%s): fitting it again", path,
                    type(exc).__name__)
        return None


def fit_run(cfg: RunConfig, inputs: RunInputs, logger: RunLogger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> RunFits:
    """Step 2: the centralized baseline (first, it is fast: its curve is in TensorBoard from the
    start; saved beside the checkpoints, and read back rather than fitted again when the run
    resumes), then the distributed fit with checkpoints in ``out/checkpoints``."""
    s, e = cfg.solver, cfg.exchange
    common = _solver_kwargs(cfg, inputs)
    resumed_at = checkpoint_iteration(latest_checkpoint(resume_from)) if resume_from is not None else 0
    central, seconds = None, {}
    if cfg.centralized:
        saved = _load_baseline(out / "checkpoints", cfg, inputs) if resume_from is not None else None
        if saved is not None:
            central, seconds["centralized"] = saved
            log.info("centralized baseline: read from %s (not fitted again)", out / "checkpoints" / BASELINE_NAME)
        else:
            t0 = time.perf_counter()
            central = _fit_centralized(cfg, inputs, common, show)
            seconds["centralized"] = time.perf_counter() - t0
            if cfg.checkpoint_every:
                _save_baseline(out / "checkpoints", cfg, central, seconds["centralized"])
        logger.centralized(central.history)
    c_hist = central.history.get("nmse", []) if central is not None else []
    per_iteration = _announce(cfg, inputs, resumed_at)
    first = {}
    with Progress(show, s.bcd_iters, f"PPDNMF ({e.kind})", interval=cfg.progress_interval,
                  start=resumed_at, seconds_per_iteration=per_iteration) as bar:

        def cb(info):
            logger.iteration(info, s.x_iters)
            shown = {"nmse": info.metrics["nmse"], "consensus": info.metrics["consensus"]}
            if info.iteration <= len(c_hist):
                shown["central"] = c_hist[info.iteration - 1]
            bar.update(info.iteration, shown)
            if info.iteration == 1:
                first["sketch"] = x_sketch(info.state.X[0])
            return bool(callback(info)) if callback is not None else False

        t0 = time.perf_counter()
        result = fit(inputs.Z, inputs.graph, s.rank, columns=inputs.counts, g_max=s.g_max, exchange=e,
                     callback=cb, checkpoint_dir=out / "checkpoints", checkpoint_every=cfg.checkpoint_every,
                     resume_from=resume_from, **common, **_x_solver_kwargs(cfg))
    seconds["distributed"] = time.perf_counter() - t0
    why = degenerate_reasons(result.X, result.nmse, first.get("sketch"), result.n_iter)
    return RunFits(result, central, seconds, why)


# --------------------------------------------------------------------------------------
# 3. Outputs
# --------------------------------------------------------------------------------------


def _sample_columns(M: int, n: int) -> list[int]:
    """``n`` column indices spread evenly from the first column to the last."""
    n = max(1, min(n, M))
    if n == 1:
        return [0]
    return sorted({round(i * (M - 1) / (n - 1)) for i in range(n)})


#: the Paillier switches logged as hparams
_CRYPTO_SWITCHES = ("fast", "packing", "slot_bits", "precompute", "djn", "djn_exponent_bits", "workers")


def _hparams(cfg: RunConfig, device) -> dict:
    s, e = cfg.solver, cfg.exchange
    hp = {
        "name": run_name(cfg), "dataset": dataset_name(cfg), "seed": cfg.seed, "trials": cfg.trials,
        "n_agents": cfg.n_agents, "data": cfg.data.kind, "graph": cfg.graph.kind, "rank": s.rank, "mu": s.mu,
        "eta": s.eta, "g_max": s.g_max if isinstance(s.g_max, float) else str(s.g_max),
        "bcd_iters": s.bcd_iters, "x_iters": s.x_iters, "y_iters": s.y_iters, "tol": s.tol,
        "penalty": s.penalty, "consensus_form": s.consensus_form, "penalty_schedule": s.penalty_schedule,
        "init": s.init, "y_solver": s.y_solver, "exchange": e.kind,
        "protocol": getattr(e, "protocol", None), "n_max": getattr(e, "n_max", None),
        "key_bits": getattr(e, "key_bits", None), "g_bits": getattr(e, "g_bits", None), "dtype": cfg.dtype,
        "device": str(device), "threads": torch.get_num_threads(), "fuse": s.fuse,
    }
    for k in _CRYPTO_SWITCHES:
        if hasattr(e, k):
            v = getattr(e, k)
            hp[f"exchange.{k}"] = "auto" if v is None and k == "workers" else v
    return hp


def _cost_metrics(costs: dict) -> dict:
    """The exchange's costs as hparams metrics: counts, ``crypto_ciphertext_MB``, seconds."""
    out = {}
    for k, v in (costs or {}).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if k == "ciphertext_bytes":
                out["crypto_ciphertext_MB"] = v / 1e6
            else:
                out[f"crypto_{k}"] = v
    return out


def write_outputs(cfg: RunConfig, inputs: RunInputs, fits: RunFits, out: Path, logger: RunLogger, *,
                  factors: bool = True) -> dict:
    """Step 3: ``factors.pt``, ``history.csv``/``.json`` and the logger's end of run; returns the
    summary (``summary.json`` is written last, by :func:`run`: its presence marks a finished run).
    ``factors=False``: a result without the agents' factors (a distributed run with
    ``share="sums"``): no ``factors.pt`` and no images."""
    result, central = fits.result, fits.central
    if factors:
        write_factors(out / "factors.pt", result, central, inputs.graph, inputs.scale)
    write_histories(out, result, central)
    summary = summary_of(cfg, inputs, fits, out)
    images = None
    if factors and inputs.image_shape is not None and cfg.logger.images:
        images = {"shape": inputs.image_shape, "Z": inputs.Z, "scale": cfg.logger.image_scale,
                  "columns": _sample_columns(inputs.Z.shape[1], cfg.logger.n_samples)}
    metrics = {"nmse_distributed": result.nmse,
               **({"consensus": result.consensus} if result.consensus is not None else {}),
               **({"nmse_worst": result.history["nmse_worst"][-1]} if result.history.get("nmse_worst") else {}),
               "wall_time": fits.seconds["distributed"], **_cost_metrics(result.costs)}
    if central is not None:
        metrics["nmse_centralized"] = central.nmse
    logger.finished(result, central, hparams=_hparams(cfg, inputs.device), metrics=metrics, images=images,
                    config_text="```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```")
    summary["figures"] = _figures(cfg, inputs, result, central, out, factors)
    return summary


def _figures(cfg: RunConfig, inputs: RunInputs, result: FitResult, central, out: Path, factors: bool) -> list:
    """``curves.png`` (NMSE, consensus, objective, the worst agent's NMSE; the centralized NMSE
    beside the distributed one) and ``factors.png`` (the agents' mean ``X``: its columns as images
    on image data, else a heat map)."""
    from ..figures import columns_as_images, write_figures

    h = {k: v for k, v in result.history.items() if k in ("nmse", "consensus", "objective", "nmse_worst")}
    if central is not None and central.history.get("nmse"):
        h["centralized_nmse"] = central.history["nmse"]
    images = None
    if factors:
        X = result.X_mean.detach().cpu()
        images = columns_as_images(X, inputs.image_shape) if inputs.image_shape is not None else X
    return write_figures(out, h, title=f"PPDNMF on {dataset_name(cfg)} ({cfg.exchange.kind} exchange)",
                         curves=(("NMSE", ("nmse", "centralized_nmse", "nmse_worst")), "consensus", "objective"),
                         images=images,
                         images_title="the agents' mean X" + (" (columns as images)" if inputs.image_shape else ""))


# --------------------------------------------------------------------------------------
# Batched trials
# --------------------------------------------------------------------------------------


class _MeanInfo:
    """A batched run's :class:`~ppdnmf_torch.models.ppdnmf.solver.IterationInfo` seen through its trial means
    (what the logger and the progress show)."""

    def __init__(self, info):
        self.iteration, self.n_iter, self.state, self.elapsed = info.iteration, info.n_iter, info.state, info.elapsed
        self.metrics = {k: float(torch.as_tensor(v, dtype=torch.float64).mean()) for k, v in info.metrics.items()}
        self.costs, self.iteration_costs = info.costs, getattr(info, "iteration_costs", [])


def run_trials(cfg: RunConfig, out: Path, logger: RunLogger, *, show: bool, callback=None) -> dict:
    """``cfg.trials`` independent trials (seeds ``cfg.seed + t``) as one batched computation
    (:func:`~ppdnmf_torch.models.ppdnmf.experiments.run_experiment`); writes their outputs, returns the summary."""
    from ...models.ppdnmf.experiments import run_experiment

    s, e = cfg.solver, cfg.exchange
    device = resolve_device(cfg.device)
    per_iteration = None
    if e.kind == "paillier":
        graph = build_graph(cfg)
        L = load_data(cfg)[0].shape[0]
        est = paillier_estimate(e, graph, L, s.rank, s.x_iters, s.bcd_iters, trials=cfg.trials)
        log.info(format_estimate(e, est))
        per_iteration = seconds_per_iteration(est, s.bcd_iters)
    central: list = []  # the baseline's Progress, made at its first iteration (it runs second)
    with Progress(show, s.bcd_iters, f"PPDNMF ({e.kind}, {cfg.trials} trials)", interval=cfg.progress_interval,
                  seconds_per_iteration=per_iteration) as bar:

        def cb(info):
            mean = _MeanInfo(info)
            logger.iteration(mean, s.x_iters)
            bar.update(info.iteration, {"nmse": mean.metrics["nmse"], "consensus": mean.metrics["consensus"]})
            return bool(callback(info)) if callback is not None else False

        def central_cb(info):
            if not central:
                bar.close()  # the distributed fit's last line before the baseline's first
                central.append(Progress(show, s.bcd_iters, f"centralized ({cfg.trials} trials)",
                                        interval=cfg.progress_interval))
            central[0].update(info.iteration, {"nmse": _MeanInfo(info).metrics["nmse"]})
            return False

        try:
            exp = run_experiment(cfg, trials=cfg.trials, seed=cfg.seed, centralized=cfg.centralized, device=device,
                                 dtype=cfg.dtype, callback=cb, threads=cfg.threads, central_callback=central_cb)
        finally:
            for c in central:
                c.close()
    write_trials(out, exp)
    summary = trials_summary(cfg, exp, out, device)
    from ..figures import write_figures

    summary["figures"] = write_figures(out, exp.history, title=f"PPDNMF, {cfg.trials} trials ({e.kind} exchange)",
                                       curves=("nmse", "consensus", "objective"))
    metrics = {"nmse_distributed": summary["nmse"]["distributed"]["mean"],
               "consensus": summary["consensus"]["mean"], "wall_time": exp.seconds["distributed"],
               **_cost_metrics(exp.distributed.costs)}
    if summary["nmse"]["centralized"] is not None:
        metrics["nmse_centralized"] = summary["nmse"]["centralized"]["mean"]
        if exp.centralized is not None:
            logger.centralized({"nmse": exp.centralized.history["nmse"].mean(axis=1).tolist()})
    logger.finished(None, None, hparams=_hparams(cfg, device), metrics=metrics,
                    config_text="```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```")
    return summary


# --------------------------------------------------------------------------------------
# Over ranks
# --------------------------------------------------------------------------------------


def _ranks_resumed_at(out: Path) -> int:
    """The BCD iterations rank 0's checkpoints hold (the engine's ``checkpoints/rank000``; 0 without one)."""
    try:
        return checkpoint_iteration(latest_checkpoint(out / "checkpoints" / "rank000"))
    except CheckpointError:
        return 0


def run_rank(cfg: RunConfig, out: Path, comm, logger: RunLogger, *, partition="rcm", assignment=None, share="all",
             resume: bool = False, callback=None) -> dict | None:
    """One rank of ``ppdnmf`` over ``comm``'s ranks
    (:func:`~ppdnmf_torch.models.ppdnmf.distributed.engine.fit_rank`): the config's inputs and fit;
    rank 0 writes the outputs (``factors.pt``, histories, TensorBoard through ``logger``) and
    returns the summary with its ``distributed`` section (None elsewhere). ``share="sums"``: no
    ``factors.pt`` of the whole run; every rank writes its own agents' factors to
    ``<out>/rank<r>/factors.pt``."""
    from ...models.ppdnmf.distributed.engine import distributed_summary, fit_rank, write_own_factors

    inputs = build_inputs(cfg)
    s = cfg.solver
    if s.x_solver != "admm":
        raise ConfigError(f"solver.x_solver: a distributed run takes the ADMM X-step (x_solver=admm) in this "
                          f"version, got {s.x_solver!r}; run the incremental X-step in one process")
    kw = _solver_kwargs(cfg, inputs)
    kw.pop("device")
    label = f"PPDNMF ({cfg.exchange.kind}, {comm.world_size} ranks)"
    # rank 0 says the Paillier estimate, as a run in one process does (resumed: the BCD iterations left)
    per_iteration = _announce(cfg, inputs, _ranks_resumed_at(out) if resume else 0) if comm.rank == 0 else None
    with Progress(cfg.progress and comm.rank == 0, s.bcd_iters, label, interval=cfg.progress_interval,
                  seconds_per_iteration=per_iteration) as bar:

        def cb(info):
            if comm.rank == 0:
                logger.iteration(info, s.x_iters)
                bar.update(info.iteration, {k: info.metrics[k] for k in ("nmse", "consensus") if k in info.metrics})
            return bool(callback(info)) if callback is not None else False

        t0 = time.perf_counter()
        fit_ = fit_rank(comm, inputs.Z, inputs.graph, s.rank, columns=inputs.counts, g_max=s.g_max,
                        exchange=cfg.exchange, callback=cb, checkpoint_dir=out / "checkpoints",
                        checkpoint_every=cfg.checkpoint_every, resume=resume, partition=partition,
                        assignment=assignment, share=share, **kw)
    seconds = {"distributed": time.perf_counter() - t0}
    if share != "all":
        write_own_factors(out / f"rank{comm.rank:03d}" / "factors.pt", fit_, comm.rank, inputs.scale)
    if comm.rank != 0:
        return None
    central = None
    if cfg.centralized:
        t0 = time.perf_counter()
        central = _fit_centralized(cfg, inputs, _solver_kwargs(cfg, inputs), False)
        seconds["centralized"] = time.perf_counter() - t0
        logger.centralized(central.history)
    summary = write_outputs(cfg, inputs, RunFits(fit_.result, central, seconds), out, logger, factors=share == "all")
    summary["distributed"] = distributed_summary(comm, fit_)
    return summary


# --------------------------------------------------------------------------------------
# The task
# --------------------------------------------------------------------------------------


class PPDNMFTask(Task):
    """PPDNMF as the app runs it: :class:`~ppdnmf_torch.models.ppdnmf.config.RunConfig`,
    :func:`~ppdnmf_torch.models.ppdnmf.inputs.build_inputs`, :func:`fit_run`,
    :func:`write_outputs`, :func:`run_trials`."""

    name = "ppdnmf"
    config_keys = CONFIG_KEYS
    resume_safe_keys = ("solver.bcd_iters",)
    checkpoint_patterns = ("ckpt_bcd[0-9]*.pt", BASELINE_NAME)

    def iteration_cap(self, cfg: RunConfig) -> tuple:
        return "solver.bcd_iters", cfg.solver.bcd_iters

    def n_agents(self, cfg: RunConfig) -> int:
        return cfg.n_agents

    def resume_point(self, resume_from) -> int:
        """The BCD iterations a checkpoint file or folder has completed; a run over ranks' folder
        (``rank<r>/`` inside): the newest iteration every rank has a checkpoint of (0: none)."""
        from ...checkpoint import checkpoint_files

        path = Path(resume_from)
        ranks = sorted(p for p in path.glob("rank*") if p.is_dir()) if path.is_dir() else []
        if ranks:
            done = [{checkpoint_iteration(f) for f in checkpoint_files(r)} for r in ranks]
            common = set.intersection(*done)
            return max(common) if common else 0
        return checkpoint_iteration(latest_checkpoint(resume_from))

    def run_rank(self, cfg: RunConfig, out: Path, comm, logger, *, partition="rcm", assignment=None, share="all",
                 resume: bool = False, callback=None) -> dict | None:
        return run_rank(cfg, out, comm, logger, partition=partition, assignment=assignment, share=share,
                        resume=resume, callback=callback)

    def config_from_dict(self, d: dict) -> RunConfig:
        return from_dict(d)

    def config_to_dict(self, cfg: RunConfig) -> dict:
        return to_dict(cfg)

    def inner_iterations(self, cfg: RunConfig) -> int:
        return cfg.solver.x_iters  # the ADMM iterations of an X-step

    def build_inputs(self, cfg: RunConfig) -> RunInputs:
        return build_inputs(cfg)

    def fit(self, cfg: RunConfig, inputs: RunInputs, logger: RunLogger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> RunFits:
        return fit_run(cfg, inputs, logger, out, show=show, callback=callback, resume_from=resume_from)

    def write_outputs(self, cfg: RunConfig, inputs: RunInputs, fits: RunFits, out: Path, logger: RunLogger) -> dict:
        return write_outputs(cfg, inputs, fits, out, logger)

    def run_trials(self, cfg: RunConfig, out: Path, logger: RunLogger, *, show: bool, callback=None) -> dict:
        return run_trials(cfg, out, logger, show=show, callback=callback)

    def format_summary(self, summary: dict) -> str:
        return format_summary(summary)

    def objective(self, summary: dict) -> float:
        """The distributed fit's final NMSE (its mean over trials)."""
        nm = summary["nmse"]["distributed"]
        return nm["mean"] if isinstance(nm, dict) else nm


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=ppdnmf``
TASK = PPDNMFTask()
