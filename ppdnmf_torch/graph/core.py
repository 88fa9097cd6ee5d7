"""The :class:`Graph` of the agents and its validation.

A :class:`Graph` is an undirected, connected, loop-free, unweighted graph on the
agents ``0 .. N-1``. Besides the undirected edge list it carries the directed
edge tensors the batched solvers index with: every undirected edge ``{i, j}``
appears twice, as ``i -> j`` and ``j -> i``, sorted by ``(src, dst)`` so the
directed edges of agent ``i`` are the contiguous slice ``crow[i]:crow[i + 1]``
(CSR order), and ``rev`` maps each directed edge to its reverse.

Only torch and the standard library are used here.
"""
from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass, field
from functools import cached_property
from typing import Iterable

import torch

from .._utils import sparse_csr
from ..errors import ConfigError, GraphError

__all__ = ["Graph", "validate_graph", "components", "is_connected", "format_nodes", "as_int", "check_min_degree"]

# Components listed in a "disconnected" message are cut at this many nodes so a
# huge graph does not produce a huge message.
_MAX_LISTED_NODES = 10


def as_int(value, what: str, error=GraphError) -> int:
    """``value`` as a Python ``int``, or ``error`` naming ``what`` when it is not an integer."""
    # operator.index rejects floats such as 1.5 instead of truncating them, and
    # accepts numpy / torch integer scalars.
    try:
        return operator.index(value)
    except TypeError:
        raise error(f"{what}: expected an integer, got {value!r} ({type(value).__name__})") from None


def components(n: int, edges) -> list[list[int]]:
    """Connected components of the graph on ``0 .. n-1`` with undirected ``edges``.

    Returns
    -------
    list of list of int
        Each component's nodes, ascending; components in order of their smallest node.
    """
    adj: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        adj[i].append(j)
        adj[j].append(i)
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


def is_connected(n: int, edges) -> bool:
    """Whether the graph on ``0 .. n-1`` with undirected ``edges`` is connected."""
    return len(components(n, edges)) == 1


def format_nodes(nodes: list[int]) -> str:
    """A node list for an error message, cut after ``_MAX_LISTED_NODES`` nodes."""
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
    n = as_int(n_agents, f"{name}: n_agents")
    if n < 1:
        raise GraphError(f"{name}: a graph needs at least 1 agent, got n_agents={n}")
    canon = set()
    for k, e in enumerate(edges):
        try:
            a, b = e
        except (TypeError, ValueError):
            raise GraphError(f"{name}: edge #{k} is {e!r}, expected a pair (i, j)") from None
        i = as_int(a, f"{name}: edge #{k} {e!r}")
        j = as_int(b, f"{name}: edge #{k} {e!r}")
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
    comps = components(n, out)
    if len(comps) > 1:
        small = min(comps, key=len)
        raise GraphError(
            f"{name}: graph is disconnected: {len(comps)} connected components among {n} agents; "
            f"e.g. nodes {format_nodes(small)} are not connected to the rest; "
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
        n = as_int(self.n_agents, "n_agents")
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
        i = as_int(i, "node")
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


def check_min_degree(graph, min_degree, trial=None) -> None:
    """Refuse a graph with an agent of fewer than ``min_degree`` neighbours (None: no rule).

    Raises
    ------
    ConfigError
        Naming ``min_degree``, when it is not None or an integer ``>= 1``.
    GraphError
        Naming ``min_degree`` and the agents with fewer neighbours.
    """
    if min_degree is None:
        return
    if isinstance(min_degree, bool) or not isinstance(min_degree, int) or min_degree < 1:
        raise ConfigError(f"min_degree: expected None or an integer >= 1, got {min_degree!r}")
    degree = graph.degree.tolist()
    low = [a for a, d in enumerate(degree) if d < min_degree]
    if low:
        where = "" if trial is None else f" (trial {trial})"
        raise GraphError(
            f"min_degree: agents {low}{where} have fewer than {min_degree} neighbours (degrees "
            f"{[degree[a] for a in low]}); an agent with a single neighbour learns that neighbour's U_j from "
            "the sums of any secure exchange, so such graphs are refused; add edges, or lower min_degree"
        )


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
