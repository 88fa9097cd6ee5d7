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
import time

import numpy as np
import torch
import torch.distributed as dist

from ..exchange import make_exchange
from ..exchange.base import Exchange, ExchangeOutput
from ..exchange.codec import CodecRangeError
from ..errors import ConfigError
from ..penalties import PenaltySampler
from .comm import Comm, DistributedError
from .costs import RankLedger
from .layout import RankLayout

__all__ = ["HaloExchange", "SecAggHalo", "RankSampler", "HALO_KINDS", "TAG_U", "TAG_G", "TAG_MASKED"]

#: the exchange kinds made by :class:`HaloExchange` (``paillier``: :mod:`.secure`; ``secagg``: its
#: masked messages cross instead of the values, :class:`SecAggHalo`)
HALO_KINDS = ("plain", "quantized", "secagg")
TAG_U, TAG_G = 11, 12
#: the tag of exchange="secagg"'s masked messages
TAG_MASKED = 13


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

    def __new__(cls, spec=None, *args, **kwargs):
        # exchange="secagg" sends masked messages instead of the values: its own class, made here so
        # that every caller of HaloExchange gets it for that kind
        if cls is HaloExchange and getattr(spec, "kind", None) == "secagg":
            cls = SecAggHalo
        return super().__new__(cls)

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


class SecAggHalo(HaloExchange):
    """``exchange="secagg"`` across ranks (:class:`HaloExchange` makes one for that kind).

    The penalties of the cut edges cross as in the ``quantized`` halo (under the agreed schedule they
    are the trial's common draw, public to every agent); the values do not: each rank's agents send
    their neighbours on other ranks masked messages (:mod:`ppdnmf_torch.exchange.secagg.network`),
    one ``(P,)`` int64 row per cut edge, and each rank unmasks its own agents' sums. The seeds are
    agreed across the cut in :meth:`bind` (:class:`~.parties.SecAggRankParties`: the pair seeds of two
    neighbours of ``i`` through ``i``'s rank, which relays public keys only).

    Range: one process checks every receiver's sums against its neighbours' values before anything
    is masked; no rank sees its ghosts' values, so each checks its own agents against the public
    bound ``2 max|q_j| w d_max < limit`` (``w`` the common weight, ``d_max`` the graph's largest
    degree), which implies every check of one process; a value past it stops the run on that rank,
    naming the agent (the other ranks stop with a :class:`~.comm.DistributedError`).

    Costs: every rank counts its parties' messages and operations; :meth:`costs` sums them over the
    ranks (the single-process counters, the times summed too).
    """

    def __init__(self, spec, layout: RankLayout, comm: Comm):
        Exchange.__init__(self)
        if spec.record_transcript:
            raise ConfigError("exchange: record_transcript is a single-process tool (the privacy audit); a "
                              "distributed run's traffic is recorded per rank by Comm(record=True)")
        from ..exchange.secagg.ledger import SecAggLedger

        self._spec = spec
        self.name = "secagg"
        self.layout, self.comm = layout, comm
        self._codec = spec.codec()
        self._led = SecAggLedger(layout.n_agents)
        self.net = None
        self._block = self._last = None
        self._closed = False

    @property
    def codec(self):
        return self._codec

    @property
    def _ledger(self):
        return self._led

    def check_schedule(self, schedule: str, caps=None) -> None:
        from ..exchange.secagg.exchange import unequal_weights_message

        if schedule != "agreed":
            raise ConfigError(unequal_weights_message(f"penalty_schedule={schedule!r} draws a weight per edge"))

    def bind(self, topology, *, dtype, device, fuse=False):
        """The rank's parties and their seeds, agreed with the other ranks (new ones on every bind)."""
        if self._closed:
            raise RuntimeError("SecAggHalo: closed (its keys and seeds are gone); make a new exchange")
        from ..exchange.secagg.network import RowPlan
        from .parties import SecAggRankParties

        Exchange.bind(self, topology, dtype=dtype, device=device, fuse=fuse)
        lay = self.layout
        self._slots, self._ext_agents = lay.slots.to(device), lay.ext_of_agents.to(device)
        self._dummies, self._ext_edges = lay.dummy_slots.to(device), lay.ext_of_edges.to(device)
        self._peers = list(lay.peers)
        self._send_edges = {s: t.to(device) for s, t in lay.send_edges.items()}
        self._recv_edges = torch.cat([lay.recv_edges[s] for s in self._peers]).to(device) if self._peers else None
        self._block = self._last = None
        if self.net is not None:
            self.net.close()
        self.net = SecAggRankParties(lay, self.comm, self._led)
        self.net.agree()
        net = self.net
        agents = lay.agents.tolist()
        self._row = {a: k for k, a in enumerate(agents)}
        d_own = torch.tensor([max((len(net.nbrs[a]) for a in agents), default=0)], dtype=torch.int64)
        self._d_max = int(self.comm.all_reduce(d_own, category="setup", op=dist.ReduceOp.MAX,
                                               what="the largest degree (the public range bound)")[0])
        # the messages this rank's agents send (receiver, sender), increasing edge id; the cut's
        # ones go to the receiver's rank in that order, which is the order it expects them in
        self._out = [(x, y) for _, x, y in net.edges if y in net.own]
        receivers = [a for a in agents if net.nbrs[a]]
        self._rows = RowPlan(net.plan, self._out, receivers)
        self._send_of = {p: [k for k, (x, _) in enumerate(self._out) if net.owner[x] == p] for p in self._peers}
        local = [k for k, (x, _) in enumerate(self._out) if x in net.own]
        self._local_msgs = np.array(local, dtype=np.int64)
        slot = self._rows.slot
        if receivers:  # the messages to this rank's receivers: its own agents', then each peer's
            self._rows.incoming([slot[self._out[k][0]] for k in local]
                                + [slot[x] for p in self._peers for _, x, _ in net._cut(False, p)])
        self._n_in = {p: len(net._cut(False, p)) for p in self._peers}
        self._sender_rows = np.array([self._row[y] for _, y in self._out], dtype=np.int64)
        self._recv_rows = torch.tensor([self._row[r] for r in receivers], dtype=torch.int64)
        self._own_src = torch.tensor([e for e, a in enumerate(lay.ext_topology.src.tolist())
                                      if int(lay.ext_nodes[a]) in net.own], dtype=torch.int64)

    def close(self) -> None:
        if self.net is not None:
            self.net.close()
        self.net = None
        self._closed = True

    # -- step 1: the weights, from the penalty halo ------------------------------------------------
    def penalty_block(self, G, *, bcd_iter=0):
        return None

    def _weights(self, g_ext, bcd_iter, admm_iter):
        """``(w (D_ext,), rho_int (n_ext,))`` of the extended edges, the rank's receivers' weights checked equal."""
        from ..exchange.integer import encode_penalties, integer_penalty_sums
        from ..exchange.secagg.exchange import unequal_weights_message

        topo = self.layout.ext_topology
        _, w = self._call(encode_penalties, self._codec, topo, g_ext, bcd_iter=bcd_iter, admm_iter=admm_iter)
        dev = w.device
        own = self._own_src.to(dev)
        bad = w[own] != w[topo.crow.to(dev)[topo.src.to(dev)]][own]
        if bool(bad.any()):
            agent = int(self.layout.ext_nodes[topo.src[int(self._own_src[int(torch.nonzero(bad)[0, 0])])]])
            raise ConfigError(unequal_weights_message(
                f"agent {agent} (trial 0) at BCD iteration {bcd_iter}, ADMM iteration {admm_iter} has unequal "
                "weights gamma_ij gamma_ji across its neighbours"))
        return w, integer_penalty_sums(w, topo.src.to(dev), topo.n_nodes)

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        g_ext = self._penalties_ext(g, f"the penalty halo of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
        self._last = (g, g_ext)
        _, rho_int = self._weights(g_ext, bcd_iter, admm_iter)
        return self._local(self._codec.decode_rho(rho_int))

    # -- step 5 ----------------------------------------------------------------------------------
    def _check_range(self, q, w, bcd_iter, admm_iter) -> None:
        """The public bound (class docstring) on this rank's agents' values."""
        lim = self._codec.limit
        if not q.numel() or not w.numel():
            return
        mags = q.abs().amax(dim=1)
        bound = 2.0 * float(mags.max()) * float(w.max()) * self._d_max
        if bound < lim * (1 - 1e-9):
            return
        k = int(mags.argmax())
        agent = int(self.layout.agents[k])
        raise CodecRangeError(
            f"codec range: agent {agent} (trial 0) at BCD iteration {bcd_iter}, ADMM iteration {admm_iter}: across "
            f"ranks the masked sums are checked against the public bound 2 max|q_j| w d_max = {bound:.6g}, which "
            f"does not fit the limit {lim} (2^{lim.bit_length() - 1}); lower n_max or g_bits",
            trial=0, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=int(mags[k]), limit=lim)

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        if self.net is None:
            raise RuntimeError("SecAggHalo: call bind() before the first exchange" if not self._closed
                               else "SecAggHalo: closed (its keys and seeds are gone); make a new exchange")
        led = self._led
        led.begin(bcd_iter, admm_iter)
        g_ext = self._penalties_of(g, bcd_iter, admm_iter)
        w, rho_int = self._weights(g_ext, bcd_iter, admm_iter)
        try:
            q = self._codec.encode_values(U.index_select(0, self._slots), n_agents=max(1, self.layout.n_own),
                                          bcd_iter=bcd_iter, admm_iter=admm_iter).cpu()
        except CodecRangeError as exc:
            raise _rank_agent(exc, self.layout) from None
        self._check_range(q, w, bcd_iter, admm_iter)
        sums = self._masked_sums(q.numpy(), f"the masked messages of BCD iteration {bcd_iter}, ADMM iteration "
                                            f"{admm_iter}")
        t0 = time.perf_counter()
        ext = self._ext_agents.cpu()
        w_node = torch.zeros(self.layout.ext_topology.n_nodes, dtype=torch.int64)
        w_node[self.layout.ext_topology.src] = w.cpu()
        A = torch.zeros_like(q)
        if sums is not None:
            A[self._recv_rows] = torch.from_numpy(sums)
        S_int = w_node[ext][:, None] * A - rho_int.cpu()[ext][:, None] * q
        led.add("time_mask", time.perf_counter() - t0)
        S_loc, rho_loc = self._codec.decode(S_int.to(U.device), rho_int.to(U.device), dtype=U.dtype)
        S = out if out is not None else torch.empty_like(U)
        S.index_copy_(0, self._slots, S_loc.to(S.dtype))
        if self._dummies.numel():
            S.index_fill_(0, self._dummies, 0.0)
        return ExchangeOutput(S, self._local(rho_loc))

    def _masked_sums(self, q, what: str):
        """One round: this rank's agents' messages, the cut's across it, its receivers' sums."""
        led, rows, net = self._led, self._rows, self.net
        P = int(q.shape[1])
        rnd = net.plan.next_round()
        t0 = time.perf_counter()
        W = rows.keystreams(net.parties, rnd, P)
        t1 = time.perf_counter()
        M = rows.messages(q, self._sender_rows, W)
        t2 = time.perf_counter()
        sends = {p: torch.from_numpy(M[self._send_of[p]]) for p in self._peers}
        shapes = {p: (self._n_in[p], P) for p in self._peers}
        try:
            got = self.comm.swap(sends, shapes, torch.int64, category="crypto", what=what, tag=TAG_MASKED) \
                if self._peers else {}
        except DistributedError as exc:
            raise DistributedError(f"rank {self.comm.rank}: secagg round {rnd}: the masked messages of the "
                                   f"other ranks' agents did not all arrive, so this rank's sums cannot be unmasked "
                                   f"({exc})", failed_rank=exc.failed_rank) from None
        t3 = time.perf_counter()
        M_in = np.concatenate([M[self._local_msgs]] + [got[p].cpu().numpy() for p in self._peers])
        sums = rows.unmask(M_in, W) if rows.receivers else None
        t4 = time.perf_counter()
        led.add("time_prg", t1 - t0)
        led.add("time_mask", (t2 - t0) + (t4 - t3))
        led.add("prg_bytes", rows.n_streams * 16 * ((P + 1) // 2))
        led.add("messages", len(self._out))
        for r, j in self._out:
            led.add_edge_bytes(j, r, 8 * P)
        return sums

    # -- costs: counted per rank, summed across ranks ----------------------------------------------
    def _sum(self, rows: list, keys) -> list:
        t = torch.tensor([[float(r.get(k, 0)) for k in keys] for r in rows], dtype=torch.float64).reshape(-1, len(keys))
        t = self.comm.all_reduce(t, category="metrics", what="the sum of the cost counters").cpu()
        return [{k: (v if k.startswith("time_") else int(v)) for k, v in zip(keys, row.tolist())} for row in t]

    def costs(self) -> dict:
        keys = tuple(self._led.total)
        return self._sum([self._led.total], keys)[0]

    def pop_iteration_costs(self) -> list:
        records = self._led.pop()
        keys = tuple(k for k in self._led.keys if k not in self._led.ONCE)
        summed = self._sum(records, keys) if records else []
        return [dict(rec, **{k: v for k, v in s.items() if k in rec}) for rec, s in zip(records, summed)]

    def bytes_per_edge(self) -> dict:
        merged = {}
        for part in self.comm.all_gather_object(dict(self._led.edges), what="the per-edge byte counts"):
            for k, v in part.items():
                merged[k] = merged.get(k, 0) + v
        return merged

    def __repr__(self) -> str:
        return (f"SecAggHalo(rank={self.comm.rank}, agents={self.layout.n_own}"
                f"{', closed' if self._closed else ''})")


def _rank_agent(exc: CodecRangeError, layout: RankLayout) -> CodecRangeError:
    """A range error of the rank's ``k``-th agent (in :attr:`RankLayout.agents` order), with its global id."""
    if not 0 <= exc.agent < layout.n_own:
        return exc
    agent = int(layout.agents[exc.agent])
    text = str(exc).replace(f"agent {exc.agent} (trial {exc.trial})", f"agent {agent} (trial 0)", 1)
    return CodecRangeError(text, trial=0, agent=agent, bcd_iter=exc.bcd_iter, admm_iter=exc.admm_iter,
                           value=exc.value, limit=exc.limit)


def _global_agent(exc: CodecRangeError, layout: RankLayout) -> CodecRangeError:
    """``exc`` of the inner exchange (an extended node index) with the global agent id."""
    if not 0 <= exc.agent < layout.ext_nodes.numel():
        return exc
    agent = int(layout.ext_nodes[exc.agent])
    text = str(exc).replace(f"agent {exc.agent} (trial {exc.trial})", f"agent {agent} (trial {exc.trial})", 1)
    return CodecRangeError(text, trial=exc.trial, agent=agent, bcd_iter=exc.bcd_iter, admm_iter=exc.admm_iter,
                           value=exc.value, limit=exc.limit)
