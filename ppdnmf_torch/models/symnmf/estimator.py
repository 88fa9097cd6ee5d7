"""A scikit-learn-style estimator over :func:`~.fit.fit_symnmf`: :class:`SymmetricNMF`.

Graph clustering by symmetric NMF (docs/SYMMETRIC_NMF.md, "Graph clustering"): the samples'
similarity matrix ``S`` (Kuang et al.'s kNN construction, :mod:`.similarity`, or one given
with ``affinity="precomputed"``) is factorized ``S ~ U U^T`` with ``U >= 0 (n, r)``, and
sample ``i`` gets the label ``argmax_c U[i, c]``. The maths stays in :func:`fit_symnmf`;
the estimator validates once, holds the hyperparameters, and exposes scikit-learn's
clusterer conventions (``fit``, ``fit_predict``, ``labels_``, ``get_params`` /
``set_params``, ``random_state``, ``max_iter``, ``tol``), with ``embedding_`` (``U``),
``n_iter_``, ``lambda_``, ``reconstruction_err_`` (``E = ||S - U U^T||_F^2 / ||S||_F^2``)
and ``affinity_matrix_``.

The start (``init="scaled"``, the default) is i.i.d. uniform on ``[0, 2 sqrt(mean(S) / r)]``
(Kuang et al.'s SymNMF code): the entries of ``U U^T`` then match ``S`` on average, where
the paper's plain uniform ``[0, 1]`` start (``init="uniform"``) is far larger than a
normalized similarity and costs the first iterations. ``n_init`` starts run as one batch
of trials; the one of lowest ``E`` is kept.
"""
from __future__ import annotations

import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.utils.validation import validate_data

from ... import budget
from ..._utils import sparse_csr
from ...driver import seed_of
from ...errors import ConfigError, DataError
from .clustering import cluster_labels
from .config import CLUSTERING, SPEC, ClusteringSpec, SymNMFSpec
from .data import initial_factor
from .fit import fit_symnmf
from .similarity import similarity_matrix

__all__ = ["SymmetricNMF", "scaled_start"]



def scaled_start(S: torch.Tensor, rank: int, trials: int, seed: int, kind: str = "scaled") -> torch.Tensor:
    """Starts ``U_0 (trials, n, rank)``, i.i.d. uniform on ``[0, c]``: ``c = 2 sqrt(mean(S) / rank)``
    (``"scaled"``) or ``c = 1`` (``"uniform"``, the paper's), by
    :func:`~.data.initial_factor` (trial ``t`` from its own stream of ``seed``)."""
    n = S.shape[0]
    c = 1.0
    if kind == "scaled":
        total = S.values().sum() if S.layout == torch.sparse_csr else S.sum()
        c = 2.0 * float(total / (n * n) / rank) ** 0.5
    return initial_factor(n, rank, trials=trials, seed=seed, scale=c, device=S.device, dtype=S.dtype)


def _as_similarity(S):
    """A precomputed similarity as a torch tensor (dense, or sparse CSR for scipy.sparse input)."""
    if hasattr(S, "tocsr"):
        S = S.tocsr()
        S.sum_duplicates()
        return sparse_csr(torch.as_tensor(S.indptr, dtype=torch.long), torch.as_tensor(S.indices, dtype=torch.long),
                          torch.as_tensor(S.data), S.shape[0])
    return torch.as_tensor(np.array(S))  # a copy: the input may be read-only


class SymmetricNMF(ClusterMixin, BaseEstimator):
    """Graph clustering by symmetric NMF, ``S ~ U U^T``, solved by splitting (SymHALS & co.).

    Parameters
    ----------
    n_components : int
        ``r``, the number of clusters.
    affinity : {"knn", "precomputed"}
        ``"knn"``: ``X`` holds samples (rows) and ``S`` is Kuang et al.'s similarity
        (:func:`~.similarity.similarity_matrix`); ``"precomputed"``: ``X`` is ``S`` itself,
        square, symmetric and nonnegative (dense or ``scipy.sparse``).
    n_neighbors : int, optional
        ``kk`` of the kNN graph (default ``floor(log2 n) + 1``).
    method : str
        The solver (:func:`fit_symnmf`'s ``method``): ``"symhals"``, ``"a_symhals"``,
        ``"symanls"`` or a baseline.
    penalty : "adaptive", "bound", "kuang", float or None
        ``lambda`` (:func:`fit_symnmf`'s ``penalty``; None: the method's default, the
        adaptive rule (20) for the split methods).
    init : {"scaled", "uniform"}
        The start (:func:`scaled_start`).
    n_init : int
        Starts run as one batch; the lowest ``E`` is kept.
    max_iter : int
    tol : float
        :func:`fit_symnmf`'s stopping tolerance.
    random_state : int >= 0, numpy RandomState / Generator or None
        The starts' seed (:func:`~ppdnmf_torch.driver.seed_of`, as every estimator of the library
        reads it).
    device : {"auto", "cpu", "cuda"}
    dtype : {"float64", "float32"} or None
        None: float64.

    Attributes
    ----------
    embedding_ : ndarray (n_samples, n_components)
        ``U`` of the kept start.
    labels_ : ndarray (n_samples,)
        ``argmax`` of each row of ``embedding_``.
    n_iter_ : int
    lambda_ : float
        The last penalty.
    reconstruction_err_ : float
        ``||S - U U^T||_F^2 / ||S||_F^2``.
    affinity_matrix_ : ndarray or scipy.sparse.csr_matrix (n_samples, n_samples)
        ``S``.
    n_features_in_ : int
    """

    def __init__(self, n_components=CLUSTERING.n_components, *, affinity=CLUSTERING.affinity,
                 n_neighbors=CLUSTERING.n_neighbors, method=SPEC.method, penalty=SPEC.penalty, init=SPEC.init,
                 n_init=CLUSTERING.n_init, max_iter=SPEC.max_iter, tol=CLUSTERING.tol, random_state=None,
                 device=CLUSTERING.device, dtype=CLUSTERING.dtype):
        self.n_components = n_components
        self.affinity = affinity
        self.n_neighbors = n_neighbors
        self.method = method
        self.penalty = penalty
        self.init = init
        self.n_init = n_init
        self.max_iter = max_iter
        self.tol = tol
        self.random_state = random_state
        self.device = device
        self.dtype = dtype

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = self.affinity == "precomputed"
        tags.input_tags.sparse = self.affinity == "precomputed"
        tags.input_tags.positive_only = self.affinity == "precomputed"
        return tags

    def _check_params(self):
        """Every parameter through its spec: a wrong type or value is one ``ConfigError`` naming it."""
        dtype = str(self.dtype).removeprefix("torch.") if isinstance(self.dtype, torch.dtype) else self.dtype
        ClusteringSpec(n_components=self.n_components, affinity=self.affinity, n_neighbors=self.n_neighbors,
                       n_init=self.n_init, tol=self.tol, device=self.device, dtype=dtype)
        SymNMFSpec(method=self.method, penalty=self.penalty, init=self.init, max_iter=self.max_iter)

    def _similarity(self, X):
        dtype = torch.float32 if self.dtype in ("float32", torch.float32) else torch.float64
        if self.affinity == "knn":
            X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=3)
            S = similarity_matrix(X, n_neighbors=self.n_neighbors, device=self.device, dtype=dtype)
            return S, S
        X = validate_data(self, X, accept_sparse="csr", dtype=[np.float64, np.float32], ensure_min_samples=2)
        if X.shape[0] != X.shape[1]:
            raise DataError(f"X: affinity='precomputed' needs a square similarity matrix, got shape {X.shape}")
        data = X.data if hasattr(X, "data") and hasattr(X, "indptr") else X
        if (data < 0).any():
            raise DataError("X: Negative values in data passed to SymmetricNMF: a precomputed similarity must be "
                            "nonnegative")
        asym = abs(X - X.T)
        asym = asym.max() if not hasattr(asym, "toarray") else (asym.data.max() if asym.nnz else 0.0)
        if asym > 1e-8 * max(float(abs(data).max()) if data.size else 0.0, 1.0):
            raise DataError("X: a precomputed similarity must be symmetric")
        S = _as_similarity(X)
        return S.to(dtype), X

    def fit(self, X, y=None):
        """Factorize the similarity of ``X`` (samples, or ``S`` with ``affinity="precomputed"``).

        ``y`` is ignored. Returns ``self``.
        """
        self._check_params()
        S, shown = self._similarity(X)
        budget.check(budget.symnmf(n=S.shape[0], rank=int(self.n_components), trials=int(self.n_init),
                                   nnz=int(S.values().numel()) if S.layout == torch.sparse_csr else None,
                                   max_iter=int(self.max_iter), dtype=S.dtype, device=S.device, similarity_copies=0,
                                   key_n="X", key_trials="n_init"))
        seed = seed_of(self.random_state)
        U0 = scaled_start(S, int(self.n_components), int(self.n_init), seed, self.init)
        res = fit_symnmf(S, int(self.n_components), method=self.method, penalty=self.penalty, U0=U0,
                         trials=int(self.n_init), seed=seed, max_iter=int(self.max_iter), tol=float(self.tol),
                         device=self.device, dtype=S.dtype)
        best = res.best_trial()
        self.embedding_ = res.U[best].detach().cpu().numpy()
        self.labels_ = cluster_labels(res.U[best]).cpu().numpy()
        self.n_iter_ = int(res.n_iter[best])
        self.lambda_ = float(res.lam[best])
        self.reconstruction_err_ = float(res.E[best])
        self.affinity_matrix_ = self._shown(S) if self.affinity == "knn" else shown
        return self

    @staticmethod
    def _shown(S):
        if S.layout == torch.sparse_csr:
            import scipy.sparse as sp

            n = S.shape[0]
            return sp.csr_matrix((S.values().cpu().numpy(), S.col_indices().cpu().numpy(),
                                  S.crow_indices().cpu().numpy()), shape=(n, n))
        return S.cpu().numpy()

    def fit_predict(self, X, y=None):
        """``fit(X)`` and return ``labels_``."""
        return self.fit(X).labels_
