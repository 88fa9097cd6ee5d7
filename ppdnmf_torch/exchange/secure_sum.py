"""The interface of a server's sum of the workers' uploads, and what the secure kinds share.

:class:`Aggregator` (one :meth:`~Aggregator.total` per round, costs, ``close``), :class:`IntegerAggregator`
(the codec, the range checks, the slot layout, the decoding of the exact integer sum),
:class:`DroppedWorkerError`, the mask graph (:func:`mask_pairs`) and the ``paillier`` kind's cost model
(:func:`round_counts`, :func:`setup_counts`). The kinds and :func:`~.aggregation.make_aggregator` are in
:mod:`.aggregation` (``plain``, ``quantized``), :mod:`.paillier.aggregation` and :mod:`.secagg.aggregation`
(docs/SECURE_AGGREGATION.md).
"""
from __future__ import annotations

import time

import torch

from ..errors import ConfigError, DataError, PPDNMFError
from .codec import CodecRangeError, IntegerCodec
from .costmodel import ciphertext_nbytes, public_key_nbytes, seed_chunks
from .packing import derive_layout, natural_slot_bits
from .sealed import HoldsPrivateKey

__all__ = ["AGGREGATION_KINDS", "DEFAULT_N_MAX", "RING_BITS", "Aggregator", "IntegerAggregator",
           "DroppedWorkerError", "round_counts", "setup_counts", "mask_pairs", "check_mask_neighbours",
           "OBFUSCATORS", "check_obfuscators"]

AGGREGATION_KINDS = ("plain", "quantized", "paillier", "secagg")
#: the default quantization scale ``2^32``: a power of two, so decoding divides exactly
DEFAULT_N_MAX = float(2**32)
#: the emulated plaintext ring is ``Z_{2^63}`` (int64 arithmetic, in two limbs for sums)
RING_BITS = 63


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


#: who adds a fresh obfuscator to its upload (``paillier``): one designated worker, or every worker
OBFUSCATORS = ("designated", "every")


def check_obfuscators(obfuscators) -> None:
    if obfuscators not in OBFUSCATORS:
        raise ConfigError(f"obfuscators: must be one of {', '.join(OBFUSCATORS)}, got {obfuscators!r}")


def round_counts(n_workers: int, n_values: int, *, key_bits: int, bits: int | None = None,
                 mask_neighbours=None, obfuscators: str = "designated") -> dict:
    """The ``paillier`` kind's operations and bytes for one round of ``n_values`` values per worker.

    With ``S`` slots per plaintext (:func:`~.packing.derive_layout`) an upload is ``C = ceil(P / S)``
    ciphertexts: encryptions (fresh obfuscators) ``C`` (the designated worker's) or ``K C``
    (``obfuscators="every"``), mask units ``2 pairs C`` (PRG outputs multiplied in; ``K (K - 1) C``
    on the complete mask graph), homomorphic additions ``(K - 1) C`` (the server's products),
    decryptions ``C`` (the sum only), bytes ``K C`` ciphertexts.
    """
    check_obfuscators(obfuscators)
    layout = derive_layout(IntegerCodec(key_bits=int(key_bits)), slot_bits=bits)
    K, P = int(n_workers), int(n_values)
    C = layout.n_ciphertexts(P)
    return {"encryptions": (K if obfuscators == "every" else 1) * C, "decryptions": C, "homomorphic_additions": (K - 1) * C,
            "mask_units": 2 * len(mask_pairs(K, mask_neighbours)) * C, "bytes": K * C * ciphertext_nbytes(key_bits),
            "ciphertexts": C, "slots": layout.slots}


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
        out = {"rounds": self.rounds, "uploads": 0, "bytes": 0, "seconds": 0.0, "encryptions": 0, "decryptions": 0}
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


class IntegerAggregator(HoldsPrivateKey, Aggregator):
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
