"""Paillier obfuscators, made fast: raw ``mpz`` arithmetic, CRT for the key owner, DJN.

A Paillier ciphertext is ``c = (1 + n m) * rho mod n^2`` with ``rho`` a random ``n``-th
residue, the *obfuscator*. With :mod:`phe`, ``rho = r^n mod n^2`` for a random ``r < n``:
a 2048-bit exponentiation modulo a 4096-bit number, almost all the time of an
encryption. This module makes obfuscators three ways, all returning ``gmpy2.mpz``:

* :func:`random_obfuscators` (public key only): ``r^n mod n^2`` exactly as phe does,
  ``r`` from :mod:`secrets`. Runs in-process or in the worker pool (:mod:`.pool`).
* :class:`PrivateCRT` (the key owner only, inside its agent): the ``n``-th residues mod
  ``n^2`` are, by the CRT, pairs of elements of the order-``(p-1)`` subgroup mod ``p^2``
  and of the order-``(q-1)`` subgroup mod ``q^2``. ``r^n mod p^2`` depends on ``r mod p``
  only and equals ``w(r)^q`` with ``w(t) = t^p mod p^2`` the bijection of ``Z_p^*`` onto
  that subgroup; ``q`` is invertible mod ``p - 1``, so for uniform ``r`` it is uniform on
  the subgroup, exactly as ``t^p mod p^2`` is for uniform ``t``. The owner therefore draws
  ``t_p, t_q`` uniformly and combines ``t_p^p mod p^2`` and ``t_q^q mod q^2`` with the CRT:
  the *same distribution* as ``r^n mod n^2``, for two exponentiations with a 1024-bit
  exponent modulo 2048-bit numbers (cheaper; see docs/PERFORMANCE.md). The same object
  decrypts (phe's CRT decryption on ``mpz``). It never leaves its agent: it cannot be
  pickled or copied, and its repr shows nothing. From 1024-bit keys up, the two CRT
  halves (mod ``p^2`` and mod ``q^2``) of a batch run side by side in two threads of the
  agent's own process: gmpy2's list exponentiations release the GIL, so decryption and
  the owner's obfuscators use a second core without the key leaving the process.
* :class:`FixedBaseTable` (``djn=True``, public key only): the Damgard-Jurik-Nielsen
  short-exponent obfuscator ``h_s^x mod n^2`` with ``h_s = (-y^2)^n mod n^2`` and a random
  exponent ``x`` of ``djn_exponent_bits`` bits (default ``2 x`` the security level of the
  modulus: 224 bits at 2048), with a fixed-base window table, so one obfuscator costs
  ``ceil(bits / window)`` multiplications mod ``n^2`` instead of a 2048-bit exponentiation
  (much faster; see docs/PERFORMANCE.md).

  Security assumption (DJN 2010, I. Damgard, M. Jurik, J. B. Nielsen, "A generalization
  of Paillier's public-key system with applications to electronic voting", IJIS 9(6)):
  ``h_s^x`` with a short ``x`` hides the plaintext only if the decisional composite
  residuosity problem stays hard when the randomness is drawn from this small subgroup
  with short exponents (their "small exponent" variant; no reduction to plain DCR is
  known for exponents this short). Libraries that offer DJN (Intel IPCL, SecretFlow HEU)
  use ``key_bits / 2``-bit exponents; set ``djn_exponent_bits=key_bits // 2`` for that.
  ``y`` is derived from ``n`` with SHAKE-256 ("nothing up my sleeve"), so every party
  computes the same public ``h_s`` from ``n`` alone and no extra message or byte is sent;
  ``-y^2`` is a random square times ``-1``, as in DJN.

Randomness: every random number here comes from :mod:`secrets` (the OS generator), so
forked or spawned workers never share a generator state.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import gmpy2
from gmpy2 import mpz, powmod

from ..sealed import HoldsPrivateKey

__all__ = [
    "random_obfuscators",
    "PrivateCRT",
    "FixedBaseTable",
    "djn_base",
    "djn_table",
    "djn_obfuscators",
    "security_bits",
    "default_djn_exponent_bits",
    "public_obfuscators",
    "DJN_WINDOW",
]

#: window of the fixed-base table (bits per table row): 2^6 entries per row
DJN_WINDOW = 6
#: the in-process cache of DJN tables holds at most this many bytes of table entries
_TABLE_CACHE_BYTES = 256 << 20
#: from this modulus size up, :class:`PrivateCRT` runs its two CRT halves in two threads
#: (below it an exponentiation costs less than handing it to a thread)
CRT_THREAD_MIN_BITS = 1024


def security_bits(key_bits: int) -> int:
    """Symmetric-equivalent security of a ``key_bits``-bit RSA modulus (NIST SP 800-57 Part 1)."""
    k = int(key_bits)
    if k >= 15360:
        return 256
    if k >= 7680:
        return 192
    if k >= 3072:
        return 128
    if k >= 2048:
        return 112
    return 80


def default_djn_exponent_bits(key_bits: int) -> int:
    """``2 x`` :func:`security_bits`: 224 bits at 2048, 256 at 3072."""
    return 2 * security_bits(key_bits)


# ---------------------------------------------------------------------------- public key
def random_obfuscators(n, count: int) -> list:
    """``count`` obfuscators ``r^n mod n^2``, ``r`` uniform in ``[1, n)`` (phe's distribution)."""
    n = mpz(n)
    nsq = n * n
    ni = int(n) - 1
    return [powmod(mpz(secrets.randbelow(ni) + 1), n, nsq) for _ in range(int(count))]


def djn_base(n) -> mpz:
    """The public DJN base ``h_s = (-y^2)^n mod n^2`` of modulus ``n``, ``y`` derived from ``n``."""
    n = mpz(n)
    nbytes = (int(n).bit_length() + 7) // 8
    seed = b"ppdnmf-djn-base|" + int(n).to_bytes(nbytes, "big")
    ctr = 0
    while True:
        y = mpz(int.from_bytes(hashlib.shake_256(seed + bytes([ctr])).digest(nbytes + 16), "big")) % n
        if y > 1 and gmpy2.gcd(y, n) == 1:
            break
        ctr += 1  # pragma: no cover - probability ~2^-1000
    h = (-(y * y)) % n
    return powmod(h, n, n * n)


class FixedBaseTable:
    """``base^x mod m`` for ``x < 2^bits`` from a table of ``base^(d 2^(w i))``, ``d < 2^w``.

    ``ceil(bits / w)`` rows of ``2^w`` entries; an exponentiation is one table look-up
    per row and ``ceil(bits / w) - 1`` multiplications mod ``m``, no squarings.
    """

    __slots__ = ("modulus", "bits", "window", "rows", "nbytes")

    def __init__(self, base, modulus, bits: int, window: int = DJN_WINDOW):
        m = mpz(modulus)
        w = int(window)
        nrows = -(-int(bits) // w)
        rows = []
        b = mpz(base) % m
        for _ in range(nrows):
            row = [mpz(1), b]
            for _ in range((1 << w) - 2):
                row.append(row[-1] * b % m)
            rows.append(tuple(row))
            b = row[-1] * b % m  # base^(2^(w (i + 1)))
        self.modulus, self.bits, self.window, self.rows = m, int(bits), w, tuple(rows)
        self.nbytes = nrows * (1 << w) * ((int(m).bit_length() + 7) // 8)

    def power(self, x: int) -> mpz:
        """``base^x mod m`` for ``0 <= x < 2^bits``."""
        m, w = self.modulus, self.window
        mask = (1 << w) - 1
        acc = None
        for row in self.rows:
            d = x & mask
            x >>= w
            if d:
                acc = row[d] if acc is None else acc * row[d] % m
        return mpz(1) if acc is None else acc

    def sample(self, count: int) -> list:
        """``count`` powers with fresh uniform ``bits``-bit exponents (:mod:`secrets`)."""
        bits, power = self.bits, self.power
        return [power(secrets.randbits(bits)) for _ in range(int(count))]


_TABLES: OrderedDict = OrderedDict()
_TABLES_BYTES = [0]


def djn_table(n, bits: int, window: int = DJN_WINDOW) -> FixedBaseTable:
    """The (cached, least recently used first out) fixed-base table of ``h_s`` for ``n``."""
    key = (int(n), int(bits), int(window))
    tab = _TABLES.get(key)
    if tab is not None:
        _TABLES.move_to_end(key)
        return tab
    n = mpz(n)
    tab = FixedBaseTable(djn_base(n), n * n, bits, window)
    _TABLES[key] = tab
    _TABLES_BYTES[0] += tab.nbytes
    while _TABLES_BYTES[0] > _TABLE_CACHE_BYTES and len(_TABLES) > 1:
        _, old = _TABLES.popitem(last=False)
        _TABLES_BYTES[0] -= old.nbytes
    return tab


def djn_obfuscators(n, count: int, bits: int, window: int = DJN_WINDOW) -> list:
    """``count`` DJN obfuscators ``h_s^x mod n^2`` with ``bits``-bit random ``x``."""
    return djn_table(n, bits, window).sample(count)


def public_obfuscators(n, count: int, djn_bits=None) -> list:
    """Obfuscators for public key ``n``: DJN when ``djn_bits`` is set, else ``r^n mod n^2``."""
    if djn_bits:
        return djn_obfuscators(n, count, djn_bits)
    return random_obfuscators(n, count)


def worker_obfuscators(n: int, count: int, djn_bits) -> list:
    """Worker-pool task: public modulus ``n`` in, ``count`` obfuscators out (as Python ints)."""
    return [int(v) for v in public_obfuscators(n, count, djn_bits)]


def worker_ping() -> int:
    """Worker-pool task: start-up check."""
    import os

    return os.getpid()


#: the only functions the worker pool runs: public-key work, by name
PUBLIC_TASKS = {"obfuscators": worker_obfuscators, "ping": worker_ping}


# --------------------------------------------------------------------------- private key
_HALF = [None]  # the one helper thread for the second CRT half (made on first use)
_HALF_LOCK = threading.Lock()


def _half_thread() -> ThreadPoolExecutor:
    with _HALF_LOCK:
        if _HALF[0] is None:
            _HALF[0] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppdnmf-crt")
        return _HALF[0]


def _forget_half_thread():
    # a forked child has no copy of the parent's thread (nor of a lock it may have held):
    # it makes its own on first use
    global _HALF_LOCK
    _HALF_LOCK = threading.Lock()
    _HALF[0] = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_half_thread)


def _crt_halves(bases_p, exp_p, mod_p, bases_q, exp_q, mod_q, threaded: bool):
    """``[b^exp_p mod mod_p for b in bases_p]`` and the same for ``q``, side by side when ``threaded``.

    ``gmpy2.powmod_base_list`` releases the GIL, so the helper thread's half runs on another
    core while this thread computes the other; the results are those of ``powmod``.
    """
    fut = None
    if threaded and len(bases_p) > 0:
        try:
            fut = _half_thread().submit(gmpy2.powmod_base_list, bases_q, exp_q, mod_q)
        except RuntimeError:  # the interpreter is shutting down (no new threads): one thread then
            fut = None
    xp = gmpy2.powmod_base_list(bases_p, exp_p, mod_p)
    return xp, (gmpy2.powmod_base_list(bases_q, exp_q, mod_q) if fut is None else fut.result())


def _chain(xs, step, count: int, mod) -> list:
    """``[xs, xs^step, xs^(step^2), ...]`` (``count`` levels) mod ``mod``, elementwise."""
    levels = [xs]
    for _ in range(count - 1):
        levels.append(gmpy2.powmod_base_list(levels[-1], step, mod))
    return levels


def _crt_chains(xp, xq, step, count: int, psq, qsq, threaded: bool):
    """:func:`_chain` modulo ``p^2`` and ``q^2``, the ``q`` half in the helper thread when ``threaded``
    (one hand-over for the whole chain)."""
    fut = None
    if threaded and xp:
        try:
            fut = _half_thread().submit(_chain, xq, step, count, qsq)
        except RuntimeError:  # the interpreter is shutting down (no new threads): one thread then
            fut = None
    lp = _chain(xp, step, count, psq)
    return lp, (_chain(xq, step, count, qsq) if fut is None else fut.result())


class PrivateCRT(HoldsPrivateKey):
    """The key owner's fast private operations, on ``mpz``: CRT decryption and CRT obfuscators.

    Built from a :class:`phe.PaillierPrivateKey` inside :class:`~.keys._Agent` and kept
    there. Refuses pickling and copying; its repr shows no key material.
    """

    __slots__ = ("_n", "_nsq", "_p", "_q", "_psq", "_qsq", "_hp", "_hq", "_pinv", "_psq_inv", "_threaded")

    def __init__(self, private_key):
        self._n = mpz(private_key.public_key.n)
        self._nsq = self._n * self._n
        self._p, self._q = mpz(private_key.p), mpz(private_key.q)
        self._psq, self._qsq = self._p * self._p, self._q * self._q
        self._hp, self._hq = mpz(private_key.hp), mpz(private_key.hq)
        self._pinv = mpz(private_key.p_inverse)
        self._psq_inv = gmpy2.invert(self._psq, self._qsq)
        self._threaded = int(self._n).bit_length() >= CRT_THREAD_MIN_BITS

    def decrypt(self, ciphertexts) -> list:
        """Residues ``0 <= m < n`` (phe's CRT decryption, on ``mpz``)."""
        # malformed input fails here, before any secret is a local of this frame (tracebacks
        # that show locals, in loggers or debuggers, then hold none)
        cts = [mpz(c) for c in ciphertexts]
        nsq = self._nsq
        if any(not 0 < c < nsq for c in cts):
            raise ValueError("ciphertext outside (0, n^2): not a ciphertext of this key")
        p, q, psq, qsq, hp, hq, pinv = self._p, self._q, self._psq, self._qsq, self._hp, self._hq, self._pinv
        xp, xq = _crt_halves([c % psq for c in cts], p - 1, psq, [c % qsq for c in cts], q - 1, qsq,
                             self._threaded)
        out = []
        for a, b in zip(xp, xq):
            mp = (a - 1) // p * hp % p
            mq = (b - 1) // q * hq % q
            out.append(int(mp + (mq - mp) * pinv % q * p))
        return out

    def power_chain(self, ciphertexts, step_bits: int, count: int) -> list:
        """``[c^(2^(w t)) mod n^2 for t < count]`` for every ``c`` of ``ciphertexts`` (``w = step_bits``).

        The masked protocol's shifted encryptions ``E(m 2^(w t))`` (:mod:`.masked`): ``w (count - 1)``
        squarings per ciphertext, done modulo ``p^2`` and ``q^2`` (numbers of half the size; the two
        halves side by side in two threads from 1024-bit keys up) and combined with the CRT.
        Anyone could compute them from ``c`` (they reveal nothing ``c`` does not); the owner's
        factors only make them cheaper. Returns one list of ``count`` values per ciphertext.
        """
        cts = [mpz(c) for c in ciphertexts]
        if not cts or count < 1:
            return [[] for _ in cts]
        psq, qsq, inv = self._psq, self._qsq, self._psq_inv
        step = mpz(1) << int(step_bits)
        xp, xq = [c % psq for c in cts], [c % qsq for c in cts]
        levels_p, levels_q = _crt_chains(xp, xq, step, int(count), psq, qsq, self._threaded)
        out = [[c] for c in cts]
        for lp, lq in zip(levels_p[1:], levels_q[1:]):
            for row, a, b in zip(out, lp, lq):
                row.append(a + psq * ((b - a) * inv % qsq))
        return out

    def obfuscators(self, count: int) -> list:
        """``count`` uniform ``n``-th residues mod ``n^2`` (see the module docstring)."""
        pi, qi = int(self._p) - 1, int(self._q) - 1
        count = int(count)
        t_p = [secrets.randbelow(pi) + 1 for _ in range(count)]
        t_q = [secrets.randbelow(qi) + 1 for _ in range(count)]
        return self._from_seeds(t_p, t_q)

    def _from_seeds(self, t_p, t_q) -> list:
        """The obfuscators of seeds ``t_p in Z_p^*``, ``t_q in Z_q^*`` (lists): ``CRT(t_p^p mod p^2, t_q^q mod q^2)``.

        Each equals ``r^n mod n^2`` for the ``r in Z_n^*`` with ``r = t_p^(q^-1 mod (p-1)) mod p`` and
        ``r = t_q^(p^-1 mod (q-1)) mod q``, a bijection of the seeds onto ``Z_n^*``: uniform
        seeds give phe's distribution exactly.
        """
        psq, qsq, inv = self._psq, self._qsq, self._psq_inv
        xa, xb = _crt_halves([mpz(t) for t in t_p], self._p, psq, [mpz(t) for t in t_q], self._q, qsq,
                             self._threaded)
        return [a + psq * ((b - a) * inv % qsq) for a, b in zip(xa, xb)]

    def __repr__(self) -> str:
        return f"PrivateCRT({int(self._n).bit_length()}-bit key)"

