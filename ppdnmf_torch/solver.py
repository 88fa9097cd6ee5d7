"""The batched PPDNMF solver: Algorithm 1 of the paper for every agent (and trial) at once.

All agents' variables are stacked, trial dimension first, agent dimension second:

* ``X, U, P, Q, Q_prev``: ``(T, N, L, K)``
* ``Y, V, R``: ``(T, N, K, M_max)``; columns beyond an agent's ``M_i`` are padding and
  stay exactly zero (``Z``'s padding is zero, so every update maps zeros to zeros).

Neighbour sums go through the exchange (:mod:`ppdnmf_torch.exchange`), which uses a
sparse, ``rho``-weighted adjacency over the ``T * N`` nodes. There is no Python loop
over agents, edges or trials: the loops are over BCD and ADMM iterations only.

The systems of the U-update (eq. 9) differ across an X-step's ADMM iterations only by
the diagonal shift ``mu + rho_i``: each X-step decomposes ``Y_i Y_i^T`` once (``eigh``)
and every iteration applies ``E diag(1 / (lam + mu + rho_i)) E^T``, a small batched
product instead of a factorization. Without a stopping rule to track, the penalties of
a whole X-step (and, for the ``plain`` exchange, their sums ``rho_i``) are drawn up front
in a few batched operations. Large problems write their updates into reused buffers
(:class:`Workspace`); ``fuse=True`` compiles the iterations with TorchInductor.

Equation numbers refer to arXiv 2403.18326; the consensus term follows
``ALGORITHM.md`` ("derived" form by default).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, fields
from collections import OrderedDict
from functools import cached_property, partial

import torch

from . import metrics
from ._utils import ConfigError, DataError, PPDNMFError, plain_number
from .exchange.base import Exchange, Topology, accepts_keyword, ell_gather_sum
from .penalties import PENALTY_MODES, PenaltySampler

__all__ = [
    "SolverParams",
    "Problem",
    "SolverState",
    "IterationInfo",
    "ConvergenceWarning",
    "NumericalError",
    "RunInterrupted",
    "restore_state",
    "make_sampler",
    "CONSENSUS_FORMS",
    "init_state",
    "run_bcd",
    "x_step",
    "y_step",
    "column_gram",
    "COLUMN_CHUNK",
    "Workspace",
]

CONSENSUS_FORMS = ("derived", "paper_literal")


class ConvergenceWarning(UserWarning):
    """A run with ``tol > 0`` hit its iteration cap before every agent converged."""


class NumericalError(PPDNMFError):
    """NaN or Inf appeared in the iterates."""


@dataclass(frozen=True)
class SolverParams:
    """Algorithm parameters (validated on construction).

    Parameters
    ----------
    rank : int
        ``K``.
    mu, eta : float
        ADMM penalties of the X-step (eqs. 8-11) and the Y-step (eqs. 12-14).
    bcd_iters, x_iters, y_iters : int
        Iteration caps of the BCD loop and of the two ADMM loops.
    tol : float
        Relative-change tolerance of the stopping rule (Sec. II-C); ``0`` runs the
        fixed iteration counts.
    admm_tol : float or None
        Tolerance of the two ADMM loops; ``None`` uses ``tol``. ``admm_tol=0`` with
        ``tol > 0`` runs fixed ADMM counts inside a BCD loop that stops on convergence
        (inner loops cut short too early can keep the outer loop from settling).
    penalty : {"random", "fixed"}
    consensus_form : {"derived", "paper_literal"}
    fuse : bool
        Compile the ADMM iterations with TorchInductor (see :func:`_fused`; a
        compilation per new shape; rounding differs slightly).
    """

    rank: int
    mu: float = 0.1
    eta: float = 1.0
    bcd_iters: int = 100
    x_iters: int = 30
    y_iters: int = 30
    tol: float = 0.0
    penalty: str = "random"
    consensus_form: str = "derived"
    admm_tol: float | None = None
    fuse: bool = False

    @property
    def inner_tol(self) -> float:
        return self.tol if self.admm_tol is None else self.admm_tol

    def __post_init__(self):
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ConfigError(f"rank: must be an integer >= 1, got {self.rank!r}")
        for name in ("mu", "eta"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name}: must be a finite number > 0, got {v!r}")
        for name in ("bcd_iters", "x_iters", "y_iters"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
        if not (isinstance(self.tol, (int, float)) and math.isfinite(self.tol) and self.tol >= 0):
            raise ConfigError(f"tol: must be a finite number >= 0, got {self.tol!r}")
        if self.admm_tol is not None and not (
            isinstance(self.admm_tol, (int, float)) and math.isfinite(self.admm_tol) and self.admm_tol >= 0
        ):
            raise ConfigError(f"admm_tol: must be None or a finite number >= 0, got {self.admm_tol!r}")
        if self.penalty not in PENALTY_MODES:
            raise ConfigError(f"penalty: unknown mode {self.penalty!r}; use one of {PENALTY_MODES}")
        if self.consensus_form not in CONSENSUS_FORMS:
            raise ConfigError(
                f"consensus_form: unknown form {self.consensus_form!r}; use one of {CONSENSUS_FORMS}"
            )


@dataclass
class Problem:
    """A batch of ``T`` distributed problems with the same ``N``, ``L`` and ``K``.

    Attributes
    ----------
    Z : Tensor (T, N, L, M_max)
        Zero-padded data blocks.
    counts : LongTensor (T, N)
        ``M_i`` of every agent.
    topology : Topology
        The trials' graphs, flattened to ``T * N`` nodes.
    caps : Tensor (T, N) float64
        Penalty caps ``g_i``.
    seeds : list of int
        One seed per trial (penalty streams).
    n_agents : int, optional
        The real agents: ``Z.shape[1]`` may hold isolated dummy agents after them
        (alignment padding of batched trials); they are left out of every metric.
    """

    Z: torch.Tensor
    counts: torch.Tensor
    topology: Topology
    caps: torch.Tensor
    seeds: list
    n_agents: int | None = None

    def __post_init__(self):
        if self.n_agents is None:
            self.n_agents = self.Z.shape[1]

    @property
    def shape(self):
        T, N, L, M = self.Z.shape
        return T, N, L, M

    @cached_property
    def width(self) -> int:
        """Columns of the widest agent: the real part of the padded ``M_max``."""
        return int(self.counts.max())

    def column_mask(self) -> torch.Tensor:
        """Bool ``(T, N, 1, M_max)``: True on real columns."""
        M = self.Z.shape[-1]
        ar = torch.arange(M, device=self.Z.device)
        return (ar < self.counts.to(self.Z.device)[..., None])[:, :, None, :]


@dataclass
class SolverState:
    """Every variable of Algorithm 1 (the warm start carries all of them across BCD iterations)."""

    X: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor
    Y: torch.Tensor
    V: torch.Tensor
    R: torch.Tensor
    g: torch.Tensor  # (2E,) float64 penalty draws, carried over
    bcd_done: int = 0  # completed BCD iterations
    frozen: torch.Tensor | None = None  # (T, N) bool, agents stopped by the BCD-level rule

    def tensors(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), torch.Tensor)}


def init_state(problem: Problem, rank: int, dtype=None) -> SolverState:
    """Algorithm 1's initial values: ``X = U = 1``, ``P = Q = Q_prev = 0``, ``Y = V = R = 0``, ``g = 0``."""
    Z = problem.Z
    dtype = dtype or Z.dtype
    T, N, L, M = Z.shape
    ones = torch.ones((T, N, L, rank), dtype=dtype, device=Z.device)
    zx = torch.zeros_like(ones)
    zy = torch.zeros((T, N, rank, M), dtype=dtype, device=Z.device)
    g = torch.zeros(problem.topology.n_directed_edges, dtype=torch.float64, device=Z.device)
    return SolverState(
        X=ones.clone(), U=ones, P=zx, Q=zx.clone(), Q_prev=zx.clone(),
        Y=zy, V=zy.clone(), R=zy.clone(), g=g,
    )


@dataclass
class IterationInfo:
    """What the callback receives after every BCD iteration.

    ``metrics`` maps names to Tensors of shape ``(T,)`` (one value per trial);
    ``state`` is the live solver state (do not modify it; its tensors are reused buffers
    that later iterations overwrite: copy what you keep); ``costs`` is the exchange's
    :meth:`~ppdnmf_torch.exchange.Exchange.costs` after this iteration (cumulative).
    """

    iteration: int
    n_iter: int
    metrics: dict
    state: SolverState
    elapsed: float
    costs: dict = field(default_factory=dict)
    iteration_costs: list = field(default_factory=list)


#: Largest ``E diag(d) E^T`` block (bytes, all ADMM iterations of an X-step) that the eager
#: solver computes ahead in one product; above it, one product per iteration.
MINV_BLOCK_BYTES = 1 << 23
#: torch multiplies batched ``(K, K)`` matrices with ``K ** 3`` below this with its own
#: per-matrix kernel (bits independent of the batch); larger ones go to BLAS.
SMALL_BMM = 400
#: fuse=True, large problems, plain exchange: an iteration's neighbour sum (steps 5-6) runs
#: in the next iteration's elementwise pass, which reads U anyway (:func:`_fx_carry_nbr_into`);
#: False keeps it a pass of its own (the same bits, tested)
DEFER_NEIGHBOUR_SUM = True
#: Inductor's limits on the reads and operations of one fused node, for the joint pass
NBR_PASS_NODE_LIMIT = 1024
#: Large Y-steps with fixed iteration counts run all their ADMM iterations on a group of
#: agents whose six ``(K, M)`` working tensors take about this many bytes (so that they stay
#: in the cache), then move to the next group: the agents do not communicate in the Y-step,
#: so this is the same arithmetic in another order. 0 turns it off (the same bits, tested).
#: CPU only.
Y_TILE_BYTES = 12 << 20
#: Large eager X-steps on the CPU run the elementwise chains before and after the U-update's
#: product (eqs. 8-10) group by group of agents whose eight ``(L, K)`` working tensors take
#: about this many bytes, so that each chain's later operations find their operands in the
#: cache instead of memory: the same operations on slices, the same bits (tested). The
#: product and the exchange still run on the whole batch. 0 turns it off.
X_TILE_BYTES = 24 << 20

#: Width of the column chunks that reductions over the (padded) column axis run in.
#: ``Problem`` pads ``M_max`` to a multiple of it.
COLUMN_CHUNK = 64


def column_gram(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                 scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``A @ B^T`` reduced over the column axis in fixed chunks of :data:`COLUMN_CHUNK`.

    ``A (..., p, M)``, ``B (..., q, M)`` -> ``(..., p, q)``, ``M`` a multiple of the chunk.
    A BLAS reduction's rounding depends on its length, so a plain ``A @ B^T`` over a
    padded axis would round differently for different ``M_max``. Chunks of a fixed
    width, added in order, make the result independent of how much zero padding
    follows: a trial gives the same bits alone or inside any batch. This matters more
    than usual here, because Algorithm 1's all-ones start is a symmetric saddle that
    amplifies rounding differences (see ALGORITHM.md notes in the README).

    ``out`` and ``scratch`` (contiguous, of the result's shape; optional) receive the sum and
    each later chunk's product: reused buffers spare large problems a fresh allocation, whose
    first touch of every page costs more than the product (the same bits either way).
    """
    M = A.shape[-1]
    acc = bmm(A[..., :COLUMN_CHUNK], B[..., :COLUMN_CHUNK].mT, out=out)
    for c in range(COLUMN_CHUNK, M, COLUMN_CHUNK):
        acc.add_(bmm(A[..., c:c + COLUMN_CHUNK], B[..., c:c + COLUMN_CHUNK].mT, out=scratch))
    return acc


def bmm(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Batched ``A @ B`` that always takes the batched kernel.

    ``torch.matmul`` folds a batch of one into a plain ``mm``, whose kernel rounds
    differently from ``bmm``'s; going through ``bmm`` keeps one trial (or one agent)
    bit-identical to the same trial inside a batch.
    """
    batch = A.shape[:-2]
    A3, B3 = A.reshape(-1, *A.shape[-2:]), B.reshape(-1, *B.shape[-2:])
    if out is not None:  # a contiguous buffer of the result's shape
        torch.bmm(A3, B3, out=out.view(-1, A.shape[-2], B.shape[-1]))
        return out
    return torch.bmm(A3, B3).reshape(*batch, A.shape[-2], B.shape[-1])


def _spd_inverse(A: torch.Tensor) -> torch.Tensor:
    """Inverse of a batch of symmetric positive definite ``(..., K, K)`` matrices, via Cholesky.

    The per-agent systems of eqs. 9 and 13 have ``L`` (resp. ``M_i``) right-hand sides;
    one batched ``bmm`` with the Cholesky-based inverse is several times faster than
    batched triangular solves for the small ``K`` of NMF, and the matrices are well
    conditioned (shifted by ``mu + rho_i`` or ``eta``). ``cholesky_ex`` does not
    synchronize with the device; non-finite input shows up as NaN in the result and is
    caught by the solver's finiteness check.
    """
    L = torch.linalg.cholesky_ex(A).L
    try:
        return torch.cholesky_inverse(L)
    except RuntimeError:  # torch.linalg.LinAlgError: a factorization failed on non-finite input
        # NaN carries the failure to the solver's finiteness check, which names the agents
        return torch.full_like(A, float("nan"))


def _eigh_psd(A: torch.Tensor):
    """Eigenvalues (clamped at 0) and eigenvectors of a batch of symmetric PSD ``(..., K, K)`` matrices.

    The X-step's systems (eq. 9) differ across ADMM iterations only by the shift
    ``mu + rho_i`` of the diagonal, so one decomposition per X-step serves them all:
    ``(A + c I)^-1 = E diag(1 / (lam + c)) E^T``, a small batched product per
    iteration instead of a factorization. ``A = Y Y^T`` is PSD; rounding can leave
    eigenvalues of order ``-eps |A|``, which the clamp removes (``c >= mu > 0``).
    Non-finite input gives non-finite factors (NaN eigenvalues, or NaN everywhere when
    the decomposition fails), caught by the solver's finiteness check.
    """
    try:
        lam, E = torch.linalg.eigh(A)
    except RuntimeError:  # torch.linalg.LinAlgError: no convergence on non-finite input
        nan = torch.full_like(A, float("nan"))
        return nan[..., 0], nan
    return lam.clamp_(min=0), E


def _where(mask, new, old):
    """``new`` on active agents, ``old`` elsewhere; ``mask (T, N)`` or None (all active)."""
    if mask is None:
        return new
    return torch.where(mask.view(mask.shape + (1,) * (new.dim() - mask.dim())), new, old)


def _rel_change(new, old):
    num = torch.linalg.matrix_norm(new - old)
    den = torch.linalg.matrix_norm(old).clamp_min(torch.finfo(old.dtype).tiny)
    return num / den


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stop_flags(flags, raised, topology: Topology):
    """Sec. II-C: a raised flag stops its agent and travels one hop per iteration."""
    T, N = flags.shape
    return (topology.spread(flags.reshape(-1)).reshape(T, N)) | raised


class Workspace:
    """Reusable output buffers of the ADMM updates, by name.

    A large fresh tensor is page-faulted in on every allocation (glibc serves big blocks
    with ``mmap`` and returns them on free), which on a CPU costs several times the
    arithmetic of an elementwise update. The updates therefore write into buffers that
    live for the whole run: :meth:`take` returns a buffer shaped like ``like`` that shares
    no storage with the tensors in ``avoid`` (the values still needed), so the state
    alternates between two buffers per variable. State tensors are overwritten by later
    iterations: whoever keeps one across iterations (checkpoints, the BCD stopping rule)
    copies it.
    """

    #: below this size (bytes of the tensor asked for) allocation is cheap (glibc keeps
    #: small blocks), and :meth:`take` returns None: the operation allocates its output
    MIN_BYTES = 1 << 20

    def __init__(self):
        self._bufs: dict = {}
        self._children: dict = {}

    def child(self, name: str) -> "Workspace":
        """A workspace of its own for tensors of another shape (kept for the whole run), that
        gives buffers at every size: its users run many passes over small tensors."""
        if name not in self._children:
            ws = self._children[name] = Workspace()
            ws.MIN_BYTES = 0
        return self._children[name]

    def take(self, name: str, like: torch.Tensor, avoid=()) -> torch.Tensor | None:
        if like.numel() * like.element_size() < self.MIN_BYTES:
            return None
        return self._buffer(name, like, avoid, torch.empty)

    def take_padded(self, name: str, like: torch.Tensor, avoid=()) -> torch.Tensor:
        """Like :meth:`take`, at any size, from buffers zeroed on creation: whoever writes
        only part of one (the real columns) keeps the rest (the padding) zero."""
        return self._buffer("padded:" + name, like, avoid, torch.zeros)

    def _buffer(self, key, like, avoid, make):
        bufs = self._bufs.setdefault(key, [])
        if bufs and (bufs[0].shape != like.shape or bufs[0].dtype != like.dtype or bufs[0].device != like.device):
            bufs.clear()
        busy = {a.untyped_storage().data_ptr() for a in avoid}
        for b in bufs:
            if b.untyped_storage().data_ptr() not in busy:
                return b
        b = make(like.shape, dtype=like.dtype, device=like.device)
        bufs.append(b)
        return b


def _x_pre(U, P, ZYt, Q, Q_prev, rho, mu: float, derived: bool, ws: Workspace, X_old, group: int = 0):
    """Eq. 8 and the right-hand side of eq. 9.

    ``X = max(0, U + P)``; ``rhs = Z Y^T + mu (X - P) + c`` with the consensus term
    ``c = rho U + 2 Q - Q_prev`` (derived) or ``rho (U + 2 Q - Q_prev)`` (as printed).
    In-place operations on workspace buffers: the iteration is memory bound. ``group > 0``
    (large problems, see :data:`X_TILE_BYTES`): the chain runs on ``group`` agents at a time.
    """
    X_new, rhs = ws.take("X", U, (X_old,)), ws.take("rhs", U)
    if not group:
        return _x_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived, X_new, rhs, ws.take("tmp_lk", U))
    Uf, Pf, Zf, Qf, Qpf, rf, Xf, Rf = _agent_rows(U, P, ZYt, Q, Q_prev, rho, X_new, rhs)
    tmp = ws.child("x_groups").take("tmp_lk", Uf[:group])
    for sl in _agent_slices(Uf.shape[0], group):
        _x_pre_into(Uf[sl], Pf[sl], Zf[sl], Qf[sl], Qpf[sl], rf[sl], mu, derived, Xf[sl], Rf[sl],
                    tmp[: sl.stop - sl.start])
    return X_new, rhs


def _x_pre_into(U, P, ZYt, Q, Q_prev, rho, mu: float, derived: bool, X_out, rhs_out, tmp):
    """:func:`_x_pre` into ``X_out`` and ``rhs_out`` (fresh tensors where None), ``tmp`` a scratch."""
    X_new = torch.add(U, P, out=X_out).clamp_(min=0)
    rhs = torch.add(ZYt, torch.sub(X_new, P, out=tmp), alpha=mu, out=rhs_out)
    if derived:
        rhs.addcmul_(rho, U).add_(Q, alpha=2.0).sub_(Q_prev)
    else:
        rhs.addcmul_(rho, torch.add(U, Q, alpha=2.0, out=tmp).sub_(Q_prev))
    return X_new, rhs


def _agent_rows(*tensors):
    """``(T, N, ...)`` tensors as ``(A, ...)``: trials and agents in one dimension (views of
    contiguous tensors, such as the workspace's buffers that the grouped chains write)."""
    return [t.reshape(-1, *t.shape[2:]) for t in tensors]


def _agent_slices(n_agents: int, group: int):
    return [slice(a, min(a + group, n_agents)) for a in range(0, n_agents, group)]


def _y_iteration(V, R, XtZ, G_inv, eta: float, Mw: int, ws: Workspace, live):
    """One Y-step ADMM iteration (eqs. 12-14) into zero-padded buffers, elementwise work on
    the first ``Mw`` columns only. Returns ``Y, B, V, R`` (full width)."""
    Yb, Bb = ws.take_padded("Y", V, live), ws.take_padded("B", V, live)
    Vb, Rb = ws.take_padded("V", V, live), ws.take_padded("R", V, live)
    Vn, Rn = V[..., :Mw], R[..., :Mw]
    Yn = torch.add(Vn, Rn, out=Yb[..., :Mw]).clamp_(min=0)  # eq. 12
    tmp = torch.sub(Yn, Rn, out=ws.take("tmp_km", Yn))
    torch.add(XtZ[..., :Mw], tmp, alpha=eta, out=Bb[..., :Mw])
    bmm(G_inv, Bb, out=Vb)  # eq. 13
    torch.sub(Rn, Yn, out=Rb[..., :Mw]).add_(Vb[..., :Mw])  # eq. 14
    return Yb, Bb, Vb, Rb


def _spectral_factors(lam, rho, mu: float):
    """``d = 1 / (lam + mu + rho_i)``, ``(..., T, N, K)`` from ``rho (..., T, N, 1, 1)``."""
    return torch.add(lam, rho[..., 0] + mu).reciprocal_()


def _inverse_factors(E, Et, d, ws: Workspace | None = None):
    """``E diag(d) E^T``: ``(..., T, N, K, K)`` for ``d (..., T, N, K)``: one iteration's (into
    the workspace ``ws``), or, without ``ws``, several iterations' at once."""
    if ws is None:
        Ed = E * d.unsqueeze(-2)
        return bmm(Ed, Et.expand_as(Ed))
    return bmm(torch.mul(E, d.unsqueeze(-2), out=ws.take("Ed", E)), Et, out=ws.take("Minv", E))


def _u_update(rhs, E, Et, d, ws: Workspace, U_old, Minv=None):
    """Eq. 9: ``rhs (Y Y^T + (mu + rho_i) I)^-1 = rhs (E diag(d) E^T)``, ``d = 1 / (lam + mu + rho_i)``
    (``Minv``: ``E diag(d) E^T`` computed ahead)."""
    if Minv is None:
        Minv = _inverse_factors(E, Et, d, ws)
    return bmm(rhs, Minv, out=ws.take("U", rhs, (U_old,)))


def _step_post(P, X_new, U_new, ws: Workspace, name: str):
    """Eqs. 10 and 14: the scaled dual update ``P - (X - U)``."""
    return torch.sub(P, X_new, out=ws.take(name, P, (P,))).add_(U_new)


def _x_post_grouped(P, X_new, U_new, ws: Workspace, group: int, u_sums):
    """Eq. 10 (:func:`_step_post`) on ``group`` agents at a time, each group's sums of ``U_i``
    into ``u_sums (T, N)`` (the finiteness check) while its ``U_i`` is in the cache."""
    P_new = ws.take("P", P, (P,))
    Pf, Xf, Uf, Pn = _agent_rows(P, X_new, U_new, P_new)
    sums = u_sums.view(-1)
    for sl in _agent_slices(Pf.shape[0], group):
        torch.sub(Pf[sl], Xf[sl], out=Pn[sl]).add_(Uf[sl])
        torch.sum(Uf[sl], dim=(-2, -1), out=sums[sl])
    return P_new


# -- fuse=True: the same iterations compiled by TorchInductor ---------------------------
# Small problems run a whole ADMM iteration as one compiled graph (:class:`_Graph`: the
# call's fixed cost, about 5 µs, then buys the fusion of every elementwise chain, and for
# small ranks of the products too). Large problems compile the elementwise chains alone, writing into the
# workspace's buffers: a compiled graph would allocate its intermediates afresh, and a
# fresh large tensor costs more to page in than the arithmetic on it.
def _fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool):
    """Eqs. 8-9 from ``P``: ``X``, ``D = X - P`` and the right-hand side of eq. 9."""
    X_new = torch.clamp(U + P, min=0)
    D = X_new - P
    c = rho * U + 2.0 * Q - Q_prev if derived else rho * (U + 2.0 * Q - Q_prev)
    return X_new, D, ZYt + mu * D + c


def _small_matmul(A, B, small: bool):
    """``A @ B`` of batched matrices; ``small`` (inner size below 8): a broadcast product
    summed over the inner axis, which Inductor fuses into the elementwise loop around it
    (a batched BLAS call costs 30-50 µs at synthetic sizes, most of it per call)."""
    return (A.unsqueeze(-1) * B.unsqueeze(-3)).sum(-2) if small else A @ B


def _fx_whole(U, P, ZYt, Q, Q_prev, rho, d, E, mu, derived: bool, small: bool = False):
    X_new, _, rhs = _fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    U_new = _small_matmul(rhs, _small_matmul(E * d.unsqueeze(-2), E.mT, small), small)
    return X_new, U_new, P - X_new + U_new, U_new.sum((-2, -1))


def _fx_whole_nbr(U, P, ZYt, Q, Q_prev, rho, d, E, nbr, wv, mu, derived: bool, small: bool = False):
    """:func:`_fx_whole` and steps 5-6 with the exchange's padded neighbour operator."""
    X_new, U_new, P_new, usum = _fx_whole(U, P, ZYt, Q, Q_prev, rho, d, E, mu, derived, small)
    S = ell_gather_sum(U_new.reshape(nbr.shape[0], -1), nbr, wv)
    return X_new, U_new, P_new, usum, S.view_as(Q) + Q


def _fq_into(U, nbr, wv, Q, Q_out):
    """Steps 5-6 with the exchange's padded neighbour operator: ``Q + S`` into ``Q_out``."""
    Q_out.copy_(ell_gather_sum(U, nbr, wv) + Q)


def _fx_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, X_out, rhs_out):
    X_new, _, rhs = _fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    X_out.copy_(X_new)
    rhs_out.copy_(rhs)


def _fx_post_into(P, X_new, U_new, P_out, usum_out):
    P_out.copy_(P - X_new + U_new)
    usum_out.copy_(U_new.sum((-2, -1)))


# Carried differences. Without a stopping rule, the large fused loop keeps
# ``D = X - P_prev`` (eq. 8's X less the dual it was computed from) instead of X and P:
# eq. 10 gives ``P = P_prev - X + U = U - D`` (bit for bit: ``a - b = -(b - a)`` in
# IEEE arithmetic), so an iteration reads U and D and writes D, and X and P are
# written once, by the last iteration. Two passes over the state fewer per iteration.
# The Y-step likewise: eq. 14 is ``R = V - D`` with ``D = Y - R_prev``. The variants that
# also write X (Y), in the last iteration, are functions of their own: each compiled
# function has its own budget of recompilations (one per shape).
def _fx_carry_first_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out):
    """The first iteration: ``D`` and the right-hand side from the state's ``P``."""
    _, D, rhs = _fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)


def _fx_carry_first_x_into(U, P, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, X_out):
    """:func:`_fx_carry_first_into` that also writes ``X`` (a one-iteration loop)."""
    X_new, D, rhs = _fx_body(U, P, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    X_out.copy_(X_new)


def _fx_carry_into(U, D_old, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, usum_out):
    """The previous iteration's eq. 10 (``P = U - D``, in registers) and U sums, and this
    iteration's eqs. 8-9, in one pass."""
    _, D, rhs = _fx_body(U, U - D_old, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))


def _fx_carry_x_into(U, D_old, ZYt, Q, Q_prev, rho, mu, derived: bool, D_out, rhs_out, usum_out, X_out):
    """:func:`_fx_carry_into` that also writes ``X`` (the last iteration)."""
    X_new, D, rhs = _fx_body(U, U - D_old, ZYt, Q, Q_prev, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))
    X_out.copy_(X_new)


def _fx_carry_nbr_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived: bool, D_out, rhs_out, usum_out, Q_out,
                       X_out=None):
    """:func:`_fx_carry_into` with the previous iteration's steps 5-6 in the same pass:
    ``Q_new = Q + S`` from the exchange's padded neighbour operator (``nbr``, ``wv``: the
    previous iteration's), written to ``Q_out``; eqs. 8-9 then read ``Q_new`` and, as
    ``Q_prev``, ``Q``. The pass reads U once for both, and ``Q_prev`` not at all. With
    ``X_out`` (the last iteration) it also writes ``X``."""
    Q_new = ell_gather_sum(U.reshape(nbr.shape[0], -1), nbr, wv).view_as(Q) + Q
    X_new, D, rhs = _fx_body(U, U - D_old, ZYt, Q_new, Q, rho, mu, derived)
    D_out.copy_(D)
    rhs_out.copy_(rhs)
    usum_out.copy_(U.sum((-2, -1)))
    Q_out.copy_(Q_new)
    if X_out is not None:
        X_out.copy_(X_new)


def _fx_carry_nbr_x_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived: bool, D_out, rhs_out, usum_out, Q_out,
                         X_out):
    """:func:`_fx_carry_nbr_into` writing ``X``: a function of its own, with its own budget
    of recompilations."""
    _fx_carry_nbr_into(U, D_old, ZYt, Q, rho, nbr, wv, mu, derived, D_out, rhs_out, usum_out, Q_out, X_out)


def _fx_carry_last_into(U, D, P_out, usum_out):
    """The last iteration's eq. 10 and U sums."""
    P_out.copy_(U - D)
    usum_out.copy_(U.sum((-2, -1)))


def _fy_body(V, R, XtZ, eta):
    """Eq. 12 and the right-hand side of eq. 13: ``Y``, ``D = Y - R`` and ``XtZ + eta D``."""
    Y_new = torch.clamp(V + R, min=0)
    D = Y_new - R
    return Y_new, D, XtZ + eta * D


def _fy_whole(V, R, XtZ, G_inv, eta, small: bool = False):
    Y_new, _, B = _fy_body(V, R, XtZ, eta)
    V_new = _small_matmul(G_inv, B, small)
    return Y_new, V_new, R - Y_new + V_new


def _fy_pre_into(V, R, XtZ, eta, Y_out, B_out):
    Y_new, _, B = _fy_body(V, R, XtZ, eta)
    Y_out.copy_(Y_new)
    B_out.copy_(B)


def _fy_post_into(R, Y_new, V_new, R_out):
    R_out.copy_(R - Y_new + V_new)


def _fy_carry_first_into(V, R, XtZ, eta, D_out, B_out):
    _, D, B = _fy_body(V, R, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)


def _fy_carry_first_y_into(V, R, XtZ, eta, D_out, B_out, Y_out):
    Y_new, D, B = _fy_body(V, R, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)
    Y_out.copy_(Y_new)


def _fy_carry_into(V, D_old, XtZ, eta, D_out, B_out):
    _, D, B = _fy_body(V, V - D_old, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)


def _fy_carry_y_into(V, D_old, XtZ, eta, D_out, B_out, Y_out):
    Y_new, D, B = _fy_body(V, V - D_old, XtZ, eta)
    D_out.copy_(D)
    B_out.copy_(B)
    Y_out.copy_(Y_new)


def _fy_carry_last_into(V, D, R_out):
    R_out.copy_(V - D)


def _carry_pass(kernels, primal, dual, D_c, args, last_out):
    """One pass of a carried-difference loop: the first iteration starts from the state's
    dual (``D_c`` None), later ones from ``D_c``; the last also writes ``last_out``."""
    first, first_last, later, later_last = kernels
    if last_out is None:
        fn = first if D_c is None else later
        fn(primal, dual if D_c is None else D_c, *args)
    else:
        fn = first_last if D_c is None else later_last
        fn(primal, dual if D_c is None else D_c, *args, last_out)


class _Graph:
    """``fn`` compiled by Inductor once per combination of static keywords and tensor
    layouts, and called directly.

    ``torch.compile`` evaluates Dynamo's guards and wrappers on every call: a compiled
    one-addition graph took 19 µs a call through it on the development VM and 5 µs called
    directly, where a whole iteration of a small problem computes in 15-55 µs. The key
    stands in for the guards the solver's calls need: each tensor's shape, strides,
    dtype, device and ``requires_grad``, which arguments are the same tensor (a trace
    reads a repeated argument once), and the static keywords with their types (bool, int
    or str only: ``True == 1`` must not share a graph). ``make_fx`` traces ``fn`` with the
    first arguments of each key (Python control flow runs at trace time, so ``fn`` must
    not branch on tensor values); ``fn`` must not mutate its inputs, and the graphs are
    for inference (no autograd). Each ``_Graph`` keeps its :data:`MAX_GRAPHS` most
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
                raise TypeError(f"_Graph: static keywords must be bool, int or str, got {bad}")
            from torch._inductor import compile as inductor_compile
            from torch.fx.experimental.proxy_tensor import make_fx

            traced = make_fx(partial(self.fn, **static))(*tensors)
            graph = self.graphs[key] = inductor_compile(traced, list(tensors))
            if len(self.graphs) > self.MAX_GRAPHS:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return graph(*tensors)


class _Fused:
    """The compiled iterations (compiled lazily, on first call, once per shape)."""

    def __init__(self):
        def c(f):
            return torch.compile(f, dynamic=False)

        # small problems: a whole iteration per call, where the per-call cost counts
        self.x_whole, self.x_whole_nbr, self.y_whole = _Graph(_fx_whole), _Graph(_fx_whole_nbr), _Graph(_fy_whole)
        self.x_pre, self.x_post, self.q_into = c(_fx_pre_into), c(_fx_post_into), c(_fq_into)
        self.y_pre, self.y_post = c(_fy_pre_into), c(_fy_post_into)
        # the (first, first and last, later, later and last) passes of the carried-difference loops
        self.x_carry = tuple(c(f) for f in (_fx_carry_first_into, _fx_carry_first_x_into, _fx_carry_into,
                                            _fx_carry_x_into))
        self.y_carry = tuple(c(f) for f in (_fy_carry_first_into, _fy_carry_first_y_into, _fy_carry_into,
                                            _fy_carry_y_into))
        # (later, later and last). Inductor stores a node in a fresh buffer of its own (and
        # copies it) when it reads more than realize_cpu_acc_reads_threshold inputs (12 by
        # default: a neighbour operator of 6 slots or more) or holds more than
        # realize_cpu_opcount_threshold operations (50: 12 slots or more); at 6 slots this
        # made the pass 4-5x slower than the two passes it replaces (development VM,
        # N = 2000, CBCL sizes). The limits are raised past what the widest operator the
        # exchange pads (ELL_MAX_SLOTS) needs (tested on the generated code); a torch without
        # these settings keeps the two passes (None).
        from torch._inductor import config as inductor_config

        limits = ("realize_cpu_acc_reads_threshold", "realize_acc_reads_threshold",
                  "realize_cpu_opcount_threshold", "realize_opcount_threshold")
        nbr_opts = {k: NBR_PASS_NODE_LIMIT for k in limits if hasattr(inductor_config, k)}
        nbr_opts = nbr_opts if len(nbr_opts) == len(limits) else {}
        self.x_carry_nbr = tuple(torch.compile(f, dynamic=False, options=nbr_opts)
                                 for f in (_fx_carry_nbr_into, _fx_carry_nbr_x_into)) if nbr_opts else None
        self.x_carry_last, self.y_carry_last = c(_fx_carry_last_into), c(_fy_carry_last_into)


_FUSED = None


def _fused(fuse: bool):
    """None (eager torch ops), or the compiled iterations of ``fuse=True``: single-pass
    loops over the elementwise chains, which cut the memory traffic (large problems) and
    the number of calls (small ones) of an iteration; a compilation (seconds) per new
    shape (each whole-iteration :class:`_Graph` keeps its 8 most recently used graphs and
    compiles a dropped one again; beyond torch's limit on recompilations of one chain, 8
    by default, torch runs it uncompiled), and slightly different rounding (fused
    multiply-adds)."""
    global _FUSED
    if not fuse:
        return None
    if _FUSED is None:
        _FUSED = _Fused()
    return _FUSED


class _StopRule:
    """Sec. II-C inside one ADMM loop: a converged agent raises a flag, the flag travels one
    hop per iteration, and an agent stops once it has it; every agent stops at the cap.

    With ``tol == 0`` and no agent frozen by the BCD-level rule nothing is tracked (the
    fixed counts run, without a device synchronization per iteration).
    """

    def __init__(self, frozen, tol, n_iters, topology, shape, device):
        self.frozen, self.tol, self.n_iters, self.topology = frozen, tol, n_iters, topology
        self.track = tol > 0 or frozen is not None
        self.flags = torch.zeros(shape, dtype=torch.bool, device=device)
        self.active = None if frozen is None else ~frozen
        self.counts = torch.full(shape, n_iters, dtype=torch.int64, device=device)
        if self.track:
            self.counts.zero_()

    def after(self, it: int, new, prev) -> bool:
        """Book-keeping after iteration ``it`` (0-based); True when the loop must end."""
        if not self.track:
            return False
        self.counts += self.active.to(torch.int64) if self.active is not None else 1
        if it == self.n_iters - 1:
            return True
        raised = torch.zeros_like(self.flags) if self.tol == 0 else (_rel_change(new, prev) < self.tol)
        if self.active is not None:
            raised &= self.active
        self.flags = _stop_flags(self.flags, raised, self.topology)
        self.active = ~self.flags if self.frozen is None else ~(self.flags | self.frozen)
        return not bool(self.active.any())


def x_step(problem: Problem, state: SolverState, params: SolverParams, exchange: Exchange,
           sampler: PenaltySampler, *, bcd_iter: int = 1, ws: Workspace | None = None):
    """X-step: ``x_iters`` ADMM iterations with secure consensus (eqs. 8-11, lines 4-17).

    Updates ``state`` in place. Returns a dict with the iteration counts per agent
    ``(T, N)`` and the primal/dual residuals ``(T,)``.
    """
    Z, topo = problem.Z, problem.topology
    T, N, L, _ = Z.shape
    K = params.rank
    mu = params.mu
    dtype = state.U.dtype
    A = T * N
    tol = params.inner_tol
    frozen = state.frozen

    ws = ws if ws is not None else Workspace()
    # (T, N, L, K), fixed during the X-step; large ones into buffers kept from the last
    # X-step ("rhs" is the loop's scratch, free until then)
    ZYt = column_gram(Z, state.Y, out=ws.take("ZYt", state.U), scratch=ws.take("rhs", state.U))
    lam, E = _eigh_psd(column_gram(state.Y, state.Y))  # Y Y^T = E diag(lam) E^T, (T, N, K), (T, N, K, K)
    Et = E.mT.contiguous()

    stop = _StopRule(frozen, tol, params.x_iters, topo, (T, N), Z.device)
    active = stop.active
    fused = _fused(params.fuse)
    large = state.U.numel() * state.U.element_size() >= Workspace.MIN_BYTES
    derived = params.consensus_form == "derived"
    # per-iteration sums of U_i: NaN/Inf anywhere in U_i makes its sum non-finite; one
    # reduction into a preallocated buffer, inspected once after the loop (no sync per
    # iteration)
    u_sums = torch.empty((params.x_iters, T, N), dtype=dtype, device=Z.device)
    sampler.begin_bcd_iteration()
    X, U, P, Q, Q_prev, g = state.X, state.U, state.P, state.Q, state.Q_prev, state.g
    # Without a stopping rule to track, the penalties of the whole X-step are known in
    # advance: draw them, and (where the exchange allows) their sums rho_i and the
    # spectral factors 1 / (lam + mu + rho_i) of eq. 9, in a few batched operations.
    G_rows = rho_block = D_block = Minv_block = None
    # fuse=True at large sizes, no stopping rule: the loop carries D_c = X - P_prev (see
    # _fx_carry_into); X and P are written by the last iteration
    carry, D_c = fused is not None and large and not stop.track, None
    # the carried loop with a padded neighbour operator: the operator of an iteration whose
    # steps 5-6 wait for the next iteration's pass (_fx_carry_nbr_into)
    deferred = None
    pass_out = accepts_keyword(exchange.exchange, "out")
    # compiled code takes mu as a 0-d tensor: a Python float would compile anew for every value
    mu_c = torch.tensor(mu, dtype=dtype, device=Z.device) if fused is not None else mu
    small_k = K ** 3 < SMALL_BMM
    # eager, large, CPU: the elementwise chains group by group (the same bits)
    x_group = 0
    if fused is None and large and Z.device.type == "cpu":
        x_group = _agent_group(A, 8 * L * K * state.U.element_size(), X_TILE_BYTES)
    if not stop.track:
        G = sampler.steps(g, params.x_iters)
        rho_block = exchange.penalty_block(G, bcd_iter=bcd_iter)
        G_rows = G.unbind(0)
        if rho_block is not None:
            rho_block = rho_block.to(dtype).view(params.x_iters, T, N, 1, 1)
            D_block = _spectral_factors(lam, rho_block, mu)  # (x_iters, T, N, K)
            small = small_k and D_block.numel() * K * D_block.element_size() <= MINV_BLOCK_BYTES
            if fused is None and small:
                # small K: one batched product for the X-step's E diag(d) E^T instead of a call
                # per iteration (same bits: torch's small-matrix kernel multiplies each matrix
                # alone, whatever the batch; BLAS batches round by batch size, tested)
                Minv_block = _inverse_factors(E, Et, D_block)
    for m in range(params.x_iters):
        # 1. penalties of this iteration, and rho_i as the agent obtains it
        if G_rows is not None:
            g = G_rows[m]
        else:
            active_edges = None if active is None else active.reshape(-1)[topo.src]
            g = sampler.step(g, m, active_edges)
        if rho_block is not None:
            rho, d = rho_block[m], D_block[m]
        else:
            rho = exchange.penalty_sums(g, bcd_iter=bcd_iter, admm_iter=m + 1).to(dtype).view(T, N, 1, 1)
            d = _spectral_factors(lam, rho, mu)
        # 2. X_i = max(0, U_i + P_i) (eq. 8), the right-hand side of eq. 9,
        # 3. the U-update (eq. 9): rhs (Y Y^T + (mu + rho_i) I)^-1 = rhs E diag(d) E^T,
        # 4. P_i = P_i - (X_i - U_i) (eq. 10), and the sums of U_i (finiteness check)
        usum, Q_new = u_sums[m], None
        # steps 5-6 join the compiled code when the exchange has a padded form (and no agent
        # has stopped: a stopped agent's neighbours must see its old U)
        op = exchange.neighbour_operator(g, dtype) if fused is not None and active is None else None
        if fused is None:
            X_new, rhs = _x_pre(U, P, ZYt, Q, Q_prev, rho, mu, derived, ws, X, x_group)
            U_new = _u_update(rhs, E, Et, d, ws, U, None if Minv_block is None else Minv_block[m])
            if x_group and active is None:
                P_new = _x_post_grouped(P, X_new, U_new, ws, x_group, usum)
            else:
                P_new, usum = _step_post(P, X_new, U_new, ws, "P"), None
        elif not large:
            if op is None:
                X_new, U_new, P_new, s_new = fused.x_whole(U, P, ZYt, Q, Q_prev, rho, d, E, mu_c, derived=derived,
                                                           small=small_k)
            else:
                X_new, U_new, P_new, s_new, Q_new = fused.x_whole_nbr(U, P, ZYt, Q, Q_prev, rho, d, E, *op, mu_c,
                                                                      derived=derived, small=small_k)
            usum.copy_(s_new)
        elif carry:
            rhs, D_new = ws.take("rhs", U), ws.take("D_c", U, () if D_c is None else (D_c,))
            last = m == params.x_iters - 1
            X_new = ws.take("X", U, (X,)) if last else None  # the last iteration writes X
            if deferred is not None:  # the previous iteration's steps 5-6 join this pass
                Q_out = ws.take("S", U, (Q, Q_prev))
                args = (ZYt, Q, rho, *deferred, mu_c, derived, D_new, rhs, u_sums[m - 1], Q_out)
                fused.x_carry_nbr[last](U, D_c, *args, *(() if X_new is None else (X_new,)))
                Q_prev, Q, deferred = Q, Q_out, None
            else:
                args = (ZYt, Q, Q_prev, rho, mu_c, derived, D_new, rhs) + (() if D_c is None else (u_sums[m - 1],))
                _carry_pass(fused.x_carry, U, P, D_c, args, X_new)
            D_c, X_new, P_new = D_new, X if X_new is None else X_new, P  # P: after the loop
            U_new = _u_update(rhs, E, Et, d, ws, U)
            if op is not None and not last and DEFER_NEIGHBOUR_SUM and fused.x_carry_nbr is not None:
                deferred = op  # steps 5-6 in the next iteration's pass, which reads U anyway
        else:
            X_new, rhs = ws.take("X", U, (X,)), ws.take("rhs", U)
            fused.x_pre(U, P, ZYt, Q, Q_prev, rho, mu_c, derived, X_new, rhs)
            U_new = _u_update(rhs, E, Et, d, ws, U)
            P_new = ws.take("P", P, (P,))
            fused.x_post(P, X_new, U_new, P_new, usum)
        if fused is not None and large:
            if op is not None and deferred is None:
                Q_new = ws.take("S", U, (Q, Q_prev))
                fused.q_into(U_new.view(A, L * K), *op, Q.view(A, L * K), Q_new.view(A, L * K))
        U_prev = U
        X, U, P = _where(active, X_new, X), _where(active, U_new, U), _where(active, P_new, P)
        if usum is None or active is not None:
            torch.sum(U, dim=(-2, -1), out=u_sums[m])
        if deferred is not None:  # steps 5-6 run in the next iteration's pass
            continue
        # 5. secure exchange: S_i = sum_j rho_ij (U_j - U_i)   (eq. 11, lines 10-16)
        if Q_new is None:
            S_buf = ws.take("S", U, (Q, Q_prev)) if pass_out else None
            kw = {} if S_buf is None else {"out": S_buf.view(A, L * K)}
            out = exchange.exchange(U.reshape(A, L * K), g, bcd_iter=bcd_iter, admm_iter=m + 1, **kw)
            Q_new = out.S.view(T, N, L, K).to(dtype).add_(Q)
        # 6. Q_prev, Q = Q, Q + S
        Q_prev, Q = _where(active, Q, Q_prev), _where(active, Q_new, Q)
        if stop.after(m, U, U_prev):
            break
        active = stop.active
    if D_c is not None:  # the last iteration's eq. 10
        P = ws.take("P", P, (P,))
        fused.x_carry_last(U, D_c, P, u_sums[m])
    # first ADMM iteration (1-based) at which each agent's U stopped being finite, 0: never
    bad = ~torch.isfinite(u_sums[: m + 1])
    first_bad = torch.where(bad.any(0), bad.to(torch.int8).argmax(0) + 1, 0)
    state.X, state.U, state.P, state.Q, state.Q_prev, state.g = X, U, P, Q, Q_prev, g
    # the differences in the loop's scratch, free again; dummy agents add exact zeros
    sq = _residuals_sq(X, U, U_prev, ws.take("rhs", U, (X, U, U_prev))).sum(-1).sqrt()
    return {"iters": stop.counts, "primal": sq[0], "dual": mu * sq[1], "first_bad": first_bad}


def y_step(problem: Problem, state: SolverState, params: SolverParams, *, ws: Workspace | None = None):
    """Y-step: ``y_iters`` local ADMM iterations, no communication (eqs. 12-14, lines 19-23).

    Updates ``state`` in place; returns iteration counts and residuals like :func:`x_step`.
    Large problems with fixed iteration counts run in groups of agents
    (:data:`Y_TILE_BYTES`), each group through all its iterations while it is in the cache.
    """
    Z, topo = problem.Z, problem.topology
    T, N = Z.shape[:2]
    K, eta, tol = params.rank, params.eta, params.inner_tol
    frozen = state.frozen
    X, Y, V, R = state.X, state.Y, state.V, state.R
    eye = torch.eye(K, dtype=X.dtype, device=X.device)
    G_inv = _spd_inverse(bmm(X.mT, X) + eta * eye)  # fixed during the Y-step
    ws = ws if ws is not None else Workspace()
    XtZ = bmm(X.mT, Z, out=ws.take("XtZ", V))  # (T, N, K, M) like V; kept from the last Y-step
    stop = _StopRule(frozen, tol, params.y_iters, topo, (T, N), Z.device)
    fused = _fused(params.fuse)
    large = V.numel() * V.element_size() >= Workspace.MIN_BYTES
    # Eager: the elementwise updates touch the real columns only (the padding beyond the
    # widest agent's M_i stays zero in buffers that were zeroed once); the product of
    # eq. 13 keeps the full padded width, whose rounding does not depend on the batch.
    Mw = problem.width if fused is None else 0
    fixed = large and not stop.track  # fixed counts, no flags: agents independent
    loop = dict(eta=eta, Mw=Mw, fused=fused, n_iters=params.y_iters, small_k=K ** 3 < SMALL_BMM, large=large,
                carry=fused is not None and fixed)
    # CPU only (a GPU would run many small kernels instead of one), and only where the
    # state's flat views write through (contiguous tensors)
    group = _y_group(T * N, V, fixed and V.device.type == "cpu" and all(t.is_contiguous() for t in (Y, V, R)))
    if group:
        # each agent's iterations depend on its own tensors only
        A = T * N
        flat = _agent_rows(Y, V, R, XtZ, G_inv)  # Y, V, R contiguous: views that write through
        sq = torch.empty((2, A), dtype=V.dtype, device=V.device)
        tile_ws = ws.child("y_groups")
        for sl in _agent_slices(A, group):
            Yg, Vg, Rg, Xg, Gg = (t[sl] for t in flat)
            Yn, Vn, Rn, Vp = _y_loop(Yg, Vg, Rg, Xg, Gg, None, None, tile_ws, **loop)
            sq[:, sl] = _residuals_sq(Yn, Vn, Vp)
            # this group's slices of the state are read by this group only: overwrite them
            Yg.copy_(Yn), Vg.copy_(Vn), Rg.copy_(Rn)
        sq = sq.view(2, T, N)
    else:
        Y, V, R, V_prev = _y_loop(Y, V, R, XtZ, G_inv, stop, stop.active, ws, **loop)
        state.Y, state.V, state.R = Y, V, R
        sq = _residuals_sq(Y, V, V_prev)
    sq = sq.sum(-1).sqrt()
    return {"iters": stop.counts, "primal": sq[0], "dual": eta * sq[1]}


def _residuals_sq(X, U, U_prev, scratch=None):
    """Per agent, ``||X - U||^2`` and ``||U - U_prev||^2`` (an ADMM step's primal and dual
    residuals before the sum over agents; ``Y, V, V_prev`` for the Y-step), stacked: shape
    ``(2, ...)``. ``scratch`` (optional, of ``U``'s shape) receives the differences."""
    return torch.stack((torch.linalg.matrix_norm(torch.sub(X, U, out=scratch)).square(),
                        torch.linalg.matrix_norm(torch.sub(U, U_prev, out=scratch)).square()))


def _y_group(n_agents: int, V: torch.Tensor, allowed: bool) -> int:
    """Agents per group of a grouped Y-step (0: not grouped): :data:`Y_TILE_BYTES` over the
    six ``(K, M)`` tensors an iteration touches per agent (see :func:`_agent_group`)."""
    if not allowed:
        return 0
    return _agent_group(n_agents, 6 * V[0, 0].numel() * V.element_size(), Y_TILE_BYTES)


def _agent_group(n_agents: int, per_agent: int, tile_bytes: int) -> int:
    """Agents per group whose working tensors (``per_agent`` bytes each) take about
    ``tile_bytes`` (0: not grouped, also when one group would hold every agent), rounded
    down to a divisor of ``n_agents`` when one lies within a factor of two (one group
    shape, one compiled graph)."""
    if tile_bytes <= 0:
        return 0
    want = max(1, tile_bytes // per_agent)
    if want >= n_agents:
        return 0
    for g in range(want, max(1, want // 2) - 1, -1):
        if n_agents % g == 0:
            return g
    return want


def _y_loop(Y, V, R, XtZ, G_inv, stop, active, ws, *, eta, Mw, fused, n_iters, small_k, carry, large):
    """The Y-step's ADMM iterations on ``V, R (..., K, M)``; returns ``Y, V, R, V_prev``.

    ``stop`` (a :class:`_StopRule`, or None for fixed counts) ends the loop early.
    """
    V_prev, D_c = V, None  # carry, as in the X-step: D_c = Y - R_prev
    eta_c = torch.tensor(eta, dtype=V.dtype, device=V.device) if fused is not None else eta
    for k in range(n_iters):
        # eq. 12, the right-hand side of eq. 13 and eq. 13, eq. 14
        if fused is None:
            Y_new, _, V_new, R_new = _y_iteration(V, R, XtZ, G_inv, eta, Mw, ws, (Y, V, R))
        elif not large:
            Y_new, V_new, R_new = fused.y_whole(V, R, XtZ, G_inv, eta_c, small=small_k)
        elif carry:
            B, D_new = ws.take("B", V), ws.take("D_y", V, () if D_c is None else (D_c,))
            args = (XtZ, eta_c, D_new, B)
            Y_new = ws.take("Y", V, (Y,)) if k == n_iters - 1 else None  # the last iteration writes Y
            _carry_pass(fused.y_carry, V, R, D_c, args, Y_new)
            D_c, Y_new, R_new = D_new, Y if Y_new is None else Y_new, R  # R: after the loop
            V_new = bmm(G_inv, B, out=ws.take("V", V, (V,)))
        else:
            Y_new, B = ws.take("Y", V, (Y,)), ws.take("B", V)
            fused.y_pre(V, R, XtZ, eta_c, Y_new, B)
            V_new = bmm(G_inv, B, out=ws.take("V", V, (V,)))
            R_new = ws.take("R", R, (R,))
            fused.y_post(R, Y_new, V_new, R_new)
        V_prev = V
        Y, V, R = _where(active, Y_new, Y), _where(active, V_new, V), _where(active, R_new, R)
        if stop is not None:
            if stop.after(k, V, V_prev):
                break
            active = stop.active
    if D_c is not None:  # the last iteration's eq. 14
        R = ws.take("R", R, (R,))
        fused.y_carry_last(V, D_c, R)
    return Y, V, R, V_prev


def _nonfinite_agents(t: torch.Tensor) -> torch.Tensor:
    """``(T, N)`` bool: the agents whose block of ``t (T, N, ...)`` holds a NaN or an Inf.

    One reduction pass instead of ``isfinite``'s temporaries of ``t``'s size: a NaN or Inf
    entry makes its agent's sum non-finite, and only agents whose sums are not finite
    (which finite entries can also give, by overflow) are checked entry by entry. At
    N = 2000 with CBCL sizes, by hand: 15 ms against 0.26 s for ``U`` and ``Y`` alone; inside
    ``fit``, where the temporaries were fresh pages, ``time_metrics`` went from 1.0-1.2 s to
    0.42-0.47 s per BCD iteration.
    """
    bad = ~torch.isfinite(t.flatten(2).sum(-1))
    if bool(bad.any()):
        bad[bad.clone()] = ~torch.isfinite(t[bad]).flatten(1).all(-1)
    return bad


def _check_finite(problem, state, bcd_iter, per_agent_nmse, first_bad):
    """Raise :class:`NumericalError` naming the BCD/ADMM iteration and the agents hit."""
    n = problem.n_agents
    bad = ~torch.isfinite(per_agent_nmse)
    for name in ("U", "Y"):
        bad |= _nonfinite_agents(getattr(state, name)[:, :n])
    if bool(bad.any()):
        where = torch.nonzero(bad).tolist()
        agents = sorted({a for _, a in where})
        trials = sorted({t for t, _ in where})
        fb = first_bad[:, :n][bad]
        fb = fb[fb > 0]
        step = (f"X-step ADMM iteration {int(fb.min())}" if fb.numel() else "Y-step")
        raise NumericalError(
            f"NaN or Inf in the iterates at BCD iteration {bcd_iter}, {step}: agents {agents}"
            + (f" in trials {trials}" if problem.Z.shape[0] > 1 else "")
            + "; check the data scale, mu/eta and the penalty caps (checkpoints written so far are kept)"
        )


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: a checkpoint of the last completed BCD iteration was written.

    Attributes
    ----------
    checkpoint : str or None
        Path of the checkpoint written (None when the run had no checkpoint folder).
    bcd_done : int
    """

    def __init__(self, checkpoint, bcd_done):
        super().__init__(f"interrupted after BCD iteration {bcd_done}; checkpoint: {checkpoint}")
        self.checkpoint = checkpoint
        self.bcd_done = bcd_done


def _good_point(state: SolverState, sampler, history: dict, keep: bool = True, exchange=None) -> dict:
    """The last consistent state: a copy of its tensors (``keep``; the workspace reuses the
    state's buffers in later iterations), the RNG states, the history's length and the
    exchange's cumulative cost counters."""
    return {
        "tensors": {k: v.clone() for k, v in state.tensors().items()} if keep else {},
        "bcd_done": state.bcd_done,
        "sampler": sampler.state_dict(),
        "hist_len": {k: len(v) for k, v in history.items()},
        "exchange_costs": (getattr(exchange, "cost_state", dict)() if keep and exchange is not None else {}),
    }


def _snapshot(good: dict, history: dict, fp: str) -> dict:
    from .checkpoint import FORMAT_VERSION

    hist = {}
    for k, vals in history.items():
        vals = vals[: good["hist_len"].get(k, 0)]
        hist[k] = [v.detach().cpu().clone() if isinstance(v, torch.Tensor) else float(v) for v in vals]
    return {
        "format": FORMAT_VERSION,
        "bcd_done": int(good["bcd_done"]),
        "state": {k: v.detach().to("cpu").clone() for k, v in good["tensors"].items()},
        "sampler": good["sampler"],
        "history": hist,
        "exchange_costs": good.get("exchange_costs", {}),
        "fingerprint": fp,
    }


def restore_state(payload: dict, device) -> SolverState:
    """A :class:`SolverState` from a checkpoint payload, on ``device``."""
    t = {k: v.to(device) for k, v in payload["state"].items()}
    frozen = t.pop("frozen", None)
    return SolverState(**t, bcd_done=int(payload["bcd_done"]), frozen=frozen)


def make_sampler(problem: Problem, params: SolverParams) -> PenaltySampler:
    """The penalty sampler of a problem, seeded from its per-trial seeds."""
    T, N = problem.Z.shape[:2]
    device = problem.Z.device
    edges_per_trial = torch.bincount(
        torch.div(problem.topology.src, N, rounding_mode="floor").cpu(), minlength=T
    ).tolist()
    return PenaltySampler(
        problem.caps.reshape(-1).to(device=device, dtype=torch.float64),
        problem.topology.src.to(device), edges_per_trial, problem.seeds, params.penalty, params.x_iters,
    )


def run_bcd(problem: Problem, params: SolverParams, exchange: Exchange, *, state: SolverState | None = None,
            sampler: PenaltySampler | None = None, callback=None, history: dict | None = None,
            checkpointer=None, fingerprint: str = ""):
    """The outer BCD loop (Algorithm 1, lines 3-24) on a batch of problems.

    Parameters
    ----------
    problem : Problem
    params : SolverParams
    exchange : Exchange
        Already bound to ``problem.topology``.
    state, sampler : optional
        To resume: the state and penalty sampler of a previous run.
    callback : callable, optional
        Called as ``callback(info: IterationInfo)`` after every BCD iteration; returning
        ``True`` stops the run after that iteration.
    history : dict, optional
        Metric history to append to (when resuming).
    checkpointer : ppdnmf_torch.checkpoint.Checkpointer, optional
        Writes a checkpoint on its schedule, and on Ctrl-C (then :class:`RunInterrupted`
        is raised).
    fingerprint : str
        Stored in checkpoints to match them to this run.

    Returns
    -------
    state : SolverState
    history : dict of lists
        Per BCD iteration: Tensors ``(T,)`` for ``nmse``, ``consensus``, ``objective``,
        ``x_primal``, ``x_dual``, ``y_primal``, ``y_dual``; floats for ``time_x``,
        ``time_y``, ``time_metrics``; Tensors ``(T, N)`` for ``x_iters``, ``y_iters``.
    info : dict
        ``converged`` (bool; always False with ``tol == 0``), ``n_iter``.
    """
    Z = problem.Z
    device = Z.device
    T, N = Z.shape[:2]
    if state is None:
        state = init_state(problem, params.rank)
    if sampler is None:
        sampler = make_sampler(problem, params)
    history = history if history is not None else {}
    n_real = problem.n_agents
    z_norms = torch.linalg.matrix_norm(Z[:, :n_real])
    if not bool((z_norms > 0).all()):
        # the paper's NMSE divides by ||Z_i||: refuse before any work rather than fail on 0/0
        where = torch.nonzero(z_norms == 0).tolist()
        agents = sorted({a for _, a in where})
        trials = sorted({t for t, _ in where})
        raise DataError(
            f"Z: the blocks of agents {agents}" + (f" in trials {trials}" if T > 1 else "")
            + f" have Frobenius norm 0 in {Z.dtype} (all zeros, or entries too small to square); "
            "the NMSE (sum_i ||Z_i - X_i Y_i|| / ||Z_i||) is undefined for them: give every agent "
            "some nonzero data, or rescale it"
        )
    tol = params.tol
    bflags = state.frozen if state.frozen is not None else torch.zeros((T, N), dtype=torch.bool, device=device)
    converged = False
    t_start = time.perf_counter()

    def log(key, value):
        history.setdefault(key, []).append(value)

    ws = Workspace()
    keep = checkpointer is not None  # only a checkpoint needs a copy of the last good state
    good = _good_point(state, sampler, history, keep, exchange)
    try:
        for n in range(state.bcd_done, params.bcd_iters):
            bcd_iter = n + 1
            # the workspace overwrites state buffers: the stopping rule keeps its own copy
            X_before, Y_before = (state.X.clone(), state.Y.clone()) if tol > 0 else (None, None)
            _sync(device)
            t0 = time.perf_counter()
            xi = x_step(problem, state, params, exchange, sampler, bcd_iter=bcd_iter, ws=ws)
            _sync(device)
            t1 = time.perf_counter()
            yi = y_step(problem, state, params, ws=ws)
            _sync(device)
            t2 = time.perf_counter()
            Zr, Xr, Yr = Z[:, :n_real], state.X[:, :n_real], state.Y[:, :n_real]
            res = metrics.residual_norms(Zr, Xr, Yr, scratch=ws.take("metrics_XY", Zr))
            nm, per_agent, obj = metrics.from_residuals(res, z_norms)
            _check_finite(problem, state, bcd_iter, per_agent, xi["first_bad"])
            values = {
                "nmse": nm,
                "consensus": metrics.consensus_error(Xr, scratch=ws.take("rhs", Xr)),
                "objective": obj,
                "x_primal": xi["primal"],
                "x_dual": xi["dual"],
                "y_primal": yi["primal"],
                "y_dual": yi["dual"],
            }
            values = {k: v.detach().to("cpu", torch.float64) for k, v in values.items()}
            t3 = time.perf_counter()
            for k, v in values.items():
                log(k, v)
            log("x_iters", xi["iters"][:, :n_real].cpu())
            log("y_iters", yi["iters"][:, :n_real].cpu())
            log("time_x", t1 - t0)
            log("time_y", t2 - t1)
            log("time_metrics", t3 - t2)
            state.bcd_done = bcd_iter
            if tol > 0 and bcd_iter > 1:
                # both factors: X alone can sit still while Y moves. Not on the first BCD
                # iteration: there the "previous iterate" is the start, which X = max(0, U + P)
                # and Y = max(0, V + R) still equal after one ADMM iteration each
                raised = torch.maximum(_rel_change(state.X, X_before), _rel_change(state.Y, Y_before)) < tol
                bflags = _stop_flags(bflags, raised & ~bflags, problem.topology)
                state.frozen = bflags if bool(bflags.any()) else None
            # the exchange's cumulative costs after this BCD iteration (crypto_<counter>), in
            # the history so that a checkpoint carries them into a resumed run
            costs = exchange.costs()
            for k, v in costs.items():
                v = plain_number(v)
                if v is not None:
                    v = float(v)  # the history holds floats (checkpoints store them so)
                    vals = history.setdefault(f"crypto_{k}", [])
                    # a counter the checkpoint's segment did not log (an older checkpoint, or
                    # another exchange kind): NaN for its iterations, so rows stay aligned
                    vals.extend([float("nan")] * (len(history["nmse"]) - 1 - len(vals)))
                    vals.append(v)
            good = _good_point(state, sampler, history, keep, exchange)
            if checkpointer is not None and checkpointer.due(bcd_iter):
                checkpointer.write(_snapshot(good, history, fingerprint))
            stop = False
            if callback is not None:
                stop = bool(callback(IterationInfo(bcd_iter, params.bcd_iters, values, state,
                                                   time.perf_counter() - t_start, costs=costs)))
            if tol > 0 and bool(bflags.all()):
                converged = True
                break
            if stop:
                break
    except KeyboardInterrupt:
        path = None
        if checkpointer is not None:
            path = checkpointer.write(_snapshot(good, history, fingerprint))
        raise RunInterrupted(path, good["bcd_done"]) from None
    if tol > 0 and not converged and state.bcd_done >= params.bcd_iters:
        warnings.warn(
            f"PPDNMF did not converge to tol={tol:g} within bcd_iters={params.bcd_iters}; "
            "the factors of the last iteration are returned",
            ConvergenceWarning,
            stacklevel=3,
        )
    return state, history, {"converged": converged, "n_iter": state.bcd_done, "sampler": sampler}
