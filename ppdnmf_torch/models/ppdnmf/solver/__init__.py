"""The batched PPDNMF solver: Algorithm 1 of the paper for every agent (and trial) at once.

All agents' variables are stacked, trial dimension first, agent dimension second (see
:mod:`.state`); neighbour sums go through the exchange (:mod:`ppdnmf_torch.exchange`).
There is no Python loop over agents, edges or trials: the loops are over BCD and ADMM
iterations only.

* :mod:`.state`: parameters, the state of Algorithm 1, the initial state;
* :mod:`.admm`: the X-step (eqs. 8-11) and the Y-step (eqs. 12-14), one call per step;
* :mod:`.plans`: how an ADMM loop runs (eager, fused whole iterations, fused carried
  differences, buffered chains, agent groups), chosen once per step;
* :mod:`.kernels`, :mod:`.eager`, :mod:`.fused`: bit-stable linear algebra and buffers,
  the eager updates, the compiled updates (``fuse=True``);
* :mod:`.stopping`: the stopping rule of Sec. II-C;
* :mod:`.incremental`: the X-step by the incremental consensus engine (``x_solver``);
* :mod:`.hals`: the HALS Y-step (``y_solver="hals"``), batched over agents and trials;
* :mod:`.schedule`: the consensus-seeking penalty schedules (``penalty_schedule="agreed"``,
  the default, and ``"adaptive"``);
* :mod:`.refit`: the worst-agent NMSE (``nmse_worst``), a metric that cannot hide disagreement;
* :mod:`.bcd`: the outer BCD loop (lines 3-24), metrics and finiteness checks.

Equation numbers refer to arXiv 2403.18326; the consensus term follows ALGORITHM.md
("derived" form by default).
"""
from ..problem import COLUMN_CHUNK, Problem
from .admm import x_step, y_step
from .incremental import incremental_x_step
from .bcd import AgentReduction, ConvergenceWarning, NumericalError, RunInterrupted, run_bcd
from .kernels import Workspace, column_gram
from .state import IterationInfo, SolverParams, SolverState, init_state, make_sampler, solver_params

__all__ = [
    "SolverParams",
    "solver_params",
    "Problem",
    "SolverState",
    "IterationInfo",
    "ConvergenceWarning",
    "NumericalError",
    "RunInterrupted",
    "AgentReduction",
    "make_sampler",
    "incremental_x_step",
    "init_state",
    "run_bcd",
    "x_step",
    "y_step",
    "column_gram",
    "COLUMN_CHUNK",
    "Workspace",
]
