"""``FederatedSparsePCA``: FSSPCA as a scikit-learn estimator (``sklearn.decomposition.SparsePCA``'s
attributes, the workers given by ``groups`` or as a list of row blocks).

A thin layer over :func:`.fit.fit_fsspca`: parameters are stored as given, validated once in
``fit``; NumPy in, NumPy out.
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from ...driver import seed_of
from ...driver.progress import FitProgress, check_verbose
from ...errors import ConfigError, DataError
from ...exchange.aggregation import Aggregator
from ...threads import using_threads
from .data import split_iid
from .config import ESTIMATOR, SPEC, EstimatorSpec, FSSPCASpec
from .fit import fit_fsspca
from .server_host import PLANS

__all__ = ["FederatedSparsePCA"]


def _shown(info) -> tuple:
    """What ``verbose`` shows of an ADMM iteration: the first trial's objective, explained
    variance and consensus."""
    v = info.values
    return info.iteration, {k.replace("_", " "): float(v[k][0]) for k in ("objective", "explained_variance",
                                                                          "consensus") if k in v}


def _checked_groups(groups, n: int) -> np.ndarray:
    """``groups`` as an array of ``n`` labels, or one ``DataError`` naming ``groups``."""
    try:
        g = np.asarray(groups)
    except (TypeError, ValueError) as exc:
        raise DataError(f"groups: cannot read as an array of worker labels ({exc})") from None
    if g.ndim != 1 or g.shape[0] != n:
        raise DataError(f"groups: must give one worker label per row of X, {n} in all, got shape {g.shape}")
    if g.dtype.kind not in "biuUSO" or (g.dtype.kind == "O" and not all(isinstance(x, (str, int)) for x in g)):
        raise DataError(f"groups: worker labels must be integers or strings, got dtype {g.dtype}")
    return g


def _is_blocks(X) -> bool:
    return isinstance(X, (list, tuple)) and len(X) > 0 and all(np.ndim(b) == 2 for b in X)


class FederatedSparsePCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Federated sparse PCA (FSSPCA): sparse loadings of rows held by several workers, found
    by consensus ADMM on the Stiefel manifold (docs/FSSPCA.md).

    Parameters
    ----------
    n_components : int or None
        ``r``, the number of loadings (None: every feature).
    alpha : float
        The weight of ``||z||_1`` relative to the data: ``lambda_1 = alpha sum_i lambda_max(C_i)``
        (``alpha_scale="gram"`` of :func:`.fit.fit_fsspca`), so one ``alpha`` means the same
        sparsity at any scale of the data (the default: docs/FSSPCA.md, "The estimator's alpha").
    lambda_2 : float or None
        The smooth term's weight; None follows ``alpha`` (``alpha / K``).
    smoothing : {"sqrt", "huber", "logexp", "erf"}
    mu : float
    rho : float, "auto" or "worker"
        One penalty (``"auto"``: from the workers' mean largest eigenvalue) or each worker its
        own (``"worker"``); :func:`.fit.fit_fsspca`.
    line_search : {"armijo", "wolfe"}
        The Riemannian local solver's line search.
    inner_steps : int
        Local steps per worker per ADMM iteration (4: docs/FSSPCA.md, "Many small workers").
    local_solver : {"polar", "riemannian"}
        A worker's step: majorize-minimize polar steps or the paper's Riemannian steps
        (:func:`.fit.fit_fsspca`; docs/FSSPCA.md, "The polar step").
    aggregation : {"plain", "quantized", "paillier", "secagg"} or an aggregator
        How the server sums the workers' uploads (:func:`.fit.fit_fsspca`).
    n_workers : int
        Workers of an IID split when ``fit`` gets one array without ``groups``.
    max_iter : int
        ADMM iterations at most (1000, ``SparsePCA``'s; the functions' default is 500).
    tol : float
        As :func:`.fit.fit_fsspca`'s.
    random_state : int >= 0, numpy RandomState / Generator or None
        The start and the IID split: an integer is the seed of :func:`.fit.fit_fsspca` itself
        (:func:`~ppdnmf_torch.driver.seed_of`, as every estimator of the library reads it).
    device : {"cpu", "cuda", "auto"}
    dtype : {"float64", "float32"}
    threads : int or None
        torch's intra-op threads for ``fit``, restored after it (None: the package's default,
        :func:`ppdnmf_torch.threads.default_threads`).
    plan : {"auto", "torch", "host"}
        How the iterations run (:func:`.fit.fit_fsspca`'s; ``"auto"``: on NumPy arrays on the CPU
        with the polar solver, docs/FSSPCA.md, "The host plan"); ``result_.plan`` says which ran.
    verbose : int or bool
        0: silent; 1: the fit's progress (a tqdm bar on a terminal, else a line every few
        seconds: ADMM iteration, objective, explained variance, consensus, elapsed time, ETA);
        2: a line per iteration.

    Attributes
    ----------
    components_ : ndarray (r, d)
        The sparse consensus loadings ``z^T``.
    orthonormal_components_ : ndarray (r, d)
        ``qf(z)^T``.
    mean_ : ndarray (d,)
        The global mean (a secure sum).
    explained_variance_ : ndarray (r,)
        Each loading's adjusted variance (Zou et al.), divided by ``n - 1``.
    explained_variance_ratio_ : ndarray (r,)
        The same over the total variance.
    n_components_, n_iter_, n_workers_, n_features_in_ : int
    result_ : FSSPCAResult
    """

    def __init__(self, n_components=ESTIMATOR.n_components, *, alpha=ESTIMATOR.alpha, lambda_2=SPEC.lambda_2,
                 smoothing=SPEC.smoothing, mu=SPEC.mu, rho=SPEC.rho, line_search=SPEC.line_search,
                 inner_steps=SPEC.inner_steps, local_solver=SPEC.local_solver, aggregation=SPEC.aggregation,
                 n_workers=ESTIMATOR.n_workers, max_iter=ESTIMATOR.max_iter, tol=SPEC.tol, random_state=None,
                 device=ESTIMATOR.device, dtype=ESTIMATOR.dtype, threads=ESTIMATOR.threads, verbose=ESTIMATOR.verbose,
                 plan="auto"):
        self.n_components = n_components
        self.alpha = alpha
        self.lambda_2 = lambda_2
        self.smoothing = smoothing
        self.mu = mu
        self.rho = rho
        self.line_search = line_search
        self.inner_steps = inner_steps
        self.local_solver = local_solver
        self.aggregation = aggregation
        self.n_workers = n_workers
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device
        self.dtype = dtype
        self.threads = threads
        self.verbose = verbose
        self.plan = plan

    def fit(self, X, y=None, groups=None, callback=None):
        """Fit on ``X (n, d)`` with ``groups (n,)`` (each row's worker), or on a list of the
        workers' row blocks ``[(n_i, d), ...]``; ``y`` is ignored. ``callback`` as
        :func:`.fit.fit_fsspca`'s (True stops the run)."""
        self._check_params()
        with using_threads(self.threads):
            return self._fit(X, groups, callback)

    def _fit(self, X, groups, callback):
        seed = seed_of(self.random_state)
        if _is_blocks(X):
            if groups is not None:
                raise ConfigError("groups: give either a list of blocks or an array with groups, not both")
            blocks = [check_array(b, dtype=np.float64) for b in X]
            d = blocks[0].shape[1]
            validate_data(self, np.zeros((1, d)), reset=True)
        else:
            A = validate_data(self, X, dtype=np.float64, ensure_min_samples=2)
            if groups is None:
                k = int(self.n_workers)
                if not 1 <= k <= A.shape[0]:
                    raise ConfigError(f"n_workers: must be in 1..{A.shape[0]} (the number of rows), got {k}")
                groups = split_iid(A.shape[0], k, seed=seed)
            groups = _checked_groups(groups, A.shape[0])
            blocks = [A[groups == g] for g in np.unique(groups)]
            d = A.shape[1]
        r = d if self.n_components is None else self.n_components
        progress = FitProgress(self.verbose, int(self.max_iter), "FederatedSparsePCA", step="ADMM iteration")
        try:
            with torch.no_grad():
                res = fit_fsspca(blocks, r, alpha=self.alpha, lambda_2=self.lambda_2, smoothing=self.smoothing,
                                 mu=self.mu, rho=self.rho, line_search=self.line_search,
                                 inner_steps=self.inner_steps, local_solver=self.local_solver, alpha_scale="gram",
                                 aggregation=self.aggregation, max_iter=self.max_iter, tol=self.tol, seed=seed,
                                 device=self.device, dtype=self.dtype, callback=progress.wrap(callback, _shown),
                                 plan=self.plan)
        except BaseException:
            progress.close()
            raise
        progress.done(int(res.n_iter[0]))
        n = sum(b.shape[0] for b in blocks)
        var = res.variance_components[0].cpu().numpy().astype(np.float64)
        self.components_ = res.z[0].T.cpu().numpy().astype(np.float64)
        self.orthonormal_components_ = res.components[0].T.cpu().numpy().astype(np.float64)
        self.mean_ = res.mean.cpu().numpy().astype(np.float64)
        total = float(res.total_variance[0])
        self.explained_variance_ = var / max(n - 1, 1)
        self.explained_variance_ratio_ = var / total if total > 0 else np.zeros_like(var)
        self.n_components_ = r
        self.n_iter_ = int(res.n_iter[0])
        self.n_workers_ = len(blocks)
        self.result_ = res
        return self

    def _check_params(self):
        """Every parameter through its spec: a wrong type or value is one ``ConfigError`` naming it
        (an aggregator object is checked by the fit)."""
        dtype = str(self.dtype).removeprefix("torch.") if isinstance(self.dtype, torch.dtype) else self.dtype
        EstimatorSpec(n_components=self.n_components, alpha=self.alpha, n_workers=self.n_workers, device=self.device,
                      dtype=dtype, threads=self.threads, verbose=check_verbose(self.verbose))
        if not isinstance(self.plan, str) or self.plan not in PLANS:
            raise ConfigError(f"plan: must be one of {list(PLANS)}, got {self.plan!r}")
        if not isinstance(self.aggregation, (str, Aggregator)):
            raise ConfigError(f"aggregation: must be one of the kinds' names or an aggregator, got "
                              f"{self.aggregation!r} ({type(self.aggregation).__name__})")
        FSSPCASpec(lambda_2=self.lambda_2, smoothing=self.smoothing, mu=self.mu, rho=self.rho,
                   line_search=self.line_search, inner_steps=self.inner_steps, local_solver=self.local_solver,
                   max_iter=self.max_iter, tol=self.tol,
                   aggregation=self.aggregation if isinstance(self.aggregation, str) else SPEC.aggregation)

    def transform(self, X):
        """Scores ``(n, r)``: least squares of ``X - mean_`` on ``components_`` (``SparsePCA``'s
        rule; the orthogonal projection when the loadings are orthonormal)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return (X - self.mean_) @ np.linalg.pinv(self.components_)

    def inverse_transform(self, X):
        """``scores @ components_ + mean_``."""
        check_is_fitted(self)
        return np.asarray(X, dtype=np.float64) @ self.components_ + self.mean_

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

