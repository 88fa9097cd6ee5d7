"""Least-squares local losses: ``f_i(x) = 1/2 ||A_i x - b_i||^2`` and ``f_i(X) = 1/2 ||Z_i - X Y_i||_F^2``.

Both are held as ``f_i(X) = 1/2 tr(X H_i X^T) - <C_i, X> + const`` with the Gram matrix
``H_i (K, K)`` and the cross term ``C_i (L, K)`` (a vector variable is the row ``L = 1``,
kept in the user's shape ``(p,)``). The exact step (4a)/(12) is

    X = (C_i + y + c z) (H_i + c I)^{-1},   c = rho gamma,

and ``H_i``'s eigendecomposition ``Q diag(lam) Q^T``, taken once, makes every ``c`` cheap:
``X = ((C_i + y + c z) Q / (lam + c)) Q^T`` (the spec's "As PPDNMF's X-step").
"""
from __future__ import annotations

import torch

from ..errors import DataError
from .losses import LocalLoss, take_agent

__all__ = ["LeastSquares", "as_batched", "check_same_lead"]


def as_batched(t, ndim: int, name: str, check_finite: bool = True) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise DataError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise DataError(f"{name}: expected a floating-point tensor, got {t.dtype}")
    if t.ndim == ndim - 1:
        t = t.unsqueeze(0)
    if t.ndim != ndim:
        raise DataError(f"{name}: expected {ndim - 1} or {ndim} dimensions (with a leading batch "
                        f"dimension), got shape {tuple(t.shape)}")
    if check_finite and not bool(torch.isfinite(t).all()):
        raise DataError(f"{name}: contains NaN or infinite entries")
    return t


def check_same_lead(a, b, na: str, nb: str, dims: int = 2):
    if a.shape[1] != b.shape[1]:
        raise DataError(f"{nb}: has {b.shape[1]} agents but {na} has {a.shape[1]}")
    if a.shape[0] != b.shape[0] and 1 not in (a.shape[0], b.shape[0]):
        raise DataError(f"{nb}: batch size {b.shape[0]} does not match {na}'s {a.shape[0]} (nor is either 1)")


class LeastSquares(LocalLoss):
    """``f_i(X) = 1/2 tr(X H_i X^T) - <C_i, X>`` (+ const), with its exact step.

    Parameters
    ----------
    gram : Tensor (Bd, N, K, K) or (N, K, K)
        ``H_i``, symmetric positive semidefinite.
    cross : Tensor (Bd, N, K) / (N, K) for a vector variable, or (Bd, N, L, K) / (N, L, K)
        ``C_i``: the gradient is ``X H_i - C_i``.

    check_finite : bool
        Refuse NaN or infinite entries (False: a caller with its own finiteness check, such
        as PPDNMF's solver, lets them through to the iterates).

    Notes
    -----
    Use :meth:`from_samples` for ``1/2 sum_j (o_ij^T x - t_ij)^2`` and :meth:`from_factors`
    for PPDNMF's ``1/2 ||Z_i - X Y_i||_F^2``. Zero-padded samples or columns contribute nothing.
    """

    def __init__(self, gram: torch.Tensor, cross: torch.Tensor, _eig=None, *, check_finite: bool = True):
        H = as_batched(gram, 4, "gram", check_finite)
        vector = isinstance(cross, torch.Tensor) and cross.ndim in (2, 3) and cross.ndim == gram.ndim - 1
        C = as_batched(cross, 3 if vector else 4, "cross", check_finite)
        check_same_lead(H, C, "gram", "cross")
        K = H.shape[-1]
        if H.shape[-2] != K:
            raise DataError(f"gram: each H_i must be square, got {tuple(H.shape[-2:])}")
        if C.shape[-1] != K:
            raise DataError(f"cross: last dimension {C.shape[-1]} does not match gram's K = {K}")
        if C.dtype != H.dtype or C.device != H.device:
            raise DataError(f"cross: dtype/device {C.dtype}/{C.device} differ from gram's {H.dtype}/{H.device}")
        self.vector = vector
        self.H, self.C = H, C
        self.n_agents = H.shape[1]
        self.shape = tuple(C.shape[2:])
        self.batch_size = max(H.shape[0], C.shape[0])
        self.device, self.dtype = H.device, H.dtype
        if _eig is None:
            lam, Q = torch.linalg.eigh(H)
        else:
            lam, Q = _eig
        self.lam, self.Q, self.Qt = lam, Q, Q.transpose(-1, -2)

    # -- constructors ------------------------------------------------------------------
    @classmethod
    def from_samples(cls, inputs: torch.Tensor, targets: torch.Tensor) -> "LeastSquares":
        """``f_i(x) = 1/2 sum_j (o_ij^T x - t_ij)^2`` (Sec. V's least squares).

        Parameters
        ----------
        inputs : Tensor (Bd, N, b, p) or (N, b, p)
            ``o_ij``.
        targets : Tensor (Bd, N, b) or (N, b)
            ``t_ij``.
        """
        O = as_batched(inputs, 4, "inputs")
        t = as_batched(targets, 3, "targets")
        check_same_lead(O, t, "inputs", "targets")
        if t.shape[2] != O.shape[2]:
            raise DataError(f"targets: {t.shape[2]} samples per agent, but inputs has {O.shape[2]}")
        H = O.transpose(-1, -2) @ O
        C = (O.transpose(-1, -2) @ t.unsqueeze(-1)).squeeze(-1)
        return cls(H, C)

    @classmethod
    def from_factors(cls, Z: torch.Tensor, Y: torch.Tensor) -> "LeastSquares":
        """``f_i(X) = 1/2 ||Z_i - X Y_i||_F^2`` with ``X (L, K)`` (PPDNMF's X-step).

        Parameters
        ----------
        Z : Tensor (Bd, N, L, M) or (N, L, M)
        Y : Tensor (Bd, N, K, M) or (N, K, M)
            Zero-padded columns (``M = M_max``) are allowed: they add nothing.
        """
        Zb = as_batched(Z, 4, "Z")
        Yb = as_batched(Y, 4, "Y")
        check_same_lead(Zb, Yb, "Z", "Y")
        if Zb.shape[-1] != Yb.shape[-1]:
            raise DataError(f"Y: {Yb.shape[-1]} columns per agent, but Z has {Zb.shape[-1]}")
        Yt = Yb.transpose(-1, -2)
        return cls(Yb @ Yt, Zb @ Yt)

    # -- the protocol ------------------------------------------------------------------
    def _rows(self, X):
        return X.unsqueeze(-2) if self.vector else X

    def _unrows(self, X):
        return X.squeeze(-2) if self.vector else X

    def grad(self, agent, x):
        """``X H_i - C_i``; ``x (B, *shape)``."""
        H = take_agent(self.H, agent)
        return self._unrows(self._rows(x) @ H) - take_agent(self.C, agent)

    def exact_step(self, agent, z, y, c):
        """``(C_i + y + c z)(H_i + c I)^{-1}`` through ``H_i = Q diag(lam) Q^T`` (eq. 4a / 12)."""
        R = self._rows(take_agent(self.C, agent) + y + c * z)
        cm = c.unsqueeze(-1) if self.vector else c
        lam = take_agent(self.lam, agent).unsqueeze(-2)
        X = ((R @ take_agent(self.Q, agent)) / (lam + cm)) @ take_agent(self.Qt, agent)
        return self._unrows(X)

    def relabel(self, perm):
        B = perm.shape[0]
        rows = torch.arange(B, device=perm.device).unsqueeze(1)

        def g(t):
            return t.expand(B, *t.shape[1:])[rows, perm]

        return LeastSquares(g(self.H), g(self.C), _eig=(g(self.lam), g(self.Q)), check_finite=False)

    def solution(self) -> torch.Tensor:
        """The centralized minimiser ``X* = (sum_i C_i)(sum_i H_i)^{-1}``, in float64 then cast.

        Returns
        -------
        Tensor (Bd, *shape)

        Raises
        ------
        DataError
            If ``sum_i H_i`` is singular (no unique minimiser).
        """
        Hs = self.H.double().sum(1)
        Cs = self._rows(self.C.double().sum(1))
        try:
            X = torch.linalg.solve(Hs, Cs.transpose(-1, -2)).transpose(-1, -2)
        except RuntimeError as err:
            raise DataError(f"gram: sum_i H_i is singular, the minimiser is not unique ({err})") from None
        return self._unrows(X).to(self.dtype)
