"""The fused SymHALS column update (issue 41) against the update it replaced: eq. (17) as
``z_i + (a_i - Z b_i) / B_ii`` column after column. The two are the same number in exact
arithmetic (``z_i``'s own term cancels) and differ by rounding, so the iterates agree to a
tolerance (1e-10 relative in float64: a few hundred roundings of ``1e-16``, with room), and a
run with a stopping tolerance stops at the same iteration."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

from ppdnmf_torch.models.symnmf import fit_symnmf, initial_factor, synthetic_similarity
from ppdnmf_torch.models.symnmf import symhals
from ppdnmf_torch.models.symnmf.alternating import block_data
from ppdnmf_torch.models.symnmf.symhals import ZERO_COLUMN_RESET, hals_block, hals_sweep


class _OldRows:
    """The sweep as it was before (commit 477b2ec): three calls per column on the unscaled data."""

    def __init__(self, Zt, At, B, diag=None):
        self.Zt = Zt
        d = torch.diagonal(B, dim1=-2, dim2=-1).unsqueeze(-1)
        self.cols = list(zip(*(t.split(1, dim=1) for t in (Zt, At, B, d))))
        self.step = torch.empty_like(self.cols[0][0])

    def sweep(self):
        Zt, step = self.Zt, self.step
        reset = Zt.amax(dim=(-2, -1), keepdim=True).mul_(ZERO_COLUMN_RESET)
        for row, a, b, d in self.cols:
            torch.baddbmm(a, b, Zt, alpha=-1, out=step)
            row.addcdiv_(step, d).clamp_(min=0)
        Zt.copy_(torch.where(Zt.amax(dim=-1, keepdim=True) > 0, Zt, reset))


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("T,n,r", [(1, 30, 3), (3, 50, 6), (2, 80, 12)])
@pytest.mark.parametrize("lam", [1e-5, 0.5, 20.0])
def test_fused_sweep_equals_the_unfused_one_to_rounding(T, n, r, lam, monkeypatch):
    gen = torch.Generator().manual_seed(n + r)
    X, _ = synthetic_similarity(n, r, 0.1, seed=n)
    U = torch.rand((T, n, r), generator=gen, dtype=torch.float64)
    V = torch.rand((T, n, r), generator=gen, dtype=torch.float64)
    A, B = block_data(X[0] @ V, V, torch.full((T,), lam, dtype=torch.float64))
    A[..., 0] -= 2 * A[..., 0].mean()  # some entries clamp at zero
    new = hals_sweep(U, A, B)
    new5 = hals_block(U, A, B, inner_max=5, delta=0.0)
    monkeypatch.setattr(symhals, "_Rows", _OldRows)
    old = hals_sweep(U, A, B)
    old5 = hals_block(U, A, B, inner_max=5, delta=0.0)
    assert _rel(new, old) <= 1e-10 and _rel(new5, old5) <= 1e-10
    assert torch.equal(new == 0, old == 0)  # the same entries clamped


@pytest.mark.parametrize("method", ["symhals", "a_symhals"])
@pytest.mark.parametrize("penalty", [5.0, "adaptive"])
def test_fused_fit_equals_the_unfused_one_and_stops_at_the_same_iteration(method, penalty, monkeypatch):
    X, _ = synthetic_similarity(60, 4, 0.05, seed=11)
    U0 = initial_factor(60, 4, trials=3, seed=12)
    kw = dict(method=method, U0=U0, penalty=penalty, max_iter=300, tol=1e-3)
    new = fit_symnmf(X[0], 4, **kw)
    monkeypatch.setattr(symhals, "_Rows", _OldRows)
    old = fit_symnmf(X[0], 4, **kw)
    assert torch.equal(new.n_iter, old.n_iter) and bool(new.converged.all())
    assert _rel(new.U, old.U) <= 1e-10 and _rel(new.V, old.V) <= 1e-10
    torch.testing.assert_close(new.history["E"], old.history["E"], rtol=1e-10, atol=1e-14)



@pytest.mark.parametrize("r,m", [(4, 50), (20, 200)])  # the per-column path, and the per-set one
def test_nnls_residual_by_one_product_per_block_batched_equals_alone(r, m):
    """``y = G x - c`` is one product per block: ``x G^T`` with one trial, a ``(T, m, r)`` block
    with several; both give the NNLS solution (scipy's, to 1e-9), and a trial batched with others
    is the same as alone to rounding."""
    from ppdnmf_torch.models.symnmf.nnls import nnls_bpp

    gen = torch.Generator().manual_seed(r * m)
    A = torch.randn((3, r + 6, r), generator=gen, dtype=torch.float64)
    B = torch.randn((3, r + 6, m), generator=gen, dtype=torch.float64)
    G, C = A.transpose(1, 2) @ A, A.transpose(1, 2) @ B
    init = torch.rand((3, r, m), generator=gen, dtype=torch.float64) - 0.5
    batched = nnls_bpp(G, C, init=init)
    for t in range(3):
        alone = nnls_bpp(G[t:t + 1], C[t:t + 1], init=init[t:t + 1])
        torch.testing.assert_close(batched[t], alone[0], rtol=1e-12, atol=1e-12 * float(alone.abs().max()))
    want = np.stack([scipy.optimize.nnls(A[0].numpy(), B[0, :, j].numpy())[0] for j in range(m)], 1)
    np.testing.assert_allclose(batched[0].numpy(), want, rtol=1e-9, atol=1e-12)


def test_nnls_in_small_cpu_chunks_equals_one_large_chunk(monkeypatch):
    """On the CPU the masked systems are solved in chunks of ``CHUNK_ENTRIES_CPU`` entries; a
    chunk decides alone whether its columns share factors (by set), which rounds differently
    from one large chunk, so equal to it to rounding (1e-12 relative), not bit for bit."""
    from ppdnmf_torch.models.symnmf import nnls as nnls_mod

    gen = torch.Generator().manual_seed(9)
    r, m = 20, 1500  # 6e5 entries: two chunks of 2^19, one of 2^22
    A = torch.rand((1, 60, r), generator=gen, dtype=torch.float64)
    B = torch.randn((1, 60, m), generator=gen, dtype=torch.float64) + 0.5
    G, C = A.transpose(1, 2) @ A + 0.1 * torch.eye(r, dtype=torch.float64), A.transpose(1, 2) @ B
    init = torch.rand((1, r, m), generator=gen, dtype=torch.float64) - 0.5
    small = nnls_mod.nnls_bpp(G, C, init=init)
    monkeypatch.setattr(nnls_mod, "CHUNK_ENTRIES_CPU", 1 << 22)
    large = nnls_mod.nnls_bpp(G, C, init=init)
    torch.testing.assert_close(small, large, rtol=1e-12, atol=1e-12 * float(large.abs().max()))
    assert bool((small > 0).any() and (small == 0).any())


def test_one_trial_bench_reports_the_gemm_floor_and_its_bound():
    """``bench_symnmf.py --part one-trial`` (issue 41): beside both plans and NumPy, the GEMM floor
    (the iteration's two products alone) and NumPy's time over it, the bound on any ratio; every
    side's iterates equal NumPy's to rounding."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bench_symnmf.py"
    spec = importlib.util.spec_from_file_location("bench_symnmf", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.part_one_trial(True, methods=("symhals",))
    (row,) = rows
    floor = row["gemm_floor_s_per_iter"]
    assert 0 < floor and row["bound_numpy_over_floor_min"] == row["numpy_loop_s_per_iter"] / floor
    for plan in ("torch", "host"):
        assert row[f"{plan}_rest_s_per_iter"] == row[f"{plan}_loop_s_per_iter"] - floor
        assert row[f"max_abs_diff_U_{plan}"] < 1e-9
