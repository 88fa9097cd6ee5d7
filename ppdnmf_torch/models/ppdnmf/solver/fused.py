"""``fuse=True``: the ADMM iterations compiled by TorchInductor.

Small problems run a whole ADMM iteration as one compiled graph
(:class:`CompiledGraph`: called without ``torch.compile``'s per-call guards, so that its
fixed cost buys the fusion of every elementwise chain, and for small ranks of the
products too). Large problems compile the elementwise chains alone, writing into the
workspace's buffers: a compiled graph would allocate its intermediates afresh, and a
fresh large tensor costs more to page in than the arithmetic on it. The kernels here
compute what :mod:`.eager` computes; they round slightly differently (fused
multiply-adds). docs/PERFORMANCE.md records what each buys.

Carried differences. Without a stopping rule, the large fused loop keeps
``D = X - P_prev`` (eq. 8's X less the dual it was computed from) instead of X and P:
eq. 10 gives ``P = P_prev - X + U = U - D`` (bit for bit: ``a - b = -(b - a)`` in
IEEE arithmetic), so an iteration reads U and D and writes D, and X and P are
written once, by the last iteration: two passes over the state fewer per iteration.
The Y-step likewise: eq. 14 is ``R = V - D`` with ``D = Y - R_prev``. The variants that
also write X (Y), in the last iteration, are functions of their own: each compiled
function has its own budget of recompilations (one per shape).
"""
from __future__ import annotations

from collections import OrderedDict
from functools import partial

import torch

from ....exchange.base import ell_gather_sum
from .kernels import NBR_PASS_NODE_LIMIT

__all__ = ["CompiledGraph", "FusedKernels", "compiled_kernels", "small_matmul", "carry_pass"]


def fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool):
    """Eqs. 8-9 from ``P``: ``X``, ``D = X - P`` and the right-hand side of eq. 9."""
    X_new = torch.clamp(U + P, min=0)
    D = X_new - P
    c = rho * U + 2.0 * Q - Q_prev if derived else rho * (U + 2.0 * Q - Q_prev)
    return X_new, D, ZYt + mu * D + c


def small_matmul(A, B, small: bool):
    """``A @ B`` of batched matrices; ``small`` (inner size below 8): a broadcast product
    summed over the inner axis, which Inductor fuses into the elementwise loop around it
    (a batched BLAS call at synthetic sizes costs mostly its per-call overhead)."""
    return (A.unsqueeze(-1) * B.unsqueeze(-3)).sum(-2) if small else A @ B


def fx_whole(U, P, ZYt, Q, Q_prev, rho, d, E, mu, derived: bool, small: bool = False):
    X_new, _, rhs = fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    U_new = small_matmul(rhs, small_matmul(E * d.unsqueeze(-2), E.mT, small), small)
    return X_new, U_new, P - X_new + U_new, U_new.sum((-2, -1))


def fx_whole_nbr(U, P, ZYt, Q, Q_prev, rho, d, E, nbr, wv, mu, derived: bool, small: bool = False):
    """:func:`fx_whole` and steps 5-6 with the exchange's padded neighbour operator."""
    X_new, U_new, P_new, usum = fx_whole(U, P, ZYt, Q, Q_prev, rho, d, E, mu, derived, small)
    S = ell_gather_sum(U_new.reshape(nbr.shape[0], -1), nbr, wv)
    return X_new, U_new, P_new, usum, S.view_as(Q) + Q


def fq_into(U, nbr, wv, Q, Q_out):
    """Steps 5-6 with the exchange's padded neighbour operator: ``Q + S`` into ``Q_out``."""
    Q_out.copy_(ell_gather_sum(U, nbr, wv) + Q)


def fx_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, X_out, rhs_out):
    X_new, _, rhs = fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    X_out.copy_(X_new)
    rhs_out.copy_(rhs)


def fx_post_into(P, X_new, U_new, P_out, usum_out):
    P_out.copy_(P - X_new + U_new)
    usum_out.copy_(U_new.sum((-2, -1)))


def fx_carry_first_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out):
    """The first iteration: ``D`` and the right-hand side from the state's ``P``."""
    _, D, rhs = fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)


def fx_carry_first_x_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, X_out):
    """:func:`fx_carry_first_into` that also writes ``X`` (a one-iteration loop)."""
    X_new, D, rhs = fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    X_out.copy_(X_new)


def fx_carry_into(U, D_old, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, usum_out):
    """The previous iteration's eq. 10 (``P = U - D``, in registers) and U sums, and this
    iteration's eqs. 8-9, in one pass."""
    _, D, rhs = fx_body(U, U - D_old, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))


def fx_carry_x_into(U, D_old, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, usum_out, X_out):
    """:func:`fx_carry_into` that also writes ``X`` (the last iteration)."""
    X_new, D, rhs = fx_body(U, U - D_old, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))
    X_out.copy_(X_new)


def fx_carry_nbr_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived: bool, D_out, rhs_out, usum_out, Q_out,
                       X_out=None):
    """:func:`fx_carry_into` with the previous iteration's steps 5-6 in the same pass:
    ``Q_new = Q + S`` from the exchange's padded neighbour operator (``nbr``, ``wv``: the
    previous iteration's), written to ``Q_out``; eqs. 8-9 then read ``Q_new`` and, as
    ``Q_prev``, ``Q``. The pass reads U once for both, and ``Q_prev`` not at all. With
    ``X_out`` (the last iteration) it also writes ``X``."""
    Q_new = ell_gather_sum(U.reshape(nbr.shape[0], -1), nbr, wv).view_as(Q) + Q
    X_new, D, rhs = fx_body(U, U - D_old, ZYt, Q_new, Q, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))
    Q_out.copy_(Q_new)
    if X_out is not None:
        X_out.copy_(X_new)


def fx_carry_nbr_x_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived: bool, D_out, rhs_out, usum_out, Q_out,
                         X_out):
    """:func:`fx_carry_nbr_into` writing ``X``: a function of its own, with its own budget
    of recompilations."""
    fx_carry_nbr_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived, D_out, rhs_out, usum_out, Q_out, X_out)


def fx_carry_last_into(U, D, P_out, usum_out):
    """The last iteration's eq. 10 and U sums."""
    P_out.copy_(U - D)
    usum_out.copy_(U.sum((-2, -1)))


def fy_body(V, R, XtZ, eta):
    """Eq. 12 and the right-hand side of eq. 13: ``Y``, ``D = Y - R`` and ``XtZ + eta D``."""
    Y_new = torch.clamp(V + R, min=0)
    D = Y_new - R
    return Y_new, D, XtZ + eta * D


def fy_whole(V, R, XtZ, G_inv, eta, small: bool = False):
    Y_new, _, B = fy_body(V, R, XtZ, eta)
    V_new = small_matmul(G_inv, B, small)
    return Y_new, V_new, R - Y_new + V_new


def fy_pre_into(V, R, XtZ, eta, Y_out, B_out):
    Y_new, _, B = fy_body(V, R, XtZ, eta)
    Y_out.copy_(Y_new)
    B_out.copy_(B)


def fy_post_into(R, Y_new, V_new, R_out):
    R_out.copy_(R - Y_new + V_new)


def fy_carry_first_into(V, R, XtZ, eta, D_out, B_out):
    _, D, B = fy_body(V, R, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)


def fy_carry_first_y_into(V, R, XtZ, eta, D_out, B_out, Y_out):
    Y_new, D, B = fy_body(V, R, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)
    Y_out.copy_(Y_new)


def fy_carry_into(V, D_old, XtZ, eta, D_out, B_out):
    _, D, B = fy_body(V, V - D_old, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)


def fy_carry_y_into(V, D_old, XtZ, eta, D_out, B_out, Y_out):
    Y_new, D, B = fy_body(V, V - D_old, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)
    Y_out.copy_(Y_new)


def fy_carry_last_into(V, D, R_out):
    R_out.copy_(V - D)


def carry_pass(kernels, primal, dual, D_c, args, last_out):
    """One pass of a carried-difference loop: the first iteration starts from the state's
    dual (``D_c`` None), later ones from ``D_c``; the last also writes ``last_out``."""
    first, first_last, later, later_last = kernels
    if last_out is None:
        fn = first if D_c is None else later
        fn(primal, dual if D_c is None else D_c, *args)
    else:
        fn = first_last if D_c is None else later_last
        fn(primal, dual if D_c is None else D_c, *args, last_out)


class CompiledGraph:
    """``fn`` compiled by Inductor once per combination of static keywords and tensor
    layouts, and called directly.

    ``torch.compile`` evaluates Dynamo's guards and wrappers on every call, which costs
    about as much as a whole iteration of a small problem computes. The key
    stands in for the guards the solver's calls need: each tensor's shape, strides,
    dtype, device and ``requires_grad``, which arguments are the same tensor (a trace
    reads a repeated argument once), and the static keywords with their types (bool, int
    or str only: ``True == 1`` must not share a graph). ``make_fx`` traces ``fn`` with the
    first arguments of each key (Python control flow runs at trace time, so ``fn`` must
    not branch on tensor values); ``fn`` must not mutate its inputs, and the graphs are
    for inference (no autograd). Each ``CompiledGraph`` keeps its :data:`MAX_GRAPHS` most
    recently used graphs; one dropped is compiled again when next needed.
    """

    MAX_GRAPHS = 8

    def __init__(self, fn):
        self.fn, self.graphs = fn, OrderedDict()

    def __call__(self, *tensors, **static):
        ids = [id(t) for t in tensors]
        same = () if len(set(ids)) == len(ids) else tuple(ids.index(i) for i in ids)
        key = (tuple((k, type(v), v) for k, v in static.items()), same,
               *[(t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in tensors])
        graph = self.graphs.get(key)
        if graph is None:
            bad = [k for k, v in static.items() if type(v) not in (bool, int, str)]
            if bad:
                raise TypeError(f"CompiledGraph: static keywords must be bool, int or str, got {bad}")
            from torch._inductor import compile as inductor_compile
            from torch.fx.experimental.proxy_tensor import make_fx

            traced = make_fx(partial(self.fn, **static))(*tensors)
            graph = self.graphs[key] = inductor_compile(traced, list(tensors))
            if len(self.graphs) > self.MAX_GRAPHS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return graph(*tensors)


class FusedKernels:
    """The compiled iterations (compiled lazily, on first call, once per shape)."""

    def __init__(self):
        def c(f):
            return torch.compile(f, dynamic=False)

        # small problems: a whole iteration per call, where the per-call cost counts
        self.x_whole, self.x_whole_nbr = CompiledGraph(fx_whole), CompiledGraph(fx_whole_nbr)
        self.y_whole = CompiledGraph(fy_whole)
        self.x_pre, self.x_post, self.q_into = c(fx_pre_into), c(fx_post_into), c(fq_into)
        self.y_pre, self.y_post = c(fy_pre_into), c(fy_post_into)
        # the (first, first and last, later, later and last) passes of the carried-difference loops
        self.x_carry = tuple(c(f) for f in (fx_carry_first_into, fx_carry_first_x_into, fx_carry_into,
                                            fx_carry_x_into))
        self.y_carry = tuple(c(f) for f in (fy_carry_first_into, fy_carry_first_y_into, fy_carry_into,
                                            fy_carry_y_into))
        # (later, later and last). Inductor stores a node in a fresh buffer of its own (and
        # copies it) when it reads more than realize_cpu_acc_reads_threshold inputs (12 by
        # default: a neighbour operator of 6 slots or more) or holds more than
        # realize_cpu_opcount_threshold operations (50: 12 slots or more), which made the
        # joint pass slower than the two passes it replaces. The limits are raised past what the widest operator the
        # exchange pads (ELL_MAX_SLOTS) needs (tested on the generated code); a torch without
        # these settings keeps the two passes (None).
        from torch._inductor import config as inductor_config

        limits = ("realize_cpu_acc_reads_threshold", "realize_acc_reads_threshold",
                  "realize_cpu_opcount_threshold", "realize_opcount_threshold")
        nbr_opts = {k: NBR_PASS_NODE_LIMIT for k in limits if hasattr(inductor_config, k)}
        nbr_opts = nbr_opts if len(nbr_opts) == len(limits) else {}
        self.x_carry_nbr = tuple(torch.compile(f, dynamic=False, options=nbr_opts)
                                 for f in (fx_carry_nbr_into, fx_carry_nbr_x_into)) if nbr_opts else None
        self.x_carry_last, self.y_carry_last = c(fx_carry_last_into), c(fy_carry_last_into)


_FUSED = None


def compiled_kernels(fuse: bool):
    """None (eager torch ops), or the compiled iterations of ``fuse=True``: single-pass
    loops over the elementwise chains, which cut the memory traffic (large problems) and
    the number of calls (small ones) of an iteration; a compilation (seconds) per new
    shape (each whole-iteration :class:`CompiledGraph` keeps its 8 most recently used graphs and
    compiles a dropped one again; beyond torch's limit on recompilations of one chain, 8
    by default, torch runs it uncompiled), and slightly different rounding (fused
    multiply-adds)."""
    global _FUSED
    if not fuse:
        return None
    if _FUSED is None:
        _FUSED = FusedKernels()
    return _FUSED

