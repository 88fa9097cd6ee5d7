"""One outer iteration of an alternating method on the split problem (3).

Both blocks solve the same kind of subproblem: with the other factor ``W`` fixed,
``min_{Z >= 0} 1/2 ||X - Z W^T||_F^2 + lambda/2 ||Z - W||_F^2``, whose data are
``A = X W + lambda W`` ``(T, n, r)`` and ``B = W^T W + lambda I`` ``(T, r, r)`` (``X``
symmetric, so the ``V``-block has the same form with ``W = U``). SymANLS solves it exactly
(an NNLS), SymHALS by one column sweep (17), A-SymHALS by several.
"""
from __future__ import annotations

import torch

__all__ = ["block_data", "alternate"]


def block_data(XW: torch.Tensor, W: torch.Tensor, lam: torch.Tensor):
    """``A = X W + lambda W`` ``(T, n, r)`` and ``B = W^T W + lambda I`` ``(T, r, r)``."""
    A = XW + lam[:, None, None] * W
    B = W.transpose(-2, -1) @ W
    # lambda on the diagonal in place: the numbers of B + lambda I (x + 0 off it), in two calls
    # instead of four (with few trials the iteration is bound by the cost per torch call)
    B.diagonal(dim1=-2, dim2=-1).add_(lam[:, None])
    return A, B


def alternate(sim, U, V, prods, lam, solve_block):
    """``(U_k, V_k)`` from ``(U_{k-1}, V_{k-1})``: the ``U``-block with ``V_{k-1}`` fixed, then
    the ``V``-block with ``U_k`` fixed.

    Parameters
    ----------
    sim : Similarity
    U, V : torch.Tensor
        ``(T, n, r)``, the previous iterate.
    prods : dict
        ``{"XU": X U_{k-1}, "XV": X V_{k-1}}``, ``(T, n, r)`` each (kept from the previous
        iteration).
    lam : torch.Tensor
        ``(T,)``.
    solve_block : callable
        ``solve_block(Z, A, B) -> Z_new``, the block update from its current value.

    Returns
    -------
    U, V : torch.Tensor
        The new iterate.
    prods : dict
        ``{"XU": X U_k, "XV": X V_k}`` (the metrics' and the next iteration's).
    """
    A, B = block_data(prods["XV"], V, lam)
    U = solve_block(U, A, B)
    XU = sim.matmul(U)
    A, B = block_data(XU, U, lam)
    V = solve_block(V, A, B)
    return U, V, {"XU": XU, "XV": sim.matmul(V)}
