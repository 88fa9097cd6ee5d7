"""One run of the app, without Hydra: :func:`run` turns a :class:`~ppdnmf_torch.config.RunConfig`
into outputs, in three steps:

1. :func:`build_inputs`: the data, the column split, the graph, the device and dtype;
2. :func:`fit_run`: the centralized baseline and the distributed fit, reporting to one
   :class:`~ppdnmf_torch.loggers.RunLogger` (TensorBoard or none) and a progress bar;
3. :func:`write_outputs`: the files of :mod:`ppdnmf_torch.outputs` and the logger's end.

The runner never prints; the progress bar (tqdm, stderr) is the only terminal output,
and only when asked for. :mod:`ppdnmf_torch.cli` prints the summary. Errors name the
config's keys (``exchange.g_bits``, not the API's ``g_bits``): each error carries its
parameter (:attr:`~ppdnmf_torch.errors.PPDNMFError.key`), re-rooted here once.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

from .api import X_SOLVER_KEYS, FitResult, fit, fit_centralized
from .config import RunConfig, SolverConfig, to_dict
from .errors import PPDNMFError
from .exchange.spec import SPECS
from .inputs import RunInputs, build_graph, build_inputs, load_data, make_split
from .loggers import NullLogger, RunLogger
from .outputs import format_summary, summary_of, write_factors, write_histories, write_summary, write_yaml
from .progress import Progress
from .solver import RunInterrupted

__all__ = ["run", "build_inputs", "fit_run", "write_outputs", "RunInputs", "RunFits", "load_data", "make_split",
           "build_graph", "format_summary", "CONFIG_KEYS"]

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
    """The distributed result, the centralized baseline's (or None), and their wall times."""

    result: FitResult
    central: FitResult | None
    seconds: dict = field(default_factory=dict)


def _solver_kwargs(cfg: RunConfig, inputs: RunInputs) -> dict:
    s = cfg.solver
    kw = dict(mu=s.mu, eta=s.eta, bcd_iters=s.bcd_iters, x_iters=s.x_iters, y_iters=s.y_iters, tol=s.tol,
              penalty=s.penalty, consensus_form=s.consensus_form, fuse=s.fuse, negative=cfg.data.negative,
              seed=cfg.seed, device=inputs.device, dtype=inputs.dtype)
    if s.admm_tol is not None:
        kw["admm_tol"] = s.admm_tol
    return kw


def _x_solver_kwargs(cfg: RunConfig) -> dict:
    """The distributed fit's X-step solver (the centralized baseline keeps the ADMM X-step: one
    reference curve whatever the distributed X-step)."""
    return {k: getattr(cfg.solver, k) for k in X_SOLVER_KEYS}


def _fit_centralized(cfg: RunConfig, inputs: RunInputs, common: dict, show: bool) -> FitResult:
    s = cfg.solver
    # one agent has no neighbours: its penalty cap never enters the updates
    g_c = s.g_max if isinstance(s.g_max, float) else float(s.g_max[0])
    with Progress(show, s.bcd_iters, "centralized") as bar:
        try:
            return fit_centralized(inputs.Z, s.rank, g_max=g_c, callback=lambda info: bar.update(
                {"nmse": f"{info.metrics['nmse']:.4g}"}), **common)
        except RunInterrupted as exc:
            # the baseline keeps no checkpoints: say so, rather than "checkpoint: None"
            raise KeyboardInterrupt(
                f"during the centralized baseline (after its BCD iteration {exc.bcd_done}), before the "
                "distributed run started: there is nothing to resume; run again (centralized=false skips "
                "the baseline)"
            ) from None


def fit_run(cfg: RunConfig, inputs: RunInputs, logger: RunLogger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> RunFits:
    """Step 2: the centralized baseline (first, it is fast: its curve is in TensorBoard from the
    start), then the distributed fit with checkpoints in ``out/checkpoints``."""
    s, e = cfg.solver, cfg.exchange
    common = _solver_kwargs(cfg, inputs)
    central, seconds = None, {}
    if cfg.centralized:
        t0 = time.perf_counter()
        central = _fit_centralized(cfg, inputs, common, show)
        seconds["centralized"] = time.perf_counter() - t0
        logger.centralized(central.history)
    c_hist = central.history.get("nmse", []) if central is not None else []
    with Progress(show, s.bcd_iters, f"PPDNMF ({e.kind})") as bar:

        def cb(info):
            logger.iteration(info, s.x_iters)
            shown = {"nmse": f"{info.metrics['nmse']:.4g}", "cons": f"{info.metrics['consensus']:.2g}"}
            if info.iteration <= len(c_hist):
                shown["central"] = f"{c_hist[info.iteration - 1]:.4g}"
            bar.update(shown)
            return bool(callback(info)) if callback is not None else False

        t0 = time.perf_counter()
        result = fit(inputs.Z, inputs.graph, s.rank, columns=inputs.counts, g_max=s.g_max, exchange=e,
                     callback=cb, checkpoint_dir=out / "checkpoints", checkpoint_every=cfg.checkpoint_every,
                     resume_from=resume_from, **common, **_x_solver_kwargs(cfg))
    seconds["distributed"] = time.perf_counter() - t0
    return RunFits(result, central, seconds)


# --------------------------------------------------------------------------------------
# 3. Outputs
# --------------------------------------------------------------------------------------


def _sample_columns(M: int, n: int) -> list[int]:
    """``n`` column indices spread evenly from the first column to the last."""
    n = max(1, min(n, M))
    if n == 1:
        return [0]
    return sorted({round(i * (M - 1) / (n - 1)) for i in range(n)})


def _hparams(cfg: RunConfig) -> dict:
    s, e = cfg.solver, cfg.exchange
    return {
        "name": cfg.name, "seed": cfg.seed, "n_agents": cfg.n_agents, "data": cfg.data.kind,
        "graph": cfg.graph.kind, "rank": s.rank, "mu": s.mu, "eta": s.eta,
        "g_max": s.g_max if isinstance(s.g_max, float) else str(s.g_max),
        "bcd_iters": s.bcd_iters, "x_iters": s.x_iters, "y_iters": s.y_iters, "tol": s.tol,
        "penalty": s.penalty, "consensus_form": s.consensus_form, "exchange": e.kind,
        "protocol": getattr(e, "protocol", None), "n_max": getattr(e, "n_max", None),
        "key_bits": getattr(e, "key_bits", None), "dtype": cfg.dtype, "device": cfg.device,
    }


def write_outputs(cfg: RunConfig, inputs: RunInputs, fits: RunFits, out: Path, logger: RunLogger) -> dict:
    """Step 3: ``factors.pt``, ``history.csv``/``.json`` and the logger's end of run; returns the
    summary (``summary.json`` is written last, by :func:`run`: its presence marks a finished run)."""
    result, central = fits.result, fits.central
    write_factors(out / "factors.pt", result, central, inputs.graph)
    write_histories(out, result, central)
    summary = summary_of(cfg, inputs, fits, out)
    images = None
    if inputs.image_shape is not None and cfg.logger.images:
        images = {"shape": inputs.image_shape, "Z": inputs.Z, "scale": cfg.logger.image_scale,
                  "columns": _sample_columns(inputs.Z.shape[1], cfg.logger.n_samples)}
    metrics = {"nmse_distributed": result.nmse, "consensus": result.consensus,
               "wall_time": fits.seconds["distributed"]}
    if central is not None:
        metrics["nmse_centralized"] = central.nmse
    logger.finished(result, central, hparams=_hparams(cfg), metrics=metrics, images=images,
                    config_text="```\n" + json.dumps(to_dict(cfg), indent=2) + "\n```")
    return summary


def make_logger(kind: str, folder, *, flush_secs: int = 30) -> RunLogger:
    """The logger of ``logger.kind``: ``"tensorboard"`` (events under ``folder``) or ``"none"``."""
    if kind == "tensorboard":
        from .tensorboard import TensorBoardLogger

        return TensorBoardLogger(folder, flush_secs=flush_secs)
    return NullLogger()


def run(cfg: RunConfig, out_dir, *, progress: bool | None = None, callback=None, resume_from=None) -> dict:
    """Run one experiment and write its outputs into ``out_dir``.

    Parameters
    ----------
    cfg : RunConfig
        Validated here again (so a hand-built config gets the same checks).
    out_dir : str or os.PathLike
        Created if missing.
    progress : bool, optional
        Show tqdm progress bars on stderr (default ``cfg.progress``; never on a non-terminal).
    callback : callable, optional
        Extra ``callback(info)`` of the distributed fit, called after the logger's.
    resume_from : str or os.PathLike, optional
        Checkpoint file or folder of this same run to continue from (bit-identical to an
        uninterrupted run). Checkpoints are written to ``out_dir/checkpoints`` every
        ``cfg.checkpoint_every`` BCD iterations and on Ctrl-C.

    Returns
    -------
    dict
        The summary also written to ``summary.json``.

    Raises
    ------
    PPDNMFError
        (ConfigError, DataError, GraphError, CodecRangeError, NumericalError) for bad
        input or a failed run; its key names the config's keys (``exchange.g_bits``).
    """
    t_start = time.perf_counter()
    try:
        cfg.validate()
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if resume_from is None:
            # a fresh run in a used folder: the old run's summary would mark this one finished
            # (the CLI refuses to resume a folder with a summary.json)
            (out / "summary.json").unlink(missing_ok=True)
        write_yaml(out / "config.yaml", to_dict(cfg))
        show = cfg.progress if progress is None else bool(progress)
        inputs = build_inputs(cfg)
        with make_logger(cfg.logger.kind, out / "tb", flush_secs=cfg.logger.flush_secs) as logger:
            fits = fit_run(cfg, inputs, logger, out, show=show, callback=callback, resume_from=resume_from)
            summary = write_outputs(cfg, inputs, fits, out, logger)
    except PPDNMFError as exc:
        raise exc.renamed(CONFIG_KEYS) from None
    summary["wall_time"]["total"] = time.perf_counter() - t_start
    write_summary(out / "summary.json", summary)
    return summary
