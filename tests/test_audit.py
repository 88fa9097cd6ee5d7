"""The privacy audit (ppdnmf_torch.audit, scripts/privacy_audit.py): eavesdropper and curious neighbours."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import small_problem
from ppdnmf_torch import PAPER_SETTINGS, audit
from ppdnmf_torch.audit.neighbour import _gcd_scales
from ppdnmf_torch.models.ppdnmf.audit import record_fit, run_audit
from ppdnmf_torch.models.ppdnmf.audit.run import _scenario
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.graph import Graph

REPO = Path(__file__).resolve().parents[1]

#: a path 0 - 1 - 2: two degree-1 agents and one of degree 2
PATH3 = Graph(3, [(0, 1), (1, 2)])
# the paper's settings: the assertions below count on the all-ones start (q = 10^6)
TINY = dict(bcd_iters=2, x_iters=3, y_iters=3, g_max=0.05, seed=0, **PAPER_SETTINGS)


def _tiny_blocks():
    return small_problem(L=4, K=2, counts=(3, 4, 5), seed=1)


def _scenario_recording(name, **over):
    blocks, graph, g_max, solver, sc_over = _scenario(name, 0)
    rank = solver.pop("rank")
    kw = dict(solver, g_max=g_max, negative="allow", seed=0)
    kw.update(sc_over)
    kw.update(over)
    return record_fit(blocks, graph, rank, kind="quantized", n_max=1e6, g_bits=16, key_bits=128, **kw)


@pytest.fixture(scope="module")
def star_rec():
    return _scenario_recording("star", bcd_iters=3)


@pytest.fixture(scope="module")
def paper_rec():
    return _scenario_recording("paper_synthetic", bcd_iters=3)


# ---------------------------------------------------------------------------------------
# (a) eavesdropper
# ---------------------------------------------------------------------------------------
def test_plain_transcript_reveals_every_U_exactly():
    rec = record_fit(_tiny_blocks(), PATH3, 2, kind="plain", **TINY)
    tr = audit.plain_transcript(rec)
    assert len(tr) == rec.n_calls * len(rec.src)  # one clear-text message per call and directed edge
    seen = audit.eavesdrop_plain(tr, rec.n_agents, rec.U.shape[2])
    for t in range(rec.n_calls):
        got = seen[(int(rec.bcd[t]), int(rec.admm[t]))]
        assert np.array_equal(got, rec.U[t])  # bit for bit
    rep = audit.eavesdropper_plain(rec)
    assert rep["all_recovered_exactly"]
    assert all(a["recovered_fraction"] == 1.0 and a["rel_err_max"] == 0.0 for a in rep["agents"])
    assert all(a["flags"] == ["U_in_clear"] for a in rep["agents"])


@pytest.fixture(scope="module", params=["paper", "aggregated"])
def paillier_rec(request, paillier_keypairs):
    return record_fit(_tiny_blocks(), PATH3, 2, kind="paillier", protocol=request.param, n_max=1e6,
                            g_bits=16, key_bits=128, keypairs=paillier_keypairs(128, 3), **TINY)


@pytest.mark.crypto
def test_paillier_transcript_carries_no_plaintext(paillier_rec):
    rec = paillier_rec
    assert rec.transcript and len(rec.moduli) == 3
    plain = audit.protocol_plaintexts(rec)
    # the collection is not vacuous: it holds the quantized U's (all-ones start: 10^6),
    # their negatives, penalties and sums, most of them far above 2^16
    assert 1_000_000 in plain["q"] and -1_000_000 in plain["neg_q"]
    assert set(int(v) for v in rec.q.ravel()) <= set(plain["q"])
    assert set(int(v) for v in rec.rho_int.ravel()) <= set(plain["partial_rho"])
    assert set(int(v) for v in rec.S_int.ravel()) <= set(plain["partial_S"])
    scan = audit.scan_transcript(rec.transcript, plain, rec.moduli)
    assert scan["n_significant"] > 100
    assert scan["n_hits"] == 0, scan["hits"]
    assert scan["unobfuscated"] == 0
    assert scan["repeated_ciphertexts"] == 0
    assert scan["clean"]
    assert scan["chance_match_bound"] < 1e-40
    ev = audit.eavesdropper_paillier(rec)
    assert all(a["plaintext_hits"] == 0 and not a["flags"] for a in ev["agents"])
    assert sum(a["ciphertexts_sent"] for a in ev["agents"]) > 0


@pytest.mark.crypto
def test_paillier_and_quantized_handle_the_same_integers(paillier_rec):
    """The neighbour audit runs on the quantized path; it sees what the real protocol decrypts."""
    q = record_fit(_tiny_blocks(), PATH3, 2, kind="quantized", n_max=1e6, g_bits=16, key_bits=128, **TINY)
    assert np.array_equal(q.q, paillier_rec.q)
    assert np.array_equal(q.gamma, paillier_rec.gamma)
    assert np.array_equal(q.U, paillier_rec.U)


@pytest.mark.crypto
def test_scan_detects_injected_plaintexts(paillier_rec):
    """Sanity: the scan can fail. Plant a plaintext (as a value and as a residue), an
    unobfuscated ciphertext and a reused ciphertext into copies of the transcript."""
    rec = paillier_rec
    plain = audit.protocol_plaintexts(rec)
    tr = list(rec.transcript)
    k = next(idx for idx, m in enumerate(tr) if m.kind == "enc_reply")
    msg = tr[k]
    n = rec.moduli[msg.receiver]
    secret = next(int(v) for v in rec.q[-1].ravel() if abs(int(v)) > audit.SIGNIFICANT)
    negative = next(int(v) for v in plain["neg_q"] if v < -audit.SIGNIFICANT)

    def planted(value):
        copy = list(tr)
        copy[k] = dataclasses.replace(msg, payload=(value,) + msg.payload[1:])
        return audit.scan_transcript(copy, plain, rec.moduli)

    s = planted(secret)
    assert s["n_hits"] == 1 and s["hits"][0]["value"] == secret and s["hits"][0]["form"] == "value"
    s = planted(negative % n)  # how a negative is represented mod n
    assert s["n_hits"] == 1 and s["hits"][0]["value"] == negative and s["hits"][0]["form"].startswith("mod n_")
    s = planted((1 + 12345 * n) % (n * n))  # E(m) with r = 1: the plaintext is readable
    assert s["n_hits"] == 0 and s["unobfuscated"] == 1 and not s["clean"]
    other = next(m for idx, m in enumerate(tr) if idx != k and m.kind == "enc_reply" and m.sender != msg.sender)
    s = planted(int(other.payload[0]))  # the same ciphertext in two different messages
    assert s["repeated_ciphertexts"] >= 1 and not s["clean"]
    assert audit.scan_transcript(tr, plain, rec.moduli)["clean"]


@pytest.mark.crypto
@pytest.mark.parametrize("protocol", ["paper", "aggregated"])
def test_packed_plaintexts_are_checked_too(protocol, paillier_keypairs):
    """With keys large enough to pack several values per plaintext (512 bits: 8 slots), the
    scan also looks for the packed plaintexts, and finds one that is planted."""
    rec = record_fit(_tiny_blocks(), PATH3, 2, kind="paillier", protocol=protocol, n_max=1e6, g_bits=16,
                           key_bits=512, keypairs=paillier_keypairs(512, 3), **TINY)
    if getattr(rec.layout, "slots", 1) <= 1:
        pytest.skip("this Paillier exchange does not pack values")
    plain = audit.protocol_plaintexts(rec)
    assert plain["packed_q"] and plain["packed_reply"]
    scan = audit.scan_transcript(rec.transcript, plain, rec.moduli)
    assert scan["clean"], scan["hits"]
    tr = list(rec.transcript)
    k = next(idx for idx, m in enumerate(tr) if m.kind == "enc_reply")
    tr[k] = dataclasses.replace(tr[k], payload=(plain["packed_reply"][-1],) + tr[k].payload[1:])
    hit = audit.scan_transcript(tr, plain, rec.moduli)
    assert hit["n_hits"] == 1 and hit["hits"][0]["name"].startswith("packed_")


@pytest.mark.crypto
@pytest.mark.parametrize("path,bits,options", [
    ("naive", 128, {"fast": False}),
    ("fast", 128, {}),
    ("packed", 512, {}),
])
def test_aggregated_replies_decrypt_individually_with_own_key(path, bits, options, paillier_keypairs):
    """The decrypt_each attack on real ciphertexts: every reply of the aggregated protocol is
    under its receiver's own key, so the receiver decrypts each one on its own and gets
    gamma_ji (penalty round) and gamma_ji (q_j - q_i) (step 5), hence q_j exactly."""
    keys = paillier_keypairs(bits, 3)
    rec = record_fit(_tiny_blocks(), PATH3, 2, kind="paillier", protocol="aggregated", n_max=1e6,
                           g_bits=16, key_bits=bits, keypairs=keys, paillier_options=options, **TINY)
    if path == "packed" and getattr(rec.layout, "slots", 1) <= 1:
        pytest.skip("this Paillier exchange does not pack values")
    if path == "naive":
        assert rec.layout is None
    # the wire carries no plaintext: this is the receiver's view, not the eavesdropper's
    assert audit.scan_transcript(rec.transcript, audit.protocol_plaintexts(rec), rec.moduli)["clean"]
    got = audit.decrypt_individual_replies(rec, keys)
    E = len(rec.src)
    assert got["n_penalty_messages"] >= rec.n_calls * E and got["n_reply_messages"] == rec.n_calls * E
    assert got["penalty_seen"].all() and got["reply_seen"].all()
    assert np.array_equal(got["penalty"], rec.gamma[:, rec.rev])  # gamma_ji, exactly
    assert np.array_equal(got["reply"], rec.replies)  # gamma_ji (q_j - q_i), exactly
    q_hat = rec.q[:, rec.src] + got["reply"] // got["penalty"][..., None]
    assert np.array_equal(q_hat, rec.q[:, rec.dst])  # every neighbour's q_j, every call
    info = (rec.q[:, rec.dst] != rec.q[:, rec.src]).any(-1)
    assert info.any()  # not only the all-ones start
    chk = audit.decrypt_each_check(rec, keys)
    assert chk["penalties_match"] and chk["replies_match"]
    assert chk["q_exact"] == chk["informative"] == int(info.sum())
    # the degree-2 agent 1 learns both neighbours, which its sums alone do not give
    rep = audit.neighbour_audit(rec, "aggregated")
    a1 = next(a for a in rep["agents"] if a["agent"] == 1)
    assert a1["learns_exactly"] == [0, 2] and a1["sums_only"]["learns_exactly"] == []


@pytest.mark.crypto
def test_decrypt_individual_replies_needs_a_paillier_run_and_every_key(paillier_keypairs):
    with pytest.raises(ConfigError, match="exchange='paillier'"):
        audit.decrypt_individual_replies(record_fit(_tiny_blocks(), PATH3, 2, kind="quantized", **TINY), [])
    keys = paillier_keypairs(128, 3)
    rec = record_fit(_tiny_blocks(), PATH3, 2, kind="paillier", protocol="aggregated", keypairs=keys, **TINY)
    with pytest.raises(ConfigError, match=r"nodes \[2\]"):
        audit.decrypt_individual_replies(rec, keys[:2])
    assert audit.decrypt_individual_replies(rec, [sk for _, sk in keys])["reply_seen"].all()


# ---------------------------------------------------------------------------------------
# (b) honest-but-curious neighbours
# ---------------------------------------------------------------------------------------
def test_sums_only_view_degree1_agents_recover_neighbour_exactly_under_aggregated(star_rec):
    """An agent that decrypts only the two sums: exact for degree 1 (rho reveals the penalty),
    the weighted neighbourhood mean otherwise."""
    rep = audit.neighbour_audit(star_rec, "aggregated")
    assert rep["views"] == {"honest_but_curious": ["decrypt_each", "nbr_mean"], "sums_only": ["nbr_mean"]}
    leaves = [p for p in rep["pairs"] if p["attacker"] != 0]
    hub = [p for p in rep["pairs"] if p["attacker"] == 0]
    assert len(leaves) == 9 and len(hub) == 9
    for p in leaves:
        m = p["attacks"]["nbr_mean"]
        assert p["target"] == 0 and p["attacker_degree"] == 1
        assert m["exact_fraction"] == 1.0  # the hub's q_0, bit for bit, at every informative iteration
        # i.e. U_0 to quantization error (n_max = 1e6)
        assert m["rel_err_median"] <= 2 * p["quantization_rel_err_median"] + 1e-12
        assert m["rel_err_max"] < 1e-5
        assert m["pearson_median"] > 0.999999
        assert p["sums_only"]["best_attack"] == "nbr_mean"
        assert {"exact_recovery", "degree1_rho_reveals_penalty", "beats_baseline"} <= set(p["sums_only"]["flags"])
    for p in hub:  # the hub's sums hold one weighted sum of nine leaves: no exact recovery
        assert p["attacks"]["nbr_mean"]["exact_fraction"] < 0.5
        assert "exact_recovery" not in p["sums_only"]["flags"]
    agents = {a["agent"]: a["sums_only"] for a in rep["agents"]}
    assert agents[0]["exposed_to"] == list(range(1, 10)) and agents[0]["learns_exactly"] == []
    for leaf in range(1, 10):
        assert agents[leaf]["learns_exactly"] == [0]
        assert "degree1" in agents[leaf]["flags"]
    assert rep["summary"]["sums_only_exact_recovery_pairs"] == 9


@pytest.mark.parametrize("which", ["star", "paper"])
def test_decrypt_each_recovers_every_neighbour_under_aggregated(which, star_rec, paper_rec):
    """Every reply is under the receiver's own key: decrypting each one on its own gives
    gamma_ji and gamma_ji (q_j - q_i), hence q_j exactly, for every pair and every call,
    whatever the degree (the hub of the star, the degree-5 agents of the paper's graph)."""
    rec = star_rec if which == "star" else paper_rec
    est = audit.aggregated_attacks(rec)
    qj = rec.q[:, rec.dst]
    gam = rec.penalty_replies
    assert np.array_equal(gam, rec.gamma[:, rec.rev]) and (gam > 0).all()
    assert np.array_equal(np.rint(est["decrypt_each"] * rec.n_max).astype(np.int64), qj)  # every call, every pair
    # from the plaintexts alone: gamma_ji divides the reply exactly
    d = rec.replies
    assert (d % gam[..., None] == 0).all()
    assert np.array_equal(rec.q[:, rec.src] + d // gam[..., None], qj)
    rep = audit.neighbour_audit(rec, "aggregated")
    assert rec.degree.max() >= 2
    for p in rep["pairs"]:
        m = p["attacks"]["decrypt_each"]
        assert m["exact_fraction"] == 1.0
        assert m["rel_err_median"] <= 2 * p["quantization_rel_err_median"] + 1e-12
        assert p["best_attack"] == "decrypt_each"
        assert {"exact_recovery", "beats_baseline"} <= set(p["flags"])
    assert rep["summary"]["exact_recovery_pairs"] == len(rep["pairs"])
    for a in rep["agents"]:
        assert a["learns_exactly"] == a["neighbours"]  # every agent, every neighbour
        assert sorted(a["exposed_to"]) == a["neighbours"]
    # the sums-only view of the same run recovers only the degree-1 agents' neighbours
    exact_so = {(p["attacker"], p["target"]) for p in rep["pairs"] if "exact_recovery" in p["sums_only"]["flags"]}
    assert exact_so == {(int(i), int(j)) for i, j in zip(rec.src, rec.dst) if rec.degree[i] == 1}


def test_paper_protocol_reveals_direction_and_gcd_recovers_U(paper_rec):
    rep = audit.neighbour_audit(paper_rec, "paper")
    deg = paper_rec.degree
    assert deg.max() >= 2
    multi = [p for p in rep["pairs"] if deg[p["attacker"]] >= 2]
    assert multi
    for p in rep["pairs"]:
        # every decrypted message d_ij = gamma_ji (q_j - q_i) points along U_j - U_i
        assert p["difference_direction_corr_min"] > 0.999999
        assert "difference_direction_exact" in p["flags"]
        # and the integer attack removes the scale: q_j exactly
        assert p["attacks"]["gcd"]["exact_fraction"] == 1.0
        assert p["attacks"]["gcd"]["diff_corr_median"] > 0.999999
        assert "exact_recovery" in p["flags"]
        base = p["attacks"]["baseline"]["rel_err_median"]
        assert p["attacks"]["gcd"]["rel_err_median"] < 1e-4 * base
    assert rep["summary"]["exact_recovery_pairs"] == len(rep["pairs"])


def test_gcd_attack_does_not_need_saturated_or_equal_penalties():
    rec = _scenario_recording("random_caps", bcd_iters=3, x_iters=3)
    info = (rec.q[:, rec.dst] != rec.q[:, rec.src]).any(-1)
    moving = rec.gamma[:, rec.rev] != rec.gamma[-1][rec.rev][None]
    assert (moving & info).any()  # some informative messages carry a penalty still being drawn
    rep = audit.neighbour_audit(rec, "paper")
    for p in rep["pairs"]:
        assert p["attacks"]["gcd"]["exact_fraction"] == 1.0
    # splitting rho equally is exact only for a single neighbour when caps differ
    split = [p["attacks"]["rho_split"]["exact_fraction"] for p in rep["pairs"] if p["attacker_degree"] >= 2]
    assert min(split) < 0.5


def test_gcd_scale_correction_uses_the_monotone_schedule():
    # gamma = 3, 3, 5 on one edge; the first difference vector is all even, so its gcd is 6
    diffs = np.array([[2, 4, -6], [1, 2, 7], [3, -1, 2]], dtype=np.int64)
    gammas = np.array([3, 3, 5])
    d = (gammas[:, None] * diffs)[:, None, :]  # (T, 1 edge, P)
    assert np.gcd.reduce(np.abs(d[0, 0])) == 6
    assert _gcd_scales(d)[:, 0].tolist() == [3, 3, 5]


def test_report_fields_and_flags(tmp_path):
    rep = run_audit(("star",), bcd_iters=2, x_iters=10, y_iters=10, paillier=False)
    json.dumps(rep, allow_nan=False)
    sc = rep["scenarios"]["star"]
    assert set(sc) >= {"graph", "fit", "penalty_schedule", "protocols", "eavesdropper_plain"}
    for proto in ("paper", "aggregated"):
        pa = sc["protocols"][proto]
        assert len(pa["agents"]) == 10
        for a in pa["agents"]:
            assert set(a) >= {"agent", "degree", "neighbours", "flags", "learns_exactly", "exposed_to",
                              "partially_exposed_to"}
        for p in pa["pairs"]:
            assert set(p) >= {"attacker", "target", "attacker_degree", "attacks", "best_attack", "advantage",
                              "flags"}
            assert list(p["attacks"]) == list(audit.ATTACKS[proto])
            for m in p["attacks"].values():
                assert set(m) >= {"rel_err_median", "rel_err_early", "rel_err_final", "pearson_median",
                                  "exact_fraction", "per_bcd_rel_err"}
                assert len(m["per_bcd_rel_err"]) == 2 and m["per_bcd_rel_err"][0] is None  # BCD 1: U = 1
    assert all(set(p["sums_only"]) >= {"best_attack", "advantage", "flags"}
               for p in sc["protocols"]["aggregated"]["pairs"])
    assert all("sums_only" not in p for p in sc["protocols"]["paper"]["pairs"])
    assert all(f["view"] in ("honest_but_curious", "sums_only", "eavesdropper") for f in rep["flags"])
    flagged = {(f["protocol"], f["agent"], f["flag"]) for f in rep["flags"]}
    hub = next(f for f in rep["flags"] if f["protocol"] == "aggregated" and f["agent"] == 0
               and f["flag"] == "learns_neighbour_U_exactly")
    assert hub["view"] == "honest_but_curious" and hub["neighbours"] == list(range(1, 10))
    for leaf in range(1, 10):
        assert ("aggregated", leaf, "learns_neighbour_U_exactly") in flagged  # honest-but-curious
        assert ("aggregated", leaf, "sums_only_learns_neighbour_U_exactly") in flagged
        assert ("aggregated", leaf, "degree1_rho_reveals_penalty") in flagged
    assert ("aggregated", 0, "sums_only_learns_neighbour_U_exactly") not in flagged
    assert ("plain", None, "eavesdropper_reads_every_U") in flagged
    md = audit.format_markdown(rep)
    assert "## Flags" in md and "degree1_rho_reveals_penalty" in md and "| 1 -> 0 |" in md
    assert "| 0 -> 1 |" in md and "sums_only" in md and "decrypt_each" in md


def test_script_writes_report(tmp_path):
    spec = importlib.util.spec_from_file_location("privacy_audit", REPO / "scripts" / "privacy_audit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "audit"
    assert mod.main(["--out", str(out), "--scenarios", "star", "--bcd-iters", "2", "--x-iters", "5",
                     "--y-iters", "5", "--no-paillier", "--no-plain", "--quiet"]) == 0
    rep = json.loads((out / "report.json").read_text())
    sm = rep["scenarios"]["star"]["protocols"]["aggregated"]["summary"]
    assert sm["exact_recovery_pairs"] == 18  # honest-but-curious: every pair (decrypt_each)
    assert sm["sums_only_exact_recovery_pairs"] == 9  # sums only: the nine leaves
    assert (out / "report.md").read_text().startswith("# Privacy audit")


@pytest.mark.slow
@pytest.mark.crypto
def test_default_audit_headline_numbers():
    """The numbers docs/THREAT_MODEL.md quotes (scripts/privacy_audit.py's default settings, seed 0)."""
    rep = run_audit(masked_bcd_iters=2)  # the script's default
    for name in ("paper_synthetic", "random_caps", "short_admm"):
        s = rep["scenarios"][name]["protocols"]
        assert s["paper"]["summary"]["exact_recovery_pairs"] == 30
        assert s["aggregated"]["summary"]["exact_recovery_pairs"] == 30  # decrypt_each
        assert s["aggregated"]["summary"]["sums_only_exact_recovery_pairs"] == 2  # agents 0 and 5: degree 1
    star = rep["scenarios"]["star"]["protocols"]
    assert star["paper"]["summary"]["exact_recovery_pairs"] == 18
    assert star["aggregated"]["summary"]["exact_recovery_pairs"] == 18
    assert star["aggregated"]["summary"]["sums_only_exact_recovery_pairs"] == 9
    for ev in rep["eavesdropper_paillier"].values():
        assert ev["scan"]["clean"] and ev["scan"]["n_hits"] == 0
    de = rep["eavesdropper_paillier"]["aggregated"]["decrypt_each"]
    assert de["penalties_match"] and de["replies_match"] and de["q_exact"] == de["informative"] > 0
    for name in ("paper_synthetic", "star", "short_admm"):  # the default, agreed schedule: equal weights
        for b in rep["scenarios"][name]["sums"]["by_degree"].values():
            assert b["exact_neighbour_values"] == 0 and b["certified"] == 0
        assert rep["scenarios"][name]["schedule_leak"]["all"]["attributed"] == 0
    for name, sc in rep["scenarios"].items():  # masked: only the inherent degree-1 receivers
        sm = sc["protocols"]["masked"]["summary"]
        assert sm["exact_recovery_pairs_degree2plus"] == 0
        assert sm["exact_recovery_pairs_degree1"] == (9 if name == "star" else 2)
        assert sc["collusion"]["summary"]["exact_other"] == 0
        mc = sc["masked_ciphertexts"]
        assert mc["uniformity"]["uniform"] and mc["plaintext_matches"] == 0
        assert all(c["independent"] for c in mc["independence"].values())
        assert mc["eavesdropping_neighbour"]["unmasked"] == 0 and mc["collusion"]["higher_unmasked"] == 0
        assert sum(v["exact"] for v in mc["decrypt_each"].values()) == 0
        assert mc["scan"]["n_hits"] == 0
