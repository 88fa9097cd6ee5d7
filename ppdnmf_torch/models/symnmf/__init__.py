"""Symmetric NMF by splitting (SymANLS, SymHALS, A-SymHALS) and its baselines, batched over
trials on CPU and CUDA, for dense or sparse similarity matrices (docs/SYMNMF.md)."""
from .data import initial_factor, synthetic_similarity
from .fit import METHODS, fit_symnmf
from .objective import fitting_error, split_objective
from .operator import Similarity, as_similarity
from .result import SymNMFIteration, SymNMFResult

__all__ = ["fit_symnmf", "METHODS", "SymNMFResult", "SymNMFIteration", "synthetic_similarity", "initial_factor",
           "Similarity", "as_similarity", "fitting_error", "split_objective"]
