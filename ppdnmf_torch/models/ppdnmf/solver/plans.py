"""Execution plans: how one X-step's (or Y-step's) ADMM iterations run, chosen once per step.

Every plan computes the same equations (8-10 for the X-step, 12-14 for the Y-step); they
differ in how the work reaches the hardware:

* eager (``fuse=False``): torch operations into reused buffers, in agent groups on large
  CPU problems (:class:`EagerXPlan`, :class:`EagerYPlan`);
* fused whole iterations (``fuse=True``, small problems): one compiled graph per
  iteration, with steps 5-6 inside when the exchange has a padded neighbour operator
  (:class:`WholeXPlan`, :class:`WholeYPlan`);
* fused carried differences (``fuse=True``, large problems, fixed iteration counts): the
  loop carries ``D = X - P_prev`` and writes X and P once, at the end; the plain
  exchange's neighbour sum joins the next iteration's pass (:class:`CarryXPlan`,
  :class:`CarryYPlan`);
* fused buffered chains (``fuse=True``, large problems with a stopping rule): compiled
  elementwise passes into reused buffers (:class:`BufferedXPlan`, :class:`BufferedYPlan`).

The X-step's loop (:func:`~ppdnmf_torch.models.ppdnmf.solver.admm.x_step`) calls, per ADMM iteration,
:meth:`XPlan.neighbour_operator` and :meth:`XPlan.iterate`, and once at the end
:meth:`XPlan.finish`; it never looks at which plan runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import kernels
from .eager import dual_update, inverse_factors, u_update, x_post_grouped, x_pre, y_iteration
from .fused import carry_pass, compiled_kernels
from .kernels import MINV_BLOCK_BYTES, SMALL_BMM, Workspace, agent_group, bmm, is_large

__all__ = ["XVars", "XFixed", "XIterate", "XPlan", "x_plan", "YPlan", "y_plan"]


@dataclass
class XVars:
    """The X-step's loop variables ``(T, N, L, K)``, rebound as the iterations go."""

    X: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor


@dataclass
class XFixed:
    """What stays fixed during an X-step: ``Z Y^T (T, N, L, K)`` and ``Y Y^T = E diag(lam) E^T``
    (``lam (T, N, K)``, ``E``, ``Et = E^T (T, N, K, K)``), and the parameters of eq. 9."""

    ZYt: torch.Tensor
    lam: torch.Tensor
    E: torch.Tensor
    Et: torch.Tensor
    mu: float | torch.Tensor  # a float, or mu_i per agent (T, N, 1, 1) (penalty_schedule="adaptive")
    derived: bool


@dataclass
class XIterate:
    """One iteration's new ``X, U, P`` (before the stopping rule's mask) and what the plan did.

    ``sums_done``: this iteration's sums of ``U_i`` are in ``u_sums[m]`` already;
    ``Q_new``: steps 5-6 computed by the plan (``Q + S``), or None;
    ``deferred``: steps 5-6 of this iteration run in the next iteration's pass.
    """

    X: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    sums_done: bool = False
    Q_new: torch.Tensor | None = None
    deferred: bool = False


class XPlan:
    """Base of the X-step plans: the eager path's neighbour sums come from the exchange."""

    def __init__(self, fixed: XFixed, ws: Workspace, u_sums: torch.Tensor):
        self.f, self.ws, self.u_sums = fixed, ws, u_sums

    def neighbour_operator(self, exchange, g, active):
        """The exchange's padded neighbour operator for steps 5-6 inside the plan, or None."""
        return None

    def prepare(self, D_block) -> None:
        """The spectral factors ``d (x_iters, T, N, K)`` of the whole X-step, when known ahead."""

    def iterate(self, m: int, v: XVars, rho, d, op, active) -> XIterate:  # pragma: no cover
        """Eqs. 8-10 of iteration ``m`` (0-based) from ``v``; steps 5-6 too when ``op`` is given."""
        raise NotImplementedError

    def finish(self, v: XVars, m: int) -> None:
        """After the last iteration ``m`` (0-based)."""


class EagerXPlan(XPlan):
    """Eager torch operations (:mod:`.eager`); large CPU problems in groups of ``group`` agents."""

    def __init__(self, fixed, ws, u_sums, group: int):
        super().__init__(fixed, ws, u_sums)
        self.group, self.Minv_block = group, None

    def prepare(self, D_block):
        K = D_block.shape[-1]
        if K ** 3 < SMALL_BMM and D_block.numel() * K * D_block.element_size() <= MINV_BLOCK_BYTES:
            # small K: one batched product for the X-step's E diag(d) E^T instead of a call
            # per iteration (same bits: torch's small-matrix kernel multiplies each matrix
            # alone, whatever the batch; BLAS batches round by batch size, tested)
            self.Minv_block = inverse_factors(self.f.E, self.f.Et, D_block)

    def iterate(self, m, v, rho, d, op, active):
        f, ws = self.f, self.ws
        Minv = None if self.Minv_block is None else self.Minv_block[m]
        X_new, rhs = x_pre(v.U, v.P, f.ZYt, v.Q, v.Q_prev, rho, f.mu, f.derived, ws, v.X, self.group)  # eqs. 8, 9
        U_new = u_update(rhs, f.E, f.Et, d, ws, v.U, Minv)  # eq. 9
        if self.group and active is None:
            return XIterate(X_new, U_new, x_post_grouped(v.P, X_new, U_new, ws, self.group, self.u_sums[m]), True)
        return XIterate(X_new, U_new, dual_update(v.P, X_new, U_new, ws, "P"))  # eq. 10


class _FusedXPlan(XPlan):
    def __init__(self, fixed, ws, u_sums, fused, mu_c, small: bool):
        super().__init__(fixed, ws, u_sums)
        self.fused, self.mu_c, self.small = fused, mu_c, small

    def neighbour_operator(self, exchange, g, active):
        # a stopped agent's neighbours must see its old U: no fused neighbour sums then
        return exchange.neighbour_operator(g, self.f.ZYt.dtype) if active is None else None

    def _q_into(self, v: XVars, U_new, op):
        """Steps 5-6 with the padded operator: ``Q + S`` into a buffer."""
        A = v.U.shape[0] * v.U.shape[1]
        Q_new = self.ws.take("S", v.U, (v.Q, v.Q_prev))
        self.fused.q_into(U_new.view(A, -1), *op, v.Q.view(A, -1), Q_new.view(A, -1))
        return Q_new


class WholeXPlan(_FusedXPlan):
    """One compiled graph per iteration (small problems), steps 5-6 included when possible."""

    def iterate(self, m, v, rho, d, op, active):
        f, fz = self.f, self.fused
        Q_new = None
        if op is None:
            X_new, U_new, P_new, s_new = fz.x_whole(v.U, v.P, f.ZYt, v.Q, v.Q_prev, rho, d, f.E, self.mu_c,
                                                    derived=f.derived, small=self.small)
        else:
            X_new, U_new, P_new, s_new, Q_new = fz.x_whole_nbr(v.U, v.P, f.ZYt, v.Q, v.Q_prev, rho, d, f.E, *op,
                                                               self.mu_c, derived=f.derived, small=self.small)
        self.u_sums[m].copy_(s_new)
        return XIterate(X_new, U_new, P_new, True, Q_new)


class BufferedXPlan(_FusedXPlan):
    """Compiled elementwise passes into the workspace's buffers (large problems, stopping rule)."""

    def iterate(self, m, v, rho, d, op, active):
        f, fz, ws = self.f, self.fused, self.ws
        X_new, rhs = ws.take("X", v.U, (v.X,)), ws.take("rhs", v.U)
        fz.x_pre(v.U, v.P, f.ZYt, v.Q, v.Q_prev, rho, self.mu_c, f.derived, X_new, rhs)  # eqs. 8, 9
        U_new = u_update(rhs, f.E, f.Et, d, ws, v.U)  # eq. 9
        P_new = ws.take("P", v.P, (v.P,))
        fz.x_post(v.P, X_new, U_new, P_new, self.u_sums[m])  # eq. 10
        return XIterate(X_new, U_new, P_new, True, None if op is None else self._q_into(v, U_new, op))


class CarryXPlan(_FusedXPlan):
    """Carried differences ``D = X - P_prev`` (large problems, fixed counts; see :mod:`.fused`).

    ``X`` is written by the last iteration and ``P`` by :meth:`finish`; with the plain
    exchange's padded operator, an iteration's steps 5-6 run in the next iteration's pass,
    which reads ``U`` anyway (:data:`~.kernels.DEFER_NEIGHBOUR_SUM`).
    """

    def __init__(self, fixed, ws, u_sums, fused, mu_c, small: bool, n_iters: int):
        super().__init__(fixed, ws, u_sums, fused, mu_c, small)
        self.n_iters, self.D_c, self.deferred = n_iters, None, None

    def iterate(self, m, v, rho, d, op, active):
        f, fz, ws, D_c = self.f, self.fused, self.ws, self.D_c
        rhs, D_new = ws.take("rhs", v.U), ws.take("D_c", v.U, () if D_c is None else (D_c,))
        last = m == self.n_iters - 1
        X_new = ws.take("X", v.U, (v.X,)) if last else None  # the last iteration writes X
        if self.deferred is not None:  # the previous iteration's steps 5-6 join this pass
            Q_out = ws.take("S", v.U, (v.Q, v.Q_prev))
            args = (f.ZYt, v.Q, rho, *self.deferred, self.mu_c, f.derived, D_new, rhs, self.u_sums[m - 1], Q_out)
            fz.x_carry_nbr[last](v.U, D_c, *args, *(() if X_new is None else (X_new,)))
            v.Q_prev, v.Q, self.deferred = v.Q, Q_out, None
        else:
            args = (f.ZYt, v.Q, v.Q_prev, rho, self.mu_c, f.derived, D_new, rhs)
            args += () if D_c is None else (self.u_sums[m - 1],)
            carry_pass(fz.x_carry, v.U, v.P, D_c, args, X_new)
        self.D_c = D_new
        U_new = u_update(rhs, f.E, f.Et, d, ws, v.U)  # eq. 9
        it = XIterate(v.X if X_new is None else X_new, U_new, v.P, True)  # P: after the loop
        if op is not None and not last and kernels.DEFER_NEIGHBOUR_SUM and fz.x_carry_nbr is not None:
            self.deferred, it.deferred = op, True
        elif op is not None:
            it.Q_new = self._q_into(v, U_new, op)
        return it

    def finish(self, v, m):
        if self.D_c is not None:  # the last iteration's eq. 10
            v.P = self.ws.take("P", v.P, (v.P,))
            self.fused.x_carry_last(v.U, self.D_c, v.P, self.u_sums[m])


def x_plan(fixed: XFixed, ws: Workspace, u_sums, *, fuse: bool, track: bool, n_iters: int) -> XPlan:
    """The X-step's plan for this problem's size, device and settings (once per X-step).

    ``track``: a stopping rule (or a frozen agent) is tracked, so the iteration count is
    not fixed in advance and the carried-difference loop cannot run.
    """
    U = fixed.ZYt
    fused = compiled_kernels(fuse)
    large = is_large(U)
    if fused is None:
        group = 0
        if large and U.device.type == "cpu":  # the elementwise chains group by group (the same bits)
            T, N, L, K = U.shape
            group = agent_group(T * N, 8 * L * K * U.element_size(), kernels.X_TILE_BYTES)
        return EagerXPlan(fixed, ws, u_sums, group)
    # compiled code takes mu as a 0-d tensor: a Python float would compile anew for every value
    mu_c = fixed.mu if isinstance(fixed.mu, torch.Tensor) else torch.tensor(fixed.mu, dtype=U.dtype, device=U.device)
    small = U.shape[-1] ** 3 < SMALL_BMM
    if not large:
        return WholeXPlan(fixed, ws, u_sums, fused, mu_c, small)
    if not track:
        return CarryXPlan(fixed, ws, u_sums, fused, mu_c, small, n_iters)
    return BufferedXPlan(fixed, ws, u_sums, fused, mu_c, small)


# -- the Y-step ------------------------------------------------------------------------
class YPlan:
    """The Y-step's ADMM iterations (eqs. 12-14) on ``V, R (..., K, M)`` with ``X^T Z`` and
    ``G_inv = (X^T X + eta I)^-1`` fixed; one plan per loop (a group of agents has its own)."""

    def __init__(self, XtZ, G_inv, ws: Workspace, eta: float, n_iters: int):
        self.XtZ, self.G_inv, self.ws, self.eta, self.n_iters = XtZ, G_inv, ws, eta, n_iters

    def iterate(self, k: int, Y, V, R):  # pragma: no cover
        """Iteration ``k``'s ``Y, V, R`` (before the stopping rule's mask)."""
        raise NotImplementedError

    def finish(self, V, R):
        """``R`` after the last iteration."""
        return R


class EagerYPlan(YPlan):
    """Eager operations on the first ``Mw`` (real) columns, zero padding kept in buffers."""

    def __init__(self, XtZ, G_inv, ws, eta, n_iters, Mw: int):
        super().__init__(XtZ, G_inv, ws, eta, n_iters)
        self.Mw = Mw

    def iterate(self, k, Y, V, R):
        Y_new, _, V_new, R_new = y_iteration(V, R, self.XtZ, self.G_inv, self.eta, self.Mw, self.ws, (Y, V, R))
        return Y_new, V_new, R_new


class _FusedYPlan(YPlan):
    def __init__(self, XtZ, G_inv, ws, eta, n_iters, fused, small: bool):
        super().__init__(XtZ, G_inv, ws, eta, n_iters)
        self.fused, self.small = fused, small
        self.eta_c = torch.tensor(eta, dtype=XtZ.dtype, device=XtZ.device)


class WholeYPlan(_FusedYPlan):
    def iterate(self, k, Y, V, R):
        return self.fused.y_whole(V, R, self.XtZ, self.G_inv, self.eta_c, small=self.small)


class BufferedYPlan(_FusedYPlan):
    def iterate(self, k, Y, V, R):
        ws = self.ws
        Y_new, B = ws.take("Y", V, (Y,)), ws.take("B", V)
        self.fused.y_pre(V, R, self.XtZ, self.eta_c, Y_new, B)  # eq. 12, the right-hand side of eq. 13
        V_new = bmm(self.G_inv, B, out=ws.take("V", V, (V,)))  # eq. 13
        R_new = ws.take("R", R, (R,))
        self.fused.y_post(R, Y_new, V_new, R_new)  # eq. 14
        return Y_new, V_new, R_new


class CarryYPlan(_FusedYPlan):
    """Carried differences ``D = Y - R_prev``: ``Y`` written by the last iteration, ``R`` at the end."""

    def __init__(self, *args):
        super().__init__(*args)
        self.D_c = None

    def iterate(self, k, Y, V, R):
        ws = self.ws
        B, D_new = ws.take("B", V), ws.take("D_y", V, () if self.D_c is None else (self.D_c,))
        Y_new = ws.take("Y", V, (Y,)) if k == self.n_iters - 1 else None  # the last iteration writes Y
        carry_pass(self.fused.y_carry, V, R, self.D_c, (self.XtZ, self.eta_c, D_new, B), Y_new)
        self.D_c = D_new
        V_new = bmm(self.G_inv, B, out=ws.take("V", V, (V,)))  # eq. 13
        return Y if Y_new is None else Y_new, V_new, R  # R: after the loop

    def finish(self, V, R):
        if self.D_c is None:
            return R
        R = self.ws.take("R", R, (R,))
        self.fused.y_carry_last(V, self.D_c, R)  # the last iteration's eq. 14
        return R


def y_plan(XtZ, G_inv, ws: Workspace, *, eta: float, n_iters: int, fuse: bool, large: bool, fixed: bool,
           width: int) -> YPlan:
    """The Y-step's plan for one loop (a whole batch or a group of its agents).

    ``large``: the whole batch is large enough for buffers (a group of a large batch keeps
    the batch's plan); ``fixed``: fixed iteration counts and no agent frozen; ``width``: the
    widest agent's real columns (the eager plan's elementwise width).
    """
    fused = compiled_kernels(fuse)
    if fused is None:
        return EagerYPlan(XtZ, G_inv, ws, eta, n_iters, width)
    small = XtZ.shape[-2] ** 3 < SMALL_BMM
    if not large:
        return WholeYPlan(XtZ, G_inv, ws, eta, n_iters, fused, small)
    cls = CarryYPlan if fixed else BufferedYPlan
    return cls(XtZ, G_inv, ws, eta, n_iters, fused, small)
