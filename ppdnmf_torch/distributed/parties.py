"""A rank's parties of the Paillier protocol and the links between ranks: :class:`RankParties`.

A rank *is* the parties it owns: its agents, with the key pairs generated here and the mask
seeds agreed here, none of which ever leaves this process, and, for the agents of other
ranks its agents talk to (its *ghosts*), their public keys. :class:`RankParties` holds them,
the run's directed edges as this rank sees them (global ids: the edges out of its agents,
the edges into them, and per peer rank the cut edges either way), the rank's
:class:`~ppdnmf_torch.exchange.costmodel.CostLedger` and its obfuscator supply, and it moves
the protocol's messages across the cut (:meth:`RankParties.forward`, ``i -> j``;
:meth:`RankParties.backward`, ``j -> i``): fixed-width big-endian integers (ciphertexts,
public keys) in one ``uint8`` tensor per peer rank (:meth:`~.comm.Comm.swap_bytes`), the cut
edges in increasing global edge id, which both ends know, so that no message carries an index.

The masked protocol's seed agreement (:meth:`RankParties.agree_seeds`) runs here once: the
public keys over every edge; per agent ``i`` and pair ``j < k`` of its neighbours, ``i`` relays
``kp_k`` to ``j``, ``j`` draws the pair seed and sends it under ``kp_k`` to ``i``, and ``i`` relays
it to ``k`` (up to three ranks for one seed); per edge the smaller end draws the edge seed and
sends it to the larger. Only ciphertexts and public keys cross.

Every message is accounted as in one process (:meth:`RankParties.account`, by the rank of the
party that sends it), so that the ranks' ledgers sum to the single-process counts.
"""
from __future__ import annotations

import os
import warnings

import torch
from gmpy2 import mpz

from ..exchange.costmodel import CostLedger, ciphertext_nbytes, public_key_nbytes, seed_chunks
from ..exchange.paillier.keys import EncryptedVector, RawPaillier, _Agent, check_key_bits, generate_keypair
from ..exchange.paillier.masked import MaskPlan
from ..exchange.paillier.obfuscation import HoldsPrivateKey, public_obfuscators
from ..exchange.paillier.pool import ObfuscatorSupply, WorkerPool, resolve_workers
from ..exchange.secagg.party import SIGNED_KEY_BYTES, Party, SignedKey
from ..exchange.secagg.network import finish_agreement
from ..exchange.secagg.plan import SecAggPlan
from .comm import Comm, DistributedError

__all__ = ["RankParties", "SecAggRankParties", "TAG_CRYPTO", "TAG_SECAGG"]

#: the tags of the protocol's byte messages (lengths, payload), apart from every other message's
TAG_CRYPTO = 31
#: the tags of exchange="secagg"'s setup messages (lengths, payload)
TAG_SECAGG = 33


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


class _Graph:
    """The global directed edges as Python lists (what :class:`MaskPlan` reads)."""

    def __init__(self, graph):
        self.n_nodes = graph.n_agents
        self.src, self.dst, self.rev = graph.src.tolist(), graph.dst.tolist(), graph.rev.tolist()


class RankParties(HoldsPrivateKey):
    """One rank's parties, links and ledger (module docstring).

    Making one makes the rank's key pairs, learns its ghosts' public keys from the other
    ranks and, with ``masked``, agrees on the seeds with them: every rank of the run makes its
    own at the same point.

    Parameters
    ----------
    spec : PaillierSpec
    codec : IntegerCodec
    layout_rank : RankLayout
    comm : Comm
    graph : Graph
        The whole graph (the protocol's structure is public).
    owner : sequence of int
        The rank of every agent.
    djn_bits : int or None
    masked : bool
    """

    def __init__(self, spec, codec, layout_rank, comm: Comm, graph, owner, *, djn_bits, masked: bool,
                 keypairs=None):
        self.spec, self.codec, self.layout_rank, self.comm = spec, codec, layout_rank, comm
        self.djn_bits = djn_bits
        self.g = _Graph(graph)
        self.owner = [int(o) for o in owner]
        self.parties: dict = {}
        self.supply = self.pool = None
        self.structure()
        self.ledger = CostLedger(self.g.n_nodes, timers=True, setup=masked)
        self._make_keys(keypairs)
        self.plan = MaskPlan(self.g) if masked else None
        if masked:
            self.agree_seeds()
        self.start_supply()

    def _make_keys(self, keypairs) -> None:
        """The rank's own key pairs, made here (``keypairs``: this rank's agents' pairs handed in,
        ``{agent: (pk, sk)}``; tests), then the ghosts' public keys."""
        spec, codec, n_nodes = self.spec, self.codec, self.g.n_nodes
        kb = codec.key_bits
        raw = RawPaillier(self.ledger)
        check_key_bits(kb)
        with self.ledger.timed("time_keygen"):
            for i in self.agents:
                pk, sk = keypairs.pop(i) if keypairs is not None else generate_keypair(kb)
                self.parties[i] = _Agent(i, n_nodes, pk, sk, codec, raw)
        own_mode = "djn" if spec.djn else ("crt" if spec.precompute else None)
        for i in self.agents:
            self.parties[i]._enable_fast(own_mode=own_mode, djn_bits=self.djn_bits)
        keys = self.forward({e: [self.parties[self.g.src[e]].n] for e in self.out_edges}, 1, public_key_nbytes(kb),
                            "the public keys", category="setup")
        for e, (n,) in keys.items():
            i = self.g.src[e]
            if i not in self.parties:
                self.parties[i] = _Ghost(i, n)

    def check_keys(self, keys: dict, what: str) -> None:
        """The public keys a round's messages carry (``{edge: [n_i]}``, received) are the ones the
        setup delivered: a peer that sends another key is a protocol error, not a new key."""
        for e, (n,) in keys.items():
            if int(n) != int(self.parties[self.g.src[e]].n):
                raise DistributedError(f"rank {self.comm.rank}: {what}: rank {self.owner[self.g.src[e]]} sent "
                                       f"another public key for agent {self.g.src[e]} than at setup")

    # -- structure and links ------------------------------------------------------------
    def mine(self, node: int) -> bool:
        """Whether agent ``node`` is this rank's."""
        return self.owner[node] == self.comm.rank

    def structure(self) -> None:
        """The rank's agents and edges (global ids): out of its agents, into them, and per peer
        rank the cut edges either way, in increasing edge id."""
        g, r = self.g, self.comm.rank
        own = self.owner
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

    def swap_items(self, sends: dict, expect: dict, count: int, width: int, what: str,
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

    def forward(self, msgs: dict, count: int, width: int, what: str, category: str = "crypto") -> dict:
        """``i -> j`` over the cut edges (``msgs[e]`` for this rank's out-edges): the messages of
        the other ranks' agents to this rank's, by edge."""
        sends = {s: [msgs[e] for e in self.out_cross[s]] for s in self.peers}
        return self.swap_items(sends, self.in_cross, count, width, what, category)

    def backward(self, msgs: dict, count: int, width: int, what: str) -> dict:
        """``j -> i`` over the cut edges (``msgs[e]`` for this rank's in-edges)."""
        sends = {s: [msgs[e] for e in self.in_cross[s]] for s in self.peers}
        return self.swap_items(sends, self.out_cross, count, width, what)

    def account(self, edges, *, reply: bool, nbytes: int, setup: bool = False) -> None:
        """Account one message per edge of ``edges`` (``reply``: ``j -> i``, else ``i -> j``) of
        ``nbytes`` each, per edge or (``setup``) in ``setup_ciphertext_bytes``."""
        g, led = self.g, self.ledger
        for e in edges:
            a, b = (g.dst[e], g.src[e]) if reply else (g.src[e], g.dst[e])
            if setup:
                led.add("setup_ciphertext_bytes", nbytes)
            else:
                led.add_edge_bytes(a, b, nbytes)

    def start_supply(self) -> None:
        """Public-key obfuscators for the keys this rank encrypts under: its ghosts' (replies) and,
        without the owner's obfuscators, its agents'."""
        spec = self.spec
        moduli = {i: p.n for i, p in self.parties.items()}
        workers = resolve_workers(spec.workers, self.codec.key_bits)
        if spec.workers is None and workers:
            # one machine's cores are shared by the ranks on it
            local = int(os.environ.get("LOCAL_WORLD_SIZE", self.comm.world_size))
            workers = workers // max(1, local)
            workers = workers if workers >= 2 else 0
        if workers and moduli:
            try:
                self.pool = WorkerPool(workers, audit=spec.pool_audit)
            except Exception as exc:  # pragma: no cover - a host without working subprocesses
                warnings.warn(f"SecureHalo: the worker pool did not start ({exc!r}); working in-process",
                              RuntimeWarning, stacklevel=3)
        # with precompute and a pool, a stock per key refilled in the background (obfuscators)
        self.supply = ObfuscatorSupply(moduli, djn_bits=self.djn_bits, pool=self.pool,
                                       stock={} if spec.precompute else None)

    def obfuscators(self, demand: dict) -> dict:
        """``{key: [obfuscator, ...]}``, ``demand[key]`` each; in stock mode the stock of every
        key asked for is then kept at two rounds' worth and refilled in the background."""
        out = self.supply.take(demand)
        targets = self.supply.targets
        if targets is not None:
            for key, c in demand.items():
                targets[key] = max(targets.get(key, 0), 2 * int(c))
            self.supply.refill()
        return out

    def agree_seeds(self) -> None:
        """The masked protocol's seed agreement across ranks (module docstring): the keys' setup
        bytes, the pair seeds in four steps (relayed key, drawn seed, relayed seed, kept seed)
        and the edge seeds; counted in the ``setup_*`` keys as
        :func:`~ppdnmf_torch.exchange.paillier.masked.agree_seeds` counts them."""
        g, led, plan, P = self.g, self.ledger, self.plan, self.parties
        kb = self.codec.key_bits
        B, CT, k = public_key_nbytes(kb), ciphertext_nbytes(kb), seed_chunks(kb)
        own, mine = self.owner, self.mine
        with led.timed("time_setup"):
            self.account(self.out_edges, reply=False, nbytes=B, setup=True)  # every key to each neighbour
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
            relayed = self.swap_items(out1, exp1, 1, B, "the seed agreement (relayed keys)", category="setup")
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
            drawn.update(self.swap_items(out2, exp2, k, CT, "the seed agreement (pair seeds)", category="setup"))
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
            arrived.update(self.swap_items(out3, exp3, k, CT, "the seed agreement (relayed seeds)", category="setup"))
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
            edge_msgs.update(self.swap_items(sends, expect, k, CT, "the seed agreement (edge seeds)",
                                              category="setup"))
            for e in self.in_edges:
                lo, hi = g.src[e], g.dst[e]
                if lo < hi:
                    P[hi].store_seed(("edge", lo, hi), EncryptedVector(P[hi].public_key, edge_msgs[e]))
                    led.add("setup_decryptions", k)

    def decrypt(self, acc: dict, layout, count: int, bcd_iter, admm_iter) -> torch.Tensor:
        """Each agent of this rank decrypts its homomorphic sum: ``(n_own, count)`` int64 (zeros
        for an agent without neighbours)."""
        led = self.ledger
        rows = []
        for i in self.agents:
            if i in acc:
                ag = self.parties[i]
                with led.timed("time_decrypt"):
                    rows.append(ag.decrypt_packed(EncryptedVector(ag.public_key, acc[i]), layout, count,
                                                  bcd_iter=bcd_iter, admm_iter=admm_iter))
                    led.add("decryptions", len(acc[i]))
            else:
                rows.append([0] * count)
        with led.timed("time_transfer"):
            return torch.tensor(rows, dtype=torch.int64).reshape(len(self.agents), count)

    def product(self, replies: dict, strip_round=None) -> dict:
        """Agent ``i``'s product of its neighbours' replies (masked: its edge units removed)."""
        P, plan = self.parties, self.plan
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

    def mask(self, e: int, round_no: int, cts, fresh) -> list:
        """Neighbour ``j``'s reply ciphertexts for edge ``e = (i, j)`` times its mask units (and the
        fresh obfuscators when ``j`` is ``i``'s designated neighbour)."""
        g, P = self.g, self.parties
        i, j = g.src[e], g.dst[e]
        units = P[j].mask_units(self.plan.tags[e], i, round_no, P[i].n, len(cts))
        nsq = P[i].nsquare
        out = [c * u % nsq for c, u in zip(cts, units)]
        if fresh is not None:
            out = [c * f % nsq for c, f in zip(out, fresh)]
        return out

    def reply_demand(self, per_edge: int) -> dict:
        """Public-key obfuscators this rank's replies need, per key: ``per_edge`` for every edge
        into its agents, under the asking agent's key."""
        demand = {}
        for e in self.in_edges:
            i = self.g.src[e]
            demand[i] = demand.get(i, 0) + per_edge
        return demand

    def designated_here(self) -> list:
        """The agents (here or ghosts) whose designated neighbour is on this rank."""
        return [i for i, j in self.plan.designated.items() if self.mine(j)]

    def close(self) -> None:
        """Drop every agent and with it every private key and seed; stop the worker pool."""
        for part in (self.supply, self.pool):
            if part is not None:
                part.close()
        self.supply = self.pool = None
        for p in self.parties.values():
            if isinstance(p, _Agent):
                p.forget()  # also in the references a caller kept
        self.parties = {}

    def __repr__(self) -> str:
        ghosts = len(self.parties) - len(self.agents)
        return f"RankParties(rank={self.comm.rank}, agents={len(self.agents)}, ghosts={ghosts})"


class SecAggRankParties(HoldsPrivateKey):
    """``exchange="secagg"`` across ranks: one rank's parties of the pairwise-masked secure sum.

    The rank's agents are :class:`~ppdnmf_torch.exchange.secagg.party.Party` objects made here (their
    identity, ephemeral keys and seeds never leave this process); of the other ranks' agents it
    knows the public identity keys and the signed ephemeral keys it receives. The seed agreement
    of :class:`~ppdnmf_torch.exchange.secagg.network.SecAggNetwork` runs across the cut
    (:meth:`agree`): the public identity keys of every agent (the public-key infrastructure, one
    all-gather); the two ends of every edge send each other their signed keys; every receiver ``i``
    relays to each neighbour ``j`` the signed keys of ``N_i \\ {j}`` (on the rank of ``i``: the pair
    seeds of ``j`` and ``k`` are agreed through it, and it holds public keys only), so that ``j``
    learns ``i``'s group from it; every party checks every key against its owner's identity key
    and derives its seeds. Byte messages per peer rank, the cut edges in increasing global edge
    id (both ends know them): no message carries an index. Counted in the ledger as one process
    counts them (every rank the messages of its parties and their operations).

    Parameters
    ----------
    layout : RankLayout
    comm : Comm
    ledger : SecAggLedger
    """

    def __init__(self, layout, comm: Comm, ledger):
        self.layout, self.comm, self.ledger = layout, comm, ledger
        ext = layout.ext_nodes.tolist()
        topo = layout.ext_topology
        #: ``(global edge id, src, dst)`` of every edge with an end among the rank's agents, increasing ids
        self.edges = [(int(e), ext[a], ext[b]) for e, a, b in zip(layout.ext_edge_ids.tolist(), topo.src.tolist(),
                                                                  topo.dst.tolist())]
        self.own = set(layout.agents.tolist())
        self.owner = {n: comm.rank for n in self.own}
        for peer in layout.peers:
            for k in layout.recv_nodes[peer].tolist():
                self.owner[ext[k]] = peer
        self.peers = list(layout.peers)
        self.nbrs = {i: sorted(b for _, a, b in self.edges if a == i) for i in sorted(self.own)}
        self.parties = {a: Party(a) for a in sorted(self.own)}
        self.plan = None

    def _cut(self, into_here: bool, peer: int) -> list:
        """The edges ``(e, x, y)`` from ``peer``'s agents to this rank's (``into_here``) or back."""
        if into_here:
            return [(e, x, y) for e, x, y in self.edges if self.owner[x] == peer and y in self.own]
        return [(e, x, y) for e, x, y in self.edges if x in self.own and self.owner[y] == peer]

    def _swap(self, sends: dict, what: str) -> dict:
        return self.comm.swap_bytes({s: b"".join(sends.get(s, [])) for s in self.peers}, self.peers,
                                    category="setup", what=f"the secagg seed agreement ({what})", tag=TAG_SECAGG)

    def agree(self) -> None:
        """The seed agreement across ranks (class docstring)."""
        import time

        led, parties, own = self.ledger, self.parties, self.own
        t0 = time.perf_counter()
        pki = {}
        for part in self.comm.all_gather_object({a: p.identity_key for a, p in parties.items()}, category="setup",
                                                what="the identity keys (the public-key infrastructure)"):
            pki.update(part)
        got = {a: {} for a in own}
        nbytes = 0
        sends: dict = {}
        for _, x, y in self.edges:  # every agent's signed key to each neighbour
            if x in own:
                sk = parties[x].signed_key
                nbytes += SIGNED_KEY_BYTES
                if y in own:
                    got[y].setdefault(x, []).append((sk, None))
                else:
                    sends.setdefault(self.owner[y], []).append(sk.to_bytes())
        for peer, raw in self._swap(sends, "signed keys").items():
            raw = raw.numpy().tobytes()
            cut = self._cut(True, peer)
            if len(raw) != SIGNED_KEY_BYTES * len(cut):
                raise DistributedError(f"rank {self.comm.rank}: the secagg seed agreement: rank {peer} sent "
                                       f"{len(raw)} bytes of signed keys, the protocol expects {SIGNED_KEY_BYTES * len(cut)}")
            for k, (_, x, y) in enumerate(cut):
                got[y].setdefault(x, []).append((SignedKey.from_bytes(raw[k * SIGNED_KEY_BYTES:(k + 1) * SIGNED_KEY_BYTES]),
                                                 None))
        groups = {i: nb for i, nb in self.nbrs.items() if nb}
        sends = {}
        for _, x, y in self.edges:  # receiver x relays to neighbour y the keys of its other neighbours
            if x not in own:
                continue
            keys = [got[x][k][0][0] for k in self.nbrs[x] if k != y]
            nbytes += SIGNED_KEY_BYTES * len(keys)
            if y in own:
                for sk in keys:
                    got[y].setdefault(sk.node, []).append((sk, x))
            else:
                sends.setdefault(self.owner[y], []).append(len(keys).to_bytes(4, "big")
                                                           + b"".join(sk.to_bytes() for sk in keys))
        for peer, raw in self._swap(sends, "relayed keys").items():
            raw, at = raw.numpy().tobytes(), 0
            for _, x, y in self._cut(True, peer):  # x (there) relays N_x \ {y} to y (here)
                count = int.from_bytes(raw[at:at + 4], "big")
                at += 4
                group = [y]
                for _ in range(count):
                    sk = SignedKey.from_bytes(raw[at:at + SIGNED_KEY_BYTES])
                    at += SIGNED_KEY_BYTES
                    got[y].setdefault(sk.node, []).append((sk, x))
                    group.append(sk.node)
                groups.setdefault(x, sorted(group))
            if at != len(raw):
                raise DistributedError(f"rank {self.comm.rank}: the secagg seed agreement: rank {peer} sent "
                                       f"{len(raw) - at} bytes of relayed keys beyond the protocol's")
        self.plan = SecAggPlan(groups)
        finish_agreement(parties, self.plan, got, pki, led, nbytes, t0)  # every key checked, then the seeds

    def close(self) -> None:
        """Drop every key and seed of the rank's parties."""
        for p in self.parties.values():
            p.forget()
        self.parties = {}

    def __repr__(self) -> str:
        return f"SecAggRankParties(rank={self.comm.rank}, agents={len(self.own)}, peers={self.peers})"
