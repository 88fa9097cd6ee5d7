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

If agent ``i`` decrypts only the two sums, it learns ``S_i`` and ``rho_i`` and nothing per
neighbour (with one neighbour, ``rho_i`` still reveals that neighbour's penalty). But every
reply is encrypted under ``i``'s own key: an honest-but-curious ``i`` that decrypts each
reply learns ``gamma_ji`` and then ``q_j`` exactly, as in the ``paper`` protocol. Both
protocols protect against eavesdroppers, not against curious neighbours (measured by
:mod:`ppdnmf_torch.audit`; see docs/THREAT_MODEL.md).

The operation counts and bytes of both protocols are derived in
:mod:`ppdnmf_torch.exchange.costmodel`; :meth:`PaillierExchange.costs` reports what this
stage actually performed (the tests check that the two agree).

Per call, the quantized integers cross from the device to the host once (one ``.cpu()``
of one int64 tensor) and the integer result goes back once (timed as ``time_transfer``).

Two host paths, the same numbers
--------------------------------
``fast=False``, the naive path: one phe ``raw_encrypt`` (``r^n mod n^2``) per value, phe's
``raw_decrypt`` per value, serial. The ciphertext arithmetic goes through
:class:`RawPaillier` (products mod ``n^2`` for homomorphic additions, ``gmpy2.powmod`` for
scalar multiplications by the nonnegative integer penalties).

``fast=True`` (default): the same protocol on raw ``gmpy2.mpz`` ciphertexts, with

* ``packing`` (default on, :mod:`.packing`): ``S`` values per plaintext (32 at 2048 bits),
  slot width derived from the codec's range, offsets added at decoding, unpacked exactly;
  a message of ``P`` values is ``ceil(P / S)`` ciphertexts, and every operation count drops
  by that factor;
* ``precompute`` (default on, :mod:`.obfuscation`, :mod:`.pool`): public-key obfuscators
  made ahead of use by the worker pool (a stock per public key, refilled in the
  background), and the key owner's own obfuscators made with its CRT factors inside its
  agent (same distribution as ``r^n mod n^2``);
* ``djn`` (default off): Damgard-Jurik-Nielsen short-exponent obfuscators with a
  fixed-base table, under DJN's short-exponent assumption (:mod:`.obfuscation`);
* ``workers`` (default ``os.cpu_count()`` from 1024-bit keys up): worker processes that
  make public-key obfuscators; they receive public moduli only. Decryption, the owner's
  CRT obfuscators, the homomorphic operations, packing and unpacking run in the agent's
  (the caller's) process; from 1024-bit keys up, the two CRT halves of a decryption or of a
  batch of the owner's obfuscators run side by side in two threads of that process
  (:class:`~.obfuscation.PrivateCRT`), and from 2048-bit keys up the per-edge homomorphic
  work runs in one thread lane per worker (:class:`~.pool.ThreadLanes`).

On the fast path neighbour ``j``'s reply is ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji} rho_j``:
``j``'s fresh obfuscator ``rho_j`` multiplies the result *after* the exponentiation (one
encryption, one addition, one scalar multiplication per ciphertext, as on the naive
path). On the naive path (lines 13-14 as printed) the reply's randomness is
``(r_j r_i)^{n gamma_ji}``, which lies in the subgroup of ``gamma_ji``-th powers; agent ``i``,
who knows the factorization, can test that membership and learn, for instance, the
parity of ``gamma_ji``. The fast path's reply randomness is uniform and independent of
``gamma_ji``. Both paths decrypt to the same integers.

Both paths count the operations they perform (each fresh obfuscator applied is one
encryption; with packing, counts are per ciphertext) and ``exchange="quantized"`` with
``cost_model=True`` predicts the same counts for the same ``packing`` / ``slot_bits``.
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
from .obfuscation import HoldsPrivateKey, PrivateCRT, default_djn_exponent_bits, djn_obfuscators
from .packing import SlotDecodeError, SlotLayout, check_protocol_range, decrypted_range_error, derive_layout
from .pool import LANE_MIN_KEY_BITS, ObfuscatorSupply, ThreadLanes, WorkerPool, resolve_workers
from .quantized import Step1Penalties, encode_inputs, integer_penalty_sums

__all__ = [
    "PaillierExchange",
    "generate_keypairs",
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

    The naive path's layer (phe's ``raw_encrypt`` / ``raw_decrypt`` per value); the fast
    path (``fast=True``) works on ``mpz`` vectors directly, with obfuscators from
    :mod:`.obfuscation` and :mod:`.pool`. ``ledger`` (a
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


def _decrypt_range_error(agent, bcd_iter, admm_iter, value, limit, what=None) -> CodecRangeError:
    """:func:`~.packing.decrypted_range_error` for ``agent`` (an :class:`_Agent`)."""
    return decrypted_range_error(agent.trial, agent.agent, bcd_iter, admm_iter, value, limit, what)


class _Agent(HoldsPrivateKey):
    """One party of the protocol: node ``node`` (agent ``agent`` of trial ``trial``).

    Holds its private key; the only ways to use it are :meth:`decrypt` /
    :meth:`decrypt_packed` (only for messages under the agent's own public key) and
    :meth:`own_obfuscators` (the owner's CRT obfuscators for its own encryptions, which
    never leave the agent). Everything else is public.
    """

    __slots__ = ("node", "trial", "agent", "public_key", "n", "nsquare", "_codec", "_raw", "_own_mode",
                 "_djn_bits", "__private_key", "__crt")

    def __init__(self, node: int, n_agents: int, public_key, private_key, codec: IntegerCodec, raw: RawPaillier):
        self.node = int(node)
        self.trial, self.agent = divmod(self.node, max(1, int(n_agents)))
        self.public_key = public_key
        #: ``n`` and ``n^2`` as ``mpz`` (public)
        self.n = gmpy2.mpz(public_key.n)
        self.nsquare = self.n * self.n
        self._codec = codec
        self._raw = raw
        self._own_mode = None
        self._djn_bits = None
        self.__private_key = private_key
        self.__crt = None

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
        self._check_key(message)
        residues = self._raw.decrypt(self.__private_key, message.ciphertexts)
        n = self.public_key.n
        codec = self._codec
        try:
            return [codec.from_residue(r, n) for r in residues]
        except CodecRangeError as exc:
            raise _decrypt_range_error(self, bcd_iter, admm_iter, exc.value, exc.limit) from None

    # -- the fast path -----------------------------------------------------------------
    def _check_key(self, message: EncryptedVector) -> None:
        if message.public_key != self.public_key:
            raise KeyMismatchError(
                f"agent {self.agent} (trial {self.trial}) cannot decrypt a message encrypted under "
                "another agent's public key"
            )

    def _enable_fast(self, *, own_mode, djn_bits=None) -> None:
        """Fast path: ``mpz`` CRT decryption; the owner's obfuscators from ``own_mode``.

        ``own_mode``: ``"djn"`` (fixed-base DJN table of the public key), ``"crt"`` (CRT with
        the agent's own factors) or None (the caller supplies public-key obfuscators).
        """
        self.__crt = PrivateCRT(self.__private_key)
        self._own_mode = own_mode
        self._djn_bits = djn_bits

    def own_obfuscators(self, count: int):
        """Obfuscators for the agent's own encryptions, or None when the caller must supply them."""
        mode = self._own_mode
        if mode == "crt":
            return self.__crt.obfuscators(count)
        if mode == "djn":
            return djn_obfuscators(self.n, count, self._djn_bits)
        return None

    def decrypt_residues(self, message: EncryptedVector) -> list:
        """Residues ``0 <= m < n`` of a message under this agent's key (``mpz`` CRT decryption)."""
        self._check_key(message)
        crt = self.__crt
        if crt is None:
            return [self.__private_key.raw_decrypt(int(c)) for c in message.ciphertexts]
        return crt.decrypt(message.ciphertexts)

    def decrypt_packed(self, message: EncryptedVector, layout: SlotLayout, count: int, *, bcd_iter: int = 0,
                       admm_iter: int = 0) -> list:
        """The ``count`` signed slot values of a packed message under this agent's key.

        Raises
        ------
        KeyMismatchError
            If the message is under another public key.
        CodecRangeError
            If a plaintext does not decode (a slot outgrew its range, the plaintext wrapped
            modulo ``n``, or the ciphertext was not made under this key).
        """
        residues = self.decrypt_residues(message)
        try:
            return layout.unpack(residues, self.n, count)
        except SlotDecodeError as exc:
            if layout.slots == 1:
                raise _decrypt_range_error(self, bcd_iter, admm_iter, exc.value, layout.limit) from None
            raise _decrypt_range_error(self, bcd_iter, admm_iter, exc.value, layout.limit, what=str(exc)) from None

    def __repr__(self) -> str:
        return f"_Agent(node={self.node}, trial={self.trial}, agent={self.agent}, key_bits={self.key_bits})"


def generate_keypairs(key_bits: int, count: int, existing=()) -> list:
    """``existing`` plus new Paillier key pairs up to ``count``, all with distinct moduli.

    For tests, benchmarks and the audit, which hand keys to an exchange through
    ``keypairs=`` (a run's own keys are made inside :meth:`PaillierExchange.bind`).
    """
    out = list(existing)
    seen = {pk.n for pk, _ in out}
    while len(out) < count:
        pk, sk = phe.generate_paillier_keypair(n_length=key_bits)
        if pk.n not in seen:
            seen.add(pk.n)
            out.append((pk, sk))
    return out


@dataclass(frozen=True)
class WireMessage:
    """One message on a link, as an eavesdropper records it: for the Paillier protocols,
    ciphertexts and public keys only (the audit also records the plain protocol's
    messages, values in the clear, in this form)."""

    bcd_iter: int
    admm_iter: int
    sender: int
    receiver: int
    kind: str
    payload: tuple


class PaillierExchange(HoldsPrivateKey, Exchange):
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
    fast : bool
        ``True`` (default): the fast host path below (raw ``mpz`` arithmetic plus the
        switches that follow). ``False``: the naive per-value path (one phe ``raw_encrypt``
        per value, serial), kept for comparison; the switches below are then ignored.
    packing : bool
        Several values per plaintext (:mod:`.packing`; default True). Encryptions,
        decryptions, homomorphic operations and bytes of a message drop from ``P`` to
        ``ceil(P / S)`` with ``S`` slots per plaintext (32 at 2048 bits).
    slot_bits : int, optional
        Narrower slots than the codec's range needs (more per plaintext); values must then
        fit ``2^(slot_bits - 1)`` and a value that does not raises ``CodecRangeError`` before
        anything is encrypted. Default: derived from the codec's limit.
    precompute : bool
        Obfuscators ahead of use (default True): with a worker pool, a stock per public key
        refilled in the background; and the key owner makes the obfuscators of its own
        encryptions with its CRT factors ``p, q`` (same distribution, ~3.4x cheaper at 2048
        bits), inside its agent.
    djn : bool
        Damgard-Jurik-Nielsen short-exponent obfuscators ``h_s^x`` with a fixed-base table
        (default False). Faster (~50x per obfuscator at 2048 bits) under an extra
        assumption: DCR stays hard with short random exponents in the subgroup generated
        by ``h_s`` (DJN 2010); see :mod:`.obfuscation`.
    djn_exponent_bits : int, optional
        Bits of the DJN exponent ``x`` (default ``2 x`` the modulus' security level:
        224 at 2048 bits; IPCL and HEU use ``key_bits / 2``). Fewer bits than the default
        warn (:class:`InsecureKeyWarning`): ``x`` falls to a baby-step giant-step search
        in about ``2^(bits / 2)`` steps.
    workers : int, optional
        Worker processes for the public-key work (obfuscators for every key). Default
        ``os.cpu_count()`` for keys of at least 1024 bits and in-process below, where a task
        costs less than shipping it; ``0`` or ``1``: in-process. Workers only ever receive
        public moduli ``n`` (:mod:`.pool`); decryption and the owner's CRT obfuscators stay
        in the agent's process. With ``k >= 2`` workers and keys of at least 2048 bits
        (:data:`~.pool.LANE_MIN_KEY_BITS`) the per-edge homomorphic work (replies and scalar
        multiplications) also runs in ``k`` thread lanes of this process (the caller's
        thread and ``k - 1`` helpers, :class:`~.pool.ThreadLanes`), with the same results;
        if the pool cannot start, neither runs. So the default starts ``os.cpu_count()``
        processes and as many lanes, more threads than cores while both are busy; on the
        2-core development VM that measured slightly faster than no lanes (docs/PERFORMANCE.md).
    pool_audit : callable, optional
        Called with the pickled arguments of every task sent to a worker (tests).
    """

    name = "paillier"

    def __init__(self, codec: IntegerCodec, *, protocol: str = "aggregated", keypairs=None, cost_model=False,
                 record_transcript: bool = False, fast: bool = True, packing: bool = True, slot_bits=None,
                 precompute: bool = True, djn: bool = False, djn_exponent_bits=None, workers=None,
                 pool_audit=None):
        super().__init__()
        for name, val in (("fast", fast), ("packing", packing), ("precompute", precompute), ("djn", djn)):
            if not isinstance(val, bool):
                raise ConfigError(f"{name}: expected True or False, got {val!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
            raise ConfigError(f"workers: expected None or an integer >= 0, got {workers!r}")
        if djn_exponent_bits is not None and (isinstance(djn_exponent_bits, bool)
                                              or not isinstance(djn_exponent_bits, int) or djn_exponent_bits < 16):
            raise ConfigError(f"djn_exponent_bits: expected None or an integer >= 16, got {djn_exponent_bits!r}")
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
        self.fast = fast
        self.packing = packing and fast
        self.precompute = precompute
        self.djn = djn
        self.djn_exponent_bits = (djn_exponent_bits or default_djn_exponent_bits(kb)) if djn else None
        if djn and self.djn_exponent_bits < default_djn_exponent_bits(kb):
            # a baby-step giant-step search finds an x of b bits in about 2^(b/2) steps, from
            # the public h_s alone: it strips the obfuscator off every ciphertext
            warnings.warn(
                f"djn_exponent_bits={self.djn_exponent_bits}: DJN exponents shorter than "
                f"{default_djn_exponent_bits(kb)} bits (2 x the {kb}-bit key's security level) let an "
                f"eavesdropper recover them in about 2^{self.djn_exponent_bits // 2} steps and read every "
                "ciphertext; for experiments only",
                InsecureKeyWarning, stacklevel=3,
            )
        #: the slot layout of the fast path (one slot per plaintext without packing)
        self.layout = derive_layout(codec, packing=self.packing, slot_bits=slot_bits) if fast else None
        self._layout1 = derive_layout(codec, packing=False)
        self.workers = resolve_workers(workers, kb) if fast else 0
        self._pool_audit = pool_audit
        self._pool = None
        self._supply = None
        self._lanes = None
        self._cost_model = cost_model
        self._pending_keys = list(keypairs) if keypairs is not None else None
        self._agents: tuple = ()
        self._ledger = CostLedger(0, timers=True)
        self._raw = RawPaillier(self._ledger)
        self._rho_cache = None
        self._step1 = Step1Penalties()
        self._closed = False
        #: every message on the wire (ciphertexts and public keys only) when recording
        self.transcript: list | None = [] if record_transcript else None
        self._ledger_iter = (0, 0)

    # -- lifecycle ---------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        if self._closed:
            raise RuntimeError("PaillierExchange: closed (its keys are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        topo = self.topology
        A = topo.n_nodes
        self._src = topo.src.cpu().tolist()
        self._dst = topo.dst.cpu().tolist()
        self._rev = topo.rev.cpu().tolist()
        self._senders = [i for i, d in enumerate(topo.degree.cpu().tolist()) if d > 0]
        self._ledger = CostLedger(topo.n_agents, timers=True)
        self._raw = RawPaillier(self._ledger)
        self._rho_cache = None
        self._step1.clear()
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
        if self.fast:
            self._setup_fast()

    def _setup_fast(self) -> None:
        """Owner obfuscators per agent, and the supply of public-key obfuscators (pool, stock)."""
        self._stop_pool()
        own = "djn" if self.djn else ("crt" if self.precompute else None)
        for ag in self._agents:
            ag._enable_fast(own_mode=own, djn_bits=self.djn_exponent_bits)
        deg = [0] * self.topology.n_nodes
        for i in self._src:
            deg[i] += 1
        self._deg = deg
        moduli = {i: self._agents[i].n for i in self._senders}
        pool = None
        if self.workers and moduli:
            try:
                pool = WorkerPool(self.workers, audit=self._pool_audit)
            except Exception as exc:  # pragma: no cover - a host without working subprocesses
                warnings.warn(f"PaillierExchange: the worker pool did not start ({exc!r}); working in-process",
                              RuntimeWarning, stacklevel=3)
                self.workers = 0
        self._pool = pool
        # the edges' homomorphic work: one thread lane per worker (in this process)
        lanes = self.workers >= 2 and self.codec.key_bits >= LANE_MIN_KEY_BITS
        self._lanes = ThreadLanes(self.workers) if lanes else None
        self._supply = ObfuscatorSupply(moduli, djn_bits=self.djn_exponent_bits, pool=pool,
                                        stock={} if self.precompute else None)
        self._stock_lk = None
        self._plan_stock(0)

    def _plan_stock(self, lk: int) -> None:
        """Stock mode: keep two ADMM iterations' public obfuscators ready per key, for ``P = lk``.

        Per iteration, key ``i`` needs ``d_i ceil(P / S)`` for its neighbours' replies and, in
        the aggregated protocol, ``d_i`` for the penalty mini-round. Before the first exchange
        (``lk = 0``) only the mini-round's are planned.
        """
        sup = self._supply
        if sup is None or self._stock_lk == lk:
            return
        self._stock_lk = lk
        C = self.layout.n_ciphertexts(lk)
        pen = self.protocol == "aggregated"
        per_iter = {i: self._deg[i] * C + (self._deg[i] if pen else 0) for i in sup.moduli}
        total = sum(per_iter.values())
        # a few tasks per worker and iteration: ~1 for cheap DJN obfuscators, ~4 otherwise
        tasks = max(1, self.workers) * (1 if self.djn else 4)
        sup.chunk = max(1, -(-total // tasks))
        if sup.targets is not None:
            sup.targets = {i: 2 * c for i, c in per_iter.items()}
            sup.refill()

    def _stop_pool(self) -> None:
        if self._supply is not None:
            self._supply.close()
            self._supply = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._lanes is not None:
            self._lanes.close()
            self._lanes = None

    def close(self) -> None:
        """Drop every agent and with it every private key; stop the worker pool. The exchange
        cannot be used again."""
        self._stop_pool()
        self._agents = ()
        self._pending_keys = None
        self._rho_cache = None
        self._step1.clear()
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
        gamma, w = self._step1.encode(self.codec, topo, g, bcd_iter=bcd_iter, admm_iter=admm_iter)  # checked
        if self.protocol == "paper":
            # the simulation hands rho_i to agent i (see the module docstring)
            return self.codec.decode_rho(integer_penalty_sums(w, topo.src, topo.n_nodes))
        rho_int = self._penalty_round(self._to_host(gamma), bcd_iter, admm_iter)
        return self.codec.decode_rho(rho_int)

    def _penalty_round(self, gamma: list, bcd_iter, admm_iter) -> torch.Tensor:
        if self.fast:
            return self._fast_penalty_round(gamma, bcd_iter, admm_iter)
        return self._naive_penalty_round(gamma, bcd_iter, admm_iter)

    def _naive_penalty_round(self, gamma: list, bcd_iter, admm_iter) -> torch.Tensor:
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
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        """``S_i`` and ``rho_i`` for every node, through the encrypted protocol."""
        self._check_ready()
        self._ledger.begin(bcd_iter, admm_iter)
        self._ledger_iter = (bcd_iter, admm_iter)
        topo = self.topology
        A = topo.n_nodes
        q, gamma, w = encode_inputs(self.codec, topo, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter,
                                    penalties=self._step1.take(g))
        P = int(q.shape[1])
        # before anything is encrypted (the naive path too: it would find out at decryption)
        check_protocol_range(self.codec, self.layout if self.fast else None, topo, self.protocol, q, gamma, w,
                             bcd_iter=bcd_iter, admm_iter=admm_iter)
        if self.fast:
            self._plan_stock(P)
        host = self._to_host(torch.cat([q.reshape(-1), gamma]))  # the one device -> host transfer
        qh = [host[a * P:(a + 1) * P] for a in range(A)]
        gh = host[A * P:]
        if self.protocol == "paper":
            rnd = self._fast_paper_round if self.fast else self._paper_round
            S_int = rnd(qh, gh, P, bcd_iter, admm_iter)
            rho_int = integer_penalty_sums(w, topo.src, A)  # handed by the simulation
        else:
            cache = self._rho_cache
            if cache is not None and cache[0] == gh:
                rho_int = cache[1]
            else:
                rho_int = self._penalty_round(gh, bcd_iter, admm_iter)
            rnd = self._fast_aggregated_round if self.fast else self._aggregated_round
            S_int = rnd(qh, gh, P, bcd_iter, admm_iter)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype)
        return ExchangeOutput(S, rho)

    def _requests(self, qh: list) -> dict:
        """Lines 10-11: every agent with neighbours encrypts ``-q_i`` under its own key."""
        return {i: self._agents[i].encrypt([-v for v in qh[i]]) for i in self._senders}

    def _reply(self, request: EncryptedVector, q_j: list, gamma_ji: int) -> list:
        """Lines 13-14 at neighbour ``j``: ``E_i(gamma_ji (q_j - q_i))`` (public-key operations).

        Computed as ``E_i(-q_i)^{gamma_ji} E_i(gamma_ji q_j)``. The paper writes
        ``[E_i(q_j) E_i(-q_i)]^{gamma_ji}``: the same plaintext and the same operations (one
        encryption, one addition, one scalar multiplication per value), but then the
        reply's randomness ``(r_j r_i)^{n gamma_ji}`` depends on ``gamma_ji`` (whose subgroup
        membership ``i`` can test with its factors), and for ``gamma_ji = 0`` the reply is the
        ciphertext ``1`` for all to see. With the fresh encryption last, the randomness is
        uniform whatever ``gamma_ji``, as on the fast path.
        """
        raw, pk = self._raw, request.public_key
        n = pk.n
        enc = raw.encrypt(pk, [gamma_ji * v % n for v in q_j])
        return raw.add(pk, raw.scalar_mul(pk, request.ciphertexts, gamma_ji), enc)

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

    # -- step 5, fast path --------------------------------------------------------------
    # The per-edge work (replies, scalar multiplications) runs on the exchange's thread
    # lanes (:class:`~.pool.ThreadLanes`, one per worker); the messages, the counts and the
    # homomorphic sums follow in edge order in the calling thread, as on a serial loop. A
    # round that fails in its per-edge work (a negative penalty) sends and counts nothing
    # of that work.
    def _lanes_map(self, fn, items) -> list:
        lanes = self._lanes
        return [fn(x) for x in items] if lanes is None else lanes.map(fn, items)

    def _fast_penalty_round(self, gamma: list, bcd_iter, admm_iter) -> torch.Tensor:
        """The aggregated mini-round on the fast path (one value per message: never packed)."""
        agents, led = self._agents, self._ledger
        src, dst = self._src, self._dst
        t0 = time.perf_counter()
        obf = self._supply.take({i: self._deg[i] for i in self._senders})
        self._supply.refill()
        replies = []  # j: E_i(gamma_ji)
        for e, i in enumerate(src):
            ag = agents[i]
            replies.append((1 + ag.n * (gamma[self._rev[e]] % ag.n)) * obf[i].pop() % ag.nsquare)
        t1 = time.perf_counter()
        led.add("time_encrypt", t1 - t0)

        def term(e):  # i: E_i(gamma_ij gamma_ji)
            return gmpy2.powmod_base_list([replies[e]], self._exponent(gamma[e]), agents[src[e]].nsquare)[0]

        terms = self._lanes_map(term, range(len(src)))
        acc = {}
        for i, t in zip(src, terms):
            acc[i] = t if i not in acc else acc[i] * t % agents[i].nsquare
        led.add("encryptions", len(src))
        led.add("scalar_multiplications", len(src))
        led.add("homomorphic_additions", len(src) - len(acc))
        led.add("time_homomorphic", time.perf_counter() - t1)
        for e, (i, j) in enumerate(zip(src, dst)):
            ag = agents[i]
            self._send(i, j, _pk_nbytes(ag.public_key), "public_key", (ag.public_key.n,))  # i -> j: kp_i
            self._send(j, i, _ct_nbytes(ag.public_key), "enc_penalty", (replies[e],))
        rho = [0] * self.topology.n_nodes
        lay1 = self._layout1
        for i, c in acc.items():
            ag = agents[i]
            t0 = time.perf_counter()
            rho[i] = ag.decrypt_packed(EncryptedVector(ag.public_key, [c]), lay1, 1,
                                       bcd_iter=bcd_iter, admm_iter=admm_iter)[0]
            led.add("decryptions", 1)
            led.add("time_decrypt", time.perf_counter() - t0)
        rho_int = self._to_device(rho, (self.topology.n_nodes,))
        self._rho_cache = (list(gamma), rho_int)
        return rho_int

    @staticmethod
    def _exponent(k: int):
        if k < 0:
            raise ValueError("scalar multiplication needs a nonnegative integer exponent")
        return gmpy2.mpz(k)

    def _fast_requests(self, qh: list, C: int):
        """Lines 10-11, packed: every agent with neighbours encrypts ``-q_i`` under its own key.

        Also fetches the public-key obfuscators of this round's replies (``d_i C`` per key
        ``i``), and returns them with the requests, as each edge's ``C`` (in edge order).
        """
        agents, led, lay = self._agents, self._ledger, self.layout
        t0 = time.perf_counter()
        own = {i: agents[i].own_obfuscators(C) for i in self._senders}
        demand = {i: self._deg[i] * C + (C if own[i] is None else 0) for i in self._senders}
        obf = self._supply.take(demand)
        self._supply.refill()
        requests = {}
        for i in self._senders:
            ag = agents[i]
            n, nsq = ag.n, ag.nsquare
            mine = own[i]
            if mine is None:
                mine, obf[i] = obf[i][:C], obf[i][C:]
            cts = [(1 + n * m) * r % nsq for m, r in zip(lay.pack([-v for v in qh[i]], n), mine)]
            requests[i] = EncryptedVector(ag.public_key, cts)
        used = dict.fromkeys(obf, 0)
        per_edge = []
        for i in self._src:
            per_edge.append(obf[i][used[i]:used[i] + C])
            used[i] += C
        led.add("encryptions", C * len(self._senders))
        led.add("time_encrypt", time.perf_counter() - t0)
        return requests, per_edge

    def _fast_reply(self, e: int, requests: dict, packed: dict, gh: list, obfuscators: list) -> list:
        """Lines 13-14 at neighbour ``j`` of edge ``e = (i, j)``, packed: ``E_i(gamma_ji (q_j - q_i))``,
        freshly obfuscated.

        ``[(1 + n M(q_j)) E_i(-q_i)]^{gamma_ji}`` (a plaintext addition and a scalar
        multiplication) times a fresh obfuscator of ``j``'s: one encryption, one addition
        and one scalar multiplication per ciphertext, as on the naive path. The fresh
        obfuscator comes *after* the exponentiation, so the reply's randomness is
        independent of ``gamma_ji`` (on the naive path it is ``(r_j r_i)^{n gamma_ji}``, whose
        subgroup membership, which ``i`` can test with its factors, depends on ``gamma_ji``).
        Pure arithmetic (no counts, no messages): it runs on the thread lanes.
        """
        ag = self._agents[self._src[e]]
        n, nsq = ag.n, ag.nsquare
        k = self._exponent(gh[self._rev[e]])
        bases = [(1 + n * (m % n)) * c % nsq for m, c in zip(packed[self._dst[e]], requests[self._src[e]].ciphertexts)]
        return [x * r % nsq for x, r in zip(gmpy2.powmod_base_list(bases, k, nsq), obfuscators)]

    def _account_replies(self, C: int) -> None:
        D = len(self._src)
        led = self._ledger
        led.add("encryptions", C * D)
        led.add("homomorphic_additions", C * D)
        led.add("scalar_multiplications", C * D)

    def _fast_paper_round(self, qh, gh, P, bcd_iter, admm_iter) -> torch.Tensor:
        agents, lay, led = self._agents, self.layout, self._ledger
        A = self.topology.n_nodes
        D = len(self._src)
        if D == 0:
            return self._to_device([0] * (A * P), (A, P))
        C = lay.n_ciphertexts(P)
        requests, obf = self._fast_requests(qh, C)
        packed = {j: lay.pack_signed(qh[j]) for j in set(self._dst)}
        t0 = time.perf_counter()
        replies = self._lanes_map(lambda e: self._fast_reply(e, requests, packed, gh, obf[e]), range(D))
        self._account_replies(C)
        led.add("time_homomorphic", time.perf_counter() - t0)
        decrypted = []
        for e, (i, j) in enumerate(zip(self._src, self._dst)):
            req = requests[i]
            self._send(i, j, req.nbytes + _pk_nbytes(req.public_key), "enc_neg_u_and_key",
                       list(req.ciphertexts) + [req.public_key.n])  # E_i(-q_i) and kp_i
            reply = EncryptedVector(req.public_key, replies[e])
            self._send(j, i, reply.nbytes, "enc_reply", reply.ciphertexts)
            # lines 15-16: i decrypts each neighbour's reply on its own
            t0 = time.perf_counter()
            decrypted.append(agents[i].decrypt_packed(reply, lay, P, bcd_iter=bcd_iter, admm_iter=admm_iter))
            led.add("decryptions", C)
            led.add("time_decrypt", time.perf_counter() - t0)
        d = torch.tensor(decrypted, dtype=torch.int64).reshape(D, P)
        gamma_ij = torch.tensor(gh, dtype=torch.int64)
        src = torch.tensor(self._src, dtype=torch.int64)
        S_int = torch.zeros((A, P), dtype=torch.int64).index_add_(0, src, gamma_ij[:, None] * d)
        t0 = time.perf_counter()
        out = S_int.to(self.device)
        led.add("time_transfer", time.perf_counter() - t0)
        return out

    def _fast_aggregated_round(self, qh, gh, P, bcd_iter, admm_iter) -> torch.Tensor:
        agents, lay, led = self._agents, self.layout, self._ledger
        A = self.topology.n_nodes
        C = lay.n_ciphertexts(P)
        flat = [0] * (A * P)
        D = len(self._src)
        if not D:
            return self._to_device(flat, (A, P))
        requests, obf = self._fast_requests(qh, C)
        packed = {j: lay.pack_signed(qh[j]) for j in set(self._dst)}

        def edge(e):  # j's reply; i raises it to its own gamma_ij
            reply = self._fast_reply(e, requests, packed, gh, obf[e])
            return reply, gmpy2.powmod_base_list(reply, self._exponent(gh[e]), agents[self._src[e]].nsquare)

        t0 = time.perf_counter()
        done = self._lanes_map(edge, range(D))
        acc = {}
        for i, (_, term) in zip(self._src, done):  # i's homomorphic sum
            nsq = agents[i].nsquare
            acc[i] = term if i not in acc else [a * b % nsq for a, b in zip(acc[i], term)]
        self._account_replies(C)
        led.add("scalar_multiplications", C * D)
        led.add("homomorphic_additions", C * (D - len(acc)))
        led.add("time_homomorphic", time.perf_counter() - t0)
        for (i, j), (reply, _) in zip(zip(self._src, self._dst), done):
            req = requests[i]
            self._send(i, j, req.nbytes, "enc_neg_u", req.ciphertexts)  # E_i(-q_i); kp_i went with step 1
            self._send(j, i, len(reply) * _ct_nbytes(req.public_key), "enc_reply", reply)
        for i, cts in acc.items():
            ag = agents[i]
            t0 = time.perf_counter()
            flat[i * P:(i + 1) * P] = ag.decrypt_packed(EncryptedVector(ag.public_key, cts), lay, P,
                                                        bcd_iter=bcd_iter, admm_iter=admm_iter)
            led.add("decryptions", C)
            led.add("time_decrypt", time.perf_counter() - t0)
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
        if self.fast:
            lay = self.layout
            path = (f", fast: {lay.slots} slot{'s' if lay.slots != 1 else ''} x {lay.slot_bits} bits"
                    f"{', precompute' if self.precompute else ''}"
                    f"{f', djn ({self.djn_exponent_bits}-bit exponents)' if self.djn else ''}, workers={self.workers}")
        else:
            path = ", naive"
        return (f"PaillierExchange(protocol={self.protocol!r}, key_bits={self.codec.key_bits}, "
                f"n_max={self.codec.n_max:g}, g_bits={self.codec.g_bits}, agents={len(self._agents)}{path}"
                f"{', closed' if self._closed else ''})")
