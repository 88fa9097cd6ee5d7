"""Multi-exponentiation ``prod_t B_t^(e_t) mod m`` for the masked protocol's replies.

Neighbour ``j`` of agent ``i`` needs, per packed block ``b``, ``E_i(gamma_ij gamma_ji M(q_j,b))``
from ``i``'s shifted encryptions ``B_t = E_i(gamma_ij 2^(w t))``: the product of ``B_t`` raised
to the slot values ``gamma_ji q_{j,b,t}`` (:mod:`.masked`). One exponentiation of
``E_i(gamma_ij)`` by the packed integer would cost about ``key_bits`` squarings modulo
``n^2``; with the shifted bases the exponents are a slot's width, and the interleaved
sliding-window method (Straus) shares the squarings of every base: about ``b`` squarings and
``S b / (v + 1)`` multiplications for ``S`` bases of ``b``-bit exponents and windows of
``v`` bits, the odd-power tables of the bases (``2^(v - 1)`` entries each) being shared by
every block of the message.

Signed exponents: with ``o = 2^b`` above every ``|e_t|``, ``prod_t B_t^(e_t + o)`` has
nonnegative exponents, and ``(prod_t B_t)^o``, inverted once per message, removes the offset.
The results equal ``gmpy2.powmod`` products exactly (the tests check it).
"""
from __future__ import annotations

import gmpy2
from gmpy2 import mpz

__all__ = ["odd_powers", "multi_exp", "signed_multi_exps", "WINDOW", "SEPARATE_MAX_BASES"]

#: window width of the sliding windows (odd powers up to ``2^WINDOW - 1`` per base)
WINDOW = 4
#: up to this many bases, separate ``powmod`` calls (in C) beat the interpreted Straus loop
SEPARATE_MAX_BASES = 4


def odd_powers(base, mod, window: int = WINDOW) -> list:
    """``[base^1, base^3, ..., base^(2^window - 1)] mod mod``."""
    b = mpz(base) % mod
    sq = b * b % mod
    row = [b]
    for _ in range((1 << (window - 1)) - 1):
        row.append(row[-1] * sq % mod)
    return row


def multi_exp(tables, exps, mod, window: int = WINDOW):
    """``prod_t B_t^(e_t) mod mod`` for exponents ``e_t >= 0`` (``tables[t] = odd_powers(B_t)``)."""
    sched: dict = {}
    top = 0
    for tab, e in zip(tables, exps, strict=True):
        e = int(e)
        i = e.bit_length() - 1
        top = max(top, i + 1)
        while i >= 0:
            if not (e >> i) & 1:
                i -= 1
                continue
            j = max(i - window + 1, 0)
            seg = (e >> j) & ((1 << (i - j + 1)) - 1)
            tz = (seg & -seg).bit_length() - 1  # the window ends at a set bit: an odd digit
            j += tz
            seg >>= tz
            sched.setdefault(j, []).append(tab[seg >> 1])
            i = j - 1
    acc = None
    for pos in range(top - 1, -1, -1):
        if acc is not None:
            acc = acc * acc % mod
        for x in sched.get(pos, ()):
            acc = x if acc is None else acc * x % mod
    return mpz(1) if acc is None else acc


def signed_multi_exps(bases, rows, mod, window: int = WINDOW) -> list:
    """``[prod_t B_t^(e_bt) mod mod for each row b]`` for signed integer exponents ``e_bt``.

    A row shorter than ``bases`` has zeros after its entries. Up to :data:`SEPARATE_MAX_BASES`
    bases: one ``gmpy2.powmod`` per entry (it inverts for negative exponents; below that many
    bases the shared squarings save less than the interpreted loop costs). More:
    :func:`multi_exp` with the offset of the module docstring. Every base must be a unit mod
    ``mod``.
    """
    mod = mpz(mod)
    if len(bases) <= SEPARATE_MAX_BASES:
        out = []
        for row in rows:
            acc = mpz(1)
            for b, e in zip(bases, row):
                acc = acc * gmpy2.powmod(b, int(e), mod) % mod
            out.append(acc)
        return out
    top = max((abs(int(e)).bit_length() for row in rows for e in row), default=0)
    if top == 0:
        return [mpz(1) for _ in rows]
    off = 1 << top
    tables = [odd_powers(b, mod, window) for b in bases]
    prod = mpz(1)
    for b in bases:
        prod = prod * b % mod
    corr = gmpy2.invert(gmpy2.powmod(prod, off, mod), mod)
    S = len(bases)
    out = []
    for row in rows:
        exps = [int(e) + off for e in row] + [off] * (S - len(row))
        out.append(multi_exp(tables, exps, mod, window) * corr % mod)
    return out
