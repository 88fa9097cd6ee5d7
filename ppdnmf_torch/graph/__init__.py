"""Communication graphs of the agents: validation, generators and CSR edge tensors.

A :class:`Graph` is an undirected, connected, loop-free, unweighted graph on the
agents ``0 .. N-1`` that carries the directed edge tensors (CSR order) the
batched solvers index with.

* :mod:`.core`: :class:`Graph` and its validation (:func:`validate_graph`);
* :mod:`.io`: :func:`from_adjacency` (dense, sparse, networkx) and :func:`from_edge_list`;
* :mod:`.generators`: :func:`random_connected` (the paper's graph), :func:`ring`,
  :func:`star`, :func:`complete`, :func:`grid_2d`, :func:`erdos_renyi`,
  :func:`random_geometric`, and :func:`make_graph` by name with the parameter
  table :data:`GRAPH_PARAMS`;
* :mod:`.topology`: :func:`block_diagonal` and :class:`Topology`, the graphs of a
  run's trials laid out as one.

Only torch and the standard library are used here.
"""
from .core import Graph, check_min_degree, validate_graph
from .generators import (
    GRAPH_ALIASES,
    GRAPH_KINDS,
    GRAPH_PARAMS,
    GRAPH_REQUIRED,
    complete,
    erdos_renyi,
    grid_2d,
    make_graph,
    random_connected,
    random_geometric,
    ring,
    star,
)
from .io import from_adjacency, from_edge_list
from .topology import Topology, block_diagonal

__all__ = [
    "Graph",
    "validate_graph",
    "check_min_degree",
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
    "Topology",
    "GRAPH_KINDS",
    "GRAPH_PARAMS",
    "GRAPH_REQUIRED",
    "GRAPH_ALIASES",
]
