"""ppdnmf_torch: privacy-preserving distributed NMF (arXiv 2403.18326), batched in PyTorch.

>>> import ppdnmf_torch as pp
>>> data = pp.data.synthetic(seed=0)
>>> result = pp.fit(data.Z, pp.graph.random_connected(10, 3.0, seed=0), rank=5,
...                 negative="allow", bcd_iters=5)
"""
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


#: where each public name lives: imported on first use (PEP 562), so that ``import ppdnmf_torch``
#: (and every ``ppdnmf`` start, ``ppdnmf --help`` included) does not pay for torch and scikit-learn
_LAZY = {
    "fit": "models.ppdnmf.api", "fit_centralized": "models.ppdnmf.api", "fit_trials": "models.ppdnmf.api",
    "PAPER_SETTINGS": "models.ppdnmf.config", "FitResult": "models.ppdnmf.result",
    "TrialsResult": "models.ppdnmf.result",
    "PPDNMF": "models.ppdnmf.estimator", "run_experiment": "models.ppdnmf.experiments",
    "ExperimentResult": "models.ppdnmf.experiments", "FederatedSparsePCA": "models.fsspca.estimator",
    "SymmetricNMF": "models.symnmf.estimator", "PPDNMFError": "errors", "ConfigError": "errors",
    "DataError": "errors", "GraphError": "errors", "DegreeOneWarning": "errors", "SumLeakWarning": "errors",
    "ConvergenceWarning": "errors", "CodecRangeError": "exchange", "NumericalError": "models.ppdnmf.solver",
    "resolve_device": "_utils", "resolve_dtype": "_utils",
}
#: the subpackages reachable as attributes (``pp.data.synthetic``)
_SUBPACKAGES = ("consensus", "data", "graph", "metrics")


def __getattr__(name):
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # the next access is a plain attribute
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
