"""The batched problem: :class:`Problem`, and turning user input (matrices, blocks, graphs,
caps) into a validated one (:func:`build_problem`)."""
from __future__ import annotations

import math
import numbers
import operator
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch

from ..._utils import caller_stacklevel, counted
from ...errors import ConfigError, DataError
from ...diagnostics import scale_warning
from ...errors import DataScaleWarning
from ...graph.topology import Topology
from ...graph import Graph, from_adjacency

__all__ = ["Problem", "COLUMN_CHUNK", "as_graph", "as_blocks", "as_caps", "as_seed", "check_data", "build_problem",
           "padded_width", "NEGATIVE_MODES", "MAX_SEED"]

NEGATIVE_MODES = ("error", "clip", "shift", "allow")

#: Width of the column chunks that reductions over the (padded) column axis run in
#: (:func:`~ppdnmf_torch.models.ppdnmf.solver.kernels.column_gram`); :func:`build_problem` pads ``M_max``
#: to a multiple of it.
COLUMN_CHUNK = 64


@dataclass
class Problem:
    """A batch of ``T`` distributed problems with the same ``N``, ``L`` and ``K``.

    Attributes
    ----------
    Z : Tensor (T, N, L, M_max)
        Zero-padded data blocks.
    counts : LongTensor (T, N)
        ``M_i`` of every agent.
    topology : Topology
        The trials' graphs, flattened to ``T * N`` nodes.
    caps : Tensor (T, N) float64
        Penalty caps ``g_i``.
    seeds : list of int
        One seed per trial (penalty streams).
    n_agents : int, optional
        The real agents: ``Z.shape[1]`` may hold isolated dummy agents after them
        (alignment padding of batched trials); they are left out of every metric.
    init_seeds : list of int, optional
        One seed per trial for the seeded start (``init="random"``); None: ``seeds``.
    """

    Z: torch.Tensor
    counts: torch.Tensor
    topology: Topology
    caps: torch.Tensor
    seeds: list
    n_agents: int | None = None
    init_seeds: list | None = None

    def __post_init__(self):
        if self.n_agents is None:
            self.n_agents = self.Z.shape[1]
        if self.init_seeds is None:
            self.init_seeds = list(self.seeds)

    @property
    def shape(self):
        T, N, L, M = self.Z.shape
        return T, N, L, M

    @cached_property
    def width(self) -> int:
        """Columns of the widest agent: the real part of the padded ``M_max``."""
        return int(self.counts.max())

    def column_mask(self) -> torch.Tensor:
        """Bool ``(T, N, 1, M_max)``: True on real columns."""
        M = self.Z.shape[-1]
        ar = torch.arange(M, device=self.Z.device)
        return (ar < self.counts.to(self.Z.device)[..., None])[:, :, None, :]


def as_graph(adjacency, n_agents: int | None = None) -> Graph:
    """A :class:`~ppdnmf_torch.graph.Graph` from a Graph, adjacency matrix, sparse tensor or networkx graph."""
    if isinstance(adjacency, Graph):
        if n_agents is not None and adjacency.n_agents != n_agents:
            raise ConfigError(
                f"adjacency: the graph has {adjacency.n_agents} nodes but there are {n_agents} agents"
            )
        return adjacency
    return from_adjacency(adjacency, n_agents=n_agents)


def _to_tensor(x, what: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.is_meta:
            raise DataError(f"{what}: is a meta tensor (a shape without values); give a tensor that holds its data")
        if t.is_sparse or t.layout != torch.strided:
            t = t.to_dense()
    else:
        try:
            import numpy as np  # only for array-likes handed in by the user

            _refuse_masked(x, what)
            arr = np.asarray(x)
            if np.iscomplexobj(arr):  # float64 conversion would drop the imaginary parts
                raise DataError(f"{what}: expected a real numeric matrix, got complex values (dtype {arr.dtype})")
            t = torch.as_tensor(np.asarray(arr, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, DataError):
                raise
            raise DataError(f"{what}: cannot be read as a numeric matrix ({exc})") from None
    if not (t.is_floating_point() or t.dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)):
        raise DataError(f"{what}: expected a real numeric matrix, got dtype {t.dtype}")
    return t.to(torch.float64)


def _refuse_masked(x, what: str) -> None:
    """A ``numpy.ma`` array with masked entries: ``numpy.asarray`` would drop the mask and the
    masked entries would be factorized as data."""
    import numpy as np

    if isinstance(x, np.ma.MaskedArray) and np.ma.count_masked(x):
        raise DataError(f"{what}: a masked array with {int(np.ma.count_masked(x))} masked entries; NMF here has no "
                        "missing values: fill them (Z.filled(value)) or drop their columns")


def _is_block_list(Z) -> bool:
    """A list or tuple of per-agent blocks (each 2-D), as opposed to a nested list of rows."""
    if not isinstance(Z, (list, tuple)) or not Z:
        return False
    return all(isinstance(b, torch.Tensor) and b.dim() == 2 or hasattr(b, "ndim") and b.ndim == 2
               or isinstance(b, (list, tuple)) and b and isinstance(b[0], (list, tuple)) for b in Z)


def _as_counts(columns, n_agents: int) -> list:
    """``columns`` as a list of integer counts (integral floats accepted; a string, a
    fractional count or a bool is refused, never truncated)."""
    if isinstance(columns, (str, bytes)) or not hasattr(columns, "__iter__"):
        raise ConfigError(f"columns: expected a sequence of {n_agents} integer counts, got {columns!r}")
    out = []
    for i, c in enumerate(list(columns.tolist() if hasattr(columns, "tolist") else columns)):
        if isinstance(c, bool) or not isinstance(c, numbers.Real):
            raise ConfigError(f"columns: count {i} is {c!r}; every count must be an integer")
        if isinstance(c, numbers.Integral):
            out.append(int(c))
        elif math.isfinite(c) and float(c).is_integer():
            out.append(int(c))
        else:
            raise ConfigError(f"columns: count {i} is {c!r}; every count must be an integer (none is rounded)")
    return out


def as_blocks(Z, n_agents: int, columns: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Split ``Z (L, M)`` by columns (or accept a list of blocks ``(L, M_i)``), float64 on CPU.

    ``columns=None`` splits as evenly as possible (the first ``M mod N`` agents get one more).
    """
    if _is_block_list(Z):
        if columns is not None:
            raise ConfigError("columns: give either a list of per-agent blocks or a matrix with columns=, not both")
        blocks = [_to_tensor(b, f"Z[{i}]") for i, b in enumerate(Z)]
        if len(blocks) != n_agents:
            raise DataError(f"Z: got {len(blocks)} blocks but the graph has {n_agents} agents")
        for i, b in enumerate(blocks):
            if b.dim() != 2:
                raise DataError(f"Z[{i}]: expected a 2-D block (L, M_i), got shape {tuple(b.shape)}")
            if b.shape[1] < 1:
                raise DataError(f"Z[{i}]: agent {i} has no columns")
            if b.shape[0] < 1:
                raise DataError(f"Z[{i}]: the block is empty (shape {tuple(b.shape)}); it needs at least one row")
            if b.shape[0] != blocks[0].shape[0]:
                raise DataError(
                    f"Z[{i}]: has {b.shape[0]} rows but Z[0] has {blocks[0].shape[0]}; all blocks need the same L"
                )
        return blocks
    Zt = _to_tensor(Z, "Z")
    if Zt.dim() != 2:
        raise DataError(f"Z: expected a 2-D matrix (L, M), got shape {tuple(Zt.shape)}")
    L, M = Zt.shape
    if L == 0 or M == 0:
        raise DataError(f"Z: the matrix is empty (shape {tuple(Zt.shape)}); it needs at least one row and one "
                        "column per agent")
    if columns is None:
        if M < n_agents:
            raise DataError(f"Z: has {M} columns, fewer than the {n_agents} agents; every agent needs a column")
        base, extra = divmod(M, n_agents)
        columns = [base + (1 if i < extra else 0) for i in range(n_agents)]
    columns = _as_counts(columns, n_agents)
    if len(columns) != n_agents:
        raise DataError(f"columns: got {len(columns)} counts but the graph has {n_agents} agents")
    if any(c < 1 for c in columns):
        bad = [i for i, c in enumerate(columns) if c < 1]
        raise DataError(f"columns: agents {bad} have no columns; every count must be >= 1")
    if sum(columns) != M:
        raise DataError(f"columns: counts sum to {sum(columns)} but Z has M = {M} columns")
    return list(torch.split(Zt, columns, dim=1))


def as_caps(g_max, n_agents: int) -> torch.Tensor:
    """Per-agent penalty caps ``g_i`` as float64 ``(N,)`` from a float or a sequence."""
    if isinstance(g_max, (int, float)) and not isinstance(g_max, bool):
        caps = torch.full((n_agents,), float(g_max), dtype=torch.float64)
    else:
        if g_max is None or isinstance(g_max, (bool, str, bytes)) or not hasattr(g_max, "__iter__"):
            raise ConfigError(f"g_max: expected a number > 0 or a sequence of {n_agents} numbers, got {g_max!r}")
        vals = list(g_max) if not isinstance(g_max, torch.Tensor) else g_max
        if not isinstance(vals, torch.Tensor) and any(isinstance(v, bool) or not isinstance(v, numbers.Real)
                                                      for v in vals):
            raise ConfigError(f"g_max: every cap must be a number > 0, got {list(vals)!r}")
        caps = torch.as_tensor(vals, dtype=torch.float64).reshape(-1)
        if caps.numel() != n_agents:
            raise ConfigError(f"g_max: got {caps.numel()} caps but there are {n_agents} agents")
    if not bool(torch.isfinite(caps).all()) or not bool((caps > 0).all()):
        raise ConfigError(f"g_max: every cap must be a finite number > 0, got {caps.tolist()}")
    return caps


def check_data(blocks: list[torch.Tensor], negative: str = "error") -> list[torch.Tensor]:
    """Reject NaN/Inf; handle negative entries as ``negative`` says.

    Parameters
    ----------
    blocks : list (N) of Tensor (L, M_i)
        The agents' data blocks; returned as given, or with their negative entries handled.
    negative : {"error", "clip", "shift", "allow"}
        ``error`` refuses them; ``clip`` sets them to 0; ``shift`` adds ``-min(Z)`` to
        every entry of every block; ``allow`` keeps them (the paper's synthetic
        ``Z = XY + noise`` has a few slightly negative entries and is factorized as is).
    """
    if negative not in NEGATIVE_MODES:
        raise ConfigError(f"negative: unknown mode {negative!r}; use one of {NEGATIVE_MODES}")
    # one pass per block: a NaN makes both extremes NaN, an Inf one of them infinite
    lows, highs = [], []
    for i, b in enumerate(blocks):
        lo, hi = (float(v) for v in torch.aminmax(b))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            r, c = (int(v) for v in torch.nonzero(~torch.isfinite(b))[0])
            raise DataError(f"Z: agent {i}'s block has a NaN or Inf entry at row {r}, column {c} (of the block)")
        lows.append(lo)
        highs.append(hi)
    zmin = min(lows)
    text = scale_warning(max(max(abs(lo), abs(hi)) for lo, hi in zip(lows, highs)))
    if text is not None:
        warnings.warn(text, DataScaleWarning, stacklevel=caller_stacklevel())
    if zmin < 0:
        if negative == "error":
            i = next(k for k, lo in enumerate(lows) if lo < 0)
            count = sum(int((b < 0).sum()) for b in blocks)
            raise DataError(
                f"Z: has {counted(count, 'negative entry', 'negative entries')} (min {zmin:.4g}, first in agent {i}'s block); NMF needs "
                "nonnegative data. Set {negative}=clip or shift (or {negative}=allow to factorize as is)"
            )
        if negative == "clip":
            blocks = [b.clamp(min=0) for b in blocks]
        elif negative == "shift":
            blocks = [b - zmin for b in blocks]
    return blocks


#: Per-trial blocks of a batch start on this byte boundary (see :func:`build_problem`).
TRIAL_ALIGN_BYTES = 64


def _aligned_agents(N: int, L: int, K: int, itemsize: int) -> int:
    """Smallest ``N' >= N`` whose per-trial ``(N', L, K)`` and ``(N', K, K)`` blocks are whole
    multiples of :data:`TRIAL_ALIGN_BYTES`."""
    n = N
    while (n * L * K * itemsize) % TRIAL_ALIGN_BYTES or (n * K * K * itemsize) % TRIAL_ALIGN_BYTES:
        n += 1
    return n


def padded_width(m: int) -> int:
    """``M_max`` for a widest agent of ``m`` columns: whole column chunks
    (:data:`COLUMN_CHUNK`), so that reductions over columns round the
    same whatever the batch (see :func:`~ppdnmf_torch.models.ppdnmf.solver.kernels.column_gram`)."""
    return -(-int(m) // COLUMN_CHUNK) * COLUMN_CHUNK


def build_problem(block_lists, graphs, caps, seeds, *, dtype, device, rank=None, init_seeds=None) -> Problem:
    """Stack ``T`` trials into one padded :class:`Problem`.

    Parameters
    ----------
    block_lists : list (T) of list (N) of Tensor (L, M_i)
    graphs : list (T) of Graph, all with ``N`` agents
    caps : Tensor (T, N) float64
    seeds : list (T) of int
    dtype : torch.dtype
        Of ``Z`` and of every iterate.
    device : torch.device
        Where ``Z``, the counts, the caps and the topology live.
    rank : int, optional
        ``K``; with ``T > 1`` it sets the agent padding below.
    init_seeds : list (T) of int, optional
        Seeds of the seeded start (``init="random"``); None: ``seeds``.

    Notes
    -----
    Small BLAS/LAPACK kernels (``X^T X``, the Cholesky solves) round differently
    depending on the memory alignment of their operands. In a batch of ``T > 1``
    trials, each trial's agents are padded with isolated dummy agents (``Z = 0``, no
    edges, excluded from every metric and result) up to ``N'`` agents, so that every
    trial starts on a 64-byte boundary exactly like a single run does. Trial ``t`` of a
    batch then gives the same bits as the same problem run alone.
    """
    T = len(block_lists)
    N = graphs[0].n_agents
    L = block_lists[0][0].shape[0]
    for t, (blocks, g) in enumerate(zip(block_lists, graphs)):
        if g.n_agents != N or len(blocks) != N:
            raise DataError(f"trial {t}: {len(blocks)} blocks on a {g.n_agents}-agent graph; expected {N}")
        if any(b.shape[0] != L for b in blocks):
            raise DataError(f"trial {t}: blocks must all have L = {L} rows")
    itemsize = torch.empty((), dtype=dtype).element_size()
    Np = N if T == 1 or rank is None else _aligned_agents(N, L, rank, itemsize)
    counts = torch.zeros((T, Np), dtype=torch.int64)
    counts[:, :N] = torch.tensor([[b.shape[1] for b in blocks] for blocks in block_lists], dtype=torch.int64)
    M_max = padded_width(counts.max())
    Z = torch.zeros((T, Np, L, M_max), dtype=dtype)
    for t, blocks in enumerate(block_lists):
        for i, b in enumerate(blocks):  # data layout only, once, before any iteration
            Z[t, i, :, : b.shape[1]] = b
    topo = Topology.from_graphs(graphs, stride=Np).to(device)  # dummies have no edges
    caps_p = torch.ones((T, Np), dtype=torch.float64)
    caps_p[:, :N] = caps
    return Problem(Z=Z.to(device), counts=counts.to(device), topology=topo,
                   caps=caps_p.to(device=device), seeds=[int(s) for s in seeds], n_agents=N,
                   init_seeds=None if init_seeds is None else [int(s) for s in init_seeds])


def check_rank(rank, L: int) -> int:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise ConfigError(f"rank: must be an integer >= 1, got {rank!r}")
    if rank > L:
        raise ConfigError(f"rank: K = {rank} is larger than L = {L} (the number of rows of Z)")
    return rank


#: the largest seed accepted (:func:`as_seed`)
MAX_SEED = 2**63 - 1


def as_seed(seed, name: str = "seed") -> int:
    """``seed`` as a Python int from 0 to :data:`MAX_SEED` (numpy integers accepted; a float, a
    bool or None is refused, never truncated)."""
    if isinstance(seed, bool):
        raise ConfigError(f"{name}: must be an integer, got {seed!r}")
    try:
        value = operator.index(seed)
    except TypeError:
        raise ConfigError(f"{name}: must be an integer, got {seed!r} ({type(seed).__name__})") from None
    if not 0 <= value <= MAX_SEED:  # as the CLI's seed (>= 0); torch's generators take 64 bits
        raise ConfigError(f"{name}: must be an integer from 0 to 2**63 - 1, got {value}")
    return value


