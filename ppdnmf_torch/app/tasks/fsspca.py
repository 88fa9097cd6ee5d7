"""The FSSPCA task: how the app runs :mod:`ppdnmf_torch.models.fsspca` (``ppdnmf task=fsspca``).

1. :meth:`FSSPCATask.build_inputs`: the device and dtype (the data are loaded and split by
   the model's :func:`~ppdnmf_torch.models.fsspca.experiments.run_task`);
2. :meth:`FSSPCATask.fit`: ``run_task`` with the trials batched in one fit, every ADMM
   iteration's values (their means over trials) to the logger (``fsspca/<key>``) and the
   progress; the model's checkpoint in ``out/checkpoints``;
3. :meth:`FSSPCATask.write_outputs`: one ``.npy`` per array (``z``, ``components``,
   ``loadings_image``), ``history.csv`` (a row per iteration and trial), the loadings image
   and the hparams to the logger; the summary.

``trials > 1`` runs the same three steps: the model batches its trials itself.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import ConfigError
from ...models.fsspca.experiments import run_task
from ...models.fsspca.fit import CHECKPOINT_NAME, DEFAULTS
from ...models.fsspca.smoothing import DEFAULT_SMOOTHING
from ..progress import Progress
from . import _common as common
from ._common import DeviceInputs, ModelFits, ModelTask, RunKeys, spec

__all__ = ["TASK", "FSSPCATask", "FSSPCARunConfig", "FSSPCAData", "FSSPCASplit", "FSSPCASolver", "CONFIG_KEYS",
           "DATA_KINDS"]

DATA_KINDS = ("spiked", "digits", "breast_cancer", "wine", "npy", "csv")


@dataclass
class FSSPCAData:
    """The rows to decompose: a preset, or a user's ``.npy``/``.csv`` (``kind=npy|csv``, ``path``)."""

    kind: str = spec("spiked", choices=DATA_KINDS)
    path: str | None = None


@dataclass
class FSSPCASplit:
    """How the rows are dealt to the workers: IID, by class, or by a Dirichlet draw over classes."""

    kind: str = spec("iid", choices=("iid", "class", "dirichlet"))
    concentration: float = spec(0.5, gt=0)


@dataclass
class FSSPCASolver:
    """Algorithm 1's settings (:func:`~ppdnmf_torch.models.fsspca.fit.fit_fsspca`)."""

    max_iter: int = spec(DEFAULTS["max_iter"], ge=1)
    tol: float = spec(DEFAULTS["tol"], ge=0)
    smoothing: str = spec(DEFAULT_SMOOTHING, choices=("sqrt", "huber", "logexp", "erf"))
    mu: float = spec(DEFAULTS["mu"], gt=0)
    # null: "auto" (rho_scale times the workers' mean largest eigenvalue)
    rho: float | None = spec(None, gt=0)
    rho_scale: float = spec(DEFAULTS["rho_scale"], gt=0)
    line_search: str = spec(DEFAULTS["line_search"], choices=("armijo", "wolfe"))
    inner_steps: int = spec(DEFAULTS["inner_steps"], ge=1)
    # null: lambda_1 / n_workers
    lambda_2: float | None = spec(None, ge=0)
    # null: random per trial; pca: the pooled top eigenvectors
    init: str | None = spec(None, choices=("pca",))
    center: bool = True
    aggregation: str = spec("plain", choices=("plain", "quantized", "paillier"))


@dataclass
class FSSPCARunConfig(RunKeys):
    """One ``ppdnmf task=fsspca`` run (``conf/task/fsspca.yaml``)."""

    task: str = spec("fsspca", choices=("fsspca",))
    n_workers: int = spec(4, ge=1)
    n_components: int = spec(2, ge=1)
    # lambda_1; a list: one per trial (a hyperparameter batched over trials)
    alpha: float | list[float] = spec(0.0, ge=0)
    data: FSSPCAData = field(default_factory=FSSPCAData)
    split: FSSPCASplit = field(default_factory=FSSPCASplit)
    solver: FSSPCASolver = field(default_factory=FSSPCASolver)

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


#: the API's parameter names and the config keys they come from
CONFIG_KEYS = {"data": "data.kind", "path": "data.path", "split": "split.kind", "max_iter": "solver.max_iter", "tol": "solver.tol",
               "mu": "solver.mu", "rho": "solver.rho", "inner_steps": "solver.inner_steps",
               "line_search": "solver.line_search", "lambda_2": "solver.lambda_2", "checkpoint_dir": "resume"}


class FSSPCATask(ModelTask):
    """Federated sparse PCA as the app runs it."""

    name = "fsspca"
    config_cls = FSSPCARunConfig
    cross = staticmethod(_cross)
    config_keys = CONFIG_KEYS

    def resume_point(self, resume_from) -> int:
        path = Path(resume_from)
        path = path / CHECKPOINT_NAME if path.is_dir() else path
        return int(torch.load(path, weights_only=True)["iteration"]) if path.is_file() else 0

    def fit(self, cfg: FSSPCARunConfig, inputs: DeviceInputs, logger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> ModelFits:
        s = cfg.solver
        # the model resumes by itself from a checkpoint of the same problem in its folder
        ckpt = {} if cfg.checkpoint_every == 0 else {"checkpoint_dir": out / "checkpoints",
                                                     "checkpoint_every": cfg.checkpoint_every}
        start = self.resume_point(out / "checkpoints") if resume_from is not None else 0
        label = f"FSSPCA ({cfg.data.kind}, {cfg.trials} trials)" if cfg.trials > 1 else f"FSSPCA ({cfg.data.kind})"
        with Progress(show, s.max_iter, label, interval=cfg.progress_interval, start=start,
                      step="ADMM iteration") as bar:

            def cb(info):
                means = common.trial_means(info.values, "fsspca")
                logger.scalars(info.iteration, means)
                bar.update(info.iteration, {"objective": means.get("fsspca/objective"),
                                            "consensus": means.get("fsspca/consensus"),
                                            "explained variance": means.get("fsspca/explained_variance")})
                return bool(callback(info)) if callback is not None else False

            t0 = time.perf_counter()
            summary, arrays = run_task(
                data=cfg.data.path if cfg.data.kind in ("npy", "csv") else cfg.data.kind, n_workers=cfg.n_workers,
                split=cfg.split.kind, n_components=cfg.n_components, alpha=cfg.alpha, trials=cfg.trials,
                seed=cfg.seed, concentration=cfg.split.concentration, callback=cb, smoothing=s.smoothing, mu=s.mu,
                rho="auto" if s.rho is None else s.rho, rho_scale=s.rho_scale, line_search=s.line_search,
                inner_steps=s.inner_steps, lambda_2=s.lambda_2, init=s.init, center=s.center,
                aggregation=s.aggregation, max_iter=s.max_iter, tol=s.tol, device=inputs.device,
                dtype=inputs.dtype, **ckpt)
        return ModelFits(summary, arrays, time.perf_counter() - t0)

    def write_outputs(self, cfg: FSSPCARunConfig, inputs: DeviceInputs, fits: ModelFits, out: Path,
                      logger) -> dict:
        arrays = fits.arrays
        histories = {k[len("history_"):]: v for k, v in arrays.items() if k.startswith("history_")}
        common.write_arrays(out, {k: v for k, v in arrays.items() if not k.startswith("history_")})
        common.write_history_csv(out / "history.csv", histories)
        s = fits.summary
        n_iter = max(s["n_iter"])
        if cfg.logger.images:
            logger.image("images/loadings", arrays["loadings_image"], n_iter, scale=4 * cfg.logger.image_scale)
        summary = {"task": self.name, "name": cfg.name, "data": cfg.data.kind, "split": cfg.split.kind,
                   "n_components": cfg.n_components, "alpha": cfg.alpha, "trials": cfg.trials,
                   "seed": cfg.seed, "device": str(inputs.device), "dtype": cfg.dtype, **s,
                   "wall_time": {"fit": fits.seconds}, "out_dir": str(out)}
        summary = json.loads(json.dumps(summary, default=str))  # the model's settings as plain values
        hp = {"name": cfg.name, "data": cfg.data.kind, "split": cfg.split.kind, "n_workers": cfg.n_workers,
              "n_components": cfg.n_components, "alpha": str(cfg.alpha), "trials": cfg.trials, "seed": cfg.seed,
              "smoothing": cfg.solver.smoothing, "aggregation": cfg.solver.aggregation, "dtype": cfg.dtype}
        metrics = {"explained_variance": common.mean(s["explained_variance"]), "sparsity": common.mean(s["sparsity"]),
                   "n_iter": n_iter, "wall_time": fits.seconds}
        logger.finished(None, None, hparams=hp, metrics=metrics,
                        config_text="```\n" + json.dumps(self.config_to_dict(cfg), indent=2) + "\n```")
        if not cfg.keep_checkpoints:
            common.remove_files([out / "checkpoints" / CHECKPOINT_NAME])
        return summary

    def format_summary(self, summary: dict) -> str:
        s = summary
        conv = sum(bool(c) for c in s["converged"])
        return "\n".join([
            f"FSSPCA on {s['data']} ({s['n_rows']} x {s['n_features']}, {s['split']} split over {s['n_workers']} "
            f"workers), {s['n_components']} loadings, alpha {s['alpha']}, {s['trials']} trial(s)",
            f"  explained variance {common.stat(s['explained_variance'])} | sparsity {common.stat(s['sparsity'])} | "
            f"iterations {common.stat(s['n_iter'], 'g')} | converged {conv}/{len(s['converged'])}",
            f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']})",
            f"outputs: {s['out_dir']}",
        ])

    def objective(self, summary: dict) -> float:
        """The explained variance (its mean over trials)."""
        return common.mean(summary["explained_variance"])


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=fsspca``
TASK = FSSPCATask()
