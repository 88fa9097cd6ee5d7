"""PPDNMF's site run in the app (:mod:`.site`): :func:`run_ppdnmf_site`, one party's columns on
:func:`~ppdnmf_torch.models.ppdnmf.distributed.fit_site`, and its own run folder."""
from __future__ import annotations

import time
from dataclasses import fields
from pathlib import Path

import torch

from .._utils import resolve_device, resolve_dtype
from ..errors import ConfigError
from ..models.ppdnmf.config import X_SOLVER_KEYS, SolverConfig
from ..models.ppdnmf.distributed.engine import write_own_factors
from ..models.ppdnmf.distributed.site import fit_site
from ..models.ppdnmf.inputs import RunInputs, build_graph
from .progress import Progress
from .tasks.ppdnmf import RunFits, write_outputs

__all__ = ["run_ppdnmf_site"]


def _solver_kwargs(cfg) -> dict:
    """``fit_site``'s keywords from the config (as the app over ranks passes ``fit_rank``'s)."""
    s = cfg.solver
    if s.x_solver != "admm":
        raise ConfigError(f"solver.x_solver: a site's run takes the ADMM X-step (x_solver=admm), got {s.x_solver!r}")
    skip = ("rank", "g_max", *X_SOLVER_KEYS)
    kw = {f.name: getattr(s, f.name) for f in fields(SolverConfig) if f.name not in skip}
    kw.update(negative=cfg.data.negative, seed=cfg.seed, dtype=resolve_dtype(cfg.dtype), threads=cfg.threads)
    return kw


def run_ppdnmf_site(cfg, opts, own: dict, out: Path, comm, logger, *, resume: bool = False, callback=None) -> dict:
    """This site's PPDNMF run: ``own`` (its agents' blocks by id) on ``comm``; writes
    ``factors.pt`` (its agents' ``X``, ``U``, ``Y``: :func:`~.engine.write_own_factors`), the
    history and TensorBoard scalars (the same on every site: per-site sums reduced), and returns
    the summary with a ``site`` section (its agents, and the bytes it sent by category)."""
    if cfg.data.normalize:
        raise ConfigError("data.normalize: divides by the whole data's largest entry, which no site knows; scale "
                          "the data by an agreed number beforehand (data.normalize=false)")
    s = cfg.solver
    graph = build_graph(cfg)
    kw = _solver_kwargs(cfg)
    label = f"PPDNMF site {comm.rank} of {comm.world_size} ({cfg.exchange.kind})"
    with Progress(cfg.progress, s.bcd_iters, label, interval=cfg.progress_interval) as bar:

        def cb(info):
            logger.iteration(info, s.x_iters)
            bar.update(info.iteration, {k: info.metrics[k] for k in ("nmse",) if k in info.metrics})
            return bool(callback(info)) if callback is not None else False

        t0 = time.perf_counter()
        fit_ = fit_site(comm, own, graph, s.rank, columns=opts.columns, assignment=opts.assignment, g_max=s.g_max,
                        exchange=cfg.exchange, callback=cb, checkpoint_dir=out / "checkpoints",
                        checkpoint_every=cfg.checkpoint_every, resume=resume, **kw)
    seconds = {"distributed": time.perf_counter() - t0}
    write_own_factors(out / "factors.pt", fit_, comm.rank)
    mine = torch.cat([own[i] for i in sorted(own)], dim=1)
    inputs = RunInputs(mine, None, list(opts.columns), graph, resolve_device(cfg.device), resolve_dtype(cfg.dtype))
    summary = write_outputs(cfg, inputs, RunFits(fit_.result, None, seconds), out, logger, factors=False)
    summary["site"] = {"rank": comm.rank, "world": comm.world_size, "agents": fit_.own["agents"],
                       "columns": list(opts.columns), "sent": dict(comm.sent), "share": fit_.share}
    return summary
