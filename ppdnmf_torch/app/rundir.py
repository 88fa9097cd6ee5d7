"""A run's folder: written by one run at a time, never taken over by another run.

* :class:`RunFolderLock` holds ``<folder>/.ppdnmf.lock`` (an ``flock`` on a file that names
  its owner: process, host, start time, command) while a run writes; a second run into the
  same folder is refused with the owner named. The kernel drops the lock when its holder
  dies, so a killed run never leaves the folder locked.
* :func:`refuse_foreign_checkpoints`: a fresh run refuses a folder that holds the checkpoints
  of an interrupted run (they are someone's work; the message says how to resume them).
* :func:`remove_checkpoints`: a run that finished removes its own checkpoints (unless told
  to keep them), once every output is written.
"""
from __future__ import annotations

import os
import re
import shlex

from ..checkpoint import PREFIX, checkpoint_files
from ..errors import PPDNMFError
from ..folderlock import LOCK_NAME, FolderLock

__all__ = ["RunFolderError", "RunFolderLock", "refuse_foreign_checkpoints", "remove_checkpoints", "LOCK_NAME"]


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


def refuse_foreign_checkpoints(folder) -> None:
    """Refuse a fresh run in ``folder`` when ``folder/checkpoints`` holds an interrupted run's
    checkpoints: pruning or overwriting them would lose that run.

    Raises
    ------
    RunFolderError
        Naming ``out_dir``, the newest checkpoint and the three ways on.
    """
    folder = os.path.abspath(os.fspath(folder))
    files = checkpoint_files(os.path.join(folder, "checkpoints"))
    if files:
        raise RunFolderError(
            f"out_dir: {folder} holds the checkpoints of an interrupted run (newest: {os.path.basename(files[-1])}); "
            f"continue it with: ppdnmf resume={shlex.quote(folder)}; or remove {os.path.join(folder, 'checkpoints')} "
            "to start over there; or give this run another folder"
        )


def _remove_checkpoint_files(ckpt: str) -> int:
    removed = 0
    for name in os.listdir(ckpt):
        if name.startswith(PREFIX) and name.endswith(".pt") or name.startswith(".tmp_"):
            try:
                os.unlink(os.path.join(ckpt, name))
                removed += 1
            except OSError:
                pass
    return removed


def remove_checkpoints(folder) -> int:
    """Remove the checkpoints (and leftover temporary files) in ``folder/checkpoints``, those
    of a multi-process run's ranks (``rank<r>/``, with its ``partition.json``) too, and the
    folders when they are then empty; returns the number of files removed."""
    ckpt = os.path.join(os.fspath(folder), "checkpoints")
    if not os.path.isdir(ckpt):
        return 0
    removed = _remove_checkpoint_files(ckpt)
    ranks = [n for n in os.listdir(ckpt) if re.fullmatch(r"rank\d+", n) and os.path.isdir(os.path.join(ckpt, n))]
    for name in ranks:
        sub = os.path.join(ckpt, name)
        removed += _remove_checkpoint_files(sub)
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
