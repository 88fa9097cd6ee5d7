"""The memory a run needs, checked before it allocates anything.

A run's peak memory follows from its sizes (trials, agents, the data's shape, the rank, the
iteration caps whose histories are kept, the Paillier worker processes; for symmetric NMF
``n``, the starts and a dense or sparse similarity; for FSSPCA the features, workers and
trials). :func:`ppdnmf`, :func:`symnmf` and :func:`fsspca` estimate it from those sizes alone
(no model is imported here), :func:`available_memory` says what the machine has (Linux's
``MemAvailable`` and the cgroup's limit; ``torch.cuda.mem_get_info`` on a GPU), and
:func:`check` refuses a run that cannot fit with one :class:`~ppdnmf_torch.errors.ConfigError`
line: what was asked, what it needs, what the machine has and how to run it in pieces.

The estimates count the tensors a run holds at its peak (the data and its padded copy, the
iterates and the solver's buffers, the histories at the iteration cap) with the factors
measured on this package's solvers (``scripts/measure_memory.py`` prints estimate against
measured peak); they are meant to be within a factor of about two of the truth, and a run is
refused only when its estimate exceeds all the memory available, so an error of that size
refuses nothing that could have run.

The environment variable ``PPDNMF_MEMORY_LIMIT`` (bytes, or with a unit: ``512M``, ``8G``,
``1.5T``) stands in for the machine's figure: a lower one keeps a run within a share of a
shared machine; ``PPDNMF_MEMORY_LIMIT=none`` turns the check off.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

import torch

from .errors import ConfigError

__all__ = ["Estimate", "Part", "Available", "available_memory", "check", "check_bytes", "format_bytes", "parse_bytes",
           "ppdnmf", "symnmf", "fsspca", "history_bytes", "ENV_LIMIT"]

#: environment variable that replaces the machine's available memory (a size, or "none")
ENV_LIMIT = "PPDNMF_MEMORY_LIMIT"
#: bytes of one history entry per iteration and key: a small tensor (or float) kept in a list
_ENTRY_BYTES = 560
#: resident memory of one Paillier worker process (an interpreter with gmpy2 and phe; no torch)
_WORKER_BYTES = 60 * 2**20
#: what a fit allocates whatever its size: the first kernels' work buffers, the thread pools'
#: stacks, the lazily imported modules (measured: scripts/measure_memory.py)
_RUNTIME = 40 * 2**20
#: a CPU run's transient buffers (the solver's workspace, temporaries of one step) as a share
#: of its iterates; measured on the PPDNMF solver (scripts/measure_memory.py)
_WORKSPACE = 1.0


# --------------------------------------------------------------------------------------
# What the machine has
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Available:
    """Memory a run may take: ``bytes`` (None: unknown, nothing is refused) and where the
    figure comes from (``"MemAvailable"``, ``"the cgroup's limit"``, ``"PPDNMF_MEMORY_LIMIT"``,
    ``"free on cuda:0"``)."""

    bytes: int | None
    source: str


_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def parse_bytes(text: str) -> int:
    """``"8G"`` -> ``8 * 2**30``; a plain number is bytes; ``KiB``/``KB``/``K`` all mean 2^10.

    Raises
    ------
    ConfigError
        Naming :data:`ENV_LIMIT`, for text that is not a size.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?)(?:I?B)?\s*", str(text), re.I)
    if m is None:
        raise ConfigError(f"{ENV_LIMIT}: expected a size such as 8G, 512M or a number of bytes, got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # "max" (cgroup v2): no limit


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """What this process's cgroup still allows (its limit minus its usage), or None."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # v2
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",  # v1
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap = _read_int(limit)
        if cap is not None and cap < 2**60:  # v1 writes a huge number for "no limit"
            return max(0, cap - (_read_int(usage) or 0))
    return None


def available_memory(device=None) -> Available:
    """The memory a new allocation may take now, on ``device`` (CPU when None).

    CPU: the smaller of Linux's ``MemAvailable`` and the room left under the process's cgroup
    limit; elsewhere the free physical pages (``os.sysconf``), else unknown. CUDA: the free
    memory ``torch.cuda.mem_get_info`` reports. :data:`ENV_LIMIT` replaces either.
    """
    env = os.environ.get(ENV_LIMIT, "").strip()
    if env.lower() in ("none", "off"):
        return Available(None, ENV_LIMIT)
    if env:
        return Available(parse_bytes(env), ENV_LIMIT)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return Available(int(free), f"free on {dev}")
    found = [(v, s) for v, s in ((_meminfo_available(), "MemAvailable"), (_cgroup_room(), "the cgroup's limit"))
             if v is not None]
    if not found:
        try:
            found = [(int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_AVPHYS_PAGES")), "free pages")]
        except (AttributeError, ValueError, OSError):  # not a POSIX system: no bound known
            return Available(None, "unknown")
    value, source = min(found)
    return Available(value, source)


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``; binary units, three significant digits."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} EiB"  # pragma: no cover (the loop returns at PiB)


# --------------------------------------------------------------------------------------
# An estimate and its check
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One term of an estimate: the parameter that scales it, what was asked in words
    (``"1000000000 trials"``) and its bytes."""

    key: str
    asked: str
    bytes: float
    verb: str = "need"


@dataclass(frozen=True)
class Estimate:
    """A run's estimated peak memory.

    Attributes
    ----------
    model : str
        ``"PPDNMF"``, ``"symmetric NMF"``, ``"FSSPCA"``.
    sizes : str
        The run's sizes in words (``"10 agents, Z 30 x 200, rank 5, float64"``).
    parts : tuple of Part
        The terms; the largest names the error's key.
    device : str
        Where the run's tensors live.
    host : float
        Bytes on the host whatever ``device`` (worker processes, files read).
    pieces : dict
        ``key -> advice`` on running it in pieces, for the key that dominates.
    """

    model: str
    sizes: str
    parts: tuple
    device: str = "cpu"
    host: float = 0.0
    pieces: dict = field(default_factory=dict)

    @property
    def bytes(self) -> float:
        return float(sum(p.bytes for p in self.parts)) + self.host

    @property
    def largest(self) -> Part:
        return max(self.parts, key=lambda p: p.bytes)


def check(estimate: Estimate, available: Available | None = None) -> Estimate:
    """Refuse a run whose estimate exceeds the available memory; returns the estimate.

    Raises
    ------
    ConfigError
        One line, its key the parameter of the largest term: ``trials: 1000000000 trials need
        about 9.31 TiB of memory (PPDNMF, 10 agents, Z 30 x 200, rank 5, float64), more than the
        20.1 GiB available on this machine (MemAvailable); run it in pieces: ...``.
    """
    have = available if available is not None else available_memory(estimate.device)
    need = estimate.bytes
    if have.bytes is None or need <= have.bytes:
        return estimate
    big = estimate.largest
    where = "on this machine" if estimate.device == "cpu" else f"on {estimate.device}"
    hint = estimate.pieces.get(big.key) or next(iter(estimate.pieces.values()), "use smaller sizes")
    raise ConfigError(
        f"{big.key}: {big.asked} {big.verb} about {format_bytes(need)} of memory ({estimate.model}, {estimate.sizes}), "
        f"more than the {format_bytes(have.bytes)} available {where} ({have.source}); {hint}"
    )


def check_bytes(nbytes: float, key: str, asked: str, *, model: str, sizes: str, hint: str, device="cpu",
                verb: str = "needs") -> Estimate:
    """:func:`check` for a single term: ``asked`` (``"'/data/x.npy' (100000 x 10000 float64)"``)
    ``verb`` about ``nbytes``, refused naming ``key`` with ``hint``."""
    return check(Estimate(model, sizes, (Part(key, asked, float(nbytes), verb),), str(device), pieces={key: hint}))


def history_bytes(iterations: float, keys: int, trials: int = 1) -> float:
    """A history of ``keys`` values per iteration (one small tensor of ``trials`` each, kept in
    lists and stacked at the end) at its cap of ``iterations``."""
    return float(iterations) * keys * (_ENTRY_BYTES + 2 * 8 * trials)


def _history_parts(iterations: float, keys: int, trials: int, key_iter: str, asked_iter: str, key_trials: str,
                   asked_trials: str, runs: int = 1) -> tuple:
    """A history's two terms: its entries' overhead (the iteration cap's, ``key_iter``) and their
    values (``trials`` per entry); the values go with ``key_trials`` once a trial's value
    outweighs an entry's overhead (many trials), else with the cap."""
    fixed = history_bytes(iterations, keys, 0) * runs
    values = (history_bytes(iterations, keys, trials) - history_bytes(iterations, keys, 0)) * runs
    if 16 * trials > _ENTRY_BYTES:
        return Part(key_iter, asked_iter, fixed), Part(key_trials, asked_trials, values)
    return (Part(key_iter, asked_iter, fixed + values),)


def _merge(parts) -> tuple:
    """Parts of the same key summed (the first one's words kept), in first-seen order."""
    out: dict = {}
    for p in parts:
        out[p.key] = Part(p.key, p.asked, out[p.key].bytes + p.bytes, p.verb) if p.key in out else p
    return tuple(out.values())


def _fits(room: float, fixed: float, per: float) -> int:
    """How many units of ``per`` bytes fit in ``room`` next to ``fixed`` (at least 0)."""
    return max(0, int((room - fixed) // per)) if per > 0 else 0


def _dtype_bytes(dtype) -> int:
    if isinstance(dtype, torch.dtype):
        return dtype.itemsize
    return {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "double": 8, "float": 4}.get(str(dtype), 8)


def _smaller_dtype(bpe: int) -> str:
    return "; or dtype=float32 (half the memory of float64)" if bpe == 8 else ""


# --------------------------------------------------------------------------------------
# Per model: the sizes -> bytes
# --------------------------------------------------------------------------------------


def ppdnmf(*, trials: int, n_agents: int, L: int, M: int, rank: int, M_max: int | None = None,
           bcd_iters: float = 1000, x_iters: float = 30, edges: int | None = None, dtype=torch.float64,
           device="cpu", centralized: bool = False, data_copies: int = 1, workers: int = 0,
           avail: Available | None = None) -> Estimate:
    """PPDNMF's peak: ``trials`` batched runs of ``n_agents`` agents on ``Z (L, M)`` at ``rank``.

    Parameters
    ----------
    trials, n_agents, L, M, rank : int
    M_max : int, optional
        The widest agent's columns (default: an equal split); the iterates ``Y (T, N, K,
        M_max)`` and the padded data ``(T, N, L, M_max)`` are padded to it (to 64 columns).
    bcd_iters : number
        The cap of BCD iterations (each keeps about a dozen history values per trial).
    x_iters : number
        ADMM iterations per X-step: the per-iteration penalty draws and sums (``x_iters``
        long, per directed edge and per agent).
    edges : int, optional
        Directed edges per trial (default: 4 per agent, the paper's graphs).
    dtype, device
    centralized : bool
        The centralized baseline runs after the distributed fit, whose result is kept.
    data_copies : int
        Copies of each trial's data besides the solver's padded one (1: the caller's blocks;
        more where a loader holds a file's matrix as well).
    workers : int
        Paillier worker processes (host memory).
    avail : Available, optional
        Used for the "how many fit" advice (default :func:`available_memory`).
    """
    T, N, L, M, K = (max(1, int(v)) for v in (trials, n_agents, L, M, rank))
    bpe = _dtype_bytes(dtype)
    m_max = int(M_max) if M_max is not None else -(-M // N)
    m_pad = -(-m_max // 64) * 64
    n_pad = N + 8  # agents padded for the trials' alignment
    E = int(edges) if edges is not None else 4 * N
    per_trial_data = bpe * (data_copies * L * M + n_pad * L * m_pad)
    # X, U, P, Q, Q_prev, the X-step's D and right-hand side, and a spare (L, K) each; Y, V,
    # R and two buffers (K, M_max); Grams (K, K); twice over for the workspace's buffers
    per_trial_state = bpe * n_pad * (10 * L * K + 6 * K * m_pad + 4 * K * K) * (1 + _WORKSPACE)
    per_trial_iter = 8.0 * (n_pad * (K + 2) + 6 * E) * float(x_iters)
    runs = 2 if centralized else 1  # the baseline's history beside the distributed fit's
    per_trial_hist = (history_bytes(bcd_iters, 12, 1) - history_bytes(bcd_iters, 12, 0)) * runs
    if centralized:
        per_trial_state *= 2
        per_trial_data += bpe * (L * M + L * (-(-M // 64) * 64))
    size_key = "n_agents" if N > 1000 and N > T else "trials"
    asked = f"{N} agents" if size_key == "n_agents" else f"{T} trials"
    parts = _merge((Part(size_key, asked, T * (per_trial_data + per_trial_state)),
                    Part("x_iters", f"{_num(x_iters)} ADMM iterations per X-step", T * per_trial_iter))
                   + _history_parts(bcd_iters, 12, T, "bcd_iters", f"{_num(bcd_iters)} BCD iterations (a history "
                                    "entry each)", size_key, asked, runs))
    host = float(workers) * _WORKER_BYTES + _RUNTIME
    room = (avail or available_memory(device)).bytes or 0
    fixed = history_bytes(bcd_iters, 12, 0) * runs + host
    per = per_trial_data + per_trial_state + per_trial_iter + per_trial_hist
    fit_t = _fits(room, fixed, per)
    cut = _smaller_dtype(bpe)
    pieces = {
        "trials": (f"run it in pieces: at most {fit_t} trials per batch (the CLI: ppdnmf -m seed=0,{fit_t},... "
                   f"trials={fit_t}; each batch takes seeds seed, seed + 1, ...)" if fit_t >= 1 else
                   "even one trial does not fit: use fewer agents or a smaller rank") + cut,
        "n_agents": ("run it in pieces: distributed.nproc=<p> spreads the agents over p processes (each holds its "
                     "own agents' data and iterates), or use fewer agents") + cut,
        "x_iters": "use fewer ADMM iterations per X-step",
        "bcd_iters": ("use a lower cap (the history keeps every BCD iteration up to it, even when tol > 0 stops "
                      "the run earlier)"),
    }
    sizes = f"{N} agents, Z {L} x {M}, rank {K}, {_dtype_name(dtype)}" + (f", {T} trials" if T > 1 else "")
    return Estimate("PPDNMF", sizes, parts, str(torch.device(device)) if device != "auto" else "cpu", host, pieces)


def symnmf(*, n: int, rank: int, trials: int = 1, nnz: int | None = None, max_iter: float = 500,
           samples: tuple | None = None, dtype=torch.float64, device="cpu", similarity_copies: int = 1,
           avail: Available | None = None, key_n: str = "n", key_trials: str = "trials") -> Estimate:
    """Symmetric NMF's peak: an ``n x n`` similarity (dense, or sparse with ``nnz`` entries)
    and ``trials`` starts of ``U, V (n, rank)`` at ``rank``.

    Parameters
    ----------
    n, rank, trials : int
        ``trials`` is also :class:`SymmetricNMF`'s ``n_init`` (pass ``key_trials="n_init"``).
    nnz : int, optional
        Stored entries of a sparse similarity; None: dense (``n^2``).
    max_iter : number
        The iteration cap (its history: 8 values per trial per iteration).
    samples : (n, p), optional
        Samples a similarity is built from (their copy and the neighbour search's blocks).
    similarity_copies : int
        Dense copies of the similarity held at once (a generator's temporaries, a loader's
        array and its tensor).
    key_n, key_trials : str
        The parameters' names in the error (``"data.n"``, ``"n_init"``).
    """
    n, r, T = max(1, int(n)), max(1, int(rank)), max(1, int(trials))
    bpe = _dtype_bytes(dtype)
    dense = nnz is None
    sim = (float(n) * n * bpe * similarity_copies) if dense else float(nnz) * (bpe + 8) * 2 + (n + 1) * 8
    if samples is not None:
        p = max(1, int(samples[1]))
        sim += 8.0 * n * p * 2 + 256 * 2**20  # the samples, their tensor, one block of distances
    # U, V, the products X U and U^T U, the previous iterates and the workspace: per start
    per_start = float(bpe) * n * r * 12
    starts = f"{T} starts" if key_trials == "n_init" else f"{T} trials"
    hist = history_bytes(max_iter, 8, T)
    parts = _merge((Part(key_n, f"{n} samples" + (" (a dense similarity)" if dense else ""), sim),
                    Part(key_trials, starts, per_start * T))
                   + _history_parts(max_iter, 8, T, "max_iter", f"{_num(max_iter)} iterations (a history entry "
                                    "each)", key_trials, starts))
    room = (avail or available_memory(device)).bytes or 0
    rest = per_start * T + hist + _RUNTIME
    fit_n = int(math.sqrt(max(0.0, room - rest) / (bpe * max(1, similarity_copies))))
    fit_t = _fits(room, sim + history_bytes(max_iter, 8, 0) + _RUNTIME,
                  per_start + history_bytes(max_iter, 8, 1) - history_bytes(max_iter, 8, 0))
    cut = _smaller_dtype(bpe)
    pieces = {
        key_n: (f"at most about {fit_n} samples fit as a dense similarity; a sparse similarity (a kNN graph, "
                f"O(n log n) entries: sparse=True) or fewer samples" if dense else "fewer samples") + cut,
        key_trials: f"run it in pieces: at most {fit_t} {'starts per fit' if key_trials == 'n_init' else 'trials per batch'}"
                    + cut,
        "max_iter": "use a lower cap (the history keeps every iteration up to it)",
    }
    sizes = f"n = {n}, rank {r}, {'dense' if dense else f'sparse, {nnz} entries'}, {_dtype_name(dtype)}"
    return Estimate("symmetric NMF", sizes, parts, str(torch.device(device)) if device != "auto" else "cpu", _RUNTIME,
                    pieces)


def fsspca(*, n: int, d: int, n_workers: int, n_components: int, trials: int = 1, max_iter: float = 1000,
           dtype=torch.float64, device="cpu", avail: Available | None = None, data_copies: int = 3,
           key_d: str = "data", key_trials: str = "trials") -> Estimate:
    """FSSPCA's peak: ``n x d`` rows over ``n_workers`` workers (a ``d x d`` covariance each),
    ``n_components`` loadings, ``trials`` batched runs.

    Parameters
    ----------
    data_copies : int
        Copies of the rows held at once (the loader's array, the centred tensor).
    key_d, key_trials : str
        The parameters' names in the error.
    """
    n, d, W, r, T = (max(1, int(v)) for v in (n, d, n_workers, n_components, trials))
    bpe = _dtype_bytes(dtype)
    data = float(n) * d * 8 * data_copies
    cov = float(W) * d * d * bpe * 3  # the workers' covariances, their centred copies and products
    # per trial: w, u, the Riemannian step's buffers (workers x d x r) and z (d x r)
    per_trial = float(bpe) * (W + 1) * d * r * 16
    parts = _merge((Part(key_d, f"{d} features over {W} workers", data + cov),
                    Part(key_trials, f"{T} trials", per_trial * T))
                   + _history_parts(max_iter, 10, T, "max_iter", f"{_num(max_iter)} iterations (a history entry "
                                    "each)", key_trials, f"{T} trials"))
    room = (avail or available_memory(device)).bytes or 0
    fit_t = _fits(room, data + cov + history_bytes(max_iter, 10, 0) + _RUNTIME,
                  per_trial + history_bytes(max_iter, 10, 1) - history_bytes(max_iter, 10, 0))
    cut = _smaller_dtype(bpe)
    pieces = {
        key_d: "each worker holds a d x d covariance: use fewer features (or fewer workers)" + cut,
        key_trials: f"run it in pieces: at most {fit_t} trials per batch" + cut,
        "max_iter": "use a lower cap (the history keeps every iteration up to it)",
    }
    sizes = f"{n} x {d} rows, {W} workers, {r} components, {_dtype_name(dtype)}"
    return Estimate("FSSPCA", sizes, parts, str(torch.device(device)) if device != "auto" else "cpu", _RUNTIME, pieces)


def _num(v) -> str:
    """An iteration count as written: ``1000``, ``1e+30`` (floats from a config), ``10**30``."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e16:
        return str(int(v))
    if isinstance(v, int) and v >= 10**16:
        return f"{v:.3g}"
    return str(v)


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")
