"""The baselines of the paper's Fig. 4, batched over trials like the split methods:
projected gradient descent on (2), the ADMM of Lu, Hong and Wang (2017), beta-SNMF
(He et al., 2011) and tSVD (Huang, Sidiropoulos and Swami, 2014). Kuang et al.'s method is
SymANLS under its 1.01 schedule (``method="kuang"``, :mod:`.symanls`).

Every method reads ``X`` only through products ``X W`` and reports the same metrics.
"""
from __future__ import annotations

import torch

from ...errors import ConfigError
from .nnls import nnls_bpp
from .objective import inner

__all__ = ["PGD", "ADMM", "BetaSNMF", "TSVD", "eig_factor", "procrustes"]

#: subspace iterations of :func:`eig_factor` for a sparse ``X``
SUBSPACE_ITERS = 100


def _sym_value(sqX, U, XU):
    """``1/2 ||X - U U^T||_F^2`` per trial from ``XU = X U``, ``(T,)``."""
    UtU = U.transpose(-2, -1) @ U
    return 0.5 * (sqX - 2 * inner(XU, U) + inner(UtU, UtU))


class PGD:
    """Projected gradient descent on (2), ``min_{U >= 0} 1/2 ||X - U U^T||_F^2``, with an
    Armijo backtracking step per trial (Lin's rule: grow the accepted step by 2 each
    iteration, halve it until ``f(U+) - f(U) <= sigma <grad f(U), U+ - U>``).

    The paper does not give its PGD's step rule (the authors' published code has no PGD);
    this is the standard one (choice), with two safeguards against the collapse to the
    stationary point ``U = 0`` (``f(0) = ||X||_F^2 / 2``, where the gradient vanishes and the
    method would stay for good):

    - the first step is ``1 / L_0``, ``L_0 = 6 ||U_0||_F^2 + 2 ||X||_F`` a bound on the
      Hessian's norm at ``U_0`` (``||grad^2 f(U)|| <= 6 ||U||_2^2 + 2 ||X||_2``), so that it
      follows the start's scale: from ``U_0`` uniform on ``[0, 1]`` and a normalized
      similarity, ``U U^T`` is orders of magnitude above ``X``, and the old ``1 / ||X||_F``
      moved every entry below zero in the first step (docs/RESULTS.md, Table I);
    - a candidate that is all zero is never accepted (while ``f(U) > f(0)`` the Armijo test
      accepts it however large the step).

    Parameters
    ----------
    step0 : float, optional
        The first trial step (default ``1 / (6 ||U_0||_F^2 + 2 ||X||_F)``).
    armijo : float
        ``sigma`` (default 0.01).
    max_backtracks : int
        Halvings per iteration (default 30); a trial that accepts none keeps its ``U``.
    """

    split = False
    state_names = ("U", "step")
    name = "pgd"

    def __init__(self, step0: float | None = None, armijo: float = 0.01, max_backtracks: int = 30):
        if step0 is not None and not step0 > 0:
            raise ConfigError(f"step0: must be > 0, got {step0!r}")
        if not 0 < armijo < 1:
            raise ConfigError(f"armijo: must be in (0, 1), got {armijo!r}")
        if not isinstance(max_backtracks, int) or max_backtracks < 1:
            raise ConfigError(f"max_backtracks: must be an integer >= 1, got {max_backtracks!r}")
        self.step0, self.armijo, self.max_backtracks = step0, float(armijo), max_backtracks

    def options(self) -> dict:
        return {"step0": self.step0, "armijo": self.armijo, "max_backtracks": self.max_backtracks}

    def init_state(self, sim, U0):
        T = U0.shape[0]
        s0 = (1.0 / (6 * inner(U0, U0) + 2 * sim.sq_norm_per_trial(T).to(U0.dtype).sqrt())) if self.step0 is None \
            else torch.full((T,), self.step0, dtype=U0.dtype, device=U0.device)
        # the first iteration doubles it
        return {"U": U0.clone(), "step": (s0 / 2).to(U0.dtype).clone()}

    def step(self, sim, state, prods, lam):
        """One projected gradient step, ``U+ = max(0, U - s grad f(U))``,
        ``grad f(U) = 2 (U U^T - X) U``."""
        U, XU = state["U"], prods["XU"]
        sqX = sim.sq_norm_per_trial(U.shape[0])
        grad = 2 * (U @ (U.transpose(-2, -1) @ U) - XU)
        f0 = _sym_value(sqX, U, XU)
        s = 2 * state["step"]
        searching = torch.ones_like(s, dtype=torch.bool)
        U_new, XU_new, s_ok = U, XU, s
        for _ in range(self.max_backtracks):  # backtracking halvings, every trial at once
            cand = (U - s[:, None, None] * grad).clamp_min(0)
            Xc = sim.matmul(cand)
            ok = searching & (cand.amax(dim=(-2, -1)) > 0) & (
                _sym_value(sqX, cand, Xc) - f0 <= self.armijo * inner(grad, cand - U))
            ok3 = ok[:, None, None]
            U_new, XU_new = torch.where(ok3, cand, U_new), torch.where(ok3, Xc, XU_new)
            s_ok = torch.where(ok, s, s_ok)
            searching = searching & ~ok
            if not bool(searching.any()):
                break
            s = torch.where(searching, s / 2, s)
        s_ok = torch.where(searching, s, s_ok)
        return {"U": U_new, "step": s_ok}, {"XU": XU_new, "XV": XU_new}


class BetaSNMF:
    """beta-SNMF's multiplicative update (He et al., 2011),
    ``U <- U * (1 - beta + beta (X U) / (U U^T U))``, ``beta = 1/2``."""

    split = False
    state_names = ("U",)
    name = "beta"

    def __init__(self, beta: float = 0.5):
        if not 0 < beta <= 1:
            raise ConfigError(f"beta: must be in (0, 1], got {beta!r}")
        self.beta = float(beta)

    def options(self) -> dict:
        return {"beta": self.beta}

    def init_state(self, sim, U0):
        return {"U": U0.clone()}

    def step(self, sim, state, prods, lam):
        U = state["U"]
        den = (U @ (U.transpose(-2, -1) @ U)).clamp_min(torch.finfo(U.dtype).tiny)
        U = U * (1 - self.beta + self.beta * prods["XU"] / den)
        XU = sim.matmul(U)
        return {"U": U}, {"XU": XU, "XV": XU}


class ADMM:
    """The ADMM of Lu, Hong and Wang (2017) on the split with an equality constraint,
    ``min 1/2 ||X - U V^T||_F^2`` s.t. ``U = V``, ``U >= 0``, with the augmented Lagrangian
    ``1/2 ||X - U V^T||^2 + <Lambda, U - V> + rho/2 ||U - V||^2`` (``rho``: the run's
    ``lambda``, fixed):

    - ``V <- (X U + Lambda + rho U)(U^T U + rho I)^{-1}`` (unconstrained, closed form);
    - ``U <- argmin_{U >= 0}`` of the Lagrangian ``+ prox/2 ||U - U_k||^2`` (an NNLS, solved
      exactly by :func:`~.nnls.nnls_bpp`; Lu, Hong and Wang linearize or add a proximal term:
      exact with ``prox = 0`` by default is a choice);
    - ``Lambda <- Lambda + rho (U - V)``.

    ``U`` (nonnegative) is the reported factor.
    """

    split = True
    state_names = ("U", "V", "L")
    name = "admm"

    def __init__(self, prox: float = 0.0):
        if not prox >= 0:
            raise ConfigError(f"prox: must be >= 0, got {prox!r}")
        self.prox = float(prox)

    def options(self) -> dict:
        return {"prox": self.prox}

    def init_state(self, sim, U0):
        return {"U": U0.clone(), "V": U0.clone(), "L": torch.zeros_like(U0)}

    def step(self, sim, state, prods, lam):
        U, L = state["U"], state["L"]
        rho = lam[:, None, None]
        eye = torch.eye(U.shape[-1], dtype=U.dtype, device=U.device)
        G = U.transpose(-2, -1) @ U + rho * eye
        rhs = prods["XU"] + L + rho * U
        V = torch.linalg.solve(G, rhs.transpose(-2, -1)).transpose(-2, -1)  # G symmetric
        XV = sim.matmul(V)
        G = V.transpose(-2, -1) @ V + (rho + self.prox) * eye
        C = XV - L + rho * V + self.prox * U
        U = nnls_bpp(G, C.transpose(-2, -1), init=U.transpose(-2, -1)).transpose(-2, -1)
        L = L + rho * (U - V)
        return {"U": U, "V": V, "L": L}, {"XU": sim.matmul(U), "XV": XV}


def eig_factor(sim, T: int, r: int) -> torch.Tensor:
    """``B = Q_r Lambda_r^{1/2}`` ``(T, n, r)``, ``X ~ B B^T`` from the ``r`` largest eigenvalues of
    ``X`` (those below zero clamped at 0: ``X`` need not be positive semidefinite).

    Dense ``X``: exact (``torch.linalg.eigh``). Sparse: :data:`SUBSPACE_ITERS` orthogonal
    (subspace) iterations through :meth:`Similarity.matmul` from a fixed random start, then
    Rayleigh-Ritz: the eigenvalues of largest modulus, approximately (choice: the core has no
    sparse eigensolver; ``torch.lobpcg`` needs ``n >= 3 r`` and COO input).
    """
    if not sim.sparse:
        vals, vecs = torch.linalg.eigh(sim.data)
        vals, vecs = vals[..., -r:], vecs[..., -r:]
        B = vecs * vals.clamp_min(0).sqrt().unsqueeze(-2)
        return B if sim.batched else B.unsqueeze(0).expand(T, -1, -1)
    gen = torch.Generator(device="cpu").manual_seed(0)
    Q = torch.rand((1, sim.n, r), generator=gen, dtype=torch.float64).to(sim.device, sim.dtype)
    for _ in range(SUBSPACE_ITERS):  # power iterations are sequential by definition
        Q = torch.linalg.qr(sim.matmul(Q)).Q
    vals, W = torch.linalg.eigh(Q.transpose(-2, -1) @ sim.matmul(Q))
    B = (Q @ W) * vals.clamp_min(0).sqrt().unsqueeze(-2)
    return B.expand(T, -1, -1)


def procrustes(B: torch.Tensor, U: torch.Tensor) -> torch.Tensor:
    """The orthogonal ``Q`` ``(T, r, r)`` that minimizes ``||U - B Q||_F``: ``Q = P W^T`` from the SVD
    ``B^T U = P Sigma W^T`` (orthogonal Procrustes)."""
    P, _, Wh = torch.linalg.svd(B.transpose(-2, -1) @ U)
    return P @ Wh


class TSVD:
    """tSVD (Huang, Sidiropoulos and Swami, 2014): with ``X ~ B B^T`` its rank-``r`` truncated
    eigendecomposition (:func:`eig_factor`, once), look for ``U = max(0, B Q)`` with ``Q``
    orthogonal, alternating

    - ``U <- max(0, B Q)``;
    - ``Q <- argmin_{Q^T Q = I} ||U - B Q||_F`` (:func:`procrustes`).

    ``Q_0`` is the Procrustes fit of ``U_0`` (so that every method starts from the same
    ``U_0``: a choice, not Huang et al.'s own start). Each iteration costs
    ``O(n r^2)`` plus the product ``X U`` of the metrics.
    """

    split = False
    state_names = ("U", "Q", "B")
    name = "tsvd"

    def options(self) -> dict:
        return {}

    def init_state(self, sim, U0):
        B = eig_factor(sim, U0.shape[0], U0.shape[-1]).to(U0.dtype)
        return {"U": U0.clone(), "Q": procrustes(B, U0), "B": B}

    def step(self, sim, state, prods, lam):
        B = state["B"]
        U = (B @ state["Q"]).clamp_min(0)
        XU = sim.matmul(U)
        return {"U": U, "Q": procrustes(B, U), "B": B}, {"XU": XU, "XV": XU}
