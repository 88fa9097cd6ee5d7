"""Each estimator with its defaults beside its scikit-learn neighbour (issue 40, "defaults that
finish on real data"): PPDNMF and ``NMF``, SymmetricNMF and ``SpectralClustering``,
FederatedSparsePCA and ``SparsePCA``, on scikit-learn's digits and (the two NMF models) ORL (the NMF pair at rank ``--orl-rank``, 20 by
default; the clustering pair at the 40 subjects).

One JSON object per line on stdout: ``data``, ``estimator``, ``seconds``, ``metric`` (its
name), ``value``, ``sparsity`` (share of zeros in the components, or null), ``n_iter``,
``max_iter`` and ``converged`` (no ``ConvergenceWarning``, ours or scikit-learn's). Every
estimator runs with its defaults but ``n_components`` / ``n_clusters`` and ``random_state=0``
(and SpectralClustering's ``affinity="nearest_neighbors"``).

    python scripts/estimators_vs_sklearn.py [--orl PATH] [--only digits orl] [--skip NAME ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sklearn.cluster import SpectralClustering  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.decomposition import NMF, SparsePCA  # noqa: E402
from sklearn.exceptions import ConvergenceWarning as SkConvergenceWarning  # noqa: E402

import ppdnmf_torch  # noqa: E402
from ppdnmf_torch.errors import ConvergenceWarning  # noqa: E402
from ppdnmf_torch.models.symnmf.clustering import clustering_accuracy  # noqa: E402
from ppdnmf_torch.models.symnmf.data import load_orl  # noqa: E402


def _run(make, X):
    """Fit ``make()`` on ``X``: the fitted estimator, seconds, and whether it warned of non-convergence."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        est = make().fit(X)
        seconds = time.perf_counter() - t0
    warned = any(issubclass(w.category, (ConvergenceWarning, SkConvergenceWarning)) for w in caught)
    return est, seconds, not warned


def _row(data, name, seconds, metric, value, sparsity, n_iter, max_iter, converged):
    print(json.dumps(dict(data=data, estimator=name, seconds=round(seconds, 1), metric=metric, value=float(value),
                          sparsity=None if sparsity is None else float(sparsity), n_iter=int(n_iter),
                          max_iter=int(max_iter), converged=bool(converged))), flush=True)


def nmf_pair(data, X, k, skip):
    norm = np.linalg.norm(X)
    if "ppdnmf" not in skip:
        est, s, ok = _run(lambda: ppdnmf_torch.PPDNMF(n_components=k, random_state=0), X)
        _row(data, "PPDNMF", s, "relative error", est.reconstruction_err_ / norm, None, est.n_iter_, est.max_iter,
             ok)
        print(json.dumps(dict(data=data, estimator="PPDNMF", consensus=float(np.max(est.consensus_)))), flush=True)
    if "nmf" not in skip:
        est, s, ok = _run(lambda: NMF(n_components=k, random_state=0), X)
        _row(data, "NMF", s, "relative error", est.reconstruction_err_ / norm, None, est.n_iter_, est.max_iter, ok)


def clustering_pair(data, X, y, k, skip):
    if "symnmf" not in skip:
        est, s, ok = _run(lambda: ppdnmf_torch.SymmetricNMF(n_clusters=k, random_state=0), X)
        _row(data, "SymmetricNMF", s, "accuracy", clustering_accuracy(y, est.labels_), None, est.n_iter_,
             est.max_iter, ok)
    if "spectral" not in skip:
        # its default rbf affinity (gamma = 1) on raw pixels is numerically an empty graph: the kNN
        # graph is its neighbour of SymmetricNMF's own kNN similarity
        est, s, ok = _run(lambda: SpectralClustering(n_clusters=k, affinity="nearest_neighbors", random_state=0), X)
        _row(data, "SpectralClustering", s, "accuracy", clustering_accuracy(y, est.labels_), None, 0, 0, ok)


def adjusted_variance_ratio(X, components):
    """Zou et al.'s adjusted variance of the loadings ``components (r, d)`` over the total:
    ``sum_j R_jj^2 / ||X - mean||_F^2`` with ``X_c V^T = Q R`` (0 for all-zero loadings)."""
    Xc = X - X.mean(axis=0)
    R = np.linalg.qr(Xc @ components.T, mode="r")
    return float(np.sum(np.diag(R) ** 2) / np.sum(Xc * Xc))


def sparse_pca_pair(data, X, skip):
    if "fsspca" not in skip:
        est, s, ok = _run(lambda: ppdnmf_torch.FederatedSparsePCA(random_state=0), X)
        _row(data, "FederatedSparsePCA", s, "adjusted variance ratio", adjusted_variance_ratio(X, est.components_),
             (est.components_ == 0).mean(), est.n_iter_, est.max_iter, ok)
    if "sparsepca" not in skip:
        est, s, ok = _run(lambda: SparsePCA(random_state=0), X)
        _row(data, "SparsePCA", s, "adjusted variance ratio", adjusted_variance_ratio(X, est.components_),
             (est.components_ == 0).mean(),
             est.n_iter_, est.max_iter, ok)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orl", default=None, help="ORL's orl_faces.mat (the ORL rows are skipped without it)")
    ap.add_argument("--only", nargs="*", default=["digits", "orl"], choices=["digits", "orl"])
    ap.add_argument("--skip", nargs="*", default=[], help="estimators left out (ppdnmf nmf symnmf spectral fsspca "
                                                          "sparsepca)")
    ap.add_argument("--orl-rank", type=int, default=20,
                    help="the NMF pair's rank on ORL (the clustering pair takes the 40 subjects)")
    args = ap.parse_args(argv)
    skip = {s.lower() for s in args.skip}
    if "digits" in args.only:
        X, y = load_digits(return_X_y=True)
        X = X.astype(np.float64)
        nmf_pair("digits", X, 10, skip)
        clustering_pair("digits", X, y, 10, skip)
        sparse_pca_pair("digits", X, skip)
    if "orl" in args.only and args.orl:
        X, y = load_orl(args.orl)
        nmf_pair("ORL", X, args.orl_rank, skip)
        clustering_pair("ORL", X, y, 40, skip)


if __name__ == "__main__":
    main()
