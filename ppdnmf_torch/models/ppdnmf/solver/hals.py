"""HALS on the Y-step's nonnegative least squares (``y_solver="hals"``), batched over agents and trials.

The Y-step of Algorithm 1 solves, per agent, ``min_{Y_i >= 0} 1/2 ||Z_i - X_i Y_i||_F^2``
(``X_i`` fixed). The paper runs ADMM on it (eqs. 12-14); HALS (hierarchical alternating
least squares, Cichocki et al. 2007) minimizes it exactly one row of ``Y_i`` at a time,
which is eq. 17 of the symmetric-NMF splitting paper (Zhu et al., "Dropping symmetry for
fast symmetric NMF") with ``lambda = 0``: with ``G = X^T X`` and ``C = X^T Z``,

    ``Y[k, :] <- max(0, Y[k, :] + (C[k, :] - G[k, :] Y) / G[k, k])``,   ``k = 1..K``.

One sweep is one pass over the ``K`` rows (Gauss-Seidel: row ``k`` sees rows ``< k`` already
updated); every row update is one batched product over all agents and trials. The agents
do not communicate in the Y-step, so HALS changes nothing in the protocol. Padding
columns (beyond an agent's ``M_i``) are never touched and stay exactly zero.

Each sweep decreases the objective monotonically, so a few sweeps warm-started from the
last BCD iteration's ``Y_i`` do the work of many ADMM iterations; the same kernel refits
the right factors of the disagreement metric (:func:`ppdnmf_torch.metrics.refit_nmse`).
"""
from __future__ import annotations

import torch

from .kernels import where_active

__all__ = ["scaled_system", "hals_sweep", "hals_loop"]


def scaled_system(G: torch.Tensor, C: torch.Tensor):
    """Rows of ``G (..., K, K)`` and ``C (..., K, M)`` divided by ``G[k, k]``: the sweep's operands.

    A column of ``X`` that is exactly zero has ``G[k, k] = 0`` and ``C[k, :] = 0``: its row is
    divided by the smallest normal number instead, which keeps ``0 / 0`` out (the row's
    update is then ``Y[k, :] <- max(0, Y[k, :])``, it stays what it was).
    """
    d = torch.diagonal(G, dim1=-2, dim2=-1).clamp_min(torch.finfo(G.dtype).tiny).unsqueeze(-1)
    return G / d, C / d


def hals_sweep(Y: torch.Tensor, Gs: torch.Tensor, Cs: torch.Tensor) -> torch.Tensor:
    """One HALS sweep over the ``K`` rows of ``Y (A, K, W)``, in place.

    Parameters
    ----------
    Y : Tensor (A, K, W)
        Nonnegative and contiguous (every row update multiplies the whole of it: a strided
        view would be copied ``K`` times per sweep); ``A`` agents (trials and agents
        flattened), ``W`` columns. Updated in place.
    Gs, Cs : Tensor (A, K, K), (A, K, W)
        :func:`scaled_system` of ``G = X^T X`` and ``C = X^T Z``.

    Returns
    -------
    Y
    """
    for k in range(Y.shape[-2]):
        row = Y[:, k:k + 1, :]
        # row + (C_k - G_k Y) / G_kk, the row's exact minimizer before the projection
        row.add_(torch.baddbmm(Cs[:, k:k + 1, :], Gs[:, k:k + 1, :], Y, alpha=-1.0)).clamp_(min=0)
    return Y


def hals_loop(Y: torch.Tensor, G: torch.Tensor, C: torch.Tensor, n_sweeps: int, width: int, stop=None):
    """``n_sweeps`` HALS sweeps on ``Y (T, N, K, M)`` (a new tensor; ``Y`` is not modified).

    Parameters
    ----------
    Y : Tensor (T, N, K, M)
        The warm start.
    G, C : Tensor (T, N, K, K), (T, N, K, M)
        ``X^T X`` and ``X^T Z``.
    n_sweeps, width : int
    stop : StopRule, optional
        The Sec. II-C rule on ``Y``'s relative change; None runs ``n_sweeps`` sweeps.

    Returns
    -------
    Y, Y_prev : Tensor (T, N, K, M)
        The last iterate and the one before it (for the residual and the stopping rule).
    """
    T, N, K, M = Y.shape
    Gs, Cs = scaled_system(G, C[..., :width])
    Gs, Cs = Gs.reshape(T * N, K, K), Cs.reshape(T * N, K, width)
    # the sweeps run on the real columns, copied once; the padding stays zero
    Yw = Y[..., :width].contiguous() if width < M else Y.clone(memory_format=torch.contiguous_format)
    Yw_prev = Yw
    active = None if stop is None else stop.active
    for k in range(n_sweeps):
        if stop is not None or k == n_sweeps - 1:  # a copy only where it is read
            Yw_prev = Yw.clone()
        hals_sweep(Yw.view(T * N, K, width), Gs, Cs)
        if active is not None:  # stopped agents keep their last Y
            Yw = where_active(active, Yw, Yw_prev).contiguous()
        if stop is not None:
            if stop.after(k, Yw, Yw_prev):
                break
            active = stop.active
    return _padded(Yw, M), _padded(Yw_prev, M)


def _padded(Yw: torch.Tensor, M: int) -> torch.Tensor:
    """``Yw (..., W)`` with zero columns appended up to ``M``."""
    if Yw.shape[-1] == M:
        return Yw
    return torch.nn.functional.pad(Yw, (0, M - Yw.shape[-1]))
