"""Incremental consensus ADMM with privacy: I-ADMM, PI-ADMM1, PI-ADMM2 and W-ADMM.

``min_x sum_i f_i(x)`` over N agents: one token walks a Hamiltonian cycle (a random walk
for W-ADMM) and only its holder updates (arXiv 2003.10615; the specification is
docs/INCREMENTAL_ADMM.md, equation numbers refer to it).

>>> import torch
>>> from ppdnmf_torch import consensus as cs
>>> graph, cycle = cs.random_hamiltonian_graph(10, 0.5, seed=0)
>>> data = cs.least_squares_data(10, seed=0)
>>> loss = cs.LeastSquares.from_samples(data.inputs, data.targets)
>>> res = cs.run_incremental(loss, "pi_admm1", rho=5.0, n_rounds=200, graph=graph, cycle=cycle,
...                          x_star=loss.solution())
>>> bool(res.accuracy[-1, 0] < 1e-12)
True
"""
from .attacks import LsqrAttack, eavesdrop_offsets, eavesdrop_recursion, lsqr_attack
from .cycles import EXACT_MAX_NODES, hamiltonian_cycle, validate_cycle
from .engine import COMPILE_MODES, IncrementalADMM, run_incremental
from .problems import SampleData, least_squares_data, logistic_data
from .least_squares import LeastSquares
from .logistic import Logistic
from .losses import CallableLoss, LocalLoss
from .methods import METHODS, Method, i_admm, make_method, pi_admm1, pi_admm2, w_admm
from .networks import n_edges_for_ratio, random_hamiltonian_graph
from .result import IncrementalResult, IncrementalState, RoundInfo, Transcript


def project_nonnegative(z):
    """``max(z, 0)``: the token projection for a nonnegative variable (PPDNMF's ``X >= 0``)."""
    return z.clamp_min(0)


__all__ = [
    "IncrementalADMM", "run_incremental", "COMPILE_MODES",
    "Method", "METHODS", "i_admm", "pi_admm1", "pi_admm2", "w_admm", "make_method",
    "LocalLoss", "CallableLoss", "LeastSquares", "Logistic",
    "hamiltonian_cycle", "validate_cycle", "EXACT_MAX_NODES", "random_hamiltonian_graph", "n_edges_for_ratio",
    "IncrementalResult", "IncrementalState", "RoundInfo", "Transcript",
    "eavesdrop_recursion", "eavesdrop_offsets", "lsqr_attack", "LsqrAttack",
    "SampleData", "least_squares_data", "logistic_data", "project_nonnegative",
]
