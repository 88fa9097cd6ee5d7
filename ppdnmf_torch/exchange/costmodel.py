"""Cost accounting of the secure exchange: exact operation counts, and a timing model.

The real Paillier stage (:class:`~ppdnmf_torch.exchange.paillier.PaillierExchange`)
counts the operations it performs; the emulated stage
(:class:`~ppdnmf_torch.exchange.quantized.QuantizedExchange` with ``cost_model=True``)
predicts them with the formulas below and turns them into seconds with per-operation
costs measured on this machine (:class:`PaillierOpCosts`, made by
:func:`~ppdnmf_torch.exchange.paillier.calibration.calibrate`). This module imports no
exchange kind. The test suite checks that a real
run's counters equal the model's prediction, iteration by iteration.

Counts per ADMM iteration
-------------------------
Notation: ``D = 2E`` directed edges (over all trials), ``A'`` the nodes with at least one
neighbour (``A' = N`` on a connected graph with ``N >= 2``), ``P = L K`` entries per
message, ``C = ceil(2 k / 8)`` bytes per ciphertext (an element of ``Z_{n^2}``, ``n`` a
``k``-bit modulus) and ``B = ceil(k / 8)`` bytes per public key (``n``).

``protocol="paper"`` (lines 10-16 as printed; ``rho_i`` handed to agent ``i``, no cost):

=====================  ================  =========================================
operation              count             who
=====================  ================  =========================================
encryptions            ``(A' + D) P``    ``i``: ``E_i(-q_i)``; ``j``: ``E_i(q_j)``
homomorphic additions  ``D P``           ``j``: ``E_i(q_j) E_i(-q_i)``
scalar mult.           ``D P``           ``j``: ``(...)^{gamma_ji}``
decryptions            ``D P``           ``i``: one message per neighbour
bytes                  ``D (2 P C + B)`` ``i -> j``: ``E_i(-q_i)`` and ``kp_i``; ``j -> i``: reply
=====================  ================  =========================================

``protocol="aggregated"``, step 1 (:meth:`penalty_sums`, an encrypted mini-round):
``i -> j`` sends ``kp_i``; ``j -> i`` returns ``E_i(gamma_ji)``; ``i`` raises it to
``gamma_ij``, multiplies over neighbours and decrypts the sum ``rho_int_i``:
encryptions ``D``, scalar mult. ``D``, homomorphic additions ``D - A'``,
decryptions ``A'``, bytes ``D (B + C)``.

``protocol="aggregated"``, step 5 (:meth:`exchange`): ``i -> j`` sends ``E_i(-q_i)``;
``j`` returns ``E_i(gamma_ji (q_j - q_i))``; ``i`` raises every reply to ``gamma_ij``,
multiplies them and decrypts only the sum ``S_int_i``:
encryptions ``(A' + D) P``, homomorphic additions ``D P + (D - A') P``, scalar mult.
``2 D P``, decryptions ``A' P``, bytes ``2 D P C``.

``protocol="masked"`` (:mod:`~ppdnmf_torch.exchange.paillier.masked`; docs/SECURE_EXCHANGE.md),
step 1: ``i -> j``: ``E_i(gamma_ij)`` (one encryption per edge, the owner's); ``j -> i``:
``E_i(gamma_ij)^{gamma_ji}`` times ``j``'s mask unit (and, from the one designated neighbour of
``i``, a fresh obfuscator); ``i`` multiplies the replies and decrypts ``rho_int_i``:
encryptions ``D + A'``, scalar mult. ``D``, homomorphic additions ``D - A'``, decryptions
``A'``, bytes ``2 D C``. Step 5, with ``S`` slots per plaintext, ``C = ceil(P / S)``
ciphertexts per message and ``S' = min(S, P)`` slots in use: ``i -> j``: the ``S' - 1``
shifted encryptions ``E_i(gamma_ij 2^{w t})``, ``t = 1 .. S' - 1`` (successive ``2^w``-th
powers of ``E_i(gamma_ij)``, one scalar multiplication each); ``j -> i``: per block one
multi-exponentiation over the ``S'`` shifted encryptions (counted as ``S'`` scalar
multiplications and ``S' - 1`` additions, ``P`` and ``P - C`` per message) times its mask
unit; ``i`` multiplies and decrypts ``C`` sums: encryptions ``A' C`` (the designated
neighbours' fresh obfuscators), scalar mult. ``D (S' - 1) + D P``, homomorphic additions
``(D - A') C + D (P - C)``, decryptions ``A' C``, bytes ``D (S' - 1 + C) C``. The mask units
(PRG outputs multiplied into the replies) are not counted. Setup, once per bound exchange
(:func:`setup_counts`): the public keys and the seeds (reported apart, ``setup_*``).

Per ADMM iteration the aggregated protocol thus needs ``A' (P + 1)`` decryptions
instead of the paper's ``D P`` (a factor ``~2E/N`` fewer; 3x on the paper's graph), at
the price of ``D (P + 1)`` extra scalar multiplications, which are cheap (a ~16-bit
exponent instead of the ``k``-bit exponent of an encryption).

Public keys travel with the first message of every iteration, as the paper prints it
(a real deployment would send them once); they are counted in ``ciphertext_bytes``.
Key generation (one key pair per node) happens once, in ``bind``.

Packing
-------
With slot packing (:mod:`~ppdnmf_torch.exchange.packing`, ``packing=True``: ``S`` values
per plaintext, 2 at 128 bits, 8 at 512, 16 at 1024, 32 at 2048) a message of ``P`` values
is ``ceil(P / S)`` ciphertexts, and every count and byte of the exchange phase above holds
with ``P`` replaced by ``ceil(P / S)`` (``slots=S`` in :func:`round_counts` and
:func:`round_edge_bytes`). The penalty mini-round carries one value per message and is
never packed. ``exchange="quantized"`` predicts the packed counts with ``packing=True``
(its default is the unpacked protocol, whose counts the formulas above give; the real
stage packs by default). Precomputed, CRT or DJN obfuscators and the worker pool change
what an operation costs, not how many there are: each fresh obfuscator applied is one
encryption, each ciphertext product one homomorphic addition, each ``powmod`` by a penalty
one scalar multiplication.

The timing model (:class:`PaillierOpCosts`, :func:`estimate_seconds`) prices every operation at
the naive serial cost (``r^n mod n^2`` per encryption). The fast paths make some operations
cheaper (CRT obfuscators, workers) and add work the counts leave out (the masked protocol's
mask streams, packing): how far the two land from a real run at each key size is measured in
docs/SECURE_EXCHANGE.md ("What a run costs").

One figure per run
------------------
:func:`run_seconds` is the one computation of a run's estimated seconds, whichever command
asks (the CLI before a ``paillier`` run, the cost model of a ``quantized`` run in its
summary and TensorBoard, a ``paillier`` run's own ``cost_model``, the ranks' counters): the
rounds (:func:`estimate_seconds` of the counts), the masked protocol's seed agreement
(:func:`setup_seconds`), and the key generation, counted once and only for the key pairs
the run generates (none when its keys are handed in).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

__all__ = [
    "COUNT_KEYS",
    "TIME_KEYS",
    "PaillierOpCosts",
    "CostLedger",
    "estimate_seconds",
    "add_estimates",
    "round_counts",
    "round_edge_bytes",
    "ciphertexts_per_message",
    "ciphertext_nbytes",
    "public_key_nbytes",
    "SETUP_KEYS",
    "SEED_BITS",
    "seed_chunks",
    "setup_counts",
    "setup_seconds",
    "run_seconds",
    "ESTIMATE_KEYS",
]

#: operation and traffic counters every cost dict has
COUNT_KEYS = ("encryptions", "decryptions", "homomorphic_additions", "scalar_multiplications", "ciphertext_bytes")
#: wall-clock timers of the real stage (seconds)
TIME_KEYS = ("time_keygen", "time_encrypt", "time_homomorphic", "time_decrypt", "time_transfer")

PHASES = ("penalty", "exchange")
#: the masked protocol's once-per-run setup counters (the seed agreement), kept apart from the rounds'
SETUP_KEYS = ("setup_encryptions", "setup_decryptions", "setup_ciphertext_bytes")
#: bits of every mask seed (drawn from the operating system's CSPRNG)
SEED_BITS = 256


def ciphertext_nbytes(key_bits: int) -> int:
    """Bytes of one ciphertext, ``ceil(bits(n^2) / 8)``; ``bits(n^2)`` is ``2k`` or ``2k - 1``
    for a ``k``-bit ``n`` and both round up to the same byte count (``2k - 1`` is odd)."""
    return (2 * int(key_bits) + 7) // 8


def public_key_nbytes(key_bits: int) -> int:
    """Bytes of one public key (the modulus ``n``), ``ceil(k / 8)``."""
    return (int(key_bits) + 7) // 8


def ciphertexts_per_message(lk: int, slots: int = 1) -> int:
    """Ciphertexts that carry ``lk`` values with ``slots`` values per plaintext: ``ceil(lk / slots)``."""
    return -(-int(lk) // max(1, int(slots)))


def seed_chunks(key_bits: int) -> int:
    """Plaintexts one :data:`SEED_BITS`-bit seed takes under a ``key_bits``-bit key: chunks of
    ``key_bits - 1`` bits, each below any ``key_bits``-bit modulus (1 from 258-bit keys up)."""
    return -(-SEED_BITS // (int(key_bits) - 1))


def _pairs(src) -> int:
    deg: dict = {}
    for i in src:
        deg[i] = deg.get(i, 0) + 1
    return sum(d * (d - 1) // 2 for d in deg.values())


def setup_counts(src, dst, *, key_bits: int) -> dict:
    """The masked protocol's setup (:data:`SETUP_KEYS`), once per bound exchange.

    Messages: every agent's public key to each neighbour (``D``), and to each neighbour ``j`` of
    ``i`` the key of every other neighbour ``k > j`` of ``i``, relayed by ``i`` (one per pair);
    per agent ``i`` and pair ``j < k`` of its neighbours the seed ``s^i_jk``, encrypted by ``j``
    under ``k``'s key and sent through ``i`` (two hops); per edge ``{a, b}``, ``a < b``, the
    edge seed, encrypted by ``a`` under ``b``'s key. A seed is :func:`seed_chunks` ciphertexts.
    """
    D = len(src)
    pairs = _pairs(src)
    edges = sum(1 for i, j in zip(src, dst) if i < j)
    k = seed_chunks(key_bits)
    C, B = ciphertext_nbytes(key_bits), public_key_nbytes(key_bits)
    seeds = (pairs + edges) * k
    return {"setup_encryptions": seeds, "setup_decryptions": seeds,
            "setup_ciphertext_bytes": (D + pairs) * B + (2 * pairs + edges) * k * C}


def round_counts(protocol: str, phase: str, *, n_edges: int, n_senders: int, lk: int = 0, slots: int = 1) -> dict:
    """Operation counts of one round (see the module docstring).

    Parameters
    ----------
    protocol : {"masked", "aggregated", "paper"}
    phase : {"penalty", "exchange"}
        ``penalty`` is the step-1 round (the paper protocol's is empty).
    n_edges : int
        ``D``, directed edges.
    n_senders : int
        ``A'``, nodes with at least one neighbour.
    lk : int
        ``P``, entries per message (exchange phase).
    slots : int
        Values per plaintext (packing, :mod:`~ppdnmf_torch.exchange.packing`): a message of
        ``P`` values is ``ceil(P / slots)`` ciphertexts, and every count of the exchange
        phase scales with that instead of ``P``. The penalty phase is never packed.
    """
    D, A1, P = int(n_edges), int(n_senders), ciphertexts_per_message(lk, slots)
    zero = {"encryptions": 0, "decryptions": 0, "homomorphic_additions": 0, "scalar_multiplications": 0}
    if D == 0:
        return zero
    if phase == "penalty":
        if protocol == "paper":
            return zero
        if protocol == "masked":
            return {"encryptions": D + A1, "decryptions": A1, "homomorphic_additions": D - A1,
                    "scalar_multiplications": D}
        return {"encryptions": D, "decryptions": A1, "homomorphic_additions": D - A1, "scalar_multiplications": D}
    if protocol == "masked":
        lk = int(lk)
        used = min(max(1, int(slots)), lk)
        return {"encryptions": A1 * P, "decryptions": A1 * P,
                "homomorphic_additions": (D - A1) * P + D * (lk - P),
                "scalar_multiplications": D * (used - 1) + D * lk}
    if protocol == "paper":
        return {"encryptions": (A1 + D) * P, "decryptions": D * P, "homomorphic_additions": D * P,
                "scalar_multiplications": D * P}
    return {"encryptions": (A1 + D) * P, "decryptions": A1 * P, "homomorphic_additions": (2 * D - A1) * P,
            "scalar_multiplications": 2 * D * P}


def round_edge_bytes(protocol: str, phase: str, src, dst, *, key_bits: int, lk: int = 0, slots: int = 1) -> list:
    """Bytes sent over each directed edge in one round, as ``[(sender, receiver, bytes), ...]``.

    ``src, dst`` are Python sequences of the directed edges ``i -> j`` (``i`` the agent that
    asks, ``j`` the neighbour that answers); both directions of every message are listed.
    A message of ``lk`` values is ``ceil(lk / slots)`` ciphertexts.
    """
    C, B, P = ciphertext_nbytes(key_bits), public_key_nbytes(key_bits), ciphertexts_per_message(lk, slots)
    out = []
    if protocol == "masked":
        ask, answer = (C, C) if phase == "penalty" else ((min(max(1, int(slots)), int(lk)) - 1) * C, P * C)
        for i, j in zip(src, dst):
            if ask:
                out.append((i, j, ask))  # E_i(gamma_ij), or its shifted encryptions
            out.append((j, i, answer))  # the masked reply
        return out
    if phase == "penalty":
        if protocol == "paper":
            return out
        for i, j in zip(src, dst):
            out.append((i, j, B))  # kp_i
            out.append((j, i, C))  # E_i(gamma_ji)
        return out
    ask = P * C + (B if protocol == "paper" else 0)
    for i, j in zip(src, dst):
        out.append((i, j, ask))  # E_i(-q_i) (and kp_i in the paper protocol)
        out.append((j, i, P * C))  # the neighbour's reply
    return out


class CostLedger:
    """Cumulative and per-ADMM-iteration cost counters.

    ``begin(bcd_iter, admm_iter)`` opens the record of an iteration (a no-op when that
    iteration's record is already open); ``add`` adds to the cumulative total and to the
    open record; ``add_edge_bytes`` keeps the per-edge traffic of trial 0. ``setup=True``
    (the masked protocol) adds the :data:`SETUP_KEYS` counters (and ``time_setup``) to the
    total; like ``time_keygen`` they are once-per-run costs that no iteration record carries.
    """

    #: counters of the total that no per-iteration record carries (once-per-run costs)
    ONCE = ("time_keygen", "time_setup") + SETUP_KEYS

    def __init__(self, n_agents: int = 0, *, timers: bool = True, setup: bool = False):
        self.keys = (COUNT_KEYS + (TIME_KEYS if timers else ()) + (SETUP_KEYS if setup else ())
                     + (("time_setup",) if setup and timers else ()))
        self.total = dict.fromkeys(self.keys, 0)
        for k in self.total:
            if k.startswith("time_"):
                self.total[k] = 0.0
        self.edges: dict = {}
        self.n_agents = n_agents
        self._records: list = []
        self._current = None

    def begin(self, bcd_iter: int, admm_iter: int) -> None:
        cur = self._current
        if cur is not None and cur["bcd_iter"] == bcd_iter and cur["admm_iter"] == admm_iter:
            return
        rec = {"bcd_iter": int(bcd_iter), "admm_iter": int(admm_iter)}
        rec.update({k: (0.0 if k.startswith("time_") else 0) for k in self.keys if k not in self.ONCE})
        self._records.append(rec)
        self._current = rec

    def add(self, key: str, value) -> None:
        self.total[key] += value
        if self._current is not None and key in self._current:
            self._current[key] += value

    @contextlib.contextmanager
    def timed(self, key: str):
        """Add the wall-clock seconds of the ``with`` block to timer ``key`` (not when it raises)."""
        t0 = time.perf_counter()
        yield
        self.add(key, time.perf_counter() - t0)

    def add_counts(self, counts: dict) -> None:
        for k, v in counts.items():
            self.add(k, v)

    def add_edge_bytes(self, sender: int, receiver: int, nbytes: int) -> None:
        """Traffic ``sender -> receiver``: always in ``ciphertext_bytes``; per edge for trial 0."""
        self.add("ciphertext_bytes", nbytes)
        if sender < self.n_agents and receiver < self.n_agents:
            key = f"{sender}->{receiver}"
            self.edges[key] = self.edges.get(key, 0) + nbytes

    def pop(self) -> list:
        out, self._records, self._current = self._records, [], None
        return out


@dataclass(frozen=True)
class PaillierOpCosts:
    """Seconds per Paillier operation at one key size, measured on this machine.

    ``scalar_multiplication`` is timed with an ``exponent_bits``-bit exponent
    (the integer penalties are ~10-20 bits; the cost grows linearly with the bits).
    ``path_factor``: the scale of the run's own exchange path over the raw operations,
    already applied to the four operation costs (key generation is not scaled).
    """

    key_bits: int
    keygen: float
    encryption: float
    decryption: float
    homomorphic_addition: float
    scalar_multiplication: float
    exponent_bits: int = 32
    repeats: int = 0
    #: the scale of the run's own path over the raw operations that the costs above carry
    #: (:func:`~ppdnmf_torch.exchange.paillier.calibration.calibrate`; 1: the raw costs)
    path_factor: float = 1.0


def estimate_seconds(counts: dict, op_costs: PaillierOpCosts) -> float:
    """Serial host seconds of the operations in ``counts`` (keys as in :data:`COUNT_KEYS`)."""
    return (
        counts.get("encryptions", 0) * op_costs.encryption
        + counts.get("decryptions", 0) * op_costs.decryption
        + counts.get("homomorphic_additions", 0) * op_costs.homomorphic_addition
        + counts.get("scalar_multiplications", 0) * op_costs.scalar_multiplication
    )


def setup_seconds(costs: dict, op_costs: PaillierOpCosts) -> float:
    """Serial host seconds of the masked protocol's seed agreement (``setup_*`` keys of ``costs``)."""
    return (costs.get("setup_encryptions", 0) * op_costs.encryption
            + costs.get("setup_decryptions", 0) * op_costs.decryption)


#: the estimate of a whole run (:func:`run_seconds`): the rounds, the key generation, the seed
#: agreement (masked), and their sum
ESTIMATE_KEYS = ("estimated_seconds", "estimated_seconds_keygen", "estimated_seconds_setup",
                 "estimated_seconds_total")


def run_seconds(costs: dict, op_costs: PaillierOpCosts, *, key_pairs: int) -> dict:
    """The estimated seconds of a run: the one computation every command's figure comes from.

    Parameters
    ----------
    costs : dict
        The run's counts (:data:`COUNT_KEYS`; the masked protocol's :data:`SETUP_KEYS` when it
        has a seed agreement), predicted before the run or counted by it.
    op_costs : PaillierOpCosts
        Seconds per operation.
    key_pairs : int
        Key pairs the run generates (0 when its keys are handed in): each priced at
        ``op_costs.keygen``, once.

    Returns
    -------
    dict
        :data:`ESTIMATE_KEYS`: ``estimated_seconds`` (the rounds' operations),
        ``estimated_seconds_keygen``, ``estimated_seconds_setup`` (0 without a seed agreement)
        and ``estimated_seconds_total``, their sum.
    """
    rounds = estimate_seconds(costs, op_costs)
    keygen = int(key_pairs) * op_costs.keygen
    setup = setup_seconds(costs, op_costs)
    return {"estimated_seconds": rounds, "estimated_seconds_keygen": keygen, "estimated_seconds_setup": setup,
            "estimated_seconds_total": rounds + keygen + setup}


def add_estimates(costs: dict, op_costs, *, setup: bool, generates_keys: bool = True) -> dict:
    """``costs`` with :func:`run_seconds`'s figures (``estimated_seconds_setup`` only with
    ``setup``, the masked protocol; the key generation only with ``generates_keys``: its
    ``key_pairs``); unchanged for ``op_costs=None``."""
    if op_costs is not None:
        est = run_seconds(costs, op_costs, key_pairs=costs.get("key_pairs", 0) if generates_keys else 0)
        if not setup:
            del est["estimated_seconds_setup"]
        costs.update(est)
    return costs
