"""FSSPCA without a server (``models/fsspca/serverless.py``): step 2 agreed through the library's
exchange, against the server version, bit-identical integer kinds, costs, and the audit."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, ConvergenceWarning, DegreeOneWarning
from ppdnmf_torch.graph import Graph, complete, ring
from ppdnmf_torch.models.fsspca import admm, fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import CONSENSUS_METHODS, fit_serverless
from ppdnmf_torch.models.fsspca.serverless_run import admm_local_step, laplacian_step


def _blocks(K=4, d=6, seed=0):
    rng = np.random.default_rng(seed)
    scale = 3.0 * 0.6 ** np.arange(d)
    return [rng.standard_normal((12 + 5 * i, d)) * scale + 0.3 for i in range(K)]


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", DegreeOneWarning)
        return fn(*a, **kw)


def test_complete_graph_one_laplacian_step_is_the_server_version():
    """On a complete graph with the fixed penalty, eps = 1 / (g^2 K): one Laplacian step is the
    exact average, so every worker's z_i is the server's z, iteration for iteration."""
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=25, tol=1e-8)
    server = _quiet(fit_fsspca, blocks, 2, aggregation="plain", **kw)
    res = _quiet(fit_serverless, blocks, 2, complete(4), consensus="laplacian", inner_iters=1,
                 penalty_mode="fixed", exchange="plain", **kw)
    torch.testing.assert_close(res.z, server.z[:, None].expand_as(res.z), rtol=0, atol=1e-10)
    assert res.n_iter.tolist() == server.n_iter.tolist()


@pytest.mark.parametrize("method, inner, atol", [("laplacian", 20, 1e-9), ("admm", 40, 1e-5)])
@pytest.mark.parametrize("graph", [complete(4), ring(4)], ids=["complete", "ring"])
def test_many_inner_iterations_follow_the_server_version(method, inner, atol, graph):
    """Many inner iterations per ADMM iteration: the workers' z_i follow the server's z iteration
    for iteration (same start, 12 iterations, tol=0)."""
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=12, tol=0)
    server = fit_fsspca(blocks, 2, aggregation="plain", **kw)
    res = fit_serverless(blocks, 2, graph, consensus=method, inner_iters=inner, exchange="plain", **kw)
    torch.testing.assert_close(res.z, server.z[:, None].expand_as(res.z), rtol=0, atol=atol)
    assert float((res.z == 0).double().mean()) > 0  # the threshold is active: a sparse z


@pytest.mark.slow
@pytest.mark.parametrize("method", CONSENSUS_METHODS)
def test_serverless_converges_to_the_server_solution_on_a_ring(method):
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=400, tol=1e-6)
    server = _quiet(fit_fsspca, blocks, 2, aggregation="plain", **kw)
    res = _quiet(fit_serverless, blocks, 2, ring(4), consensus=method, inner_iters=3, exchange="plain", **kw)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.z, server.z[:, None].expand_as(res.z), rtol=0, atol=1e-5)


@pytest.mark.parametrize("method", CONSENSUS_METHODS)
def test_more_inner_iterations_agree_more_on_a_ring(method):
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=6, tol=0)
    few = fit_serverless(blocks, 2, ring(4), consensus=method, inner_iters=1, **kw)
    many = fit_serverless(blocks, 2, ring(4), consensus=method, inner_iters=20, **kw)
    assert float(few.disagreement[-1, 0]) > 10 * float(many.disagreement[-1, 0])
    assert many.exchange_calls - few.exchange_calls == 19 * 6  # and 100 calls of the centring each


def test_admm_local_step_fixes_the_consensus_solution():
    """At z_i = z* = soft(mean v, tau) and duals Q_i = z* - v_i + tau sign(z*) (which sum to 0 over
    the workers), step 3 returns z* on the support: the fixed point is the server's z."""
    g = torch.Generator().manual_seed(0)
    v = torch.randn((1, 5, 4, 2), generator=g, dtype=torch.float64)
    tau = torch.full((1, 1, 1, 1), 0.3, dtype=torch.float64)
    z = admm.soft_threshold(v.mean(1, keepdim=True), tau).expand_as(v)
    Q = z - v + tau * torch.sign(z)
    Q = Q - Q.mean(1, keepdim=True) * (z == 0)  # off the support any subgradient in [-tau, tau]
    torch.testing.assert_close(Q.sum(1), torch.zeros_like(Q.sum(1)), rtol=0, atol=1e-12)
    rho = torch.full((1, 5, 1, 1), 0.7, dtype=torch.float64)
    out = admm_local_step(v, z, Q, Q, rho, tau)
    support = z != 0
    torch.testing.assert_close(out[support], z[support], rtol=0, atol=1e-12)
    x = torch.randn((1, 5, 3), generator=g, dtype=torch.float64)
    S = x.sum(1, keepdim=True) - 5 * x  # the complete graph, rho_ij = 1
    torch.testing.assert_close(laplacian_step(x, S, 0.2), x.mean(1, keepdim=True).expand_as(x))


@pytest.mark.parametrize("method", CONSENSUS_METHODS)
def test_quantized_is_plain_to_the_codec_resolution_and_counts_costs(method):
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=5, tol=0, consensus=method, inner_iters=2)
    plain = fit_serverless(blocks, 2, ring(4), exchange="plain", **kw)
    quant = fit_serverless(blocks, 2, ring(4), exchange="quantized",
                           exchange_options={"n_max": 1e6, "key_bits": 2048, "cost_model": True}, **kw)
    torch.testing.assert_close(quant.z, plain.z, rtol=0, atol=1e-4)
    assert not torch.equal(quant.z, plain.z)
    assert quant.costs["estimated_seconds"] > 0 and quant.costs["encryptions"] > 0
    assert quant.bytes > plain.bytes > 0
    # plain: d r float64 values per directed edge and call, d + 1 for the centring's 100 calls
    assert plain.bytes == 8 * 8 * (6 * 2 * (plain.exchange_calls - 100) + 7 * 100)
    assert plain.settings["exchange"] == "plain" and quant.settings["exchange"] == "quantized"


@pytest.mark.crypto
def test_paillier_equals_quantized_bit_for_bit(paillier_keypairs):
    from ppdnmf_torch.exchange.paillier import InsecureKeyWarning

    blocks = _blocks(K=3, d=4)
    kw = dict(alpha=2.0, max_iter=2, tol=0, consensus="admm", inner_iters=2)
    opts = {"n_max": 1e6, "key_bits": 128, "protocol": "masked"}
    quant = fit_serverless(blocks, 2, ring(3), exchange="quantized", exchange_options=opts, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureKeyWarning)
        real = fit_serverless(blocks, 2, ring(3), exchange="paillier",
                              exchange_options={**opts, "keypairs": paillier_keypairs(128, 3), "workers": 0}, **kw)
    assert torch.equal(real.z, quant.z) and torch.equal(real.w, quant.w)
    assert real.costs["encryptions"] > 0


def test_the_mean_is_agreed_over_the_graph():
    """Centring without a server: each worker's mean estimate tends to the global mean with the
    Laplacian steps; the agreed mean gives the server's centred problem."""
    blocks = _blocks()
    kw = dict(alpha=20.0, max_iter=2, tol=0, exchange="plain")
    one = fit_serverless(blocks, 2, ring(4), center_iters=1, **kw)
    many = fit_serverless(blocks, 2, ring(4), center_iters=60, **kw)
    assert float(many.mean_error[0]) < 1e-12 < 1e-3 < float(one.mean_error[0])
    assert fit_serverless(blocks, 2, ring(4), center=False, **kw).mean_error is None
    first = fit_serverless(blocks, 2, ring(4), center_iters=60, alpha=20.0, max_iter=1, tol=0, exchange="plain")
    server = fit_fsspca(blocks, 2, alpha=20.0, max_iter=1, tol=0, aggregation="plain")
    torch.testing.assert_close(first.w, server.w, rtol=0, atol=1e-10)  # step 1 sees the same Grams


def test_bad_settings_are_refused():
    blocks = _blocks()
    with pytest.raises(ConfigError, match="graph"):
        fit_serverless(blocks, 2, ring(5))
    with pytest.raises(ConfigError, match="consensus"):
        fit_serverless(blocks, 2, ring(4), consensus="gossip")
    with pytest.raises(ConfigError, match="inner_iters"):
        fit_serverless(blocks, 2, ring(4), inner_iters=0)
    with pytest.raises(ConfigError, match="init"):
        fit_serverless(blocks, 2, ring(4), init="pca")
    with pytest.raises(ConfigError, match="g_cap"):
        fit_serverless(blocks, 2, ring(4), g_cap=0.0)
    with pytest.raises(ConfigError, match="center_iters"):
        fit_serverless(blocks, 2, ring(4), center_iters=0)
    with pytest.raises(ConfigError, match="max_iter"):
        fit_serverless(blocks, 2, ring(4), max_iter=0)
    with pytest.raises(ConfigError, match="rho"):
        fit_serverless(blocks, 2, ring(4), rho="big")


def test_a_worker_with_one_neighbour_is_warned_under_an_integer_exchange():
    path = Graph(4, [(0, 1), (1, 2), (2, 3)])
    with pytest.warns(DegreeOneWarning, match=r"\[0, 3\]"):
        _quiet_conv(fit_serverless, _blocks(), 2, path, exchange="quantized", max_iter=1)


def _quiet_conv(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fn(*a, **kw)


def test_compare_with_server_rows():
    """The study in scripts/studies/fsspca_serverless.py (out of the library)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from studies.fsspca_serverless import compare_with_server

    rows = compare_with_server(_blocks(), 2, ring(4), inner=(1, 20), alpha=20.0, max_iter=8, tol=0, at_iteration=4)
    assert [r["inner_iters"] for r in rows] == [1, 20]
    assert rows[1]["max_z_distance"][0] < rows[0]["max_z_distance"][0]
    assert rows[1]["z_distance_at"][0] < rows[0]["z_distance_at"][0]
    assert rows[1]["bytes"] > rows[0]["bytes"] and rows[0]["server_bytes"] > 0


def test_audit_plain_gives_everything_masked_gives_no_exact_value_on_a_ring():
    """Named adversaries (serverless_audit): under plain every message is read exactly and, under
    the Laplacian method, every neighbour's first message is its v_j; under quantized + masked
    with the agreed schedule no neighbour of degree 2 recovers a message or v_j exactly."""
    from ppdnmf_torch.models.fsspca.serverless_audit import audit_serverless

    rep = audit_serverless(_blocks(), 2, ring(4), consensus="laplacian", inner_iters=2, alpha=20.0, max_iter=6,
                           tol=0, sums_max_calls=4)
    assert rep["plain"]["agents_recovered_exactly"] == 4
    assert rep["plain"]["v"]["message"]["pairs_any_exact"] == 8  # v_j^1 is j's first message
    m = rep["masked"]
    assert m["messages"]["exact_recovery_pairs"] == 0 and m["messages"]["pairs"] == 8
    assert all(m["v"][a]["exact"] == 0 for a in ("nbr_mean", "trajectory"))
    assert all(b["exact_calls"] == 0 for b in m["sums"].values())
    # two neighbours i, k of j on ring(4): i's other neighbour is not k, so j is never left alone
    c = m["collusion"]
    assert (c["triples"], c["inherent_triples"], c["exact_other"]) == (8, 0, 0)


def test_audit_a_single_neighbour_learns_the_value():
    """The inherent case: a worker of degree 1 reads its neighbour's message off its own sums."""
    from ppdnmf_torch.models.fsspca.serverless_audit import audit_serverless

    path = Graph(4, [(0, 1), (1, 2), (2, 3)])
    rep = audit_serverless(_blocks(), 2, path, consensus="laplacian", inner_iters=2, alpha=20.0, max_iter=4, tol=0,
                           sums=False)
    assert rep["masked"]["messages"]["exact_recovery_pairs_degree1"] == 2
    assert rep["masked"]["messages"]["exact_recovery_pairs_degree2plus"] == 0


@pytest.mark.parametrize("kind", ["plain", "quantized"])
def test_runs_on_the_input_device_and_dtype(device, kind):
    """Tensors in on ``device`` (float32 too): the run stays there and equals the CPU run."""
    blocks = [torch.as_tensor(b) for b in _blocks()]
    kw = dict(alpha=20.0, max_iter=4, tol=0, exchange=kind, inner_iters=2)
    ref = fit_serverless(blocks, 2, ring(4), **kw)
    res = fit_serverless([b.to(device) for b in blocks], 2, ring(4), **kw)
    assert res.z.device.type == device.type and res.z.dtype == torch.float64
    torch.testing.assert_close(res.z.cpu(), ref.z, rtol=0, atol=1e-9)
    low = fit_serverless([b.to(device, torch.float32) for b in blocks], 2, ring(4), **kw)
    assert low.z.dtype == torch.float32 and low.z.device.type == device.type


def test_a_batched_trial_equals_the_same_trial_alone():
    """Trial t draws its penalties from seed + t; with a given start, trial 1 of a batch of two
    (its own alpha) is the run of seed + 1 alone."""
    blocks = _blocks()
    init = torch.linalg.qr(torch.as_tensor(np.random.default_rng(3).standard_normal((6, 2))))[0]
    kw = dict(max_iter=4, tol=0, exchange="quantized", init=init)
    both = fit_serverless(blocks, 2, ring(4), alpha=[5.0, 20.0], trials=2, seed=7, **kw)
    alone = fit_serverless(blocks, 2, ring(4), alpha=20.0, seed=8, **kw)
    assert torch.equal(both.z[1], alone.z[0]) and not torch.equal(both.z[0], both.z[1])


@pytest.mark.crypto
def test_paillier_wire_carries_no_plaintext_and_no_seed(paillier_keypairs):
    """An eavesdropper on every link of a real masked Paillier run finds none of step 2's
    plaintexts and none of the masks' seeds on the wire (the library's transcript scan)."""
    from ppdnmf_torch.models.fsspca.serverless_audit import paillier_scan

    scan = paillier_scan(_blocks(K=3, d=4), 2, ring(3), keypairs=paillier_keypairs(128, 3), alpha=20.0, max_iter=2,
                         tol=0, center_iters=2, inner_iters=2)
    assert scan["clean"] and scan["n_hits"] == 0 and scan["n_seeds"] > 0 and scan["n_plaintexts"] > 0
