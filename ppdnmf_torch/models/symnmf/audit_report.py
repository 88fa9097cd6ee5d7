"""The report of the privacy audit of symmetric NMF across agents (:mod:`.audit`'s attacks over a
run's calls and pairs, per graph and setting; docs/THREAT_MODEL.md, "Symmetric NMF across agents"):
:func:`reconstruction_audit`, :func:`paillier_scan`, :func:`run_symnmf_audit`."""
from __future__ import annotations

import time

import numpy as np
import torch

from ...audit.eavesdropper import eavesdropper_paillier, eavesdropper_plain
from ...audit.masked import collusion_audit, record_seeds
from ...audit.neighbour import neighbour_audit
from ...audit.recording import Recording
from ...audit.sums import public_x_max, schedule_audit, sums_audit, unequal_weights
from ...errors import ConfigError
from .audit import (EQUAL_WEIGHT_SETTINGS, SETTINGS, column_errors, degree2_recoveries, eavesdropper_first_call,
                    first_call_errors, first_call_sum_errors, gram_audit, median_of, record_symnmf_agents, true_starts)
from .config import ADAPTIVE_LAMBDA0

__all__ = ["reconstruction_audit", "paillier_scan", "run_symnmf_audit", "FIRST_EXACT", "RECONSTRUCTION_KEYS"]


#: a pair's first-call inversion counts as exact below this relative error
FIRST_EXACT = 1e-8
#: the errors :func:`reconstruction_audit` summarizes (``first*``: at the first call only)
RECONSTRUCTION_KEYS = ("attack_sym", "attack_ls", "own_sym", "own_ls", "nystrom", "first", "attack_sym_prec",
                       "own_sym_prec", "nystrom_prec", "first_prec", "chance_prec")


def reconstruction_audit(rec: Recording, X, parts, rank: int, *, calls=None, pairs=None, U0=None,
                         lam0: float = ADAPTIVE_LAMBDA0, mu="auto") -> dict:
    """:func:`column_errors` for the directed edges ``pairs`` (``(i, j)``; default every edge) at
    ``calls`` (``[(call, pairs or None)]``; default: the first call and the last call of every
    outer iteration), with ``U_j`` read off the recording: ``q_j / n_max`` for an integer
    recording (what an exact recovery of ``q_j`` gives), ``U_j`` for ``plain`` (what the
    eavesdropper reads); the attacker's own copy exactly. At the first call, with ``U0`` (the
    common start), also :func:`first_call_errors`.

    Returns
    -------
    dict
        ``per_iteration``: per call ``{"call", "outer_iter", "admm_iter", "pairs", medians of the
        errors over the pairs}`` (with the inversion: ``first_exact`` pairs below
        :data:`FIRST_EXACT` of ``first_pairs``, ``first_max``, ``first_prec_min``); ``rows``: every
        (call, pair) entry; ``medians``: the same summary over all rows.
    """
    n = int(np.asarray(X.shape)[0])
    U = rec.U.reshape(rec.n_calls, rec.n_agents, n, rank)
    U_hat = U if rec.q is None else (rec.q / rec.n_max).reshape(U.shape)
    if calls is None:
        last = np.flatnonzero(np.r_[rec.bcd[1:] != rec.bcd[:-1], True])
        calls = [(int(t), None) for t in np.union1d([0], last)]
    if pairs is None:
        pairs = list(zip(rec.src.tolist(), rec.dst.tolist()))
    rows = []
    for t, only in calls:
        first = U0 is not None and rec.bcd[t] == 1 and rec.admm[t] == 1
        for i, j in (only if only is not None else pairs):
            e = column_errors(X, parts, i, j, U_hat[t, j], U[t, i])
            if first:
                e.update(first_call_errors(X, parts, i, j, U_hat[t, j], U0, lam0=lam0, mu=mu))
            rows.append({"call": int(t), "outer_iter": int(rec.bcd[t]), "admm_iter": int(rec.admm[t]),
                         "attacker": int(i), "target": int(j), **e})
    def summary(sel):
        out = {k: median_of(sel, k) for k in RECONSTRUCTION_KEYS}
        first = [r["first"] for r in sel if "first" in r]
        if first:  # the inversion is exact or not per pair: count, and the worst
            out.update(first_exact=sum(v < FIRST_EXACT for v in first), first_max=max(first),
                       first_prec_min=min(r["first_prec"] for r in sel if "first" in r), first_pairs=len(first))
        return out

    per = []
    for t in sorted({r["call"] for r in rows}):
        sel = [r for r in rows if r["call"] == t]
        per.append({"call": t, "outer_iter": sel[0]["outer_iter"], "admm_iter": sel[0]["admm_iter"],
                    "pairs": len(sel), **summary(sel)})
    return {"per_iteration": per, "rows": rows, "medians": summary(rows)}


# --------------------------------------------------------------------------- the audit
def _graph_info(graph) -> dict:
    return {"n_agents": int(graph.n_agents), "edges": [list(e) for e in graph.edges], "degree": graph.degree.tolist()}


def _weights(rec: Recording) -> dict:
    """:func:`~ppdnmf_torch.audit.sums.unequal_weights` (receiver-calls of degree >= 2: informative,
    and with unequal weights) and the first call at which every draw has its final value."""
    sat = (rec.gamma == rec.gamma[-1][None]).all(1)
    out = unequal_weights(rec)
    return {"informative_receiver_calls": out["informative_calls"], "unequal_weights": out["unequal_weights"],
            "saturated_from_call": int(np.argmax(sat)) + 1 if sat.any() else None}


def _neighbour_summary(audit: dict) -> dict:
    s = audit["summary"]
    keep = ("pairs", "pairs_informative", "exact_recovery_pairs", "exact_recovery_pairs_degree1",
            "exact_recovery_pairs_degree2plus", "beats_baseline_pairs", "baseline_rel_err_median",
            "best_rel_err_median", "by_degree")
    return {k: s[k] for k in keep if k in s}


def paillier_scan(X, rank: int, graph, keypairs, *, protocols=("masked",), n_max: float = 1e6, g_bits: int = 16,
                  key_bits: int = 128, **fit_kwargs) -> dict:
    """A real Paillier run per protocol (the caller's ``keypairs``, e.g. small ones made once), its
    transcript scanned for every plaintext the protocol handled and every mask seed drawn
    (:func:`~ppdnmf_torch.audit.eavesdropper_paillier`); also checks that its integers equal a
    ``quantized`` run's (``bit_identical``); ``key_bits``: the keys' size, for the codec."""
    out = {}
    qrec, _ = record_symnmf_agents(X, rank, graph, kind="quantized", n_max=n_max, g_bits=g_bits,
                                   key_bits=key_bits, **fit_kwargs)
    for proto in protocols:
        t0 = time.perf_counter()
        with record_seeds() as drawn:
            rec, _ = record_symnmf_agents(X, rank, graph, kind="paillier", protocol=proto, n_max=n_max,
                                          g_bits=g_bits, key_bits=key_bits, keypairs=keypairs,
                                          paillier_options={"workers": 0}, **fit_kwargs)
        ev = eavesdropper_paillier(rec, seeds=list(drawn))
        ev["bit_identical"] = bool(np.array_equal(rec.q, qrec.q) and np.array_equal(rec.gamma, qrec.gamma))
        ev["seconds"] = time.perf_counter() - t0
        del drawn
        out[proto] = ev
    return out


def run_symnmf_audit(X, rank: int, graphs: dict, *, settings=("agreed", "paper", "equal"),
                     protocols=("paper", "aggregated", "masked"), n_max: float = 1e6, g_bits: int = 16,
                     key_bits: int = 128, sums: bool = True, sums_max_calls: int | None = 10, plain: bool = True,
                     reconstruct: bool = True, progress=None, **fit_kwargs) -> dict:
    """The audit of :func:`~.agents.fit_symnmf_agents` on ``X`` per graph and setting.

    Parameters
    ----------
    X : array-like or Tensor (n, n)
        The similarity matrix.
    rank : int
    graphs : dict of str to Graph
    settings : sequence of str
        Keys of :data:`SETTINGS` (``agreed``: the default schedule, one common draw; ``paper``:
        random draws per edge under equal caps; ``equal``: fixed draws, equal weights).
    protocols : which neighbour views to audit on the integer recording.
    n_max, g_bits, key_bits : the codec.
    sums : bool
        The sums attacks (:func:`~ppdnmf_torch.audit.sums_audit`, at most ``sums_max_calls``
        informative calls per receiver) and :func:`~ppdnmf_torch.audit.schedule_audit`.
    plain : bool
        Also record ``plain``: the eavesdropper, and (``reconstruct``) :func:`reconstruction_audit`
        at the end of every outer iteration.
    reconstruct : bool
        :func:`column_errors` at the calls the degree-2 sums attack recovers exactly (and, with
        ``plain``, per outer iteration).
    progress : callable(str), optional
    **fit_kwargs
        Keywords of :func:`~.agents.fit_symnmf_agents` (``U0``, ``max_iter``, ``x_iters``,
        ``g_cap``, ``seed``, ``start``, ...), for every run. The first-call inversions assume
        the public start ``V_j = U_0[S_j]`` (``start="common"``); under the default private
        start that is the attacker's best public guess, and it fails (the report's numbers).

    Returns
    -------
    dict
        JSON-ready: ``meta`` and ``cases`` (``"<graph>/<setting>"``: ``graph``, ``fit``
        (``E``, ``consensus``), ``weights`` (:func:`_weights`), ``sums``,
        ``schedule_leak``, ``neighbour`` per protocol (summary), ``collusion`` (``masked``),
        ``eavesdropper_plain``, ``recoveries`` (:func:`degree2_recoveries` on every degree-2
        call with unequal weights: calls attacked, exact, certified, and the columns'
        reconstruction at the exact ones), ``reconstruction_plain`` (per outer iteration) and
        ``eavesdropper_first_call`` (with ``U0``), ``first_call_sum`` (the equal-weight settings
        :data:`EQUAL_WEIGHT_SETTINGS`, with ``U0``: :func:`first_call_sum_errors`)).
    """
    say = progress or (lambda s: None)
    t_start = time.perf_counter()
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        raise ConfigError(f"settings: unknown {unknown}; use some of {tuple(SETTINGS)}")
    g_cap = float(fit_kwargs.get("g_cap", 0.3))
    # what the first-call inversion needs: the common start and the first X-step's lambda and mu
    inv = {"U0": fit_kwargs.get("U0"), "mu": fit_kwargs.get("mu", "auto"),
           "lam0": fit_kwargs.get("lam0", ADAPTIVE_LAMBDA0) if fit_kwargs.get("penalty", "adaptive") == "adaptive"
           else float(fit_kwargs["penalty"])}
    if inv["U0"] is not None:
        inv["U0"] = torch.as_tensor(inv["U0"]).reshape(-1, *torch.as_tensor(inv["U0"]).shape[-2:])[0]
    # the caps are fixed in this model under every schedule ("agreed" included: agents.py keeps the
    # one common cap, no growth), so the public bound of a draw is the cap itself
    x_max = public_x_max(g_cap, g_bits, "paper")
    report = {"meta": {"audit": "ppdnmf_torch.models.symnmf.audit", "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                       "n": int(np.asarray(X.shape)[0]), "rank": int(rank), "n_max": n_max, "g_bits": g_bits,
                       "key_bits": key_bits, "x_max": x_max, "sums_max_calls": sums_max_calls,
                       "fit": {k: v for k, v in fit_kwargs.items() if k != "U0"}},
              "cases": {}}
    for gname, graph in graphs.items():
        for sname in settings:
            kw = dict(fit_kwargs, **SETTINGS[sname])
            name = f"{gname}/{sname}"
            t0 = time.perf_counter()
            say(f"[{name}] recording the integer protocol")
            rec, res = record_symnmf_agents(X, rank, graph, kind="quantized", n_max=n_max, g_bits=g_bits,
                                            key_bits=key_bits, **kw)
            parts = res.parts[0]
            entry = {"graph": _graph_info(graph), "setting": sname, "fit": {"E": rec.nmse, "consensus": rec.consensus},
                     "calls": rec.n_calls, "weights": _weights(rec), "neighbour": {}}
            if sums:
                say(f"[{name}] sums attacks")
                entry["sums"] = sums_audit(rec, x_max=x_max, max_calls=sums_max_calls)
                entry["schedule_leak"] = schedule_audit(rec, x_max=x_max)
                if reconstruct:
                    hits, tried = degree2_recoveries(rec, x_max=x_max, unequal_only=True)
                    rc = reconstruction_audit(rec, X, parts, rank,
                                              calls=[(t, [(i, j) for j in nb]) for t, i, nb, _ in hits], **inv)
                    entry["recoveries"] = {"attacked": tried, "exact": len(hits),
                                           "certified": sum(c for *_, c in hits), "calls": [{"call": t, "outer_iter": int(rec.bcd[t]), "admm_iter":
                                                      int(rec.admm[t]), "receiver": i, "neighbours": nb,
                                                      "certified": c} for t, i, nb, c in hits],
                                           "reconstruction": rc["medians"], "rows": rc["rows"]}
            if reconstruct and sname in EQUAL_WEIGHT_SETTINGS and inv["U0"] is not None:
                say(f"[{name}] the first messages' sum inverted")
                entry["first_call_sum"] = first_call_sum_errors(rec, X, parts, rank, **inv)
            for proto in protocols:
                say(f"[{name}] neighbour attacks under protocol={proto}")
                entry["neighbour"][proto] = _neighbour_summary(neighbour_audit(rec, proto))
            if "masked" in protocols:
                entry["collusion"] = collusion_audit(rec)["summary"]
            if plain:
                say(f"[{name}] plain run: eavesdropper" + (" and the columns' reconstruction" if reconstruct else ""))
                prec, _ = record_symnmf_agents(X, rank, graph, kind="plain", **kw)
                ev = eavesdropper_plain(prec)
                entry["eavesdropper_plain"] = {"all_recovered_exactly": ev["all_recovered_exactly"],
                                               "n_messages": ev["n_messages"]}
                if reconstruct:
                    entry["reconstruction_plain"] = reconstruction_audit(prec, X, parts, rank, **inv)["per_iteration"]
                    if inv["U0"] is not None:
                        entry["eavesdropper_first_call"] = eavesdropper_first_call(prec, X, parts, rank, **inv)
                        if inv["mu"] == "auto" and int(kw.get("x_iters", 10)) >= 2:
                            V0 = true_starts(inv["U0"], parts, kw.get("start", "private"),
                                            int(kw.get("start_seed", kw.get("seed", 0))))
                            entry["gram"] = gram_audit(prec, X, parts, rank, inv["U0"], V0, lam0=inv["lam0"])
            entry["seconds"] = time.perf_counter() - t0
            report["cases"][name] = entry
    report["meta"]["seconds"] = time.perf_counter() - t_start
    return report
