"""Federated sparse PCA (ppdnmf_torch.models.fsspca): the manifold, the line searches, the
smoothing, Algorithm 1's steps, the PCA limit, batching, deflation, centring, checkpoints,
and each choice docs/SPARSE_PCA.md marks (pinned by name in docs/FSSPCA.md)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.checkpoint import CheckpointError
from ppdnmf_torch.errors import ConfigError, ConvergenceWarning, DataError
from ppdnmf_torch.models.fsspca import admm, fit_fsspca, manifold
from ppdnmf_torch.models.fsspca.centring import centred_gram, global_mean, worker_sums
from ppdnmf_torch.models.fsspca.data import (spiked_covariance, split_by_class, split_dirichlet, split_iid)
from ppdnmf_torch.models.fsspca.deflation import fit_deflated, fit_sequential
from ppdnmf_torch.models.fsspca.config import SPEC
from ppdnmf_torch.models.fsspca import fit as fit_mod
from ppdnmf_torch.models.fsspca.fit import prepare_problem
from ppdnmf_torch.models.fsspca.smoothing import DEFAULT_SMOOTHING, SMOOTHINGS, get_smoothing

SMOOTH = sorted(SMOOTHINGS)


def _stiefel(shape, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    return manifold.qf(torch.randn(shape, generator=gen, dtype=dtype))


def _small_problem(K=3, d=8, seed=0, counts=None):
    """K workers' blocks of different sizes, anisotropic so the PCA subspace is well separated."""
    rng = np.random.default_rng(seed)
    counts = counts or [12 + 7 * i for i in range(K)]
    scale = 3.0 * 0.6 ** np.arange(d)  # a well-separated spectrum
    return [rng.standard_normal((n, d)) * scale + 0.3 for n in counts]


def _principal_sines(A, Q, r):
    A = A - A.mean(axis=0)
    V = np.linalg.eigh(A.T @ A)[1][:, -r:]
    return np.sqrt(np.clip(1 - np.linalg.svd(V.T @ Q)[1] ** 2, 0, None))


def _local(problem, state, lam2, rho, psi, mu=1e-3):
    return lambda w: admm.local_objective(problem, w, state.z, state.u, lam2, rho, psi, mu)


def _setup(T=2, K=3, d=8, r=2, seed=0, smoothing="huber", lam2=0.5, rho=5.0):
    blocks = [torch.as_tensor(b) for b in _small_problem(K, d, seed)]
    problem, _ = prepare_problem(blocks, T)
    z = _stiefel((T, d, r), seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    w = manifold.qf(z[:, None] + 0.3 * torch.randn((T, K, d, r), generator=gen, dtype=torch.float64))
    u = 0.5 * torch.randn((T, K, d, r), generator=gen, dtype=torch.float64)
    state = admm.ADMMState(w=w, u=u, z=z, theta=torch.full((T, K), 1e-2, dtype=torch.float64))
    lam = torch.full((T,), lam2, dtype=torch.float64)
    rh = torch.full((T,), rho, dtype=torch.float64)
    return problem, state, lam, rh, get_smoothing(smoothing)


# -- smoothing ------------------------------------------------------------------------
@pytest.mark.parametrize("name", SMOOTH)
def test_smoothing_tends_to_abs_and_derivative_matches(name):
    psi = SMOOTHINGS[name]
    x = torch.linspace(-0.05, 0.05, 401, dtype=torch.float64) + 1.234e-5  # off the Huber kinks at +-mu
    for mu in (1e-2, 1e-3, 1e-4):
        err = (psi.value(x, mu) - x.abs()).abs().max()
        assert err <= 2.0 * mu  # every psi_mu is within 2 mu of |x|
    mu, h = 1e-2, 1e-6
    fd = (psi.value(x + h, mu) - psi.value(x - h, mu)) / (2 * h)
    torch.testing.assert_close(psi.grad(x, mu), fd, atol=1e-6, rtol=1e-6)
    # far from 0 every psi_mu has |x|'s slope
    assert torch.allclose(psi.grad(torch.tensor([-1.0, 1.0], dtype=torch.float64), 1e-3),
                          torch.tensor([-1.0, 1.0], dtype=torch.float64), atol=1e-9)


def test_default_smoothing_is_sqrt_and_unknown_is_refused():
    assert DEFAULT_SMOOTHING == "sqrt" and fit_fsspca.__kwdefaults__["smoothing"] == "sqrt"
    with pytest.raises(ConfigError, match="smoothing"):
        get_smoothing("cosh")


# -- manifold ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 3), (4, 5, 10, 4), (2, 3, 6, 6)])
def test_retraction_stays_on_the_manifold(shape):
    w = _stiefel(shape, 1)
    gen = torch.Generator().manual_seed(2)
    zeta = manifold.project_tangent(w, torch.randn(shape, generator=gen, dtype=torch.float64))
    theta = torch.rand(shape[:-2], generator=gen, dtype=torch.float64) * 10
    Q = manifold.retract(w, zeta, theta)
    eye = torch.eye(shape[-1], dtype=torch.float64)
    assert (Q.transpose(-2, -1) @ Q - eye).abs().max() <= 1e-12
    # qf fixes the signs: the R factor of the retracted point has a positive diagonal
    R = Q.transpose(-2, -1) @ (w + theta[..., None, None] * zeta)
    assert bool((torch.diagonal(R, dim1=-2, dim2=-1) > 0).all())
    assert torch.allclose(torch.tril(R, -1), torch.zeros_like(R), atol=1e-10)


@pytest.mark.parametrize("name", SMOOTH)
def test_riemannian_gradient_matches_finite_differences_along_the_manifold(name):
    problem, state, lam, rho, psi = _setup(smoothing=name, lam2=0.7)
    fg = _local(problem, state, lam, rho, psi, mu=0.05)
    value, egrad = fg(state.w)
    grad = manifold.riemannian_gradient(state.w, egrad)
    # the gradient is tangent: w^T grad is skew
    wg = state.w.transpose(-2, -1) @ grad
    assert (wg + wg.transpose(-2, -1)).abs().max() < 1e-10
    gen = torch.Generator().manual_seed(5)
    xi = manifold.project_tangent(state.w, torch.randn(state.w.shape, generator=gen, dtype=torch.float64))
    h = 1e-6
    tp = torch.full(value.shape, h, dtype=torch.float64)
    fd = (fg(manifold.retract(state.w, xi, tp))[0] - fg(manifold.retract(state.w, xi, -tp))[0]) / (2 * h)
    torch.testing.assert_close(fd, manifold.inner(grad, xi), rtol=1e-5, atol=1e-5)


def test_retraction_derivative_matches_finite_differences():
    w = _stiefel((3, 9, 3), 3)
    gen = torch.Generator().manual_seed(4)
    zeta = manifold.project_tangent(w, torch.randn(w.shape, generator=gen, dtype=torch.float64))
    theta = torch.tensor([0.1, 0.5, 2.0], dtype=torch.float64)
    _, dQ = manifold.retraction_derivative(w, zeta, theta)
    h = 1e-6
    fd = (manifold.retract(w, zeta, theta + h) - manifold.retract(w, zeta, theta - h)) / (2 * h)
    torch.testing.assert_close(dQ, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("search", ["armijo", "wolfe"])
@pytest.mark.parametrize("name", ["huber", "logexp"])
def test_accepted_steps_meet_the_line_search_conditions(search, name):
    problem, state, lam, rho, psi = _setup(T=3, K=4, smoothing=name)
    fg = _local(problem, state, lam, rho, psi, mu=0.01)
    value, egrad = fg(state.w)
    grad = manifold.riemannian_gradient(state.w, egrad)
    # a spread of first trials: some must shrink, some (for Wolfe) grow
    theta0 = torch.logspace(-5, 0, 12, dtype=torch.float64).reshape(3, 4)
    fn = manifold.armijo if search == "armijo" else manifold.strong_wolfe
    res = fn(fg, state.w, value, grad, theta0)
    assert bool(res.accepted.all()) and bool((res.theta > 0).all())
    slope0 = -manifold.inner(grad, grad)
    c1 = manifold.ARMIJO_C1 if search == "armijo" else manifold.WOLFE_C1
    v, _ = fg(res.w)
    torch.testing.assert_close(v, res.value)
    assert bool((v <= value + c1 * res.theta * slope0).all())  # sufficient decrease
    torch.testing.assert_close(res.w, manifold.retract(state.w, -grad, res.theta))
    if search == "wolfe":  # strong curvature condition, slope by finite differences
        h = 1e-7
        fd = (fg(manifold.retract(state.w, -grad, res.theta + h))[0]
              - fg(manifold.retract(state.w, -grad, res.theta - h))[0]) / (2 * h)
        assert bool((fd.abs() <= manifold.WOLFE_C2 * slope0.abs() * (1 + 1e-4)).all())
    else:  # each entry took theta0 * beta^m, the first one that passed
        m = torch.log(theta0 / res.theta) / math.log(1 / manifold.BACKTRACK)
        torch.testing.assert_close(m, m.round(), atol=1e-9, rtol=0)
        prev = res.theta / manifold.BACKTRACK
        shrunk = m.round() > 0
        vp, _ = fg(manifold.retract(state.w, -grad, prev))
        assert bool((vp[shrunk] > (value + c1 * prev * slope0)[shrunk]).all())


def test_each_worker_keeps_its_own_step_size():
    """The batched step of K workers is each worker's step alone (its own line search)."""
    blocks = [torch.as_tensor(b) * c for b, c in zip(_small_problem(3, 6, 3), (0.1, 1.0, 10.0))]
    z, w0 = _stiefel((1, 6, 2), 4), _stiefel((1, 3, 6, 2), 5)
    one = torch.ones(1, dtype=torch.float64)

    def step(bl, w):
        problem, _ = prepare_problem(bl, 1, center=False)  # a worker alone would centre differently
        K = len(bl)
        state = admm.ADMMState(w=w.clone(), u=torch.zeros((1, K, 6, 2), dtype=torch.float64), z=z,
                               theta=torch.full((1, K), 1e3, dtype=torch.float64))
        return admm.local_step(problem, state, 0.5 * one, one, get_smoothing("huber"), 1e-3, inner_steps=2), state

    w_all, s_all = step(blocks, w0)
    assert len(set(s_all.theta.flatten().tolist())) == 3
    for i in range(3):
        w_i, s_i = step(blocks[i:i + 1], w0[:, i:i + 1])
        torch.testing.assert_close(w_i[:, 0], w_all[:, i], rtol=0, atol=1e-12)
        assert s_i.theta[0, 0] == s_all.theta[0, i]


# -- the ADMM steps ------------------------------------------------------------------------
def test_soft_threshold():
    v = torch.tensor([-3.0, -0.5, 0.0, 0.2, 0.5, 2.0], dtype=torch.float64)
    torch.testing.assert_close(admm.soft_threshold(v, 0.5),
                               torch.tensor([-2.5, 0.0, 0.0, 0.0, 0.0, 1.5], dtype=torch.float64))
    # the z-step is the minimizer of lambda_1 ||z||_1 + sum_i rho/2 ||w_i - z + u_i/rho||^2 (eq. (12))
    gen = torch.Generator().manual_seed(0)
    T, K, d, r = 2, 5, 4, 2
    w, u = torch.randn((2, T, K, d, r), generator=gen, dtype=torch.float64)
    lam1, rho = torch.tensor([0.7, 3.0], dtype=torch.float64), torch.tensor([1.5, 2.0], dtype=torch.float64)
    z = admm.z_step((w + u / rho[:, None, None, None]).sum(1), K, lam1, rho)

    def g(z):
        c = w - z[:, None] + u / rho[:, None, None, None]
        return lam1 * z.abs().sum((-2, -1)) + 0.5 * rho * (c * c).sum((1, 2, 3))

    base = g(z)
    for _ in range(50):
        assert bool((g(z + 1e-3 * torch.randn(z.shape, generator=gen, dtype=torch.float64)) >= base).all())
    # the threshold is lambda_1 / (K rho)
    v = (w + u / rho[:, None, None, None]).mean(1)
    tau = (lam1 / (K * rho))[:, None, None]
    torch.testing.assert_close(z, torch.sign(v) * (v.abs() - tau).clamp_min(0))


def test_per_worker_rho_z_step_is_the_weighted_minimizer():
    """rho='worker': with each worker's rho_i, the sum of the uploads and z_step with the mean
    rho_i minimize lambda_1 ||z||_1 + sum_i rho_i/2 ||w_i - z + u_i/rho_i||^2 (eq. (12) with
    per-worker penalties); one rho per trial uploads w_i + u_i/rho exactly as before."""
    gen = torch.Generator().manual_seed(1)
    T, K, d, r = 2, 5, 4, 2
    w, u = torch.randn((2, T, K, d, r), generator=gen, dtype=torch.float64)
    lam1 = torch.tensor([0.7, 3.0], dtype=torch.float64)
    rho = torch.rand((T, K), generator=gen, dtype=torch.float64) * 4 + 0.5
    rho_mean = rho.mean(1)
    z = admm.z_step(admm.upload(w, u, rho, rho_mean).sum(1), K, lam1, rho_mean)

    def g(z):
        c = w - z[:, None] + u / rho[..., None, None]
        return lam1 * z.abs().sum((-2, -1)) + 0.5 * (rho[..., None, None] * c * c).sum((1, 2, 3))

    base = g(z)
    for _ in range(20):
        assert bool((g(z + 1e-3 * torch.randn(z.shape, generator=gen, dtype=torch.float64)) >= base).all())
    one = torch.tensor([1.5, 2.0], dtype=torch.float64)
    assert torch.equal(admm.upload(w, u, one), w + u / one[:, None, None, None])
    torch.testing.assert_close(admm.dual_step(u, w, z, rho) - u, rho[..., None, None] * (w - z[:, None]))


def test_rho_rules_cost_one_secure_round():
    blocks = _small_problem(4, 8, 5)
    auto = fit_fsspca(blocks, 2, alpha=30.0, max_iter=3, tol=0)
    per = fit_fsspca(blocks, 2, alpha=30.0, max_iter=3, tol=0, rho="worker")
    assert per.settings["rho"] == "worker" and auto.settings["rho"] == "auto"
    # the centring round, one per iteration, and one for the rule's numbers: "auto" sums the
    # workers' lambda_max(C_i), "worker" their rho_i (neither reaches the server in the clear)
    assert auto.costs["rounds"] == 5 and per.costs["rounds"] == 5
    fixed = fit_fsspca(blocks, 2, alpha=30.0, max_iter=3, tol=0, rho=float(auto.settings["rho_mean"][0]))
    assert fixed.costs["rounds"] == 4
    lam = torch.linalg.eigvalsh(prepare_problem([torch.as_tensor(b) for b in blocks])[0].gram[0]).amax(-1)
    for res in (per, auto):
        torch.testing.assert_close(torch.tensor(res.settings["rho_mean"], dtype=torch.float64), 2.0 * lam.mean()[None])
    with pytest.raises(ConfigError, match="rho"):
        fit_fsspca(blocks, 2, rho="big")


@pytest.mark.slow
def test_rho_worker_reaches_the_answer_of_rho_auto():
    blocks = _small_problem(4, 8, 5)
    kw = dict(alpha=30.0, max_iter=3000, tol=1e-8)  # under the polar step tol 1e-6 left them 1.6e-5 apart
    auto = fit_fsspca(blocks, 2, **kw)
    per = fit_fsspca(blocks, 2, rho="worker", **kw)
    assert bool(auto.converged.all()) and bool(per.converged.all())
    torch.testing.assert_close(per.z, auto.z, rtol=0, atol=1e-5)


@pytest.mark.parametrize("search", ["armijo", "wolfe"])
def test_a_point_stationary_to_rounding_takes_no_trial_step(search):
    """A worker whose first trial could not decrease f beyond rounding keeps its point at no cost
    (it used to backtrack 30 times on noise, and the whole batch waited)."""
    problem, state, lam, rho, psi = _setup(T=1, K=3)
    fg = _local(problem, state, lam, rho, psi)
    value, egrad = fg(state.w)
    grad = manifold.riemannian_gradient(state.w, egrad)
    grad[:, 0] *= 1e-12  # worker 0 at a stationary point to the dtype's resolution
    fn = manifold.armijo if search == "armijo" else manifold.strong_wolfe
    theta0 = torch.full((1, 3), 1e-3, dtype=torch.float64)
    res = fn(fg, state.w, value, grad, theta0)
    assert bool(res.accepted.all()) and res.theta[0, 0] == 0 and bool((res.theta[0, 1:] > 0).all())
    assert torch.equal(res.w[:, 0], state.w[:, 0])
    res_all = fn(fg, state.w, value, grad * 1e-12, theta0)
    assert res_all.n_evals == 0 and torch.equal(res_all.w, state.w)


@pytest.mark.parametrize("search", ["armijo", "polar", pytest.param("wolfe", marks=pytest.mark.slow)])
def test_augmented_lagrangian_over_a_round(search):
    """Each step's effect on L_rho as the ADMM theory has it: the w-step and the z-step do not
    increase it (a descent step on (14), and (12) exactly); the dual step raises it by exactly
    ||u+ - u||^2 / rho; and once the duals settle (rho large enough) the round decreases it."""
    problem, state, lam2, rho, psi = _setup(T=2, K=3, smoothing="logexp")
    mu = 0.1
    # rho above the local gradient's Lipschitz constant (2 ||C_i|| + lambda_2 / (2 mu)), as the
    # nonconvex ADMM theory asks (Wang, Yin and Zeng)
    lip = 2 * torch.linalg.matrix_norm(problem.gram, ord=2).amax() + lam2.max() / (2 * mu)
    rho = torch.full((2,), 2.0 * float(lip), dtype=torch.float64)
    lam1 = torch.tensor([0.5, 2.0], dtype=torch.float64)
    state.w, state.u = state.z[:, None].expand_as(state.w).clone(), torch.zeros_like(state.u)  # Algorithm 1's start

    def L(w, z, u):
        return admm.augmented_lagrangian(problem, w, z, u, lam1, lam2, rho, psi, mu)

    K = problem.n_workers
    rounds = []
    for it in range(60):
        L0 = L(state.w, state.z, state.u)
        solver = dict(solver="polar") if search == "polar" else dict(solver="riemannian", line_search=search)
        w = admm.local_step(problem, state, lam2, rho, psi, mu, inner_steps=5, **solver)
        L1 = L(w, state.z, state.u)
        z = admm.z_step((w + state.u / rho[:, None, None, None]).sum(1), K, lam1, rho)
        L2 = L(w, z, state.u)
        u = admm.dual_step(state.u, w, z, rho)
        L3 = L(w, z, u)
        assert bool((L1 <= L0 + 1e-9 * L0.abs()).all())
        assert bool((L2 <= L1 + 1e-9 * L1.abs()).all())
        torch.testing.assert_close(L3 - L2, ((u - state.u) ** 2).sum((1, 2, 3)) / rho, rtol=1e-6, atol=1e-8)
        rounds.append(L3 - L0)
        state.w, state.z, state.u = w, z, u
    late = torch.stack(rounds[40:])
    assert bool((late <= 1e-7 * L3.abs()).all())


def test_objective_and_residuals_at_consensus():
    problem, state, lam2, rho, psi = _setup(T=1, K=3)
    lam1 = torch.tensor([1.0], dtype=torch.float64)
    w = state.z[:, None].expand_as(state.w)
    primal, dual, cons = admm.residuals(w, state.z, state.z, rho)
    assert float(primal) == 0 and float(dual) == 0 and float(cons) == 0
    A = np.vstack(_small_problem(3, 8, 0))
    A = A - A.mean(0)
    z = state.z[0].numpy()
    f = np.linalg.norm(A - A @ z @ z.T) ** 2
    expect = f + lam1.item() * np.abs(z).sum() + 3 * lam2.item() * psi.value(state.z, 1e-3).sum().item()
    assert abs(admm.objective(problem, w, state.z, lam1, lam2, psi, 1e-3).item() - expect) < 1e-8 * expect


# -- fits ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("split,search", [("class", "armijo"), ("class", "polar"),
                                          pytest.param("iid", "armijo", marks=pytest.mark.slow),
                                          pytest.param("iid", "polar", marks=pytest.mark.slow),
                                          pytest.param("class", "wolfe", marks=pytest.mark.slow),
                                          pytest.param("iid", "wolfe", marks=pytest.mark.slow)])
def test_zero_penalties_give_the_pca_subspace(split, search):
    blocks = _small_problem(4, 8, 1)
    A = np.vstack(blocks)
    if split == "class":  # non-IID: workers hold differently shifted rows
        blocks = [b + 2.0 * i for i, b in enumerate(blocks)]
        A = np.vstack(blocks)
    solver = dict(local_solver="polar") if search == "polar" else dict(local_solver="riemannian", line_search=search)
    res = fit_fsspca(blocks, 3, alpha=0.0, max_iter=400, tol=1e-6, **solver)
    assert bool(res.converged.all())
    assert _principal_sines(A, res.components[0].numpy(), 3).max() < 1e-4
    assert res.sparsity.item() == 0.0


def test_a_batched_trial_equals_the_same_trial_alone():
    sp = spiked_covariance(n=120, d=12, r=2, support=3, seed=0)
    groups = split_iid(120, 3, seed=0)
    kw = dict(groups=groups, max_iter=25, tol=1e-6, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        both = fit_fsspca(sp.X, 2, alpha=[0.0, 30.0, 60.0], trials=3, **kw)
        with pytest.raises(ConfigError, match="alpha"):
            fit_fsspca(sp.X, 2, alpha=[1.0, 2.0], trials=3, **kw)
        for t, a in enumerate([0.0, 30.0, 60.0]):
            alone = fit_fsspca(sp.X, 2, alpha=a, **kw)
            # the same start: trial t of a batch is drawn from (seed, t)
            alone_t = fit_fsspca(sp.X, 2, alpha=a, init=_start(t, kw), **kw)
            assert alone_t.n_iter.item() == both.n_iter[t].item()
            # batched linear algebra may round differently from the unbatched: not bit for bit
            torch.testing.assert_close(alone_t.z[0], both.z[t], rtol=0, atol=1e-10)
            torch.testing.assert_close(alone_t.history["objective"][:, 0],
                                       both.history["objective"][: alone_t.n_iter.item(), t], rtol=1e-10, atol=0)
            if t == 0:
                torch.testing.assert_close(alone.z[0], both.z[0], rtol=0, atol=1e-10)


def _start(t, kw):
    from ppdnmf_torch.models.fsspca.fit import initial_z

    return initial_z(12, 2, t + 1, kw["seed"], None, torch.float64, torch.device("cpu"))[t]


def test_lambda_2_follows_alpha_over_k_and_zero_is_the_unsmoothed_baseline():
    blocks = _small_problem(4, 6, 2)
    res = fit_fsspca(blocks, 2, alpha=8.0, max_iter=3, tol=0)
    assert res.settings["lambda_2"] == [2.0]
    base = fit_fsspca(blocks, 2, alpha=8.0, lambda_2=0.0, max_iter=3, tol=0)
    assert base.settings["lambda_2"] == [0.0]
    assert SPEC.inner_steps == 4 and SPEC.line_search == "armijo" and SPEC.rho == "auto"


def test_sparse_loadings_recover_the_spiked_support():
    sp = spiked_covariance(n=400, d=20, r=1, support=4, spikes=(10.0,), seed=1)
    groups = split_iid(400, 4, seed=0)
    alphas = [0.0, 100.0, 200.0]
    res = fit_fsspca(sp.X, 1, groups=groups, alpha=alphas, trials=3, max_iter=400, tol=1e-6)
    assert bool(res.converged.all())
    z = res.z[:, :, 0].numpy()
    nnz = (z != 0).sum(axis=1)
    assert nnz[0] == 20 and nnz[0] > nnz[1] > nnz[2] >= 4  # sparser as lambda_1 grows
    top = np.argsort(-np.abs(z[2]))[:4]
    assert set(top) == set(np.flatnonzero(sp.support[:, 0]))  # the largest entries are the true support
    assert abs(z[2] @ sp.V[:, 0]) / np.linalg.norm(z[2]) > 0.999


def test_deflation_loadings_are_orthogonal_to_the_earlier_ones():
    sp = spiked_covariance(n=300, d=15, r=3, support=3, spikes=(9.0, 6.0, 3.0), seed=2)
    groups = split_iid(300, 3, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # orthogonality holds at every iterate
        results, z, comps = fit_sequential(sp.X, [1, 2], groups=groups, alpha=20.0, max_iter=60, tol=1e-6)
        first = results[0].components[0]
        later = fit_deflated(sp.X, first, 1, groups=groups, alpha=0.0, max_iter=60, tol=1e-6)
    Q = comps[0]
    torch.testing.assert_close(Q.T @ Q, torch.eye(3, dtype=torch.float64), rtol=0, atol=1e-10)
    assert (first.T @ later.components[0]).abs().max() < 1e-10
    # the workers' points stay in the complement too
    assert (first.T @ later.w[0]).abs().max() < 1e-8


def test_centring_is_a_sum_of_what_each_worker_shares():
    blocks = [torch.as_tensor(b) for b in _small_problem(3, 5, 4)]
    s, n = worker_sums(blocks)
    m = global_mean(s, n)
    A = torch.cat(blocks)
    torch.testing.assert_close(m, A.mean(0))
    gram = torch.stack([b.T @ b for b in blocks])
    q = torch.stack([b.square().sum() for b in blocks])
    C, qc = centred_gram(gram, q, s, n, m)
    torch.testing.assert_close(C, torch.stack([(b - m).T @ (b - m) for b in blocks]))
    torch.testing.assert_close(qc, torch.stack([(b - m).square().sum() for b in blocks]))


def test_histories_callback_and_shapes():
    blocks = _small_problem(3, 6, 5)
    seen = []
    res = fit_fsspca(blocks, 2, alpha=[1.0, 5.0], trials=2, max_iter=7, tol=0,
                     callback=lambda info: seen.append(info.iteration) or info.iteration == 5)
    assert seen == [1, 2, 3, 4, 5] and res.n_iter.tolist() == [5, 5]
    for k, h in res.history.items():
        assert h.shape == (5, 2), k
    assert res.w.shape == (2, 3, 6, 2) and res.z.shape == (2, 6, 2) and res.components.shape == (2, 6, 2)
    torch.testing.assert_close(res.history["consensus"][-1],
                               torch.linalg.matrix_norm(res.w - res.z[:, None]).amax(1))
    assert bool(((res.explained_variance >= 0) & (res.explained_variance <= 1)).all())


def test_adjusted_variance_of_orthonormal_loadings_is_the_plain_one():
    A = torch.as_tensor(np.vstack(_small_problem(2, 6, 6)))
    A = A - A.mean(0)
    C = (A.T @ A)[None]
    E = torch.linalg.eigh(C[0])[1][None, :, -3:]  # uncorrelated scores: adjusted == plain
    torch.testing.assert_close(admm.adjusted_variance(C, E), torch.trace(E[0].T @ C[0] @ E[0])[None] / torch.trace(C[0]))
    V = _stiefel((1, 6, 3), 7)  # correlated scores: adjusted < plain
    assert admm.adjusted_variance(C, V) < torch.trace(V[0].T @ C[0] @ V[0]) / torch.trace(C[0]) - 1e-6
    # correlated loadings explain less than the sum of their variances; a zero column adds nothing
    Vc = torch.cat([V[..., :1], V[..., :1] + 0.1 * V[..., 1:2], torch.zeros_like(V[..., :1])], -1)
    assert admm.adjusted_variance(C, Vc) < admm.adjusted_variance(C, Vc[..., :1]) * 2
    torch.testing.assert_close(admm.adjusted_variance(C, Vc[..., ::2]), admm.adjusted_variance(C, Vc[..., :1]))


def test_checkpoint_resume_equals_an_uninterrupted_run(tmp_path):
    blocks = _small_problem(3, 6, 8)
    kw = dict(alpha=[2.0, 6.0], trials=2, tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        full = fit_fsspca(blocks, 2, max_iter=30, **kw)
        fit_fsspca(blocks, 2, max_iter=30, checkpoint_dir=tmp_path, checkpoint_every=10,
                   callback=lambda info: info.iteration == 12, **kw)
        resumed = fit_fsspca(blocks, 2, max_iter=30, checkpoint_dir=tmp_path, resume=True, **kw)
    assert resumed.n_iter.tolist() == [30, 30]
    torch.testing.assert_close(resumed.z, full.z, rtol=0, atol=0)
    torch.testing.assert_close(resumed.history["objective"], full.history["objective"], rtol=0, atol=0)
    with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* holds the checkpoints of another run"):
        fit_fsspca(blocks, 2, max_iter=30, checkpoint_dir=tmp_path, alpha=1.0)  # a fresh run: refused
    with pytest.raises(CheckpointError, match=r"different run: its alpha is \[2.0, 6.0\], this run's \[1.0\]"):
        fit_fsspca(blocks, 2, max_iter=30, checkpoint_dir=tmp_path, alpha=1.0, resume=True)


def test_float32_runs_and_follows_the_input():
    blocks = [b.astype(np.float32) for b in _small_problem(3, 6, 9)]
    res = fit_fsspca(blocks, 2, alpha=0.0, max_iter=200, tol=1e-3)  # float32 resolves the consensus gap to ~1e-4
    assert res.z.dtype == torch.float32
    A = np.vstack(blocks).astype(np.float64)
    assert _principal_sines(A, res.components[0].double().numpy(), 2).max() < 1e-2


@pytest.mark.parametrize("solver", [dict(local_solver="polar"), dict(local_solver="riemannian", line_search="wolfe")])
def test_fsspca_on_device(device, solver):
    blocks = [torch.as_tensor(b, device=device) for b in _small_problem(3, 6, 10)]
    res = fit_fsspca(blocks, 2, alpha=1.0, max_iter=20, tol=0, **solver)
    assert res.z.device.type == device.type


def test_bad_input_is_refused():
    blocks = _small_problem(3, 6, 11)
    with pytest.raises(DataError, match=r"data\[1\]"):
        fit_fsspca([blocks[0], blocks[1][:, :4]], 2)
    with pytest.raises(DataError, match=r"data\[0\]"):
        fit_fsspca([np.full((3, 6), np.nan)], 2)
    with pytest.raises(ConfigError, match="n_components"):
        fit_fsspca(blocks, 7)
    with pytest.raises(ConfigError, match="line_search"):
        fit_fsspca(blocks, 2, line_search="exact")
    with pytest.raises(ConfigError, match="rho"):
        fit_fsspca(blocks, 2, rho=0.0)
    with pytest.raises(DataError, match="groups"):
        fit_fsspca(np.vstack(blocks), 2, groups=[0, 1])


@pytest.mark.parametrize("split", ["iid", "class", "dirichlet"])
def test_splits_give_every_worker_rows(split):
    y = np.repeat(np.arange(3), [50, 30, 20])
    if split == "iid":
        g = split_iid(100, 7, seed=0)
    elif split == "class":
        g = split_by_class(y, 7)
        assert all(len(np.unique(y[g == k])) <= 2 for k in range(7))
    else:
        g = split_dirichlet(y, 7, concentration=0.1, seed=0)
    assert np.bincount(g, minlength=7).min() >= 1 and g.shape == (100,)


# -- the server's aggregation (ppdnmf_torch.exchange.aggregation) ---------------------------------
def test_secure_aggregation_wired_in_equals_the_plain_path():
    """The z-step and the centring through the quantized secure sum: the masks cancel exactly
    (two mask seeds give the same bits), the sums equal the plain ones to the codec's
    resolution, and every round is counted."""
    blocks = _small_problem(3, 6, 12)
    kw = dict(alpha=[0.0, 5.0], trials=2, max_iter=10, tol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        plain = fit_fsspca(blocks, 2, aggregation="plain", **kw)
        q1 = fit_fsspca(blocks, 2, aggregation="quantized", aggregation_options=dict(seed=1), **kw)
        q2 = fit_fsspca(blocks, 2, aggregation="quantized", aggregation_options=dict(seed=2), **kw)
    torch.testing.assert_close(q1.z, q2.z, rtol=0, atol=0)
    torch.testing.assert_close(q1.mean, q2.mean, rtol=0, atol=0)
    torch.testing.assert_close(q1.mean, plain.mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(q1.z, plain.z, rtol=0, atol=1e-7)
    assert q1.costs["rounds"] == plain.costs["rounds"] == 12  # centring, rho's round, one per iteration
    assert q1.settings["aggregation"] == "quantized"


@pytest.mark.crypto
def test_paillier_aggregation_equals_quantized_bit_for_bit(paillier_keypairs):
    blocks = _small_problem(3, 4, 13)
    keys = paillier_keypairs(256, 4)
    kw = dict(alpha=2.0, max_iter=3, tol=0)
    from ppdnmf_torch.exchange.paillier import InsecureKeyWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", InsecureKeyWarning)
        q = fit_fsspca(blocks, 1, aggregation="quantized", aggregation_options=dict(key_bits=256), **kw)
        p = fit_fsspca(blocks, 1, aggregation="paillier", aggregation_options=dict(key_bits=256, keypairs=keys), **kw)
    torch.testing.assert_close(p.z, q.z, rtol=0, atol=0)
    assert p.costs["encryptions"] > 0 and p.costs["decryptions"] > 0


def test_a_dropped_worker_is_refused():
    from ppdnmf_torch.exchange.aggregation import DroppedWorkerError, make_aggregator

    agg = make_aggregator("quantized", 3)

    class Dropping:  # a round where worker 1's upload is missing
        kind = "quantized"

        def total(self, values, dim):
            return agg.total(values, dim=dim, dropped=[1])

        def costs(self):
            return agg.costs()

    with pytest.raises(DroppedWorkerError, match="1"):
        fit_fsspca(_small_problem(3, 4, 14), 1, aggregation=Dropping(), max_iter=2)
    agg.close()


# -- the estimator ---------------------------------------------------------------------------------
def test_estimator_groups_equal_blocks_and_follows_scikit_learn():
    from sklearn.base import clone

    import ppdnmf_torch

    est = ppdnmf_torch.FederatedSparsePCA(2, alpha=5.0, max_iter=15, tol=1e-5, random_state=0)
    blocks = _small_problem(3, 6, 15)
    X = np.vstack(blocks)
    groups = np.repeat(np.arange(3), [len(b) for b in blocks])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = clone(est).fit(X, groups=groups)
        b = clone(est).fit(blocks)
    np.testing.assert_array_equal(a.components_, b.components_)
    assert a.components_.shape == (2, 6) and a.orthonormal_components_.shape == (2, 6)
    np.testing.assert_allclose(a.orthonormal_components_ @ a.orthonormal_components_.T, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(a.mean_, X.mean(0))
    S = a.transform(X)
    assert isinstance(S, np.ndarray) and S.shape == (len(X), 2)
    assert a.n_workers_ == 3 and a.n_iter_ >= 1 and a.explained_variance_.shape == (2,)
    assert 0 < a.explained_variance_ratio_.sum() <= 1
    assert est.get_params()["alpha"] == 5.0 and est.set_params(alpha=1.0).alpha == 1.0
    with pytest.raises(ConfigError, match="groups"):
        clone(est).fit(blocks, groups=groups)


@pytest.mark.slow
def test_estimator_passes_check_estimator():
    from sklearn.utils.estimator_checks import check_estimator

    from ppdnmf_torch.models.fsspca.estimator import FederatedSparsePCA

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = check_estimator(FederatedSparsePCA(2, alpha=0.1, max_iter=30, tol=1e-4, random_state=0), on_fail=None)
    bad = [(r["check_name"], r["status"]) for r in res if r["status"] == "failed"]
    assert not bad


def test_pca_start_is_the_pooled_principal_subspace():
    blocks = _small_problem(3, 6, 17)
    res = fit_fsspca(blocks, 2, alpha=0.0, init="pca", max_iter=1, tol=0)
    assert res.settings["init"] == "pca" and res.costs["rounds"] == 4  # centring, rho, the Gram sum, one z-step
    # the start is the pooled PCA subspace; one iteration moves it only slightly (the duals start at 0)
    assert _principal_sines(np.vstack(blocks), res.components[0].numpy(), 2).max() < 0.1
    with pytest.raises(ConfigError, match="init"):
        fit_fsspca(blocks, 2, init="svd")


def test_run_task_gives_the_app_a_summary_and_arrays():
    from ppdnmf_torch.models.fsspca.experiments import run_task

    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        summary, arrays = run_task(data="spiked", n_workers=3, split="iid", n_components=2, alpha=[0.0, 5.0], trials=2,
                                   max_iter=4, tol=0, callback=lambda info: seen.append(sorted(info.values)))
    assert summary["n_iter"] == [4, 4] and summary["n_features"] == 50 and len(seen) == 4
    assert arrays["z"].shape == (2, 50, 2) and arrays["history_objective"].shape == (4, 2)
    assert 0 <= arrays["loadings_image"].min() and arrays["loadings_image"].max() == 1
    with pytest.raises(ConfigError, match="data"):
        run_task(data="iris")


# -- the number of workers -----------------------------------------------------------------------
@pytest.mark.parametrize("solver,tol", [("riemannian", 1e-4), ("polar", 1e-5)])
def test_many_tiny_workers_reach_the_answer_of_two(solver, tol):
    """100 workers of 4 rows each (every C_i of rank 4) converge to the loadings 2 workers find:
    z within 1e-4 (columns matched in order and sign: either is the same solution), the same
    objective. The Riemannian setting before (2 inner steps) left this run unconverged at explained
    variance 0.146 against 0.320 after 300 iterations (docs/FSSPCA.md, "Many small workers"). The
    polar step's last steps are shorter (its majorizer's weight on the current point), so the
    same distance to the answer takes a 10x tighter stopping tolerance (73 and 88 iterations for
    1e-4 and 1e-5: z within 3.1e-4 and 4.1e-5)."""
    from ppdnmf_torch.models.fsspca.experiments import _matched_difference

    sp = spiked_covariance(n=400, d=30, r=2, support=5, seed=0)
    # the plain sum: numerics, not privacy (the default secagg's pairwise masks over 100 workers took 11 s)
    kw = dict(alpha=40.0, tol=tol, max_iter=300, seed=0, local_solver=solver, aggregation="plain")
    two = fit_fsspca(sp.X, 2, groups=split_iid(400, 2, seed=0), **kw)
    many = fit_fsspca(sp.X, 2, groups=split_iid(400, 100, seed=0), **kw)
    assert bool(two.converged.all()) and bool(many.converged.all())
    assert _matched_difference(many.z[0].numpy(), two.z[0].numpy()) < 1e-4
    f2, f100 = two.history["objective"][-1, 0], many.history["objective"][-1, 0]
    assert abs(float(f100 - f2)) < 1e-5 * abs(float(f2))


# -- the per-iteration values ---------------------------------------------------------------------
@pytest.mark.parametrize("per_worker", [False, True])
def test_iteration_values_equal_the_separate_functions_bit_for_bit(per_worker):
    """admm.iteration_values shares the objective and the gaps between the history's values;
    every value is the separate function's to the bit."""
    psi, mu = get_smoothing("sqrt"), 1e-3
    problem, state, lam, rho, _ = _setup(T=2, K=3, d=9, r=3)
    if per_worker:
        rho = rho[:, None] * torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    w, u = state.w, state.u
    z_old = state.z + 0.01
    z = state.z.clone()
    z[0, :, 1] = 0.0  # a zero loading: the adjusted variance's pinv path of a zero entry
    lam1 = torch.tensor([1.5, 0.5], dtype=torch.float64)
    pooled = problem.pooled_gram()
    values, change = admm.iteration_values(problem, pooled, w, z, z_old, u, lam1, lam, rho, psi, mu)
    primal, dual, consensus = admm.residuals(w, z, z_old, rho)
    expect = dict(objective=admm.objective(problem, w, z, lam1, lam, psi, mu),
                  lagrangian=admm.augmented_lagrangian(problem, w, z, u, lam1, lam, rho, psi, mu),
                  explained_variance=admm.adjusted_variance(pooled, z),
                  sparsity=(z == 0).to(w.dtype).mean(dim=(-2, -1)), consensus=consensus, primal_residual=primal,
                  dual_residual=dual)
    assert values.keys() == expect.keys()
    for k, v in expect.items():
        assert torch.equal(values[k], v), k
    assert torch.equal(change, torch.linalg.matrix_norm(z - z_old) / math.sqrt(3))


def test_adjusted_variance_second_loading_is_the_pinv_formula_bit_for_bit():
    """The second loading's 1 x 1 pseudo-inverse is taken as 1 / x (0 at 0): the numbers of
    torch.linalg.pinv exactly, on random loadings and on a zero first loading."""
    gen = torch.Generator().manual_seed(3)
    A = torch.randn((4, 30, 7), generator=gen, dtype=torch.float64)
    gram = A.mT @ A
    V = torch.randn((4, 7, 3), generator=gen, dtype=torch.float64)
    V[1, :, 0] = 0.0
    got = admm.adjusted_variance_components(gram, V)
    norms = torch.linalg.vector_norm(V, dim=-2, keepdim=True)
    Vn = torch.where(norms > 0, V / norms.clamp_min(torch.finfo(V.dtype).tiny), torch.zeros_like(V))
    M = Vn.transpose(-2, -1) @ gram @ Vn
    b = M[..., :1, 1]
    want = M[..., 1, 1] - (b * (torch.linalg.pinv(M[..., :1, :1], hermitian=True) @ b.unsqueeze(-1)).squeeze(-1)).sum(-1)
    assert torch.equal(got[..., 1], want.clamp_min(0))


# -- the stop: scale-free, and at a KKT point --------------------------------------------
def _spiked_scaled(c):
    sp = spiked_covariance(n=300, d=12, r=2, support=3, seed=0)
    return sp.X * c, split_iid(len(sp.X), 3, seed=0)


_STOP_KW = dict(alpha=0.03, alpha_scale="gram", max_iter=1000, seed=0, aggregation="plain")


@pytest.mark.parametrize("c", [1e-2, 1e2])
def test_the_stop_is_the_same_at_any_scale_of_the_data(c):
    """``alpha_scale="gram"`` with ``rho="auto"``: data times ``c`` multiplies ``C_i``, ``lambda_1``,
    ``lambda_2``, ``rho`` and ``u_i`` by ``c^2``; the stop reads only the loadings' units (the RMS
    consensus gap and the change of ``z`` per column), so the same iteration count and support
    at the default ``tol`` (docs/FSSPCA.md, "Stopping")."""
    X, g = _spiked_scaled(1.0)
    base = fit_fsspca(X, 2, groups=g, **_STOP_KW)
    Xc, _ = _spiked_scaled(c)
    scaled = fit_fsspca(Xc, 2, groups=g, **_STOP_KW)
    assert bool(base.converged[0]) and bool(scaled.converged[0])
    assert 0.2 < float(base.sparsity[0]) < 0.8  # a sparse, not empty, answer
    assert int(scaled.n_iter[0]) == int(base.n_iter[0])
    assert torch.equal(scaled.z == 0, base.z == 0)


def _stationarity(res, data, groups):
    problem, _ = prepare_problem(fit_mod.as_blocks(data, groups), res.z.shape[0])
    f64 = dict(dtype=torch.float64)
    return admm.stationarity(problem, res.w, res.u, torch.tensor(res.settings["lambda_2"], **f64),
                             torch.tensor(res.settings["rho_mean"], **f64), get_smoothing(res.settings["smoothing"]),
                             res.settings["mu"])


def test_the_stop_ends_at_a_kkt_point_to_tol():
    """Where the stop fires the workers' KKT residual (:func:`.admm.stationarity`, the Riemannian
    gradient of the Lagrangian over ``rho``) is of the order of ``tol`` too (measured 0.02-1.3x
    ``tol`` on the support experiment's runs), and far above it where a cap cut the run."""
    X, g = _spiked_scaled(1.0)
    done = fit_fsspca(X, 2, groups=g, **_STOP_KW)
    assert float(_stationarity(done, X, g)[0]) <= 3 * SPEC.tol
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        cut = fit_fsspca(X, 2, groups=g, **dict(_STOP_KW, max_iter=5))
    assert not bool(cut.converged[0]) and float(_stationarity(cut, X, g)[0]) > 100 * SPEC.tol
    Xc, _ = _spiked_scaled(1e2)  # scale-free: the same number for the data times c
    torch.testing.assert_close(_stationarity(fit_fsspca(Xc, 2, groups=g, **_STOP_KW), Xc, g),
                               _stationarity(done, X, g), rtol=1e-3, atol=1e-9)


@pytest.mark.parametrize("per_worker", [False, True])
def test_stationarity_vanishes_exactly_at_the_kkt_duals(per_worker):
    """``g_i = P_T(-2 C_i w_i + lambda_2 psi'(w_i) + u_i)``: zero for ``u_i = 2 C_i w_i - lambda_2
    psi'(w_i) + w_i S`` with any symmetric ``S`` (the orthogonality constraint's multiplier, which
    the tangent projection removes), and ``||P_T(e)|| / rho_i`` RMS when ``u_i`` is moved by ``e``."""
    problem, state, lam, rho, psi = _setup(smoothing="sqrt")
    T, K, d, r = state.w.shape
    if per_worker:
        rho = rho[:, None] * torch.linspace(0.5, 2.0, K, dtype=torch.float64)
    w = state.w
    S = torch.randn((T, K, r, r), generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    u = 2.0 * problem.gram @ w - lam[:, None, None, None] * psi.grad(w, 1e-3) + w @ (S + S.mT)
    assert float(admm.stationarity(problem, w, u, lam, rho, psi, 1e-3).abs().max()) < 1e-12
    e = 1e-2 * torch.randn(w.shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    got = admm.stationarity(problem, w, u + e, lam, rho, psi, 1e-3)
    g = manifold.project_tangent(w, e) / admm._rho4(rho)
    torch.testing.assert_close(got, torch.linalg.matrix_norm(g).square().sum(1).div(K * r).sqrt())
    assert bool((got > 1e-5).all())
