"""``protocol="masked"``: exact numbers, masks that hide every reply and cancel in every sum,
seeds that stay inside their agents, the degree-1 rules, its cost model and its audit."""
from __future__ import annotations

import copy
import pickle
import warnings

import gmpy2
import numpy as np
import pytest
import torch

from ppdnmf_torch import DegreeOneWarning, GraphError, fit, fit_trials
from ppdnmf_torch import audit
from ppdnmf_torch.models.ppdnmf.audit import record_fit, run_audit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange import CodecRangeError, IntegerCodec, QuantizedExchange
from ppdnmf_torch.exchange.base import Topology
from ppdnmf_torch.exchange.costmodel import COUNT_KEYS, SETUP_KEYS, seed_chunks, setup_counts
from ppdnmf_torch.exchange.paillier import PaillierExchange
from ppdnmf_torch.exchange.paillier import seeds as seeds_mod
from ppdnmf_torch.exchange.paillier.multiexp import SEPARATE_MAX_BASES, signed_multi_exps
from ppdnmf_torch.graph import Graph, random_connected, ring, star

from conftest import CYCLE4, FAKE_COSTS, PATH3, PATH4, drive, small_problem

CPU = torch.device("cpu")
PAPER10 = random_connected(10, 3.0, seed=0)  # degrees 1 to 5
pytestmark = pytest.mark.filterwarnings("ignore::ppdnmf_torch.exchange.paillier.InsecureKeyWarning")


def bound(ex, topo):
    ex.bind(topo, dtype=torch.float64, device=CPU)
    return ex


def _problem(N, seed=0, L=6, K=2):
    counts = tuple(3 + (i % 3) for i in range(N))
    return small_problem(L=L, K=K, counts=counts, seed=seed)


# ----------------------------------------------------------------------- exact numbers
@pytest.mark.crypto
@pytest.mark.parametrize("key_bits", [128, 512])
@pytest.mark.parametrize("packing", [False, True])
def test_full_fit_is_bit_identical_to_every_other_protocol(key_bits, packing, paillier_keypairs):
    """Random penalties, a graph with degrees 1 to 5: masked on real Paillier equals quantized under
    masked, aggregated and paper, whichever packing (the masks cancel, the offsets decode)."""
    blocks = _problem(10, seed=key_bits)
    kw = dict(bcd_iters=2, x_iters=3, y_iters=2, key_bits=key_bits, n_max=1e5, seed=3, g_max=0.05,
              penalty="random", device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegreeOneWarning)
        ref = fit(blocks, PAPER10, 2, exchange="quantized", protocol="aggregated", **kw)
        others = [fit(blocks, PAPER10, 2, exchange="quantized", protocol=p, exchange_options={"packing": packing},
                      **kw) for p in ("masked", "paper")]
        real = fit(blocks, PAPER10, 2, exchange="paillier", protocol="masked",
                   exchange_options={"packing": packing, "workers": 0, "keypairs": paillier_keypairs(key_bits, 10)},
                   **kw)
    for res in others + [real]:
        assert torch.equal(res.X, ref.X) and torch.equal(res.U, ref.U)
        assert all(torch.equal(a, b) for a, b in zip(res.Y, ref.Y))
        for k, v in ref.history.items():
            if not k.startswith("time_"):
                assert res.history[k] == v, k
    assert real.costs["setup_encryptions"] > 0 and real.costs["decryptions"] > 0


@pytest.mark.crypto
def test_step5_alone_and_changed_penalties_match_quantized(paillier_keypairs):
    # step 5 without step 1, and with other penalties than step 1's: its own penalty round
    topo = Topology.from_graphs([PAPER10, ring(10)])
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=128)
    keys = paillier_keypairs(128, topo.n_nodes)
    q = bound(QuantizedExchange(codec, protocol="masked", cost_model=FAKE_COSTS), topo)
    p = bound(PaillierExchange(codec, protocol="masked", keypairs=keys, workers=0, packing=False), topo)
    gen = torch.Generator().manual_seed(0)
    U = torch.rand((topo.n_nodes, 5), generator=gen, dtype=torch.float64) - 0.3
    g = torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
    a, b = q.exchange(U, g, admm_iter=1), p.exchange(U, g, admm_iter=1)
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    q.penalty_sums(g, admm_iter=2), p.penalty_sums(g, admm_iter=2)
    a, b = q.exchange(U, 0.5 * g, admm_iter=2), p.exchange(U, 0.5 * g, admm_iter=2)
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    assert [{k: r[k] for k in COUNT_KEYS} for r in q.pop_iteration_costs()] == \
        [{k: r[k] for k in COUNT_KEYS} for r in p.pop_iteration_costs()]


def test_masked_range_check_covers_the_sum_of_the_terms():
    # |q_j - q_i| small but |q_j| large: the aggregated sums fit 2^62, the masked sums
    # sum_j w_ij |q_j| do not; both integer kinds refuse before anything is encrypted
    topo = Topology.from_graphs([CYCLE4])
    codec = IntegerCodec(n_max=1.0, g_bits=16, key_bits=128)
    U = torch.full((4, 2), 2.0**36, dtype=torch.float64)
    U[0, 0] += 3.0
    g = torch.full((8,), 1.0, dtype=torch.float64)
    out = bound(QuantizedExchange(codec, protocol="aggregated"), topo).exchange(U, g)
    assert bool(torch.isfinite(out.S).all())
    with pytest.raises(CodecRangeError, match=r"masked range: agent \d .*sum_j gamma_ij gamma_ji \|q_j\|"):
        bound(QuantizedExchange(codec, protocol="masked"), topo).exchange(U, g)


# ------------------------------------------------------------------- what a reply shows
@pytest.fixture(scope="module")
def masked_run(paillier_keypairs):
    """A real masked run on the paper-like graph (128-bit keys, packed), its keys and seeds."""
    keys = paillier_keypairs(128, 10)
    with audit.record_seeds() as drawn:
        rec = record_fit(_problem(10, seed=1), PAPER10, 2, kind="paillier", protocol="masked", n_max=1e5,
                               key_bits=128, keypairs=keys, paillier_options={"workers": 0}, bcd_iters=2, x_iters=4,
                               y_iters=2, g_max=0.05, seed=2)
    seeds, plan = audit.tag_seeds(rec, drawn)
    return rec, keys, seeds, plan, list(drawn)


@pytest.mark.crypto
def test_each_reply_decrypts_to_a_uniform_value_unrelated_to_any_plaintext(masked_run):
    rec, keys, seeds, plan, _ = masked_run
    got = audit.masked_ciphertext_audit(rec, keys, seeds, plan)
    assert got["replies"]["ciphertexts"] > 1000
    assert got["uniformity"]["uniform"] and got["uniformity"]["ks_p"] > 1e-3
    for name in ("slot_value", "unmasked_term", "penalty"):
        c = got["independence"][name]
        # the audit's bound is a 99.9 % one (z = 3.29) and the masks come from the OS's CSPRNG, so a
        # run crosses it by chance about once in a few hundred; the test allows z = 4.9 (about one
        # in a million): a reply that depended on its plaintext would give |r| near 1
        assert abs(c["r"]) < 1.5 * c["bound"], (name, c)
    assert got["plaintext_matches"] == 0 and got["plaintexts_checked"] > 1000
    assert all(v["exact"] == 0 for v in got["decrypt_each"].values())
    assert sum(v["informative"] for v in got["decrypt_each"].values()) > 0
    # a neighbour on a link it is not on, with its pair seed: nothing; with the receiver
    # (seeds pooled), exactly the receivers of degree 2 are unmasked (the inherent case)
    assert got["eavesdropping_neighbour"]["checked"] > 0 and got["eavesdropping_neighbour"]["unmasked"] == 0
    co = got["collusion"]
    assert co["degree2_checked"] > 0 and co["degree2_unmasked"] == co["degree2_checked"]
    assert co["higher_checked"] > 0 and co["higher_unmasked"] == 0


@pytest.mark.crypto
def test_the_uniformity_and_independence_checks_can_fail(masked_run):
    # the same statistics on values that are not masked: the checks are not vacuous
    rec, *_ = masked_run
    from ppdnmf_torch.audit.masked import independence_test, uniformity_test

    terms = (rec.w[:, :, None] * rec.q[:, rec.dst]).ravel().astype(np.float64)
    assert uniformity_test(np.abs(terms) / np.abs(terms).max())["uniform"] is False
    assert independence_test(terms, rec.q[:, rec.dst].ravel())["independent"] is False


@pytest.mark.crypto
def test_masks_cancel_in_every_sum_including_the_penalty_sum(masked_run, paillier_keypairs):
    # per receiver, round and ciphertext: the pair units of its neighbours multiply to 1
    rec, keys, seeds, plan, _ = masked_run
    n = [int(pk.n) for pk, _ in keys]
    for i, nbrs in plan.nbrs.items():
        if len(nbrs) < 2:
            continue
        for rnd in (1, 2, 7):
            prod = [gmpy2.mpz(1)] * 3
            for j in nbrs:
                e = plan.out_edges[i][nbrs.index(j)]
                pair = [(t, s) for t, s in plan.tags[e] if t[0] == "pair"]
                store = seeds_mod.SeedStore()
                for t, _ in pair:
                    store.put(t, seeds[t])
                units = store.units(pair, i, rnd, n[i], 3)
                prod = [a * b % (n[i] ** 2) for a, b in zip(prod, units)]
            assert prod == [1, 1, 1]
            # and any one neighbour's units alone are not 1
            assert units != [1, 1, 1]
    # in the protocol itself: the decrypted products are the sums the other protocols give
    topo = Topology.from_graphs([PAPER10])
    codec = IntegerCodec(n_max=1e5, key_bits=128)
    q = bound(QuantizedExchange(codec, protocol="masked"), topo)
    p = bound(PaillierExchange(codec, protocol="masked", keypairs=keys, workers=0), topo)
    ((a,),), ((b,),) = drive([q], topo, lk=7, n_iter=1, seed=5), drive([p], topo, lk=7, n_iter=1, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])


@pytest.mark.crypto
def test_seeds_never_appear_in_the_clear(masked_run):
    rec, keys, seeds, plan, drawn = masked_run
    assert len(drawn) == len(seeds) == sum(1 for _ in plan.pairs()) + PAPER10.n_edges
    ev = audit.eavesdropper_paillier(rec, seeds=drawn)
    assert ev["scan"]["clean"] and ev["scan"]["n_seeds"] == len(drawn)
    kinds = {m.kind for m in rec.transcript}
    assert {"seed", "seed_relay", "edge_seed", "enc_gamma", "enc_shifted", "enc_masked_penalty",
            "enc_masked_reply"} <= kinds
    # the scan finds a seed planted on the wire, as an integer or as one of its chunks
    from ppdnmf_torch.exchange.paillier import WireMessage

    s = drawn[0]
    for planted in (int.from_bytes(s, "big"), seeds_mod.seed_to_chunks(s, 128)[1]):
        bad = list(rec.transcript) + [WireMessage(0, 0, 1, 2, "seed", (planted,), 2)]
        assert audit.eavesdropper_paillier(dataclass_replace(rec, transcript=bad), seeds=drawn)["scan"]["n_hits"] == 1


def dataclass_replace(rec, **kw):
    import dataclasses

    return dataclasses.replace(rec, **kw)


@pytest.mark.crypto
def test_seeds_stay_in_their_agents(paillier_keypairs):
    topo = Topology.from_graphs([PAPER10])
    with audit.record_seeds() as drawn:
        p = bound(PaillierExchange(IntegerCodec(key_bits=128), protocol="masked", keypairs=paillier_keypairs(128, 10),
                                   workers=0), topo)
    store = p.agents[0]._seeds
    assert len(store) > 0 and repr(store) == f"SeedStore({len(store)} seeds)"
    for obj in (store, p.agents[0], p):
        with pytest.raises(TypeError, match="mask seeds"):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
    text = repr(p) + repr(p.agents[0]) + repr(p.rounds.masked.plan.tags[:3])
    for s in drawn:
        assert s.hex() not in text and str(int.from_bytes(s, "big")) not in text
    p.close()
    assert len(store) == 0  # the seeds go with the keys


def test_seed_chunks_round_trip_and_units_skip_non_units():
    for bits in (64, 128, 2048):
        s = bytes(range(32))
        chunks = seeds_mod.seed_to_chunks(s, bits)
        assert len(chunks) == seed_chunks(bits) and all(c < 2 ** (bits - 1) for c in chunks)
        assert seeds_mod.chunks_to_seed(chunks, bits) == s
    n = gmpy2.mpz(3 * 1000003)  # a third of the chunks are not units: they are skipped alike
    u = seeds_mod.unit_stream(b"s" * 32, 4, 9, n, 40)
    assert len(u) == 40 and all(gmpy2.gcd(x, n) == 1 for x in u)
    assert u == seeds_mod.unit_stream(b"s" * 32, 4, 9, n, 40)
    assert u != seeds_mod.unit_stream(b"s" * 32, 4, 10, n, 40)  # another round, other masks


@pytest.mark.parametrize("n_bases", [1, SEPARATE_MAX_BASES, 9])
def test_signed_multi_exponentiation_equals_powmod(n_bases):
    import random

    rng = random.Random(n_bases)
    mod = gmpy2.mpz(rng.getrandbits(256) | 1) ** 2
    bases = []
    while len(bases) < n_bases:  # units only
        b = gmpy2.mpz(rng.randrange(2, int(mod)))
        if gmpy2.gcd(b, mod) == 1:
            bases.append(b)
    rows = [[rng.randrange(-(1 << 30), 1 << 30) for _ in range(n_bases)], [0] * n_bases, [5][:n_bases]]
    got = signed_multi_exps(bases, rows, mod)
    for r, row in zip(got, rows):
        want = gmpy2.mpz(1)
        for b, e in zip(bases, row):
            want = want * gmpy2.powmod(b, e, mod) % mod
        assert r == want


# ----------------------------------------------------------------------- costs
@pytest.mark.crypto
def test_setup_is_counted_apart_and_predicted(paillier_keypairs):
    topo = Topology.from_graphs([PAPER10, star(10)])
    codec = IntegerCodec(key_bits=128)
    q = bound(QuantizedExchange(codec, protocol="masked", cost_model=FAKE_COSTS, packing=True), topo)
    p = bound(PaillierExchange(codec, protocol="masked", keypairs=paillier_keypairs(128, 20), workers=0,
                               cost_model=FAKE_COSTS), topo)
    cq, cp = q.costs(), p.costs()
    want = setup_counts(topo.src.tolist(), topo.dst.tolist(), key_bits=128)
    assert {k: cq[k] for k in SETUP_KEYS} == {k: cp[k] for k in SETUP_KEYS} == want
    assert want["setup_encryptions"] == 3 * (sum(d * (d - 1) // 2 for d in topo.degree.tolist()) + 15 + 9)
    assert all(cq[k] == 0 for k in COUNT_KEYS) and all(cp[k] == 0 for k in COUNT_KEYS)  # rounds only
    assert cp["time_setup"] > 0 and cq["estimated_seconds_setup"] == pytest.approx(cp["estimated_seconds_setup"])
    drive([q, p], topo, lk=9, n_iter=2, seed=1)
    assert all(rec.keys().isdisjoint(SETUP_KEYS) for rec in p.pop_iteration_costs())
    assert p.bytes_per_edge() == q.bytes_per_edge()
    assert {k: q.costs()[k] for k in SETUP_KEYS} == want  # once per run


def test_cost_state_carries_the_setup_into_a_resumed_run():
    topo = Topology.from_graphs([CYCLE4])
    a = bound(QuantizedExchange(IntegerCodec(key_bits=128), protocol="masked", cost_model=FAKE_COSTS), topo)
    b = bound(QuantizedExchange(IntegerCodec(key_bits=128), protocol="masked", cost_model=FAKE_COSTS), topo)
    b.load_cost_state(a.cost_state())
    assert b.costs()["setup_encryptions"] == 2 * a.costs()["setup_encryptions"]  # each segment's own setup


@pytest.mark.crypto
def test_resume_from_a_checkpoint_gives_the_same_bits(tmp_path, paillier_keypairs):
    """A masked Paillier run interrupted after BCD iteration 2 and resumed (new keys, new seeds)
    ends with the bits of the uninterrupted run; the rounds' counters continue, and each
    segment counts its own setup."""
    G = random_connected(6, 2.5, seed=2)
    blocks = _problem(6, seed=7)
    kw = dict(bcd_iters=4, x_iters=3, y_iters=2, device="cpu", seed=4, exchange="paillier", protocol="masked",
              n_max=1e5, key_bits=128)
    opts = {"workers": 0, "cost_model": FAKE_COSTS}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegreeOneWarning)
        full = fit(blocks, G, 2, exchange_options=dict(opts, keypairs=paillier_keypairs(128, 6)), **kw)
        fit(blocks, G, 2, checkpoint_dir=tmp_path, callback=lambda info: info.iteration == 2, exchange_options=opts,
            **kw)
        resumed = fit(blocks, G, 2, resume_from=tmp_path, exchange_options=opts, **kw)
    assert torch.equal(resumed.X, full.X) and torch.equal(resumed.U, full.U)
    assert all(torch.equal(a, b) for a, b in zip(resumed.Y, full.Y))
    assert resumed.history["nmse"] == full.history["nmse"]
    assert {k: resumed.costs[k] for k in COUNT_KEYS} == {k: full.costs[k] for k in COUNT_KEYS}
    assert {k: resumed.costs[k] for k in SETUP_KEYS} == {k: 2 * full.costs[k] for k in SETUP_KEYS}


# ------------------------------------------------------------------ degree-1 agents
def test_fit_warns_naming_the_degree1_agents_and_min_degree_refuses_them():
    blocks = _problem(3)
    kw = dict(bcd_iters=1, x_iters=2, y_iters=1, key_bits=128, n_max=1e4)
    with pytest.warns(DegreeOneWarning, match=r"agents \[0, 2\] have a single neighbour"):
        fit(blocks, PATH3, 2, exchange="quantized", **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegreeOneWarning)
        fit(blocks, PATH3, 2, exchange="plain",
            **{k: v for k, v in kw.items() if k not in ("key_bits", "n_max")})  # plain: no warning
        fit(_problem(4), ring(4), 2, exchange="quantized", min_degree=2, **kw)  # every degree 2
    with pytest.raises(GraphError, match=r"^min_degree: agents \[0, 2\] have fewer than 2 neighbours") as err:
        fit(blocks, PATH3, 2, exchange="quantized", min_degree=2, **kw)
    assert err.value.key == "min_degree"
    for bad in (0, 1.5, True, "2"):
        with pytest.raises(ConfigError, match=r"^min_degree: must be (>= 1|an integer or None), got"):
            fit(blocks, PATH3, 2, min_degree=bad)
    with pytest.raises(GraphError, match=r"agents \[0, 3\] \(trial 1\)"):
        fit_trials([_problem(4), _problem(4)], [ring(4), PATH4], 2, seeds=[0, 1], min_degree=2,
                   bcd_iters=1, x_iters=1, y_iters=1)
    with pytest.warns(DegreeOneWarning, match=r"0 \(trial 1\), 3 \(trial 1\)"):
        fit_trials([_problem(4), _problem(4)], [ring(4), PATH4], 2, seeds=[0, 1], exchange="quantized",
                   bcd_iters=1, x_iters=1, y_iters=1, key_bits=128, n_max=1e4)


def test_config_min_degree_refuses_such_graphs():
    from ppdnmf_torch.models.ppdnmf.config import from_dict
    from ppdnmf_torch.models.ppdnmf.inputs import build_graph

    base = {"n_agents": 6, "data": {"kind": "synthetic", "negative": "allow", "L": 6, "M": 18, "K": 2}}
    assert build_graph(from_dict(dict(base, graph={"kind": "ring", "min_degree": 2}))).n_agents == 6
    with pytest.raises(GraphError, match=r"^graph\.min_degree: agents \[1, 2, 3, 4, 5\]") as err:
        build_graph(from_dict(dict(base, graph={"kind": "star", "min_degree": 2})))
    assert err.value.key == "graph.min_degree"
    with pytest.raises(ConfigError, match=r"^graph\.min_degree: must be >= 1"):
        from_dict(dict(base, graph={"kind": "ring", "min_degree": 0}))


# ----------------------------------------------------------------------- the audit
@pytest.fixture(scope="module")
def paper_rec():
    from ppdnmf_torch.models.ppdnmf.audit.run import _scenario

    blocks, graph, g_max, solver, _ = _scenario("paper_synthetic", 0)
    rank = solver.pop("rank")
    return record_fit(blocks, graph, rank, kind="quantized", n_max=1e6, key_bits=128,
                            **dict(solver, g_max=g_max, bcd_iters=3), negative="allow", seed=0)


def test_masked_neighbour_audit_no_exact_recovery_beyond_degree1(paper_rec):
    pa = audit.neighbour_audit(paper_rec, "masked")
    sm = pa["summary"]
    assert list(pa["pairs"][0]["attacks"]) == list(audit.MASKED_ATTACKS)
    assert sm["exact_recovery_pairs_degree2plus"] == 0  # the target
    assert sm["exact_recovery_pairs_degree1"] == 2 == sm["by_degree"]["1"]["pairs"]  # agents 0 and 5: inherent
    agg = audit.neighbour_audit(paper_rec, "aggregated")["summary"]
    assert agg["exact_recovery_pairs"] == 30  # decrypt_each, for comparison
    deg = paper_rec.degree
    for p in pa["pairs"]:
        if deg[p["attacker"]] >= 2:
            assert p["attacks"]["nbr_mean"]["exact_fraction"] < 0.5 and "exact_recovery" not in p["flags"]


def test_collusion_is_exact_only_in_the_inherent_case(paper_rec):
    co = audit.collusion_audit(paper_rec)
    sm = co["summary"]
    assert sm["triples"] > 0 and sm["inherent_triples"] > 0
    assert sm["exact_inherent"] == sm["inherent_triples"] and sm["exact_other"] == 0
    for t in co["triples"]:
        assert t["inherent"] == (t["remaining"] == 1)


def test_run_audit_takes_user_scenarios_and_reports_masked(tmp_path):
    blocks = _problem(6, seed=4)
    g = Graph(6, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0), (0, 3)])
    rep = run_audit((("hexagon", blocks, g.adjacency() if hasattr(g, "adjacency") else g, 0.05),),
                          bcd_iters=2, x_iters=4, y_iters=2, paillier=False, plain=False)
    sc = rep["scenarios"]["hexagon"]
    assert set(sc["protocols"]) == {"paper", "aggregated", "masked"} and "collusion" in sc
    assert sc["protocols"]["masked"]["summary"]["exact_recovery_pairs"] == 0  # no agent of degree 1
    md = audit.format_markdown(rep)
    assert "### Protocol `masked`" in md and "Two colluding agents" in md and "| degree |" in md


@pytest.mark.crypto
def test_tensorboard_crypto_curves_cover_the_setup(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    from ppdnmf_torch.models.ppdnmf.config import from_dict
    from ppdnmf_torch.app.runner import run

    cfg = from_dict({
        "n_agents": 4, "centralized": False, "progress": False,
        "data": {"kind": "synthetic", "negative": "allow", "L": 6, "M": 16, "K": 2},
        "graph": {"kind": "ring", "min_degree": 2},
        "solver": {"rank": 2, "bcd_iters": 2, "x_iters": 2, "y_iters": 2},
        "exchange": {"kind": "quantized", "n_max": 1e3, "key_bits": 256, "cost_model": True},
    })
    summary = run(cfg, tmp_path / "q")
    assert summary["costs"]["setup_encryptions"] == setup_counts(
        [0, 0, 1, 1, 2, 2, 3, 3], [1, 3, 0, 2, 1, 3, 0, 2], key_bits=256)["setup_encryptions"]
    acc = event_accumulator.EventAccumulator(str(tmp_path / "q" / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"crypto/setup_encryptions", "crypto/setup_ciphertext_bytes", "crypto/estimated_seconds_setup",
            "crypto/encryptions", "crypto_admm/encryptions"} <= tags
    assert not any(t.startswith("crypto_admm/setup") for t in tags)  # once per run, not per iteration
