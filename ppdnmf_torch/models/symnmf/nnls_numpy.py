"""The host plan's NNLS: :func:`~.nnls.nnls_bpp`'s block principal pivoting (Kim and Park, 2011)
on NumPy arrays.

Two ways to solve a round's systems ``G_FF x_F = c_F`` (``F`` a column's passive set):

* ``"masked"`` (small blocks): each column's masked ``r x r`` system ``(P G P + I - P) x = P c``
  alone. With few small systems (a block of ``n = 150`` rows and ``r = 6``) the batched torch
  NNLS is bound by its cost per call; the same steps on NumPy arrays cost a fraction of that.
* ``"subsets"`` (large blocks): the passive subsystems themselves, the columns that share a set
  solved together (Kim and Park's grouping; :data:`SHARED_SET`), the others grouped by the size
  ``s`` of their set, each group's ``s x s`` systems ``G_FF`` gathered and solved in one batched
  call (in chunks of :data:`~.nnls.CHUNK_ENTRIES_CPU` entries, as the torch NNLS). A symmetric NMF
  factor is sparse (a point in few clusters), so ``s`` is mostly a few variables out of ``r``: the
  masked systems' ``r^3`` work per column (the torch NNLS's batched Cholesky) becomes ``s^3``.

The host plan takes ``"masked"`` up to :data:`~.host.NUMPY_NNLS_MAX_ENTRIES` entries of masked
systems and ``"subsets"`` above. The answer is each column's exact minimizer, as
:func:`~.nnls.nnls_bpp`'s (the same pivoting and flushes; the systems solved by LU here, by
Cholesky there: equal to rounding).
"""
from __future__ import annotations

import numpy as np

from ...errors import ConfigError
from .nnls import CHUNK_ENTRIES_CPU, PBAR

__all__ = ["nnls_bpp_numpy", "SOLVES"]

#: how a round's systems are solved (the module)
SOLVES = ("masked", "subsets")
#: "subsets": a passive set held by this many columns (of one trial) or more is solved once for
#: all of them
SHARED_SET = 4


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


def _set_keys(t, Pk, T: int):
    """Each column's ``(trial, passive set)`` (``t (k,)``, ``Pk (k, r)`` bool) as a key for
    ``np.unique``: ``(keys, axis)``, one integer per column while the set and the trial fit 62
    bits, else rows ``[trial, set]`` (``axis=0``)."""
    r = Pk.shape[1]
    if r + max(T - 1, 1).bit_length() <= 62:
        codes = Pk.astype(np.int64) @ (np.int64(1) << np.arange(r, dtype=np.int64))
        return (codes + (t.astype(np.int64) << r) if T > 1 else codes), None
    return np.concatenate([t[:, None], Pk], axis=1), 0


def _solve_subsets(G, C, P, t, j):
    """:func:`_solve` by passive subsystems ``G_FF x_F = c_F``: a set that :data:`SHARED_SET`
    columns or more of one trial hold (at the warm start most columns hold every variable) in one
    solve with those columns as right-hand sides (Kim and Park's grouping); the other columns
    grouped by the size ``s`` of their set, each group's ``s x s`` systems gathered and solved in
    one batched call. LU throughout; ``y = G x - c`` as one product per trial."""
    T, r = G.shape[0], G.shape[-1]
    Pk = P[t, :, j]
    ck = C[t, :, j]
    x = np.zeros_like(ck)
    keys, axis = _set_keys(t, Pk, T)
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    shared = counts >= SHARED_SET
    by_set = np.argsort(inverse, kind="stable")
    set_starts = np.concatenate([[0], np.cumsum(counts)])
    for g in np.flatnonzero(shared):  # sets of many columns each
        cols = by_set[set_starts[g]:set_starts[g + 1]]
        idx = np.flatnonzero(Pk[first[g]])
        if idx.size:
            Gt = G[t[first[g]]]
            x[cols[:, None], idx] = np.linalg.solve(Gt[np.ix_(idx, idx)], ck[cols][:, idx].T).T
    rest = np.flatnonzero(~shared[inverse])
    sizes = Pk[rest].sum(1)
    order = np.argsort(sizes, kind="stable")
    starts = np.searchsorted(sizes[order], np.arange(r + 2))
    flat_x = x.reshape(-1)
    for size in range(1, r + 1):  # each set alone, batched by its size, in chunks that bound memory
        group = rest[order[starts[size]:starts[size + 1]]]
        step = max(1, CHUNK_ENTRIES_CPU // (size * size))
        for c in range(0, group.size, step):
            cols = group[c:c + step]
            idx = np.nonzero(Pk[cols])[1].reshape(-1, size)  # each column's passive variables, ascending
            where = idx[:, :, None] * r + idx[:, None, :]
            if T > 1:
                where += (t[cols] * (r * r))[:, None, None]
            at = cols[:, None] * r + idx
            flat_x[at] = np.linalg.solve(np.take(G, where), np.take(ck, at)[:, :, None])[:, :, 0]
    if T == 1:
        y = x @ G[0].T - ck
    else:
        y = np.empty_like(ck)
        for tr in np.unique(t):
            sel = t == tr
            y[sel] = x[sel] @ G[tr].T - ck[sel]
    return x, y


def _flush(x, floor):
    return np.where(np.abs(x) < floor, 0.0, x)


def _flush_relative(x, tiny, axis):
    ax = np.abs(x)
    return np.where(ax < tiny * ax.max(axis=axis, keepdims=True), 0.0, x)


def nnls_bpp_numpy(G, C, init, max_iter=None, solve: str = "masked"):
    """:func:`~.nnls.nnls_bpp` on arrays: ``min_{x >= 0} 1/2 x^T G x - x^T c`` for every column of
    ``C (T, r, m)``, ``G (T, r, r)`` symmetric positive definite, warm started from the positive
    entries of ``init (T, r, m)``; returns ``(T, r, m)``. ``solve``: one of :data:`SOLVES` (the
    module)."""
    if solve not in SOLVES:
        raise ConfigError(f"solve: one of {SOLVES}, got {solve!r}")
    _solve_cols = _solve if solve == "masked" else _solve_subsets
    T, r, m = C.shape
    max_iter = 5 * r if max_iter is None else int(max_iter)
    info = np.finfo(C.dtype)
    tiny = info.eps * 100  # entries this small are zero (relative; Kim and Park's 1e-12 in float64)
    scale_c = np.maximum(np.abs(C).max(axis=1, keepdims=True), info.tiny)
    P = init > 0
    t, j = np.nonzero(np.ones((T, m), dtype=bool))
    x, y = _solve_cols(G, C, P, t, j)
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
        x, y = _solve_cols(G, C, P, t, j)
        X[t, :, j] = _flush_relative(x, tiny, 1)
        Y[t, :, j] = _flush(y, tiny * scale_cols[t, j][:, None])
        mask = notopt[:, None, :]
        nonopt = mask & (Y < 0) & ~P
        infea = mask & (X < 0) & P
        notgood = nonopt.sum(1) + infea.sum(1)
        notopt = notgood > 0
    return np.maximum(X, 0)
