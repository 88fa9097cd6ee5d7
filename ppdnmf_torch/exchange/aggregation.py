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

``quantized`` and ``paillier`` return the same bits: both compute the exact integer sum
``sum_i q_i`` and decode it through one function (:meth:`IntegerAggregator._decode`).

Masks (``quantized``). For every pair ``a < b`` of workers, a 256-bit seed ``s_ab`` drawn from
the operating system's CSPRNG (:func:`secrets.token_bytes`, as the masked protocol's seeds,
:mod:`.paillier.seeds`) is held by ``a`` and ``b`` only. In round ``r`` the PRG is SHAKE-256
(FIPS 202) of ``("ppdnmf-aggregate-v1", s_ab, r)``, read in counter mode: entry ``c`` of the
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

from .._utils import ConfigError, DataError, PPDNMFError
from .codec import CodecRangeError, IntegerCodec
from .costmodel import SEED_BITS, ciphertext_nbytes, public_key_nbytes, seed_chunks
from .packing import derive_layout, natural_slot_bits

__all__ = ["AGGREGATION_KINDS", "DEFAULT_N_MAX", "RING_BITS", "Aggregator", "PlainAggregator", "IntegerAggregator",
           "QuantizedAggregator", "DroppedWorkerError", "make_aggregator", "round_counts", "setup_counts", "mask_pairs",
           "ring_sum", "signed_lift"]

AGGREGATION_KINDS = ("plain", "quantized", "paillier")
#: the default quantization scale ``2^32``: a power of two, so decoding divides exactly
DEFAULT_N_MAX = float(2**32)
#: the emulated plaintext ring is ``Z_{2^63}`` (int64 arithmetic, in two limbs for sums)
RING_BITS = 63
_RING_MASK = (1 << RING_BITS) - 1
_LO_BITS = 32
_LO_MASK = (1 << _LO_BITS) - 1
_SEED_BYTES = SEED_BITS // 8
_DOMAIN = b"ppdnmf-aggregate-v1|"


class DroppedWorkerError(PPDNMFError):
    """A worker's upload is missing from a secure round: refused (the masks would not cancel).

    Attributes
    ----------
    workers : tuple of int
    round : int
    """

    def __init__(self, message, *, workers=(), round_no=0):
        super().__init__(message)
        self.workers, self.round = tuple(workers), int(round_no)


def _refuse(obj):
    raise TypeError(f"{type(obj).__name__} holds key material (mask seeds or private keys) and cannot be "
                    "pickled or copied; build a new one instead")


class SealedKeys:
    """Mixin of the objects that hold seeds or keys: pickling and copying are refused."""

    __slots__ = ()

    def __reduce_ex__(self, protocol):
        _refuse(self)

    def __reduce__(self):
        _refuse(self)

    def __getstate__(self):
        _refuse(self)

    def __copy__(self):
        _refuse(self)

    def __deepcopy__(self, memo):
        _refuse(self)


# --------------------------------------------------------------------------- ring arithmetic
def ring_sum(y: torch.Tensor, dim: int) -> torch.Tensor:
    """``sum y mod 2^63`` along ``dim`` for int64 ``y`` in ``[0, 2^63)``, exact (two 32/31-bit limbs,
    so no partial sum overflows int64 for fewer than ``2^31`` terms)."""
    lo = (y & _LO_MASK).sum(dim)
    hi = (y >> _LO_BITS).sum(dim)
    return (((hi + (lo >> _LO_BITS)) & ((1 << (RING_BITS - _LO_BITS)) - 1)) << _LO_BITS) | (lo & _LO_MASK)


def signed_lift(s: torch.Tensor) -> torch.Tensor:
    """Residues mod ``2^63`` as signed integers in ``[-2^62, 2^62)``."""
    return torch.where(s >= (1 << (RING_BITS - 1)), s - (1 << (RING_BITS - 1)) - (1 << (RING_BITS - 1)), s)


def _ring_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(a + b) mod 2^63`` for ``a, b`` in ``[0, 2^63)`` without int64 overflow."""
    return (a + (b - (1 << (RING_BITS - 1)) - (1 << (RING_BITS - 1)))) & _RING_MASK


# --------------------------------------------------------------------------- the mask graph
def mask_pairs(n_workers: int, mask_neighbours=None) -> list:
    """The pairs ``(a, b)``, ``a < b``, of workers that share a mask seed, in a fixed order.

    ``mask_neighbours=None``: every pair (the complete graph). An integer ``h >= 1``: worker ``i``
    pairs with the ``h`` next workers on each side of a ring (``i +- 1, ..., i +- h`` mod ``K``), so
    ``min(2h, K - 1)`` partners each and ``O(K h)`` seeds instead of ``K (K - 1) / 2``. Any connected
    mask graph gives the server only the sum; a smaller ``h`` lets fewer colluders unmask a worker
    (its ``2h`` partners together with the server), docs/SECURE_AGGREGATION.md.
    """
    K = int(n_workers)
    if mask_neighbours is None or 2 * int(mask_neighbours) >= K - 1:
        return [(a, b) for a in range(K) for b in range(a + 1, K)]
    pairs = {tuple(sorted((i, (i + s) % K))) for i in range(K) for s in range(1, int(mask_neighbours) + 1)}
    return sorted(pairs)


def check_mask_neighbours(mask_neighbours) -> None:
    if mask_neighbours is not None and (isinstance(mask_neighbours, bool) or not isinstance(mask_neighbours, int)
                                        or mask_neighbours < 1):
        raise ConfigError(f"mask_neighbours: must be None (every pair) or an integer >= 1, got {mask_neighbours!r}")


# --------------------------------------------------------------------------- the cost model
def setup_counts(n_workers: int, *, key_bits: int, mask_neighbours=None) -> dict:
    """The ``paillier`` kind's setup, once per aggregator: every worker's public key to the
    server and, relayed, to every other worker; per pair ``a < b`` of :func:`mask_pairs` a seed drawn
    by ``a``, encrypted under ``b``'s key and sent to ``b`` through the server (two hops)."""
    K = int(n_workers)
    pairs = len(mask_pairs(K, mask_neighbours))
    k, B, C = seed_chunks(key_bits), public_key_nbytes(key_bits), ciphertext_nbytes(key_bits)
    return {"setup_encryptions": pairs * k, "setup_decryptions": pairs * k,
            "setup_bytes": K * B + K * K * B + 2 * pairs * k * C, "key_pairs": K + 1}


def round_counts(n_workers: int, n_values: int, *, key_bits: int, bits: int | None = None,
                 mask_neighbours=None) -> dict:
    """The ``paillier`` kind's operations and bytes for one round of ``n_values`` values per worker.

    With ``S`` slots per plaintext (:func:`~.packing.derive_layout`) an upload is ``C = ceil(P / S)``
    ciphertexts: encryptions ``K C`` (one per worker and ciphertext), mask units ``2 pairs C``
    (PRG outputs multiplied in; ``K (K - 1) C`` on the complete mask graph), homomorphic additions
    ``(K - 1) C`` (the server's products), decryptions ``C`` (the sum only), bytes ``K C`` ciphertexts.
    """
    layout = derive_layout(IntegerCodec(key_bits=int(key_bits)), slot_bits=bits)
    K, P = int(n_workers), int(n_values)
    C = layout.n_ciphertexts(P)
    return {"encryptions": K * C, "decryptions": C, "homomorphic_additions": (K - 1) * C,
            "mask_units": 2 * len(mask_pairs(K, mask_neighbours)) * C, "bytes": K * C * ciphertext_nbytes(key_bits), "ciphertexts": C,
            "slots": layout.slots}


# --------------------------------------------------------------------------- the interface
class Aggregator:
    """The server's sum of the workers' uploads, one :meth:`total` per round.

    Parameters
    ----------
    n_workers : int
        ``K >= 1`` (``>= 2`` for the secure kinds: one worker's sum is its upload).
    record : bool
        Keep a transcript of every round (:attr:`transcript`): for the audit and tests only,
        it holds the private uploads next to what the server received.

    Costs: :meth:`costs` (cumulative, a flat dict of numbers) and :meth:`pop_round_costs` (one dict
    per round since the last call), keys ``rounds``, ``uploads`` (values per worker, summed over
    rounds), ``bytes`` (upload traffic), ``seconds`` and, per kind, the operation counters and the
    seconds per step (``seconds_encode``, ``seconds_mask``, ``seconds_encrypt``, ``seconds_aggregate``,
    ``seconds_decrypt``, ``seconds_setup``, ``seconds_keygen``).
    """

    kind = ""

    def __init__(self, n_workers: int, *, record: bool = False, min_workers: int = 1):
        if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < min_workers:
            raise ConfigError(f"n_workers: must be an integer >= {min_workers} for kind={self.kind!r}, "
                              f"got {n_workers!r}")
        self.n_workers = int(n_workers)
        self.record = bool(record)
        self.transcript = [] if record else None
        self.rounds = 0
        self._closed = False
        self._total = {}
        self._records = []
        self._current = None

    # -- costs ---------------------------------------------------------------------------
    def _add(self, key: str, value) -> None:
        self._total[key] = self._total.get(key, 0) + value
        if self._current is not None:
            self._current[key] = self._current.get(key, 0) + value

    def _timed(self, key: str, t0: float) -> float:
        t1 = time.perf_counter()
        self._add(key, t1 - t0)
        return t1

    def costs(self) -> dict:
        """Cumulative costs (a copy): counters, bytes, seconds."""
        out = {"rounds": self.rounds, "uploads": 0, "bytes": 0, "seconds": 0.0}
        out.update(self._total)
        return out

    def pop_round_costs(self) -> list:
        """One dict per round since the last call (``round`` and that round's counters)."""
        out, self._records = self._records, []
        return out

    # -- a round -------------------------------------------------------------------------
    def _worker_dim(self, values: torch.Tensor, dim) -> int:
        if not isinstance(values, torch.Tensor) or not values.is_floating_point():
            raise DataError(f"values: the workers' uploads must be a floating-point tensor, got "
                            f"{type(values).__name__ if not isinstance(values, torch.Tensor) else values.dtype}")
        K = self.n_workers
        if dim is None:
            hits = [d for d in range(values.dim()) if values.shape[d] == K]
            if len(hits) != 1:
                raise ConfigError(
                    f"dim: values of shape {tuple(values.shape)} have {len(hits)} dimensions of size n_workers={K}; "
                    "say which one holds the workers (dim=...)")
            return hits[0]
        if not isinstance(dim, int) or not -values.dim() <= dim < values.dim():
            raise ConfigError(f"dim: must be a dimension of values (shape {tuple(values.shape)}), got {dim!r}")
        dim %= values.dim()
        if values.shape[dim] != K:
            raise DataError(f"values: dimension {dim} of shape {tuple(values.shape)} must hold the "
                            f"n_workers={K} uploads")
        return dim

    def _check_dropped(self, dropped) -> None:
        if dropped is None:
            return
        if isinstance(dropped, torch.Tensor) and dropped.dtype == torch.bool:
            missing = torch.nonzero(dropped.reshape(-1)).flatten().tolist()
        else:
            missing = sorted({int(k) for k in dropped})
        if not missing:
            return
        bad = [k for k in missing if not 0 <= k < self.n_workers]
        if bad:
            raise ConfigError(f"dropped: worker indices must lie in [0, {self.n_workers}), got {bad}")
        names = ", ".join(str(k) for k in missing)
        raise DroppedWorkerError(
            f"dropped: worker{'s' if len(missing) > 1 else ''} {names} did not upload in round {self.rounds + 1}; "
            f"the {self.kind} aggregation refuses a round without every worker's upload"
            + (" (the other workers' pairwise masks cancel only against the missing ones: the server would "
               "decode noise); rerun the round with every worker, or start a new aggregator without them"
               if self.kind != "plain" else " (the sum would silently miss a term)"),
            workers=missing, round_no=self.rounds + 1)

    def total(self, values: torch.Tensor, dim: int | None = None, *, dropped=None) -> torch.Tensor:
        """The sum of the workers' uploads.

        Parameters
        ----------
        values : float Tensor (..., K, *shape)
            Every worker's upload, stacked along ``dim`` (trials first when batched: ``w (T, K, d, r)``
            with ``dim=1``). One call is one round.
        dim : int, optional
            The workers' dimension. None: the only dimension of size ``K`` (an error when there
            is not exactly one: pass ``dim`` whenever a trial or value dimension could equal ``K``).
        dropped : iterable of int or bool Tensor (K,), optional
            Workers whose upload is missing this round: refused with :class:`DroppedWorkerError`.

        Returns
        -------
        Tensor (..., *shape)
            ``values.sum(dim)`` for ``plain``; for ``quantized`` and ``paillier`` the exact integer
            sum ``sum_i round(n_max v_i)`` divided by ``n_max``, on ``values``' device and dtype
            (the two bit for bit the same).

        Raises
        ------
        DroppedWorkerError, CodecRangeError, DataError, ConfigError
        """
        if self._closed:
            raise ConfigError(f"aggregator: this {self.kind} aggregator was closed (its keys and seeds are gone); "
                              "make a new one")
        dim = self._worker_dim(values, dim)
        self._check_dropped(dropped)
        t0 = time.perf_counter()
        self.rounds += 1
        self._current = {"round": self.rounds}
        self._records.append(self._current)
        out = self._total_impl(values, dim)
        self._add("uploads", values.numel() // self.n_workers)
        self._add("seconds", time.perf_counter() - t0)
        self._current = None
        return out

    def _total_impl(self, values: torch.Tensor, dim: int) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        """Drop every private key and seed; :meth:`total` refuses afterwards."""
        self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


class IntegerAggregator(SealedKeys, Aggregator):
    """What both secure kinds share: the codec, the range checks, the layout and the decoding.

    Subclasses implement :meth:`_masked_sum` (``q (K, P)`` int64 in, the exact ``sum_i q_i (P,)``
    int64 out) and :meth:`_forget` (drop the keys and seeds).
    """

    __slots__ = ()

    def __init__(self, n_workers: int, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = 2048,
                 record: bool = False, mask_neighbours=None):
        super().__init__(n_workers, record=record, min_workers=2)
        check_mask_neighbours(mask_neighbours)
        self.mask_neighbours = mask_neighbours
        #: the pairs of workers that share a seed (:func:`mask_pairs`)
        self.pairs = mask_pairs(self.n_workers, mask_neighbours)
        self.codec = IntegerCodec(n_max=n_max, g_bits=0, key_bits=key_bits)
        natural = natural_slot_bits(self.codec)
        if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= natural):
            raise ConfigError(f"bits: the slot width must be an integer in [2, {natural}] at key_bits={key_bits}, "
                              f"got {bits!r}")
        self.layout = derive_layout(self.codec, slot_bits=bits)
        #: exclusive bound on every ``|q_i|`` and on every entry's ``sum_i |q_i|``
        self.limit = min(self.layout.limit, self.codec.limit)

    @property
    def n_max(self) -> float:
        return self.codec.n_max

    @property
    def bits(self) -> int:
        return self.layout.slot_bits

    @property
    def key_bits(self) -> int:
        return self.codec.key_bits

    def encode(self, values: torch.Tensor, dim: int) -> torch.Tensor:
        """``q (K, P)`` int64: every worker's upload quantized, range-checked per worker and per entry."""
        flat = values.movedim(dim, 0).reshape(self.n_workers, -1)
        try:
            q = self.codec.encode_values(flat, n_agents=self.n_workers, admm_iter=self.rounds)
        except CodecRangeError as exc:
            raise CodecRangeError(
                f"aggregation range: worker {exc.agent}, round {self.rounds}: quantized upload magnitude "
                f"{exc.value} (= n_max * |v|) does not fit the codec limit {exc.limit}; lower n_max",
                agent=exc.agent, admm_iter=self.rounds, value=exc.value, limit=exc.limit) from None
        if q.numel() and int(q.abs().max()) >= self.limit:
            k = int(q.abs().amax(dim=1).argmax())
            v = int(q[k].abs().max())
            raise CodecRangeError(
                f"aggregation range: worker {k}, round {self.rounds}: quantized upload magnitude {v} does not fit "
                f"the slot limit {self.limit} (2^{self.limit.bit_length() - 1}) of {self.bits}-bit slots; lower "
                "n_max or raise bits", agent=k, admm_iter=self.rounds, value=v, limit=self.limit)
        bound = q.to(torch.float64).abs().sum(0)
        worst = float(bound.max()) if bound.numel() else 0.0
        if not worst < self.limit * (1 - 1e-9):
            e = int(bound.argmax())
            raise CodecRangeError(
                f"aggregation range: round {self.rounds}, entry {e}: the bound sum_i |q_i| = {worst:.6g} of the "
                f"workers' quantized uploads does not fit the slot limit {self.limit} "
                f"(2^{self.limit.bit_length() - 1}); lower n_max (or raise bits)",
                admm_iter=self.rounds, value=int(worst), limit=self.limit)
        return q

    def _decode(self, s_int: torch.Tensor, like: torch.Tensor, dim: int) -> torch.Tensor:
        """The exact integer sum ``(P,)`` -> ``sum / n_max`` in ``like``'s dtype and shape without ``dim``."""
        shape = like.shape[:dim] + like.shape[dim + 1:]
        out = s_int.to(torch.float64).div_(self.codec.value_scale).to(like.dtype)
        return out.reshape(shape)

    def _total_impl(self, values, dim):
        t0 = time.perf_counter()
        q = self.encode(values, dim)
        self._timed("seconds_encode", t0)
        s_int = self._masked_sum(q)
        if self.record:
            self.transcript[-1]["q"] = q.cpu().clone()
            self.transcript[-1]["sum"] = s_int.cpu().clone()
        return self._decode(s_int.to(values.device), values, dim)

    def _masked_sum(self, q: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        self._forget()
        super().close()

    def _forget(self) -> None:
        raise NotImplementedError


class _SeedVault(SealedKeys):
    """One worker's pairwise seeds, by peer. No method returns a seed: :meth:`stream` gives the
    PRG output of a pair for one round, the only thing the protocol needs from it."""

    __slots__ = ("_seeds",)

    def __init__(self):
        self._seeds = {}

    def put(self, peer: int, seed: bytes) -> None:
        if len(seed) != _SEED_BYTES:
            raise ValueError("a seed has 32 bytes")
        self._seeds[int(peer)] = bytes(seed)

    def stream(self, me: int, peer: int, round_no: int, count: int) -> np.ndarray:
        """``count`` PRG values in ``[0, 2^63)`` (int64) of the pair ``{me, peer}`` in round ``round_no``."""
        a, b = min(me, peer), max(me, peer)
        head = _DOMAIN + self._seeds[int(peer)] + struct.pack(">QQQ", a, b, int(round_no))
        raw = hashlib.shake_256(head).digest(8 * int(count))
        return (np.frombuffer(raw, dtype="<u8") & np.uint64(_RING_MASK)).astype(np.int64)

    def clear(self) -> None:
        self._seeds.clear()

    def __len__(self) -> int:
        return len(self._seeds)

    def __repr__(self) -> str:
        return f"_SeedVault({len(self._seeds)} seeds)"


def _test_seed(seed: int, a: int, b: int) -> bytes:
    return hashlib.shake_256(b"ppdnmf-aggregate-test-seed|" + struct.pack(">qQQ", int(seed), a, b)).digest(
        _SEED_BYTES)


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
                s = secrets.token_bytes(_SEED_BYTES) if seed is None else _test_seed(seed, a, b)
                self._vaults[a].put(b, s)
                self._vaults[b].put(a, s)
        self._timed("seconds_setup", t0)
        for k, v in setup_counts(K, key_bits=self.key_bits, mask_neighbours=self.mask_neighbours).items():
            self._add(f"model_{k}", v)

    def _net_masks(self, P: int, device) -> torch.Tensor:
        """``m (K, P)`` in ``[0, 2^63)``: ``m_i = sum_{k != i} sigma_ik PRG(s_ik, r) mod 2^63``."""
        K, r, pairs = self.n_workers, self.rounds, self.pairs
        streams = torch.from_numpy(np.stack([self._vaults[a].stream(a, b, r, P) for a, b in pairs])).to(device)
        src = torch.tensor([a for a, _ in pairs], device=device)
        dst = torch.tensor([b for _, b in pairs], device=device)
        self._add("prg_bytes", 8 * P * len(pairs))

        def ring_scatter(index):  # the mod-2^63 sum of the streams per worker, in two limbs
            lo = torch.zeros((K, P), dtype=torch.int64, device=device).index_add_(0, index, streams & _LO_MASK)
            hi = torch.zeros((K, P), dtype=torch.int64, device=device).index_add_(0, index, streams >> _LO_BITS)
            return (((hi + (lo >> _LO_BITS)) & ((1 << (RING_BITS - _LO_BITS)) - 1)) << _LO_BITS) | (lo & _LO_MASK)

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
        return torch.from_numpy(self._vaults[worker].stream(worker, peer, round_no, count))

    def __repr__(self) -> str:
        seeds = sum(len(v) for v in self._vaults) // 2  # a count, never a seed
        return (f"QuantizedAggregator(n_workers={self.n_workers}, n_max={self.n_max:g}, bits={self.bits}, "
                f"key_bits={self.key_bits}, rounds={self.rounds}, {seeds} pair seeds{', masks off' * (not self.masks)})")


def make_aggregator(kind: str = "plain", n_workers: int = 2, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = 2048,
                    seed=None, record: bool = False, mask_neighbours=None, **options) -> Aggregator:
    """The server's aggregator of ``kind`` for ``n_workers`` workers; one per run (trials share it).

    Parameters
    ----------
    kind : {"plain", "quantized", "paillier"}
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
        ``quantized`` only: derive the mask seeds from it (tests; default: the OS CSPRNG).
    record : bool
        Keep :attr:`Aggregator.transcript` (audit, tests).
    mask_neighbours : int, optional
        The secure kinds' mask graph (:func:`mask_pairs`): None pairs every two workers (``K (K - 1) / 2``
        seeds); ``h`` pairs each worker with ``2h`` ring neighbours (for many workers).
    **options
        ``paillier``: ``keypairs`` (``K + 1`` pre-made key pairs, the server's last; tests) and
        ``djn`` (DJN short-exponent obfuscators; :mod:`.paillier.obfuscation`).

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

        if seed is not None:
            raise ConfigError("seed: kind='paillier' draws its seeds and keys from the OS CSPRNG only")
        return PaillierAggregator(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                                  mask_neighbours=mask_neighbours, **options)
    raise ConfigError(f"kind: unknown aggregation kind {kind!r}; use one of {', '.join(AGGREGATION_KINDS)}")

