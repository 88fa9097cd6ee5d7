"""The secure aggregation under audit: what a curious server, alone or colluding with one worker,
learns of a single worker's upload (docs/SECURE_AGGREGATION.md).

Adversaries, per target worker ``i`` and every round of a recorded run
(:func:`~ppdnmf_torch.exchange.aggregation.make_aggregator` with ``record=True``):

* ``server``: the honest-but-curious server. It holds every upload and (``paillier``) its private
  key, so its best reading of upload ``i`` is the upload itself: ``y_i`` read as a signed integer
  (``quantized``), or the ciphertext decrypted under its key and read slot by slot, without the
  validity checks of the decoding (``paillier``), or the upload less the edge mask the server shares
  with worker ``i``, read as a signed 64-bit integer (``secagg``).
* ``server+worker k`` (every ``k != i``): worker ``k`` hands the server its seeds' outputs, so the
  pair mask ``PRG(s_ik)`` (``quantized``, ``secagg``) or the pair unit ``mu(s_ik)`` (``paillier``) is stripped from
  ``i``'s upload before reading it; and ``k``'s own upload is known, so ``(sum - q_k) / (K - 1)``
  is a second guess.

Every reading is an estimate ``q_hat_i`` of the quantized upload ``q_i``, measured by:

* ``exact_fraction``: entries with ``q_hat == q`` (0 means no entry read back);
* ``corr``: the correlation of ``q_hat`` with ``q`` over all entries and rounds, against the bound
  ``z / sqrt(N)`` (two-sided, for independent values);
* ``ks``: the Kolmogorov-Smirnov distance of ``q_hat``, scaled to ``[0, 1)``, from the uniform
  distribution, against its critical value ``sqrt(-ln(alpha / 2) / 2) / sqrt(N)``;

both at the level ``alpha = 0.001 / m`` for the ``m`` tests of a run (Bonferroni: a run of an
aggregator that leaks nothing crosses a bound with probability at most 0.1%);
* ``rel_err_median``: ``||q_hat / n_max - v_i|| / ||v_i||`` per round, median; against the
  **baseline**, the guess the sum itself gives (``sum / K``; with a colluder ``(sum - q_k) / (K - 1)``).

The verdict ``learns_beyond_sum`` is False when the reading matches no entry, is uncorrelated
and uniform within the bounds, and is no closer than the baseline: the adversary has nothing of
``v_i`` beyond what the sum tells. ``inherent`` marks the one case no protocol can hide: ``K = 2``
with a colluder, whose own upload and the sum give the other upload exactly.

Positive control (:func:`run_server_audit` with ``masks=False``, a ``quantized`` aggregator with
its masks switched off): the server reads every upload exactly.
"""
from __future__ import annotations

import math
from statistics import NormalDist

import gmpy2
import numpy as np
import torch

from ..exchange.aggregation import RING_BITS, QuantizedAggregator, make_aggregator, signed_lift

__all__ = ["server_views", "run_server_audit", "format_server_audit", "FAMILY_ALPHA"]

#: the family-wise false-alarm level of one audit run (module docstring)
FAMILY_ALPHA = 1e-3


# --------------------------------------------------------------------------- readings
def _read_slots(residues, layout, n: int, count: int) -> list:
    """The slots of packed residues read as signed ``w``-bit digits (offset added, no validity check):
    what a reader gets from a plaintext whether or not it decodes."""
    w, S, lim = layout.slot_bits, layout.slots, layout.limit
    mask, off = (1 << w) - 1, layout.offset_word
    out = []
    for r in residues:
        u = (int(r) + off) % n
        for _ in range(S):
            out.append((u & mask) - lim)
            u >>= w
    return out[:count]


def _quantized_reading(agg, rec, i: int, colluder):
    y = rec["uploads"][i].clone()
    if colluder is not None:
        P = y.numel()
        prg = agg.mask_stream(colluder, i, rec["round"], P)
        sign = 1 if i < colluder else -1  # i added sign * PRG(s_ik): remove it
        y = (y - sign * prg) & ((1 << RING_BITS) - 1)
    return signed_lift(y).to(torch.float64)


def _paillier_reading(agg, rec, i: int, colluder):
    cts = [gmpy2.mpz(c) for c in rec["uploads"][i]]
    n = gmpy2.mpz(rec["modulus"])
    nsq = n * n
    if colluder is not None:
        units = agg._pair_units(colluder, i, rec["round"], len(cts))
        if i < colluder:  # i multiplied by mu^{+1}: divide it out
            units = [gmpy2.invert(u, nsq) for u in units]
        cts = [c * u % nsq for c, u in zip(cts, units)]
    residues = agg._decrypt_as_server(cts)
    P = rec["q"].shape[1]
    return torch.tensor(_read_slots(residues, agg.layout, int(n), P), dtype=torch.float64)


def _secagg_reading(agg, rec, i: int, colluder):
    """The server removes its edge mask of worker ``i`` (it holds that seed), the colluder its pair
    mask with ``i``: what is left, as a signed 64-bit integer (int64 arithmetic wraps mod ``2^64``)."""
    y = rec["uploads"][i].clone()
    P = y.numel()
    y -= agg.edge_stream(i, rec["round"], P)
    if colluder is not None:
        sign = 1 if i < colluder else -1  # i added sign * PRG(s_ik): remove it
        y -= sign * agg.mask_stream(colluder, i, rec["round"], P)
    return y.to(torch.float64)


def _reading(agg, rec, i, colluder):
    if colluder is not None and (min(i, colluder), max(i, colluder)) not in agg.pairs:
        colluder = None  # no seed shared with i (a sparse mask graph): nothing of i's to strip
    if agg.kind == "paillier":
        return _paillier_reading(agg, rec, i, colluder)
    if agg.kind == "secagg":
        return _secagg_reading(agg, rec, i, colluder)
    return _quantized_reading(agg, rec, i, colluder)


def _ring_half(agg) -> float:
    """Half the width of a reading's range: ``2^62`` (the ring), ``2^63`` (secagg's int64) or the slot
    limit (paillier)."""
    if agg.kind == "secagg":
        return float(2 ** 63)
    return float(agg.layout.limit) if agg.kind == "paillier" else float(1 << (RING_BITS - 1))


# --------------------------------------------------------------------------- statistics
def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else 0.0


def _ks_uniform(u: np.ndarray) -> float:
    u = np.sort(u)
    N = len(u)
    if N == 0:
        return 0.0
    ranks = np.arange(1, N + 1) / N
    return float(max(np.max(ranks - u), np.max(u - (ranks - 1.0 / N))))


def _rel_err(est, truth) -> np.ndarray:
    return np.linalg.norm(est - truth, axis=-1) / np.maximum(np.linalg.norm(truth, axis=-1), 1e-300)


def server_views(agg) -> list:
    """Every (adversary, target) result of a recorded run of ``agg`` (module docstring).

    Parameters
    ----------
    agg : QuantizedAggregator, PaillierAggregator or SecAggAggregator
        Built with ``record=True``, after some rounds, not closed (the colluder's seeds are used).

    Returns
    -------
    list of dict
        ``adversary``, ``target``, ``colluder`` (or None), ``exact_fraction``, ``corr``, ``corr_bound``,
        ``ks``, ``ks_bound``, ``rel_err_median``, ``baseline_rel_err_median``,
        ``baseline_exact_fraction``, ``inherent``, ``learns_beyond_sum``.
    """
    if agg.kind not in ("quantized", "paillier", "secagg") or not agg.record or not agg.transcript:
        raise ValueError("server_views: needs a quantized, paillier or secagg aggregator with record=True that ran")
    K, n_max, half = agg.n_workers, agg.n_max, _ring_half(agg)
    recs = agg.transcript
    Q = np.stack([r["q"].numpy() for r in recs])  # (R, K, P) int64
    S = np.stack([r["sum"].numpy() for r in recs])  # (R, P)
    V = Q.astype(np.float64) / n_max
    out = []
    colluders = [None] + (list(range(K)) if getattr(agg, "masks", True) else [])
    alpha = FAMILY_ALPHA / (2 * K * len(colluders))
    z, c_ks = NormalDist().inv_cdf(1 - alpha / 2), math.sqrt(-math.log(alpha / 2) / 2)
    for i in range(K):
        for k in colluders:
            if k == i:
                continue
            est = np.stack([_reading(agg, r, i, k).numpy() for r in recs])  # (R, P)
            base = (S - Q[:, k]) / (K - 1) if k is not None else S / K
            N = est.size
            exact = float(np.mean(est == Q[:, i]))
            corr = _corr(est.ravel(), Q[:, i].astype(np.float64).ravel())
            ks = _ks_uniform(((est.ravel() + half) / (2 * half)).clip(0.0, 1.0))
            err = float(np.median(_rel_err(est / n_max, V[:, i])))
            base_err = float(np.median(_rel_err(base / n_max, V[:, i])))
            base_exact = float(np.mean(base == Q[:, i]))
            cb, kb = z / math.sqrt(N), c_ks / math.sqrt(N)
            leaks = exact > 0 or abs(corr) > cb or ks > kb or err < base_err
            out.append({
                "adversary": "server" if k is None else f"server+worker {k}",
                "masks": bool(getattr(agg, "masks", True)), "target": i, "colluder": k,
                "exact_fraction": exact, "corr": corr, "corr_bound": cb, "ks": ks, "ks_bound": kb,
                "rel_err_median": err, "baseline_rel_err_median": base_err, "baseline_exact_fraction": base_exact,
                "inherent": k is not None and K == 2, "learns_beyond_sum": bool(leaks),
            })
    return out


def _uploads(K: int, P: int, rounds: int, seed: int):
    """FSSPCA-like uploads: a common drifting vector and a small per-worker part (so that the sum's
    own guess, the mean, is close: a reading must beat it to count as a leak)."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(P, generator=gen, dtype=torch.float64)
    for _ in range(rounds):
        z = z + 0.05 * torch.randn(P, generator=gen, dtype=torch.float64)
        yield z + 0.1 * torch.randn((K, P), generator=gen, dtype=torch.float64)


def run_server_audit(kind: str = "quantized", n_workers: int = 3, *, rounds: int = 8, n_values: int = 64,
                     seed: int = 0, masks: bool = True, **agg_options) -> dict:
    """Run ``rounds`` recorded rounds of FSSPCA-like uploads through an aggregator of ``kind`` and audit them.

    ``masks=False`` (``quantized`` only): the positive control, masks switched off. ``agg_options`` go
    to :func:`~ppdnmf_torch.exchange.aggregation.make_aggregator` (``key_bits``, ``keypairs``, ``n_max``).

    Returns
    -------
    dict
        ``kind``, ``n_workers``, ``rounds``, ``n_values``, ``masks``, ``views`` (:func:`server_views`),
        ``sums_exact`` (every round's sum equal to the exact integer sum) and ``verdict``: per adversary
        kind (``server``, ``server+worker``) whether any non-inherent view learns beyond the sum.
    """
    if kind == "quantized":  # a reproducible transcript (the paillier kind's seeds come from the OS only)
        agg_options.setdefault("seed", seed)
    if masks:
        agg = make_aggregator(kind, n_workers, record=True, **agg_options)
    elif kind == "quantized":
        agg = QuantizedAggregator(n_workers, record=True, masks=False, **agg_options)
    else:
        raise ValueError("run_server_audit: masks=False is the quantized kind's positive control")
    try:
        exact = True
        for v in _uploads(n_workers, n_values, rounds, seed):
            s = agg.total(v, 0)
            q = torch.round(v * agg.n_max).to(torch.int64)
            exact &= bool(torch.equal(s, q.sum(0).to(torch.float64) / agg.n_max))
        views = server_views(agg)
    finally:
        agg.close()
    verdict = {}
    for name in ("server", "server+worker"):
        sel = [v for v in views if v["adversary"].startswith(name) and not v["inherent"]
               and (name == "server+worker") == (v["colluder"] is not None)]
        if sel:
            verdict[name] = "learns beyond the sum" if any(v["learns_beyond_sum"] for v in sel) else "only the sum"
    return {"kind": kind, "n_workers": n_workers, "rounds": rounds, "n_values": n_values, "masks": masks,
            "key_bits": agg.key_bits, "views": views, "sums_exact": exact, "verdict": verdict}


def format_server_audit(reports) -> str:
    """A Markdown table of :func:`run_server_audit` reports: per adversary, the worst view over targets
    (and colluders): the largest exact fraction, ``|corr|`` / bound, KS / bound, the smallest error
    against the baseline."""
    lines = ["| kind | K | masks | adversary | exact entries | max abs(corr) / bound | max KS / bound | "
             "min error / baseline error | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for rep in reports:
        groups = {}
        for v in rep["views"]:
            name = "server" if v["colluder"] is None else ("server+worker (K=2, inherent)" if v["inherent"]
                                                           else "server+worker")
            groups.setdefault(name, []).append(v)
        for name, vs in groups.items():
            ex = max(v["exact_fraction"] for v in vs)
            c = max(abs(v["corr"]) / v["corr_bound"] for v in vs)
            ks = max(v["ks"] / v["ks_bound"] for v in vs)
            er = min(v["rel_err_median"] / max(v["baseline_rel_err_median"], 1e-300) for v in vs)
            verdict = "learns beyond the sum" if any(v["learns_beyond_sum"] for v in vs) else "only the sum"
            if name.endswith("inherent)"):
                verdict = "exact from the sum (inherent)" if max(v["baseline_exact_fraction"] for v in vs) == 1 \
                    else verdict
            lines.append(f"| {rep['kind']} | {rep['n_workers']} | {'on' if rep['masks'] else 'off'} | {name} | "
                         f"{ex:.3g} | {c:.3g} | {ks:.3g} | {er:.3g} | {verdict} |")
    return "\n".join(lines)
