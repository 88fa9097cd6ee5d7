"""Data for FSSPCA: the spiked-covariance model with known sparse loadings, scikit-learn's
small data sets, a user's rows from a file, and IID / non-IID splits of rows over workers
(docs/FSSPCA.md, "Data").

Splits return ``groups (n,)``: the worker of each row (every worker gets at least one row).
:func:`load_rows` reads a user's ``.npy``/``.csv`` (one :class:`~ppdnmf_torch.errors.DataError`
line keyed ``path`` for a bad file), and :func:`check_rows` refuses rows no covariance can be
made of (constant, or so large or small that it overflows or vanishes).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch

from ...data.files import check_matrix, existing_file, read_npy, read_text
from ...errors import ConfigError, DataError

__all__ = ["SpikedData", "spiked_covariance", "load_dataset", "DATASETS", "split_iid", "split_by_class",
           "split_dirichlet", "split_rows", "SPLITS", "load_rows", "check_rows"]

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


def load_rows(path, key: str = "path") -> np.ndarray:
    """A user's rows ``(n, d)`` float64 from a ``.npy`` or ``.csv`` file (one sample per row).

    Raises
    ------
    DataError
        Keyed ``key``: missing, not of its kind (text in a ``.npy``, binary bytes in a
        ``.csv``), truncated, pickled objects, strings, not 2-D, empty, NaN or infinite.
    """
    p = existing_file(path, "data", key)
    ext = os.path.splitext(p)[1].lower()
    if ext not in (".npy", ".csv"):
        raise DataError(f"{key}: {p!r} is not a .npy or .csv file")
    arr = read_npy(p, key) if ext == ".npy" else read_text(p, key)
    return check_matrix(arr, repr(p), key, "(n_samples, n_features) matrix")


def check_rows(blocks, *, center: bool = True, key: str = "data") -> None:
    """Refuse workers' rows that give no covariance to decompose, before any work.

    Parameters
    ----------
    blocks : list of Tensor (n_i, d)
        The workers' rows (finite; :func:`~.fit.as_blocks` checked them).
    center : bool
        Whether the rows are centred (then constant features carry no variance).

    Raises
    ------
    DataError
        Keyed ``key``: every feature constant (``center``) or every entry zero, so that every
        covariance is 0 (and ``rho="auto"``, a multiple of its largest eigenvalue, too); or
        entries so large that ``n max|x|^2`` overflows the dtype, or so small that it
        underflows to 0, with the scale to divide by.
    """
    n = sum(int(b.shape[0]) for b in blocks)
    # the columns' extremes by NumPy on CPU float tensors (the same numbers, a fraction of the time)
    host = all(b.device.type == "cpu" and b.dtype in (torch.float32, torch.float64) and not b.requires_grad
               for b in blocks)
    cols = [(torch.from_numpy(b.numpy().min(0)), torch.from_numpy(b.numpy().max(0))) if host
            else (b.amin(0), b.amax(0)) for b in blocks]
    top = max(max(-float(lo.min()), float(hi.max())) for lo, hi in cols)
    fin = torch.finfo(blocks[0].dtype)
    if top > 0:
        grows = 2 * math.log10(top) + math.log10(max(n, 1))
        if grows > math.log10(fin.max) - 1:
            raise DataError(f"{key}: entries up to {top:.3g} overflow the covariance in {str(fin.dtype)} (n max|x|^2 "
                            f"~ 1e{grows:.0f}); rescale the rows (divide by their largest absolute entry)")
        if 2 * math.log10(top) < math.log10(fin.tiny) + 1:
            raise DataError(f"{key}: entries up to {top:.3g} make the covariance underflow to 0 in "
                            f"{str(fin.dtype)}; rescale the rows (divide by their largest absolute entry)")
    if center:
        lo = torch.stack([c[0] for c in cols]).amin(0)
        hi = torch.stack([c[1] for c in cols]).amax(0)
        if bool((lo == hi).all()):
            raise DataError(f"{key}: every one of the {int(lo.numel())} features is constant over the {n} rows, so "
                            "the centred covariance is 0: there is no variance to find components of")
    elif top == 0:
        raise DataError(f"{key}: every entry is 0, so the covariance is 0: there is no variance to find components of")
