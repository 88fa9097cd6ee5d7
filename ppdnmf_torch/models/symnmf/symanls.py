"""SymANLS (Algorithm 1): each block of the split problem (3) solved exactly, an NNLS
(stacked form ``[V; sqrt(lambda) I] U^T ~ [X^T; sqrt(lambda) V^T]``, eq. (16)) by batched
block principal pivoting."""
from __future__ import annotations

from ...errors import ConfigError
from .alternating import alternate
from .nnls import nnls_bpp

__all__ = ["SymANLS", "anls_block"]


def anls_block(Z, A, B, max_iter=None):
    """The exact minimizer of one block, ``(T, n, r)``: every row ``z_j`` solves
    ``min_{z >= 0} 1/2 z^T B z - z^T a_j`` (the normal equations of the stacked NNLS), warm
    started from ``Z``'s passive sets."""
    return nnls_bpp(B, A.transpose(-2, -1), init=Z.transpose(-2, -1), max_iter=max_iter).transpose(-2, -1)


class SymANLS:
    """SymANLS on the split problem (3) (``name="kuang"``: the same iteration, which Kuang et
    al. run under their 1.01 penalty schedule).

    Parameters
    ----------
    name : str
    max_pivot_iter : int, optional
        Cap on the pivoting rounds of each NNLS (default ``5 r``).
    """

    split = True
    state_names = ("U", "V")

    def __init__(self, name: str = "symanls", max_pivot_iter: int | None = None):
        if max_pivot_iter is not None and (not isinstance(max_pivot_iter, int) or max_pivot_iter < 1):
            raise ConfigError(f"max_pivot_iter: must be an integer >= 1, got {max_pivot_iter!r}")
        self.name, self.max_pivot_iter = name, max_pivot_iter

    def options(self) -> dict:
        return {"max_pivot_iter": self.max_pivot_iter}

    def init_state(self, sim, U0):
        return {"U": U0.clone(), "V": U0.clone()}

    def step(self, sim, state, prods, lam):
        """One outer iteration: ``U_k`` by NNLS with ``V_{k-1}``, then ``V_k`` with ``U_k``."""
        U, V, prods = alternate(sim, state["U"], state["V"], prods, lam,
                                 lambda Z, A, B: anls_block(Z, A, B, self.max_pivot_iter))
        return {"U": U, "V": V}, prods
