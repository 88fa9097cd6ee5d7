"""The split of a data matrix's columns over the agents: ``Z = [Z_1, ..., Z_N]``."""
from __future__ import annotations

import bisect
import random

import torch

from .._utils import derive_seed
from ..errors import ConfigError, DataError
from ._args import as_int as _as_int

__all__ = ["split_counts", "split_columns"]


def split_counts(M, n_agents, lo=None, hi=None, seed=0) -> list[int]:
    """Number of columns each agent gets.

    Without bounds the split is equal: sizes differ by at most one, the larger
    ones first. With bounds (the paper's setting, e.g. 4..40 columns for the
    synthetic data and 224..245 for CBCL) each count is drawn uniformly in
    ``[lo, hi]``, and the sum is then repaired to exactly ``M`` by +/-1 moves on
    uniformly chosen agents that still have room, so the counts stay roughly
    uniform. The draw uses ``random.Random(derive_seed(seed, "split"))``.

    Parameters
    ----------
    M : int
        Total number of columns.
    n_agents : int
        Number of agents ``N``.
    lo, hi : int, optional
        Inclusive bounds on each count. If only one is given the other
        defaults to 1 (``lo``) or ``M`` (``hi``).
    seed : int, default 0

    Returns
    -------
    list of int, length N
        Positive counts summing to ``M``.

    Raises
    ------
    ConfigError
        If ``M < N``, ``N < 1``, ``lo < 1``, ``lo > hi``, ``N * lo > M`` or ``N * hi < M``.
    """
    M = _as_int(M, "M")
    n = _as_int(n_agents, "n_agents")
    if n < 1:
        raise ConfigError(f"n_agents: must be >= 1, got {n}")
    if M < n:
        raise ConfigError(f"M: {M} columns cannot give each of the {n} agents at least one column")
    if lo is None and hi is None:
        base, extra = divmod(M, n)
        return [base + 1] * extra + [base] * (n - extra)
    lo = 1 if lo is None else _as_int(lo, "lo")
    hi = M if hi is None else _as_int(hi, "hi")
    if lo < 1:
        raise ConfigError(f"lo: every agent needs at least 1 column, got lo={lo}")
    if lo > hi:
        raise ConfigError(f"lo, hi: lo={lo} is greater than hi={hi}")
    if n * lo > M:
        raise ConfigError(f"lo: {n} agents x lo={lo} = {n * lo} columns exceeds M={M}")
    if n * hi < M:
        raise ConfigError(f"hi: {n} agents x hi={hi} = {n * hi} columns is less than M={M}")
    rng = random.Random(derive_seed(_as_int(seed, "seed"), "split"))
    counts = [rng.randint(lo, hi) for _ in range(n)]
    diff = M - sum(counts)
    step = 1 if diff > 0 else -1  # the repair moves one way only
    bound = hi if step > 0 else lo
    # the agents that still have room, in index order, kept as they fill (not rebuilt per move:
    # n agents and |diff| moves would cost n |diff|)
    room = [i for i, c in enumerate(counts) if c != bound]
    while diff:
        i = rng.choice(room)
        counts[i] += step
        diff -= step
        if counts[i] == bound:
            del room[bisect.bisect_left(room, i)]
    return counts


def split_columns(Z: torch.Tensor, counts) -> list[torch.Tensor]:
    """Split ``Z`` into contiguous column blocks ``[Z_1, ..., Z_N]``.

    Parameters
    ----------
    Z : torch.Tensor, shape (L, M)
    counts : sequence of int, length N
        Columns per agent, each ``>= 1``, summing to ``M``.

    Returns
    -------
    list of torch.Tensor, shapes (L, M_i)
        Views into ``Z`` (no copy), in agent order.

    Raises
    ------
    DataError
        If ``Z`` is not a 2-D tensor.
    ConfigError
        If a count is not a positive integer or the counts do not sum to ``M``.
    """
    if not isinstance(Z, torch.Tensor) or Z.dim() != 2:
        shape = tuple(Z.shape) if hasattr(Z, "shape") else type(Z).__name__
        raise DataError(f"Z: expected a 2-D (L, M) tensor, got {shape}")
    cs = [_as_int(c, f"counts[{i}]") for i, c in enumerate(counts)]
    if not cs:
        raise ConfigError("counts: need at least one agent")
    for i, c in enumerate(cs):
        if c < 1:
            raise ConfigError(f"counts: agent {i} gets {c} columns; every agent needs at least 1")
    if sum(cs) != Z.shape[1]:
        raise ConfigError(f"counts: sum to {sum(cs)} but Z has {Z.shape[1]} columns")
    return list(torch.split(Z, cs, dim=1))
