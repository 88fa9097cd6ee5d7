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
from ppdnmf_torch.models.symnmf.alternating import block_data
from ppdnmf_torch.models.symnmf.objective import split_objective
from ppdnmf_torch.models.symnmf.penalty import next_lambda, parse_penalty
from ppdnmf_torch.models.symnmf.symhals import hals_block, hals_sweep

SPLIT = ["symhals", "a_symhals"]


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


@pytest.mark.parametrize("method", SPLIT)
def test_adaptive_lambda_nondecreasing_with_a_finite_limit_in_a_run(method):
    X = _problem(n=30, r=3, sigma=0.0, trials=2)
    res = fit_symnmf(X, 3, method=method, max_iter=300, tol=0)
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


def test_bound_penalty_is_the_theorem_bound_times_1_01():
    X = _problem(n=15, r=3, sigma=0.1)
    U0 = initial_factor(15, 3, trials=1, seed=0)
    res = fit_symnmf(X, 3, penalty="bound", U0=U0, max_iter=0)
    Xn = X[0].numpy()
    s = np.linalg.svd(Xn, compute_uv=False)
    want = 1.01 * 0.5 * (s[0] + np.linalg.norm(Xn - U0[0].numpy() @ U0[0].numpy().T) - s[-1])
    assert float(res.lam[0]) == pytest.approx(want, rel=1e-10)


# -- U = V at convergence on noise-free data --------------------------------------------------

@pytest.mark.parametrize("method", SPLIT)
def test_u_equals_v_at_convergence_on_noise_free_data(method):
    X = _problem(n=40, r=3, sigma=0.0, seed=5)
    res = fit_symnmf(X, 3, method=method, max_iter=3000, tol=1e-10)
    assert bool(res.converged.all())
    assert float(res.history["rel_gap"][-1].max()) < 1e-6
    assert float(res.E.max()) < 1e-8


# -- batched = alone; dense = sparse ----------------------------------------------------------

@pytest.mark.parametrize("method", SPLIT)
def test_a_batched_trial_equals_the_same_trial_alone(method):
    X = _problem(n=16, r=3, sigma=0.1, trials=3)
    lams = [0.2, 1.0, 3.0]
    U0 = initial_factor(16, 3, trials=3, seed=9)
    batch = fit_symnmf(X, 3, method=method, penalty=lams, U0=U0, max_iter=60, tol=1e-7)
    for t in range(3):
        alone = fit_symnmf(X[t], 3, method=method, penalty=lams[t], U0=U0[t], max_iter=60, tol=1e-7)
        torch.testing.assert_close(batch.U[t], alone.U[0], rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(batch.V[t], alone.V[0], rtol=1e-12, atol=1e-13)
        assert int(batch.n_iter[t]) == int(alone.n_iter[0])


@pytest.mark.parametrize("kind", ["scipy", "torch_csr", "torch_coo"])
@pytest.mark.parametrize("method", SPLIT)
def test_dense_and_sparse_x_give_the_same_iterates(kind, method):
    X = _problem(n=25, r=3, sigma=0.1)[0]
    X[X < 2.0] = 0  # genuinely sparse
    Xs = {"scipy": sp.csr_matrix(X.numpy()), "torch_csr": X.to_sparse_csr(), "torch_coo": X.to_sparse()}[kind]
    U0 = initial_factor(25, 3, trials=2, seed=1)
    dense = fit_symnmf(X, 3, method=method, U0=U0, max_iter=30, tol=0)
    sparse = fit_symnmf(Xs, 3, method=method, U0=U0, max_iter=30, tol=0)
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
