"""Crash-safe checkpoints of a run, one format for every model, and resuming from them.

A checkpoint holds everything a run needs to continue bit for bit: the model's state tensors,
its random generators' states, the history so far (packed, :class:`HistoryPacker`), the cost
ledgers (plain numbers) and the run's bookkeeping, with the run's settings and a digest of each
of its inputs, so that a checkpoint is never resumed into a different run and the refusal names
what differs (:func:`verify_run`). It never holds key material, mask seeds or private values:
exchanges and aggregations are rebuilt on resume (a resumed Paillier run makes new keys, and its
numbers do not change, because the Paillier exchange is bit-identical to the emulated one).

Writes are atomic (:func:`write_atomically`): the file is written to a temporary name in the
same folder, flushed to disk, then renamed over the final name, so a kill during a write leaves
either the old checkpoint or the new one, never a torn file, and a failed write (a full disk)
leaves no temporary file and raises the ``OSError`` of the write, naming the file.

Reads are verified (:func:`load_checkpoint`): every state tensor, the generators' states, the
history and the bookkeeping carry a SHA-256 of their content, checked on load; a file that
cannot be read (emptied, truncated, random bytes) or whose content does not match its hashes
is one :class:`CheckpointError` line naming the file. A :class:`Checkpointer` keeps the newest
few files (default 2) and prunes only those it wrote (or adopted when resuming), never another
run's. Files are named ``ckpt_bcd<iterations done:06d>.pt`` for every model (:data:`PREFIX`;
PPDNMF's BCD iterations gave the name), so one guard knows every run's files.

:mod:`ppdnmf_torch.driver` writes and resumes them for every model's loop.
"""
from __future__ import annotations

import glob
import io
import hashlib
import os
import tempfile

import torch

from ._utils import counted
from .errors import PPDNMFError

__all__ = ["CheckpointError", "Checkpointer", "HistoryPacker", "unpack_history", "latest_checkpoint", "load_checkpoint",
           "save_checkpoint", "write_atomically", "checkpoint_iteration", "checkpoint_files", "PREFIX", "run_payload",
           "verify_run", "digest", "FORMAT_VERSION"]

#: 2: the solver's U-update changed its rounding (one eigendecomposition per X-step), so a
#: format-1 checkpoint could no longer be continued bit for bit; 3: content hashes, and the
#: fingerprint leaves out ``bcd_iters`` (a resumed run may run longer); 4: each history key
#: packed into one tensor (:class:`HistoryPacker`), so that a write costs the same at every
#: point of a long run; 5: one format for every model (:mod:`ppdnmf_torch.driver`), settings and
#: inputs compared by name. Only this format is read.
FORMAT_VERSION = 5
_PREFIX = "ckpt_bcd"
#: checkpoint files are named ``<PREFIX><iterations done:06d>.pt``
PREFIX = _PREFIX


class CheckpointError(PPDNMFError):
    """A checkpoint is missing, unreadable, or belongs to a different run."""


class HistoryPacker:
    """The history as one tensor per key, grown in place as the run appends to it.

    A checkpoint's history used to be pickled as Python lists of small tensors, so each
    write cost time in proportion to the run's length and a run's checkpoints in
    proportion to its square. The packer keeps, per key, a buffer that holds the entries
    packed so far and packs only the new ones at each write: a key whose entries are all
    floats becomes a float64 vector ``(n,)``, one whose entries are tensors of one shape
    and dtype a stacked tensor ``(n, *shape)``; any other key stays a list.
    :func:`unpack_history` gives back the lists, value for value.
    """

    def __init__(self):
        self._buf: dict = {}  # key -> (kind, buffer tensor, entries packed)

    def pack(self, history: dict, lengths: dict) -> dict:
        """``{key: {"floats"|"stack": tensor (n, ...)}}`` (or a plain list) of the first
        ``lengths[key]`` entries of each history list."""
        out = {}
        for key, vals in history.items():
            n = int(lengths.get(key, 0))
            kind, buf, done = self._buf.get(key, (None, None, 0))
            if done > n or kind == "list":
                kind, buf, done = None, None, 0
            new = vals[done:n]
            if kind is None:
                kind = _kind_of(vals[:n])
            elif new and _kind_of(new, like=buf) != kind:
                kind, buf, done, new = _kind_of(vals[:n]), None, 0, vals[:n]
            if kind == "list":
                self._buf[key] = ("list", None, 0)
                out[key] = [v.detach().cpu().clone() if isinstance(v, torch.Tensor) else float(v) for v in vals[:n]]
                continue
            if new:
                packed = (torch.tensor([float(v) for v in new], dtype=torch.float64) if kind == "floats"
                          else torch.stack([v.detach().cpu() for v in new]))
                if buf is None:
                    buf = torch.empty((max(16, 2 * n),) + tuple(packed.shape[1:]), dtype=packed.dtype)
                elif buf.shape[0] < n:
                    grown = torch.empty((2 * n,) + tuple(buf.shape[1:]), dtype=buf.dtype)
                    grown[:done] = buf[:done]
                    buf = grown
                buf[done:n] = packed
            self._buf[key] = (kind, buf, n)
            out[key] = {kind: (buf[:n].clone() if buf is not None else torch.empty(0, dtype=torch.float64))}
        return out


def _kind_of(vals, like=None) -> str:
    """How a run of history entries packs: ``floats``, ``stack`` (tensors of one shape and dtype,
    that of ``like``'s rows when given) or ``list``."""
    if all(isinstance(v, float) for v in vals):
        return "floats"
    if vals and all(isinstance(v, torch.Tensor) for v in vals):
        shape, dtype = ((tuple(like.shape[1:]), like.dtype) if like is not None
                        else (tuple(vals[0].shape), vals[0].dtype))
        if all(tuple(v.shape) == shape and v.dtype == dtype for v in vals):
            return "stack"
    return "list"


def unpack_history(history: dict) -> dict:
    """The history lists of a checkpoint's packed history (:class:`HistoryPacker`)."""
    out = {}
    for key, vals in history.items():
        if isinstance(vals, dict) and "floats" in vals:
            out[key] = vals["floats"].tolist()
        elif isinstance(vals, dict) and "stack" in vals:
            out[key] = list(vals["stack"].unbind(0))
        else:
            out[key] = list(vals)
    return out


def _history_length(vals) -> int:
    if isinstance(vals, dict) and len(vals) == 1 and next(iter(vals)) in ("floats", "stack"):
        return int(next(iter(vals.values())).shape[0])
    return len(vals)


# --------------------------------------------------------------------------------------
# Content hashes
# --------------------------------------------------------------------------------------


def _feed(h, value) -> None:
    """Feed ``value`` (tensors, numbers, strings, lists, dicts, None) into hash ``h``, with its
    type, shape and dtype, so that two different values never feed the same bytes."""
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous()
        h.update(f"T{tuple(t.shape)}{t.dtype};".encode())
        if t.numel():
            h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    elif isinstance(value, dict):
        h.update(f"D{len(value)};".encode())
        for k in sorted(value, key=str):
            _feed(h, str(k))
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)};".encode())
        for v in value:
            _feed(h, v)
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def _digest(value) -> str:
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


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
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename is None:  # a write's error names no file: this one
            raise OSError(exc.errno, exc.strerror or str(exc), path) from None
        raise
    return path


def save_checkpoint(path: str, payload: dict) -> str:
    """Atomically write ``payload`` to ``path`` (:func:`write_atomically`).

    The payload is serialized in memory first: a failed write (a full disk) is then the
    ``OSError`` of the write itself, naming the file and the reason, instead of the archive
    writer's ``RuntimeError`` (``[enforce fail at inline_container.cc] unexpected pos``)."""

    def write(fh):
        buf = io.BytesIO()
        torch.save(payload, buf)
        fh.write(buf.getbuffer())

    return write_atomically(path, write)


def checkpoint_files(folder) -> list:
    """The checkpoint files in ``folder``, oldest first (none when it does not exist)."""
    return sorted(glob.glob(os.path.join(os.fspath(folder), f"{_PREFIX}[0-9]*.pt")))


def checkpoint_iteration(path, key: str = "resume_from") -> int:
    """The iterations done of a checkpoint file, from its name (``ckpt_bcd000021.pt`` -> 21)."""
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    digits = stem[len(_PREFIX):]
    if not stem.startswith(_PREFIX) or not digits.isdigit():
        raise CheckpointError(f"{key}: {os.fspath(path)!r} is not named like a checkpoint ({_PREFIX}<n>.pt)")
    return int(digits)


def latest_checkpoint(path, key: str = "resume_from") -> str:
    """The newest checkpoint file in folder ``path`` (or its ``checkpoints`` subfolder), or ``path``
    itself if it is a file."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"{key}: {path!r} is neither a checkpoint file nor a folder")
    files = checkpoint_files(path) or checkpoint_files(os.path.join(path, "checkpoints"))
    if not files:
        raise CheckpointError(f"{key}: no checkpoint ({_PREFIX}*.pt) in {path!r}")
    return files[-1]


def load_checkpoint(path, key: str = "resume_from") -> dict:
    """The newest checkpoint at ``path`` (file or folder), on the CPU, its content checked against
    its hashes (format 5); ``payload["path"]`` is the file read.

    Raises
    ------
    CheckpointError
        One line naming the file (and ``key``, the parameter that pointed at it) when it cannot
        be read (emptied, truncated, random bytes), is not a checkpoint of this format, or its
        content does not match its hashes (a flipped bit).
    """
    file = latest_checkpoint(path, key)
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - torch's reasons (EOFError, UnpicklingError, zip errors) say less than this
        raise CheckpointError(f"{key}: checkpoint {file!r} is damaged or not a checkpoint (it cannot be read: "
                              "emptied, truncated or overwritten); remove it to resume from an older one, or start "
                              "afresh") from None
    if not isinstance(payload, dict) or "format" not in payload:
        raise CheckpointError(f"{key}: {file!r} is not a ppdnmf_torch checkpoint (format {FORMAT_VERSION})")
    if payload["format"] != FORMAT_VERSION:
        raise CheckpointError(
            f"{key}: {file!r} was written by another version of ppdnmf_torch (checkpoint format "
            f"{payload['format']!r}, this version reads {FORMAT_VERSION}); its run cannot be continued bit for bit")
    payload["path"] = file
    _check_integrity(payload, key)
    return payload


# --------------------------------------------------------------------------------------
# The payload: one format for every model (ppdnmf_torch.driver writes and reads it)
# --------------------------------------------------------------------------------------

#: the entries of a format-5 checkpoint besides ``format``, ``path`` and ``hashes``
_RUN_KEYS = ("model", "done", "settings", "inputs", "state", "rng", "history", "ledgers", "extra")


def digest(*parts) -> str:
    """SHA-256 (hex) over tensors (their shape, dtype and bytes), numbers, strings, lists and
    dicts: the digest of a run's input that a checkpoint holds instead of the input."""
    h = hashlib.sha256()
    for p in parts:
        _feed(h, p)
    return h.hexdigest()


def _cpu(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, detached, holding its own storage only (a view would save its base)."""
    t = t.detach().to("cpu")
    if t.untyped_storage().nbytes() != t.numel() * t.element_size() or not t.is_contiguous():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def run_payload(*, model: str, done: int, settings: dict, inputs: dict, state: dict, rng, history: dict,
                ledgers: dict, extra: dict) -> dict:
    """A format-5 checkpoint: what :class:`Checkpointer` writes and :func:`load_checkpoint` reads.

    Parameters
    ----------
    model : str
        The model's name (a checkpoint of another model is refused by it).
    done : int
        Iterations done.
    settings : dict
        The run's settings as plain values (compared by name on resume; no key or seed of a
        secure exchange).
    inputs : dict
        ``{name: digest}`` of the run's inputs (:func:`digest`; compared by name on resume).
    state : dict of Tensor
        The model's state tensors (copied to the CPU).
    rng
        The random generators' states (plain values and tensors), or None.
    history : dict
        The packed history (:meth:`HistoryPacker.pack`).
    ledgers : dict
        ``{ledger: {counter: number}}``: the cost counters.
    extra : dict
        Plain bookkeeping (the clock, flags, counters of the model).
    """
    payload = {"format": FORMAT_VERSION, "model": str(model), "done": int(done), "settings": settings,
               "inputs": inputs, "state": {k: _cpu(v) for k, v in state.items()}, "rng": rng, "history": history,
               "ledgers": ledgers, "extra": extra}
    payload["hashes"] = _run_hashes(payload)
    return payload


def _run_hashes(payload: dict) -> dict:
    return {"state": {k: _digest(v) for k, v in payload["state"].items()}, "rng": _digest(payload["rng"]),
            "history": _digest(payload["history"]),
            "meta": _digest([payload[k] for k in ("model", "done", "settings", "inputs", "ledgers", "extra")])}


def _check_integrity(payload: dict, key: str) -> None:
    """A format-5 payload's structure and content against its hashes (before any run looks at it)."""
    where = f"{key}: checkpoint {payload['path']!r}"
    missing = [k for k in _RUN_KEYS + ("hashes",) if k not in payload]
    if missing:
        raise CheckpointError(f"{where} lacks its {missing[0]!r} entry (damaged)")
    hashes, state = payload["hashes"], payload["state"]
    if not isinstance(hashes, dict) or not isinstance(hashes.get("state"), dict):
        raise CheckpointError(f"{where} has no content hashes; it cannot be verified")
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{where}: its state is not a set of tensors (damaged)")
    if set(hashes["state"]) != set(state):
        raise CheckpointError(f"{where}: the state tensors {sorted(state)} do not match the hashed set "
                              f"{sorted(hashes['state'])} (damaged)")
    for name, t in state.items():
        if _digest(t) != hashes["state"][name]:
            raise CheckpointError(f"{where}: the content of state tensor {name!r} does not match its hash "
                                  "(the file was changed or damaged)")
    for part, value, what in (("rng", payload["rng"], "the random generators' states"),
                              ("history", payload["history"], "the history"),
                              ("meta", [payload[k] for k in ("model", "done", "settings", "inputs", "ledgers",
                                                             "extra")], "the run's settings and counters")):
        if _digest(value) != hashes.get(part):
            raise CheckpointError(f"{where}: {what} do not match the hash (the file was changed or damaged)")
    done = payload["done"]
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        raise CheckpointError(f"{where}: its iteration count is {done!r}, not a count (damaged)")


def _same(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare: by their digests
        return _digest(a) == _digest(b)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def verify_run(payload: dict, *, model: str, settings: dict, inputs: dict, state_spec: dict, cap: int,
               cap_key: str, key: str = "resume", start_rows: int = 0, partial=(),
               step_name: str = "iteration") -> None:
    """Check a format-5 checkpoint against the run that resumes it, naming what differs.

    Parameters
    ----------
    payload : dict
        From :func:`load_checkpoint`.
    model : str
    settings, inputs : dict
        The resuming run's (as :func:`run_payload` takes them).
    state_spec : dict
        ``{name: (shape or None, dtype, optional)}`` of the model's state tensors.
    cap : int
        The resuming run's iteration cap (the one setting a resume may change); a checkpoint
        with more iterations done is refused naming ``cap_key``.
    start_rows : int
        History rows recorded before the first iteration.
    partial : tuple of str
        History keys (prefixes) that may hold fewer rows than the run (counters that appear later).
    step_name : str
        What an iteration is called (``"BCD iteration"``), for the messages.

    Raises
    ------
    CheckpointError
        One line: another model, changed settings or inputs (by name, both values), a state
        tensor missing, unexpected, or of another shape or dtype, a history of the wrong
        length, or more iterations done than ``cap``.
    """
    path = payload.get("path", "?")
    where = f"{key}: checkpoint {path!r}"
    if payload.get("format") != FORMAT_VERSION or payload.get("model") != model:
        raise CheckpointError(f"{where} is a checkpoint of another model ({payload.get('model', 'ppdnmf')!r}); "
                              f"this run is {model!r}")
    diffs = [f"its {name} is {_shown(payload['settings'].get(name))}, this run's {_shown(settings.get(name))}"
             for name in sorted(set(settings) | set(payload["settings"]), key=str)
             if not _same(payload["settings"].get(name), settings.get(name))]
    diffs += [f"its {name} differ" for name in sorted(set(inputs) | set(payload["inputs"]), key=str)
              if payload["inputs"].get(name) != inputs.get(name)]
    if diffs:
        more = f" (and {len(diffs) - 3} more)" if len(diffs) > 3 else ""
        raise CheckpointError(f"{where} belongs to a different run: {'; '.join(diffs[:3])}{more}; resume with the "
                              "settings it was written with, or start afresh in another folder")
    done = payload["done"]
    if done > cap:
        raise CheckpointError(f"{cap_key}: the checkpoint {path!r} has done {counted(done, step_name)}, more than "
                              f"{cap_key} = {cap}")
    _check_state(where, payload["state"], state_spec)
    for name, vals in payload["history"].items():
        n, want = _history_length(vals), done + start_rows
        if n != want and not (any(str(name).startswith(p) for p in partial) and n < want):
            raise CheckpointError(f"{where}: {counted(done, step_name)} done but its history holds {n} {name!r} "
                                  "entries (damaged)")


def _check_state(where: str, state: dict, spec: dict) -> None:
    required = {k for k, (_, _, optional) in spec.items() if not optional}
    missing, extra = sorted(required - set(state)), sorted(set(state) - set(spec))
    if missing or extra:
        raise CheckpointError(f"{where}: its state tensors differ from the model's"
                              + (f"; missing {missing}" if missing else "")
                              + (f"; unexpected {extra}" if extra else ""))
    for name, t in state.items():
        shape, dtype, _ = spec[name]
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(f"{where}: state tensor {name!r} has shape {tuple(t.shape)}, the run needs "
                                  f"{tuple(shape)}")
        if t.dtype != dtype:
            raise CheckpointError(f"{where}: state tensor {name!r} holds {t.dtype}, the run asks for {dtype}")


class Checkpointer:
    """Writes a checkpoint every ``every`` iterations into ``folder``, keeping the newest ``keep``.

    Parameters
    ----------
    folder : str
    every : int
        ``0`` writes none on schedule (but :meth:`write` still works, e.g. on Ctrl-C).
    keep : int
        How many of the newest checkpoint files to keep.
    """

    def __init__(self, folder: str, every: int = 1, keep: int = 2, adopt=()):
        if not isinstance(every, int) or isinstance(every, bool) or every < 0:
            raise CheckpointError(f"checkpoint_every: must be an integer >= 0, got {every!r}")
        folder = os.fspath(folder)
        if os.path.exists(folder) and not os.path.isdir(folder):
            raise CheckpointError(f"checkpoint_dir: {folder!r} is a file, not a folder")
        self.folder = folder
        self.every = every
        self.keep = max(1, int(keep))
        #: the files this checkpointer may prune: those it wrote, and those it adopted (the
        #: checkpoints of the segment a resumed run continues)
        self.written: list[str] = [os.path.abspath(os.fspath(p)) for p in adopt]
        #: packs the run's history incrementally across its writes (:func:`snapshot`)
        self.packer = HistoryPacker()

    def due(self, done: int) -> bool:
        return self.every > 0 and done % self.every == 0

    def write(self, snapshot: dict) -> str:
        """Write a payload (:func:`run_payload`) and prune the older files of this run (never
        another run's); returns the file's path."""
        name = os.path.join(self.folder, f"{_PREFIX}{snapshot['done']:06d}.pt")
        save_checkpoint(name, snapshot)
        full = os.path.abspath(name)
        self.written = [p for p in self.written if p != full] + [full]
        for old in sorted(self.written)[: -self.keep]:
            try:
                os.unlink(old)
            except OSError:
                pass
            self.written.remove(old)
        return name
