"""Graph generators, by function and by name (:func:`make_graph`), and the table of their parameters.

Every random generator draws from its own seeded :class:`random.Random` stream, so the
same seed gives the same graph on every platform.
"""
from __future__ import annotations

import heapq
import math
import random

from .._utils import derive_seed
from ..errors import ConfigError
from .core import Graph, as_int, is_connected
from .io import from_edge_list

__all__ = [
    "random_connected",
    "ring",
    "star",
    "complete",
    "grid_2d",
    "erdos_renyi",
    "random_geometric",
    "make_graph",
    "GRAPH_KINDS",
    "GRAPH_PARAMS",
    "GRAPH_REQUIRED",
    "GRAPH_ALIASES",
]


def _check_n(n, what: str) -> int:
    n = as_int(n, f"{what}: n_agents", error=ConfigError)
    if n < 1:
        raise ConfigError(f"{what}: n_agents must be >= 1, got {n}")
    return n


def _rng(seed, kind: str) -> random.Random:
    # Each generator gets its own stream so "random" and "erdos_renyi" with the
    # same seed are unrelated draws.
    return random.Random(derive_seed(as_int(seed, "seed", error=ConfigError), "graph", kind))


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
    r = as_int(rows, "grid_2d: rows", error=ConfigError)
    c = as_int(cols, "grid_2d: cols", error=ConfigError)
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
    t = as_int(max_tries, f"{what}: max_tries", error=ConfigError)
    if t < 1:
        raise ConfigError(f"{what}: max_tries must be >= 1, got {t}")
    return t


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
            if is_connected(n, edges):
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
        if is_connected(n, edges):
            return Graph(n, edges)
    raise ConfigError(
        f"random_geometric: no connected graph with n={n}, radius={radius} in {tries} tries; "
        f"increase radius (about sqrt(ln(n)/(pi n)) = {math.sqrt(math.log(n) / (math.pi * n)):.3g} is the threshold)"
    )


# ----------------------------------------------------------------------------
# By name: the parameter table and the factory
# ----------------------------------------------------------------------------

#: the parameters each graph kind takes (all others must be unset); its keys are the kinds
GRAPH_PARAMS = {
    "random": ("avg_degree",),
    "ring": (),
    "star": (),
    "complete": (),
    "grid": ("rows", "cols"),
    "erdos_renyi": ("p", "max_tries"),
    "random_geometric": ("radius", "max_tries"),
    "file": ("path",),
}
#: the parameters a kind cannot do without
GRAPH_REQUIRED = {"erdos_renyi": ("p",), "random_geometric": ("radius",), "file": ("path",)}
#: other names accepted for a kind
GRAPH_ALIASES = {"random_connected": "random", "grid_2d": "grid"}
#: the graph kinds :func:`make_graph` builds
GRAPH_KINDS = tuple(GRAPH_PARAMS)

# what a required parameter stands for, in the message that asks for it
_REQUIRED_HINTS = {"path": "edge list file", "p": "edge probability", "radius": "connection radius"}


def _square_ish(n: int) -> tuple[int, int]:
    r = math.isqrt(n)
    while n % r:
        r -= 1
    return r, n // r


def _canonical_kind(kind) -> str:
    if not isinstance(kind, str):
        raise ConfigError(f"kind: expected a string, got {kind!r}")
    k = kind.strip().lower()
    k = GRAPH_ALIASES.get(k, k)
    if k not in GRAPH_KINDS:
        raise ConfigError(f"kind: unknown graph kind {kind!r}; known kinds: {', '.join(GRAPH_KINDS)}")
    return k


def _known_params(k: str, params: dict) -> dict:
    """The parameters that are set (not None); each must be one of kind ``k``'s."""
    params = {key: v for key, v in params.items() if v is not None}
    allowed = set(GRAPH_PARAMS[k])
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ConfigError(
            f"make_graph: unknown parameter(s) {unknown} for kind {k!r}; "
            f"allowed: {sorted(allowed) if allowed else 'none'}"
        )
    return params


def _check_required(k: str, params: dict) -> None:
    for key in GRAPH_REQUIRED.get(k, ()):
        if key not in params:
            raise ConfigError(f"make_graph: kind {k!r} needs {key}=<{_REQUIRED_HINTS[key]}>")


def _grid_shape(n: int, rows, cols) -> tuple[int, int]:
    """``(rows, cols)`` of a grid of ``n`` agents; a missing side is ``n`` divided by the other,
    both missing the most square factorization."""
    if rows is None and cols is None:
        rows, cols = _square_ish(n)
    elif rows is None:
        cols = as_int(cols, "make_graph: cols", error=ConfigError)
        rows = n // cols if cols > 0 else 0
    elif cols is None:
        rows = as_int(rows, "make_graph: rows", error=ConfigError)
        cols = n // rows if rows > 0 else 0
    rows = as_int(rows, "make_graph: rows", error=ConfigError)
    cols = as_int(cols, "make_graph: cols", error=ConfigError)
    if rows * cols != n:
        raise ConfigError(
            f"make_graph: grid rows*cols = {rows}*{cols} = {rows * cols} but there are {n} agents"
        )
    return rows, cols


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
        ``"random_connected"`` and ``"grid_2d"`` are accepted as aliases
        (:data:`GRAPH_PARAMS`, :data:`GRAPH_REQUIRED`, :data:`GRAPH_ALIASES`).
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
    k = _canonical_kind(kind)
    params = _known_params(k, params)
    if k == "file":
        _check_required(k, params)
        return from_edge_list(params["path"], n_agents=n_agents)
    if n_agents is None:
        raise ConfigError(f"make_graph: n_agents is required for kind {k!r}")
    n = _check_n(n_agents, "make_graph")
    _check_required(k, params)
    if k == "random":
        return random_connected(n, params.get("avg_degree", 3.0), seed=seed)
    if k == "ring":
        return ring(n)
    if k == "star":
        return star(n)
    if k == "complete":
        return complete(n)
    if k == "grid":
        return grid_2d(*_grid_shape(n, params.get("rows"), params.get("cols")))
    if k == "erdos_renyi":
        return erdos_renyi(n, params["p"], seed=seed, max_tries=params.get("max_tries", 1000))
    return random_geometric(n, params["radius"], seed=seed, max_tries=params.get("max_tries", 1000))
