"""CPU threads of torch's intra-op pool: one setting, set once at the edge and restored.

torch's default (one thread per core) collapses when a core is busy with other work: the
solver's many small operations each end in an OpenMP barrier that waits for a thread the
scheduler has parked (docs/PERFORMANCE.md, "Threads"). :func:`default_threads` is the
package's choice instead; :func:`using_threads` applies a setting for one call and puts
torch's back afterwards, so that :func:`ppdnmf_torch.fit` leaves the caller's process as
it found it. An explicit ``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) in the environment is
the user's choice and wins over the default.

The same count bounds the BLAS that NumPy loaded (through ``threadpoolctl``), because the CPU's
host plans (symmetric NMF, FSSPCA's kernels) make their products with NumPy: without it they would
take OpenBLAS's own count, one thread per core, whatever ``threads`` says.
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch
from threadpoolctl import ThreadpoolController

from .errors import ConfigError

__all__ = ["default_threads", "resolve_threads", "using_threads", "with_threads", "THREAD_ENV", "usable_cores",
           "max_threads", "THREADS_PER_CORE"]

#: environment variables that, when set, make torch's current thread count the default
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


#: the most threads (or local ranks) per usable core a setting may ask for: more never helps, and
#: OpenMP aborts (``threads=20000``) or crashes (``threads=1000000``) long before memory runs out
THREADS_PER_CORE = 4


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the system has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def max_threads() -> int:
    """The largest ``threads`` accepted: :data:`THREADS_PER_CORE` per usable core."""
    return THREADS_PER_CORE * usable_cores()


def default_threads() -> int:
    """The package's default: one thread (measured: never far from the fastest setting on an
    idle machine, and the only one that does not collapse when a core is busy; see
    docs/PERFORMANCE.md, "Threads"), or torch's current count when ``OMP_NUM_THREADS`` or
    ``MKL_NUM_THREADS`` is set."""
    if any(os.environ.get(k, "").strip() for k in THREAD_ENV):
        return torch.get_num_threads()
    return 1


def resolve_threads(threads) -> int:
    """``threads`` (None: :func:`default_threads`; an integer >= 1) as a thread count.

    Raises
    ------
    ConfigError
        Naming ``threads`` for anything but None or an integer from 1 to :func:`max_threads`
        (checked before torch makes a thread).
    """
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads: must be None (the default) or an integer >= 1, got {threads!r}")
    if threads > max_threads():
        raise ConfigError(f"threads: {threads} is above the limit of {THREADS_PER_CORE} per usable CPU core "
                          f"({usable_cores()} here: at most {max_threads()})")
    return threads


@functools.lru_cache(maxsize=1)
def _blas_pools() -> ThreadpoolController:
    """The thread pools loaded in this process, found once (NumPy's BLAS is loaded by then: the
    package imports NumPy before any entry point runs)."""
    return ThreadpoolController()


@contextlib.contextmanager
def using_threads(threads):
    """Run the ``with`` block with torch's intra-op threads, and NumPy's BLAS threads, at
    ``threads`` (see :func:`resolve_threads`) and restore the previous counts after it."""
    want = resolve_threads(threads)
    before = torch.get_num_threads()
    if want != before:
        torch.set_num_threads(want)
    try:
        with _blas_pools().limit(limits=want, user_api="blas"):
            yield want
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def with_threads(fn):
    """Decorate an entry point that takes a ``threads=`` keyword: the call runs under
    :func:`using_threads` (nested entry points keep the outer setting when given the same)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with using_threads(kwargs.get("threads")):
            return fn(*args, **kwargs)

    return wrapper
