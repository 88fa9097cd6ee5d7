"""FSSPCA's polar local step (ppdnmf_torch.models.fsspca.polar): the polar factor, the
curvature bounds of the smoothings, monotone decrease of a worker's subproblem (14), the same
fixed points as the paper's Riemannian steps, batching, and the per-iteration values computed
once (docs/FSSPCA.md, "The polar step")."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.models.fsspca import admm, fit_fsspca, manifold
from ppdnmf_torch.models.fsspca.data import spiked_covariance, split_iid
from ppdnmf_torch.models.fsspca.config import SPEC
from ppdnmf_torch.models.fsspca.fit import prepare_problem
from ppdnmf_torch.models.fsspca import polar as polar_module
from ppdnmf_torch.models.fsspca.polar import (CURVATURE, GRAM_RATIO, NUMPY, TORCH, kernels_for, polar, polar_steps,
                                              polar_svd, smooth_weight)
from ppdnmf_torch.models.fsspca.smoothing import SMOOTHINGS, Smoothing, get_smoothing

SMOOTH = sorted(SMOOTHINGS)


def _subproblem(T=2, K=3, d=10, r=2, seed=0, lam2=2.0, rho_per_worker=False, z_per_worker=False):
    """Workers' Gram matrices of different sizes, a consensus z, duals u and start points w."""
    rng = np.random.default_rng(seed)
    blocks = [torch.as_tensor(rng.standard_normal((6 + 5 * i, d)) * (2.0 * 0.7 ** np.arange(d)) + 0.2)
              for i in range(K)]
    problem, _ = prepare_problem(blocks, T)
    gen = torch.Generator().manual_seed(seed)
    z = manifold.qf(torch.randn((T, K, d, r) if z_per_worker else (T, d, r), generator=gen, dtype=torch.float64))
    z = z * (torch.rand(z.shape, generator=gen, dtype=torch.float64) > 0.4)  # sparse, as after the z-step
    w = manifold.qf(torch.randn((T, K, d, r), generator=gen, dtype=torch.float64))
    u = torch.randn((T, K, d, r), generator=gen, dtype=torch.float64)
    lam = torch.full((T,), lam2, dtype=torch.float64)
    rho = 5.0 + torch.rand((T, K) if rho_per_worker else (T,), generator=gen, dtype=torch.float64) * 5.0
    return problem, w, z, u, lam, rho


def _h(problem, w, z, u, lam, rho, psi, mu):
    return admm.local_objective(problem, w, z, u, lam, rho, psi, mu)[0]


def _target(z, u, rho, w):
    return admm._rho4(rho) * admm._per_worker(z, w) - u


# -- the polar factor and the curvature bounds ----------------------------------------------------
@pytest.mark.parametrize("shape", [(7, 1), (9, 3), (2, 4, 12, 5)])
def test_polar_is_the_orthonormal_maximizer_of_the_inner_product(shape):
    """polar(M) has orthonormal columns, <M, polar(M)> is the nuclear norm of M (the largest
    <M, w> over St(d, r), von Neumann), and M = polar(M) P with P symmetric positive definite."""
    gen = torch.Generator().manual_seed(1)
    M = torch.randn(shape, generator=gen, dtype=torch.float64)
    Q = polar(M)
    eye = torch.eye(shape[-1], dtype=torch.float64).expand(*shape[:-2], shape[-1], shape[-1])
    torch.testing.assert_close(Q.mT @ Q, eye, rtol=0, atol=1e-13)
    torch.testing.assert_close(manifold.inner(M, Q), torch.linalg.svdvals(M).sum(-1), rtol=1e-13, atol=0)
    P = Q.mT @ M
    torch.testing.assert_close(P, P.mT, rtol=0, atol=1e-12)
    assert bool((torch.linalg.eigvalsh(0.5 * (P + P.mT)) > 0).all())
    # any other point of St(d, r) does no better
    others = manifold.qf(torch.randn((50,) + shape, generator=gen, dtype=torch.float64))
    assert bool((manifold.inner(M, others) <= manifold.inner(M, Q) + 1e-12).all())


@pytest.mark.parametrize("name", SMOOTH)
def test_curvature_bound_is_the_largest_second_derivative(name):
    """kappa / mu bounds psi_mu'' everywhere (finite differences of psi' on a fine grid) and is
    attained (within 1 %): the descent lemma behind the majorizer, and not looser than needed."""
    psi, mu = get_smoothing(name), 1e-3
    x = torch.linspace(-20 * mu, 20 * mu, 400001, dtype=torch.float64)
    second = torch.diff(psi.grad(x, mu)) / torch.diff(x)
    L = smooth_weight(psi, mu)
    assert float(second.max()) <= L * (1 + 1e-6)
    assert float(second.max()) >= 0.99 * L
    assert CURVATURE.keys() == SMOOTHINGS.keys()


# -- the Gram form of the polar factor and the two kernels ------------------------------------------
def _conditioned(B, d, r, cond, dtype=torch.float64, seed=0):
    """``B`` random ``d x r`` matrices with singular values from 7 down to ``7 / cond``."""
    gen = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn((B, d, r), generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn((B, r, r), generator=gen, dtype=torch.float64))[0]
    s = torch.logspace(0, -np.log10(cond), r, dtype=torch.float64) if r > 1 else torch.ones(1, dtype=torch.float64)
    return ((U * (7.0 * s)) @ V.mT).to(dtype)


def _kernel_polar(kernels, M):
    return kernels.polar_rows(M.mT.contiguous()).mT


@pytest.mark.parametrize("kernels", [TORCH, NUMPY], ids=lambda k: k.name)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("r", [1, 2, 3, 5])
@pytest.mark.parametrize("cond", [1.0, 30.0])
def test_gram_polar_equals_the_svd_polar_to_rounding(kernels, dtype, r, cond):
    """M (M^T M)^{-1/2} (the NumPy kernel's closed form at r = 2, eigh otherwise) is the SVD's
    polar factor to rounding. The Gram form squares the condition number, so its error grows
    like eps cond^2; cond = 30 is just inside the guard (cond^2 < 1 / GRAM_RATIO): tolerance
    50 eps cond^2 (observed: 200 eps at cond 30 in float64)."""
    M = _conditioned(64, 40, r, cond, dtype)
    eps = torch.finfo(dtype).eps
    want = polar_svd(M.double())
    torch.testing.assert_close(_kernel_polar(kernels, M).double(), want, rtol=0, atol=50 * eps * max(cond, 2.0) ** 2)


@pytest.mark.parametrize("kernels", [TORCH, NUMPY], ids=lambda k: k.name)
@pytest.mark.parametrize("r", [2, 3])
def test_ill_conditioned_and_rank_deficient_points_take_the_svd(kernels, r):
    """Below the guard (smallest Gram eigenvalue under GRAM_RATIO times the largest) the SVD's
    factor: for full rank (cond 1e3 and 1e8) the SVD's to its own sensitivity, eps cond (the two
    libraries' SVDs differ by that); rank-deficient points (a repeated column, a zero matrix)
    still get orthonormal columns that maximize <M, w>, and the well-conditioned points in the
    same batch are untouched."""
    assert 30.0 ** -2 > GRAM_RATIO > 1e3 ** -2
    good = _conditioned(3, 40, r, 2.0, seed=1)
    ill = torch.cat([_conditioned(2, 40, r, 1e3, seed=2), _conditioned(2, 40, r, 1e8, seed=3)])
    deficient = good[:2].clone()
    deficient[0, :, 1] = 2.0 * deficient[0, :, 0]
    deficient[1] = 0.0
    M = torch.cat([good, ill, deficient])
    Q = _kernel_polar(kernels, M)
    assert bool(torch.isfinite(Q).all())
    torch.testing.assert_close(Q[:3], _kernel_polar(kernels, good), rtol=0, atol=0)
    torch.testing.assert_close(Q[:3], polar_svd(good), rtol=0, atol=1e-13)
    torch.testing.assert_close(Q[3:5], polar_svd(ill[:2]), rtol=0, atol=50 * 2.2e-16 * 1e3)
    torch.testing.assert_close(Q[5:7], polar_svd(ill[2:]), rtol=0, atol=50 * 2.2e-16 * 1e8)
    eye = torch.eye(r, dtype=torch.float64).expand(len(M), r, r)
    torch.testing.assert_close(Q.mT @ Q, eye, rtol=0, atol=1e-12)
    torch.testing.assert_close(manifold.inner(M, Q), torch.linalg.svdvals(M).sum(-1), rtol=1e-12, atol=1e-12)


def test_the_kernels_follow_the_device_and_dtype():
    """NumPy's kernels for float CPU tensors without autograd, torch's for anything else."""
    x = torch.zeros((1, 1, 3, 2), dtype=torch.float64)
    assert kernels_for(x) is NUMPY and kernels_for(x.float()) is NUMPY
    assert kernels_for(x.requires_grad_()) is TORCH
    assert kernels_for(torch.zeros(3, dtype=torch.float16)) is TORCH


class _SVDKernels:
    """The polar steps as they were before the Gram form: torch's products and the SVD."""

    name = "svd"
    xtc, xt = staticmethod(TORCH.xtc), staticmethod(TORCH.xt)

    @staticmethod
    def polar_rows(Mt):
        return polar_svd(Mt.mT).mT


@pytest.mark.parametrize("lambda_2", [0.0, None])
def test_the_fit_is_the_same_with_every_kernel(monkeypatch, lambda_2):
    """A whole fit (two trials sharing their Gram matrices, 4 workers) with NumPy's kernels (the
    CPU's default), torch's, and torch's products with the SVD's polar factor (the steps before
    the Gram form): the same iterations, support and history to rounding (the tolerance: what
    rounding differences of ~1e-15 per step grow to over a few hundred ADMM iterations)."""
    sp = spiked_covariance(n=400, d=20, r=2, support=4, seed=2)
    kw = dict(groups=split_iid(400, 4, seed=0), alpha=150.0, lambda_2=lambda_2, tol=1e-8, max_iter=1500, seed=1,
              trials=2, aggregation="plain", plan="torch")  # the kernels are the torch plan's
    fits = {}
    for kernels in (NUMPY, TORCH, _SVDKernels):
        monkeypatch.setattr(polar_module, "kernels_for", lambda x, k=kernels: k)
        fits[kernels.name] = fit_fsspca(sp.X, 2, **kw)
    ref = fits["numpy"]
    assert bool(ref.converged.all())
    for name in ("torch", "svd"):
        got = fits[name]
        assert torch.equal(got.n_iter, ref.n_iter), name
        for t in range(2):
            assert _support_key(got.z[t].numpy()) == _support_key(ref.z[t].numpy())
        torch.testing.assert_close(got.z, ref.z, rtol=0, atol=1e-8)
        torch.testing.assert_close(got.history["objective"], ref.history["objective"], rtol=1e-10, atol=0)


@pytest.mark.parametrize("T,lam2", [(1, 2.0), (3, 2.0), (3, 0.0)])
def test_chunked_steps_equal_the_whole_batch_bit_for_bit(monkeypatch, T, lam2):
    """The steps run over chunks of workers (CHUNK_BYTES) give the numbers of one batch, bit
    for bit (every kernel works matrix by matrix): one worker per chunk, two, and all at once,
    in the per-trial and the shared-Gram layouts, with and without the smooth term."""
    psi, mu = get_smoothing("sqrt"), 1e-3
    problem, w, z, u, lam, rho = _subproblem(T=T, K=5, d=12, lam2=lam2)
    target = _target(z, u, rho, w)
    one = problem.gram[0, 0].numel() * problem.gram.element_size()
    outs = []
    for chunk in (one, 2 * one, 2 ** 40):
        monkeypatch.setattr(polar_module, "CHUNK_BYTES", chunk)
        outs.append(polar_steps(problem.gram, w, target, lam, psi, mu, 3))
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[2])


@pytest.mark.parametrize("kernels", [TORCH, NUMPY], ids=lambda k: k.name)
@pytest.mark.parametrize("chunk", [1, 2 ** 40])
def test_the_steps_product_is_the_objectives_bit_for_bit(monkeypatch, kernels, chunk):
    """C_i w_i handed back by the polar steps (computed per chunk while C_i is in the cache) is
    gram_times' (the objective's own) to the bit, so the history does not depend on who computed
    it; with trials sharing their Gram matrices (another product shape) none is handed back."""
    psi, mu = get_smoothing("sqrt"), 1e-3
    monkeypatch.setattr(polar_module, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(polar_module, "kernels_for", lambda x: kernels)
    problem, w, z, u, lam, rho = _subproblem(T=1, K=5, d=12)
    w_new, Cw = polar_steps(problem.gram, w, _target(z, u, rho, w), lam, psi, mu, 3, product=True)
    assert torch.equal(Cw, polar_module.gram_times(problem.gram, w_new))
    lam1 = torch.tensor([2.0], dtype=torch.float64)
    assert torch.equal(admm.objective(problem, w_new, z, lam1, lam, psi, mu, Cw),
                       admm.objective(problem, w_new, z, lam1, lam, psi, mu))
    problem, w, z, u, lam, rho = _subproblem(T=2, K=3, d=12)
    assert polar_steps(problem.gram, w, _target(z, u, rho, w), lam, psi, mu, 1, product=True)[1] is None


# -- monotone decrease and fixed points ------------------------------------------------------------
@pytest.mark.parametrize("name", SMOOTH)
@pytest.mark.parametrize("lam2,per_worker", [(0.0, False), (3.0, False), (3.0, True)])
def test_each_polar_step_never_increases_the_subproblem(name, lam2, per_worker):
    """h(w) of (14) (the value the Riemannian solver's line search uses) after every step is at
    most its value before, for every trial and worker: with and without the smooth term, one
    rho per trial or per worker with a z per worker (the serverless shapes)."""
    psi, mu = get_smoothing(name), 0.05
    problem, w, z, u, lam, rho = _subproblem(lam2=lam2, rho_per_worker=per_worker, z_per_worker=per_worker)
    target = _target(z, u, rho, w)
    h = _h(problem, w, z, u, lam, rho, psi, mu)
    drops = []
    for _ in range(30):
        w = polar_steps(problem.gram, w, target, lam, psi, mu, 1)
        h_new = _h(problem, w, z, u, lam, rho, psi, mu)
        assert bool((h_new <= h + 1e-12 * h.abs()).all()), (h_new - h).max()
        drops.append(float((h - h_new).max()))
        h = h_new
    assert drops[0] > 0  # it moves


@pytest.mark.parametrize("name", ["sqrt", pytest.param("huber", marks=pytest.mark.slow)])
def test_polar_fixed_points_are_the_riemannian_stationary_points(name):
    """Both local solvers solve the same subproblem: where the polar steps stop moving the
    Riemannian gradient of h vanishes and one more Riemannian step does not move the point; the
    paper's Armijo steps from the same start end at the same point."""
    psi, mu = get_smoothing(name), 0.05
    problem, w0, z, u, lam, rho = _subproblem(lam2=1.0)
    target = _target(z, u, rho, w0)
    w = polar_steps(problem.gram, w0, target, lam, psi, mu, 4000)
    _, egrad = admm.local_objective(problem, w, z, u, lam, rho, psi, mu)
    grad = manifold.riemannian_gradient(w, egrad)
    assert float(torch.linalg.matrix_norm(grad).max()) < 1e-9 * float(torch.linalg.matrix_norm(egrad).max())
    torch.testing.assert_close(polar_steps(problem.gram, w, target, lam, psi, mu, 1), w, rtol=0, atol=1e-12)
    # the Riemannian solver (Armijo, many steps) from the same start reaches the same point, to
    # what its steepest descent resolves in 3000 steps, and no lower value of h
    state = admm.ADMMState(w=w0, u=u, z=z, theta=torch.full(w0.shape[:2], 1e-3, dtype=torch.float64))
    for _ in range(60):
        state.w = admm.local_step(problem, state, lam, rho, psi, mu, inner_steps=50, solver="riemannian")
    torch.testing.assert_close(state.w, w, rtol=0, atol=1e-5)
    h_pol, h_rie = (_h(problem, x, z, u, lam, rho, psi, mu) for x in (w, state.w))
    assert bool((h_pol <= h_rie + 1e-12 * h_rie.abs()).all())


def test_polar_step_keeps_deflation_in_the_projectors_range():
    """polar(G M) lies in range(G) (Algorithm 4's St_G) and still never increases h."""
    psi, mu = get_smoothing("sqrt"), 0.05
    problem, w, z, u, lam, rho = _subproblem(T=2, K=3, d=10, r=2)
    gen = torch.Generator().manual_seed(5)
    Q1 = manifold.qf(torch.randn((2, 10, 2), generator=gen, dtype=torch.float64))
    G = torch.eye(10, dtype=torch.float64) - Q1 @ Q1.mT
    problem.gram = G[:, None] @ problem.gram @ G[:, None]
    problem.projector = G
    w = manifold.qf(G[:, None] @ w)
    target = _target(z, u, rho, w)
    h = _h(problem, w, z, u, lam, rho, psi, mu)
    for _ in range(10):
        w = polar_steps(problem.gram, w, target, lam, psi, mu, 1, projector=G)
        torch.testing.assert_close(Q1[:, None].mT @ w, torch.zeros((2, 3, 2, 2), dtype=torch.float64),
                                   rtol=0, atol=1e-12)
        h_new = _h(problem, w, z, u, lam, rho, psi, mu)
        assert bool((h_new <= h + 1e-12 * h.abs()).all())
        h = h_new


def test_trials_sharing_their_gram_matrices_equal_each_trial_alone():
    """The shared-Gram layout ((K, d, T r) right-hand sides) gives every trial the points it gets
    alone; a product's columns may round differently with its width, so to 1e-13, not bit for bit."""
    psi, mu = get_smoothing("sqrt"), 1e-3
    problem, w, z, u, _, rho = _subproblem(T=3, K=4)
    assert problem.gram.stride(0) == 0  # the trials share C_i (an expanded view)
    lam = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    target = _target(z, u, rho, w)
    both = polar_steps(problem.gram, w, target, lam, psi, mu, 3)
    for t in range(3):
        alone = polar_steps(problem.gram[t:t + 1], w[t:t + 1], target[t:t + 1], lam[t:t + 1], psi, mu, 3)
        torch.testing.assert_close(alone[0], both[t], rtol=0, atol=1e-13)


# -- fits -------------------------------------------------------------------------------------------
def _support_key(z, floor=1e-6):
    # an entry at the soft threshold's edge is 0 or ~1e-9 depending on the last iterate
    return sorted(tuple(np.flatnonzero(np.abs(z[:, j]) > floor)) for j in range(z.shape[1]))


@pytest.mark.parametrize("K,lambda_2", [(1, 0.0), (4, None)])
def test_polar_and_riemannian_fits_reach_the_same_answer(K, lambda_2):
    """The whole ADMM with either local solver, run to convergence from the same start: the
    same support (columns matched up to order and sign) and objective within 2e-4 (the issue's
    criterion; they agree far closer), unsmoothed and smoothed."""
    sp = spiked_covariance(n=400, d=20, r=2, support=4, seed=2)
    kw = dict(groups=split_iid(400, K, seed=0), alpha=150.0, lambda_2=lambda_2, tol=1e-8, max_iter=1500, seed=1)
    pol = fit_fsspca(sp.X, 2, local_solver="polar", **kw)
    rie = fit_fsspca(sp.X, 2, local_solver="riemannian", **kw)
    assert bool(pol.converged.all()) and bool(rie.converged.all())
    assert _support_key(pol.z[0].numpy()) == _support_key(rie.z[0].numpy())
    f_p, f_r = float(pol.history["objective"][-1, 0]), float(rie.history["objective"][-1, 0])
    assert abs(f_p - f_r) <= 2e-4 * abs(f_r)
    assert pol.line_search == dict(evals=0, failures=0)


def test_the_default_local_solver_is_polar_and_unknown_ones_are_refused():
    assert SPEC.local_solver == "polar"
    blocks = [np.random.default_rng(0).standard_normal((10, 4))]
    with pytest.raises(ConfigError, match="local_solver"):
        fit_fsspca(blocks, 2, local_solver="newton")
    odd = Smoothing("odd", SMOOTHINGS["sqrt"].value, SMOOTHINGS["sqrt"].grad, "sqrt again")
    with pytest.raises(ConfigError, match="smoothing"):
        fit_fsspca(blocks, 2, smoothing=odd, local_solver="polar")
    fit_fsspca(blocks, 2, smoothing=odd, local_solver="riemannian", max_iter=2, tol=0)
