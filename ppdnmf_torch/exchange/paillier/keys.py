"""The Paillier primitives and the parties that hold the keys.

* :class:`RawPaillier`: vector operations on raw ciphertexts (``gmpy2.mpz``), counted and
  timed into a :class:`~ppdnmf_torch.exchange.costmodel.CostLedger` (the naive path's layer).
* :class:`EncryptedVector`: a message, ciphertexts under one public key.
* :class:`_Agent`: one party of the protocol, the only holder of its private key; it
  cannot be pickled, copied or printed with key material (:class:`~ppdnmf_torch.exchange.sealed.HoldsPrivateKey`).
* :func:`generate_keypairs` (tests, benchmarks, the audit) and :func:`make_agents` (the
  agents of a bound exchange, from handed-in or freshly generated keys).

Key generation draws each prime as a uniformly random odd number with its top two bits set
and tests candidates one by one (:func:`generate_keypair`), so Ctrl-C ends it between two
candidates (milliseconds at the usual sizes) instead of waiting out one long C call; key
sizes above :data:`MAX_KEY_BITS` are refused (:func:`check_key_bits`) unless
``$PPDNMF_MAX_KEY_BITS`` raises the limit.
"""
from __future__ import annotations

import os
import secrets
import time

import gmpy2
import phe

from ...errors import ConfigError
from ..codec import CodecRangeError, IntegerCodec
from ..costmodel import CostLedger, ciphertext_nbytes
from ..packing import SlotDecodeError, SlotLayout, decrypted_range_error
from ..spec import MIN_KEY_BITS, SECURE_KEY_BITS
from .obfuscation import HoldsPrivateKey, PrivateCRT, djn_obfuscators
from .seeds import SeedStore, chunks_to_seed, draw_seed, seed_to_chunks

__all__ = [
    "InsecureKeyWarning",
    "KeyMismatchError",
    "EncryptedVector",
    "RawPaillier",
    "generate_keypairs",
    "make_agents",
    "generate_keypair",
    "check_key_bits",
    "SECURE_KEY_BITS",
    "MIN_KEY_BITS",
    "MAX_KEY_BITS",
    "MAX_KEY_BITS_ENV",
]

#: the largest key size accepted by default: one key pair of it takes minutes to make, the
#: next size up (16384 bits) hours
MAX_KEY_BITS = 8192
#: the environment variable that raises (or lowers) :data:`MAX_KEY_BITS`
MAX_KEY_BITS_ENV = "PPDNMF_MAX_KEY_BITS"


def check_key_bits(key_bits: int) -> int:
    """Refuse key sizes above the limit (:data:`MAX_KEY_BITS`, or ``$PPDNMF_MAX_KEY_BITS``).

    Raises
    ------
    ConfigError
        Naming ``key_bits``, the limit and the way past it.
    """
    raw = os.environ.get(MAX_KEY_BITS_ENV, "").strip()
    try:
        limit = int(raw) if raw else MAX_KEY_BITS
    except ValueError:
        raise ConfigError(f"key_bits: the environment variable {MAX_KEY_BITS_ENV} must be an integer number of "
                          f"bits, got {raw!r}") from None
    if int(key_bits) > limit:
        raise ConfigError(
            f"key_bits: {key_bits}-bit Paillier keys are above the limit of {limit} bits (making one key pair of "
            f"{key_bits} bits takes hours, and every operation grows with the cube of the size); set the "
            f"environment variable {MAX_KEY_BITS_ENV}={key_bits} to go past it"
        )
    return int(key_bits)


#: the product of the odd primes below 2000: a candidate sharing a factor with it is composite
_SMALL_PRIMES = int(gmpy2.mpz(1))
for _p in range(3, 2000, 2):
    if gmpy2.is_prime(_p):
        _SMALL_PRIMES *= _p
_SMALL_PRIMES = gmpy2.mpz(_SMALL_PRIMES)


def _random_prime(bits: int) -> int:
    """A uniformly random prime of exactly ``bits`` bits with its top two bits set (so that
    the product of two of them has exactly ``2 bits`` bits). Every candidate is tested by
    short C calls (a gcd with the small primes, one strong base-2 test, then 40 rounds on
    the rare survivor), so a KeyboardInterrupt gets through between two of them."""
    top = 3 << (bits - 2)
    while True:
        c = gmpy2.mpz(secrets.randbits(bits) | top | 1)
        if gmpy2.gcd(c, _SMALL_PRIMES) == 1 and gmpy2.is_strong_prp(c, 2) and gmpy2.is_prime(c, 40):
            return int(c)


def generate_keypair(key_bits: int):
    """One Paillier key pair ``(public, private)`` with an exactly ``key_bits``-bit modulus
    (the keys phe's ``generate_paillier_keypair`` makes, made interruptibly)."""
    check_key_bits(key_bits)
    half = int(key_bits) // 2
    p = _random_prime(half)
    q = p
    while q == p:
        q = _random_prime(key_bits - half)
    pub = phe.PaillierPublicKey(p * q)
    return pub, phe.PaillierPrivateKey(pub, p, q)


class InsecureKeyWarning(UserWarning):
    """Paillier keys shorter than 2048 bits: for experiments only."""


class KeyMismatchError(ValueError):
    """An agent was handed a message encrypted under another agent's public key."""


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
        return len(self.ciphertexts) * ciphertext_nbytes(self.public_key.n.bit_length())

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
                 "_djn_bits", "__private_key", "__crt", "_seeds")

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
        #: the masked protocol's seeds (:mod:`.seeds`): held here only, like the private key
        self._seeds = SeedStore()

    @property
    def key_bits(self) -> int:
        return self.public_key.n.bit_length()

    def forget(self) -> None:
        """Drop the private key, its CRT form and the seeds (the exchange closed): a reference
        the caller kept to this agent holds no private material from now on."""
        self.__private_key = None
        self.__crt = None
        self._seeds.clear()

    def _private_key(self):
        key = self.__private_key
        if key is None:
            raise RuntimeError(f"agent {self.agent} (trial {self.trial}): its exchange was closed and its private "
                               "key dropped")
        return key

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
        residues = self._raw.decrypt(self._private_key(), message.ciphertexts)
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
        self.__crt = PrivateCRT(self._private_key())
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
            return [self._private_key().raw_decrypt(int(c)) for c in message.ciphertexts]
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

    # -- the masked protocol (:mod:`.masked`): seeds stay in the agent ----------------------
    def draw_seed_for(self, tag: tuple, peer_public_key, obfuscators) -> list:
        """Draw a seed shared with one peer, keep it under ``tag``, and return it encrypted under
        the peer's key (one ciphertext per chunk, with the given public-key ``obfuscators``)."""
        seed = draw_seed()
        self._seeds.put(tag, seed)
        n = gmpy2.mpz(peer_public_key.n)
        nsq = n * n
        return [(1 + n * m) * r % nsq for m, r in zip(seed_to_chunks(seed, self._codec.key_bits), obfuscators,
                                                     strict=True)]

    def store_seed(self, tag: tuple, message: EncryptedVector) -> None:
        """Decrypt a seed sent to this agent (under its own key) and keep it under ``tag``."""
        self._seeds.put(tag, chunks_to_seed(self.decrypt_residues(message), self._codec.key_bits))

    def mask_units(self, signed_tags, receiver: int, round_no: int, n, count: int) -> list:
        """This agent's mask units for ``count`` reply ciphertexts to ``receiver`` (modulus ``n``) in
        round ``round_no``: the product of the seeds' units (:meth:`.seeds.SeedStore.units`)."""
        return self._seeds.units(signed_tags, receiver, round_no, n, count)

    def shifted(self, ciphertexts, step_bits: int, count: int) -> list:
        """``[c^(2^(w t)) for t < count]`` of each of the agent's own ciphertexts ``c``
        (:meth:`.obfuscation.PrivateCRT.power_chain`; by plain squaring without the fast path)."""
        crt = self.__crt
        if crt is not None:
            return crt.power_chain(ciphertexts, step_bits, count)
        step, nsq = gmpy2.mpz(1) << int(step_bits), self.nsquare
        out = []
        for c in ciphertexts:
            row = [gmpy2.mpz(c)]
            for _ in range(int(count) - 1):
                row.append(gmpy2.powmod(row[-1], step, nsq))
            out.append(row)
        return out

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
        pk, sk = generate_keypair(key_bits)
        if pk.n not in seen:
            seen.add(pk.n)
            out.append((pk, sk))
    return out


def make_agents(keypairs, *, n_nodes: int, n_agents: int, codec: IntegerCodec, raw: RawPaillier) -> tuple:
    """One :class:`_Agent` per node, with the key pairs handed in (``keypairs``, one per node,
    used in node order; None: generated here, timed as ``time_keygen`` in ``raw.ledger``).

    Raises
    ------
    ConfigError
        Naming ``keypairs``: too few, a modulus of another size than ``codec.key_bits``, or
        two nodes with the same key.
    """
    kb = codec.key_bits
    agents = []
    if keypairs is not None:
        if len(keypairs) < n_nodes:
            raise ConfigError(f"keypairs: {len(keypairs)} key pairs for {n_nodes} nodes; need one per node")
        keypairs = keypairs[:n_nodes]
        moduli = [pk.n for pk, _ in keypairs]
        if any(m.bit_length() != kb for m in moduli):
            raise ConfigError(f"keypairs: every public key must have a {kb}-bit modulus (key_bits={kb})")
        if len(set(moduli)) != n_nodes:
            raise ConfigError("keypairs: every node needs its own key pair; got duplicates")
        for node, (pk, sk) in enumerate(keypairs):
            agents.append(_Agent(node, n_agents, pk, sk, codec, raw))
    else:
        check_key_bits(kb)
        t0 = time.perf_counter()
        for node in range(n_nodes):
            pk, sk = generate_keypair(kb)
            agents.append(_Agent(node, n_agents, pk, sk, codec, raw))
        raw.ledger.add("time_keygen", time.perf_counter() - t0)
    return tuple(agents)
