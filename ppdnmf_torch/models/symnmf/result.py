"""What a symmetric-NMF run returns (:class:`SymNMFResult`) and what its callback sees
(:class:`SymNMFIteration`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SymNMFResult", "SymNMFIteration", "HISTORY_KEYS"]

#: the per-iteration histories, each a ``(K + 1, T)`` tensor (row 0: the starting point)
HISTORY_KEYS = ("E", "objective", "gap", "rel_gap", "lam", "time")


@dataclass
class SymNMFResult:
    """The factors and histories of a batched symmetric-NMF run.

    Attributes
    ----------
    U, V : torch.Tensor
        ``(T, n, r)``, one factor pair per trial (``V = U`` for the methods without a split:
        PGD, beta-SNMF). ``U`` is the symmetric factor, ``X ~ U U^T``.
    lam : torch.Tensor
        ``(T,)``, the last penalty ``lambda`` (ADMM: its ``rho``; 0 without a split).
    history : dict of torch.Tensor
        ``(K + 1, T)`` each, float64 on the CPU: ``E`` (``||X - U_k U_k^T||_F^2 / ||X||_F^2``),
        ``objective`` (the split objective (3); without a split, ``1/2 ||X - U U^T||_F^2``),
        ``gap`` (``||U_k - V_k||_F^2``), ``rel_gap`` (``||U_k - V_k||_F / ||V_k||_F``),
        ``lam`` (``lambda_k``) and ``time`` (seconds since the start, on the run's clock).
    n_iter : torch.Tensor
        ``(T,)`` int64, the iterations each trial ran (a trial stops when it converges).
    converged : torch.Tensor
        ``(T,)`` bool, whether each trial met ``tol`` (always False with ``tol = 0``).
    wall_time : float
        Seconds of the whole run, resumed parts included.
    method, penalty : str
        What ran.
    options : dict
        The method's options.
    plan : str
        The plan that ran the iterations, ``"torch"`` or ``"host"`` (:func:`~.fit.fit_symnmf`).
    """

    U: torch.Tensor
    V: torch.Tensor
    lam: torch.Tensor
    history: dict
    n_iter: torch.Tensor
    converged: torch.Tensor
    wall_time: float
    method: str
    penalty: str
    options: dict = field(default_factory=dict)
    plan: str = "torch"

    @property
    def trials(self) -> int:
        return int(self.U.shape[0])

    @property
    def E(self) -> torch.Tensor:
        """The last ``E^k`` per trial, ``(T,)``."""
        return self.history["E"][-1]

    def best_trial(self) -> int:
        """The trial with the smallest final ``E``."""
        return int(torch.argmin(self.E))

    def summary(self) -> dict:
        """Plain numbers (lists over trials) for logs and reports."""
        return {
            "method": self.method, "penalty": self.penalty, "trials": self.trials,
            "n_iter": self.n_iter.tolist(), "converged": self.converged.tolist(),
            "E": self.E.tolist(), "objective": self.history["objective"][-1].tolist(),
            "rel_gap": self.history["rel_gap"][-1].tolist(), "lam": self.lam.detach().cpu().tolist(),
            "wall_time": float(self.wall_time),
        }


@dataclass
class SymNMFIteration:
    """What the callback receives after each iteration.

    Attributes
    ----------
    k : int
        Iterations done (1 after the first).
    max_iter : int
    metrics : dict
        ``(T,)`` float64 CPU tensors: ``E``, ``objective``, ``gap``, ``rel_gap``, ``lam``, ``time``.
    U, V : torch.Tensor
        ``(T, n, r)``, the current factors (the solver's own: do not modify).
    active : torch.Tensor
        ``(T,)`` bool, the trials still iterating.
    """

    k: int
    max_iter: int
    metrics: dict
    U: torch.Tensor
    V: torch.Tensor
    active: torch.Tensor
