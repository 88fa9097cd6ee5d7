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

Reads are verified (:func:`check_payload`): every state tensor, the sampler's RNG states,
the history and the run's bookkeeping carry a SHA-256 of their content, checked on load, and
the key set, shapes and dtypes of the state, and the length of the history against
``bcd_done``, are checked against the run that resumes; any difference is a
:class:`CheckpointError` that names it. A :class:`Checkpointer` prunes only the files it
wrote (or adopted when resuming), never another run's.
"""
from __future__ import annotations

import glob
import io
import hashlib
import os
import tempfile
from dataclasses import asdict

import torch

from .errors import PPDNMFError

__all__ = ["CheckpointError", "Checkpointer", "HistoryPacker", "unpack_history", "fingerprint", "latest_checkpoint", "load_checkpoint",
           "save_checkpoint", "write_atomically", "good_point", "snapshot", "check_payload",
           "checkpoint_iteration", "checkpoint_files", "PREFIX"]

#: 2: the solver's U-update changed its rounding (one eigendecomposition per X-step), so a
#: format-1 checkpoint could no longer be continued bit for bit; 3: content hashes, and the
#: fingerprint leaves out ``bcd_iters`` (a resumed run may run longer); 4: each history key
#: packed into one tensor (:class:`HistoryPacker`), so that a write costs the same at every
#: point of a long run. Format 3 is still read.
FORMAT_VERSION = 4
_READABLE_FORMATS = (3, 4)
_PREFIX = "ckpt_bcd"
#: checkpoint files are named ``<PREFIX><bcd_done:06d>.pt``
PREFIX = _PREFIX
#: solver parameters that do not change the numbers of the iterations already done: a
#: checkpoint resumes into a run that differs from its own only in these
_RESUMABLE_PARAMS = ("bcd_iters",)


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
    """The history lists of a checkpoint's (packed, format 4; or plain, format 3) history."""
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


def snapshot(good: dict, history: dict, fp: str, packer: HistoryPacker | None = None) -> dict:
    """The checkpoint payload of a :func:`good_point` (on the CPU): what :class:`Checkpointer`
    writes and :func:`load_checkpoint` reads back. With the run's ``packer`` (its
    :class:`Checkpointer`'s), only the history entries new since the last write are packed."""
    hist = (packer or HistoryPacker()).pack(history, good["hist_len"])
    payload = {
        "format": FORMAT_VERSION,
        "bcd_done": int(good["bcd_done"]),
        "state": {k: v.detach().to("cpu").clone() for k, v in good["tensors"].items()},
        "sampler": good["sampler"],
        "history": hist,
        "exchange_costs": good.get("exchange_costs", {}),
        "fingerprint": fp,
    }
    payload["hashes"] = _content_hashes(payload)
    return payload


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


def _content_hashes(payload: dict) -> dict:
    """SHA-256 of every state tensor, of the sampler's RNG states, of the history and of the
    bookkeeping (``bcd_done``, the exchange's counters, the fingerprint)."""
    return {
        "state": {k: _digest(v) for k, v in payload["state"].items()},
        "sampler": _digest(payload["sampler"]),
        "history": _digest(payload["history"]),
        "meta": _digest([payload["bcd_done"], payload["exchange_costs"], payload["fingerprint"]]),
    }


def _expected_state(problem, params) -> dict:
    """``{name: (shape, dtype)}`` of the solver state of ``problem`` under ``params``
    (the adaptive and agreed penalty schedules add each agent's caps and ``mu_i``)."""
    T, N, L, M = problem.Z.shape
    dt, rank = problem.Z.dtype, params.rank
    xs, ys = ((T, N, L, rank), dt), ((T, N, rank, M), dt)
    out = {"X": xs, "U": xs, "P": xs, "Q": xs, "Q_prev": xs, "Y": ys, "V": ys, "R": ys,
           "g": ((int(problem.topology.n_directed_edges),), torch.float64)}
    if getattr(params, "penalty_schedule", "paper") != "paper":
        out.update(caps=((T * N,), torch.float64), mu=((T, N), torch.float64))
    if getattr(params, "x_solver", "admm") != "admm":  # the token's state; its walk's length is the run's own
        out.update(inc_y=xs, inc_z=((T, L, rank), dt), inc_cycle=(None, torch.int64))
    return out


def check_payload(payload: dict, problem, params) -> None:
    """Verify a loaded checkpoint against its hashes and against the run that resumes it.

    Parameters
    ----------
    payload : dict
        From :func:`load_checkpoint`.
    problem : Problem
        The resuming run's problem (``Z (T, N, L, M_max)``, its topology).
    params : SolverParams
        The resuming run's parameters (``rank``, ``bcd_iters``).

    Raises
    ------
    CheckpointError
        Naming what differs: a part whose content does not match its hash (a changed or
        damaged file), a missing or unexpected state tensor, a shape or dtype, or a history
        whose length does not match ``bcd_done``.
    """
    where = f"resume_from: checkpoint {payload.get('path', '?')!r}"
    hashes = payload.get("hashes")
    if not isinstance(hashes, dict):
        raise CheckpointError(f"{where} has no content hashes; it cannot be verified")
    for key in ("state", "sampler", "history", "bcd_done", "exchange_costs", "fingerprint"):
        if key not in payload:
            raise CheckpointError(f"{where} lacks its {key!r} entry")
    state = payload["state"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{where}: its state is not a set of tensors")
    expected = _expected_state(problem, params)
    names = set(state) - {"frozen"}
    if names != set(expected):
        missing, extra = sorted(set(expected) - names), sorted(names - set(expected))
        raise CheckpointError(f"{where}: its state tensors differ from the solver's"
                              + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
    if set(hashes.get("state", {})) != set(state):
        raise CheckpointError(f"{where}: the state tensors {sorted(state)} do not match the hashed set "
                              f"{sorted(hashes.get('state', {}))}")
    for name, t in state.items():
        if _digest(t) != hashes["state"][name]:
            raise CheckpointError(f"{where}: the content of state tensor {name!r} does not match its hash "
                                  "(the file was changed or damaged)")
    for part, value in (("sampler", payload["sampler"]), ("history", payload["history"]),
                        ("meta", [payload["bcd_done"], payload["exchange_costs"], payload["fingerprint"]])):
        if _digest(value) != hashes.get(part):
            what = {"meta": "bcd_done, the exchange's counters or the fingerprint"}.get(part, f"the {part}")
            raise CheckpointError(f"{where}: {what} do not match the hash (the file was changed or damaged)")
    for name, (shape, dtype) in expected.items():
        t = state[name]
        if shape is not None and tuple(t.shape) != shape:
            raise CheckpointError(f"{where}: state tensor {name!r} has shape {tuple(t.shape)}, the run needs {shape}")
        if t.dtype != dtype:
            raise CheckpointError(f"{where}: state tensor {name!r} holds {t.dtype}, the run asks for {dtype}")
    if "frozen" in state and tuple(state["frozen"].shape) != tuple(problem.Z.shape[:2]):
        raise CheckpointError(f"{where}: state tensor 'frozen' has shape {tuple(state['frozen'].shape)}, "
                              f"the run needs {tuple(problem.Z.shape[:2])}")
    _check_history(where, payload, params)


def _check_history(where: str, payload: dict, params) -> None:
    done, hist = payload["bcd_done"], payload["history"]
    if not isinstance(done, int) or isinstance(done, bool) or done < 0:
        raise CheckpointError(f"{where}: bcd_done is {done!r}, not a count of BCD iterations")
    if not isinstance(hist, dict) or "nmse" not in hist and done > 0:
        raise CheckpointError(f"{where}: its history has no 'nmse' entries")
    for key, vals in hist.items():
        n = _history_length(vals)
        # a crypto_* counter that the checkpoint's segment did not log can be shorter
        if n != done and not (str(key).startswith("crypto_") and n < done):
            raise CheckpointError(f"{where}: bcd_done = {done} but its history holds {n} {key!r} entries")
    if done > params.bcd_iters:
        raise CheckpointError(f"bcd_iters: the checkpoint {payload.get('path', '?')!r} has done {done} BCD iterations, "
                              f"more than bcd_iters = {params.bcd_iters}")


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
    items = {k: v for k, v in asdict(params).items() if k not in _RESUMABLE_PARAMS}
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
_LATER_SETTINGS = {"penalty_schedule": "paper", "init": "ones", "y_solver": "admm", "x_solver": "admm",
                   "x_rho": 0.1, "x_gamma_spread": 0.05, "x_sigma": 1e-3, "x_rounds": None, "x_start": None,
                   "x_walk": "auto"}


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


def checkpoint_iteration(path) -> int:
    """``bcd_done`` of a checkpoint file, from its name (``ckpt_bcd000021.pt`` -> 21)."""
    stem = os.path.splitext(os.path.basename(os.fspath(path)))[0]
    digits = stem[len(_PREFIX):]
    if not stem.startswith(_PREFIX) or not digits.isdigit():
        raise CheckpointError(f"resume_from: {os.fspath(path)!r} is not named like a checkpoint ({_PREFIX}<n>.pt)")
    return int(digits)


def latest_checkpoint(path: str) -> str:
    """The newest checkpoint file in folder ``path`` (or ``path`` itself if it is a file)."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise CheckpointError(f"resume_from: {path!r} is neither a checkpoint file nor a folder")
    files = checkpoint_files(path) or checkpoint_files(os.path.join(path, "checkpoints"))
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
    if payload["format"] not in _READABLE_FORMATS:
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

    def due(self, bcd_done: int) -> bool:
        return self.every > 0 and bcd_done % self.every == 0

    def write(self, snapshot: dict) -> str:
        """Write a :func:`snapshot` and prune the older files of this run (never another run's)."""
        name = os.path.join(self.folder, f"{_PREFIX}{snapshot['bcd_done']:06d}.pt")
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
