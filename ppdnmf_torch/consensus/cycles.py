"""Hamiltonian cycles: the fixed order in which I-ADMM's token visits the agents.

* :func:`validate_cycle` checks a user's cycle;
* :func:`hamiltonian_cycle` finds one: an exact bitmask dynamic programme (Held-Karp's
  reachability form, vectorised over subsets with numpy) up to ``exact_max_nodes``
  agents, which also proves that none exists; above that a randomised rotation-extension
  search (Posa rotations with restarts) within a step budget.
"""
from __future__ import annotations

import random

import numpy as np

from ..errors import ConfigError, GraphError
from ..graph import Graph

__all__ = ["validate_cycle", "hamiltonian_cycle", "EXACT_MAX_NODES"]

#: Largest graph the exact search takes by default (2^(N-1) subsets of N-bit masks).
EXACT_MAX_NODES = 20


def _graph(graph) -> Graph:
    if not isinstance(graph, Graph):
        raise GraphError(f"graph: expected a ppdnmf_torch.graph.Graph, got {type(graph).__name__}")
    return graph


def _adjacency_sets(g: Graph) -> list[set[int]]:
    adj = [set() for _ in range(g.n_agents)]
    for i, j in g.edges:
        adj[i].add(j)
        adj[j].add(i)
    return adj


def validate_cycle(graph: Graph, cycle) -> tuple[int, ...]:
    """Check that ``cycle`` is a Hamiltonian cycle of ``graph``.

    Parameters
    ----------
    graph : Graph
    cycle : sequence of int
        A permutation of ``0 .. N-1``; consecutive agents, and the last and the first,
        must be neighbours (for ``N <= 2`` the token goes back and forth along the edge).

    Returns
    -------
    tuple of int

    Raises
    ------
    GraphError
        Naming the first offending entry or pair.
    """
    g = _graph(graph)
    n = g.n_agents
    try:
        order = tuple(int(v) for v in cycle)
    except (TypeError, ValueError):
        raise GraphError(f"cycle: expected a sequence of agent ids, got {cycle!r}") from None
    if len(order) != n or sorted(order) != list(range(n)):
        raise GraphError(f"cycle: must be a permutation of 0..{n - 1} (each agent once), got "
                         f"{len(order)} entries {list(order)[:10]}{' ...' if len(order) > 10 else ''}")
    adj = _adjacency_sets(g)
    for k in range(n if n > 2 else n - 1):
        a, b = order[k], order[(k + 1) % n]
        if b not in adj[a]:
            raise GraphError(f"cycle: agents {a} and {b} (positions {k} and {(k + 1) % n}) are not "
                             "neighbours in the graph")
    return order


def _exact(adj_bits: list[int], n: int):
    """Cycle through agent 0 by a DP over subsets of ``1..n-1``, or None if there is none.

    ``reach[S]`` is the bitmask of the ends ``v in S`` of paths ``0 -> ... -> v`` that
    visit exactly ``S + {0}``; subsets are processed by size so each layer only reads
    the previous one.
    """
    m = n - 1
    size = 1 << m
    reach = np.zeros(size, dtype=np.int64)
    masks = np.arange(size, dtype=np.int64)
    popcount = np.zeros(size, dtype=np.int8)
    for b in range(m):
        popcount += ((masks >> b) & 1).astype(np.int8)
    # bit v-1 of the subset mask stands for agent v; bit v of an adjacency mask for agent v
    adj = np.array([adj_bits[v + 1] >> 1 for v in range(m)], dtype=np.int64)
    for v in range(m):
        if adj_bits[0] >> (v + 1) & 1:
            reach[1 << v] = 1 << v
    layers = [masks[popcount == c] for c in range(m + 1)]
    for c in range(2, m + 1):
        layer = layers[c]
        for v in range(m):
            sub = layer[(layer >> v) & 1 == 1]
            prev = reach[sub ^ (1 << v)]
            hit = (prev & adj[v]) != 0
            reach[sub[hit]] |= 1 << v
    full = size - 1
    ends = [v for v in range(m) if reach[full] >> v & 1 and adj_bits[0] >> (v + 1) & 1]
    if not ends:
        return None
    path, S, v = [], full, ends[0]
    while True:
        path.append(v + 1)
        S ^= 1 << v
        if S == 0:
            break
        v = next(u for u in range(m) if S >> u & 1 and reach[S] >> u & 1 and adj[v] >> u & 1)
    return [0] + path[::-1]


def _rotation_extension(adj: list[set[int]], n: int, rng: random.Random, budget: int):
    """Posa's rotation-extension search with restarts; None when ``budget`` steps are spent."""
    nbrs = [sorted(a) for a in adj]
    steps = 0
    while steps < budget:
        start = rng.randrange(n)
        path, pos = [start], {start: 0}
        stall = 0
        while steps < budget and stall < 10 * n:
            steps += 1
            end = path[-1]
            fresh = [w for w in nbrs[end] if w not in pos]
            if fresh:
                w = rng.choice(fresh)
                pos[w] = len(path)
                path.append(w)
                stall = 0
                continue
            if len(path) == n and path[0] in adj[end]:
                return path
            # rotate: join end to an earlier path vertex w, reverse the part after w
            choices = [w for w in nbrs[end] if pos[w] < len(path) - 2]
            if not choices:
                break
            j = pos[rng.choice(choices)]
            path[j + 1:] = path[j + 1:][::-1]
            for k in range(j + 1, len(path)):
                pos[path[k]] = k
            stall += 1
    return None


def hamiltonian_cycle(graph: Graph, method: str = "auto", seed: int = 0, budget: int | None = None,
                      exact_max_nodes: int = EXACT_MAX_NODES) -> tuple[int, ...]:
    """A Hamiltonian cycle of ``graph``, starting at agent 0.

    Parameters
    ----------
    graph : Graph
    method : {"auto", "exact", "heuristic"}
        "auto": exact for ``N <= exact_max_nodes``, else heuristic.
    seed : int
        Seed of the heuristic's random choices.
    budget : int, optional
        Heuristic steps (extensions plus rotations) before giving up; default ``200 N^2``.
    exact_max_nodes : int
        Largest ``N`` the exact search accepts.

    Returns
    -------
    tuple of int
        A permutation of ``0 .. N-1`` with ``cycle[0] == 0``, checked by :func:`validate_cycle`.

    Raises
    ------
    GraphError
        If the graph has none (exact search, or an agent of degree < 2), or the heuristic
        found none within ``budget`` (the graph may still have one).
    ConfigError
        For an unknown ``method``, or "exact" above ``exact_max_nodes``.
    """
    g = _graph(graph)
    n = g.n_agents
    if method not in ("auto", "exact", "heuristic"):
        raise ConfigError(f"method: unknown {method!r}; use 'auto', 'exact' or 'heuristic'")
    if n <= 2:
        return validate_cycle(g, range(n))
    adj = _adjacency_sets(g)
    low = [v for v in range(n) if len(adj[v]) < 2]
    if low:
        raise GraphError(f"graph: has no Hamiltonian cycle: agent {low[0]} has degree {len(adj[low[0]])} < 2")
    exact = method == "exact" or (method == "auto" and n <= exact_max_nodes)
    if exact:
        if n > exact_max_nodes:
            raise ConfigError(f"method: 'exact' takes at most exact_max_nodes={exact_max_nodes} agents, "
                              f"got N={n}; use 'heuristic'")
        bits = [sum(1 << w for w in a) for a in adj]
        cycle = _exact(bits, n)
        if cycle is None:
            raise GraphError(f"graph: has no Hamiltonian cycle (exact search over {n} agents)")
    else:
        steps = 200 * n * n if budget is None else int(budget)
        if steps < 1:
            raise ConfigError(f"budget: must be >= 1, got {budget!r}")
        cycle = _rotation_extension(adj, n, random.Random(f"hamiltonian:{int(seed)}"), steps)
        if cycle is None:
            raise GraphError(f"graph: no Hamiltonian cycle found within budget={steps} heuristic steps "
                             f"(N={n}); the graph may have none: raise budget, or use method='exact' "
                             f"for N <= {exact_max_nodes}")
        k = cycle.index(0)
        cycle = cycle[k:] + cycle[:k]
    return validate_cycle(g, cycle)
