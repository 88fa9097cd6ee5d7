"""Agreement (issue 21): the adaptive penalty schedule, the seeded start, the HALS Y-step and
the worst-agent metric; the paper's settings keep their bits."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.graph.topology import Topology
from ppdnmf_torch.penalties import MAX_CAP_RATIO, PenaltySampler, cap_bounds
from ppdnmf_torch.models.ppdnmf.problem import build_problem
from ppdnmf_torch.models.ppdnmf.solver import init_state, run_bcd, solver_params
from ppdnmf_torch.models.ppdnmf.solver import schedule
from ppdnmf_torch.models.ppdnmf.solver.hals import hals_loop, hals_sweep, scaled_system
from ppdnmf_torch.models.ppdnmf.solver.refit import REFIT_SWEEPS, worst_agent_nmse
from ppdnmf_torch.models.ppdnmf.config import PAPER_SETTINGS, SOLVER_DEFAULTS, SolverConfig
from ppdnmf_torch.models.ppdnmf.solver.state import initial_factor

CPU = torch.device("cpu")
PAPER = dict(PAPER_SETTINGS)
NEW = dict(penalty_schedule="adaptive", init="random")
# the per-edge schedules above are no plain sum: their runs name exchange="plain" (secagg, the default, refuses them)
PLAIN = dict(exchange="plain")
SHORT = dict(bcd_iters=6, x_iters=4, y_iters=4, device="cpu")


def _synthetic(N=6, seed=0, M=60, L=12, K=3):
    d = pp.data.synthetic(L=L, M=M, K=K, seed=seed, noise_var=0.0)
    cols = pp.data.split_counts(M, N, lo=4, hi=20, seed=seed)
    return pp.data.split_columns(d.Z, cols)


GRAPHS = {"ring": lambda n, s: graph.ring(n), "star": lambda n, s: graph.star(n),
          "random": lambda n, s: graph.random_connected(n, 3.0, seed=s)}


def _same(a, b):
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    for k, v in a.history.items():
        if "time" not in k:
            assert b.history[k] == v, k


# ------------------------------------------------------------------ the penalty schedule
@pytest.mark.parametrize("kind", sorted(GRAPHS))
@pytest.mark.parametrize("seed", [0, 1])
def test_adaptive_draws_stay_random_monotone_and_bounded(kind, seed):
    blocks = _synthetic(seed=seed)
    g = GRAPHS[kind](6, seed)
    seen = []
    pp.fit(blocks, g, 3, g_max=0.02, seed=seed, negative="allow", callback=lambda i: seen.append(
        (i.state.g.clone(), i.state.caps.clone())), **NEW, **SHORT, **PLAIN)
    src = Topology.from_graphs([g]).src  # the source agent of every directed edge (CSR order)
    caps0 = torch.full((6,), 0.02, dtype=torch.float64)
    prev_g, prev_caps = torch.zeros_like(seen[0][0]), caps0
    grew = False
    for g_n, caps_n in seen:
        assert bool((g_n >= prev_g).all()), "draws fell"
        assert bool((caps_n >= prev_caps).all()), "a cap fell"
        assert bool((caps_n <= MAX_CAP_RATIO * caps0 * (1 + 1e-12)).all()), "a cap passed its bound"
        # each draw lies below the cap its own agent had when it drew
        assert bool((g_n <= prev_caps[src]).all())
        grew |= bool((caps_n > prev_caps).any())
        prev_g, prev_caps = g_n, caps_n
    assert grew, "the rule never raised a cap"
    last_g, last_caps = seen[-1]
    assert bool((last_g < last_caps[src]).any()), "draws are not random (all at the caps)"
    other = []
    pp.fit(blocks, g, 3, g_max=0.02, seed=seed + 10, negative="allow",
           callback=lambda i: other.append(i.state.g.clone()), **NEW, **SHORT, **PLAIN)
    assert not torch.equal(other[-1], last_g), "another seed drew the same penalties"


def test_sampler_keeps_draws_in_the_interval_after_new_caps():
    src = torch.tensor([0, 0, 1, 2])
    caps = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    s = PenaltySampler(caps, src, [4], [3], "random", 6)
    s.begin_bcd_iteration()
    g = s.steps(s.initial(), 6)[-1]
    s.set_caps(caps * 2)
    s.begin_bcd_iteration()
    G = s.steps(g, 6)
    prev = g
    for row in G:
        assert bool((row > prev).all()) and bool((row <= (caps * 2)[src]).all())
        prev = row
    # the per-iteration path gives the same draws
    s2 = PenaltySampler(caps, src, [4], [3], "random", 6)
    s2.begin_bcd_iteration()
    g2 = s2.initial()
    for m in range(6):
        g2 = s2.step(g2, m)
    s2.set_caps(caps * 2)
    s2.begin_bcd_iteration()
    for m in range(6):
        g2 = s2.step(g2, m)
    assert torch.equal(g2, G[-1])


def _state_for_adapt(delta_big):
    """A one-trial, three-agent state whose agent 0 disagrees with its neighbours (and, with
    ``delta_big``, agent 1 too)."""
    blocks = [torch.rand(4, 3, generator=torch.Generator().manual_seed(i), dtype=torch.float64) for i in range(3)]
    prob = build_problem([blocks], [graph.ring(3)], torch.full((1, 3), 0.1, dtype=torch.float64), [0],
                         dtype=torch.float64, device=CPU)
    st = init_state(prob, 2, init="random")
    schedule.init_schedule(prob, st, 0.5)
    st.Y = torch.full_like(st.Y, 2.0)  # tr(Y_i Y_i^T) / K far above mu = 0.5: mu_i's floor lifts it
    st.P = torch.rand(st.P.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    S = torch.zeros_like(st.Q)
    S[0, 0] = 1.0
    if delta_big:
        S[0, 1] = 1.0
    st.Q = st.Q_prev + S
    return prob, st


@pytest.mark.parametrize("delta_big", [False, True])
def test_adapt_grows_only_disagreeing_agents_and_keeps_the_multiplier(delta_big):
    prob, st = _state_for_adapt(delta_big)
    caps0, mu0, P0 = st.caps.clone(), st.mu.clone(), st.P.clone()
    rho = torch.full((1, 3), 0.02, dtype=torch.float64)
    schedule.adapt(prob, st, rho)
    curvature = st.Y[0].reshape(3, -1).square().sum(-1)[None] / 2  # tr(Y_i Y_i^T) / K
    torch.testing.assert_close(st.mu, torch.maximum(mu0, schedule.KAPPA * curvature), rtol=1e-15, atol=0)
    assert bool((st.mu > mu0).all())
    # the unscaled multiplier mu * P of the nonnegativity split is kept
    torch.testing.assert_close(st.P * st.mu.view(1, 3, 1, 1), P0 * mu0.view(1, 3, 1, 1), rtol=1e-12, atol=0)
    expect = caps0.clone()
    expect[0] = 0.1 * schedule.GROWTH
    if delta_big:
        expect[1] = 0.1 * schedule.GROWTH
    torch.testing.assert_close(st.caps, expect, rtol=1e-15, atol=0)


def test_adapt_caps_stop_at_their_bound():
    prob, st = _state_for_adapt(True)
    rho = torch.full((1, 3), 0.02, dtype=torch.float64)
    for _ in range(60):
        st.Q_prev = st.Q - torch.ones_like(st.Q)  # everyone keeps disagreeing
        schedule.adapt(prob, st, rho)
    bound = torch.minimum(MAX_CAP_RATIO * torch.tensor(0.1, dtype=torch.float64),
                          (schedule.STABILITY * st.mu.reshape(-1) / 2.0).sqrt())
    torch.testing.assert_close(st.caps, bound, rtol=1e-15, atol=0)


def test_preflight_checks_the_bound_the_caps_can_reach():
    blocks = _synthetic()
    kw = dict(exchange="quantized", n_max=1e6, g_bits=16, key_bits=2048, g_max=0.5, negative="allow",
              bcd_iters=1, x_iters=1, y_iters=1, device="cpu")
    pp.fit(blocks, graph.ring(6), 3, **PAPER, **{k: v for k, v in kw.items() if k != "penalty_schedule"})
    with pytest.raises(pp.ConfigError, match="key_bits/n_max"):
        pp.fit(blocks, graph.ring(6), 3, penalty_schedule="adaptive", init="ones", y_solver="admm", **kw)
    assert torch.equal(cap_bounds(torch.tensor([0.5]), "adaptive"), torch.tensor([0.5 * MAX_CAP_RATIO]))


@pytest.mark.crypto
@pytest.mark.filterwarnings("ignore::ppdnmf_torch.exchange.paillier.InsecureKeyWarning")
@pytest.mark.filterwarnings("ignore::ppdnmf_torch.SumLeakWarning")
@pytest.mark.parametrize("schedule,protocol", [("adaptive", "aggregated"), ("adaptive", "paper"),
                                               ("agreed", "masked"), ("agreed", "aggregated")])
def test_exchange_kinds_agree_under_the_adaptive_schedules(schedule, protocol, paillier_keypairs):
    """quantized and paillier give the same bits under both consensus-seeking schedules (the
    default, agreed, included; tests/test_schedule_agreed.py has the rest of its tests)."""
    blocks = _synthetic(N=4, M=40)
    g = graph.ring(4)
    kw = dict(bcd_iters=4, x_iters=3, y_iters=3, key_bits=128, n_max=1e6, protocol=protocol, seed=5,
              g_max=0.05, negative="allow", device="cpu", **dict(NEW, penalty_schedule=schedule))
    rq = pp.fit(blocks, g, 3, exchange="quantized", **kw)
    rp = pp.fit(blocks, g, 3, exchange="paillier", exchange_options={"keypairs": paillier_keypairs(128, 4)}, **kw)
    _same(rq, rp)
    rf = pp.fit(blocks, g, 3, exchange="plain", **{k: v for k, v in kw.items() if k not in ("key_bits", "n_max",
                                                                                          "protocol")})
    torch.testing.assert_close(rf.X, rq.X, rtol=1e-4, atol=1e-6)


def test_adaptive_run_resumes_bit_for_bit(tmp_path):
    blocks = _synthetic()
    kw = dict(negative="allow", seed=2, exchange="quantized", n_max=1e5, **NEW, **SHORT)
    whole = pp.fit(blocks, graph.ring(6), 3, **kw)
    pp.fit(blocks, graph.ring(6), 3, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 4, **kw)
    resumed = pp.fit(blocks, graph.ring(6), 3, resume_from=tmp_path, **kw)
    _same(whole, resumed)
    payload = pp.checkpoint.load_checkpoint(tmp_path) if hasattr(pp, "checkpoint") else None
    if payload is not None:
        assert {"caps", "mu"} <= set(payload["state"])


# ------------------------------------------------------------------ HALS
@pytest.mark.parametrize("L,K,M,pad", [(6, 2, 5, 3), (10, 4, 9, 0), (12, 5, 20, 7)])
def test_hals_solves_the_nnls_like_scipy(L, K, M, pad):
    nnls = pytest.importorskip("scipy.optimize").nnls
    gen = torch.Generator().manual_seed(L * 100 + K)
    X = torch.rand(2, L, K, generator=gen, dtype=torch.float64)
    Z = torch.cat([torch.rand(2, L, M, generator=gen, dtype=torch.float64),
                   torch.zeros(2, L, pad, dtype=torch.float64)], dim=-1)
    G, C = X.mT @ X, X.mT @ Z
    Y, _ = hals_loop(torch.zeros(1, 2, K, M + pad, dtype=torch.float64), G[None], C[None], 3000, M)
    for a in range(2):
        ref = np.stack([nnls(X[a].numpy(), Z[a, :, m].numpy())[0] for m in range(M)], axis=1)
        np.testing.assert_allclose(Y[0, a, :, :M].numpy(), ref, atol=1e-9)
        assert bool((Y[0, a, :, M:] == 0).all()), "padding columns must stay zero"


def test_hals_sweeps_lower_the_objective_and_stay_nonnegative():
    gen = torch.Generator().manual_seed(3)
    X = torch.rand(3, 8, 4, generator=gen, dtype=torch.float64)
    Z = torch.rand(3, 8, 11, generator=gen, dtype=torch.float64)
    Gs, Cs = scaled_system(X.mT @ X, X.mT @ Z)
    Y = torch.zeros(3, 4, 11, dtype=torch.float64)
    last = float("inf")
    for _ in range(10):
        hals_sweep(Y, Gs, Cs)
        obj = float(torch.linalg.matrix_norm(Z - X @ Y).square().sum())
        assert obj <= last + 1e-12 and bool((Y >= 0).all())
        last = obj


def test_hals_y_solver_runs_batched_like_single_runs():
    res = pp.run_experiment("paper_synthetic", trials=3, seed=1, centralized=False, bcd_iters=3, x_iters=4,
                            y_iters=4, y_solver="hals", **NEW)
    spec = pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS["paper_synthetic"]
    for t in range(3):
        blocks, g = pp.models.ppdnmf.experiments.make_trial(spec, 1 + t)
        one = pp.fit(blocks, g, 5, negative="allow", seed=1 + t, mu=0.1, eta=1.0, g_max=0.033, bcd_iters=3,
                     x_iters=4, y_iters=4, device="cpu", y_solver="hals", **NEW, **PLAIN)  # the preset's
        assert torch.equal(one.X, res.distributed.X[t])
        assert one.history["nmse_worst"] == res.history["nmse_worst"][:, t].tolist()


# ------------------------------------------------------------------ the seeded start
def test_seeded_start_is_shared_by_every_agent_and_differs_between_seeds():
    blocks = [_synthetic(seed=s) for s in (0, 1)]
    prob = build_problem(blocks, [graph.ring(6)] * 2, torch.full((2, 6), 0.1, dtype=torch.float64), [4, 5],
                         dtype=torch.float64, device=CPU, rank=3, init_seeds=[7, 8])
    st = init_state(prob, 3, init="random")
    X = st.X
    for t, s in enumerate((7, 8)):
        assert all(torch.equal(X[t, i], initial_factor(s, 12, 3)) for i in range(X.shape[1]))
    assert not torch.equal(X[0, 0], X[1, 0])
    assert bool((X >= 0).all()) and bool((X < 2).all()) and torch.equal(st.U, X)
    assert not bool((X[0, 0] == X[0, 0, :, :1]).all()), "the columns must differ (no symmetric start)"
    assert torch.equal(init_state(prob, 3).X, torch.ones_like(X))


def test_init_seed_defaults_to_the_seed_and_drives_the_start():
    blocks = _synthetic()
    kw = dict(negative="allow", bcd_iters=1, x_iters=1, y_iters=1, device="cpu", **NEW, **PLAIN)
    a = pp.fit(blocks, graph.ring(6), 3, seed=3, **kw)
    b = pp.fit(blocks, graph.ring(6), 3, seed=3, init_seed=3, **kw)
    c = pp.fit(blocks, graph.ring(6), 3, seed=3, init_seed=4, **kw)
    assert torch.equal(a.X, b.X) and not torch.equal(a.X, c.X)
    with pytest.raises(pp.ConfigError, match="init_seed"):
        pp.fit(blocks, graph.ring(6), 3, init_seed="x", **kw)


# ------------------------------------------------------------------ the paper's settings
def test_paper_settings_are_the_solver_defaults_bit_for_bit():
    """fit's explicit paper keywords run exactly the solver's code path with the same settings."""
    blocks = _synthetic()
    g = graph.random_connected(6, 3.0, seed=0)
    r = pp.fit(blocks, g, 3, negative="allow", seed=4, g_max=0.033, mu=0.1, eta=1.0, **PAPER, **SHORT, **PLAIN)
    prob = build_problem([blocks], [g], torch.full((1, 6), 0.033, dtype=torch.float64), [4],
                         dtype=torch.float64, device=CPU)
    ex = pp.exchange.make_exchange("plain")
    ex.bind(prob.topology, dtype=torch.float64, device=CPU)
    iters = {k: v for k, v in SHORT.items() if k != "device"}
    st, hist, _ = run_bcd(prob, solver_params(3, mu=0.1, eta=1.0, **PAPER, **iters), ex)
    assert torch.equal(st.X[0], r.X) and st.caps is None and st.mu is None
    assert [float(v[0]) for v in hist["nmse"]] == r.history["nmse"]
    for name in ("paper_synthetic", "paper_cbcl"):
        solver = pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS[name].solver
        assert {k: getattr(solver, k) for k in PAPER} == PAPER


def test_library_defaults_differ_from_the_paper():
    assert SOLVER_DEFAULTS.penalty_schedule == "agreed" and SOLVER_DEFAULTS.init == "random"
    assert {k: getattr(SOLVER_DEFAULTS, k) for k in PAPER} != PAPER


# ------------------------------------------------------------------ the worst-agent metric
def test_worst_agent_metric_matches_a_direct_computation():
    gen = torch.Generator().manual_seed(0)
    T, N, L, K, M = 2, 3, 7, 2, 64
    Z = torch.rand(T, N, L, M, generator=gen, dtype=torch.float64)
    Z[..., 50:] = 0
    X = torch.rand(T, N, L, K, generator=gen, dtype=torch.float64)
    Y = torch.rand(T, N, K, M, generator=gen, dtype=torch.float64)
    Y[..., 50:] = 0
    zn = torch.linalg.matrix_norm(Z)
    got = worst_agent_nmse(Z, X, Y, zn, 50)
    for t in range(T):
        w = int(torch.linalg.matrix_norm(X[t] - X[t].mean(0)).argmax())
        Xw = X[t, w]
        vals = []
        for j in range(N):
            Yj = Y[t, j].clone()
            Gs, Cs = scaled_system(Xw.T @ Xw, Xw.T @ Z[t, j, :, :50])
            Yw = Yj[:, :50].contiguous()
            for _ in range(REFIT_SWEEPS):
                hals_sweep(Yw[None], Gs[None], Cs[None])
            Yj[:, :50] = Yw
            vals.append(float(torch.linalg.norm(Z[t, j] - Xw @ Yj) / zn[t, j]))
        assert abs(float(got[t]) - np.mean(vals)) < 1e-12


def test_worst_agent_metric_sees_the_disagreement_that_the_nmse_hides():
    d = pp.data.synthetic(L=12, M=40, K=3, seed=0, noise_var=0.0)
    blocks = pp.data.split_columns(d.Z, pp.data.split_counts(40, 4, lo=4, hi=20, seed=0))
    kw = dict(negative="allow", g_max=0.005, bcd_iters=15, x_iters=6, y_iters=6, device="cpu", **PAPER)
    paper = pp.fit(blocks, graph.ring(4), 3, **kw, **PLAIN)
    assert paper.consensus > 0.1
    assert paper.history["nmse_worst"][-1] > 2 * paper.nmse
    # one agent agrees with itself: its refit from its own Y only lowers the error
    alone = pp.fit_centralized(d.Z, 3, **kw)
    assert all(w <= n * (1 + 1e-12) for w, n in zip(alone.history["nmse_worst"], alone.history["nmse"]))


def test_worst_agent_metric_has_a_tensorboard_tag():
    from ppdnmf_torch.app.tensorboard import SCALAR_TAGS

    assert "nmse_worst" in SCALAR_TAGS


def test_worst_agent_metric_is_in_the_run_summary(tmp_path):
    import json

    from ppdnmf_torch.models.ppdnmf.config import from_dict
    from ppdnmf_torch.app.outputs import format_summary
    from ppdnmf_torch.app.runner import run

    cfg = from_dict({"n_agents": 4, "centralized": False, "progress": False, "logger": {"kind": "none"},
                     "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 24, "K": 2},
                     "graph": {"kind": "ring"}, "solver": {"rank": 2, "bcd_iters": 3, "x_iters": 2, "y_iters": 2}})
    summary = run(cfg, tmp_path / "run")
    hist = json.loads((tmp_path / "run" / "history.json").read_text())["distributed"]
    assert summary["nmse_worst"] == hist["nmse_worst"][-1] > 0
    assert f"worst agent {summary['nmse_worst']:.6g}" in format_summary(summary)


# ------------------------------------------------------------------ the generated data set
def test_sparse_poisson_data():
    a, b = pp.data.sparse_poisson(seed=1), pp.data.sparse_poisson(seed=1)
    c = pp.data.sparse_poisson(seed=2)
    assert torch.equal(a.Z, b.Z) and not torch.equal(a.Z, c.Z)
    assert a.Z.shape == (64, 400) and a.X.shape == (64, 8) and a.Y.shape == (8, 400)
    assert bool((a.Z >= 0).all()) and float((a.Z == 0).double().mean()) > 0.2
    assert bool((a.X != 0).any(0).all()) and bool((a.Y != 0).any(0).all())
    # E[Z] = X Y: the mean count matches on average
    assert abs(float(a.Z.mean() / (a.X @ a.Y).mean()) - 1) < 0.05
    for kw, key in (({"density": 0}, "density"), ({"mean_count": -1}, "mean_count"), ({"K": 0}, "K")):
        with pytest.raises(pp.ConfigError, match=key):
            pp.data.sparse_poisson(**kw)


@pytest.mark.parametrize("key,value", [("penalty_schedule", "boyd"), ("init", "nndsvd"), ("y_solver", "bpp")])
def test_bad_new_settings_are_refused(key, value):
    with pytest.raises(pp.ConfigError, match=key):
        SolverConfig(rank=2, **{key: value})
    from ppdnmf_torch.models.ppdnmf.config import from_dict

    with pytest.raises(pp.ConfigError, match=f"solver.{key}"):
        from_dict({"solver": {key: value}})


@pytest.mark.slow
def test_fused_adaptive_run_matches_eager():
    """fuse=True takes the per-agent mu_i of the schedule in its compiled chains."""
    blocks = _synthetic()
    # the adaptive schedule's per-edge weights: an exchange that takes them (the secure default refuses)
    kw = dict(negative="allow", seed=1, exchange="plain", **NEW, **SHORT)
    eager = pp.fit(blocks, graph.ring(6), 3, **kw)
    fused = pp.fit(blocks, graph.ring(6), 3, fuse=True, **kw)
    torch.testing.assert_close(fused.X, eager.X, rtol=1e-9, atol=1e-12)
