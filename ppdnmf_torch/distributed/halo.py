"""The halo exchange: :class:`HaloExchange` runs a rank's step 1 and step 5 of the consensus
ADMM's X-step (ALGORITHM.md) with its neighbours on other ranks, then the run's own exchange
kind on the rank's extended nodes. Model-free: PPDNMF's ranks
(:mod:`ppdnmf_torch.models.ppdnmf.distributed`) and symmetric NMF's
(:mod:`ppdnmf_torch.models.symnmf.distributed`) use it alike.

Per ADMM iteration a rank sends each peer rank

* the ``U_i`` rows of its agents with a neighbour there (the *halo*; ``(b, L K)`` in ``U``'s
  dtype), and
* the penalties ``g_{i->j}`` of its edges into that rank (``rho_ij = g_{i->j} g_{j->i}`` needs
  both directions): once per X-step for the kinds whose step 1 is no protocol round
  (``plain``: the whole X-step's draws, ``(x_iters, e)``), per ADMM iteration otherwise
  (``quantized``).

Then the wrapped kind (``plain``, ``quantized``) computes ``S_i`` and ``rho_i`` on the
extended nodes (:class:`~.layout.RankLayout`), the same terms in the same order as in one
process, and the rank keeps its agents' rows. ``paillier`` sends no value and no penalty in
the clear: it has a cross-rank protocol of its own (:mod:`.secure`: ciphertexts and public keys
as byte messages, :meth:`~.comm.Comm.swap_bytes`).

:class:`RankSampler` draws the single-process penalty stream and keeps the rank's edges:
the seeding contract of :mod:`ppdnmf_torch.penalties` is one generator per trial over all
edges, so every rank draws the whole block (``x_iters x 2E`` uniforms per BCD iteration)
and each edge gets its single-process draw. A deployment would draw each agent's
penalties from its own generator instead.
"""
from __future__ import annotations

import dataclasses

import torch

from ..exchange import make_exchange
from ..exchange.base import Exchange, ExchangeOutput
from ..exchange.codec import CodecRangeError
from ..penalties import PenaltySampler
from .comm import Comm
from .costs import RankLedger
from .layout import RankLayout

__all__ = ["HaloExchange", "RankSampler", "HALO_KINDS", "TAG_U", "TAG_G"]

#: the exchange kinds whose halo carries tensors (``paillier``: :mod:`.secure`)
HALO_KINDS = ("plain", "quantized")
TAG_U, TAG_G = 11, 12


class RankSampler(PenaltySampler):
    """The single-process penalty draws of the rank's edges (:attr:`RankLayout.edge_ids`).

    Parameters
    ----------
    caps : Tensor (n_slots,) float64
        The cap ``g_i`` of each slot's agent (:meth:`set_caps` takes new ones the same way:
        ``penalty_schedule="adaptive"``).
    src : LongTensor (D,)
        The slot of each of the rank's edges' source agent (:class:`~.topology.RankTopology`'s ``src``).
    edge_ids : LongTensor (D,)
    n_edges : int
        ``2E``, the directed edges of the whole graph (one trial).
    seed, mode, x_iters, shared
        As the single-process sampler's.
    """

    def __init__(self, caps, src, edge_ids, n_edges: int, seed: int, mode: str, x_iters: int, shared: bool = False):
        super().__init__(caps, src, [int(n_edges)], [int(seed)], mode, x_iters, shared=shared)
        self._keep = edge_ids.cpu()

    def begin_bcd_iteration(self) -> None:
        super().begin_bcd_iteration()
        if self._block_host is not None:
            self._block_host = self._block_host[:, self._keep].contiguous()


def _is_default(obj, name: str) -> bool:
    return getattr(type(obj), name) is getattr(Exchange, name)


class HaloExchange(Exchange):
    """A rank's exchange: the halo across ranks, then ``inner`` on the extended nodes.

    Parameters
    ----------
    spec : ExchangeSpec
        The run's exchange (``plain`` or ``quantized``); the inner exchange is made from it
        (with its cost counting done here, per rank, and summed across ranks).
    layout : RankLayout
    comm : Comm
    """

    def __init__(self, spec, layout: RankLayout, comm: Comm):
        super().__init__()
        self._spec = spec
        counting = getattr(spec, "cost_model", False)
        inner_spec = dataclasses.replace(spec, cost_model=False) if counting is not False else spec
        self.inner = make_exchange(inner_spec)
        self.name = self.inner.name
        self.layout, self.comm = layout, comm
        self._ledger = RankLedger(layout, spec, comm) if counting is not False else None
        self._block = self._last = None

    @property
    def spec(self):
        return self._spec

    @property
    def codec(self):
        return getattr(self.inner, "codec", None)

    def bind(self, topology, *, dtype, device, fuse=False):
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        lay = self.layout
        self.inner.bind(lay.ext_topology, dtype=dtype, device=device, fuse=fuse)
        self._slots = lay.slots.to(device)
        self._ext_agents = lay.ext_of_agents.to(device)
        self._dummies = lay.dummy_slots.to(device)
        self._ext_edges = lay.ext_of_edges.to(device)
        self._peers = list(lay.peers)
        self._send_rows = {s: t.to(device) for s, t in lay.send_rows.items()}
        self._recv_nodes = torch.cat([lay.recv_nodes[s] for s in self._peers]).to(device) if self._peers else None
        self._send_edges = {s: t.to(device) for s, t in lay.send_edges.items()}
        self._recv_edges = torch.cat([lay.recv_edges[s] for s in self._peers]).to(device) if self._peers else None
        self._block = self._last = None
        if self._ledger is not None:
            self._ledger.bind()

    # -- the halo ------------------------------------------------------------------------
    def _penalties_ext(self, g, what: str):
        """``g (..., D)`` of the rank's edges -> ``(..., D_ext)`` of its extended edges, the
        reverse-edge penalties from the peers."""
        lead = tuple(g.shape[:-1])
        out = torch.zeros(lead + (self.layout.ext_edge_ids.numel(),), dtype=g.dtype, device=g.device)
        out[..., self._ext_edges] = g
        if self._peers:
            sends = {s: g[..., self._send_edges[s]] for s in self._peers}
            shapes = {s: lead + (self.layout.recv_edges[s].numel(),) for s in self._peers}
            got = self.comm.swap(sends, shapes, g.dtype, category="penalty", what=what, tag=TAG_G)
            out[..., self._recv_edges] = torch.cat([got[s] for s in self._peers], dim=-1)
        return out

    def _values_ext(self, U, what: str):
        """``U (A, C)`` on the rank's slots -> ``(n_ext, C)`` on its extended nodes."""
        out = torch.empty((self.layout.ext_nodes.numel(),) + tuple(U.shape[1:]), dtype=U.dtype, device=U.device)
        out[self._ext_agents] = U[self._slots]
        if self._peers:
            sends = {s: U[self._send_rows[s]] for s in self._peers}
            shapes = {s: (self.layout.recv_nodes[s].numel(),) + tuple(U.shape[1:]) for s in self._peers}
            got = self.comm.swap(sends, shapes, U.dtype, category="halo", what=what, tag=TAG_U)
            out[self._recv_nodes] = torch.cat([got[s] for s in self._peers])
        return out

    def _local(self, t_ext):
        """``(..., n_ext)`` -> ``(..., n_slots)``: the agents' entries; dummies 0."""
        out = torch.zeros(tuple(t_ext.shape[:-1]) + (self.layout.n_slots,), dtype=t_ext.dtype, device=t_ext.device)
        out[..., self._slots] = t_ext[..., self._ext_agents]
        return out

    def _call(self, fn, *args, **kw):
        """``fn`` of the inner exchange; its range errors name the global agent."""
        try:
            return fn(*args, **kw)
        except CodecRangeError as exc:
            raise _global_agent(exc, self.layout) from None

    # -- the interface ---------------------------------------------------------------------
    def penalty_block(self, G, *, bcd_iter=0):
        if _is_default(self.inner, "penalty_block"):
            return None
        G_ext = self._penalties_ext(G, f"the penalty halo of BCD iteration {bcd_iter}")
        rho = self._call(self.inner.penalty_block, G_ext, bcd_iter=bcd_iter)
        if rho is None:
            return None
        self._block = (G, G_ext)
        return self._local(rho)

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        g_ext = self._penalties_ext(g, f"the penalty halo of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
        self._last = (g, g_ext)
        rho = self._call(self.inner.penalty_sums, g_ext, bcd_iter=bcd_iter, admm_iter=admm_iter)
        if self._ledger is not None:
            self._ledger.penalty_round(g, bcd_iter, admm_iter)
        return self._local(rho)

    def _penalties_of(self, g, bcd_iter, admm_iter):
        blk = self._block
        if blk is not None and g._base is blk[0]:
            return blk[1][admm_iter - 1]
        if self._last is not None and self._last[0] is g:
            return self._last[1]
        return self._penalties_ext(g, f"the penalty halo of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        g_ext = self._penalties_of(g, bcd_iter, admm_iter)
        U_ext = self._values_ext(U, f"the halo of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
        res = self._call(self.inner.exchange, U_ext, g_ext, bcd_iter=bcd_iter, admm_iter=admm_iter)
        if self._ledger is not None:
            self._ledger.exchange_round(g, bcd_iter, admm_iter, int(U.shape[1]) if U.dim() > 1 else 1)
        S = out if out is not None else torch.empty_like(U)
        S.index_copy_(0, self._slots, res.S[self._ext_agents].to(S.dtype))
        if self._dummies.numel():
            S.index_fill_(0, self._dummies, 0.0)
        return ExchangeOutput(S, self._local(res.rho))

    # -- costs: counted per rank, summed across ranks ----------------------------------------
    def costs(self) -> dict:
        return {} if self._ledger is None else self._ledger.costs()

    def pop_iteration_costs(self) -> list:
        return [] if self._ledger is None else self._ledger.pop()

    def bytes_per_edge(self) -> dict:
        return {} if self._ledger is None else self._ledger.bytes_per_edge()

    def close(self) -> None:
        self.inner.close()


def _global_agent(exc: CodecRangeError, layout: RankLayout) -> CodecRangeError:
    """``exc`` of the inner exchange (an extended node index) with the global agent id."""
    if not 0 <= exc.agent < layout.ext_nodes.numel():
        return exc
    agent = int(layout.ext_nodes[exc.agent])
    text = str(exc).replace(f"agent {exc.agent} (trial {exc.trial})", f"agent {agent} (trial {exc.trial})", 1)
    return CodecRangeError(text, trial=exc.trial, agent=agent, bcd_iter=exc.bcd_iter, admm_iter=exc.admm_iter,
                           value=exc.value, limit=exc.limit)
