"""Which rank owns which agent: :class:`Partition`, made by :func:`partition_agents`.

A rank holds its agents' data blocks and states; every edge between agents of two ranks
is a *cut* edge, over which the halo exchange (:mod:`.halo`) carries the neighbour's
messages each ADMM iteration. Keeping neighbours together keeps the cut (and the halo)
small:

* ``"rcm"`` (default): a reverse Cuthill-McKee order of the graph
  (:func:`scipy.sparse.csgraph.reverse_cuthill_mckee`), which numbers neighbours close
  to each other, cut into ``P`` consecutive pieces of (nearly) equal size;
* ``"block"``: agents ``0 .. N-1`` in ``P`` consecutive ranges of (nearly) equal size (the
  graph's own numbering; the right choice when that numbering is local already, as on a
  ring or a grid);
* an explicit assignment, one rank per agent (a site's agents on its own rank).

Every rank owns at least one agent. The partition never changes the numbers: a run gives
the bits of the single-process run whatever the partition.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse
from scipy.sparse.csgraph import reverse_cuthill_mckee

from ..errors import ConfigError
from ..graph import Graph

__all__ = ["PARTITION_METHODS", "Partition", "partition_agents"]

#: how :func:`partition_agents` assigns agents to ranks when no assignment is given
PARTITION_METHODS = ("rcm", "block")


@dataclass(frozen=True)
class Partition:
    """The owner rank of every agent.

    Attributes
    ----------
    owner : tuple of int, length N
        ``owner[i]``: the rank that holds agent ``i``.
    world_size : int
        ``P``, the number of ranks.
    method : str
        ``"rcm"``, ``"block"`` or ``"given"``.
    cut_edges : int
        Undirected edges whose two agents sit on different ranks.
    """

    owner: tuple
    world_size: int
    method: str
    cut_edges: int

    @property
    def n_agents(self) -> int:
        return len(self.owner)

    def agents(self, rank: int) -> list[int]:
        """The agents of ``rank``, in increasing order."""
        return [i for i, r in enumerate(self.owner) if r == rank]

    def counts(self) -> list[int]:
        """Agents per rank."""
        return np.bincount(np.asarray(self.owner, dtype=np.int64), minlength=self.world_size).tolist()

    def summary(self) -> dict:
        """What ``summary.json`` records: method, cut size, agents per rank and the owners."""
        return {"method": self.method, "world_size": self.world_size, "cut_edges": self.cut_edges,
                "agents_per_rank": self.counts(), "owner": list(self.owner)}


def _cut(graph: Graph, owner: np.ndarray) -> int:
    src, dst = graph.src.numpy(), graph.dst.numpy()
    upper = src < dst
    return int((owner[src[upper]] != owner[dst[upper]]).sum())


def _pieces(order, n: int, world_size: int) -> np.ndarray:
    """``owner`` that gives the agents of ``order`` to the ranks in consecutive pieces, the
    first ``n mod P`` pieces one agent longer."""
    base, extra = divmod(n, world_size)
    sizes = [base + (1 if r < extra else 0) for r in range(world_size)]
    owner = np.empty(n, dtype=np.int64)
    owner[np.asarray(order, dtype=np.int64)] = np.repeat(np.arange(world_size), sizes)
    return owner


def partition_agents(graph: Graph, world_size: int, method: str = "rcm", assignment=None) -> Partition:
    """Assign the agents of ``graph`` to ``world_size`` ranks.

    Parameters
    ----------
    graph : Graph
    world_size : int
        ``P >= 1``, at most the number of agents (every rank owns an agent).
    method : {"rcm", "block"}
        How to assign when no ``assignment`` is given (see the module docstring).
    assignment : sequence of N ints, optional
        The rank of every agent, each in ``[0, P)``, every rank used.

    Raises
    ------
    ConfigError
        Naming ``world_size``, ``partition`` or ``assignment``.
    """
    n = graph.n_agents
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world_size: must be an integer >= 1, got {world_size!r}")
    if world_size > n:
        raise ConfigError(f"world_size: {world_size} ranks for {n} agents; every rank needs an agent")
    if assignment is not None:
        owner = np.asarray(list(assignment))
        if owner.shape != (n,) or not np.issubdtype(owner.dtype, np.integer):
            raise ConfigError(f"assignment: expected {n} integer ranks (one per agent), got {list(assignment)!r}")
        if owner.size and (owner.min() < 0 or owner.max() >= world_size):
            raise ConfigError(f"assignment: ranks must lie in [0, {world_size}), got {sorted(set(owner.tolist()))}")
        idle = sorted(set(range(world_size)) - set(owner.tolist()))
        if idle:
            raise ConfigError(f"assignment: ranks {idle} own no agent; every rank needs one")
        method = "given"
    elif method == "block":
        owner = _pieces(range(n), n, world_size)
    elif method == "rcm":
        src, dst = graph.src.numpy(), graph.dst.numpy()
        adj = scipy.sparse.csr_matrix((np.ones(src.size, dtype=np.int8), (src, dst)), shape=(n, n))
        owner = _pieces(reverse_cuthill_mckee(adj, symmetric_mode=True), n, world_size)
    else:
        raise ConfigError(f"partition: unknown method {method!r}; use one of {PARTITION_METHODS} "
                          "or give an assignment")
    owner = owner.astype(np.int64)
    return Partition(tuple(owner.tolist()), world_size, method, _cut(graph, owner))
