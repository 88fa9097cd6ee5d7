"""What a Paillier run will cost, said before it starts, and its costs with units after.

:func:`paillier_estimate` counts the operations and the ciphertext bytes of a whole run from
the cost model's formulas (:mod:`ppdnmf_torch.exchange.costmodel`: every ADMM iteration of
every BCD iteration, the packed counts when the fast path packs, the masked protocol's seed
agreement) and prices them with the cost model's one computation
(:func:`~ppdnmf_torch.exchange.costmodel.run_seconds`) at per-operation costs measured on this
machine: the figure a ``quantized`` run of the same settings writes as its
``estimated_seconds_total``. How close it lands to a real run at each key size is measured in
docs/SECURE_EXCHANGE.md ("What a run costs"). :func:`format_estimate` says it, and names the
switches that make the run faster with what each one assumes; :func:`format_costs` writes a
run's cost counters with units.
"""
from __future__ import annotations

import functools
import logging

from ..exchange.costmodel import COUNT_KEYS, add_estimates, round_counts, round_edge_bytes, setup_counts
from ..exchange.packing import derive_layout
from .progress import format_seconds

__all__ = ["paillier_estimate", "exchange_estimate", "announce", "announcing", "seconds_per_iteration", "format_estimate", "format_costs", "format_bytes"]


def format_bytes(n: float) -> str:
    """``"812 B"``, ``"3.4 kB"``, ``"12.3 MB"``, ``"1.2 GB"`` (powers of 1000)."""
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _run_costs(spec, graph, phases) -> tuple:
    """One trial's counts (the cost dict of :meth:`~ppdnmf_torch.exchange.Exchange.costs`:
    :data:`COUNT_KEYS`, ``key_pairs``, the masked protocol's :data:`SETUP_KEYS`), and the slots per
    plaintext: for each ``(lk, rounds)`` of ``phases``, ``rounds`` ADMM iterations of one penalty
    round and one exchange round of ``lk`` values; the keys and the seed agreement once."""
    src = [i for i, j in graph.edges] + [j for i, j in graph.edges]
    dst = [j for i, j in graph.edges] + [i for i, j in graph.edges]
    senders = int((graph.degree > 0).sum())
    slots = derive_layout(spec.codec(), packing=spec.packing, slot_bits=spec.slot_bits).slots if spec.fast else 1
    costs = dict.fromkeys(COUNT_KEYS, 0)
    for lk, rounds in phases:
        for phase, p in (("penalty", 0), ("exchange", int(lk))):
            c = round_counts(spec.protocol, phase, n_edges=len(src), n_senders=senders, lk=p, slots=slots)
            for k, v in c.items():
                costs[k] += v * int(rounds)
            costs["ciphertext_bytes"] += int(rounds) * sum(b for _, _, b in round_edge_bytes(
                spec.protocol, phase, src, dst, key_bits=spec.key_bits, lk=p, slots=slots))
    costs["key_pairs"] = graph.n_agents
    if spec.protocol == "masked":
        costs.update(setup_counts(src, dst, key_bits=spec.key_bits))
    return costs, slots


def paillier_estimate(spec, graph, L: int, rank: int, x_iters: int, bcd_iters: int, *, op_costs=None,
                      trials: int = 1) -> dict:
    """The estimated cost of a PPDNMF Paillier run before it starts.

    The counts are the cost model's formulas for the whole run (every ADMM iteration of every
    BCD iteration, the packed counts when the fast path packs, the seed agreement under
    ``masked``), priced by :func:`~ppdnmf_torch.exchange.costmodel.run_seconds`, the computation
    a ``quantized`` run's cost model and a ``paillier`` run's ``cost_model`` use: the same run
    gets the same figure from each. The run generates its keys (one pair per agent and trial),
    so their generation is counted, once.

    Parameters
    ----------
    spec : PaillierSpec
    graph : Graph
        The agents' graph (one trial).
    L, rank : int
        Message size ``P = L K`` values.
    x_iters, bcd_iters : int
    op_costs : PaillierOpCosts, optional
        Seconds per operation; default: measured here on the run's own path
        (:func:`~ppdnmf_torch.exchange.paillier.exchange.calibrate_for`, as a ``quantized``
        or ``paillier`` run's ``cost_model=True`` measures them; kept per machine, so that
        another process gets the same).
    trials : int
        Trials run side by side (each its own keys, seed agreement and rounds).

    Returns
    -------
    dict
        As :func:`exchange_estimate`.
    """
    return exchange_estimate(spec, [graph] * int(trials), [(int(L) * int(rank), int(x_iters) * int(bcd_iters))],
                             op_costs=op_costs)


def exchange_estimate(spec, graphs, phases, *, op_costs=None) -> dict:
    """The estimated cost of any model's run through a Paillier exchange before it starts: per
    ``(lk, rounds)`` of ``phases``, ``rounds`` ADMM iterations (exchange calls) of one penalty
    round and one exchange round of ``lk`` values, over each trial's graph (``graphs``, side by side), priced by
    :func:`~ppdnmf_torch.exchange.costmodel.run_seconds` (the figure the ``quantized`` twin's cost
    model writes as ``estimated_seconds_total``).

    Parameters
    ----------
    spec : PaillierSpec
    graphs : list of Graph
        One per trial.
    phases : list of (int, int)
        ``(lk, rounds)``: values per message and the calls of that size (FSSPCA's centring agrees
        ``d + 1`` values, its ADMM iterations ``d r``).
    op_costs : PaillierOpCosts, optional
        As :func:`paillier_estimate`.

    Returns
    -------
    dict
        ``costs`` (the run's predicted cost dict, with the estimate's
        :data:`~ppdnmf_torch.exchange.costmodel.ESTIMATE_KEYS`), ``counts`` (operations),
        ``ciphertext_bytes``, ``slots``, ``key_pairs``, ``rounds`` (ADMM iterations),
        ``trials``, ``seconds`` (the estimate: ``estimated_seconds_total``),
        ``seconds_operations``, ``seconds_keygen``, ``seconds_setup``, ``op_costs``.
    """
    if op_costs is None:
        from ..exchange.paillier.exchange import calibrate_for  # imports phe, at the point of use

        op_costs = calibrate_for(spec)
    rounds, costs, slots = sum(int(r) for _, r in phases), {}, 1
    for g in graphs:
        one, slots = _run_costs(spec, g, phases)
        for k, v in one.items():
            costs[k] = costs.get(k, 0) + v
    add_estimates(costs, op_costs, setup=spec.protocol == "masked")
    return {"costs": costs, "counts": {k: costs[k] for k in COUNT_KEYS if k != "ciphertext_bytes"},
            "ciphertext_bytes": costs["ciphertext_bytes"], "slots": slots, "key_pairs": costs["key_pairs"],
            "rounds": rounds, "trials": len(graphs), "seconds": costs["estimated_seconds_total"],
            "seconds_operations": costs["estimated_seconds"], "seconds_keygen": costs["estimated_seconds_keygen"],
            "seconds_setup": costs.get("estimated_seconds_setup", 0.0), "op_costs": op_costs}


def announce(spec, graphs, phases) -> dict:
    """Log the lines a Paillier run says before it starts (:func:`format_estimate` of
    :func:`exchange_estimate`, to the ``ppdnmf_torch.runner`` logger) and return the estimate."""
    est = exchange_estimate(spec, graphs, phases)
    logging.getLogger("ppdnmf_torch.runner").info(format_estimate(spec, est))
    return est


def announcing(fit, spec, graphs, rounds: int):
    """``fit(X, rank, **kw)`` that first :func:`announce` s its run: messages of ``X.shape[0] rank``
    values (symmetric NMF's ``U_i``), ``rounds`` exchange calls; for a fit whose data and rank
    are known only once its preset is loaded."""

    @functools.wraps(fit)
    def announced(X, rank, **kw):
        announce(spec, graphs, [(int(X.shape[0]) * int(rank), rounds)])
        return fit(X, rank, **kw)

    return announced


def seconds_per_iteration(est: dict, bcd_iters: int) -> float:
    """The rounds' share of ``est`` (:func:`paillier_estimate`) per BCD iteration: the rate a
    progress ETA starts from before it has measured one (:class:`~.progress.Progress`)."""
    return est["seconds_operations"] / max(1, int(bcd_iters))


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
    side = f", {est['trials']} trials side by side" if est.get("trials", 1) > 1 else ""
    setup = f", seed agreement {format_seconds(est['seconds_setup'])}" if spec.protocol == "masked" else ""
    how = (f"about {format_seconds(est['seconds'])} for {est['rounds']:,} ADMM iterations{side} (key generation "
           f"{format_seconds(est['seconds_keygen'])} for {est['key_pairs']} key pairs{setup}, rounds "
           f"{format_seconds(est['seconds_operations'])}; every operation priced at its cost on this run's path, "
           "measured here; a stopping rule may end the run sooner)")
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
               ("estimated_seconds_setup", "estimated seed agreement (cost model)"),
               ("estimated_seconds_total", "estimated in all (cost model)"))


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
