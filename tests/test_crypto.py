"""The real Paillier stage (``exchange="paillier"``) with small keys made once per session.

Bit identity with ``quantized``, both protocols, key privacy, pickling refusal, range
errors, and cost counters equal to the cost model's prediction.
"""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from ppdnmf_torch import PAPER_SETTINGS, fit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange import CodecRangeError, IntegerCodec, PlainExchange, QuantizedExchange, make_exchange
from ppdnmf_torch.exchange.base import Topology
from ppdnmf_torch.exchange.costmodel import COUNT_KEYS, TIME_KEYS
from ppdnmf_torch.exchange.paillier import (
    EncryptedVector,
    InsecureKeyWarning,
    KeyMismatchError,
    PaillierExchange,
)
from ppdnmf_torch.exchange.paillier.calibration import calibrate
from ppdnmf_torch.models.ppdnmf.problem import build_problem
from ppdnmf_torch.models.ppdnmf.solver import init_state, run_bcd, solver_params

from conftest import CYCLE4, FAKE_COSTS, PATH3, PATH4, PROTOCOLS, drive

pytestmark = [
    pytest.mark.crypto,
    pytest.mark.filterwarnings("ignore::ppdnmf_torch.exchange.paillier.InsecureKeyWarning"),
]

CPU = torch.device("cpu")


def pair(topo, protocol, keys, key_bits=128, n_max=1e6, g_bits=16, **opts):
    """A bound (quantized, paillier) pair with the same codec."""
    codec = IntegerCodec(n_max=n_max, g_bits=g_bits, key_bits=key_bits)
    q = QuantizedExchange(codec, protocol=protocol, **opts)
    p = PaillierExchange(codec, protocol=protocol, keypairs=keys(key_bits, topo.n_nodes), **opts)
    for ex in (q, p):
        ex.bind(topo, dtype=torch.float64, device=CPU)
    return q, p


# ---------------------------------------------------------------- protocol correctness
@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("graph", [PATH3, CYCLE4], ids=["path3", "cycle4"])
def test_protocol_matches_plain_within_quantization(graph, protocol, paillier_keypairs):
    topo = Topology.from_graphs([graph])
    q, p = pair(topo, protocol, paillier_keypairs)
    plain = PlainExchange()
    plain.bind(topo, dtype=torch.float64, device=CPU)
    outs_q, outs_p, outs_f = drive([q, p, plain], topo, lk=6, n_iter=2, seed=1)
    for (rq, Sq, rhoq, _, _), (rp, Sp, rhop, U, g), (rf, Sf, rhof, _, _) in zip(outs_q, outs_p, outs_f):
        assert torch.equal(Sp, Sq) and torch.equal(rhop, rhoq) and torch.equal(rp, rq)
        assert bool((Sf < 0).any())  # negative sums crossed the ciphertext domain
        # error bound: gamma rounding (<= 2^-17 absolute per penalty) and U rounding (0.5 / n_max)
        w = g * g[topo.rev]
        dw = (g.abs() + g[topo.rev].abs() + 2.0**-17) * 2.0**-17
        diff = (U[topo.dst] - U[topo.src]).abs()
        bnd = torch.zeros_like(U).index_add_(0, topo.src, dw[:, None] * diff + w[:, None] * 1e-6)
        assert bool(((Sp - Sf).abs() <= bnd + 1e-12).all())
        assert torch.allclose(rp, rf, atol=float(dw.sum()), rtol=0)


@pytest.mark.parametrize("key_bits", [128, 512])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bit_identical_to_quantized(protocol, key_bits, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4, PATH4])  # two trials, different graphs
    q, p = pair(topo, protocol, paillier_keypairs, key_bits=key_bits)
    outs_q, outs_p = drive([q, p], topo, lk=5, n_iter=3, seed=key_bits)
    for a, b in zip(outs_q, outs_p):
        for x, y in zip(a[:3], b[:3]):
            assert x.dtype == y.dtype and torch.equal(x, y)


def test_float32_output_identical(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    q, p = pair(topo, "aggregated", paillier_keypairs)
    U = torch.rand((4, 3), generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    g = torch.full((8,), 0.3, dtype=torch.float64)
    a, b = q.exchange(U, g), p.exchange(U, g)
    assert a.S.dtype == b.S.dtype == torch.float32 and torch.equal(a.S, b.S)


def _blocks(seed, N=4, L=6, K=2, M=(3, 4, 2, 5)):
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand(L, K, generator=gen, dtype=torch.float64)
    return [X @ torch.rand(K, m, generator=gen, dtype=torch.float64) for m in M[:N]]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_fit_paillier_equals_fit_quantized(protocol, paillier_keypairs):
    Z = torch.cat(_blocks(0), dim=1)
    kw = dict(bcd_iters=2, x_iters=3, y_iters=3, key_bits=128, n_max=1e6, protocol=protocol, seed=5)
    rq = fit(Z, CYCLE4, 2, exchange="quantized", **kw)
    rp = fit(Z, CYCLE4, 2, exchange="paillier", exchange_options={"keypairs": paillier_keypairs(128, 4)}, **kw)
    assert torch.equal(rq.X, rp.X) and torch.equal(rq.U, rp.U)
    assert all(torch.equal(a, b) for a, b in zip(rq.Y, rp.Y))
    for k, v in rq.history.items():
        if not k.startswith("time_"):
            assert rp.history[k] == v, k
    assert rp.costs["encryptions"] > 0 and rp.costs["time_encrypt"] > 0


def test_fit_generates_its_own_keys():
    Z = torch.cat(_blocks(1, N=3, M=(3, 3, 3)), dim=1)
    with pytest.warns(InsecureKeyWarning):
        res = fit(Z, PATH3, 2, bcd_iters=1, x_iters=2, y_iters=1, exchange="paillier", key_bits=64)
    assert res.costs["key_pairs"] == 3 and res.costs["time_keygen"] > 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multiple_trials_and_frozen_agents(protocol, paillier_keypairs):
    """Batched trials (nodes t*N+i) and agents stopped by the BCD rule: same bits as quantized."""
    graphs = [CYCLE4, PATH4]
    caps = torch.tensor([[0.3, 0.5, 0.4, 0.6], [0.2, 0.25, 0.3, 0.35]], dtype=torch.float64)
    problem = build_problem([_blocks(2), _blocks(3)], graphs, caps, [7, 8], dtype=torch.float64, device=CPU)
    params = solver_params(2, mu=0.1, eta=1.0, bcd_iters=2, x_iters=3, y_iters=2, admm_tol=None,
                           **PAPER_SETTINGS)
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=128)
    states = []
    for ex in (QuantizedExchange(codec, protocol=protocol),
               PaillierExchange(codec, protocol=protocol, keypairs=paillier_keypairs(128, 8))):
        ex.bind(problem.topology, dtype=torch.float64, device=CPU)
        state = init_state(problem, params.rank)
        state.frozen = torch.tensor([[False, True, False, False], [False, False, False, True]])
        state, _, _ = run_bcd(problem, params, ex, state=state)
        states.append(state)
    a, b = states
    for name, t in a.tensors().items():
        assert torch.equal(t, getattr(b, name)), name
    # the frozen agents kept their initial U = 1
    assert bool((a.U[0, 1] == 1).all()) and bool((a.U[1, 3] == 1).all())


# ------------------------------------------------------------------------ key privacy
def test_agent_cannot_decrypt_another_agents_message(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    _, p = pair(topo, "aggregated", paillier_keypairs)
    a0, a1 = p.agents[0], p.agents[1]
    msg = a0.encrypt([5, -7, 123456])
    assert a0.decrypt(msg) == [5, -7, 123456]
    with pytest.raises(KeyMismatchError, match="another agent's public key"):
        a1.decrypt(msg)
    # a message relabelled with agent 1's key: the wrong private key gives garbage, out of range
    forged = EncryptedVector(a1.public_key, msg.ciphertexts)
    with pytest.raises(CodecRangeError, match="agent 1") as err:
        a1.decrypt(forged, bcd_iter=4, admm_iter=2)
    assert (err.value.agent, err.value.bcd_iter, err.value.admm_iter) == (1, 4, 2)
    # nothing public on an agent or the exchange is a private key
    import phe

    for obj in (a0, p):
        for name in dir(obj):
            if not name.startswith("_"):
                assert not isinstance(getattr(obj, name), phe.PaillierPrivateKey), name
    assert not hasattr(a0, "__dict__")  # slots only: no place to stash a copy
    assert len({ag.public_key.n for ag in p.agents}) == 4


def test_negative_values_round_trip(paillier_keypairs):
    topo = Topology.from_graphs([PATH3])
    _, p = pair(topo, "paper", paillier_keypairs)
    agent = p.agents[2]
    lim = p.codec.limit
    values = [0, 1, -1, -123456789, lim - 1, -(lim - 1)]
    assert agent.decrypt(agent.encrypt(values)) == values
    with pytest.raises(CodecRangeError, match="agent 2"):  # wraps: never silent
        agent.decrypt(agent.encrypt([lim]))


def test_pickling_copying_and_repr_show_no_keys(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    keys = paillier_keypairs(128, 4)
    ex = PaillierExchange(IntegerCodec(key_bits=128), keypairs=keys)
    ex.bind(topo, dtype=torch.float64, device=CPU)
    for obj in (ex, ex.agents[0]):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
        with pytest.raises(TypeError):
            copy.copy(obj)
    text = repr(ex) + str(ex) + "".join(repr(a) + str(a) for a in ex.agents)
    for pk, sk in keys:
        for secret in (sk.p, sk.q, pk.n):
            assert str(secret) not in text and format(secret, "x") not in text
            assert str(secret)[:12] not in text
    assert "PaillierExchange(" in repr(ex) and "key_bits=128" in repr(ex)


def test_small_keys_warn_and_bad_sizes_raise():
    with pytest.warns(InsecureKeyWarning, match="experiments only"):
        PaillierExchange(IntegerCodec(key_bits=128))
    with pytest.warns(InsecureKeyWarning):
        make_exchange("paillier", key_bits=1024)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PaillierExchange(IntegerCodec(key_bits=2048))  # no keys made before bind
    for bits in (63, 129):
        with pytest.raises(ConfigError, match="key_bits"):
            PaillierExchange(IntegerCodec(key_bits=bits))


def test_keypair_validation(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    codec = IntegerCodec(key_bits=128)
    with pytest.raises(ConfigError, match="one per node"):
        PaillierExchange(codec, keypairs=paillier_keypairs(128, 3)).bind(topo, dtype=torch.float64, device=CPU)
    dup = paillier_keypairs(128, 3)
    with pytest.raises(ConfigError, match="duplicates"):
        PaillierExchange(codec, keypairs=dup + dup[:1]).bind(topo, dtype=torch.float64, device=CPU)
    with pytest.raises(ConfigError, match="128-bit"):
        PaillierExchange(codec, keypairs=paillier_keypairs(512, 4)).bind(topo, dtype=torch.float64, device=CPU)


def test_close_drops_the_keys(paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4])
    _, p = pair(topo, "aggregated", paillier_keypairs)
    p.close()
    assert p.agents == ()
    g = torch.full((8,), 0.5, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="closed"):
        p.penalty_sums(g)
    assert p.costs()["encryptions"] == 0


# ----------------------------------------------------------------------- range errors
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_range_errors_are_identical(protocol, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4, PATH4])
    q, p = pair(topo, protocol, paillier_keypairs, n_max=1e6, g_bits=16)
    gen = torch.Generator().manual_seed(0)
    U = torch.rand((8, 3), generator=gen, dtype=torch.float64)
    g = torch.full((14,), 0.5, dtype=torch.float64)
    for bad, match in ((1e14, "quantized value"), (1e8, "neighbour sum bound")):
        V = U.clone()
        V[5, 2] = bad  # trial 1, agent 1
        errs = []
        for ex in (q, p):
            with pytest.raises(CodecRangeError, match=match) as err:
                ex.exchange(V, g, bcd_iter=3, admm_iter=4)
            errs.append(err.value)
        a, b = errs
        assert str(a) == str(b)
        assert (a.trial, a.agent, a.bcd_iter, a.admm_iter, a.value, a.limit) == \
               (b.trial, b.agent, b.bcd_iter, b.admm_iter, b.value, b.limit)
        assert (a.trial, a.bcd_iter, a.admm_iter) == (1, 3, 4)
    assert p.costs()["encryptions"] == 0  # refused before anything was encrypted


# ------------------------------------------------------------------------------ costs
def expected_counts(protocol, D, A1, P, lk=None):
    """Per ADMM iteration; ``P`` is the number of ciphertexts per message (values, unpacked),
    ``lk`` the values per message (default ``P``)."""
    lk = P if lk is None else lk
    if protocol == "masked":
        used = min(-(-lk // P), lk)  # slots in use
        return {"encryptions": D + A1 + A1 * P, "decryptions": A1 + A1 * P,
                "homomorphic_additions": (D - A1) * (1 + P) + D * (lk - P),
                "scalar_multiplications": D + D * (used - 1) + D * lk}
    if protocol == "paper":
        return {"encryptions": (A1 + D) * P, "decryptions": D * P,
                "homomorphic_additions": D * P, "scalar_multiplications": D * P}
    return {"encryptions": (A1 + D) * P + D, "decryptions": A1 * P + A1,
            "homomorphic_additions": (2 * D - A1) * P + D - A1, "scalar_multiplications": 2 * D * P + D}


# (paillier options, quantized options, ciphertexts per 4-value message at 128 bits)
COUNT_CASES = {
    "naive": (dict(fast=False), dict(packing=False), 4),
    "fast-unpacked": (dict(packing=False), dict(packing=False), 4),
    "fast-packed": (dict(packing=True), dict(packing=True), 2),  # 2 slots of 63 bits at 128 bits
}


@pytest.mark.parametrize("case", list(COUNT_CASES))
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_counters_match_formulas_and_cost_model(protocol, case, paillier_keypairs):
    topo = Topology.from_graphs([CYCLE4, PATH4])
    popts, qopts, n_ct = COUNT_CASES[case]
    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=128)
    q = QuantizedExchange(codec, protocol=protocol, cost_model=FAKE_COSTS, **qopts)
    p = PaillierExchange(codec, protocol=protocol, keypairs=paillier_keypairs(128, topo.n_nodes),
                         cost_model=FAKE_COSTS, **popts)
    for ex in (q, p):
        ex.bind(topo, dtype=torch.float64, device=CPU)
    P, n_iter = 4, 3
    drive([q, p], topo, lk=P, n_iter=n_iter, seed=2)
    p.exchange(torch.rand(8, P, dtype=torch.float64), torch.full((14,), 0.7, dtype=torch.float64),
               bcd_iter=2, admm_iter=1)  # step 5 without step 1
    q.exchange(torch.rand(8, P, dtype=torch.float64), torch.full((14,), 0.7, dtype=torch.float64),
               bcd_iter=2, admm_iter=1)
    rq, rp = q.pop_iteration_costs(), p.pop_iteration_costs()
    assert len(rq) == len(rp) == n_iter + 1
    want = expected_counts(protocol, 14, 8, n_ct, lk=P)
    for a, b in zip(rq, rp):
        for k in COUNT_KEYS + ("bcd_iter", "admm_iter"):
            assert a[k] == b[k], k
        assert set(TIME_KEYS) - {"time_keygen"} <= set(b)
        assert b["estimated_seconds"] == pytest.approx(a["estimated_seconds"])
    for rec in rp[:n_iter]:
        assert {k: rec[k] for k in want} == want
    cq, cp = q.costs(), p.costs()
    for k in COUNT_KEYS + ("key_pairs", "estimated_seconds"):
        assert cq[k] == pytest.approx(cp[k]), k
    assert q.bytes_per_edge() == p.bytes_per_edge() and len(p.bytes_per_edge()) == 8
    assert all(isinstance(v, (int, float)) for v in cp.values())
    assert cp["time_keygen"] == 0  # keys were handed in
    assert p.pop_iteration_costs() == []


def _count_raw_ops(monkeypatch):
    """Count the raw Paillier operations :func:`calibrate` performs (its work, not its time)."""
    from ppdnmf_torch.exchange.paillier import RawPaillier

    calls = {}
    for name in ("encrypt", "add", "scalar_mul", "decrypt"):
        orig = getattr(RawPaillier, name)

        def counted(self, key, values, *rest, _orig=orig, _name=name):
            out = _orig(self, key, values, *rest)
            calls[_name] = calls.get(_name, 0) + len(out)
            return out

        monkeypatch.setattr(RawPaillier, name, counted)
    return calls


def test_calibrate_and_estimate(monkeypatch):
    from ppdnmf_torch.exchange.paillier.calibration import BATCH_CALLS

    calls = _count_raw_ops(monkeypatch)
    oc = calibrate(128, repeats=4, refresh=True)
    # bounded work, whatever the machine: five batches of at most BATCH_CALLS calls of `repeats`
    # values each, after a first call (and one encryption and decryption of the values to check)
    for op in ("encrypt", "add", "scalar_mul", "decrypt"):
        assert 4 <= calls[op] <= 4 * (2 + 5 * BATCH_CALLS), op
    done = dict(calls)
    assert calibrate(128, repeats=4) is oc  # cached
    assert calls == done
    for v in (oc.keygen, oc.encryption, oc.decryption, oc.homomorphic_addition, oc.scalar_multiplication):
        assert v > 0
    assert oc.path_factor == 1.0  # the raw costs: no path asked for


@pytest.mark.slow
def test_calibrate_2048_does_bounded_work(monkeypatch):
    from ppdnmf_torch.exchange.paillier.calibration import BATCH_CALLS

    calls = _count_raw_ops(monkeypatch)
    oc = calibrate(2048, refresh=True)
    assert all(12 <= calls[op] <= 12 * (2 + 5 * BATCH_CALLS) for op in ("encrypt", "add", "scalar_mul", "decrypt"))
    assert oc.key_bits == 2048 and oc.repeats == 12


def test_message_sizes_are_the_cost_models(paillier_keypairs):
    # the one byte-size helper, from the modulus' bit length: the bytes of n^2 and of n
    from ppdnmf_torch.exchange.costmodel import ciphertext_nbytes, public_key_nbytes

    for bits in (64, 128, 256):
        for pk, _ in paillier_keypairs(bits, 3):
            k = pk.n.bit_length()
            assert ciphertext_nbytes(k) == (pk.nsquare.bit_length() + 7) // 8
            assert public_key_nbytes(k) == (pk.n.bit_length() + 7) // 8
            assert EncryptedVector(pk, [1, 2, 3]).nbytes == 3 * ciphertext_nbytes(bits)
