"""Geometry of the Stiefel manifold ``St(d, r) = {w : w^T w = I_r}`` and the workers' line
searches (step 1 of Algorithm 1, docs/SPARSE_PCA.md; Absil, Mahony and Sepulchre, ch. 3-4;
Ring and Wirth for the strong Wolfe conditions on a manifold).

Everything is batched over leading dimensions ``(...)`` (trials, workers): each batch entry
is one point ``w (d, r)`` with its own step size; no Python loop over entries. The line
searches take ``fg(w) -> (value (...), euclidean_gradient (..., d, r))``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["qf", "sym", "project_tangent", "riemannian_gradient", "retract", "retraction_derivative",
           "inner", "LineSearchResult", "armijo", "strong_wolfe", "ARMIJO_C1", "WOLFE_C1", "WOLFE_C2",
           "BACKTRACK", "MAX_LINE_SEARCH"]

#: Armijo's sufficient-decrease constant (Absil et al., Algorithm 1, ``sigma``)
ARMIJO_C1 = 1e-4
#: backtracking factor of the Armijo search (``beta``)
BACKTRACK = 0.5
#: the strong Wolfe constants ``0 < c_1 < c_2 < 1`` (the usual quasi-Newton pair)
WOLFE_C1 = 1e-4
WOLFE_C2 = 0.9
#: trial steps per line search before it gives up on a worker (its point is then kept)
MAX_LINE_SEARCH = 30


def inner(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Frobenius inner product over the last two dimensions: ``(..., d, r) -> (...)``."""
    return (a * b).sum(dim=(-2, -1))


def qf(Y: torch.Tensor) -> torch.Tensor:
    """The Q factor of the thin QR decomposition ``Y = QR`` with ``diag(R) > 0`` (eq. (17)).

    Parameters
    ----------
    Y : Tensor (..., d, r), ``d >= r``, full column rank

    Returns
    -------
    Tensor (..., d, r), ``Q^T Q = I_r``. The sign fix makes ``qf`` a function of ``Y``
    (LAPACK's Householder QR may return either sign per column); a zero diagonal entry
    (rank-deficient ``Y``) keeps its column as LAPACK returned it.
    """
    Q, R = torch.linalg.qr(Y, mode="reduced")
    s = torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))
    s = torch.where(s == 0, torch.ones_like(s), s)
    return Q * s.unsqueeze(-2)


def _qr_positive(Y):
    Q, R = torch.linalg.qr(Y, mode="reduced")
    s = torch.sign(torch.diagonal(R, dim1=-2, dim2=-1))
    s = torch.where(s == 0, torch.ones_like(s), s)
    return Q * s.unsqueeze(-2), R * s.unsqueeze(-1)


def sym(B: torch.Tensor) -> torch.Tensor:
    """``sym(B) = (B + B^T) / 2`` over the last two dimensions."""
    return 0.5 * (B + B.transpose(-2, -1))


def project_tangent(w: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Orthogonal projection onto the tangent space at ``w``: ``X - w sym(w^T X)`` (eq. (16))."""
    return X - w @ sym(w.transpose(-2, -1) @ X)


def riemannian_gradient(w: torch.Tensor, egrad: torch.Tensor) -> torch.Tensor:
    """``grad f(w) = P_{T_w}(nabla f(w))`` (eq. (15)) for the Euclidean gradient ``egrad``."""
    return project_tangent(w, egrad)


def retract(w: torch.Tensor, zeta: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """QR retraction ``R_w(theta zeta) = qf(w + theta zeta)`` (eq. (17)); ``theta (...)``."""
    return qf(w + theta[..., None, None] * zeta)


def _rho_skew(A):
    low = torch.tril(A, diagonal=-1)
    return low - low.transpose(-2, -1)


def retraction_derivative(w: torch.Tensor, zeta: torch.Tensor, theta: torch.Tensor):
    """The point ``Q = qf(w + theta zeta)`` and the curve's velocity ``dQ/dtheta``.

    ``D qf(Y)[zeta] = Q rho_skew(Q^T zeta R^{-1}) + (I - Q Q^T) zeta R^{-1}`` (Absil et al.,
    Example 8.1.5), ``rho_skew`` the strictly lower part minus its transpose. The strong Wolfe
    test uses it for ``phi'(theta) = <nabla f(Q), dQ/dtheta>``, the exact slope along the
    retraction curve (Ring and Wirth's condition with the differentiated retraction as the
    vector transport).

    Returns
    -------
    Q, dQ : Tensor (..., d, r)
    """
    Q, R = _qr_positive(w + theta[..., None, None] * zeta)
    # zeta R^{-1}: solve X R = zeta
    ZRi = torch.linalg.solve_triangular(R, zeta, upper=True, left=False)
    QtZRi = Q.transpose(-2, -1) @ ZRi
    dQ = Q @ _rho_skew(QtZRi) + ZRi - Q @ QtZRi
    return Q, dQ


@dataclass
class LineSearchResult:
    """One line search over a batch of workers.

    Attributes
    ----------
    w : Tensor (..., d, r)
        The accepted points (the old point where no step was accepted).
    value : Tensor (...)
        The objective there.
    theta : Tensor (...)
        The accepted step sizes (0 where none was accepted).
    accepted : Tensor (...) bool
        Where a step met the conditions (or none was needed: inactive or stationary entries).
    n_evals : int
        Trial steps taken (the batch's largest).
    """

    w: torch.Tensor
    value: torch.Tensor
    theta: torch.Tensor
    accepted: torch.Tensor
    n_evals: int


def _decrease_ok(v, value, c1, theta, slope):
    """Armijo's test, with a roundoff clause: where the decrease it asks for is below what the
    dtype resolves at ``|f(w)|`` (``16 eps |f(w)|``), any step that does not increase ``f``
    passes (else a converged worker would backtrack forever on rounding noise)."""
    need = c1 * theta * slope
    floor = 16.0 * torch.finfo(value.dtype).eps * value.abs()
    return (v <= value + need) | ((-need <= floor) & (v <= value))


def _resolved(value, theta0, slope):
    """Entries already stationary to the dtype's resolution: even the first trial's predicted
    decrease ``theta0 |phi'(0)|`` is below ``16 eps |f(w)|``. No trial step could be told apart
    from rounding noise there, so the search keeps their point (``theta = 0``, accepted) instead
    of backtracking ``max_steps`` times on noise (which made every worker of the batch wait)."""
    return theta0 * slope.abs() <= 16.0 * torch.finfo(value.dtype).eps * value.abs()


def armijo(fg: Callable, w, value, grad, theta0, *, c1=ARMIJO_C1, beta=BACKTRACK, max_steps=MAX_LINE_SEARCH,
           active=None) -> LineSearchResult:
    """Armijo backtracking along ``zeta = -grad`` (eq. (18); Absil et al., Algorithm 1).

    Accepts the first ``theta = theta0 beta^m`` with
    ``f(R_w(theta zeta)) <= f(w) - c1 theta ||grad||^2``, each batch entry on its own (with the
    roundoff clause of :func:`_decrease_ok`).

    Parameters
    ----------
    fg : callable, ``w (..., d, r) -> (value (...), egrad (..., d, r))``
    w : Tensor (..., d, r), on the manifold
    value : Tensor (...), ``f(w)``
    grad : Tensor (..., d, r), the Riemannian gradient at ``w``
    theta0 : Tensor (...), the first trial step of each entry
    active : Tensor (...) bool, optional
        Entries to move; the others keep their point and count as accepted with ``theta = 0``,
        as do entries stationary to rounding (:func:`_resolved`).
    """
    zeta = -grad
    slope = -inner(grad, grad)  # phi'(0) = <grad, zeta>
    done = _resolved(value, theta0, slope) if active is None else ~active | _resolved(value, theta0, slope)
    theta = theta0.clone()
    w_new, v_new = w.clone(), value.clone()
    accepted_theta = torch.zeros_like(theta)
    n = 0
    while n < max_steps and not bool(done.all()):
        n += 1
        cand = retract(w, zeta, theta)
        v, _ = fg(cand)
        ok = (~done) & _decrease_ok(v, value, c1, theta, slope)
        w_new = torch.where(ok[..., None, None], cand, w_new)
        v_new = torch.where(ok, v, v_new)
        accepted_theta = torch.where(ok, theta, accepted_theta)
        done = done | ok
        theta = torch.where(done, theta, theta * beta)
    return LineSearchResult(w_new, v_new, accepted_theta, done, n)


def strong_wolfe(fg: Callable, w, value, grad, theta0, *, c1=WOLFE_C1, c2=WOLFE_C2, max_steps=MAX_LINE_SEARCH,
                 active=None) -> LineSearchResult:
    """A step meeting the strong Wolfe conditions along ``zeta = -grad`` (Ring and Wirth).

    ``phi(theta) = f(R_w(theta zeta))``; accepted when
    ``phi(theta) <= phi(0) + c1 theta phi'(0)`` and ``|phi'(theta)| <= c2 |phi'(0)|``, with the
    exact slope of :func:`retraction_derivative`. The bracket is kept per entry and refined by
    bisection (expanding by 2 while no upper end is known; Lewis and Overton's scheme with the
    strong curvature test): a trial that fails the decrease test or whose slope is
    ``> c2 |phi'(0)|`` closes the bracket from above, one whose slope is ``< -c2 |phi'(0)|``
    from below. An entry left without an acceptable step after ``max_steps`` trials takes the
    bracket's lower end when that met the decrease test (``accepted`` stays False for it).

    Parameters and returns as :func:`armijo`.
    """
    zeta = -grad
    slope0 = -inner(grad, grad)
    done = _resolved(value, theta0, slope0) if active is None else ~active | _resolved(value, theta0, slope0)
    lo = torch.zeros_like(theta0)
    hi = torch.full_like(theta0, float("inf"))
    theta = theta0.clone()
    w_new, v_new = w.clone(), value.clone()
    acc_theta = torch.zeros_like(theta0)
    w_lo, v_lo = w.clone(), value.clone()
    n = 0
    while n < max_steps and not bool(done.all()):
        n += 1
        cand, dQ = retraction_derivative(w, zeta, theta)
        v, eg = fg(cand)
        dphi = inner(eg, dQ)
        armijo_ok = _decrease_ok(v, value, c1, theta, slope0)
        too_far = (~armijo_ok) | (dphi > c2 * slope0.abs())
        too_near = armijo_ok & (dphi < -c2 * slope0.abs())
        ok = (~done) & armijo_ok & ~too_far & ~too_near
        w_new = torch.where(ok[..., None, None], cand, w_new)
        v_new = torch.where(ok, v, v_new)
        acc_theta = torch.where(ok, theta, acc_theta)
        # the lowest point met the decrease test: the fallback
        move_lo = (~done) & too_near
        lo = torch.where(move_lo, theta, lo)
        w_lo = torch.where(move_lo[..., None, None], cand, w_lo)
        v_lo = torch.where(move_lo, v, v_lo)
        hi = torch.where((~done) & too_far, theta, hi)
        done = done | ok
        theta = torch.where(done, theta, torch.where(torch.isinf(hi), 2.0 * theta, 0.5 * (lo + hi)))
    fallback = (~done) & (lo > 0)
    w_new = torch.where(fallback[..., None, None], w_lo, w_new)
    v_new = torch.where(fallback, v_lo, v_new)
    acc_theta = torch.where(fallback, lo, acc_theta)
    return LineSearchResult(w_new, v_new, acc_theta, done, n)
