"""The masked protocol's key material besides the Paillier keys: mask seeds and mask units.

Seeds
-----
Every seed is :data:`~ppdnmf_torch.exchange.costmodel.SEED_BITS` = 256 bits from the
operating system's CSPRNG (:func:`secrets.token_bytes`), drawn by one agent and sent to the
one other agent that shares it encrypted under that agent's Paillier key (in
:func:`~ppdnmf_torch.exchange.costmodel.seed_chunks` plaintexts of ``key_bits - 1`` bits).
Two kinds (docs/SECURE_EXCHANGE.md):

* ``("pair", i, j, k)``, ``j < k`` two neighbours of ``i``: drawn by ``j``, sent to ``k``
  through ``i`` (who cannot read it); the masks of ``j``'s and ``k``'s replies to ``i``;
* ``("edge", a, b)``, ``a < b`` two neighbours: drawn by ``a``, sent to ``b``; a second mask
  of every reply over that edge, which the receiver removes (it hides a reply from another
  neighbour of the receiver who listens on the link and holds the pair seeds).

A seed lives in the :class:`SeedStore` of each of its two agents and nowhere else: the store
refuses pickling and copying (:class:`~ppdnmf_torch.exchange.sealed.HoldsPrivateKey`), its repr shows a count,
and no method returns a seed. The transcript carries the seeds' ciphertexts only.

Mask units
----------
From a seed, the round number ``r`` (public: every party counts the protocol's rounds, so no
``(seed, r)`` is used twice) and the receiver's modulus ``n``, :func:`unit_stream` draws
uniform units of ``Z*_{n^2}``: SHAKE-256 (FIPS 202, an extendable-output function used as
the PRG) of the seed and ``(receiver, r)``, cut into chunks of ``bits(n^2) + 128`` bits, each
reduced mod ``n^2``; a chunk that is not a unit (probability about ``2^-(key_bits / 2)``)
is skipped, in the same way by both holders. With 128 extra bits a reduced chunk is within
statistical distance ``2^-128`` of uniform on ``Z_{n^2}``: no rejection loop with an
unbounded running time is needed.

A uniform unit of ``Z*_{n^2}`` is, by Paillier's isomorphism ``Z_n x Z*_n -> Z*_{n^2}``,
``(1 + u n) s^n`` with ``u`` uniform in ``Z_n`` and ``s`` uniform: multiplying a ciphertext by
it adds a uniform plaintext mask *and* re-randomizes it. Neighbour ``j`` multiplies its
reply to ``i`` by ``prod_k mu_jk^{+-1}`` (``+1`` if ``j < k``): over ``i``'s neighbours these
cancel exactly in ``i``'s product, plaintext and randomness alike.
"""
from __future__ import annotations

import hashlib
import secrets
import struct

import gmpy2
from gmpy2 import mpz

from ..costmodel import SEED_BITS
from ..sealed import SeedBox

__all__ = ["SeedStore", "draw_seed", "seed_to_chunks", "chunks_to_seed", "unit_stream", "SEED_BYTES",
           "MASK_EXTRA_BITS"]

SEED_BYTES = SEED_BITS // 8
#: extra PRG bits per unit: a chunk of ``bits(n^2) + 128`` bits reduced mod ``n^2`` is
#: within ``2^-128`` of uniform
MASK_EXTRA_BITS = 128
_DOMAIN = b"ppdnmf-masked-v1|"

#: the seeds' source; the audit and the key-hygiene test watch it (they never see it otherwise)
_token = secrets.token_bytes


def draw_seed() -> bytes:
    """A fresh seed from the operating system's CSPRNG."""
    return _token(SEED_BYTES)


def seed_to_chunks(seed: bytes, key_bits: int) -> list:
    """The seed as plaintexts of ``key_bits - 1`` bits (each below any ``key_bits``-bit modulus)."""
    v = int.from_bytes(seed, "big")
    w = int(key_bits) - 1
    out = []
    for _ in range(-(-SEED_BITS // w)):
        out.append(v & ((1 << w) - 1))
        v >>= w
    return out


def chunks_to_seed(chunks, key_bits: int) -> bytes:
    """Inverse of :func:`seed_to_chunks`."""
    w = int(key_bits) - 1
    v = 0
    for c in reversed(list(chunks)):
        v = (v << w) | int(c)
    return v.to_bytes(SEED_BYTES, "big")


def unit_stream(seed: bytes, receiver: int, round_no: int, n, count: int) -> list:
    """``count`` uniform units of ``Z*_{n^2}`` for the replies to ``receiver`` in round ``round_no``."""
    n = mpz(n)
    nsq = n * n
    nbytes = (int(nsq).bit_length() + MASK_EXTRA_BITS + 7) // 8
    head = _DOMAIN + seed + struct.pack(">QQ", int(receiver), int(round_no))
    want = int(count)
    raw = hashlib.shake_256(head).digest(want * nbytes)
    xs = [mpz(int.from_bytes(raw[k * nbytes:(k + 1) * nbytes], "big")) % nsq for k in range(want)]
    prod = mpz(1)
    for x in xs:  # one gcd for the whole stream: all are units iff their product is
        prod = prod * x % n
    if gmpy2.gcd(prod, n) == 1:
        return xs
    # a non-unit (probability about 2^-(key_bits / 2)) is skipped, and the stream continues:
    # every holder of the seed does the same
    out, k = [], 0
    while len(out) < want:
        k += 1
        raw = hashlib.shake_256(head).digest((want + k) * nbytes)
        out = [x for x in (mpz(int.from_bytes(raw[i * nbytes:(i + 1) * nbytes], "big")) % nsq
                           for i in range(want + k)) if gmpy2.gcd(x, n) == 1][:want]
    return out


class SeedStore(SeedBox):
    """One agent's seeds, by tag. Nothing reads a seed out: :meth:`units` returns the product
    of the masks of a set of tags, the only thing the protocol needs from them."""

    __slots__ = ()

    def units(self, signed_tags, receiver: int, round_no: int, n, count: int) -> list:
        """``prod_tag mu_tag^{sign}`` for ``count`` ciphertexts (``signed_tags``: ``(tag, +1 or -1)``)."""
        n = mpz(n)
        nsq = n * n
        pos = [mpz(1)] * int(count)
        neg = None
        for tag, sign in signed_tags:
            mus = unit_stream(self._seeds[tag], receiver, round_no, n, count)
            if sign > 0:
                pos = [a * b % nsq for a, b in zip(pos, mus)]
            else:
                neg = mus if neg is None else [a * b % nsq for a, b in zip(neg, mus)]
        if neg is None:
            return pos
        return [a * gmpy2.invert(b, nsq) % nsq for a, b in zip(pos, neg)]
