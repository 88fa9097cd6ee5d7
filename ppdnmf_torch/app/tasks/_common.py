"""What the tasks of the models other than PPDNMF share: the app's run keys as a dataclass
(:class:`RunKeys`), the config's conversion and check (``key: reason`` errors, through
:mod:`ppdnmf_torch.specs`, so a section may be a model's frozen spec), the ``graph`` and
``exchange`` sections of a variant across agents, the trial means the logger and the progress
show, and :class:`ModelTask`, whose ``trials > 1`` are the model's own batch.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..._utils import resolve_device
from ...errors import ConfigError, PPDNMFError
from ...exchange.spec import ExchangeSpec
from ...models.ppdnmf.config import DTYPES, GraphConfig, LoggerConfig, build_exchange, exchange_to_dict
from ...specs import build, check_dataclass, rule
from .base import Task

__all__ = ["RunKeys", "ModelTask", "DeviceInputs", "ModelFits", "mean", "rule", "config_from_dict", "config_to_dict",
           "check_run_keys", "trial_means", "stat", "validate", "build_exchange", "check_variant_sections", "make_graphs", "GraphConfig",
           "resume_point"]

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass
class RunKeys:
    """The app's run keys (``conf/config.yaml``; :class:`~.base.RunSettings`), the first fields
    of every non-PPDNMF task's config (a subclass redeclares ``task``)."""

    task: str = ""
    name: str = "custom"
    seed: int = rule(0, ge=0)
    device: str = "auto"
    dtype: str = rule("float64", choices=DTYPES)
    progress: bool = True
    progress_interval: float = rule(5.0, gt=0)
    threads: int | None = rule(None, ge=1)
    # independent trials, batched in one fit (trial dimension first)
    trials: int = rule(1, ge=1)
    # the model's checkpoint every this many outer iterations (0: none)
    checkpoint_every: int = rule(10, ge=0)
    keep_checkpoints: bool = False
    resume: str | None = None
    logger: LoggerConfig = field(default_factory=LoggerConfig)


def check_run_keys(cfg: RunKeys) -> None:
    """The checks of the run keys that are not a field's own range."""
    if not _DEVICE_RE.match(cfg.device):
        raise ConfigError(f"device: unknown value {cfg.device!r}; use auto, cpu, cuda or cuda:<k>")


def check_variant_sections(task: str, variant: str, name: str, chosen: bool, sections: dict, exchange_kind) -> None:
    """The sections that come with ``{task}/variant={variant}`` (``name``, ``graph``, ``exchange``):
    all there when it is ``chosen`` (with ``{name}.exchange`` the exchange group's kind), none of them
    otherwise; errors name the first section at fault."""
    if chosen:
        missing = [k for k, v in sections.items() if v is None]
        if missing:
            raise ConfigError(f"{missing[0]}: variant={variant} needs the {name}, graph and exchange sections "
                              f"(choose the variant with {task}/variant={variant}, which brings them)")
        if sections[name].exchange != exchange_kind:
            raise ConfigError(f"{name}.exchange: {sections[name].exchange!r} is not the exchange group's kind "
                              f"{exchange_kind!r}; choose the exchange with exchange=<kind>")
    else:
        extra = [k for k, v in sections.items() if v is not None]
        if extra:
            raise ConfigError(f"{extra[0]}: only variant={variant} takes it ({task}/variant={variant})")


def make_graphs(g: GraphConfig, n_agents: int, seeds) -> list:
    """The agents' graph of the ``graph`` section, one per seed (a random kind draws each from its
    trial's seed); refuses a graph below ``graph.min_degree``. Errors name ``graph.<key>``."""
    from ...graph import check_min_degree, make_graph

    try:
        graphs = [make_graph(g.kind, n_agents, seed=int(s), **g.params()) for s in seeds]
        for t, graph in enumerate(graphs):
            check_min_degree(graph, g.min_degree, trial=t if len(graphs) > 1 else None)
    except PPDNMFError as exc:
        raise exc.within("graph") from None
    return graphs


def resume_point(resume_from) -> int:
    """The outer iterations a model's checkpoint file or folder holds (the engine's
    ``ckpt_bcd<k>.pt``, every model); a run over ranks' folder (``rank<r>/`` inside): the newest
    iteration every rank has a checkpoint of; 0 when there is none."""
    from ...checkpoint import checkpoint_files, checkpoint_iteration

    path = Path(resume_from)
    if not path.is_dir():
        return checkpoint_iteration(path, "resume")
    ranks = sorted(p for p in path.glob("rank*") if p.is_dir())
    done = [{checkpoint_iteration(f, "resume") for f in checkpoint_files(p)} for p in (ranks or [path])]
    every = set.intersection(*done)
    return max(every) if every else 0


def config_from_dict(cls, d: Mapping, cross=None):
    """``d`` (Hydra's resolved config or a ``config.yaml``; a ``hydra`` node ignored) as a
    validated ``cls``; missing keys take the defaults, unknown keys are errors, an integral float
    is taken for an integer (``max_iter=1e3``); ``cross(cfg)`` checks what spans fields."""
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
    """The plain nested dict of a config (``config.yaml``): an exchange section as its config keys."""
    out = {}
    for f in fields(cfg):
        v = getattr(cfg, f.name)
        if isinstance(v, ExchangeSpec):
            out[f.name] = exchange_to_dict(v)
        elif is_dataclass(v):
            out[f.name] = asdict(v)
        else:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def trial_means(values: Mapping, prefix: str) -> dict:
    """``{prefix/key: mean over trials}`` of per-trial values (tensors, arrays or lists ``(T,)``)."""
    out = {}
    for k, v in values.items():
        a = np.asarray(torch.as_tensor(v).detach().cpu().double() if isinstance(v, torch.Tensor) else v,
                       dtype=np.float64)
        if a.size:
            out[f"{prefix}/{k}"] = float(np.nanmean(a))
    return out


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
    """What a model's task resolves before its fit (the model loads its own data): the device,
    the dtype, and the agents' graphs of a variant across agents (one per trial)."""

    device: torch.device
    dtype: torch.dtype
    graphs: list | None = None


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
