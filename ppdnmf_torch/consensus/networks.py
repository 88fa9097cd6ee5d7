"""Random networks of Sec. V: ``N`` agents, connectivity ratio ``eta``, with a Hamiltonian cycle.

The connectivity ratio is the fraction of the ``N (N - 1) / 2`` possible links that are
present (as in the W-ADMM / COCA experiments the paper follows), so a draw has exactly
``E = round(eta N (N - 1) / 2)`` edges, uniformly at random; it is redrawn until it is
connected and a Hamiltonian cycle is found.
"""
from __future__ import annotations

import math
import random

from ..errors import ConfigError, GraphError
from ..graph import Graph
from .cycles import hamiltonian_cycle

__all__ = ["random_hamiltonian_graph", "n_edges_for_ratio"]


def n_edges_for_ratio(n_agents: int, eta: float) -> int:
    """``round(eta N (N - 1) / 2)`` (Python ``round``), checked to allow a Hamiltonian cycle.

    Raises
    ------
    ConfigError
        If ``N < 3``, ``eta`` is not in ``(0, 1]``, or the count is below ``N`` (a cycle
        through ``N`` agents needs ``N`` edges).
    """
    try:
        n = int(n_agents)
        e = float(eta)
    except (TypeError, ValueError):
        raise ConfigError(f"n_agents, eta: expected numbers, got {n_agents!r}, {eta!r}") from None
    if n < 3:
        raise ConfigError(f"n_agents: a random Hamiltonian network needs N >= 3, got {n_agents!r}")
    if not (math.isfinite(e) and 0.0 < e <= 1.0):
        raise ConfigError(f"eta: the connectivity ratio must be in (0, 1], got {eta!r}")
    m = round(e * n * (n - 1) / 2)
    if m < n:
        raise ConfigError(f"eta: {eta} gives {m} edges for N={n}, fewer than the N={n} a Hamiltonian "
                          f"cycle needs (eta >= {2 / (n - 1):.3g})")
    return m


def random_hamiltonian_graph(n_agents: int, eta: float, seed: int = 0, max_tries: int = 100,
                             cycle_budget: int | None = None):
    """A uniformly random connected graph with ratio ``eta`` and one of its Hamiltonian cycles.

    Parameters
    ----------
    n_agents : int
        ``N >= 3``.
    eta : float
        Connectivity ratio in ``(0, 1]``.
    seed : int
        The same seed gives the same graph and cycle.
    max_tries : int
        Draws before giving up.
    cycle_budget : int, optional
        Passed to :func:`hamiltonian_cycle` as ``budget`` (the heuristic, ``N > 20``).

    Returns
    -------
    graph : Graph
    cycle : tuple of int
        A Hamiltonian cycle of ``graph`` starting at agent 0.

    Raises
    ------
    ConfigError
        For a bad ``n_agents``, ``eta`` or ``max_tries``.
    GraphError
        If no draw in ``max_tries`` was connected with a cycle found.
    """
    m = n_edges_for_ratio(n_agents, eta)
    n = int(n_agents)
    if int(max_tries) < 1:
        raise ConfigError(f"max_tries: must be >= 1, got {max_tries!r}")
    rng = random.Random(f"random_hamiltonian_graph:{int(seed)}")
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    last = None
    for attempt in range(int(max_tries)):
        edges = rng.sample(pairs, m)
        try:
            graph = Graph(n, edges)
            return graph, hamiltonian_cycle(graph, seed=attempt, budget=cycle_budget)
        except GraphError as err:
            last = err
    raise GraphError(f"random_hamiltonian_graph: no connected graph with a Hamiltonian cycle found in "
                     f"{max_tries} draws (N={n}, eta={eta}, {m} edges); raise eta or max_tries "
                     f"(last failure: {last})")
