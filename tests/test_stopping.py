"""Stopping rules that mean converged (issue 40): each model's default stops on a scaled
stationarity residual, a noise-free problem reaches its target under the defaults, and a run
that ``max_iter`` cuts warns."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConvergenceWarning
from ppdnmf_torch.models.symnmf import fit_symnmf, synthetic_similarity
from ppdnmf_torch.models.symnmf.config import CLUSTERING, SPEC
from ppdnmf_torch.models.symnmf.estimator import SymmetricNMF
from ppdnmf_torch.models.symnmf.objective import stationarity


# -- symmetric NMF: the projected-gradient residual of (2) ----------------------------------

def _residual_numpy(X, U):
    G = U @ (U.T @ U) - X @ U
    P = np.where(U > 0, G, np.minimum(G, 0))
    return np.linalg.norm(P) / (np.linalg.norm(X) * np.linalg.norm(U))


def _residual(X, U):
    X, U = torch.as_tensor(X)[None], torch.as_tensor(U)[None]
    return float(stationarity((X * X).sum((-2, -1)), U, X @ U)[0])


def test_symnmf_residual_equals_the_numpy_transcription_and_is_zero_at_a_factorization():
    rng = np.random.default_rng(0)
    U = rng.random((30, 4))
    U[rng.random((30, 4)) < 0.3] = 0.0  # zeros: only the negative part of the gradient counts there
    X = U @ U.T
    assert _residual(X, U) < 1e-14
    V = np.abs(U + 0.1 * rng.standard_normal(U.shape))
    V[U == 0] = 0.0
    assert _residual(X, V) == pytest.approx(_residual_numpy(X, V), rel=1e-12)
    assert _residual(X, V) > 1e-3


@pytest.mark.parametrize("c", [1e-6, 1e-2, 1e4])
def test_symnmf_residual_means_the_same_at_any_scale(c):
    """``X -> c X`` with ``U -> sqrt(c) U`` leaves it unchanged (up to rounding)."""
    rng = np.random.default_rng(1)
    X = synthetic_similarity(40, 3, 0.1, seed=1)[0][0].numpy()
    U = rng.random((40, 3))
    assert _residual(c * X, np.sqrt(c) * U) == pytest.approx(_residual(X, U), rel=1e-10)


def test_symnmf_defaults_pinned():
    """The default tolerance is on the residual (1e-5: E <= 6e-7 over 12 noise-free starts,
    where 1e-4 gave up to 1.4e-6) and the cap leaves SymHALS its slow rise of lambda."""
    assert (SPEC.tol, CLUSTERING.tol, SPEC.max_iter) == (1e-5, 1e-5, 5000)


@pytest.mark.parametrize("seed", [6, pytest.param(0, marks=pytest.mark.slow), pytest.param(7, marks=pytest.mark.slow)])
def test_symmetric_nmf_defaults_reach_the_noise_free_answer(seed):
    """Issue 40's case: n = 150, r = 6, noise-free; under the step rule the defaults stopped
    at E = 1.6e-2 (414 iterations)."""
    X = synthetic_similarity(150, 6, 0.0, seed=seed)[0][0].numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        est = SymmetricNMF(n_clusters=6, affinity="precomputed", random_state=seed).fit(X)
    assert est.reconstruction_err_ ** 2 / np.sum(X * X) <= 1e-6  # E = ||X - U U^T||^2 / ||X||^2
    assert est.n_iter_ < SPEC.max_iter


def test_symmetric_nmf_cut_by_max_iter_warns():
    X = synthetic_similarity(150, 6, 0.0, seed=0)[0][0].numpy()
    with pytest.warns(ConvergenceWarning, match="did not reach tol"):
        est = SymmetricNMF(n_clusters=6, affinity="precomputed", random_state=0, max_iter=300).fit(X)
    assert est.n_iter_ == 300


@pytest.mark.parametrize("method", ["symhals", "symanls", "pgd"])
def test_fit_symnmf_stops_where_the_residual_meets_tol(method):
    """The rule is the residual: a converged trial's last iterate meets it, the one before did not."""
    X = synthetic_similarity(30, 3, 0.05, seed=2)[0]
    res = fit_symnmf(X, 3, method=method, tol=1e-3, max_iter=3000, seed=2)
    assert bool(res.converged.all())
    U = res.U[0].numpy()
    assert _residual(X[0].numpy(), U) <= 1e-3
    n = int(res.n_iter[0])
    before = fit_symnmf(X, 3, method=method, tol=0, max_iter=n - 1, seed=2)
    assert _residual(X[0].numpy(), before.U[0].numpy()) > 1e-3


# -- FSSPCA: alpha relative to the data ------------------------------------------------------

def _fsspca_blocks(c):
    rng = np.random.default_rng(3)
    A = rng.standard_normal((90, 10)) @ np.diag(np.linspace(3.0, 0.5, 10))
    return [c * A[i::3] for i in range(3)]


@pytest.mark.parametrize("c", [1e-3, 1e3])
def test_fsspca_gram_alpha_gives_the_same_answer_at_any_scale(c):
    """``alpha_scale="gram"``: data times ``c`` is the same problem (objective times ``c^2``), so
    the same loadings, where the unscaled ``alpha`` gives another sparsity."""
    from ppdnmf_torch.models.fsspca.fit import fit_fsspca

    kw = dict(alpha=0.05, max_iter=40, tol=0.0, seed=0)
    base = fit_fsspca(_fsspca_blocks(1.0), 2, alpha_scale="gram", **kw)
    scaled = fit_fsspca(_fsspca_blocks(c), 2, alpha_scale="gram", **kw)
    assert 0.1 < float((base.z == 0).double().mean()) < 0.9  # a sparse, not empty, answer
    # the same problem to rounding: scaling rounds differently, and 40 ADMM iterations near the
    # soft threshold amplify it (measured up to 5e-8 on entries of order 0.1)
    torch.testing.assert_close(scaled.z, base.z, rtol=1e-5, atol=1e-6)
    raw = fit_fsspca(_fsspca_blocks(c), 2, alpha_scale="none", **kw)
    assert float((raw.z == 0).double().mean()) != float((base.z == 0).double().mean())


def test_fsspca_alpha_scale_is_checked():
    from ppdnmf_torch.errors import ConfigError
    from ppdnmf_torch.models.fsspca.fit import fit_fsspca

    with pytest.raises(ConfigError, match="alpha_scale"):
        fit_fsspca(_fsspca_blocks(1.0), 2, alpha_scale="pooled")


def test_fsspca_estimator_alpha_is_relative_and_a_cut_run_warns():
    """The estimator's ``alpha`` is relative (``alpha_scale="gram"``): data times 1e3 gives the
    same loadings; three iterations do not meet ``tol`` and say so."""
    from ppdnmf_torch.models.fsspca.estimator import FederatedSparsePCA

    X = np.vstack(_fsspca_blocks(1.0))
    with pytest.warns(ConvergenceWarning, match="did not reach tol"):
        a = FederatedSparsePCA(2, alpha=0.05, max_iter=3, random_state=0).fit(X)
    with pytest.warns(ConvergenceWarning):
        b = FederatedSparsePCA(2, alpha=0.05, max_iter=3, random_state=0).fit(1e3 * X)
    np.testing.assert_allclose(b.components_, a.components_, rtol=1e-6, atol=1e-8)


def test_the_tables_adjusted_variance_is_pcas_explained_variance_for_pca_loadings():
    """scripts/estimators_vs_sklearn.py scores both sparse PCAs by Zou et al.'s adjusted variance;
    for orthonormal, uncorrelated loadings (PCA's) it is PCA's explained variance ratio."""
    import importlib.util
    from pathlib import Path

    from sklearn.decomposition import PCA

    path = Path(__file__).resolve().parents[1] / "scripts" / "estimators_vs_sklearn.py"
    spec = importlib.util.spec_from_file_location("estimators_vs_sklearn", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    X = np.vstack(_fsspca_blocks(1.0))
    pca = PCA(3).fit(X)
    assert mod.adjusted_variance_ratio(X, pca.components_) == pytest.approx(pca.explained_variance_ratio_.sum(),
                                                                             rel=1e-10)
    assert mod.adjusted_variance_ratio(X, np.zeros((2, X.shape[1]))) == 0.0
