"""(a) The eavesdropper on every link: the plain protocol's transcript read back, and a
Paillier transcript scanned for every plaintext the run handled.

:func:`protocol_plaintexts` collects every integer the integer protocol handled;
:func:`scan_transcript` looks for each one among the transcript's integers, in every form
an implementation could leak it (the signed value, its residue mod every agent's ``n``
and mod ``n^2``), and for unobfuscated or repeated ciphertexts.
"""
from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from .recording import Recording

__all__ = [
    "plain_transcript",
    "eavesdrop_plain",
    "eavesdropper_plain",
    "protocol_plaintexts",
    "scan_transcript",
    "eavesdropper_paillier",
    "SIGNIFICANT",
]

#: plaintexts above this magnitude count as "significant" in the eavesdropper scan
SIGNIFICANT = 1 << 16


def plain_transcript(rec: Recording) -> list:
    """The wire of the plain protocol: every call, ``i -> j`` carries ``U_i`` and ``g_{i->j}``.

    ``exchange="plain"`` computes ``S_i`` in floating point from the neighbours' ``U_j``
    and penalties; deployed, that is one clear-text message per directed edge.
    """
    from ..exchange.paillier import WireMessage  # the same record for every protocol

    out = []
    for t in range(rec.n_calls):
        b, m = int(rec.bcd[t]), int(rec.admm[t])
        for e, (i, j) in enumerate(zip(rec.src.tolist(), rec.dst.tolist())):
            out.append(WireMessage(b, m, i, j, "plain_u_and_penalty",
                                        tuple(rec.U[t, i].tolist()) + (float(rec.g[t, e]),)))
    return out


def eavesdrop_plain(transcript: list, n_agents: int, n_values: int) -> dict:
    """Read every agent's ``U`` per iteration off a plain transcript.

    Returns ``{(bcd, admm): ndarray (N, P)}`` (NaN rows for agents that sent nothing).
    """
    out: dict = {}
    for msg in transcript:
        key = (msg.bcd_iter, msg.admm_iter)
        if key not in out:
            out[key] = np.full((n_agents, n_values), np.nan)
        out[key][msg.sender] = np.asarray(msg.payload[:n_values], dtype=np.float64)
    return out


def eavesdropper_plain(rec: Recording) -> dict:
    """Per agent, how much of its ``U`` an eavesdropper reads off the plain transcript of ``rec``."""
    tr = plain_transcript(rec)
    P = rec.U.shape[2]
    seen = eavesdrop_plain(tr, rec.n_agents, P)
    agents = []
    for j in range(rec.n_agents):
        errs = []
        exact = 0
        for t in range(rec.n_calls):
            got = seen[(int(rec.bcd[t]), int(rec.admm[t]))][j]
            true = rec.U[t, j]
            if np.isnan(got).any():
                continue
            errs.append(float(np.linalg.norm(got - true) / max(np.linalg.norm(true), 1e-300)))
            exact += int(np.array_equal(got, true))
        n_sent = sum(1 for msg in tr if msg.sender == j)
        agents.append({
            "agent": j, "messages_sent": n_sent,
            "recovered_fraction": exact / rec.n_calls,
            "rel_err_max": max(errs) if errs else None,
            "flags": ["U_in_clear"] if exact else [],
        })
    return {"kind": "plain", "n_messages": len(tr), "agents": agents,
            "all_recovered_exactly": all(a["recovered_fraction"] == 1.0 for a in agents)}


def protocol_plaintexts(rec: Recording, layout=None, seeds=()) -> dict:
    """Every integer plaintext the integer protocol handled in the recorded run, by name.

    Names: ``q`` (``q_i``), ``neg_q`` (``-q_i``, encrypted by ``i``), ``gamma`` (every
    penalty), ``w`` (``gamma_ij gamma_ji``), ``diff`` (``q_j - q_i``, after the homomorphic
    addition), ``reply`` (``gamma_ji (q_j - q_i)``), ``scaled_reply`` (``gamma_ij`` times
    it), ``partial_S`` (the running sums over ``i``'s neighbours in CSR order, the last
    being ``S_int_i``), ``partial_rho`` (likewise for ``rho_int_i``). Each value is a
    Python ``int``; the sets may overlap (both protocols' values are included).

    The masked protocol's plaintexts too: ``term`` (``gamma_ij gamma_ji q_j``, what ``j``'s reply
    to ``i`` carries under its masks), ``partial_A`` (the running sums of the terms over ``i``'s
    neighbours, the last being ``A_i``), and, given ``seeds`` (bytes), every seed as an integer
    and as the chunks it is encrypted in (``seed``).

    With a packing ``layout`` (default: the recording's, when it has more than one slot per
    plaintext) the packed plaintexts of every vector above are added too, as
    ``packed_<name>`` (``layout.pack_signed``: the integers that get encrypted).
    """
    rec.need_ints()
    layout = layout if layout is not None else rec.layout
    q, gamma = rec.q, rec.gamma
    d = rec.replies
    terms = gamma[:, :, None] * d
    w = rec.w
    out = {
        "q": q.ravel(), "neg_q": (-q).ravel(), "gamma": gamma.ravel(), "w": w.ravel(),
        "diff": (q[:, rec.dst] - q[:, rec.src]).ravel(), "reply": d.ravel(), "scaled_reply": terms.ravel(),
    }
    # running sums over each agent's out-edges, in the order the protocol accumulates them
    ps, pr = [], []
    crow = np.concatenate([[0], np.cumsum(rec.degree)])
    for i in range(rec.n_agents):
        a, b = crow[i], crow[i + 1]
        if b > a:
            ps.append(np.cumsum(terms[:, a:b], axis=1).ravel())
            pr.append(np.cumsum(w[:, a:b], axis=1).ravel())
    out["partial_S"] = np.concatenate(ps) if ps else np.zeros(0, dtype=np.int64)
    out["partial_rho"] = np.concatenate(pr) if pr else np.zeros(0, dtype=np.int64)
    term = w[:, :, None] * q[:, rec.dst]  # the masked protocol's per-neighbour terms
    out["term"] = term.ravel()
    pa = [np.cumsum(term[:, crow[i]:crow[i + 1]], axis=1).ravel() for i in range(rec.n_agents)
          if crow[i + 1] > crow[i]]
    out["partial_A"] = np.concatenate(pa) if pa else np.zeros(0, dtype=np.int64)
    res = {k: sorted({int(v) for v in np.unique(arr)}) for k, arr in out.items()}
    if seeds:
        from ..exchange.paillier.seeds import seed_to_chunks

        bits = min(int(m).bit_length() for m in rec.moduli) if rec.moduli else 2048
        res["seed"] = sorted({int.from_bytes(s, "big") for s in seeds}
                             | {c for s in seeds for c in seed_to_chunks(s, bits)})
    if layout is not None and getattr(layout, "slots", 1) > 1:
        P = q.shape[-1]
        vectors = {  # name -> (..., P) arrays whose rows are packed as the protocol packs them
            "q": q, "neg_q": -q, "diff": q[:, rec.dst] - q[:, rec.src], "reply": d, "scaled_reply": terms,
            "partial_S": np.concatenate([np.cumsum(terms[:, crow[i]:crow[i + 1]], axis=1)
                                         for i in range(rec.n_agents) if crow[i + 1] > crow[i]], axis=1)
            if len(rec.src) else np.zeros((0, P), dtype=np.int64),
            "term": term,
            "partial_A": np.concatenate([np.cumsum(term[:, crow[i]:crow[i + 1]], axis=1)
                                         for i in range(rec.n_agents) if crow[i + 1] > crow[i]], axis=1)
            if len(rec.src) else np.zeros((0, P), dtype=np.int64),
        }
        for name, arr in vectors.items():
            packed = set()
            for row in arr.reshape(-1, P):
                packed.update(int(m) for m in layout.pack_signed(row.tolist()))
            res[f"packed_{name}"] = sorted(packed)
    return res


# which agent's key a message's ciphertexts are under (WireMessage.under, when set, says it instead)
_KEY_OF = {"enc_neg_u": "sender", "enc_neg_u_and_key": "sender", "enc_reply": "receiver",
           "enc_penalty": "receiver", "enc_gamma": "sender", "enc_shifted": "sender",
           "enc_masked_penalty": "receiver", "enc_masked_reply": "receiver", "edge_seed": "receiver"}
#: messages that forward another message's ciphertexts unchanged (not a reuse of randomness)
_RELAYS = ("seed_relay",)


def _ciphertexts(msg) -> list:
    """The ciphertexts of a wire message (the trailing public key of ``enc_neg_u_and_key`` excluded)."""
    if msg.kind == "public_key":
        return []
    if msg.kind == "enc_neg_u_and_key":
        return list(msg.payload[:-1])
    return list(msg.payload)


def _plaintext_forms(plaintexts, moduli: list) -> tuple[dict, set]:
    """``(forms, values)``: every form of every plaintext (the value, its residues mod each
    ``n_k`` and ``n_k^2``) mapped to ``(value, form, name)`` (the first name that gives it), and
    the distinct values."""
    if isinstance(plaintexts, dict):
        named = [(name, v) for name, vals in plaintexts.items() for v in vals]
    else:
        named = [("value", v) for v in plaintexts]
    forms: dict = {}
    for name, v in named:
        v = int(v)
        forms.setdefault(v, (v, "value", name))
        for k, n in enumerate(moduli):
            forms.setdefault(v % n, (v, f"mod n_{k}", name))
            forms.setdefault(v % (n * n), (v, f"mod n_{k}^2", name))
    return forms, {int(v) for _, v in named}


def _chance_match_bound(n_payload: int, n_forms: int, moduli: list):
    """Union bound on a chance match of a payload integer with a form (None without moduli)."""
    if not moduli:
        return None
    smallest = min(moduli)
    # every payload integer vs every form: a uniform element of Z_{n^2} matches a given
    # integer with probability <= 1 / phi(n^2) ~ 1 / n^2
    return float(n_payload) * float(n_forms) / float(smallest) ** 2


def scan_transcript(transcript: list, plaintexts, moduli: list, *, significant: int = SIGNIFICANT) -> dict:
    """Look for plaintexts, unobfuscated and repeated ciphertexts in a Paillier transcript.

    Parameters
    ----------
    transcript : list of WireMessage
    plaintexts : iterable of int, or dict name -> iterable of int
        Signed plaintext integers (:func:`protocol_plaintexts`).
    moduli : list of int
        Every agent's public ``n`` (node order).
    significant : int
        Plaintexts with ``|v| > significant`` are counted separately in the report.

    Returns
    -------
    dict
        ``hits`` (list of ``{"value", "form", "name", "bcd_iter", "admm_iter", "sender",
        "receiver", "kind"}``, at most 20), ``n_hits``, ``unobfuscated`` (ciphertexts with
        ``c mod n == 1`` under their key), ``repeated_ciphertexts`` (a ciphertext seen in two
        different broadcasts), ``n_plaintexts``, ``n_significant``, ``n_forms``,
        ``n_payload_integers``, ``chance_match_bound`` and ``per_sender`` counts.
    """
    forms, values = _plaintext_forms(plaintexts, moduli)
    hits, unobf, repeats = [], 0, 0
    seen_ct: dict = {}
    per_sender: dict = {}
    n_payload = 0
    for idx, msg in enumerate(transcript):
        ps = per_sender.setdefault(int(msg.sender), {"messages": 0, "ciphertexts": 0, "plaintext_hits": 0,
                                                     "unobfuscated": 0})
        ps["messages"] += 1
        cts = _ciphertexts(msg)
        ps["ciphertexts"] += len(cts)
        n_payload += len(msg.payload)
        for x in msg.payload:
            x = int(x)
            if x in forms:
                v, form, name = forms[x]
                ps["plaintext_hits"] += 1
                if len(hits) < 20:
                    hits.append({"value": v, "form": form, "name": name, "bcd_iter": msg.bcd_iter,
                                 "admm_iter": msg.admm_iter, "sender": msg.sender, "receiver": msg.receiver,
                                 "kind": msg.kind})
                else:
                    hits.append(None)
        under = getattr(msg, "under", -1)
        owner = _KEY_OF.get(msg.kind) if under < 0 else None
        if (owner is not None or under >= 0) and moduli:
            n = moduli[under if under >= 0 else getattr(msg, owner)]
            bad = sum(1 for c in cts if int(c) % n == 1)
            unobf += bad
            ps["unobfuscated"] += bad
        # one broadcast (the same request to every neighbour) is one message as far as
        # freshness goes
        bkey = (msg.bcd_iter, msg.admm_iter, msg.sender, msg.kind, hash(msg.payload))
        if msg.kind in _RELAYS:
            continue
        for c in cts:
            prev = seen_ct.setdefault(int(c), bkey)
            if prev != bkey:
                repeats += 1
    n_hits = len(hits)
    bound = _chance_match_bound(n_payload, len(forms), moduli)
    return {
        "hits": [h for h in hits if h is not None],
        "n_hits": n_hits,
        "unobfuscated": unobf,
        "repeated_ciphertexts": repeats,
        "n_plaintexts": len(values),
        "n_significant": sum(1 for v in values if abs(v) > significant),
        "significant_threshold": significant,
        "n_forms": len(forms),
        "n_messages": len(transcript),
        "n_payload_integers": n_payload,
        "chance_match_bound": bound,
        "per_sender": per_sender,
        "clean": n_hits == 0 and unobf == 0 and repeats == 0,
    }


def eavesdropper_paillier(rec: Recording, seeds=()) -> dict:
    """Scan a recorded ``paillier`` run's transcript for its own plaintexts (per agent); under
    ``protocol="masked"`` also for the ``seeds`` drawn (bytes; :func:`~.masked.record_seeds`)."""
    if rec.kind != "paillier":
        raise ConfigError("eavesdropper_paillier: needs a recording of exchange='paillier'")
    plain = protocol_plaintexts(rec, seeds=seeds)
    scan = scan_transcript(rec.transcript, plain, rec.moduli)
    slots = getattr(rec.layout, "slots", 1) if rec.layout is not None else 1
    values = {v for k, vals in plain.items() if not k.startswith("packed_") for v in vals}
    packed = {v for k, vals in plain.items() if k.startswith("packed_") for v in vals}
    scan["n_values"] = len(values)
    scan["n_values_significant"] = sum(1 for v in values if abs(v) > SIGNIFICANT)
    scan["n_packed"] = len(packed)
    agents = []
    for j in range(rec.n_agents):
        ps = scan["per_sender"].get(j, {"messages": 0, "ciphertexts": 0, "plaintext_hits": 0, "unobfuscated": 0})
        flags = []
        if ps["plaintext_hits"]:
            flags.append("plaintext_on_wire")
        if ps["unobfuscated"]:
            flags.append("unobfuscated_ciphertext")
        agents.append({"agent": j, "messages_sent": ps["messages"], "ciphertexts_sent": ps["ciphertexts"],
                       "plaintext_hits": ps["plaintext_hits"], "unobfuscated": ps["unobfuscated"], "flags": flags})
    scan = {k: v for k, v in scan.items() if k != "per_sender"}
    scan["n_seeds"] = len(seeds)
    return {"kind": "paillier", "protocol": rec.protocol, "key_bits": min(m.bit_length() for m in rec.moduli),
            "slots_per_plaintext": int(slots), "n_calls": rec.n_calls, "scan": scan, "agents": agents}
