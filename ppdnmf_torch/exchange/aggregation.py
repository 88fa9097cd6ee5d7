"""Secure aggregation: a server that learns the sum of the workers' uploads and nothing else.

A federated round (for example step 2 of FSSPCA, docs/SPARSE_PCA.md, which needs only
``sum_i (w_i + u_i / rho)``) sends one upload per worker to a server. Three kinds, one
interface (:func:`make_aggregator`):

* ``plain``: the paper's upload in the clear, ``values.sum(dim)``, with its costs counted.
* ``quantized``: the secure protocol emulated exactly on the values' device: every worker
  quantizes its upload with the library's integer codec (:mod:`.codec`, ``q_i = round(n_max
  v_i)``), adds pairwise masks that cancel in the sum, and the server adds the masked
  integers modulo ``2^63``; the masks are gone from the sum, which decodes to ``sum_i q_i /
  n_max``.
* ``paillier`` (:mod:`.paillier.aggregation`; imports :mod:`phe`): the same protocol with real
  cryptography: seeds agreed under the workers' Paillier keys, every upload packed and
  encrypted under the server's key and multiplied by mask units that cancel in the product,
  so the server decrypts only the sum (docs/SECURE_AGGREGATION.md).
* ``secagg`` (:mod:`.secagg.aggregation`; imports :mod:`cryptography`): the pairwise masks agreed by
  the parties themselves (X25519 keys signed with Ed25519 identity keys, through the server, which
  relays public keys only) and drawn from AES-128-CTR, plus an edge mask per worker that only the
  server removes: the server learns the sum, an eavesdropper not even that; no Paillier key.

``quantized``, ``paillier`` and ``secagg`` return the same bits: each computes the exact integer sum
``sum_i q_i`` and decode it through one function (:meth:`.secure_sum.IntegerAggregator._decode`).

Masks (``quantized``). For every pair ``a < b`` of workers, a 256-bit seed ``s_ab`` drawn from
the operating system's CSPRNG (:func:`secrets.token_bytes`, as the masked protocol's seeds,
:mod:`.paillier.seeds`) is held by ``a`` and ``b`` only. In round ``r`` the PRG is SHAKE-256
(FIPS 202) of ``("ppdnmf-aggregate-v1", s_ab, a, b, r)``, read in counter mode: entry ``c`` of the
upload takes bytes ``8c .. 8c + 7``, reduced mod ``2^63``. Worker ``i`` adds

    m_i = sum_{k != i} sigma_ik PRG(s_ik, r)  mod 2^63,      sigma_ik = +1 if i < k else -1,

so ``sum_i m_i = 0 mod 2^63``: the server's modular sum of the uploads ``y_i = q_i + m_i``
is ``sum_i q_i mod 2^63``, read back as a signed integer. Each ``y_i`` alone is uniform on
``Z_{2^63}`` (for ``K >= 2``) and the uploads jointly carry only their sum.

Range. Every ``|q_i|`` and, entry by entry, the bound ``sum_i |q_i|`` must stay below the
limit of a slot of the Paillier plaintext (``2^(bits - 1)``, ``bits`` the slot width,
:mod:`.packing`; ``2^62`` by default): both kinds check it before anything is masked or
encrypted and raise :class:`~.codec.CodecRangeError` naming the worker or the entry; nothing
ever wraps.

A dropped worker (a missing upload: ``total(values, dropped=[k])``) is refused with
:class:`DroppedWorkerError` naming it: the others' masks cancel only against its masks, so
without it the round has no meaningful sum. No kind sums a partial round.
"""
from __future__ import annotations

import hashlib
import secrets
import struct
import time

import numpy as np
import torch

from ..errors import ConfigError
from .sealed import SEED_BYTES, SeedBox
from .secure_sum import (
    AGGREGATION_KINDS,
    DEFAULT_N_MAX,
    RING_BITS,
    Aggregator,
    DroppedWorkerError,
    IntegerAggregator,
    check_mask_neighbours,
    mask_pairs,
    round_counts,
    setup_counts,
)

__all__ = ["AGGREGATION_KINDS", "DEFAULT_N_MAX", "RING_BITS", "Aggregator", "PlainAggregator", "IntegerAggregator",
           "QuantizedAggregator", "DroppedWorkerError", "make_aggregator", "round_counts", "setup_counts", "mask_pairs",
           "ring_sum", "signed_lift"]

_RING_MASK = (1 << RING_BITS) - 1
_LO_BITS = 32
_LO_MASK = (1 << _LO_BITS) - 1
_DOMAIN = b"ppdnmf-aggregate-v1|"


# --------------------------------------------------------------------------- ring arithmetic
def ring_sum(y: torch.Tensor, dim: int) -> torch.Tensor:
    """``sum y mod 2^63`` along ``dim`` for int64 ``y`` in ``[0, 2^63)``, exact (two 32/31-bit limbs,
    so no partial sum overflows int64 for fewer than ``2^31`` terms)."""
    return _from_limbs((y & _LO_MASK).sum(dim), (y >> _LO_BITS).sum(dim))


def _from_limbs(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``(hi 2^32 + lo) mod 2^63`` from sums of the low (32-bit) and high (31-bit) limbs."""
    return (((hi + (lo >> _LO_BITS)) & ((1 << (RING_BITS - _LO_BITS)) - 1)) << _LO_BITS) | (lo & _LO_MASK)


def signed_lift(s: torch.Tensor) -> torch.Tensor:
    """Residues mod ``2^63`` as signed integers in ``[-2^62, 2^62)``."""
    return torch.where(s >= (1 << (RING_BITS - 1)), s - (1 << (RING_BITS - 1)) - (1 << (RING_BITS - 1)), s)


def _ring_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a + b) mod 2^63`` for ``a, b`` in ``[0, 2^63)`` without int64 overflow."""
    return (a + (b - (1 << (RING_BITS - 1)) - (1 << (RING_BITS - 1)))) & _RING_MASK


class PlainAggregator(Aggregator):
    """The paper's plain upload: the server receives every ``v_i`` and sums them (no secret)."""

    kind = "plain"

    def __init__(self, n_workers: int, *, record: bool = False):
        super().__init__(n_workers, record=record)

    def _total_impl(self, values, dim):
        out = values.sum(dim=dim)
        self._add("bytes", values.numel() * values.element_size())
        if self.record:
            self.transcript.append({"round": self.rounds, "uploads": values.movedim(dim, 0).detach().cpu().clone(),
                                    "sum": out.detach().cpu().clone()})
        return out

    def __repr__(self) -> str:
        return f"PlainAggregator(n_workers={self.n_workers}, rounds={self.rounds})"


class _SeedVault(SeedBox):
    """One worker's pairwise seeds, by peer. No method returns a seed: :meth:`stream` gives the
    PRG output of a pair for one round, the only thing the protocol needs from it."""

    __slots__ = ()

    def stream(self, me: int, peer: int, round_no: int, count: int) -> bytes:
        """The PRG output of the pair ``{me, peer}`` in round ``round_no``: ``8 count`` bytes, entry ``c``
        in bytes ``8c .. 8c + 7`` (read by :func:`_ring_values`)."""
        a, b = min(me, peer), max(me, peer)
        head = _DOMAIN + self._seeds[int(peer)] + struct.pack(">QQQ", a, b, int(round_no))
        return hashlib.shake_256(head).digest(8 * int(count))


def _ring_values(raw: bytes, shape) -> torch.Tensor:
    """PRG bytes as int64 values in ``[0, 2^63)`` (little-endian 64-bit words, top bit dropped)."""
    words = np.frombuffer(raw, dtype="<u8") & np.uint64(_RING_MASK)
    return torch.from_numpy(words.astype(np.int64).reshape(shape))


def _test_seed(seed: int, a: int, b: int) -> bytes:
    return hashlib.shake_256(b"ppdnmf-aggregate-test-seed|" + struct.pack(">qQQ", int(seed), a, b)).digest(
        SEED_BYTES)


class QuantizedAggregator(IntegerAggregator):
    """``kind="quantized"``: the masked integer protocol, emulated exactly on the values' device.

    Parameters
    ----------
    n_workers : int
    n_max : float
        Quantization scale, ``q_i = round(n_max v_i)`` (default ``2^32``).
    bits : int, optional
        Slot width of the Paillier plaintext it stands in for (default: the codec's natural 63
        bits): the range limit ``2^(bits - 1)`` and the cost model's slots per ciphertext.
    key_bits : int
        The Paillier key size it stands in for (the range and the cost model).
    seed : int, optional
        None (the default): mask seeds from the OS CSPRNG. An integer derives them from it, so
        that a transcript is reproducible: for tests and audits only, never in a real run (anyone
        who knows the integer knows every mask).
    record : bool
    masks : bool
        False switches the masks off (the audit's positive control; not offered by
        :func:`make_aggregator`).

    The PRG streams of a pair are computed once per round and added to one worker's upload and
    subtracted from the other's (each worker would compute the same values from its own copy of
    the seed). Costs: ``bytes`` (8 per masked integer), ``prg_bytes``, seconds per step, and the
    ``paillier`` kind's operation counts at ``key_bits`` as ``model_*`` (:func:`round_counts`,
    :func:`setup_counts`).
    """

    kind = "quantized"
    __slots__ = ()

    def __init__(self, n_workers: int, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = 2048, seed=None,
                 record: bool = False, mask_neighbours=None, masks: bool = True):
        super().__init__(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                         mask_neighbours=mask_neighbours)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed: must be an integer or None, got {seed!r}")
        self.masks = bool(masks)
        K = self.n_workers
        self._vaults = tuple(_SeedVault() for _ in range(K))
        t0 = time.perf_counter()
        if self.masks:
            for a, b in self.pairs:
                s = secrets.token_bytes(SEED_BYTES) if seed is None else _test_seed(seed, a, b)
                self._vaults[a].put(b, s)
                self._vaults[b].put(a, s)
        self._timed("seconds_setup", t0)
        for k, v in setup_counts(K, key_bits=self.key_bits, mask_neighbours=self.mask_neighbours).items():
            self._add(f"model_{k}", v)

    def _net_masks(self, P: int, device) -> torch.Tensor:
        """``m (K, P)`` in ``[0, 2^63)``: ``m_i = sum_{k != i} sigma_ik PRG(s_ik, r) mod 2^63``."""
        K, r, pairs = self.n_workers, self.rounds, self.pairs
        raw = b"".join([self._vaults[a].stream(a, b, r, P) for a, b in pairs])  # one conversion for all
        streams = _ring_values(raw, (len(pairs), P)).to(device)
        src = torch.tensor([a for a, _ in pairs], device=device)
        dst = torch.tensor([b for _, b in pairs], device=device)
        self._add("prg_bytes", 8 * P * len(pairs))

        def ring_scatter(index):  # the mod-2^63 sum of the streams per worker, in two limbs
            lo = torch.zeros((K, P), dtype=torch.int64, device=device).index_add_(0, index, streams & _LO_MASK)
            hi = torch.zeros((K, P), dtype=torch.int64, device=device).index_add_(0, index, streams >> _LO_BITS)
            return _from_limbs(lo, hi)

        return (ring_scatter(src) - ring_scatter(dst)) & _RING_MASK

    def _masked_sum(self, q):
        K, P = q.shape
        t0 = time.perf_counter()
        y = q & _RING_MASK  # q mod 2^63 (two's complement)
        if self.masks and P:
            y = _ring_add(y, self._net_masks(P, q.device))
        t0 = self._timed("seconds_mask", t0)
        s = signed_lift(ring_sum(y, 0))
        self._timed("seconds_aggregate", t0)
        self._add("bytes", K * P * 8)
        for k, v in round_counts(K, P, key_bits=self.key_bits, bits=self.bits,
                                 mask_neighbours=self.mask_neighbours).items():
            if k not in ("slots", "ciphertexts"):
                self._add(f"model_{k}", v)
        if self.record:
            self.transcript.append({"round": self.rounds, "uploads": y.cpu().clone()})
        return s

    def _forget(self) -> None:
        for v in self._vaults:
            v.clear()

    def mask_stream(self, worker: int, peer: int, round_no: int, count: int) -> torch.Tensor:
        """What ``worker`` can compute with its seed shared with ``peer``: the pair's PRG values of a
        round (int64 ``(count,)``). For the audit's colluding worker (it never returns a seed)."""
        return _ring_values(self._vaults[worker].stream(worker, peer, round_no, count), (int(count),))

    def __repr__(self) -> str:
        seeds = sum(len(v) for v in self._vaults) // 2  # a count, never a seed
        off = "" if self.masks else ", masks off"
        return (f"QuantizedAggregator(n_workers={self.n_workers}, n_max={self.n_max:g}, bits={self.bits}, "
                f"key_bits={self.key_bits}, rounds={self.rounds}, {seeds} pair seeds{off})")


def make_aggregator(kind: str = "plain", n_workers: int = 2, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = 2048,
                    seed=None, record: bool = False, mask_neighbours=None, **options) -> Aggregator:
    """The server's aggregator of ``kind`` for ``n_workers`` workers; one per run (trials share it).

    Parameters
    ----------
    kind : {"plain", "quantized", "paillier", "secagg"}
    n_workers : int
    n_max : float
        Quantization scale of the integer kinds (default ``2^32``; values are ``round(n_max v) / n_max``
        in the sum, so an upload's error is at most ``0.5 / n_max`` per entry).
    bits : int, optional
        Slot width of the packed Paillier plaintexts (default 63): the range ``2^(bits - 1)`` of
        every quantized sum, ``floor((key_bits - 2) / bits)`` values per ciphertext.
    key_bits : int
        Paillier key size (``paillier``; ``quantized`` uses it for the range and the cost model).
    seed : int, optional
        ``quantized``: derive the mask seeds from it, for a reproducible transcript (tests; default:
        the OS CSPRNG). ``plain`` and ``paillier`` ignore it (``paillier``'s keys and seeds always come
        from the OS, ``secagg``'s are agreed by its parties); no kind's sums depend on it.
    record : bool
        Keep :attr:`Aggregator.transcript` (audit, tests).
    mask_neighbours : int, optional
        The secure kinds' mask graph (:func:`mask_pairs`): None pairs every two workers (``K (K - 1) / 2``
        seeds); ``h`` pairs each worker with ``2h`` ring neighbours (for many workers).
    **options
        ``paillier``: ``keypairs`` (``K + 1`` pre-made key pairs, the server's last; tests) and
        ``djn`` (DJN short-exponent obfuscators; :mod:`.paillier.obfuscation`) and ``obfuscators``
        (``"designated"``: one worker's fresh obfuscators randomize the product; ``"every"``: every
        worker encrypts with its own, ``K`` times the cost).

    Raises
    ------
    ConfigError
        Naming an unknown kind or option, or a setting out of its range.
    """
    if kind == "plain":
        if options:
            raise ConfigError(f"{sorted(options)[0]}: not an option of kind='plain'")
        check_mask_neighbours(mask_neighbours)
        return PlainAggregator(n_workers, record=record)
    if kind == "quantized":
        if options:
            raise ConfigError(f"{sorted(options)[0]}: not an option of kind='quantized'")
        return QuantizedAggregator(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, seed=seed, record=record,
                                   mask_neighbours=mask_neighbours)
    if kind == "paillier":
        from .paillier.aggregation import PaillierAggregator  # imports phe: here and only here

        # seed: not used; paillier's keys and seeds always come from the OS, and no sum depends on them
        return PaillierAggregator(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                                  mask_neighbours=mask_neighbours, **options)
    if kind == "secagg":
        from .secagg.aggregation import SecAggAggregator  # imports cryptography: here and only here

        if options:
            raise ConfigError(f"{sorted(options)[0]}: not an option of kind='secagg'")
        # seed: not used; secagg's seeds are agreed by its parties, and no sum depends on them
        return SecAggAggregator(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                                mask_neighbours=mask_neighbours)
    raise ConfigError(f"kind: unknown aggregation kind {kind!r}; use one of {', '.join(AGGREGATION_KINDS)}")

