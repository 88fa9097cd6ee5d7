"""``exchange="secagg"`` under audit: its recorded messages against an eavesdropper, the curious
receiver, a neighbour listening on a link it is not on, and colluders (docs/THREAT_MODEL.md).

:func:`secagg_message_audit` takes a ``secagg`` recording (its transcript: the signed keys and every
masked message) and the seeds the audit watched being derived (:func:`record_secagg_seeds`; the
seeds never leave their parties otherwise) and measures, over every masked message ``m`` of ``j`` to
``i`` (int64, ``P`` entries):

* ``uniformity``: ``m`` read as an unsigned 64-bit word over ``2^64``, Kolmogorov-Smirnov and a
  16-bin chi-square against U(0, 1);
* ``independence``: its correlation with ``q_j``, entry by entry, against the 99.9% bound;
* ``plaintext_matches``: entries of ``m``, and of the eavesdropper's sum of a receiver's messages,
  equal to any integer the protocol handled (:func:`~.eavesdropper.protocol_plaintexts` and the
  sums ``sum_j q_j`` with their partial sums);
* ``receiver``: ``i`` removes the edge mask it shares with ``j`` from ``m`` (it holds that seed):
  entries equal to ``q_j``, per receiver degree (degree 1: the inherent case, no pair mask);
* ``eavesdropping_neighbour``: another neighbour ``k`` of ``i`` listening on the link removes its pair
  mask with ``j``: messages read back as ``q_j``;
* ``collusion``: ``i`` and ``k`` pool their seeds (edge and pair masks removed): messages read back,
  at degree 2 (inherent: ``i``'s sum less ``k``'s term is ``q_j``) and higher;
* ``sums``: every receiver's sum of its messages less its edge masks equals ``sum_j q_j`` (the
  protocol's correctness, from the wire), and the eavesdropper's plain sum does not.
"""
from __future__ import annotations

import contextlib
import struct

import numpy as np

from ..errors import ConfigError
from .masked import independence_test, uniformity_test
from .recording import Recording

__all__ = ["record_secagg_seeds", "secagg_message_audit", "secagg_flags", "md_secagg"]


@contextlib.contextmanager
def record_secagg_seeds():
    """Within the block, every seed a secagg party derives is also put in the yielded dict by tag
    (the audit's view; the two holders of a seed derive the same one, which is checked)."""
    from ..exchange.secagg import party as party_mod

    seeds: dict = {}
    real = party_mod._derive_seed
    head = party_mod.DOMAIN + b"|"

    def spy(shared, info):
        s = real(shared, info)
        body = info[len(head):]
        kind = body[:4].decode()
        n = 3 if kind == "pair" else 2
        tag = (kind,) + struct.unpack(f">{n}I", body[4:4 + 4 * n])
        if seeds.get(tag, s) != s:
            raise AssertionError(f"the two holders of seed {tag} derived different seeds")
        seeds[tag] = s
        return s

    party_mod._derive_seed = spy
    try:
        yield seeds
    finally:
        party_mod._derive_seed = real


def _keystream(seed: bytes, round_no: int, receiver: int, count: int) -> np.ndarray:
    from ..exchange.secagg.prg import aes_context, as_words, counter_blocks, stream_rows

    rows = stream_rows(1, count)
    aes_context(seed).update_into(counter_blocks(round_no, receiver, count), rows[0])
    return as_words(rows, count)[0].copy()


def _tag(kind, *ids):
    return (kind,) + tuple(sorted(int(v) for v in ids[-2:])) if kind == "edge" else \
        (kind, int(ids[0])) + tuple(sorted(int(v) for v in ids[1:]))


def _known(rec: Recording) -> np.ndarray:
    from .across_calls import neighbour_sums
    from .eavesdropper import protocol_plaintexts

    vals = [np.asarray(v, dtype=np.int64).ravel() for v in protocol_plaintexts(rec).values() if len(v)]
    crow = np.concatenate([[0], np.cumsum(rec.degree)])
    for i in range(rec.n_agents):  # the receivers' partial sums of their neighbours' values
        a, b = crow[i], crow[i + 1]
        if b > a:
            vals.append(np.cumsum(rec.q[:, rec.dst[a:b]], axis=1).ravel())
    vals.append(neighbour_sums(rec).ravel())
    return np.unique(np.concatenate(vals))


def secagg_message_audit(rec: Recording, seeds: dict, *, seed_check_rounds: int = 12) -> dict:
    """Every masked message of a ``secagg`` recording (module docstring).

    Parameters
    ----------
    rec : Recording
        ``kind="secagg"`` (its transcript holds the masked messages).
    seeds : dict
        Every seed by tag (:func:`record_secagg_seeds`).
    seed_check_rounds : int
        About this many rounds, evenly spread, get the seed-holders' checks (receiver, listening
        neighbour, colluders), which recompute keystreams.
    """
    if rec.kind != "secagg":
        raise ConfigError("secagg_message_audit: needs a recording of exchange='secagg'")
    msgs = [m for m in rec.transcript if m.kind == "masked"]
    if not msgs:
        raise ConfigError("secagg_message_audit: the recording holds no masked message")
    call = {(int(b), int(a)): t for t, (b, a) in enumerate(zip(rec.bcd, rec.admm))}
    deg = rec.degree
    nbrs = {i: rec.dst[rec.src == i].tolist() for i in range(rec.n_agents)}
    known = _known(rec)
    n_rounds = max(m.round for m in msgs)
    stride = max(1, n_rounds // seed_check_rounds)
    words, truth = [], []
    recv = {}
    eaves = {"checked": 0, "unmasked": 0}
    coll = {"degree2_checked": 0, "degree2_unmasked": 0, "higher_checked": 0, "higher_unmasked": 0}
    totals: dict = {}
    for m in msgs:
        t = call[(m.bcd_iter, m.admm_iter)]
        i, j, y = m.receiver, m.sender, m.payload
        q = rec.q[t, j]
        words.append(y)
        truth.append(q)
        totals.setdefault((m.round, t, i), []).append(y)
        if m.round % stride:
            continue
        P = y.size
        edge = _keystream(seeds[_tag("edge", i, j)], m.round, i, P)
        alone = y - edge  # the receiver strips its edge mask (int64 wraps mod 2^64)
        r = recv.setdefault(str(int(deg[i])), {"messages": 0, "read_back": 0, "entries_equal": 0})
        r["messages"] += 1
        r["read_back"] += int(np.array_equal(alone, q))
        r["entries_equal"] += int((alone == q).sum())
        for k in nbrs[i]:
            if k == j:
                continue
            sign = 1 if j < k else -1
            pair = _keystream(seeds[_tag("pair", i, j, k)], m.round, i, P)
            eaves["checked"] += 1
            eaves["unmasked"] += int(np.array_equal(y - sign * pair, q))
            key = "degree2" if deg[i] == 2 else "higher"
            coll[f"{key}_checked"] += 1
            coll[f"{key}_unmasked"] += int(np.array_equal(alone - sign * pair, q))
    sums = {"receivers_checked": 0, "unmasked_equal": 0, "eavesdropper_sum_entries_equal": 0}
    from .across_calls import neighbour_sums

    true_sums = neighbour_sums(rec)
    eaves_sums = []
    for (rnd, t, i), ys in totals.items():
        tot = np.sum(np.stack(ys), axis=0)  # wraps mod 2^64
        eaves_sums.append(tot)
        sums["eavesdropper_sum_entries_equal"] += int((tot == true_sums[t, i]).sum())
        if rnd % stride == 0:
            strip = sum(_keystream(seeds[_tag("edge", i, j)], rnd, i, tot.size) for j in nbrs[i])
            sums["receivers_checked"] += 1
            sums["unmasked_equal"] += int(np.array_equal(tot - strip, true_sums[t, i]))
    W = np.concatenate(words)
    matches = int(np.isin(W, known).sum()) + int(np.isin(np.concatenate(eaves_sums), known).sum())
    u = W.view(np.uint64).astype(np.float64) / 2.0 ** 64
    return {
        "messages": len(msgs), "entries": int(W.size),
        "uniformity": uniformity_test(u),
        "independence": {"value": independence_test(u, np.concatenate(truth).astype(np.float64))},
        "plaintext_matches": matches, "plaintexts_checked": int(known.size),
        "receiver": dict(sorted(recv.items(), key=lambda kv: int(kv[0]))),
        "eavesdropping_neighbour": eaves, "collusion": coll, "sums": sums,
    }


def secagg_flags(sname: str, sa: dict) -> list:
    """Flags of :func:`secagg_message_audit`: a message that is not uniform, correlates with ``q_j``,
    equals a plaintext, reads back as ``q_j`` for its receiver (degree >= 2), a listening neighbour or
    colluders beyond the inherent case; sums that do not unmask, or an eavesdropper's sum that does."""
    out = []

    def flag(name, view="honest_but_curious"):
        out.append({"scenario": sname, "protocol": "secagg", "agent": None, "view": view, "flag": name,
                    "neighbours": [], "inherent": False})

    if sa["uniformity"].get("uniform") is False:
        flag("secagg_messages_not_uniform", "eavesdropper")
    if sa["independence"]["value"].get("independent") is False:
        flag("secagg_messages_correlate_with_q", "eavesdropper")
    if sa["plaintext_matches"]:
        flag("secagg_message_equals_a_plaintext", "eavesdropper")
    if any(r["read_back"] or r["entries_equal"] for d, r in sa["receiver"].items() if int(d) >= 2):
        flag("secagg_receiver_reads_a_message")
    if sa["eavesdropping_neighbour"]["unmasked"]:
        flag("listening_neighbour_unmasks_message", "eavesdropper")
    if sa["collusion"]["higher_unmasked"]:
        flag("colluders_unmask_beyond_the_inherent_case", "collusion")
    if sa["sums"]["unmasked_equal"] != sa["sums"]["receivers_checked"] or sa["sums"]["eavesdropper_sum_entries_equal"]:
        flag("secagg_sums_wrong_or_readable", "eavesdropper")
    return out


def md_secagg(entry: dict, where: str) -> list:
    """Markdown lines of a scenario's secagg entry (:func:`~ppdnmf_torch.models.ppdnmf.audit.run_audit`)."""
    if not entry:
        return []
    if "refused" in entry:
        return [f"`exchange=\"secagg\"` ({where}): refused, {entry['refused']}", ""]
    sa, nb, co = entry["messages"], entry["neighbour"], entry["collusion"]
    u, c = sa["uniformity"], sa["independence"]["value"]
    rd = "; ".join(f"degree {d}: {r['read_back']} of {r['messages']}" for d, r in sa["receiver"].items())
    ea, cl, sm = sa["eavesdropping_neighbour"], sa["collusion"], sa["sums"]
    return [f"`exchange=\"secagg\"` ({where}, {entry['calls']} calls, NMSE {entry['fit']['nmse']:.4g}): "
            f"{sa['messages']} masked messages, {sa['entries']} integers on the wire, uniform mod 2^64 (KS p = "
            f"{u.get('ks_p', float('nan')):.3f}, chi-square p = {u.get('chi2_p', float('nan')):.3f}), correlation "
            f"with `q_j` r = {c['r']:.4f} (bound {c['bound']:.4f}); {sa['plaintext_matches']} entries equal to any of "
            f"{sa['plaintexts_checked']} plaintexts; the receiver, its edge mask removed, reads a message back as "
            f"`q_j` ({rd}; degree 1 is the inherent case); a neighbour listening on a link, with its pair seed: "
            f"{ea['unmasked']} of {ea['checked']}; the receiver and one other neighbour pooling seeds: "
            f"{cl['degree2_unmasked']} of {cl['degree2_checked']} at degree 2 (inherent), {cl['higher_unmasked']} of "
            f"{cl['higher_checked']} at higher degrees; sums unmasked correctly {sm['unmasked_equal']} of "
            f"{sm['receivers_checked']}, eavesdropper's sums equal to the true sums in "
            f"{sm['eavesdropper_sum_entries_equal']} entries. On its sums: exact recovery pairs "
            f"{nb['exact_recovery_pairs']} (degree 1: {nb.get('exact_recovery_pairs_degree1')}, degree >= 2: "
            f"{nb.get('exact_recovery_pairs_degree2plus')}); two colluders: {co['exact_inherent']} of "
            f"{co['inherent_triples']} inherent triples exact, {co['exact_other']} others.", ""]
