"""The FSSPCA task: how the app runs :mod:`ppdnmf_torch.models.fsspca` (``ppdnmf task=fsspca``).

Two variants (``fsspca/variant=``): ``server`` (:func:`~ppdnmf_torch.models.fsspca.fit.fit_fsspca`,
the server sums the workers' uploads through ``solver.aggregation``) and ``serverless``
(:func:`~ppdnmf_torch.models.fsspca.serverless.fit_serverless`: the workers agree on ``z`` over
the ``graph`` through the ``exchange``, the groups PPDNMF has; the ``serverless`` section,
:class:`~ppdnmf_torch.models.fsspca.config.ServerlessSpec`). The ``solver`` section is the model's
:class:`~ppdnmf_torch.models.fsspca.config.FSSPCASpec`. FSSPCA has no run over ranks in this
version (issue 39): a ``distributed.*`` setting is refused with one line.

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

from ...checkpoint import PREFIX
from ...errors import ConfigError
from ...exchange.spec import ExchangeSpec
from ...models.fsspca.config import DATA_PRESETS, TASK as TASK_SPEC, FSSPCASpec, ServerlessSpec
from ...models.fsspca.data import SPLITS
from ...models.fsspca.experiments import run_task
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
    """The rows to decompose: a preset, or a user's ``.npy``/``.csv`` (``kind=npy|csv``, ``path``)."""

    kind: str = rule("spiked", choices=DATA_KINDS)
    path: str | None = None


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
        raise ConfigError("task: FSSPCA has no run over ranks in this version (a worker per rank comes with issue "
                          "39); leave the distributed.* settings out to run it in one process")

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
        lines += [f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']})",
                  f"outputs: {s['out_dir']}"]
        return "\n".join(lines)

    def objective(self, summary: dict) -> float:
        """The explained variance (its mean over trials)."""
        return common.mean(summary["explained_variance"])


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=fsspca``
TASK = FSSPCATask()
