"""Data for FSSPCA: the spiked-covariance model with known sparse loadings, scikit-learn's
small data sets, and IID / non-IID splits of rows over workers (docs/FSSPCA.md, "Data").

Splits return ``groups (n,)``: the worker of each row (every worker gets at least one row).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError, DataError

__all__ = ["SpikedData", "spiked_covariance", "load_dataset", "DATASETS", "split_iid", "split_by_class",
           "split_dirichlet", "split_rows", "SPLITS"]

DATASETS = ("digits", "breast_cancer", "wine")
SPLITS = ("iid", "class", "dirichlet")


@dataclass
class SpikedData:
    """Rows of ``N(0, I + sum_j s_j v_j v_j^T)``: ``X (n, d)``, the true loadings ``V (d, r)``
    (orthonormal, disjoint supports of ``support`` entries ``+-1/sqrt(support)``), ``spikes (r,)``."""

    X: np.ndarray
    V: np.ndarray
    spikes: np.ndarray

    @property
    def support(self) -> np.ndarray:
        """``(d, r)`` bool: the true loadings' nonzero pattern."""
        return self.V != 0


def spiked_covariance(n=400, d=50, r=2, support=5, spikes=(8.0, 4.0), seed=0) -> SpikedData:
    """A spiked covariance model with sparse loadings (Johnstone and Lu's setting).

    Loading ``j`` has ``support`` nonzero entries ``+-1/sqrt(support)`` on its own random
    coordinates; ``X = G + sum_j sqrt(s_j) g_j v_j^T`` with standard normal ``G (n, d)`` and
    ``g_j (n,)``.
    """
    spikes = np.broadcast_to(np.asarray(spikes, dtype=np.float64), (r,)).copy()
    if r * support > d:
        raise ConfigError(f"support: r * support = {r * support} exceeds d = {d}")
    rng = np.random.default_rng(seed)
    coords = rng.permutation(d)[: r * support].reshape(r, support)
    V = np.zeros((d, r))
    for j in range(r):  # r loadings, a handful: building the truth, not the computation
        V[coords[j], j] = rng.choice([-1.0, 1.0], size=support) / np.sqrt(support)
    X = rng.standard_normal((n, d)) + (rng.standard_normal((n, r)) * np.sqrt(spikes)) @ V.T
    return SpikedData(X, V, spikes)


def load_dataset(name: str, standardize: bool = True):
    """``(X (n, d), y (n,))`` of scikit-learn's bundled ``digits``, ``breast_cancer`` or ``wine``
    (no download); ``standardize`` scales each feature to unit variance (constant features stay)."""
    from sklearn import datasets

    loaders = {"digits": datasets.load_digits, "breast_cancer": datasets.load_breast_cancer,
               "wine": datasets.load_wine}
    if name not in loaders:
        raise ConfigError(f"dataset: unknown data set {name!r}; use one of {list(DATASETS)}")
    X, y = loaders[name](return_X_y=True)
    X = X.astype(np.float64)
    if standardize:
        sd = X.std(axis=0)
        X = (X - X.mean(axis=0)) / np.where(sd > 0, sd, 1.0)
    return X, y


def _check_k(n, k):
    if not 1 <= int(k) <= n:
        raise ConfigError(f"n_workers: must be in 1..{n} (the number of rows), got {k}")
    return int(k)


def split_iid(n, n_workers, seed=0) -> np.ndarray:
    """Rows shuffled and dealt into ``n_workers`` near-equal parts."""
    k = _check_k(n, n_workers)
    groups = np.empty(n, dtype=np.int64)
    groups[np.random.default_rng(seed).permutation(n)] = np.arange(n) % k
    return groups


def split_by_class(y, n_workers) -> np.ndarray:
    """Non-IID by class: rows sorted by class and cut into ``n_workers`` contiguous near-equal
    parts, so each worker sees one or a few classes."""
    y = np.asarray(y)
    k = _check_k(len(y), n_workers)
    order = np.argsort(y, kind="stable")
    groups = np.empty(len(y), dtype=np.int64)
    groups[order] = (np.arange(len(y)) * k) // len(y)
    return groups


def split_dirichlet(y, n_workers, concentration=0.5, seed=0) -> np.ndarray:
    """Non-IID by a Dirichlet draw: each class's rows are shared among the workers in
    proportions ``~ Dir(concentration)`` (smaller is more skewed); a worker left empty takes
    one row from the largest."""
    y = np.asarray(y)
    n = len(y)
    k = _check_k(n, n_workers)
    if not concentration > 0:
        raise ConfigError(f"concentration: must be > 0, got {concentration}")
    rng = np.random.default_rng(seed)
    groups = np.empty(n, dtype=np.int64)
    for c in np.unique(y):  # one draw per class
        rows = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet(np.full(k, concentration))) * len(rows)).astype(int)[:-1]
        for w, part in enumerate(np.split(rows, cuts)):
            groups[part] = w
    counts = np.bincount(groups, minlength=k)
    for w in np.flatnonzero(counts == 0):
        big = int(np.argmax(counts))
        row = np.flatnonzero(groups == big)[0]
        groups[row] = w
        counts[big] -= 1
        counts[w] += 1
    return groups


def split_rows(split, n_workers, *, y=None, n=None, seed=0, concentration=0.5) -> np.ndarray:
    """``groups (n,)`` by name: ``"iid"``, ``"class"`` or ``"dirichlet"`` (the last two need ``y``)."""
    if split == "iid":
        return split_iid(len(y) if n is None else n, n_workers, seed)
    if split in ("class", "dirichlet") and y is None:
        raise DataError(f"split: {split!r} needs class labels y")
    if split == "class":
        return split_by_class(y, n_workers)
    if split == "dirichlet":
        return split_dirichlet(y, n_workers, concentration, seed)
    raise ConfigError(f"split: unknown split {split!r}; use one of {list(SPLITS)}")
