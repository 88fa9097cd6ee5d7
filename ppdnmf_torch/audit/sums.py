"""The receiver's two sums under attack, on a recording (docs/THREAT_MODEL.md, "What the sums
reveal"): :func:`sums_audit` runs the attacks of :mod:`.attacks` (integer decomposition at
degree 2, lattice reduction at degree >= 3) on every receiver and informative call of a
:class:`~.recording.Recording`; :func:`schedule_audit` measures what the changes of
``rho_int_i`` reveal of the neighbours' penalties.
"""
from __future__ import annotations

import math
from math import gcd

import numpy as np

from ..penalties import cap_bounds
from .attacks import (D_FRACTION, LATTICE_MAX_DEGREE, RUNNER_UP, WINDOW_MIN, attack_degree2, attack_lattice,
                      diophantine2, lattice_available)
from .recording import Recording

__all__ = ["public_x_max", "sums_audit", "schedule_audit", "unequal_weights"]


def public_x_max(g_max, g_bits: int, schedule: str = "adaptive") -> int:
    """The public upper bound of a neighbour's integer penalty ``x_j = round(2^g_bits g_ji)``:
    the largest value the configured caps can reach under ``schedule``
    (:func:`~ppdnmf_torch.penalties.cap_bounds`: the caps themselves under ``"paper"``, up to
    :data:`~ppdnmf_torch.penalties.MAX_CAP_RATIO` times them under ``"adaptive"``)."""
    import torch

    caps = torch.as_tensor(np.atleast_1d(np.asarray(g_max, dtype=np.float64)))
    cap = float(cap_bounds(caps, schedule).max())
    return int(math.floor(cap * (1 << int(g_bits)) + 0.5))


# --------------------------------------------------------------------------- the audit
def _receiver_views(rec: Recording):
    """Per agent ``i``: its out-edges ``e`` (CSR order) and neighbours."""
    out = {}
    for i in range(rec.n_agents):
        e = np.flatnonzero(rec.src == i)
        out[i] = (e, rec.dst[e])
    return out


def _new_bucket():
    return {"receivers": 0, "informative_calls": 0, "exact_calls": 0, "exact_neighbour_values": 0,
            "neighbour_values": 0, "pairs": 0, "pairs_any_exact": 0, "certified": 0, "certified_correct": 0,
            "false_positives": 0, "penalties_exact": 0, "sign_agreement": [], "sign_baseline": [],
            "residue_bits": [], "calls_not_tried": 0, "searches_truncated": 0}


def _finish_bucket(b: dict) -> dict:
    inf = b["informative_calls"]
    out = {k: v for k, v in b.items() if not isinstance(v, list)}
    out["exact_fraction"] = b["exact_calls"] / inf if inf else None
    out["penalties_exact_fraction"] = b["penalties_exact"] / inf if inf else None
    for key in ("sign_agreement", "sign_baseline"):
        out[key] = float(np.mean(b[key])) if b[key] else None
    out["residue_bits_median"] = float(np.median(b["residue_bits"])) if b["residue_bits"] else None
    return out


def sums_audit(rec: Recording, *, x_max: int, lattice: bool | None = None, max_calls: int | None = None,
               min_degree: int = 2, lattice_max_degree: int = LATTICE_MAX_DEGREE) -> dict:
    """Run the sums attacks on every receiver of degree >= ``min_degree`` and every informative call.

    Parameters
    ----------
    rec : Recording
        An integer recording (the sums are the same under every protocol).
    x_max : int
        Public bound of the integer penalties (:func:`public_x_max`).
    lattice : bool, optional
        Run the lattice attack on receivers of degree 3 .. ``lattice_max_degree`` (default:
        when python-flint is installed).
    max_calls : int, optional
        Attack at most this many informative calls per receiver, evenly spread over the run
        (None: all); the fractions are over the calls attacked.

    Returns
    -------
    dict
        ``by_degree``: per receiver degree (str), ``receivers``, ``informative_calls`` (calls at
        which some neighbour's ``q_j`` differs from ``q_i``), ``exact_calls`` (every neighbour's
        ``q_j`` recovered bit for bit), ``exact_fraction``, ``exact_neighbour_values`` of
        ``neighbour_values``, ``pairs_any_exact`` of ``pairs`` (a pair counts if any call is
        exact), ``certified`` calls (the attacker's acceptance rule), ``certified_correct``,
        ``false_positives``, ``penalties_exact`` (calls whose chosen ``x`` equals the
        neighbours' penalties: they leak even when the values do not), partial leakage on the
        calls not recovered exactly: ``sign_agreement`` (sign of each recovered difference
        against the truth) next to ``sign_baseline`` (the sign of ``S_int_i``'s entry taken
        for every neighbour), ``residue_bits_median`` (degree 2: ``log2`` of the modulus to
        which each ``d_j`` is known once the penalties are), ``calls_not_tried`` (degree above
        :data:`LATTICE_MAX_DEGREE`, or no python-flint), ``searches_truncated`` (degree 2: more
        candidates than the attacker's budget :data:`SCREEN_FULL` could not be ruled out); and
        ``rule`` (the acceptance rule's constants), ``x_max``, ``lattice``, ``lattice_max_degree``.
    """
    rec.need_ints()
    if lattice is None:
        lattice = lattice_available()
    S_all, rho_all = rec.S_int, rec.rho_int
    views = _receiver_views(rec)
    buckets: dict = {}
    for i, (edges, nbrs) in views.items():
        k = len(edges)
        if k < min_degree:
            continue
        b = buckets.setdefault(str(k), _new_bucket())
        b["receivers"] += 1
        b["pairs"] += k
        any_exact = np.zeros(k, dtype=bool)
        d_true_all = rec.q[:, nbrs] - rec.q[:, i][:, None]
        info = np.flatnonzero((d_true_all != 0).any(axis=(1, 2)))
        if max_calls is not None and info.size > max_calls:
            info = info[np.unique(np.linspace(0, info.size - 1, max_calls).round().astype(np.int64))]
        for t in info:
            b["informative_calls"] += 1
            b["neighbour_values"] += k
            if k > 2 and not (lattice and k <= lattice_max_degree):
                b["calls_not_tried"] += 1
                continue
            a = rec.gamma[t, edges].tolist()
            attack = attack_degree2 if k == 2 else attack_lattice
            res = attack(a, int(rho_all[t, i]), S_all[t, i].tolist(), x_max)
            b["searches_truncated"] += int(not res.get("exhaustive", True))
            d_true = d_true_all[t]
            x_true = rec.gamma[t, rec.rev[edges]].tolist()
            if res["d"] is None:
                hit = np.zeros(k, dtype=bool)
            else:
                hit = np.array([list(map(int, d_true[j])) == list(map(int, res["d"][j])) for j in range(k)])
            exact = bool(hit.all())
            b["exact_calls"] += int(exact)
            b["exact_neighbour_values"] += int(hit.sum())
            any_exact |= hit
            if res["x"] is not None and list(res["x"]) == x_true:
                b["penalties_exact"] += 1
            if res["certified"]:
                b["certified"] += 1
                b["certified_correct"] += int(exact)
                b["false_positives"] += int(not exact)
            if not exact:
                nz = d_true != 0
                if res["d"] is not None:
                    dh = np.array(res["d"], dtype=np.float64)
                    b["sign_agreement"].append(float((np.sign(dh)[nz] == np.sign(d_true)[nz]).mean()))
                Srow = np.sign(S_all[t, i].astype(np.float64))[None, :].repeat(k, 0)
                b["sign_baseline"].append(float((Srow[nz] == np.sign(d_true)[nz]).mean()))
                if k == 2:
                    w1, w2 = a[0] * x_true[0], a[1] * x_true[1]
                    g = gcd(w1, w2)
                    if len(diophantine2(a[0], a[1], int(rho_all[t, i]), x_max)) == 1:
                        b["residue_bits"].append(math.log2(max(min(w1, w2) // g, 1)))
        b["pairs_any_exact"] += int(any_exact.sum())
    return {"by_degree": {d: _finish_bucket(v) for d, v in sorted(buckets.items(), key=lambda kv: int(kv[0]))},
            "rule": {"window_min": WINDOW_MIN, "d_fraction": D_FRACTION, "runner_up": RUNNER_UP},
            "x_max": int(x_max), "lattice": bool(lattice), "max_calls": max_calls,
            "lattice_max_degree": int(lattice_max_degree)}


def unequal_weights(rec: Recording) -> dict:
    """Informative calls (some neighbour's ``q_j != q_i``) of receivers of degree >= 2, summed over
    the receivers, and of those the calls at which the receiver's weights ``gamma_ij gamma_ji`` are
    not all equal (what the attacks above need): ``{"informative_calls", "unequal_weights"}``."""
    rec.need_ints()
    w = rec.w
    tot = uneq = 0
    for i in range(rec.n_agents):
        e = np.flatnonzero(rec.src == i)
        if len(e) < 2:
            continue
        info = (rec.q[:, rec.dst[e]] != rec.q[:, i][:, None]).any(axis=(1, 2))
        tot += int(info.sum())
        uneq += int((info & (w[:, e].min(1) != w[:, e].max(1))).sum())
    return {"informative_calls": tot, "unequal_weights": uneq}


def schedule_audit(rec: Recording, *, x_max: int) -> dict:
    """What the changes of ``rho_int_i`` reveal of the neighbours' penalties.

    For every receiver and pair of consecutive calls after BCD iteration 1 (``t - 1, t`` in
    the same run): a *change* is ``rho_int_i`` moving; when the receiver's own draws did not
    move, ``delta = sum_j a_j dx_j``, and when exactly one neighbour ``j`` has ``a_j | delta``
    with ``|delta / a_j| <= x_max`` the receiver *attributes* the change to ``j`` with the
    increment ``delta / a_j``; the attribution is correct when ``j``'s penalty moved by exactly
    that and no other neighbour's moved.

    Returns
    -------
    dict
        Per receiver degree (str) and ``"all"``: ``changes``, ``own_draws_fixed`` (changes at
        which the receiver's own draws did not move), ``attributed``, ``attributed_correct``.
    """
    rec.need_ints()
    rho = rec.rho_int
    out: dict = {}
    views = _receiver_views(rec)
    later = np.flatnonzero(rec.bcd[1:] >= 2) + 1  # call t >= 1 of BCD iteration >= 2, against call t - 1
    for i, (edges, _) in views.items():
        k = len(edges)
        if k == 0:
            continue
        b = out.setdefault(str(k), {"receivers": 0, "calls": 0, "changes": 0, "own_draws_fixed": 0,
                                    "attributed": 0, "attributed_correct": 0})
        b["receivers"] += 1
        for t in later:
            b["calls"] += 1
            delta = int(rho[t, i]) - int(rho[t - 1, i])
            if delta == 0:
                continue
            b["changes"] += 1
            a_now, a_prev = rec.gamma[t, edges], rec.gamma[t - 1, edges]
            if (a_now != a_prev).any():
                continue
            b["own_draws_fixed"] += 1
            a = a_now.tolist()
            cands = [j for j in range(k) if delta % a[j] == 0 and abs(delta // a[j]) <= x_max]
            if len(cands) != 1:
                continue
            j = cands[0]
            b["attributed"] += 1
            dx = (rec.gamma[t, rec.rev[edges]] - rec.gamma[t - 1, rec.rev[edges]]).tolist()
            b["attributed_correct"] += int(dx[j] == delta // a[j] and all(v == 0 for m, v in enumerate(dx) if m != j))
    tot = {key: sum(v[key] for v in out.values()) for key in ("receivers", "calls", "changes", "own_draws_fixed",
                                                                "attributed", "attributed_correct")}
    return {"by_degree": dict(sorted(out.items(), key=lambda kv: int(kv[0]))), "all": tot}
