"""The host plan of ``fit_symnmf`` (issue 41) against the torch plan.

The two run the same updates in the same order; they differ in the BLAS (NumPy's against
torch's) and in the order of some sums (a block's data, the history's inner products), so their
iterates agree to rounding, not bit for bit: ``1e-9`` relative in float64 (a few hundred
iterations of ``1e-16`` roundings, measured ``< 1e-13`` on these problems), with the same
stopping iteration and the same clamped entries. The torch plan's bits are the fingerprints'
(``scripts/fingerprint_symnmf.py``, which runs it by name)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import scipy.optimize
import scipy.sparse as sp
import torch

from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.models.symnmf import fit_symnmf, initial_factor, synthetic_similarity
from ppdnmf_torch.models.symnmf import host
from ppdnmf_torch.models.symnmf.fit import make_method
from ppdnmf_torch.models.symnmf.nnls import nnls_bpp
from ppdnmf_torch.models.symnmf.nnls_numpy import nnls_bpp_numpy
from ppdnmf_torch.models.symnmf.operator import as_similarity

RTOL = 1e-9


def _close(a, b, rtol=RTOL):
    torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * float(b.abs().max()))


def _problem(n=60, r=4, seed=11):
    X, _ = synthetic_similarity(n, r, 0.05, seed=seed)
    return X[0], initial_factor(n, r, trials=3, seed=seed + 1)


@pytest.mark.parametrize("trials", [1, 3])
@pytest.mark.parametrize("penalty", [5.0, "adaptive"])
@pytest.mark.parametrize("method", ["symhals", "a_symhals", "symanls"])
def test_host_plan_equals_the_torch_plan_and_stops_at_the_same_iteration(method, penalty, trials):
    X, U0 = _problem()
    kw = dict(method=method, U0=U0[:trials], penalty=penalty, max_iter=300, tol=1e-3)
    ref = fit_symnmf(X, 4, plan="torch", **kw)
    out = fit_symnmf(X, 4, plan="host", **kw)
    assert (ref.plan, out.plan) == ("torch", "host")
    assert torch.equal(out.n_iter, ref.n_iter) and torch.equal(out.converged, ref.converged)
    assert bool(out.converged.all())
    _close(out.U, ref.U)
    _close(out.V, ref.V)
    _close(out.lam, ref.lam)
    assert torch.equal(out.U == 0, ref.U == 0)  # the same entries clamped
    for key in ("E", "objective", "gap", "rel_gap", "lam"):
        _close(out.history[key], ref.history[key])
    assert out.U.shape == ref.U.shape and out.U.dtype == ref.U.dtype and out.U.device == ref.U.device


@pytest.mark.parametrize("case", ["kuang", "float32", "sparse", "batched_X"])
def test_host_plan_equals_the_torch_plan_other_inputs(case):
    X, U0 = _problem(n=40, r=3, seed=5)
    kw = dict(method="symhals", U0=U0, max_iter=30, tol=0)
    rtol = RTOL
    if case == "kuang":
        kw["method"] = "kuang"
    elif case == "float32":  # float32 roundings: eps 1.2e-7
        X, kw["U0"], kw["dtype"], rtol = X.float(), U0.float(), torch.float32, 1e-4
    elif case == "sparse":
        X = sp.csr_matrix(torch.where(X > 0.6 * X.mean(), X, torch.zeros_like(X)).numpy())
    else:  # one X per trial
        X = torch.stack([X, 2 * X, X.sqrt()])
    ref = fit_symnmf(X, 3, plan="torch", **kw)
    out = fit_symnmf(X, 3, plan="host", **kw)
    _close(out.U, ref.U, rtol)
    _close(out.history["E"], ref.history["E"], rtol)
    assert out.U.dtype == ref.U.dtype


def test_the_plan_is_chosen_once_per_fit():
    """``choose_plan`` decides before the run; the methods' steps take no plan."""
    X, U0 = _problem(n=30, r=3)
    dense, sparse = as_similarity(X), as_similarity(sp.csr_matrix(X.numpy()))
    for method in host.HOST_METHODS:
        assert host.choose_plan("auto", dense, method) == "host"
        assert host.choose_plan("auto", sparse, method) == "host"
        assert host.choose_plan("torch", dense, method) == "torch"
    assert host.choose_plan("auto", dense, "pgd") == "torch"
    for method in ("symhals", "a_symhals", "symanls", "pgd"):
        assert "plan" not in inspect.signature(make_method(method).step).parameters
    assert fit_symnmf(X, 3, U0=U0, max_iter=2, tol=0).plan == "host"  # the default: "auto"
    assert fit_symnmf(X, 3, method="pgd", U0=U0, max_iter=2, tol=0).plan == "torch"
    with pytest.raises(ConfigError) as err:
        fit_symnmf(X, 3, method="pgd", max_iter=2, plan="host")
    assert err.value.key == "plan"
    with pytest.raises(ConfigError) as err:
        fit_symnmf(X, 3, max_iter=2, plan="numpy")
    assert err.value.key == "plan"


@pytest.mark.filterwarnings("ignore::ppdnmf_torch.errors.ConvergenceWarning")
@pytest.mark.parametrize("method", ["symhals", "symanls"])
def test_host_plan_resume_is_bit_for_bit_and_crosses_plans(tmp_path, method):
    X, _ = _problem(n=18, r=3)
    X = torch.stack([X, X])
    kw = dict(method=method, max_iter=12, tol=1e-9, seed=3)
    full = fit_symnmf(X, 3, plan="host", **kw)
    for folder in ("a", "b"):
        fit_symnmf(X, 3, plan="host", **{**kw, "max_iter": 5}, checkpoint_dir=tmp_path / folder, checkpoint_every=2)
    resumed = fit_symnmf(X, 3, plan="host", **kw, checkpoint_dir=tmp_path / "a", resume=True)
    for a, b in ((full.U, resumed.U), (full.V, resumed.V), (full.lam, resumed.lam), (full.n_iter, resumed.n_iter)):
        assert torch.equal(a, b)
    for key in ("E", "objective", "gap", "rel_gap", "lam"):
        assert torch.equal(full.history[key], resumed.history[key]), key
    # a checkpoint holds the same names, shapes and dtypes under both plans: the other plan continues it
    crossed = fit_symnmf(X, 3, plan="torch", **kw, checkpoint_dir=tmp_path / "b", resume=True)
    assert torch.equal(crossed.n_iter, full.n_iter)
    _close(crossed.U, full.U)


def test_host_plan_callback_sees_tensors_and_stops():
    X, U0 = _problem(n=30, r=3)
    seen = []

    def cb(info):
        seen.append((info.k, info.U.clone(), info.active))
        return info.k == 4

    res = fit_symnmf(X, 3, U0=U0, max_iter=50, tol=0, callback=cb, plan="host")
    assert [k for k, _, _ in seen] == [1, 2, 3, 4] and int(res.n_iter[0]) == 4
    k, U, active = seen[-1]
    assert isinstance(U, torch.Tensor) and U.shape == (3, 30, 3) and active.dtype == torch.bool
    assert torch.equal(U, res.U) and not torch.equal(seen[0][1], res.U)


@pytest.mark.parametrize("solve", ["masked", "subsets"])
@pytest.mark.parametrize("r,m,shared", [(4, 50, 0), (20, 200, 0), (20, 200, 120), (70, 40, 20)])
def test_numpy_nnls_equals_the_torch_nnls_and_scipy(r, m, shared, solve):
    """The host plan's NNLS, each column's masked system (``"masked"``) or the passive subsystems
    (``"subsets"``; ``shared`` columns start from one set, solved together; ``r = 70``: the sets
    keyed by bytes): the same pivoting as ``nnls_bpp``, the systems by LU instead of Cholesky:
    equal to rounding (1e-12 relative), to scipy's (1e-9), and the KKT conditions."""
    gen = torch.Generator().manual_seed(r * m + shared)
    A = torch.randn((3, r + 6, r), generator=gen, dtype=torch.float64)
    B = torch.randn((3, r + 6, m), generator=gen, dtype=torch.float64)
    G, C = A.transpose(1, 2) @ A, A.transpose(1, 2) @ B
    init = torch.rand((3, r, m), generator=gen, dtype=torch.float64) - 0.5
    init[:, :, :shared] = 1.0
    ref = nnls_bpp(G, C, init=init)
    out = torch.from_numpy(nnls_bpp_numpy(G.numpy(), C.numpy(), init.numpy(), solve=solve))
    _close(out, ref, 1e-12)
    assert torch.equal(out == 0, ref == 0)
    Y = G @ out - C  # KKT: x >= 0, y >= 0 where x = 0, y = 0 where x > 0 (to rounding)
    scale = float(C.abs().max())
    assert bool((out >= 0).all()) and float(Y[out == 0].min()) > -1e-12 * scale
    assert float(Y[out > 0].abs().max()) < 1e-10 * scale
    want = np.stack([scipy.optimize.nnls(A[0].numpy(), B[0, :, j].numpy())[0] for j in range(m)], 1)
    np.testing.assert_allclose(out[0].numpy(), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("trials", [1, 3])
@pytest.mark.parametrize("method, threshold", [("symanls", "NUMPY_NNLS_MAX_ENTRIES"), ("symhals", "NARROW_SWEEP_MIN"),
                                               ("a_symhals", "NARROW_SWEEP_MIN")])
def test_host_large_block_paths_equal_the_torch_plan(monkeypatch, method, threshold, trials):
    """The host plan's paths for large blocks, taken here at every size: above
    ``NUMPY_NNLS_MAX_ENTRIES`` SymANLS solves the passive subsystems (``solve="subsets"``), above
    ``NARROW_SWEEP_MIN`` a sweep takes a column's product over the block's own rows
    (:func:`~.host._sweep_narrow`): the torch plan's iterates to rounding, the same stop."""
    X, U0 = _problem()
    kw = dict(method=method, U0=U0[:trials], penalty="adaptive", max_iter=300, tol=1e-3)
    ref = fit_symnmf(X, 4, plan="torch", **kw)
    monkeypatch.setattr(host, threshold, 0)
    out = fit_symnmf(X, 4, plan="host", **kw)
    assert torch.equal(out.n_iter, ref.n_iter) and bool(out.converged.all())
    _close(out.U, ref.U)
    assert torch.equal(out.U == 0, ref.U == 0)


@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("inner_max", [1, 4])
def test_host_sweep_equals_the_torch_sweep_with_a_zero_column_reset(inner_max, T, narrow):
    """A column driven to zero is reset to ``1e-16 x`` the block's largest entry before the sweep
    on both plans (eq. (17)'s safety reset); the sweeps agree to rounding (1e-12). The host
    block's Gram matrix is the reset rows' (it checks for zero rows on its diagonal)."""
    from ppdnmf_torch.models.symnmf.alternating import block_data
    from ppdnmf_torch.models.symnmf.symhals import hals_block

    gen = torch.Generator().manual_seed(inner_max)
    n, r = 30, 4
    Z, W = (torch.rand((T, n, r), generator=gen, dtype=torch.float64) for _ in range(2))
    XW = torch.rand((T, n, r), generator=gen, dtype=torch.float64) * n
    XW[..., 1] = -100.0  # column 1's data pushes it to zero
    lam = torch.tensor([0.5, 3.0][:T], dtype=torch.float64)
    A, B = block_data(XW, W, lam)
    ref = hals_block(Z, A, B, inner_max=inner_max, delta=0.0)
    rows = lambda t: np.ascontiguousarray(t.transpose(-2, -1).numpy())  # noqa: E731
    gram = (W.transpose(-2, -1) @ W).numpy()
    out, out_gram = host.hals_block(rows(Z), rows(W), rows(XW), gram, host._Lambda(lam.numpy()), inner_max, 0.0,
                                    host._Coefficients(T, r, np.float64), np.zeros((T, 1, n)), narrow)
    assert np.array_equal(out_gram, host._gram(out))
    out = torch.from_numpy(out).transpose(-2, -1)
    _close(out, ref, 1e-12)
    assert bool((ref[..., 1] < 1e-10).all()) and bool((ref[..., 1] > 0).all())


def test_subset_nnls_in_small_chunks_equals_one_chunk(monkeypatch):
    """The subsets' batched solves in chunks that bound memory: each system is solved alone either
    way, so the same bits."""
    from ppdnmf_torch.models.symnmf import nnls_numpy

    rng = np.random.default_rng(7)
    A, B = rng.standard_normal((2, 26, 20)), rng.standard_normal((2, 26, 300))
    G, C = A.transpose(0, 2, 1) @ A, A.transpose(0, 2, 1) @ B
    init = rng.random((2, 20, 300)) - 0.5
    whole = nnls_bpp_numpy(G, C, init, solve="subsets")
    monkeypatch.setattr(nnls_numpy, "CHUNK_ENTRIES_CPU", 50)
    assert np.array_equal(nnls_bpp_numpy(G, C, init, solve="subsets"), whole)
