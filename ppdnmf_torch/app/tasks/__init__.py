"""The app's tasks, one per model, found by name: ``task=<name>`` runs
``ppdnmf_torch/app/tasks/<name>.py``'s ``TASK`` (a :class:`~.base.Task`) with the defaults of
``conf/task/<name>.yaml``. Adding a model to the app is adding those two files; nothing here
lists them.
"""
from __future__ import annotations

import importlib
import pkgutil

from ...errors import ConfigError
from .base import Task

__all__ = ["Task", "DEFAULT_TASK", "get_task", "task_names", "task_of"]

#: the task of ``ppdnmf`` without ``task=``, and of a config (or a run folder) that names none
DEFAULT_TASK = "ppdnmf"


def task_names() -> tuple:
    """The names of the tasks this package holds (its modules other than ``base`` and the
    private helpers ``_*``), sorted."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if m.name != "base" and not m.name.startswith("_") and not m.ispkg))


def get_task(name: str) -> Task:
    """The task called ``name``.

    Raises
    ------
    ConfigError
        ``task: unknown value ...`` for a name no module of this package holds.
    """
    names = task_names()
    if not isinstance(name, str) or name not in names:
        raise ConfigError(f"task: unknown value {name!r}; use one of {', '.join(names)}")
    task = importlib.import_module(f"{__name__}.{name}").TASK
    if not isinstance(task, Task) or task.name != name:
        raise TypeError(f"{__name__}.{name}.TASK must be a Task named {name!r}")  # a programming error
    return task


def task_of(cfg_or_dict) -> Task:
    """The task of a typed config (its ``task`` attribute) or of a config dict (its ``task``
    key; :data:`DEFAULT_TASK` when it has none: run folders written before tasks existed)."""
    if isinstance(cfg_or_dict, dict):
        return get_task(cfg_or_dict.get("task") or DEFAULT_TASK)
    return get_task(getattr(cfg_or_dict, "task", None) or DEFAULT_TASK)
