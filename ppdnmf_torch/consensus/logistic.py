"""Logistic-regression local losses ``f_i(x) = sum_j log(1 + exp(-t_ij o_ij^T x))`` (Sec. V).

There is no closed-form exact step: the methods use the linearised step (8), as the paper
does for every algorithm it compares on this problem.
"""
from __future__ import annotations

import warnings

import torch

from ..errors import ConvergenceWarning, DataError
from .least_squares import as_batched, check_same_lead
from .losses import LocalLoss, take_agent

__all__ = ["Logistic"]


class Logistic(LocalLoss):
    """``f_i(x) = sum_j log(1 + exp(-t_ij o_ij^T x))``, ``x (p,)``.

    Parameters
    ----------
    inputs : Tensor (Bd, N, b, p) or (N, b, p)
        ``o_ij``. Zero rows (padding) add only a constant.
    labels : Tensor (Bd, N, b) or (N, b)
        ``t_ij in {-1, +1}``.
    """

    def __init__(self, inputs: torch.Tensor, labels: torch.Tensor):
        O = as_batched(inputs, 4, "inputs")
        t = as_batched(labels, 3, "labels").to(O.dtype)
        check_same_lead(O, t, "inputs", "labels")
        if t.shape[2] != O.shape[2]:
            raise DataError(f"labels: {t.shape[2]} samples per agent, but inputs has {O.shape[2]}")
        if not bool(((t == 1) | (t == -1)).all()):
            raise DataError("labels: every label must be -1 or +1")
        self.O, self.t = O, t
        self.n_agents = O.shape[1]
        self.shape = (O.shape[-1],)
        self.batch_size = max(O.shape[0], t.shape[0])
        self.device, self.dtype = O.device, O.dtype

    def grad(self, agent, x):
        """``-sum_j t_ij o_ij / (1 + exp(t_ij o_ij^T x))``; ``x (B, p)``.

        Written with ``exp`` and correctly rounded operations (not ``torch.sigmoid``, whose
        vectorised and scalar CPU paths differ in the last bit), so that a trial's bits do
        not depend on where its elements fall in a batch.
        """
        O = take_agent(self.O, agent)
        t = take_agent(self.t, agent)
        margin = (O * x.unsqueeze(-2)).sum(-1)
        w = -t / (1 + torch.exp(t * margin))
        return (w.unsqueeze(-1) * O).sum(-2)

    def relabel(self, perm):
        B = perm.shape[0]
        rows = torch.arange(B, device=perm.device).unsqueeze(1)
        return Logistic(self.O.expand(B, *self.O.shape[1:])[rows, perm],
                        self.t.expand(B, *self.t.shape[1:])[rows, perm])

    def objective(self, x: torch.Tensor) -> torch.Tensor:
        """``sum_i f_i(x)`` for a common ``x (Bd, p)``; returns ``(Bd,)``."""
        m = torch.einsum("bnjp,bp->bnj", self.O, x) * self.t
        return torch.nn.functional.softplus(-m).sum((1, 2))

    def solution(self, tol: float = 1e-14, max_iter: int = 100) -> torch.Tensor:
        """The centralized minimiser by damped Newton in float64.

        Parameters
        ----------
        tol : float
            Stop one Newton step after ``max |grad| <= tol * (1 + number of samples)``.
        max_iter : int

        Returns
        -------
        Tensor (Bd, p)
            Warns (:class:`~ppdnmf_torch.errors.ConvergenceWarning`) when Newton did not reach ``tol``.
        """
        O, t = self.O.double(), self.t.double()
        Bd = max(O.shape[0], t.shape[0])
        O, t = O.expand(Bd, *O.shape[1:]).flatten(1, 2), t.expand(Bd, *t.shape[1:]).flatten(1, 2)
        x = torch.zeros(Bd, O.shape[-1], dtype=torch.float64, device=O.device)
        f = lambda v: torch.nn.functional.softplus(-t * torch.einsum("bjp,bp->bj", O, v)).sum(1)
        scale = tol * (1 + O.shape[1])
        polished = False
        for _ in range(max_iter):
            m = t * torch.einsum("bjp,bp->bj", O, x)
            s = torch.sigmoid(-m)
            g = -torch.einsum("bj,bjp->bp", t * s, O)
            if float(g.abs().max()) <= scale:
                if polished:
                    return x.to(self.dtype)
                polished = True   # one more Newton step: quadratic convergence takes x to rounding
            H = torch.einsum("bj,bjp,bjq->bpq", s * (1 - s), O, O)
            d = torch.linalg.solve(H, g.unsqueeze(-1)).squeeze(-1)
            step = torch.ones(Bd, 1, dtype=torch.float64, device=O.device)
            f0 = f(x)
            # Armijo, with the objective's rounding as slack: near the minimiser the decrease
            # is below f's last bits and an exact test would halve the step for nothing
            slack = 64 * torch.finfo(torch.float64).eps * (1 + f0.abs())
            for _ in range(30):
                bad = f(x - step * d) > f0 - 1e-4 * step.squeeze(1) * (g * d).sum(1) + slack
                if not bool(bad.any()):
                    break
                step = torch.where(bad.unsqueeze(1), step / 2, step)
            x = x - step * d
        warnings.warn(f"Logistic.solution: Newton did not reach tol={tol} in {max_iter} iterations "
                      "(separable data have no minimiser)", ConvergenceWarning, stacklevel=2)
        return x.to(self.dtype)
