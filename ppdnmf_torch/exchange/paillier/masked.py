"""``protocol="masked"`` on the host: the seed agreement and the two masked rounds.

Agent ``i`` learns, per ADMM iteration, exactly ``rho_int_i = sum_j gamma_ij gamma_ji`` and
``A_i = sum_j gamma_ij gamma_ji q_j`` (so ``S_int_i = A_i - rho_int_i q_i``), and nothing per
neighbour: every reply it receives is a uniformly random element of ``Z*_{n_i^2}`` on its
own, and only their product decrypts to something (docs/SECURE_EXCHANGE.md has the
argument and what it does not cover).

Setup (:func:`agree_seeds`, once per bound exchange): the public keys; per agent ``i`` and
pair ``j < k`` of its neighbours a seed drawn by ``j``, encrypted under ``k``'s key and sent
through ``i``; per edge a seed between its two ends (:mod:`.seeds`).

Rounds (``E_i`` encryption under ``i``'s key; ``U_j`` the product of ``j``'s mask units for
the reply, :class:`MaskPlan`; ``rho`` a fresh obfuscator, added by the one *designated*
neighbour of ``i``, its first in edge order, to each of its reply ciphertexts so that ``i``'s
products carry fresh randomness unknown to ``i``):

1. step 1: ``i -> j``: ``c_ij = E_i(gamma_ij)``; ``j -> i``: ``c_ij^{gamma_ji} U_j [rho]``;
   ``i`` multiplies the replies and decrypts ``rho_int_i``;
2. step 5: ``i -> j``: ``B_t = c_ij^{2^{w t}} = E_i(gamma_ij 2^{w t})`` for the ``S'`` slot
   positions ``t`` (``w`` bits per slot, :mod:`~ppdnmf_torch.exchange.packing`; made with
   ``i``'s CRT factors); ``j -> i``, per packed block ``b``: ``prod_t B_t^{gamma_ji q_{j,b,t}} U_j
   [rho] = E_i(gamma_ij gamma_ji M(q_j,b)) U_j [rho]`` (:mod:`.multiexp`); ``i`` multiplies over
   its neighbours and decrypts ``M(A_i)`` block by block (signed slots, offsets added at
   decoding as for the other protocols).

With a single neighbour there is nothing to mask against (``U_j = 1``): ``i``'s sums are that
neighbour's term, inherently (``fit`` warns; ``min_degree=2`` refuses such graphs).
"""
from __future__ import annotations

import gmpy2

from ..costmodel import ciphertext_nbytes, public_key_nbytes, seed_chunks
from .keys import EncryptedVector
from .multiexp import signed_multi_exps
from .obfuscation import public_obfuscators

__all__ = ["MaskPlan", "agree_seeds", "FastMasked", "NaiveMasked", "value_cores", "value_blocks"]


class MaskPlan:
    """The public structure of the masks, from the graph: per directed edge ``e = (i, j)``
    (``j``'s replies to ``i``) the signed seed tags of ``j``'s mask units, each node's
    designated neighbour, and the round counter every party keeps.

    Tags: ``("pair", i, a, b)`` (``a < b`` neighbours of ``i``; sign ``+1`` for ``a``'s replies,
    ``-1`` for ``b``'s, so that they cancel in ``i``'s product) and ``("edge", a, b)`` (``a < b``
    the two ends; known to ``i``, which removes it: it hides a reply from the other neighbours
    of ``i``, who hold the pair seeds).
    """

    def __init__(self, net):
        self.nbrs = {i: [] for i in range(net.n_nodes)}
        self.out_edges = {i: [] for i in range(net.n_nodes)}
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            self.nbrs[i].append(j)
            self.out_edges[i].append(e)
        self.designated = {i: nb[0] for i, nb in self.nbrs.items() if nb}
        self.tags = []
        for i, j in zip(net.src, net.dst):
            signed = [(("pair", i, min(j, k), max(j, k)), 1 if j < k else -1) for k in self.nbrs[i] if k != j]
            signed.append((("edge", min(i, j), max(i, j)), 1))
            self.tags.append(signed)
        self.round = 0

    def pairs(self):
        """``(i, j, k)`` for every node ``i`` and pair ``j < k`` of its neighbours, in node order."""
        for i, nb in self.nbrs.items():
            ordered = sorted(nb)
            for a in range(len(ordered)):
                for b in range(a + 1, len(ordered)):
                    yield i, ordered[a], ordered[b]

    def next_round(self) -> int:
        """The number of the next round (public; no seed is ever used twice with one number)."""
        self.round += 1
        return self.round


def agree_seeds(net, plan: MaskPlan, *, key_bits: int, djn_bits=None) -> None:
    """The setup: public keys, pair seeds through the middle agent, edge seeds; counted in the
    ledger's ``setup_*`` keys (the messages with ``setup=True``), timed as ``time_setup``."""
    agents, led = net.agents, net.ledger
    B, C, k = public_key_nbytes(key_bits), ciphertext_nbytes(key_bits), seed_chunks(key_bits)
    n_seeds = 0
    with led.timed("time_setup"):
        for i, j in zip(net.src, net.dst):  # every agent's key to each neighbour
            net.send(i, j, B, "public_key", (agents[i].public_key.n,), setup=True)
        for i, j, kk in plan.pairs():  # j draws s^i_jk, sends it to k through i, under k's key
            a, b = agents[j], agents[kk]
            net.send(i, j, B, "public_key", (b.public_key.n,), under=kk, setup=True)  # i relays kp_k to j
            cts = a.draw_seed_for(("pair", i, j, kk), b.public_key, public_obfuscators(b.n, k, djn_bits))
            net.send(j, i, k * C, "seed", cts, under=kk, setup=True)
            net.send(i, kk, k * C, "seed_relay", cts, under=kk, setup=True)
            b.store_seed(("pair", i, j, kk), EncryptedVector(b.public_key, cts))
            n_seeds += 1
        for lo, hi in zip(net.src, net.dst):  # the edge seeds, from the smaller end to the larger
            if lo < hi:
                a, b = agents[lo], agents[hi]
                cts = a.draw_seed_for(("edge", lo, hi), b.public_key, public_obfuscators(b.n, k, djn_bits))
                net.send(lo, hi, k * C, "edge_seed", cts, under=hi, setup=True)
                b.store_seed(("edge", lo, hi), EncryptedVector(b.public_key, cts))
                n_seeds += 1
        led.add("setup_encryptions", k * n_seeds)
        led.add("setup_decryptions", k * n_seeds)


def value_cores(bases, gamma_ji: int, blocks, nsq) -> list:
    """Neighbour ``j``'s unmasked reply of step 5: per packed block ``b`` of ``q_j``,
    ``prod_t (B_t^{gamma_ji})^{q_{j,b,t}} = E_i(gamma_ij gamma_ji M(q_j,b))`` from ``i``'s shifted
    encryptions ``bases`` (:mod:`.multiexp`). Pure arithmetic (the one-process rounds and a
    rank's run it)."""
    if gamma_ji < 0:
        raise ValueError("scalar multiplication needs a nonnegative integer exponent")
    scaled = gmpy2.powmod_base_list(bases, gmpy2.mpz(gamma_ji), nsq)  # E_i(rho_ij 2^{w t}), in C
    return signed_multi_exps(scaled, blocks, nsq)


def value_blocks(values, slots: int) -> list:
    return [values[s:s + slots] for s in range(0, len(values), slots)]


class _Masked:
    """What both paths share: the plan, the ciphertexts of step 1 kept for step 5, the messages."""

    def __init__(self, rounds, plan: MaskPlan):
        self.r, self.plan = rounds, plan
        self.c = None  # E_i(gamma_ij) per edge, from the last penalty round
        self.c_gamma = None

    def _product(self, replies, round_no: int, combine=None) -> dict:
        """``i``'s homomorphic sums: the product of its neighbours' replies, ciphertext by ciphertext
        (``combine(i, a, b)``: the counted addition of the naive path), then the edge units of its
        neighbours removed (``i`` holds the edge seeds; the pair units cancel by themselves)."""
        net, plan = self.r.net, self.plan
        acc = {}
        for i, rep in zip(net.src, replies):
            if i not in acc:
                acc[i] = list(rep)
            elif combine is not None:
                acc[i] = combine(i, acc[i], rep)
            else:
                nsq = net.agents[i].nsquare
                acc[i] = [a * b % nsq for a, b in zip(acc[i], rep)]
        for i, cts in acc.items():
            ag = net.agents[i]
            edge_tags = [(plan.tags[e][-1][0], -1) for e in plan.out_edges[i]]
            strip = ag.mask_units(edge_tags, i, round_no, ag.n, len(cts))
            acc[i] = [a * u % ag.nsquare for a, u in zip(cts, strip)]
        return acc

    def _mask(self, e: int, round_no: int, cts, fresh) -> list:
        """``j``'s reply ciphertexts for edge ``e`` times its mask units (and the fresh obfuscators
        ``fresh`` when ``j`` is the designated neighbour of ``i``, None otherwise)."""
        net, plan = self.r.net, self.plan
        i, j = net.src[e], net.dst[e]
        ag = net.agents[i]
        units = net.agents[j].mask_units(plan.tags[e], i, round_no, ag.n, len(cts))
        nsq = ag.nsquare
        out = [c * u % nsq for c, u in zip(cts, units)]
        if fresh is not None:
            out = [c * f % nsq for c, f in zip(out, fresh)]
        return out

    def _send_gamma(self):
        net = self.r.net
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            self.r._send_reply(i, j, net.agents[i].public_key, (self.c[e],), "enc_gamma")

    def _send_replies(self, replies, kind):
        net = self.r.net
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            self.r._send_reply(j, i, net.agents[i].public_key, replies[e], kind)


class FastMasked(_Masked):
    """The masked rounds on the fast path (:class:`~.rounds.FastRounds`: its supply, lanes, layout)."""

    def penalty_round(self, gamma, bcd_iter, admm_iter):
        r, plan = self.r, self.plan
        net = r.net
        agents, src, dst, rev, led = net.agents, net.src, net.dst, net.rev, net.ledger
        with led.timed("time_encrypt"):
            own = {i: agents[i].own_obfuscators(net.degree[i]) for i in net.senders}
            obf = r.supply.take({i: 1 + (net.degree[i] if own[i] is None else 0) for i in net.senders})
            r.supply.refill()
            fresh = {i: obf[i][0] for i in net.senders}
            mine = {i: (own[i] if own[i] is not None else obf[i][1:]) for i in net.senders}
            c = []
            for e, i in enumerate(src):
                ag = agents[i]
                c.append((1 + ag.n * (gamma[e] % ag.n)) * mine[i].pop() % ag.nsquare)  # i: E_i(gamma_ij)
            led.add("encryptions", len(src) + len(net.senders))
        self.c, self.c_gamma = c, list(gamma)
        rnd = plan.next_round()

        def reply(e):  # j: E_i(gamma_ij)^{gamma_ji}, masked
            i, j = src[e], dst[e]
            t = gmpy2.powmod(c[e], gmpy2.mpz(gamma[rev[e]]), agents[i].nsquare)
            return self._mask(e, rnd, [t], [fresh[i]] if plan.designated[i] == j else None)

        with led.timed("time_homomorphic"):
            replies = r._map(reply, range(len(src)))
            acc = self._product(replies, rnd)
            led.add("scalar_multiplications", len(src))
            led.add("homomorphic_additions", len(src) - len(acc))
        self._send_gamma()
        self._send_replies(replies, "enc_masked_penalty")
        return r._decrypt_sums(acc, 1, r._decrypter(r._layout1, 1, bcd_iter, admm_iter), (net.n_nodes,))

    def value_round(self, qh, gh, P, bcd_iter, admm_iter):
        r, plan = self.r, self.plan
        net, lay = r.net, r.layout
        agents, src, dst, rev, led = net.agents, net.src, net.dst, net.rev, net.ledger
        D = len(src)
        if not D:
            return net.to_device([0] * (net.n_nodes * P), (net.n_nodes, P))
        S, C = lay.slots, lay.n_ciphertexts(P)
        used = min(S, P)
        c = self.c
        with led.timed("time_homomorphic"):  # i: its shifted encryptions E_i(gamma_ij 2^{w t})
            bases = [None] * D
            for i in net.senders:
                es = plan.out_edges[i]
                for e, row in zip(es, agents[i].shifted([c[e] for e in es], lay.slot_bits, used)):
                    bases[e] = row
            led.add("scalar_multiplications", D * (used - 1))
        with led.timed("time_encrypt"):
            fresh = r.supply.take({i: C for i in net.senders})
            r.supply.refill()
            led.add("encryptions", C * len(net.senders))
        blocks = {j: value_blocks(qh[j], S) for j in set(dst)}
        rnd = plan.next_round()

        def reply(e):  # j: per block, prod_t (B_t^{gamma_ji})^{q_t} = E_i(rho_ij M(q_j,b)), masked
            i, j = src[e], dst[e]
            cores = value_cores(bases[e], gh[rev[e]], blocks[j], agents[i].nsquare)
            return self._mask(e, rnd, cores, fresh[i] if plan.designated[i] == j else None)

        with led.timed("time_homomorphic"):
            replies = r._map(reply, range(D))
            acc = self._product(replies, rnd)
            led.add("scalar_multiplications", D * P)
            led.add("homomorphic_additions", D * (P - C) + (D - len(acc)) * C)
        if used > 1:
            for e, (i, j) in enumerate(zip(src, dst)):
                r._send_reply(i, j, agents[i].public_key, bases[e][1:], "enc_shifted")
        self._send_replies(replies, "enc_masked_reply")
        return r._decrypt_sums(acc, P, r._decrypter(lay, P, bcd_iter, admm_iter), (net.n_nodes, P))


class NaiveMasked(_Masked):
    """The masked rounds on the naive path (:class:`~.rounds.NaiveRounds`): one value per
    ciphertext, phe's encryption and one ``powmod`` per value, through the counted raw layer."""

    def penalty_round(self, gamma, bcd_iter, admm_iter):
        r, plan = self.r, self.plan
        net, raw = r.net, r.raw
        agents, src, dst, rev = net.agents, net.src, net.dst, net.rev
        c = [raw.encrypt(agents[i].public_key, [gamma[e] % agents[i].n])[0] for e, i in enumerate(src)]
        self.c, self.c_gamma = c, list(gamma)
        rnd = plan.next_round()
        replies = []
        for e, (i, j) in enumerate(zip(src, dst)):
            pk = agents[i].public_key
            t = raw.scalar_mul(pk, [c[e]], gamma[rev[e]])
            fresh = raw.encrypt(pk, [0]) if plan.designated[i] == j else None  # a fresh obfuscator
            replies.append(self._mask(e, rnd, t, fresh))
        acc = self._product(replies, rnd, self._add)
        self._send_gamma()
        self._send_replies(replies, "enc_masked_penalty")
        return r._decrypt_sums(acc, 1, r._decrypter(bcd_iter, admm_iter), (net.n_nodes,))

    def value_round(self, qh, gh, P, bcd_iter, admm_iter):
        r, plan = self.r, self.plan
        net, raw = r.net, r.raw
        agents, src, dst, rev = net.agents, net.src, net.dst, net.rev
        if not src:
            return net.to_device([0] * (net.n_nodes * P), (net.n_nodes, P))
        rnd = plan.next_round()
        replies = []
        for e, (i, j) in enumerate(zip(src, dst)):
            pk, n = agents[i].public_key, agents[i].n
            g = gh[rev[e]]
            if g < 0:
                raise ValueError("scalar multiplication needs a nonnegative integer exponent")
            cores = [raw.scalar_mul(pk, [self.c[e]], int(g * v % n))[0] for v in qh[j]]
            fresh = raw.encrypt(pk, [0] * P) if plan.designated[i] == j else None
            replies.append(self._mask(e, rnd, cores, fresh))
        acc = self._product(replies, rnd, self._add)
        self._send_replies(replies, "enc_masked_reply")
        return r._decrypt_sums(acc, P, r._decrypter(bcd_iter, admm_iter), (net.n_nodes, P))

    def _add(self, i, a, b) -> list:
        return self.r.raw.add(self.r.net.agents[i].public_key, a, b)
