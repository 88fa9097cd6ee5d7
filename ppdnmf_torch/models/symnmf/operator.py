"""The similarity matrix ``X`` as the solvers see it: dense, dense per trial, or sparse CSR.

Every solver touches ``X`` only through :meth:`Similarity.matmul` (``X @ W`` for a stack of
factors ``W (T, n, r)``) and its squared Frobenius norm, so a sparse ``X`` costs
``O(nnz + T n r)`` memory and never becomes dense. ``X`` is symmetric, so ``X^T W = X W``
serves the ``V``-updates too.
"""
from __future__ import annotations

import hashlib
import numbers

import numpy as np
import torch

from ..._utils import resolve_device, resolve_dtype, sparse_csr, sparse_matmul
from ...errors import DataError

__all__ = ["Similarity", "as_similarity"]

#: relative asymmetry ``||X - X^T||_F / ||X||_F`` above which ``X`` is refused
SYMMETRY_TOL = 1e-6


class Similarity:
    """A symmetric nonnegative ``X``, dense ``(n, n)``, dense per trial ``(T, n, n)`` or sparse
    CSR ``(n, n)``.

    Attributes
    ----------
    data : torch.Tensor
        The matrix (a ``torch.sparse_csr`` tensor when :attr:`sparse`).
    n : int
    batched : bool
        One ``X`` per trial (``data`` is ``(T, n, n)``).
    sparse : bool
    sq_norm : torch.Tensor
        ``||X||_F^2``, ``(T,)`` when batched, else ``()``.
    """

    def __init__(self, data: torch.Tensor):
        self.data = data
        self.sparse = data.layout == torch.sparse_csr
        self.batched = (not self.sparse) and data.dim() == 3
        self.n = int(data.shape[-1])
        vals = data.values() if self.sparse else data
        self.sq_norm = (vals * vals).sum(dim=(-2, -1)) if self.batched else (vals * vals).sum()

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def trials(self) -> int | None:
        """``T`` when ``X`` is batched, else None (one ``X`` for every trial)."""
        return int(self.data.shape[0]) if self.batched else None

    def matmul(self, W: torch.Tensor) -> torch.Tensor:
        """``X @ W`` for ``W (T, n, r)``, shape ``(T, n, r)``.

        With one ``X`` for every trial, the trials stand side by side, ``(T r, n)``: one GEMM
        (or one sparse pass) serves them all, and ``X`` is never expanded per trial.
        """
        # dense: (X W)^T = W^T X (X symmetric), the faster GEMM shape for a skinny W
        if self.batched:
            return torch.bmm(W.transpose(-2, -1), self.data).transpose(-2, -1)
        T, n, r = W.shape
        if not self.sparse:
            return (W.transpose(-2, -1).reshape(T * r, n) @ self.data).reshape(T, r, n).transpose(-2, -1)
        flat = W.permute(1, 0, 2).reshape(n, T * r)
        return sparse_matmul(self.data, flat).reshape(n, T, r).permute(1, 0, 2)

    def sq_norm_per_trial(self, T: int) -> torch.Tensor:
        """``||X||_F^2`` for each of ``T`` trials, ``(T,)``."""
        return self.sq_norm if self.batched else self.sq_norm.expand(T)

    def max_per_trial(self, T: int) -> torch.Tensor:
        """``max_ij X_ij`` for each of ``T`` trials, ``(T,)``."""
        if self.sparse:
            vals = self.data.values()
            m = vals.max() if vals.numel() else torch.zeros((), dtype=self.dtype, device=self.device)
            return m.expand(T)
        return self.data.amax(dim=(-2, -1)) if self.batched else self.data.max().expand(T)

    def spectrum_ends(self, T: int, power_iters: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
        """``(||X||_2, sigma_n(X))`` per trial, each ``(T,)``.

        Dense: from the eigenvalues (``X`` symmetric: the singular values are their moduli).
        Sparse: ``||X||_2`` by power iteration and ``sigma_n`` taken as 0, which only raises
        the bound it enters (the bound stays sufficient).
        """
        if not self.sparse:
            ev = torch.linalg.eigvalsh(self.data).abs()
            hi, lo = ev.amax(dim=-1), ev.amin(dim=-1)
            return (hi, lo) if self.batched else (hi.expand(T), lo.expand(T))
        gen = torch.Generator(device="cpu").manual_seed(0)
        w = torch.rand((1, self.n, 1), generator=gen, dtype=torch.float64).to(self.device, self.dtype) + 0.5
        est = torch.zeros((), dtype=self.dtype, device=self.device)
        for _ in range(power_iters):
            y = self.matmul(w)
            est = torch.linalg.vector_norm(y) / torch.linalg.vector_norm(w).clamp_min(torch.finfo(self.dtype).tiny)
            w = y / torch.linalg.vector_norm(y).clamp_min(torch.finfo(self.dtype).tiny)
        return est.expand(T), torch.zeros(T, dtype=self.dtype, device=self.device)

    def digest(self) -> str:
        """SHA-256 of the matrix's content (layout, shape, dtype and values): the checkpoint
        fingerprint's part for ``X``."""
        h = hashlib.sha256(f"{self.sparse}{tuple(self.data.shape)}{self.dtype};".encode())
        parts = ((self.data.crow_indices(), self.data.col_indices(), self.data.values()) if self.sparse
                 else (self.data,))
        for t in parts:
            t = t.detach().to("cpu").contiguous()
            if t.numel():
                h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
        return h.hexdigest()


def _is_scipy_sparse(X) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency
        return False
    return sp.issparse(X)


def as_similarity(X, *, device="auto", dtype=None) -> Similarity:
    """Validate ``X`` once and put it on ``device`` in ``dtype``.

    Parameters
    ----------
    X : array_like, torch.Tensor, scipy.sparse matrix or torch sparse tensor
        ``(n, n)`` symmetric nonnegative similarity, or ``(T, n, n)`` dense, one per trial.
    device : {"auto", "cpu", "cuda"} or torch.device
        ``"auto"`` follows a torch ``X``'s device, else CUDA when there is one.
    dtype : torch.dtype or str, optional
        Default: ``X``'s floating dtype, float64 for anything else.

    Raises
    ------
    DataError
        Not square, not symmetric, negative, not finite, or all zero.
    """
    if isinstance(X, Similarity):
        return X
    if device == "auto" and isinstance(X, torch.Tensor):
        dev = X.device
    else:
        dev = resolve_device(device)
    if _is_scipy_sparse(X):
        Xc = X.tocsr()
        Xc.sum_duplicates()
        Xc.sort_indices()
        if Xc.ndim != 2 or Xc.shape[0] != Xc.shape[1]:
            raise DataError(f"X: a similarity matrix must be square, got shape {Xc.shape}")
        src = Xc.dtype
        dt = resolve_dtype(dtype) if dtype is not None else (
            torch.float32 if src == np.float32 else torch.float64)
        crow = torch.from_numpy(Xc.indptr.astype(np.int64))
        col = torch.from_numpy(Xc.indices.astype(np.int64))
        vals = torch.from_numpy(np.asarray(Xc.data, dtype=np.float64)).to(dt)
        asym = abs(Xc - Xc.T)
        asym_norm = float(np.sqrt((asym.multiply(asym)).sum())) if asym.nnz else 0.0
        data = sparse_csr(crow.to(dev), col.to(dev), vals.to(dev), Xc.shape[0])
        return _checked(Similarity(data), asym_norm)
    if isinstance(X, torch.Tensor) and X.layout in (torch.sparse_csr, torch.sparse_coo):
        if X.dim() != 2 or X.shape[0] != X.shape[1]:
            raise DataError(f"X: a sparse similarity matrix must be square (n, n), got shape {tuple(X.shape)}")
        csr = X.to_sparse_csr() if X.layout == torch.sparse_coo else X
        dt = resolve_dtype(dtype) if dtype is not None else (
            csr.dtype if csr.dtype in (torch.float32, torch.float64) else torch.float64)
        crow, col = csr.crow_indices().to(dev, torch.int64), csr.col_indices().to(dev, torch.int64)
        data = sparse_csr(crow, col, csr.values().to(dev, dt), int(X.shape[0]))
        coo = X.to_sparse_coo().coalesce() if X.layout == torch.sparse_csr else X.coalesce()
        diff = (coo - coo.t()).coalesce().values()
        asym_norm = float(torch.linalg.vector_norm(diff.double())) if diff.numel() else 0.0
        return _checked(Similarity(data), asym_norm)
    if isinstance(X, torch.Tensor):
        t = X.detach()
        dt = resolve_dtype(dtype) if dtype is not None else (
            t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float64)
        t = t.to(dev, dt)
    else:
        if isinstance(X, numbers.Number):
            raise DataError("X: expected a square matrix, got a number")
        arr = np.asarray(X)
        if arr.dtype == object or not np.issubdtype(arr.dtype, np.number):
            raise DataError(f"X: expected a numeric matrix, got dtype {arr.dtype}")
        dt = resolve_dtype(dtype) if dtype is not None else (
            torch.float32 if arr.dtype == np.float32 else torch.float64)
        t = torch.as_tensor(np.ascontiguousarray(arr), dtype=dt, device=dev)
    if t.dim() not in (2, 3) or t.shape[-1] != t.shape[-2]:
        raise DataError(f"X: a similarity matrix must be (n, n) or (T, n, n), got shape {tuple(t.shape)}")
    return _checked(Similarity(t.contiguous()), _asymmetry(t.contiguous()))


#: rows per block of the symmetry check
_SYM_BLOCK = 256


def _asymmetry(t: torch.Tensor) -> float:
    """``max over trials of ||X - X^T||_F`` for a dense ``(n, n)`` or ``(T, n, n)``, in blocks of
    rows (a whole ``X - X^T`` would read ``X^T`` with a stride of ``n`` and allocate ``n^2``)."""
    X = t if t.dim() == 3 else t.unsqueeze(0)
    n = X.shape[-1]
    total = torch.zeros(X.shape[0], dtype=torch.float64, device=X.device)
    for i in range(0, n, _SYM_BLOCK):  # blocks of rows, a bounded temporary each
        d = X[:, i:i + _SYM_BLOCK, :] - X[:, :, i:i + _SYM_BLOCK].transpose(-2, -1)
        total += (d * d).sum(dim=(-2, -1)).double()
    return float(total.max().sqrt()) if n else 0.0


def _checked(sim: Similarity, asym_norm: float) -> Similarity:
    vals = sim.data.values() if sim.sparse else sim.data
    if sim.n == 0:
        raise DataError("X: the similarity matrix is empty")
    # ||X||_F^2 is finite exactly when every entry is (short of overflow): one pass less
    if not bool(torch.isfinite(sim.sq_norm).all()):
        raise DataError("X: holds NaN or infinite entries (or entries too large to square)")
    lowest = float(vals.min()) if vals.numel() else 0.0
    if lowest < 0:
        raise DataError(f"X: must be nonnegative (smallest entry {lowest:.3g})")
    norms = sim.sq_norm.sqrt()
    if bool((norms == 0).any()):
        raise DataError("X: is all zero (no similarity to factor)")
    if asym_norm > SYMMETRY_TOL * float(norms.max()):
        raise DataError(f"X: must be symmetric (||X - X^T||_F / ||X||_F = {asym_norm / float(norms.max()):.3g}); "
                        "symmetrize it first, e.g. (X + X^T) / 2")
    return sim
