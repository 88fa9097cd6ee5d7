"""What a Paillier run will cost, said before it starts, and its costs with units after.

:func:`paillier_estimate` counts the operations and the ciphertext bytes of a whole run from
the cost model's formulas (:mod:`ppdnmf_torch.exchange.costmodel`: every ADMM iteration of
every BCD iteration, the packed counts when the fast path packs), and prices the run by
measuring it (:func:`measure_rounds`): the run's own exchange (its key size, protocol, fast
paths, workers), bound to the run's graph, runs a few ADMM iterations of messages of the run's
size on this machine; the estimate is its key generation and seed agreement plus the seconds of
one ADMM iteration times the run's ADMM iterations. Pricing the counted operations one by one
(the cost model's :func:`~ppdnmf_torch.exchange.costmodel.estimate_seconds`, ``op_costs=``) leaves
out what is not an operation of the model (the masked protocol's mask streams and their
inverses, packing, the workers' traffic): at 128 bits it said 1.6 s of a 7-9 s run, where the
measured rounds said 6.7 s (docs: the commands in the report). :func:`format_estimate` says
it, and names the switches that make the run faster with what each one assumes;
:func:`format_costs` writes a run's cost counters with units.
"""
from __future__ import annotations

import statistics
import time

from ..exchange.costmodel import estimate_seconds, round_counts, round_edge_bytes
from ..exchange.packing import derive_layout
from .progress import format_seconds

__all__ = ["paillier_estimate", "measure_rounds", "format_estimate", "format_costs", "format_bytes",
           "MEASURED_ROUNDS"]

#: ADMM iterations :func:`measure_rounds` times after a first one (the workers' start, the first
#: obfuscators), whose median prices the run's
MEASURED_ROUNDS = 1


def format_bytes(n: float) -> str:
    """``"812 B"``, ``"3.4 kB"``, ``"12.3 MB"``, ``"1.2 GB"`` (powers of 1000)."""
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _run_counts(spec, graph, lk: int, x_iters: int, bcd_iters: int) -> tuple:
    """``(operation counts, ciphertext bytes)`` of the whole run: one penalty round (the
    aggregated protocol's step 1) and one exchange round per ADMM iteration."""
    src = [i for i, j in graph.edges] + [j for i, j in graph.edges]
    dst = [j for i, j in graph.edges] + [i for i, j in graph.edges]
    senders = int((graph.degree > 0).sum())
    slots = derive_layout(spec.codec(), packing=spec.packing, slot_bits=spec.slot_bits).slots if spec.fast else 1
    rounds = x_iters * bcd_iters
    counts, nbytes = {}, 0
    for phase, p in (("penalty", 0), ("exchange", lk)):
        c = round_counts(spec.protocol, phase, n_edges=len(src), n_senders=senders, lk=p, slots=slots)
        for k, v in c.items():
            counts[k] = counts.get(k, 0) + v * rounds
        nbytes += rounds * sum(b for _, _, b in round_edge_bytes(spec.protocol, phase, src, dst,
                                                                 key_bits=spec.key_bits, lk=p, slots=slots))
    return counts, nbytes, slots


def measure_rounds(spec, graph, lk: int, rounds: int = MEASURED_ROUNDS) -> dict:
    """Time the run's exchange on this machine: ``spec`` made and bound to ``graph`` (its key
    generation and seed agreement: ``seconds_setup``), then ``rounds + 1`` ADMM iterations (the
    penalty round and the exchange of ``lk`` values per agent, values and penalties in the run's
    ranges), the first one left out (the workers' start); ``seconds_round`` is the median of the
    others. The exchange is closed at the end: its keys die with it."""
    import torch

    from ..exchange import make_exchange
    from ..graph import Topology

    topo = Topology.from_graphs([graph])
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    exch = make_exchange(spec)
    try:
        exch.bind(topo, dtype=torch.float64, device=torch.device("cpu"))
        setup = time.perf_counter() - t0
        times = []
        for m in range(int(rounds) + 1):
            g = 0.03 * torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
            U = torch.rand((topo.n_nodes, int(lk)), generator=gen, dtype=torch.float64)
            t1 = time.perf_counter()
            exch.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
            exch.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
            times.append(time.perf_counter() - t1)
    finally:
        exch.close()
    return {"seconds_setup": setup, "seconds_round": statistics.median(times[1:] or times)}


def paillier_estimate(spec, graph, L: int, rank: int, x_iters: int, bcd_iters: int, *, op_costs=None,
                      trials: int = 1) -> dict:
    """The estimated cost of a Paillier run before it starts.

    Parameters
    ----------
    spec : PaillierSpec
    graph : Graph
        The agents' graph (one trial).
    L, rank : int
        Message size ``P = L K`` values.
    x_iters, bcd_iters : int
    op_costs : PaillierOpCosts, optional
        Price the counted operations at these per-operation seconds (the cost model) instead of
        measuring the run's rounds (:func:`measure_rounds`, the default).
    trials : int
        Trials run side by side (each its own exchange rounds).

    Returns
    -------
    dict
        ``counts`` (operations), ``ciphertext_bytes``, ``slots``, ``key_pairs``, ``rounds``
        (ADMM iterations), ``seconds`` (the estimate), and either ``seconds_setup``,
        ``seconds_round`` (measured) or ``seconds_operations``, ``seconds_keygen``, ``op_costs``
        (the model).
    """
    counts, nbytes, slots = _run_counts(spec, graph, int(L) * int(rank), int(x_iters), int(bcd_iters))
    rounds = int(x_iters) * int(bcd_iters)
    out = {"counts": counts, "ciphertext_bytes": nbytes, "slots": slots, "key_pairs": graph.n_agents,
           "rounds": rounds, "trials": int(trials)}
    if op_costs is not None:
        ops = estimate_seconds(counts, op_costs)
        keygen = graph.n_agents * op_costs.keygen
        out.update(seconds_operations=ops, seconds_keygen=keygen, seconds=(ops + keygen) * int(trials),
                   op_costs=op_costs)
        return out
    measured = measure_rounds(spec, graph, int(L) * int(rank))
    out.update(measured, seconds=(measured["seconds_setup"] + rounds * measured["seconds_round"]) * int(trials))
    return out


def _faster(spec, slots_packed: int | None) -> list:
    """The switches that would make ``spec`` faster, each with what it assumes."""
    out = []
    if not spec.fast:
        out.append("exchange.fast=true: the fast path (packing, precomputed CRT obfuscators, workers), "
                   "bit-identical to the naive one")
        return out
    if not spec.djn:
        out.append("exchange.djn=true: short-exponent (Damgard-Jurik-Nielsen) obfuscators, much cheaper "
                   "encryptions; assumes DCR stays hard with short exponents")
    if not spec.packing and slots_packed and slots_packed > 1:
        out.append(f"exchange.packing=true: {slots_packed} values per ciphertext at {spec.key_bits} bits "
                   f"({slots_packed}x fewer operations and bytes); assumes the values fit their slots (checked "
                   "every round)")
    if not spec.precompute:
        out.append("exchange.precompute=true: obfuscators made ahead, off the critical path; assumes spare cores")
    if spec.workers is not None and spec.workers < 2:
        out.append("exchange.workers=<k>: k worker processes for the public-key work; assumes k free cores")
    return out


def format_estimate(spec, est: dict) -> str:
    """The lines the CLI prints before a Paillier run."""
    c = est["counts"]
    packed = None
    if spec.fast and not spec.packing:
        packed = derive_layout(spec.codec(), packing=True, slot_bits=spec.slot_bits).slots
    switches = (f"protocol={spec.protocol}, fast={str(spec.fast).lower()}, packing={str(spec.packing).lower()} "
                f"({est['slots']} value{'s' if est['slots'] != 1 else ''} per ciphertext), "
                f"precompute={str(spec.precompute).lower()}, djn={str(spec.djn).lower()}, "
                f"workers={'auto' if spec.workers is None else spec.workers}")
    side = f" for each of {est['trials']} trials side by side" if est.get("trials", 1) > 1 else ""
    if "seconds_round" in est:
        how = (f"about {format_seconds(est['seconds'])} for {est['rounds']:,} ADMM iterations (measured here: key "
               f"generation and seed agreement {format_seconds(est['seconds_setup'])} for {est['key_pairs']} key "
               f"pairs, {est['seconds_round']:.3g} s per ADMM iteration{side}; a stopping rule may end it sooner)")
    else:
        how = (f"about {format_seconds(est['seconds'])} (key generation {format_seconds(est['seconds_keygen'])} for "
               f"{est['key_pairs']} key pairs, operations {format_seconds(est['seconds_operations'])} priced one by "
               f"one{side})")
    lines = [
        f"paillier estimate at {spec.key_bits}-bit keys ({switches}): {how}, "
        f"{format_bytes(est['ciphertext_bytes'])} of ciphertexts; {c['encryptions']:,} encryptions, "
        f"{c['decryptions']:,} decryptions, {c['homomorphic_additions']:,} homomorphic additions, "
        f"{c['scalar_multiplications']:,} scalar multiplications",
    ]
    faster = _faster(spec, packed)
    if faster:
        lines.append("faster: " + "; ".join(faster))
    return "\n".join(lines)


#: the counters of a costs dict, how to say them, and their unit kind
_COUNT_NAMES = (("encryptions", "encryptions"), ("decryptions", "decryptions"),
                ("homomorphic_additions", "homomorphic additions"),
                ("scalar_multiplications", "scalar multiplications"), ("key_pairs", "key pairs"))
#: the masked protocol's seed agreement, once before the rounds (``costmodel.SETUP_KEYS``)
_SETUP_NAMES = (("setup_encryptions", "encryptions"), ("setup_decryptions", "decryptions"))
_TIME_NAMES = (("time_keygen", "key generation"), ("time_setup", "seed agreement"),
               ("time_encrypt", "encryption"), ("time_homomorphic", "homomorphic operations"),
               ("time_decrypt", "decryption"), ("time_transfer", "transfer"),
               ("estimated_seconds", "estimated operations (cost model)"),
               ("estimated_seconds_keygen", "estimated key generation (cost model)"),
               ("estimated_seconds_setup", "estimated seed agreement (cost model)"))


def _count(n, name: str) -> str:
    """``"1 encryption"``, ``"1,024 encryptions"`` (``name``: the plural, ending in ``s``)."""
    n = int(n)
    return f"{n:,} {name[:-1] if n == 1 else name}"


def format_costs(costs: dict) -> str:
    """A run's cost counters in words with units: counts, bytes (``ciphertext_bytes``), the
    seed agreement apart (``setup_*``), seconds; no raw key is shown."""
    parts = [_count(costs[k], name) for k, name in _COUNT_NAMES if k in costs]
    if "ciphertext_bytes" in costs:
        parts.append(f"{format_bytes(costs['ciphertext_bytes'])} of ciphertexts")
    setup = [_count(costs[k], name) for k, name in _SETUP_NAMES if k in costs]
    if "setup_ciphertext_bytes" in costs:
        setup.append(f"{format_bytes(costs['setup_ciphertext_bytes'])} of ciphertexts")
    times = [f"{name} {float(costs[k]):.3g} s" for k, name in _TIME_NAMES if k in costs]
    known = ({k for k, _ in _COUNT_NAMES} | {k for k, _ in _SETUP_NAMES} | {k for k, _ in _TIME_NAMES}
             | {"ciphertext_bytes", "setup_ciphertext_bytes"})
    other = [f"{k.replace('_', ' ')} {v:.4g}" for k, v in costs.items()
             if k not in known and isinstance(v, (int, float)) and not isinstance(v, bool)]
    sections = [", ".join(parts)] if parts else []  # a kind without the Paillier counters (secagg) has none
    for title, items in (("seed agreement before the rounds: ", setup), ("time: ", times), ("other: ", other)):
        if items:
            sections.append(title + ", ".join(items))
    return "; ".join(sections)
