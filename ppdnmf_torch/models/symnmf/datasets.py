"""scikit-learn's digits for the symmetric-NMF presets (``ppdnmf task=symnmf``) and studies (ORL
faces: :func:`.data.load_orl`)."""
from __future__ import annotations

import numpy as np

__all__ = ["load_digits_samples"]


def load_digits_samples() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: samples ``(1797, 64)`` float64 and labels ``(1797,)``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return d.data.astype(np.float64), d.target.astype(np.int64)
