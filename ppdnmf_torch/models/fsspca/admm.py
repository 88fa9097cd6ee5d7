"""Algorithm 1 of FSSPCA (consensus ADMM on the Stiefel manifold), batched over trials and
workers (docs/SPARSE_PCA.md; equation numbers are the paper's).

Shapes: ``T`` trials, ``K`` workers, ``d`` features, ``r`` loadings. The workers' points
``w (T, K, d, r)``, their duals ``u (T, K, d, r)``, the server's ``z (T, d, r)``. A worker
needs only its Gram matrix ``C_i = A_i^T A_i (d, d)`` and ``||A_i||_F^2``: workers with
different row counts need no padding (the Gram-only path). On ``St(d, r)``,
``f_i(w) = ||A_i - A_i w w^T||_F^2 = ||A_i||_F^2 - tr(w^T C_i w)``.

The unsmoothed ADMM of Tan et al. (the paper's baseline) is ``lambda_2 = 0``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ...errors import ConfigError
from . import manifold
from .polar import CURVATURE, LOCAL_SOLVERS, gram_times, polar_steps
from .smoothing import Smoothing, smooth_l1

__all__ = ["FSSPCAProblem", "ADMMState", "local_objective", "local_step", "soft_threshold", "upload", "z_step",
           "dual_step", "objective", "augmented_lagrangian", "adjusted_variance", "adjusted_variance_components", "residuals", "LINE_SEARCHES",
           "LOCAL_SOLVERS", "iteration_values", "stationarity"]

LINE_SEARCHES = ("armijo", "wolfe")


@dataclass
class FSSPCAProblem:
    """The workers' data as the algorithm needs it, trials first.

    Attributes
    ----------
    gram : Tensor (T, K, d, d)
        ``C_i = A_i^T A_i`` per trial and worker (an expanded view when trials share data).
    sqnorm : Tensor (T, K)
        ``||A_i||_F^2``.
    n_rows : Tensor (T, K)
        ``n_i``, the workers' row counts (for reporting; the algorithm does not need them).
    projector : Tensor (T, d, d) or None
        Deflation's ``G = I - Z_1 Z_1^T`` (Algorithm 4): gradients and points stay in its range.
    """

    gram: torch.Tensor
    sqnorm: torch.Tensor
    n_rows: torch.Tensor
    projector: torch.Tensor | None = None

    @property
    def n_trials(self) -> int:
        return self.gram.shape[0]

    @property
    def n_workers(self) -> int:
        return self.gram.shape[1]

    @property
    def n_features(self) -> int:
        return self.gram.shape[-1]

    def pooled_gram(self) -> torch.Tensor:
        """``sum_i C_i (T, d, d)``: the pooled ``A^T A`` (monitoring and experiments only)."""
        return self.gram.sum(dim=1)


@dataclass
class ADMMState:
    """The iterates of Algorithm 1 and each worker's last step size.

    Attributes
    ----------
    w, u : Tensor (T, K, d, r)
    z : Tensor (T, d, r)
    theta : Tensor (T, K)
        Each worker's next first trial step (twice its last accepted one).
    iteration : int
    """

    w: torch.Tensor
    u: torch.Tensor
    z: torch.Tensor
    theta: torch.Tensor
    iteration: int = 0
    line_search_evals: int = field(default=0)
    line_search_failures: int = field(default=0)


def _col(x, like):
    """A per-trial parameter ``(T,)`` as a tensor broadcastable against ``like (T, ...)``."""
    return x.reshape(x.shape + (1,) * (like.dim() - 1))


def _per_worker(z, w):
    return z[:, None] if z.dim() == w.dim() - 1 else z


def _rho2(rho):
    """``rho`` as ``(T, 1)`` (one per trial) or ``(T, K)`` (one per worker), against ``(T, K)``."""
    return rho[:, None] if rho.dim() == 1 else rho


def _rho4(rho):
    """``rho`` as ``(T, 1, 1, 1)`` or ``(T, K, 1, 1)``, against ``(T, K, d, r)``."""
    return _rho2(rho)[..., None, None]


def local_objective(problem, w, z, u, lambda_2, rho, smoothing: Smoothing, mu):
    """The worker's subproblem (14), value and Euclidean gradient.

    ``h_i(w) = f_i(w) + lambda_2 r(w) + rho/2 ||w - z + u_i/rho||^2``;
    ``nabla h_i = -2 C_i w + lambda_2 psi'(w) + rho (w - z) + u_i``.

    Parameters
    ----------
    w, u : Tensor (T, K, d, r)
    z : Tensor (T, d, r), or (T, K, d, r): each worker its own (the serverless variant)
    lambda_2 : Tensor (T,)
    rho : Tensor (T,) or (T, K)
        One penalty per trial, or each worker its own ``rho_i`` (:func:`worker_rho`).

    Returns
    -------
    value : Tensor (T, K); egrad : Tensor (T, K, d, r)
    """
    Cw = problem.gram @ w
    lam = lambda_2[:, None]
    shift = w - _per_worker(z, w) + u / _rho4(rho)
    value = (problem.sqnorm - manifold.inner(w, Cw) + lam * smooth_l1(w, smoothing, mu)
             + 0.5 * _rho2(rho) * manifold.inner(shift, shift))
    egrad = -2.0 * Cw + lam[..., None, None] * smoothing.grad(w, mu) + _rho4(rho) * shift
    if problem.projector is not None:
        egrad = problem.projector[:, None] @ egrad
    return value, egrad


def local_step(problem, state, lambda_2, rho, smoothing, mu, *, line_search="armijo", inner_steps=1,
               active=None, solver="riemannian", smooth=None, product=False):
    """Step 1 of Algorithm 1, eq. (14): ``inner_steps`` steps of every worker from its current
    ``w_i`` on its subproblem.

    ``solver="riemannian"``: the paper's Riemannian steepest-descent steps, each with its own line
    search and step size. ``solver="polar"``: majorize-minimize polar steps
    (:func:`.polar.polar_steps`; no line search, ``state.theta`` and the counters unchanged).

    Parameters
    ----------
    active : Tensor (T,) bool, optional
        Trials still running; the others are left as they are.
    solver : {"riemannian", "polar"}
    smooth : bool, optional
        The polar step's: whether any ``lambda_2`` is nonzero (None: checked per call).
    product : bool
        Also return ``C_i w_i`` at the new points where the polar steps have it (``active`` None
        and not deflated; :func:`.polar.polar_steps`), else None: ``(w, Cw)``.

    Returns
    -------
    Tensor (T, K, d, r): the new ``w``; ``state.theta`` and the line-search counters are updated.
    """
    if solver == "polar":
        target = _rho4(rho) * _per_worker(state.z, state.w) - state.u
        want = product and active is None  # a masked w would not match the product
        out = polar_steps(problem.gram, state.w, target, lambda_2, smoothing, mu, inner_steps,
                          projector=problem.projector, smooth=smooth, product=want)
        w, Cw = out if want else (out, None)
        if active is not None:
            w, Cw = torch.where(active[:, None, None, None], w, state.w), None
        return (w, Cw) if product else w
    search = {"armijo": manifold.armijo, "wolfe": manifold.strong_wolfe}[line_search]
    z, u = state.z, state.u

    def fg(w):
        return local_objective(problem, w, z, u, lambda_2, rho, smoothing, mu)

    w = state.w
    act = None if active is None else active[:, None].expand(w.shape[:2])
    for _ in range(inner_steps):
        value, egrad = fg(w)
        grad = manifold.riemannian_gradient(w, egrad)
        res = search(fg, w, value, grad, state.theta, active=act)
        w = res.w
        # the next search starts from twice the accepted step; a worker whose search failed
        # keeps its first trial (shrinking it would only slow the worker down for good)
        state.theta = torch.where(res.theta > 0, 2.0 * res.theta, state.theta)
        state.line_search_evals += res.n_evals
        state.line_search_failures += int((~res.accepted).sum())
    return (w, None) if product else w


def soft_threshold(v: torch.Tensor, tau) -> torch.Tensor:
    """``sign(v) max(|v| - tau, 0)`` elementwise (eq. (13)); ``tau`` broadcasts against ``v``."""
    return torch.sign(v) * (v.abs() - tau).clamp_min(0)


def upload(w, u, rho, rho_mean=None):
    """What worker ``i`` sends for step 2 (its share of the server's sum), ``(T, K, d, r)``.

    One ``rho (T,)``: ``w_i + u_i / rho``. Each worker its own ``rho (T, K)``, with
    ``rho_mean (T,)`` the workers' mean ``rho_i``: ``(rho_i w_i + u_i) / rho_mean``, so that the
    sum is ``sum_i (rho_i w_i + u_i) / rho_mean`` and :func:`z_step` with ``rho_mean`` is the
    exact minimizer of (12) with per-worker penalties (Boyd et al., section 7.1, with ``rho_i``).
    """
    if rho.dim() == 1:
        return w + u / _rho4(rho)
    return (_rho4(rho) * w + u) / _rho4(rho_mean)


def z_step(total, n_workers, lambda_1, rho):
    """Step 2 of Algorithm 1, eqs. (12)-(13), on the server.

    Parameters
    ----------
    total : Tensor (T, d, r)
        The sum of the workers' :func:`upload` (``sum_i (w_i + u_i / rho)`` for one ``rho``),
        the only thing the server needs (its aggregate).
    lambda_1 : Tensor (T,)
    rho : Tensor (T,)
        The penalty, or the workers' mean ``rho_i`` when each has its own.

    Returns
    -------
    Tensor (T, d, r): ``z = soft(v, lambda_1 / (K rho))``, ``v = total / K``.
    """
    v = total / n_workers
    return soft_threshold(v, _col(lambda_1 / (n_workers * rho), v))


def dual_step(u, w, z, rho):
    """Step 3 of Algorithm 1: ``u_i <- u_i + rho_i (w_i - z)`` on each worker (``z (T, d, r)``, or
    ``(T, K, d, r)`` per worker; ``rho (T,)`` or ``(T, K)``)."""
    return u + _rho4(rho) * (w - _per_worker(z, w))


def objective(problem, w, z, lambda_1, lambda_2, smoothing, mu, Cw=None):
    """Objective (6) at the iterates: ``sum_i [f_i(w_i) + lambda_2 r(w_i)] + lambda_1 ||z||_1``; ``(T,)``.

    ``Cw (T, K, d, r)``, optional: ``C_i w_i`` where the caller has it (the polar steps' product,
    :func:`.polar.gram_times`'s bits); else computed here (by the polar steps' kernels).
    """
    f = problem.sqnorm - manifold.inner(w, gram_times(problem.gram, w) if Cw is None else Cw)
    return (f + lambda_2[:, None] * smooth_l1(w, smoothing, mu)).sum(dim=1) + lambda_1 * z.abs().sum(dim=(-2, -1))


def augmented_lagrangian(problem, w, z, u, lambda_1, lambda_2, rho, smoothing, mu):
    """``L_rho`` of Algorithm 1 (eq. (7)); ``(T,)``."""
    gap = w - z[:, None]
    return (objective(problem, w, z, lambda_1, lambda_2, smoothing, mu)
            + (manifold.inner(u, gap) + 0.5 * _rho2(rho) * manifold.inner(gap, gap)).sum(dim=1))


def residuals(w, z, z_old, rho):
    """Primal ``sqrt(sum_i ||w_i - z||^2)``, dual ``sqrt(sum_i rho_i^2) ||z - z_old||`` (``rho
    sqrt(K) ||z - z_old||`` for one ``rho``) and consensus ``max_i ||w_i - z||``, each ``(T,)``
    (Boyd et al., section 7.1)."""
    gap = torch.linalg.matrix_norm(w - z[:, None])
    K = w.shape[1]
    primal = gap.square().sum(dim=1).sqrt()
    weight = rho * K ** 0.5 if rho.dim() == 1 else torch.linalg.vector_norm(rho, dim=1)
    dual = weight * torch.linalg.matrix_norm(z - z_old)
    return primal, dual, gap.amax(dim=1)


def stationarity(problem, w, u, lambda_2, rho, smoothing, mu):
    """The workers' KKT residual of problem (6) in consensus form, in the units of the loadings.

    At a KKT point of ``sum_i [f_i(w_i) + lambda_2 r(w_i)] + lambda_1 ||z||_1`` subject to
    ``w_i = z`` on ``St(d, r)``, each worker's Riemannian gradient of its part of the Lagrangian
    vanishes, ``g_i = P_{T_{w_i}}(-2 C_i w_i + lambda_2 psi'(w_i) + u_i) = 0`` (eq. (15)); the
    z-step (12)-(13) meets its own condition ``sum_i u_i in lambda_1 d||z||_1`` exactly after
    every iteration, and :func:`residuals` measures ``w_i = z``. ``g_i / rho_i`` is what one
    ADMM iteration would move ``w_i`` for it, so ``sqrt(sum_i ||g_i / rho_i||^2 / (K r))`` is
    scale-free (data times ``c`` multiplies ``C_i``, ``u_i`` and ``rho_i`` by ``c^2``), comparable
    with the stopping rule's RMS consensus gap and change of ``z``.

    Parameters
    ----------
    w, u : Tensor (T, K, d, r)
    lambda_2 : Tensor (T,)
    rho : Tensor (T,) or (T, K)

    Returns
    -------
    Tensor (T,)
    """
    # local_objective with z = w: its gradient is -2 C_i w_i + lambda_2 psi'(w_i) + u_i
    # (projected by deflation's G, as the local step sees it)
    _, egrad = local_objective(problem, w, w, u, lambda_2, rho, smoothing, mu)
    g = manifold.riemannian_gradient(w, egrad) / _rho4(rho)
    K, r = w.shape[1], w.shape[-1]
    return torch.linalg.matrix_norm(g).square().sum(dim=1).div(K * r).sqrt()


def iteration_values(problem, pooled, w, z, z_old, u, lambda_1, lambda_2, rho, smoothing, mu, Cw=None):
    """Every per-iteration value of the server's loop in one pass, bit for bit those of
    :func:`objective`, :func:`augmented_lagrangian`, :func:`adjusted_variance` and
    :func:`residuals` (the objective, the gaps ``w_i - z`` and ``||z - z_old||`` are computed once
    and shared).

    Parameters
    ----------
    pooled : Tensor (T, d, d)
        ``sum_i C_i`` (:meth:`FSSPCAProblem.pooled_gram`).
    w, u : Tensor (T, K, d, r)
        The new points and duals.
    z, z_old : Tensor (T, d, r)
        The new and the previous consensus.

    Returns
    -------
    values : dict of Tensor (T,)
        ``objective``, ``lagrangian``, ``explained_variance``, ``sparsity``, ``consensus``,
        ``primal_residual``, ``dual_residual`` (:data:`.result.HISTORY_KEYS`).
    change : Tensor (T,)
        ``||z - z_old|| / sqrt(r)``, the stopping rule's change of ``z``.

    ``Cw``: as :func:`objective`'s.
    """
    gap = w - z[:, None]
    obj = objective(problem, w, z, lambda_1, lambda_2, smoothing, mu, Cw)
    lag = obj + (manifold.inner(u, gap) + 0.5 * _rho2(rho) * manifold.inner(gap, gap)).sum(dim=1)
    gap_norm = torch.linalg.matrix_norm(gap)
    K = w.shape[1]
    weight = rho * K ** 0.5 if rho.dim() == 1 else torch.linalg.vector_norm(rho, dim=1)
    step = torch.linalg.matrix_norm(z - z_old)
    values = dict(objective=obj, lagrangian=lag, explained_variance=adjusted_variance(pooled, z),
                  sparsity=(z == 0).to(w.dtype).mean(dim=(-2, -1)), consensus=gap_norm.amax(dim=1),
                  primal_residual=gap_norm.square().sum(dim=1).sqrt(), dual_residual=weight * step)
    return values, step / math.sqrt(z.shape[-1])


def adjusted_variance_components(gram: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Each loading's adjusted variance ``R_jj^2`` (Zou, Hastie and Tibshirani, section 3.4).

    The scores ``A v_j`` of non-orthogonal loadings are correlated; with ``A V = QR`` the
    adjusted variance of loading ``j`` is ``R_jj^2``, the residual variance of score ``j`` after
    regressing it on the earlier scores, computed from the Gram matrix alone. Loadings are
    normalized to unit length first; a zero column explains nothing.

    Parameters
    ----------
    gram : Tensor (T, d, d), ``A^T A``
    V : Tensor (T, d, r)

    Returns
    -------
    Tensor (T, r), in the units of ``A^T A`` (divide by ``n - 1`` for variances).
    """
    norms = torch.linalg.vector_norm(V, dim=-2, keepdim=True)
    Vn = torch.where(norms > 0, V / norms.clamp_min(torch.finfo(V.dtype).tiny), torch.zeros_like(V))
    M = Vn.transpose(-2, -1) @ gram @ Vn  # score covariance (T, r, r)
    out = []
    for j in range(M.shape[-1]):  # r is small; the columns are sequential by definition
        res = M[..., j, j]
        if j == 1:
            # pinv of a 1 x 1 matrix is 1 / x (0 at x = 0), exactly: the same numbers as the
            # general case below without an eigendecomposition
            b, m = M[..., :1, 1], M[..., :1, 0]
            res = res - (b * (torch.where(m != 0, m.reciprocal(), 0.0) * b)).sum(-1)
        elif j:
            b = M[..., :j, j]
            res = res - (b * (torch.linalg.pinv(M[..., :j, :j], hermitian=True) @ b.unsqueeze(-1)).squeeze(-1)).sum(-1)
        out.append(res.clamp_min(0))
    return torch.stack(out, dim=-1)


def adjusted_variance(gram: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Adjusted explained variance of loadings ``V (T, d, r)`` as a fraction of ``tr(A^T A)``:
    ``sum_j R_jj^2 / tr(A^T A)`` (:func:`adjusted_variance_components`); ``(T,)``."""
    return adjusted_variance_components(gram, V).sum(-1) / torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)


def check_settings(line_search, inner_steps, mu, solver="riemannian", smoothing=None):
    """Reject unknown line searches or local solvers, a non-positive step count or ``mu``, and
    a smoothing the polar step has no curvature bound for."""
    if solver not in LOCAL_SOLVERS:
        raise ConfigError(f"local_solver: unknown local solver {solver!r}; use one of {list(LOCAL_SOLVERS)}")
    if solver == "polar" and smoothing is not None and smoothing.name not in CURVATURE:
        raise ConfigError(f"smoothing: the polar step needs the curvature bound of {smoothing.name!r}; "
                          f"use one of {sorted(CURVATURE)} or local_solver='riemannian'")
    if line_search not in LINE_SEARCHES:
        raise ConfigError(f"line_search: unknown line search {line_search!r}; use one of {list(LINE_SEARCHES)}")
    if int(inner_steps) < 1:
        raise ConfigError(f"inner_steps: must be >= 1, got {inner_steps}")
    if not mu > 0:
        raise ConfigError(f"mu: must be > 0, got {mu}")
