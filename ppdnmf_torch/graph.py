"""Communication graphs of the agents: validation, generators and CSR edge tensors.

A :class:`Graph` is an undirected, connected, loop-free, unweighted graph on the
agents ``0 .. N-1``. Besides the undirected edge list it carries the directed
edge tensors the batched solvers index with: every undirected edge ``{i, j}``
appears twice, as ``i -> j`` and ``j -> i``, sorted by ``(src, dst)`` so the
directed edges of agent ``i`` are the contiguous slice ``crow[i]:crow[i + 1]``
(CSR order), and ``rev`` maps each directed edge to its reverse.

Only torch and the standard library are used here; numpy arrays and networkx
graphs are accepted by duck typing, without importing either package.
"""
from __future__ import annotations

import heapq
import math
import operator
import os
import random
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable, Sequence

import torch

from ._utils import ConfigError, GraphError, derive_seed, sparse_csr

__all__ = [
    "Graph",
    "validate_graph",
    "from_adjacency",
    "from_edge_list",
    "random_connected",
    "ring",
    "star",
    "complete",
    "grid_2d",
    "erdos_renyi",
    "random_geometric",
    "make_graph",
    "block_diagonal",
    "GRAPH_KINDS",
]

# Components listed in a "disconnected" message are cut at this many nodes so a
# huge graph does not produce a huge message.
_MAX_LISTED_NODES = 10


# ----------------------------------------------------------------------------
# Validation shared by every constructor
# ----------------------------------------------------------------------------


def _as_int(value, what: str, error=GraphError) -> int:
    # operator.index rejects floats such as 1.5 instead of truncating them, and
    # accepts numpy / torch integer scalars.
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{what}: expected an integer, got {value!r} ({type(value).__name__})") from None


def _components(n: int, adj: Sequence[Sequence[int]]) -> list[list[int]]:
    seen = [False] * n
    comps = []
    for start in range(n):
        if seen[start]:
            continue
        seen[start] = True
        comp = [start]
        queue = deque([start])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if not seen[v]:
                    seen[v] = True
                    comp.append(v)
                    queue.append(v)
        comps.append(sorted(comp))
    return comps


def _format_nodes(nodes: list[int]) -> str:
    if len(nodes) <= _MAX_LISTED_NODES:
        return str(nodes)
    head = ", ".join(str(v) for v in nodes[:_MAX_LISTED_NODES])
    return f"[{head}, ... ({len(nodes)} nodes)]"


def validate_graph(n_agents, edges: Iterable, name: str = "edges") -> tuple[tuple[int, int], ...]:
    """Check an undirected edge list and return it in canonical form.

    Parameters
    ----------
    n_agents : int
        Number of nodes ``N >= 1``; node ids are ``0 .. N-1``.
    edges : iterable of (int, int)
        Undirected edges in any order and orientation. An edge listed twice
        (in either orientation) is kept once.
    name : str, default "edges"
        Name of the input, used as the prefix of error messages.

    Returns
    -------
    tuple of (int, int)
        The ``E`` distinct edges as ``(i, j)`` with ``i < j``, sorted.

    Raises
    ------
    GraphError
        If ``N < 1``, an edge is not a pair of integers, a node id is out of
        range, an edge is a self loop, or the graph is disconnected.
    """
    n = _as_int(n_agents, f"{name}: n_agents")
    if n < 1:
        raise GraphError(f"{name}: a graph needs at least 1 agent, got n_agents={n}")
    canon = set()
    for k, e in enumerate(edges):
        try:
            a, b = e
        except (TypeError, ValueError):
            raise GraphError(f"{name}: edge #{k} is {e!r}, expected a pair (i, j)") from None
        i = _as_int(a, f"{name}: edge #{k} {e!r}")
        j = _as_int(b, f"{name}: edge #{k} {e!r}")
        for v in (i, j):
            if not 0 <= v < n:
                raise GraphError(
                    f"{name}: edge ({i}, {j}) has node id {v} outside 0..{n - 1} "
                    f"(there are {n} agents)"
                )
        if i == j:
            raise GraphError(f"{name}: self loop at node {i}; graphs must not have self loops")
        canon.add((i, j) if i < j else (j, i))
    out = tuple(sorted(canon))
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in out:
        adj[i].append(j)
        adj[j].append(i)
    comps = _components(n, adj)
    if len(comps) > 1:
        small = min(comps, key=len)
        raise GraphError(
            f"{name}: graph is disconnected: {len(comps)} connected components among {n} agents; "
            f"e.g. nodes {_format_nodes(small)} are not connected to the rest; "
            "the agents must form one connected graph"
        )
    return out


# ----------------------------------------------------------------------------
# Graph
# ----------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Graph:
    """An undirected, connected, loop-free, unweighted graph on agents ``0 .. N-1``.

    Parameters
    ----------
    n_agents : int
        Number of agents ``N >= 1``. ``N = 1`` with no edges is the centralized case.
    edges : iterable of (int, int)
        Undirected edges; normalized to distinct ``(i, j)`` with ``i < j``, sorted.

    Attributes
    ----------
    src, dst : torch.LongTensor, shape (2E,)
        Directed edges ``src[e] -> dst[e]``, both orientations of every edge,
        sorted lexicographically by ``(src, dst)`` (CSR order).
    rev : torch.LongTensor, shape (2E,)
        ``rev[e]`` is the index of the directed edge ``dst[e] -> src[e]``.
    degree : torch.LongTensor, shape (N,)
        Number of neighbours of each agent.
    crow : torch.LongTensor, shape (N + 1,)
        CSR row pointers: the out-edges of agent ``i`` are ``crow[i]:crow[i+1]``.

    Raises
    ------
    GraphError
        If the edges do not describe a valid connected graph (see :func:`validate_graph`).
    """

    n_agents: int
    edges: tuple[tuple[int, int], ...] = ()
    src: torch.Tensor = field(init=False, repr=False)
    dst: torch.Tensor = field(init=False, repr=False)
    rev: torch.Tensor = field(init=False, repr=False)
    degree: torch.Tensor = field(init=False, repr=False)
    crow: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        n = _as_int(self.n_agents, "n_agents")
        edges = validate_graph(n, self.edges, name="edges")
        # The dataclass is frozen so a Graph can be shared between trials and
        # used as a cache key; the derived tensors are set once, here.
        object.__setattr__(self, "n_agents", n)
        object.__setattr__(self, "edges", edges)
        src, dst, rev, crow = _directed_tensors(n, edges)
        object.__setattr__(self, "src", src)
        object.__setattr__(self, "dst", dst)
        object.__setattr__(self, "rev", rev)
        object.__setattr__(self, "crow", crow)
        object.__setattr__(self, "degree", crow[1:] - crow[:-1])

    # -- basic queries -------------------------------------------------------

    @property
    def n_edges(self) -> int:
        """Number of undirected edges ``E``."""
        return len(self.edges)

    @cached_property
    def _neighbors(self) -> tuple[tuple[int, ...], ...]:
        dst = self.dst.tolist()
        crow = self.crow.tolist()
        return tuple(tuple(dst[crow[i]:crow[i + 1]]) for i in range(self.n_agents))

    def _check_node(self, i) -> int:
        i = _as_int(i, "node")
        if not 0 <= i < self.n_agents:
            raise GraphError(f"node: {i} is outside 0..{self.n_agents - 1}")
        return i

    def neighbors(self, i) -> list[int]:
        """Sorted neighbours of agent ``i``.

        Parameters
        ----------
        i : int
            Agent id in ``0 .. N-1``.

        Returns
        -------
        list of int
            The ``degree[i]`` neighbours, ascending.

        Raises
        ------
        GraphError
            If ``i`` is not a node of the graph.
        """
        return list(self._neighbors[self._check_node(i)])

    def distances_from(self, i) -> list[int]:
        """Hop counts from agent ``i`` to every agent (breadth-first search).

        Parameters
        ----------
        i : int
            Source agent id.

        Returns
        -------
        list of int, length N
            ``d[j]`` is the number of edges on a shortest path from ``i`` to ``j``.

        Raises
        ------
        GraphError
            If ``i`` is not a node of the graph.
        """
        i = self._check_node(i)
        dist = [-1] * self.n_agents
        dist[i] = 0
        queue = deque([i])
        nbrs = self._neighbors
        while queue:
            u = queue.popleft()
            for v in nbrs[u]:
                if dist[v] < 0:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        return dist

    @cached_property
    def diameter(self) -> int:
        """Largest hop count between two agents (0 for a single agent)."""
        return max(max(self.distances_from(i)) for i in range(self.n_agents))

    # -- matrix views --------------------------------------------------------

    def adjacency(self, device=None, dtype=torch.float64, values=None) -> torch.Tensor:
        """Sparse CSR adjacency (or edge-weighted) matrix.

        Parameters
        ----------
        device : torch.device or str, optional
            Device of the result; CPU when omitted.
        dtype : torch.dtype, default torch.float64
            Value dtype; ``values``, when given, is cast to it.
        values : torch.Tensor, shape (2E,), optional
            Value of each directed edge in ``src``/``dst`` order; ones by default.
            Entry ``(src[e], dst[e])`` of the result is ``values[e]``.

        Returns
        -------
        torch.Tensor, sparse CSR, shape (N, N)

        Raises
        ------
        GraphError
            If ``values`` does not have shape ``(2E,)``.
        """
        n_dir = self.src.numel()
        if values is None:
            vals = torch.ones(n_dir, dtype=dtype, device=device)
        else:
            vals = torch.as_tensor(values)
            if tuple(vals.shape) != (n_dir,):
                raise GraphError(
                    f"values: expected shape ({n_dir},) (one value per directed edge), "
                    f"got {tuple(vals.shape)}"
                )
            vals = vals.to(device=device if device is not None else vals.device, dtype=dtype)
        dev = vals.device
        return sparse_csr(self.crow.to(dev), self.dst.to(dev), vals, self.n_agents)

    def to_dense(self, dtype=torch.float64) -> torch.Tensor:
        """Dense 0/1 adjacency matrix.

        Parameters
        ----------
        dtype : torch.dtype, default torch.float64

        Returns
        -------
        torch.Tensor, shape (N, N)
            Symmetric, zero diagonal.
        """
        a = torch.zeros(self.n_agents, self.n_agents, dtype=dtype)
        a[self.src, self.dst] = 1
        return a

    def to_edge_list_file(self, path) -> None:
        """Write the graph as a text edge list readable by :func:`from_edge_list`.

        The first line is a ``# n_agents: N`` comment so a single-agent graph
        (which has no edges) round-trips; then one ``i j`` line per undirected edge.

        Parameters
        ----------
        path : str or os.PathLike
            Output file; overwritten.
        """
        lines = [f"# n_agents: {self.n_agents}", f"# {self.n_edges} undirected edges, 0-based ids"]
        lines += [f"{i} {j}" for i, j in self.edges]
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")

    def __repr__(self) -> str:
        return f"Graph(n_agents={self.n_agents}, n_edges={self.n_edges})"


def _directed_tensors(n: int, edges: tuple[tuple[int, int], ...]):
    if edges:
        und = torch.tensor(edges, dtype=torch.long)
    else:
        und = torch.zeros(0, 2, dtype=torch.long)
    src = torch.cat([und[:, 0], und[:, 1]])
    dst = torch.cat([und[:, 1], und[:, 0]])
    # A single integer key per directed edge makes both the CSR sort and the
    # reverse-edge lookup one vectorized operation.
    key = src * n + dst
    key, order = torch.sort(key)
    src, dst = src[order], dst[order]
    rev = torch.searchsorted(key, dst * n + src)
    crow = torch.zeros(n + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(src, minlength=n), 0)
    return src.contiguous(), dst.contiguous(), rev, crow


# ----------------------------------------------------------------------------
# Constructors from matrices and files
# ----------------------------------------------------------------------------


def _is_networkx_like(obj) -> bool:
    return hasattr(obj, "nodes") and hasattr(obj, "edges") and not isinstance(obj, torch.Tensor)


def _entries_from_networkx(g):
    nodes = sorted(g.nodes)
    index = {v: k for k, v in enumerate(nodes)}
    n = len(nodes)
    directed = bool(g.is_directed()) if callable(getattr(g, "is_directed", None)) else False
    try:
        triples = [(u, v, d) for u, v, d in g.edges(data=True)]
    except TypeError:
        triples = [(u, v, {}) for u, v in g.edges]
    entries = {}
    for u, v, data in triples:
        w = data.get("weight", 1) if isinstance(data, dict) else 1
        i, j = index[u], index[v]
        entries[(i, j)] = w
        if not directed:
            entries[(j, i)] = w
    rows = [k[0] for k in entries]
    cols = [k[1] for k in entries]
    vals = [float(w) for w in entries.values()]
    return n, rows, cols, vals, nodes


def from_adjacency(adjacency, n_agents=None) -> Graph:
    """Build a :class:`Graph` from an adjacency matrix or a networkx graph.

    Parameters
    ----------
    adjacency : array-like (N, N), torch.Tensor (dense, sparse COO or CSR) or networkx graph
        0/1 symmetric matrix with zero diagonal. A networkx-like object (anything
        with ``.nodes`` and ``.edges``) is read with its nodes in ``sorted`` order
        mapped to ``0 .. N-1``; an edge ``weight`` other than 1 is rejected.
    n_agents : int, optional
        Expected number of agents; checked against ``N``.

    Returns
    -------
    Graph

    Raises
    ------
    GraphError
        If the matrix is not 2-D or not square, has NaN or entries other than
        0/1, is not symmetric, has a self loop, describes a disconnected graph,
        has ``N < 1`` nodes, or ``N != n_agents``.
    """
    name = "adjacency"
    labels = None
    if _is_networkx_like(adjacency):
        n, rows, cols, vals, labels = _entries_from_networkx(adjacency)
        rows = torch.tensor(rows, dtype=torch.long)
        cols = torch.tensor(cols, dtype=torch.long)
        vals = torch.tensor(vals, dtype=torch.float64)
    else:
        if isinstance(adjacency, torch.Tensor) and adjacency.layout != torch.strided:
            a = adjacency.detach().cpu()
            if a.layout != torch.sparse_coo:
                try:
                    a = a.to_sparse_coo()
                except RuntimeError as exc:
                    raise GraphError(f"{name}: unsupported sparse layout {a.layout}: {exc}") from None
            if a.dim() != 2 or a.shape[0] != a.shape[1]:
                raise GraphError(
                    f"{name}: must be a square (N, N) matrix, got shape {tuple(a.shape)}"
                )
            a = a.coalesce()
            rows, cols = a.indices()[0], a.indices()[1]
            vals = a.values().to(torch.float64)
            n = a.shape[0]
        else:
            try:
                a = torch.as_tensor(adjacency).detach().cpu()
            except (TypeError, ValueError, RuntimeError) as exc:
                raise GraphError(
                    f"{name}: cannot read as a square (N, N) matrix ({exc})"
                ) from None
            if a.dim() != 2 or a.shape[0] != a.shape[1]:
                raise GraphError(
                    f"{name}: must be a square (N, N) matrix, got shape {tuple(a.shape)}"
                )
            if a.dtype == torch.bool:
                a = a.to(torch.uint8)
            if a.is_complex():
                raise GraphError(f"{name}: complex entries are not supported")
            n = a.shape[0]
            a = a.to(torch.float64)
            nz = (a != 0).nonzero()
            rows, cols = nz[:, 0], nz[:, 1]
            vals = a[rows, cols]

    if n_agents is not None:
        expected = _as_int(n_agents, "n_agents")
        if n != expected:
            raise GraphError(f"{name} has {n} nodes but there are {expected} agents (n_agents={expected})")
    if n < 1:
        raise GraphError(f"{name}: a graph needs at least 1 agent, got an empty {n}x{n} matrix")

    def who(k):
        r, c = int(rows[k]), int(cols[k])
        if labels is not None:
            return f"({r}, {c}) [nodes {labels[r]!r}, {labels[c]!r}]"
        return f"({r}, {c})"

    bad_nan = torch.isnan(vals).nonzero()
    if bad_nan.numel():
        raise GraphError(f"{name}: entry {who(int(bad_nan[0]))} is NaN")
    # Explicit zeros in a sparse input are not edges.
    keep = vals != 0
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    bad = (vals != 1).nonzero()
    if bad.numel():
        k = int(bad[0])
        raise GraphError(
            f"{name}: entry {who(k)} is {vals[k].item():g}; entries must be 0 or 1 "
            "(weighted graphs are not supported)"
        )
    loops = (rows == cols).nonzero()
    if loops.numel():
        k = int(loops[0])
        node = int(rows[k]) if labels is None else f"{int(rows[k])} ({labels[int(rows[k])]!r})"
        raise GraphError(
            f"{name}: self loop at node {node} (diagonal entry is 1); graphs must not have self loops"
        )
    key = rows * n + cols
    skey, order = torch.sort(key)
    rkey = (cols * n + rows)[order]
    pos = torch.searchsorted(skey, rkey).clamp(max=max(skey.numel() - 1, 0))
    missing = (skey[pos] != rkey).nonzero() if skey.numel() else torch.zeros(0, 1)
    if missing.numel():
        k = int(order[int(missing[0])])
        r, c = int(rows[k]), int(cols[k])
        raise GraphError(
            f"{name}: not symmetric: entry ({r}, {c}) is 1 but ({c}, {r}) is 0"
            + (f" [nodes {labels[r]!r}, {labels[c]!r}]" if labels is not None else "")
        )
    upper = rows < cols
    edges = list(zip(rows[upper].tolist(), cols[upper].tolist()))
    validate_graph(n, edges, name=name)
    return Graph(n, edges)


def from_edge_list(path_or_lines, n_agents=None) -> Graph:
    """Read a graph from a text edge list.

    One ``i j`` pair per line, separated by whitespace or a comma, 0-based node
    ids. ``#`` starts a comment; blank lines are ignored. A comment line of the
    form ``# n_agents: N`` (as written by :meth:`Graph.to_edge_list_file`) sets
    the number of agents. An edge listed twice, in either direction, counts once.

    Parameters
    ----------
    path_or_lines : str, os.PathLike or iterable of str
        A file path, or the lines themselves.
    n_agents : int, optional
        Number of agents; defaults to the ``# n_agents:`` header, else max id + 1.

    Returns
    -------
    Graph

    Raises
    ------
    GraphError
        If the file is missing or unreadable, a line is malformed (the message
        names the file and line number), an id is negative or not below
        ``n_agents``, an edge is a self loop, the header disagrees with
        ``n_agents``, or the graph is disconnected.
    """
    if isinstance(path_or_lines, (str, os.PathLike)):
        source = os.fspath(path_or_lines)
        try:
            with open(source, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except FileNotFoundError:
            raise GraphError(f"edge list file not found: {source!r}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise GraphError(f"edge list file {source!r} cannot be read: {exc}") from None
    else:
        source = "<lines>"
        lines = [str(s) for s in path_or_lines]

    header_n = None
    pairs = []
    for lineno, raw in enumerate(lines, start=1):
        text, _, comment = raw.partition("#")
        c = comment.strip().lower().replace("=", ":")
        if not text.strip() and c.startswith("n_agents"):
            val = c.split(":", 1)[-1].strip()
            try:
                header_n = int(val)
            except ValueError:
                raise GraphError(
                    f"{source}, line {lineno}: malformed header {raw.strip()!r}; expected '# n_agents: N'"
                ) from None
            continue
        tokens = text.replace(",", " ").split()
        if not tokens:
            continue
        if len(tokens) != 2:
            raise GraphError(
                f"{source}, line {lineno}: expected two node ids 'i j', got {raw.strip()!r}"
            )
        try:
            i, j = int(tokens[0]), int(tokens[1])
        except ValueError:
            raise GraphError(
                f"{source}, line {lineno}: node ids must be integers, got {raw.strip()!r}"
            ) from None
        if i < 0 or j < 0:
            raise GraphError(f"{source}, line {lineno}: node ids must be >= 0, got {raw.strip()!r}")
        if i == j:
            raise GraphError(
                f"{source}, line {lineno}: self loop at node {i}; graphs must not have self loops"
            )
        pairs.append((i, j, lineno))

    if n_agents is not None:
        n = _as_int(n_agents, "n_agents")
        if header_n is not None and header_n != n:
            raise GraphError(
                f"{source}: the file says n_agents: {header_n} but there are {n} agents (n_agents={n})"
            )
    elif header_n is not None:
        n = header_n
    elif pairs:
        n = max(max(i, j) for i, j, _ in pairs) + 1
    else:
        raise GraphError(
            f"{source}: no edges and no '# n_agents: N' header; pass n_agents to read a single-agent graph"
        )
    for i, j, lineno in pairs:
        if max(i, j) >= n:
            raise GraphError(
                f"{source}, line {lineno}: node id {max(i, j)} is outside 0..{n - 1} "
                f"(there are {n} agents)"
            )
    return Graph(n, validate_graph(n, [(i, j) for i, j, _ in pairs], name=source))


# ----------------------------------------------------------------------------
# Generators
# ----------------------------------------------------------------------------


def _check_n(n, what: str) -> int:
    n = _as_int(n, f"{what}: n_agents", error=ConfigError)
    if n < 1:
        raise ConfigError(f"{what}: n_agents must be >= 1, got {n}")
    return n


def _rng(seed, kind: str) -> random.Random:
    # Each generator gets its own stream so "random" and "erdos_renyi" with the
    # same seed are unrelated draws.
    return random.Random(derive_seed(_as_int(seed, "seed", error=ConfigError), "graph", kind))


def _random_tree(n: int, rng: random.Random) -> list[tuple[int, int]]:
    # A uniformly random Pruefer sequence decodes to a uniformly random labeled
    # tree (Cayley's bijection), i.e. a uniform spanning tree of K_n.
    if n == 1:
        return []
    if n == 2:
        return [(0, 1)]
    seq = [rng.randrange(n) for _ in range(n - 2)]
    degree = [1] * n
    for v in seq:
        degree[v] += 1
    leaves = [v for v in range(n) if degree[v] == 1]
    heapq.heapify(leaves)
    edges = []
    for v in seq:
        leaf = heapq.heappop(leaves)
        edges.append((min(leaf, v), max(leaf, v)))
        degree[v] -= 1
        if degree[v] == 1:
            heapq.heappush(leaves, v)
    u, w = heapq.heappop(leaves), heapq.heappop(leaves)
    edges.append((min(u, w), max(u, w)))
    return edges


def random_connected(n_agents, avg_degree=3.0, seed=0) -> Graph:
    """The paper's random graph: connected, with a prescribed average degree.

    A uniformly random spanning tree (random Pruefer sequence) guarantees
    connectivity; then uniformly random extra edges are added until there are
    exactly ``E = round(n_agents * avg_degree / 2)`` edges (Python ``round``).
    ``N = 10, avg_degree = 3`` gives 15 edges, as in the paper.

    Parameters
    ----------
    n_agents : int
        Number of agents ``N >= 1``. ``N = 1`` returns the lone node whatever
        ``avg_degree`` is (the centralized case).
    avg_degree : float, default 3.0
        Target average degree ``2E / N``.
    seed : int, default 0
        Seed; the same seed gives the same graph.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``N < 1``, or ``E < N - 1`` (too few edges to connect) or
        ``E > N (N - 1) / 2`` (more than the complete graph).
    """
    n = _check_n(n_agents, "random_connected")
    if n == 1:
        return Graph(1, ())
    try:
        d = float(avg_degree)
    except (TypeError, ValueError):
        raise ConfigError(f"random_connected: avg_degree must be a number, got {avg_degree!r}") from None
    if not math.isfinite(d):
        raise ConfigError(f"random_connected: avg_degree must be finite, got {avg_degree!r}")
    n_e = round(n * d / 2)
    max_e = n * (n - 1) // 2
    if n_e < n - 1:
        raise ConfigError(
            f"random_connected: avg_degree={avg_degree} gives {n_e} edges for {n} agents, but a "
            f"connected graph needs at least {n - 1} (avg_degree >= {2 * (n - 1) / n:.3g})"
        )
    if n_e > max_e:
        raise ConfigError(
            f"random_connected: avg_degree={avg_degree} gives {n_e} edges for {n} agents, but the "
            f"complete graph has only {max_e} (avg_degree <= {n - 1})"
        )
    rng = _rng(seed, "random_connected")
    edges = set(_random_tree(n, rng))
    extra = n_e - len(edges)
    free = max_e - len(edges)
    if extra > 0 and 2 * extra <= free:
        # Sparse target: rejection sampling keeps memory O(E); drawing
        # uniform pairs and skipping duplicates yields a uniform subset.
        while len(edges) < n_e:
            i, j = rng.sample(range(n), 2)
            edges.add((min(i, j), max(i, j)))
    elif extra > 0:
        candidates = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in edges]
        edges.update(rng.sample(candidates, extra))
    return Graph(n, edges)


def ring(n) -> Graph:
    """Cycle ``0 - 1 - ... - (n-1) - 0``.

    Parameters
    ----------
    n : int
        Number of agents; ``n = 2`` gives a single edge, ``n = 1`` a lone node.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``n < 1``.
    """
    n = _check_n(n, "ring")
    if n == 1:
        return Graph(1, ())
    if n == 2:
        return Graph(2, ((0, 1),))
    return Graph(n, [(i, (i + 1) % n) for i in range(n)])


def star(n) -> Graph:
    """Star with agent 0 at the centre.

    Parameters
    ----------
    n : int
        Number of agents ``>= 1``.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``n < 1``.
    """
    n = _check_n(n, "star")
    return Graph(n, [(0, j) for j in range(1, n)])


def complete(n) -> Graph:
    """Complete graph on ``n`` agents.

    Parameters
    ----------
    n : int
        Number of agents ``>= 1``.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``n < 1``.
    """
    n = _check_n(n, "complete")
    return Graph(n, [(i, j) for i in range(n) for j in range(i + 1, n)])


def grid_2d(rows, cols) -> Graph:
    """4-neighbour lattice; agent ``r * cols + c`` sits at row ``r``, column ``c``.

    Parameters
    ----------
    rows, cols : int
        Grid size, both ``>= 1``; ``N = rows * cols``.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``rows < 1`` or ``cols < 1``.
    """
    r = _as_int(rows, "grid_2d: rows", error=ConfigError)
    c = _as_int(cols, "grid_2d: cols", error=ConfigError)
    if r < 1 or c < 1:
        raise ConfigError(f"grid_2d: rows and cols must be >= 1, got rows={r}, cols={c}")
    edges = []
    for a in range(r):
        for b in range(c):
            v = a * c + b
            if b + 1 < c:
                edges.append((v, v + 1))
            if a + 1 < r:
                edges.append((v, v + c))
    return Graph(r * c, edges)


def _check_tries(max_tries, what) -> int:
    t = _as_int(max_tries, f"{what}: max_tries", error=ConfigError)
    if t < 1:
        raise ConfigError(f"{what}: max_tries must be >= 1, got {t}")
    return t


def _is_connected(n: int, edges) -> bool:
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        adj[i].append(j)
        adj[j].append(i)
    return len(_components(n, adj)) == 1


def erdos_renyi(n, p, seed=0, max_tries=1000) -> Graph:
    """G(n, p) random graph, resampled until it is connected.

    Parameters
    ----------
    n : int
        Number of agents ``>= 1``.
    p : float
        Edge probability in ``[0, 1]``.
    seed : int, default 0
    max_tries : int, default 1000
        Number of draws before giving up.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``n < 1``, ``p`` is outside ``[0, 1]``, or no connected draw was
        found in ``max_tries`` tries.
    """
    n = _check_n(n, "erdos_renyi")
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"erdos_renyi: p must be in [0, 1], got {p}")
    tries = _check_tries(max_tries, "erdos_renyi")
    if n == 1:
        return Graph(1, ())
    if p > 0:
        rng = _rng(seed, "erdos_renyi")
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
        for _ in range(tries):
            edges = [e for e in pairs if rng.random() < p]
            if _is_connected(n, edges):
                return Graph(n, edges)
    raise ConfigError(
        f"erdos_renyi: no connected graph with n={n}, p={p} in {tries} tries; increase p "
        f"(connectivity threshold is about ln(n)/n = {math.log(n) / n:.3g})"
    )


def random_geometric(n, radius, seed=0, max_tries=1000) -> Graph:
    """Random geometric graph in the unit square, resampled until connected.

    Points are uniform in ``[0, 1]^2``; agents are joined when their Euclidean
    distance is ``<= radius``.

    Parameters
    ----------
    n : int
        Number of agents ``>= 1``.
    radius : float
        Connection radius ``> 0``.
    seed : int, default 0
    max_tries : int, default 1000

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``n < 1``, ``radius <= 0``, or no connected draw was found in ``max_tries``.
    """
    n = _check_n(n, "random_geometric")
    radius = float(radius)
    if not radius > 0:
        raise ConfigError(f"random_geometric: radius must be > 0, got {radius}")
    tries = _check_tries(max_tries, "random_geometric")
    if n == 1:
        return Graph(1, ())
    rng = _rng(seed, "random_geometric")
    r2 = radius * radius
    for _ in range(tries):
        pts = [(rng.random(), rng.random()) for _ in range(n)]
        edges = [
            (i, j)
            for i in range(n)
            for j in range(i + 1, n)
            if (pts[i][0] - pts[j][0]) ** 2 + (pts[i][1] - pts[j][1]) ** 2 <= r2
        ]
        if _is_connected(n, edges):
            return Graph(n, edges)
    raise ConfigError(
        f"random_geometric: no connected graph with n={n}, radius={radius} in {tries} tries; "
        f"increase radius (about sqrt(ln(n)/(pi n)) = {math.sqrt(math.log(n) / (math.pi * n)):.3g} is the threshold)"
    )


# ----------------------------------------------------------------------------
# Factory and batching
# ----------------------------------------------------------------------------

GRAPH_KINDS = ("random", "ring", "star", "complete", "grid", "erdos_renyi", "random_geometric", "file")
_ALIASES = {"random_connected": "random", "grid_2d": "grid"}


def _square_ish(n: int) -> tuple[int, int]:
    r = math.isqrt(n)
    while n % r:
        r -= 1
    return r, n // r


def make_graph(kind: str, n_agents, seed: int = 0, **params) -> Graph:
    """Build a graph by name.

    Parameters
    ----------
    kind : str
        One of ``"random"`` (params: ``avg_degree``, default 3.0), ``"ring"``,
        ``"star"``, ``"complete"``, ``"grid"`` (params: ``rows``, ``cols``;
        default the most square factorization ``rows * cols == n_agents``),
        ``"erdos_renyi"`` (params: ``p``, ``max_tries``), ``"random_geometric"``
        (params: ``radius``, ``max_tries``), ``"file"`` (params: ``path``).
        ``"random_connected"`` and ``"grid_2d"`` are accepted as aliases.
    n_agents : int or None
        Number of agents; may be None only for ``"file"`` (then read from the file).
    seed : int, default 0
        Seed of the random kinds; ignored by the deterministic ones.
    **params
        Kind-specific parameters. Parameters set to None are ignored, so a
        config can carry unused keys as null.

    Returns
    -------
    Graph

    Raises
    ------
    ConfigError
        If ``kind`` is unknown (the message lists the known kinds), a parameter
        is unknown for the kind or missing, or the parameters are impossible.
    GraphError
        If the graph read from a file is invalid.
    """
    if not isinstance(kind, str):
        raise ConfigError(f"kind: expected a string, got {kind!r}")
    k = kind.strip().lower()
    k = _ALIASES.get(k, k)
    if k not in GRAPH_KINDS:
        raise ConfigError(f"kind: unknown graph kind {kind!r}; known kinds: {', '.join(GRAPH_KINDS)}")
    params = {key: v for key, v in params.items() if v is not None}
    allowed = {
        "random": {"avg_degree"},
        "ring": set(),
        "star": set(),
        "complete": set(),
        "grid": {"rows", "cols"},
        "erdos_renyi": {"p", "max_tries"},
        "random_geometric": {"radius", "max_tries"},
        "file": {"path"},
    }[k]
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError(
            f"make_graph: unknown parameter(s) {unknown} for kind {k!r}; "
            f"allowed: {sorted(allowed) if allowed else 'none'}"
        )
    if k == "file":
        if "path" not in params:
            raise ConfigError("make_graph: kind 'file' needs path=<edge list file>")
        return from_edge_list(params["path"], n_agents=n_agents)
    if n_agents is None:
        raise ConfigError(f"make_graph: n_agents is required for kind {k!r}")
    n = _check_n(n_agents, "make_graph")
    if k == "random":
        return random_connected(n, params.get("avg_degree", 3.0), seed=seed)
    if k == "ring":
        return ring(n)
    if k == "star":
        return star(n)
    if k == "complete":
        return complete(n)
    if k == "grid":
        rows, cols = params.get("rows"), params.get("cols")
        if rows is None and cols is None:
            rows, cols = _square_ish(n)
        elif rows is None:
            cols = _as_int(cols, "make_graph: cols", error=ConfigError)
            rows = n // cols if cols > 0 else 0
        elif cols is None:
            rows = _as_int(rows, "make_graph: rows", error=ConfigError)
            cols = n // rows if rows > 0 else 0
        rows = _as_int(rows, "make_graph: rows", error=ConfigError)
        cols = _as_int(cols, "make_graph: cols", error=ConfigError)
        if rows * cols != n:
            raise ConfigError(
                f"make_graph: grid rows*cols = {rows}*{cols} = {rows * cols} but there are {n} agents"
            )
        return grid_2d(rows, cols)
    if k == "erdos_renyi":
        if "p" not in params:
            raise ConfigError("make_graph: kind 'erdos_renyi' needs p=<edge probability>")
        return erdos_renyi(n, params["p"], seed=seed, max_tries=params.get("max_tries", 1000))
    if "radius" not in params:
        raise ConfigError("make_graph: kind 'random_geometric' needs radius=<connection radius>")
    return random_geometric(n, params["radius"], seed=seed, max_tries=params.get("max_tries", 1000))


def block_diagonal(graphs: Sequence[Graph], stride: int | None = None):
    """Directed-edge tensors of ``T`` graphs laid out as one block-diagonal graph.

    Trial ``t``'s agent ``i`` becomes node ``t * N + i``, so ``T`` independent
    trials share one sparse ``(T*N, T*N)`` matrix. The graphs may have different
    edge counts; the result is in CSR order like :class:`Graph`'s tensors.

    Parameters
    ----------
    graphs : sequence of Graph, length T >= 1
        All with the same ``n_agents``.
    stride : int, optional
        Nodes per trial block (default ``n_agents``); a larger stride appends isolated
        nodes to every trial (the solver's alignment padding).

    Returns
    -------
    src, dst : torch.LongTensor, shape (sum_t 2E_t,)
        Directed edges with offset node ids, sorted by ``(src, dst)``.
    rev : torch.LongTensor, shape (sum_t 2E_t,)
        Index of the reverse of each directed edge, in the concatenated order.
    crow : torch.LongTensor, shape (T*N + 1,)
        CSR row pointers.

    Raises
    ------
    GraphError
        If ``graphs`` is empty, holds a non-Graph, or the graphs differ in ``n_agents``.
    """
    graphs = list(graphs)
    if not graphs:
        raise GraphError("graphs: need at least one graph")
    for t, g in enumerate(graphs):
        if not isinstance(g, Graph):
            raise GraphError(f"graphs: item {t} is a {type(g).__name__}, not a Graph")
    n = graphs[0].n_agents
    for t, g in enumerate(graphs):
        if g.n_agents != n:
            raise GraphError(
                f"graphs: graph {t} has {g.n_agents} agents but graph 0 has {n}; "
                "all trials must have the same number of agents"
            )
    stride = n if stride is None else int(stride)
    if stride < n:
        raise GraphError(f"stride: {stride} is smaller than the {n} agents of a trial")
    srcs, dsts, revs, crows = [], [], [], [torch.zeros(1, dtype=torch.long)]
    e_off = 0
    for t, g in enumerate(graphs):
        srcs.append(g.src + t * stride)
        dsts.append(g.dst + t * stride)
        revs.append(g.rev + e_off)
        # the isolated padding nodes repeat the trial's last row pointer: no edges
        crows.append(torch.cat([g.crow[1:], g.crow[-1:].expand(stride - n)]) + e_off)
        e_off += g.src.numel()
    return torch.cat(srcs), torch.cat(dsts), torch.cat(revs), torch.cat(crows)
