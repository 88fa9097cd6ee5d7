"""The protocol's rounds on the host (lines 10-16): one interface, two implementations.

A bound :class:`~.exchange.PaillierExchange` runs its rounds through one :class:`Rounds`
object, chosen once in ``bind``:

* :class:`NaiveRounds` (``fast=False``): one phe ``raw_encrypt`` (``r^n mod n^2``) and one
  ``raw_decrypt`` per value, serial, through :class:`~.keys.RawPaillier` (products mod
  ``n^2`` for homomorphic additions, ``gmpy2.powmod`` for scalar multiplications by the
  nonnegative integer penalties), which counts and times every operation.
* :class:`FastRounds` (``fast=True``, the default): the same protocol on raw ``gmpy2.mpz``
  ciphertexts, with

  - ``packing`` (:mod:`~ppdnmf_torch.exchange.packing`): ``S`` values per plaintext (32 at
    2048 bits), slot width derived from the codec's range, offsets added at decoding,
    unpacked exactly; a message of ``P`` values is ``ceil(P / S)`` ciphertexts, and every
    operation count drops by that factor;
  - ``precompute`` (:mod:`.obfuscation`, :mod:`.pool`): public-key obfuscators made ahead
    of use by the worker pool (a stock per public key, refilled in the background), and
    the key owner's own obfuscators made with its CRT factors inside its agent (same
    distribution as ``r^n mod n^2``);
  - ``djn``: Damgard-Jurik-Nielsen short-exponent obfuscators with a fixed-base table,
    under DJN's short-exponent assumption (:mod:`.obfuscation`);
  - ``workers``: processes that make public-key obfuscators; they receive public moduli
    only. Decryption, the owner's CRT obfuscators, the homomorphic operations, packing and
    unpacking run in the agent's (the caller's) process; from 1024-bit keys up the two CRT
    halves of a decryption or of a batch of the owner's obfuscators run side by side in two
    threads of that process (:class:`~.obfuscation.PrivateCRT`), and from
    :data:`~.pool.LANE_MIN_KEY_BITS` up the per-edge homomorphic work runs in one thread
    lane per worker (:class:`~.pool.ThreadLanes`).

Neighbour ``j``'s reply puts its fresh randomness last on both paths: the naive one computes
``E_i(-q_i)^{gamma_ji} E_i(gamma_ji q_j)``, the fast one
``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji} rho_j`` with ``j``'s fresh obfuscator ``rho_j`` (one
encryption, one addition, one scalar multiplication per ciphertext either way). The
paper's ``[E_i(q_j) E_i(-q_i)]^{gamma_ji}`` as printed would carry the randomness
``(r_j r_i)^{n gamma_ji}``, which lies in the subgroup of ``gamma_ji``-th powers: agent ``i``,
who knows the factorization, could test that membership and learn, for instance, the
parity of ``gamma_ji`` (and a zero penalty would send the ciphertext 1). The replies'
randomness here is uniform and independent of ``gamma_ji``; both paths decrypt to the same
integers.

Both paths count the operations they perform (each fresh obfuscator applied is one
encryption; with packing, counts are per ciphertext) and ``exchange="quantized"`` with
``cost_model=True`` predicts the same counts for the same ``packing`` / ``slot_bits``.
"""
from __future__ import annotations

import abc
import warnings

import gmpy2
import torch

from ..codec import IntegerCodec
from ..costmodel import ciphertext_nbytes, public_key_nbytes
from ..packing import SlotLayout, derive_layout
from .keys import EncryptedVector, RawPaillier
from .network import Network
from .pool import LANE_MIN_KEY_BITS, ObfuscatorSupply, ThreadLanes, WorkerPool

__all__ = ["Rounds", "NaiveRounds", "FastRounds", "packed_reply"]


def _exponent(k: int):
    """A penalty as the exponent of a homomorphic scalar multiplication (nonnegative)."""
    if k < 0:
        raise ValueError("scalar multiplication needs a nonnegative integer exponent")
    return gmpy2.mpz(k)


def packed_reply(n, nsq, packed_q_j, request, gamma_ji: int, obfuscators) -> list:
    """Lines 13-14 at neighbour ``j``, packed: ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji}`` times ``j``'s
    fresh obfuscators, after the exponentiation (module docstring); ``n`` is ``i``'s modulus,
    ``packed_q_j`` the signed packed plaintexts of ``q_j``, ``request`` the ciphertexts of
    ``E_i(-q_i)``. Pure arithmetic (both the one-process rounds and a rank's run it)."""
    k = _exponent(gamma_ji)
    bases = [(1 + n * (m % n)) * c % nsq for m, c in zip(packed_q_j, request)]
    return [x * r % nsq for x, r in zip(gmpy2.powmod_base_list(bases, k, nsq), obfuscators)]


class Rounds(abc.ABC):
    """The rounds of one bound exchange, over its :class:`~.network.Network`.

    Every round takes the host's Python integers (``gamma`` per directed edge in edge
    order; ``qh[i]`` the ``P`` quantized values of node ``i``) and returns the decrypted
    integer sums as int64 on the device.
    """

    #: the slot layout of the exchange phase; None: one value per plaintext (unpacked)
    layout: SlotLayout | None = None

    #: the masked protocol's rounds on this path (:mod:`.masked`), made by :meth:`enable_masked`
    masked = None

    def __init__(self, net: Network):
        self.net = net

    def enable_masked(self, plan) -> None:
        """Run ``protocol="masked"``: its rounds on this path, with the mask plan ``plan``."""
        from .masked import FastMasked, NaiveMasked  # masked imports this module's neighbours only

        self.masked = (FastMasked if isinstance(self, FastRounds) else NaiveMasked)(self, plan)

    def prepare(self, P: int) -> None:
        """Called before an exchange round of ``P`` values per agent (no-op by default)."""

    @abc.abstractmethod
    def penalty_round(self, gamma: list, bcd_iter: int, admm_iter: int) -> torch.Tensor:
        """The aggregated protocol's step 1 (an encrypted mini-round): ``i -> j``: ``kp_i``;
        ``j -> i``: ``E_i(gamma_ji)``; ``i`` raises each reply to ``gamma_ij``, multiplies over
        its neighbours and decrypts only ``rho_int_i = sum_j gamma_ij gamma_ji``, ``(A,)``."""

    @abc.abstractmethod
    def paper_round(self, qh: list, gh: list, P: int, bcd_iter: int, admm_iter: int) -> torch.Tensor:
        """Lines 10-16 as printed: ``i -> j``: ``E_i(-q_i)`` and ``kp_i``; ``j -> i``:
        ``E_i(gamma_ji (q_j - q_i))``; ``i`` decrypts every reply on its own, weighs it by its
        ``gamma_ij`` and sums: ``S_int (A, P)``."""

    @abc.abstractmethod
    def aggregated_round(self, qh: list, gh: list, P: int, bcd_iter: int, admm_iter: int) -> torch.Tensor:
        """Step 5 of the aggregated protocol: ``i -> j``: ``E_i(-q_i)`` (``kp_i`` went with step
        1); ``j -> i``: the reply; ``i`` raises each reply to ``gamma_ij``, multiplies over its
        neighbours and decrypts only ``S_int_i``, ``(A, P)``."""

    def close(self) -> None:
        """Stop whatever the rounds run on, and let go of the network (and its agents)."""
        self.net = None

    # -- shared by both paths ------------------------------------------------------------
    def _send_request(self, i: int, j: int, request: EncryptedVector, *, with_key: bool) -> None:
        """``i -> j``: ``E_i(-q_i)``, with ``kp_i`` in the paper protocol."""
        if with_key:
            pk = request.public_key
            self.net.send(i, j, request.nbytes + public_key_nbytes(pk.n.bit_length()), "enc_neg_u_and_key",
                          list(request.ciphertexts) + [pk.n])
        else:
            self.net.send(i, j, request.nbytes, "enc_neg_u", request.ciphertexts)

    def _send_reply(self, j: int, i: int, public_key, ciphertexts, kind: str = "enc_reply") -> None:
        self.net.send(j, i, len(ciphertexts) * ciphertext_nbytes(public_key.n.bit_length()), kind, ciphertexts)

    def _send_key(self, i: int, j: int, public_key) -> None:
        self.net.send(i, j, public_key_nbytes(public_key.n.bit_length()), "public_key", (public_key.n,))

    def _paper_messages(self, requests: dict, reply_of, decrypt, gh: list, P: int) -> torch.Tensor:
        """The paper protocol's messages, edge by edge: the request and its reply
        (``reply_of(e, request)``, ciphertexts), which ``i`` decrypts on its own
        (``decrypt(i, reply)``, lines 15-16); then the weighted sum on the host."""
        net = self.net
        decrypted = []
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            req = requests[i]
            self._send_request(i, j, req, with_key=True)
            reply = EncryptedVector(req.public_key, reply_of(e, req))
            self._send_reply(j, i, req.public_key, reply.ciphertexts)
            decrypted.append(decrypt(i, reply))
        return net.weighted_reply_sums(decrypted, gh, P)

    def _decrypt_sums(self, acc: dict, P: int, decrypt, shape) -> torch.Tensor:
        """Every agent decrypts its homomorphic sum (``acc[i]``, ciphertexts of ``P`` values;
        ``decrypt(i, message)``); nodes without neighbours get zeros. ``shape`` on the device."""
        net = self.net
        flat = [0] * (net.n_nodes * P)
        for i, cts in acc.items():
            ag = net.agents[i]
            flat[i * P:(i + 1) * P] = decrypt(i, EncryptedVector(ag.public_key, cts))
        return net.to_device(flat, shape)


class NaiveRounds(Rounds):
    """``fast=False``: one phe operation per value, serial, through :class:`~.keys.RawPaillier`."""

    def __init__(self, net: Network, raw: RawPaillier):
        super().__init__(net)
        self.raw = raw

    def penalty_round(self, gamma, bcd_iter, admm_iter):
        net, raw = self.net, self.raw
        acc = {}
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            pk = net.agents[i].public_key
            self._send_key(i, j, pk)  # i -> j: kp_i
            reply = raw.encrypt(pk, [gamma[net.rev[e]]])  # j: E_i(gamma_ji)
            self._send_reply(j, i, pk, reply, "enc_penalty")
            term = raw.scalar_mul(pk, reply, gamma[e])  # i: E_i(gamma_ij gamma_ji)
            acc[i] = term if i not in acc else raw.add(pk, acc[i], term)
        return self._decrypt_sums(acc, 1, self._decrypter(bcd_iter, admm_iter), (net.n_nodes,))

    def paper_round(self, qh, gh, P, bcd_iter, admm_iter):
        net = self.net
        if not net.src:
            return net.to_device([0] * (net.n_nodes * P), (net.n_nodes, P))
        requests = self._requests(qh)

        def reply_of(e, req):
            return self._reply(req, qh[net.dst[e]], gh[net.rev[e]])

        return self._paper_messages(requests, reply_of, self._decrypter(bcd_iter, admm_iter), gh, P)

    def aggregated_round(self, qh, gh, P, bcd_iter, admm_iter):
        net, raw = self.net, self.raw
        requests = self._requests(qh)
        acc = {}
        for e, (i, j) in enumerate(zip(net.src, net.dst)):
            req = requests[i]
            pk = req.public_key
            self._send_request(i, j, req, with_key=False)
            reply = self._reply(req, qh[j], gh[net.rev[e]])
            self._send_reply(j, i, pk, reply)
            term = raw.scalar_mul(pk, reply, gh[e])  # i raises the reply to its own gamma_ij
            acc[i] = term if i not in acc else raw.add(pk, acc[i], term)  # homomorphic sum
        return self._decrypt_sums(acc, P, self._decrypter(bcd_iter, admm_iter), (net.n_nodes, P))

    def _decrypter(self, bcd_iter, admm_iter):
        agents = self.net.agents
        return lambda i, message: agents[i].decrypt(message, bcd_iter=bcd_iter, admm_iter=admm_iter)

    def _requests(self, qh: list) -> dict:
        """Lines 10-11: every agent with neighbours encrypts ``-q_i`` under its own key."""
        agents = self.net.agents
        return {i: agents[i].encrypt([-v for v in qh[i]]) for i in self.net.senders}

    def _reply(self, request: EncryptedVector, q_j: list, gamma_ji: int) -> list:
        """Lines 13-14 at neighbour ``j``: ``E_i(gamma_ji (q_j - q_i))`` (public-key operations),
        as ``E_i(-q_i)^{gamma_ji} E_i(gamma_ji q_j)``: the fresh encryption last, so that the
        reply's randomness does not depend on ``gamma_ji`` (module docstring)."""
        raw, pk = self.raw, request.public_key
        n = pk.n
        enc = raw.encrypt(pk, [gamma_ji * v % n for v in q_j])
        return raw.add(pk, raw.scalar_mul(pk, request.ciphertexts, gamma_ji), enc)


class FastRounds(Rounds):
    """``fast=True``: raw ``mpz`` arithmetic, packing, precomputed / CRT / DJN obfuscators, the
    worker pool and the thread lanes (module docstring).

    The per-edge work (replies, scalar multiplications) runs on the thread lanes, one per
    worker; the messages, the counts and the homomorphic sums follow in edge order in the
    calling thread, as on a serial loop. A round that fails in its per-edge work (a
    negative penalty) sends and counts nothing of that work.

    Parameters
    ----------
    net : Network
    codec : IntegerCodec
    layout : SlotLayout
        Of the exchange phase (one slot per plaintext without packing).
    protocol : {"aggregated", "paper"}
    precompute, djn : bool
    djn_bits : int or None
        The DJN exponent size (with ``djn``).
    workers : int
        Worker processes to start (0: in-process); :attr:`workers` is 0 after a pool that
        did not start.
    pool_audit : callable, optional
        Sees the pickled arguments of every pool task (tests).
    """

    def __init__(self, net: Network, *, codec: IntegerCodec, layout: SlotLayout, protocol: str, precompute: bool,
                 djn: bool, djn_bits, workers: int, pool_audit=None):
        super().__init__(net)
        self.layout = layout
        self._layout1 = derive_layout(codec, packing=False)  # the penalty mini-round: never packed
        self._protocol = protocol
        self._djn = djn
        own = "djn" if djn else ("crt" if precompute else None)
        for ag in net.agents:
            ag._enable_fast(own_mode=own, djn_bits=djn_bits)
        moduli = {i: net.agents[i].n for i in net.senders}
        self.pool = None
        if workers and moduli:
            try:
                self.pool = WorkerPool(workers, audit=pool_audit)
            except Exception as exc:  # pragma: no cover - a host without working subprocesses
                warnings.warn(f"PaillierExchange: the worker pool did not start ({exc!r}); working in-process",
                              RuntimeWarning, stacklevel=4)
                workers = 0
        self.workers = workers
        # the edges' homomorphic work: one thread lane per worker (in this process)
        lanes = workers >= 2 and codec.key_bits >= LANE_MIN_KEY_BITS
        self.lanes = ThreadLanes(workers) if lanes else None
        self.supply = ObfuscatorSupply(moduli, djn_bits=djn_bits, pool=self.pool,
                                       stock={} if precompute else None)
        self._stock_lk = None
        self.prepare(0)

    def prepare(self, P: int) -> None:
        """Stock mode: keep two ADMM iterations' public obfuscators ready per key, for ``P`` values.

        Per iteration, key ``i`` needs ``d_i ceil(P / S)`` for its neighbours' replies and, in
        the aggregated protocol, ``d_i`` for the penalty mini-round. Before the first exchange
        (``P = 0``) only the mini-round's are planned.
        """
        sup = self.supply
        if sup is None or self._stock_lk == P:
            return
        self._stock_lk = P
        C = self.layout.n_ciphertexts(P)
        deg = self.net.degree
        if self._protocol == "masked":
            # the designated neighbour's fresh obfuscators (C + 1), and i's own E_i(gamma_ij)
            # when the owner makes no obfuscators of its own
            agents = self.net.agents
            per_iter = {i: C + 1 + (0 if agents[i]._own_mode is not None else deg[i]) for i in sup.moduli}
        else:
            pen = self._protocol == "aggregated"
            per_iter = {i: deg[i] * C + (deg[i] if pen else 0) for i in sup.moduli}
        total = sum(per_iter.values())
        # a few tasks per worker and iteration: ~1 for cheap DJN obfuscators, ~4 otherwise
        tasks = max(1, self.workers) * (1 if self._djn else 4)
        sup.chunk = max(1, -(-total // tasks))
        if sup.targets is not None:
            sup.targets = {i: 2 * c for i, c in per_iter.items()}
            sup.refill()

    def close(self) -> None:
        for name in ("supply", "pool", "lanes"):
            part = getattr(self, name)
            if part is not None:
                part.close()
                setattr(self, name, None)
        super().close()

    # -- the rounds ----------------------------------------------------------------------
    def penalty_round(self, gamma, bcd_iter, admm_iter):
        net = self.net
        agents, led, src = net.agents, net.ledger, net.src
        with led.timed("time_encrypt"):
            obf = self.supply.take({i: net.degree[i] for i in net.senders})
            self.supply.refill()
            replies = []  # j: E_i(gamma_ji)
            for e, i in enumerate(src):
                ag = agents[i]
                replies.append((1 + ag.n * (gamma[net.rev[e]] % ag.n)) * obf[i].pop() % ag.nsquare)

        def term(e):  # i: E_i(gamma_ij gamma_ji)
            return gmpy2.powmod_base_list([replies[e]], _exponent(gamma[e]), agents[src[e]].nsquare)[0]

        with led.timed("time_homomorphic"):
            terms = self._map(term, range(len(src)))
            acc = {}
            for i, t in zip(src, terms):
                acc[i] = [t] if i not in acc else [acc[i][0] * t % agents[i].nsquare]
            led.add("encryptions", len(src))
            led.add("scalar_multiplications", len(src))
            led.add("homomorphic_additions", len(src) - len(acc))
        for e, (i, j) in enumerate(zip(src, net.dst)):
            pk = agents[i].public_key
            self._send_key(i, j, pk)  # i -> j: kp_i
            self._send_reply(j, i, pk, (replies[e],), "enc_penalty")
        return self._decrypt_sums(acc, 1, self._decrypter(self._layout1, 1, bcd_iter, admm_iter), (net.n_nodes,))

    def paper_round(self, qh, gh, P, bcd_iter, admm_iter):
        net, lay = self.net, self.layout
        if not net.src:
            return net.to_device([0] * (net.n_nodes * P), (net.n_nodes, P))
        C = lay.n_ciphertexts(P)
        requests, obf = self._requests(qh, C)
        packed = {j: lay.pack_signed(qh[j]) for j in set(net.dst)}
        with net.ledger.timed("time_homomorphic"):
            replies = self._map(lambda e: self._reply(e, requests, packed, gh, obf[e]), range(len(net.src)))
            self._account_replies(C)
        return self._paper_messages(requests, lambda e, req: replies[e],
                                    self._decrypter(lay, P, bcd_iter, admm_iter), gh, P)

    def aggregated_round(self, qh, gh, P, bcd_iter, admm_iter):
        net, lay, led = self.net, self.layout, self.net.ledger
        agents, src = net.agents, net.src
        D = len(src)
        if not D:
            return net.to_device([0] * (net.n_nodes * P), (net.n_nodes, P))
        C = lay.n_ciphertexts(P)
        requests, obf = self._requests(qh, C)
        packed = {j: lay.pack_signed(qh[j]) for j in set(net.dst)}

        def edge(e):  # j's reply; i raises it to its own gamma_ij
            reply = self._reply(e, requests, packed, gh, obf[e])
            return reply, gmpy2.powmod_base_list(reply, _exponent(gh[e]), agents[src[e]].nsquare)

        with led.timed("time_homomorphic"):
            done = self._map(edge, range(D))
            acc = {}
            for i, (_, term) in zip(src, done):  # i's homomorphic sum
                nsq = agents[i].nsquare
                acc[i] = term if i not in acc else [a * b % nsq for a, b in zip(acc[i], term)]
            self._account_replies(C)
            led.add("scalar_multiplications", C * D)
            led.add("homomorphic_additions", C * (D - len(acc)))
        for (i, j), (reply, _) in zip(zip(src, net.dst), done):
            req = requests[i]
            self._send_request(i, j, req, with_key=False)
            self._send_reply(j, i, req.public_key, reply)
        return self._decrypt_sums(acc, P, self._decrypter(lay, P, bcd_iter, admm_iter), (net.n_nodes, P))

    # -- their parts -----------------------------------------------------------------------
    def _map(self, fn, items) -> list:
        lanes = self.lanes
        return [fn(x) for x in items] if lanes is None else lanes.map(fn, items)

    def _decrypter(self, layout: SlotLayout, count: int, bcd_iter, admm_iter):
        """``decrypt(i, message)``: agent ``i`` decrypts and unpacks ``count`` values (counted, timed)."""
        agents, led = self.net.agents, self.net.ledger

        def decrypt(i, message):
            with led.timed("time_decrypt"):
                out = agents[i].decrypt_packed(message, layout, count, bcd_iter=bcd_iter, admm_iter=admm_iter)
                led.add("decryptions", len(message))
            return out

        return decrypt

    def _requests(self, qh: list, C: int):
        """Lines 10-11, packed: every agent with neighbours encrypts ``-q_i`` under its own key.

        Also fetches the public-key obfuscators of this round's replies (``d_i C`` per key
        ``i``), and returns them with the requests, as each edge's ``C`` (in edge order).
        """
        net, lay = self.net, self.layout
        agents = net.agents
        with net.ledger.timed("time_encrypt"):
            own = {i: agents[i].own_obfuscators(C) for i in net.senders}
            demand = {i: net.degree[i] * C + (C if own[i] is None else 0) for i in net.senders}
            obf = self.supply.take(demand)
            self.supply.refill()
            requests = {}
            for i in net.senders:
                ag = agents[i]
                n, nsq = ag.n, ag.nsquare
                mine = own[i]
                if mine is None:
                    mine, obf[i] = obf[i][:C], obf[i][C:]
                cts = [(1 + n * m) * r % nsq for m, r in zip(lay.pack([-v for v in qh[i]], n), mine)]
                requests[i] = EncryptedVector(ag.public_key, cts)
            used = dict.fromkeys(obf, 0)
            per_edge = []
            for i in net.src:
                per_edge.append(obf[i][used[i]:used[i] + C])
                used[i] += C
            net.ledger.add("encryptions", C * len(net.senders))
        return requests, per_edge

    def _reply(self, e: int, requests: dict, packed: dict, gh: list, obfuscators: list) -> list:
        """Lines 13-14 at neighbour ``j`` of edge ``e = (i, j)``, packed: ``E_i(gamma_ji (q_j - q_i))``,
        freshly obfuscated: ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji}`` (a plaintext addition and a
        scalar multiplication) times a fresh obfuscator of ``j``'s, after the exponentiation
        (module docstring). Pure arithmetic (no counts, no messages): it runs on the lanes.
        """
        net = self.net
        i = net.src[e]
        ag = net.agents[i]
        return packed_reply(ag.n, ag.nsquare, packed[net.dst[e]], requests[i].ciphertexts, gh[net.rev[e]],
                            obfuscators)

    def _account_replies(self, C: int) -> None:
        """One encryption, one addition and one scalar multiplication per reply ciphertext."""
        D = len(self.net.src)
        led = self.net.ledger
        led.add("encryptions", C * D)
        led.add("homomorphic_additions", C * D)
        led.add("scalar_multiplications", C * D)
