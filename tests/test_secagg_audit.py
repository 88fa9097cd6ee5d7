"""exchange="secagg" under audit (issue 38): its messages on the wire, the library's attacks on its
recording in run_audit, and the adversary across calls, which the network-wide stop leaves nothing to read."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from ppdnmf_torch import audit
from ppdnmf_torch.audit.across_calls import difference_attack, neighbour_sums
from ppdnmf_torch.audit.secagg import _keystream, record_secagg_seeds, secagg_flags, secagg_message_audit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.graph import Graph, ring
from ppdnmf_torch.models.ppdnmf.audit import record_fit, run_audit

from conftest import small_problem

# degrees 1 (agents 0 and 4), 2 (agent 2) and 3 (agents 1 and 3)
G = Graph(5, [(0, 1), (1, 2), (2, 3), (3, 1), (3, 4)])


@pytest.fixture
def fixed_keys(monkeypatch):
    """The parties' keys from a counter (tests only): the masks, hence the audit's statistical tests
    at their 99.9% bounds, are the same on every run instead of failing once in a thousand."""
    import hashlib

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from ppdnmf_torch.exchange.secagg import party

    count = [0]

    def raw():
        count[0] += 1
        return hashlib.sha256(b"test-key-%d" % count[0]).digest()

    monkeypatch.setattr(party, "_new_identity", lambda: Ed25519PrivateKey.from_private_bytes(raw()))
    monkeypatch.setattr(party, "_new_ephemeral", lambda: X25519PrivateKey.from_private_bytes(raw()))


def _record(graph, counts, seed=0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with record_secagg_seeds() as seeds:
            rec = record_fit(small_problem(L=8, K=3, counts=counts, seed=seed), graph, 3, kind="secagg",
                             n_max=1e5, device="cpu", **kw)
    return rec, seeds


def test_messages_are_uniform_and_only_the_inherent_cases_read_back(fixed_keys):
    rec, seeds = _record(G, (3, 4, 2, 5, 3), bcd_iters=3, x_iters=4, y_iters=2)
    assert len(seeds) == 3 + 1 + 3 + 5  # pairs: agent 1's 3, agent 2's 1, agent 3's 3; 5 edges
    sa = secagg_message_audit(rec, seeds, seed_check_rounds=100)
    assert sa["messages"] == rec.n_calls * 10 and sa["entries"] == sa["messages"] * 24  # L K = 24
    assert sa["uniformity"]["uniform"] and sa["independence"]["value"]["independent"]
    assert sa["plaintext_matches"] == 0 and sa["plaintexts_checked"] > 0
    rd = sa["receiver"]
    assert rd["1"]["read_back"] == rd["1"]["messages"] > 0  # a single neighbour: its message is its value
    assert rd["2"]["read_back"] == rd["3"]["read_back"] == 0 and rd["2"]["entries_equal"] == 0
    ea, co = sa["eavesdropping_neighbour"], sa["collusion"]
    assert ea["checked"] > 0 and ea["unmasked"] == 0
    assert co["degree2_unmasked"] == co["degree2_checked"] > 0  # inherent: i's sum less k's term
    assert co["higher_checked"] > 0 and co["higher_unmasked"] == 0
    sm = sa["sums"]
    assert sm["unmasked_equal"] == sm["receivers_checked"] > 0 and sm["eavesdropper_sum_entries_equal"] == 0
    assert secagg_flags("g", sa) == []
    # the audit's checks can fail: a message that carries its value in the clear is caught
    bad = [m for m in rec.transcript if m.kind == "masked"][0]
    t = 0
    object.__setattr__(bad, "payload", rec.q[t, bad.sender].copy())
    sb = secagg_message_audit(rec, seeds, seed_check_rounds=100)
    assert sb["plaintext_matches"] > 0 and "secagg_message_equals_a_plaintext" in {f["flag"] for f in
                                                                                 secagg_flags("g", sb)}
    with pytest.raises(ConfigError, match="needs a recording of exchange='secagg'"):
        secagg_message_audit(record_fit(small_problem(), ring(4), 2, kind="quantized", bcd_iters=1, x_iters=1,
                                        y_iters=1, device="cpu"), seeds)


def test_the_agreed_stop_leaves_no_increment_to_read_and_the_attack_reads_a_frozen_neighbour():
    # fit's default stopping rule (tol=1e-4), decided network-wide: every agent varies until the run
    # stops, so no receiver of degree >= 2 ever has a lone neighbour moving (the one-hop rule of
    # Sec. II-C froze agents one at a time: 60 exact increments by 6 receivers on this ring)
    rec, seeds = _record(ring(8), (3, 4, 2, 5, 3, 4, 3, 5), bcd_iters=60, x_iters=5, y_iters=5)
    assert rec.bcd.max() < 60  # the run converged: the stop was taken
    sm = difference_attack(rec)["summary"]
    assert sm["increments"] > 0 and sm["isolated"] == sm["exact"] == 0
    # the same from the sums the receivers unmasked from the wire (messages less their edge masks)
    wire = np.zeros_like(neighbour_sums(rec))
    call = {(int(b), int(a)): t for t, (b, a) in enumerate(zip(rec.bcd, rec.admm))}
    for m in rec.transcript:
        if m.kind == "masked":
            key = ("edge", min(m.sender, m.receiver), max(m.sender, m.receiver))
            wire[call[(m.bcd_iter, m.admm_iter)], m.receiver] += m.payload - _keystream(seeds[key], m.round,
                                                                                        m.receiver, m.payload.size)
    assert np.array_equal(wire, neighbour_sums(rec))
    assert difference_attack(rec, sums=wire)["summary"] == sm
    # the attack can fail the run: agent 3 held still from call 20 on (as the one-hop rule froze it),
    # so receiver 2 (neighbours 1 and 3) reads agent 1's exact increments from then on
    rec.q[20:, 3] = rec.q[19, 3]
    da = difference_attack(rec)
    pair = [p for p in da["pairs"] if (p["receiver"], p["target"]) == (2, 1)][0]
    assert pair["exact"] == pair["isolated"] == pair["increments"] - sum(
        1 for t in range(20) if t and (rec.q[t, 1] != rec.q[t - 1, 1]).any()) > 0
    assert da["summary"]["receivers_with_exact"] == 2  # receivers 2 and 4 (neighbours 3 and 5)
    for p in da["pairs"]:
        assert p["exact"] <= p["isolated"] <= p["increments"]


def test_run_audit_includes_secagg_and_the_adversary_across_calls(fixed_keys):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = run_audit(("star", "random_caps"), bcd_iters=2, x_iters=4, y_iters=2, paillier=False, plain=False,
                        protocols=("masked",), sums=False, to_stop=4)
    json.dumps(rep, allow_nan=False)
    star = rep["scenarios"]["star"]
    assert set(star["across_calls"]) >= {"increments", "exact", "degree1"}
    ts = star["across_calls_to_stop"]  # fit's tol, at most 4 BCD iterations: every call attacked
    assert ts["tol"] == 1e-4 and ts["bcd_iters_run"] <= 4 and ts["calls"] == 4 * ts["bcd_iters_run"]
    assert ts["exact"] == 0 and ts["degree1"]["exact"] == ts["degree1"]["increments"] > 0  # the leaves: inherent
    sec = star["secagg"]
    assert sec["neighbour"]["exact_recovery_pairs_degree2plus"] == 0
    assert sec["neighbour"]["exact_recovery_pairs_degree1"] == 9  # the leaves: inherent
    assert sec["messages"]["plaintext_matches"] == 0 and sec["collusion"]["exact_other"] == 0
    assert "refused" in rep["scenarios"]["random_caps"]["secagg"]  # adaptive: per-edge weights
    assert "penalty_schedule='adaptive'" in rep["scenarios"]["random_caps"]["secagg"]["refused"]
    assert not [f for f in rep["flags"] if f["protocol"] == "secagg"]
    md = audit.format_markdown(rep)
    assert '`exchange="secagg"` (star' in md and "refused" in md and "differences its sums across calls" in md
    assert "the run to its stop: tol=0.0001" in md
