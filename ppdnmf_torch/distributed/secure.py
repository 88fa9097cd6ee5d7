"""``exchange="paillier"`` across ranks: :class:`SecureHalo`, the protocol's rounds with their
parties split over the ranks that own them (:mod:`.parties`: the parties, their keys and seeds,
the links across the cut).

Every round of :mod:`ppdnmf_torch.exchange.paillier` (its fast path) runs in three phases,
each on the rank of the party it belongs to:

1. the asking side, agent ``i``: its own encryptions (``E_i(-q_i)``; masked, ``E_i(gamma_ij)``
   and the shifted ``E_i(gamma_ij 2^{w t})``), one message per neighbour ``j``;
2. the answering side, neighbour ``j``: the replies under ``i``'s key, from ``j``'s values,
   ``j``'s penalties and (masked) ``j``'s mask units, one message back to ``i``;
3. agent ``i`` again: the homomorphic sums and their decryption.

Between two phases every rank sends the messages of its cut edges to the ranks at their
other ends, and nothing else (:meth:`~.parties.RankParties.forward`, ``backward``); messages
between two agents of one rank stay in memory. Every operation is counted by the rank that
performs it and every message by the rank that sends it; the ranks' counters are summed, so
the operation counts and the per-edge bytes equal the single-process run's, and the bytes a
rank sends for the rounds are the cost model's bytes of its cut edges
(:func:`~.costs.cut_protocol_bytes`).

The paper protocol leaves open how agent ``i`` learns ``rho_i`` (the simulation hands it over,
ALGORITHM.md); across ranks the simulation does the same: the integer penalties of the cut
edges cross in the clear (category ``penalty``), as the printed protocol presumes.

What no rank can check
----------------------
One process range-checks every agent's sums against its neighbours' values before anything
is encrypted. Here no rank sees a ghost's values: a rank checks its own agents' values against
the public bound ``2 max|q_i| max(w_max d_max, gamma_max) < limit`` (``gamma_max`` the largest
quantized cap, ``w_max`` the largest product of two neighbours' caps, ``d_max`` the largest
degree; the bound implies every check of one process) and the ranks agree on it once per ADMM
iteration. It is looser than one process's exact checks only
for iterates far beyond the preflight's headroom; a value past it stops every rank, with the
agent named on its own rank.
"""
from __future__ import annotations

import dataclasses

import gmpy2
import torch
import torch.distributed as dist
from gmpy2 import mpz

from ..errors import ConfigError
from ..exchange.base import Exchange, ExchangeOutput
from ..exchange.codec import CodecRangeError
from ..exchange.costmodel import (COUNT_KEYS, SETUP_KEYS, TIME_KEYS, add_estimates, ciphertext_nbytes,
                                  estimate_seconds, public_key_nbytes)
from ..exchange.packing import derive_layout
from ..exchange.paillier.exchange import warn_if_insecure
from ..exchange.paillier.keys import EncryptedVector, check_key_bits
from ..exchange.paillier.masked import value_blocks, value_cores
from ..exchange.paillier.rounds import packed_reply
from ..exchange.paillier.obfuscation import HoldsPrivateKey, default_djn_exponent_bits
from .comm import Comm, DistributedError
from .parties import RankParties

__all__ = ["SecureHalo"]


class SecureHalo(HoldsPrivateKey, Exchange):
    """A rank's ``paillier`` exchange: its agents' parts of every round (module docstring).

    Parameters
    ----------
    spec : PaillierSpec
        The run's exchange (the fast path; ``record_transcript`` is a single-process tool).
    layout : RankLayout
    comm : Comm
    graph : Graph
        The whole graph (every rank knows it: the protocol's structure is public).
    owner : sequence of int
        The rank of every agent.
    caps : Tensor (N,)
        The largest penalty caps ``g_i`` the run can reach (public), for the range bound.
    """

    name = "paillier"

    def __init__(self, spec, layout, comm: Comm, graph, owner, caps):
        super().__init__()
        # the keys handed in (tests) are checked on every rank alike; the rank keeps its own
        # agents' pairs only, until bind moves them into the agents, and the spec none
        self._own_keys = _own_keypairs(spec.keypairs, layout.agents.tolist(), graph.n_agents, spec.key_bits)
        self._generates_keys = spec.keypairs is None  # the cost model prices the key generation only then
        self._spec = dataclasses.replace(spec, keypairs=None)
        spec = self._spec
        self.codec = spec.codec()
        self.protocol = spec.protocol
        self.layout_rank, self.comm = layout, comm
        self.djn_bits = (spec.djn_exponent_bits or default_djn_exponent_bits(self.codec.key_bits)) if spec.djn else None
        warn_if_insecure(self.codec.key_bits, self.djn_bits)
        self.layout = derive_layout(self.codec, packing=spec.packing, slot_bits=spec.slot_bits)
        self._layout1 = derive_layout(self.codec, packing=False)
        self._graph, self._owner = graph, [int(o) for o in owner]
        gcap = [int(v) for v in torch.round(torch.as_tensor(caps, dtype=torch.float64) * self.codec.penalty_scale)]
        src, dst = graph.src.tolist(), graph.dst.tolist()
        w_max = max((gcap[a] * gcap[b] for a, b in zip(src, dst)), default=0)
        d_max = int(graph.degree.max()) if graph.degree.numel() else 0
        # |S_int_i|, |A_i| <= 2 max|q| w_max d_max; a paper reply weighed by gamma_ij = 0 still
        # holds gamma_ji |q_j - q_i| <= 2 max|q| gamma_max
        self._bound_factor = 2 * max(w_max * d_max, max(gcap, default=0))
        self.net = None
        self._calibrated = self._last = self._c = None
        self._closed = False

    @property
    def spec(self):
        return self._spec

    @property
    def _ledger(self):
        """The rank's cost ledger (what the base class checkpoints and resumes)."""
        return None if self.net is None else self.net.ledger

    # -- lifecycle -----------------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        """Make this rank's parties (:class:`~.parties.RankParties`: its key pairs, the ghosts'
        public keys and, masked, the seeds agreed with the other ranks)."""
        if self._closed:
            raise RuntimeError("SecureHalo: closed (its keys are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        if self.net is not None:
            self.net.close()
        keys, self._own_keys = self._own_keys, None
        self.net = RankParties(self._spec, self.codec, self.layout_rank, self.comm, self._graph, self._owner,
                               djn_bits=self.djn_bits, masked=self.protocol == "masked", keypairs=keys)
        del keys
        self._last = self._c = None

    def close(self) -> None:
        """Drop every agent and with it every private key and seed; stop the worker pool."""
        if self.net is not None:
            self.net.close()
        self._own_keys = None
        self._closed = True

    def _check_ready(self):
        if self._closed:
            raise RuntimeError("SecureHalo: closed (its keys are gone); make a new exchange")
        if self.net is None:
            raise RuntimeError("SecureHalo: call bind() before the first exchange")

    # -- the rounds' parts ---------------------------------------------------------------------
    def _requests(self, qh: dict, C: int, reply_demand: dict):
        """Lines 10-11 on this rank: ``E_i(-q_i)`` of its agents (packed); also the public-key
        obfuscators of its replies (``reply_demand``: per key)."""
        P, led, lay = self.net.parties, self.net.ledger, self.layout
        with led.timed("time_encrypt"):
            own = {i: P[i].own_obfuscators(C) for i in self.net.senders}
            demand = dict(reply_demand)
            for i in self.net.senders:
                if own[i] is None:
                    demand[i] = demand.get(i, 0) + C
            obf = self.net.obfuscators(demand)
            requests = {}
            for i in self.net.senders:
                ag = P[i]
                mine = own[i]
                if mine is None:
                    mine, obf[i] = obf[i][:C], obf[i][C:]
                plain = lay.pack([-v for v in qh[i]], ag.n)
                requests[i] = [(1 + ag.n * m) * r % ag.nsquare for m, r in zip(plain, mine)]
            led.add("encryptions", C * len(self.net.senders))
        return requests, obf

    def _replies(self, req_of: dict, qh: dict, gam: dict, obf: dict, C: int) -> dict:
        """Lines 13-14 at this rank's neighbours: ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji}`` times a
        fresh obfuscator, for every edge into this rank's agents."""
        g, P, led, lay = self.net.g, self.net.parties, self.net.ledger, self.layout
        packed = {j: lay.pack_signed(qh[j]) for j in self.net.agents if j in qh}
        out = {}
        with led.timed("time_homomorphic"):
            for e in self.net.in_edges:
                i, j = g.src[e], g.dst[e]
                fresh, obf[i] = obf[i][:C], obf[i][C:]
                out[e] = packed_reply(P[i].n, P[i].nsquare, packed[j], req_of[e], gam[g.rev[e]], fresh)
            D = len(self.net.in_edges)
            led.add("encryptions", C * D)
            led.add("homomorphic_additions", C * D)
            led.add("scalar_multiplications", C * D)
        return out

    def _requests_everywhere(self, requests: dict, C: int, what: str) -> dict:
        """``E_i(-q_i)`` for every edge into this rank's agents (sent across the cut)."""
        g = self.net.g
        CT = ciphertext_nbytes(self.codec.key_bits)
        got = self.net.forward({e: requests[g.src[e]] for e in self.net.out_edges}, C, CT, what)
        return {e: (requests[g.src[e]] if self.net.mine(g.src[e]) else got[e]) for e in self.net.in_edges}

    def _replies_everywhere(self, replies: dict, C: int, what: str) -> dict:
        """The replies to every edge out of this rank's agents: its own, and those of the other
        ranks' neighbours (sent across the cut; counted here for the edges into its agents)."""
        g = self.net.g
        CT = ciphertext_nbytes(self.codec.key_bits)
        self.net.account(self.net.in_edges, reply=True, nbytes=C * CT)
        got = self.net.backward(replies, C, CT, what)
        return {e: (replies[e] if self.net.mine(g.dst[e]) else got[e]) for e in self.net.out_edges}

    # -- step 1 -------------------------------------------------------------------------------
    def _gammas(self, g) -> dict:
        """This rank's integer penalties ``gamma_ij``, by global edge id."""
        gamma = self.codec.encode_penalties(g.reshape(-1))
        if gamma.numel() and int(gamma.min()) < 0:  # exponents of scalar multiplications
            raise ValueError("SecureHalo: penalties must be nonnegative (a negative one has no scalar multiplication)")
        return dict(zip(self.layout_rank.edge_ids.tolist(), gamma.cpu().tolist()))

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        """``rho_i`` of this rank's agents, on its slots ``(n_slots,)``."""
        self._check_ready()
        self.net.ledger.begin(bcd_iter, admm_iter)
        gam = self._gammas(g)
        what = f"step 1 of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}"
        if self.protocol == "paper":
            rho_int = self._handed_rho(gam, what)
        else:
            rho_int = self._penalty_round(gam, bcd_iter, admm_iter, what)
        return self._on_slots(self.codec.decode_rho(rho_int), g.device)

    def _penalty_round(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        """Step 1's encrypted round (``masked`` or ``aggregated``); its ``rho_int`` is kept for step 5
        while the penalties stay the same."""
        rho_int = (self._masked_penalty(gam, bcd_iter, admm_iter, what) if self.protocol == "masked"
                   else self._aggregated_penalty(gam, bcd_iter, admm_iter, what))
        self._last = (gam, rho_int)
        return rho_int

    def _handed_rho(self, gam: dict, what: str) -> torch.Tensor:
        """The paper protocol's ``rho_int_i``, handed over by the simulation (module docstring)."""
        g = self.net.g
        # the cut edges' penalties in the clear (gamma >= 0: unsigned 8-byte words)
        net = self.net
        got = net.swap_items({s: [[gam[e]] for e in net.out_cross[s]] for s in net.peers}, net.in_cross, 1, 8,
                             what + " (the simulation's penalties)", category="penalty")
        rho = []
        for i in self.net.agents:
            total = 0
            for e in self.net.out_of[i]:
                r = g.rev[e]
                total += gam[e] * (gam[r] if r in gam else int(got[r][0]))
            rho.append(total)
        return torch.tensor(rho, dtype=torch.int64)

    def _aggregated_penalty(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        """The aggregated protocol's step 1 on this rank
        (:meth:`~ppdnmf_torch.exchange.paillier.rounds.Rounds.penalty_round`): ``kp_i`` out,
        ``E_i(gamma_ji)`` back, ``i`` raises, multiplies and decrypts ``rho_int_i``; ``(n_own,)``."""
        g, P, led = self.net.g, self.net.parties, self.net.ledger
        kb = self.codec.key_bits
        B = public_key_nbytes(kb)
        # i -> j: kp_i
        keys = self.net.forward({e: [P[g.src[e]].n] for e in self.net.out_edges}, 1, B, what + " (public keys)")
        self.net.check_keys(keys, what)
        self.net.account(self.net.out_edges, reply=False, nbytes=B)
        with led.timed("time_encrypt"):  # j: E_i(gamma_ji)
            demand = self.net.reply_demand(1)
            obf = self.net.obfuscators(demand)
            replies = {}
            for e in self.net.in_edges:
                i = g.src[e]
                ag = P[i]
                replies[e] = [(1 + ag.n * (gam[g.rev[e]] % ag.n)) * obf[i].pop() % ag.nsquare]
            led.add("encryptions", len(self.net.in_edges))
        back = self._replies_everywhere(replies, 1, what)
        with led.timed("time_homomorphic"):  # i: E_i(gamma_ij gamma_ji), multiplied
            terms = {e: [gmpy2.powmod(back[e][0], mpz(gam[e]), P[g.src[e]].nsquare)] for e in self.net.out_edges}
            acc = self.net.product(terms)
            led.add("scalar_multiplications", len(self.net.out_edges))
            led.add("homomorphic_additions", len(self.net.out_edges) - len(acc))
        return self.net.decrypt(acc, self._layout1, 1, bcd_iter, admm_iter)[:, 0]

    def _masked_penalty(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        """The masked protocol's step 1 on this rank (:class:`~ppdnmf_torch.exchange.paillier.masked.FastMasked`):
        ``E_i(gamma_ij)`` out, ``E_i(gamma_ij)^{gamma_ji}`` times ``j``'s mask units back, ``i``
        multiplies, strips its edge units and decrypts ``rho_int_i``; ``(n_own,)``."""
        g, P, led, plan = self.net.g, self.net.parties, self.net.ledger, self.net.plan
        CT = ciphertext_nbytes(self.codec.key_bits)
        fresh_for = self.net.designated_here()
        with led.timed("time_encrypt"):
            own = {i: P[i].own_obfuscators(len(self.net.out_of[i])) for i in self.net.senders}
            demand = {i: 1 for i in fresh_for}
            for i in self.net.senders:
                if own[i] is None:
                    demand[i] = demand.get(i, 0) + len(self.net.out_of[i])
            obf = self.net.obfuscators(demand)
            fresh = {i: obf[i].pop() for i in fresh_for}
            c = {}
            for i in self.net.senders:
                ag = P[i]
                mine = own[i] if own[i] is not None else obf[i]
                for e in self.net.out_of[i]:
                    c[e] = (1 + ag.n * (gam[e] % ag.n)) * mine.pop() % ag.nsquare  # i: E_i(gamma_ij)
            led.add("encryptions", len(self.net.out_edges) + len(fresh_for))
        self.net.account(self.net.out_edges, reply=False, nbytes=CT)
        c.update({e: v[0] for e, v in self.net.forward({e: [c[e]] for e in self.net.out_edges}, 1, CT,
                                                      what + " (E_i(gamma_ij))").items()})
        rnd = plan.next_round()
        with led.timed("time_homomorphic"):  # j: E_i(gamma_ij)^{gamma_ji}, masked
            replies = {}
            for e in self.net.in_edges:
                i, j = g.src[e], g.dst[e]
                t = gmpy2.powmod(c[e], mpz(gam[g.rev[e]]), P[i].nsquare)
                replies[e] = self.net.mask(e, rnd, [t], [fresh[i]] if plan.designated[i] == j else None)
            led.add("scalar_multiplications", len(self.net.in_edges))
        back = self._replies_everywhere(replies, 1, what)
        with led.timed("time_homomorphic"):
            acc = self.net.product(back, rnd)
            led.add("homomorphic_additions", len(self.net.out_edges) - len(acc))
        self._c = c
        return self.net.decrypt(acc, self._layout1, 1, bcd_iter, admm_iter)[:, 0]

    # -- step 5 -------------------------------------------------------------------------------
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        """``S_i`` and ``rho_i`` of this rank's agents through the encrypted protocol, on its slots."""
        self._check_ready()
        self.net.ledger.begin(bcd_iter, admm_iter)
        lr = self.layout_rank
        slots = lr.slots.to(U.device)
        try:
            q = self.codec.encode_values(U.index_select(0, slots), n_agents=max(1, len(self.net.agents)),
                                         bcd_iter=bcd_iter, admm_iter=admm_iter)
        except CodecRangeError as exc:
            raise _named(exc, self.net.agents) from None
        gam = self._gammas(g)
        what = f"step 5 of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}"
        P = int(q.shape[1])
        rerun = self._agree_on_round(q, gam, bcd_iter, admm_iter)
        with self.net.ledger.timed("time_transfer"):
            rows = q.cpu().tolist()
        qh = dict(zip(self.net.agents, rows))
        if self.protocol == "paper":
            S_int = self._paper_round(qh, gam, P, bcd_iter, admm_iter, what)
            rho_int = self._handed_rho(gam, what)
        else:
            rho_int = self._penalty_round(gam, bcd_iter, admm_iter, what) if rerun else self._last[1]
            if self.protocol == "masked":
                A = self._masked_values(qh, gam, P, bcd_iter, admm_iter, what)
                S_int = A - rho_int[:, None] * q.cpu()
            else:
                S_int = self._aggregated_values(qh, gam, P, bcd_iter, admm_iter, what)
        S_loc, rho_loc = self.codec.decode(S_int.to(U.device), rho_int.to(U.device), dtype=U.dtype)
        S = out if out is not None else torch.empty_like(U)
        S.zero_()
        S.index_copy_(0, slots, S_loc.to(S.dtype))
        return ExchangeOutput(S, self._on_slots(rho_loc, U.device))

    def _agree_on_round(self, q, gam: dict, bcd_iter, admm_iter) -> bool:
        """One collective per ADMM iteration: whether step 1 must run again (some rank's penalties
        changed since it ran) and whether every rank's values are inside the public range bound."""
        lim = min(self.layout.limit, self.codec.limit)
        qmax = int(q.abs().max()) if q.numel() else 0
        bound = qmax * self._bound_factor
        bad = bound >= lim
        changed = self.protocol != "paper" and (self._last is None or self._last[0] != gam)
        flags = torch.tensor([int(changed), (self.comm.rank + 1) if bad else 0], dtype=torch.int64)
        flags = self.comm.all_reduce(flags, category="metrics", op=dist.ReduceOp.MAX,
                                     what=f"the range check of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
        failed = int(flags[1]) - 1
        if bad:
            row = int(q.abs().amax(dim=1).argmax())
            raise CodecRangeError(
                f"codec range: agent {self.net.agents[row]} (trial 0) at BCD iteration {bcd_iter}, ADMM iteration "
                f"{admm_iter}: across ranks the protocol's sums are checked against the public bound "
                f"2 max|q_i| max(gamma_max^2 d_max, gamma_max) = {bound:.6g}, which does not fit "
                f"the limit {lim} (2^{lim.bit_length() - 1}); lower n_max, or use larger keys",
                trial=0, agent=self.net.agents[row], bcd_iter=bcd_iter, admm_iter=admm_iter, value=qmax, limit=lim)
        if failed >= 0:
            raise DistributedError(f"rank {self.comm.rank}: stopped at BCD iteration {bcd_iter}, ADMM iteration "
                                   f"{admm_iter}: rank {failed} holds a value outside the protocol's range",
                                   failed_rank=failed)
        return bool(int(flags[0]))

    def _aggregated_values(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        """The aggregated protocol's step 5 on this rank: ``E_i(-q_i)`` out, the replies back, ``i``
        raises each to ``gamma_ij``, multiplies and decrypts ``S_int_i``; ``(n_own, P)``."""
        g, Pa, led = self.net.g, self.net.parties, self.net.ledger
        C = self.layout.n_ciphertexts(P)
        CT = ciphertext_nbytes(self.codec.key_bits)
        demand = self.net.reply_demand(C)
        requests, obf = self._requests(qh, C, demand)
        self.net.account(self.net.out_edges, reply=False, nbytes=C * CT)
        req_of = self._requests_everywhere(requests, C, what + " (E_i(-q_i))")
        replies = self._replies(req_of, qh, gam, obf, C)
        back = self._replies_everywhere(replies, C, what)
        with led.timed("time_homomorphic"):  # i raises each reply to its own gamma_ij
            terms = {e: gmpy2.powmod_base_list(back[e], mpz(gam[e]), Pa[g.src[e]].nsquare) for e in self.net.out_edges}
            acc = self.net.product(terms)
            led.add("scalar_multiplications", C * len(self.net.out_edges))
            led.add("homomorphic_additions", C * (len(self.net.out_edges) - len(acc)))
        return self.net.decrypt(acc, self.layout, P, bcd_iter, admm_iter)

    def _paper_round(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        """Lines 10-16 as printed, on this rank: ``E_i(-q_i)`` and ``kp_i`` out, the replies back,
        ``i`` decrypts each on its own and weighs it by ``gamma_ij``; ``S_int (n_own, P)``."""
        g, Pa, led = self.net.g, self.net.parties, self.net.ledger
        C = self.layout.n_ciphertexts(P)
        kb = self.codec.key_bits
        CT, B = ciphertext_nbytes(kb), public_key_nbytes(kb)
        demand = self.net.reply_demand(C)
        requests, obf = self._requests(qh, C, demand)
        # i -> j: E_i(-q_i) and kp_i
        self.net.account(self.net.out_edges, reply=False, nbytes=C * CT + B)
        keys = self.net.forward({e: [Pa[g.src[e]].n] for e in self.net.out_edges}, 1, B, what + " (public keys)")
        self.net.check_keys(keys, what)
        req_of = self._requests_everywhere(requests, C, what + " (E_i(-q_i))")
        replies = self._replies(req_of, qh, gam, obf, C)
        back = self._replies_everywhere(replies, C, what)
        rows = []
        for i in self.net.agents:  # i decrypts every reply on its own and weighs it (lines 15-16)
            total = [0] * P
            ag = Pa[i]
            for e in self.net.out_of[i]:
                with led.timed("time_decrypt"):
                    d = ag.decrypt_packed(EncryptedVector(ag.public_key, back[e]), self.layout, P,
                                          bcd_iter=bcd_iter, admm_iter=admm_iter)
                    led.add("decryptions", len(back[e]))
                total = [t + gam[e] * v for t, v in zip(total, d)]
            rows.append(total)
        return torch.tensor(rows, dtype=torch.int64).reshape(len(self.net.agents), P)

    def _masked_values(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        """The masked protocol's step 5 on this rank: the shifted ``E_i(gamma_ij 2^{w t})`` out, per
        packed block ``E_i(rho_ij M(q_j, b))`` times ``j``'s mask units back, ``i`` multiplies,
        strips and decrypts ``A_i``; ``(n_own, P)``."""
        g, Pa, led, plan, lay = self.net.g, self.net.parties, self.net.ledger, self.net.plan, self.layout
        S, C = lay.slots, lay.n_ciphertexts(P)
        used = min(S, P)
        CT = ciphertext_nbytes(self.codec.key_bits)
        c = self._c
        with led.timed("time_homomorphic"):  # i: its shifted encryptions E_i(gamma_ij 2^{w t})
            bases = {}
            for i in self.net.senders:
                es = self.net.out_of[i]
                for e, row in zip(es, Pa[i].shifted([c[e] for e in es], lay.slot_bits, used)):
                    bases[e] = row
            led.add("scalar_multiplications", len(self.net.out_edges) * (used - 1))
        fresh_for = self.net.designated_here()
        with led.timed("time_encrypt"):
            fresh = self.net.obfuscators({i: C for i in fresh_for})
            led.add("encryptions", C * len(fresh_for))
        if used > 1:
            self.net.account(self.net.out_edges, reply=False, nbytes=(used - 1) * CT)
        got = self.net.forward({e: bases[e][1:] for e in self.net.out_edges}, used - 1, CT, what + " (shifted)") \
            if used > 1 else {}
        for e in self.net.in_edges:
            if e not in bases:
                bases[e] = [c[e]] + list(got.get(e, []))
        blocks = {j: value_blocks(qh[j], S) for j in self.net.agents}
        rnd = plan.next_round()
        with led.timed("time_homomorphic"):
            replies = {}
            for e in self.net.in_edges:  # j: per block, prod_t (B_t^{gamma_ji})^{q_t}, masked
                i, j = g.src[e], g.dst[e]
                cores = value_cores(bases[e], gam[g.rev[e]], blocks[j], Pa[i].nsquare)
                replies[e] = self.net.mask(e, rnd, cores, fresh[i] if plan.designated[i] == j else None)
            D = len(self.net.in_edges)
            led.add("scalar_multiplications", D * P)
            led.add("homomorphic_additions", D * (P - C))
        back = self._replies_everywhere(replies, C, what)
        with led.timed("time_homomorphic"):
            acc = self.net.product(back, rnd)
            led.add("homomorphic_additions", (len(self.net.out_edges) - len(acc)) * C)
        return self.net.decrypt(acc, lay, P, bcd_iter, admm_iter)

    # -- results on the rank's slots -------------------------------------------------------------
    def _on_slots(self, values, device) -> torch.Tensor:
        """``values (n_own,)`` of the rank's agents on its slots ``(n_slots,)``; dummies 0."""
        out = torch.zeros(self.layout_rank.n_slots, dtype=values.dtype, device=device)
        out[self.layout_rank.slots.to(device)] = values.to(device)
        return out

    # -- costs: counted per rank, summed across ranks ----------------------------------------------
    def _sum(self, rows: list, keys) -> list:
        """``rows`` (counter dicts) summed over the ranks, key by key (float64: exact below 2^53)."""
        t = torch.tensor([[float(r.get(k, 0)) for k in keys] for r in rows], dtype=torch.float64).reshape(-1, len(keys))
        t = self.comm.all_reduce(t, category="metrics", what="the sum of the cost counters").cpu()
        return [{k: (v if k.startswith("time_") else int(v)) for k, v in zip(keys, row.tolist())} for row in t]

    def _op_costs(self):
        """The cost model's per-operation seconds: given, or calibrated once on rank 0 and shared."""
        cm = self._spec.cost_model
        if cm is False:
            return None
        if cm is True:
            if self._calibrated is None:  # calibrated on rank 0 and shared: one set for the run
                oc = None
                if self.comm.rank == 0:
                    from ..exchange.paillier.exchange import calibrate_for

                    oc = calibrate_for(self._spec)
                self._calibrated = self.comm.broadcast_object(oc, 0, what="the calibration of the cost model")
            return self._calibrated
        return cm

    def costs(self) -> dict:
        """The run's counters (every rank's, summed), ``key_pairs`` and times (summed over ranks)."""
        masked = self.protocol == "masked"
        keys = COUNT_KEYS + TIME_KEYS + ((SETUP_KEYS + ("time_setup",)) if masked else ())
        out = self._sum([self.net.ledger.total], keys)[0]
        out["key_pairs"] = self.net.g.n_nodes
        return add_estimates(out, self._op_costs(), setup=masked, generates_keys=self._generates_keys)

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration records since the last call, every rank's counts summed."""
        records = self.net.ledger.pop()
        keys = COUNT_KEYS + TIME_KEYS
        summed = self._sum(records, keys) if records else []
        oc = self._op_costs()
        out = []
        for rec, s in zip(records, summed):
            rec = dict(rec, **{k: v for k, v in s.items() if k in rec})
            if oc is not None:
                rec["estimated_seconds"] = estimate_seconds(rec, oc)
            out.append(rec)
        return out

    def bytes_per_edge(self) -> dict:
        """Bytes sent ``"i->j"`` over the run, every rank's (an edge's two directions may be counted
        on two ranks)."""
        merged = {}
        for part in self.comm.all_gather_object(dict(self.net.ledger.edges), what="the per-edge byte counts"):
            for k, v in part.items():
                merged[k] = merged.get(k, 0) + v
        return merged

    def __repr__(self) -> str:
        agents = 0 if self.net is None else len(self.net.agents)
        return (f"SecureHalo(protocol={self.protocol!r}, key_bits={self.codec.key_bits}, rank={self.comm.rank}, "
                f"agents={agents}{', closed' if self._closed else ''})")


def _named(exc: CodecRangeError, agents: list) -> CodecRangeError:
    """A range error of the rank's ``k``-th agent, with its global id."""
    if not 0 <= exc.agent < len(agents):
        return exc
    agent = agents[exc.agent]
    text = str(exc).replace(f"agent {exc.agent} (trial {exc.trial})", f"agent {agent} (trial 0)", 1)
    return CodecRangeError(text, trial=0, agent=agent, bcd_iter=exc.bcd_iter, admm_iter=exc.admm_iter,
                           value=exc.value, limit=exc.limit)


def _own_keypairs(keypairs, agents: list, n_agents: int, key_bits: int):
    """The pairs of ``agents`` among ``keypairs`` (one per agent of the run, in agent order),
    after the checks :func:`~ppdnmf_torch.exchange.paillier.keys.make_agents` makes: every rank
    runs them on the whole list, so that every rank refuses the same list."""
    if keypairs is None:
        return None
    check_key_bits(key_bits)
    if len(keypairs) < n_agents:
        raise ConfigError(f"keypairs: {len(keypairs)} key pairs for {n_agents} agents; need one per agent")
    moduli = [pk.n for pk, _ in keypairs[:n_agents]]
    if any(m.bit_length() != key_bits for m in moduli):
        raise ConfigError(f"keypairs: every public key must have a {key_bits}-bit modulus (key_bits={key_bits})")
    if len(set(moduli)) != n_agents:
        raise ConfigError("keypairs: every agent needs its own key pair; got duplicates")
    return {i: keypairs[i] for i in agents}
