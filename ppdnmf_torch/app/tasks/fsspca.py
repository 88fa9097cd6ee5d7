"""The FSSPCA task: how the app runs :mod:`ppdnmf_torch.models.fsspca` (``ppdnmf task=fsspca``).

Two variants (``fsspca/variant=``): ``server`` (:func:`~ppdnmf_torch.models.fsspca.fit.fit_fsspca`,
the server sums the workers' uploads through ``solver.aggregation``) and ``serverless``
(:func:`~ppdnmf_torch.models.fsspca.serverless.fit_serverless`: the workers agree on ``z`` over
the ``graph`` through the ``exchange``, the groups PPDNMF has; the ``serverless`` section,
:class:`~ppdnmf_torch.models.fsspca.config.ServerlessSpec`). The ``solver`` section is the model's
:class:`~ppdnmf_torch.models.fsspca.config.FSSPCASpec`. Over ranks (``python -m ppdnmf_torch.distributed
task=fsspca fsspca/variant=serverless distributed.nproc=2``, :meth:`FSSPCATask.run_rank`) the
serverless variant runs :func:`~ppdnmf_torch.models.fsspca.serverless_ranks.fit_serverless_rank`: every
rank loads the data and keeps its own workers' rows; rank 0 writes the outputs. With a server
(``distributed.nproc=3``): :func:`~ppdnmf_torch.models.fsspca.server_ranks.fit_server_rank`, the server
on rank 0. A site's run (each party its own rows): :mod:`ppdnmf_torch.app.site_fsspca`.

1. :meth:`FSSPCATask.build_inputs`: the device and dtype, and the workers' graph (serverless);
2. :meth:`FSSPCATask.fit`: the model's :func:`~ppdnmf_torch.models.fsspca.experiments.run_task`
   with the trials batched in one fit, every ADMM iteration's values (their means over trials) to
   the logger (``fsspca/<key>``) and the progress; the model's checkpoints in ``out/checkpoints``
   (either variant);
3. :meth:`FSSPCATask.write_outputs`: one ``.npy`` per array (``z``, ``components``,
   ``loadings_image``), ``history.csv``, the PNG figures (curves, loadings), the loadings image
   and the hparams to the logger; the summary.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...checkpoint import PREFIX
from ...errors import ConfigError
from ...exchange.spec import ExchangeSpec
from ...models.fsspca.config import DATA_PRESETS, TASK as TASK_SPEC, FSSPCASpec, ServerlessSpec
from ...models.fsspca.data import SPLITS
from ...models.fsspca.experiments import run_task
from ..costs import announce
from ..figures import write_figures
from ..outputs import write_arrays, write_history_csv
from ..progress import Progress
from . import _common as common
from ._common import (DeviceInputs, GraphConfig, ModelFits, ModelTask, RunKeys, build_exchange, check_variant_sections,
                      rule)

__all__ = ["TASK", "FSSPCATask", "FSSPCARunConfig", "FSSPCAData", "FSSPCASplit", "CONFIG_KEYS", "DATA_KINDS",
           "VARIANTS"]

DATA_KINDS = (*DATA_PRESETS, "npy", "csv")
#: the variants of ``fsspca/variant=``
VARIANTS = ("server", "serverless")


@dataclass
class FSSPCAData:
    """The rows to decompose: a preset, or a user's ``.npy``/``.csv`` (``kind=npy|csv``, ``path``);
    ``n_features``: the rows' width, public in a site's run (:mod:`ppdnmf_torch.app.site_fsspca`:
    each site's file is checked against it before connecting), unused otherwise."""

    kind: str = rule("spiked", choices=DATA_KINDS)
    path: str | None = None
    n_features: int | None = rule(None, ge=1)


@dataclass
class FSSPCASplit:
    """How the rows are dealt to the workers: IID, by class, or by a Dirichlet draw over classes."""

    kind: str = rule(TASK_SPEC.split, choices=SPLITS)
    concentration: float = rule(TASK_SPEC.concentration, gt=0)


@dataclass
class FSSPCARunConfig(RunKeys):
    """One ``ppdnmf task=fsspca`` run (``conf/task/fsspca.yaml`` and ``conf/fsspca/``)."""

    task: str = rule("fsspca", choices=("fsspca",))
    variant: str = rule("server", choices=VARIANTS)
    n_workers: int = rule(TASK_SPEC.n_workers, ge=1)
    n_components: int = rule(TASK_SPEC.n_components, ge=1)
    # lambda_1; a list: one per trial (a hyperparameter batched over trials)
    alpha: float | list[float] = rule(TASK_SPEC.alpha, ge=0)
    data: FSSPCAData = field(default_factory=FSSPCAData)
    split: FSSPCASplit = field(default_factory=FSSPCASplit)
    solver: FSSPCASpec = field(default_factory=FSSPCASpec)
    # variant=serverless: the consensus, the workers' graph and exchange
    serverless: ServerlessSpec | None = None
    graph: GraphConfig | None = None
    exchange: ExchangeSpec | None = rule(None, build=build_exchange)

    def validate(self) -> "FSSPCARunConfig":
        return common.validate(self, _cross)


def _cross(cfg: FSSPCARunConfig) -> None:
    if isinstance(cfg.alpha, list) and len(cfg.alpha) != cfg.trials:
        raise ConfigError(f"alpha: a list needs one value per trial ({cfg.trials}), got {len(cfg.alpha)}")
    d = cfg.data
    if d.kind in ("npy", "csv"):
        if not d.path:
            raise ConfigError(f"data.path: data.kind={d.kind} needs the file's path")
        if not d.path.endswith(f".{d.kind}"):
            raise ConfigError(f"data.path: {d.path!r} is not a .{d.kind} file")
    if cfg.split.kind != "iid" and d.kind in ("spiked", "npy", "csv"):
        raise ConfigError(f"split.kind: {cfg.split.kind!r} needs class labels; data.kind={d.kind} has none (use iid)")
    sections = {"serverless": cfg.serverless, "graph": cfg.graph, "exchange": cfg.exchange}
    check_variant_sections("fsspca", "serverless", "serverless", cfg.variant == "serverless", sections,
                           cfg.exchange.kind if cfg.exchange is not None else None)


#: the API's parameter names and the config keys they come from
CONFIG_KEYS = {"data": "data.kind", "path": "data.path", "split": "split.kind", "checkpoint_dir": "resume",
               **{k: f"solver.{k}" for k in asdict(FSSPCASpec())},
               **{k: f"serverless.{k}" for k in asdict(ServerlessSpec()) if k != "exchange"}}


class FSSPCATask(ModelTask):
    """Federated sparse PCA as the app runs it."""

    name = "fsspca"
    config_cls = FSSPCARunConfig
    cross = staticmethod(_cross)
    config_keys = CONFIG_KEYS
    # the iteration cap a resumed run may raise (the engine's checkpoints allow another cap)
    resume_safe_keys = ("solver.max_iter",)
    checkpoint_patterns = (f"{PREFIX}[0-9]*.pt",)
    step = "ADMM iteration"

    def iteration_cap(self, cfg) -> tuple:
        return "solver.max_iter", cfg.solver.max_iter

    def n_agents(self, cfg) -> int:
        """The agents over ranks: the workers (serverless), or the server and the workers (the
        server on rank 0, :func:`~ppdnmf_torch.models.fsspca.server_ranks.fit_server_rank`)."""
        return cfg.n_workers if cfg.variant == "serverless" else cfg.n_workers + 1

    def rank_kwargs(self, cfg: FSSPCARunConfig, out: Path, resume: bool) -> dict:
        """:func:`~ppdnmf_torch.models.fsspca.serverless_ranks.fit_serverless_rank`'s keywords (one trial)."""
        if cfg.trials != 1:
            raise ConfigError(f"trials: a run over ranks is one trial, got trials={cfg.trials}")
        kw = self._fit_kwargs(cfg, DeviceInputs(None, None, [None]), out, resume)
        kw.pop("graph")
        return dict(kw, seed=cfg.seed, dtype=getattr(torch, cfg.dtype))

    def run_rank(self, cfg: FSSPCARunConfig, out: Path, comm, logger, *, partition="rcm", assignment=None,
                 share="all", resume=False, callback=None) -> dict | None:
        """One rank of ``task=fsspca fsspca/variant=serverless`` over ranks: every rank loads the
        rows and keeps its own workers'; rank 0 writes the outputs (with ``share="all"`` the
        workers' mean ``z``; with ``"sums"`` its own workers' ``z_i``) and returns the summary."""
        from ...distributed.partition import partition_agents
        from ...models.fsspca.fit import as_blocks
        from ...models.fsspca.serverless_ranks import fit_serverless_rank

        if cfg.variant == "server":
            return self._run_server_rank(cfg, out, comm, logger, assignment=assignment, callback=callback)
        kw = self.rank_kwargs(cfg, out, resume)
        X, groups = _rows(cfg)
        blocks = as_blocks(X, groups)
        graph = common.make_graphs(cfg.graph, cfg.n_workers, [cfg.seed])[0]
        part = partition_agents(graph, comm.world_size, partition, assignment)
        show = cfg.progress and comm.rank == 0
        if comm.rank == 0:  # resumed: the whole run's figure (the ranks' checkpoints are per rank)
            _announce(cfg, [graph], 0, d=X.shape[1])
        with Progress(show, cfg.solver.max_iter, f"FSSPCA ({cfg.data.kind}, serverless over {cfg.n_workers} workers, "
                      f"{comm.world_size} ranks)", interval=cfg.progress_interval, step=self.step) as bar:
            cb = rank_callback(logger, bar, callback)
            t0 = time.perf_counter()
            res = fit_serverless_rank(comm, [blocks[i] for i in part.agents(comm.rank)], cfg.n_components, graph,
                                      assignment=list(part.owner), share=share, callback=cb, **kw)
        seconds = time.perf_counter() - t0
        if comm.rank != 0:
            return None
        summary, arrays = rank_outputs(res, blocks if res.z_all is not None else None, X.shape, cfg.n_workers)
        inputs = DeviceInputs(comm.device, getattr(torch, cfg.dtype), [graph])
        summary = self.write_outputs(cfg, inputs, ModelFits(summary, arrays, seconds), out, logger)
        summary["distributed"] = {"world_size": comm.world_size, "partition": part.method, "share": share}
        return summary

    def resume_point(self, resume_from) -> int:
        return common.resume_point(resume_from)

    def build_inputs(self, cfg: FSSPCARunConfig) -> DeviceInputs:
        inputs = super().build_inputs(cfg)
        if cfg.variant == "serverless":
            inputs.graphs = common.make_graphs(cfg.graph, cfg.n_workers, [cfg.seed])
        return inputs

    def _fit_kwargs(self, cfg: FSSPCARunConfig, inputs: DeviceInputs, out: Path, resume: bool) -> dict:
        s = {**asdict(cfg.solver), "alpha": cfg.alpha}
        # checkpoint_every=0: the model's checkpoints at the end and on Ctrl-C only (as PPDNMF's)
        ckpt = {"checkpoint_dir": out / "checkpoints", "checkpoint_every": cfg.checkpoint_every, "resume": resume}
        if cfg.variant == "serverless":
            s.pop("aggregation")
            sl = {k: v for k, v in asdict(cfg.serverless).items() if k != "exchange"}
            return {**s, **sl, **ckpt, "exchange": cfg.exchange, "graph": inputs.graphs[0]}
        return {**s, **ckpt}

    def fit(self, cfg: FSSPCARunConfig, inputs: DeviceInputs, logger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> ModelFits:
        s = cfg.solver
        start = self.resume_point(out / "checkpoints") if resume_from is not None else 0
        where = f", serverless over {cfg.n_workers} workers" if cfg.variant == "serverless" else ""
        label = f"FSSPCA ({cfg.data.kind}{where}" + (f", {cfg.trials} trials)" if cfg.trials > 1 else ")")
        _announce(cfg, inputs.graphs, start)
        with Progress(show, s.max_iter, label, interval=cfg.progress_interval, start=start, step=self.step) as bar:

            def cb(info):
                means = common.trial_means(info.values, "fsspca")
                logger.scalars(info.iteration, means)
                shown = {k: means.get(f"fsspca/{k}") for k in ("objective", "consensus", "disagreement")}
                if "fsspca/explained_variance" in means:
                    shown["explained variance"] = means["fsspca/explained_variance"]
                bar.update(info.iteration, {k: v for k, v in shown.items() if v is not None})
                return bool(callback(info)) if callback is not None else False

            t0 = time.perf_counter()
            summary, arrays = run_task(
                data=cfg.data.path if cfg.data.kind in ("npy", "csv") else cfg.data.kind, n_workers=cfg.n_workers,
                split=cfg.split.kind, n_components=cfg.n_components, trials=cfg.trials, seed=cfg.seed,
                concentration=cfg.split.concentration, callback=cb, device=inputs.device, dtype=inputs.dtype,
                **self._fit_kwargs(cfg, inputs, out, resume_from is not None))
        return ModelFits(summary, arrays, time.perf_counter() - t0)

    def write_outputs(self, cfg: FSSPCARunConfig, inputs: DeviceInputs, fits: ModelFits, out: Path,
                      logger) -> dict:
        arrays = fits.arrays
        histories = {k[len("history_"):]: v for k, v in arrays.items() if k.startswith("history_")}
        write_arrays(out, {k: v for k, v in arrays.items() if not k.startswith("history_")})
        write_history_csv(out / "history.csv", histories)
        s = fits.summary
        n_iter = max(s["n_iter"])
        if cfg.logger.images:
            logger.image("images/loadings", arrays["loadings_image"], n_iter, scale=4 * cfg.logger.image_scale)
        figures = write_figures(out, histories, title=f"FSSPCA on {cfg.data.kind} ({cfg.variant})",
                                curves=("objective", "explained_variance", "sparsity", "consensus", "disagreement",
                                        "primal_residual", "dual_residual"),
                                loadings=arrays["z"][0])
        summary = {"task": self.name, "variant": cfg.variant, "name": cfg.name, "data": cfg.data.kind,
                   "split": cfg.split.kind, "n_components": cfg.n_components, "alpha": cfg.alpha,
                   "trials": cfg.trials, "seed": cfg.seed, "device": str(inputs.device), "dtype": cfg.dtype, **s,
                   "wall_time": {"fit": fits.seconds}, "figures": figures, "out_dir": str(out)}
        if cfg.variant == "serverless":
            summary.update(graph=cfg.graph.kind, exchange=cfg.exchange.kind, consensus=cfg.serverless.consensus)
        summary = json.loads(json.dumps(summary, default=str))  # the model's settings as plain values
        hp = {"name": cfg.name, "variant": cfg.variant, "data": cfg.data.kind, "split": cfg.split.kind,
              "n_workers": cfg.n_workers, "n_components": cfg.n_components, "alpha": str(cfg.alpha),
              "trials": cfg.trials, "seed": cfg.seed, "smoothing": cfg.solver.smoothing,
              "aggregation": cfg.exchange.kind if cfg.variant == "serverless" else cfg.solver.aggregation,
              "dtype": cfg.dtype}
        metrics = {"explained_variance": common.mean(s["explained_variance"]), "sparsity": common.mean(s["sparsity"]),
                   "n_iter": n_iter, "wall_time": fits.seconds}
        logger.finished(None, None, hparams=hp, metrics=metrics,
                        config_text="```\n" + json.dumps(self.config_to_dict(cfg), indent=2) + "\n```")
        return summary

    def _run_server_rank(self, cfg: FSSPCARunConfig, out: Path, comm, logger, *, assignment=None,
                         callback=None) -> dict | None:
        """One rank of ``task=fsspca fsspca/variant=server`` over ranks: rank 0 the server, the
        workers' rows on the other ranks (``assignment``: every worker's rank, ``>= 1``); the
        server's sums through ``solver.aggregation`` (``plain``, ``quantized``, ``secagg``)."""
        from types import SimpleNamespace

        from ...models.fsspca.fit import as_blocks
        from ...models.fsspca.server_ranks import SERVER_SETTINGS, fit_server_rank

        if cfg.trials != 1:
            raise ConfigError(f"trials: a run over ranks is one trial, got trials={cfg.trials}")
        if assignment is not None and len(assignment) == cfg.n_workers + 1:
            assignment = assignment[1:]  # the server's own entry (rank 0) given with the workers'
        s = {k: v for k, v in {**asdict(cfg.solver), "alpha": cfg.alpha, "seed": cfg.seed}.items()
             if k in SERVER_SETTINGS}
        X, groups = _rows(cfg)
        blocks = as_blocks(X, groups)
        P, K = comm.world_size, cfg.n_workers
        owner = list(assignment) if assignment is not None else [1 + (i * (P - 1)) // K for i in range(K)]
        mine = [blocks[i] for i in range(K) if owner[i] == comm.rank] or None
        show = cfg.progress and comm.rank == 0
        with Progress(show, cfg.solver.max_iter, f"FSSPCA ({cfg.data.kind}, a server and {K} workers over {P} ranks)",
                      interval=cfg.progress_interval, step=self.step) as bar:
            def cb(k, row):
                means = common.trial_means(row, "fsspca")
                logger.scalars(k, means)
                bar.update(k, {"consensus": means["fsspca/consensus"]})
                return False

            t0 = time.perf_counter()
            res = fit_server_rank(comm, mine, cfg.n_components, n_workers=K, n_features=int(X.shape[1]),
                                  assignment=owner, exchange=cfg.solver.aggregation, callback=cb,
                                  dtype=getattr(torch, cfg.dtype), **s)
        seconds = time.perf_counter() - t0
        if comm.rank != 0:
            return None
        like = SimpleNamespace(z_all=res.z[None], own={}, history=res.history, n_iter=res.n_iter,
                               converged=res.converged, bytes=float(sum(comm.sent.values())), exchange_calls=0,
                               costs={}, settings=dict(res.settings, center=cfg.solver.center))
        summary, arrays = rank_outputs(like, blocks, X.shape, K)
        arrays.pop("z_workers")
        inputs = DeviceInputs(comm.device, getattr(torch, cfg.dtype), None)
        summary = self.write_outputs(cfg, inputs, ModelFits(summary, arrays, seconds), out, logger)
        summary["distributed"] = {"world_size": P, "server": 0, "owner": owner}
        return summary

    def format_summary(self, summary: dict) -> str:
        s = summary
        conv = sum(bool(c) for c in s["converged"])
        how = (f", serverless ({s['consensus']} consensus over a {s['graph']} graph, exchange {s['exchange']})"
               if s.get("variant") == "serverless" else "")
        lines = [
            f"FSSPCA on {s['data']} ({s['n_rows']} x {s['n_features']}, {s['split']} split over {s['n_workers']} "
            f"workers{how}), {s['n_components']} loadings, alpha {s['alpha']}, {s['trials']} trial(s)",
            f"  explained variance {common.stat(s['explained_variance'])} | sparsity {common.stat(s['sparsity'])} | "
            f"iterations {common.stat(s['n_iter'], 'g')} | converged {conv}/{len(s['converged'])}",
        ]
        if "disagreement" in s:
            lines.append(f"  workers' disagreement {common.stat(s['disagreement'], '.3g')} | "
                         f"{s['exchange_calls']:,} exchange calls, {s['bytes']:.4g} bytes")
        where = (f", site {s['site']['rank']} of {s['site']['world']}" if s.get("site") else
                 f", {s['distributed']['world_size']} ranks" if s.get("distributed") else "")
        lines += [f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']}{where})",
                  f"outputs: {s['out_dir']}"]
        return "\n".join(lines)

    def objective(self, summary: dict) -> float:
        """The explained variance (its mean over trials)."""
        return common.mean(summary["explained_variance"])


def _announce(cfg: FSSPCARunConfig, graphs, start: int, d: int | None = None) -> None:
    """Log the Paillier estimate of a serverless run before it starts (app/costs.py): the centring's
    ``center_iters`` calls of ``d + 1`` values (made again by a resumed run), then ``inner_iters``
    calls of ``d n_components`` values per ADMM iteration left; ``graphs``: the one graph all
    trials share. Nothing for another exchange or the server variant."""
    if cfg.variant != "serverless" or cfg.exchange is None or cfg.exchange.kind != "paillier":
        return
    d = _rows(cfg)[0].shape[1] if d is None else int(d)
    s, sl = cfg.solver, cfg.serverless
    phases = ([(d + 1, sl.center_iters)] if s.center else []) + [
        (d * cfg.n_components, sl.inner_iters * max(0, s.max_iter - start))]
    announce(cfg.exchange, list(graphs) * cfg.trials if len(graphs) == 1 else list(graphs), phases)


def _rows(cfg: FSSPCARunConfig) -> tuple:
    """``(X (n, d), groups (n,))``: the config's rows and their workers, as
    :func:`~ppdnmf_torch.models.fsspca.experiments.run_task` makes them."""
    from ...models.fsspca.data import load_dataset, load_rows, spiked_covariance, split_rows

    y, kind = None, cfg.data.kind
    if kind == "spiked":
        X = spiked_covariance(seed=cfg.seed).X
    elif kind in ("npy", "csv"):
        X = load_rows(cfg.data.path)
    else:
        X, y = load_dataset(kind)
    groups = split_rows(cfg.split.kind, cfg.n_workers, y=y, n=len(X), seed=cfg.seed,
                        concentration=cfg.split.concentration)
    return X, groups


def rank_callback(logger, bar, callback=None):
    """The per-iteration callback of a rank's (or a site's) run: its history values to the logger
    (``fsspca/<key>``) and the progress, then ``callback(IterationInfo)``."""
    from ...models.fsspca.result import IterationInfo

    def cb(k, values):
        row = {key: values[key] for key in ("disagreement", "consensus") if key in values}
        means = common.trial_means(row, "fsspca")
        logger.scalars(k, means)
        bar.update(k, {key: means[f"fsspca/{key}"] for key in row})
        return bool(callback(IterationInfo(k, row, None))) if callback is not None else False

    return cb


def rank_outputs(res, blocks, shape, n_workers: int) -> tuple:
    """``(summary, arrays)`` as :func:`~ppdnmf_torch.models.fsspca.experiments.run_serverless` gives them,
    from a rank's result: with every worker's ``z_i`` (``res.z_all``) and ``blocks``, the workers'
    mean and its explained variance on the pooled rows; else (a site) its own workers' ``z_i`` and
    no explained variance (it would need every worker's data)."""
    import numpy as np

    from ...models.fsspca.admm import adjusted_variance
    from ...models.fsspca.fit import prepare_problem
    from ...models.fsspca.manifold import qf

    z = res.z_all if res.z_all is not None else res.own["z"]
    zm = z.mean(0)
    variance = [float("nan")]
    if blocks is not None:
        pooled = prepare_problem(blocks, 1, center=bool(res.settings.get("center", True)))[0].pooled_gram()[0]
        variance = adjusted_variance(pooled, zm[None]).tolist()
    img = np.abs(zm.cpu().numpy())
    hist = {k: v.cpu().numpy()[:, None] for k, v in res.history.items()}
    summary = dict(n_iter=[res.n_iter], converged=[res.converged], explained_variance=variance,
                   sparsity=[float((z == 0).to(zm.dtype).mean())], bytes=float(res.bytes),
                   exchange_calls=int(res.exchange_calls), costs=res.costs, n_workers=n_workers,
                   n_rows=int(shape[0]), n_features=int(shape[1]), settings=res.settings)
    if "disagreement" in hist:
        summary["disagreement"] = hist["disagreement"][-1].tolist()
    arrays = dict(z=zm[None].cpu().numpy(), components=qf(zm[None]).cpu().numpy(), z_workers=z.cpu().numpy(),
                  loadings_image=img / max(img.max(), 1e-300), **{f"history_{k}": v for k, v in hist.items()})
    return summary, arrays


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=fsspca``
TASK = FSSPCATask()
