"""One rank's share of a run over ranks: :class:`RankLayout` (where its agents sit in its
tensors, which edges it draws, whom it exchanges what with). Model-free: a model builds its
rank's local problem on it (PPDNMF: :func:`ppdnmf_torch.models.ppdnmf.distributed.layout.rank_problem`;
symmetric NMF: :mod:`ppdnmf_torch.models.symnmf.distributed`).

Same bits as one process
------------------------
A solver that computes every agent alone (batched products that do not mix agents,
reductions over each agent's block) gives a rank that runs the same operations on its
agents their bits, with one caveat the batched trials know too
(:func:`ppdnmf_torch.models.ppdnmf.problem.build_problem`): small BLAS/LAPACK kernels (a
Cholesky inverse, ``eigh``, products by ``(K, K)`` matrices) round differently at
different memory alignments of their operands. Agent ``i``'s blocks of ``b`` elements
start ``i * b`` elements into the single-process tensors, so a rank puts agent ``i`` in a
*slot* ``s`` with ``s = i (mod p)``, ``p`` the smallest count of agents whose blocks fill
whole 64-byte lines (:func:`block_period`; PPDNMF's ``(L, K)`` and ``(K, K)`` blocks:
:func:`alignment_period`; ``p = 1`` when the blocks do already), and its slot count ``= N (mod p)``
(the X-step's per-iteration blocks of ``E diag(d) E^T`` then line up too). The free slots
are isolated dummy agents (``Z = 0``, no edges, left out of every metric). Agent ``i`` of
residue class ``c = i mod p`` takes the slot ``c + p k`` for its place ``k`` in its class,
so the dummies are about ``p`` times the imbalance of the classes, not one per agent.

The neighbour sums are computed by the run's exchange kind on the rank's *extended*
nodes: its agents and their neighbours on other ranks (ghosts), numbered in increasing
global order, with the directed edges that touch one of its agents, in the graph's CSR
order. Row ``i`` of the plain kind's sparse product then adds the same terms in the same
order as in one process; the integer kinds' sums are exact anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..graph import Graph
from ..graph.topology import Topology
from .partition import Partition

__all__ = ["ALIGN_BYTES", "block_period", "alignment_period", "RankLayout", "gather_agents"]

#: the byte boundary an agent's blocks keep across ranks (PPDNMF's ``TRIAL_ALIGN_BYTES``)
ALIGN_BYTES = 64


def block_period(sizes, itemsize: int, align: int = ALIGN_BYTES) -> int:
    """The smallest ``p >= 1`` for which ``p`` agents' blocks of ``sizes`` elements each (one
    entry per per-agent tensor) fill whole ``align``-byte lines."""
    p = 1
    while any((p * int(b) * itemsize) % align for b in sizes):
        p += 1
    return p


def alignment_period(L: int, K: int, itemsize: int, align: int = ALIGN_BYTES) -> int:
    """The smallest ``p >= 1`` for which ``p`` agents' ``(L, K)`` and ``(K, K)`` blocks fill whole
    ``align``-byte lines (PPDNMF's blocks)."""
    return block_period((L * K, K * K), itemsize, align)


def _t(a) -> torch.Tensor:
    return torch.as_tensor(np.asarray(a, dtype=np.int64))


@dataclass
class RankLayout:
    """Rank ``rank``'s agents, slots, edges and halo (index tensors on the CPU; see the module
    docstring). Global ids are the single-process agent and directed-edge numbers.

    Attributes
    ----------
    agents : LongTensor (n_own,)
        The rank's agents, increasing.
    slots : LongTensor (n_own,)
        The slot of each of them in the rank's tensors; ``n_slots`` slots in all.
    edge_ids : LongTensor (D,)
        The global ids of the directed edges out of the rank's agents, in the rank's CSR
        order (by slot, then by neighbour): its penalty draws ``g (D,)``.
    ext_nodes : LongTensor (n_ext,)
        The extended nodes (agents and ghosts), increasing global ids.
    ext_of_agents : LongTensor (n_own,)
        The extended index of each agent.
    ext_edge_ids : LongTensor (D_ext,)
        The directed edges with an end among the agents, increasing global ids.
    ext_of_edges : LongTensor (D,)
        The extended index of each of the rank's edges.
    peers : list of int
        The ranks that own a neighbour of one of this rank's agents.
    send_rows, recv_nodes : dict peer -> LongTensor
        Slots of the agents whose messages go to ``peer`` (increasing global id), and the
        extended indices of ``peer``'s agents whose messages come back (the same order on
        both sides).
    send_edges, recv_edges : dict peer -> LongTensor
        The rank's edges to ``peer``'s agents (indices into ``g``), and the extended indices
        of ``peer``'s edges to this rank's agents: the reverse-edge penalties
        ``g_{j->i}`` that ``rho_ij = g_{i->j} g_{j->i}`` needs.
    """

    rank: int
    world_size: int
    n_agents: int
    period: int
    agents: torch.Tensor
    slots: torch.Tensor
    n_slots: int
    edge_ids: torch.Tensor
    ext_nodes: torch.Tensor
    ext_of_agents: torch.Tensor
    ext_edge_ids: torch.Tensor
    ext_of_edges: torch.Tensor
    ext_topology: Topology
    peers: list
    send_rows: dict
    recv_nodes: dict
    send_edges: dict
    recv_edges: dict

    @property
    def n_own(self) -> int:
        return int(self.agents.numel())

    @property
    def dummy_slots(self) -> torch.Tensor:
        """The slots that hold no agent."""
        mask = torch.ones(self.n_slots, dtype=torch.bool)
        mask[self.slots] = False
        return torch.nonzero(mask).flatten()

    @classmethod
    def build(cls, partition: Partition, graph: Graph, rank: int, *, L: int = 1, K: int = 1, itemsize: int = 8,
              period: int | None = None) -> "RankLayout":
        """The layout of ``rank`` for a run of ``K`` factors of ``L`` rows in ``itemsize``-byte
        floats (PPDNMF's blocks, :func:`alignment_period`), or for agents whose blocks repeat
        every ``period`` agents (another model's, :func:`block_period`)."""
        owner = np.asarray(partition.owner, dtype=np.int64)
        N = graph.n_agents
        src, dst, rev = graph.src.numpy(), graph.dst.numpy(), graph.rev.numpy()
        mine = owner == rank
        agents = np.nonzero(mine)[0]
        p = alignment_period(L, K, itemsize) if period is None else int(period)
        if p < 1:
            raise ValueError(f"RankLayout.build: period must be >= 1, got {p}")
        slots = np.empty(agents.size, dtype=np.int64)
        for c in range(p):
            members = agents % p == c
            slots[members] = c + p * np.arange(int(members.sum()))
        n_slots = int(slots.max()) + 1 if slots.size else 0
        n_slots += (N - n_slots) % p
        slot_of = np.full(N, -1, dtype=np.int64)
        slot_of[agents] = slots
        # the rank's edges, in its CSR order
        out = np.nonzero(mine[src])[0]
        edge_ids = out[np.lexsort((dst[out], slot_of[src[out]]))]
        # the extended nodes and edges, in global order
        ext_nodes = np.unique(np.concatenate([agents, dst[out]]))
        ext_of = np.full(N, -1, dtype=np.int64)
        ext_of[ext_nodes] = np.arange(ext_nodes.size)
        ext_edges = np.nonzero(mine[src] | mine[dst])[0]
        pos_of_edge = np.full(src.size, -1, dtype=np.int64)
        pos_of_edge[ext_edges] = np.arange(ext_edges.size)
        e_src, e_dst = ext_of[src[ext_edges]], ext_of[dst[ext_edges]]
        n_ext = int(ext_nodes.size)
        degree = np.bincount(e_src, minlength=n_ext)
        crow = np.zeros(n_ext + 1, dtype=np.int64)
        crow[1:] = np.cumsum(degree)
        ext_topology = Topology(1, n_ext, _t(e_src), _t(e_dst), _t(pos_of_edge[rev[ext_edges]]), _t(crow), _t(degree))
        # the halo: whom this rank exchanges what with, in global order on both sides
        peers = sorted(set(owner[ext_nodes].tolist()) - {rank})
        local_pos = np.full(src.size, -1, dtype=np.int64)
        local_pos[edge_ids] = np.arange(edge_ids.size)
        send_rows, recv_nodes, send_edges, recv_edges = {}, {}, {}, {}
        for s in peers:
            to_s = out[owner[dst[out]] == s]  # increasing global edge id
            send_rows[s] = _t(slot_of[np.unique(src[to_s])])
            recv_nodes[s] = _t(ext_of[ext_nodes[owner[ext_nodes] == s]])
            send_edges[s] = _t(local_pos[to_s])
            from_s = ext_edges[(owner[src[ext_edges]] == s)]
            recv_edges[s] = _t(pos_of_edge[from_s])
        return cls(rank, partition.world_size, N, p, _t(agents), _t(slots), n_slots, _t(edge_ids), _t(ext_nodes),
                   _t(ext_of[agents]), _t(ext_edges), _t(pos_of_edge[edge_ids]), ext_topology, peers, send_rows,
                   recv_nodes, send_edges, recv_edges)

    def local_topology(self, graph: Graph) -> Topology:
        """The graph among the rank's own agents, on its slots (PPDNMF's local problem's topology;
        the edges to other ranks are the halo's)."""
        src, dst = graph.src.numpy(), graph.dst.numpy()
        slot_of = np.full(graph.n_agents, -1, dtype=np.int64)
        slot_of[self.agents.numpy()] = self.slots.numpy()
        inner = np.nonzero((slot_of[src] >= 0) & (slot_of[dst] >= 0))[0]
        s, d = slot_of[src[inner]], slot_of[dst[inner]]
        order = np.lexsort((d, s))
        s, d = s[order], d[order]
        key = s * max(1, self.n_slots) + d
        rev = np.searchsorted(key, d * max(1, self.n_slots) + s)
        degree = np.bincount(s, minlength=self.n_slots)
        crow = np.zeros(self.n_slots + 1, dtype=np.int64)
        crow[1:] = np.cumsum(degree)
        return Topology(1, self.n_slots, _t(s), _t(d), _t(rev), _t(crow), _t(degree))

    def edge_src(self, graph: Graph) -> torch.Tensor:
        """The slot of the source agent of each of the rank's edges (:attr:`edge_ids`), ``(D,)``:
        a :class:`~.halo.RankSampler`'s ``src``."""
        slot_of = np.full(graph.n_agents, -1, dtype=np.int64)
        slot_of[self.agents.numpy()] = self.slots.numpy()
        return _t(slot_of[graph.src.numpy()[self.edge_ids.numpy()]])

    def summary(self) -> dict:
        """Sizes of this rank's share: agents, slots (dummies included), edges, ghosts, peers."""
        return {"rank": self.rank, "agents": self.n_own, "slots": self.n_slots, "period": self.period,
                "edges": int(self.edge_ids.numel()), "ghosts": int(self.ext_nodes.numel()) - self.n_own,
                "peers": list(self.peers)}


TAG_GATHER = 21


def gather_agents(comm, layout: RankLayout, t: torch.Tensor, counts: list, agents_of, *, what: str,
                  category: str = "output"):
    """Rank 0: ``(T, N, ...)`` with every rank's agents' rows of ``t (T, n_slots, ...)`` in their
    global places; other ranks: None (they send theirs). ``counts[r]`` and ``agents_of(r)``:
    each rank's agent count and agents."""
    own = t[:, layout.slots.to(t.device)]
    if comm.rank != 0:
        comm.send(own, 0, category=category, what=what, tag=TAG_GATHER)
        return None
    T, N = t.shape[0], layout.n_agents
    out = torch.empty((T, N) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
    out[:, layout.agents.to(t.device)] = own
    for r in range(1, comm.world_size):
        got = comm.recv((T, counts[r]) + tuple(t.shape[2:]), t.dtype, r, what=what, tag=TAG_GATHER)
        out[:, torch.as_tensor(agents_of(r), device=t.device)] = got
    return out
