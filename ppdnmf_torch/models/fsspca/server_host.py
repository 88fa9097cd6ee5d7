"""The host plan of FSSPCA with a server (issue 41): Algorithm 1's iteration on NumPy arrays.

With one trial, one worker and ``d = 40`` an iteration of the torch plan (:class:`~.server_run.ServerRun`)
is some two hundred torch calls on arrays of a few dozen numbers, bound by the cost per call,
several times NumPy's on the CPU (docs/PERFORMANCE.md, "Federated sparse PCA"). The host plan
(:class:`HostServerRun`) runs the same iteration on NumPy arrays: the workers' polar steps
(:func:`.polar.polar_rows_array`, batched over trials and workers by NumPy's batched matrix
product, in worker chunks as :func:`.polar.polar_steps`), the upload, the server's z-step (the
sum through the same aggregator, on a tensor sharing the upload's memory, so every kind and its
counted costs are the torch plan's), the dual step, the history's seven values and the stopping
test; with one float64 trial the per-trial numbers are Python floats.

The state is kept in the steps' layout, rows ``(T, K, r, d)`` (``z`` ``(T, r, d)``); what leaves
the run (the callback's values, the history, the checkpoints, the result) is torch tensors, a
checkpoint's in the torch plan's shapes, so a run resumes across the plans.

The two plans compute the same numbers up to rounding (other kernels and reduction orders);
``tests/test_fsspca_plan.py`` holds them to ``1e-9`` relative with the same stopping iteration.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ...driver import LoopModel
from ...driver.history import RowBuffer
from ...errors import ConfigError
from . import admm
from .centring import aggregate
from .polar import CHUNK_BYTES, polar_rows_array, smooth_weight
from .result import HISTORY_KEYS, IterationInfo
from .smoothing import SMOOTHINGS

__all__ = ["PLANS", "choose_plan", "HostServerRun"]

#: the execution plans of :func:`~.fit.fit_fsspca`
PLANS = ("auto", "torch", "host")


def host_applies(like: torch.Tensor, local_solver: str) -> bool:
    """Whether the host plan runs a fit of ``like``'s device and dtype with ``local_solver``."""
    return (like.device.type == "cpu" and like.dtype in (torch.float32, torch.float64) and not like.requires_grad
            and local_solver == "polar")


def choose_plan(plan: str, like: torch.Tensor, local_solver: str) -> str:
    """The plan of one fit, ``"torch"`` or ``"host"``, chosen once.

    ``"auto"``: the host plan for CPU float tensors with the polar local solver (any aggregation:
    the sum goes through the aggregator on a tensor view), the torch plan on CUDA and for the
    Riemannian solver (its line searches stay torch's).
    """
    if plan not in PLANS:
        raise ConfigError(f"plan: must be one of {list(PLANS)}, got {plan!r}")
    fits = host_applies(like, local_solver)
    if plan == "host" and not fits:
        raise ConfigError(f"plan: 'host' runs local_solver='polar' on CPU float32/float64 tensors, not "
                          f"local_solver={local_solver!r} on {like.device.type} {like.dtype}")
    if plan == "auto":
        return "host" if fits else "torch"
    return plan


def _numpy_smoothing(psi, mu):
    """``(value, grad)`` of ``psi_mu`` on arrays: NumPy's for ``sqrt`` and ``huber`` (the formulas
    of :mod:`.smoothing`, in their order), else the torch functions on tensors sharing the memory."""
    if psi is SMOOTHINGS["sqrt"]:
        c = 4.0 * mu * mu
        return (lambda x: _root(x, c)), (lambda x: x / _root(x, c))
    if psi is SMOOTHINGS["huber"]:
        def value(x):
            a = np.abs(x)
            return np.where(a <= mu, x * x / (2.0 * mu), a - mu / 2.0)
        return value, (lambda x: np.clip(x / mu, -1.0, 1.0))
    return ((lambda x: psi.value(torch.from_numpy(x), mu).numpy()),
            (lambda x: psi.grad(torch.from_numpy(x), mu).numpy()))


def _root(x, c):
    """``sqrt(c + x^2)`` in three calls on one new array (``np.hypot`` is one call, but several
    times slower per entry on large arrays)."""
    h = np.multiply(x, x)
    h += c
    return np.sqrt(h, out=h)


def _tiny(dtype):
    return _TINY[np.dtype(dtype)]


_TINY = {np.dtype(t): np.finfo(t).tiny for t in (np.float32, np.float64)}


def _rows(t: torch.Tensor) -> np.ndarray:
    """A ``(..., d, r)`` tensor as a C-contiguous array of rows ``(..., r, d)`` (a copy)."""
    return np.array(t.detach().cpu().transpose(-2, -1).numpy(), order="C", copy=True)


def _columns(a: np.ndarray) -> torch.Tensor:
    """Rows ``(..., r, d)`` as a contiguous ``(..., d, r)`` tensor (a copy: the torch plan's layout)."""
    return torch.from_numpy(np.ascontiguousarray(a.swapaxes(-2, -1)))


class HostServerRun(LoopModel):
    """:class:`~.server_run.ServerRun` on the host plan (see the module): the same hooks, history,
    callback values and checkpoints. Takes :class:`~.server_run.ServerRun`'s arguments
    (``local_solver`` must be ``"polar"``)."""

    name = "fsspca"
    step_name = "ADMM iteration"

    def __init__(self, problem, state, aggregation, *, lam1, lam2, rho, rho_bar, smoothing, mu, line_search,
                 inner_steps, local_solver, tol, settings: dict, inputs):
        if local_solver != "polar":
            raise ConfigError(f"plan: the host plan runs local_solver='polar', not {local_solver!r}")
        self.problem, self.aggregation, self.tol = problem, aggregation, float(tol)
        self.steps, self.theta = int(inner_steps), state.theta
        self._settings, self._inputs = settings, inputs
        self.evals, self.failures = state.line_search_evals, state.line_search_failures
        T, K, d = problem.n_trials, problem.n_workers, problem.n_features
        self.T, self.K, self.r = T, K, state.z.shape[-1]
        self.pooled = problem.pooled_gram()
        self.C = problem.gram.numpy()  # (T, K, d, d), stride 0 over shared trials
        self.sq = problem.sqnorm.numpy()
        self.G = None if problem.projector is None else problem.projector.numpy()[:, None]
        pooled = self.pooled.numpy()
        self._pooled, self._trace = pooled, np.trace(pooled, axis1=-2, axis2=-1)
        dt = self.C.dtype
        # one float64 trial: the per-trial numbers as Python floats (the same IEEE operations)
        self.one = T == 1 and dt == np.float64
        shared = T > 1 and problem.gram.stride(0) == 0
        self.per = max(1, CHUNK_BYTES // max(1, d * d * dt.itemsize * (1 if shared else T)))
        self._set_params(lam1.numpy(), lam2.numpy(), rho.numpy(), rho_bar.numpy(), smoothing, mu)
        self._load(_rows(state.w), _rows(state.u), _rows(state.z))
        self.active = np.ones(T, dtype=bool)
        self.conv = np.zeros(T, dtype=bool)
        self.iters = np.zeros(T, dtype=np.int64)
        self._full = True
        self._last = None
        self._values = None
        self._rows = RowBuffer(T, len(HISTORY_KEYS), problem.gram.dtype)

    def _set_params(self, lam1, lam2, rho, rho_bar, psi, mu):
        """The per-trial parameters in the shapes the steps broadcast them in (floats for one trial)."""
        T, K, one = self.T, self.K, self.one
        self.smooth = bool((lam2 != 0).any())
        self.value, self.grad = _numpy_smoothing(psi, mu)
        self._c = 4.0 * mu * mu if psi is SMOOTHINGS["sqrt"] else None

        def per_trial(x, dims):  # (T,) -> (T, 1, ...) or a float
            return float(x[0]) if one else x.reshape((T,) + (1,) * dims)

        self.lam1, self.lam2, self.rho_bar = per_trial(lam1, 0), per_trial(lam2, 0), per_trial(rho_bar, 0)
        self.lam2_4 = per_trial(lam2, 3)
        self.lamL_4 = self.lam2_4 * smooth_weight(psi, mu)
        self.worker_rho = rho.ndim == 2
        if self.worker_rho:
            self.rho4, self.rho2 = rho.reshape(T, K, 1, 1), rho
            self.rho_bar4 = per_trial(rho_bar, 3)
            self.weight = per_trial(np.sqrt((rho * rho).sum(axis=1)), 0)
        else:
            self.rho4, self.rho2 = per_trial(rho, 3), per_trial(rho, 1)
            self.weight = self.rho_bar * K ** 0.5
        # lambda_1 / (K rho), the z-step's threshold (eq. (13)), per trial
        self.tau = self.lam1 / (K * self.rho_bar) if one else (lam1 / (K * rho_bar)).reshape(T, 1, 1)
        self.neg_tau = -self.tau

    def _load(self, wt, ut, zt):
        """The iterates from their rows, and ``(C_i w_i)^T`` made from them (as every step makes it)."""
        self.wt, self.ut, self.zt = wt, ut, zt
        self.Pt = np.concatenate([np.matmul(wt[:, i:i + self.per], self.C[:, i:i + self.per])
                                  for i in range(0, self.K, self.per)], axis=1)

    # -- one iteration --------------------------------------------------------------------
    def _local(self, bt):
        """The workers' polar steps (eq. (14), :func:`.polar.polar_steps`) from ``wt`` with the
        targets ``bt = rho_i z - u_i``, a chunk of workers at a time (their Gram matrices stay in
        the cache through the steps): the new rows and ``(C_i w_i)^T`` at them."""
        if self.T * self.K == 1:  # one point: 2-D products (np.dot costs less per call than np.matmul)
            lam2, lamL = (self.lam2_4, self.lamL_4) if self.one else (self.lam2_4[0, 0], self.lamL_4[0, 0])
            x, P = self._steps(self.wt[0, 0], bt[0, 0], self.C[0, 0], np.dot, lam2, lamL)
            return x[None, None], P[None, None]
        xs, ps = [], []
        for i in range(0, self.K, self.per):
            sl = slice(i, i + self.per)
            x, P = self._steps(self.wt[:, sl], bt[:, sl], self.C[:, sl], np.matmul, self.lam2_4, self.lamL_4)
            xs.append(x)
            ps.append(P)
        if len(xs) == 1:
            return xs[0], ps[0]
        return np.concatenate(xs, axis=1), np.concatenate(ps, axis=1)

    def _steps(self, x, b, C, matmul, lam2, lamL):
        """The polar steps of the points ``x`` with the targets ``b`` and Gram matrices ``C`` (rows,
        ``matmul`` their product; ``lam2``, ``lamL``: ``lambda_2`` and ``lambda_2 kappa / mu``
        broadcasting against ``x``): the new points and ``(C x)^T`` at them."""
        G = self.G if self.G is None or x.ndim == 4 else self.G[0, 0]
        for _ in range(self.steps):
            M = matmul(x, C)  # (C x)^T = x^T C: C is symmetric
            M *= 2.0
            M += b
            if self.smooth:
                M += self._smooth_term(x, lam2, lamL)
            if G is not None:
                M = matmul(M, G)  # (G M)^T = M^T G
            x = polar_rows_array(M)
        return x, matmul(x, C)

    def _smooth_term(self, x, lam2, lamL):
        """``lambda_2 (kappa / mu) x - lambda_2 psi'(x)``, the majorizer's smooth part; for ``sqrt``
        as ``x (lambda_2 kappa / mu - lambda_2 / sqrt(4 mu^2 + x^2))`` (six calls, in place)."""
        if self._c is None:
            return lamL * x - lam2 * self.grad(x)
        h = _root(x, self._c)
        np.divide(lam2, h, out=h)
        np.subtract(lamL, h, out=h)
        h *= x
        return h

    def step(self, k: int, clock) -> dict:
        wt, ut, zt, K = self.wt, self.ut, self.zt, self.K
        rho4, full = self.rho4, self._full
        x, P = self._local(rho4 * zt[:, None] - ut)
        up = x + ut / rho4 if not self.worker_rho else (rho4 * x + ut) / self.rho_bar4
        total = aggregate(self.aggregation, torch.from_numpy(up).transpose(-2, -1), 2)
        v = total.numpy().swapaxes(-2, -1) / K
        # soft(v, tau) = sign(v) max(|v| - tau, 0) as v - clip(v, -tau, tau): the same numbers
        # (v - tau and v + tau exactly; zero inside), fewer calls
        zn = v - np.minimum(np.maximum(v, self.neg_tau), self.tau)
        gap = x - zn[:, None]
        un = ut + rho4 * gap
        if not full:  # frozen trials keep their iterates (and C w) bit for bit
            keep = ~self.active
            x[keep], P[keep], zn[keep], un[keep] = wt[keep], self.Pt[keep], zt[keep], ut[keep]
            gap = x - zn[:, None]
        row, views = self._rows.next()
        vals = row if full else np.empty_like(row)
        change = (self._values_one if self.one else self._values_batch)(x, P, zn, zt, un, gap, vals)
        self.wt, self.ut, self.zt, self.Pt = x, un, zn, P
        primal, scale, tol = vals[5], math.sqrt(K * self.r), self.tol
        if self.one:  # the stopping test on floats; the arrays change only when it is met
            if self.active[0] and primal[0] / scale <= tol and change <= tol:
                self.conv, self.active = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
        else:
            done = (primal / scale <= tol) & (change <= tol) & self.active
            self.conv = self.conv | done
            self.active = self.active & ~done
        self._values = vals  # the callback's (made into tensors only for one)
        if full:
            self.iters += 1
        else:
            self.iters += ~keep
            row[...] = vals
            if self._last is not None:
                row[:, keep] = self._last[:, keep]
        self._last = row
        return dict(zip(HISTORY_KEYS, views))

    def _values_one(self, x, P, zn, zt, un, gap, out):
        """:func:`.admm.iteration_values` of one float64 trial on floats into ``out (7, 1)``
        (:data:`.result.HISTORY_KEYS`); returns the change of ``z`` (a float)."""
        K = self.K
        if K == 1:
            def inner(a, b):
                return float(np.vdot(a, b))
            g2 = inner(gap, gap)
            f = float(self.sq[0, 0]) - inner(x, P)
            if self.smooth:
                f = f + self.lam2 * float(self.value(x).sum())
            worst = total_g2 = g2
            lag = inner(un, gap) + 0.5 * self.rho2 * g2
        else:
            def inner(a, b):
                return np.einsum("kij,kij->k", a[0], b[0])
            g2 = inner(gap, gap)
            f = self.sq[0] - inner(x, P)
            if self.smooth:
                f = f + self.lam2 * self.value(x)[0].sum(axis=(-2, -1))
            f, worst, total_g2 = float(f.sum()), float(g2.max()), float(g2.sum())
            lag = float((inner(un, gap) + 0.5 * self.rho2 * g2).sum())
        obj = f + self.lam1 * float(np.abs(zn).sum())
        lag = obj + lag
        dz = zn - zt
        step = math.sqrt(float(np.vdot(dz, dz)))
        sparsity = (zn.size - np.count_nonzero(zn)) / zn.size
        ev = self._explained_variance(zn)
        out[:, 0] = [obj, lag, ev if isinstance(ev, float) else float(ev[0]), sparsity, math.sqrt(worst),
                     math.sqrt(total_g2), self.weight * step]
        return step / math.sqrt(self.r)

    def _values_batch(self, x, P, zn, zt, un, gap, out):
        """:func:`.admm.iteration_values` on the rows into ``out (7, T)`` (:data:`.result.HISTORY_KEYS`);
        returns the change of ``z`` ``(T,)``."""
        T = self.T

        def inner(a, b):
            return np.einsum("tkij,tkij->tk", a, b)
        g2 = inner(gap, gap)
        f = self.sq - inner(x, P)
        if self.smooth:
            f = f + self.lam2[:, None] * self.value(x).sum(axis=(-2, -1))
        out[0] = f.sum(axis=1) + self.lam1 * np.abs(zn).sum(axis=(-2, -1))
        out[1] = out[0] + (inner(un, gap) + 0.5 * self.rho2 * g2).sum(axis=1)
        dz = zn - zt
        step = np.sqrt(np.einsum("tij,tij->t", dz, dz))
        out[2] = self._explained_variance(zn)
        out[3] = np.count_nonzero(zn.reshape(T, -1) == 0, axis=1) / (zn.shape[1] * zn.shape[2])
        out[4] = np.sqrt(g2.max(axis=1))
        out[5] = np.sqrt(g2.sum(axis=1))
        out[6] = self.weight * step
        return step / math.sqrt(self.r)

    def _explained_variance(self, zt):
        """:func:`.admm.adjusted_variance` of the rows ``zt (T, r, d)``: ``(T,)``, a float for one
        float64 trial with ``r <= 2``."""
        r = zt.shape[1]
        if self.one and r <= 2:
            z = zt[0]
            N = np.dot(z, z.T).tolist()
            n = [math.sqrt(N[i][i]) for i in range(r)]
            M = np.dot(np.dot(z, self._pooled[0]), z.T).tolist()

            def score(i, j):  # (Vn^T C Vn)_ij, the normalized loadings' (a zero column: 0)
                return M[i][j] / (n[i] * n[j]) if n[i] > 0 and n[j] > 0 else 0.0
            m = score(0, 0)
            total = max(m, 0.0)
            if r == 2:
                b = score(0, 1)
                total += max(score(1, 1) - b * ((1.0 / m if m != 0 else 0.0) * b), 0.0)
            return total / float(self._trace[0])
        norms = np.sqrt(np.einsum("tij,tij->ti", zt, zt))[..., None]
        Vn = np.where(norms > 0, zt / np.maximum(norms, _tiny(zt.dtype)), 0.0).astype(zt.dtype, copy=False)
        M = np.matmul(np.matmul(Vn, self._pooled), Vn.swapaxes(-2, -1))  # score covariance (T, r, r)
        total = np.maximum(M[:, 0, 0], 0)
        for j in range(1, r):  # as admm.adjusted_variance_components: sequential by definition
            b = M[:, :j, j]
            if j == 1:
                m = M[:, 0, 0]
                inv = np.where(m != 0, 1.0 / np.where(m != 0, m, 1.0), 0.0)
                res = M[:, 1, 1] - b[:, 0] * (inv * b[:, 0])
            else:
                res = M[:, j, j] - (b * np.matmul(np.linalg.pinv(M[:, :j, :j], hermitian=True),
                                                  b[..., None])[..., 0]).sum(-1)
            total = total + np.maximum(res, 0)
        return total / self._trace

    # -- the driver's hooks -----------------------------------------------------------------
    def converged(self, k: int, row: dict) -> bool:
        if self.one:
            return not self.active[0]
        running = int(self.active.sum())
        self._full = running == self.T
        return running == 0

    def report(self, callback, k: int, row: dict, clock) -> bool:
        values = dict(zip(HISTORY_KEYS, torch.from_numpy(self._values).unbind()))
        return bool(callback(IterationInfo(k, values, torch.from_numpy(self.active.copy()))))

    def not_converged(self, k: int, tol: float) -> str:
        bad = np.flatnonzero(~self.conv).tolist()
        return f"FSSPCA: trials {bad} did not reach tol={tol} in {k} iterations"

    # -- what leaves the run: torch tensors in the torch plan's shapes ------------------------
    @property
    def st(self) -> admm.ADMMState:
        """The iterates as :class:`.admm.ADMMState` (copies, ``(T, K, d, r)``)."""
        return admm.ADMMState(w=_columns(self.wt), u=_columns(self.ut), z=_columns(self.zt), theta=self.theta,
                              line_search_evals=self.evals, line_search_failures=self.failures)

    @property
    def n_iter(self) -> torch.Tensor:
        return torch.from_numpy(self.iters.copy())

    @property
    def converged_trials(self) -> torch.Tensor:
        return torch.from_numpy(self.conv.copy())

    def state(self) -> dict:
        return {"w": _columns(self.wt), "u": _columns(self.ut), "z": _columns(self.zt), "theta": self.theta,
                "active": torch.from_numpy(self.active.copy()), "converged": torch.from_numpy(self.conv.copy()),
                "n_iter": torch.from_numpy(self.iters.copy())}

    def load_state(self, tensors: dict, extra: dict) -> None:
        self._load(_rows(tensors["w"]), _rows(tensors["u"]), _rows(tensors["z"]))
        self.theta = tensors["theta"].to(self.theta.device)
        self.active, self.conv, self.iters = (np.array(tensors[k].cpu().numpy(), copy=True)
                                              for k in ("active", "converged", "n_iter"))
        self._full = bool(self.active.all())
        self.evals, self.failures = int(extra["evals"]), int(extra["failures"])

    def resumed(self, done: int, history) -> None:
        """The last row of a resumed run (a stopped trial repeats it)."""
        if history.get(HISTORY_KEYS[0]):
            self._last = np.stack([np.asarray(history[key][-1].cpu().numpy(), dtype=self.C.dtype)
                                   for key in HISTORY_KEYS])

    def extra(self) -> dict:
        return {"evals": int(self.evals), "failures": int(self.failures)}

    def settings(self) -> dict:
        return self._settings

    def inputs(self) -> dict:
        return self._inputs()
