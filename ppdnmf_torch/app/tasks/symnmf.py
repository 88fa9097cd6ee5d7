"""The symmetric-NMF task: how the app runs :mod:`ppdnmf_torch.models.symnmf` (``ppdnmf task=symnmf``).

1. :meth:`SymNMFTask.build_inputs`: the device and dtype (the preset's data, its similarity
   and the starts are built by the model's :func:`~ppdnmf_torch.models.symnmf.presets.run_preset`);
2. :meth:`SymNMFTask.fit`: ``run_preset`` with the trials batched in one fit; every
   iteration's scalars (``symnmf/E``, ``symnmf/objective``, ``symnmf/rel_gap_UV``
   (``||U - V||_F / ||V||_F``), ``symnmf/gap_UV_sq``, ``symnmf/lambda``, and with labels
   ``symnmf/accuracy``, ``symnmf/nmi``), their means over trials, to the logger and the
   progress; the model's checkpoints in ``out/checkpoints``;
3. :meth:`SymNMFTask.write_outputs`: one ``.npy`` per array (``U``, ``V``, ``labels``,
   ``cluster_sizes``, ``cluster_means``, ...), ``history.csv`` (a row per iteration and
   trial), the images of the reordered similarity and of the cluster means; the summary.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...errors import ConfigError
from ...models.symnmf import checkpoint as symnmf_checkpoint
from ...models.symnmf.fit import METHODS
from ...models.symnmf.presets import PRESETS, run_preset
from ..progress import Progress
from . import _common as common
from ._common import DeviceInputs, ModelFits, ModelTask, RunKeys, spec

__all__ = ["TASK", "SymNMFTask", "SymNMFRunConfig", "SymNMFData", "SymNMFSolver", "CONFIG_KEYS"]


@dataclass
class SymNMFData:
    """A preset: ``synthetic`` (``X = U* U*^T + sigma |N|``, ``n`` x ``n``), ``orl`` (``path``:
    ``orl_faces.mat``), ``digits``, a user's ``samples`` (rows) or ``similarity`` (``path``:
    ``.npy``/``.csv``, or ``.npz`` for a sparse similarity), with ``labels_path`` optional."""

    preset: str = spec("synthetic", choices=PRESETS)
    path: str | None = None
    labels_path: str | None = None
    n: int = spec(300, ge=2)
    sigma: float = spec(0.1, ge=0)
    # neighbours of Kuang et al.'s similarity of samples (null: its default)
    n_neighbors: int | None = spec(None, ge=1)


@dataclass
class SymNMFSolver:
    """The fit's settings (:func:`~ppdnmf_torch.models.symnmf.fit.fit_symnmf`)."""

    method: str = spec("symhals", choices=METHODS)
    # lambda's rule: adaptive | bound | kuang (null: the method's default)
    penalty: str | None = spec(None, choices=("adaptive", "bound", "kuang"))
    # fixed lambda (one value, or one per trial); overrides penalty
    lam: float | list[float] | None = spec(None, ge=0)
    lam0: float | None = spec(None, gt=0)
    max_iter: int = spec(500, ge=1)
    tol: float = spec(1e-6, ge=0)
    # the start U_0: scaled (uniform on [0, 2 sqrt(mean(X) / rank)]) | uniform (on [0, 1])
    init: str = spec("scaled", choices=("scaled", "uniform"))


@dataclass
class SymNMFRunConfig(RunKeys):
    """One ``ppdnmf task=symnmf`` run (``conf/task/symnmf.yaml``)."""

    task: str = spec("symnmf", choices=("symnmf",))
    # r (null: the number of classes of a labelled preset, 20 otherwise)
    rank: int | None = spec(None, ge=1)
    data: SymNMFData = field(default_factory=SymNMFData)
    solver: SymNMFSolver = field(default_factory=SymNMFSolver)

    def validate(self) -> "SymNMFRunConfig":
        return common.validate(self, _cross)


def _cross(cfg: SymNMFRunConfig) -> None:
    d = cfg.data
    if d.preset in ("orl", "samples", "similarity") and not d.path:
        raise ConfigError(f"data.path: data.preset={d.preset} needs a file")
    lam = cfg.solver.lam
    if isinstance(lam, list) and len(lam) != cfg.trials:
        raise ConfigError(f"solver.lam: a list needs one value per trial ({cfg.trials}), got {len(lam)}")


#: the API's parameter names and the config keys they come from
CONFIG_KEYS = {"path": "data.path", "labels_path": "data.labels_path", "n": "data.n", "preset": "data.preset", "method": "solver.method", "penalty": "solver.penalty",
               "lam0": "solver.lam0", "max_iter": "solver.max_iter", "tol": "solver.tol", "rank": "rank",
               "checkpoint_dir": "resume"}


class SymNMFTask(ModelTask):
    """Symmetric NMF as the app runs it."""

    name = "symnmf"
    config_cls = SymNMFRunConfig
    cross = staticmethod(_cross)
    config_keys = CONFIG_KEYS
    resume_safe_keys = ("solver.max_iter",)  # the model's checkpoints allow another max_iter

    def resume_point(self, resume_from) -> int:
        path = Path(resume_from)
        path = symnmf_checkpoint.latest(path) if path.is_dir() else path
        if path is None:
            return 0
        digits = os.path.basename(os.fspath(path))[len(symnmf_checkpoint.PREFIX):].split(".")[0]
        return int(digits) if digits.isdigit() else 0

    def fit(self, cfg: SymNMFRunConfig, inputs: DeviceInputs, logger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> ModelFits:
        s, d = cfg.solver, cfg.data
        ckpt = out / "checkpoints"
        start = self.resume_point(ckpt) if resume_from is not None else 0
        label = f"SymNMF ({d.preset}, {s.method}" + (f", {cfg.trials} trials)" if cfg.trials > 1 else ")")
        with Progress(show, s.max_iter, label, interval=cfg.progress_interval, start=start,
                      step="iteration") as bar:

            def log_scalars(k, values):
                means = common.trial_means(values, "")
                means = {tag.lstrip("/"): v for tag, v in means.items()}
                logger.scalars(k, means)
                if "symnmf/E" in means:  # the labels' scores come in a second call
                    bar.update(k, {"E": means["symnmf/E"], "lambda": means["symnmf/lambda"],
                                   "||U-V||/||V||": means["symnmf/rel_gap_UV"]})

            t0 = time.perf_counter()
            summary, arrays = run_preset(
                d.preset, cfg.rank, path=d.path, labels_path=d.labels_path, n=d.n, sigma=d.sigma,
                n_neighbors=d.n_neighbors, init=s.init, seed=cfg.seed, trials=cfg.trials, log_scalars=log_scalars,
                device=inputs.device, dtype=inputs.dtype, method=s.method,
                penalty=s.lam if s.lam is not None else s.penalty, lam0=s.lam0, max_iter=s.max_iter, tol=s.tol,
                callback=callback, checkpoint_dir=ckpt if cfg.checkpoint_every else None,
                checkpoint_every=cfg.checkpoint_every, resume=resume_from is not None)
        return ModelFits(summary, arrays, time.perf_counter() - t0)

    def write_outputs(self, cfg: SymNMFRunConfig, inputs: DeviceInputs, fits: ModelFits, out: Path,
                      logger) -> dict:
        arrays = fits.arrays
        histories = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("history/")}
        # the reordered similarity is an image (n x n), not an output of the fit
        common.write_arrays(out, {k: v for k, v in arrays.items()
                                  if not k.startswith("history/") and k != "reordered_similarity"})
        common.write_history_csv(out / "history.csv", histories)
        s = fits.summary
        n_iter = max(s["n_iter"])
        if cfg.logger.images:
            if "reordered_similarity" in arrays:
                logger.image("images/reordered_similarity", arrays["reordered_similarity"], n_iter)
            if "cluster_mean_images" in arrays:
                logger.image("images/cluster_means", arrays["cluster_mean_images"], n_iter,
                             scale=cfg.logger.image_scale, normalize=True)
        summary = {"task": self.name, "name": cfg.name, "data": cfg.data.preset, "seed": cfg.seed,
                   "device": str(inputs.device), "dtype": cfg.dtype, **s,
                   "wall_time": {"fit": fits.seconds, "solver": s.get("wall_time")}, "out_dir": str(out)}
        summary = json.loads(json.dumps(summary, default=str))
        hp = {"name": cfg.name, "data": cfg.data.preset, "method": cfg.solver.method, "penalty": str(s["penalty"]),
              "rank": s["rank"], "n": s["n"], "trials": cfg.trials, "seed": cfg.seed, "init": cfg.solver.init,
              "dtype": cfg.dtype}
        metrics = {"E": common.mean(s["E"]), "rel_gap_UV": common.mean(s["rel_gap"]), "n_iter": n_iter,
                   "wall_time": fits.seconds,
                   **({"accuracy": common.mean(s["accuracy"]), "nmi": common.mean(s["nmi"])} if "accuracy" in s else {})}
        logger.finished(None, None, hparams=hp, metrics=metrics,
                        config_text="```\n" + json.dumps(self.config_to_dict(cfg), indent=2) + "\n```")
        if not cfg.keep_checkpoints:
            folder = out / "checkpoints"
            common.remove_files(sorted(folder.glob(f"{symnmf_checkpoint.PREFIX}*.pt")) or [folder / "-"])
        return summary

    def format_summary(self, summary: dict) -> str:
        s = summary
        conv = sum(bool(c) for c in s["converged"])
        lines = [f"SymNMF on {s['data']} (n = {s['n']}, rank {s['rank']}), {s['method']} with penalty "
                 f"{s['penalty']}, {s['trials']} trial(s)",
                 f"  E {common.stat(s['E'], '.6g')} | ||U - V||/||V|| {common.stat(s['rel_gap'], '.3g')} | "
                 f"iterations {common.stat(s['n_iter'], 'g')} | converged {conv}/{len(s['converged'])}"]
        if "accuracy" in s:
            lines.append(f"  clustering accuracy {common.stat(s['accuracy'])} | NMI {common.stat(s['nmi'])}")
        lines += [f"wall time: fit {s['wall_time']['fit']:.2f} s ({s['device']}, {s['dtype']})",
                  f"outputs: {s['out_dir']}"]
        return "\n".join(lines)

    def objective(self, summary: dict) -> float:
        """The final fitting error ``E`` (its mean over trials)."""
        return common.mean(summary["E"])


#: the task :mod:`ppdnmf_torch.app.tasks` finds under ``task=symnmf``
TASK = SymNMFTask()
