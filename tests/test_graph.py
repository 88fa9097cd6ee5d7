"""Tests of ppdnmf_torch.graph: validation, generators, CSR tensors, I/O."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, GraphError
from ppdnmf_torch import graph as G
from ppdnmf_torch.graph import Graph


def _check_valid(g: Graph, n: int):
    """Connected, symmetric, loop-free, CSR tensors consistent."""
    assert g.n_agents == n
    a = g.to_dense()
    assert a.shape == (n, n)
    assert torch.equal(a, a.T)
    assert torch.all(a.diagonal() == 0)
    assert set(a.unique().tolist()) <= {0.0, 1.0}
    assert int(a.sum()) == 2 * g.n_edges
    assert all(i < j for i, j in g.edges)
    assert list(g.edges) == sorted(set(g.edges))
    assert all(d >= 0 for d in g.distances_from(0)), "graph is not connected"
    _check_csr(g.src, g.dst, g.rev, g.crow, n)
    assert torch.equal(g.degree, a.sum(1).long())


def _check_csr(src, dst, rev, crow, n):
    m = src.numel()
    assert src.dtype == dst.dtype == rev.dtype == crow.dtype == torch.long
    assert dst.shape == rev.shape == (m,)
    assert crow.shape == (n + 1,)
    key = src * n + dst
    if m:
        assert torch.all(key[1:] > key[:-1]), "directed edges not strictly sorted by (src, dst)"
    assert torch.equal(src[rev], dst)
    assert torch.equal(dst[rev], src)
    assert torch.equal(rev[rev], torch.arange(m))
    assert crow[0] == 0 and crow[-1] == m
    assert torch.equal(torch.repeat_interleave(torch.arange(n), crow[1:] - crow[:-1]), src)


GENERATORS = [
    ("random10", lambda: G.random_connected(10, 3.0, seed=0), 10),
    ("random50", lambda: G.random_connected(50, 4.0, seed=3), 50),
    ("random_dense", lambda: G.random_connected(12, 9.0, seed=1), 12),
    ("random_tree", lambda: G.random_connected(9, 16 / 9, seed=2), 9),
    ("ring8", lambda: G.ring(8), 8),
    ("ring2", lambda: G.ring(2), 2),
    ("ring1", lambda: G.ring(1), 1),
    ("star7", lambda: G.star(7), 7),
    ("complete6", lambda: G.complete(6), 6),
    ("grid3x4", lambda: G.grid_2d(3, 4), 12),
    ("grid1x5", lambda: G.grid_2d(1, 5), 5),
    ("er", lambda: G.erdos_renyi(15, 0.3, seed=4), 15),
    ("geo", lambda: G.random_geometric(20, 0.4, seed=5), 20),
]


@pytest.mark.parametrize("make,n", [(m, n) for _, m, n in GENERATORS], ids=[i for i, _, _ in GENERATORS])
def test_generators_valid(make, n):
    _check_valid(make(), n)


@pytest.mark.parametrize("n,d", [(10, 3.0), (10, 2.0), (25, 3.0), (7, 3.0), (40, 5.5), (5, 4.0)])
@pytest.mark.parametrize("seed", [0, 1, 17])
def test_random_connected_edge_count(n, d, seed):
    g = G.random_connected(n, d, seed=seed)
    _check_valid(g, n)
    assert g.n_edges == round(n * d / 2)


def test_paper_graph_has_15_edges():
    assert G.random_connected(10, 3.0, seed=0).n_edges == 15


@pytest.mark.parametrize(
    "make",
    [
        lambda s: G.random_connected(10, 3.0, seed=s),
        lambda s: G.erdos_renyi(12, 0.35, seed=s),
        lambda s: G.random_geometric(12, 0.5, seed=s),
    ],
    ids=["random", "erdos_renyi", "random_geometric"],
)
def test_random_generators_deterministic(make):
    assert make(5).edges == make(5).edges
    distinct = {make(s).edges for s in range(8)}
    assert len(distinct) >= 6


def test_random_connected_uses_all_trees():
    # Uniform spanning trees: over many seeds with E = N-1, many distinct trees and
    # every node shows up as a leaf sometimes (no fixed-centre bias).
    trees = [G.random_connected(6, 10 / 6, seed=s) for s in range(200)]
    assert all(t.n_edges == 5 for t in trees)
    assert len({t.edges for t in trees}) > 100
    leaf_counts = torch.zeros(6)
    for t in trees:
        leaf_counts += (t.degree == 1).double()
    assert torch.all(leaf_counts > 20)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: G.random_connected(10, 1.0), "at least 9"),
        (lambda: G.random_connected(5, 5.0), "complete graph"),
        (lambda: G.random_connected(0), ">= 1"),
        (lambda: G.ring(0), ">= 1"),
        (lambda: G.grid_2d(0, 3), "rows"),
        (lambda: G.erdos_renyi(10, 1.5), r"\[0, 1\]"),
        (lambda: G.erdos_renyi(30, 0.01, max_tries=5), "no connected graph"),
        (lambda: G.random_geometric(30, 0.01, max_tries=5), "no connected graph"),
        (lambda: G.random_geometric(5, 0.0), "radius"),
    ],
)
def test_generator_errors(call, match):
    with pytest.raises(ConfigError, match=match):
        call()


def test_single_agent():
    for g in (G.random_connected(1), G.ring(1), G.complete(1), G.make_graph("grid", 1), Graph(1, ())):
        assert g.n_agents == 1 and g.n_edges == 0
        assert g.diameter == 0
        assert g.crow.tolist() == [0, 0]
        assert g.adjacency().to_dense().tolist() == [[0.0]]


def test_diameters():
    assert G.ring(8).diameter == 4
    assert G.ring(9).diameter == 4
    assert G.complete(6).diameter == 1
    assert G.star(6).diameter == 2
    assert G.grid_2d(3, 4).diameter == 5
    path = np.zeros((6, 6))
    for i in range(5):
        path[i, i + 1] = path[i + 1, i] = 1
    g = G.from_adjacency(path)
    assert g.diameter == 5
    assert g.distances_from(2) == [2, 1, 0, 1, 2, 3]
    assert g.neighbors(2) == [1, 3]
    assert g.neighbors(0) == [1]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("g", [G.random_connected(10, 3.0, seed=2), G.grid_2d(2, 3), G.star(5)], ids=["random", "grid", "star"])
def test_adjacency_matches_dense(g, dtype):
    a = g.adjacency(dtype=dtype)
    assert a.layout == torch.sparse_csr
    assert a.dtype == dtype
    assert torch.equal(a.to_dense(), g.to_dense(dtype=dtype))
    # Custom values land at (src[e], dst[e]).
    vals = torch.arange(g.src.numel(), dtype=torch.float64) + 1
    w = g.adjacency(values=vals).to_dense()
    assert torch.equal(w[g.src, g.dst], vals)
    assert int((w != 0).sum()) == g.src.numel()
    # Sparse mat-vec agrees with the dense one.
    x = torch.randn(g.n_agents, 2, dtype=dtype)
    torch.testing.assert_close(a @ x, g.to_dense(dtype) @ x)


def test_adjacency_values_wrong_shape():
    g = G.ring(4)
    with pytest.raises(GraphError, match=r"values: expected shape \(8,\)"):
        g.adjacency(values=torch.ones(4))


def _ring_matrix(n=6):
    a = np.zeros((n, n))
    for i in range(n):
        a[i, (i + 1) % n] = a[(i + 1) % n, i] = 1
    return a


@pytest.mark.parametrize(
    "convert",
    [
        lambda a: a,
        lambda a: a.astype(np.int64),
        lambda a: a.astype(bool),
        lambda a: a.tolist(),
        lambda a: torch.from_numpy(a),
        lambda a: torch.from_numpy(a).to_sparse(),
        lambda a: torch.from_numpy(a).to_sparse_csr(),
    ],
    ids=["numpy", "numpy_int", "numpy_bool", "list", "torch_dense", "torch_coo", "torch_csr"],
)
def test_from_adjacency_round_trip(convert):
    g0 = G.random_connected(9, 3.0, seed=7)
    g = G.from_adjacency(convert(g0.to_dense().numpy()))
    assert g.edges == g0.edges
    assert torch.equal(g.src, g0.src) and torch.equal(g.rev, g0.rev) and torch.equal(g.crow, g0.crow)
    assert G.from_adjacency(g0.to_dense(), n_agents=9).edges == g0.edges


def test_from_adjacency_networkx():
    nx = pytest.importorskip("networkx")
    ng = nx.Graph()
    # Non-integer, unsorted labels are mapped by sorted order.
    ng.add_edges_from([("c", "a"), ("a", "b"), ("b", "d"), ("d", "c")])
    g = G.from_adjacency(ng)
    assert g.n_agents == 4
    assert g.edges == ((0, 1), (0, 2), (1, 3), (2, 3))
    g0 = G.random_connected(11, 3.0, seed=1)
    ng2 = nx.Graph(list(g0.edges))
    assert G.from_adjacency(ng2).edges == g0.edges
    with pytest.raises(GraphError, match="disconnected"):
        G.from_adjacency(nx.Graph([(0, 1), (2, 3)]))
    with pytest.raises(GraphError, match="self loop"):
        G.from_adjacency(nx.Graph([(0, 1), (1, 1)]))
    with pytest.raises(GraphError, match="weighted"):
        wg = nx.Graph()
        wg.add_edge(0, 1, weight=2.5)
        G.from_adjacency(wg)
    with pytest.raises(GraphError, match="symmetric"):
        G.from_adjacency(nx.DiGraph([(0, 1), (1, 2), (2, 1), (1, 0), (0, 2)]))


def _asym():
    a = _ring_matrix()
    a[0, 3] = 1
    return a


def _loop():
    a = _ring_matrix()
    a[4, 4] = 1
    return a


def _disconnected():
    a = np.zeros((7, 7))
    for i, j in [(0, 1), (1, 2), (2, 3), (3, 4), (5, 6)]:
        a[i, j] = a[j, i] = 1
    return a


def _weighted():
    a = _ring_matrix()
    a[1, 2] = a[2, 1] = 0.5
    return a


def _nan():
    a = _ring_matrix()
    a[1, 2] = np.nan
    return a


@pytest.mark.parametrize(
    "adj,kw,match",
    [
        (_asym(), {}, r"not symmetric: entry \(0, 3\) is 1 but \(3, 0\) is 0"),
        (torch.from_numpy(_asym()).to_sparse(), {}, "symmetric"),
        (_loop(), {}, "self loop at node 4"),
        (_disconnected(), {}, r"disconnected: 2 connected components.*\[5, 6\]"),
        (np.zeros((3, 4)), {}, "square"),
        (np.zeros((2, 2, 2)), {}, "square"),
        (np.zeros(5), {}, "square"),
        (_ring_matrix(7), {"n_agents": 8}, "adjacency has 7 nodes but there are 8 agents"),
        (_weighted(), {}, "weighted"),
        (_nan(), {}, "NaN"),
        (np.zeros((0, 0)), {}, "at least 1 agent"),
        (np.zeros((2, 2)), {}, "disconnected"),
        ([[0, 1], [1]], {}, "square"),
    ],
    ids=["asym", "asym_sparse", "loop", "disconnected", "rect", "3d", "1d", "n_agents", "weighted", "nan", "empty", "no_edges", "ragged"],
)
def test_from_adjacency_errors(adj, kw, match):
    with pytest.raises(GraphError, match=match):
        G.from_adjacency(adj, **kw)


def test_graph_direct_construction_validates():
    g = Graph(4, [(1, 0), (2, 1), (1, 2), (3, 2)])
    assert g.edges == ((0, 1), (1, 2), (2, 3))
    with pytest.raises(GraphError, match="self loop"):
        Graph(3, [(0, 1), (1, 1), (1, 2)])
    with pytest.raises(GraphError, match="outside"):
        Graph(3, [(0, 1), (1, 3)])
    with pytest.raises(GraphError, match="disconnected"):
        Graph(4, [(0, 1)])
    with pytest.raises(GraphError, match="integer"):
        Graph(3, [(0, 1.5), (1, 2)])
    with pytest.raises(dataclasses_frozen_error()):
        g.n_agents = 5


def dataclasses_frozen_error():
    import dataclasses

    return dataclasses.FrozenInstanceError


@pytest.mark.parametrize("g", [G.random_connected(10, 3.0, seed=4), G.ring(1), G.star(4)], ids=["random", "single", "star"])
def test_edge_list_file_round_trip(g, tmp_path):
    p = tmp_path / "g.txt"
    g.to_edge_list_file(p)
    g2 = G.from_edge_list(p)
    assert g2.n_agents == g.n_agents and g2.edges == g.edges
    assert G.from_edge_list(str(p), n_agents=g.n_agents).edges == g.edges


def test_edge_list_parsing(tmp_path):
    p = tmp_path / "g.csv"
    p.write_text("# a comment\n\n0,1\n1 2   # trailing comment\n2\t3\n1,0\n3 2\n")
    g = G.from_edge_list(p)
    assert g.n_agents == 4 and g.edges == ((0, 1), (1, 2), (2, 3))
    g5 = G.from_edge_list(["0 1", "1 2", "2 3", "3 4"], n_agents=5)
    assert g5.n_agents == 5


@pytest.mark.parametrize(
    "text,kw,match",
    [
        ("0 1\n1 2\n2 x\n", {}, r"line 3: node ids must be integers"),
        ("0 1\n\n1 2 3\n", {}, r"line 3: expected two node ids"),
        ("0 1\n1 1\n", {}, r"line 2: self loop at node 1"),
        ("0 1\n-1 2\n", {}, r"line 2: node ids must be >= 0"),
        ("0 1\n1 5\n", {"n_agents": 4}, r"line 2: node id 5 is outside"),
        ("0 1\n2 3\n", {}, "disconnected"),
        ("0 1\n1 2\n", {"n_agents": 4}, "disconnected"),
        ("# n_agents: 3\n0 1\n1 2\n", {"n_agents": 4}, "agents"),
        ("# only comments\n", {}, "no edges"),
    ],
)
def test_edge_list_errors(tmp_path, text, kw, match):
    p = tmp_path / "bad.txt"
    p.write_text(text)
    with pytest.raises(GraphError, match=match) as info:
        G.from_edge_list(p, **kw)
    if "line" in match:
        assert "bad.txt" in str(info.value)


def test_edge_list_missing_file(tmp_path):
    p = tmp_path / "nope" / "graph.txt"
    with pytest.raises(GraphError, match="not found") as info:
        G.from_edge_list(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize(
    "kind,n,params,expected_edges",
    [
        ("random", 10, {}, 15),
        ("random", 10, {"avg_degree": 4}, 20),
        ("random_connected", 10, {"avg_degree": 2}, 10),
        ("ring", 7, {}, 7),
        ("star", 7, {}, 6),
        ("complete", 5, {}, 10),
        ("grid", 12, {}, 17),
        ("grid", 12, {"rows": 2}, 16),
        ("grid", 12, {"rows": 2, "cols": 6}, 16),
        ("grid", 7, {}, 6),
        ("erdos_renyi", 10, {"p": 1.0}, 45),
        ("random_geometric", 8, {"radius": 2.0}, 28),
        ("ring", 7, {"avg_degree": None}, 7),
    ],
)
def test_make_graph(kind, n, params, expected_edges):
    g = G.make_graph(kind, n, seed=3, **params)
    _check_valid(g, n)
    assert g.n_edges == expected_edges


def test_make_graph_random_matches_generator():
    assert G.make_graph("random", 10, seed=9).edges == G.random_connected(10, 3.0, seed=9).edges


def test_make_graph_file(tmp_path):
    g = G.random_connected(8, 3.0, seed=2)
    p = tmp_path / "g.txt"
    g.to_edge_list_file(p)
    assert G.make_graph("file", 8, path=str(p)).edges == g.edges
    with pytest.raises(GraphError, match="agents"):
        G.make_graph("file", 9, path=str(p))


@pytest.mark.parametrize(
    "kind,n,params,match",
    [
        ("hypercube", 8, {}, "known kinds: random, ring, star, complete, grid, erdos_renyi, random_geometric, file"),
        ("ring", 8, {"avg_degree": 3}, "unknown parameter"),
        ("grid", 12, {"rows": 5}, "rows"),
        ("erdos_renyi", 8, {}, "needs p"),
        ("random_geometric", 8, {}, "needs radius"),
        ("file", 8, {}, "needs path"),
        ("random", 10, {"avg_degree": 20}, "complete graph"),
    ],
)
def test_make_graph_errors(kind, n, params, match):
    with pytest.raises(ConfigError, match=match):
        G.make_graph(kind, n, **params)


def test_graph_parameter_table_is_the_config_table():
    from ppdnmf_torch.models.ppdnmf import config

    assert config.GRAPH_PARAMS is G.GRAPH_PARAMS
    assert config.GRAPH_REQUIRED is G.GRAPH_REQUIRED and config.GRAPH_ALIASES is G.GRAPH_ALIASES
    assert tuple(G.GRAPH_PARAMS) == G.GRAPH_KINDS


@pytest.mark.parametrize("kind", G.GRAPH_KINDS)
def test_make_graph_follows_the_parameter_table(kind):
    """A parameter outside the kind's row of the table is rejected, and each required one is asked for."""
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) \['not_a_param'\]"):
        G.make_graph(kind, 6, not_a_param=1)
    for key in G.GRAPH_REQUIRED.get(kind, ()):
        assert key in G.GRAPH_PARAMS[kind]
        with pytest.raises(ConfigError, match=f"needs {key}="):
            G.make_graph(kind, 6)


@pytest.mark.parametrize("alias", sorted(G.GRAPH_ALIASES))
def test_make_graph_aliases(alias):
    assert G.make_graph(alias, 6, seed=2).edges == G.make_graph(G.GRAPH_ALIASES[alias], 6, seed=2).edges


def test_block_diagonal():
    graphs = [G.random_connected(10, 3.0, seed=s) for s in range(3)] + [G.ring(10), G.complete(10)]
    src, dst, rev, crow = G.block_diagonal(graphs)
    n, t = 10, len(graphs)
    _check_csr(src, dst, rev, crow, n * t)
    off = 0
    for k, g in enumerate(graphs):
        m = g.src.numel()
        assert torch.equal(src[off:off + m], g.src + k * n)
        assert torch.equal(dst[off:off + m], g.dst + k * n)
        assert torch.equal(rev[off:off + m], g.rev + off)
        assert torch.equal(crow[k * n:(k + 1) * n + 1], g.crow + off)
        off += m
    # The block-diagonal sparse matrix has each trial's adjacency on its diagonal block.
    big = torch.sparse_csr_tensor(crow, dst, torch.ones(src.numel(), dtype=torch.float64), size=(n * t, n * t), check_invariants=True).to_dense()
    for k, g in enumerate(graphs):
        assert torch.equal(big[k * n:(k + 1) * n, k * n:(k + 1) * n], g.to_dense())
    assert int(big.sum()) == sum(2 * g.n_edges for g in graphs)


def test_block_diagonal_errors():
    with pytest.raises(GraphError, match="at least one"):
        G.block_diagonal([])
    with pytest.raises(GraphError, match="agents"):
        G.block_diagonal([G.ring(5), G.ring(6)])


def test_validate_graph_canonical():
    assert G.validate_graph(3, [(2, 1), (0, 1), (1, 2)]) == ((0, 1), (1, 2))
    with pytest.raises(GraphError, match=r"myname: graph is disconnected: 3 connected"):
        G.validate_graph(3, [], name="myname")
