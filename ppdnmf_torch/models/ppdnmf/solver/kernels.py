"""Bit-stable batched linear algebra, reusable buffers and agent groups.

Everything here works on stacked tensors, trial dimension first, agent dimension second
(``(T, N, ...)``), and is written so that a trial gives the same bits alone or inside
any batch: reductions over the padded column axis run in fixed chunks
(:func:`column_gram`), batched products always take the batched kernel (:func:`bmm`).
Large problems write their updates into buffers that live for the whole run
(:class:`Workspace`) and run their elementwise chains group by group of agents
(:func:`agent_group`). docs/PERFORMANCE.md records what each of these buys.
"""
from __future__ import annotations

import torch

from ..problem import COLUMN_CHUNK

__all__ = [
    "COLUMN_CHUNK",
    "MINV_BLOCK_BYTES",
    "SMALL_BMM",
    "DEFER_NEIGHBOUR_SUM",
    "NBR_PASS_NODE_LIMIT",
    "Y_TILE_BYTES",
    "X_TILE_BYTES",
    "column_gram",
    "bmm",
    "spd_inverse",
    "eigh_psd",
    "where_active",
    "rel_change",
    "sync",
    "residuals_sq",
    "Workspace",
    "agent_group",
    "agent_rows",
    "agent_slices",
]

#: Largest ``E diag(d) E^T`` block (bytes, all ADMM iterations of an X-step) that the eager
#: solver computes ahead in one product; above it, one product per iteration.
MINV_BLOCK_BYTES = 1 << 23
#: torch multiplies batched ``(K, K)`` matrices with ``K ** 3`` below this with its own
#: per-matrix kernel (bits independent of the batch); larger ones go to BLAS.
SMALL_BMM = 400
#: fuse=True, large problems, plain exchange: an iteration's neighbour sum (steps 5-6) runs
#: in the next iteration's elementwise pass, which reads U anyway
#: (:func:`~ppdnmf_torch.models.ppdnmf.solver.fused.fx_carry_nbr_into`); False keeps it a pass of its own
#: (the same bits, tested)
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


def column_gram(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None,
                scratch: torch.Tensor | None = None) -> torch.Tensor:
    """``A @ B^T`` reduced over the column axis in fixed chunks of :data:`COLUMN_CHUNK`.

    ``A (..., p, M)``, ``B (..., q, M)`` -> ``(..., p, q)``, ``M`` a multiple of the chunk.
    A BLAS reduction's rounding depends on its length, so a plain ``A @ B^T`` over a
    padded axis would round differently for different ``M_max``. Chunks of a fixed
    width, added in order, make the result independent of how much zero padding
    follows: a trial gives the same bits alone or inside any batch. This matters more
    than usual here, because Algorithm 1's all-ones start is a symmetric saddle that
    amplifies rounding differences.

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


def spd_inverse(A: torch.Tensor) -> torch.Tensor:
    """Inverse of a batch of symmetric positive definite ``(..., K, K)`` matrices, via Cholesky.

    The per-agent systems of eq. 13 have ``M_i`` right-hand sides; one batched ``bmm`` with
    the Cholesky-based inverse beats batched triangular solves for the small ``K`` of NMF,
    and the matrices are well conditioned (shifted by ``eta``). ``cholesky_ex`` does not
    synchronize with the device; non-finite input shows up as NaN in the result and is
    caught by the solver's finiteness check.
    """
    L = torch.linalg.cholesky_ex(A).L
    try:
        return torch.cholesky_inverse(L)
    except RuntimeError:  # torch.linalg.LinAlgError: a factorization failed on non-finite input
        # NaN carries the failure to the solver's finiteness check, which names the agents
        return torch.full_like(A, float("nan"))


def eigh_psd(A: torch.Tensor):
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


def where_active(mask, new, old):
    """``new`` on active agents, ``old`` elsewhere; ``mask (T, N)`` or None (all active)."""
    if mask is None:
        return new
    return torch.where(mask.view(mask.shape + (1,) * (new.dim() - mask.dim())), new, old)


def rel_change(new, old):
    """``||new - old||_F / ||old||_F`` per agent, ``(T, N)`` (the stopping rule's measure)."""
    num = torch.linalg.matrix_norm(new - old)
    den = torch.linalg.matrix_norm(old).clamp_min(torch.finfo(old.dtype).tiny)
    return num / den


def sync(device):
    """Wait for the device (step timings)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def residuals_sq(X, U, U_prev, scratch=None):
    """Per agent, ``||X - U||^2`` and ``||U - U_prev||^2`` (an ADMM step's primal and dual
    residuals before the sum over agents; ``Y, V, V_prev`` for the Y-step), stacked: shape
    ``(2, ...)``. ``scratch`` (optional, of ``U``'s shape) receives the differences."""
    return torch.stack((torch.linalg.matrix_norm(torch.sub(X, U, out=scratch)).square(),
                        torch.linalg.matrix_norm(torch.sub(U, U_prev, out=scratch)).square()))


class Workspace:
    """Reusable output buffers of the ADMM updates, by name.

    A large fresh tensor is page-faulted in on every allocation (glibc serves big blocks
    with ``mmap`` and returns them on free), which on a CPU costs more than the
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


def is_large(t: torch.Tensor) -> bool:
    """Whether ``t`` is large enough for the workspace's buffers (and the buffered plans)."""
    return t.numel() * t.element_size() >= Workspace.MIN_BYTES


def agent_group(n_agents: int, per_agent: int, tile_bytes: int) -> int:
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


def agent_rows(*tensors):
    """``(T, N, ...)`` tensors as ``(A, ...)``: trials and agents in one dimension (views of
    contiguous tensors, such as the workspace's buffers that the grouped chains write)."""
    return [t.reshape(-1, *t.shape[2:]) for t in tensors]


def agent_slices(n_agents: int, group: int):
    """Consecutive groups of ``group`` agents (the last may be shorter), as slices."""
    return [slice(a, min(a + group, n_agents)) for a in range(0, n_agents, group)]
