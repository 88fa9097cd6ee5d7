"""``exchange="plain"``: float arithmetic, no quantization, no encryption."""
from __future__ import annotations

import torch

from .._utils import sparse_csr, sparse_matmul
from .base import Exchange, ExchangeOutput, ell_gather_sum
from .spec import PlainSpec

__all__ = ["PlainExchange"]


class PlainExchange(Exchange):
    """Neighbour sums in floating point through one sparse matrix product.

    ``S = (W - diag(rho)) U`` with ``W[i, j] = rho_ij`` (eq. 11 with ``S_ij`` eliminated):
    the diagonal sits in the CSR structure, so that one sparse product (into the solver's
    buffer, when it passes one) computes ``S`` without a second pass over ``U``. Row ``i``
    adds its terms in column order, ``-rho_i U_i`` among the ``rho_ij U_j``.

    Bound with ``fuse=True`` (the solver's ``fuse``), a graph whose degrees are even
    enough (padded to the largest degree, at most four times the stored entries; at most
    :data:`ELL_MAX_SLOTS` per row) gets the same sums from a compiled gather kernel over
    a padded ("ELL") copy of the structure in one pass (faster than the sparse CSR product
    on a CPU; see docs/PERFORMANCE.md). It adds the same terms in the same order, padding
    adds exact zeros.
    """

    #: widest padded row (largest degree + 1) the compiled gather kernel takes
    ELL_MAX_SLOTS = 32
    #: smaller ``U`` (bytes) take the sparse product: the compiled call's fixed cost is larger
    ELL_MIN_BYTES = 1 << 20

    name = "plain"

    def __init__(self) -> None:
        super().__init__()
        self._cache = (None, None, None)
        self._block = None

    @property
    def spec(self) -> PlainSpec:
        return PlainSpec()

    def bind(self, topology, *, dtype, device, fuse=False):
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        topo = self.topology
        A, src, dst = topo.n_nodes, topo.src, topo.dst
        # CSR structure of W - diag(rho): the edges of row i, with (i, i) inserted in order
        below = torch.zeros(A, dtype=torch.int64, device=device)
        below.index_add_(0, src, (dst < src).to(torch.int64))
        counts = topo.degree.to(device) + 1
        crow = torch.zeros(A + 1, dtype=torch.int64, device=device)
        torch.cumsum(counts, 0, out=crow[1:])
        e_rank = torch.arange(src.numel(), device=device) - topo.crow.to(device)[src]
        self._edge_pos = crow[src] + e_rank + (dst > src).to(torch.int64)  # after the diagonal
        self._diag_pos = crow[:-1] + below
        col = torch.empty(src.numel() + A, dtype=torch.int64, device=device)
        col[self._edge_pos] = dst
        col[self._diag_pos] = torch.arange(A, device=device)
        self._crow, self._col = crow, col
        self._cache = (None, None, None)
        self._block = None
        self._ell = None
        slots = int(counts.max()) if A else 0
        if self.fuse and 0 < slots <= self.ELL_MAX_SLOTS and A * slots <= 4 * col.numel():
            # the padded ("ELL") form: row i's entries in slots 0 .. deg_i, in column order
            rows = torch.repeat_interleave(torch.arange(A, device=device), counts)
            slot = torch.arange(col.numel(), device=device) - crow[:-1][rows]
            nbr = torch.arange(A, device=device)[:, None].repeat(1, slots)  # padding: the row itself, weight 0
            nbr[rows, slot] = col
            self._ell = (nbr, rows * slots + slot, slots)

    def _values(self, w, rho):
        """CSR values of ``W - diag(rho)`` (last dimension ``2E + A``)."""
        vals = torch.empty(w.shape[:-1] + (self._col.numel(),), dtype=torch.float64, device=w.device)
        vals[..., self._edge_pos] = w
        vals[..., self._diag_pos] = -rho
        return vals

    def _block_row(self, g):
        """Which row of this X-step's penalty block ``g`` is (a view of it), or None."""
        blk = self._block
        if blk is None or g._base is not blk[0]:
            return None
        if blk[0].numel() == 0:  # no edges: every row is the same empty draw (and has no stride)
            return 0
        return (g.storage_offset() - blk[0].storage_offset()) // blk[0].stride(0)

    def _sums(self, w):
        """``rho_i = sum_j rho_ij`` over the last dimension of ``w (..., 2E)``, edges added in order."""
        rho = torch.zeros(w.shape[:-1] + (self.topology.n_nodes,), dtype=torch.float64, device=w.device)
        return rho.index_add_(w.dim() - 1, self.topology.src, w)

    def _weights(self, g):
        """``(CSR values, rho_i per node)`` of the penalties ``g``; step 5 reuses step 1's."""
        m = self._block_row(g)
        if m is not None:
            return self._block[1][m], self._block[2][m]
        if self._cache[0] is g:
            return self._cache[1], self._cache[2]
        w = self._pair_weights(g)
        rho = self._sums(w)
        self._cache = (g, self._values(w, rho), rho)
        return self._cache[1], rho

    def _runs_own_steps(self) -> bool:
        """False for a subclass that overrides step 1 or step 5 (a recorder, say): it gets
        every per-iteration call, and the batched shortcuts stay off."""
        cls = type(self)
        return cls.exchange is PlainExchange.exchange and cls.penalty_sums is PlainExchange.penalty_sums

    def penalty_block(self, G, *, bcd_iter=0):
        if not self._runs_own_steps():
            return None
        w = self._pair_weights(G)
        rho = self._sums(w)  # per row, the same additions in the same order as one row alone
        vals = self._values(w, rho)
        self._block = (G, vals, rho, None if self._ell is None else self._padded(vals, self.dtype))
        return rho

    def _padded(self, vals, dtype):
        """ELL weights ``(..., A, D)`` from CSR values ``(..., 2E + A)``; padding weighs 0."""
        nbr, flat, slots = self._ell
        n = self.topology.n_nodes
        wv = torch.zeros(vals.shape[:-1] + (n * slots,), dtype=dtype, device=vals.device)
        wv[..., flat] = vals.to(dtype)
        return wv.view(vals.shape[:-1] + (n, slots))

    def neighbour_operator(self, g, dtype):
        if self._ell is None or not self._runs_own_steps():
            return None
        m = self._block_row(g)
        if m is not None and self._block[3].dtype == dtype:
            return self._ell[0], self._block[3][m]
        return self._ell[0], self._padded(self._weights(g)[0], dtype)

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        return self._weights(g)[1]

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        vals, rho = self._weights(g)
        n = self.topology.n_nodes
        if self._ell is not None and U.numel() * U.element_size() >= self.ELL_MIN_BYTES:
            nbr, wv = self.neighbour_operator(g, U.dtype)
            S = out if out is not None else torch.empty_like(U)
            _ell_kernel()(U, nbr, wv, S)
            return ExchangeOutput(S, rho)
        W = sparse_csr(self._crow, self._col, vals.to(U.dtype), n)
        return ExchangeOutput(sparse_matmul(W, U, out), rho)


def _ell_sum(U, nbr, wv, out):
    out.copy_(ell_gather_sum(U, nbr, wv))


_ELL = None


def _ell_kernel():
    global _ELL
    if _ELL is None:
        _ELL = torch.compile(_ell_sum, dynamic=False)
    return _ELL
