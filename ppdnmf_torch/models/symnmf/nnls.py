"""Batched exact nonnegative least squares by block principal pivoting (Kim and Park, 2011).

Each column ``j`` of each trial ``t`` solves ``min_{x >= 0} 1/2 x^T G_t x - x^T c_{tj}`` with
``G = A^T A`` symmetric positive definite ``(T, r, r)`` and ``C = A^T B`` ``(T, r, m)``: the
normal-equation form of ``min_{x >= 0} ||A x - b_j||``. Every column keeps its own passive
set ``F`` (where ``x > 0``), solves ``G_FF x_F = c_F`` and exchanges the infeasible
variables (``x_F < 0`` or ``y_G = (G x - c)_G < 0``) in blocks, with Kim and Park's backup
rule (``p = 3`` full exchanges, then one variable at a time), which makes it terminate.

The columns whose sets differ are solved together as masked systems
``(P G P + I - P) x = P c`` (``P`` the passive set as a diagonal 0/1), one batched Cholesky
solve over every column still not optimal, in chunks that bound the memory.
"""
from __future__ import annotations

import torch

__all__ = ["nnls_bpp", "nnls"]

#: full exchanges allowed before the backup rule (Kim and Park's ``pbar``)
PBAR = 3
#: entries of the masked systems per batched solve on a GPU (fewer, larger launches)
CHUNK_ENTRIES = 1 << 22
#: the same on the CPU: chunks small enough that their tensors come from memory the allocator
#: has freed before, not from fresh pages the kernel must map and zero on every chunk
CHUNK_ENTRIES_CPU = 1 << 19
#: a chunk's columns are solved set by set (many right-hand sides per solve) when it holds at
#: most this many distinct passive sets and at least GROUPED_RATIO columns per set
GROUPED_SETS = 64
GROUPED_RATIO = 8
#: otherwise a set's factor is made once and copied to its columns when the columns number at
#: least this many times the sets (else each column is factored alone: the same numbers)
SHARED_RATIO = 2
#: below this many entries of the masked systems (columns x r^2) each column is factored
#: alone: grouping costs more torch calls than it saves there
GROUPED_MIN_ENTRIES = 1 << 16


def _passive_sets(t, Pb):
    """The distinct ``(trial, passive set)`` of some columns: ``(sets, inverse)``, ``sets (S, 1 + r)``
    (the trial, then the set as 0/1) and each column's set index ``(k,)``. Sets of up to 62
    variables (with the trial) are one integer each, the others rows of ``unique(dim=0)``."""
    r = Pb.shape[1]
    if r + max(int(t.max()), 1).bit_length() <= 62:
        weights = torch.ones(r, dtype=torch.int64, device=t.device) << torch.arange(r, device=t.device)
        codes, inverse = torch.unique((t << r) + (Pb.to(torch.int64) * weights).sum(1), return_inverse=True)
        bits = (codes[:, None] & weights) != 0
        return torch.cat([(codes >> r)[:, None], bits.to(torch.int64)], dim=1), inverse
    return torch.unique(torch.cat([t[:, None], Pb.to(t.dtype)], dim=1), dim=0, return_inverse=True)


def _solve_masked(G, C, P, t_idx, j_idx):
    """``x`` with ``x_F = G_FF^{-1} c_F`` and ``x_G = 0`` for the columns at ``(t_idx, j_idx)``
    (``(K,)`` each): returns ``x (K, r)`` and ``y = G x - c`` ``(K, r)``.

    The columns of one trial with the same passive set solve the same system, so, as Kim and
    Park do, each distinct ``(t, F)`` is factored once (above :data:`GROUPED_MIN_ENTRIES`). Where few sets hold many columns (near
    convergence a block of thousands of rows holds a few dozen sets: :data:`GROUPED_SETS`),
    each set's columns are solved together (one triangular solve with many right-hand sides,
    one product for ``y``); otherwise every column alone, with its set's factor."""
    r = G.shape[-1]
    xs, ys = [], []
    step = max(1, (CHUNK_ENTRIES_CPU if G.device.type == "cpu" else CHUNK_ENTRIES) // (r * r))
    for s in range(0, t_idx.numel(), step):  # memory chunks of one batched solve
        t, j = t_idx[s:s + step], j_idx[s:s + step]
        Pb = P[t, :, j]
        ck = C[t, :, j]
        if t.numel() * r * r < GROUPED_MIN_ENTRIES:  # few small systems: finding the sets costs more
            Pk = Pb.to(G.dtype)
            x = _cholesky_solve(torch.linalg.cholesky(_masked_system(G, t, Pk)), ck * Pk) * Pk
            xs.append(x)
            ys.append(_residual(G, C, t, j, x, ck))
            continue
        sets, inverse = _passive_sets(t, Pb)
        Ps = sets[:, 1:].to(G.dtype)
        if sets.shape[0] <= GROUPED_SETS and sets.shape[0] * GROUPED_RATIO <= t.numel():
            L = torch.linalg.cholesky(_masked_system(G, sets[:, 0], Ps))
            x, y = _solve_grouped(G, L, sets, inverse, Ps, ck)
        else:
            Pk = Pb.to(G.dtype)
            if sets.shape[0] * SHARED_RATIO <= t.numel():  # each set's factor, shared by its columns
                L = torch.linalg.cholesky(_masked_system(G, sets[:, 0], Ps))[inverse]
            else:  # most columns hold a set of their own: one factor per column, no copies
                L = torch.linalg.cholesky(_masked_system(G, t, Pk))
            x = _cholesky_solve(L, ck * Pk) * Pk
            y = _residual(G, C, t, j, x, ck)
        xs.append(x)
        ys.append(y)
    if len(xs) == 1:  # one chunk (the usual case): no copy
        return xs[0], ys[0]
    return torch.cat(xs), torch.cat(ys)


def _masked_system(G, t, Pk):
    """``P G_t P + I - P`` ``(k, r, r)`` for 0/1 passive sets ``Pk (k, r)`` of trials ``t (k,)``
    (``P = diag(Pk)``). Products by 0 and 1 and sums with 0 are exact, so these are the numbers
    of ``G_t * p_i * p_j + diag(1 - p)`` in any order; ``G`` is expanded, not copied, with one
    trial."""
    Gt = G.expand(t.shape[0], -1, -1) if G.shape[0] == 1 else G[t]
    M = Gt * (Pk[:, :, None] * Pk[:, None, :])
    M.diagonal(dim1=-2, dim2=-1).add_(1 - Pk)
    return M


def _cholesky_solve(L, b):
    """``(L L^T)^{-1} b`` for ``L (k, r, r)`` lower and ``b (k, r)``: two triangular solves
    (LAPACK's ``potrs`` is the same two, but batched it runs one matrix at a time)."""
    z = torch.linalg.solve_triangular(L, b[..., None], upper=False)
    return torch.linalg.solve_triangular(L.transpose(-2, -1), z, upper=True)[..., 0]


def _residual(G, C, t, j, x, ck):
    """``y = G_t x - c`` ``(k, r)`` for the columns ``x (k, r)`` at ``(t, j)``: one product per
    block, ``X G^T`` with the columns placed in a ``(T, m, r)`` block (``T r^2 m`` flops, against
    one matrix-vector call per column)."""
    if G.shape[0] == 1:
        return x @ G[0].transpose(-2, -1) - ck
    full = x.new_zeros((G.shape[0], C.shape[-1], x.shape[-1]))
    full[t, j] = x
    return torch.bmm(full, G.transpose(-2, -1))[t, j] - ck


def _solve_grouped(G, L, sets, inverse, Ps, ck):
    """Each set's columns in one solve: ``x (k, r)``, ``y (k, r)`` in the columns' order."""
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse, minlength=sets.shape[0]).tolist()
    x, y = torch.empty_like(ck), torch.empty_like(ck)
    start = 0
    for g, n in enumerate(counts):  # a few dozen sets (GROUPED_SETS at most)
        idx = order[start:start + n]
        start += n
        p = Ps[g][:, None]
        xg = torch.cholesky_solve(ck[idx].mT * p, L[g]) * p  # (r, n)
        x[idx] = xg.mT
        y[idx] = (G[sets[g, 0]] @ xg).mT - ck[idx]
    return x, y


def _flush(x, floor):
    """``x`` with the entries below ``floor`` in magnitude set to 0 (a scalar 0: no zeros tensor)."""
    return torch.where(x.abs() < floor, 0.0, x)


def _flush_relative(x, tiny):
    """``x`` with the entries below ``tiny`` times their column's largest magnitude set to 0."""
    ax = x.abs()
    return torch.where(ax < tiny * ax.amax(dim=1, keepdim=True), 0.0, x)


def nnls_bpp(G: torch.Tensor, C: torch.Tensor, init: torch.Tensor | None = None, max_iter: int | None = None):
    """Solve ``min_{x >= 0} 1/2 x^T G x - x^T c`` for every column of ``C``, exactly.

    Parameters
    ----------
    G : torch.Tensor
        ``(T, r, r)`` symmetric positive definite (``A^T A``).
    C : torch.Tensor
        ``(T, r, m)`` (``A^T B``).
    init : torch.Tensor, optional
        ``(T, r, m)``, a previous solution: its positive entries start the passive sets
        (a warm start; the answer does not depend on it).
    max_iter : int, optional
        Pivoting rounds (default ``5 r``, Kim and Park's cap; with the backup rule the
        method ends well before it).

    Returns
    -------
    torch.Tensor
        ``(T, r, m)``, the minimizers (nonnegative).
    """
    T, r, m = C.shape
    dt = C.dtype
    max_iter = 5 * r if max_iter is None else int(max_iter)
    # entries this small are zero (Kim and Park's 1e-12 in float64, relative here)
    tiny = torch.finfo(dt).eps * 100
    scale_c = C.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(dt).tiny)
    X = torch.zeros_like(C)
    if init is None:
        P = torch.zeros((T, r, m), dtype=torch.bool, device=C.device)
        Y = -C
    else:
        P = init > 0
        t, j = torch.ones((T, m), dtype=torch.bool, device=C.device).nonzero().unbind(1)
        x, y = _solve_masked(G, C, P, t, j)
        X[t, :, j] = x
        Y = torch.empty_like(C)
        Y[t, :, j] = y
    X = _flush_relative(X, tiny)
    Y = _flush(Y, tiny * scale_c)
    nonopt = (Y < 0) & ~P
    infea = (X < 0) & P
    notgood = nonopt.sum(1) + infea.sum(1)
    notopt = notgood > 0
    p = torch.full((T, m), PBAR, dtype=torch.int64, device=C.device)
    ninf = torch.full((T, m), r + 1, dtype=torch.int64, device=C.device)
    rows = torch.arange(r, device=C.device)[None, :, None]
    it = 0
    scale_cols = scale_c[:, 0, :]
    while bool(notopt.any()) and it < max_iter:
        it += 1
        cols1 = notopt & (notgood < ninf)
        cols2 = notopt & (notgood >= ninf) & (p >= 1)
        exchange = cols1 | cols2
        p = torch.where(cols1, PBAR, torch.where(cols2, p - 1, p))
        ninf = torch.where(cols1, notgood, ninf)
        # nonopt (not in P) and infea (in P) are disjoint: moving them in or out of P is a flip.
        # Full exchange: every infeasible variable; backup rule: only the largest-index one
        bad = nonopt | infea
        last = torch.where(bad, rows, -1).amax(dim=1, keepdim=True)
        P = P ^ torch.where(exchange[:, None, :], bad, (rows == last) & (notopt & ~exchange)[:, None, :])
        t, j = notopt.nonzero().unbind(1)
        x, y = _solve_masked(G, C, P, t, j)
        x = _flush_relative(x, tiny)
        y = _flush(y, tiny * scale_cols[t, j][:, None])
        X[t, :, j] = x
        Y[t, :, j] = y
        mask = notopt[:, None, :]
        nonopt = mask & (Y < 0) & ~P
        infea = mask & (X < 0) & P
        notgood = nonopt.sum(1) + infea.sum(1)
        notopt = notgood > 0
    return X.clamp_min(0)


def nnls(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``argmin_{X >= 0} ||A X - B||_F`` column by column, for ``A (..., p, r)`` of full column
    rank and ``B (..., p, m)``; ``(..., r, m)``. A convenience over :func:`nnls_bpp`."""
    batch = A.shape[:-2]
    A3, B3 = A.reshape(-1, *A.shape[-2:]), B.reshape(-1, *B.shape[-2:])
    At = A3.transpose(-2, -1)
    X = nnls_bpp(At @ A3, At @ B3)
    return X.reshape(*batch, *X.shape[-2:])
