"""ppdnmf_torch: privacy-preserving distributed NMF (arXiv 2403.18326), batched in PyTorch.

>>> import ppdnmf_torch as pp
>>> data = pp.data.synthetic(seed=0)
>>> result = pp.fit(data.Z, pp.graph.random_connected(10, 3.0, seed=0), rank=5,
...                 negative="allow", bcd_iters=5)
"""
from . import consensus, data, graph, metrics
from ._utils import resolve_device, resolve_dtype
from .models.ppdnmf.api import fit, fit_centralized, fit_trials
from .models.ppdnmf.config import PAPER_SETTINGS
from .models.ppdnmf.result import FitResult, TrialsResult
from .models.ppdnmf.estimator import PPDNMF
from .models.ppdnmf.experiments import ExperimentResult, run_experiment
from .errors import (ConfigError, ConvergenceWarning, DataError, DegreeOneWarning, GraphError, PPDNMFError,
                     SumLeakWarning)
from .exchange import CodecRangeError
from .models.ppdnmf.solver import NumericalError

__version__ = "0.1.0"

__all__ = [
    "fit",
    "PPDNMF",
    "FederatedSparsePCA",
    "SymmetricNMF",
    "fit_centralized",
    "fit_trials",
    "run_experiment",
    "PAPER_SETTINGS",
    "FitResult",
    "TrialsResult",
    "ExperimentResult",
    "consensus",
    "data",
    "graph",
    "metrics",
    "PPDNMFError",
    "ConfigError",
    "DataError",
    "GraphError",
    "CodecRangeError",
    "ConvergenceWarning",
    "DegreeOneWarning",
    "SumLeakWarning",
    "NumericalError",
    "resolve_device",
    "resolve_dtype",
]


def __getattr__(name):
    # FederatedSparsePCA and SymmetricNMF import scikit-learn: only when asked for, so that
    # importing the package (and every CLI start) does not pay for it
    if name == "FederatedSparsePCA":
        from .models.fsspca.estimator import FederatedSparsePCA

        return FederatedSparsePCA
    if name == "SymmetricNMF":
        from .models.symnmf.estimator import SymmetricNMF

        return SymmetricNMF
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
