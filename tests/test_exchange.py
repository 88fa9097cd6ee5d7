"""The exchange kinds without real keys: the integer codec, ``quantized`` vs ``plain``,
range errors, and the cost model's counting (no ``phe`` keys here; see test_crypto.py)."""
from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from ppdnmf_torch import fit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange import EXCHANGE_KINDS, EXCHANGE_OPTIONS, PROTOCOLS, CodecRangeError, ExchangeSpec
from ppdnmf_torch.exchange import IntegerCodec, PaillierSpec, PlainExchange, PlainSpec, QuantizedExchange
from ppdnmf_torch.exchange import QuantizedSpec, SecAggSpec, exchange_spec, make_exchange
from ppdnmf_torch.exchange.base import Exchange, Topology
from ppdnmf_torch.exchange.codec import INT64_LIMIT
from ppdnmf_torch.exchange.costmodel import (
    COUNT_KEYS,
    CostLedger,
    ciphertext_nbytes,
    estimate_seconds,
    public_key_nbytes,
    round_counts,
    round_edge_bytes,
)
from ppdnmf_torch.graph import Graph, ring

from conftest import FAKE_COSTS, penalty_encodings

CPU = torch.device("cpu")
#: fixed per-operation costs, so that no test here measures anything


def isolated_topology() -> Topology:
    """3 nodes, one edge 0 - 1, node 2 without neighbours."""
    t = torch.tensor
    return Topology(1, 3, t([0, 1]), t([1, 0]), t([1, 0]), t([0, 1, 2, 2]), t([1, 1, 0]))


PATH3 = Graph(3, [(0, 1), (1, 2)])
CYCLE4 = ring(4)


def bound(ex, topo, dtype=torch.float64, device=CPU):
    ex.bind(topo, dtype=dtype, device=device)
    return ex


def random_inputs(topo, lk, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    U = scale * torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
    g = 0.5 + 0.5 * torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
    return U, g


# ----------------------------------------------------------------------------- codec
def test_quantized_with_huge_n_max_matches_plain(device):
    """Dyadic penalties are exact in the codec; then only the 1/n_max rounding of U remains."""
    topo = Topology.from_graphs([CYCLE4, Graph(4, [(0, 1), (1, 2), (2, 3)])]).to(device)
    gen = torch.Generator().manual_seed(3)
    U = torch.rand((topo.n_nodes, 12), generator=gen, dtype=torch.float64).to(device)
    g_bits = 16
    g = (torch.randint(1, 1 << g_bits, (topo.n_directed_edges,), generator=gen).double() / (1 << g_bits)).to(device)
    codec = IntegerCodec(n_max=1e9, g_bits=g_bits, key_bits=2048)
    q = bound(QuantizedExchange(codec), topo, device=device).exchange(U, g)
    p = bound(PlainExchange(), topo, device=device).exchange(U, g)
    assert torch.equal(q.rho, p.rho)  # dyadic gamma: rho is exact
    # |S_q - S_p| <= sum_j rho_ij (|dq_j| + |dq_i|) with |dq| <= 0.5 / n_max, plus float rounding
    tol = float(p.rho.max()) * 1.0 / 1e9 + 1e-12
    assert float((q.S - p.S).abs().max()) <= tol


def test_quantized_close_to_plain_with_default_codec():
    topo = Topology.from_graphs([CYCLE4])
    U, g = random_inputs(topo, 6, 0)
    q = bound(QuantizedExchange(IntegerCodec()), topo).exchange(U, g)
    p = bound(PlainExchange(), topo).exchange(U, g)
    # gamma rounding: relative 2^-17 / 0.5 per factor; U rounding: 1e-6
    assert torch.allclose(q.S, p.S, atol=1e-4, rtol=0)
    assert torch.allclose(q.rho, p.rho, atol=1e-4, rtol=0)


def test_decode_is_exact():
    """``S = S_int / (n_max 4^s)`` is the correctly rounded float64 of the exact quotient."""
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=2048)
    gen = torch.Generator().manual_seed(1)
    S_int = torch.randint(-(1 << 52), 1 << 52, (5, 7), generator=gen, dtype=torch.int64)
    rho_int = torch.randint(0, 1 << 40, (5,), generator=gen, dtype=torch.int64)
    S, rho = codec.decode(S_int, rho_int)
    div = Fraction(10**6) * (1 << 32)
    for v, s in zip(S_int.flatten().tolist(), S.flatten().tolist()):
        assert s == float(Fraction(v) / div)
    for v, r in zip(rho_int.tolist(), rho.tolist()):
        assert r == float(Fraction(v, 1 << 32))


def test_negative_values_survive_the_codec():
    codec = IntegerCodec(n_max=100.0, g_bits=4, key_bits=128)
    U = torch.tensor([[-1.25, 0.5, -0.004], [2.0, -3.0, 0.0]], dtype=torch.float64)
    q = codec.encode_values(U)
    assert q.tolist() == [[-125, 50, 0], [200, -300, 0]]
    n = (1 << 127) + 1  # any odd 128-bit modulus
    assert [codec.from_residue(codec.to_residue(v, n), n) for v in q.flatten().tolist()] == q.flatten().tolist()


@pytest.mark.parametrize("key_bits", [64, 66, 128, 512, 1024, 2048, 4096])
def test_emulated_limit_is_the_limit_of_the_key_it_stands_in_for(key_bits):
    """The codec's limit depends on the key size only, and fits every ``key_bits``-bit modulus."""
    codec = IntegerCodec(key_bits=key_bits)
    assert codec.limit == min(1 << (key_bits - 3), INT64_LIMIT)
    smallest_n = (1 << (key_bits - 1)) + 1
    assert codec.limit <= smallest_n // 3 - 1  # phe's max_int = n // 3 - 1
    q = QuantizedExchange(codec)
    assert q.codec.limit == codec.limit


def test_from_residue_refuses_wrapped_values():
    codec = IntegerCodec(key_bits=128)
    n = (1 << 127) + 12345
    assert codec.from_residue(codec.limit - 1, n) == codec.limit - 1
    assert codec.from_residue(n - (codec.limit - 1), n) == -(codec.limit - 1)
    for v in (codec.limit, -codec.limit, n // 2):
        with pytest.raises(CodecRangeError):
            codec.from_residue(v % n, n)


def test_int64_overflow_guard():
    """Values and neighbour sums at or above 2^62 raise, even when the key would allow more."""
    codec = IntegerCodec(n_max=1.0, g_bits=16, key_bits=2048)
    assert codec.limit == INT64_LIMIT
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(QuantizedExchange(codec), topo)
    g = torch.full((topo.n_directed_edges,), 1.0, dtype=torch.float64)
    U = torch.zeros((4, 3), dtype=torch.float64)
    U[2, 1] = 2.0**62
    with pytest.raises(CodecRangeError) as err:
        ex.exchange(U, g, bcd_iter=3, admm_iter=7)
    assert (err.value.agent, err.value.bcd_iter, err.value.admm_iter, err.value.limit) == (2, 3, 7, INT64_LIMIT)
    # each |q| fits, but gamma_ij gamma_ji |q_j - q_i| = 2^32 * 2^31 does not
    U[2, 1] = 2.0**31
    with pytest.raises(CodecRangeError, match="neighbour sum bound"):
        ex.exchange(U, g)
    U[2, 1] = 2.0**27  # 2 neighbours * 2^32 * 2^27 = 2^60: fits
    S = ex.exchange(U, g).S
    assert float(S[2, 1]) == -2 * 2.0**27  # rho_ij = 1 with g = 1


def test_range_error_names_agent_iteration_value_and_limit():
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=128)
    topo = Topology.from_graphs([CYCLE4, CYCLE4])  # node 6 = agent 2 of trial 1
    ex = bound(QuantizedExchange(codec), topo)
    U, g = random_inputs(topo, 4, 0)
    U[6, 3] = -3e13  # |q| = 3e19 > 2^62
    with pytest.raises(CodecRangeError) as err:
        ex.exchange(U, g, bcd_iter=2, admm_iter=5)
    e = err.value
    assert (e.trial, e.agent, e.bcd_iter, e.admm_iter, e.limit) == (1, 2, 2, 5, 1 << 62)
    assert e.value == 3 * 10**19
    msg = str(e)
    for part in ("agent 2", "trial 1", "BCD iteration 2", "ADMM iteration 5", str(1 << 62), "3e+19"):
        assert part in msg
    with pytest.raises(CodecRangeError):
        ex.exchange(U.new_full(U.shape, float("nan")), g)


def test_quantized_is_deterministic_and_rho_agrees():
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(QuantizedExchange(IntegerCodec(n_max=1e4, g_bits=10, key_bits=128)), topo)
    U, g = random_inputs(topo, 5, 4)
    a, b = ex.exchange(U, g), ex.exchange(U.clone(), g.clone())
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    assert torch.equal(ex.penalty_sums(g), a.rho)


# ------------------------------------------------------------------------ cost model
def expected_counts(protocol, D, A1, P, with_penalty_round=True):
    """The formulas of the costmodel docstring, written out once more, per ADMM iteration
    (unpacked: ``P`` values, one per ciphertext)."""
    pen = with_penalty_round
    if protocol == "masked":
        return {"encryptions": A1 * P + (D + A1) * pen, "decryptions": A1 * P + A1 * pen,
                "homomorphic_additions": (D - A1) * P + (D - A1) * pen,
                "scalar_multiplications": D * P + D * pen}
    if protocol == "paper":
        return {"encryptions": (A1 + D) * P, "decryptions": D * P,
                "homomorphic_additions": D * P, "scalar_multiplications": D * P}
    pen = with_penalty_round
    return {"encryptions": (A1 + D) * P + D * pen, "decryptions": A1 * P + A1 * pen,
            "homomorphic_additions": (2 * D - A1) * P + (D - A1) * pen,
            "scalar_multiplications": 2 * D * P + D * pen}


def expected_bytes(protocol, D, P, key_bits):
    C, B = ciphertext_nbytes(key_bits), public_key_nbytes(key_bits)
    if protocol == "masked":
        return D * (2 * C + P * C)  # E_i(gamma_ij) and its masked reply; the P masked replies
    return D * (2 * P * C + B) if protocol == "paper" else D * (2 * P * C + B + C)


@pytest.mark.parametrize("protocol", ["masked", "aggregated", "paper"])
@pytest.mark.parametrize("graphs", [[PATH3], [CYCLE4], [CYCLE4, Graph(4, [(0, 1), (1, 2), (2, 3)])]],
                         ids=["path3", "cycle4", "two-trials"])
def test_cost_model_counts_follow_the_formulas(protocol, graphs):
    topo = Topology.from_graphs(graphs)
    P, key_bits = 6, 128
    ex = bound(QuantizedExchange(IntegerCodec(key_bits=key_bits), protocol=protocol, cost_model=FAKE_COSTS), topo)
    D, A1 = topo.n_directed_edges, topo.n_nodes
    gen = torch.Generator().manual_seed(0)
    n_iter = 3
    for m in range(n_iter):
        U = torch.rand((topo.n_nodes, P), generator=gen, dtype=torch.float64)
        g = 0.1 + torch.rand(D, generator=gen, dtype=torch.float64)
        ex.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
        ex.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
    per_iter = ex.pop_iteration_costs()
    assert ex.pop_iteration_costs() == []
    assert [(r["bcd_iter"], r["admm_iter"]) for r in per_iter] == [(1, m + 1) for m in range(n_iter)]
    want = expected_counts(protocol, D, A1, P)
    for rec in per_iter:
        assert {k: rec[k] for k in want} == want
        assert rec["ciphertext_bytes"] == expected_bytes(protocol, D, P, key_bits)
        assert rec["estimated_seconds"] == pytest.approx(estimate_seconds(rec, FAKE_COSTS))
    total = ex.costs()
    assert {k: total[k] for k in want} == {k: n_iter * v for k, v in want.items()}
    assert total["key_pairs"] == topo.n_nodes
    assert total["estimated_seconds"] == pytest.approx(n_iter * per_iter[0]["estimated_seconds"])
    assert total["estimated_seconds_keygen"] == pytest.approx(topo.n_nodes * FAKE_COSTS.keygen)
    assert all(isinstance(v, (int, float)) for v in total.values())  # flat and numeric
    # per-edge bytes: trial 0 only, both directions of each of its edges
    edges = ex.bytes_per_edge()
    N = topo.n_agents
    trial0 = [(i, j) for i, j in zip(topo.src.tolist(), topo.dst.tolist()) if i < N]
    assert set(edges) == {f"{i}->{j}" for i, j in trial0}
    assert sum(edges.values()) == n_iter * expected_bytes(protocol, len(trial0), P, key_bits)


def test_paper_counts_match_the_algorithm_page():
    """ALGORITHM.md: N + 2E encryptions, 2E additions, scalar mults and decryptions of LK values."""
    c = round_counts("paper", "exchange", n_edges=30, n_senders=10, lk=17689)
    assert c == {"encryptions": 40 * 17689, "homomorphic_additions": 30 * 17689,
                 "scalar_multiplications": 30 * 17689, "decryptions": 30 * 17689}
    assert round_counts("paper", "penalty", n_edges=30, n_senders=10) == dict.fromkeys(c, 0)
    agg = round_counts("aggregated", "exchange", n_edges=30, n_senders=10, lk=17689)
    assert agg["decryptions"] == 10 * 17689 and agg["encryptions"] == c["encryptions"]


def test_cost_model_with_an_isolated_node():
    topo = isolated_topology()
    for protocol in ("masked", "aggregated", "paper"):
        ex = bound(QuantizedExchange(IntegerCodec(key_bits=128), protocol=protocol, cost_model=FAKE_COSTS), topo)
        U, g = random_inputs(topo, 4, 0)
        ex.penalty_sums(g, admm_iter=1)
        out = ex.exchange(U, g, admm_iter=1)
        assert float(out.rho[2]) == 0.0 and bool((out.S[2] == 0).all())
        (rec,) = ex.pop_iteration_costs()
        want = expected_counts(protocol, 2, 2, 4)
        assert {k: rec[k] for k in want} == want


@pytest.mark.parametrize("protocol", ["masked", "aggregated"])
def test_model_counts_a_penalty_round_when_step_1_was_skipped(protocol):
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(QuantizedExchange(IntegerCodec(key_bits=128), protocol=protocol, cost_model=FAKE_COSTS), topo)
    U, g = random_inputs(topo, 3, 0)
    ex.exchange(U, g, admm_iter=1)  # no penalty_sums first: the mini-round runs in step 5
    ex.penalty_sums(g, admm_iter=2)
    ex.exchange(U, g, admm_iter=2)  # same penalties as step 1: reused
    ex.penalty_sums(g, admm_iter=3)
    ex.exchange(U, g * 0.5, admm_iter=3)  # different penalties: a second mini-round
    recs = ex.pop_iteration_costs()
    one = round_counts(protocol, "penalty", n_edges=8, n_senders=4)["encryptions"]
    base = round_counts(protocol, "exchange", n_edges=8, n_senders=4, lk=3)["encryptions"]
    assert [r["encryptions"] for r in recs] == [base + one, base + one, base + 2 * one]


def test_cost_model_is_off_by_default_and_fit_leaves_it_off():
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(QuantizedExchange(IntegerCodec(key_bits=128)), topo)
    U, g = random_inputs(topo, 3, 0)
    ex.penalty_sums(g)
    ex.exchange(U, g)
    assert ex.costs() == {} and ex.pop_iteration_costs() == [] and ex.bytes_per_edge() == {}
    Z = torch.rand(5, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    res = fit(Z, CYCLE4, 2, bcd_iters=1, x_iters=2, y_iters=2, exchange="quantized", key_bits=128)
    assert res.costs == {}
    res = fit(Z, CYCLE4, 2, bcd_iters=1, x_iters=2, y_iters=2, exchange="quantized", key_bits=128,
              exchange_options={"cost_model": FAKE_COSTS})
    want = expected_counts("masked", 8, 4, 5 * 2)  # the default protocol
    assert {k: res.costs[k] for k in want} == {k: 2 * v for k, v in want.items()}
    assert res.costs["estimated_seconds"] > 0


def test_plain_and_base_cost_defaults():
    ex = bound(PlainExchange(), Topology.from_graphs([CYCLE4]))
    assert ex.costs() == {} and ex.pop_iteration_costs() == [] and ex.bytes_per_edge() == {}


def test_make_exchange_options():
    q = make_exchange("quantized", protocol="paper", key_bits=128, cost_model=True)
    assert isinstance(q, QuantizedExchange) and q.protocol == "paper" and q.cost_model
    with pytest.raises(ConfigError, match=r"^cost_model: does not apply to exchange='plain'"):
        make_exchange("plain", cost_model=True)  # plain has no protocol to cost: refused, not ignored
    with pytest.raises(ConfigError, match="keypairs"):
        make_exchange("quantized", keypairs=[])
    with pytest.raises(ConfigError, match="workers"):
        make_exchange("quantized", key_bits=2048, workers=4)
    with pytest.raises(ConfigError, match="protocol"):
        QuantizedExchange(IntegerCodec(), protocol="nope")
    with pytest.raises(ConfigError, match="cost_model"):
        QuantizedExchange(IntegerCodec(), cost_model="yes")
    assert set(EXCHANGE_OPTIONS) == {"plain", "quantized", "paillier", "secagg"}


def test_edge_bytes_and_sizes():
    assert ciphertext_nbytes(128) == 32 and public_key_nbytes(128) == 16
    assert ciphertext_nbytes(2048) == 512 and public_key_nbytes(2048) == 256
    assert ciphertext_nbytes(66) == 17 and public_key_nbytes(66) == 9
    rows = round_edge_bytes("aggregated", "penalty", [0, 1], [1, 0], key_bits=128)
    assert rows == [(0, 1, 16), (1, 0, 32), (1, 0, 16), (0, 1, 32)]
    rows = round_edge_bytes("paper", "exchange", [0], [1], key_bits=128, lk=2)
    assert rows == [(0, 1, 2 * 32 + 16), (1, 0, 2 * 32)]


def test_ledger_records_and_pop():
    led = CostLedger(2, timers=False)
    led.add("encryptions", 5)  # outside any iteration: total only
    led.begin(1, 1)
    led.add("encryptions", 2)
    led.begin(1, 1)  # same iteration: same record
    led.add_edge_bytes(0, 1, 10)
    led.add_edge_bytes(2, 3, 7)  # trial 1: total only
    led.begin(1, 2)
    led.add("decryptions", 1)
    recs = led.pop()
    assert [(r["encryptions"], r["ciphertext_bytes"], r["decryptions"]) for r in recs] == [(2, 17, 0), (0, 0, 1)]
    assert led.total["encryptions"] == 7 and led.edges == {"0->1": 10}
    assert led.pop() == []
    assert set(COUNT_KEYS) <= set(recs[0])


@pytest.mark.parametrize("scale", [10**6, 10**9])  # bound below and above 2^53
def test_integer_neighbour_sums_fast_float_path_is_exact(scale):
    """Below 2^53 the sums go through a float64 sparse matmul; above, through int64 gathers.
    Both must give exactly the integers of the plain definition."""
    from ppdnmf_torch import graph as graph_mod
    from ppdnmf_torch.exchange.integer import integer_neighbour_sums

    g = graph_mod.random_connected(40, 4.0, seed=3)
    gen = torch.Generator().manual_seed(scale % 97)
    q = torch.randint(-scale, scale, (40, 37), generator=gen)
    w = torch.randint(0, 5 * 10**6, (g.src.numel(),), generator=gen)
    S, rho = integer_neighbour_sums(q, w, Topology.from_graphs([g]))
    expected = [[sum(int(w[e]) * (int(q[int(g.dst[e]), c]) - int(q[i, c]))
                     for e in range(int(g.crow[i]), int(g.crow[i + 1]))) for c in range(37)] for i in range(40)]
    assert S.dtype == torch.int64 and S.tolist() == expected
    assert rho.tolist() == [sum(int(w[e]) for e in range(int(g.crow[i]), int(g.crow[i + 1]))) for i in range(40)]


def test_quantized_step5_reuses_step1_penalty_encoding(monkeypatch):
    # the same g in steps 1 and 5 of an iteration: encoded (and range-checked) once; same bits
    codec = IntegerCodec(n_max=1e4, g_bits=16, key_bits=256)
    topo = Topology.from_graphs([ring(5)])
    ex = QuantizedExchange(codec)
    ex.bind(topo, dtype=torch.float64, device=torch.device("cpu"))
    calls, U, g = penalty_encodings(monkeypatch, topo, 0, 6)
    ex.penalty_sums(g)
    a = ex.exchange(U, g)
    assert len(calls) == 1
    ex.penalty_sums(g)
    b = ex.exchange(U, g.clone())  # another tensor: encoded again
    assert len(calls) == 3
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)
    c = ex.exchange(U, g)  # no step 1 before it: encoded here
    assert len(calls) == 4 and torch.equal(a.S, c.S)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("n, p", [(7, 3), (40, 300)])
def test_sparse_matmul_gives_the_bits_of_mm_and_never_reads_out(n, p, dtype, device):
    from ppdnmf_torch._utils import sparse_csr, sparse_matmul
    from ppdnmf_torch.graph import random_connected

    g = random_connected(n, 3.0, seed=n)
    gen = torch.Generator().manual_seed(p)
    topo = Topology.from_graphs([g]).to(device)
    vals = torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64).to(device, dtype) - 0.5
    W = sparse_csr(topo.crow, topo.dst, vals, n)
    B = (torch.rand((n, p), generator=gen, dtype=torch.float64) - 0.5).to(device, dtype)
    want = torch.mm(W, B)
    assert torch.equal(sparse_matmul(W, B), want)
    out = torch.full((n, p), float("nan"), dtype=dtype, device=device)  # written, never read
    assert sparse_matmul(W, B, out) is out and torch.equal(out, want)


def test_abs_max_is_the_largest_magnitude_without_a_temporary():
    import math

    from ppdnmf_torch.exchange.codec import abs_max

    assert abs_max(torch.zeros(0, 3)) == 0.0
    assert abs_max(torch.tensor([[3, -7], [2, 1]])) == 7.0
    assert abs_max(torch.tensor([-(2**62), 5])) == float(2**62)
    assert abs_max(torch.tensor([1.5, -0.25, 1.0], dtype=torch.float64)) == 1.5
    assert abs_max(torch.tensor([1.0, float("-inf")])) == float("inf")
    assert math.isnan(abs_max(torch.tensor([1.0, float("nan"), -3.0])))


@pytest.mark.parametrize("protocol", ["aggregated", "paper"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("scale", [1 / 64, 64.0], ids=["float-path", "int64-path"])
def test_quantized_buffers_give_the_numbers_of_fresh_tensors(monkeypatch, protocol, dtype, scale):
    """Large exchanges compute in buffers the exchange keeps; the numbers are those of fresh
    tensors, call after call, with and without the caller's ``out``, on the float64 path and
    on the int64 one (sums too large for float64 to hold exactly)."""
    topo = Topology.from_graphs([CYCLE4, Graph(4, [(0, 1), (1, 2), (2, 3)])])
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=2048)
    fresh = bound(QuantizedExchange(codec, protocol=protocol), topo, dtype=dtype)
    kept = bound(QuantizedExchange(codec, protocol=protocol), topo, dtype=dtype)
    kept.BUFFER_MIN_BYTES = 0  # buffers at every size (fresh keeps the default: none at this size)
    from ppdnmf_torch.exchange import integer

    float_path = []
    real = integer.sparse_matmul
    monkeypatch.setattr(integer, "sparse_matmul", lambda *a: float_path.append(1) or real(*a))
    for seed in range(3):
        U, g = random_inputs(topo, 9, seed, scale=scale)
        U = U.to(dtype)
        want = fresh.exchange(U, g)
        out = torch.full_like(U, float("nan"))
        got = kept.exchange(U, g, out=out)
        assert got.S is out and torch.equal(got.S, want.S) and torch.equal(got.rho, want.rho)
        again = kept.exchange(U, g)  # without out: a fresh S, none of the exchange's buffers
        assert torch.equal(again.S, want.S)
        assert all(again.S.data_ptr() != b.data_ptr() for b in kept._bufs)
    assert kept._bufs is not None and fresh._bufs is None
    assert bool(float_path) == (scale < 1)


# ------------------------------------------------------------------ the exchange spec
#: one spec per kind, with settings away from the defaults (2048-bit keys: nothing warns)
SPEC_CASES = [
    PlainSpec(),
    QuantizedSpec(protocol="paper", n_max=1e4, key_bits=512, g_bits=12, cost_model=FAKE_COSTS, packing=True,
                  slot_bits=40),
    PaillierSpec(protocol="paper", n_max=1e5, key_bits=2048, g_bits=10, cost_model=True, fast=True, packing=False,
                 slot_bits=50, precompute=False, djn=True, djn_exponent_bits=256, workers=0,
                 record_transcript=True),
    SecAggSpec(n_max=1e5, g_bits=10, record_transcript=True),
]


@pytest.mark.parametrize("spec", SPEC_CASES, ids=lambda s: s.kind)
def test_make_exchange_of_a_spec_has_that_spec(spec):
    ex = make_exchange(spec)
    assert ex.spec == spec and type(ex.spec) is type(spec) and ex.name == spec.kind
    assert exchange_spec(ex) is ex and exchange_spec(spec) is spec
    # the round trip through the flat form: a kind name, its flat values and its options
    values = {k: getattr(spec, k) for k in spec.keys()}
    flat = {k: values.pop(k) for k in ("protocol", "n_max", "key_bits", "g_bits") if k in values}
    assert exchange_spec(spec.kind, **flat, options=values) == spec
    assert make_exchange(spec.kind, **flat, **values).spec == spec
    # equal values agree with a spec and with an exchange
    assert exchange_spec(spec, **flat, options=values) is spec and exchange_spec(ex, **flat, options=values) is ex


def test_spec_kinds_and_options_are_the_specs_fields():
    assert tuple(s.kind for s in SPEC_CASES) == EXCHANGE_KINDS and PROTOCOLS == ("masked", "aggregated", "paper")
    assert all(isinstance(s, ExchangeSpec) for s in SPEC_CASES)
    assert EXCHANGE_OPTIONS == {"plain": (), "quantized": ("cost_model", "packing", "slot_bits"),
                                "paillier": ("cost_model", "fast", "packing", "slot_bits", "precompute", "djn",
                                             "djn_exponent_bits", "workers", "record_transcript", "keypairs",
                                             "pool_audit"),
                                "secagg": ("record_transcript",)}
    from ppdnmf_torch.models.ppdnmf import config
    from ppdnmf_torch.exchange import spec

    assert config.SPECS is spec.SPECS and config.EXCHANGE_KINDS is spec.EXCHANGE_KINDS


@pytest.mark.parametrize("cls, bad", [
    (QuantizedSpec, dict(protocol="gossip")), (QuantizedSpec, dict(n_max=0.5)), (QuantizedSpec, dict(g_bits=31)),
    (QuantizedSpec, dict(key_bits=8)), (QuantizedSpec, dict(cost_model="yes")), (QuantizedSpec, dict(packing=1)),
    (QuantizedSpec, dict(slot_bits=80)), (PaillierSpec, dict(key_bits=129)), (PaillierSpec, dict(fast=1)),
    (PaillierSpec, dict(workers=-1)), (PaillierSpec, dict(workers=True)), (PaillierSpec, dict(djn_exponent_bits=8)),
    (PaillierSpec, dict(slot_bits=80)), (PaillierSpec, dict(n_max=float("inf"))),
])
def test_specs_check_their_settings_and_name_them(cls, bad):
    key = next(iter(bad))
    with pytest.raises(ConfigError, match=f"^{key}: "):
        cls(**bad)
    with pytest.raises(ConfigError, match=f"^{key}: "):
        exchange_spec(cls.kind, options=bad)


def test_specs_rules_are_the_exchanges_rules():
    # the constructors go through the spec: the same messages
    for make, bad in ((lambda: QuantizedExchange(IntegerCodec(), protocol="gossip"), "protocol"),
                      (lambda: QuantizedExchange(IntegerCodec(), packing="no"), "packing")):
        with pytest.raises(ConfigError, match=f"^{bad}: "):
            make()
    with pytest.raises(ConfigError, match="^n_max: must be a finite number >= 1") as a:
        IntegerCodec(n_max=0.5)
    with pytest.raises(ConfigError) as b:
        QuantizedSpec(n_max=0.5)
    assert str(a.value) == str(b.value)
    # the naive path has no slots: slot_bits is not checked there, as before
    assert PaillierSpec(fast=False, slot_bits=80).slot_bits == 80


def test_exchange_spec_from_a_kind_takes_what_is_given():
    assert exchange_spec() == PlainSpec() and exchange_spec("plain") == PlainSpec()
    assert exchange_spec("quantized", n_max=1e4, key_bits=None, options={"packing": True}) == \
        QuantizedSpec(n_max=1e4, packing=True)
    assert exchange_spec("paillier", key_bits=512, options={"workers": 0}) == PaillierSpec(key_bits=512, workers=0)
    assert exchange_spec("quantized", n_max=1e4, options={"n_max": 1e4}).n_max == 1e4  # twice, equal


@pytest.mark.parametrize("args, kw, match", [
    (("plain",), dict(n_max=1e5), r"^n_max: does not apply to exchange='plain' \(it takes no settings\)"),
    (("plain",), dict(options={"cost_model": True}), r"^cost_model: does not apply to exchange='plain'"),
    (("quantized",), dict(options={"workers": 2}), r"^workers: does not apply to exchange='quantized' \(it takes "),
    (("quantized",), dict(options={"keypairs": []}), r"^keypairs: does not apply to exchange='quantized'"),
    (("nope",), {}, r"^exchange: unknown kind 'nope'"),
    ((QuantizedSpec(key_bits=128),), dict(key_bits=512), r"^key_bits: 512 contradicts the given spec's key_bits=128"),
    ((QuantizedSpec(),), dict(options={"packing": True}), r"^packing: True contradicts the given spec's packing"),
    ((PlainSpec(),), dict(protocol="paper"), r"^protocol: does not apply to exchange='plain'"),
    (("quantized",), dict(n_max=1e4, options={"n_max": 1e5}), r"^n_max: given twice"),
    (("quantized",), dict(options=[("packing", True)]), r"^options: expected a dict"),
])
def test_exchange_spec_refuses_and_names_the_key(args, kw, match):
    with pytest.raises(ConfigError, match=match):
        exchange_spec(*args, **kw)


def test_exchange_spec_checks_a_given_exchange():
    q = QuantizedExchange(IntegerCodec(key_bits=128), protocol="paper")
    assert exchange_spec(q, key_bits=128, protocol="paper") is q
    with pytest.raises(ConfigError, match=r"^protocol: 'aggregated' contradicts the given exchange's protocol='paper'"):
        exchange_spec(q, protocol="aggregated")
    with pytest.raises(ConfigError, match=r"^cost_model: True contradicts"):
        exchange_spec(q, options={"cost_model": True})

    class Custom(PlainExchange):
        @property
        def spec(self):
            return None

    c = Custom()
    assert exchange_spec(c) is c and make_exchange(c) is c
    with pytest.raises(ConfigError, match=r"^n_max: the exchange Custom has no spec"):
        exchange_spec(c, n_max=1e4)


def test_make_exchange_flat_keywords_are_never_dropped():
    # plain takes no settings: a flat value for it is refused, not ignored; for a given
    # exchange, values that agree are fine and values that contradict it are refused
    assert isinstance(make_exchange("plain"), PlainExchange)
    with pytest.raises(ConfigError, match=r"^n_max: does not apply to exchange='plain'"):
        make_exchange("plain", n_max=1e4)
    with pytest.raises(ConfigError, match="^protocol: does not apply"):
        make_exchange("plain", protocol="gossip")
    q = QuantizedExchange(IntegerCodec(key_bits=128))
    assert make_exchange(q, protocol="masked", n_max=1e6, key_bits=128, g_bits=16) is q
    with pytest.raises(ConfigError, match=r"^key_bits: 512 contradicts the given exchange's key_bits=128"):
        make_exchange(q, key_bits=512)
    with pytest.raises(ConfigError, match=r"^packing: True contradicts"):
        make_exchange(q, packing=True)
    with pytest.raises(ConfigError, match="^mixin: "):
        make_exchange(q, mixin=object)


def test_fit_refuses_an_exchange_with_a_conflicting_keyword():
    import ppdnmf_torch as pp
    from conftest import small_problem
    from ppdnmf_torch.graph import ring

    q = QuantizedExchange(IntegerCodec(n_max=1e4, key_bits=2048))
    with pytest.raises(ConfigError, match=r"^n_max: 1000000\.0 contradicts the given exchange's n_max=10000"):
        pp.fit(small_problem(), ring(4), 2, exchange=q, n_max=1e6, bcd_iters=1, x_iters=1, y_iters=1, device="cpu")
    r = pp.fit(small_problem(), ring(4), 2, exchange=q, n_max=1e4, bcd_iters=1, x_iters=1, y_iters=1, device="cpu")
    assert r.n_iter == 1


class _CallLog:
    """A tiny mixin: records every step-1 and step-5 call, then does what the kind does."""

    def penalty_sums(self, g, **kw):
        self.__dict__.setdefault("calls", []).append(("penalty_sums", kw.get("admm_iter")))
        return super().penalty_sums(g, **kw)

    def exchange(self, U, g, **kw):
        self.__dict__.setdefault("calls", []).append(("exchange", kw.get("admm_iter")))
        return super().exchange(U, g, **kw)


@pytest.mark.parametrize("kind", ["plain", "quantized"])
def test_make_exchange_with_a_mixin(kind):
    topo = Topology.from_graphs([CYCLE4])
    ex = bound(make_exchange(kind, mixin=_CallLog), topo)
    ref = bound(make_exchange(kind), topo)
    cls = type(ex)
    assert isinstance(ex, _CallLog) and type(ref) in cls.__mro__ and cls.__mro__[1] is _CallLog
    assert cls.__name__ == f"_CallLog{type(ref).__name__}"
    assert type(make_exchange(kind, mixin=_CallLog)) is cls  # one class per (mixin, kind)
    assert ex.spec == ref.spec
    U, g = random_inputs(topo, 5, 0)
    rho = ex.penalty_sums(g, admm_iter=1)
    out, want = ex.exchange(U, g, admm_iter=1), ref.exchange(U, g, admm_iter=1)
    assert ex.calls == [("penalty_sums", 1), ("exchange", 1)]
    assert torch.equal(out.S, want.S) and torch.equal(out.rho, want.rho) and torch.equal(rho, want.rho)


def test_paillier_spec_hides_the_keys():
    keys = ["not-a-key-but-a-secret"]
    spec = PaillierSpec(key_bits=2048, keypairs=keys, pool_audit=print)
    assert "keypairs" not in repr(spec) and "secret" not in repr(spec) and "pool_audit" not in repr(spec)
    assert spec == PaillierSpec(key_bits=2048)  # neither is compared
    ex = make_exchange(spec)
    assert ex.spec == spec and ex.spec.keypairs is None  # the exchange keeps its keys apart


def test_every_kind_has_a_spec_the_base_has_none():
    assert Exchange.spec.fget(PlainExchange()) is None
    assert PlainExchange().spec == PlainSpec()
    assert QuantizedExchange(IntegerCodec(n_max=1e3)).spec == QuantizedSpec(n_max=1e3)


def test_ciphertext_bytes_from_the_key_size_are_those_of_n_squared():
    # ceil(bits(n^2) / 8) for a k-bit n: n^2 has 2k - 1 or 2k bits, the same bytes either way
    for k in range(16, 4200):
        assert ciphertext_nbytes(k) == (2 * k - 1 + 7) // 8 == (2 * k + 7) // 8
        assert public_key_nbytes(k) == -(-k // 8)


def test_the_exchange_core_imports_no_paillier_module():
    # in a fresh process: the cost model, the specs, the factory and the quantized kind
    # (whose calibration waits for its first estimate) import neither phe nor paillier/
    import subprocess
    import sys

    code = ("import sys\n"
            "for m in ('ppdnmf_torch.exchange.costmodel', 'ppdnmf_torch.exchange.spec', "
            "'ppdnmf_torch.exchange.factory', 'ppdnmf_torch.exchange.quantized', 'ppdnmf_torch.exchange'):\n"
            "    __import__(m)\n"
            "assert 'ppdnmf_torch.exchange.paillier' not in sys.modules\n"
            "bad = [m for m in sys.modules if m.startswith('ppdnmf_torch.exchange.paillier') or m == 'phe']\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)
