"""The ranks' transport: :class:`Comm`, a thin layer over :mod:`torch.distributed` with
timeouts, clear errors and byte counts.

Everything a rank sends goes through one :class:`Comm`, so that

* every operation has a bounded wait (the process group's timeout, or an explicit one for
  point-to-point messages), and a failure becomes a :class:`DistributedError` naming the
  operation and, where one reported it, the rank that failed and why (ranks post their
  error to the rendezvous store before they exit, :meth:`Comm.report_error`);
* a watchdog thread (:class:`Watchdog`) ends a rank whose peers stopped: one reported an
  error and this rank has not reacted (blocked in a collective that will never complete,
  as NCCL can be), or one stopped writing heartbeats (killed, or its machine lost);
* the bytes each rank sends are counted per category (``halo``, ``penalty``, ``metrics``,
  ``output``, ``setup``, and for ``paillier`` ``crypto`` and ``framing``) and, with
  ``record=True``, kept (tests scan them: no data block, no private key and no mask seed ever
  crosses a rank).

Tensors travel as tensors (``gloo`` on CPU, ``nccl`` between GPUs); byte messages of any
length (:meth:`Comm.swap_bytes`: ciphertexts, public keys, seed agreement) travel as
``uint8`` tensors, their lengths first.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import PPDNMFError

__all__ = ["DistributedError", "Comm", "Watchdog", "EXIT_PEER_FAILED", "BACKENDS", "STORE_PREFIX"]

#: exit status of a rank that stops because another rank failed or died
EXIT_PEER_FAILED = 3
#: ``auto`` picks ``nccl`` for CUDA tensors when every rank has a GPU of its own, else ``gloo``
BACKENDS = ("auto", "gloo", "nccl")

STORE_PREFIX = "ppdnmf/"
#: set to "1" in the ranks :func:`.launch.launch_local` starts: their launcher reports for them
LAUNCHED_ENV = "PPDNMF_LOCAL_LAUNCHER"


class DistributedError(PPDNMFError):
    """A rank failed, died or stopped answering, or the ranks of a run disagree."""

    def __init__(self, message, *, failed_rank=None):
        super().__init__(message, key="distributed")
        self.failed_rank = failed_rank


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    # gloo's messages: drop the source location and the advice that follows the reason
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", text).split(" This is typically")[0]
    return (text[:300] + "...") if len(text) > 300 else (text or type(exc).__name__)


class Comm:
    """One rank's view of the process group.

    Parameters
    ----------
    store : torch.distributed.Store
        The rendezvous store (error reports and heartbeats go there too).
    rank, world_size : int
    backend : {"gloo", "nccl"}
    device : torch.device
        Where the solver's tensors live; ``gloo`` stages CUDA tensors through the host.
    timeout : float
        Seconds any one operation may wait for the other ranks.
    record : bool
        Keep a copy of every byte this rank sends (:attr:`sent_log`), for tests.
    """

    def __init__(self, store, rank: int, world_size: int, *, backend: str, device, timeout: float = 300.0,
                 record: bool = False):
        self.store = dist.PrefixStore(STORE_PREFIX, store)
        self.rank, self.world_size, self.backend = int(rank), int(world_size), backend
        self.device = torch.device(device)
        self.timeout = float(timeout)
        self.record = bool(record)
        #: bytes sent, by category
        self.sent: dict = {}
        #: ``(category, peer, bytes)`` of every message sent, with ``record=True``
        self.sent_log: list = []
        self._what = "setup"
        self.watchdog = None
        if backend == "nccl":
            torch.cuda.set_device(self.device)  # NCCL's object collectives use the current device
        if not dist.is_initialized():
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                    timeout=timedelta(seconds=self.timeout))
        self._wire = torch.device("cpu") if backend == "gloo" else self.device

    # -- making one ------------------------------------------------------------------
    @classmethod
    def connect(cls, url: str = "env://", *, rank=None, world_size=None, backend: str = "auto", device="cpu",
                timeout: float = 300.0, record: bool = False, heartbeat: float | None = 60.0) -> "Comm":
        """Join the run's process group through ``url`` (``env://``: torchrun's or SLURM's
        variables ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``; or
        ``tcp://host:port``) and start the watchdog (``heartbeat`` seconds without a peer's
        heartbeat end this rank; None: no watchdog)."""
        kw = {}
        if rank is not None:
            kw["rank"] = int(rank)
        if world_size is not None:
            kw["world_size"] = int(world_size)
        try:
            store, rank, world_size = _rendezvous(url, timeout, kw)
        except (RuntimeError, ValueError, TimeoutError) as exc:
            raise DistributedError(f"rendezvous at {url!r} failed: {_first_line(exc)}") from None
        device = torch.device(device)
        backend = resolve_backend(backend, device, world_size)
        try:  # the process group's own wait for every rank (a rank that never came)
            comm = cls(store, rank, world_size, backend=backend, device=device, timeout=timeout, record=record)
        except (RuntimeError, ValueError, TimeoutError) as exc:
            raise DistributedError(f"rank {rank}: joining the process group at {url!r} failed (not every one of the "
                                   f"{world_size} ranks came within {timeout:g} s): {_first_line(exc)}") from None
        if heartbeat:
            comm.watchdog = Watchdog(comm, heartbeat)
            comm.watchdog.start()
        return comm

    # -- bookkeeping -------------------------------------------------------------------
    def _count(self, category: str, t: torch.Tensor, peer) -> None:
        n = t.numel() * t.element_size()
        self.sent[category] = self.sent.get(category, 0) + n
        if self.record:
            self.sent_log.append((category, peer, t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()))

    def stage(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` on the wire's device, contiguous."""
        return t.detach().to(self._wire).contiguous()

    @contextlib.contextmanager
    def guard(self, what: str):
        """Turn a failure of the transport inside the block into a :class:`DistributedError`
        that names ``what`` and, where one reported it, the rank that failed."""
        self._what = what
        try:
            yield
        except DistributedError:
            raise
        except Exception as exc:  # noqa: BLE001 - every transport error, whatever its type
            raise self.peer_failure(what, exc) from None

    def peer_failure(self, what: str, exc: BaseException) -> DistributedError:
        """The error of this rank when ``what`` failed with ``exc``."""
        reports = self.reports(wait=3.0)
        if reports:
            r, msg = min(reports.items())
            return DistributedError(f"rank {self.rank}: stopped during {what}: rank {r} failed: {msg}",
                                    failed_rank=r)
        silent = self.silent_ranks()
        who = (f"rank {silent[0]} died or hangs (its heartbeat stopped)" if len(silent) == 1 else
               f"ranks {silent} died or hang (their heartbeats stopped)" if silent else
               "no rank reported an error: a rank died or lost its connection")
        return DistributedError(
            f"rank {self.rank}: {what} failed ({_first_line(exc)}); {who} (each operation waits at most "
            f"{self.timeout:g} s)", failed_rank=silent[0] if silent else None)

    def silent_ranks(self) -> list:
        """The other ranks whose heartbeat (:class:`Watchdog`) does not move for three intervals
        and that did not finish; empty without a watchdog."""
        if self.watchdog is None:
            return []

        def beats():
            out = {}
            for r in range(self.world_size):
                if r != self.rank and not self.store.check([f"done/{r}"]) and self.store.check([f"hb/{r}"]):
                    out[r] = self.store.get(f"hb/{r}")
            return out

        try:
            before = beats()
            time.sleep(3 * self.watchdog.interval)
            after = beats()
        except Exception:  # noqa: BLE001 - the store is gone with its host
            return []
        return sorted(r for r in before if after.get(r) == before[r])

    def reports(self, wait: float = 0.0) -> dict:
        """The errors other ranks posted, ``{rank: message}`` (waits up to ``wait`` seconds for one)."""
        deadline = time.monotonic() + wait
        while True:
            out = {}
            try:
                for r in range(self.world_size):
                    key = f"error/{r}"
                    if r != self.rank and self.store.check([key]):
                        out[r] = self.store.get(key).decode("utf-8", "replace")
            except Exception:  # noqa: BLE001 - the store's host is gone too
                return out
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(0.2)

    def report_error(self, exc: BaseException) -> None:
        """Tell the other ranks why this one stops (best effort; never raises). A
        :class:`DistributedError` is another rank's failure, reported by that rank."""
        if isinstance(exc, DistributedError):
            return
        try:
            self.store.set(f"error/{self.rank}", f"{type(exc).__name__}: {_first_line(exc)}")
        except Exception:  # noqa: BLE001
            pass

    # -- point to point ----------------------------------------------------------------
    def swap(self, sends: dict, recv_shapes: dict, dtype, *, category: str, what: str, tag: int = 0) -> dict:
        """Send ``sends[peer]`` to each peer and receive a tensor of ``recv_shapes[peer]`` and
        ``dtype`` from each, all at once; returns ``{peer: tensor}`` on :attr:`device`."""
        ops, bufs, staged = [], {}, []
        for peer, t in sends.items():
            w = self.stage(t)
            staged.append(w)
            self._count(category, w, peer)
            ops.append(dist.P2POp(dist.isend, w, peer, tag=tag))
        for peer, shape in recv_shapes.items():
            bufs[peer] = torch.empty(shape, dtype=dtype, device=self._wire)
            ops.append(dist.P2POp(dist.irecv, bufs[peer], peer, tag=tag))
        if ops:
            with self.guard(what):
                for work in dist.batch_isend_irecv(ops):
                    if not work.wait(timeout=timedelta(seconds=self.timeout)):
                        raise TimeoutError(f"no answer within {self.timeout:g} s")
        return {p: b.to(self.device) for p, b in bufs.items()}

    def swap_bytes(self, sends: dict, peers, *, category: str, what: str, tag: int = 0) -> dict:
        """Byte messages of any length: ``sends[peer]`` (bytes or a ``uint8`` tensor) to each of
        ``peers``, one message back from each; returns ``{peer: uint8 tensor}`` on the host. The
        payload counts in ``category``, the lengths before it (8 bytes per peer) in ``framing``."""
        peers = sorted(peers)
        payload = {p: _as_bytes(sends.get(p, b"")) for p in peers}
        lengths = self.swap({p: torch.tensor([payload[p].numel()], dtype=torch.int64) for p in peers},
                            {p: (1,) for p in peers}, torch.int64, category="framing", what=f"{what} (lengths)",
                            tag=tag)
        got = self.swap({p: payload[p] for p in peers}, {p: (int(lengths[p][0]),) for p in peers}, torch.uint8,
                        category=category, what=what, tag=tag + 1)
        return {p: t.cpu() for p, t in got.items()}

    def send(self, t: torch.Tensor, peer: int, *, category: str, what: str, tag: int = 0) -> None:
        w = self.stage(t)
        self._count(category, w, peer)
        with self.guard(what):
            if not dist.isend(w, peer, tag=tag).wait(timeout=timedelta(seconds=self.timeout)):
                raise TimeoutError(f"no answer within {self.timeout:g} s")

    def recv(self, shape, dtype, peer: int, *, what: str, tag: int = 0) -> torch.Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self._wire)
        with self.guard(what):
            if not dist.irecv(buf, peer, tag=tag).wait(timeout=timedelta(seconds=self.timeout)):
                raise TimeoutError(f"no answer within {self.timeout:g} s")
        return buf.to(self.device)

    # -- collectives -------------------------------------------------------------------
    def all_gather(self, t: torch.Tensor, *, category: str, what: str) -> list:
        """Every rank's ``t`` (the same shape on every rank), in rank order."""
        w = self.stage(t)
        self._count(category, w, "all")
        out = [torch.empty_like(w) for _ in range(self.world_size)]
        with self.guard(what):
            dist.all_gather(out, w)
        return [o.to(self.device) for o in out]

    def broadcast(self, t: torch.Tensor, src: int, *, category: str, what: str) -> torch.Tensor:
        w = self.stage(t)
        if self.rank == src:
            self._count(category, w, "all")
        with self.guard(what):
            dist.broadcast(w, src)
        return w.to(self.device)

    def all_reduce(self, t: torch.Tensor, *, category: str, what: str, op=None) -> torch.Tensor:
        w = self.stage(t)
        self._count(category, w, "all")
        with self.guard(what):
            dist.all_reduce(w, op=op if op is not None else dist.ReduceOp.SUM)
        return w.to(self.device)

    def broadcast_object(self, obj, src: int = 0, *, category: str = "setup", what: str = "setup"):
        """A picklable object from ``src`` to every rank (plain data only: configs, partitions)."""
        box = [obj if self.rank == src else None]
        with self.guard(what):
            dist.broadcast_object_list(box, src, device=self._wire)
        if self.rank == src:
            self.sent[category] = self.sent.get(category, 0) + len(repr(obj))
        return box[0]

    def all_gather_object(self, obj, *, category: str = "output", what: str = "output") -> list:
        out = [None] * self.world_size
        with self.guard(what):
            dist.all_gather_object(out, obj)
        self.sent[category] = self.sent.get(category, 0) + len(repr(obj))
        return out

    def barrier(self, what: str) -> None:
        with self.guard(what):
            dist.barrier()

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """Report an error to the other ranks (:meth:`report_error`), then :meth:`close`."""
        if exc is not None:
            self.report_error(exc)
        self.close(finished=exc is None)
        return False

    def close(self, finished: bool = True) -> None:
        """Stop the watchdog and leave the process group; ``finished``: tell the other ranks'
        watchdogs that this rank ended normally (its heartbeat stops without harm)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        try:
            if finished:
                self.store.set(f"done/{self.rank}", "1")
            self.store.set(f"left/{self.rank}", "1")
            if self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                # rank 0 hosts the store: the others read this run's reports from it until they leave
                deadline = time.monotonic() + 15.0
                while time.monotonic() < deadline and not self.store.check(
                        [f"left/{r}" for r in range(self.world_size)]):
                    time.sleep(0.1)
        except Exception:  # noqa: BLE001 - the store's host is gone
            pass
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()


#: seconds the rendezvous may take beyond its timeout before this rank gives up on it
RENDEZVOUS_SLACK = 10.0


def _rendezvous(url: str, timeout: float, kw: dict):
    """``torch.distributed.rendezvous``, bounded: torch's own timeout does not cover a store
    address where another program listens (it accepts the connection and never answers), so
    the call runs in a daemon thread that this rank abandons after ``timeout`` +
    :data:`RENDEZVOUS_SLACK` seconds."""
    box = {}

    def join():
        try:
            box["value"] = next(dist.rendezvous(url, timeout=timedelta(seconds=timeout), **kw))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=join, name="ppdnmf-rendezvous", daemon=True)
    thread.start()
    thread.join(timeout + RENDEZVOUS_SLACK)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        where = (f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
                 if url.startswith("env://") else url)
        raise TimeoutError(f"no answer from the rendezvous store at {where} within {timeout + RENDEZVOUS_SLACK:g} s "
                           "(distributed.timeout plus 10 s): rank 0 did not start it, or another program holds that "
                           "port (MASTER_PORT)")
    return box["value"]


def _as_bytes(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().contiguous().view(torch.uint8).reshape(-1)
    return torch.frombuffer(bytearray(bytes(x)), dtype=torch.uint8) if len(x) else torch.zeros(0, dtype=torch.uint8)


def resolve_backend(backend: str, device: torch.device, world_size: int) -> str:
    """``auto``: ``nccl`` when the tensors are on CUDA and there is a GPU per local rank, else
    ``gloo``."""
    if backend not in BACKENDS:
        from ..errors import ConfigError

        raise ConfigError(f"backend: unknown backend {backend!r}; use one of {BACKENDS}")
    if backend == "nccl" and device.type != "cuda":
        from ..errors import ConfigError

        raise ConfigError(f"backend: 'nccl' moves CUDA tensors only, and this run's tensors are on {device}; use "
                          "backend 'gloo' (or 'auto'), or a CUDA device")
    if backend != "auto":
        return backend
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    if device.type == "cuda" and dist.is_nccl_available() and torch.cuda.device_count() >= local:
        return "nccl"
    return "gloo"


#: seconds a rank that hosts the rendezvous store keeps it up after it stopped on another rank's
#: failure, so that the others read the same cause rather than the store's loss
STORE_LINGER = 3.0


def hosts_store(rank: int) -> bool:
    """Whether this process hosts the rendezvous store: rank 0, unless a launcher (this package's
    ``launch_local``, or torchrun's agent) does."""
    return (rank == 0 and os.environ.get(LAUNCHED_ENV) != "1"
            and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True")


class Watchdog:
    """A thread that ends this rank when its peers are gone and the main thread cannot tell.

    Every second it writes this rank's heartbeat to the store and reads the others'. It
    ends the process (exit status :data:`EXIT_PEER_FAILED`, one line on stderr) when

    * a peer reported an error (:meth:`Comm.report_error`) and this rank is still running
      ``grace`` seconds later (blocked in an operation that will not complete), or
    * a peer's heartbeat is older than ``timeout`` seconds (killed, or its machine lost),
      unless that peer finished; or the store itself is gone.
    """

    def __init__(self, comm: Comm, timeout: float, interval: float = 1.0, grace: float = 10.0):
        self.comm, self.timeout, self.interval, self.grace = comm, float(timeout), float(interval), float(grace)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ppdnmf-watchdog", daemon=True)

    def start(self) -> None:
        self.comm.store.set(f"hb/{self.comm.rank}", repr(time.time()))  # alive from now on
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _end(self, message: str) -> None:
        if self._stop.is_set():
            return
        try:  # a local launcher reads it (:func:`.launch.launch_local`) and prints the run's one line
            self.comm.store.set(f"ended/{self.comm.rank}", message)
        except Exception:  # noqa: BLE001 - the store is gone
            pass
        if os.environ.get(LAUNCHED_ENV) != "1":
            print(f"ppdnmf: error: rank {self.comm.rank}: {message}", file=sys.stderr, flush=True)
        if hosts_store(self.comm.rank):  # the others' watchdogs see the same cause, not the store's end
            time.sleep(STORE_LINGER)
        os._exit(EXIT_PEER_FAILED)

    def _run(self) -> None:
        comm, store = self.comm, self.comm.store
        seen, first_report = {}, None
        while not self._stop.wait(self.interval):
            now = time.time()
            try:
                store.set(f"hb/{comm.rank}", repr(now))
                for r in range(comm.world_size):
                    if r == comm.rank or store.check([f"done/{r}"]):
                        continue
                    if store.check([f"error/{r}"]):
                        first_report = first_report or time.monotonic()
                        if time.monotonic() - first_report > self.grace:
                            msg = store.get(f"error/{r}").decode("utf-8", "replace")
                            self._end(f"rank {r} failed: {msg}")
                    if store.check([f"hb/{r}"]):
                        seen[r] = float(store.get(f"hb/{r}").decode())
                    if r in seen and now - seen[r] > self.timeout:
                        self._end(f"rank {r} sent no heartbeat for {now - seen[r]:.0f} s: it died or hangs")
            except Exception as exc:  # noqa: BLE001 - the store's host (rank 0 or the launcher) is gone
                if not self._stop.is_set():
                    self._end(f"lost the rendezvous store ({_first_line(exc)}): rank 0 or the launcher died")
                return
