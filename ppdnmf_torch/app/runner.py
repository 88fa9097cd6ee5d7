"""One run of the app, without Hydra, for every model: :func:`run` turns a task's typed config
into a run folder.

The runner does what is the same for every model and asks the config's task
(:mod:`ppdnmf_torch.app.tasks`, :class:`~ppdnmf_torch.app.tasks.base.Task`) for the rest:

* the folder: created, locked while the run writes (:mod:`ppdnmf_torch.app.rundir`), refused
  when it holds an unfinished run of any task, its old ``summary.json`` removed;
* ``config.yaml`` (the task's config as run), the logger (TensorBoard or none; a resumed
  run's events after its checkpoint dropped), ``threads`` applied once and restored;
* the task's three steps (:meth:`~.Task.build_inputs`, :meth:`~.Task.fit`,
  :meth:`~.Task.write_outputs`), or its batched trials (:meth:`~.Task.run_trials`) with
  ``trials > 1``;
* ``summary.json`` last (its presence marks a finished run), then the checkpoints removed
  (unless ``keep_checkpoints``); an error's key re-rooted at the config's key once
  (:attr:`~.Task.config_keys`: ``exchange.g_bits``, not the API's ``g_bits``).

The runner never prints: the CLI (:mod:`ppdnmf_torch.app.cli`) prints the task's summary lines.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..errors import PPDNMFError
from ..threads import using_threads
from .loggers import NullLogger, RunLogger
from .outputs import write_summary, write_yaml
from .rundir import RunFolderLock, refuse_unfinished_run, remove_checkpoints
from .tasks import Task, task_of

__all__ = ["run", "make_logger"]


def make_logger(kind: str, folder, *, flush_secs: int = 30, resume_at: int | None = None,
                x_iters: int = 1) -> RunLogger:
    """The logger of ``logger.kind``: ``"tensorboard"`` (events under ``folder``) or ``"none"``.
    ``resume_at``: a resumed run's completed BCD iterations (the events after them, written
    before the interruption, are dropped so that no step is shown twice)."""
    if kind == "tensorboard":
        from .tensorboard import TensorBoardLogger

        return TensorBoardLogger(folder, flush_secs=flush_secs, resume_at=resume_at, x_iters=x_iters)
    return NullLogger()


def _resume_point(task: Task, cfg, resume_from) -> int | None:
    """The outer iterations the checkpoints of a resumed run hold, checked against the run's
    iteration cap before anything is written: a cap below them would leave a ``config.yaml`` that
    says fewer iterations than the run holds.

    Raises
    ------
    CheckpointError
        Naming the cap's config key (``solver.max_iter``), what was done and what to give.
    """
    from ..checkpoint import CheckpointError

    try:
        done = task.resume_point(resume_from)
    except PPDNMFError:
        raise
    except Exception:  # noqa: BLE001 - a damaged checkpoint: the fit refuses it by name
        return None
    key, cap = task.iteration_cap(cfg)
    if key and cap is not None and done > cap:
        raise CheckpointError(f"{key}: the checkpoint {str(resume_from)!r} has done {done} {task.step}s, more than "
                              f"{key.rsplit('.', 1)[-1]} = {cap}; give {key} >= {done} (or leave it out): nothing was "
                              "written")
    return done


def run(cfg, out_dir, *, progress: bool | None = None, callback=None, resume_from=None,
        task: Task | None = None) -> dict:
    """Run one experiment of ``cfg``'s task and write its outputs into ``out_dir``.

    Parameters
    ----------
    cfg : a task's typed config (PPDNMF: :class:`~ppdnmf_torch.models.ppdnmf.config.RunConfig`)
        Validated here again (so a hand-built config gets the same checks).
    out_dir : str or os.PathLike
        Created if missing; locked while the run writes (a second run into it is refused).
    progress : bool, optional
        Report progress (default ``cfg.progress``): tqdm bars on a terminal, log lines on the
        ``ppdnmf_torch.app.progress`` logger elsewhere.
    callback : callable, optional
        Extra ``callback(info)`` of the distributed fit, called after the logger's.
    resume_from : str or os.PathLike, optional
        Checkpoint file or folder of this same run to continue from (bit-identical to an
        uninterrupted run). Checkpoints are written to ``out_dir/checkpoints`` every
        ``cfg.checkpoint_every`` BCD iterations and on Ctrl-C, and removed when the run
        finishes (``cfg.keep_checkpoints`` keeps them).
    task : Task, optional
        The task that runs ``cfg`` (default: the one its ``task`` names).

    Returns
    -------
    dict
        The summary also written to ``summary.json``.

    Raises
    ------
    PPDNMFError
        (ConfigError, DataError, GraphError, CodecRangeError, NumericalError, CheckpointError,
        RunFolderError) for bad input, a folder in use or a failed run; its key names the
        config's keys (``exchange.g_bits``).
    OSError
        When the folder cannot be written (read-only, full): the checkpoints written so far
        are kept.
    """
    t_start = time.perf_counter()
    task = task_of(cfg) if task is None else task
    try:
        cfg.validate()
        out = Path(out_dir)
        with using_threads(cfg.threads), RunFolderLock(out):
            if resume_from is None:
                refuse_unfinished_run(out)
                # a fresh run in a used folder: the old run's summary would mark this one finished
                # (the CLI refuses to resume a folder with a summary.json)
                (out / "summary.json").unlink(missing_ok=True)
            resume_at = _resume_point(task, cfg, resume_from) if resume_from is not None else None
            write_yaml(out / "config.yaml", task.config_to_dict(cfg))
            show = cfg.progress if progress is None else bool(progress)
            with make_logger(cfg.logger.kind, out / "tb", flush_secs=cfg.logger.flush_secs, resume_at=resume_at,
                             x_iters=task.inner_iterations(cfg)) as logger:
                if cfg.trials > 1:
                    summary = task.run_trials(cfg, out, logger, show=show, callback=callback)
                else:
                    inputs = task.build_inputs(cfg)
                    fits = task.fit(cfg, inputs, logger, out, show=show, callback=callback, resume_from=resume_from)
                    summary = task.write_outputs(cfg, inputs, fits, out, logger)
            summary["wall_time"]["total"] = time.perf_counter() - t_start
            write_summary(out / "summary.json", summary)
            if not cfg.keep_checkpoints:
                remove_checkpoints(out, task.checkpoint_patterns)
    except PPDNMFError as exc:
        raise exc.renamed(task.keys_of(cfg)) from None
    return summary
