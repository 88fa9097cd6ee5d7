"""The host plan (issue 41): SymHALS, A-SymHALS and SymANLS on the CPU, the iteration on NumPy
views of the same memory.

With one trial and small ``n`` an iteration of the torch plan (:class:`~.central.CentralRun`) is
some 140 torch calls on vectors of ``n`` entries, bound by the cost per call, which is several
times NumPy's on the CPU; from ``n = 1000`` it is bound by the two products ``W^T X``, where
NumPy's BLAS measured faster than torch's here (docs/PERFORMANCE.md, "Symmetric NMF"). The host
plan runs the same iteration (the same updates in the same order: the block data, the column
sweeps, both products, the history's metrics, the penalty rule and the stopping test) on NumPy
arrays; SymANLS's NNLS too (:func:`~.nnls_numpy.nnls_bpp_numpy`: each column's masked system
for small blocks, above :data:`NUMPY_NNLS_MAX_ENTRIES` the passive subsystems, the columns that
share a set solved together). The state is kept
in the sweep's layout, ``(T, r, n)`` rows; what leaves the run (the callback's factors, the
checkpoints, the result) is a torch tensor on the same memory, ``(T, n, r)``.

The two plans compute the same numbers up to rounding (other BLAS, other reduction orders);
``tests/test_symnmf_plan.py`` holds them to ``1e-9`` relative with the same stopping iteration.
NumPy's BLAS takes its thread count from the environment (``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``) or :func:`ppdnmf_torch.threads.using_threads` (``threadpoolctl``), not
from ``torch.set_num_threads``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...driver.history import RowBuffer
from ...errors import ConfigError, DataError
from .central import CentralRun
from .nnls_numpy import nnls_bpp_numpy
from .penalty import KUANG_FACTOR, KUANG_TOL, initial_lambda
from .result import HISTORY_KEYS, SymNMFIteration
from .symhals import ZERO_COLUMN_RESET

__all__ = ["PLANS", "HOST_METHODS", "choose_plan", "HostRun"]

#: the execution plans of :func:`~.fit.fit_symnmf`
PLANS = ("auto", "torch", "host")
#: the methods the host plan runs
HOST_METHODS = ("symhals", "a_symhals", "symanls", "kuang")
#: SymANLS's blocks with at most this many entries of masked systems (trials x n x r^2) solve each
#: column's masked system, larger ones the passive subsystems (``solve="masked"``, ``"subsets"``;
#: one trial, fixed lambda, one thread, load about 1, ms per iteration masked / subsets / the torch
#: NNLS: n = 150, r = 6 0.4-0.5 / 0.6-0.7 / 1.0-1.2; n = 300, r = 20 (1.2e5 entries) 3.7-4.2 /
#: 4.6-4.8 / 4.6-5.2; n = 1000, r = 20 (4e5) 19.3-20.4 / 13.7-14.4 / 16.2-18.2)
NUMPY_NNLS_MAX_ENTRIES = 1 << 18
#: SymHALS's blocks of more than this many entries (r x n) take :func:`_sweep_narrow` (a column's
#: product over the block's rows alone; one trial, one thread, a sweep alone: level at n = 300,
#: r = 20, 83 against 109 us at n = 1000, r = 20, 0.70 against 1.25 ms at n = 3000, r = 40)
NARROW_SWEEP_MIN = 1 << 13


def choose_plan(plan: str, sim, method: str) -> str:
    """The plan of one fit, ``"torch"`` or ``"host"``, chosen once.

    ``"auto"``: the host plan on the CPU for a method of :data:`HOST_METHODS`, dense or sparse
    ``X`` (faster than the torch plan or level with it at every size measured, one thread, one
    and 20 trials: docs/PERFORMANCE.md, "Symmetric NMF"); the torch plan on CUDA and for the
    baselines.
    """
    if plan not in PLANS:
        raise ConfigError(f"plan: must be one of {PLANS}, got {plan!r}")
    if plan == "host" and (sim.device.type != "cpu" or method not in HOST_METHODS):
        raise ConfigError(f"plan: 'host' runs {HOST_METHODS} on the CPU, not {method!r} on {sim.device.type}")
    if plan == "auto":
        return "host" if sim.device.type == "cpu" and method in HOST_METHODS else "torch"
    return plan


# -- the numbers, on arrays (T, r, n) ----------------------------------------------------------

class _Trials:
    """Arithmetic per trial: on arrays ``(T,)``, or on Python floats with one trial (an operation
    on floats costs a fraction of a NumPy call on a one-element array)."""

    def __init__(self, T: int):
        self.one = T == 1
        if self.one:
            self.inner = lambda A, B: float(np.vdot(A, B))
            self.max, self.sqrt = max, math.sqrt
            self.where = lambda c, a, b: a if c else b
            self.finite = lambda a, b: math.isfinite(a) and math.isfinite(b)
        else:
            self.inner = lambda A, B: np.einsum("tij,tij->t", A, B)
            self.max, self.sqrt, self.where = np.maximum, np.sqrt, np.where
            self.finite = lambda a, b: bool(np.isfinite(a).all() and np.isfinite(b).all())

    def of(self, arr):
        """A ``(T,)`` array in this arithmetic."""
        return float(arr[0]) if self.one else arr

    def array(self, x, dtype):
        """A value of this arithmetic as a ``(T,)`` array of ``dtype``."""
        return np.array([x] if self.one else x, dtype=dtype)


def _gram(Wt):
    """``W^T W`` ``(T, r, r)`` from the rows ``Wt (T, r, n)``."""
    return np.matmul(Wt, Wt.transpose(0, 2, 1))


def _product(sim):
    """``Wt -> (X W)^T = W^T X`` ``(T, r, n)`` (``X`` symmetric), on ``X``'s memory."""
    if sim.sparse:
        def sparse(Wt):
            out = sim.matmul(torch.from_numpy(Wt).transpose(-2, -1)).transpose(-2, -1)
            return np.ascontiguousarray(out.numpy())
        return sparse
    Xn = sim.data.numpy()
    if sim.batched:
        return lambda Wt: np.matmul(Wt, Xn)

    def dense(Wt):  # the trials side by side: one GEMM for all
        T, r, n = Wt.shape
        return (Wt.reshape(T * r, n) @ Xn).reshape(T, r, n)
    return dense


class _Lambda:
    """``lambda`` ``(T,)`` in the shapes the blocks use, made when it changes: ``col``
    ``(T, 1, 1)`` and ``neg`` ``-lambda`` ``(T, 1)``; with one trial both 0-d arrays (the same
    broadcasts, which NumPy runs at half the cost per call)."""

    def __init__(self, lam):
        self.vec = lam
        if lam.shape[0] == 1:
            self.col = lam.reshape(())
            self.neg = np.negative(self.col, out=np.empty((), dtype=lam.dtype))
        else:
            self.col, self.neg = lam[:, None, None], -lam[:, None]


class _Coefficients:
    """The sweep's coefficients ``C (T, r, 2r)``, made once per fit and rewritten per block: row
    ``i`` ``[-B_i / B_ii`` with 0 at ``i``, ``-e_i]`` (the right half never changes)."""

    def __init__(self, T: int, r: int, dtype):
        self.C = np.zeros((T, r, 2 * r), dtype=dtype)
        flat = self.C.reshape(T, 2 * r * r)
        flat[:, r::2 * r + 1] = -1  # (i, r + i)
        self.left, self.diag = self.C[:, :, :r], flat[:, ::2 * r + 1]  # views: B's part, its (i, i)

    def of(self, gram, neg_diag):
        """``C`` for ``B`` with the diagonal ``-diag(B)`` ``(T, r, 1)``."""
        np.divide(gram, neg_diag, out=self.left)
        self.diag[...] = 0
        return self.C


def _sweep_data(Zt, gram, XWt, Wt, lam, coef):
    """One block's data in the sweep's form: ``E (T, 2r, n)``, its first ``r`` rows a copy of the
    block ``Zt`` (swept in place), the others ``-A^T / diag(B)``; ``C (T, r, 2r)``, row ``i``
    ``[-B_i / B_ii`` with 0 at ``i``, ``-e_i]`` (``coef``: :class:`_Coefficients`), so that
    ``C_i E = a_i / B_ii - sum_{j != i} B_ij / B_ii z_j``: eq. (17)'s column ``i``
    (:class:`~.symhals._Rows`' update) in one product, whose clamp at zero is the column's second
    and last call. ``B = W^T W + lambda I`` and ``A^T = (X W)^T + lambda W^T`` from
    ``gram = W^T W``, ``XWt``, the rows ``Wt`` and ``lam`` (:class:`_Lambda`); ``-diag(B)`` is
    ``-lambda - diag(W^T W)`` (the same number as ``-(diag(W^T W) + lambda)``)."""
    T, r, n = Zt.shape
    neg_diag = np.subtract(lam.neg, gram.diagonal(0, 1, 2))[:, :, None]
    E = np.empty((T, 2 * r, n), dtype=Zt.dtype)
    E[:, :r] = Zt
    A = E[:, r:]
    np.multiply(lam.col, Wt, out=A)
    A += XWt
    A /= neg_diag
    return E, coef.of(gram, neg_diag)


def _sweep(E, C, s, zeros):
    """Eq. (17) over the block's rows ``E[:, :r]`` in place (``s`` ``(T, 1, n)`` scratch,
    ``zeros`` as ``s``'s row: the clamp's bound as an array, which NumPy takes at a fraction of
    the cost of converting a Python scalar per call; the same numbers)."""
    T, r = C.shape[0], C.shape[1]
    if T == 1:  # vector-matrix products on the rows (np.dot costs less per call than np.matmul)
        e, s1, z0 = E[0], s[0, 0], zeros[0, 0]
        for c, z in zip(C[0], e):  # sequential by definition (Gauss-Seidel); r rows of C
            np.dot(c, e, out=s1)
            np.maximum(s1, z0, out=z)
    else:
        for i in range(r):
            np.matmul(C[:, i:i + 1, :], E, out=s)
            np.maximum(s, zeros, out=E[:, i:i + 1, :])


def _sweep_narrow(E, C, s, zeros):
    """:func:`_sweep` for long rows: ``z_i = max(0, B'_i Z - A'_i)`` (``B'``, ``A'``: ``C``'s left
    half and ``E``'s lower rows), the product over the block's ``r`` rows instead of all ``2r``
    (a third call per column, half the memory read per product; the same number up to rounding:
    ``C_i E`` sums the data term inside the product)."""
    T, r = C.shape[0], C.shape[1]
    Z, A, L = E[:, :r], E[:, r:], C[:, :, :r]
    if T == 1:
        z_all, s1, z0 = Z[0], s[0, 0], zeros[0, 0]
        for c, z, a in zip(L[0], z_all, A[0]):  # sequential by definition (Gauss-Seidel)
            np.dot(c, z_all, out=s1)
            np.subtract(s1, a, out=s1)
            np.maximum(s1, z0, out=z)
    else:
        for i in range(r):
            np.matmul(L[:, i:i + 1, :], Z, out=s)
            np.subtract(s, A[:, i:i + 1], out=s)
            np.maximum(s, zeros, out=Z[:, i:i + 1, :])


def _reset_zero_rows(Z, before) -> bool:
    """The zero-row reset of the rows ``Z (T, r, n)`` (after a sweep, every entry ``>= 0``) to
    ``1e-16 x`` the largest entry of ``before`` (the block before the sweep), in place; whether
    a row was reset."""
    top = Z.max(axis=2)  # a row is all zero exactly where its largest is not > 0 (NaN too)
    if top.min() > 0:
        return False
    live = top > 0
    reset = before.max(axis=(1, 2)) * ZERO_COLUMN_RESET
    Z[...] = np.where(live[:, :, None], Z, reset[:, None, None])
    return not live.all()


def _checked_gram(Z, before):
    """``Z^T Z`` of the rows ``Z`` after one sweep, with :func:`_reset_zero_rows` applied first:
    the Gram matrix's diagonal (the rows' squared norms) is positive exactly where no row is all
    zero, so only a diagonal that is not (a zero row, an underflow, a NaN) pays the full check;
    a reset remakes the Gram matrix (the same numbers as the reset before it)."""
    gram = _gram(Z)
    if gram.diagonal(0, 1, 2).min() > 0:
        return gram
    return _gram(Z) if _reset_zero_rows(Z, before) else gram


def hals_block(Zt, Wt, XWt, gram, lam, inner_max: int, delta: float, coef: _Coefficients, zeros,
               narrow: bool = False):
    """SymHALS's (``inner_max = 1``) or A-SymHALS's block, :func:`~.symhals._block` on arrays:
    ``Zt (T, r, n)`` (not modified) with the other factor's rows ``Wt``, ``XWt = (X W)^T`` and
    ``gram = W^T W``, ``lam`` a :class:`_Lambda`, ``zeros`` ``(T, 1, n)``, ``narrow``: the sweep
    of :func:`_sweep_narrow`; returns the new rows ``(T, r, n)`` contiguous and their Gram matrix
    ``(T, r, r)``."""
    E, C = _sweep_data(Zt, gram, XWt, Wt, lam, coef)
    Z = E[:, :Zt.shape[1]]
    step = np.empty_like(zeros)
    sweep = _sweep_narrow if narrow else _sweep
    if inner_max == 1:
        sweep(E, C, step, zeros)
        Z = np.ascontiguousarray(Z)
        return Z, _checked_gram(Z, Zt)
    active = first = None
    for j in range(inner_max):  # A-SymHALS: :func:`~.symhals._rows_block`'s stopping rule
        prev = Z.copy()
        sweep(E, C, step, zeros)
        _reset_zero_rows(Z, prev)
        d = Z - prev
        change = np.einsum("tij,tij->t", d, d)
        if active is None:
            first, active = change, change > 0
        else:
            Z[~active] = prev[~active]
            active = active & (change > 0)
        active = active & (change >= delta * delta * first)
        if j + 1 < inner_max and not active.any():
            break
    Z = np.ascontiguousarray(Z)
    return Z, _gram(Z)


def anls_block(Zt, Wt, XWt, gram, lam, max_iter, solve: str):
    """SymANLS's block: the NNLS of :func:`~.symanls.anls_block` (``(X W)^T + lambda W^T`` is its
    ``C``, in its layout; ``lam`` a :class:`_Lambda`) on the arrays,
    :func:`~.nnls_numpy.nnls_bpp_numpy` with ``solve`` ``"masked"`` or ``"subsets"``."""
    T, r = Zt.shape[0], Zt.shape[1]
    G = gram.copy()
    G.reshape(T, r * r)[:, ::r + 1] += lam.vec[:, None]
    C = lam.col * Wt
    C += XWt
    Z = nnls_bpp_numpy(G, C, Zt, max_iter, solve=solve)
    return Z, _gram(Z)


def _block_solver(meth, T: int, n: int, r: int, dtype):
    """The block update of ``meth`` on arrays, chosen once for the sizes: SymHALS's sweep
    (:data:`NARROW_SWEEP_MIN`), SymANLS's NNLS (:data:`NUMPY_NNLS_MAX_ENTRIES`)."""
    if meth.name in ("symhals", "a_symhals"):
        coef, zeros, narrow = _Coefficients(T, r, dtype), np.zeros((T, 1, n), dtype=dtype), r * n > NARROW_SWEEP_MIN
        return lambda *a: hals_block(*a, meth.inner_max, meth.delta, coef, zeros, narrow)
    solve = "masked" if T * n * r * r <= NUMPY_NNLS_MAX_ENTRIES else "subsets"
    return lambda *a: anls_block(*a, meth.max_pivot_iter, solve)


class HostRun(CentralRun):
    """:class:`~.central.CentralRun` on the host plan: the same hooks, checkpoints and history, the
    iteration on NumPy arrays (the module). ``Ut``, ``Vt`` ``(T, r, n)``; ``XUt``, ``XVt`` their
    products ``(X U)^T``, ``(X V)^T``; ``VtV`` the Gram matrix of ``V`` (the next ``U``-block's)."""

    def __init__(self, sim, meth, rule, U0, *, tol: float, max_iter: int):
        self.sim, self.meth, self.rule, self.U0, self.tol, self.max_iter = sim, meth, rule, U0, tol, max_iter
        T = U0.shape[0]
        self.prod, self.block = _product(sim), _block_solver(meth, T, sim.n, U0.shape[-1], U0.numpy().dtype)
        self.tiny = torch.finfo(U0.dtype).tiny
        self.t = _Trials(T)
        self.sq = self.t.of(sim.sq_norm_per_trial(T).numpy().copy())
        U0t = np.ascontiguousarray(U0.transpose(-2, -1).numpy())
        self._load(U0t, U0t.copy())
        XV = torch.from_numpy(self.XVt).transpose(-2, -1)
        self.lam = initial_lambda(rule, sim, U0, U0, XV).numpy().copy()
        self.active = np.ones(T, dtype=bool)
        self.n_iter = np.zeros(T, dtype=np.int64)
        self.conv = np.zeros(T, dtype=bool)
        self._all_active, self._lams = True, None  # what a step reuses: whether no trial is frozen, lambda's shapes
        self._rows = RowBuffer(T, len(HISTORY_KEYS))
        self._zero = np.zeros((), dtype=U0.numpy().dtype)  # NumPy takes a 0-d array faster than a Python 0

    def _load(self, Ut, Vt):
        """The state from its rows, the products and Gram matrices made from them (a resumed run's
        are made as the uninterrupted run's were: the same bits)."""
        self.Ut, self.Vt = Ut, Vt
        self.XUt, self.XVt = self.prod(Ut), self.prod(Vt)
        self.UtU, self.VtV = _gram(Ut), _gram(Vt)

    # -- what the run shows -------------------------------------------------------------------
    @property
    def W(self) -> dict:
        """The factors as tensors ``(T, n, r)`` on the arrays' memory."""
        return {"U": torch.from_numpy(self.Ut).transpose(-2, -1), "V": torch.from_numpy(self.Vt).transpose(-2, -1)}

    def _values(self, now: float = 0.0):
        """The history's row (:data:`HISTORY_KEYS`, the time last; its values ``(6, T)`` the numbers
        of :func:`~.objective.metrics`), its values, ``<V, V>`` for the penalty rule and whether
        ``E`` and the objective are finite."""
        t, Ut, Vt, sqX, lam = self.t, self.Ut, self.Vt, self.sq, self.t.of(self.lam)
        D = Ut - Vt
        g2, vv = t.inner(D, D), t.inner(Vt, Vt)
        out, tensors = self._rows.next()
        out[0] = e = t.max(sqX - 2 * t.inner(self.XUt, Ut) + t.inner(self.UtU, self.UtU), 0.0) / sqX
        out[1] = obj = (0.5 * t.max(sqX - 2 * t.inner(self.XVt, Ut) + t.inner(self.UtU, self.VtV), 0.0)
                        + 0.5 * lam * g2)
        out[2] = g2
        out[3] = t.sqrt(g2) / t.max(t.sqrt(vv), self.tiny)
        out[4] = lam
        out[5] = now
        return dict(zip(HISTORY_KEYS, tensors)), out, vv, t.finite(e, obj)

    def _row(self, now: float) -> dict:
        return self._values(now)[0]

    def start_row(self) -> dict:
        return self._row(0.0)

    # -- one iteration ------------------------------------------------------------------------
    def step(self, k: int, clock) -> dict:
        Ut, Vt, lam = self.Ut, self.Vt, self.lam
        if self._lams is None or self._lams.vec is not lam:  # lambda's shapes, remade when it changes
            self._lams = _Lambda(lam)
        lams = self._lams
        U, UtU = self.block(Ut, Vt, self.XVt, self.VtV, lams)
        XU = self.prod(U)
        V, VtV = self.block(Vt, U, XU, UtU, lams)
        XV = self.prod(V)
        active = self.active
        if not self._all_active:  # frozen trials keep their iterate bit for bit
            keep = ~active
            for new, old in ((U, Ut), (V, Vt), (XU, self.XUt), (XV, self.XVt)):
                new[keep] = old[keep]
            UtU[keep], VtV[keep] = self.UtU[keep], self.VtV[keep]
        self.Ut, self.Vt, self.XUt, self.XVt, self.UtU, self.VtV = U, V, XU, XV, UtU, VtV
        self.n_iter = self.n_iter + active
        row, vals, vv, finite = self._values(clock())
        if not finite:
            raise DataError(f"X: the iterates of {self.meth.name} became non-finite at iteration {k} "
                            f"(penalty {self.rule.describe()}); check the scale of X")
        if self.rule.kind in ("adaptive", "kuang"):
            self.lam = np.where(active, self._next_lambda(vals[3], vv), lam)
        if self.tol > 0:
            self._stop(active)
        return row

    def _stop(self, active):
        """Freeze the active trials whose :meth:`_stationarity` is ``<= tol`` (one trial: on the
        float, the flags rewritten only when it stops)."""
        stat = self._stationarity()
        if self.t.one:
            if not (active[0] and stat <= self.tol):
                return
            done = active.copy()
        else:
            done = active & (stat <= self.tol)
        self.conv = self.conv | done
        self.active = active & ~done
        self._all_active = bool(self.active.all())

    def _next_lambda(self, rel_gap, vv):
        """:func:`~.penalty.next_lambda` (the same three sums for ``"adaptive"``), ``(T,)``."""
        t, kind = self.t, self.rule.kind
        if kind == "adaptive":
            lam = t.of(self.lam)
            uu, uv = t.inner(self.Ut, self.Ut), t.inner(self.Ut, self.Vt)
            ratio = t.where(uv > 0, (uu + vv) / (2 * t.max(uv, self.tiny)), 1.0)
            return t.array(lam * t.max(ratio, 1.0), self.lam.dtype)
        if kind == "kuang":
            return np.where(rel_gap >= KUANG_TOL, self.lam * self.lam.dtype.type(KUANG_FACTOR), self.lam)
        return self.lam

    def _stationarity(self):
        """:func:`~.objective.stationarity` on the rows: ``(U U^T U - X U)^T = U^T U U^T - (X U)^T``;
        a float with one trial, else ``(T,)``."""
        t, Ut = self.t, self.Ut
        G = np.matmul(self.UtU, Ut) - self.XUt
        P = np.minimum(G, self._zero)  # min(G, 0) where U = 0, G where U > 0
        np.copyto(P, G, where=Ut > 0)
        den = t.max(t.sqrt(self.sq * t.inner(Ut, Ut)), self.tiny)
        stat = t.sqrt(t.inner(P, P)) / den
        return stat if t.one else stat.astype(np.float64)

    def converged(self, k: int, row: dict) -> bool:
        return not self._all_active and not self.active.any()

    def report(self, callback, k: int, row: dict, clock) -> bool:
        W = self.W
        return bool(callback(SymNMFIteration(k, self.max_iter, row, W["U"], W["V"],
                                             torch.from_numpy(self.active.copy()))))

    def not_converged(self, k: int, tol: float) -> str:
        return (f"{self.meth.name}: {int(self.active.sum())} of {self.U0.shape[0]} trials did not reach tol={tol} in "
                f"{k} iterations")

    # -- what a checkpoint holds (the torch plan's names, shapes and dtypes) -------------------
    def state(self) -> dict:
        out = dict(W_U=self.W["U"], W_V=self.W["V"])
        out.update(lam=torch.from_numpy(self.lam), active=torch.from_numpy(self.active),
                   n_iter=torch.from_numpy(self.n_iter), converged=torch.from_numpy(self.conv))
        return out

    def load_state(self, tensors: dict, extra: dict) -> None:
        def rows(t):
            return np.array(t.detach().cpu().transpose(-2, -1).numpy(), order="C", copy=True)

        def arr(t):
            return np.array(t.detach().cpu().numpy(), copy=True)

        self._load(rows(tensors["W_U"]), rows(tensors["W_V"]))
        self.lam, self.active = arr(tensors["lam"]), arr(tensors["active"])
        self.n_iter, self.conv = arr(tensors["n_iter"]), arr(tensors["converged"])
        self._all_active, self._lams = bool(self.active.all()), None

    def final(self):
        W = self.W
        return (W["U"], W["V"], torch.from_numpy(self.lam), torch.from_numpy(self.n_iter),
                torch.from_numpy(self.conv))
