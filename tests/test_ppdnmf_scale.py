"""PPDNMF's answer does not depend on the data's units (issue 40, "defaults that finish on real
data"), and its default stop means converged: the estimator fits ``X / scale_`` and gives
``components_`` in ``X``'s units; the BCD rule measures the change of each agent's model
``X_i Y_i`` against ``||Z_i||`` (``solver/stopping.model_change``), which the factors' drift
along ``X D, D^-1 Y`` does not hold up."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.models.ppdnmf.solver.kernels import rel_change
from ppdnmf_torch.models.ppdnmf.solver.stopping import model_change

#: the plain exchange keeps these fits short: the scale is the estimator's, before any exchange
QUICK = dict(n_components=3, random_state=0, n_agents=4, exchange="plain", device="cpu", tol=1e-3, max_iter=200)


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).uniform(size=(40, 6))


@pytest.fixture(scope="module")
def base(X):
    return pp.PPDNMF(**QUICK).fit(X)


@pytest.mark.parametrize("c", [1e-3, 1.0, 16.0, 1e3])
def test_the_answer_on_c_times_x_is_c_times_the_answer_on_x(X, base, c):
    """fit(c X) == the c-scaled fit(X): the same iterations, ``components_`` (and what is built from
    them) times c, the coefficients alike. Bit for bit where ``c`` is a power of two (``c X /
    (c max X)`` is ``X / max X`` exactly); to 1e-6 otherwise: ``c X`` and ``c max X`` are rounded,
    and the iterations carry the rounding on (2e-7 relative after 200 iterations, measured)."""
    m = pp.PPDNMF(**QUICK).fit(c * X)
    assert m.n_iter_ == base.n_iter_ < QUICK["max_iter"]
    assert m.scale_ == pytest.approx(c * base.scale_, rel=1e-15)
    W, W0 = m.transform(c * X), base.transform(X)
    if c in (1.0, 16.0):
        np.testing.assert_array_equal(m.components_, c * base.components_)
        np.testing.assert_array_equal(W, W0)
        assert m.reconstruction_err_ == c * base.reconstruction_err_
    else:
        np.testing.assert_allclose(m.components_, c * base.components_, rtol=1e-6, atol=1e-6 * c)
        np.testing.assert_allclose(W, W0, rtol=1e-6, atol=1e-6)
        assert m.reconstruction_err_ == pytest.approx(c * base.reconstruction_err_, rel=1e-6)
    np.testing.assert_allclose(m.inverse_transform(W), c * base.inverse_transform(W0), rtol=1e-6, atol=1e-6 * c)
    assert m.score(c * X) == pytest.approx(base.score(X), rel=1e-6)


def test_the_errors_are_in_the_datas_units(base, X):
    W = base.fit_transform(X)
    assert base.reconstruction_err_ == pytest.approx(np.linalg.norm(X - W @ base.components_), rel=1e-12)
    assert base.agent_reconstruction_err_ == pytest.approx(
        base.scale_ * np.sqrt(2 * float(base.history_["objective"][-1])), rel=1e-12)


def test_scale_one_is_the_functional_fit_on_x_as_it_is(X):
    """``scale=1.0`` fits ``X`` as :func:`ppdnmf_torch.fit` does (dividing by 1 is exact): bit for bit."""
    kw = {k: v for k, v in QUICK.items() if k not in ("n_components", "n_agents", "random_state", "max_iter")}
    m = pp.PPDNMF(**QUICK, scale=1.0).fit(X)
    r = pp.fit(torch.as_tensor(X.T), pp.graph.ring(4), 3, seed=0, init_seed=0, bcd_iters=QUICK["max_iter"], **kw)
    assert m.scale_ == 1.0
    np.testing.assert_array_equal(m.components_, r.X_mean.T.numpy())


def test_a_public_bound_is_the_same_fit_as_the_max_when_they_agree(X):
    """A bound the agents agree on in public (nothing crosses) gives the fit of ``X / bound``."""
    big = 16.0 * X / X.max()  # entries in [0, 16], 16 reached: the max is the bound
    a = pp.PPDNMF(**QUICK).fit(big)
    b = pp.PPDNMF(**QUICK, scale=16.0).fit(big)
    assert a.scale_ == b.scale_ == 16.0
    np.testing.assert_array_equal(a.components_, b.components_)


def test_sparse_input_takes_the_same_scale(X):
    sp = pytest.importorskip("scipy.sparse")
    Xs = X * (X > 0.3)
    a = pp.PPDNMF(**QUICK).fit(100.0 * Xs)
    b = pp.PPDNMF(**QUICK).fit(sp.csr_matrix(100.0 * Xs))
    assert a.scale_ == b.scale_ == 100.0 * Xs.max()
    np.testing.assert_array_equal(a.components_, b.components_)  # divided entry by entry alike


@pytest.mark.parametrize("bad", ["big", 0, -1.0, float("nan"), float("inf"), True, None])
def test_a_bad_scale_is_one_line_naming_it(X, bad):
    with pytest.raises(pp.ConfigError, match=r"^scale: must be 'max' or a finite number > 0") as err:
        pp.PPDNMF(**QUICK, scale=bad).fit(X)
    assert err.value.key == "scale"


# ---------------------------------------------------------------------------- the stop
def test_model_change_ignores_the_factors_drift():
    g = torch.Generator().manual_seed(0)
    X, Y = torch.rand(2, 3, 8, 4, generator=g, dtype=torch.float64), torch.rand(2, 3, 4, 9, generator=g,
                                                                                dtype=torch.float64)
    Z = X @ Y
    D = torch.rand(2, 3, 1, 4, generator=g, dtype=torch.float64) + 0.5
    z = torch.linalg.matrix_norm(Z)
    assert float(model_change(X * D, Y / D.transpose(-1, -2), X, Y, z).max()) < 1e-14
    assert float(rel_change(X * D, X).min()) > 0.05  # what the factors' relative change sees
    X2 = X + 0.01 * torch.rand(X.shape, generator=g, dtype=torch.float64)
    expected = torch.linalg.matrix_norm(X2 @ Y - X @ Y) / z
    torch.testing.assert_close(model_change(X2, Y, X, Y, z), expected, rtol=1e-12, atol=0)
    z[0, 1] = 0  # a padding slot: no data, nothing to converge
    assert float(model_change(X2, Y, X, Y, z)[0, 1]) == 0.0


def test_the_default_stop_fires_where_the_factors_drift():
    """scikit-learn's checks' transformer data (two blobs, 30 x 3, rank 3: an exact factorization
    and a family of them): the default rule stops well within the cap, near the answer, while the
    factors' relative change is still above ``tol`` (the earlier rule ran the 1000 iterations)."""
    from sklearn.datasets import make_blobs

    X, _ = make_blobs(n_samples=30, centers=[[0, 0, 0], [1, 1, 1]], random_state=0, n_features=2, cluster_std=0.1)
    X -= X.min()
    kept = []

    def keep(info):
        kept.append(info.state.X.clone())

    with warnings.catch_warnings():
        warnings.simplefilter("error", pp.ConvergenceWarning)
        m = pp.PPDNMF(random_state=0, exchange="plain", device="cpu").fit(X, callback=keep)
    assert m.n_iter_ < 200
    assert m.consensus_ <= 1e-3
    assert m.reconstruction_err_ / np.linalg.norm(X) < 1e-2
    assert float(rel_change(kept[-1], kept[-2]).max()) > m.tol
