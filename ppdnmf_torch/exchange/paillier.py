"""``exchange="paillier"``: the real secure exchange (lines 10-16) with :mod:`phe`, on the host.

Every node (agent ``i`` of trial ``t`` is node ``t * N + i``) is an :class:`_Agent` with
its own Paillier key pair ``(kp_i, ks_i)``, generated in :meth:`PaillierExchange.bind`.
The private key never leaves its agent object: only the agent decrypts, the messages
carry ciphertexts and public keys only, and neither the agents nor the exchange can be
pickled, copied or printed with key material.

The inputs are quantized exactly as ``exchange="quantized"`` does
(:func:`~ppdnmf_torch.exchange.quantized.encode_inputs`: ``q_i = round(n_max U_i)``,
``gamma = round(2^s g)``, the same range checks), and the decrypted integers go through
the same :meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.decode`, so the two kinds
return bit-identical ``S`` and ``rho``. Negative integers are encrypted as residues mod
``n``; decrypted residues are mapped back with
:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.from_residue`, which raises
:class:`~ppdnmf_torch.exchange.codec.CodecRangeError` instead of wrapping silently.

Message flows (``i`` an agent, ``j in N_i``; ``E_i`` encryption under ``kp_i``)
--------------------------------------------------------------------------------
``protocol="paper"`` (lines 10-16 as printed):

1. step 1: the simulation hands ``rho_i = sum_j gamma_ij gamma_ji / 4^s`` to agent ``i``.
   The paper does not say how ``i`` obtains it without learning ``g_{j->i}``; this is an
   assumption of the simulation (see ALGORITHM.md, "A gap in the paper's protocol").
2. ``i -> j``: ``E_i(-q_i)`` (``P = L K`` ciphertexts) and ``kp_i``.
3. ``j -> i``: ``[E_i(q_j) E_i(-q_i)]^{gamma_ji} = E_i(gamma_ji (q_j - q_i))``.
4. ``i`` decrypts every neighbour's reply on its own, multiplies by its ``gamma_ij`` and
   sums: ``S_int_i = sum_j gamma_ij gamma_ji (q_j - q_i)``.

``protocol="aggregated"`` (default):

1. step 1 (:meth:`~PaillierExchange.penalty_sums`, an encrypted mini-round):
   ``i -> j``: ``kp_i``; ``j -> i``: ``E_i(gamma_ji)``; ``i`` raises each reply to
   ``gamma_ij``, multiplies over its neighbours and decrypts only the sum ``rho_int_i``.
2. step 5 (:meth:`~PaillierExchange.exchange`): ``i -> j``: ``E_i(-q_i)``;
   ``j -> i``: ``E_i(gamma_ji (q_j - q_i))`` as above; ``i`` raises each reply to
   ``gamma_ij``, multiplies over its neighbours and decrypts only ``S_int_i``.
   ``rho_i`` is the one of step 1 (the mini-round runs again here only when the
   penalties differ from step 1's).

Agent ``i`` learns ``S_i`` and ``rho_i`` and nothing per neighbour (with one neighbour,
``rho_i`` still reveals that neighbour's penalty).

The operation counts and bytes of both protocols are derived in
:mod:`ppdnmf_torch.exchange.costmodel`; :meth:`PaillierExchange.costs` reports what this
stage actually performed (the tests check that the two agree).

Per call, the quantized integers cross from the device to the host once (one ``.cpu()``
of one int64 tensor) and the integer result goes back once (timed as ``time_transfer``).

Raw arithmetic: the ciphertext arithmetic goes through :class:`RawPaillier`
(``raw_encrypt``, ``raw_decrypt``, products mod ``n^2`` for homomorphic additions,
``gmpy2.powmod`` for scalar multiplications by the nonnegative integer penalties),
a small layer that a faster backend (packing, process pools, precomputed obfuscators)
can replace.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
import warnings

import gmpy2
import phe
import torch

from .._utils import ConfigError
from .base import Exchange, ExchangeOutput
from .codec import CodecRangeError, IntegerCodec
from .costmodel import COUNT_KEYS, TIME_KEYS, CostLedger, PaillierOpCosts, calibrate, estimate_seconds
from .quantized import encode_inputs, integer_penalty_sums

__all__ = [
    "PaillierExchange",
    "InsecureKeyWarning",
    "KeyMismatchError",
    "EncryptedVector",
    "RawPaillier",
    "SECURE_KEY_BITS",
    "MIN_KEY_BITS",
]

#: key sizes below this warn (:class:`InsecureKeyWarning`)
SECURE_KEY_BITS = 2048
#: smallest key size accepted (the codec needs room for its limit)
MIN_KEY_BITS = 64

_PROTOCOLS = ("aggregated", "paper")


class InsecureKeyWarning(UserWarning):
    """Paillier keys shorter than 2048 bits: for experiments only."""


class KeyMismatchError(ValueError):
    """An agent was handed a message encrypted under another agent's public key."""


def _refuse_pickle(obj):
    raise TypeError(
        f"{type(obj).__name__} holds Paillier private keys and cannot be pickled, copied or "
        "serialized; checkpoint the solver state instead and regenerate keys on resume"
    )


def _ct_nbytes(public_key) -> int:
    """Bytes of one ciphertext under ``public_key``: ``ceil(bits(n^2) / 8)``."""
    return (public_key.nsquare.bit_length() + 7) // 8


def _pk_nbytes(public_key) -> int:
    """Bytes of the public key itself: ``ceil(bits(n) / 8)``."""
    return (public_key.n.bit_length() + 7) // 8


class EncryptedVector:
    """A message: ciphertexts (elements of ``Z_{n^2}``) under one public key."""

    __slots__ = ("public_key", "ciphertexts")

    def __init__(self, public_key, ciphertexts):
        self.public_key = public_key
        self.ciphertexts = ciphertexts

    def __len__(self) -> int:
        return len(self.ciphertexts)

    @property
    def nbytes(self) -> int:
        return len(self.ciphertexts) * _ct_nbytes(self.public_key)

    def __repr__(self) -> str:
        return f"EncryptedVector({len(self.ciphertexts)} ciphertexts, {self.public_key.n.bit_length()}-bit key)"


class RawPaillier:
    """Vector operations on raw Paillier ciphertexts (``gmpy2.mpz``), counted and timed.

    The one layer a faster backend replaces. ``ledger`` (a
    :class:`~ppdnmf_torch.exchange.costmodel.CostLedger` or None) receives the counts
    and the times.
    """

    def __init__(self, ledger: CostLedger | None):
        self.ledger = ledger

    def _account(self, count_key, n, time_key, t0):
        led = self.ledger
        if led is not None:
            led.add(count_key, n)
            led.add(time_key, time.perf_counter() - t0)

    def encrypt(self, public_key, residues) -> list:
        """``E(m)`` for residues ``0 <= m < n`` (Python ints)."""
        t0 = time.perf_counter()
        enc = public_key.raw_encrypt
        out = [gmpy2.mpz(enc(int(m))) for m in residues]
        self._account("encryptions", len(out), "time_encrypt", t0)
        return out

    def add(self, public_key, a, b) -> list:
        """Homomorphic addition ``E(x + y) = E(x) E(y) mod n^2``, elementwise."""
        t0 = time.perf_counter()
        nsq = gmpy2.mpz(public_key.nsquare)
        out = [x * y % nsq for x, y in zip(a, b, strict=True)]
        self._account("homomorphic_additions", len(out), "time_homomorphic", t0)
        return out

    def scalar_mul(self, public_key, a, k: int) -> list:
        """Homomorphic scalar multiplication ``E(k x) = E(x)^k mod n^2`` by one integer ``k >= 0``."""
        if k < 0:
            raise ValueError("scalar multiplication needs a nonnegative integer exponent")
        t0 = time.perf_counter()
        nsq = gmpy2.mpz(public_key.nsquare)
        k = gmpy2.mpz(k)
        out = [gmpy2.powmod(x, k, nsq) for x in a]
        self._account("scalar_multiplications", len(out), "time_homomorphic", t0)
        return out

    def decrypt(self, private_key, ciphertexts) -> list:
        """Residues ``0 <= m < n`` (Python ints)."""
        t0 = time.perf_counter()
        dec = private_key.raw_decrypt
        out = [dec(int(c)) for c in ciphertexts]
        self._account("decryptions", len(out), "time_decrypt", t0)
        return out


class _Agent:
    """One party of the protocol: node ``node`` (agent ``agent`` of trial ``trial``).

    Holds its private key; the only way to use it is :meth:`decrypt`, and only for
    messages under the agent's own public key. Everything else is public.
    """

    __slots__ = ("node", "trial", "agent", "public_key", "_codec", "_raw", "__private_key")

    def __init__(self, node: int, n_agents: int, public_key, private_key, codec: IntegerCodec, raw: RawPaillier):
        self.node = int(node)
        self.trial, self.agent = divmod(self.node, max(1, int(n_agents)))
        self.public_key = public_key
        self._codec = codec
        self._raw = raw
        self.__private_key = private_key

    @property
    def key_bits(self) -> int:
        return self.public_key.n.bit_length()

    def encrypt(self, values) -> EncryptedVector:
        """``E_i(v)`` for signed integers ``v`` under the agent's own key (negatives mod ``n``)."""
        n = self.public_key.n
        to_res = self._codec.to_residue
        return EncryptedVector(self.public_key, self._raw.encrypt(self.public_key, [to_res(v, n) for v in values]))

    def decrypt(self, message: EncryptedVector, *, bcd_iter: int = 0, admm_iter: int = 0) -> list:
        """Signed integers of a message under this agent's key.

        Raises
        ------
        KeyMismatchError
            If the message is under another public key.
        CodecRangeError
            If a decrypted value lies outside the codec's range (it wrapped modulo ``n``, or
            the ciphertext was not made under this key).
        """
        if message.public_key != self.public_key:
            raise KeyMismatchError(
                f"agent {self.agent} (trial {self.trial}) cannot decrypt a message encrypted under "
                "another agent's public key"
            )
        residues = self._raw.decrypt(self.__private_key, message.ciphertexts)
        n = self.public_key.n
        codec = self._codec
        try:
            return [codec.from_residue(r, n) for r in residues]
        except CodecRangeError as exc:
            raise CodecRangeError(
                f"codec range: agent {self.agent} (trial {self.trial}) at BCD iteration {bcd_iter}, "
                f"ADMM iteration {admm_iter}: decrypted value magnitude {exc.value} does not fit the "
                f"codec limit {exc.limit} (2^{exc.limit.bit_length() - 1}); the plaintext wrapped "
                "modulo n or was not encrypted under this agent's key",
                trial=self.trial, agent=self.agent, bcd_iter=bcd_iter, admm_iter=admm_iter,
                value=exc.value, limit=exc.limit,
            ) from None

    def __repr__(self) -> str:
        return f"_Agent(node={self.node}, trial={self.trial}, agent={self.agent}, key_bits={self.key_bits})"

    def __reduce_ex__(self, protocol):
        _refuse_pickle(self)

    def __reduce__(self):
        _refuse_pickle(self)

    def __getstate__(self):
        _refuse_pickle(self)


@dataclass(frozen=True)
class WireMessage:
    """One message on a link, as an eavesdropper records it: ciphertexts and public keys only."""

    bcd_iter: int
    admm_iter: int
    sender: int
    receiver: int
    kind: str
    payload: tuple


class PaillierExchange(Exchange):
    """The secure exchange with real Paillier encryption (:mod:`phe`), on the host.

    Parameters
    ----------
    codec : IntegerCodec
        Quantization and range; ``codec.key_bits`` is the modulus size of every agent's key
        (even, ``>= 64``; below 2048 bits an :class:`InsecureKeyWarning` is issued).
    protocol : {"aggregated", "paper"}
        Message pattern (module docstring). In ``paper`` mode ``rho_i`` is handed to agent
        ``i`` by the simulation (an assumption the paper leaves open).
    keypairs : sequence of (PaillierPublicKey, PaillierPrivateKey), optional
        Pre-made keys (tests, benchmarks), one per node, used in node order instead of
        generating them in :meth:`bind`. Each private key is moved into its agent; keys
        handed in are only as private as the caller keeps them.
    cost_model : bool or PaillierOpCosts
        Also report ``estimated_seconds`` (the cost model's prediction for the counted
        operations) next to the measured times, to validate the model.
    record_transcript : bool
        Keep every message sent, as an eavesdropper on every link would see it
        (:class:`WireMessage`; for the privacy audit and tests).
    """

    name = "paillier"

    def __init__(self, codec: IntegerCodec, *, protocol: str = "aggregated", keypairs=None, cost_model=False,
                 record_transcript: bool = False):
        super().__init__()
        if protocol not in _PROTOCOLS:
            raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {_PROTOCOLS}")
        kb = codec.key_bits
        if kb < MIN_KEY_BITS or kb % 2:
            raise ConfigError(f"key_bits: Paillier keys need an even size >= {MIN_KEY_BITS} bits, got {kb}")
        if not isinstance(cost_model, (bool, PaillierOpCosts)):
            raise ConfigError(f"cost_model: expected True, False or PaillierOpCosts, got {cost_model!r}")
        if kb < SECURE_KEY_BITS:
            warnings.warn(
                f"key_bits={kb}: Paillier keys shorter than {SECURE_KEY_BITS} bits can be broken and are "
                "for experiments only (the paper's experiments use 128-bit keys)",
                InsecureKeyWarning, stacklevel=3,
            )
        self.codec = codec
        self.protocol = protocol
        self._cost_model = cost_model
        self._pending_keys = list(keypairs) if keypairs is not None else None
        self._agents: tuple = ()
        self._ledger = CostLedger(0, timers=True)
        self._raw = RawPaillier(self._ledger)
        self._rho_cache = None
        self._closed = False
        #: every message on the wire (ciphertexts and public keys only) when recording
        self.transcript: list | None = [] if record_transcript else None
        self._ledger_iter = (0, 0)

    # -- lifecycle ---------------------------------------------------------------------
    def bind(self, topology, *, dtype, device):
        if self._closed:
            raise RuntimeError("PaillierExchange: closed (its keys are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device)
        topo = self.topology
        A = topo.n_nodes
        self._src = topo.src.cpu().tolist()
        self._dst = topo.dst.cpu().tolist()
        self._rev = topo.rev.cpu().tolist()
        self._senders = [i for i, d in enumerate(topo.degree.cpu().tolist()) if d > 0]
        self._ledger = CostLedger(topo.n_agents, timers=True)
        self._raw = RawPaillier(self._ledger)
        self._rho_cache = None
        kb = self.codec.key_bits
        agents = []
        pending, self._pending_keys = self._pending_keys, None
        if pending is not None:
            if len(pending) < A:
                raise ConfigError(f"keypairs: {len(pending)} key pairs for {A} nodes; need one per node")
            pending = pending[:A]
            moduli = [pk.n for pk, _ in pending]
            if any(m.bit_length() != kb for m in moduli):
                raise ConfigError(f"keypairs: every public key must have a {kb}-bit modulus (key_bits={kb})")
            if len(set(moduli)) != A:
                raise ConfigError("keypairs: every node needs its own key pair; got duplicates")
            for node, (pk, sk) in enumerate(pending):
                agents.append(_Agent(node, topo.n_agents, pk, sk, self.codec, self._raw))
        else:
            t0 = time.perf_counter()
            for node in range(A):
                pk, sk = phe.generate_paillier_keypair(n_length=kb)
                agents.append(_Agent(node, topo.n_agents, pk, sk, self.codec, self._raw))
            self._ledger.add("time_keygen", time.perf_counter() - t0)
        del pending
        self._agents = tuple(agents)

    def close(self) -> None:
        """Drop every agent and with it every private key; the exchange cannot be used again."""
        self._agents = ()
        self._pending_keys = None
        self._rho_cache = None
        self._closed = True

    @property
    def agents(self) -> tuple:
        """The nodes' :class:`_Agent` objects (public keys and a ``decrypt`` method each)."""
        return self._agents

    def _check_ready(self):
        if self._closed:
            raise RuntimeError("PaillierExchange: closed (its keys are gone); make a new exchange")
        if self.topology is None:
            raise RuntimeError("PaillierExchange: call bind() before the first exchange")

    # -- transfers ---------------------------------------------------------------------
    def _to_host(self, t: torch.Tensor) -> list:
        t0 = time.perf_counter()
        out = t.cpu().tolist()
        self._ledger.add("time_transfer", time.perf_counter() - t0)
        return out

    def _to_device(self, values, shape) -> torch.Tensor:
        t0 = time.perf_counter()
        out = torch.tensor(values, dtype=torch.int64).reshape(shape).to(self.device)
        self._ledger.add("time_transfer", time.perf_counter() - t0)
        return out

    def _send(self, sender: int, receiver: int, nbytes: int, kind: str = "", payload=()) -> None:
        """Account a message on the wire; with ``record_transcript`` keep what an eavesdropper sees."""
        self._ledger.add_edge_bytes(sender, receiver, nbytes)
        if self.transcript is not None:
            self.transcript.append(WireMessage(self._ledger_iter[0], self._ledger_iter[1], sender, receiver,
                                               kind, tuple(int(v) for v in payload)))

    # -- step 1 ------------------------------------------------------------------------
    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        """``rho_i``: handed by the simulation (``paper``) or an encrypted mini-round (``aggregated``)."""
        self._check_ready()
        self._ledger.begin(bcd_iter, admm_iter)
        self._ledger_iter = (bcd_iter, admm_iter)
        topo = self.topology
        gamma = self.codec.encode_penalties(g)
        if self.protocol == "paper":
            # the simulation hands rho_i to agent i (see the module docstring)
            w = self.codec.pair_weights(gamma, topo.rev)
            return self.codec.decode_rho(integer_penalty_sums(w, topo.src, topo.n_nodes))
        rho_int = self._penalty_round(self._to_host(gamma), bcd_iter, admm_iter)
        return self.codec.decode_rho(rho_int)

    def _penalty_round(self, gamma: list, bcd_iter, admm_iter) -> torch.Tensor:
        """Aggregated mini-round: every ``i`` obtains ``rho_int_i = sum_j gamma_ij gamma_ji``."""
        agents, raw = self._agents, self._raw
        acc = {}
        for e, (i, j) in enumerate(zip(self._src, self._dst)):
            pk = agents[i].public_key
            self._send(i, j, _pk_nbytes(pk), "public_key", (pk.n,))  # i -> j: kp_i
            reply = raw.encrypt(pk, [gamma[self._rev[e]]])  # j: E_i(gamma_ji)
            self._send(j, i, len(reply) * _ct_nbytes(pk), "enc_penalty", reply)
            term = raw.scalar_mul(pk, reply, gamma[e])  # i: E_i(gamma_ij gamma_ji)
            acc[i] = term if i not in acc else raw.add(pk, acc[i], term)
        rho = [0] * self.topology.n_nodes
        for i, cts in acc.items():
            rho[i] = agents[i].decrypt(EncryptedVector(agents[i].public_key, cts),
                                       bcd_iter=bcd_iter, admm_iter=admm_iter)[0]
        rho_int = self._to_device(rho, (self.topology.n_nodes,))
        self._rho_cache = (list(gamma), rho_int)
        return rho_int

    # -- step 5 ------------------------------------------------------------------------
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0):
        """``S_i`` and ``rho_i`` for every node, through the encrypted protocol."""
        self._check_ready()
        self._ledger.begin(bcd_iter, admm_iter)
        self._ledger_iter = (bcd_iter, admm_iter)
        topo = self.topology
        A = topo.n_nodes
        q, gamma, w = encode_inputs(self.codec, topo, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        P = int(q.shape[1])
        host = self._to_host(torch.cat([q.reshape(-1), gamma]))  # the one device -> host transfer
        qh = [host[a * P:(a + 1) * P] for a in range(A)]
        gh = host[A * P:]
        if self.protocol == "paper":
            S_int = self._paper_round(qh, gh, P, bcd_iter, admm_iter)
            rho_int = integer_penalty_sums(w, topo.src, A)  # handed by the simulation
        else:
            cache = self._rho_cache
            if cache is not None and cache[0] == gh:
                rho_int = cache[1]
            else:
                rho_int = self._penalty_round(gh, bcd_iter, admm_iter)
            S_int = self._aggregated_round(qh, gh, P, bcd_iter, admm_iter)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype)
        return ExchangeOutput(S, rho)

    def _requests(self, qh: list) -> dict:
        """Lines 10-11: every agent with neighbours encrypts ``-q_i`` under its own key."""
        return {i: self._agents[i].encrypt([-v for v in qh[i]]) for i in self._senders}

    def _reply(self, request: EncryptedVector, q_j: list, gamma_ji: int) -> list:
        """Lines 13-14 at neighbour ``j``: ``[E_i(q_j) E_i(-q_i)]^{gamma_ji}`` (public-key operations)."""
        raw, pk = self._raw, request.public_key
        n = pk.n
        enc_qj = raw.encrypt(pk, [v % n for v in q_j])
        return raw.scalar_mul(pk, raw.add(pk, enc_qj, request.ciphertexts), gamma_ji)

    def _paper_round(self, qh, gh, P, bcd_iter, admm_iter) -> torch.Tensor:
        agents = self._agents
        requests = self._requests(qh)
        A = self.topology.n_nodes
        D = len(self._src)
        if D == 0:
            return self._to_device([0] * (A * P), (A, P))
        decrypted = []
        for e, (i, j) in enumerate(zip(self._src, self._dst)):
            req = requests[i]
            self._send(i, j, req.nbytes + _pk_nbytes(req.public_key), "enc_neg_u_and_key",
                       list(req.ciphertexts) + [req.public_key.n])  # E_i(-q_i) and kp_i
            reply = EncryptedVector(req.public_key, self._reply(req, qh[j], gh[self._rev[e]]))
            self._send(j, i, reply.nbytes, "enc_reply", reply.ciphertexts)
            # lines 15-16: i decrypts each neighbour's reply on its own
            decrypted.append(agents[i].decrypt(reply, bcd_iter=bcd_iter, admm_iter=admm_iter))
        # ... multiplies by its own gamma_ij and sums (exact int64: |each partial sum| <= B_i < limit)
        d = torch.tensor(decrypted, dtype=torch.int64).reshape(D, P)
        gamma_ij = torch.tensor(gh, dtype=torch.int64)
        src = torch.tensor(self._src, dtype=torch.int64)
        S_int = torch.zeros((A, P), dtype=torch.int64).index_add_(0, src, gamma_ij[:, None] * d)
        t0 = time.perf_counter()
        out = S_int.to(self.device)  # the one host -> device transfer
        self._ledger.add("time_transfer", time.perf_counter() - t0)
        return out

    def _aggregated_round(self, qh, gh, P, bcd_iter, admm_iter) -> torch.Tensor:
        agents, raw = self._agents, self._raw
        requests = self._requests(qh)
        acc = {}
        for e, (i, j) in enumerate(zip(self._src, self._dst)):
            req = requests[i]
            pk = req.public_key
            self._send(i, j, req.nbytes, "enc_neg_u", req.ciphertexts)  # E_i(-q_i); kp_i went with step 1
            reply = self._reply(req, qh[j], gh[self._rev[e]])
            self._send(j, i, len(reply) * _ct_nbytes(pk), "enc_reply", reply)
            term = raw.scalar_mul(pk, reply, gh[e])  # i raises the reply to its own gamma_ij
            acc[i] = term if i not in acc else raw.add(pk, acc[i], term)  # homomorphic sum
        A = self.topology.n_nodes
        flat = [0] * (A * P)
        for i, cts in acc.items():
            flat[i * P:(i + 1) * P] = agents[i].decrypt(EncryptedVector(agents[i].public_key, cts),
                                                        bcd_iter=bcd_iter, admm_iter=admm_iter)
        return self._to_device(flat, (A, P))

    # -- costs -------------------------------------------------------------------------
    def _estimates(self):
        cm = self._cost_model
        if cm is False:
            return None
        if cm is True:
            cm = self._cost_model = calibrate(self.codec.key_bits)
        return cm

    def costs(self) -> dict:
        """Cumulative counts (:data:`~.costmodel.COUNT_KEYS`), ``key_pairs`` and times
        (:data:`~.costmodel.TIME_KEYS`, seconds); with ``cost_model`` also ``estimated_seconds``."""
        led = self._ledger
        out = {k: led.total[k] for k in COUNT_KEYS + TIME_KEYS}
        out["key_pairs"] = 0 if self.topology is None else self.topology.n_nodes
        oc = self._estimates()
        if oc is not None:
            out["estimated_seconds"] = estimate_seconds(out, oc)
            out["estimated_seconds_keygen"] = out["key_pairs"] * oc.keygen
        return out

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration counts and times since the last call (``bcd_iter``, ``admm_iter``, ...)."""
        records = self._ledger.pop()
        oc = self._estimates()
        if oc is not None:
            for rec in records:
                rec["estimated_seconds"] = estimate_seconds(rec, oc)
        return records

    def bytes_per_edge(self) -> dict:
        """Cumulative bytes sent ``"i->j"`` (trial-0 node ids; ciphertexts and public keys)."""
        return dict(self._ledger.edges)

    # -- no key material out ----------------------------------------------------------
    def __repr__(self) -> str:
        return (f"PaillierExchange(protocol={self.protocol!r}, key_bits={self.codec.key_bits}, "
                f"n_max={self.codec.n_max:g}, g_bits={self.codec.g_bits}, agents={len(self._agents)}"
                f"{', closed' if self._closed else ''})")

    def __reduce_ex__(self, protocol):
        _refuse_pickle(self)

    def __reduce__(self):
        _refuse_pickle(self)

    def __getstate__(self):
        _refuse_pickle(self)
