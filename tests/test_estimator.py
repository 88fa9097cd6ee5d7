"""The scikit-learn estimator: attributes, transform on held-out samples, seeds, input checks,
scikit-learn's conventions (check_estimator, Pipeline, GridSearchCV, NotFittedError, NumPy out)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp

FAST = dict(max_iter=8, tol=0.0, x_iters=10, y_iters=10, device="cpu", negative="allow", graph=pp.graph.ring(10))


@pytest.fixture(scope="module")
def data():
    """The paper's ``Z (30, 200)``, as a tensor, and its samples as rows (scikit-learn's ``X``)."""
    d = pp.data.synthetic(seed=0)
    return d.Z, d.Z.T.contiguous()


@pytest.fixture(scope="module")
def fitted(data):
    _, X = data
    return pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(X)


@pytest.fixture(scope="module")
def fitted_hals(data):
    _, X = data
    return pp.PPDNMF(n_components=5, random_state=0, y_solver="hals", **FAST).fit(X)


def test_attributes_follow_scikit_learn(fitted, data):
    Z, _ = data
    m = fitted
    assert isinstance(m.components_, torch.Tensor)  # tensor in, tensor out
    assert m.components_.shape == (5, 30) and bool((m.components_ >= 0).all())
    # the fit is of X / scale_ (the data's largest absolute entry), components_ in X's units
    assert m.scale_ == float(Z.abs().max())
    assert torch.equal(m.components_, m.result_.X_mean.T * m.scale_)
    assert m.n_iter_ == 8 and m.n_features_in_ == 30 and len(m.history_["nmse"]) == 8
    blocks = torch.split(Z / m.scale_, m.result_.columns, dim=1)
    err = m.scale_ * torch.sqrt(sum(torch.linalg.matrix_norm(b - m.result_.X[i] @ m.result_.Y[i]) ** 2
                                    for i, b in enumerate(blocks)))
    assert m.agent_reconstruction_err_ == pytest.approx(float(err), rel=1e-10)
    W = torch.cat(m.result_.Y, dim=1).T  # fit_transform's W, with H = components_ (scikit-learn's meaning)
    assert m.reconstruction_err_ == pytest.approx(float(torch.linalg.matrix_norm(Z.T - W @ m.components_)), rel=1e-10)
    assert m.nmse_ == m.result_.nmse and m.consensus_ == m.result_.consensus
    assert m.get_params()["n_components"] == 5 and m.set_params(mu=0.2).mu == 0.2


def test_fit_transform_is_the_agents_own_Y(data):
    _, X = data
    m = pp.PPDNMF(n_components=5, random_state=1, **FAST)
    W = m.fit_transform(X)
    assert W.shape == (200, 5) and torch.equal(W, torch.cat(m.result_.Y, dim=1).T)


@pytest.mark.parametrize("model", ["fitted", "fitted_hals"])
def test_transform_projects_held_out_columns_like_nnls(model, request):
    from scipy.optimize import nnls

    fitted = request.getfixturevalue(model)
    new = pp.data.synthetic(seed=7).Z[:, :12].clamp(min=0)
    Y = fitted.transform(new.T).T
    X = fitted.components_.T.numpy()
    ref = np.stack([nnls(X, new[:, j].numpy())[0] for j in range(new.shape[1])], axis=1)
    assert Y.shape == (5, 12) and bool((Y >= 0).all())
    res_ours = np.linalg.norm(new.numpy() - X @ Y.numpy())
    res_ref = np.linalg.norm(new.numpy() - X @ ref)
    assert res_ours <= res_ref * (1 + 1e-6) + 1e-9  # the same optimum, to the solver's tolerance
    with pytest.raises(ValueError, match="30 features"):
        fitted.transform(torch.rand(3, 29))


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
    _, Xs = data
    kw = dict(FAST, y_iters=5, **({} if y_solver is None else {"y_solver": y_solver}))  # None: the default
    m = pp.PPDNMF(n_components=5, random_state=0, transform_iters=15, transform_tol=0.0, **kw).fit(Xs)
    m.set_params(y_solver=other)  # transform follows the fit, not a later setting
    X = m.result_.X_mean  # the basis of X / scale_: transform projects new / scale_ on it
    new = pp.data.synthetic(seed=7).Z[:, :12].clamp(min=0)
    Y = m.transform(new.T).T
    new = new / m.scale_
    refs = {"admm": _admm_projection(X, new, m.eta, 15), "hals": _hals_projection(X, new, 15)}
    used = y_solver or pp.models.ppdnmf.config.SOLVER_DEFAULTS.y_solver
    torch.testing.assert_close(Y, refs[used], rtol=1e-9, atol=1e-12)
    # 15 iterations are far from converged, so the two solvers' iterates differ
    assert float(torch.linalg.matrix_norm(refs["admm"] - refs["hals"])) > 1e-3 * float(torch.linalg.matrix_norm(Y))


def test_random_state_reproduces_and_differs(data):
    _, X = data
    kw = dict(n_components=5, penalty="fixed", **FAST)  # fixed penalties: only the start differs
    a = pp.PPDNMF(random_state=0, **kw).fit(X)
    b = pp.PPDNMF(random_state=0, **kw).fit(X)
    c = pp.PPDNMF(random_state=1, **kw).fit(X)
    assert torch.equal(a.components_, b.components_)
    assert not torch.equal(a.components_, c.components_)
    ones0 = pp.PPDNMF(init="ones", random_state=0, **kw).fit(X)
    ones1 = pp.PPDNMF(init="ones", random_state=1, **kw).fit(X)
    assert torch.equal(ones0.components_, ones1.components_)  # the paper's start has no randomness


def test_scipy_sparse_input_is_densified_per_agent(data):
    import scipy.sparse as sp

    _, X = data
    dense = pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(X.numpy())
    sparse = pp.PPDNMF(n_components=5, random_state=0, **FAST).fit(sp.csr_matrix(X.numpy()))
    assert np.array_equal(dense.components_, sparse.components_)


def test_sparse_input_too_large_is_refused(monkeypatch):
    import scipy.sparse as sp

    from ppdnmf_torch.models.ppdnmf import estimator

    monkeypatch.setattr(estimator, "MAX_DENSE_BYTES", 1000)
    with pytest.raises(pp.DataError, match="densified per agent"):
        pp.PPDNMF(n_components=2, random_state=0, **dict(FAST, graph=pp.graph.ring(2))).fit(
            sp.random(100, 40, density=0.1, random_state=0))


@pytest.mark.parametrize("bad,match", [(dict(n_components=0), "n_components"), (dict(random_state=-1), "random_state"),
                                       (dict(random_state="x"), "random_state"), (dict(max_iter=0), "max_iter"),
                                       (dict(transform_iters=-5), "transform_iters"), (dict(tol=-1.0), "tol"),
                                       (dict(dtype="int8"), "dtype")])
def test_bad_hyperparameters(data, bad, match):
    _, X = data
    kw = dict(n_components=3, random_state=0, **FAST)
    kw.update(bad)
    with pytest.raises(pp.ConfigError, match=match):
        pp.PPDNMF(**kw).fit(X)


# -- scikit-learn's conventions (issue 31, item 9) -----------------------------------------

SMALL = dict(max_iter=3, tol=0.0, x_iters=3, y_iters=3, transform_iters=6, device="cpu", random_state=0)


def test_transform_before_fit_is_not_fitted_error():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match="fit"):
        pp.PPDNMF(n_components=2).transform(np.random.rand(3, 3))


@pytest.mark.parametrize("call", [lambda: pp.PPDNMF(max_iters=5), lambda: pp.PPDNMF(n_component=4)])
def test_misspelt_parameters_are_refused_at_construction(call):
    with pytest.raises(TypeError, match="unexpected keyword"):
        call()


def test_misspelt_parameters_are_refused_by_set_params():
    with pytest.raises(ValueError, match="n_component"):
        pp.PPDNMF().set_params(n_component=4)


def test_numpy_in_numpy_out_and_the_round_trip(data):
    _, X = data
    Xn = X.numpy()
    m = pp.PPDNMF(n_components=4, **dict(FAST, max_iter=4))
    W = m.fit_transform(Xn)
    assert isinstance(W, np.ndarray) and isinstance(m.components_, np.ndarray)
    assert isinstance(m.transform(Xn[:7]), np.ndarray) and m.transform(Xn[:7]).shape == (7, 4)
    back = m.inverse_transform(W)
    assert isinstance(back, np.ndarray) and back.shape == Xn.shape
    np.testing.assert_allclose(back, W @ m.components_)
    assert list(m.get_feature_names_out()) == [f"ppdnmf{k}" for k in range(4)]
    score = m.score(Xn)
    rel = np.linalg.norm(Xn - m.transform(Xn) @ m.components_) / np.linalg.norm(Xn)
    assert score == pytest.approx(-rel, rel=1e-9) and -1 < score < 0


def test_the_graph_as_y_is_refused_with_the_new_place_named(data):
    _, X = data
    with pytest.raises(pp.ConfigError, match=r"PPDNMF\(graph=\.\.\.\)"):
        pp.PPDNMF(n_components=3, **SMALL).fit(X, pp.graph.ring(10))


def test_default_graph_is_a_ring_with_degree_two():
    m = pp.PPDNMF(n_components=2, **SMALL).fit(np.random.default_rng(0).random((40, 6)))
    assert len(m.result_.Y) == 10
    few = pp.PPDNMF(n_components=2, **SMALL).fit(np.random.default_rng(0).random((7, 6)))
    assert len(few.result_.Y) == 3  # at least two samples per agent


@pytest.mark.parametrize("bad,match", [
    (np.array([[1.0, np.nan], [0.5, 0.2], [0.1, 0.3]]), "NaN"),
    (np.array([[1.0, np.inf], [0.5, 0.2], [0.1, 0.3]]), "infinity"),
    (np.array([[1.0, -0.5], [0.5, 0.2], [0.1, 0.3]]), "Negative values"),
    (np.array([["a", "b"], ["c", "d"], ["e", "f"]]), "string|could not convert"),
    (np.zeros((0, 2)), "0 sample"),
])
def test_transform_checks_its_input(bad, match):
    m = pp.PPDNMF(n_components=1, **SMALL).fit(np.random.default_rng(0).random((12, 2)))
    with pytest.raises(ValueError, match=match):
        m.transform(bad)


def test_transform_refuses_a_meta_tensor():
    m = pp.PPDNMF(n_components=1, **SMALL).fit(np.random.default_rng(0).random((12, 2)))
    with pytest.raises(pp.DataError, match="meta"):
        m.transform(torch.empty((3, 2), device="meta"))


def test_transform_runs_under_the_thread_setting(monkeypatch, data):
    from ppdnmf_torch.models.ppdnmf import estimator

    _, X = data
    m = pp.PPDNMF(n_components=3, threads=1, negative="allow", **SMALL).fit(X.numpy())
    seen = []
    real = estimator.PPDNMF._project

    def spy(self, Zt):
        seen.append(torch.get_num_threads())
        return real(self, Zt)

    monkeypatch.setattr(estimator.PPDNMF, "_project", spy)
    torch.set_num_threads(2)
    try:
        m.transform(X.numpy()[:5])
        m.score(X.numpy()[:5])
    finally:
        torch.set_num_threads(1)
    assert seen == [1, 1]


def test_pipeline_and_grid_search():
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import MinMaxScaler

    X = np.random.default_rng(0).random((60, 8))
    pipe = make_pipeline(MinMaxScaler(), pp.PPDNMF(n_components=2, **SMALL))
    W = pipe.fit_transform(X)
    assert W.shape == (60, 2)
    grid = GridSearchCV(pp.PPDNMF(**SMALL), {"n_components": [1, 3]}, cv=2).fit(X)
    assert grid.best_params_["n_components"] == 3  # a larger rank reconstructs better


def test_the_defaults_stop_on_a_tolerance_and_warn_at_the_cap(data):
    from ppdnmf_torch.models.ppdnmf.solver import ConvergenceWarning

    _, X = data
    with pytest.warns(ConvergenceWarning, match="max_iter") as rec:
        m = pp.PPDNMF(n_components=5, random_state=0, max_iter=6, negative="allow").fit(X)
    assert m.n_iter_ == 6
    assert rec[0].filename == __file__  # at the caller's line, not inside the library
    m = pp.PPDNMF(n_components=5, random_state=0, negative="allow", tol=1e-2).fit(X)
    assert m.n_iter_ < m.max_iter  # stopped on the tolerance


#: fit_transform gives the agents' own coefficients (Algorithm 1's Y_i, each fitted with the
#: agent's own copy X_i); transform projects on the consensus basis. They agree once the run has
#: converged (the slow test below runs every check so); after 3 iterations they do not
UNCONVERGED = {name: "fit_transform equals transform only at convergence (see test_check_estimator_converged)"
               for name in ("check_transformer_general", "check_transformer_data_not_an_array")}


def test_check_estimator():
    """scikit-learn's own checks, on a short run. The graph is a constructor parameter (by
    default a ring of at most ``n_agents`` agents with two samples each at least), so no check
    needs the graph passed to ``fit``."""
    from sklearn.utils.estimator_checks import check_estimator

    small = dict(SMALL, max_iter=3, x_iters=3, y_iters=3, transform_iters=6)
    failed = check_estimator(pp.PPDNMF(**small), on_fail=None, expected_failed_checks=UNCONVERGED)
    bad = [f"{r['check_name']}: {r['exception']}" for r in failed if r["status"] == "failed"]
    assert not bad, bad


@pytest.mark.slow
def test_check_estimator_converged():
    """Every one of scikit-learn's checks, none expected to fail, on converged runs."""
    from sklearn.utils.estimator_checks import check_estimator

    conv = dict(SMALL, max_iter=200, tol=1e-7, x_iters=10, y_iters=10, transform_iters=3000)
    failed = check_estimator(pp.PPDNMF(**conv), on_fail=None)
    bad = [f"{r['check_name']}: {r['exception']}" for r in failed if r["status"] == "failed"]
    assert not bad, bad
