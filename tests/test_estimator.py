"""The scikit-learn-style estimator: attributes, transform on held-out columns, seeds, input checks."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.models.ppdnmf.estimator import TransposedInputWarning

FAST = dict(bcd_iters=8, x_iters=10, y_iters=10, device="cpu", negative="allow")


@pytest.fixture(scope="module")
def data():
    d = pp.data.synthetic(seed=0)
    return d.Z, pp.graph.ring(10)


@pytest.fixture(scope="module")
def fitted(data):
    Z, g = data
    return pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(Z, g)


@pytest.fixture(scope="module")
def fitted_hals(data):
    Z, g = data
    return pp.PPDNMF(n_components=5, random_state=0, y_solver="hals", **FAST).fit(Z, g)


def test_attributes_follow_scikit_learn(fitted, data):
    Z, _ = data
    m = fitted
    assert m.components_.shape == (5, 30) and bool((m.components_ >= 0).all())
    assert torch.equal(m.components_, m.result_.X_mean.T)
    assert m.n_iter_ == 8 and m.n_features_in_ == 30 and len(m.history_["nmse"]) == 8
    blocks = torch.split(Z, m.result_.columns, dim=1)
    err = torch.sqrt(sum(torch.linalg.matrix_norm(b - m.result_.X[i] @ m.result_.Y[i]) ** 2
                         for i, b in enumerate(blocks)))
    assert m.reconstruction_err_ == pytest.approx(float(err), rel=1e-10)
    assert m.nmse_ == m.result_.nmse and m.consensus_ == m.result_.consensus
    assert m.get_params()["n_components"] == 5 and m.set_params(mu=0.2).mu == 0.2


def test_fit_transform_is_the_agents_own_Y(data):
    Z, g = data
    m = pp.PPDNMF(n_components=5, random_state=1, **FAST)
    Y = m.fit_transform(Z, g)
    assert Y.shape == (5, 200) and torch.equal(Y, torch.cat(m.result_.Y, dim=1))


@pytest.mark.parametrize("model", ["fitted", "fitted_hals"])
def test_transform_projects_held_out_columns_like_nnls(model, request):
    from scipy.optimize import nnls

    fitted = request.getfixturevalue(model)
    new = pp.data.synthetic(seed=7).Z[:, :12].clamp(min=0)
    Y = fitted.transform(new)
    X = fitted.components_.T.numpy()
    ref = np.stack([nnls(X, new[:, j].numpy())[0] for j in range(new.shape[1])], axis=1)
    assert Y.shape == (5, 12) and bool((Y >= 0).all())
    res_ours = np.linalg.norm(new.numpy() - X @ Y.numpy())
    res_ref = np.linalg.norm(new.numpy() - X @ ref)
    assert res_ours <= res_ref * (1 + 1e-6) + 1e-9  # the same optimum, to the solver's tolerance
    with pytest.raises(pp.DataError, match=r"expected \(30, M\)"):
        fitted.transform(torch.rand(29, 3))


def _admm_projection(X, Z, eta, n_iters):
    """The Y-step's ADMM (eqs. 12-14) written out, from ``Y = V = R = 0``."""
    G = X.T @ X + eta * torch.eye(X.shape[1], dtype=X.dtype)
    XtZ = X.T @ Z
    V = R = torch.zeros((X.shape[1], Z.shape[1]), dtype=X.dtype)
    for _ in range(n_iters):
        Y = torch.clamp(V + R, min=0.0)
        V = torch.linalg.solve(G, XtZ + eta * (Y - R))
        R = R - (Y - V)
    return Y


def _hals_projection(X, Z, n_sweeps):
    """HALS sweeps written out row by row, from ``Y = 0``."""
    G, C = X.T @ X, X.T @ Z
    Y = torch.zeros((X.shape[1], Z.shape[1]), dtype=X.dtype)
    for _ in range(n_sweeps):
        for k in range(X.shape[1]):
            Y[k] = torch.clamp(Y[k] + (C[k] - G[k] @ Y) / G[k, k], min=0.0)
    return Y


@pytest.mark.parametrize("y_solver,other", [("admm", "hals"), ("hals", "admm"), (None, "hals")])
def test_transform_uses_the_fits_y_solver(data, y_solver, other):
    Z, g = data
    kw = dict(FAST, y_iters=5)
    m = pp.PPDNMF(n_components=5, random_state=0, y_solver=y_solver, transform_iters=15, transform_tol=0.0,
                  **kw).fit(Z, g)
    m.set_params(y_solver=other)  # transform follows the fit, not a later setting
    X = m.result_.X_mean
    new = pp.data.synthetic(seed=7).Z[:, :12].clamp(min=0)
    Y = m.transform(new)
    refs = {"admm": _admm_projection(X, new, m.eta, 15), "hals": _hals_projection(X, new, 15)}
    used = y_solver or pp.models.ppdnmf.solver.DEFAULTS["y_solver"]
    torch.testing.assert_close(Y, refs[used], rtol=1e-9, atol=1e-12)
    # 15 iterations are far from converged, so the two solvers' iterates differ
    assert float(torch.linalg.matrix_norm(refs["admm"] - refs["hals"])) > 1e-3 * float(torch.linalg.matrix_norm(Y))


def test_random_state_reproduces_and_differs(data):
    Z, g = data
    kw = dict(n_components=5, penalty="fixed", **FAST)  # fixed penalties: only the start differs
    a = pp.PPDNMF(random_state=0, **kw).fit(Z, g)
    b = pp.PPDNMF(random_state=0, **kw).fit(Z, g)
    c = pp.PPDNMF(random_state=1, **kw).fit(Z, g)
    assert torch.equal(a.components_, b.components_)
    assert not torch.equal(a.components_, c.components_)
    ones0 = pp.PPDNMF(init="ones", random_state=0, **kw).fit(Z, g)
    ones1 = pp.PPDNMF(init="ones", random_state=1, **kw).fit(Z, g)
    assert torch.equal(ones0.components_, ones1.components_)  # the paper's start has no randomness


def test_transposed_input_warns(data):
    Z, g = data
    with pytest.warns(TransposedInputWarning, match="Z.T"):
        pp.PPDNMF(n_components=3, random_state=0, **FAST).fit(Z[:, :20].contiguous(), pp.graph.ring(4))  # 30 x 20
    with warnings.catch_warnings():
        warnings.simplefilter("error", TransposedInputWarning)
        pp.PPDNMF(n_components=3, random_state=0, **FAST).fit(Z, g)  # more columns than rows: no warning


def test_scipy_sparse_input_is_densified_per_agent(data):
    import scipy.sparse as sp

    Z, g = data
    dense = pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(Z, g)
    sparse = pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(sp.csr_matrix(Z.numpy()), g)
    assert torch.equal(dense.components_, sparse.components_)


def test_sparse_input_too_large_is_refused(monkeypatch):
    import scipy.sparse as sp

    from ppdnmf_torch.models.ppdnmf import estimator

    monkeypatch.setattr(estimator, "MAX_DENSE_BYTES", 1000)
    with pytest.raises(pp.DataError, match="densified per agent"):
        pp.PPDNMF(n_components=2, random_state=0, **FAST).fit(sp.random(40, 100, density=0.1), pp.graph.ring(2))


@pytest.mark.parametrize("bad,match", [(dict(n_components=0), "n_components"), (dict(random_state=-1), "random_state"),
                                       (dict(random_state="x"), "random_state")])
def test_bad_hyperparameters(data, bad, match):
    Z, g = data
    kw = dict(n_components=3, random_state=0, **FAST)
    kw.update(bad)
    with pytest.raises(pp.ConfigError, match=match):
        pp.PPDNMF(**kw).fit(Z, g)


def test_transform_before_fit_is_an_error():
    with pytest.raises(pp.ConfigError, match="fit"):
        pp.PPDNMF(n_components=2).transform(torch.rand(3, 3))
