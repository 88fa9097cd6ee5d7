"""The workers' local step (14) by majorize-minimize: one polar decomposition per step,
batched over trials and workers (docs/FSSPCA.md, "The polar step").

A worker's subproblem (14) on ``St(d, r)`` is

    h(w) = f(w) + lambda_2 r(w) + rho/2 ||w - z + u/rho||^2,   f(w) = q - tr(w^T C w).

Each step replaces ``h`` by a function ``g(. ; x)`` that lies above it on the manifold and
touches it at the current point ``x``, and minimizes ``g`` exactly:

* ``-tr(w^T C w)`` is concave (``C`` is a Gram matrix, positive semidefinite): its tangent
  plane lies above it, ``-tr(w^T C w) <= -tr(x^T C x) - 2 <C x, w - x>``;
* ``r(w) = sum psi_mu(w_ij)`` has a Lipschitz gradient with constant ``kappa / mu``
  (:data:`CURVATURE`, the largest ``psi_mu''``), so the descent lemma gives
  ``r(w) <= r(x) + <psi'(x), w - x> + kappa / (2 mu) ||w - x||^2``;
* on the manifold ``||w||^2 = r`` and ``||w - x||^2 = 2 r - 2 <w, x>`` are affine in ``w``, so the
  proximal term and the descent lemma's quadratic are linear there.

Together ``h(w) <= g(w; x) = c(x) - <M(x), w>`` on ``St(d, r)``, with

    M(x) = 2 C x + rho z - u - lambda_2 psi'(x) + lambda_2 (kappa / mu) x,

and ``argmin_{w in St} -<M, w> = polar(M) = U V^T`` (``M = U S V^T``, the thin SVD). The step
``x+ = polar(M(x))`` therefore never increases ``h``: ``h(x+) <= g(x+; x) <= g(x; x) = h(x)``.
Without smoothing (``lambda_2 = 0``) it is the plain MM step ``polar(2 C x + rho z - u)``.

Its fixed points are the points where ``grad h = 0`` on the manifold (and ``x^T M(x)`` is
positive definite): ``M(x) = -nabla h(x) + (rho + lambda_2 kappa / mu) x``, and
``polar(M) = x`` exactly when ``(I - x x^T) nabla h(x) = 0`` and ``x^T nabla h(x)`` is symmetric,
that is, where the Riemannian gradient of :func:`.manifold.riemannian_gradient` vanishes. So
the polar step and the paper's Riemannian steps solve the same subproblem; the polar step
needs no line search (no trial points) and per worker and step one product ``x^T C_i`` and
one polar factor, computed from the ``r x r`` Gram matrix ``M^T M`` (:func:`polar`; the thin SVD
of the ``d x r`` matrix only where ``M`` is ill-conditioned, one host check per step).

The products and the polar factor are two kernels chosen by the tensors' device and dtype
(:func:`kernels_for`): on the CPU NumPy's (its batched matrix product of these skinny shapes
and its small dense algebra cost a fraction of torch's per call there), elsewhere torch's.

Deflation (Algorithm 4): ``polar(G M)`` lies in the range of ``G`` and maximizes ``<M, w>`` over
the points of ``St(d, r)`` in that range, so the step stays on ``St_G``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .smoothing import Smoothing

__all__ = ["CURVATURE", "GRAM_RATIO", "LOCAL_SOLVERS", "polar", "polar_svd", "smooth_weight", "polar_steps", "kernels_for", "gram_times",
           "TorchKernels", "NumpyKernels", "polar_rows_array"]

#: the local solvers of step 1: the polar MM step (this module) and the paper's Riemannian
#: steepest descent with a line search (:mod:`.manifold`)
LOCAL_SOLVERS = ("polar", "riemannian")

#: ``kappa`` of each smoothing: ``sup_x psi_mu''(x) = kappa / mu`` (attained at ``x = 0``):
#: ``sqrt(4 mu^2 + x^2)``: ``4 mu^2 / (4 mu^2 + x^2)^{3/2}``; Huber: ``1 / mu`` on ``|x| < mu``;
#: log-exp: ``sech^2(x / (2 mu)) / (2 mu)``; erf: ``sqrt(2 / pi) e^{-x^2 / (2 mu^2)} / mu``
CURVATURE = {"sqrt": 0.5, "huber": 1.0, "logexp": 0.5, "erf": math.sqrt(2.0 / math.pi)}


#: the polar steps run worker chunks whose Gram matrices take at most this many bytes (at least
#: one worker per chunk), all steps of a chunk before the next, so that the matrices stay in the
#: cache between steps (chosen on the development machine: 1 MiB L2 per core, 32 MiB L3)
CHUNK_BYTES = 2 ** 22

#: the Gram form of the polar factor is used where the Gram matrix's smallest eigenvalue is at
#: least this fraction of its largest (``cond(M) <= 1 / sqrt(GRAM_RATIO)``, about 32): its
#: rounding error grows like ``eps / ratio``, so there it stays within about ``1e3 eps`` of the
#: SVD's factor; a worse-conditioned (or rank-deficient) ``M`` takes the thin SVD
GRAM_RATIO = 1e-3


def polar_svd(M: torch.Tensor) -> torch.Tensor:
    """The polar factor ``U V^T`` of ``M = U S V^T`` by the thin SVD (the reference of
    :func:`polar`, and its fallback).

    Parameters
    ----------
    M : Tensor (..., d, r), ``d >= r``

    Returns
    -------
    Tensor (..., d, r)
    """
    U, _, Vh = torch.linalg.svd(M, full_matrices=False)
    return U @ Vh


def polar(M: torch.Tensor) -> torch.Tensor:
    """The polar factor ``U V^T`` of ``M = U S V^T``: the point of ``St(d, r)`` nearest to ``M``,
    and the maximizer of ``<M, w>`` over it.

    Computed from the ``r x r`` Gram matrix, ``M (M^T M)^{-1/2}`` (one batched ``eigh`` of
    ``M^T M``), which for a skinny ``M`` costs a fraction of the SVD of the ``d x r`` matrix;
    where ``M^T M`` is ill-conditioned (:data:`GRAM_RATIO`) the thin SVD (:func:`polar_svd`).

    Parameters
    ----------
    M : Tensor (..., d, r), ``d >= r``

    Returns
    -------
    Tensor (..., d, r) with orthonormal columns (unique where ``M`` has full column rank).
    """
    return TORCH.polar_rows(M.transpose(-2, -1)).transpose(-2, -1)


class TorchKernels:
    """The polar steps' two kernels in torch (any device): ``b + alpha x C`` by ``baddbmm`` and
    the polar factor by the Gram form (:func:`polar`)."""

    name = "torch"

    @staticmethod
    def xtc(b, x, C, alpha):
        """``b + alpha x C`` for ``x (B, m, d)``, ``C (B, d, d)``, ``b (B, m, d)``."""
        return torch.baddbmm(b, x, C, alpha=alpha)

    @staticmethod
    def xt(x, C):
        """``x C`` for ``x (..., m, d)``, ``C (..., d, d)`` (broadcast batch dimensions): ``(C w)^T``
        for ``x = w^T`` and a symmetric ``C``."""
        return x @ C

    @staticmethod
    def polar_rows(Mt):
        """``polar(M)^T`` from ``M^T (..., r, d)``."""
        S = Mt @ Mt.transpose(-2, -1)
        e, V = torch.linalg.eigh(S)
        bad = e[..., 0] <= GRAM_RATIO * e[..., -1]
        Q = ((V * e.clamp_min(torch.finfo(e.dtype).tiny).rsqrt().unsqueeze(-2)) @ V.transpose(-2, -1)) @ Mt
        if bool(bad.any()):  # rare: the SVD for those points only
            Q[bad] = polar_svd(Mt[bad].transpose(-2, -1)).transpose(-2, -1)
        return Q


class NumpyKernels:
    """The same kernels through NumPy, for CPU tensors (zero-copy views both ways): on the
    development machine's CPU NumPy's batched matrix product of these skinny shapes and its small
    ``eigh`` took a fraction of torch's per-call time (docs/PERFORMANCE.md, FSSPCA)."""

    name = "numpy"

    @staticmethod
    def xtc(b, x, C, alpha):
        out = np.matmul(x.numpy(), C.numpy())
        out *= alpha
        out += b.numpy()
        return torch.from_numpy(out)

    @staticmethod
    def xt(x, C):
        return torch.from_numpy(np.matmul(x.numpy(), C.numpy()))

    @staticmethod
    def polar_rows(Mt):
        return torch.from_numpy(polar_rows_array(Mt.numpy()))


_TINY = {np.dtype(t): np.finfo(t).tiny for t in (np.float32, np.float64)}


def polar_rows_array(M: np.ndarray) -> np.ndarray:
    """``polar(M^T)^T`` from ``M^T (..., r, d)`` on NumPy arrays (:class:`NumpyKernels`' kernel, the
    host plan's, :mod:`.server_host`): the Gram form, the SVD where it is ill-conditioned
    (:data:`GRAM_RATIO`)."""
    two_d = M.ndim == 2  # one point: np.dot (less per call than np.matmul; the same BLAS products)
    S = np.dot(M, M.T) if two_d else np.matmul(M, M.swapaxes(-2, -1))
    tiny = _TINY[S.dtype]
    if S.shape[-1] == 2 and S.size == 4 and S.dtype == np.float64:
        # one float64 point: the closed form below on Python floats (IEEE doubles, each operation
        # correctly rounded as NumPy's, in the same order: the same bits at a fraction of the
        # calls); an ill-conditioned (or NaN) point takes the arrays' path below
        a, b, _, c = S.ravel().tolist()
        det, tr = a * c - b * b, a + c
        if det > GRAM_RATIO * tr * tr:
            rt = math.sqrt(max(det, tiny))
            f = 1.0 / (rt * math.sqrt(tr + 2.0 * rt))
            W = np.array([[(c + rt) * f, -b * f], [-b * f, (a + rt) * f]])
            return np.dot(W, M) if two_d else np.matmul(W.reshape(S.shape), M)
    if S.shape[-1] == 2:
        # r = 2 in closed form: with s = sqrt(det S), t = sqrt(tr S + 2 s), sqrt(S) = (S + s I) / t,
        # so S^{-1/2} = [[c + s, -b], [-b, a + s]] / (s t) for S = [[a, b], [b, c]]; and
        # lambda_min / lambda_max >= det / tr^2, so det > GRAM_RATIO tr^2 is inside the guard
        a, b, c = S[..., 0, 0], S[..., 0, 1], S[..., 1, 1]
        det, tr = a * c - b * b, a + c
        bad = det <= GRAM_RATIO * tr * tr
        rt = np.sqrt(np.maximum(det, tiny))
        f = 1.0 / (rt * np.sqrt(tr + 2.0 * rt))
        W = np.empty_like(S)
        W[..., 0, 0], W[..., 1, 1] = (c + rt) * f, (a + rt) * f
        W[..., 0, 1] = W[..., 1, 0] = -b * f
    else:
        e, V = np.linalg.eigh(S)
        bad = e[..., 0] <= GRAM_RATIO * e[..., -1]
        W = np.matmul(V / np.sqrt(np.maximum(e, tiny))[..., None, :], V.swapaxes(-2, -1))
    Q = np.matmul(W, M)
    if bad.any():  # rare: the SVD for those points only
        U, _, Vh = np.linalg.svd(M[bad].swapaxes(-2, -1), full_matrices=False)
        Q[bad] = np.matmul(U, Vh).swapaxes(-2, -1)
    return Q


TORCH, NUMPY = TorchKernels(), NumpyKernels()


def gram_times(gram: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``C_i w_i`` as the polar steps compute it, ``(w^T C)^T`` by :func:`kernels_for`'s kernel.

    Parameters
    ----------
    gram : Tensor (T, K, d, d); w : Tensor (T, K, d, r)

    Returns
    -------
    Tensor (T, K, d, r)
    """
    return kernels_for(w).xt(w.transpose(-2, -1), gram).transpose(-2, -1)


def kernels_for(x: torch.Tensor):
    """The kernels of the polar steps for ``x``'s device and dtype: NumPy's for float CPU tensors
    (no autograd), torch's elsewhere. One rule of the device and dtype, so a fit's rounding does
    not depend on its sizes or the batching."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and not x.requires_grad:
        return NUMPY
    return TORCH


def smooth_weight(smoothing: Smoothing, mu: float) -> float:
    """``kappa / mu``: the Lipschitz constant of ``psi_mu'`` (:data:`CURVATURE`)."""
    return CURVATURE[smoothing.name] / mu


class _Layout:
    """The steps' layout of ``(T, K, d, r)`` points: transposed, ``(T K, r, d)``, so that ``C_i x``
    is computed as ``x^T C_i`` (``C_i`` symmetric), the faster product shape for a skinny
    ``x``; and where the trials share their Gram matrices (an expanded view, stride 0 over
    trials) ``(K, T r, d)``: the ``T`` trials' points of a worker are the rows of one left-hand
    side, so the ``(d, d)`` matrices are neither copied nor read once per trial."""

    def __init__(self, gram, shape):
        self.T, self.K, self.d, self.r = shape
        self.shared = self.T > 1 and gram.stride(0) == 0
        self.C = gram[0] if self.shared else gram.reshape(self.T * self.K, self.d, self.d)

    def put(self, x):
        """``(T, K, d, r) ->`` the layout."""
        T, K, d, r = self.T, self.K, self.d, self.r
        if self.shared:
            return x.permute(1, 0, 3, 2).reshape(K, T * r, d)
        return x.transpose(-2, -1).reshape(T * K, r, d)

    def get(self, y):
        """The layout ``-> (T, K, d, r)`` (a view)."""
        T, K, d, r = self.T, self.K, self.d, self.r
        if self.shared:
            return y.view(K, T, r, d).permute(1, 0, 3, 2)
        return y.view(T, K, r, d).transpose(-2, -1)

    def polar(self, M, kernels):
        """``polar`` of every point given in the layout (or the layout's first workers), returned
        in the layout."""
        if self.shared:
            T, r, d = self.T, self.r, self.d
            return kernels.polar_rows(M.view(-1, T, r, d)).reshape(-1, T * r, d)
        return kernels.polar_rows(M)

    def per_trial(self, x):
        """A per-trial ``(T,)`` as a factor broadcasting against the layout."""
        if self.shared:
            return x.repeat_interleave(self.r)[None, :, None]
        return x.repeat_interleave(self.K)[:, None, None]


def _majorizer(ker, b, x, C, lam, lam_L, smoothing, mu):
    """``M(x)^T`` in the layout: ``b + 2 x^T C + lambda_2 (kappa / mu) x - lambda_2 psi'(x)``
    (``lam``, ``lam_L``: ``lambda_2`` and ``lambda_2 kappa / mu`` broadcasting against the layout,
    None without the smooth term)."""
    M = ker.xtc(b, x, C, 2.0)  # (C x)^T = x^T C: C is symmetric
    if lam is not None:
        M = M.addcmul_(lam_L, x).addcmul_(lam, smoothing.grad(x, mu), value=-1.0)
    return M


def polar_steps(gram, w, target, lambda_2, smoothing: Smoothing, mu, steps, *, projector=None, kernels=None,
                smooth=None, product=False):
    """``steps`` MM polar steps of every worker on its subproblem (14), from ``w``.

    Parameters
    ----------
    gram : Tensor (T, K, d, d)
        ``C_i`` (the trials may share it: an expanded view).
    w : Tensor (T, K, d, r)
        The starting points (on the manifold).
    target : Tensor (T, K, d, r)
        ``rho_i z - u_i``, fixed during the steps.
    lambda_2 : Tensor (T,)
        The smooth term's weight per trial; where all are zero, no smoothing term is formed.
    smoothing : Smoothing
        ``psi_mu``, one of :data:`CURVATURE`'s.
    projector : Tensor (T, d, d), optional
        Deflation's ``G``: each step is ``polar(G M)``.
    kernels : TorchKernels or NumpyKernels, optional
        The products and the polar factor (default: :func:`kernels_for` of ``w``).
    smooth : bool, optional
        Whether any ``lambda_2`` is nonzero, where the caller knows it (a fit's loop: once per
        fit); None: checked here (one host synchronization).
    product : bool
        Also return ``C_i w_i`` at the new points, computed while each chunk's ``C_i`` is in the
        cache: the bits of :func:`gram_times` (the same kernel call on the same matrices), or None
        where the layouts differ (trials sharing their Gram matrices, deflation).

    Returns
    -------
    Tensor (T, K, d, r): the points after ``steps`` steps; with ``product``, ``(points, C w or None)``.
    """
    ker = kernels_for(w) if kernels is None else kernels
    lay = _Layout(gram, w.shape)
    b, x = lay.put(target), lay.put(w)
    smooth = bool((lambda_2 != 0).any()) if smooth is None else smooth
    lam = lay.per_trial(lambda_2) if smooth else None
    lam_L = None if lam is None else lam * smooth_weight(smoothing, mu)
    if projector is not None:
        G = projector[:, None]
        for _ in range(int(steps)):
            M = _majorizer(ker, b, x, lay.C, lam, lam_L, smoothing, mu)
            x = lay.put(polar(G @ lay.get(M)))
        return (lay.get(x), None) if product else lay.get(x)
    keep = product and not lay.shared

    def run(b, x, C, lam, lam_L):
        for _ in range(int(steps)):
            x = lay.polar(_majorizer(ker, b, x, C, lam, lam_L, smoothing, mu), ker)
        return (x, ker.xt(x, C)) if keep else (x, None)

    # the workers' steps are independent (b is fixed during them): all steps of a few workers at a
    # time, so that their Gram matrices stay in the cache from one step to the next (the same
    # numbers: every kernel works matrix by matrix)
    n, per = lay.C.shape[0], max(1, CHUNK_BYTES // max(1, lay.C[0].numel() * lay.C.element_size()))
    if n <= per:
        x, P = run(b, x, lay.C, lam, lam_L)
    else:
        cut = lam is not None and lam.shape[0] > 1  # a factor per worker row (not the shared layout's)
        parts = [run(b[i:i + per], x[i:i + per], lay.C[i:i + per], lam[i:i + per] if cut else lam,
                     lam_L[i:i + per] if cut else lam_L) for i in range(0, n, per)]
        x = torch.cat([q[0] for q in parts])
        P = torch.cat([q[1] for q in parts]) if keep else None
    if not product:
        return lay.get(x)
    return lay.get(x), None if P is None else lay.get(P)

    def run(b, x, C, lam, lam_L):
        for _ in range(int(steps)):
            x = lay.polar(_majorizer(ker, b, x, C, lam, lam_L, smoothing, mu), ker)
        return x

    # the workers' steps are independent (b is fixed during them): all steps of a few workers at a
    # time, so that their Gram matrices stay in the cache from one step to the next (the same
    # numbers: every kernel works matrix by matrix)
    n, per = lay.C.shape[0], max(1, CHUNK_BYTES // max(1, lay.C[0].numel() * lay.C.element_size()))
    if n <= per:
        x = run(b, x, lay.C, lam, lam_L)
    else:
        cut = lam is not None and lam.shape[0] > 1  # a factor per worker row (not the shared layout's)
        x = torch.cat([run(b[i:i + per], x[i:i + per], lay.C[i:i + per], lam[i:i + per] if cut else lam,
                           lam_L[i:i + per] if cut else lam_L) for i in range(0, n, per)])
    return lay.get(x)
