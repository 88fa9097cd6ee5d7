"""A run's folder: written by one run at a time, never taken over by another run.

* :class:`RunFolderLock` holds ``<folder>/.ppdnmf.lock`` (an ``flock`` on a file that names
  its owner: process, host, start time, command) while a run writes; a second run into the
  same folder is refused with the owner named. The kernel drops the lock when its holder
  dies, so a killed run never leaves the folder locked.
* :func:`refuse_unfinished_run`: a fresh run, of any task, refuses a folder that holds an
  unfinished run of any task (its checkpoints, or its ``config.yaml`` without a ``summary.json``):
  they are someone's work; the message says how to resume them. The CLI checks before Hydra
  writes anything into the folder; the runner again before it writes.
* :func:`remove_checkpoints`: a run that finished removes its own checkpoints (unless told
  to keep them), once every output is written.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex

from ..errors import PPDNMFError
from ..folderlock import LOCK_NAME, FolderLock

__all__ = ["RunFolderError", "RunFolderLock", "refuse_unfinished_run", "unfinished_run", "remove_checkpoints",
           "LOCK_NAME", "CHECKPOINT_PATTERNS"]

#: the checkpoint files of every model (one format, :mod:`ppdnmf_torch.checkpoint`'s
#: ``ckpt_bcd<k>.pt``; the tasks' ``checkpoint_patterns``), and the temporary files of an atomic
#: write that a killed run may leave (:func:`ppdnmf_torch.checkpoint.write_atomically`)
CHECKPOINT_PATTERNS = ("ckpt_bcd[0-9]*.pt", ".tmp_*")


class RunFolderError(PPDNMFError):
    """A run folder is in use by another run, or holds another run's work."""


class RunFolderLock(FolderLock):
    """An exclusive lock on a run folder (:data:`LOCK_NAME` inside it), held until :meth:`release`.

    Raises
    ------
    RunFolderError
        From :meth:`acquire`, naming ``out_dir`` and the run that holds the folder.
    """

    def __init__(self, folder):
        super().__init__(folder, key="out_dir", error=RunFolderError)


def _files_under(folder: str) -> list:
    """The files under ``folder`` (a run's checkpoints and its ranks' folders), oldest first."""
    found = []
    for root, _, names in os.walk(folder):
        for n in names:
            if n != LOCK_NAME:
                p = os.path.join(root, n)
                try:
                    found.append((os.path.getmtime(p), n, p))
                except OSError:
                    pass
    return [p for _, _, p in sorted(found)]


def unfinished_run(folder) -> str | None:
    """What in ``folder`` is an unfinished run of any task, in words, or None: the files under its
    ``checkpoints`` folder, or a ``config.yaml`` with no ``summary.json`` beside it."""
    folder = os.path.abspath(os.fspath(folder))
    files = _files_under(os.path.join(folder, "checkpoints"))
    if files:
        return f"the checkpoints of an interrupted run (newest: {os.path.basename(files[-1])})"
    if os.path.isfile(os.path.join(folder, "config.yaml")) and not os.path.isfile(os.path.join(folder, "summary.json")):
        return "an unfinished run (its config.yaml and no summary.json; it stopped before its first checkpoint)"
    return None


def refuse_unfinished_run(folder) -> None:
    """Refuse a fresh run in ``folder`` when it holds an unfinished run of any task
    (:func:`unfinished_run`): writing there would lose it, or turn it into a finished run.

    Raises
    ------
    RunFolderError
        Naming ``out_dir``, what it holds and the ways on.
    """
    folder = os.path.abspath(os.fspath(folder))
    why = unfinished_run(folder)
    if why is None:
        return
    if why.startswith("the checkpoints"):
        raise RunFolderError(
            f"out_dir: {folder} holds {why}; continue it with: ppdnmf resume={shlex.quote(folder)}; or remove "
            f"{os.path.join(folder, 'checkpoints')} to start over there; or give this run another folder")
    raise RunFolderError(f"out_dir: {folder} holds {why}; remove its config.yaml to start over there, or give this "
                         "run another folder")


def _remove_checkpoint_files(ckpt: str, patterns) -> int:
    removed = 0
    for name in os.listdir(ckpt):
        if any(fnmatch.fnmatchcase(name, p) for p in patterns) and os.path.isfile(os.path.join(ckpt, name)):
            try:
                os.unlink(os.path.join(ckpt, name))
                removed += 1
            except OSError:
                pass
    return removed


def remove_checkpoints(folder, patterns=CHECKPOINT_PATTERNS) -> int:
    """Remove the checkpoints (files matching ``patterns``, and leftover temporary files) in
    ``folder/checkpoints``, those of a multi-process run's ranks (``rank<r>/``, with its
    ``partition.json``) too, and the folders when they are then empty; returns the number of
    files removed."""
    patterns = tuple(patterns) + (".tmp_*",)
    ckpt = os.path.join(os.fspath(folder), "checkpoints")
    if not os.path.isdir(ckpt):
        return 0
    removed = _remove_checkpoint_files(ckpt, patterns)
    ranks = [n for n in os.listdir(ckpt) if re.fullmatch(r"rank\d+", n) and os.path.isdir(os.path.join(ckpt, n))]
    for name in ranks:
        sub = os.path.join(ckpt, name)
        removed += _remove_checkpoint_files(sub, patterns)
        try:
            os.rmdir(sub)
        except OSError:
            pass
    if ranks and os.path.isfile(os.path.join(ckpt, "partition.json")):
        os.unlink(os.path.join(ckpt, "partition.json"))
        removed += 1
    try:
        os.rmdir(ckpt)
    except OSError:  # not empty: other files the user put there stay
        pass
    return removed
