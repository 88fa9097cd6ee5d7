"""A rank's local :class:`~ppdnmf_torch.models.ppdnmf.problem.Problem` (:func:`rank_problem`) on its
:class:`~ppdnmf_torch.distributed.layout.RankLayout` (the engine's: where the rank's agents sit in its
tensors, which edges it draws, whom it exchanges what with).

Same bits as one process: the layout keeps agent ``i`` in a slot ``s = i (mod p)``, ``p`` the
:func:`~ppdnmf_torch.distributed.layout.alignment_period` of PPDNMF's ``(L, K)`` and ``(K, K)``
blocks (the Cholesky inverse of eq. 13, ``eigh`` of ``Y Y^T`` and the products by ``(K, K)``
matrices round differently at different memory alignments); see the engine module.
"""
from __future__ import annotations

import torch

from ....graph import Graph
from ....graph.topology import Topology
from ....distributed.layout import RankLayout
from ..problem import Problem, padded_width

__all__ = ["rank_problem"]


def rank_problem(layout: RankLayout, graph: Graph, blocks: dict, caps: torch.Tensor, seed: int, *, width: int,
                 dtype, device, topology: Topology | None = None) -> Problem:
    """The rank's :class:`Problem`: its agents' blocks ``blocks[i] (L, M_i)`` (global id ``i``) in
    their slots, zero-padded to the single-process width ``padded_width(width)``, its caps
    ``caps (N,)`` (dummies: 1), and the single-process seed (the penalty stream).
    ``topology``: the solver's view of the rank's graph (a run's
    :class:`~.topology.RankTopology`); default :meth:`RankLayout.local_topology`."""
    L = next(iter(blocks.values())).shape[0]
    M = padded_width(width)
    n = layout.n_slots
    Z = torch.zeros((1, n, L, M), dtype=dtype)
    counts = torch.zeros((1, n), dtype=torch.int64)
    caps_p = torch.ones((1, n), dtype=torch.float64)
    for i, s in zip(layout.agents.tolist(), layout.slots.tolist()):
        b = blocks[i]
        Z[0, s, :, : b.shape[1]] = b
        counts[0, s] = b.shape[1]
        caps_p[0, s] = caps[i]
    topology = layout.local_topology(graph) if topology is None else topology
    problem = Problem(Z=Z.to(device), counts=counts.to(device), topology=topology.to(device),
                      caps=caps_p.to(device), seeds=[int(seed)], n_agents=n)
    # the Y-step's elementwise width is the widest agent's of the whole run, as in one process
    problem.width = int(width)
    return problem
