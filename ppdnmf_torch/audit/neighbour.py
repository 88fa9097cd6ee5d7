"""(b) The honest-but-curious neighbour: the attacks an agent ``i`` runs on what it receives
to reconstruct each neighbour's ``U_j``, their metrics, and :func:`neighbour_audit`.

The attacks run on a :class:`~ppdnmf_torch.audit.recording.Recording` of the integer
protocol; :func:`decrypt_individual_replies` checks on a real Paillier transcript that
decrypting each reply under the receiver's own key gives exactly the integers modelled.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from .masked import MASKED_ATTACKS, masked_attacks
from .recording import Recording
from .report import DIRECTION_CORR, exposure, judge

__all__ = [
    "paper_attacks",
    "aggregated_attacks",
    "decrypt_individual_replies",
    "decrypt_each_check",
    "neighbour_audit",
    "ATTACKS",
    "SUMS_ONLY_ATTACKS",
]

#: attacks per protocol (``baseline`` first): what an honest-but-curious agent can run
ATTACKS = {
    "paper": ("baseline", "gcd", "rho_split", "smooth_ls"),
    "aggregated": ("baseline", "decrypt_each", "nbr_mean"),
    # what the receiver can do with its sums; that each reply decrypted on its own carries
    # nothing is measured on real ciphertexts (audit.masked.masked_ciphertext_audit)
    "masked": MASKED_ATTACKS,
    # secagg's receiver obtains sum_j q_j (= A_i / w under the agreed schedule): the same attacks;
    # its messages are measured on the wire (audit.secagg.secagg_message_audit)
    "secagg": MASKED_ATTACKS,
}
#: the attacks open to an agent that decrypts only what the protocol tells it to (under
#: ``aggregated``: the two sums); reported as the pair's ``"sums_only"`` view
SUMS_ONLY_ATTACKS = {"aggregated": ("nbr_mean",)}


def _gcd_scales(d: np.ndarray) -> np.ndarray:
    """Per call and edge, the gcd attack's estimate of ``gamma_ji`` from ``d (T, 2E, P)``.

    ``gcd(d) = gamma_ji * gcd(q_j - q_i)``; a gcd above a later one (the true penalty is
    non-decreasing, so it is at most every later gcd) is cut to its largest divisor that
    fits. 0 where the message is all zeros (nothing to learn from it).
    """
    G = np.gcd.reduce(np.abs(d), axis=-1)  # (T, 2E)
    est = G.copy()
    T = G.shape[0]
    big = np.iinfo(np.int64).max
    suffix = np.full(G.shape[1], big, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        for e in np.nonzero((G[t] > suffix) & (G[t] > 0))[0]:
            g, cap = int(G[t, e]), int(suffix[e])
            est[t, e] = max((k for k in _divisors(g) if k <= cap), default=0)
        pos = G[t] > 0
        suffix = np.where(pos, np.minimum(suffix, est[t]), suffix)
    return est


def _divisors(n: int) -> list:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in small]


def _smooth_scale(d: np.ndarray, qi: np.ndarray, bcd: np.ndarray, info: np.ndarray) -> np.ndarray:
    """``a = 1 / gamma_ji`` per edge: ``min_a sum_m ||a (d^m - d^(m-1)) + (q_i^m - q_i^(m-1))||^2``
    over consecutive informative calls of the same BCD iteration (``U_j`` assumed to move
    less than ``U_i``; one constant scale, the penalty having saturated at its cap)."""
    dd = np.diff(d.astype(np.float64), axis=0)  # (T-1, 2E, P)
    dq = np.diff(qi.astype(np.float64), axis=0)
    ok = (bcd[1:] == bcd[:-1])[:, None] & info[1:] & info[:-1]  # (T-1, 2E)
    num = -np.where(ok, (dd * dq).sum(-1), 0.0).sum(0)
    den = np.where(ok, (dd * dd).sum(-1), 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = num / den
    return np.where(np.isfinite(a) & (a > 0), a, np.nan)


def paper_attacks(rec: Recording) -> dict:
    """Estimates ``U_hat (T, 2E, P)`` of ``U_j`` by agent ``i`` for every directed edge ``i -> j``,
    from what ``i`` sees under ``protocol="paper"``; keys :data:`ATTACKS`\\ ``["paper"]``."""
    rec.need_ints()
    n_max = rec.n_max
    qi = rec.q[:, rec.src]  # (T, 2E, P), the attacker's own
    d = rec.replies
    out = {"baseline": rec.U[:, rec.src]}
    # rho_split: gamma_ji ~ rho_int_i / sum_k gamma_ik
    own = np.zeros((rec.n_calls, rec.n_agents), dtype=np.int64)
    np.add.at(own, (slice(None), rec.src), rec.gamma)
    own_e = own[:, rec.src].astype(np.float64)
    rho_e = rec.rho_int[:, rec.src].astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(own_e > 0, rho_e / own_e, 0.0)
        out["rho_split"] = np.where(scale[..., None] > 0, (qi + d / np.where(scale > 0, scale, 1.0)[..., None]),
                                    qi) / n_max
    info = (d != 0).any(-1)
    a = _smooth_scale(d, qi, rec.bcd, info)  # (2E,)
    a = np.where(np.isnan(a), 0.0, a)
    out["smooth_ls"] = (qi + a[None, :, None] * d) / n_max
    gam = _gcd_scales(d)
    exact = np.where(gam[..., None] > 0, d // np.where(gam > 0, gam, 1)[..., None], 0)
    out["gcd"] = (qi + exact) / n_max
    return out


def aggregated_attacks(rec: Recording) -> dict:
    """Estimates ``U_hat (T, 2E, P)`` of ``U_j`` by ``i`` under ``protocol="aggregated"``;
    keys :data:`ATTACKS`\\ ``["aggregated"]``.

    ``decrypt_each`` (honest-but-curious): ``i`` decrypts each reply under its own key,
    ``gamma_ji`` (step 1) and ``d_ij = gamma_ji (q_j - q_i)`` (step 5), and divides:
    ``q_j = q_i + d_ij / gamma_ji``, exact (``gamma_ji`` divides ``d_ij``); where
    ``gamma_ji = 0`` the reply is zero and the guess stays ``q_i``.
    ``nbr_mean`` (sums only): the penalty-weighted neighbourhood mean from ``S_int_i`` and
    ``rho_int_i``.
    """
    rec.need_ints()
    S = rec.S_int[:, rec.src]  # (T, 2E, P): i's view, repeated for each of its neighbours
    rho = rec.rho_int[:, rec.src][..., None]
    qi = rec.q[:, rec.src]
    with np.errstate(invalid="ignore", divide="ignore"):
        # (S + rho q_i) / rho, computed as q_i + S / rho to stay far from int64 limits
        exact = (S % np.where(rho > 0, rho, 1) == 0)
        mean = np.where(exact, qi + S // np.where(rho > 0, rho, 1), qi + S / np.where(rho > 0, rho, 1))
    gam = rec.penalty_replies  # (T, 2E): E_i(gamma_ji) decrypted
    d = rec.replies  # (T, 2E, P): E_i(gamma_ji (q_j - q_i)) decrypted
    pos = gam > 0
    each = np.where(pos[..., None], qi + d // np.where(pos, gam, 1)[..., None], qi)
    return {"baseline": rec.U[:, rec.src], "decrypt_each": each / rec.n_max,
            "nbr_mean": np.where(rho > 0, mean, qi) / rec.n_max}


def _signed(residue: int, n: int) -> int:
    """The signed integer a residue mod ``n`` stands for (negatives are encrypted as ``v + n``)."""
    r = int(residue) % n
    return r - n if r > n // 2 else r


def decrypt_individual_replies(rec: Recording, private_keys) -> dict:
    """Decrypt every reply of a recorded ``paillier`` run on its own, as its receiver can.

    Every ``enc_penalty`` (step 1, ``E_i(gamma_ji)``) and ``enc_reply`` (step 5,
    ``E_i(gamma_ji (q_j - q_i))``) that neighbour ``j`` sends to ``i`` is under ``i``'s public
    key; ``i`` holds the private key, so nothing stops it from decrypting each one before
    it multiplies them into the sums. This function does exactly that with the agents'
    private keys (a test or an audit that made the keys; :func:`~ppdnmf_torch.models.ppdnmf.audit.record_fit` with
    ``keypairs``), unpacking packed plaintexts with the recording's slot layout.

    Parameters
    ----------
    rec : Recording
        Of ``kind="paillier"`` (the transcript is recorded).
    private_keys : sequence
        One per node, in node order: ``phe`` private keys or ``(public, private)`` pairs.

    Returns
    -------
    dict
        ``penalty`` ``(T, 2E)`` int64 and ``reply`` ``(T, 2E, P)`` int64: the plaintexts per
        recorded call and directed edge ``i -> j`` (what ``i`` decrypted from ``j``; 0 where
        nothing was received), ``penalty_seen`` / ``reply_seen`` ``(T, 2E)`` bool (a message
        was decrypted there), ``n_penalty_messages``, ``n_reply_messages`` and
        ``n_ciphertexts`` decrypted. Under ``protocol="aggregated"`` these equal
        :attr:`Recording.penalty_replies` and :attr:`Recording.replies`.
    """
    if rec.kind != "paillier":
        raise ConfigError("decrypt_individual_replies: needs a recording of exchange='paillier'")
    rec.need_ints()
    by_n = {}
    for k in private_keys:
        sk = k[1] if isinstance(k, (tuple, list)) else k
        by_n[int(sk.public_key.n)] = sk
    missing = [i for i, n in enumerate(rec.moduli) if int(n) not in by_n]
    if missing:
        raise ConfigError(f"decrypt_individual_replies: no private key for nodes {missing}")
    T, P = rec.n_calls, rec.q.shape[-1]
    call = {(int(b), int(a)): t for t, (b, a) in enumerate(zip(rec.bcd, rec.admm))}
    edge = {(int(i), int(j)): e for e, (i, j) in enumerate(zip(rec.src, rec.dst))}
    E = len(rec.src)
    penalty = np.zeros((T, E), dtype=np.int64)
    reply = np.zeros((T, E, P), dtype=np.int64)
    pen_seen = np.zeros((T, E), dtype=bool)
    rep_seen = np.zeros((T, E), dtype=bool)
    n_pen = n_rep = n_ct = 0
    layout = rec.layout
    for msg in rec.transcript:
        if msg.kind not in ("enc_penalty", "enc_reply"):
            continue
        t = call.get((int(msg.bcd_iter), int(msg.admm_iter)))
        if t is None:
            continue
        i, j = int(msg.receiver), int(msg.sender)  # j's reply to i, under i's key
        e = edge[(i, j)]
        n = int(rec.moduli[i])
        sk = by_n[n]
        residues = [sk.raw_decrypt(int(c)) for c in msg.payload]
        n_ct += len(residues)
        if msg.kind == "enc_penalty":
            penalty[t, e] = _signed(residues[0], n)
            pen_seen[t, e] = True
            n_pen += 1
        else:
            if layout is not None:
                vals = layout.unpack(residues, n, P)
            else:
                vals = [_signed(r, n) for r in residues]
            reply[t, e] = vals
            rep_seen[t, e] = True
            n_rep += 1
    return {"penalty": penalty, "reply": reply, "penalty_seen": pen_seen, "reply_seen": rep_seen,
            "n_penalty_messages": n_pen, "n_reply_messages": n_rep, "n_ciphertexts": n_ct}


def _rowcorr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis (NaN where either side is constant)."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(-1) / den, np.nan)


def _nanstat(fn, x):
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    return float(fn(x)) if x.size else None


def _attack_metrics(U_hat, rec: Recording, info: np.ndarray, e: int) -> dict:
    """Metrics of one attack on one directed edge over the informative calls ``info (T,)``."""
    i, j = int(rec.src[e]), int(rec.dst[e])
    idx = np.nonzero(info)[0]
    Ut, Ui, Uh = rec.U[idx, j], rec.U[idx, i], U_hat[idx, e]
    rel = np.linalg.norm(Uh - Ut, axis=-1) / np.maximum(np.linalg.norm(Ut, axis=-1), 1e-300)
    pear = _rowcorr(Uh, Ut)
    dcor = _rowcorr(Uh - Ui, Ut - Ui)
    exact = np.all(np.rint(Uh * rec.n_max).astype(np.int64) == rec.q[idx, j], axis=-1)
    bcd = rec.bcd[idx]
    per_bcd = []
    for b in range(1, int(rec.bcd.max()) + 1):
        sel = bcd == b
        per_bcd.append(float(rel[sel].mean()) if sel.any() else None)
    first = next((v for v in per_bcd if v is not None), None)
    return {
        "rel_err_median": _nanstat(np.median, rel),
        "rel_err_mean": _nanstat(np.mean, rel),
        "rel_err_max": _nanstat(np.max, rel),
        "rel_err_early": first,
        "rel_err_final": float(rel[-1]) if rel.size else None,
        "pearson_median": _nanstat(np.median, pear),
        "diff_corr_median": _nanstat(np.median, dcor),
        "exact_fraction": float(exact.mean()) if exact.size else None,
        "per_bcd_rel_err": per_bcd,
    }


def decrypt_each_check(rec: Recording, private_keys) -> dict:
    """The ``decrypt_each`` attack on a real ``aggregated`` Paillier run.

    Decrypts every reply on its own with its receiver's key
    (:func:`decrypt_individual_replies`), checks the plaintexts against the recording
    (``gamma_ji`` and ``gamma_ji (q_j - q_i)``: the integers the neighbour audit models), and
    recovers ``q_j = q_i + d_ij / gamma_ji`` from the decrypted values alone.

    Returns ``{"penalty_messages", "reply_messages", "ciphertexts", "penalties_match",
    "replies_match", "informative", "q_exact"}``: ``informative`` counts the (call, directed
    edge) pairs with ``q_j != q_i`` and a reply received, ``q_exact`` those at which ``q_j``
    came out bit for bit.
    """
    got = decrypt_individual_replies(rec, private_keys)
    pen_seen, rep_seen = got["penalty_seen"], got["reply_seen"]
    gam, d = got["penalty"], got["reply"]
    qi, qj = rec.q[:, rec.src], rec.q[:, rec.dst]
    pos = pen_seen & rep_seen & (gam > 0)
    q_hat = np.where(pos[..., None], qi + d // np.where(pos, gam, 1)[..., None], qi)
    info = rep_seen & (qj != qi).any(-1)
    return {
        "penalty_messages": got["n_penalty_messages"], "reply_messages": got["n_reply_messages"],
        "ciphertexts": got["n_ciphertexts"],
        "penalties_match": bool(pen_seen.any() and np.array_equal(gam[pen_seen], rec.penalty_replies[pen_seen])),
        "replies_match": bool(rep_seen.any() and np.array_equal(d[rep_seen], rec.replies[rep_seen])),
        "informative": int(info.sum()),
        "q_exact": int((info & (q_hat == qj).all(-1)).sum()),
    }



def _pair_entry(rec: Recording, protocol: str, est: dict, e: int, info: np.ndarray, dcorr: np.ndarray,
                qerr: np.ndarray, sums_only: list) -> dict:
    """One directed edge ``attacker i -> target j``: every attack's metrics over the
    informative calls ``info (T,)``, the verdict and the flags; ``dcorr (T,)`` is the
    correlation of each message with ``U_j - U_i``, ``qerr (T, N)`` the quantization error."""
    deg = rec.degree
    i, j = int(rec.src[e]), int(rec.dst[e])
    n_info = int(info.sum())
    entry = {"attacker": i, "target": j, "attacker_degree": int(deg[i]), "informative_calls": n_info,
             "attacks": {}, "flags": []}
    if n_info == 0:
        entry["best_attack"] = None
        return entry
    for name in ATTACKS[protocol]:
        entry["attacks"][name] = _attack_metrics(est[name], rec, info, e)
    verdict = judge(entry["attacks"], [k for k in ATTACKS[protocol] if k != "baseline"])
    entry["best_attack"] = verdict["best_attack"]
    entry["advantage"] = verdict["advantage"]
    entry["quantization_rel_err_median"] = _nanstat(np.median, qerr[info, j])
    final_gamma = rec.gamma[-1]
    entry["penalty_saturated_fraction"] = float((rec.gamma[info, rec.rev[e]] == final_gamma[rec.rev[e]]).mean())
    if protocol == "paper":
        dc = dcorr[info]
        entry["difference_direction_corr_min"] = _nanstat(np.min, dc)
        entry["difference_direction_corr_median"] = _nanstat(np.median, dc)
        if entry["difference_direction_corr_min"] is not None and entry["difference_direction_corr_min"] >= DIRECTION_CORR:
            entry["flags"].append("difference_direction_exact")
    entry["flags"] += verdict["flags"]
    if deg[i] == 1:
        entry["flags"].append("degree1_rho_reveals_penalty")
    if sums_only:
        so = judge(entry["attacks"], sums_only)
        if deg[i] == 1:
            so["flags"].append("degree1_rho_reveals_penalty")
        entry["sums_only"] = so
    return entry


def _agent_entry(a: int, deg: np.ndarray, pairs: list, sums_only: list) -> dict:
    """Agent ``a``: its degree, neighbours and flags as attacker, whom it learns and to whom it is exposed."""
    mine = [p for p in pairs if p["attacker"] == a]
    against = [p for p in pairs if p["target"] == a]
    flags = sorted({f for p in mine for f in p["flags"]})
    if deg[a] == 1:
        flags = sorted(set(flags) | {"degree1"})
    agent = {"agent": a, "degree": int(deg[a]), "neighbours": sorted(int(p["target"]) for p in mine),
             "flags": flags, **exposure(mine, against, lambda p: p["flags"])}
    if sums_only:
        so_flags = sorted({f for p in mine if "sums_only" in p for f in p["sums_only"]["flags"]})
        if deg[a] == 1:
            so_flags = sorted(set(so_flags) | {"degree1"})
        agent["sums_only"] = {"flags": so_flags,
                              **exposure(mine, against, lambda p: p.get("sums_only", {}).get("flags", []))}
    return agent


def _per_bcd_curves(rec: Recording, pairs: list, protocol: str) -> dict:
    """Mean relative error over the scored pairs per BCD iteration: the baseline's, the best
    attack's (each pair's own) and every attack's."""
    nb = int(rec.bcd.max())
    per_bcd = {"baseline": [], "best": []}
    for b in range(nb):
        for key in per_bcd:
            vals = []
            for p in pairs:
                if p.get("best_attack") is None:
                    continue
                name = "baseline" if key == "baseline" else p["best_attack"]
                v = p["attacks"][name]["per_bcd_rel_err"][b]
                if v is not None:
                    vals.append(v)
            per_bcd[key].append(float(np.mean(vals)) if vals else None)
    for name in ATTACKS[protocol]:
        if name == "baseline":
            continue
        per_bcd[name] = []
        for b in range(nb):
            vals = [p["attacks"][name]["per_bcd_rel_err"][b] for p in pairs if p.get("best_attack")]
            vals = [v for v in vals if v is not None]
            per_bcd[name].append(float(np.mean(vals)) if vals else None)
    return per_bcd


def _summary(pairs: list, protocol: str, sums_only: list) -> dict:
    """Counts of flagged pairs and median errors over the scored pairs."""
    scored = [p for p in pairs if p.get("best_attack")]
    summary = {
        "pairs": len(pairs),
        "pairs_informative": len(scored),
        "exact_recovery_pairs": sum("exact_recovery" in p["flags"] for p in scored),
        "beats_baseline_pairs": sum("beats_baseline" in p["flags"] for p in scored),
        "baseline_rel_err_median": _nanstat(np.median, [p["attacks"]["baseline"]["rel_err_median"] for p in scored]),
        "best_rel_err_median": _nanstat(np.median, [p["attacks"][p["best_attack"]]["rel_err_median"] for p in scored]),
    }
    for name in ATTACKS[protocol]:
        summary[f"{name}_rel_err_median"] = _nanstat(
            np.median, [p["attacks"][name]["rel_err_median"] for p in scored])
        summary[f"{name}_exact_fraction_mean"] = _nanstat(
            np.mean, [p["attacks"][name]["exact_fraction"] for p in scored])
    if protocol == "paper":
        summary["difference_direction_corr_min"] = _nanstat(
            np.min, [p["difference_direction_corr_min"] for p in scored])
    by_degree: dict = {}
    for p in scored:
        by_degree.setdefault(p["attacker_degree"], []).append(p)
    summary["by_degree"] = {
        str(d): {"pairs": len(ps), "exact_recovery_pairs": sum("exact_recovery" in p["flags"] for p in ps),
                 "beats_baseline_pairs": sum("beats_baseline" in p["flags"] for p in ps),
                 "baseline_rel_err_median": _nanstat(np.median, [p["attacks"]["baseline"]["rel_err_median"]
                                                                 for p in ps]),
                 "best_rel_err_median": _nanstat(np.median, [p["attacks"][p["best_attack"]]["rel_err_median"]
                                                             for p in ps])}
        for d, ps in sorted(by_degree.items())}
    summary["exact_recovery_pairs_degree1"] = sum("exact_recovery" in p["flags"] for p in scored
                                                  if p["attacker_degree"] == 1)
    summary["exact_recovery_pairs_degree2plus"] = sum("exact_recovery" in p["flags"] for p in scored
                                                      if p["attacker_degree"] >= 2)
    if sums_only:
        summary["sums_only_exact_recovery_pairs"] = sum("exact_recovery" in p["sums_only"]["flags"] for p in scored)
        summary["sums_only_beats_baseline_pairs"] = sum("beats_baseline" in p["sums_only"]["flags"] for p in scored)
        summary["sums_only_best_rel_err_median"] = _nanstat(
            np.median, [p["attacks"][p["sums_only"]["best_attack"]]["rel_err_median"] for p in scored])
    return summary


def neighbour_audit(rec: Recording, protocol: str) -> dict:
    """What every agent learns about each neighbour's ``U_j`` under ``protocol``.

    Returns a dict with ``pairs`` (one per directed edge ``attacker -> target``: every
    attack's metrics, the best attack, flags), ``agents`` (per agent: degree, neighbours,
    flags as attacker, ``exposed_to``), ``per_bcd`` (mean relative error of the baseline and
    of the best attack per BCD iteration, over pairs) and ``summary``.
    """
    if protocol not in ATTACKS:
        raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {tuple(ATTACKS)}")
    rec.need_ints()
    est = {"paper": paper_attacks, "aggregated": aggregated_attacks, "masked": masked_attacks,
           "secagg": masked_attacks}[protocol](rec)
    sums_only = list(SUMS_ONLY_ATTACKS.get(protocol, ()))
    diff_q = rec.q[:, rec.dst] - rec.q[:, rec.src]
    info_all = (diff_q != 0).any(-1)  # (T, 2E)
    dcorr_msg = _rowcorr(rec.replies.astype(np.float64), rec.U[:, rec.dst] - rec.U[:, rec.src])
    qerr = np.linalg.norm(rec.q / rec.n_max - rec.U, axis=-1) / np.maximum(np.linalg.norm(rec.U, axis=-1), 1e-300)
    pairs = [_pair_entry(rec, protocol, est, e, info_all[:, e], dcorr_msg[:, e], qerr, sums_only)
             for e in range(len(rec.src))]
    deg = rec.degree
    agents = [_agent_entry(a, deg, pairs, sums_only) for a in range(rec.n_agents)]
    views = {"honest_but_curious": [k for k in ATTACKS[protocol] if k != "baseline"]}
    if sums_only:
        views["sums_only"] = sums_only
    return {"protocol": protocol, "views": views, "pairs": pairs, "agents": agents,
            "per_bcd": _per_bcd_curves(rec, pairs, protocol), "summary": _summary(pairs, protocol, sums_only)}
