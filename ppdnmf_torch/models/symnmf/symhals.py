"""SymHALS (Algorithm 2, eq. (17)) and A-SymHALS (Algorithm 3): column-wise exact block
minimization of the split problem (3), batched over trials.
"""
from __future__ import annotations

import torch

from ...errors import ConfigError

__all__ = ["hals_sweep", "hals_block", "SymHALS", "ZERO_COLUMN_RESET"]

#: a column that becomes all zero is reset to ``1e-16 x`` the block's largest entry (the
#: authors' ``HALSupdt`` safety procedure), so that ``B_ii`` keeps its data part
ZERO_COLUMN_RESET = 1e-16


def hals_sweep(Z: torch.Tensor, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """One sweep of eq. (17) over the columns of one block.

    For ``i = 1..r``: ``z_i <- max(0, z_i + (A[:, i] - Z B[:, i]) / B_ii)``, which is
    ``max(0, (X_i w_i + lambda w_i) / (||w_i||^2 + lambda))`` with
    ``X_i = X - sum_{j != i} z_j w_j^T``: the exact minimizer of (3) over column ``z_i``.
    It is computed as ``max(0, A[:, i] / B_ii - sum_{j != i} z_j B_ji / B_ii)`` (the same
    number: ``z_i``'s own term cancels), with ``A / diag(B)`` and ``B / diag(B)`` formed once
    per block, so that a column costs one product and one clamp.
    A column that comes out all zero is reset to ``1e-16 x`` the block's largest entry
    before the sweep, once the sweep is done (the authors reset it at once, to the current
    largest entry: the later columns of the same sweep then see ``1e-16 max`` instead of 0, a
    difference below rounding; resetting after the sweep costs no operation per column).

    Parameters
    ----------
    Z : torch.Tensor
        ``(T, n, r)``, the block's current value (not modified).
    A, B : torch.Tensor
        ``(T, n, r)`` and ``(T, r, r)`` from :func:`~.alternating.block_data`.

    Returns
    -------
    torch.Tensor
        ``(T, n, r)``.
    """
    return hals_block(Z, A, B)


class _Rows:
    """One block's data in the sweep's layout, made once per block and shared by its inner
    sweeps: the columns of ``Z`` as contiguous rows (each column update reads ``Z`` and writes
    one row), the scaled data ``A^T / diag(B)`` and ``B / diag(B)`` with a zero diagonal, and
    every per-column operand as a view made in one call (with few trials the sweep is bound
    by the cost per torch call, not by its flops).

    Parameters
    ----------
    Zt : torch.Tensor
        ``(T, r, n)`` contiguous, updated in place.
    At : torch.Tensor
        ``(T, r, n)``, ``A^T``.
    B : torch.Tensor
        ``(T, r, r)``.
    diag : torch.Tensor, optional
        ``(T, r, 1)``, ``B``'s diagonal when the caller has it.
    """

    def __init__(self, Zt, At, B, diag=None):
        self.Zt = Zt
        diag = torch.diagonal(B, dim1=-2, dim2=-1).unsqueeze(-1) if diag is None else diag
        Bs = B / diag
        Bs.diagonal(dim1=-2, dim2=-1).zero_()
        # (T, 1, .) views of row i of each operand, one call per operand
        self.cols = list(zip(*(t.split(1, dim=1) for t in (Zt, At / diag, Bs))))
        self.step = torch.empty_like(self.cols[0][0])

    def sweep(self):
        """Eq. (17) over every column, in place, then the zero-column reset."""
        Zt, step = self.Zt, self.step
        reset = Zt.amax(dim=(-2, -1), keepdim=True).mul_(ZERO_COLUMN_RESET)
        for row, a, b in self.cols:  # sequential by definition (Gauss-Seidel)
            torch.baddbmm(a, b, Zt, alpha=-1, out=step)
            torch.clamp_min(step, 0, out=row)
        # after the clamp every entry is >= 0: a row is all zero exactly where its largest is 0
        torch.where(Zt.amax(dim=-1, keepdim=True) > 0, Zt, reset, out=Zt)


def _rows_block(Zt, At, B, inner_max: int, delta: float, diag=None) -> torch.Tensor:
    """:func:`hals_block` in the sweep's layout: ``Zt (T, r, n)`` contiguous, swept in place
    and returned."""
    rows = _Rows(Zt, At, B, diag)
    if inner_max == 1:
        rows.sweep()
        return Zt
    active = first = None
    for j in range(inner_max):
        prev = Zt.clone()
        rows.sweep()
        d = Zt - prev
        change = (d * d).sum(dim=(-2, -1))
        if active is None:
            first = change
            active = change > 0
        else:
            Zt.copy_(torch.where(active[:, None, None], Zt, prev))
            active = active & (change > 0)
        active = active & (change >= delta * delta * first)
        if j + 1 < inner_max and not bool(active.any()):
            break
    return Zt


def hals_block(Z, A, B, inner_max: int = 1, delta: float = 0.1) -> torch.Tensor:
    """Up to ``inner_max`` sweeps of :func:`hals_sweep` on one block (A-SymHALS's inner loop).

    A trial stops sweeping once a sweep's squared change ``||Z^{j+1} - Z^j||_F^2`` falls
    below ``delta^2`` times its first sweep's (the accelerated HALS of Gillis and Glineur,
    with a fixed count in place of the authors' time bound: spec choice), or when it no
    longer moves. Trials that stopped keep their block while the others sweep on. The block's
    layout and views are made once for all its sweeps.

    Parameters
    ----------
    Z, A : torch.Tensor
        ``(T, n, r)``: the block's current value (not modified) and its data.
    B : torch.Tensor
        ``(T, r, r)``.

    Returns
    -------
    torch.Tensor
        ``(T, n, r)`` (a transposed view of contiguous ``(T, r, n)`` rows).
    """
    Zt = Z.transpose(-2, -1).clone(memory_format=torch.contiguous_format)
    return _rows_block(Zt, A.transpose(-2, -1), B, inner_max, delta).transpose(-2, -1)


def _block(Z, W, XW, lam2, lam3, inner_max, delta):
    """One block of (3) with the other factor ``W`` fixed, ``(T, n, r)``: the data of
    :func:`~.alternating.block_data` (the same operations) made in the sweep's layout, ``A^T``
    straight from ``(X W)^T`` (the product's own layout for a dense ``X``). ``lam2``, ``lam3``:
    ``lambda`` as ``(T, 1)`` and ``(T, 1, 1)``."""
    Wt = W.transpose(-2, -1)
    At = XW.transpose(-2, -1) + lam3 * Wt
    B = Wt @ W
    diag = B.diagonal(dim1=-2, dim2=-1).add_(lam2).unsqueeze(-1)
    Zt = Z.transpose(-2, -1).clone(memory_format=torch.contiguous_format)
    return _rows_block(Zt, At, B, inner_max, delta, diag).transpose(-2, -1)


class SymHALS:
    """SymHALS (``inner_max=1``) and A-SymHALS (``inner_max > 1``) on the split problem (3).

    Parameters
    ----------
    inner_max : int
        Sweeps of each block per outer iteration (A-SymHALS: default 10; spec choice).
    delta : float
        A-SymHALS's relative stopping threshold of the inner sweeps (default 0.1).
    """

    split = True
    state_names = ("U", "V")

    def __init__(self, inner_max: int = 1, delta: float = 0.1):
        if not isinstance(inner_max, int) or isinstance(inner_max, bool) or inner_max < 1:
            raise ConfigError(f"inner_max: must be an integer >= 1, got {inner_max!r}")
        if not 0 <= delta < 1:
            raise ConfigError(f"delta: must be in [0, 1), got {delta!r}")
        self.inner_max, self.delta = inner_max, float(delta)
        self.name = "symhals" if inner_max == 1 else "a_symhals"

    def options(self) -> dict:
        return {"inner_max": self.inner_max, "delta": self.delta}

    def init_state(self, sim, U0: torch.Tensor) -> dict:
        return {"U": U0.clone(), "V": U0.clone()}

    def step(self, sim, state, prods, lam):
        """One outer iteration: eq. (17) over the columns of ``U`` with ``V_{k-1}`` fixed, then
        of ``V`` with ``U_k`` (:func:`~.alternating.alternate`'s order).

        Returns ``(state, prods)`` with ``prods = {"XU": X U_k, "XV": X V_k}``; ``U_k`` and
        ``V_k`` are transposed views of contiguous ``(T, r, n)`` rows, the layout of the next
        sweep and of the product ``(X W)^T = W^T X``.
        """
        lam2 = lam[:, None]
        opts = (lam2, lam2[:, :, None], self.inner_max, self.delta)
        U = _block(state["U"], state["V"], prods["XV"], *opts)
        XU = sim.matmul(U)
        V = _block(state["V"], U, XU, *opts)
        return {"U": U, "V": V}, {"XU": XU, "XV": sim.matmul(V)}
