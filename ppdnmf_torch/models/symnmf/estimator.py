"""A scikit-learn-style estimator over :func:`~.fit.fit_symnmf`: :class:`SymmetricNMF`.

Graph clustering by symmetric NMF (docs/SYMMETRIC_NMF.md, "Graph clustering"): the samples'
similarity matrix ``S`` (Kuang et al.'s kNN construction, :mod:`.similarity`, or one given
with ``affinity="precomputed"``) is factorized ``S ~ U U^T`` with ``U >= 0 (n, r)``, and
sample ``i`` gets the label ``argmax_c U[i, c]``. The maths stays in :func:`fit_symnmf`;
the estimator validates once, holds the hyperparameters, and speaks scikit-learn's
clustering vocabulary (``SpectralClustering``'s ``n_clusters`` and ``affinity``, ``fit``,
``fit_predict``, ``labels_``, ``get_params`` / ``set_params``, ``random_state``,
``max_iter``, ``tol``), with ``predict`` for new samples (:mod:`.predict`), ``score`` (the
adjusted Rand index against true labels, so that ``GridSearchCV`` can pick), ``embedding_``
(``U``), ``n_iter_``, ``lambda_``, ``reconstruction_err_`` (``||S - U U^T||_F``, scikit-learn's
meaning), ``relative_err_`` (``E = ||S - U U^T||_F^2 / ||S||_F^2``) and ``affinity_matrix_``.

The start (``init="scaled"``, the default) is i.i.d. uniform on ``[0, 2 sqrt(mean(S) / r)]``
(Kuang et al.'s SymNMF code): the entries of ``U U^T`` then match ``S`` on average, where
the paper's plain uniform ``[0, 1]`` start (``init="uniform"``) is far larger than a
normalized similarity and costs the first iterations. ``n_init`` starts run as one batch
of trials; the one of lowest ``E`` is kept.
"""
from __future__ import annotations

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClusterMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from ... import budget
from ..._utils import sparse_csr
from ...driver import seed_of
from ...driver.progress import FitProgress, check_verbose
from ...errors import ConfigError, DataError
from ...threads import using_threads
from .clustering import cluster_labels
from .config import CLUSTERING, SPEC, ClusteringSpec, SymNMFSpec
from .data import initial_factor
from .fit import fit_symnmf
from .predict import knn_reference, project_rows, query_rows
from .similarity import similarity_matrix

__all__ = ["SymmetricNMF", "scaled_start"]

#: entries of one block of the queries' similarity rows in ``predict``
_PREDICT_BLOCK = 1 << 22


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
    n_clusters : int
        ``r``, the number of clusters (``SpectralClustering``'s name; the rank of ``U``).
    affinity : {"knn", "precomputed"}
        ``"knn"``: ``X`` holds samples (rows) and ``S`` is Kuang et al.'s similarity
        (:func:`~.similarity.similarity_matrix`); ``"precomputed"``: ``X`` is ``S`` itself,
        square, symmetric and nonnegative (dense or ``scipy.sparse``). ``SpectralClustering``'s
        other kernels (``"rbf"``, ``"nearest_neighbors"``) are not offered: Kuang et al.'s
        self-tuned kNN kernel is the one the method's results are for; any other is one
        ``affinity="precomputed"`` away.
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
    threads : int or None
        torch's intra-op threads for ``fit`` and ``predict``, restored after the call (None: the
        package's default, :func:`ppdnmf_torch.threads.default_threads`).
    verbose : int or bool
        0: silent; 1: the fit's progress (a tqdm bar on a terminal, else a line every few
        seconds: iteration, ``E``, ``lambda``, elapsed time, ETA); 2: a line per iteration.

    Attributes
    ----------
    embedding_ : ndarray (n_samples, n_clusters)
        ``U`` of the kept start.
    labels_ : ndarray (n_samples,)
        ``argmax`` of each row of ``embedding_``.
    n_iter_ : int
    lambda_ : float
        The last penalty.
    reconstruction_err_ : float
        ``||S - U U^T||_F`` (``U = embedding_``), as scikit-learn's NMF has it for ``||X - W H||_F``.
    relative_err_ : float
        ``E = ||S - U U^T||_F^2 / ||S||_F^2``, the papers' figure.
    affinity_matrix_ : ndarray or scipy.sparse.csr_matrix (n_samples, n_samples)
        ``S``.
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.datasets import make_blobs
    >>> from ppdnmf_torch import SymmetricNMF
    >>> X, y = make_blobs(90, centers=3, random_state=0)
    >>> model = SymmetricNMF(n_clusters=3, random_state=0).fit(X)
    >>> model.labels_.shape, model.predict(X[:5]).shape
    ((90,), (5,))
    """

    def __init__(self, n_clusters=CLUSTERING.n_clusters, *, affinity=CLUSTERING.affinity,
                 n_neighbors=CLUSTERING.n_neighbors, method=SPEC.method, penalty=SPEC.penalty, init=SPEC.init,
                 n_init=CLUSTERING.n_init, max_iter=SPEC.max_iter, tol=CLUSTERING.tol, random_state=None,
                 device=CLUSTERING.device, dtype=CLUSTERING.dtype, threads=CLUSTERING.threads,
                 verbose=CLUSTERING.verbose):
        self.n_clusters = n_clusters
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
        self.threads = threads
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.pairwise = self.affinity == "precomputed"
        tags.input_tags.sparse = self.affinity == "precomputed"
        tags.input_tags.positive_only = self.affinity == "precomputed"
        return tags

    def _check_params(self):
        """Every parameter through its spec: a wrong type or value is one ``ConfigError`` naming it."""
        dtype = str(self.dtype).removeprefix("torch.") if isinstance(self.dtype, torch.dtype) else self.dtype
        ClusteringSpec(n_clusters=self.n_clusters, affinity=self.affinity, n_neighbors=self.n_neighbors,
                       n_init=self.n_init, tol=self.tol, device=self.device, dtype=dtype, threads=self.threads,
                       verbose=check_verbose(self.verbose))
        SymNMFSpec(method=self.method, penalty=self.penalty, init=self.init, max_iter=self.max_iter)

    def _dtype(self) -> torch.dtype:
        return torch.float32 if self.dtype in ("float32", torch.float32) else torch.float64

    def _similarity(self, X):
        dtype = self._dtype()
        if self.affinity == "knn":
            X = validate_data(self, X, dtype=[np.float64, np.float32], ensure_min_samples=3)
            S = similarity_matrix(X, n_neighbors=self.n_neighbors, device=self.device, dtype=dtype)
            self._reference = knn_reference(torch.as_tensor(np.array(X), dtype=S.dtype, device=S.device),
                                            self.n_neighbors)
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
        self._reference = None
        return S.to(dtype), X

    def fit(self, X, y=None):
        """Factorize the similarity of ``X`` (samples, or ``S`` with ``affinity="precomputed"``).

        ``y`` is ignored. Returns ``self``.
        """
        self._check_params()
        with using_threads(self.threads):
            self._fit(X)
        return self

    def _fit(self, X):
        S, shown = self._similarity(X)
        r = int(self.n_clusters)
        budget.check(budget.symnmf(n=S.shape[0], rank=r, trials=int(self.n_init),
                                   nnz=int(S.values().numel()) if S.layout == torch.sparse_csr else None,
                                   max_iter=int(self.max_iter), dtype=S.dtype, device=S.device, similarity_copies=0,
                                   key_n="X", key_trials="n_init"))
        seed = seed_of(self.random_state)
        U0 = scaled_start(S, r, int(self.n_init), seed, self.init)
        progress = FitProgress(self.verbose, int(self.max_iter), "SymmetricNMF")
        try:
            res = fit_symnmf(S, r, method=self.method, penalty=self.penalty, U0=U0, trials=int(self.n_init),
                             seed=seed, max_iter=int(self.max_iter), tol=float(self.tol), device=self.device,
                             dtype=S.dtype, callback=progress.wrap(None, _shown))
        except BaseException:
            progress.close()
            raise
        best = res.best_trial()
        progress.done(int(res.n_iter[best]), {"E": float(res.E[best])})
        U = res.U[best]
        self.embedding_ = U.detach().cpu().numpy()
        self.labels_ = cluster_labels(U).cpu().numpy()
        self.n_iter_ = int(res.n_iter[best])
        self.lambda_ = float(res.lam[best])
        self.relative_err_ = float(res.E[best])
        self.reconstruction_err_ = _frobenius_gap(S, U.to(S.dtype))
        self.affinity_matrix_ = self._shown(S) if self.affinity == "knn" else shown

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

    def predict(self, X):
        """The clusters of new samples on the fitted ``U`` (:mod:`.predict`).

        Parameters
        ----------
        X : array-like (n_queries, n_features), or with ``affinity="precomputed"`` the
            similarities ``(n_queries, n_samples_fit)`` of the queries to the fitted samples.

        Returns
        -------
        labels : ndarray (n_queries,)
            ``argmax`` of the query's nonnegative projection ``w`` on ``U``; a query with no
            similarity to any fitted sample takes its nearest fitted sample's label
            (``affinity="knn"``) or cluster 0.
        """
        check_is_fitted(self, "embedding_")
        self._check_params()
        with using_threads(self.threads):
            return self._predict(X)

    def _predict(self, X):
        knn = self.affinity == "knn"
        # n_features_in_ is, under "precomputed", the fitted samples' count: another number of columns is refused
        X = validate_data(self, X, accept_sparse=False if knn else "csr", dtype=[np.float64, np.float32], reset=False)
        U = torch.as_tensor(self.embedding_)
        step = max(1, _PREDICT_BLOCK // U.shape[0])  # queries per block: their rows are (step, n_samples)
        out = []
        for lo in range(0, X.shape[0], step):
            part = X[lo:lo + step]
            if knn:
                ref = self._reference
                rows, nearest = query_rows(ref, torch.as_tensor(np.array(part), dtype=ref.M.dtype, device=ref.M.device))
                fallback = torch.as_tensor(self.labels_)[nearest.cpu()]
            else:
                rows = torch.as_tensor(part.toarray() if hasattr(part, "toarray") else np.array(part))
                fallback = torch.zeros(rows.shape[0], dtype=torch.long)
            W = project_rows(rows.to(device=U.device, dtype=U.dtype), U)
            out.append(torch.where(W.amax(1) > 0, W.argmax(1), fallback.to(W.device)).cpu())
        return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)

    def score(self, X, y=None) -> float:
        """The adjusted Rand index of :meth:`predict` against the true labels ``y`` (1: the same
        partition; about 0: chance), so that ``GridSearchCV(SymmetricNMF(), grid)`` with ``y``
        picks the best clustering; ``scoring="adjusted_rand_score"`` gives the same.

        Raises
        ------
        ConfigError
            Naming ``y`` when it is None (a clustering has no score without labels to compare).
        """
        from sklearn.metrics import adjusted_rand_score

        if y is None:
            raise ConfigError("y: SymmetricNMF.score compares the clusters with true labels (the adjusted Rand "
                              "index): give y")
        return float(adjusted_rand_score(np.asarray(y), self.predict(X)))


def _shown(info) -> tuple:
    """What ``verbose`` shows of an iteration: ``E`` and ``lambda`` of the best start."""
    E = info.metrics["E"]
    best = int(torch.argmin(E))
    return info.k, {"E": float(E[best]), "lambda": float(info.metrics["lam"][best])}


def _frobenius_gap(S: torch.Tensor, U: torch.Tensor) -> float:
    """``||S - U U^T||_F`` from ``||S||^2 - 2 <S, U U^T> + ||U^T U||^2`` (no ``n x n`` product for a sparse ``S``)."""
    SU = S @ U  # (n, r)
    ss = S.values().square().sum() if S.layout == torch.sparse_csr else S.square().sum()
    UtU = U.T @ U
    return float((ss - 2.0 * (U * SU).sum() + UtU.square().sum()).clamp_min(0.0).sqrt())
