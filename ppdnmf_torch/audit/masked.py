"""The masked protocol under audit: what a curious receiver, two colluders and a neighbour on a
link it is not on can get (docs/THREAT_MODEL.md).

* :func:`masked_attacks` (on any integer :class:`~.recording.Recording`): under
  ``protocol="masked"`` agent ``i`` obtains ``A_i = sum_j rho_ij q_j`` and ``rho_int_i``, and
  nothing else that depends on its neighbours (every reply is uniform on its own:
  :func:`masked_ciphertext_audit` measures that on real ciphertexts); what integer arithmetic
  computes from those two sums when the weights are unequal is :mod:`.sums`'. The attacks here
  (real-valued) use the sums of
  the whole run: ``nbr_mean`` (``A_i / rho_int_i``, the penalty-weighted neighbour mean; exact
  for a single neighbour) and ``trajectory`` (degree-2 receivers: the split of the mean between
  the two neighbours fitted across ADMM iterations, assuming the other neighbour moves like
  ``i`` itself and the target smoothly).
* :func:`collusion_audit`: two agents ``i`` and ``k`` that are both neighbours of ``j`` pool
  what they know (their sums, their own terms, their seeds).
* :func:`masked_ciphertext_audit` (on a real ``paillier`` recording of ``protocol="masked"``,
  with the keys and the seeds the audit made or watched): every reply decrypted on its own
  with its receiver's key, its uniformity and its correlation with ``q_j`` (with a confidence
  bound), the ``decrypt_each`` attack on it, a neighbour ``k`` of ``i`` that listens on the
  link ``j -> i`` and strips its own pair mask, and ``i`` with ``k`` (seeds pooled).
* :func:`record_seeds`: watch the seeds the exchange draws (the audit's view; the seeds never
  leave their agents otherwise), and :func:`tag_seeds`, which names them.
"""
from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np

from ..errors import ConfigError
from .recording import Recording

__all__ = ["masked_attacks", "collusion_audit", "masked_ciphertext_audit", "record_seeds", "tag_seeds",
           "CONFIDENCE_Z", "MASKED_ATTACKS", "independence_test", "uniformity_test"]

#: the attacks on the masked protocol's sums (``baseline`` first)
MASKED_ATTACKS = ("baseline", "nbr_mean", "trajectory")
#: two-sided 99.9% normal quantile: the bound ``CONFIDENCE_Z / sqrt(N)`` on a correlation of
#: ``N`` independent pairs (so that the audit's many tests rarely cross it by chance)
CONFIDENCE_Z = 3.29


# --------------------------------------------------------------------------- the sums
def _sums(rec: Recording):
    """``A (T, N, P)`` and ``rho (T, N)`` int64: what each agent decrypts under ``masked``."""
    rec.need_ints()
    w = rec.w
    A = np.zeros(rec.q.shape, dtype=np.int64)
    np.add.at(A, (slice(None), rec.src), w[:, :, None] * rec.q[:, rec.dst])
    return A, rec.rho_int


def _mean_estimate(num, den, fallback):
    """``num / den`` (exact integer division where it divides, else float), ``fallback`` where ``den = 0``."""
    den3 = den[..., None]
    safe = np.where(den3 > 0, den3, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = num % safe == 0
        est = np.where(exact, num // safe, num / safe)
    return np.where(den3 > 0, est, fallback)


def _trajectory(rec: Recording, mean: np.ndarray) -> np.ndarray:
    """Degree-2 receivers: ``q_hat = q_i + a (mean - q_i)`` with ``a >= 1`` fitted per edge by least
    squares on the roughness of ``q_hat`` across consecutive ADMM iterations (the other
    neighbour assumed to move like ``i``); other receivers keep the mean."""
    qi = rec.q[:, rec.src].astype(np.float64)
    z = mean - qi
    dz, dq = np.diff(z, axis=0), np.diff(qi, axis=0)
    ok = (rec.bcd[1:] == rec.bcd[:-1])[:, None] & (z[1:] != 0).any(-1) & (z[:-1] != 0).any(-1)
    num = -np.where(ok, (dz * dq).sum(-1), 0.0).sum(0)
    den = np.where(ok, (dz * dz).sum(-1), 0.0).sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        a = num / den
    a = np.where(np.isfinite(a), np.maximum(a, 1.0), 1.0)
    deg2 = rec.degree[rec.src] == 2
    a = np.where(deg2, a, 1.0)
    return qi + a[None, :, None] * z


def masked_attacks(rec: Recording) -> dict:
    """Estimates ``U_hat (T, 2E, P)`` of ``U_j`` by agent ``i`` under ``protocol="masked"``; keys
    :data:`MASKED_ATTACKS` (module docstring)."""
    A, rho = _sums(rec)
    qi = rec.q[:, rec.src]
    mean = _mean_estimate(A[:, rec.src], rho[:, rec.src], qi)  # the penalty-weighted neighbour mean
    return {"baseline": rec.U[:, rec.src], "nbr_mean": mean / rec.n_max,
            "trajectory": _trajectory(rec, mean.astype(np.float64)) / rec.n_max}


# --------------------------------------------------------------------------- collusion
def _rel_err(est, truth):
    return np.linalg.norm(est - truth, axis=-1) / np.maximum(np.linalg.norm(truth, axis=-1), 1e-300)


def collusion_audit(rec: Recording) -> dict:
    """Agents ``i`` and ``k``, both neighbours of ``j``, pool their sums, own terms and seeds.

    Their best guess of ``q_j``: from ``i``'s sums with ``k``'s term removed (``k`` knows ``q_k``,
    together they know ``rho_ik``) the weighted mean of ``N_i`` without ``k``, or the same from
    ``k``'s side, whichever averages fewer unknown neighbours. It is ``q_j`` exactly when
    ``j`` is the only remaining one (``N_i = {j, k}`` or ``N_k = {j, i}``): the inherent case
    (with ``i``'s key and ``k``'s pair seed they could also unmask ``j``'s replies to ``i``, which
    gives the same term, :func:`masked_ciphertext_audit`). Per triple ``(i, k, j)``: the exact
    fraction and the median error over the informative calls, against the baseline ``U_i``.
    """
    A, rho = _sums(rec)
    q, w = rec.q, rec.w
    nbrs = {a: set() for a in range(rec.n_agents)}
    edge = {}
    for e, (a, b) in enumerate(zip(rec.src.tolist(), rec.dst.tolist())):
        nbrs[a].add(b)
        edge[(a, b)] = e
    triples = []
    for j in range(rec.n_agents):
        for i in sorted(nbrs[j]):
            for k in sorted(nbrs[j]):
                if k == i:
                    continue
                rest, num, den = [], None, None
                for x, y in ((i, k), (k, i)):  # strip y's term from x's sums, if y is x's neighbour
                    others = nbrs[x] - {y}
                    n_x = A[:, x].copy()
                    d_x = rho[:, x].copy()
                    if y in nbrs[x]:
                        n_x -= w[:, edge[(x, y)], None] * q[:, y]
                        d_x -= w[:, edge[(x, y)]]
                    rest.append((len(others), n_x, d_x))
                size, num, den = min(rest, key=lambda r: r[0])
                est = _mean_estimate(num, den, q[:, i]).astype(np.float64)
                info = (q[:, j] != q[:, i]).any(-1)
                if not info.any():
                    continue
                exact = np.all(est[info] == q[info, j], axis=-1)
                err = _rel_err(est[info] / rec.n_max, rec.U[info, j])
                base = _rel_err(rec.U[info, i], rec.U[info, j])
                triples.append({"colluders": [i, k], "target": j, "k_neighbour_of_i": k in nbrs[i],
                                "remaining": int(size), "inherent": size == 1,
                                "exact_fraction": float(exact.mean()), "rel_err_median": float(np.median(err)),
                                "baseline_rel_err_median": float(np.median(base))})
    inh = [t for t in triples if t["inherent"]]
    rest = [t for t in triples if not t["inherent"]]

    def med(xs, key):
        return float(np.median([x[key] for x in xs])) if xs else None

    return {"triples": triples, "summary": {
        "triples": len(triples), "inherent_triples": len(inh),
        "exact_inherent": sum(t["exact_fraction"] >= 0.5 for t in inh),
        "exact_other": sum(t["exact_fraction"] >= 0.5 for t in rest),
        "rel_err_median_other": med(rest, "rel_err_median"),
        "baseline_rel_err_median_other": med(rest, "baseline_rel_err_median")}}


# --------------------------------------------------------------------------- the seeds
@contextlib.contextmanager
def record_seeds():
    """Within the block, every seed the masked protocol draws is also appended to the yielded list,
    in draw order (the audit's view, as it makes the agents' keys; nothing else ever sees them)."""
    from ..exchange.paillier import seeds as seeds_mod

    drawn: list = []
    real = seeds_mod._token

    def spy(k):
        s = real(k)
        drawn.append(s)
        return s

    seeds_mod._token = spy
    try:
        yield drawn
    finally:
        seeds_mod._token = real


def tag_seeds(rec: Recording, drawn: list) -> dict:
    """``{tag: seed}`` for the seeds of one bound masked exchange, drawn in the setup's order
    (:func:`~ppdnmf_torch.exchange.paillier.masked.agree_seeds`)."""
    from ..exchange.paillier.masked import MaskPlan

    net = SimpleNamespace(n_nodes=rec.n_agents, src=rec.src.tolist(), dst=rec.dst.tolist())
    plan = MaskPlan(net)
    tags = [("pair", i, j, k) for i, j, k in plan.pairs()]
    tags += [("edge", a, b) for a, b in zip(net.src, net.dst) if a < b]
    if len(drawn) != len(tags):
        raise ConfigError(f"tag_seeds: {len(drawn)} seeds drawn, the setup draws {len(tags)}")
    return dict(zip(tags, drawn)), plan


# --------------------------------------------------------------------------- real ciphertexts
def _signed(r: int, n: int) -> int:
    return r - n if r > n // 2 else r


def independence_test(a, b) -> dict:
    """Pearson's ``r`` of ``a`` and ``b`` against the bound ``CONFIDENCE_Z / sqrt(n)`` (independent
    when below it)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = int(a.size)
    if n < 3 or a.std() == 0 or b.std() == 0:
        return {"n": n, "r": None, "bound": None, "independent": None}
    r = float(np.corrcoef(a, b)[0, 1])
    bound = CONFIDENCE_Z / math.sqrt(n)
    return {"n": n, "r": r, "bound": bound, "independent": abs(r) < bound}


def uniformity_test(u: np.ndarray) -> dict:
    """Kolmogorov-Smirnov against U(0, 1) and a 16-bin chi-square of ``u = x / n``."""
    from scipy import stats

    if u.size < 16:
        return {"n": int(u.size), "ks_p": None, "chi2_p": None, "uniform": None}
    ks = stats.kstest(u, "uniform")
    counts = np.bincount(np.minimum((u * 16).astype(np.int64), 15), minlength=16)
    chi = stats.chisquare(counts)
    return {"n": int(u.size), "ks_statistic": float(ks.statistic), "ks_p": float(ks.pvalue),
            "chi2": float(chi.statistic), "chi2_p": float(chi.pvalue),
            "uniform": bool(ks.pvalue > 1e-3 and chi.pvalue > 1e-3)}


def _slots(x: int, n: int, layout, S: int) -> list:
    """The signed slot values a decrypted residue would hold if it were a packed sum (no checks:
    a masked residue reads as arbitrary digits)."""
    if layout is None or S == 1:
        return [_signed(x, n)]
    mask = (1 << layout.slot_bits) - 1
    v = (x + layout.offset_word) % n
    out = []
    for _ in range(S):
        out.append((v & mask) - layout.limit)
        v >>= layout.slot_bits
    return out


def _strip(cts, units, sign: int, nsq: int) -> list:
    """``c u^{-sign}``: a holder of the seed removes its unit (``sign``: the unit's sign in the mask)."""
    return [int(c) * pow(int(u), -sign, nsq) % nsq for c, u in zip(cts, units)]


def masked_ciphertext_audit(rec: Recording, private_keys, seeds: dict, plan, *, seed_check_rounds: int = 12) -> dict:
    """Every masked reply of a real run, decrypted on its own with its receiver's key (module docstring).

    Parameters
    ----------
    rec : Recording
        ``kind="paillier"``, ``protocol="masked"`` (the transcript is recorded).
    private_keys : sequence
        One per node (``phe`` private keys or ``(public, private)`` pairs).
    seeds, plan
        From :func:`tag_seeds`: every seed by tag, and the mask plan.
    seed_check_rounds : int
        About this many rounds, evenly spread, get the eavesdropping-neighbour and collusion
        checks (each strips units and decrypts once per other neighbour of the receiver).

    Returns
    -------
    dict
        ``replies`` (messages and ciphertexts decrypted), ``uniformity`` (of ``x / n``, every
        reply), ``independence`` (correlations, each with its 99.9% bound: the value replies'
        ``x / n`` with the block's first slot value of ``q_j`` and with the unmasked term
        ``rho_ij M(q_j, b) mod n``; the penalty replies' with ``rho_ij``), ``plaintext_matches``
        (decrypted values, or their slots, equal to one of ``plaintexts_checked`` integers that
        any protocol handled), ``decrypt_each`` (per receiver degree: pairs, informative
        (call, edge) pairs and exact recoveries of ``q_j`` from the slots divided by the
        decrypted penalty reply), ``eavesdropping_neighbour`` (a neighbour ``k`` of ``i`` on the
        link ``j -> i`` strips its pair unit, and even with ``i``'s key would read the term:
        ``unmasked`` times) and ``collusion`` (``i`` and ``k`` pool their seeds and ``i``'s key:
        unmasked terms by ``i``'s degree; 2 is the inherent case).
    """
    if rec.kind != "paillier" or rec.protocol != "masked":
        raise ConfigError("masked_ciphertext_audit: needs a recording of exchange='paillier', protocol='masked'")
    from ..exchange.paillier.seeds import unit_stream
    from .eavesdropper import protocol_plaintexts

    by_n = {}
    for k in private_keys:
        sk = k[1] if isinstance(k, (tuple, list)) else k
        by_n[int(sk.public_key.n)] = sk
    layout = rec.layout
    S = layout.slots if layout is not None else 1
    D = len(rec.src)
    call = {(int(b), int(a)): t for t, (b, a) in enumerate(zip(rec.bcd, rec.admm))}
    edge = {(int(i), int(j)): e for e, (i, j) in enumerate(zip(rec.src, rec.dst))}
    deg = rec.degree
    known = {int(v) for vals in protocol_plaintexts(rec).values() for v in vals}
    u_all, val_u, slot0, term_u, pen_u, pen_rho = [], [], [], [], [], []
    matches = n_msgs = n_ct = n_reply = 0
    eaves = {"checked": 0, "unmasked": 0}
    coll = {"degree2_checked": 0, "degree2_unmasked": 0, "higher_checked": 0, "higher_unmasked": 0}
    pen_seen, per_edge = {}, {}
    n_rounds = sum(1 for m in rec.transcript if m.kind in ("enc_masked_penalty", "enc_masked_reply")) // max(1, D)
    stride = max(1, n_rounds // seed_check_rounds)  # the seed checks on about seed_check_rounds rounds
    for msg in rec.transcript:
        if msg.kind not in ("enc_masked_penalty", "enc_masked_reply"):
            continue
        rnd = n_reply // D + 1  # every round sends one reply per directed edge, rounds numbered from 1
        n_reply += 1
        i, j = int(msg.receiver), int(msg.sender)
        e = edge[(i, j)]
        n = int(rec.moduli[i])
        nsq = n * n
        sk = by_n[n]
        xs = [sk.raw_decrypt(int(c)) for c in msg.payload]
        n_msgs += 1
        n_ct += len(xs)
        u_all += [x / n for x in xs]
        t = call.get((int(msg.bcd_iter), int(msg.admm_iter)))
        if t is None:
            continue
        w = int(rec.w[t, e])
        if msg.kind == "enc_masked_penalty":
            pen_u.append(xs[0] / n)
            pen_rho.append(w)
            pen_seen[(t, e)] = _signed(xs[0], n)
            terms = [w % n]
            matches += sum(1 for x in xs if x in known or _signed(x, n) in known)
        else:
            vals = [w * int(v) for v in rec.q[t, j]]
            terms = [m % n for m in (layout.pack_signed(vals) if layout is not None else vals)]
            slots = []
            for b, x in enumerate(xs):
                val_u.append(x / n)
                slot0.append(float(rec.q[t, j, b * S]))
                term_u.append(terms[b] / n)
                slots += _slots(x, n, layout, S)
            slots = slots[:rec.q.shape[-1]]
            matches += sum(1 for x in xs if x in known or _signed(x, n) in known)
            matches += sum(1 for v in slots if v in known)
            # decrypt_each on masked replies: the slots over the decrypted penalty reply, as if unmasked
            gp = pen_seen.get((t, e))
            exact = bool(gp) and all(v % gp == 0 and v // gp == int(qv) for v, qv in zip(slots, rec.q[t, j]))
            if (rec.q[t, j] != rec.q[t, i]).any():
                pe = per_edge.setdefault(e, [0, 0])
                pe[0] += 1
                pe[1] += int(exact)
        # a neighbour k of i on the link j -> i strips its pair unit; i and k together strip i's
        # edge unit too; with i's key, is the term out? (a designated neighbour's fresh obfuscator
        # changes the randomness only)
        if rnd % stride:
            continue
        w_units = unit_stream(seeds[("edge", min(i, j), max(i, j))], i, rnd, n, len(xs))
        for k in plan.nbrs[i]:
            if k == j:
                continue
            mu = unit_stream(seeds[("pair", i, min(j, k), max(j, k))], i, rnd, n, len(xs))
            alone = _strip(msg.payload, mu, 1 if j < k else -1, nsq)
            eaves["checked"] += 1
            eaves["unmasked"] += int([sk.raw_decrypt(c) for c in alone] == terms)
            pooled = _strip(alone, w_units, 1, nsq)
            key = "degree2" if deg[i] == 2 else "higher"
            coll[f"{key}_checked"] += 1
            coll[f"{key}_unmasked"] += int([sk.raw_decrypt(c) for c in pooled] == terms)
    by_degree: dict = {}
    for e, (inf, ex) in sorted(per_edge.items()):
        b = by_degree.setdefault(str(int(deg[int(rec.src[e])])), {"pairs": 0, "informative": 0, "exact": 0,
                                                                   "pairs_exact": 0})
        b["pairs"] += 1
        b["informative"] += inf
        b["exact"] += ex
        b["pairs_exact"] += int(inf > 0 and ex >= 0.5 * inf)
    return {
        "replies": {"messages": n_msgs, "ciphertexts": n_ct},
        "uniformity": uniformity_test(np.asarray(u_all)),
        "independence": {"slot_value": independence_test(val_u, slot0),
                         "unmasked_term": independence_test(val_u, term_u),
                         "penalty": independence_test(pen_u, pen_rho)},
        "plaintext_matches": matches,
        "plaintexts_checked": len(known),
        "decrypt_each": dict(sorted(by_degree.items(), key=lambda kv: int(kv[0]))),
        "eavesdropping_neighbour": eaves,
        "collusion": coll,
    }
