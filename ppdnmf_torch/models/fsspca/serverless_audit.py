"""What the serverless variant's exchange reveals (docs/THREAT_MODEL.md, "FSSPCA without a server").

The run is recorded through :func:`ppdnmf_torch.audit.make_recording_exchange` and the library's
attacks run on the recording, as :mod:`ppdnmf_torch.models.ppdnmf.audit` does for PPDNMF. The
values on the wire are the consensus messages (``z_i`` under ``consensus="admm"``, the tracked
averages ``x_i`` under ``"laplacian"``); the private quantity is each worker's ``v_j = w_j + u_j /
rho``, which carries its data through ``w_j``. Adversaries, all honest-but-curious:

* ``plain``: an eavesdropper on every link (:func:`~ppdnmf_torch.audit.eavesdropper_plain`)
  reads every message; so does each neighbour for the messages it receives.
* ``quantized`` (bit-identical to ``paillier``) under ``protocol="masked"`` with the agreed
  penalty schedule: a neighbour ``i`` of ``j`` holds only its sums ``A_i = sum_j rho_ij q_j`` and
  ``rho_int_i``; the masked attacks (:func:`~ppdnmf_torch.audit.neighbour_audit`: ``nbr_mean``,
  ``trajectory``), the integer and lattice attacks on the sums
  (:func:`~ppdnmf_torch.audit.sums_audit`), and two neighbours of ``j`` pooling what they hold
  (:func:`~ppdnmf_torch.audit.collusion_audit`).

``v_j`` itself: the attacker's guess of ``v_j^k`` (ADMM iteration ``k``) is its estimate of
``j``'s first message of iteration ``k`` (under ``laplacian`` at ``k = 1`` that message *is*
``v_j^1``); it is scored against two baselines that need no attack: ``v_i^k`` (the attacker's
own) and the attacker's own message (the consensus value it legitimately holds). An exact recovery is an estimate equal to ``v_j^k`` at the codec's
resolution ``1 / n_max`` in every entry. Inverting later messages through the consensus
recursion (which needs the neighbours' other neighbours' messages) is not attempted. The
centring's calls before the first ADMM iteration (:func:`.serverless.agreed_centring`: the
scaled row sums and counts) are left out of the recording: not measured here.
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import numpy as np
import torch

from ...audit.eavesdropper import eavesdropper_paillier, eavesdropper_plain
from ...audit.masked import collusion_audit, masked_attacks, record_seeds, tag_seeds
from ...audit.neighbour import neighbour_audit
from ...audit.recording import as_recording, make_recording_exchange
from ...audit.sums import public_x_max, sums_audit
from ...errors import DegreeOneWarning
from .config import SERVERLESS
from .serverless import fit_serverless

__all__ = ["record_serverless", "v_recovery", "audit_serverless", "paillier_scan"]


def record_serverless(data, n_components, graph, *, kind="quantized", protocol="masked", n_max=1e6, g_bits=16,
                      key_bits=128, keypairs=None, **fit_kwargs):
    """Run :func:`.serverless.fit_serverless` (one trial) through a recording exchange.

    Returns
    -------
    rec : Recording
        Every exchange call of step 2: ``rec.bcd`` is the ADMM iteration, ``rec.admm`` the inner
        one (the centring's calls before the first iteration are not in it).
    v : ndarray (n_iter, K, d r)
        The workers' ``v_i`` per ADMM iteration (kept by the audit, never sent).
    result : ServerlessResult
    """
    exch = make_recording_exchange(kind, protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits,
                                   keypairs=keypairs)
    vs = []

    def keep(_k, values):
        vs.append(values["v"][0].reshape(values["v"].shape[1], -1).to("cpu", torch.float64).numpy().copy())

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegreeOneWarning)  # the audit measures what such workers learn
        try:
            res = fit_serverless(data, n_components, graph, exchange=exch, trials=1, callback=keep, **fit_kwargs)
        finally:
            exch.close()
    # the centring's calls (bcd 0, d + 1 values each) are left out: the attacks here score step 2's
    exch.records = [r for r in exch.records if r["bcd"] > 0]
    costs = dict(res.costs, transcript=getattr(exch, "transcript", None) or [])  # paillier: the wire
    summary = SimpleNamespace(costs=costs, nmse=math.nan, consensus=float(res.disagreement[-1, 0]))
    return as_recording(exch, graph, kind, protocol, n_max, g_bits, summary), np.stack(vs), res


def v_recovery(rec, v, estimates: dict, *, exact_tol=None) -> dict:
    """How well a neighbour's estimates of the messages give the sender's ``v_j`` (module docstring).

    Parameters
    ----------
    rec : Recording
    v : ndarray (n_iter, K, P)
    estimates : dict name -> ndarray (calls, 2E, P)
        The attacker's estimate of ``U_j`` for directed edge ``e = i -> j`` at every call.
    exact_tol : float, optional
        An entry counts as recovered when within it (default ``0.5 / n_max``).

    Returns
    -------
    dict: per attack, ``exact`` (``(pair, iteration)`` recoveries), ``pairs_any_exact``,
    ``rel_err_median``; ``baseline_rel_err_median`` (``v_i`` as the guess),
    ``own_message_rel_err_median`` (the attacker's own message as the guess: what the consensus
    gives it legitimately); ``pairs``, ``iterations``.
    """
    tol = 0.5 / rec.n_max if exact_tol is None else exact_tol
    first = np.nonzero(rec.admm == 1)[0]  # the first call of every ADMM iteration
    n = min(len(first), len(v))
    first, vt = first[:n], v[:n]
    target = vt[:, rec.dst]  # (n, 2E, P)
    norm = np.maximum(np.linalg.norm(target, axis=-1), 1e-300)
    base = np.linalg.norm(vt[:, rec.src] - target, axis=-1) / norm
    own = np.linalg.norm(rec.U[first][:, rec.src] - target, axis=-1) / norm
    out = {"pairs": int(len(rec.src)), "iterations": int(n), "baseline_rel_err_median": float(np.median(base)),
           "own_message_rel_err_median": float(np.median(own))}
    for name, est in estimates.items():
        guess = est[first]
        hit = np.all(np.abs(guess - target) <= tol, axis=-1)  # (n, 2E)
        rel = np.linalg.norm(guess - target, axis=-1) / norm
        out[name] = {"exact": int(hit.sum()), "pairs_any_exact": int(hit.any(0).sum()),
                     "rel_err_median": float(np.median(rel))}
    return out


def audit_serverless(data, n_components, graph, *, n_max=1e6, g_bits=16, key_bits=128, sums=True,
                     sums_max_calls=20, **fit_kwargs) -> dict:
    """The serverless variant's exchange under the adversaries of the module, on one problem.

    ``fit_kwargs`` go to :func:`.serverless.fit_serverless` (``consensus``, ``inner_iters``,
    ``g_cap``, ``alpha``, ``groups``, ``max_iter``, ...).

    Returns
    -------
    dict with ``plain`` (the eavesdropper's exact message recoveries and ``v`` recovery from
    the messages in the clear) and ``masked`` (``quantized``, ``protocol="masked"``: the
    neighbour audit's summary, the sums attacks' exact counts, ``v`` recovery from the masked
    estimates, the collusion audit's summary), and the run's settings.
    """
    g_cap = float(fit_kwargs.get("g_cap", SERVERLESS.g_cap))
    prec, pv, pres = record_serverless(data, n_components, graph, kind="plain", **fit_kwargs)
    eav = eavesdropper_plain(prec)
    plain_msgs = {"message": prec.U[:, prec.dst]}
    out = {"graph": {"n_agents": graph.n_agents, "degree": graph.degree.tolist()},
           "settings": dict(pres.settings, n_max=n_max, g_bits=g_bits),
           "plain": {"calls": prec.n_calls, "messages": eav["n_messages"],
                     "agents_recovered_exactly": sum(a["recovered_fraction"] == 1.0 for a in eav["agents"]),
                     "v": v_recovery(prec, pv, plain_msgs, exact_tol=1e-12)}}
    rec, v, res = record_serverless(data, n_components, graph, kind="quantized", protocol="masked", n_max=n_max,
                                    g_bits=g_bits, key_bits=key_bits, **fit_kwargs)
    na = neighbour_audit(rec, "masked")["summary"]
    est = masked_attacks(rec)
    masked = {"calls": rec.n_calls, "n_iter": int(res.n_iter[0]),
              "messages": {k: na[k] for k in ("pairs", "pairs_informative", "exact_recovery_pairs",
                                              "exact_recovery_pairs_degree1", "exact_recovery_pairs_degree2plus",
                                              "beats_baseline_pairs", "baseline_rel_err_median",
                                              "best_rel_err_median")},
              "v": v_recovery(rec, v, {k: est[k] for k in ("nbr_mean", "trajectory")}),
              "collusion": collusion_audit(rec)["summary"]}
    if sums:
        sa = sums_audit(rec, x_max=public_x_max(g_cap, g_bits, "paper"), max_calls=sums_max_calls)
        masked["sums"] = {d: {k: b.get(k) for k in ("receivers", "informative_calls", "exact_calls",
                                                     "certified", "false_positives", "pairs_any_exact", "pairs")}
                          for d, b in sa["by_degree"].items()}
    out["masked"] = masked
    return out


def paillier_scan(data, n_components, graph, *, key_bits=128, keypairs=None, n_max=1e6, g_bits=16,
                  **fit_kwargs) -> dict:
    """An eavesdropper on every link of a real ``paillier`` run (``protocol="masked"``, keys made
    here unless given): the library's transcript scan (:func:`~ppdnmf_torch.audit.eavesdropper_paillier`)
    for every plaintext step 2's calls handled and every seed the masked protocol drew.

    Returns the scan's summary: ``n_messages``, ``n_hits`` (plaintexts or seeds found on the wire),
    ``unobfuscated`` and ``repeated_ciphertexts`` (0 when clean), ``n_plaintexts``, ``n_seeds``, ``clean``.
    """
    if keypairs is None:
        from ...exchange.paillier import generate_keypairs

        keypairs = generate_keypairs(key_bits, graph.n_agents)
    with record_seeds() as drawn:
        rec, _, _ = record_serverless(data, n_components, graph, kind="paillier", protocol="masked", n_max=n_max,
                                      g_bits=g_bits, key_bits=key_bits, keypairs=keypairs, **fit_kwargs)
    seeds, _ = tag_seeds(rec, drawn)
    scan = eavesdropper_paillier(rec, seeds=list(seeds.values()))["scan"]
    return {k: scan[k] for k in ("n_messages", "n_hits", "unobfuscated", "repeated_ciphertexts", "n_plaintexts",
                                 "n_seeds", "clean")}
