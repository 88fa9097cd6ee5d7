"""A run's checkpoints: where they go, how often, the folder's lock, and resuming from them
(:class:`Checkpoints`, the format is :mod:`ppdnmf_torch.checkpoint`'s).
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field

import numpy as np

from ..checkpoint import (PREFIX, CheckpointError, Checkpointer, checkpoint_files, checkpoint_iteration,
                          load_checkpoint, run_payload, verify_run)
from ..errors import ConfigError
from ..folderlock import FolderLock
from .history import History

__all__ = ["Checkpoints", "Start", "check_checkpoint_args", "lock_checkpoint_dir"]


def check_checkpoint_args(checkpoint_dir, checkpoint_every, resume=False, keep=2, *, resume_key: str = "resume",
                          every_key: str = "checkpoint_every") -> None:
    """Refuse bad checkpoint arguments at a fit's boundary, before any work: ``checkpoint_dir`` a
    path (``""`` names no folder), ``checkpoint_every`` an integer >= 0 (0: only at the end),
    ``keep`` an integer >= 1, ``resume`` a bool that needs a ``checkpoint_dir``."""
    if checkpoint_dir is not None:
        if not isinstance(checkpoint_dir, (str, os.PathLike)):
            raise ConfigError(f"checkpoint_dir: expected a folder's path, got {checkpoint_dir!r}")
        if os.fspath(checkpoint_dir) == "":
            raise ConfigError("checkpoint_dir: the empty path names no folder (it would write into the current "
                              "directory); give a folder, or None for no checkpoints")
        if os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
            raise CheckpointError(f"checkpoint_dir: {os.fspath(checkpoint_dir)!r} is a file, not a folder")
    for key, v, low in ((every_key, checkpoint_every, 0), ("keep_checkpoints", keep, 1)):
        if isinstance(v, bool) or not isinstance(v, (numbers.Integral, np.integer)) or v < low:
            more = " (0: only at the end)" if low == 0 else ""
            raise ConfigError(f"{key}: must be an integer >= {low}{more}, got {v!r}")
    if not isinstance(resume, bool):
        raise ConfigError(f"{resume_key}: expected True or False, got {resume!r}")
    if resume and checkpoint_dir is None:
        raise ConfigError(f"{resume_key}: needs a checkpoint_dir to resume from")


def lock_checkpoint_dir(folder, continued=None, *, hint: str) -> FolderLock:
    """Hold ``folder`` for this run (:mod:`~ppdnmf_torch.folderlock`: a second run into it is
    refused, never killed), and refuse it when it holds checkpoints of another run: this run
    would overwrite and prune them, and resuming that run would pick up this one's.
    ``continued``: the checkpoint a resumed run continues (its folder's files are its own);
    ``hint``: how to continue that run (``"resume=True"``)."""
    here = os.path.abspath(os.fspath(folder))
    lock = FolderLock(here, key="checkpoint_dir", error=CheckpointError).acquire()
    files = checkpoint_files(here)
    if files and (continued is None or os.path.dirname(os.path.abspath(continued)) != here):
        lock.release()
        raise CheckpointError(
            f"checkpoint_dir: {here} holds the checkpoints of another run (newest: {os.path.basename(files[-1])}); "
            f"continue that run with {hint}, remove its {PREFIX}*.pt files to start over there, or give this run "
            "another checkpoint_dir")
    return lock


@dataclass
class Start:
    """Where a run starts: after ``done`` iterations (0: the beginning), with their history, the
    clock's seconds so far, whether it had converged, and the checkpoint it continues."""

    done: int = 0
    history: History = field(default_factory=History)
    elapsed: float = 0.0
    converged: bool = False
    path: str | None = None


class Checkpoints:
    """A run's checkpoints (validate the arguments first: :func:`check_checkpoint_args`).

    Parameters
    ----------
    folder : path or None
        Where the files go (on a rank of a run over ranks: its ``rank<r>`` subfolder); None: none
        are written (a run that only resumes from ``resume``).
    every : int
        A checkpoint after every ``every`` iterations (0: none on schedule); one more at the end
        and on Ctrl-C.
    keep : int
        How many of the newest files to keep.
    resume : bool or path
        True: continue from the newest checkpoint in ``folder`` (none there: a fresh start when
        ``missing_ok``); a path: from the newest checkpoint there (a file or folder).
    resume_key : str
        The resume parameter, named in errors (``"resume"``, ``"resume_from"``).
    hint : str
        How a user continues a run (``"resume=True"``), for the refusal of an occupied folder.
    missing_ok : bool
        Whether ``resume=True`` with no checkpoint starts afresh (else an error).
    device : torch.device, optional
        Where a resumed history's tensors go.
    """

    def __init__(self, folder, *, every: int = 0, keep: int = 2, resume=False, resume_key: str = "resume",
                 hint: str = "resume=True", missing_ok: bool = True, device=None):
        self.root = None if folder is None else os.fspath(folder)
        self.every, self.keep, self.resume = int(every), int(keep), resume
        self.resume_key, self.hint, self.missing_ok, self.device = resume_key, hint, missing_ok, device
        self.folder = self.root
        self._writer = self._lock = None
        self._model = self._settings = self._inputs = None

    # -- start ----------------------------------------------------------------------------
    def open(self, model, ledgers, *, cap: int, ranks=None) -> Start:
        """Resume (verified against ``model``'s settings, inputs and state, restored into it and
        ``ledgers``) or start afresh, then lock the folder; returns where the run starts."""
        self._model = model
        self._settings, self._inputs = model.settings(), model.inputs()
        if ranks is not None:
            self.folder = ranks.folder(self.root)
        payload = self._resume_payload(ranks) if self.resume is not False else None
        why = None
        if payload is not None:
            try:
                verify_run(payload, model=model.name, settings=self._settings, inputs=self._inputs,
                           state_spec=model.state_spec(), cap=cap, cap_key=model.cap_key, key=self.resume_key,
                           start_rows=model.start_rows, partial=model.partial_keys, step_name=model.step_name)
            except CheckpointError as exc:
                if ranks is None:
                    raise
                why = str(exc)
        if ranks is not None:
            ranks.agree(why)
            ranks.write_partition(self.root)
        continued = payload["path"] if payload is not None else None
        if self.folder is not None:
            self._lock_folder(continued, ranks)
            adopt = ()
            if continued is not None and os.path.dirname(os.path.abspath(continued)) == os.path.abspath(self.folder):
                adopt = [f for f in checkpoint_files(self.folder) if checkpoint_iteration(f) <= payload["done"]]
            self._writer = Checkpointer(self.folder, every=self.every, keep=self.keep, adopt=adopt)
        if payload is None:
            return Start()
        model.load_state(payload["state"], payload["extra"].get("model", {}))
        model.load_rng_state(payload["rng"])
        ledgers.load(payload["ledgers"])
        loop = payload["extra"].get("loop", {})
        return Start(done=payload["done"], history=History.unpacked(payload["history"], self.device),
                     elapsed=float(loop.get("elapsed", 0.0)), converged=bool(loop.get("converged", False)),
                     path=continued)

    def _lock_folder(self, continued, ranks) -> None:
        """Lock this process's folder; over ranks, every rank's outcome is agreed (a refused rank
        stops every rank with its reason, and the others release their locks)."""
        try:
            self._lock = lock_checkpoint_dir(self.folder, continued, hint=self.hint)
            why = None
        except CheckpointError as exc:
            if ranks is None:
                raise
            why = str(exc)
        if ranks is not None:
            try:
                ranks.agree(why)
            except CheckpointError:
                self.close()
                raise

    def _resume_payload(self, ranks):
        """The checkpoint to continue (None: a fresh start), its file readable and whole."""
        if ranks is None:
            if self.resume is True:
                if not checkpoint_files(self.folder) and self.missing_ok:
                    return None
                return load_checkpoint(self.folder, self.resume_key)
            return load_checkpoint(self.resume, self.resume_key)
        ranks.check_partition(self.root, self.resume_key)
        mine = [checkpoint_iteration(f, self.resume_key) for f in checkpoint_files(self.folder)]
        every = ranks.gather(mine, "the checkpoints' iterations")
        if not any(every) and self.missing_ok:
            return None
        common = set(every[0]).intersection(*map(set, every[1:]))
        if not common:
            raise CheckpointError(f"{self.resume_key}: no iteration has a checkpoint on every rank in "
                                  f"{self.root!r} (the ranks have {every})")
        payload, why = None, None
        try:
            payload = load_checkpoint(os.path.join(self.folder, f"{PREFIX}{max(common):06d}.pt"), self.resume_key)
        except CheckpointError as exc:
            why = str(exc)
        ranks.agree(why)
        return payload

    # -- writes ---------------------------------------------------------------------------
    def due(self, done: int) -> bool:
        return self._writer is not None and self._writer.due(done)

    def write(self, good) -> str | None:
        """Write a :class:`~.loop.GoodPoint`; returns the file's path (None: no folder)."""
        if self._writer is None:
            return None
        model = self._model
        return self._writer.write(run_payload(
            model=model.name, done=good.done, settings=self._settings, inputs=self._inputs, state=good.state,
            rng=good.rng, history=good.history.packed(good.lengths), ledgers=good.ledgers,
            extra={"model": good.extra, "loop": {"elapsed": float(good.elapsed), "converged": bool(good.converged)}}))

    def close(self) -> None:
        """Release the folder's lock."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
