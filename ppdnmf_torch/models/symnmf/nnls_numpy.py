"""The host plan's NNLS for small blocks: :func:`~.nnls.nnls_bpp`'s block principal pivoting
(Kim and Park, 2011) on NumPy arrays, each column's masked system solved alone.

With few small systems (a block of ``n = 150`` rows and ``r = 6``) the batched torch NNLS is
bound by its cost per call; the same steps on NumPy arrays cost a fraction of that. With many
columns the torch NNLS, which groups them by passive set (one solve per set), is faster: the host
plan uses this one up to :data:`~.host.NUMPY_NNLS_MAX_ENTRIES` entries of masked systems. The
answer is each column's exact minimizer, as :func:`~.nnls.nnls_bpp`'s (the same pivoting; the
masked systems solved by LU here, by Cholesky there: equal to rounding).
"""
from __future__ import annotations

import numpy as np

from .nnls import PBAR

__all__ = ["nnls_bpp_numpy"]


def _solve(G, C, P, t, j):
    """``x`` with ``x_F = G_FF^{-1} c_F``, ``x_G = 0`` for the columns ``(t, j)`` (``(k,)`` each),
    and ``y = G x - c``: ``(k, r)`` each (:func:`~.nnls._solve_masked`'s per-column path)."""
    r = G.shape[-1]
    Pk = P[t, :, j].astype(G.dtype)
    ck = C[t, :, j]
    Gt = G[t]
    M = Gt * (Pk[:, :, None] * Pk[:, None, :])
    M.reshape(-1, r * r)[:, ::r + 1] += 1 - Pk
    x = np.linalg.solve(M, (ck * Pk)[:, :, None])[:, :, 0] * Pk
    y = np.matmul(Gt, x[:, :, None])[:, :, 0] - ck
    return x, y


def _flush(x, floor):
    return np.where(np.abs(x) < floor, 0.0, x)


def _flush_relative(x, tiny, axis):
    ax = np.abs(x)
    return np.where(ax < tiny * ax.max(axis=axis, keepdims=True), 0.0, x)


def nnls_bpp_numpy(G, C, init, max_iter=None):
    """:func:`~.nnls.nnls_bpp` on arrays: ``min_{x >= 0} 1/2 x^T G x - x^T c`` for every column of
    ``C (T, r, m)``, ``G (T, r, r)`` symmetric positive definite, warm started from the positive
    entries of ``init (T, r, m)``; returns ``(T, r, m)``."""
    T, r, m = C.shape
    max_iter = 5 * r if max_iter is None else int(max_iter)
    info = np.finfo(C.dtype)
    tiny = info.eps * 100  # entries this small are zero (relative; Kim and Park's 1e-12 in float64)
    scale_c = np.maximum(np.abs(C).max(axis=1, keepdims=True), info.tiny)
    P = init > 0
    t, j = np.nonzero(np.ones((T, m), dtype=bool))
    x, y = _solve(G, C, P, t, j)
    X = _flush_relative(x, tiny, 1).reshape(T, m, r).transpose(0, 2, 1).copy()
    Y = _flush(y.reshape(T, m, r).transpose(0, 2, 1), tiny * scale_c)
    nonopt = (Y < 0) & ~P
    infea = (X < 0) & P
    notgood = nonopt.sum(1) + infea.sum(1)
    notopt = notgood > 0
    p = np.full((T, m), PBAR)
    ninf = np.full((T, m), r + 1)
    rows = np.arange(r)[None, :, None]
    scale_cols = scale_c[:, 0, :]
    it = 0
    while notopt.any() and it < max_iter:
        it += 1
        cols1 = notopt & (notgood < ninf)
        cols2 = notopt & (notgood >= ninf) & (p >= 1)
        exchange = cols1 | cols2
        p = np.where(cols1, PBAR, np.where(cols2, p - 1, p))
        ninf = np.where(cols1, notgood, ninf)
        # full exchange: every infeasible variable; backup rule: only the largest-index one
        bad = nonopt | infea
        last = np.where(bad, rows, -1).max(axis=1, keepdims=True)
        P = P ^ np.where(exchange[:, None, :], bad, (rows == last) & (notopt & ~exchange)[:, None, :])
        t, j = np.nonzero(notopt)
        x, y = _solve(G, C, P, t, j)
        X[t, :, j] = _flush_relative(x, tiny, 1)
        Y[t, :, j] = _flush(y, tiny * scale_cols[t, j][:, None])
        mask = notopt[:, None, :]
        nonopt = mask & (Y < 0) & ~P
        infea = mask & (X < 0) & P
        notgood = nonopt.sum(1) + infea.sum(1)
        notopt = notgood > 0
    return np.maximum(X, 0)
