"""Judging and reporting: the thresholds, the verdict on one (attacker, target) pair, the
report's flags and its Markdown rendering.

The best attack of a pair is the one with the most exact recoveries, then the lowest
median error (an oracle choice among the attacks, so it bounds what the set achieves);
it is judged against the trivial baseline ``U_j ~ U_i``.
"""
from __future__ import annotations

import math

from .across_calls import across_calls_flags, md_across_calls
from .secagg import md_secagg, secagg_flags

__all__ = [
    "judge",
    "exposure",
    "collect_flags",
    "format_markdown",
    "EXACT_FRACTION",
    "BEATS_BASELINE_RATIO",
    "DIRECTION_CORR",
]

#: a pair is flagged ``exact_recovery`` when the best attack recovers ``q_j`` bit for bit
#: at least this fraction of the informative iterations
EXACT_FRACTION = 0.5
#: a pair is flagged ``beats_baseline`` when the best attack's median relative error is at
#: most this fraction of the trivial baseline's
BEATS_BASELINE_RATIO = 0.5
#: ``difference_direction_exact`` when every informative message correlates this well
#: with ``U_j - U_i``
DIRECTION_CORR = 0.999


def judge(attacks: dict, cands) -> dict:
    """The best of ``cands`` on one pair (most exact recoveries, then the lowest median
    error), its advantage over the baseline and the flags ``exact_recovery`` /
    ``beats_baseline``."""
    base = attacks["baseline"]
    best = min(cands, key=lambda k: (-(attacks[k]["exact_fraction"] or 0.0), attacks[k]["rel_err_median"]))
    b = attacks[best]
    flags = []
    if (b["exact_fraction"] or 0.0) >= EXACT_FRACTION:
        flags.append("exact_recovery")
    if b["rel_err_median"] <= BEATS_BASELINE_RATIO * base["rel_err_median"]:
        flags.append("beats_baseline")
    return {"best_attack": best,
            "advantage": (base["rel_err_median"] / b["rel_err_median"]
                          if b["rel_err_median"] and b["rel_err_median"] > 0 else None),
            "flags": flags}


def exposure(mine: list, against: list, flags_of) -> dict:
    """Whom an agent learns exactly, and to whom it is exposed, from its pairs' flags."""
    return {
        "learns_exactly": sorted(p["target"] for p in mine if "exact_recovery" in flags_of(p)),
        "exposed_to": sorted(p["attacker"] for p in against if "exact_recovery" in flags_of(p)),
        "partially_exposed_to": sorted(p["attacker"] for p in against
                                       if "beats_baseline" in flags_of(p) and "exact_recovery" not in flags_of(p)),
    }


def _agent_flags(sname: str, proto: str, pa: dict) -> list:
    """The flags of one scenario's neighbour audit under one protocol, agent by agent."""
    flags = []
    sums_only = "sums_only" in pa.get("views", {})
    for a in pa["agents"]:
        views = [("honest_but_curious", "", a, lambda p: p["flags"])]
        if sums_only:
            views.append(("sums_only", "sums_only_", a["sums_only"],
                          lambda p: p.get("sums_only", {}).get("flags", [])))
        for view, prefix, ag, flags_of in views:
            if ag["learns_exactly"]:
                flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"], "view": view,
                              "flag": prefix + "learns_neighbour_U_exactly",
                              "neighbours": ag["learns_exactly"], "degree": a["degree"]})
            partial = [p["target"] for p in pa["pairs"] if p["attacker"] == a["agent"]
                       and "beats_baseline" in flags_of(p) and "exact_recovery" not in flags_of(p)]
            if partial:
                flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"], "view": view,
                              "flag": prefix + "beats_trivial_baseline", "neighbours": partial,
                              "degree": a["degree"]})
        if a["degree"] == 1:
            flags.append({"scenario": sname, "protocol": proto, "agent": a["agent"],
                          "view": "sums_only" if sums_only else "honest_but_curious",
                          "flag": "degree1_rho_reveals_penalty", "neighbours": a["neighbours"],
                          "degree": 1})
    for f in flags:  # a single neighbour's term is what any protocol must give its agent
        f["inherent"] = f.get("degree") == 1
    return flags


def _masked_flags(sname: str, mc: dict) -> list:
    """Flags of a real masked run: a reply that is not uniform, correlates with ``q_j``, decrypts
    to a plaintext, or is unmasked by a listening neighbour or by colluders beyond the inherent case."""
    out = []

    def flag(name, view="honest_but_curious"):
        out.append({"scenario": sname, "protocol": "paillier/masked", "agent": None, "view": view, "flag": name,
                    "neighbours": [], "inherent": False})

    if mc["uniformity"].get("uniform") is False:
        flag("masked_replies_not_uniform")
    for k, c in mc["independence"].items():
        if c.get("independent") is False:
            flag(f"masked_replies_correlate_with_{k}")
    if mc["plaintext_matches"]:
        flag("masked_reply_decrypts_to_a_plaintext")
    if any(v["exact"] for d, v in mc["decrypt_each"].items()):
        flag("masked_decrypt_each_recovers_q")
    if mc["eavesdropping_neighbour"]["unmasked"]:
        flag("listening_neighbour_unmasks_reply", "eavesdropper")
    if mc["collusion"]["higher_unmasked"]:
        flag("colluders_unmask_beyond_the_inherent_case", "collusion")
    if not mc.get("scan", {}).get("clean", True):
        flag("plaintext_or_seed_on_wire", "eavesdropper")
    return out


def _sums_flags(sname: str, sc: dict) -> list:
    """Flags of the sums attacks (:mod:`.sums`): any exact recovery by a receiver of degree >= 2
    counts, not only a majority of its calls; a change of ``rho_int_i`` pinned to a neighbour."""
    out = []
    for d, b in (sc.get("sums") or {}).get("by_degree", {}).items():
        if b["exact_neighbour_values"]:
            out.append({"scenario": sname, "protocol": "masked (sums)", "agent": None, "view": "sums_only",
                        "flag": "sums_attack_recovers_neighbour_values", "neighbours": [], "degree": int(d),
                        "inherent": False, "count": b["exact_neighbour_values"]})
        if b["false_positives"]:
            out.append({"scenario": sname, "protocol": "masked (sums)", "agent": None, "view": "sums_only",
                        "flag": "sums_attack_certifies_a_wrong_value", "neighbours": [], "degree": int(d),
                        "inherent": False, "count": b["false_positives"]})
    sl = (sc.get("schedule_leak") or {}).get("all", {})
    if sl.get("attributed_correct"):
        out.append({"scenario": sname, "protocol": "masked (sums)", "agent": None, "view": "sums_only",
                    "flag": "rho_change_pinned_to_a_neighbour", "neighbours": [], "inherent": False,
                    "count": sl["attributed_correct"]})
    return out


def collect_flags(report: dict) -> list:
    """The report's flags. ``view``: ``honest_but_curious`` (the agent runs every attack on
    everything it receives), ``sums_only`` (``aggregated``: the agent decrypts only the two
    sums; such flags hold a fortiori for the honest-but-curious agent) or ``eavesdropper``.
    The sums-only flags carry the prefix ``sums_only_`` (``degree1_rho_reveals_penalty``
    excepted: it is about ``rho_i``, which every view sees)."""
    flags = []
    for sname, sc in report["scenarios"].items():
        for proto, pa in sc["protocols"].items():
            flags += _agent_flags(sname, proto, pa)
        if sc.get("masked_ciphertexts"):
            flags += _masked_flags(sname, sc["masked_ciphertexts"])
        flags += _sums_flags(sname, sc)
        flags += across_calls_flags(sname, sc.get("across_calls"))
        flags += across_calls_flags(sname, sc.get("across_calls_to_stop"), "any (run to its stop)")
        sec = sc.get("secagg") or {}
        if "messages" in sec:
            flags += secagg_flags(sname, sec["messages"])
            flags += across_calls_flags(sname, sec["across_calls"], "secagg")
        ev = sc.get("eavesdropper_plain")
        if ev and ev["all_recovered_exactly"]:
            flags.append({"scenario": sname, "protocol": "plain", "agent": None, "view": "eavesdropper",
                          "flag": "eavesdropper_reads_every_U", "neighbours": []})
    for proto, ev in report.get("eavesdropper_paillier", {}).items():
        for a in ev["agents"]:
            for f in a["flags"]:
                flags.append({"scenario": ev["scenario"], "protocol": f"paillier/{proto}", "agent": a["agent"],
                              "view": "eavesdropper", "flag": f, "neighbours": [], "inherent": False})
        if ev.get("masked_ciphertexts"):
            flags += _masked_flags(ev["scenario"], ev["masked_ciphertexts"])
    return flags


# ---------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------
def _fmt(v, spec=".3g"):
    if v is None:
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return format(v, spec)



def _md_flags(report: dict) -> list:
    lines = ["## Flags", ""]
    if not report["flags"]:
        lines.append("None.")
    else:
        lines += ["Agent `i -> [j, ...]`: agent `i` is flagged about its neighbours `j`. View "
                  "`honest_but_curious`: the agent runs every attack on everything it receives (under "
                  "`aggregated` it decrypts each neighbour's reply, which is under its own key); `sums_only`: "
                  "under `aggregated`, an agent that decrypts only the two sums the protocol asks for.", "",
                  "| scenario | protocol | view | flag | agents |", "|---|---|---|---|---|"]
        groups: dict = {}
        for f in report["flags"]:
            groups.setdefault((f["scenario"], f["protocol"], f.get("view", "-"), f["flag"]), []).append(f)
        for (sname, proto, view, flag), fs in groups.items():
            who = "; ".join(
                "all" if f["agent"] is None else
                f"{f['agent']} -> {f['neighbours']}" if f.get("neighbours") else str(f["agent"]) for f in fs)
            lines.append(f"| {sname} | {proto} | {view} | {flag} | {who} |")
    lines.append("")
    return lines


def _md_eavesdroppers(report: dict) -> list:
    lines = ["## Eavesdropper on every link", ""]
    for sname, sc in report["scenarios"].items():
        ev = sc.get("eavesdropper_plain")
        if ev:
            rec = [a["recovered_fraction"] for a in ev["agents"]]
            lines.append(f"- `plain`, {sname}: {ev['n_messages']} clear-text messages; every agent's `U` read "
                         f"back exactly at {min(rec):.0%} of the iterations (max relative error "
                         f"{max(a['rel_err_max'] or 0 for a in ev['agents']):.3g}).")
    for proto, ev in report.get("eavesdropper_paillier", {}).items():
        sc = ev["scan"]
        lines.append(
            f"- `paillier`, protocol `{proto}` ({ev['scenario']}, {ev['key_bits']}-bit keys, "
            f"{ev['slots_per_plaintext']} value(s) per plaintext, {ev['n_calls']} exchanges): {sc['n_messages']} messages, {sc['n_payload_integers']} integers on the wire; "
            f"{sc['n_plaintexts']} distinct plaintexts ({sc['n_values']} values, {sc['n_values_significant']} "
            f"of them with |v| > 2^16, and {sc['n_packed']} packed plaintexts) checked in "
            f"{sc['n_forms']} forms (value, mod n_k, mod n_k^2): **{sc['n_hits']} found**; "
            f"{sc['unobfuscated']} unobfuscated ciphertexts; {sc['repeated_ciphertexts']} repeated "
            f"ciphertexts; chance-match bound {_fmt(sc['chance_match_bound'], '.1e')}.")
        if ev.get("masked_ciphertexts"):
            lines += ["  - " + _md_masked_ciphertexts(ev["masked_ciphertexts"], ev["scenario"])[0]]
        de = ev.get("decrypt_each")
        if de:
            lines.append(
                f"  - `decrypt_each` on this real run: each agent decrypted its neighbours' "
                f"{de['penalty_messages']} penalty replies and {de['reply_messages']} step-5 replies one by one "
                f"with its own private key ({de['ciphertexts']} ciphertexts): penalties match `gamma_ji`: "
                f"{de['penalties_match']}; replies match `gamma_ji (q_j - q_i)`: {de['replies_match']}; `q_j` "
                f"recovered bit for bit at {de['q_exact']} of {de['informative']} informative (call, edge) pairs.")
    lines.append("")
    return lines


def _md_scenario_head(sname: str, sc: dict) -> list:
    g = sc["graph"]
    ps = sc["penalty_schedule"]
    return [f"## Scenario `{sname}`", "",
            f"{sc['iterations']['bcd_iters']} BCD x {sc['iterations']['x_iters']} ADMM iterations; "
            f"N = {g['n_agents']}, {len(g['edges'])} edges, degrees {g['degree']}; caps g_max = "
            f"{_fmt(sc['g_max']) if not isinstance(sc['g_max'], list) else [round(c, 4) for c in sc['g_max']]}; "
            f"final NMSE {sc['fit']['nmse']:.4f}, consensus {sc['fit']['consensus']:.3g}.", "",
            f"Penalty schedule: the first informative iteration is in BCD iteration "
            f"{ps['first_informative_bcd_iter']}; at {_fmt(ps['saturated_fraction_informative'], '.1%')} of "
            f"the informative (iteration, edge) pairs the integer penalty already equals its final value "
            f"(every penalty saturated from exchange call {ps['saturated_from_call']} on); final integer "
            f"penalties {ps['distinct_final_gammas']}.", ""]


def _md_protocol_summary(proto: str, pa: dict, names: list, so: bool) -> list:
    sm = pa["summary"]
    view = " (honest-but-curious: every attack)" if so else ""
    lines = [f"### Protocol `{proto}`", "",
             f"{sm['exact_recovery_pairs']} of {sm['pairs_informative']} (attacker, target) pairs: exact "
             f"recovery{view}; {sm['beats_baseline_pairs']} beat the baseline by 2x or more. Median relative "
             "error over pairs: " + ", ".join(f"{k} {_fmt(sm[f'{k}_rel_err_median'])}" for k in names)
             + ".", ""]
    if so:
        lines += [f"Sums only (an agent that decrypts only `S_int_i` and `rho_int_i`; attacks "
                  f"{', '.join(pa['views']['sums_only'])}): {sm['sums_only_exact_recovery_pairs']} of "
                  f"{sm['pairs_informative']} pairs recovered exactly, {sm['sums_only_beats_baseline_pairs']} "
                  f"beat the baseline by 2x or more; median relative error "
                  f"{_fmt(sm['sums_only_best_rel_err_median'])}.", ""]
    if proto == "paper":
        lines += [f"Direction of `U_j - U_i` from each decrypted message: minimum correlation "
                  f"{_fmt(sm['difference_direction_corr_min'], '.6f')}.", ""]
    return lines


def _md_pair_table(pa: dict, names: list, so: bool) -> list:
    extra = " sums-only exact | sums-only flags |" if so else ""
    head = "| i -> j | deg i | " + " | ".join(names) + " | best | exact | advantage | flags |" + extra
    lines = [head, "|" + "---|" * (len(names) + 6 + (2 if so else 0))]
    for p in pa["pairs"]:
        if not p.get("best_attack"):
            continue
        at = p["attacks"]
        row = [f"{p['attacker']} -> {p['target']}", str(p["attacker_degree"])]
        row += [_fmt(at[k]["rel_err_median"]) for k in names]
        row += [p["best_attack"], _fmt(at[p["best_attack"]]["exact_fraction"], ".2f"),
                _fmt(p["advantage"], ".3g"), ", ".join(p["flags"]) or "-"]
        if so:
            sp = p["sums_only"]
            row += [_fmt(at[sp["best_attack"]]["exact_fraction"], ".2f"), ", ".join(sp["flags"]) or "-"]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _md_agent_table(pa: dict, so: bool) -> list:
    extra = (" learns exactly (sums only) | exposed to (sums only, exact) | exposed to (sums only, "
             "partial) |") if so else ""
    lines = ["", "Per agent:", "", "| agent | degree | learns exactly | exposed to (exact) | "
             "exposed to (partial) | flags |" + extra, "|---|---|---|---|---|---|" + ("---|" * 3 if so else "")]
    for a in pa["agents"]:
        row = (f"| {a['agent']} | {a['degree']} | {a['learns_exactly'] or '-'} | "
               f"{a['exposed_to'] or '-'} | {a['partially_exposed_to'] or '-'} | "
               f"{', '.join(a['flags']) or '-'} |")
        if so:
            sa = a["sums_only"]
            row += (f" {sa['learns_exactly'] or '-'} | {sa['exposed_to'] or '-'} | "
                    f"{sa['partially_exposed_to'] or '-'} |")
        lines.append(row)
    return lines


def _md_per_bcd(pa: dict) -> list:
    pb = pa["per_bcd"]
    lines = ["", "Mean relative error over pairs, per BCD iteration:", "",
             "| BCD | " + " | ".join(k for k in pb) + " |", "|---|" + "---|" * len(pb)]
    for b in range(len(pb["baseline"])):
        lines.append(f"| {b + 1} | " + " | ".join(_fmt(pb[k][b]) for k in pb) + " |")
    lines.append("")
    return lines


def _md_protocol(proto: str, pa: dict) -> list:
    # the attacks the neighbour audit ran: the baseline, then the honest-but-curious view's
    names = ["baseline", *pa["views"]["honest_but_curious"]]
    so = "sums_only" in pa.get("views", {})
    return (_md_protocol_summary(proto, pa, names, so) + _md_pair_table(pa, names, so)
            + _md_agent_table(pa, so) + _md_by_degree(pa) + _md_per_bcd(pa))


def _md_by_degree(pa: dict) -> list:
    bd = pa["summary"].get("by_degree", {})
    if not bd:
        return []
    lines = ["", "By the attacker's degree (median relative error over pairs; exact: pairs recovered bit for bit "
             "at >= 50% of the informative iterations):", "",
             "| degree | pairs | exact | >= 2x better than baseline | best attack | baseline |", "|---|---|---|---|---|---|"]
    for d, v in bd.items():
        lines.append(f"| {d} | {v['pairs']} | {v['exact_recovery_pairs']} | {v['beats_baseline_pairs']} | "
                     f"{_fmt(v['best_rel_err_median'])} | {_fmt(v['baseline_rel_err_median'])} |")
    return lines


def _md_collusion(sc: dict) -> list:
    co = sc.get("collusion")
    if not co:
        return []
    sm = co["summary"]
    return [f"Two colluding agents `i`, `k`, both neighbours of `j` (masked protocol; they pool their sums, "
            f"their own terms and their seeds): {sm['triples']} triples, {sm['inherent_triples']} of them with "
            f"`j` the only neighbour left unaccounted for (the inherent case: {sm['exact_inherent']} recovered "
            f"exactly); of the others {sm['exact_other']} recovered exactly, median relative error "
            f"{_fmt(sm['rel_err_median_other'])} against the baseline's {_fmt(sm['baseline_rel_err_median_other'])}.",
            ""]


def _md_masked_ciphertexts(mc: dict, where: str) -> list:
    u, ind = mc["uniformity"], mc["independence"]
    de = mc["decrypt_each"]
    exact = sum(v["exact"] for v in de.values())
    inf = sum(v["informative"] for v in de.values())
    co, ea = mc["collusion"], mc["eavesdropping_neighbour"]

    def corr(c):
        return f"r = {_fmt(c['r'], '.4f')} (bound {_fmt(c['bound'], '.4f')}, N = {c['n']})"

    lines = [f"Real masked run ({where}): {mc['replies']['messages']} replies, {mc['replies']['ciphertexts']} "
             f"ciphertexts, each decrypted on its own with its receiver's key: uniform mod n (KS p = "
             f"{_fmt(u.get('ks_p'), '.3f')}, 16-bin chi-square p = {_fmt(u.get('chi2_p'), '.3f')}); correlation with "
             f"the first slot of `q_j` {corr(ind['slot_value'])}, with the unmasked term {corr(ind['unmasked_term'])}, "
             f"penalty replies with `rho_ij` {corr(ind['penalty'])} (99.9% bounds); {mc['plaintext_matches']} "
             f"decrypted values or slots equal to any of {mc['plaintexts_checked']} plaintexts; `decrypt_each` "
             f"recovers `q_j` at {exact} of {inf} informative (call, edge) pairs; a neighbour listening on a link "
             f"it is not on, with its pair seed (and, to measure, the receiver's key): {ea['unmasked']} of "
             f"{ea['checked']} replies unmasked; the receiver and one other neighbour pooling seeds: "
             f"{co['degree2_unmasked']} of {co['degree2_checked']} unmasked at degree 2 (inherent), "
             f"{co['higher_unmasked']} of {co['higher_checked']} at higher degrees."]
    scan = mc.get("scan")
    if scan:
        lines.append(f"  Its transcript: {scan['n_messages']} messages, {scan['n_plaintexts']} plaintexts and "
                     f"{scan['n_seeds']} seeds looked for: {scan['n_hits']} found; {scan['unobfuscated']} unobfuscated, "
                     f"{scan['repeated_ciphertexts']} repeated ciphertexts.")
    lines.append("")
    return lines


def _md_sums(sc: dict) -> list:
    su = sc.get("sums")
    if not su:
        return []
    r = su["rule"]
    lines = [f"Integer and lattice attacks on the two sums (`audit.sums`; the receiver's own draws, `q_i`, "
             f"`rho_int_i`, `S_int_i`, public bound x_max = {su['x_max']}; up to {su['max_calls'] or 'all'} "
             f"informative calls per receiver; self-certified: window > {r['window_min']:g}, |d| < "
             f"{r['d_fraction']:g} window, runner-up >= {r['runner_up']:g}x):", "",
             "| degree | receivers | calls | exact calls | exact values | pairs with any exact | certified "
             "(wrong) | penalties exact | sign agreement (baseline) | not tried |", "|---|---|---|---|---|---|---|---|---|---|"]
    for d, b in su["by_degree"].items():
        lines.append(f"| {d} | {b['receivers']} | {b['informative_calls']} | {b['exact_calls']} "
                     f"({_fmt(b['exact_fraction'], '.1%')}) | {b['exact_neighbour_values']} / {b['neighbour_values']} | "
                     f"{b['pairs_any_exact']} / {b['pairs']} | {b['certified']} ({b['false_positives']}) | "
                     f"{b['penalties_exact']} | {_fmt(b['sign_agreement'])} ({_fmt(b['sign_baseline'])}) | "
                     f"{b['calls_not_tried']} |")
    sl = sc.get("schedule_leak", {}).get("all")
    if sl:
        lines += ["", f"Changes of `rho_int_i` after BCD iteration 1: {sl['changes']} of {sl['calls']} receiver-calls; "
                  f"{sl['attributed']} pinned to one neighbour by divisibility, {sl['attributed_correct']} correctly."]
    lines.append("")
    return lines


def format_markdown(report: dict) -> str:
    """A human-readable rendering of :func:`~ppdnmf_torch.models.ppdnmf.audit.run_audit`'s report."""
    s = report["meta"]["settings"]
    lines = ["# Privacy audit", "",
             f"Created {report['meta']['created']} (torch {report['meta']['torch']}); "
             f"{s['bcd_iters']} BCD x {s['x_iters']} ADMM iterations, n_max = "
             f"{'per scenario' if s['n_max'] is None else format(s['n_max'], 'g')}, "
             f"g_bits = {s['g_bits']}, {s['key_bits']}-bit keys, seed {s['seed']}; "
             f"{report['meta'].get('seconds', 0):.1f} s.", "",
             "Relative error `||U_hat - U_j|| / ||U_j||`, median over the informative ADMM iterations "
             "(`q_j != q_i`). The baseline guesses `U_j := U_i` (what consensus reveals anyway); only "
             "error below it is leakage beyond the output. `exact` is the fraction of informative "
             "iterations at which the attack recovers the transmitted integers `q_j` bit for bit.", ""]
    lines += _md_flags(report)
    lines += _md_eavesdroppers(report)
    for sname, sc in report["scenarios"].items():
        lines += _md_scenario_head(sname, sc)
        for proto, pa in sc["protocols"].items():
            lines += _md_protocol(proto, pa)
        lines += _md_sums(sc)
        lines += _md_collusion(sc)
        if sc.get("masked_ciphertexts"):
            lines += _md_masked_ciphertexts(sc["masked_ciphertexts"], sname)
        lines += md_across_calls(sc.get("across_calls"), "every protocol that gives the sums")
        ts = sc.get("across_calls_to_stop")
        if ts:
            lines += md_across_calls(ts, f"the run to its stop: tol={ts['tol']:g}, {ts['bcd_iters_run']} BCD "
                                         f"iterations, {'stopped by the rule' if ts['stopped'] else 'at the cap'}")
        lines += md_secagg(sc.get("secagg"), sname)
    return "\n".join(lines) + "\n"
