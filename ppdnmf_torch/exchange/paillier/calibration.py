"""Per-operation costs of the real Paillier stage on this machine, for the timing model.

:func:`calibrate` measures a :class:`~ppdnmf_torch.exchange.costmodel.PaillierOpCosts`
through the raw layer the stage uses (:class:`~.keys.RawPaillier`);
:func:`~ppdnmf_torch.exchange.costmodel.estimate_seconds` turns operation counts into
seconds with it. ``exchange="quantized"`` imports this module only when it is first asked
for an estimate.
"""
from __future__ import annotations

import random
import time


from ..costmodel import PaillierOpCosts
from .keys import RawPaillier, generate_keypair

__all__ = ["calibrate"]

_CACHE: dict = {}


def calibrate(key_bits: int = 2048, repeats: int = 12, *, exponent_bits: int = 32,
              refresh: bool = False) -> PaillierOpCosts:
    """Time the raw Paillier operations of the real stage at ``key_bits`` (cached per size).

    Generates one key pair (timed: ``keygen``), then times ``repeats`` encryptions,
    decryptions, homomorphic additions (ciphertext products mod ``n^2``) and scalar
    multiplications (``powmod`` with an ``exponent_bits``-bit exponent) through the same
    raw layer the real stage uses: a bounded amount of work, whatever the machine (see
    docs/PERFORMANCE.md for how long it takes). The result is cached in-process per
    ``(key_bits, repeats, exponent_bits)``; ``refresh=True`` measures again.
    """
    key_bits, repeats, exponent_bits = int(key_bits), max(1, int(repeats)), int(exponent_bits)
    cache_key = (key_bits, repeats, exponent_bits)
    if not refresh and cache_key in _CACHE:
        return _CACHE[cache_key]
    t0 = time.perf_counter()
    pub, priv = generate_keypair(key_bits)  # interruptible, and refuses sizes above the limit
    keygen = time.perf_counter() - t0
    raw = RawPaillier(None)
    rng = random.Random(12345)  # plaintexts only; the obfuscators come from phe's SystemRandom
    plain = [rng.randrange(-(1 << 40), 1 << 40) % pub.n for _ in range(repeats)]

    t0 = time.perf_counter()
    cts = raw.encrypt(pub, plain)
    t_enc = (time.perf_counter() - t0) / repeats

    # additions are far cheaper than encryptions: time more of them for a stable number
    t0 = time.perf_counter()
    for _ in range(20):
        raw.add(pub, cts, cts)
    t_add = (time.perf_counter() - t0) / (20 * repeats)

    exponent = rng.getrandbits(exponent_bits) | (1 << (exponent_bits - 1))
    t0 = time.perf_counter()
    raw.scalar_mul(pub, cts, exponent)
    t_mul = (time.perf_counter() - t0) / repeats

    t0 = time.perf_counter()
    out = raw.decrypt(priv, cts)
    t_dec = (time.perf_counter() - t0) / repeats
    if out != plain:  # pragma: no cover - a broken phe/gmpy2 install
        raise RuntimeError("Paillier calibration: decryption does not invert encryption")
    del priv
    costs = PaillierOpCosts(key_bits, keygen, t_enc, t_dec, t_add, t_mul, exponent_bits, repeats)
    _CACHE[cache_key] = costs
    return costs
