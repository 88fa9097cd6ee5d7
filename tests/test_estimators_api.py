"""What the three estimators say they do (issue 43): ``reconstruction_err_`` as scikit-learn means
it, ``verbose`` and ``threads`` on each, ``SymmetricNMF``'s clustering vocabulary and its scorer
path in ``GridSearchCV``, and one ``ConfigError`` naming the parameter for each bad parameter."""
from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.errors import ConfigError, DataError

#: short fits: these tests are about the estimators' API, not their convergence
QUICK = {
    pp.PPDNMF: dict(n_components=3, max_iter=3, x_iters=3, y_iters=3, transform_iters=6, random_state=0),
    pp.SymmetricNMF: dict(n_clusters=3, max_iter=5, random_state=0),
    pp.FederatedSparsePCA: dict(n_components=2, max_iter=3, n_workers=3, random_state=0),
}
ESTIMATORS = list(QUICK)


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the short fits' ConvergenceWarning
        return fn(*args, **kwargs)


@pytest.fixture(scope="module")
def X():
    return np.random.default_rng(0).random((40, 6))


# -- reconstruction_err_ ----------------------------------------------------------------------

@pytest.mark.parametrize("negative,shift", [("error", 0.0), ("clip", -0.2), ("shift", -0.2), ("allow", -0.2)])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_ppdnmf_reconstruction_err_is_that_of_fit_transform_and_components(X, negative, shift, as_tensor):
    Xin = X + shift
    Xin = torch.as_tensor(Xin) if as_tensor else Xin
    m = pp.PPDNMF(negative=negative, **QUICK[pp.PPDNMF])
    W = _quiet(m.fit_transform, Xin)
    Xf = np.asarray(Xin)
    if negative == "clip":
        Xf = np.clip(Xf, 0, None)
    elif negative == "shift":
        Xf = Xf - Xf.min()
    rebuilt = np.linalg.norm(Xf - np.asarray(W) @ np.asarray(m.components_))
    assert m.reconstruction_err_ == pytest.approx(rebuilt, rel=1e-9)  # the same sum, another order
    # the agents' own copies of the basis: what the run minimized; after 3 iterations the copies
    # still differ, so the two figures differ
    # (result_ is the fit of X / scale_)
    blocks = np.split(Xf / m.scale_, np.cumsum(m.result_.columns)[:-1])
    own = m.scale_ * np.sqrt(sum(np.linalg.norm(b - (m.result_.X[i] @ m.result_.Y[i]).T.numpy()) ** 2
                                 for i, b in enumerate(blocks)))
    assert m.agent_reconstruction_err_ == pytest.approx(own, rel=1e-9)
    assert abs(m.agent_reconstruction_err_ - m.reconstruction_err_) > 1e-9 * m.reconstruction_err_


def test_symmetric_nmf_reconstruction_err_is_that_of_the_embedding(X):
    m = _quiet(pp.SymmetricNMF(**QUICK[pp.SymmetricNMF]).fit, X)
    S, U = m.affinity_matrix_, m.embedding_
    assert m.reconstruction_err_ == pytest.approx(np.linalg.norm(S - U @ U.T), rel=1e-9)
    assert m.relative_err_ == pytest.approx(np.linalg.norm(S - U @ U.T) ** 2 / np.linalg.norm(S) ** 2, rel=1e-9)


# -- verbose and threads ----------------------------------------------------------------------

@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_verbose_reports_on_stderr_and_silent_by_default(cls, X, capsys):
    _quiet(cls(**QUICK[cls]).fit, X)
    assert capsys.readouterr() == ("", "")
    m = _quiet(cls(verbose=2, **QUICK[cls]).fit, X)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    # a line per iteration, and one more when the run stopped before its cap
    last = (f" {m.n_iter_}/{m.max_iter}," if m.n_iter_ == m.max_iter
            else f"{cls.__name__}: stopped after {m.n_iter_} ")
    assert out == "" and len(lines) == m.n_iter_ + (m.n_iter_ < m.max_iter), lines
    assert lines[0].startswith(f"{cls.__name__}: ") and f" 1/{m.max_iter}," in lines[0] and "elapsed" in lines[0]
    assert last in lines[-1]
    _quiet(cls(verbose=True, **QUICK[cls]).fit, X)  # off a terminal: the first line and the last
    lines = capsys.readouterr().err.strip().splitlines()
    assert 2 <= len(lines) <= 3 and f" 1/{m.max_iter}," in lines[0] and last in lines[-1], lines


_FIT_OF = {pp.PPDNMF: "ppdnmf_torch.models.ppdnmf.estimator.fit",
           pp.SymmetricNMF: "ppdnmf_torch.models.symnmf.estimator.fit_symnmf",
           pp.FederatedSparsePCA: "ppdnmf_torch.models.fsspca.estimator.fit_fsspca"}


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_threads_hold_for_the_fit_and_are_restored(cls, X, monkeypatch):
    import importlib

    module, name = _FIT_OF[cls].rsplit(".", 1)
    mod = importlib.import_module(module)
    real, seen = getattr(mod, name), []

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, name, spy)
    before = torch.get_num_threads()
    want = 2 if before != 2 else 1
    _quiet(cls(threads=want, **QUICK[cls]).fit, X)
    assert seen == [want] and torch.get_num_threads() == before


# -- SymmetricNMF: a clusterer in scikit-learn's words ------------------------------------------

@pytest.fixture(scope="module")
def blobs():
    from sklearn.datasets import make_blobs

    return make_blobs(150, centers=3, cluster_std=0.8, random_state=0)


def test_symmetric_nmf_in_grid_search_with_a_clustering_scorer(blobs):
    from sklearn.model_selection import GridSearchCV

    X, y = blobs
    kw = dict(random_state=0, max_iter=100)
    for scoring in ("adjusted_rand_score", None):  # the scorer, and the estimator's own score
        grid = _quiet(GridSearchCV(pp.SymmetricNMF(**kw), {"n_clusters": [2, 3]}, scoring=scoring, cv=3).fit,
                      X, y)
        scores = grid.cv_results_["mean_test_score"]
        assert np.isfinite(scores).all() and grid.best_params_ == {"n_clusters": 3}, scores
        assert grid.best_score_ > 0.8


def test_symmetric_nmf_predict_and_score(blobs):
    from sklearn.metrics import adjusted_rand_score

    X, y = blobs
    m = _quiet(pp.SymmetricNMF(3, random_state=0, max_iter=100).fit, X)
    assert m.get_params()["n_clusters"] == 3
    assert (m.predict(X) == m.labels_).mean() > 0.95  # fitted samples keep (almost all) their labels
    new = X[:10] + 0.01
    assert np.array_equal(m.predict(new), m.labels_[:10])  # a sample next to a fitted one joins it
    assert m.score(X, y) == pytest.approx(adjusted_rand_score(y, m.predict(X)))
    np.testing.assert_array_equal(m.predict(X[::-1])[::-1], m.predict(X))  # one sample at a time
    with pytest.raises(ConfigError) as info:
        m.score(X)
    assert info.value.key == "y"
    pre = _quiet(pp.SymmetricNMF(3, affinity="precomputed", random_state=0, max_iter=100).fit, m.affinity_matrix_)
    assert np.array_equal(pre.predict(m.affinity_matrix_[:20]), pre.predict(m.affinity_matrix_)[:20])
    with pytest.raises(ValueError, match="20 features, but SymmetricNMF is expecting 150"):
        pre.predict(m.affinity_matrix_[:, :20])


# -- one clear line for every bad parameter -----------------------------------------------------

#: every parameter of every estimator: (a value of the wrong type, a wrong value of the right
#: type or None where the type admits none)
BAD = {
    pp.PPDNMF: dict(
        n_components=("3", 0), graph=("ring", np.ones((2, 3))), n_agents=(2.5, 0), columns=("all", [0] * 10),
        init=(3, "zeros"), random_state=("x", -1), max_iter=(2.5, 0), tol=("0", -1.0), mu=("big", 0.0),
        eta=("big", -1.0), g_max=("big", 0.0), x_iters=(2.5, 0), y_iters=(2.5, 0), admm_tol=("x", -1.0),
        exchange=(3, "secret"), protocol=(3, "nope"), n_max=("x", -1.0), key_bits=("x", 12), g_bits=("x", -1),
        penalty=(3, "sometimes"), penalty_schedule=(3, "never"), y_solver=(3, "lbfgs"), negative=(3, "ignore"),
        min_degree=("x", 0), device=(3, "tpu"), dtype=([1], "int8"), fuse=("yes", None), threads=("2", 0),
        exchange_options=("x", {"bogus": 1}), transform_iters=(2.5, 0), transform_tol=("x", -1.0),
        scale=([1], 0.0), verbose=("x", -1)),
    pp.SymmetricNMF: dict(
        n_clusters=("3", 0), affinity=(3, "rbf"), n_neighbors=("x", 0), method=(3, "nmf"), penalty=({}, -1.0),
        init=(3, "zeros"), n_init=(2.5, 0), max_iter=(2.5, 0), tol=("0", -1.0), random_state=("x", -1),
        device=(3, "tpu"), dtype=([1], "float16"), threads=("2", 0), verbose=("x", -1)),
    pp.FederatedSparsePCA: dict(
        n_components=("3", 0), alpha=("big", -1.0), lambda_2=("x", -1.0), smoothing=(3, "cubic"), mu=("x", 0.0),
        rho=({}, "server"), line_search=(3, "exact"), inner_steps=(2.5, 0), local_solver=(3, "newton"),
        aggregation=(3, "secret"), n_workers=(2.5, 0), max_iter=(2.5, 0), tol=("0", -1.0), random_state=("x", -1),
        device=(3, "tpu"), dtype=([1], "float16"), threads=("2", 0), verbose=("x", -1), plan=(3, "gpu")),
}
CASES = [(cls, name, kind, bad[i]) for cls, table in BAD.items() for name, bad in table.items()
         for i, kind in enumerate(("type", "value")) if not (kind == "value" and bad[i] is None)]


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_the_table_names_every_parameter(cls):
    params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    assert sorted(BAD[cls]) == sorted(params)


@pytest.mark.parametrize("cls,name,kind,value", CASES,
                         ids=[f"{c.__name__}.{n}-{k}" for c, n, k, _ in CASES])
def test_a_bad_parameter_is_one_config_error_naming_it_at_fit(cls, name, kind, value, X):
    kw = dict(QUICK[cls])
    kw[name] = value
    est = cls(**kw)  # scikit-learn's rule: construction stores, fit checks
    with pytest.raises(ConfigError) as info:
        _quiet(est.fit, X)
    assert info.value.key.split("[")[0].split(".")[0] == name, str(info.value)
    assert "\n" not in str(info.value)


def test_fsspca_groups_of_the_wrong_length_are_one_data_error(X):
    for groups in ([0, 1], np.zeros((1, 40)), np.full(40, 0.5)):
        with pytest.raises(DataError) as info:
            pp.FederatedSparsePCA(**QUICK[pp.FederatedSparsePCA]).fit(X, groups=groups)
        assert info.value.key == "groups"


def test_the_bar_on_a_terminal_keeps_warnings_above_it(X):
    """``verbose=1`` on a terminal draws a tqdm bar; a warning during the fit is written above it
    (its own line), and ``warnings.showwarning`` is the caller's again afterwards."""
    import io

    from ppdnmf_torch.driver.progress import FitProgress

    before = warnings.showwarning
    buf = io.StringIO()
    bar = FitProgress(1, 5, "Test", file=buf, bar=True)
    for k in range(1, 4):
        bar.update(k, {"E": 0.5 / k})
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("cut short", UserWarning)
    bar.done(3)
    text = buf.getvalue()
    assert "3/5" in text and "UserWarning: cut short\n" in text
    assert warnings.showwarning is before and bar.bar is None


def test_verbose_says_when_a_fit_stops_before_its_cap(X, capsys):
    m = pp.SymmetricNMF(3, tol=0.05, max_iter=500, random_state=0, verbose=1).fit(X)
    lines = capsys.readouterr().err.strip().splitlines()
    assert m.n_iter_ < 500 and lines[-1].startswith(f"SymmetricNMF: stopped after {m.n_iter_} iterations, E ")
