"""The incremental consensus engine (ppdnmf_torch.consensus): the tests that pin the
reconstruction of docs/INCREMENTAL_ADMM.md, batching, warm starts and bad input."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, DataError, GraphError
from ppdnmf_torch import consensus as cs
from ppdnmf_torch.graph import complete, ring

METHODS = ["i_admm", "pi_admm1", "pi_admm2", "w_admm"]


def ls_loss(N, seed=0, p=2, device=None, dtype=torch.float64):
    d = cs.least_squares_data(N, dim=p, seed=seed, device=device, dtype=dtype)
    return cs.LeastSquares.from_samples(d.inputs, d.targets)


def logistic_loss(N, seed=0, device=None):
    d = cs.logistic_data(N, seed=seed, device=device)
    return cs.Logistic(d.inputs, d.targets)


def matrix_loss(N, L, K, M, seed=0, B=None):
    g = torch.Generator().manual_seed(seed)
    lead = () if B is None else (B,)
    Z = torch.rand((*lead, N, L, M), generator=g, dtype=torch.float64)
    Y = torch.rand((*lead, N, K, M), generator=g, dtype=torch.float64)
    return cs.LeastSquares.from_factors(Z, Y), Z, Y


def engine(loss, method, rho, graph=None, **kw):
    if method == "w_admm" and graph is None:
        graph = complete(loss.n_agents) if loss.n_agents > 1 else None
    if method == "pi_admm2":
        kw.setdefault("sigma", 1e-3)
    return cs.IncrementalADMM(loss, method, rho, graph=graph, **kw)


# -- the invariant z = mean_i (x_i - y_i / rho), at every step ----------------------------
@pytest.mark.parametrize("case", range(16))
def test_invariant_holds_at_every_step(case):
    rng = random.Random(case)
    N = rng.randint(2, 9)
    method = METHODS[case % 4]
    rho = rng.uniform(1.5, 20.0)
    if case % 3 == 2:
        loss = matrix_loss(N, rng.randint(1, 4), rng.randint(1, 3), 6, seed=case)[0]
    else:
        loss = ls_loss(N, seed=case, p=rng.randint(1, 4))
    step = "linearized" if case % 5 == 4 else "exact"
    eng = engine(loss, method, [rho, rho * 1.5], seeds=case, step=step,
                 graph=complete(N) if method == "w_admm" else None)
    if case % 2:  # a projection changes what the agents use, not the invariant
        eng.projection = cs.project_nonnegative
    res = eng.run(rng.randint(3, 12), transcript=True, watch=range(N))
    tr = res.transcript
    rho_b = res.rho.view(1, 2, 1, *([1] * len(loss.shape)))
    mean = (tr.x - tr.y / rho_b).mean(2)
    scale = 1.0 + float(tr.x.abs().max())
    assert tr.tokens.shape == mean.shape and tr.tokens.shape[0] == res.steps + 1
    torch.testing.assert_close(mean, tr.tokens, rtol=0, atol=1e-12 * scale)


# -- gamma = 1 is I-ADMM, bit for bit --------------------------------------------------------
@pytest.mark.parametrize("step", ["exact", "linearized"])
def test_gamma_one_reproduces_i_admm_bit_for_bit(step):
    loss = ls_loss(6, seed=1)
    a = cs.IncrementalADMM(loss, cs.i_admm(step=step, start=(0.0, 100.0)), 7.0, seeds=4).run(
        40, transcript=True)
    b = cs.IncrementalADMM(loss, cs.pi_admm1(gamma=(1.0, 1.0), start=(0.0, 100.0), step=step), 7.0,
                           seeds=4).run(40, transcript=True)
    for t1, t2 in [(a.x, b.x), (a.y, b.y), (a.z, b.z), (a.transcript.tokens, b.transcript.tokens)]:
        assert torch.equal(t1, t2)
    # ... and a real perturbation changes the trajectory but not the limit
    c = cs.IncrementalADMM(loss, cs.pi_admm1(start=(0.0, 100.0), step=step), 7.0, seeds=4).run(40)
    assert not torch.equal(a.x, c.x)


def test_zero_start_i_admm_is_the_default():
    res = cs.IncrementalADMM(ls_loss(4), "i_admm", 3.0).run(0, transcript=True, watch=[1])
    assert res.transcript.tokens.shape == (1, 1, 2) and res.transcript.x.shape == (1, 1, 1, 2)
    assert res.transcript.agents.shape == (0, 1)
    assert torch.count_nonzero(res.x) == 0 and torch.count_nonzero(res.transcript.tokens) == 0
    r2 = cs.IncrementalADMM(ls_loss(4), "pi_admm1", 3.0).run(0)
    assert bool((r2.x > 0).all()) and torch.equal(r2.y, r2.rho.view(1, 1, 1) * r2.x)   # Algorithm 2
    assert torch.count_nonzero(r2.z) == 0


# -- batched trials equal single runs, bit for bit ------------------------------------------
@pytest.mark.parametrize("kind", ["ls", "logistic", "matrix"])
@pytest.mark.parametrize("method", METHODS)
def test_batched_trials_equal_single_runs(kind, method, device):
    B, N = 3, 5
    rhos, seeds = [2.0, 5.0, 11.0], [3, 8, 1]
    step = "linearized" if kind == "logistic" else "exact"
    if kind == "ls":
        loss, mk = ls_loss(N, seed=seeds, device=device), lambda b: ls_loss(N, seed=seeds[b], device=device)
    elif kind == "logistic":
        loss, mk = logistic_loss(N, seed=seeds, device=device), lambda b: logistic_loss(N, seed=seeds[b], device=device)
    else:
        lossm, Z, Y = matrix_loss(N, 3, 2, 7, seed=0, B=B)
        loss = cs.LeastSquares.from_factors(Z.to(device), Y.to(device))
        mk = lambda b: cs.LeastSquares.from_factors(Z[b].to(device), Y[b].to(device))
    graphs = [ring(N), complete(N), ring(N)]
    extra = {"pi_admm1": {"spread": 1.0}, "pi_admm2": {"sigma": 1e-2}}.get(method, {})
    kw = dict(graph=graphs if method == "w_admm" else None, step=step, **extra)
    batched = cs.IncrementalADMM(loss, method, rhos, seeds=seeds, x_star=None, **kw).run(
        6, transcript=True, record_every=2)
    for b in range(B):
        kw1 = dict(kw, graph=graphs[b] if method == "w_admm" else None)
        single = cs.IncrementalADMM(mk(b), method, rhos[b], seeds=seeds[b], **kw1).run(
            6, transcript=True, record_every=2)
        assert torch.equal(batched.x[b], single.x[0]) and torch.equal(batched.y[b], single.y[0])
        assert torch.equal(batched.z[b], single.z[0])
        assert torch.equal(batched.transcript.tokens[:, b], single.transcript.tokens[:, 0])
        assert torch.equal(batched.transcript.agents[:, b], single.transcript.agents[:, 0])
        assert torch.equal(batched.consensus[:, b], single.consensus[:, 0])
    assert batched.x.device.type == device.type


def test_hyperparameters_batch_as_trials():
    loss = ls_loss(5, seed=2)
    res = cs.IncrementalADMM(loss, "pi_admm2", [2.0, 4.0], sigma=[0.0, 1e-2], seeds=[0, 0],
                             x_star=loss.solution()).run(400, record_every=400)
    # sigma = 0 converges, sigma > 0 stalls at its floor
    assert res.accuracy[-1, 0] < 1e-20 < 1e-8 < res.accuracy[-1, 1]


# -- convergence to the centralized solutions -----------------------------------------------
def test_pi_admm1_reaches_the_least_squares_solution():
    d = cs.least_squares_data(8, seed=5)
    loss = cs.LeastSquares.from_samples(d.inputs, d.targets)
    A = d.inputs[0].reshape(-1, 2).numpy()
    b = d.targets[0].reshape(-1).numpy()
    x_np = np.linalg.lstsq(A, b, rcond=None)[0]
    res = cs.IncrementalADMM(loss, "pi_admm1", 5.0, seeds=1, x_star=loss.solution()).run(400, record_every=100)
    np.testing.assert_allclose(res.x[0].numpy(), np.broadcast_to(x_np, (8, 2)), rtol=0, atol=1e-10)
    np.testing.assert_allclose(res.z[0].numpy(), x_np, rtol=0, atol=1e-10)
    assert res.accuracy[0, 0] > 1e2 and res.accuracy[-1, 0] < 1e-20   # started far away, U(0, 100)


def test_pi_admm1_reaches_the_logistic_solution():
    # the linearised step (8) needs rho above about the local Lipschitz constant (~ 15 here)
    from scipy.optimize import minimize

    d = cs.logistic_data(6, seed=2)
    loss = cs.Logistic(d.inputs, d.targets)
    O = d.inputs[0].reshape(-1, 2).numpy()
    t = d.targets[0].reshape(-1).numpy()
    f = lambda x: np.logaddexp(0, -t * (O @ x)).sum()
    g = lambda x: -(O * (t / (1 + np.exp(t * (O @ x))))[:, None]).sum(0)
    x_sp = minimize(f, np.zeros(2), jac=g, method="BFGS", options={"gtol": 1e-11}).x
    np.testing.assert_allclose(loss.solution()[0].numpy(), x_sp, atol=1e-8)
    res = cs.IncrementalADMM(loss, cs.pi_admm1(spread=0.1, start=(0.0, 10.0), step="linearized"), 16.0,
                             seeds=0).run(300, record_every=300)
    np.testing.assert_allclose(res.x[0].numpy(), np.broadcast_to(x_sp, (6, 2)), atol=1e-7)


def test_matrix_exact_step_one_agent_equals_centralized():
    """f(X) = 1/2||Z - X Y||^2, X (L, K), N = 1, gamma = 1: the walk is a proximal iteration
    whose fixed point is the centralized least-squares X (rho near the Gram matrix's small
    eigenvalues, 0.11 .. 9.6 here, for speed)."""
    loss, Z, Y = matrix_loss(1, 4, 3, 9, seed=7)
    X_np = np.linalg.lstsq(Y[0].numpy().T, Z[0].numpy().T, rcond=None)[0].T
    for method in (cs.i_admm(), cs.pi_admm1(gamma=(1.0, 1.0), start=(0.0, 1.0))):
        res = cs.IncrementalADMM(loss, method, 0.5).run(300, record_every=300)
        np.testing.assert_allclose(res.x[0, 0].numpy(), X_np, rtol=0, atol=1e-10)
    np.testing.assert_allclose(loss.solution()[0].numpy(), X_np, atol=1e-12)
    # the exact step solves its own optimality condition: grad f(X) - y - c (z - X) = 0
    g = torch.Generator().manual_seed(0)
    z, y = torch.rand((2, 4, 3), generator=g, dtype=torch.float64), torch.rand((2, 4, 3), generator=g, dtype=torch.float64)
    c = torch.tensor([0.5, 3.0], dtype=torch.float64).view(2, 1, 1)
    X = loss.exact_step(0, z, y, c)
    torch.testing.assert_close(loss.grad(0, X) - y - c * (z - X), torch.zeros_like(X), atol=1e-12, rtol=0)


# -- PI-ADMM2's floor scales as sigma^2 ----------------------------------------------------
def test_pi_admm2_floor_scales_as_sigma_squared():
    """With the exact least-squares step the walk is affine in the state plus the noise, and
    the same seed gives the same standard normals: once the start's transient has decayed
    (here to < 1e-25), the error is exactly sigma times a fixed noise response, so the
    floors' ratio is (sigma_1 / sigma_2)^2 up to rounding and that transient; 1e-6 is loose."""
    loss = ls_loss(5, seed=3)
    sig = [1e-2, 1e-4]
    res = cs.IncrementalADMM(loss, "pi_admm2", 4.0, sigma=sig, seeds=[9, 9], x_star=loss.solution()).run(
        600, record_every=10)
    tail = res.accuracy[-20:]
    ratio = tail[:, 0].mean() / tail[:, 1].mean()
    assert ratio == pytest.approx((sig[0] / sig[1]) ** 2, rel=1e-6)
    assert 1e-9 < float(tail[:, 1].mean()) < 1e-6   # a floor, not convergence


# -- warm starts, callbacks, projections, user losses ---------------------------------------
def test_continuing_a_run_is_the_same_as_one_run():
    loss = ls_loss(5, seed=1)
    e1 = engine(loss, "pi_admm1", 3.0, seeds=2)
    e1.run(4)
    r1 = e1.run(6, transcript=True)
    r2 = engine(loss, "pi_admm1", 3.0, seeds=2).run(10, transcript=True)
    assert torch.equal(r1.x, r2.x) and torch.equal(r1.transcript.tokens, r2.transcript.tokens[20:])
    assert r1.steps == 50 and r1.vectors.tolist() == list(range(20, 51, 5))
    # a warm start from the state (no random draws in I-ADMM): same bits as one run
    a = engine(loss, "i_admm", 3.0).run(3)
    b = cs.IncrementalADMM(loss, "i_admm", 3.0, initial_state=a.state).run(4)
    c = engine(loss, "i_admm", 3.0).run(7)
    assert torch.equal(b.x, c.x)
    # swapping the losses keeps the state and its invariant
    e = engine(loss, "i_admm", 3.0)
    e.run(2)
    e.set_loss(ls_loss(5, seed=9))
    r = e.run(2, transcript=True, watch=range(5))
    torch.testing.assert_close((r.transcript.x - r.transcript.y / 3.0).mean(2), r.transcript.tokens,
                               atol=1e-12, rtol=0)


def test_callback_can_stop_and_sees_rounds():
    seen = []
    res = engine(ls_loss(4), "i_admm", 2.0).run(50, callback=lambda info: seen.append(info.round) or info.round >= 3)
    assert seen == [0, 1, 2, 3] and res.steps == 12


def test_projection_is_used_by_the_agents():
    g = torch.Generator().manual_seed(1)
    Y = torch.rand((4, 2, 6), generator=g, dtype=torch.float64)
    X0 = 0.1 + torch.rand((3, 2), generator=g, dtype=torch.float64)
    loss = cs.LeastSquares.from_factors(X0 @ Y, Y)        # the solution X0 is interior: X0 > 0
    res = cs.IncrementalADMM(loss, "i_admm", 3.0, projection=cs.project_nonnegative).run(300)
    torch.testing.assert_close(res.z_projected[0], X0, atol=1e-8, rtol=0)
    # a negative solution: the agents only ever see max(z, 0)
    neg = cs.LeastSquares.from_factors(-(X0 @ Y), Y)
    r = cs.IncrementalADMM(neg, "i_admm", 3.0, projection=cs.project_nonnegative).run(5, transcript=True)
    assert bool((r.z_projected >= 0).all()) and bool((r.transcript.tokens < 0).any())


def test_callable_loss_equals_builtin():
    loss = ls_loss(4, seed=2)
    user = cs.CallableLoss(4, (2,), grad=loss.grad, exact_step=loss.exact_step)
    for step in ("exact", "linearized"):
        a = cs.IncrementalADMM(loss, "pi_admm1", 6.0, step=step).run(5)
        b = cs.IncrementalADMM(user, "pi_admm1", 6.0, step=step).run(5)
        assert torch.equal(a.x, b.x)
    with pytest.raises(ConfigError, match="exact step"):
        cs.IncrementalADMM(cs.CallableLoss(4, (2,), grad=loss.grad), "i_admm", 1.0)


def test_walks_follow_the_graph_and_the_cycle():
    from ppdnmf_torch.consensus import random_hamiltonian_graph

    g, cyc = random_hamiltonian_graph(12, 0.3, seed=1)
    adj = {frozenset(e) for e in g.edges}
    w = cs.IncrementalADMM(ls_loss(12), "w_admm", 2.0, graph=g).run(5, transcript=True)
    a = w.transcript.agents[:, 0].tolist()
    assert all(frozenset((a[k], a[k + 1])) in adj for k in range(len(a) - 1))
    c = cs.IncrementalADMM(ls_loss(12), "i_admm", 2.0, graph=g).run(2, transcript=True)
    assert c.transcript.agents[:12, 0].tolist() == list(cs.hamiltonian_cycle(g))
    # per-trial cycles go by a per-trial agent index
    r = cs.IncrementalADMM(ls_loss(12, seed=[0, 1]), "i_admm", 2.0, cycle=[cyc, list(range(12))[::-1]],
                           x_star=ls_loss(12, seed=[0, 1]).solution()).run(300, record_every=300)
    assert r.transcript is None and bool((r.accuracy[-1] < 1e-20).all())


def test_float32_runs():
    loss = ls_loss(4, dtype=torch.float32)
    res = cs.IncrementalADMM(loss, "pi_admm1", 4.0, x_star=loss.solution()).run(200, record_every=200)
    assert res.x.dtype == torch.float32 and float(res.accuracy[-1, 0]) < 1e-6


# -- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, err, match", [
    (dict(rho=0.0), ConfigError, "rho"),
    (dict(rho=float("nan")), ConfigError, "rho"),
    (dict(rho=[1.0, 2.0], seeds=[1, 2, 3]), ConfigError, "seeds has 3"),
    (dict(method="admm"), ConfigError, "unknown 'admm'"),
    (dict(method="pi_admm1", rho=0.5), ConfigError, "rho > spread"),
    (dict(method="pi_admm2", sigma=-1.0), ConfigError, "sigma"),
    (dict(method="w_admm"), ConfigError, "needs the graph"),
    (dict(cycle=[0, 1, 1, 3]), GraphError, "permutation"),
    (dict(graph=ring(4), cycle=[0, 2, 1, 3]), GraphError, "not neighbours"),
    (dict(graph=ring(5)), GraphError, "5 agents"),
    (dict(compile="always"), ConfigError, "compile"),
    (dict(x_star=torch.zeros(3)), ConfigError, "x_star"),
    (dict(method=cs.pi_admm1(gamma=(1.2, 1.1))), ConfigError, "low <= high"),
    (dict(projection=3), ConfigError, "projection"),
])
def test_bad_input_names_the_parameter(kwargs, err, match):
    kw = dict(method="i_admm", rho=2.0)
    kw.update(kwargs)
    with pytest.raises(err, match=match):
        cs.IncrementalADMM(ls_loss(4), kw.pop("method"), kw.pop("rho"), **kw)


def test_bad_runs_and_data():
    eng = engine(ls_loss(4), "i_admm", 1.0)
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="n_rounds"):
            eng.run(bad)
    with pytest.raises(ConfigError, match="watch"):
        eng.run(1, watch=[7])
    with pytest.raises(ConfigError, match="exact step"):
        cs.IncrementalADMM(logistic_loss(4), "i_admm", 1.0)
    with pytest.raises(DataError, match="labels"):
        cs.Logistic(torch.zeros(2, 3, 2, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(DataError, match="targets"):
        cs.LeastSquares.from_samples(torch.zeros(2, 3, 2, dtype=torch.float64), torch.zeros(2, 4, dtype=torch.float64))
    with pytest.raises(DataError, match="NaN"):
        cs.LeastSquares.from_factors(torch.full((2, 3, 4), float("nan")), torch.zeros(2, 2, 4))
    with pytest.raises(ConfigError, match="loss"):
        cs.IncrementalADMM("loss", "i_admm", 1.0)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ls", "logistic"])
def test_compiled_round_matches_eager(kind):
    loss = ls_loss(6, seed=[0, 1]) if kind == "ls" else logistic_loss(6, seed=[0, 1])
    step = "exact" if kind == "ls" else "linearized"
    outs = [cs.IncrementalADMM(loss, "pi_admm2", [4.0, 6.0], sigma=1e-3, step=step, compile=mode).run(
        20, transcript=True) for mode in ("none", "round", "step")]
    for o in outs[1:]:
        torch.testing.assert_close(o.x, outs[0].x, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(o.transcript.tokens, outs[0].transcript.tokens, rtol=1e-9, atol=1e-9)
