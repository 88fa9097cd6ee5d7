"""What the tasks of the models other than PPDNMF share: the app's run keys as a dataclass
(:class:`RunKeys`), the config's conversion and check (``key: reason`` errors), the files of
a batched fit (one ``.npy`` per array, ``history.csv`` with a row per iteration and trial),
the trial means the logger and the progress show, and the removal of a model's own
checkpoint files once the run's outputs are written.
"""
from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..._utils import resolve_device
from ...errors import ConfigError
from .base import Task
from ...models.ppdnmf.config import DTYPES, LoggerConfig
from ...specs import build, check_dataclass, rule as spec

__all__ = ["RunKeys", "ModelTask", "DeviceInputs", "ModelFits", "mean", "spec", "config_from_dict", "config_to_dict", "check_run_keys", "trial_means",
           "write_arrays", "write_history_csv", "remove_files", "stat", "validate"]

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass
class RunKeys:
    """The app's run keys (``conf/config.yaml``; :class:`~.base.RunSettings`), the first fields
    of every non-PPDNMF task's config (a subclass redeclares ``task``)."""

    task: str = ""
    name: str = "custom"
    seed: int = spec(0, ge=0)
    device: str = "auto"
    dtype: str = spec("float64", choices=DTYPES)
    progress: bool = True
    progress_interval: float = spec(5.0, gt=0)
    threads: int | None = spec(None, ge=1)
    # independent trials, batched in one fit (trial dimension first)
    trials: int = spec(1, ge=1)
    # the model's checkpoint every this many outer iterations (0: none)
    checkpoint_every: int = spec(10, ge=0)
    keep_checkpoints: bool = False
    resume: str | None = None
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def check_run_keys(cfg: RunKeys) -> None:
    """The checks of the run keys that are not a field's own range."""
    if not _DEVICE_RE.match(cfg.device):
        raise ConfigError(f"device: unknown value {cfg.device!r}; use auto, cpu, cuda or cuda:<k>")


def config_from_dict(cls, d: Mapping, cross=None):
    """``d`` (Hydra's resolved config or a ``config.yaml``; a ``hydra`` node ignored) as a
    validated ``cls``; missing keys take the defaults, unknown keys are errors; ``cross(cfg)``
    checks what spans fields."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"config: must be a mapping of keys to values, got {type(d).__name__}")
    cfg = build(cls, {k: v for k, v in d.items() if k != "hydra"})
    check_run_keys(cfg)
    if cross is not None:
        cross(cfg)
    return cfg


def validate(cfg, cross=None):
    """Re-check an already built config (the runner's ``cfg.validate()``)."""
    check_dataclass(cfg)
    check_run_keys(cfg)
    if cross is not None:
        cross(cfg)
    return cfg


def config_to_dict(cfg) -> dict:
    """The plain nested dict of a config (``config.yaml``)."""
    return asdict(cfg)


def trial_means(values: Mapping, prefix: str) -> dict:
    """``{prefix/key: mean over trials}`` of per-trial values (tensors, arrays or lists ``(T,)``)."""
    out = {}
    for k, v in values.items():
        a = np.asarray(torch.as_tensor(v).detach().cpu().double() if isinstance(v, torch.Tensor) else v,
                       dtype=np.float64)
        if a.size:
            out[f"{prefix}/{k}"] = float(np.nanmean(a))
    return out


def write_arrays(folder: Path, arrays: Mapping) -> list:
    """Each array as ``folder/<name>.npy`` (NumPy; ``/`` in a name becomes ``_``); returns the names."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for k, v in arrays.items():
        a = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        name = k.replace("/", "_")
        np.save(folder / f"{name}.npy", a, allow_pickle=False)
        names.append(name)
    return names


def write_history_csv(path: Path, histories: Mapping) -> None:
    """``history.csv``: one row per (iteration, 1-based; trial, 0-based), one column per history ``(n_iter, T)``
    (a history shorter than the longest leaves its cells empty)."""
    hs = {k: np.asarray(v.detach().cpu() if isinstance(v, torch.Tensor) else v, dtype=np.float64)
          for k, v in histories.items()}
    hs = {k: (a[:, None] if a.ndim == 1 else a) for k, a in hs.items()}
    n = max((a.shape[0] for a in hs.values()), default=0)
    T = max((a.shape[1] for a in hs.values()), default=1)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["iteration", "trial", *hs])
        for i in range(n):
            for t in range(T):
                w.writerow([i + 1, t, *(repr(float(a[i, t])) if i < a.shape[0] and t < a.shape[1] else ""
                                    for a in hs.values())])


def remove_files(paths) -> None:
    """Remove a model's own checkpoint files (and their folder when it is then empty)."""
    for p in paths:
        p = Path(p)
        p.unlink(missing_ok=True)
        try:
            p.parent.rmdir()
        except OSError:
            pass


def stat(values, fmt: str = ".4g") -> str:
    """``v`` for one trial, ``mean +- std (min..max)`` over several."""
    a = np.asarray(values, dtype=np.float64).reshape(-1)
    if a.size == 1:
        return format(float(a[0]), fmt)
    return f"{a.mean():{fmt}} +- {a.std():{fmt}} ({a.min():{fmt}}..{a.max():{fmt}})"


def mean(values) -> float:
    """The mean of a per-trial list."""
    return float(sum(values) / len(values))


@dataclass
class DeviceInputs:
    """What a model's task resolves before its fit (the model loads its own data)."""

    device: torch.device
    dtype: torch.dtype


@dataclass
class ModelFits:
    """A model's ``(summary, arrays)`` and the fit's wall time in seconds."""

    summary: dict
    arrays: dict
    seconds: float


class ModelTask(Task):
    """A task whose model loads its data and batches its trials in one fit: the config's
    conversion from :attr:`config_cls` (checked across fields by :attr:`cross`), the inputs
    (device and dtype), and ``trials > 1`` as the same three steps."""

    config_cls: type = RunKeys
    cross: Callable | None = None

    def config_from_dict(self, d: dict):
        return config_from_dict(self.config_cls, d, type(self).cross)

    def config_to_dict(self, cfg) -> dict:
        return config_to_dict(cfg)

    def build_inputs(self, cfg) -> DeviceInputs:
        return DeviceInputs(resolve_device(cfg.device), getattr(torch, cfg.dtype))

    def run_trials(self, cfg, out: Path, logger, *, show: bool, callback=None) -> dict:
        inputs = self.build_inputs(cfg)
        fits = self.fit(cfg, inputs, logger, out, show=show, callback=callback)
        return self.write_outputs(cfg, inputs, fits, out, logger)
