"""Graphs from adjacency matrices (dense, sparse, networkx) and from text edge lists.

numpy arrays and networkx graphs are accepted by duck typing, without importing
either package.
"""
from __future__ import annotations

import os

import torch

from .. import budget
from ..errors import GraphError
from .core import Graph, as_int, validate_graph

__all__ = ["from_adjacency", "from_edge_list"]


# ----------------------------------------------------------------------------
# Adjacency matrices
# ----------------------------------------------------------------------------


def _is_networkx_like(obj) -> bool:
    return hasattr(obj, "nodes") and hasattr(obj, "edges") and not isinstance(obj, torch.Tensor)


def _entries_from_networkx(g):
    try:
        nodes = sorted(g.nodes)
    except TypeError:  # labels that do not compare (ints and strings): no agent order to read
        kinds = sorted({type(v).__name__ for v in g.nodes})
        raise GraphError(
            f"adjacency: the networkx graph's node labels mix types ({', '.join(kinds)}), so they have no order "
            "that maps them to agents 0..N-1; relabel them first (networkx.convert_node_labels_to_integers)"
        ) from None
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
    rows = torch.tensor([k[0] for k in entries], dtype=torch.long)
    cols = torch.tensor([k[1] for k in entries], dtype=torch.long)
    vals = torch.tensor([float(w) for w in entries.values()], dtype=torch.float64)
    return n, rows, cols, vals, nodes


def _check_square(a: torch.Tensor, name: str) -> None:
    if a.dim() != 2 or a.shape[0] != a.shape[1]:
        raise GraphError(f"{name}: must be a square (N, N) matrix, got shape {tuple(a.shape)}")


def _entries_from_sparse(adjacency: torch.Tensor, name: str):
    a = adjacency.detach().cpu()
    if a.layout != torch.sparse_coo:
        try:
            a = a.to_sparse_coo()
        except RuntimeError as exc:
            raise GraphError(f"{name}: unsupported sparse layout {a.layout}: {exc}") from None
    _check_square(a, name)
    a = a.coalesce()
    rows, cols = a.indices()[0], a.indices()[1]
    return a.shape[0], rows, cols, a.values().to(torch.float64), None


def _entries_from_dense(adjacency, name: str):
    try:
        a = torch.as_tensor(adjacency).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise GraphError(f"{name}: cannot read as a square (N, N) matrix ({exc})") from None
    _check_square(a, name)
    if a.dtype == torch.bool:
        a = a.to(torch.uint8)
    if a.is_complex():
        raise GraphError(f"{name}: complex entries are not supported")
    a = a.to(torch.float64)
    nz = (a != 0).nonzero()
    rows, cols = nz[:, 0], nz[:, 1]
    return a.shape[0], rows, cols, a[rows, cols], None


def _entries(adjacency, name: str):
    """``(n, rows, cols, vals, labels)``: the stored entries of an adjacency input; ``labels``
    are a networkx graph's node labels in index order (None for matrices)."""
    if _is_networkx_like(adjacency):
        return _entries_from_networkx(adjacency)
    if isinstance(adjacency, torch.Tensor) and adjacency.layout != torch.strided:
        return _entries_from_sparse(adjacency, name)
    return _entries_from_dense(adjacency, name)


def _who(rows, cols, labels, k) -> str:
    r, c = int(rows[k]), int(cols[k])
    if labels is not None:
        return f"({r}, {c}) [nodes {labels[r]!r}, {labels[c]!r}]"
    return f"({r}, {c})"


def _check_symmetric(name: str, n: int, rows, cols, labels) -> None:
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


def _edges_from_entries(name: str, n: int, rows, cols, vals, labels) -> list[tuple[int, int]]:
    """The undirected edges ``(i, j)``, ``i < j``, of 0/1 symmetric entries without self loops."""
    bad_nan = torch.isnan(vals).nonzero()
    if bad_nan.numel():
        raise GraphError(f"{name}: entry {_who(rows, cols, labels, int(bad_nan[0]))} is NaN")
    # Explicit zeros in a sparse input are not edges.
    keep = vals != 0
    rows, cols, vals = rows[keep], cols[keep], vals[keep]
    bad = (vals != 1).nonzero()
    if bad.numel():
        k = int(bad[0])
        raise GraphError(
            f"{name}: entry {_who(rows, cols, labels, k)} is {vals[k].item()!r}; entries must be 0 or 1 "
            "(weighted graphs are not supported)"
        )
    loops = (rows == cols).nonzero()
    if loops.numel():
        k = int(loops[0])
        node = int(rows[k]) if labels is None else f"{int(rows[k])} ({labels[int(rows[k])]!r})"
        raise GraphError(
            f"{name}: self loop at node {node} (diagonal entry is 1); graphs must not have self loops"
        )
    _check_symmetric(name, n, rows, cols, labels)
    upper = rows < cols
    return list(zip(rows[upper].tolist(), cols[upper].tolist()))


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
    n, rows, cols, vals, labels = _entries(adjacency, name)
    if n_agents is not None:
        expected = as_int(n_agents, "n_agents")
        if n != expected:
            raise GraphError(f"{name} has {n} nodes but there are {expected} agents (n_agents={expected})")
    if n < 1:
        raise GraphError(f"{name}: a graph needs at least 1 agent, got an empty {n}x{n} matrix")
    edges = _edges_from_entries(name, n, rows, cols, vals, labels)
    validate_graph(n, edges, name=name)
    return Graph(n, edges)


# ----------------------------------------------------------------------------
# Edge list files
# ----------------------------------------------------------------------------


#: bytes of one parsed edge (a tuple of three ints in a list); an edge takes at least 4 bytes of text
_EDGE_BYTES = 160


def _read_lines(path_or_lines) -> tuple[str, list[str]]:
    """``(source, lines)``: the name used in messages and the text lines."""
    if not isinstance(path_or_lines, (str, os.PathLike)):
        return "<lines>", [str(s) for s in path_or_lines]
    source = os.fspath(path_or_lines)
    try:
        size = os.path.getsize(source)
        # the lines and the parsed edges, at most one edge per 4 bytes of text ("0 1\n")
        budget.check_bytes(size * (1 + _EDGE_BYTES / 4), "path", f"edge list file {source!r} ({size} bytes)",
                           model="reading a graph", sizes=f"{size} bytes of text", hint="use a smaller graph")
        with open(source, encoding="utf-8") as fh:
            return source, fh.read().splitlines()
    except FileNotFoundError:
        raise GraphError(f"edge list file not found: {source!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise GraphError(f"edge list file {source!r} cannot be read: {exc}") from None


def _parse_edge_lines(source: str, lines: list[str]):
    """``(header_n, pairs)``: the ``# n_agents:`` header (or None) and ``(i, j, lineno)`` per edge line."""
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
    return header_n, pairs


def _agent_count(source: str, n_agents, header_n, pairs) -> int:
    """The number of agents: ``n_agents`` (checked against the header), else the header, else max id + 1."""
    if n_agents is not None:
        n = as_int(n_agents, "n_agents")
        if header_n is not None and header_n != n:
            raise GraphError(
                f"{source}: the file says n_agents: {header_n} but there are {n} agents (n_agents={n})"
            )
        return n
    if header_n is not None:
        return header_n
    if pairs:
        return max(max(i, j) for i, j, _ in pairs) + 1
    raise GraphError(
        f"{source}: no edges and no '# n_agents: N' header; pass n_agents to read a single-agent graph"
    )


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
    source, lines = _read_lines(path_or_lines)
    header_n, pairs = _parse_edge_lines(source, lines)
    n = _agent_count(source, n_agents, header_n, pairs)
    for i, j, lineno in pairs:
        if max(i, j) >= n:
            raise GraphError(
                f"{source}, line {lineno}: node id {max(i, j)} is outside 0..{n - 1} "
                f"(there are {n} agents)"
            )
    _check_enough_edges(source, n, pairs, n_agents, header_n)
    return Graph(n, validate_graph(n, [(i, j) for i, j, _ in pairs], name=source))


def _check_enough_edges(source: str, n: int, pairs, n_agents, header_n) -> None:
    """Refuse a graph of ``n`` agents with fewer than ``n - 1`` distinct edges (it cannot be
    connected) before any ``n``-sized structure is made: a file naming node 1000000000 asks
    for a billion agents."""
    if n - 1 > len(pairs):  # too few lines: no need to count the distinct edges
        edges = len({(min(i, j), max(i, j)) for i, j, _ in pairs})
    else:
        return  # enough lines for a connected graph: validate_graph checks the rest
    if n_agents is not None:
        why = f"n_agents={n}"
    elif header_n is not None:
        why = f"its header says n_agents: {n}"
    else:
        top = max(max(i, j) for i, j, _ in pairs)
        why = f"its largest node id is {top}, so there are {n} agents (ids count from 0; number them 0..N-1)"
    raise GraphError(f"{source}: graph is disconnected: {why}, and its {edges} distinct edges cannot connect them "
                     f"(a connected graph of {n} agents needs at least {n - 1})")
