"""The graphs of a run laid out as one block-diagonal graph: :func:`block_diagonal` and
:class:`Topology`, the form the solver and the exchanges index with.

``T`` trials of ``N`` agents become ``A = T * N`` nodes (trial ``t``'s agent ``i`` is node
``t * N + i``), so every trial's neighbour sums are one sparse product.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .._utils import sparse_csr
from ..errors import GraphError
from .core import Graph

__all__ = ["block_diagonal", "Topology"]


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


@dataclass(frozen=True)
class Topology:
    """The communication graph(s) of a run, flattened to ``A = T * N`` nodes.

    Attributes
    ----------
    n_trials, n_agents : int
    src, dst : LongTensor (2E,)
        Directed edges ``i -> j`` sorted by ``(src, dst)`` (CSR order).
    rev : LongTensor (2E,)
        Index of the reverse edge ``j -> i``.
    crow : LongTensor (A + 1,)
        CSR row pointers of the adjacency matrix.
    degree : LongTensor (A,)
    """

    n_trials: int
    n_agents: int
    src: torch.Tensor
    dst: torch.Tensor
    rev: torch.Tensor
    crow: torch.Tensor
    degree: torch.Tensor

    @classmethod
    def from_graphs(cls, graphs, stride: int | None = None) -> "Topology":
        """The topology of ``T`` trials' graphs (same ``N``), laid out block-diagonally.

        ``stride`` nodes per trial (default ``N``): the extra ones are isolated padding.
        """
        graphs = list(graphs)
        n = graphs[0].n_agents if stride is None else int(stride)
        src, dst, rev, crow = block_diagonal(graphs, stride=n)
        T = len(graphs)
        return cls(T, n, src, dst, rev, crow, torch.bincount(src, minlength=T * n))

    @property
    def n_nodes(self) -> int:
        return self.n_trials * self.n_agents

    @property
    def n_directed_edges(self) -> int:
        return int(self.src.numel())

    def to(self, device) -> "Topology":
        return Topology(
            self.n_trials,
            self.n_agents,
            self.src.to(device),
            self.dst.to(device),
            self.rev.to(device),
            self.crow.to(device),
            self.degree.to(device),
        )

    def neighbour_matrix(self, values: torch.Tensor) -> torch.Tensor:
        """Sparse CSR matrix ``W (A, A)`` with ``W[i, j] = values[e]`` for edge ``e = i -> j``."""
        return sparse_csr(self.crow, self.dst, values, self.n_nodes)

    def spread(self, flags: torch.Tensor) -> torch.Tensor:
        """One hop of flag propagation: ``flags | any(flags of neighbours)``, shape ``(A,)``."""
        hit = torch.zeros_like(flags, dtype=torch.int32)
        hit.index_add_(0, self.src, flags[self.dst].to(torch.int32))
        return flags | (hit > 0)

    def any_set(self, flags: torch.Tensor) -> bool:
        """Whether any node's flag in ``flags`` is set: the stopping rule's decisions are taken
        over every agent (one process holds them all; a rank of a distributed run asks the
        others, :class:`ppdnmf_torch.models.ppdnmf.distributed.topology.RankTopology`)."""
        return bool(flags.any())

    def all_set(self, flags: torch.Tensor) -> bool:
        """Whether every node's flag in ``flags`` is set (see :meth:`any_set`)."""
        return bool(flags.all())

    def trial_counts(self, flags: torch.Tensor) -> torch.Tensor:
        """How many nodes of each trial have each flag set: ``flags (k, T, N)`` bool ->
        LongTensor ``(k, T)``, every trial's agents counted (the agreed penalty schedule's
        one-bit decisions, :func:`ppdnmf_torch.models.ppdnmf.solver.schedule.adapt_agreed`; a rank of a
        distributed run sums its count with the others')."""
        return flags.to(torch.int64).sum(-1)
