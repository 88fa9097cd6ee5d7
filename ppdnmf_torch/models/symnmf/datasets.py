"""The data sets of the symmetric-NMF presets (``ppdnmf task=symnmf``) and studies: ORL faces from
their ``.mat`` file, scikit-learn's digits."""
from __future__ import annotations

import numpy as np

from ...errors import DataError

__all__ = ["load_orl", "load_digits_samples"]


def load_orl(path) -> tuple[np.ndarray, np.ndarray]:
    """ORL faces from ``orl_faces.mat`` (docs/SYMMETRIC_NMF.md): samples ``(400, 10304)`` float64
    (one 112 x 92 image per row) and labels ``(400,)`` in ``0..39``."""
    from scipy.io import loadmat

    d = loadmat(str(path))
    if "data" not in d or "label" not in d:
        raise DataError(f"path: {path} has no 'data' and 'label' arrays (expected ORL's orl_faces.mat)")
    return d["data"].astype(np.float64), d["label"].reshape(-1).astype(np.int64) - 1


def load_digits_samples() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: samples ``(1797, 64)`` float64 and labels ``(1797,)``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float64), d.target.astype(np.int64)
