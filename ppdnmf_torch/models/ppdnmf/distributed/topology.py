"""The rank's graph as the solver sees it: :class:`RankTopology`, the edges out of the rank's
agents (to other ranks too), the stopping rule's flags across ranks and its decisions over
every rank's agents (:class:`FlagHalo`).

The solver reads its problem's topology for three things beyond the exchange (which has a
topology of its own, :attr:`~.layout.RankLayout.ext_topology`):

* the edges out of each agent, in CSR order: a stopped agent's penalty draws stay put
  (``active[src]``), and the adaptive schedule bounds an agent's cap by its degree
  (:func:`~ppdnmf_torch.models.ppdnmf.solver.schedule.adapt`): :class:`RankTopology` lists every edge
  out of the rank's agents, cut edges included, so both are the single-process ones;
* one hop of the stopping flags (Sec. II-C, :meth:`Topology.spread`): a flag crosses a cut
  edge as one byte per boundary agent and peer (:meth:`FlagHalo.extended`);
* whether any (every) agent's flag is set: the loops of every rank end at the same
  iteration, the one where the single process's would, so the rank asks the others
  (one ``int64`` sum over the ranks, :meth:`FlagHalo.count`). Dummy slots never count.
  The agreed penalty schedule's bit per BCD iteration is counted the same way
  (:meth:`FlagHalo.counts`, one all-reduce of one ``int64``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ....graph import Graph
from ....graph.topology import Topology
from ....distributed.comm import Comm
from ....distributed.layout import RankLayout

__all__ = ["FlagHalo", "RankTopology", "rank_topology", "TAG_FLAGS"]

TAG_FLAGS = 13


class FlagHalo:
    """A rank's stopping flags across ranks.

    Parameters
    ----------
    layout : RankLayout
    comm : Comm
    device : torch.device
    """

    def __init__(self, layout: RankLayout, comm: Comm, device):
        self.layout, self.comm = layout, comm
        self.device = torch.device(device)
        self.slots = layout.slots.to(self.device)
        self.ext_of_agents = layout.ext_of_agents.to(self.device)
        self.peers = list(layout.peers)
        self.send_rows = {s: t.to(self.device) for s, t in layout.send_rows.items()}
        self.recv_nodes = {s: t.to(self.device) for s, t in layout.recv_nodes.items()}

    def to(self, device) -> "FlagHalo":
        return self if torch.device(device) == self.device else FlagHalo(self.layout, self.comm, device)

    def extended(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags (n_slots,)`` bool -> ``(n_ext,)`` on the extended nodes: the agents' own and
        their ghosts' (from the peers, one ``uint8`` per boundary agent and peer)."""
        out = torch.zeros(self.layout.ext_nodes.numel(), dtype=torch.bool, device=flags.device)
        out[self.ext_of_agents] = flags[self.slots]
        if self.peers:
            sends = {s: flags[self.send_rows[s]].to(torch.uint8) for s in self.peers}
            shapes = {s: (self.layout.recv_nodes[s].numel(),) for s in self.peers}
            got = self.comm.swap(sends, shapes, torch.uint8, category="flags", what="the stopping rule's flags",
                                 tag=TAG_FLAGS)
            for s in self.peers:
                out[self.recv_nodes[s]] = got[s].to(flags.device).bool()
        return out

    def count(self, flags: torch.Tensor) -> int:
        """How many agents of every rank have their flag set in ``flags (..., n_slots)``."""
        own = flags.reshape(-1)[self.slots].sum().reshape(1).to(torch.int64)
        total = self.comm.all_reduce(own, category="flags", what="the stopping rule's decision")
        return int(total[0])

    def counts(self, flags: torch.Tensor, what: str) -> torch.Tensor:
        """How many agents of every rank have each flag set in ``flags (k, n_slots)``: one
        ``int64`` per flag, summed over the ranks in one all-reduce; ``(k,)`` on the CPU."""
        own = flags[:, self.slots].to(torch.int64).sum(-1).cpu()
        return self.comm.all_reduce(own, category="flags", what=what)


@dataclass(frozen=True)
class RankTopology(Topology):
    """The rank's graph on its slots (``n_agents = n_slots``, one trial): every directed edge
    out of its agents (:attr:`~.layout.RankLayout.edge_ids`, the rank's CSR order), so
    ``degree`` is each agent's whole degree. ``dst`` indexes the rank's extended nodes
    (:attr:`~.layout.RankLayout.ext_nodes`: agents and ghosts), ``rev`` the reverse edge
    among the rank's edges (-1 for a cut edge: its reverse is another rank's). The
    exchanges never read it (theirs is the layout's ``ext_topology``)."""

    halo: FlagHalo | None = field(default=None, compare=False, repr=False)

    def to(self, device) -> "RankTopology":
        return RankTopology(self.n_trials, self.n_agents, self.src.to(device), self.dst.to(device),
                            self.rev.to(device), self.crow.to(device), self.degree.to(device),
                            halo=None if self.halo is None else self.halo.to(device))

    def neighbour_matrix(self, values):
        raise NotImplementedError("RankTopology: a rank's neighbour sums are its exchange's (the halo)")

    def spread(self, flags: torch.Tensor) -> torch.Tensor:
        """One hop of the flags ``(n_slots,)`` over every edge, the cut ones included."""
        ext = self.halo.extended(flags)
        hit = torch.zeros_like(flags, dtype=torch.int32)
        hit.index_add_(0, self.src, ext[self.dst].to(torch.int32))
        return flags | (hit > 0)

    def any_set(self, flags: torch.Tensor) -> bool:
        return self.halo.count(flags) > 0

    def all_set(self, flags: torch.Tensor) -> bool:
        return self.halo.count(~flags) == 0

    def trial_counts(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags (k, 1, n_slots)`` -> ``(k, 1)``: each flag's count over every rank's agents
        (dummy slots never count)."""
        k = flags.shape[0]
        total = self.halo.counts(flags.reshape(k, -1), "the agreed penalty schedule's decision")
        return total.to(flags.device).reshape(k, 1)


def rank_topology(layout: RankLayout, graph: Graph, comm: Comm, device) -> RankTopology:
    """The :class:`RankTopology` of ``layout``'s rank, on ``device``."""
    src_g, dst_g = graph.src.numpy(), graph.dst.numpy()
    edges = layout.edge_ids.numpy()
    slot_of = np.full(graph.n_agents, -1, dtype=np.int64)
    slot_of[layout.agents.numpy()] = layout.slots.numpy()
    ext_of = np.full(graph.n_agents, -1, dtype=np.int64)
    ext_of[layout.ext_nodes.numpy()] = np.arange(layout.ext_nodes.numel())
    src = slot_of[src_g[edges]]
    dst = ext_of[dst_g[edges]]
    pos = np.full(src_g.size, -1, dtype=np.int64)
    pos[edges] = np.arange(edges.size)
    rev = pos[graph.rev.numpy()[edges]]
    n = layout.n_slots
    degree = np.bincount(src, minlength=n)
    crow = np.zeros(n + 1, dtype=np.int64)
    crow[1:] = np.cumsum(degree)
    t = [torch.as_tensor(a, device=device) for a in (src, dst, rev, crow, degree)]
    return RankTopology(1, n, *t, halo=FlagHalo(layout, comm, device))
