"""Symmetric NMF by splitting: every block update is its block's exact minimizer, the split
objective never increases, the penalty rules, batched = alone, dense = sparse, resume."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
import torch

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.symnmf import fit_symnmf, initial_factor, synthetic_similarity
from ppdnmf_torch.checkpoint import CheckpointError
from ppdnmf_torch.models.symnmf.alternating import block_data
from ppdnmf_torch.models.symnmf.nnls import nnls, nnls_bpp
from ppdnmf_torch.models.symnmf.symanls import anls_block
from ppdnmf_torch.models.symnmf.objective import split_objective
from ppdnmf_torch.models.symnmf.penalty import next_lambda, parse_penalty
from ppdnmf_torch.models.symnmf.symhals import hals_block, hals_sweep

SPLIT = ["symhals", "a_symhals", "symanls"]
ALL = ["symhals", "a_symhals", "symanls", "kuang", "pgd", "admm", "beta", "tsvd"]


def _problem(n=12, r=3, sigma=0.1, trials=1, seed=0, dtype=torch.float64):
    X, _ = synthetic_similarity(n, r, sigma, trials=trials, seed=seed, dtype=dtype)
    return X


def _split_value(X, U, V, lam):
    """(3) computed directly, in float64."""
    X, U, V = (t.double() for t in (X, U, V))
    return 0.5 * torch.linalg.matrix_norm(X - U @ V.transpose(-2, -1)) ** 2 + 0.5 * lam * ((U - V) ** 2).sum((-2, -1))


# -- each update is the exact minimizer of its block ------------------------------------------

@pytest.mark.parametrize("lam", [1e-3, 0.5, 7.0])
def test_hals_column_update_is_the_column_minimizer(lam):
    """Eq. (17): after the sweep reaches column i, u_i minimizes (3) over u_i >= 0 alone
    (brute force: one scalar NNLS per entry, scipy)."""
    X = _problem()[0]
    gen = torch.Generator().manual_seed(1)
    U = torch.rand((1, 12, 3), generator=gen, dtype=torch.float64)
    V = torch.rand((1, 12, 3), generator=gen, dtype=torch.float64)
    lt = torch.tensor([lam], dtype=torch.float64)
    A, B = block_data(X @ V[0], V, lt)
    # brute force, column after column, each from the columns already updated
    Z = U.clone()
    for i in range(3):
        Xi = X - Z[0] @ V[0].T + torch.outer(Z[0, :, i], V[0, :, i])
        v = V[0, :, i].numpy()
        Z[0, :, i] = torch.tensor([scipy.optimize.nnls(np.concatenate([v, [np.sqrt(lam)]])[:, None],
                                                       np.concatenate([Xi[j].numpy(), [np.sqrt(lam) * v[j]]]))[0][0]
                                   for j in range(12)])
    np.testing.assert_allclose(hals_sweep(U, A, B).numpy(), Z.numpy(), rtol=1e-10, atol=1e-12)


def test_a_symhals_inner_sweeps_reach_the_block_minimizer():
    """Many sweeps of one block converge to the block's NNLS solution (scipy, row by row)."""
    X = _problem()[0]
    gen = torch.Generator().manual_seed(2)
    V = torch.rand((1, 12, 3), generator=gen, dtype=torch.float64)
    lam = 0.3
    A, B = block_data(X @ V[0], V, torch.tensor([lam], dtype=torch.float64))
    Z = hals_block(torch.rand((1, 12, 3), generator=gen, dtype=torch.float64), A, B, inner_max=500, delta=0.0)
    stacked = np.vstack([V[0].numpy(), np.sqrt(lam) * np.eye(3)])
    for j in range(12):
        want = scipy.optimize.nnls(stacked, np.concatenate([X[j].numpy(), np.sqrt(lam) * V[0, j].numpy()]))[0]
        np.testing.assert_allclose(Z[0, j].numpy(), want, rtol=1e-8, atol=1e-10)


# -- the split objective never increases ------------------------------------------------------

@pytest.mark.parametrize("method", SPLIT)
@pytest.mark.parametrize("sigma", [0.0, 0.1])
def test_split_objective_never_increases_under_a_fixed_penalty(method, sigma):
    X = _problem(n=20, r=4, sigma=sigma, trials=2)
    res = fit_symnmf(X, 4, method=method, penalty=0.5, max_iter=40, tol=0)
    g = res.history["objective"]
    assert g.shape == (41, 2)
    assert bool((g[1:] <= g[:-1] * (1 + 1e-12) + 1e-12).all())
    assert float(g[-1].max()) < float(g[0].min())
    # the reported objective is (3) itself
    direct = _split_value(X, res.U, res.V, 0.5)
    torch.testing.assert_close(direct, g[-1], rtol=1e-9, atol=0)
    # E^k is the symmetric problem's error with U (spec choice), not U V^T's
    E = torch.linalg.matrix_norm(X - res.U @ res.U.transpose(1, 2)) ** 2 / torch.linalg.matrix_norm(X) ** 2
    torch.testing.assert_close(res.history["E"][-1], E, rtol=1e-8, atol=1e-14)


# -- the penalty rules ------------------------------------------------------------------------

def test_adaptive_rule_is_eq20_nondecreasing_and_constant_once_u_equals_v():
    gen = torch.Generator().manual_seed(3)
    U = torch.rand((4, 10, 3), generator=gen, dtype=torch.float64)
    V = torch.rand((4, 10, 3), generator=gen, dtype=torch.float64)
    lam = torch.tensor([1e-5, 0.1, 1.0, 10.0], dtype=torch.float64)
    rule = parse_penalty("adaptive", 4)
    new = next_lambda(rule, lam, U, V)
    want = lam * ((U ** 2).sum((1, 2)) + (V ** 2).sum((1, 2))) / (2 * (U * V).sum((1, 2)))
    torch.testing.assert_close(new, want, rtol=1e-14, atol=0)
    assert bool((new >= lam).all())
    assert torch.equal(next_lambda(rule, lam, U, U.clone()), lam)


@pytest.mark.parametrize("method", ["symhals", pytest.param("a_symhals", marks=pytest.mark.slow),
                                    pytest.param("symanls", marks=pytest.mark.slow)])
def test_adaptive_lambda_nondecreasing_with_a_finite_limit_in_a_run(method):
    X = _problem(n=20, r=2, sigma=0.0, trials=2)
    res = fit_symnmf(X, 2, method=method, max_iter=300, tol=0)
    lam = res.history["lam"]
    assert float(lam[0, 0]) == 1e-5
    assert bool((lam[1:] >= lam[:-1]).all())
    # the limit is finite: lambda has stopped moving by the end
    assert bool(((lam[-1] - lam[-50]) <= 1e-6 * lam[-1]).all())
    assert bool((lam[-1] < 1e6).all())


def test_kuang_schedule_multiplies_by_1_01_until_the_gap_closes():
    gen = torch.Generator().manual_seed(4)
    U = torch.rand((2, 10, 3), generator=gen, dtype=torch.float64)
    V = torch.stack([torch.rand((10, 3), generator=gen, dtype=torch.float64), U[1] * (1 + 1e-10)])
    lam = torch.tensor([2.0, 3.0], dtype=torch.float64)
    new = next_lambda(parse_penalty("kuang", 2), lam, U, V)
    assert new.tolist() == [2.0 * 1.01, 3.0]


def test_kuang_and_adaptive_start_from_1e_5_as_the_papers_fig_3_implies():
    X = _problem(n=15, r=3, sigma=0.1)
    assert float(fit_symnmf(X, 3, method="kuang", max_iter=0).lam[0]) == 1e-5
    assert float(fit_symnmf(X, 3, method="kuang", lam0=float(X.max()) ** 2, max_iter=0).lam[0]) == float(X.max()) ** 2
    assert float(fit_symnmf(X, 3, max_iter=0).lam[0]) == 1e-5
    assert float(fit_symnmf(X, 3, method="symanls", lam0=0.3, max_iter=0).lam[0]) == 0.3


def test_a_symhals_sweeps_a_fixed_count_or_until_the_change_is_small():
    X = _problem()[0]
    gen = torch.Generator().manual_seed(5)
    V = torch.rand((2, 12, 3), generator=gen, dtype=torch.float64)
    U = torch.rand((2, 12, 3), generator=gen, dtype=torch.float64)
    A, B = block_data(X @ V, V, torch.tensor([0.1, 0.1], dtype=torch.float64))
    three = hals_sweep(hals_sweep(hals_sweep(U, A, B), A, B), A, B)
    assert torch.equal(hals_block(U, A, B, inner_max=3, delta=0.0), three)
    # delta close to 1: the second sweep moves less than delta^2 x the first, so it is the last
    two = hals_sweep(hals_sweep(U, A, B), A, B)
    assert torch.equal(hals_block(U, A, B, inner_max=10, delta=0.999), two)


def test_a_column_that_becomes_zero_is_reset_to_1e_16_times_the_block_max():
    X = torch.eye(4, dtype=torch.float64)[None]
    V = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    U = torch.full((1, 4, 2), 2.0, dtype=torch.float64)
    A, B = block_data(X @ V, V, torch.tensor([0.0], dtype=torch.float64))
    A[..., 1] = -1.0  # column 2's minimizer is all zero
    out = hals_sweep(U, A, B)
    assert torch.equal(out[0, :, 1], torch.full((4,), 1e-16 * 2.0, dtype=torch.float64))


def test_bound_penalty_is_the_theorem_bound_times_1_01():
    X = _problem(n=15, r=3, sigma=0.1)
    U0 = initial_factor(15, 3, trials=1, seed=0)
    res = fit_symnmf(X, 3, penalty="bound", U0=U0, max_iter=0)
    Xn = X[0].numpy()
    s = np.linalg.svd(Xn, compute_uv=False)
    want = 1.01 * 0.5 * (s[0] + np.linalg.norm(Xn - U0[0].numpy() @ U0[0].numpy().T) - s[-1])
    assert float(res.lam[0]) == pytest.approx(want, rel=1e-10)


# -- U = V at convergence on noise-free data --------------------------------------------------

@pytest.mark.parametrize("method", ["symhals", pytest.param("a_symhals", marks=pytest.mark.slow),
                                    pytest.param("symanls", marks=pytest.mark.slow)])
def test_u_equals_v_at_convergence_on_noise_free_data(method):
    X = _problem(n=20, r=2, sigma=0.0, seed=5)
    res = fit_symnmf(X, 2, method=method, max_iter=3000, tol=1e-9)
    assert bool(res.converged.all())
    assert float(res.history["rel_gap"][-1].max()) < 1e-6
    assert float(res.E.max()) < 1e-12


# -- batched = alone; dense = sparse ----------------------------------------------------------

@pytest.mark.parametrize("method", ["symhals", pytest.param("a_symhals", marks=pytest.mark.slow),
                                    pytest.param("symanls", marks=pytest.mark.slow)])
def test_a_batched_trial_equals_the_same_trial_alone(method):
    """Trials with their own lambda that stop at different iterations (tol)."""
    X = _problem(n=16, r=3, sigma=0.1, trials=3)
    lams = [0.2, 1.0, 3.0]
    U0 = initial_factor(16, 3, trials=3, seed=9)
    batch = fit_symnmf(X, 3, method=method, penalty=lams, U0=U0, max_iter=150, tol=1e-3)
    assert len(set(batch.n_iter.tolist())) > 1  # trials stopped at different iterations
    for t in range(3):
        alone = fit_symnmf(X[t], 3, method=method, penalty=lams[t], U0=U0[t], max_iter=150, tol=1e-3)
        torch.testing.assert_close(batch.U[t], alone.U[0], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(batch.V[t], alone.V[0], rtol=1e-12, atol=1e-13)
        assert int(batch.n_iter[t]) == int(alone.n_iter[0])


@pytest.mark.parametrize("kind, method", [("scipy", "symhals"), ("torch_csr", "symhals"), ("torch_coo", "symhals"),
                                          ("scipy", "a_symhals"), ("torch_csr", "symanls")])
def test_dense_and_sparse_x_give_the_same_iterates(kind, method):
    X = _problem(n=25, r=3, sigma=0.1)[0]
    X[X < 2.0] = 0  # genuinely sparse
    Xs = {"scipy": sp.csr_matrix(X.numpy()), "torch_csr": X.to_sparse_csr(), "torch_coo": X.to_sparse()}[kind]
    U0 = initial_factor(25, 3, trials=2, seed=1)
    dense = fit_symnmf(X, 3, method=method, U0=U0, max_iter=20, tol=0)
    sparse = fit_symnmf(Xs, 3, method=method, U0=U0, max_iter=20, tol=0)
    torch.testing.assert_close(sparse.U, dense.U, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(sparse.history["E"], dense.history["E"], rtol=1e-8, atol=1e-12)


# -- input checks ----------------------------------------------------------------------------

@pytest.mark.parametrize("bad, err", [
    (np.array([[1.0, 2.0], [0.0, 1.0]]), DataError),  # not symmetric
    (-np.eye(3), DataError),
    (np.zeros((3, 3)), DataError),
    (np.ones((2, 3)), DataError),
    (np.array([[np.nan, 1.0], [1.0, 0.0]]), DataError),
])
def test_bad_x_is_a_data_error(bad, err):
    with pytest.raises(err, match="X"):
        fit_symnmf(bad, 1, max_iter=1)


@pytest.mark.parametrize("kw, key", [({"method": "nope"}, "method"), ({"penalty": "nope"}, "penalty"),
                                     ({"penalty": -1.0}, "penalty"), ({"max_iter": -1}, "max_iter"),
                                     ({"tol": -1}, "tol"), ({"rank": 0}, "rank"),
                                     ({"method": "pgd", "penalty": 1.0}, "penalty"),
                                     ({"resume": True}, "resume")])
def test_bad_parameters_are_config_errors_naming_them(kw, key):
    kw = {"rank": 2, **kw}
    with pytest.raises(ConfigError) as info:
        fit_symnmf(np.eye(4) + 0.1, kw.pop("rank"), max_iter=kw.pop("max_iter", 2), **kw)
    assert info.value.key == key


# -- the NNLS solver against scipy ----------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 6, 3, 1), (3, 20, 5, 40), (2, 40, 12, 25)])
@pytest.mark.parametrize("warm", [False, True])
def test_nnls_bpp_matches_scipy_nnls(shape, warm):
    T, p, r, m = shape
    gen = torch.Generator().manual_seed(p * r + m)
    A = torch.randn((T, p, r), generator=gen, dtype=torch.float64)
    B = torch.randn((T, p, m), generator=gen, dtype=torch.float64)
    G, C = A.transpose(1, 2) @ A, A.transpose(1, 2) @ B
    init = torch.rand((T, r, m), generator=gen, dtype=torch.float64) - 0.5 if warm else None
    X = nnls_bpp(G, C, init=init)
    want = np.stack([np.stack([scipy.optimize.nnls(A[t].numpy(), B[t, :, j].numpy())[0] for j in range(m)], 1)
                     for t in range(T)])
    np.testing.assert_allclose(X.numpy(), want, rtol=1e-9, atol=1e-12)
    assert bool((X >= 0).all())


@pytest.mark.parametrize("r", [5, 70])  # 70: sets beyond one 62-bit code each
def test_nnls_columns_grouped_by_passive_set_equal_each_column_alone(r, monkeypatch):
    """Columns sharing a trial's passive set are solved together (one factor, many right-hand
    sides); that rounds differently from one solve per column (the triangular solves' order),
    so to 1e-12, not bit for bit: every masked solve, and the whole NNLS of a block whose
    columns hold a few sets (as near convergence), against the per-column path, and scipy's."""
    from ppdnmf_torch.models.symnmf import nnls as nnls_mod

    monkeypatch.setattr(nnls_mod, "GROUPED_MIN_ENTRIES", 0)
    T, p, m = 2, r + 10, 600
    gen = torch.Generator().manual_seed(r)
    A = torch.randn((T, p, r), generator=gen, dtype=torch.float64)
    G = A.transpose(1, 2) @ A
    X_true = torch.rand((T, r, m), generator=gen, dtype=torch.float64)
    patterns = torch.rand((4, r), generator=gen) > 0.4  # four passive sets over the m columns
    X_true = X_true * patterns[torch.randint(0, 4, (T, m), generator=gen)].transpose(1, 2)
    C = G @ X_true + 1e-3 * torch.randn((T, r, m), generator=gen, dtype=torch.float64)
    P = X_true > 0
    cols = torch.ones((T, m), dtype=torch.bool).nonzero()
    grouped = nnls_mod._solve_masked(G, C, P, *cols.unbind(1))
    X_grouped = nnls_bpp(G, C, init=X_true)
    monkeypatch.setattr(nnls_mod, "GROUPED_SETS", 0)
    alone = nnls_mod._solve_masked(G, C, P, *cols.unbind(1))
    X_alone = nnls_bpp(G, C, init=X_true)
    # x relative to its size; y = G x - c is 0 on the passive set up to rounding: relative to c's
    for a, b, scale in zip(grouped, alone, (float(alone[0].abs().max()), float(C.abs().max()))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12 * scale)
    torch.testing.assert_close(X_grouped, X_alone, rtol=1e-12, atol=1e-12 * float(X_alone.abs().max()))
    if r == 5:
        want = np.stack([np.stack([scipy.optimize.nnls(A[t].numpy(), np.linalg.lstsq(
            A[t].T.numpy(), C[t, :, j].numpy(), rcond=None)[0])[0] for j in range(40)], 1) for t in range(T)])
        np.testing.assert_allclose(X_grouped[:, :, :40].numpy(), want, rtol=1e-8, atol=1e-10)


def test_nnls_edge_cases_and_float32():
    A = torch.eye(3, dtype=torch.float64)[None]
    B = torch.tensor([[-1.0], [2.0], [0.0]], dtype=torch.float64)[None]
    assert nnls(A, B)[0, :, 0].tolist() == [0.0, 2.0, 0.0]
    gen = torch.Generator().manual_seed(7)
    A = torch.randn((2, 30, 6), generator=gen)
    B = torch.randn((2, 30, 10), generator=gen)
    X = nnls(A, B)
    assert X.dtype == torch.float32
    want = np.stack([np.stack([scipy.optimize.nnls(A[t].double().numpy(), B[t, :, j].double().numpy())[0]
                               for j in range(10)], 1) for t in range(2)])
    np.testing.assert_allclose(X.numpy(), want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("lam", [1e-4, 2.0])
def test_symanls_block_is_the_stacked_nnls_solution(lam):
    """Eq. (16): U_k row by row is scipy's NNLS of [V; sqrt(lam) I] u ~ [x_j; sqrt(lam) v_j]."""
    X = _problem(n=15, r=4)[0]
    gen = torch.Generator().manual_seed(11)
    V = torch.rand((1, 15, 4), generator=gen, dtype=torch.float64)
    A, B = block_data(X @ V[0], V, torch.tensor([lam], dtype=torch.float64))
    U = anls_block(torch.rand((1, 15, 4), generator=gen, dtype=torch.float64), A, B)
    stacked = np.vstack([V[0].numpy(), np.sqrt(lam) * np.eye(4)])
    want = np.stack([scipy.optimize.nnls(stacked, np.concatenate([X[j].numpy(), np.sqrt(lam) * V[0, j].numpy()]))[0]
                     for j in range(15)])
    np.testing.assert_allclose(U[0].numpy(), want, rtol=1e-9, atol=1e-12)


# -- the baselines ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", ALL)
def test_every_method_lowers_the_fitting_error(method):
    X = _problem(n=30, r=3, sigma=0.05, trials=2)
    # the theorem's penalty from the start (the adaptive one needs more iterations to settle)
    # Kuang's schedule from its default 1e-5 needs ~1000 iterations to reach a useful lambda
    # (the paper's Fig. 3); from Kuang et al.'s code's max(X)^2 60 are enough
    lam0 = float(X.max()) ** 2 if method == "kuang" else None
    res = fit_symnmf(X, 3, method=method, penalty="bound" if method in SPLIT else None, lam0=lam0, max_iter=60, tol=0)
    E = res.history["E"]
    assert E.shape == (61, 2)
    assert bool((E[-1] < 0.05 * E[0]).all()), E[-1]
    assert bool((res.U >= 0).all())
    if method in ("pgd", "beta", "tsvd"):
        assert torch.equal(res.U, res.V) and bool((res.lam == 0).all())


def test_pgd_objective_never_increases():
    X = _problem(n=20, r=3, sigma=0.1, trials=2)
    g = fit_symnmf(X, 3, method="pgd", max_iter=60, tol=0).history["objective"]
    assert bool((g[1:] <= g[:-1] * (1 + 1e-12)).all())


@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_pgd_does_not_collapse_to_zero_from_a_start_far_above_the_scale_of_x(scale):
    """Table I's failure: ``U_0`` uniform on [0, 1] against a small ``X`` (``U U^T`` thousands
    of times ``X``); a first step of ``1 / ||X||_F`` sent every entry to 0, a stationary point."""
    X = _problem(n=60, r=4, sigma=0.0, seed=2)[0] * scale
    res = fit_symnmf(X, 4, method="pgd", U0=initial_factor(60, 4, trials=2, seed=1), max_iter=50, tol=0)
    assert bool((res.U.amax(dim=(-2, -1)) > 0).all())
    assert bool((res.E < 0.05).all()), res.E


def test_tsvd_iterates_are_a_rotation_of_the_eigen_factor_clipped_at_zero():
    """Huang et al.'s iteration: ``U_k = max(0, B Q_{k-1})`` with ``B B^T`` the rank-r truncated
    eigendecomposition of ``X`` and ``Q`` orthogonal (the Procrustes fit of ``U_k``)."""
    from ppdnmf_torch.models.symnmf.baselines import procrustes

    X = _problem(n=30, r=3, sigma=0.1, trials=2)
    seen = []
    fit_symnmf(X, 3, method="tsvd", max_iter=4, tol=0, callback=lambda it: seen.append(it.U.clone()))
    vals, vecs = torch.linalg.eigh(X)
    B = vecs[..., -3:] * vals[..., -3:].clamp_min(0).sqrt().unsqueeze(-2)
    for U_prev, U in zip(seen, seen[1:]):
        Q = procrustes(B, U_prev)
        torch.testing.assert_close(Q.transpose(-2, -1) @ Q, torch.eye(3, dtype=X.dtype).expand(2, 3, 3))
        torch.testing.assert_close(U, (B @ Q).clamp_min(0), rtol=1e-9, atol=1e-10)


def test_tsvd_sparse_x_gives_the_dense_iterates_on_a_low_rank_x():
    """A sparse ``X`` takes the eigen-factor by subspace iteration: on a rank-r ``X`` it is exact."""
    X = _problem(n=30, r=3, sigma=0.0)[0]
    U0 = initial_factor(30, 3, trials=1, seed=2)
    dense = fit_symnmf(X, 3, method="tsvd", U0=U0, max_iter=20, tol=0)
    sparse = fit_symnmf(sp.csr_matrix(X.numpy()), 3, method="tsvd", U0=U0, max_iter=20, tol=0)
    torch.testing.assert_close(sparse.U, dense.U, rtol=1e-8, atol=1e-10)


def test_admm_reaches_consensus_u_equals_v():
    X = _problem(n=30, r=3, sigma=0.0, seed=3)
    res = fit_symnmf(X, 3, method="admm", max_iter=150, tol=0)
    assert float(res.history["rel_gap"][-1, 0]) < 1e-4
    assert float(res.E[0]) < 1e-4


@pytest.mark.parametrize("method", ["a_symhals", "symanls", "kuang", "pgd", "admm", "beta", "tsvd"])
def test_a_batched_trial_equals_the_same_trial_alone_every_method(method):
    X = _problem(n=16, r=3, sigma=0.1, trials=2)
    U0 = initial_factor(16, 3, trials=2, seed=4)
    batch = fit_symnmf(X, 3, method=method, U0=U0, max_iter=25, tol=0)
    for t in range(2):
        alone = fit_symnmf(X[t], 3, method=method, U0=U0[t], max_iter=25, tol=0)
        torch.testing.assert_close(batch.U[t], alone.U[0], rtol=1e-11, atol=1e-12)
        torch.testing.assert_close(batch.lam[t], alone.lam[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["kuang", "pgd", "admm", "beta"])
def test_dense_and_sparse_x_give_the_same_iterates_for_the_baselines(method):
    X = _problem(n=25, r=3, sigma=0.1)[0]
    X[X < 2.0] = 0
    U0 = initial_factor(25, 3, trials=1, seed=2)
    dense = fit_symnmf(X, 3, method=method, U0=U0, max_iter=20, tol=0)
    sparse = fit_symnmf(sp.csr_matrix(X.numpy()), 3, method=method, U0=U0, max_iter=20, tol=0)
    torch.testing.assert_close(sparse.U, dense.U, rtol=1e-8, atol=1e-10)


# -- dtypes and devices ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["symhals", "symanls"])
def test_runs_follow_the_device_and_dtype(device, dtype, method):
    X = _problem(n=20, r=3, sigma=0.0, trials=2).to(device, dtype)
    res = fit_symnmf(X, 3, method=method, penalty=1.0, max_iter=50, tol=0)
    assert res.U.device.type == device.type and res.U.dtype == dtype
    assert res.history["E"].dtype == torch.float64 and res.history["E"].device.type == "cpu"
    assert float(res.E.max()) < 1e-3


# -- stopping, callback, checkpoints ---------------------------------------------------------

def test_tolerance_stops_each_trial_and_the_callback_can_stop_the_run():
    X = _problem(n=20, r=3, sigma=0.0, trials=2)
    seen = []
    res = fit_symnmf(X, 3, max_iter=50, tol=0, callback=lambda info: seen.append(info.k) or info.k == 7)
    assert seen == list(range(1, 8)) and res.history["E"].shape == (8, 2)
    assert res.n_iter.tolist() == [7, 7] and not bool(res.converged.any())
    res = fit_symnmf(X, 3, penalty=[0.5, 50.0], max_iter=5000, tol=1e-3)
    assert bool(res.converged.all()) and res.n_iter[0] != res.n_iter[1]
    assert res.history["E"].shape[0] == int(res.n_iter.max()) + 1


def test_convergence_warning_when_tol_is_not_met():
    from ppdnmf_torch.errors import ConvergenceWarning

    with pytest.warns(ConvergenceWarning, match="did not reach tol"):
        fit_symnmf(_problem(n=20, r=3), 3, max_iter=3, tol=1e-12)


@pytest.mark.parametrize("method", ["symhals", "symanls", "pgd", "admm"])
def test_checkpoint_resume_is_bit_for_bit(tmp_path, method):
    X = _problem(n=18, r=3, sigma=0.1, trials=2)
    kw = dict(method=method, max_iter=12, tol=1e-9, seed=3)
    full = fit_symnmf(X, 3, **kw)
    part = fit_symnmf(X, 3, **{**kw, "max_iter": 5}, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt_bcd000004.pt", "ckpt_bcd000005.pt"]
    assert part.history["E"].shape[0] == 6
    resumed = fit_symnmf(X, 3, **kw, checkpoint_dir=tmp_path, resume=True)
    for a, b in ((full.U, resumed.U), (full.V, resumed.V), (full.lam, resumed.lam), (full.n_iter, resumed.n_iter)):
        assert torch.equal(a, b)
    for key in ("E", "objective", "gap", "rel_gap", "lam"):
        assert torch.equal(full.history[key], resumed.history[key]), key


def test_checkpoint_of_another_run_or_damaged_is_refused(tmp_path):
    X = _problem(n=18, r=3, sigma=0.1)
    fit_symnmf(X, 3, max_iter=3, checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match="different run: its U0 differ"):
        fit_symnmf(X, 3, max_iter=6, seed=1, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(CheckpointError, match="different run: its penalty is 'adaptive.*', this run's 'fixed"):
        fit_symnmf(X, 3, max_iter=6, penalty=2.0, checkpoint_dir=tmp_path, resume=True)
    path = tmp_path / "ckpt_bcd000003.pt"
    body = torch.load(path, weights_only=True)
    body["state"]["lam"] = body["state"]["lam"] * 2
    torch.save(body, path)
    with pytest.raises(CheckpointError, match="state tensor 'lam' does not match its hash"):
        fit_symnmf(X, 3, max_iter=6, checkpoint_dir=tmp_path, resume=True)


# -- the synthetic model ---------------------------------------------------------------------

@pytest.mark.parametrize("noise", ["gaussian", "uniform", "lognormal"])
def test_synthetic_model_of_sec_iv(noise):
    X, Us = synthetic_similarity(10, 2, [0.0, 0.3], noise=noise, trials=2, seed=1)
    assert X.shape == (2, 10, 10) and Us.shape == (2, 10, 2)
    assert bool((Us >= 0).all()) and torch.equal(X, X.transpose(1, 2))
    torch.testing.assert_close(X[0], Us[0] @ Us[0].T)
    N = (X[1] - Us[1] @ Us[1].T) / 0.3
    assert bool((N >= 0).all()) and float(N.std()) > 0.05
    # a trial's data do not depend on how many trials are drawn with it
    X1, _ = synthetic_similarity(10, 2, 0.0, noise=noise, trials=1, seed=1)
    assert torch.equal(X1[0], X[0])


# -- the app's entry point -------------------------------------------------------------------

def test_run_symnmf_streams_scalars_and_returns_summary_and_arrays():
    from ppdnmf_torch.models.symnmf.run import SCALAR_TAGS, run_symnmf

    X = _problem(n=24, r=3, sigma=0.1, trials=2)
    logs = []
    summary, arrays = run_symnmf(X, 3, max_iter=6, tol=0, log_scalars=lambda k, d: logs.append((k, d)),
                                 score=lambda labels: {"clusters": float(labels.unique().numel())})
    assert [k for k, _ in logs] == list(range(1, 7))
    assert set(logs[0][1]) == set(SCALAR_TAGS.values()) and len(logs[0][1]["symnmf/E"]) == 2
    assert summary["n_iter"] == [6, 6] and len(summary["clusters"]) == 2
    t = summary["reported_trial"]
    assert t == int(torch.tensor(summary["E"]).argmin())
    assert arrays["U"].shape == (24, 3) and arrays["history/E"].shape == (7, 2)
    assert torch.equal(arrays["labels"], arrays["U"].argmax(1))
    R = arrays["reordered_similarity"]
    order = torch.argsort(arrays["labels"], stable=True)
    torch.testing.assert_close(R, X[t][order][:, order] / X[t].max())


# -- the benchmark's numpy reference computes the same updates -------------------------------

def _bench_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_symnmf.py"
    spec = importlib.util.spec_from_file_location("bench_symnmf", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("method", ["symhals", "symanls"])
def test_bench_numpy_reference_matches_the_torch_solver(method):
    bench = _bench_module()
    X = _problem(n=30, r=4, sigma=0.1)[0]
    U0 = initial_factor(30, 4, trials=1, seed=3)
    res = fit_symnmf(X, 4, method=method, U0=U0, lam0=0.5, max_iter=8, tol=0)
    U, V = bench.np_fit(X.numpy(), U0[0].numpy(), 0.5, 8, method)
    np.testing.assert_allclose(U, res.U[0].numpy(), rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(V, res.V[0].numpy(), rtol=1e-9, atol=1e-11)


@pytest.mark.slow
def test_bench_script_quick_run(tmp_path):
    bench = _bench_module()
    out = bench.main(["--part", "all", "--quick", "--out", str(tmp_path / "b.json")])
    assert {"numpy", "time-to-E", "sparse"} <= set(out)
    assert all(row["max_abs_diff_U"] < 1e-9 for row in out["numpy"])
    assert all(row["E_last"] < row["E_first"] for row in out["sparse"])
