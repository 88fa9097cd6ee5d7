"""Federated sparse PCA (FSSPCA): consensus ADMM on the Stiefel manifold with smoothing,
batched over trials and workers (docs/FSSPCA.md; specification docs/SPARSE_PCA.md).

>>> import numpy as np
>>> from ppdnmf_torch.models.fsspca import fit_fsspca
>>> rng = np.random.default_rng(0)
>>> blocks = [rng.standard_normal((n, 6)) for n in (20, 30, 25)]
>>> res = fit_fsspca(blocks, 2, alpha=0.0, max_iter=300, tol=1e-7)
>>> bool(res.converged.all())
True
"""
from .admm import FSSPCAProblem, adjusted_variance, soft_threshold
from .config import SPEC, FSSPCASpec
from .fit import as_blocks, fit_fsspca
from .manifold import qf, retract, riemannian_gradient
from .result import FSSPCAResult, IterationInfo
from .smoothing import DEFAULT_SMOOTHING, SMOOTHINGS, get_smoothing

__all__ = ["FederatedSparsePCA", "fit_fsspca", "as_blocks", "SPEC", "FSSPCASpec", "FSSPCAResult", "IterationInfo", "FSSPCAProblem",
           "adjusted_variance", "soft_threshold", "qf", "retract", "riemannian_gradient", "SMOOTHINGS",
           "DEFAULT_SMOOTHING", "get_smoothing"]


def __getattr__(name):
    # the estimator imports scikit-learn: only when asked for
    if name == "FederatedSparsePCA":
        from .estimator import FederatedSparsePCA

        return FederatedSparsePCA
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
