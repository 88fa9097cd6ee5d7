"""What a PPDNMF fit returns: :class:`FitResult` (one problem) and :class:`TrialsResult`
(a batch of trials), and the solver's history in the form each holds."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...graph import Graph

__all__ = ["FitResult", "TrialsResult", "history_single", "history_batched"]


@dataclass
class FitResult:
    """Result of :func:`fit`.

    Attributes
    ----------
    X : Tensor (N, L, K)
        Every agent's left factor ``X_i`` (nonnegative).
    Y : list of N Tensors (K, M_i)
        Every agent's right factor block.
    U : Tensor (N, L, K)
        The ADMM copies ``U_i`` of the last X-step.
    history : dict of lists
        One entry per BCD iteration: ``nmse``, ``consensus``, ``nmse_worst`` (the NMSE of
        the whole data under the left factor of the agent farthest from the mean, right
        factors refit: it cannot hide disagreement, :mod:`ppdnmf_torch.models.ppdnmf.solver.refit`),
        ``objective``, ``x_primal``, ``x_dual``, ``y_primal``, ``y_dual`` (for
        ``y_solver="hals"``: 0 and the last sweep's change), ``time_x``, ``time_y`` (floats) and
        ``x_iters``, ``y_iters`` (per-agent ADMM iteration counts); for an exchange that
        counts costs, also ``crypto_<counter>`` (the cumulative values of :attr:`costs`'
        numbers after each BCD iteration; a resumed run continues them).
    graph : Graph
    columns : list of int
        ``M_i`` per agent.
    n_iter : int
        BCD iterations run.
    converged : bool
        Whether the stopping rule stopped every agent (always False with ``tol=0``).
    costs : dict
        The exchange's cost counters (empty for ``plain``): flat numbers, plus
        ``bytes_per_edge`` ({"i->j": bytes}) and, when recorded, ``transcript``.
    """

    X: torch.Tensor
    Y: list
    U: torch.Tensor
    history: dict
    graph: Graph
    columns: list
    n_iter: int
    converged: bool
    costs: dict = field(default_factory=dict)

    @property
    def X_mean(self) -> torch.Tensor:
        """The agents' average left factor ``(L, K)``."""
        return self.X.mean(dim=0)

    def reconstruction(self, i: int | None = None) -> torch.Tensor:
        """``X_i Y_i (L, M_i)`` of agent ``i``, or all blocks side by side ``(L, M)`` when ``i`` is None."""
        if i is not None:
            return self.X[i] @ self.Y[i]
        return torch.cat([self.X[k] @ self.Y[k] for k in range(len(self.Y))], dim=1)

    @property
    def nmse(self) -> float:
        return self.history["nmse"][-1]

    @property
    def consensus(self) -> float | None:
        """The last consensus error; None when the run did not measure it (a distributed run
        with ``share="sums"``, whose ranks keep their ``X_i``)."""
        h = self.history.get("consensus")
        return h[-1] if h else None


def history_single(history: dict) -> dict:
    """Batched history (tensors over trials) -> plain lists for a single trial."""
    out = {}
    for k, vals in history.items():
        if vals and isinstance(vals[0], torch.Tensor):
            if vals[0].dim() == 1:
                out[k] = [float(v[0]) for v in vals]
            else:
                out[k] = [v[0].tolist() for v in vals]
        else:
            out[k] = list(vals)
    return out


@dataclass
class TrialsResult:
    """Result of :func:`fit_trials`: ``T`` independent problems solved as one batch.

    Attributes
    ----------
    X : Tensor (T, N, L, K)
    Y : Tensor (T, N, K, M_max)
        Zero-padded; agent ``i`` of trial ``t`` owns ``Y[t, i, :, :columns[t][i]]``.
    U : Tensor (T, N, L, K)
    columns : list (T) of list (N) of int
    history : dict
        Per BCD iteration, arrays of shape ``(n_iter, T)`` (``(n_iter, T, N)`` for the
        per-agent ADMM counts, ``(n_iter,)`` for the batch's step times and its
        ``crypto_<counter>`` costs).
    graphs : list of Graph
    seeds : list of int
    n_iter : int
    costs : dict
    """

    X: torch.Tensor
    Y: torch.Tensor
    U: torch.Tensor
    columns: list
    history: dict
    graphs: list
    seeds: list
    n_iter: int
    converged: bool
    costs: dict = field(default_factory=dict)

    @property
    def n_trials(self) -> int:
        return self.X.shape[0]

    def trial_Y(self, t: int) -> list:
        """Agent blocks ``Y_i (K, M_i)`` of trial ``t``."""
        return [self.Y[t, i, :, :c] for i, c in enumerate(self.columns[t])]


def history_batched(history: dict) -> dict:
    import numpy as np  # results for users are numpy arrays; the solver stays torch

    out = {}
    for k, vals in history.items():
        if vals and isinstance(vals[0], torch.Tensor):
            out[k] = torch.stack(vals).numpy()
        else:
            out[k] = np.asarray(vals, dtype=np.float64)
    return out
