"""The NumPy reference of ``scripts/bench_symnmf.py``: SymHALS and SymANLS written independently
with NumPy, one trial at a time (the column sweep on contiguous rows, and Kim and Park's block
principal pivoting with the columns grouped by passive set, as in their own code), with the
per-iteration metrics ``fit_symnmf`` records, so that both sides of a comparison do the same work.
"""
from __future__ import annotations

import time

import numpy as np

__all__ = ["np_hals_sweep", "np_nnls_bpp", "np_fit", "np_products"]


def np_hals_sweep(Zt, At, B):
    """Eq. (17) over the rows of ``Zt (r, n)`` (a block's columns, contiguous), in place."""
    reset = 1e-16 * Zt.max()
    for i in range(Zt.shape[0]):
        zi = Zt[i] + (At[i] - B[i] @ Zt) / B[i, i]
        np.maximum(zi, 0, out=zi)
        Zt[i] = zi
    Zt[~(Zt > 0).any(axis=1)] = reset


def _solve_grouped(G, C, P):
    """``x_F = G_FF^{-1} c_F`` per column, the columns grouped by passive set (one solve per
    distinct set, as Kim and Park's ``solveNormalEqComb``)."""
    X = np.zeros_like(C)
    if C.shape[1] == 0:
        return X
    sets, inverse = np.unique(P.T, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    for k, s in enumerate(sets):
        idx = np.flatnonzero(s)
        if idx.size == 0:
            continue
        cols = np.flatnonzero(inverse == k)
        X[np.ix_(idx, cols)] = np.linalg.solve(G[np.ix_(idx, idx)], C[np.ix_(idx, cols)])
    return X


def np_nnls_bpp(G, C, init):
    """Kim and Park's block principal pivoting for ``G (r, r)``, ``C (r, m)``, warm started."""
    r, m = C.shape
    P = init > 0
    X = _solve_grouped(G, C, P)
    Y = G @ X - C
    X[np.abs(X) < 1e-12] = 0
    Y[np.abs(Y) < 1e-12] = 0
    p = np.full(m, 3)
    ninf = np.full(m, r + 1)
    nonopt = (Y < 0) & ~P
    infea = (X < 0) & P
    notgood = nonopt.sum(0) + infea.sum(0)
    notopt = notgood > 0
    it = 0
    while notopt.any() and it < 5 * r:
        it += 1
        c1 = notopt & (notgood < ninf)
        c2 = notopt & (notgood >= ninf) & (p >= 1)
        c3 = notopt & ~c1 & ~c2
        p[c1], ninf[c1] = 3, notgood[c1]
        p[c2] -= 1
        full = c1 | c2
        P[:, full] = np.where(nonopt[:, full], True, np.where(infea[:, full], False, P[:, full]))
        for j in np.flatnonzero(c3):
            last = np.flatnonzero(nonopt[:, j] | infea[:, j])[-1]
            P[last, j] = ~P[last, j]
        cols = np.flatnonzero(notopt)
        X[:, cols] = _solve_grouped(G, C[:, cols], P[:, cols])
        Y[:, cols] = G @ X[:, cols] - C[:, cols]
        X[np.abs(X) < 1e-12] = 0
        Y[np.abs(Y) < 1e-12] = 0
        mask = notopt[None, :]
        nonopt = mask & (Y < 0) & ~P
        infea = mask & (X < 0) & P
        notgood = nonopt.sum(0) + infea.sum(0)
        notopt = notgood > 0
    return np.maximum(X, 0)


def np_fit(X, U0, lam0, iters, method, clock=None, adaptive=True):
    """``iters`` iterations of SymHALS or SymANLS with the adaptive rule (20) (``adaptive=False``:
    ``lambda = lam0`` fixed), one trial, with the per-iteration metrics ``fit_symnmf`` records
    (the same two products ``X W`` per iteration, the same expansions), so that both sides do
    the same work. ``clock``: a list that gets the seconds of the iterations alone (after the
    first product, as ``fit_symnmf``'s ``history["time"]``)."""
    Ut, Vt = U0.T.copy(), U0.T.copy()
    lam = lam0
    eye = np.eye(U0.shape[1])
    sqX = float((X * X).sum())
    XVt = Vt @ X  # (X V)^T, X symmetric
    history = []
    t0 = time.perf_counter()

    def block(Z, W, XWt):  # one block of (3) in place, the other factor W fixed
        B = W @ W.T + lam * eye
        if method == "symhals":
            np_hals_sweep(Z, XWt + lam * W, B)
        else:
            Z[...] = np_nnls_bpp(B, XWt + lam * W, Z)

    for _ in range(iters):
        block(Ut, Vt, XVt)
        XUt = Ut @ X
        block(Vt, Ut, XUt)
        XVt = Vt @ X
        UtU, VtV = Ut @ Ut.T, Vt @ Vt.T
        uu, vv, uv = np.trace(UtU), np.trace(VtV), float((Ut * Vt).sum())
        gap = uu + vv - 2 * uv
        history.append(((sqX - 2 * (XUt * Ut).sum() + (UtU * UtU).sum()) / sqX,
                        0.5 * (sqX - 2 * (XVt * Ut).sum() + (UtU * VtV).sum()) + 0.5 * lam * gap,
                        gap, np.sqrt(max(gap, 0)) / np.sqrt(vv), lam))
        if adaptive:
            lam = lam * max(1.0, (uu + vv) / (2 * uv)) if uv > 0 else lam
    if clock is not None:
        clock.append(time.perf_counter() - t0)
    return Ut.T, Vt.T


def np_products(X, U, iters):
    """The GEMM floor of :func:`np_fit`: seconds per iteration of its two products ``W^T X``
    alone (``Ut @ X`` and ``Vt @ X``, the calls it makes, on the rows of ``U (n, r)``), over
    ``iters`` iterations. No implementation that makes these products can run an iteration
    faster on the same BLAS."""
    Ut, Vt = U.T.copy(), U.T.copy()
    t0 = time.perf_counter()
    for _ in range(iters):
        XUt = Ut @ X
        XVt = Vt @ X
    del XUt, XVt
    return (time.perf_counter() - t0) / iters
