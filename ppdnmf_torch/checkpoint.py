"""Crash-safe checkpoints of a run, and resuming from them.

A checkpoint holds everything the run needs to continue bit for bit: every state
tensor, the penalty draws, every RNG state, the metric history so far and the exchange's
cumulative cost counters (plain numbers), plus a fingerprint of the problem and the
parameters so that a checkpoint is never resumed into a different run. It never holds key material: exchanges are rebuilt on resume
(a resumed Paillier run makes new keys, and its numbers do not change, because the
Paillier exchange is bit-identical to the emulated one).

Writes are atomic: the file is written to a temporary name in the same folder,
flushed to disk, then renamed over the final name, so a kill during a write leaves
either the old checkpoint or the new one, never a torn file.
"""
from __future__ import annotations

import glob
import hashlib
import os
import tempfile
from dataclasses import asdict

import torch

from ._utils import PPDNMFError

__all__ = ["CheckpointError", "Checkpointer", "fingerprint", "latest_checkpoint", "load_checkpoint",
           "save_checkpoint", "write_atomically", "good_point", "snapshot"]

#: 2: the solver's U-update changed its rounding (one eigendecomposition per X-step), so a
#: format-1 checkpoint could no longer be continued bit for bit
FORMAT_VERSION = 2
_PREFIX = "ckpt_bcd"


class CheckpointError(PPDNMFError):
    """A checkpoint is missing, unreadable, or belongs to a different run."""


def good_point(state, sampler, history: dict, keep: bool = True, exchange=None) -> dict:
    """The last consistent point of a run: a copy of the state's tensors (``keep``; the solver's
    workspace reuses the state's buffers in later iterations), the RNG states, the history's
    length and the exchange's cumulative cost counters (plain numbers, no key material)."""
    return {
        "tensors": {k: v.clone() for k, v in state.tensors().items()} if keep else {},
        "bcd_done": state.bcd_done,
        "sampler": sampler.state_dict(),
        "hist_len": {k: len(v) for k, v in history.items()},
        "exchange_costs": (getattr(exchange, "cost_state", dict)() if keep and exchange is not None else {}),
    }


def snapshot(good: dict, history: dict, fp: str) -> dict:
    """The checkpoint payload of a :func:`good_point` (on the CPU): what :class:`Checkpointer`
    writes and :func:`load_checkpoint` reads back."""
    hist = {}
    for k, vals in history.items():
        vals = vals[: good["hist_len"].get(k, 0)]
        hist[k] = [v.detach().cpu().clone() if isinstance(v, torch.Tensor) else float(v) for v in vals]
    return {
        "format": FORMAT_VERSION,
        "bcd_done": int(good["bcd_done"]),
        "state": {k: v.detach().to("cpu").clone() for k, v in good["tensors"].items()},
        "sampler": good["sampler"],
        "history": hist,
        "exchange_costs": good.get("exchange_costs", {}),
        "fingerprint": fp,
    }


def fingerprint(problem, params, exchange=None) -> str:
    """SHA-256 over the data, the graphs, the caps, the seeds, the solver parameters and
    the exchange's arithmetic (``plain``, or the integer codec's ``n_max`` and ``g_bits``:
    ``quantized`` and ``paillier`` compute the same numbers, so either resumes the other)."""
    h = hashlib.sha256()
    codec = getattr(exchange, "codec", None)
    h.update(repr(("codec", None if codec is None else (float(codec.n_max), int(codec.g_bits)))).encode())
    for t in (problem.Z, problem.counts, problem.topology.src, problem.topology.dst, problem.caps):
        t = t.detach().to("cpu").contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    h.update(repr(list(problem.seeds)).encode())
    items = asdict(params)
    # settings added later are hashed only away from the paper's values, so that a checkpoint
    # of a paper-settings run written before they existed still resumes
    for key, value in _LATER_SETTINGS.items():
        if items.get(key) == value:
            items.pop(key)
    if items.get("init") == "random":
        h.update(repr(("init_seeds", list(problem.init_seeds))).encode())
    h.update(repr(sorted(items.items())).encode())
    return h.hexdigest()


#: solver settings added after checkpoint format 2, with the value that reproduces the older runs
_LATER_SETTINGS = {"penalty_schedule": "paper", "init": "ones", "y_solver": "admm"}


def write_atomically(path: str, write, *, binary: bool = True) -> str:
    """Write ``path`` through ``write(fh)`` atomically (temporary file, fsync, rename): a run
    killed mid-write leaves the previous file, never a truncated one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=os.path.splitext(path)[1], dir=folder)
    try:
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def save_checkpoint(path: str, payload: dict) -> str:
    """Atomically write ``payload`` to ``path`` (:func:`write_atomically`)."""
    return write_atomically(path, lambda fh: torch.save(payload, fh))


def latest_checkpoint(path: str) -> str:
    """The newest checkpoint file in folder ``path`` (or ``path`` itself if it is a file)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"resume_from: {path!r} is neither a checkpoint file nor a folder")
    files = sorted(glob.glob(os.path.join(path, f"{_PREFIX}*.pt")))
    if not files:
        files = sorted(glob.glob(os.path.join(path, "checkpoints", f"{_PREFIX}*.pt")))
    if not files:
        raise CheckpointError(f"resume_from: no checkpoint ({_PREFIX}*.pt) in {path!r}")
    return files[-1]


def load_checkpoint(path: str) -> dict:
    """Load the newest checkpoint at ``path`` (file or folder) onto the CPU."""
    file = latest_checkpoint(path)
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # a torn or foreign file: say which and why
        raise CheckpointError(f"resume_from: cannot read checkpoint {file!r}: {exc}") from None
    if not isinstance(payload, dict) or "format" not in payload:
        raise CheckpointError(f"resume_from: {file!r} is not a ppdnmf_torch checkpoint (format {FORMAT_VERSION})")
    if payload["format"] != FORMAT_VERSION:
        raise CheckpointError(
            f"resume_from: {file!r} was written by another version of ppdnmf_torch (checkpoint format "
            f"{payload['format']!r}, this version reads {FORMAT_VERSION}); its run cannot be continued bit for bit"
        )
    payload["path"] = file
    return payload


class Checkpointer:
    """Writes a checkpoint every ``every`` BCD iterations into ``folder``.

    Parameters
    ----------
    folder : str
    every : int
        ``0`` writes none on schedule (but :meth:`write` still works, e.g. on Ctrl-C).
    keep : int
        How many of the newest checkpoint files to keep.
    """

    def __init__(self, folder: str, every: int = 1, keep: int = 2):
        if not isinstance(every, int) or every < 0:
            raise CheckpointError(f"checkpoint_every: must be an integer >= 0, got {every!r}")
        self.folder = folder
        self.every = every
        self.keep = max(1, int(keep))
        self.written: list[str] = []

    def due(self, bcd_done: int) -> bool:
        return self.every > 0 and bcd_done % self.every == 0

    def write(self, snapshot: dict) -> str:
        """Write a :func:`snapshot` and prune old files."""
        name = os.path.join(self.folder, f"{_PREFIX}{snapshot['bcd_done']:06d}.pt")
        save_checkpoint(name, snapshot)
        self.written.append(name)
        existing = sorted(glob.glob(os.path.join(self.folder, f"{_PREFIX}*.pt")))
        for old in existing[: -self.keep]:
            try:
                os.unlink(old)
            except OSError:
                pass
        return name
