"""The task interface: what the app needs from a model to run it.

A *task* is one model as the app sees it. The runner (:func:`ppdnmf_torch.app.runner.run`)
owns everything that is the same for every model (the run folder and its lock,
``config.yaml`` and ``summary.json``, the logger, threads, removing checkpoints, naming
config keys in errors) and calls the task for the rest, in this order::

    cfg = task.config_from_dict(d)                  # the CLI: Hydra's dict -> typed config
    inputs = task.build_inputs(cfg)                 # 1. data, split, graph, device, dtype
    fits = task.fit(cfg, inputs, logger, out, show=..., callback=..., resume_from=...)
                                                    # 2. the fits, with progress and the logger
    summary = task.write_outputs(cfg, inputs, fits, out, logger)
                                                    # 3. files, the logger's end, the summary
    print(task.format_summary(summary))             # the CLI's lines

and, with ``cfg.trials > 1``, ``summary = task.run_trials(cfg, out, logger, show=..., callback=...)``
instead of steps 1 to 3. Over ranks (:mod:`ppdnmf_torch.app.distributed`), every rank calls
``task.run_rank(cfg, out, comm, logger, ...)`` (rank 0 returns the summary), after
``task.n_agents(cfg)`` said how many agents the ranks share (or refused with one line).

A task's module is ``ppdnmf_torch/app/tasks/<name>.py`` holding ``TASK``, an instance of a
:class:`Task` subclass; ``conf/task/<name>.yaml`` brings its Hydra defaults, its groups
(``conf/<name>/``) and its help (``conf/hydra/help/<name>.yaml``); :mod:`ppdnmf_torch.app.tasks`
finds them by name. A task is an adapter: the settings are the model's specs
(``models/<name>/config.py``), the work is the model's functions.
"""
from __future__ import annotations

import abc
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Task", "RunSettings", "LoggerSettings"]


class LoggerSettings(Protocol):
    """The ``logger`` section every task's config has (``conf/logger/*.yaml``)."""

    kind: str
    flush_secs: int


class RunSettings(Protocol):
    """The keys of a task's config that the app reads itself (the top of ``conf/config.yaml``):
    every task's typed config has them, with the same meaning."""

    task: str
    seed: int
    device: str
    dtype: str
    progress: bool
    progress_interval: float
    threads: int | None
    trials: int
    checkpoint_every: int
    keep_checkpoints: bool
    resume: str | None
    logger: LoggerSettings

    def validate(self) -> Any:
        """Check every value; raise :class:`~ppdnmf_torch.errors.ConfigError` naming the key."""


class Task(abc.ABC):
    """One model as the app runs it (see the module's docstring for the order of the calls).

    Attributes
    ----------
    name : str
        The task's name: ``task=<name>`` on the command line, ``conf/task/<name>.yaml``,
        ``ppdnmf_torch/app/tasks/<name>.py``, and the ``task`` key of its configs.
    config_keys : dict
        ``{API parameter name: config key}``: an error raised with the API's parameter
        (``g_bits``) is re-rooted at the config's key (``exchange.g_bits``) once, by the runner.
    resume_safe_keys : tuple
        Keys of the task's own that ``resume=`` takes from the command line.
    checkpoint_patterns : tuple
        Glob patterns of the model's checkpoint files in ``<run>/checkpoints`` (and its ranks'
        ``rank<r>/``): removed once a run's outputs are written.
    step : str
        What one outer iteration is called in the progress lines and the Ctrl-C message.
    """

    name: str = ""
    config_keys: dict = {}
    #: config keys besides the app's own (:data:`ppdnmf_torch.app.cli.RESUME_SAFE_KEYS`) that
    #: ``resume=`` takes from the command line: they change no iteration already done (an
    #: iteration cap, :meth:`iteration_cap`, only at or above what the checkpoint has done)
    resume_safe_keys: tuple = ()
    checkpoint_patterns: tuple = ("ckpt_bcd[0-9]*.pt",)
    step: str = "BCD iteration"

    def keys_of(self, cfg) -> dict:
        """``{API parameter name: config key}`` for ``cfg`` (a variant may name them otherwise);
        default :attr:`config_keys`."""
        return self.config_keys

    def iteration_cap(self, cfg) -> tuple:
        """``(config key, value)`` of ``cfg``'s outer iteration cap (a resume may raise it)."""
        return "", None

    def n_agents(self, cfg) -> int:
        """The agents a run over ranks places on the ranks; raises ``ConfigError`` (one line) for a
        config (or a task) with no run over ranks."""
        from ...errors import ConfigError

        raise ConfigError(f"task: task={self.name} has no run over ranks in this version; run it in one process")

    def run_rank(self, cfg, out: Path, comm, logger, *, partition="rcm", assignment=None, share="all",
                 resume: bool = False, callback=None):
        """One rank of a run over ranks (:mod:`ppdnmf_torch.app.distributed`): inputs, fit and, on
        rank 0, the outputs (returns the summary there, None elsewhere)."""
        raise NotImplementedError(self.name)

    # -- config ---------------------------------------------------------------------------

    @abc.abstractmethod
    def config_from_dict(self, d: dict) -> RunSettings:
        """A validated typed config from a nested dict (Hydra's composed config, or a run
        folder's ``config.yaml``); raises ``ConfigError`` naming the dotted key."""

    @abc.abstractmethod
    def config_to_dict(self, cfg: RunSettings) -> dict:
        """The plain nested dict of ``cfg`` (``config.yaml``; :meth:`config_from_dict` reads it back)."""

    def inner_iterations(self, cfg: RunSettings) -> int:
        """Inner iterations per outer iteration (the TensorBoard step of inner curves is
        ``(outer - 1) * inner_iterations + inner``); 1 when the model has none."""
        return 1

    # -- a run ----------------------------------------------------------------------------

    @abc.abstractmethod
    def build_inputs(self, cfg: RunSettings) -> Any:
        """Step 1: what the run works on (data, its split over the agents, the graph, the
        resolved device and dtype). Errors name the config's keys."""

    @abc.abstractmethod
    def fit(self, cfg: RunSettings, inputs: Any, logger, out: Path, *, show: bool, callback=None,
            resume_from=None) -> Any:
        """Step 2: the fits, reporting each outer iteration to ``logger``
        (:class:`~ppdnmf_torch.app.loggers.RunLogger`) and to a
        :class:`~ppdnmf_torch.app.progress.Progress` shown when ``show``; checkpoints go to
        ``out / "checkpoints"`` every ``cfg.checkpoint_every`` outer iterations, and
        ``resume_from`` (a checkpoint file or folder of this run) continues from one."""

    @abc.abstractmethod
    def write_outputs(self, cfg: RunSettings, inputs: Any, fits: Any, out: Path, logger) -> dict:
        """Step 3: the task's files in ``out`` and the logger's end of run (hparams, final
        metrics); returns the summary (the runner adds ``wall_time.total`` and writes it to
        ``summary.json`` last: its presence marks a finished run)."""

    @abc.abstractmethod
    def run_trials(self, cfg: RunSettings, out: Path, logger, *, show: bool, callback=None) -> dict:
        """``cfg.trials`` independent trials (seeds ``cfg.seed + t``) as one batched computation:
        their files in ``out``, the logger's curves of the trial means; returns the summary."""

    def resume_point(self, resume_from) -> int:
        """The outer iterations a checkpoint file or folder of this task has completed (the
        logger drops its events after them). Default: the library's checkpoint files."""
        from ...checkpoint import checkpoint_iteration, latest_checkpoint

        return checkpoint_iteration(latest_checkpoint(resume_from))

    # -- what the CLI shows -----------------------------------------------------------------

    @abc.abstractmethod
    def format_summary(self, summary: dict) -> str:
        """The lines the CLI prints at the end of a run."""

    def objective(self, summary: dict) -> float | None:
        """The number a run returns to Hydra's sweepers (an optimizer over a parameter)."""
        return None
