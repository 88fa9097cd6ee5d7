"""PPDNMF's X-step through the incremental consensus engine (x_solver = i_admm / pi_admm / pi_admm2)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.checkpoint import CheckpointError, load_checkpoint
from ppdnmf_torch.exchange import exchange_spec, make_exchange
from ppdnmf_torch.models.ppdnmf.problem import build_problem
from ppdnmf_torch.models.ppdnmf.config import PAPER_SETTINGS
from ppdnmf_torch.models.ppdnmf.solver import incremental_x_step, init_state, make_sampler, solver_params, x_step
from ppdnmf_torch.models.ppdnmf.solver.incremental import trial_graphs, visiting_orders

from conftest import small_problem

RING = graph.ring(5)
G5 = graph.Graph(5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2)])  # a Hamiltonian cycle
STAR = graph.star(5)  # none: the token is relayed through the centre
KW = dict(bcd_iters=4, x_iters=5, y_iters=5, device="cpu", seed=3)


def _blocks(seed=9):
    return small_problem(counts=(3, 4, 2, 5, 3), seed=seed)


def _one_agent(L=8, M=20, K=3, seed=0):
    """A one-agent problem and a state whose ``Y`` is fixed and random (the X-step's input)."""
    gen = torch.Generator().manual_seed(seed)
    Y = torch.rand((K, M), generator=gen, dtype=torch.float64)
    # some true coefficients negative: the nonnegativity constraint is active
    Xt = torch.rand((L, K), generator=gen, dtype=torch.float64) - 0.3
    Z = (Xt @ Y).clamp_min(0) + 0.01 * torch.rand((L, M), generator=gen, dtype=torch.float64)
    prob = build_problem([[Z]], [graph.complete(1)], torch.full((1, 1), 0.033, dtype=torch.float64), [seed],
                         dtype=torch.float64, device=torch.device("cpu"))
    state = init_state(prob, K)
    state.Y = torch.zeros_like(state.Y)
    state.Y[0, 0, :, :M] = Y
    return prob, state, Z, Y


#: the solver parameters these tests were written with (the paper's, ADMM loops at tol)
PAPER = dict(PAPER_SETTINGS, admm_tol=None, bcd_iters=100)


def _nnls(Z, Y):
    from scipy.optimize import nnls

    return torch.tensor(np.stack([nnls(Y.numpy().T, Z[l].numpy())[0] for l in range(Z.shape[0])]))


@pytest.mark.parametrize("solver,extra", [("i_admm", {}), ("pi_admm", {"x_gamma_spread": 0.0})])
def test_one_agent_with_gamma_one_equals_the_centralized_x_step(solver, extra):
    """N = 1, gamma = 1: the X-step reaches the centralized X-step's solution, the nonnegative
    least-squares minimiser argmin_{X >= 0} ||Z - X Y||_F (scipy's nnls, row by row), and the
    one-agent ADMM X-step converged, both to 1e-12 relative; the token is the factor."""
    prob, state, Z, Y = _one_agent()
    ref = _nnls(Z, Y)
    assert (ref == 0).any()  # the constraint is active: the projection matters
    p = solver_params(3, **PAPER, x_solver=solver, x_rho=1.0, x_rounds=250, x_start=(0.0, 0.0), **extra)
    out = incremental_x_step(prob, state, p)
    scale = float(ref.abs().max())
    assert float((state.X[0, 0] - ref).abs().max()) < 1e-12 * scale
    assert torch.allclose(state.inc_z.clamp_min(0)[0], state.X[0, 0], rtol=0, atol=1e-12 * scale)
    assert float(out["primal"][0]) < 1e-12 and float(out["dual"][0]) < 1e-12
    assert float(out["history"]["x_vectors"][0]) == 0.0  # one agent sends nothing
    # the centralized X-step: the paper's ADMM X-step with one agent, run to convergence
    _, st2, _, _ = _one_agent()
    q = solver_params(3, **PAPER, mu=1.0, x_iters=250)
    ex = make_exchange(exchange_spec("plain"))
    ex.bind(prob.topology, dtype=torch.float64, device=torch.device("cpu"))
    x_step(prob, st2, q, ex, make_sampler(prob, q))
    assert float((st2.X[0, 0] - state.X[0, 0]).abs().max()) < 1e-12 * scale


def test_one_agent_partial_x_step_is_the_projected_iteration():
    """One round at N = 1, by hand: x = (Z Y^T + y + rho P(z)) (Y Y^T + rho I)^-1 from the start
    (x = y = 0 offsets: x = 1, y = 0, z = 1), then y and z; to rounding."""
    prob, state, Z, Y = _one_agent()
    rho = 0.7
    p = solver_params(3, **PAPER, x_solver="i_admm", x_rho=rho, x_rounds=1)
    incremental_x_step(prob, state, p)
    X0 = torch.ones((8, 3), dtype=torch.float64)
    x = (Z @ Y.T + rho * X0) @ torch.linalg.inv(Y @ Y.T + rho * torch.eye(3, dtype=torch.float64))
    y = rho * (X0 - x)
    torch.testing.assert_close(state.U[0, 0], x, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.inc_y[0, 0], y, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.inc_z[0], x - y / rho, rtol=0, atol=1e-12)
    assert torch.equal(state.X[0, 0], state.U[0, 0].clamp_min(0))


def test_i_admm_equals_pi_admm_with_gamma_one_bit_for_bit_through_fit():
    kw = dict(KW, x_start=(-0.5, 0.5), x_rho=0.5)
    a = pp.fit(_blocks(), G5, 2, x_solver="i_admm", **kw)
    b = pp.fit(_blocks(), G5, 2, x_solver="pi_admm", x_gamma_spread=0.0, **kw)
    c = pp.fit(_blocks(), G5, 2, x_solver="pi_admm", x_gamma_spread=0.2, **kw)
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    assert a.history["nmse"] == b.history["nmse"] and a.history["x_primal"] == b.history["x_primal"]
    assert not torch.equal(a.X, c.X)  # the perturbation does change the iterates


@pytest.mark.parametrize("solver", ["i_admm", "pi_admm", "pi_admm2"])
def test_batched_trials_equal_single_runs(solver):
    """Each trial walks its own graph (cycles relabelled, one relaying walk), bit for bit alone."""
    graphs = [G5, RING, STAR]
    lists = [_blocks(s) for s in (1, 2, 3)]
    kw = dict(KW, x_solver=solver, x_rho=0.5, x_gamma_spread=0.2)
    kw.pop("seed")
    res = pp.fit_trials(lists, graphs, 2, seeds=[5, 6, 7], **kw)
    for t, (blocks, g) in enumerate(zip(lists, graphs)):
        one = pp.fit(blocks, g, 2, seed=5 + t, **kw)
        assert torch.equal(res.X[t], one.X) and torch.equal(res.U[t], one.U)
        assert all(torch.equal(y, one.Y[i]) for i, y in enumerate(res.trial_Y(t)))
        assert res.history["nmse"][:, t].tolist() == one.history["nmse"]
        assert res.history["x_vectors"][:, t].tolist() == one.history["x_vectors"]


@pytest.mark.parametrize("solver", ["i_admm", "pi_admm", "pi_admm2"])
def test_resume_is_bit_identical(tmp_path, solver):
    kw = dict(KW, bcd_iters=5, x_solver=solver, x_rho=0.5, x_gamma_spread=0.2)
    full = pp.fit(_blocks(), G5, 2, **kw)
    pp.fit(_blocks(), G5, 2, checkpoint_dir=tmp_path, checkpoint_every=1, callback=lambda i: i.iteration == 3, **kw)
    ck = load_checkpoint(str(tmp_path))
    assert ck["done"] == 3 and {"inc_y", "inc_z", "inc_cycle"} <= set(ck["state"])
    resumed = pp.fit(_blocks(), G5, 2, resume_from=tmp_path, **kw)
    assert torch.equal(resumed.X, full.X) and torch.equal(resumed.U, full.U)
    assert all(torch.equal(x, y) for x, y in zip(resumed.Y, full.Y))
    assert resumed.history["nmse"] == full.history["nmse"]
    assert resumed.history["x_vectors"] == full.history["x_vectors"]


def test_a_checkpoint_of_another_x_solver_is_refused(tmp_path):
    pp.fit(_blocks(), G5, 2, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 2, **KW)
    with pytest.raises(CheckpointError, match="different run"):
        pp.fit(_blocks(), G5, 2, resume_from=tmp_path, x_solver="pi_admm", **KW)


def _problem(blocks, g, seed=0):
    return build_problem([blocks], [g], torch.full((1, g.n_agents), 0.033, dtype=torch.float64), [seed],
                         dtype=torch.float64, device=torch.device("cpu"))


def _state_with_Y(prob, K=2, seed=0):
    state = init_state(prob, K)
    gen = torch.Generator().manual_seed(seed)
    mask = prob.column_mask().expand(-1, -1, K, -1)
    state.Y = torch.rand(state.Y.shape, generator=gen, dtype=torch.float64) * mask
    return state


def test_result_dict_and_invariant():
    prob = _problem(_blocks(), G5)
    state = _state_with_Y(prob)
    p = solver_params(2, **PAPER, x_solver="pi_admm", x_rho=0.5, x_gamma_spread=0.2, x_rounds=7)
    out = incremental_x_step(prob, state, p)
    assert out["iters"].tolist() == [[7] * 5]
    assert out["first_bad"].tolist() == [[0] * 5]
    x, y, z = state.U[0], state.inc_y[0], state.inc_z[0]
    torch.testing.assert_close(z, (x - y / 0.5).mean(0), rtol=0, atol=1e-12)  # z = mean(x - y / rho)
    P = z.clamp_min(0)
    torch.testing.assert_close(out["primal"][0], (x - P).square().sum().sqrt(), rtol=1e-12, atol=0)
    assert float(out["dual"][0]) > 0
    assert out["history"]["x_vectors"].tolist() == [35.0]  # 7 rounds x 5 hops of the cycle
    assert out["history"]["x_bytes"].tolist() == [35.0 * 8 * 2 * 8]  # L x K float64 entries each
    assert torch.equal(state.X, state.U.clamp_min(0))
    # more rounds: closer to consensus
    out2 = incremental_x_step(prob, _state_with_Y(prob), solver_params(2, **PAPER, x_solver="pi_admm", x_rho=0.5,
                                                                      x_gamma_spread=0.2, x_rounds=60))
    assert float(out2["primal"][0]) < 1e-2 * float(out["primal"][0])


def test_first_bad_names_the_round():
    prob = _problem(_blocks(), G5)
    state = _state_with_Y(prob)
    state.Y[0, 3, 0, 0] = float("nan")
    out = incremental_x_step(prob, state, solver_params(2, **PAPER, x_solver="i_admm", x_rounds=3))
    fb = out["first_bad"][0].tolist()
    order = state.inc_cycle[0].tolist()
    # agent 3 goes bad at its first step; the agents after it on the cycle in that round too,
    # those before it in the next round (the token carries the NaN)
    pos = order.index(3)
    assert fb == [1 if order.index(a) >= pos else 2 for a in range(5)]
    # what the BCD loop makes of it: the first bad round, and every agent hit
    from ppdnmf_torch.models.ppdnmf.solver.bcd import check_finite

    with pytest.raises(pp.NumericalError, match=r"X-step ADMM iteration 1: agents \[0, 1, 2, 3, 4\]"):
        check_finite(prob, state, 1, torch.zeros((1, 5), dtype=torch.float64), out["first_bad"])


def test_warm_start_carries_the_state_across_x_steps():
    """Two X-steps of R rounds with the same Y (no random draws) are one X-step of 2R rounds."""
    prob = _problem(_blocks(), G5)
    a, b = _state_with_Y(prob), _state_with_Y(prob)
    for _ in range(2):
        incremental_x_step(prob, a, solver_params(2, **PAPER, x_solver="i_admm", x_rounds=4), bcd_iter=1)
    incremental_x_step(prob, b, solver_params(2, **PAPER, x_solver="i_admm", x_rounds=8))
    assert torch.equal(a.U, b.U) and torch.equal(a.inc_y, b.inc_y) and torch.equal(a.inc_z, b.inc_z)


def test_visiting_orders_cycle_or_relay():
    orders, hops = visiting_orders([G5, RING, STAR, graph.complete(2), graph.complete(1)])
    assert hops == [5, 5, 8, 2, 0]  # a star relays through its centre: 2 (N - 1) hops
    assert sorted(orders[2]) == list(range(5)) and orders[2][0] == 0
    with pytest.raises(pp.GraphError, match="x_walk='cycle' needs a Hamiltonian cycle") as err:
        visiting_orders([STAR], "cycle")
    assert err.value.key == "adjacency"
    prob = build_problem([_blocks(1), _blocks(2)], [G5, STAR], torch.full((2, 5), 0.033, dtype=torch.float64),
                         [0, 1], dtype=torch.float64, device=torch.device("cpu"), rank=2)
    assert prob.Z.shape[1] > 5  # alignment dummies: not part of the walk
    assert [g.edges for g in trial_graphs(prob)] == [G5.edges, STAR.edges]


def test_fit_on_a_star_relays_and_counts_the_hops():
    res = pp.fit(_blocks(), STAR, 2, x_solver="pi_admm", x_rho=0.5, x_gamma_spread=0.2, **KW)
    assert res.history["x_vectors"] == [5 * 8.0] * 4
    with pytest.raises(pp.GraphError, match="Hamiltonian"):
        pp.fit(_blocks(), STAR, 2, x_solver="pi_admm", x_walk="cycle", **KW)


def test_the_default_is_untouched_and_keys_are_absent():
    res = pp.fit(_blocks(), G5, 2, **KW)
    assert "x_vectors" not in res.history


@pytest.mark.parametrize("kw,key", [
    ({"x_solver": "hals"}, "x_solver"),
    ({"x_solver": "pi_admm", "x_rho": 0.1, "x_gamma_spread": 0.1}, "x_gamma_spread"),
    ({"x_rho": 0.0}, "x_rho"),
    ({"x_sigma": -1.0}, "x_sigma"),
    ({"x_rounds": 0}, "x_rounds"),
    ({"x_start": (1.0, 0.0)}, "x_start"),
    ({"x_start": 3.0}, "x_start"),
    ({"x_walk": "random"}, "x_walk"),
    ({"x_solver": "pi_admm", "exchange": "quantized"}, "exchange"),
])
def test_bad_parameters_name_themselves(kw, key):
    with pytest.raises(pp.ConfigError) as err:
        pp.fit(_blocks(), G5, 2, **dict(KW, **kw))
    assert err.value.key == key


@pytest.mark.slow
def test_pi_admm_reaches_the_centralized_nmse_with_a_tighter_consensus():
    """At equal local work (30 rounds = 30 ADMM iterations) the incremental X-step comes within
    5 % of the centralized NMSE, with a consensus error far below the ADMM X-step's (whose
    lower NMSE comes from agents that have not agreed on one X)."""
    kw = dict(bcd_iters=15, x_iters=30, y_iters=30, device="cpu", seed=1)
    admm = pp.fit(_blocks(), G5, 2, **kw)
    inc = pp.fit(_blocks(), G5, 2, x_solver="pi_admm", x_rho=0.5, x_gamma_spread=0.2, **kw)
    cen = pp.fit_centralized(torch.cat(_blocks(), 1), 2, **kw)
    assert inc.history["nmse"][-1] < 1.05 * cen.history["nmse"][-1]
    assert inc.history["consensus"][-1] < 1e-2 * admm.history["consensus"][-1]


def test_config_keys_and_cross_rules():
    from ppdnmf_torch.models.ppdnmf.config import from_dict

    cfg = from_dict({"solver": {"x_solver": "pi_admm", "x_start": [-0.5, 0.5], "x_rounds": 10}})
    assert (cfg.solver.x_solver, cfg.solver.x_start, cfg.solver.x_rounds) == ("pi_admm", [-0.5, 0.5], 10)
    for bad, key in (({"solver": {"x_solver": "pi_admm"}, "exchange": {"kind": "quantized"}}, "exchange.kind"),
                     ({"solver": {"x_start": [0.0, 1.0, 2.0]}}, "solver.x_start"),
                     ({"solver": {"x_solver": "nope"}}, "solver.x_solver"),
                     ({"solver": {"x_rho": 0.0}}, "solver.x_rho")):
        with pytest.raises(pp.ConfigError) as err:
            from_dict(bad)
        assert err.value.key == key


def test_run_experiment_preset_batches_and_keeps_the_admm_baseline():
    from ppdnmf_torch.models.ppdnmf.experiments import run_experiment

    kw = dict(trials=2, seed=2, bcd_iters=2, x_iters=3, y_iters=3, device="cpu")
    inc = run_experiment("incremental_synthetic", **kw)
    ref = run_experiment("paper_synthetic", **kw)
    assert inc.config.solver.x_solver == "pi_admm" and inc.history["x_vectors"].shape == (2, 2)
    assert (inc.history["centralized_nmse"] == ref.history["centralized_nmse"]).all()
    assert not (inc.history["nmse"] == ref.history["nmse"]).all()


def test_config_error_names_the_config_key():
    """The spec's rule across two settings names both by their config keys."""
    from ppdnmf_torch.models.ppdnmf.config import from_dict

    with pytest.raises(pp.ConfigError) as err:
        from_dict({"n_agents": 5, "solver": {"rank": 2, "x_solver": "pi_admm", "x_rho": 0.1, "x_gamma_spread": 0.2}})
    assert err.value.key == "solver.x_gamma_spread" and "solver.x_rho" in str(err.value)


@pytest.mark.slow
def test_compiled_rounds_match_eager():
    """fuse=True compiles each round of the token (one graph, reused across X-steps via set_loss):
    the same numbers to rounding (not promised bit for bit)."""
    kw = dict(KW, x_solver="pi_admm", x_rho=0.5, x_gamma_spread=0.2)
    eager = pp.fit(_blocks(), G5, 2, **kw)
    fused = pp.fit(_blocks(), G5, 2, fuse=True, **kw)
    torch.testing.assert_close(fused.X, eager.X, rtol=1e-8, atol=1e-10)
    assert fused.history["x_vectors"] == eager.history["x_vectors"]
