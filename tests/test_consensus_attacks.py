"""The eavesdropper of Sec. IV-V against the incremental methods (ppdnmf_torch.consensus.attacks)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ppdnmf_torch import consensus as cs
from ppdnmf_torch.errors import ConfigError


def _run(method, N=10, rounds=30, rho=5.0, seed=0, **kw):
    d = cs.least_squares_data(N, seed=seed)
    loss = cs.LeastSquares.from_samples(d.inputs, d.targets)
    g, cyc = cs.random_hamiltonian_graph(N, 0.4, seed=seed)
    res = cs.IncrementalADMM(loss, method, rho, graph=g, cycle=cyc, seeds=seed, **kw).run(
        rounds, transcript=True, watch=range(N))
    return res.transcript, res


@pytest.mark.parametrize("seed", range(3))
def test_recursion_recovers_zero_started_i_admm_exactly(seed):
    tr, res = _run("i_admm", seed=seed)
    x, y = cs.eavesdrop_recursion(tr.tokens[:, 0], tr.agents[:, 0], 10, 5.0)
    scale = 1 + float(tr.y.abs().max())
    torch.testing.assert_close(x, tr.x[:, 0], rtol=0, atol=1e-12 * scale)
    torch.testing.assert_close(y, tr.y[:, 0], rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("method", ["pi_admm1", "i_admm_random_start"])
def test_recursion_fails_on_the_randomised_variants(method):
    m = cs.i_admm(start=(0.0, 100.0)) if method == "i_admm_random_start" else cs.pi_admm1()
    tr, _ = _run(m)
    x, y = cs.eavesdrop_recursion(tr.tokens[:, 0], tr.agents[:, 0], 10, 5.0)
    # the start is wrong by U(0, 100): the early states are far off
    assert float((x[1:20] - tr.x[1:20, 0]).abs().max()) > 1.0
    assert float((y - tr.y[:, 0]).abs().max()) > 1.0


@pytest.mark.parametrize("method", ["i_admm", "pi_admm1", "pi_admm2"])
def test_offsets_are_exposed_by_the_tokens(method):
    """u_i = x_i - y_i / rho follows from the tokens whatever gamma and omega are (eq. 5)."""
    tr, res = _run(method)
    u = cs.eavesdrop_offsets(tr.tokens[:, 0], tr.agents[:, 0], 10)
    truth = tr.x[:, 0] - tr.y[:, 0] / 5.0
    torch.testing.assert_close(u, truth, rtol=0, atol=1e-11 * (1 + float(tr.x.abs().max())))


def test_lsqr_attack_x_estimate_reaches_consensus():
    tr, res = _run("pi_admm1", N=10, rounds=60)
    at = cs.lsqr_attack(tr.tokens[:, 0], tr.agents[:, 0], 10, 5.0, target=0)
    K = tr.agents.shape[0]
    assert (at.n_rows, at.n_cols) == (2 * K + 10 + 1, 2 * K + 10)
    truth_x = tr.x[:, 0, 0, 0].numpy()
    assert at.x.shape == (K + 1,) and at.y.shape == (K + 1,)
    assert abs(at.x[-1] - truth_x[-1]) < 1e-6 < abs(at.x[0] - truth_x[0])
    with pytest.raises(ConfigError, match="target"):
        cs.lsqr_attack(tr.tokens[:, 0], tr.agents[:, 0], 10, 5.0, target=10)
    with pytest.raises(ConfigError, match="tokens"):
        cs.lsqr_attack(tr.tokens[:-1, 0], tr.agents[:, 0], 10, 5.0)


def test_lsqr_attack_is_exact_on_a_consistent_system():
    """Algorithm 2 with gamma = 1 run to consensus: the model rows hold, so the estimate of
    the whole trajectory's end matches; the substitution is the only approximation."""
    tr, _ = _run(cs.i_admm(start=(0.0, 100.0)), N=8, rounds=200)
    at = cs.lsqr_attack(tr.tokens[:, 0], tr.agents[:, 0], 8, 5.0, target=3, coord=1)
    np.testing.assert_allclose(at.x[-50:], tr.x[-50:, 0, 3, 1].numpy(), atol=1e-8)
    np.testing.assert_allclose(at.y[-50:], tr.y[-50:, 0, 3, 1].numpy(), atol=1e-6)
