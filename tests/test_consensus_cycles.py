"""Hamiltonian cycles and the random networks of Sec. V (ppdnmf_torch.consensus)."""
from __future__ import annotations

import itertools
import random

import pytest

from ppdnmf_torch.errors import ConfigError, GraphError
from ppdnmf_torch.consensus import (hamiltonian_cycle, n_edges_for_ratio, random_hamiltonian_graph,
                                    validate_cycle)
from ppdnmf_torch.graph import Graph, complete, grid_2d, ring, star


def _brute_force_has_cycle(g: Graph) -> bool:
    adj = {frozenset(e) for e in g.edges}
    n = g.n_agents
    for perm in itertools.permutations(range(1, n)):
        order = (0,) + perm
        if all(frozenset((order[k], order[(k + 1) % n])) in adj for k in range(n)):
            return True
    return False


def _random_graph(n, m, seed):
    rng = random.Random(seed)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    while True:
        try:
            return Graph(n, rng.sample(pairs, m))
        except GraphError:
            continue


def _is_cycle(g, c):
    adj = {frozenset(e) for e in g.edges}
    n = g.n_agents
    return sorted(c) == list(range(n)) and all(frozenset((c[k], c[(k + 1) % n])) in adj for k in range(n))


K23 = Graph(5, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)])
PETERSEN = Graph(10, [(i, (i + 1) % 5) for i in range(5)] + [(i, i + 5) for i in range(5)]
                 + [(5 + i, 5 + (i + 2) % 5) for i in range(5)])


@pytest.mark.parametrize("method", ["exact", "heuristic"])
@pytest.mark.parametrize("n", [3, 4, 7, 12])
def test_ring_and_complete_have_a_cycle(method, n):
    for g in (ring(n), complete(n)):
        c = hamiltonian_cycle(g, method=method)
        assert c[0] == 0 and _is_cycle(g, c)


@pytest.mark.parametrize("g, why", [(star(5), "degree 1"), (K23, "exact search"), (PETERSEN, "exact search"),
                                    (grid_2d(3, 5), "exact search")])
def test_graphs_without_a_cycle_raise(g, why):
    with pytest.raises(GraphError, match=why):
        hamiltonian_cycle(g)


def test_heuristic_gives_up_within_budget_with_a_clear_error():
    # grid 3 x 7: 21 agents, bipartite with parts 11 and 10, so no Hamiltonian cycle exists
    with pytest.raises(GraphError, match="budget=500"):
        hamiltonian_cycle(grid_2d(3, 7), budget=500)
    with pytest.raises(ConfigError, match="exact_max_nodes"):
        hamiltonian_cycle(grid_2d(3, 7), method="exact")
    with pytest.raises(ConfigError, match="method"):
        hamiltonian_cycle(ring(4), method="dp")


@pytest.mark.parametrize("seed", range(12))
def test_exact_search_agrees_with_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(4, 7)
    g = _random_graph(n, rng.randint(n, n * (n - 1) // 2), seed)
    has = _brute_force_has_cycle(g)
    if has:
        assert _is_cycle(g, hamiltonian_cycle(g, method="exact"))
    else:
        with pytest.raises(GraphError):
            hamiltonian_cycle(g, method="exact")


@pytest.mark.parametrize("seed", range(4))
def test_heuristic_on_dense_random_graphs(seed):
    g = _random_graph(60, int(0.3 * 60 * 59 / 2), seed)
    assert _is_cycle(g, hamiltonian_cycle(g, seed=seed))


def test_exact_search_at_its_size_limit():
    assert _is_cycle(grid_2d(4, 5), hamiltonian_cycle(grid_2d(4, 5)))


def test_validate_cycle_names_the_problem():
    g = ring(5)
    assert validate_cycle(g, [0, 1, 2, 3, 4]) == (0, 1, 2, 3, 4)
    assert validate_cycle(g, [2, 1, 0, 4, 3]) == (2, 1, 0, 4, 3)
    with pytest.raises(GraphError, match="permutation"):
        validate_cycle(g, [0, 1, 2, 3, 3])
    with pytest.raises(GraphError, match="permutation"):
        validate_cycle(g, [0, 1, 2, 3])
    with pytest.raises(GraphError, match="agents 1 and 3"):
        validate_cycle(g, [0, 1, 3, 2, 4])
    with pytest.raises(GraphError, match="Graph"):
        validate_cycle([(0, 1)], [0, 1])
    # N <= 2: the token goes back and forth
    assert validate_cycle(Graph(2, [(0, 1)]), [1, 0]) == (1, 0)
    assert hamiltonian_cycle(Graph(1, ())) == (0,)


@pytest.mark.parametrize("n, eta", [(10, 0.3), (20, 0.5), (50, 0.3), (100, 0.3)])
def test_random_hamiltonian_graph(n, eta):
    g, c = random_hamiltonian_graph(n, eta, seed=3)
    assert g.n_agents == n and g.n_edges == round(eta * n * (n - 1) / 2) == n_edges_for_ratio(n, eta)
    assert _is_cycle(g, c)
    g2, c2 = random_hamiltonian_graph(n, eta, seed=3)
    assert g2.edges == g.edges and c2 == c


def test_random_hamiltonian_graph_errors():
    with pytest.raises(ConfigError, match="eta"):
        random_hamiltonian_graph(10, 0.0)
    with pytest.raises(ConfigError, match="eta"):
        random_hamiltonian_graph(10, 1.5)
    with pytest.raises(ConfigError, match="fewer than"):
        random_hamiltonian_graph(30, 0.05)
    with pytest.raises(ConfigError, match="n_agents"):
        random_hamiltonian_graph(2, 0.5)
    with pytest.raises(ConfigError, match="max_tries"):
        random_hamiltonian_graph(10, 0.5, max_tries=0)
    # exactly N edges: only the cycle graph itself would do, practically never drawn
    with pytest.raises(GraphError, match="3 draws"):
        random_hamiltonian_graph(30, 2 / 29, max_tries=3)
