"""Worker processes for the public-key work of the Paillier stage, and the obfuscator supply.

What runs where
---------------
The pool runs **public-key work only**: a task receives a public modulus ``n`` (and the
DJN exponent size) and returns random obfuscators for it (:data:`~.obfuscation.PUBLIC_TASKS`).
Workers never receive a private key, a plaintext, a ciphertext or a penalty: every task's
arguments are pickled to bytes here (:meth:`WorkerPool.submit`), where an ``audit`` hook
can inspect exactly what leaves the process. Workers are started with the ``forkserver``
method (``spawn`` where there is none): they are fresh interpreters that never held a copy
of the parent's memory, so not even an inherited copy of a private key exists in them.

Workers are started without re-running the caller's main script (they only need this
package): the caller's ``__main__`` is hidden from :mod:`multiprocessing` while the workers
start (:func:`_main_hidden`), so a script without an ``if __name__ == "__main__":`` guard
works too, and no worker ever executes the caller's code. If the pool cannot start at
all, the exchange warns and works in-process.

Everything that needs a private key stays in the agent's process: decryption and the
owner's CRT obfuscators (:class:`~.obfuscation.PrivateCRT`). The cheap homomorphic
operations (products and small powers mod ``n^2``), packing and unpacking stay there too:
shipping ciphertexts to a worker would cost about as much as the work. With 2 or more
workers and keys of at least :data:`LANE_MIN_KEY_BITS` bits they still use every core:
:class:`ThreadLanes` runs the edges' homomorphic work in threads of this process, side by
side, through ``gmpy2.powmod_base_list``, which releases the GIL.

:class:`ObfuscatorSupply` hands out obfuscators per public key. In *stock* mode
(``precompute=True`` with a pool) it keeps a stock per key, refilled in the background
by the pool ahead of use, so the protocol's critical path only multiplies. In *batch*
mode (a pool without ``precompute``) it computes a round's obfuscators in parallel when
the round asks for them. Without a pool it computes them in-process.

Workers die with the process that started them: each one asks the kernel for SIGKILL when
its parent (the forkserver) dies (``prctl(PR_SET_PDEATHSIG)`` on Linux), and a watchdog
thread in it ends it within :data:`WATCH_SECONDS` once the starting process is gone (a
SIGKILLed run leaves no worker behind, on any system).
"""
from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait

from gmpy2 import mpz

from .obfuscation import PUBLIC_TASKS, public_obfuscators

__all__ = ["WorkerPool", "ObfuscatorSupply", "ThreadLanes", "resolve_workers", "POOL_MIN_KEY_BITS", "LANE_MIN_KEY_BITS"]

#: with ``workers=None`` the pool is used from this key size up (below, a task costs less
#: than shipping it to another process)
POOL_MIN_KEY_BITS = 1024
#: the per-edge thread lanes run from this key size up: smaller powers hold the GIL for a
#: larger share of their time, and below it the lanes measured slower than one thread
#: (docs/PERFORMANCE.md)
LANE_MIN_KEY_BITS = 2048

#: the module the forkserver imports once, before it forks the workers (it holds the tasks)
_PRELOAD = "ppdnmf_torch.exchange.paillier.obfuscation"


def resolve_workers(workers, key_bits: int) -> int:
    """Worker processes to start: 0 means in-process.

    ``None`` (the default): ``os.cpu_count()`` for keys of at least
    :data:`POOL_MIN_KEY_BITS` bits, in-process below. ``0`` or ``1``: in-process.
    ``k >= 2``: ``k`` workers.
    """
    if workers is None:
        return (os.cpu_count() or 1) if int(key_bits) >= POOL_MIN_KEY_BITS and (os.cpu_count() or 1) > 1 else 0
    return int(workers) if int(workers) >= 2 else 0


def _context():
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([_PRELOAD])  # import once in the server, fork workers from it
        return ctx
    return multiprocessing.get_context("spawn")


_MAIN_LOCK = threading.Lock()


@contextlib.contextmanager
def _main_hidden():
    """Hide ``__main__``'s file and spec from multiprocessing while workers start.

    A ``forkserver`` or ``spawn`` child otherwise re-imports the caller's main script
    (:func:`multiprocessing.spawn.get_preparation_data`); our workers need nothing from it.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    with _MAIN_LOCK:
        d = main.__dict__
        saved = {k: d[k] for k in ("__file__", "__spec__") if k in d}
        try:
            d.pop("__file__", None)
            d["__spec__"] = None
            yield
        finally:
            d.pop("__spec__", None)
            d.update(saved)


#: how often a worker's watchdog checks that the process that started it is alive (seconds)
WATCH_SECONDS = 0.5


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _watch(pid: int) -> None:
    while _alive(pid):
        time.sleep(WATCH_SECONDS)
    os._exit(0)


def _worker_init(owner: int) -> None:
    """Worker side, once: die with the forkserver (Linux) and with the process ``owner`` that
    started the pool (everywhere)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            pass
    threading.Thread(target=_watch, args=(int(owner),), name="ppdnmf-watchdog", daemon=True).start()


def _run_task(name: str, payload: bytes):
    """Worker side: one public task by name, arguments from bytes."""
    return PUBLIC_TASKS[name](*pickle.loads(payload))


class WorkerPool:
    """A process pool for :data:`~.obfuscation.PUBLIC_TASKS`.

    Parameters
    ----------
    workers : int
        Number of processes (``>= 1``).
    audit : callable, optional
        Called with the pickled arguments of every task before it is sent (tests use it
        to check that no private key material leaves the process).
    """

    def __init__(self, workers: int, *, audit=None):
        self.workers = int(workers)
        self.audit = audit
        self.tasks_sent = 0
        self._executor = ProcessPoolExecutor(max_workers=self.workers, mp_context=_context(),
                                             initializer=_worker_init, initargs=(os.getpid(),))
        try:
            # start every worker now (one task each), with the caller's main script hidden
            with _main_hidden():
                futs = [self.submit("ping") for _ in range(self.workers)]
            for f in futs:
                f.result(timeout=120)
        except BaseException:
            self.close()
            raise

    def submit(self, name: str, *args):
        if name not in PUBLIC_TASKS:
            raise ValueError(f"WorkerPool: {name!r} is not a public-key task")
        payload = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        if self.audit is not None:
            self.audit(payload)
        self.tasks_sent += 1
        return self._executor.submit(_run_task, name, payload)

    def close(self) -> None:
        ex, self._executor = self._executor, None
        if ex is not None:
            ex.shutdown(wait=False, cancel_futures=True)

    def __del__(self):  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:
            pass

    def __reduce__(self):
        raise TypeError("WorkerPool cannot be pickled")


class ObfuscatorSupply:
    """Obfuscators for public keys, by key id.

    Parameters
    ----------
    moduli : dict
        ``{key_id: n}``.
    djn_bits : int or None
        DJN exponent size, or None for ``r^n mod n^2``.
    pool : WorkerPool or None
    stock : dict or None
        ``{key_id: target}``: keep that many obfuscators ready per key, refilled in the
        background by ``pool`` (stock mode). None: batch mode (with a pool) or in-process.
    chunk : int
        Obfuscators per pool task.
    """

    def __init__(self, moduli: dict, *, djn_bits=None, pool: WorkerPool | None = None, stock=None, chunk: int = 16):
        self.moduli = {k: int(v) for k, v in moduli.items()}
        self.djn_bits = djn_bits
        self.pool = pool
        self.targets = dict(stock) if (stock is not None and pool is not None) else None
        self.chunk = max(1, int(chunk))
        self._stock = {k: deque() for k in self.moduli}
        self._pending = {k: deque() for k in self.moduli}  # (future, count)
        #: seconds the main process spent making obfuscators itself or waiting for the pool
        self.wait_seconds = 0.0
        self.made_in_process = 0

    @property
    def mode(self) -> str:
        if self.pool is None:
            return "in-process"
        return "stock" if self.targets is not None else "batch"

    # -- the pool side -----------------------------------------------------------------
    def _submit(self, key, count):
        futs = []
        while count > 0:
            c = min(self.chunk, count)
            futs.append((self.pool.submit("obfuscators", self.moduli[key], c, self.djn_bits), c))
            count -= c
        return futs

    def refill(self) -> None:
        """Stock mode: submit tasks so that every key's stock plus pending work reaches its target."""
        if self.targets is None:
            return
        # interleave the keys so that every key's stock grows at the same pace
        plans = {}
        for key, target in self.targets.items():
            have = len(self._stock[key]) + sum(c for _, c in self._pending[key])
            if have < target:
                plans[key] = target - have
        while plans:
            for key in list(plans):
                c = min(self.chunk, plans[key])
                self._pending[key].extend(self._submit(key, c))
                plans[key] -= c
                if plans[key] <= 0:
                    del plans[key]

    def _collect(self, key, need: int) -> None:
        """Move finished (or, while short, unfinished) pending results into the stock."""
        stock, pending = self._stock[key], self._pending[key]
        while pending and (len(stock) < need or pending[0][0].done()):
            fut, _ = pending.popleft()
            stock.extend(mpz(v) for v in fut.result())

    # -- the consumer side -------------------------------------------------------------
    def take(self, demands: dict) -> dict:
        """``{key_id: [obfuscator, ...]}`` with ``demands[key_id]`` fresh obfuscators each."""
        t0 = time.perf_counter()
        out = {}
        demands = {k: int(c) for k, c in demands.items() if int(c) > 0}
        if self.pool is None:
            for key, c in demands.items():
                out[key] = public_obfuscators(self.moduli[key], c, self.djn_bits)
                self.made_in_process += c
        elif self.targets is None:
            futs = {key: self._submit(key, c) for key, c in demands.items()}
            for key, fl in futs.items():
                vals = []
                for fut, _ in fl:
                    vals.extend(mpz(v) for v in fut.result())
                out[key] = vals
        else:
            extra = {}
            for key, c in demands.items():
                self._collect(key, c)
                short = c - len(self._stock[key])
                if short > 0:
                    extra[key] = self._submit(key, short)
            for key, fl in extra.items():
                for fut, _ in fl:
                    self._stock[key].extend(mpz(v) for v in fut.result())
            for key, c in demands.items():
                stock = self._stock[key]
                out[key] = [stock.popleft() for _ in range(c)]
        self.wait_seconds += time.perf_counter() - t0
        return out

    def close(self) -> None:
        for pending in self._pending.values():
            for fut, _ in pending:
                fut.cancel()
            pending.clear()
        for stock in self._stock.values():
            stock.clear()


def _run_chunk(fn, chunk):
    return [fn(x) for x in chunk]


class ThreadLanes:
    """``[fn(x) for x in items]`` in ``threads`` contiguous chunks, side by side, in this process.

    For the protocol's per-edge work, whose time is spent in ``gmpy2.powmod_base_list``
    (which releases the GIL): the calling thread computes the first chunk, ``threads - 1``
    helper threads the others. Nothing is pickled and nothing leaves the process. Results
    come back in the order of ``items``; when tasks raise, every chunk still finishes first
    and the error of the earliest failing chunk is raised (the one a serial loop would
    have met first).

    Parameters
    ----------
    threads : int
        Lanes, counting the caller's thread (``threads - 1`` helper threads); below 2,
        :meth:`map` is a plain loop.
    """

    def __init__(self, threads: int):
        self.threads = int(threads)
        #: chunks the helper threads have run (tests check that the lanes were used)
        self.helper_chunks = 0
        self._executor = None
        self._pid = None

    def _helpers(self) -> ThreadPoolExecutor:
        if self._executor is None or self._pid != os.getpid():  # a forked child has no copy of the threads
            self._executor = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="ppdnmf-lane")
            self._pid = os.getpid()
        return self._executor

    def map(self, fn, items) -> list:
        items = list(items)
        k = min(self.threads, len(items))
        if k < 2:
            return _run_chunk(fn, items)
        bounds = [len(items) * t // k for t in range(k + 1)]
        chunks = [items[a:b] for a, b in zip(bounds, bounds[1:])]
        futs = []
        try:
            for c in chunks[1:]:
                futs.append(self._helpers().submit(_run_chunk, fn, c))
        except RuntimeError:  # the interpreter is shutting down (no new threads): one lane then
            for f in futs:
                f.cancel()
            wait(futs)
            return _run_chunk(fn, items)
        out, error = [], None
        try:
            out.extend(_run_chunk(fn, chunks[0]))
        except BaseException as exc:  # KeyboardInterrupt too: the helpers finish before it propagates
            error = exc
        for f in futs:
            try:
                part = f.result()
            except BaseException as exc:
                error = exc if error is None else error
                continue
            out.extend(part)
        self.helper_chunks += len(futs)
        if error is not None:
            raise error
        return out

    def close(self) -> None:
        ex, self._executor = self._executor, None
        if ex is not None and self._pid == os.getpid():
            ex.shutdown(wait=True)

    def __reduce__(self):
        raise TypeError("ThreadLanes cannot be pickled")
