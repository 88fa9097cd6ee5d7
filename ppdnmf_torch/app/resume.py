"""``resume=<run folder>``: continue an interrupted run of any task with its own config.

:func:`resume_target` reads the folder's ``config.yaml`` through its task, takes from the
command line only what changes no iteration already done (:data:`RESUME_SAFE_KEYS` and the
task's :attr:`~.tasks.base.Task.resume_safe_keys`), and refuses any other change by name; the
runner refuses an iteration cap below what the checkpoints hold, before it writes anything.
"""
from __future__ import annotations

import os

from hydra.utils import to_absolute_path
from omegaconf import OmegaConf

from ..errors import ConfigError, PPDNMFError
from .tasks import task_of

__all__ = ["resume_target", "overridden", "saved_groups", "RESUME_SAFE_KEYS"]

#: the config keys ``resume=`` applies when given on the command line (they change no number
#: of the iterations done), besides the task's own (:attr:`~.tasks.base.Task.resume_safe_keys`,
#: PPDNMF's ``solver.bcd_iters``); any other override that differs from the run's own is refused
RESUME_SAFE_KEYS = ("progress", "progress_interval", "threads", "checkpoint_every", "keep_checkpoints",
                    "logger.flush_secs")



def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, key + "."))
        else:
            out[key] = v
    return out


def _unflat(flat: dict) -> dict:
    out: dict = {}
    for key, v in flat.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = v
    return out


def overridden(task_overrides) -> list:
    """The config keys (or groups) a command line set, Hydra's own and ``resume`` left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = []
    for o in OverridesParser.create().parse_overrides(list(task_overrides)):
        key = o.key_or_group
        if key.split(".")[0] in ("hydra", "resume"):
            continue
        keys.append(key)
    return keys


def _changes(keys, new: dict, saved: dict) -> dict:
    """``{flat key: (saved value, new value)}`` for the keys under the overridden ``keys`` whose
    new value differs from the run's own (``experiment`` covers every key)."""
    fn, fs = _flat(new), _flat(saved)
    out = {}
    for key in keys:
        under = [k for k in set(fn) | set(fs) if key == "experiment" or k == key or k.startswith(key + ".")]
        for k in sorted(under):
            if k == "resume" or fs.get(k) == fn.get(k):
                continue
            section = k.rsplit(".", 1)[0] if "." in k else ""
            if (k not in fn or k not in fs) and fs.get(f"{section}.kind") != fn.get(f"{section}.kind"):
                continue  # a key of one kind only: the change of kind says it
            out[k] = (fs.get(k), fn.get(k))
    return out


def _load_saved(folder: str) -> dict:
    cfg_file = os.path.join(folder, "config.yaml")
    if not os.path.isfile(cfg_file):
        raise ConfigError(f"resume: {folder!r} is not a ppdnmf run folder (no config.yaml)")
    try:
        with open(cfg_file, encoding="utf-8") as fh:
            d = OmegaConf.to_container(OmegaConf.load(fh), resolve=True)
    except Exception as exc:  # yaml's and omegaconf's many error types: the file is damaged
        raise ConfigError(f"resume: {cfg_file} is not a readable run config ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'no detail'}); the run cannot be resumed "
                          "from it") from None
    if not isinstance(d, dict):
        raise ConfigError(f"resume: {cfg_file} does not hold a run config (a mapping), it holds {type(d).__name__}")
    if not d:  # read as the defaults, it would look like another run
        raise ConfigError(f"resume: {cfg_file} is empty (damaged or truncated); the run cannot be resumed from it")
    return d


def resume_target(run_dir: str, new=None, task_overrides=()):
    """``resume=<run dir>``: that run's own config (with the safe overrides of this command line
    applied, :data:`RESUME_SAFE_KEYS`), its folder, and its checkpoints.

    Raises
    ------
    ConfigError
        For a folder that is not an unfinished run with checkpoints, a damaged config, or an
        override that would change the run (all of them listed).
    """
    folder = os.path.normpath(to_absolute_path(os.path.expanduser(run_dir)))
    d = _load_saved(folder)
    if os.path.isfile(os.path.join(folder, "summary.json")):
        raise ConfigError(f"resume: {folder!r} holds a finished run (it has summary.json); nothing to resume, "
                          "and its outputs are left as they are")
    ckpt = os.path.join(folder, "checkpoints")
    if not os.path.isdir(ckpt):
        raise ConfigError(f"resume: {folder!r} has no checkpoints: the run stopped before writing one (during the "
                          "centralized baseline, say); start it again")
    d["resume"] = None
    try:
        task = task_of(d)
        saved = task.config_to_dict(task.config_from_dict(d))
    except PPDNMFError as exc:
        raise ConfigError(f"resume: {os.path.join(folder, 'config.yaml')} holds an invalid run config ({exc})") from None
    if new is not None:
        changes = _changes(overridden(task_overrides), task_of(new).config_to_dict(new), saved)
        safe = tuple(task.resume_safe_keys) + RESUME_SAFE_KEYS
        unsafe = {k: v for k, v in changes.items() if k not in safe}
        if unsafe:
            shown = ", ".join(f"{k} ({a!r} -> {b!r})" for k, (a, b) in unsafe.items())
            raise ConfigError(f"resume: these overrides would change the run being resumed: {shown}; a resumed run "
                              f"keeps its own config and takes only {', '.join(safe)}; start a fresh "
                              "run for the others")
        if changes:
            flat = _flat(saved)
            flat.update({k: b for k, (a, b) in changes.items()})
            saved = _unflat(flat)
    return task.config_from_dict(saved), folder, ckpt


def saved_groups(argv) -> list:
    """The overrides that compose the config of the run ``resume=<folder>`` names: its ``task`` and
    its task's ``variant`` group, when not the defaults and not on the command line. Without them
    Hydra would compose the default task's config, and refuse a key of the run's own
    (``ppdnmf resume=<folder> agents.max_iter=500`` of a ``task=symnmf symnmf/variant=agents`` run)."""
    folder = next((a.split("=", 1)[1].strip("'\"") for a in argv if a.startswith("resume=")), None)
    if not folder or any(a.startswith("task=") for a in argv):
        return []
    try:
        import yaml  # PyYAML, a dependency of omegaconf; plain data only

        with open(os.path.join(os.path.expanduser(folder), "config.yaml"), encoding="utf-8") as fh:
            saved = yaml.safe_load(fh)
    except (OSError, ValueError, ImportError, yaml.YAMLError):
        return []  # resume_target says what is wrong with the folder
    task = saved.get("task") if isinstance(saved, dict) else None
    if not isinstance(task, str) or task == "ppdnmf" or not task.isidentifier():
        return []
    out = [f"task={task}"]
    variant = saved.get("variant")
    if isinstance(variant, str) and variant.isidentifier() and not any(a.startswith(f"{task}/variant=") for a in argv):
        out.append(f"{task}/variant={variant}")
    return out
