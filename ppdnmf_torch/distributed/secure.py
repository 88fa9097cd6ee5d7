"""``exchange="paillier"`` across ranks: :class:`SecureHalo`, the protocol's parties split over
the ranks that own them.

A rank *is* the parties it owns: its agents' key pairs are generated on it and never leave
it, nor do their mask seeds; the other ranks' agents it talks to (its *ghosts*) are public
keys. Every round of :mod:`ppdnmf_torch.exchange.paillier` (its fast path) runs in three
phases, each on the rank of the party it belongs to:

1. the asking side, agent ``i``: its own encryptions (``E_i(-q_i)``; masked, ``E_i(gamma_ij)``
   and the shifted ``E_i(gamma_ij 2^{w t})``), one message per neighbour ``j``;
2. the answering side, neighbour ``j``: the replies under ``i``'s key, from ``j``'s values,
   ``j``'s penalties and (masked) ``j``'s mask units, one message back to ``i``;
3. agent ``i`` again: the homomorphic sums and their decryption.

Between two phases every rank sends the messages of its cut edges to the ranks at their
other ends, and nothing else: ciphertexts and public keys as fixed-width big-endian integers
in one ``uint8`` tensor per peer rank (:meth:`~.comm.Comm.swap_bytes`), the cut edges in
increasing global edge id (both ends know the list, so no message carries an index). Messages
between two agents of one rank stay in memory. Every message is accounted as in one process,
per rank (:class:`~ppdnmf_torch.exchange.costmodel.CostLedger`, by the rank of the party that
does the work or sends), and the ranks' counters are summed: the operation counts and the
per-edge bytes equal the single-process run's, and the bytes a rank sends for the rounds are
the cost model's bytes of its cut edges (:func:`~.costs.cut_protocol_bytes`).

The masked protocol's seed agreement runs the same way, once, in :meth:`SecureHalo.bind`: the
public keys over every edge; per agent ``i`` and pair ``j < k`` of its neighbours ``i`` relays
``kp_k`` to ``j``, ``j`` draws the seed and sends it under ``kp_k`` to ``i``, ``i`` relays it to
``k``; per edge the smaller end draws the edge seed and sends it to the larger. Up to three
ranks take part in one pair seed; only ciphertexts and public keys cross.

The paper protocol leaves open how agent ``i`` learns ``rho_i`` (the simulation hands it over,
ALGORITHM.md); across ranks the simulation does the same: the integer penalties of the cut
edges cross in the clear (category ``penalty``), as the printed protocol presumes.

What no rank can check
----------------------
One process range-checks every agent's sums against its neighbours' values before anything
is encrypted. Here no rank sees a ghost's values: a rank checks its own agents' values against
the public bound ``2 max|q_i| gamma_max^2 d_max < limit`` (``gamma_max`` the largest quantized
cap, ``d_max`` the largest degree; the bound implies every check of one process) and the
ranks agree on one bit per ADMM iteration. It is looser than one process's exact checks only
for iterates far beyond the preflight's headroom; a value past it stops every rank with the
agent named on its own rank.
"""
from __future__ import annotations

import os
import warnings

import gmpy2
import torch
import torch.distributed as dist
from gmpy2 import mpz

from ..errors import ConfigError
from ..exchange.base import Exchange, ExchangeOutput
from ..exchange.codec import CodecRangeError
from ..exchange.costmodel import (COUNT_KEYS, SETUP_KEYS, TIME_KEYS, CostLedger, ciphertext_nbytes, estimate_seconds,
                                  public_key_nbytes, seed_chunks, setup_seconds)
from ..exchange.packing import derive_layout
from ..exchange.paillier.exchange import _warn_if_insecure
from ..exchange.paillier.keys import EncryptedVector, RawPaillier, _Agent, check_key_bits, generate_keypair
from ..exchange.paillier.masked import MaskPlan
from ..exchange.paillier.multiexp import signed_multi_exps
from ..exchange.paillier.obfuscation import HoldsPrivateKey, default_djn_exponent_bits, public_obfuscators
from ..exchange.paillier.pool import ObfuscatorSupply, WorkerPool, resolve_workers
from .comm import Comm, DistributedError

__all__ = ["SecureHalo", "TAG_CRYPTO"]

#: the tags of the protocol's byte messages (lengths, payload)
TAG_CRYPTO = 21


class _PublicKey:
    """A ghost's public key: its modulus (what crossed the rank boundary)."""

    __slots__ = ("n",)

    def __init__(self, n):
        self.n = int(n)

    def __eq__(self, other):
        return isinstance(other, _PublicKey) and other.n == self.n

    def __hash__(self):
        return hash(self.n)


class _Ghost:
    """An agent of another rank, as this rank knows it: node id and public key."""

    __slots__ = ("node", "public_key", "n", "nsquare")

    def __init__(self, node: int, n):
        self.node = int(node)
        self.public_key = _PublicKey(n)
        self.n = mpz(n)
        self.nsquare = self.n * self.n


def _to_bytes(values, width: int) -> bytes:
    return b"".join(int(v).to_bytes(width, "big") for v in values)


def _from_bytes(buf: bytes, width: int) -> list:
    return [mpz(int.from_bytes(buf[k:k + width], "big")) for k in range(0, len(buf), width)]


def _blocks(values, slots: int) -> list:
    return [values[s:s + slots] for s in range(0, len(values), slots)]


class _Graph:
    """The global directed edges as Python lists (what :class:`MaskPlan` reads)."""

    def __init__(self, graph):
        self.n_nodes = graph.n_agents
        self.src, self.dst, self.rev = graph.src.tolist(), graph.dst.tolist(), graph.rev.tolist()


class SecureHalo(HoldsPrivateKey, Exchange):
    """A rank's ``paillier`` exchange: its agents' parties of every round (module docstring).

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
        The penalty caps ``g_i`` (public), for the range bound.
    """

    name = "paillier"

    def __init__(self, spec, layout, comm: Comm, graph, owner, caps):
        super().__init__()
        self._spec = spec
        self.codec = spec.codec()
        self.protocol = spec.protocol
        self.layout_rank, self.comm = layout, comm
        self.djn_bits = (spec.djn_exponent_bits or default_djn_exponent_bits(self.codec.key_bits)) if spec.djn else None
        _warn_if_insecure(self.codec.key_bits, self.djn_bits)
        self.layout = derive_layout(self.codec, packing=spec.packing, slot_bits=spec.slot_bits)
        self._layout1 = derive_layout(self.codec, packing=False)
        self._g = _Graph(graph)
        self._owner = [int(o) for o in owner]
        gcap = [int(v) for v in torch.round(torch.as_tensor(caps, dtype=torch.float64) * self.codec.penalty_scale)]
        g = self._g
        self._w_max = max((gcap[a] * gcap[b] for a, b in zip(g.src, g.dst)), default=0)
        self._d_max = int(graph.degree.max()) if graph.degree.numel() else 0
        self._ledger = None
        self._parties: dict = {}
        self._supply = self._pool = None
        self._calibrated = self._last = self._c = None
        self._closed = False

    @property
    def spec(self):
        return self._spec

    # -- structure ------------------------------------------------------------------------
    def _mine(self, node: int) -> bool:
        return self._owner[node] == self.comm.rank

    def _structure(self) -> None:
        g, r = self._g, self.comm.rank
        own = self._owner
        self.peers = list(self.layout_rank.peers)
        self.agents = self.layout_rank.agents.tolist()
        self.out_edges = [e for e, i in enumerate(g.src) if own[i] == r]
        self.in_edges = [e for e, j in enumerate(g.dst) if own[j] == r]
        self.out_of = {i: [] for i in self.agents}
        for e in self.out_edges:
            self.out_of[g.src[e]].append(e)
        self.senders = [i for i in self.agents if self.out_of[i]]
        self.out_cross = {s: [e for e in self.out_edges if own[g.dst[e]] == s] for s in self.peers}
        self.in_cross = {s: [e for e in self.in_edges if own[g.src[e]] == s] for s in self.peers}

    # -- the wire ----------------------------------------------------------------------------
    def _swap_items(self, sends: dict, expect: dict, count: int, width: int, what: str,
                    category: str = "crypto") -> dict:
        """Per peer ``s``: ``sends[s]``, a list of value lists, goes out as one byte message;
        back come ``count`` values for each key of ``expect[s]``; returns ``{key: values}``."""
        if not self.peers:
            return {}
        payload = {s: _to_bytes([v for vals in sends.get(s, ()) for v in vals], width) for s in self.peers}
        got = self.comm.swap_bytes(payload, self.peers, category=category, what=what, tag=TAG_CRYPTO)
        out = {}
        for s in self.peers:
            vals = _from_bytes(got[s].numpy().tobytes(), width)
            keys = expect.get(s, ())
            if len(vals) != count * len(keys):
                raise DistributedError(f"rank {self.comm.rank}: {what}: rank {s} sent {len(vals)} values, the "
                                       f"protocol expects {count * len(keys)}")
            for k, key in enumerate(keys):
                out[key] = vals[k * count:(k + 1) * count]
        return out

    def _forward(self, msgs: dict, count: int, width: int, what: str, category: str = "crypto") -> dict:
        """``i -> j`` over the cut edges (``msgs[e]`` for this rank's out-edges): the messages of
        the other ranks' agents to this rank's, by edge."""
        sends = {s: [msgs[e] for e in self.out_cross[s]] for s in self.peers}
        return self._swap_items(sends, self.in_cross, count, width, what, category)

    def _backward(self, msgs: dict, count: int, width: int, what: str) -> dict:
        """``j -> i`` over the cut edges (``msgs[e]`` for this rank's in-edges)."""
        sends = {s: [msgs[e] for e in self.in_cross[s]] for s in self.peers}
        return self._swap_items(sends, self.out_cross, count, width, what)

    def _account(self, edges, *, reply: bool, nbytes: int, setup: bool = False) -> None:
        g, led = self._g, self._ledger
        for e in edges:
            a, b = (g.dst[e], g.src[e]) if reply else (g.src[e], g.dst[e])
            if setup:
                led.add("setup_ciphertext_bytes", nbytes)
            else:
                led.add_edge_bytes(a, b, nbytes)

    # -- lifecycle -----------------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        """Make this rank's agents (one key pair each), learn the ghosts' public keys, and (masked)
        agree on the seeds with the other ranks."""
        if self._closed:
            raise RuntimeError("SecureHalo: closed (its keys are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        self._structure()
        spec, codec, kb = self._spec, self.codec, self.codec.key_bits
        masked = self.protocol == "masked"
        self._ledger = led = CostLedger(self._g.n_nodes, timers=True, setup=masked)
        raw = RawPaillier(led)
        pending = spec.keypairs
        check_key_bits(kb)
        if pending is not None and len(pending) < self._g.n_nodes:
            raise ConfigError(f"keypairs: {len(pending)} key pairs for {self._g.n_nodes} agents; need one per agent "
                              "(each rank keeps its own agents' pairs)")
        with led.timed("time_keygen"):
            for i in self.agents:  # a rank's own keys, made here (tests may hand in small ones)
                pk, sk = pending[i] if pending is not None else generate_keypair(kb)
                self._parties[i] = _Agent(i, self._g.n_nodes, pk, sk, codec, raw)
        del pending
        own_mode = "djn" if spec.djn else ("crt" if spec.precompute else None)
        for i in self.agents:
            self._parties[i]._enable_fast(own_mode=own_mode, djn_bits=self.djn_bits)
        B = public_key_nbytes(kb)
        keys = self._forward({e: [self._parties[self._g.src[e]].n] for e in self.out_edges}, 1, B,
                             "the public keys", category="setup")
        for e, (n,) in keys.items():
            i = self._g.src[e]
            if i not in self._parties:
                self._parties[i] = _Ghost(i, n)
        self._last = self._c = None
        self.plan = MaskPlan(self._g) if masked else None
        if masked:
            self._agree_seeds()
        self._start_supply()

    def _start_supply(self) -> None:
        """Public-key obfuscators for the keys this rank encrypts under: its ghosts' (replies) and,
        without the owner's obfuscators, its agents'."""
        spec = self._spec
        moduli = {i: p.n for i, p in self._parties.items()}
        workers = resolve_workers(spec.workers, self.codec.key_bits)
        if spec.workers is None and workers:
            # one machine's cores are shared by the ranks on it
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.comm.world_size))
            workers = workers // max(1, local)
            workers = workers if workers >= 2 else 0
        if workers and moduli:
            try:
                self._pool = WorkerPool(workers, audit=spec.pool_audit)
            except Exception as exc:  # pragma: no cover - a host without working subprocesses
                warnings.warn(f"SecureHalo: the worker pool did not start ({exc!r}); working in-process",
                              RuntimeWarning, stacklevel=3)
        self._supply = ObfuscatorSupply(moduli, djn_bits=self.djn_bits, pool=self._pool)

    def close(self) -> None:
        """Drop every agent and with it every private key and seed; stop the worker pool."""
        for part in (self._supply, self._pool):
            if part is not None:
                part.close()
        self._supply = self._pool = None
        for p in self._parties.values():
            if isinstance(p, _Agent):
                p._seeds.clear()
        self._parties = {}
        self._closed = True

    def _check_ready(self):
        if self._closed:
            raise RuntimeError("SecureHalo: closed (its keys are gone); make a new exchange")
        if self.topology is None:
            raise RuntimeError("SecureHalo: call bind() before the first exchange")

    # -- the seed agreement (masked) ---------------------------------------------------------
    def _agree_seeds(self) -> None:
        g, led, plan, P = self._g, self._ledger, self.plan, self._parties
        kb = self.codec.key_bits
        B, CT, k = public_key_nbytes(kb), ciphertext_nbytes(kb), seed_chunks(kb)
        own, mine = self._owner, self._mine
        with led.timed("time_setup"):
            self._account(self.out_edges, reply=False, nbytes=B, setup=True)  # every key to each neighbour
            triples = list(plan.pairs())
            # 1. i relays kp_k to j
            out1, exp1 = {}, {}
            for t, (i, j, kk) in enumerate(triples):
                if mine(i):
                    led.add("setup_ciphertext_bytes", B)
                    if not mine(j):
                        out1.setdefault(own[j], []).append([P[kk].n])
                elif mine(j):
                    exp1.setdefault(own[i], []).append(t)
            relayed = self._swap_items(out1, exp1, 1, B, "the seed agreement (relayed keys)", category="setup")
            # 2. j draws the pair seed, sends it under kp_k to i
            drawn, out2, exp2 = {}, {}, {}
            for t, (i, j, kk) in enumerate(triples):
                if mine(j):
                    n_k = P[kk].n if kk in P else relayed[t][0]
                    cts = P[j].draw_seed_for(("pair", i, j, kk), _PublicKey(n_k),
                                             public_obfuscators(n_k, k, self.djn_bits))
                    led.add("setup_ciphertext_bytes", k * CT)
                    led.add("setup_encryptions", k)
                    drawn[t] = cts
                    if not mine(i):
                        out2.setdefault(own[i], []).append(cts)
                elif mine(i):
                    exp2.setdefault(own[j], []).append(t)
            drawn.update(self._swap_items(out2, exp2, k, CT, "the seed agreement (pair seeds)", category="setup"))
            # 3. i relays it to k
            out3, exp3, arrived = {}, {}, {}
            for t, (i, j, kk) in enumerate(triples):
                if mine(i):
                    led.add("setup_ciphertext_bytes", k * CT)
                    if mine(kk):
                        arrived[t] = drawn[t]
                    else:
                        out3.setdefault(own[kk], []).append(drawn[t])
                elif mine(kk):
                    exp3.setdefault(own[i], []).append(t)
            arrived.update(self._swap_items(out3, exp3, k, CT, "the seed agreement (relayed seeds)", category="setup"))
            # 4. k keeps it
            for t, cts in arrived.items():
                i, j, kk = triples[t]
                P[kk].store_seed(("pair", i, j, kk), EncryptedVector(P[kk].public_key, cts))
                led.add("setup_decryptions", k)
            # the edge seeds, from the smaller end to the larger
            edge_msgs = {}
            for e in self.out_edges:
                lo, hi = g.src[e], g.dst[e]
                if lo < hi:
                    cts = P[lo].draw_seed_for(("edge", lo, hi), _PublicKey(P[hi].n),
                                              public_obfuscators(P[hi].n, k, self.djn_bits))
                    led.add("setup_ciphertext_bytes", k * CT)
                    led.add("setup_encryptions", k)
                    edge_msgs[e] = cts
            sends = {s: [edge_msgs[e] for e in self.out_cross[s] if e in edge_msgs] for s in self.peers}
            expect = {s: [e for e in self.in_cross[s] if g.src[e] < g.dst[e]] for s in self.peers}
            edge_msgs.update(self._swap_items(sends, expect, k, CT, "the seed agreement (edge seeds)",
                                              category="setup"))
            for e in self.in_edges:
                lo, hi = g.src[e], g.dst[e]
                if lo < hi:
                    P[hi].store_seed(("edge", lo, hi), EncryptedVector(P[hi].public_key, edge_msgs[e]))
                    led.add("setup_decryptions", k)

    # -- what the rounds share ---------------------------------------------------------------
    def _decrypt(self, acc: dict, layout, count: int, bcd_iter, admm_iter) -> torch.Tensor:
        """Each agent of this rank decrypts its homomorphic sum: ``(n_own, count)`` int64 (zeros
        for an agent without neighbours)."""
        led = self._ledger
        rows = []
        for i in self.agents:
            if i in acc:
                ag = self._parties[i]
                with led.timed("time_decrypt"):
                    rows.append(ag.decrypt_packed(EncryptedVector(ag.public_key, acc[i]), layout, count,
                                                  bcd_iter=bcd_iter, admm_iter=admm_iter))
                    led.add("decryptions", len(acc[i]))
            else:
                rows.append([0] * count)
        with led.timed("time_transfer"):
            return torch.tensor(rows, dtype=torch.int64).reshape(len(self.agents), count)

    def _product(self, replies: dict, strip_round=None) -> dict:
        """Agent ``i``'s product of its neighbours' replies (masked: its edge units removed)."""
        P, plan = self._parties, self.plan
        acc = {}
        for i in self.senders:
            nsq = P[i].nsquare
            cts = None
            for e in self.out_of[i]:
                rep = replies[e]
                cts = list(rep) if cts is None else [a * b % nsq for a, b in zip(cts, rep)]
            if strip_round is not None:
                tags = [(plan.tags[e][-1][0], -1) for e in plan.out_edges[i]]
                strip = P[i].mask_units(tags, i, strip_round, P[i].n, len(cts))
                cts = [a * u % nsq for a, u in zip(cts, strip)]
            acc[i] = cts
        return acc

    def _mask(self, e: int, round_no: int, cts, fresh) -> list:
        """Neighbour ``j``'s reply ciphertexts for edge ``e = (i, j)`` times its mask units (and the
        fresh obfuscators when ``j`` is ``i``'s designated neighbour)."""
        g, P = self._g, self._parties
        i, j = g.src[e], g.dst[e]
        units = P[j].mask_units(self.plan.tags[e], i, round_no, P[i].n, len(cts))
        nsq = P[i].nsquare
        out = [c * u % nsq for c, u in zip(cts, units)]
        if fresh is not None:
            out = [c * f % nsq for c, f in zip(out, fresh)]
        return out

    def _designated_here(self) -> list:
        """The agents (here or ghosts) whose designated neighbour is on this rank."""
        return [i for i, j in self.plan.designated.items() if self._mine(j)]

    def _requests(self, qh: dict, C: int, reply_demand: dict):
        """Lines 10-11 on this rank: ``E_i(-q_i)`` of its agents (packed); also the public-key
        obfuscators of its replies (``reply_demand``: per key)."""
        P, led, lay = self._parties, self._ledger, self.layout
        with led.timed("time_encrypt"):
            own = {i: P[i].own_obfuscators(C) for i in self.senders}
            demand = dict(reply_demand)
            for i in self.senders:
                if own[i] is None:
                    demand[i] = demand.get(i, 0) + C
            obf = self._supply.take(demand)
            requests = {}
            for i in self.senders:
                ag = P[i]
                mine = own[i]
                if mine is None:
                    mine, obf[i] = obf[i][:C], obf[i][C:]
                plain = lay.pack([-v for v in qh[i]], ag.n)
                requests[i] = [(1 + ag.n * m) * r % ag.nsquare for m, r in zip(plain, mine)]
            led.add("encryptions", C * len(self.senders))
        return requests, obf

    def _replies(self, req_of: dict, qh: dict, gam: dict, obf: dict, C: int) -> dict:
        """Lines 13-14 at this rank's neighbours: ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji}`` times a
        fresh obfuscator, for every edge into this rank's agents."""
        g, P, led, lay = self._g, self._parties, self._ledger, self.layout
        packed = {j: lay.pack_signed(qh[j]) for j in self.agents if j in qh}
        out = {}
        with led.timed("time_homomorphic"):
            for e in self.in_edges:
                i, j = g.src[e], g.dst[e]
                n, nsq = P[i].n, P[i].nsquare
                k = gam[g.rev[e]]
                if k < 0:
                    raise ValueError("scalar multiplication needs a nonnegative integer exponent")
                bases = [(1 + n * (m % n)) * c % nsq for m, c in zip(packed[j], req_of[e])]
                fresh, obf[i] = obf[i][:C], obf[i][C:]
                out[e] = [x * r % nsq for x, r in zip(gmpy2.powmod_base_list(bases, mpz(k), nsq), fresh)]
            D = len(self.in_edges)
            led.add("encryptions", C * D)
            led.add("homomorphic_additions", C * D)
            led.add("scalar_multiplications", C * D)
        return out

    def _requests_everywhere(self, requests: dict, C: int, what: str) -> dict:
        """``E_i(-q_i)`` for every edge into this rank's agents (sent across the cut)."""
        g = self._g
        CT = ciphertext_nbytes(self.codec.key_bits)
        got = self._forward({e: requests[g.src[e]] for e in self.out_edges}, C, CT, what)
        return {e: (requests[g.src[e]] if self._mine(g.src[e]) else got[e]) for e in self.in_edges}

    def _replies_everywhere(self, replies: dict, C: int, what: str) -> dict:
        g = self._g
        CT = ciphertext_nbytes(self.codec.key_bits)
        self._account(self.in_edges, reply=True, nbytes=C * CT)
        got = self._backward(replies, C, CT, what)
        return {e: (replies[e] if self._mine(g.dst[e]) else got[e]) for e in self.out_edges}

    # -- step 1 -------------------------------------------------------------------------------
    def _gammas(self, g) -> dict:
        """This rank's integer penalties ``gamma_ij``, by global edge id."""
        gamma = self.codec.encode_penalties(g.reshape(-1))
        return dict(zip(self.layout_rank.edge_ids.tolist(), gamma.cpu().tolist()))

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        """``rho_i`` of this rank's agents, on its slots ``(n_slots,)``."""
        self._check_ready()
        self._ledger.begin(bcd_iter, admm_iter)
        gam = self._gammas(g)
        what = f"step 1 of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}"
        if self.protocol == "paper":
            rho_int = self._handed_rho(gam, what)
        else:
            rho_int = self._penalty_round(gam, bcd_iter, admm_iter, what)
        return self._on_slots(self.codec.decode_rho(rho_int), g.device)

    def _penalty_round(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        rho_int = (self._masked_penalty(gam, bcd_iter, admm_iter, what) if self.protocol == "masked"
                   else self._aggregated_penalty(gam, bcd_iter, admm_iter, what))
        self._last = (gam, rho_int)
        return rho_int

    def _handed_rho(self, gam: dict, what: str) -> torch.Tensor:
        """The paper protocol's ``rho_int_i``, handed over by the simulation (module docstring)."""
        g = self._g
        # the cut edges' penalties in the clear (gamma >= 0: unsigned 8-byte words)
        got = self._swap_items({s: [[gam[e]] for e in self.out_cross[s]] for s in self.peers}, self.in_cross, 1, 8,
                               what + " (the simulation's penalties)", category="penalty")
        rho = []
        for i in self.agents:
            total = 0
            for e in self.out_of[i]:
                r = g.rev[e]
                total += gam[e] * (gam[r] if r in gam else int(got[r][0]))
            rho.append(total)
        return torch.tensor(rho, dtype=torch.int64)

    def _aggregated_penalty(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        g, P, led = self._g, self._parties, self._ledger
        kb = self.codec.key_bits
        B = public_key_nbytes(kb)
        # i -> j: kp_i
        self._forward({e: [P[g.src[e]].n] for e in self.out_edges}, 1, B, what + " (public keys)")
        self._account(self.out_edges, reply=False, nbytes=B)
        with led.timed("time_encrypt"):  # j: E_i(gamma_ji)
            demand = {}
            for e in self.in_edges:
                demand[g.src[e]] = demand.get(g.src[e], 0) + 1
            obf = self._supply.take(demand)
            replies = {}
            for e in self.in_edges:
                i = g.src[e]
                ag = P[i]
                replies[e] = [(1 + ag.n * (gam[g.rev[e]] % ag.n)) * obf[i].pop() % ag.nsquare]
            led.add("encryptions", len(self.in_edges))
        back = self._replies_everywhere(replies, 1, what)
        with led.timed("time_homomorphic"):  # i: E_i(gamma_ij gamma_ji), multiplied
            terms = {e: [gmpy2.powmod(back[e][0], mpz(gam[e]), P[g.src[e]].nsquare)] for e in self.out_edges}
            acc = self._product(terms)
            led.add("scalar_multiplications", len(self.out_edges))
            led.add("homomorphic_additions", len(self.out_edges) - len(acc))
        return self._decrypt(acc, self._layout1, 1, bcd_iter, admm_iter)[:, 0]

    def _masked_penalty(self, gam: dict, bcd_iter, admm_iter, what) -> torch.Tensor:
        g, P, led, plan = self._g, self._parties, self._ledger, self.plan
        CT = ciphertext_nbytes(self.codec.key_bits)
        fresh_for = self._designated_here()
        with led.timed("time_encrypt"):
            own = {i: P[i].own_obfuscators(len(self.out_of[i])) for i in self.senders}
            demand = {i: 1 for i in fresh_for}
            for i in self.senders:
                if own[i] is None:
                    demand[i] = demand.get(i, 0) + len(self.out_of[i])
            obf = self._supply.take(demand)
            fresh = {i: obf[i].pop() for i in fresh_for}
            c = {}
            for i in self.senders:
                ag = P[i]
                mine = own[i] if own[i] is not None else obf[i]
                for e in self.out_of[i]:
                    c[e] = (1 + ag.n * (gam[e] % ag.n)) * mine.pop() % ag.nsquare  # i: E_i(gamma_ij)
            led.add("encryptions", len(self.out_edges) + len(fresh_for))
        self._account(self.out_edges, reply=False, nbytes=CT)
        c.update({e: v[0] for e, v in self._forward({e: [c[e]] for e in self.out_edges}, 1, CT,
                                                      what + " (E_i(gamma_ij))").items()})
        rnd = plan.next_round()
        with led.timed("time_homomorphic"):  # j: E_i(gamma_ij)^{gamma_ji}, masked
            replies = {}
            for e in self.in_edges:
                i, j = g.src[e], g.dst[e]
                t = gmpy2.powmod(c[e], mpz(gam[g.rev[e]]), P[i].nsquare)
                replies[e] = self._mask(e, rnd, [t], [fresh[i]] if plan.designated[i] == j else None)
            led.add("scalar_multiplications", len(self.in_edges))
        back = self._replies_everywhere(replies, 1, what)
        with led.timed("time_homomorphic"):
            acc = self._product(back, rnd)
            led.add("homomorphic_additions", len(self.out_edges) - len(acc))
        self._c = c
        return self._decrypt(acc, self._layout1, 1, bcd_iter, admm_iter)[:, 0]

    # -- step 5 -------------------------------------------------------------------------------
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        """``S_i`` and ``rho_i`` of this rank's agents through the encrypted protocol, on its slots."""
        self._check_ready()
        self._ledger.begin(bcd_iter, admm_iter)
        lr = self.layout_rank
        slots = lr.slots.to(U.device)
        try:
            q = self.codec.encode_values(U.index_select(0, slots), n_agents=max(1, len(self.agents)),
                                         bcd_iter=bcd_iter, admm_iter=admm_iter)
        except CodecRangeError as exc:
            raise _named(exc, self.agents) from None
        gam = self._gammas(g)
        what = f"step 5 of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}"
        P = int(q.shape[1])
        rerun = self._agree_on_round(q, gam, bcd_iter, admm_iter)
        with self._ledger.timed("time_transfer"):
            rows = q.cpu().tolist()
        qh = dict(zip(self.agents, rows))
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
        bad = 2 * qmax * self._w_max * self._d_max >= lim
        changed = self.protocol != "paper" and (getattr(self, "_last", None) is None or self._last[0] != gam)
        flags = torch.tensor([int(changed), (self.comm.rank + 1) if bad else 0], dtype=torch.int64)
        flags = self.comm.all_reduce(flags, category="metrics", op=dist.ReduceOp.MAX,
                                     what=f"the range check of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
        failed = int(flags[1]) - 1
        if bad:
            row = int(q.abs().amax(dim=1).argmax())
            raise CodecRangeError(
                f"codec range: agent {self.agents[row]} (trial 0) at BCD iteration {bcd_iter}, ADMM iteration "
                f"{admm_iter}: across ranks the protocol's sums are checked against the public bound "
                f"2 max|q_i| gamma_max^2 d_max = {2 * qmax * self._w_max * self._d_max:.6g}, which does not fit "
                f"the limit {lim} (2^{lim.bit_length() - 1}); lower n_max, or use larger keys",
                trial=0, agent=self.agents[row], bcd_iter=bcd_iter, admm_iter=admm_iter, value=qmax, limit=lim)
        if failed >= 0:
            raise DistributedError(f"rank {self.comm.rank}: stopped at BCD iteration {bcd_iter}, ADMM iteration "
                                   f"{admm_iter}: rank {failed} holds a value outside the protocol's range",
                                   failed_rank=failed)
        return bool(int(flags[0]))

    def _aggregated_values(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        g, Pa, led = self._g, self._parties, self._ledger
        C = self.layout.n_ciphertexts(P)
        CT = ciphertext_nbytes(self.codec.key_bits)
        demand = {}
        for e in self.in_edges:
            demand[g.src[e]] = demand.get(g.src[e], 0) + C
        requests, obf = self._requests(qh, C, demand)
        self._account(self.out_edges, reply=False, nbytes=C * CT)
        req_of = self._requests_everywhere(requests, C, what + " (E_i(-q_i))")
        replies = self._replies(req_of, qh, gam, obf, C)
        back = self._replies_everywhere(replies, C, what)
        with led.timed("time_homomorphic"):  # i raises each reply to its own gamma_ij
            terms = {e: gmpy2.powmod_base_list(back[e], mpz(gam[e]), Pa[g.src[e]].nsquare) for e in self.out_edges}
            acc = self._product(terms)
            led.add("scalar_multiplications", C * len(self.out_edges))
            led.add("homomorphic_additions", C * (len(self.out_edges) - len(acc)))
        return self._decrypt(acc, self.layout, P, bcd_iter, admm_iter)

    def _paper_round(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        g, Pa, led = self._g, self._parties, self._ledger
        C = self.layout.n_ciphertexts(P)
        kb = self.codec.key_bits
        CT, B = ciphertext_nbytes(kb), public_key_nbytes(kb)
        demand = {}
        for e in self.in_edges:
            demand[g.src[e]] = demand.get(g.src[e], 0) + C
        requests, obf = self._requests(qh, C, demand)
        # i -> j: E_i(-q_i) and kp_i
        self._account(self.out_edges, reply=False, nbytes=C * CT + B)
        self._forward({e: [Pa[g.src[e]].n] for e in self.out_edges}, 1, B, what + " (public keys)")
        req_of = self._requests_everywhere(requests, C, what + " (E_i(-q_i))")
        replies = self._replies(req_of, qh, gam, obf, C)
        back = self._replies_everywhere(replies, C, what)
        rows = []
        for i in self.agents:  # i decrypts every reply on its own and weighs it (lines 15-16)
            total = [0] * P
            ag = Pa[i]
            for e in self.out_of[i]:
                with led.timed("time_decrypt"):
                    d = ag.decrypt_packed(EncryptedVector(ag.public_key, back[e]), self.layout, P,
                                          bcd_iter=bcd_iter, admm_iter=admm_iter)
                    led.add("decryptions", len(back[e]))
                total = [t + gam[e] * v for t, v in zip(total, d)]
            rows.append(total)
        return torch.tensor(rows, dtype=torch.int64).reshape(len(self.agents), P)

    def _masked_values(self, qh, gam, P, bcd_iter, admm_iter, what) -> torch.Tensor:
        g, Pa, led, plan, lay = self._g, self._parties, self._ledger, self.plan, self.layout
        S, C = lay.slots, lay.n_ciphertexts(P)
        used = min(S, P)
        CT = ciphertext_nbytes(self.codec.key_bits)
        c = self._c
        with led.timed("time_homomorphic"):  # i: its shifted encryptions E_i(gamma_ij 2^{w t})
            bases = {}
            for i in self.senders:
                es = self.out_of[i]
                for e, row in zip(es, Pa[i].shifted([c[e] for e in es], lay.slot_bits, used)):
                    bases[e] = row
            led.add("scalar_multiplications", len(self.out_edges) * (used - 1))
        fresh_for = self._designated_here()
        with led.timed("time_encrypt"):
            fresh = self._supply.take({i: C for i in fresh_for})
            led.add("encryptions", C * len(fresh_for))
        if used > 1:
            self._account(self.out_edges, reply=False, nbytes=(used - 1) * CT)
        got = self._forward({e: bases[e][1:] for e in self.out_edges}, used - 1, CT, what + " (shifted)") \
            if used > 1 else {}
        for e in self.in_edges:
            if e not in bases:
                bases[e] = [c[e]] + list(got.get(e, []))
        blocks = {j: _blocks(qh[j], S) for j in self.agents}
        rnd = plan.next_round()
        with led.timed("time_homomorphic"):
            replies = {}
            for e in self.in_edges:  # j: per block, prod_t (B_t^{gamma_ji})^{q_t}, masked
                i, j = g.src[e], g.dst[e]
                k = gam[g.rev[e]]
                if k < 0:
                    raise ValueError("scalar multiplication needs a nonnegative integer exponent")
                nsq = Pa[i].nsquare
                scaled = gmpy2.powmod_base_list(bases[e], mpz(k), nsq)
                cores = signed_multi_exps(scaled, blocks[j], nsq)
                replies[e] = self._mask(e, rnd, cores, fresh[i] if plan.designated[i] == j else None)
            D = len(self.in_edges)
            led.add("scalar_multiplications", D * P)
            led.add("homomorphic_additions", D * (P - C))
        back = self._replies_everywhere(replies, C, what)
        with led.timed("time_homomorphic"):
            acc = self._product(back, rnd)
            led.add("homomorphic_additions", (len(self.out_edges) - len(acc)) * C)
        return self._decrypt(acc, lay, P, bcd_iter, admm_iter)

    # -- results on the rank's slots -------------------------------------------------------------
    def _on_slots(self, values, device) -> torch.Tensor:
        out = torch.zeros(self.layout_rank.n_slots, dtype=values.dtype, device=device)
        out[self.layout_rank.slots.to(device)] = values.to(device)
        return out

    # -- costs: counted per rank, summed across ranks ----------------------------------------------
    def _sum(self, rows: list, keys) -> list:
        t = torch.tensor([[float(r.get(k, 0)) for k in keys] for r in rows], dtype=torch.float64).reshape(-1, len(keys))
        t = self.comm.all_reduce(t, category="metrics", what="the sum of the cost counters").cpu()
        return [{k: (v if k.startswith("time_") else int(v)) for k, v in zip(keys, row.tolist())} for row in t]

    def _op_costs(self):
        cm = self._spec.cost_model
        if cm is False:
            return None
        if cm is True:
            if self._calibrated is None:  # calibrated on rank 0 and shared: one set for the run
                oc = None
                if self.comm.rank == 0:
                    from ..exchange.paillier.calibration import calibrate

                    oc = calibrate(self.codec.key_bits)
                self._calibrated = self.comm.broadcast_object(oc, 0, what="the calibration of the cost model")
            return self._calibrated
        return cm

    def costs(self) -> dict:
        """The run's counters (every rank's, summed), ``key_pairs`` and times (summed over ranks)."""
        masked = self.protocol == "masked"
        keys = COUNT_KEYS + TIME_KEYS + ((SETUP_KEYS + ("time_setup",)) if masked else ())
        out = self._sum([self._ledger.total], keys)[0]
        out["key_pairs"] = self._g.n_nodes
        oc = self._op_costs()
        if oc is not None:
            out["estimated_seconds"] = estimate_seconds(out, oc)
            out["estimated_seconds_keygen"] = out["key_pairs"] * oc.keygen
            if masked:
                out["estimated_seconds_setup"] = setup_seconds(out, oc)
        return out

    def pop_iteration_costs(self) -> list:
        records = self._ledger.pop()
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
        merged = {}
        for part in self.comm.all_gather_object(dict(self._ledger.edges), what="the per-edge byte counts"):
            for k, v in part.items():
                merged[k] = merged.get(k, 0) + v
        return merged

    def __repr__(self) -> str:
        return (f"SecureHalo(protocol={self.protocol!r}, key_bits={self.codec.key_bits}, rank={self.comm.rank}, "
                f"agents={len(getattr(self, 'agents', []))}{', closed' if self._closed else ''})")


def _named(exc: CodecRangeError, agents: list) -> CodecRangeError:
    """A range error of the rank's ``k``-th agent, with its global id."""
    if not 0 <= exc.agent < len(agents):
        return exc
    agent = agents[exc.agent]
    text = str(exc).replace(f"agent {exc.agent} (trial {exc.trial})", f"agent {agent} (trial 0)", 1)
    return CodecRangeError(text, trial=0, agent=agent, bcd_iter=exc.bcd_iter, admm_iter=exc.admm_iter,
                           value=exc.value, limit=exc.limit)
