"""Checkpoints of a symmetric-NMF run, written atomically and verified on load.

A checkpoint holds the method's state tensors, ``lambda``, the trials' bookkeeping, the
histories so far and the clock, with a fingerprint of the problem (``X``'s content, ``U_0``,
the method, the penalty and the options) so that it is never resumed into another run, and
a SHA-256 of its content. Files are written to a temporary name in the same folder, flushed
and renamed over the final name: a kill during a write leaves the old file or the new one,
never a torn one. There is no key material or seed in a checkpoint (the runs draw nothing
after their start).
"""
from __future__ import annotations

import glob
import hashlib
import io
import os

import torch

from ...checkpoint import write_atomically
from ...errors import PPDNMFError

__all__ = ["SymNMFCheckpointError", "save", "load", "latest", "iterations", "checkpoint_path", "digest", "PREFIX"]

FORMAT = 1
PREFIX = "symnmf_it"


class SymNMFCheckpointError(PPDNMFError):
    """A checkpoint is missing, damaged, or belongs to a different run."""


def digest(*parts) -> str:
    """SHA-256 over tensors (their bytes, shape and dtype) and plain values."""
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, torch.Tensor):
            t = p.detach().to("cpu").contiguous()
            h.update(f"T{tuple(t.shape)}{t.dtype};".encode())
            if t.numel():
                h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        elif isinstance(p, dict):
            for k in sorted(p):
                h.update(f"{k}=".encode())
                h.update(digest(p[k]).encode())
        elif isinstance(p, (list, tuple)):
            h.update(f"L{len(p)};".encode())
            for v in p:
                h.update(digest(v).encode())
        else:
            h.update(f"{type(p).__name__}:{p!r};".encode())
    return h.hexdigest()


def checkpoint_path(folder, k: int) -> str:
    return os.path.join(os.fspath(folder), f"{PREFIX}{k:06d}.pt")


def save(folder, payload: dict) -> str:
    """Write ``payload`` (CPU tensors and plain values; ``payload["k"]`` the iterations done)
    atomically; returns the path."""
    os.makedirs(folder, exist_ok=True)
    body = dict(payload, format=FORMAT)
    body["hash"] = digest({k: v for k, v in body.items() if k != "hash"})
    buf = io.BytesIO()
    torch.save(body, buf)
    return write_atomically(checkpoint_path(folder, int(payload["k"])), lambda fh: fh.write(buf.getvalue()))


def iterations(folder) -> list:
    """The outer iterations ``k`` that ``folder`` holds a checkpoint of, increasing (none when it
    does not exist)."""
    files = glob.glob(os.path.join(glob.escape(os.fspath(folder)), f"{PREFIX}[0-9]*.pt"))
    stems = (os.path.basename(f)[len(PREFIX):-len(".pt")] for f in files)
    return sorted(int(s) for s in stems if s.isdigit())


def latest(folder) -> str | None:
    """The checkpoint of ``folder`` with the most iterations, or None."""
    files = sorted(glob.glob(os.path.join(glob.escape(os.fspath(folder)), f"{PREFIX}[0-9]*.pt")))
    return files[-1] if files else None


def load(path, fingerprint: str) -> dict:
    """Read and verify a checkpoint against its hash and the resuming run's fingerprint.

    Raises
    ------
    SymNMFCheckpointError
        Unreadable, damaged (content and hash differ), or from another run.
    """
    try:
        body = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error to the caller
        raise SymNMFCheckpointError(f"resume: checkpoint {path!r} cannot be read ({exc})") from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT or "hash" not in body:
        raise SymNMFCheckpointError(f"resume: {path!r} is not a symmetric-NMF checkpoint of format {FORMAT}")
    if digest({k: v for k, v in body.items() if k != "hash"}) != body["hash"]:
        raise SymNMFCheckpointError(f"resume: checkpoint {path!r} does not match its hash (changed or damaged)")
    if body.get("fingerprint") != fingerprint:
        raise SymNMFCheckpointError(f"resume: checkpoint {path!r} belongs to a different run (its X, start, "
                                    "method, penalty or options differ)")
    return body
