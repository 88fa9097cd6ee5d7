"""FSSPCA's host plan (:mod:`ppdnmf_torch.models.fsspca.server_host`) against the torch plan.

The two plans run the same iteration with other kernels and reduction orders (NumPy's on the
host, torch's elsewhere), so they agree to rounding, not bit for bit: the tolerance ``1e-9``
relative (float64) is what differences of ~1e-16 per operation grow to over a few hundred ADMM
iterations with margin (measured: at most ~1e-13 on these problems); the stopping iteration and
the support are asserted equal.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.errors import ConfigError, ConvergenceWarning
from ppdnmf_torch.models.fsspca import fit_fsspca
from ppdnmf_torch.models.fsspca.data import spiked_covariance, split_iid
from ppdnmf_torch.models.fsspca.deflation import deflation_projector
from ppdnmf_torch.models.fsspca.polar import polar_rows_array
from ppdnmf_torch.models.fsspca.result import HISTORY_KEYS


def _blocks(K, n=240, d=12, dtype=np.float64):
    sp = spiked_covariance(n=n, d=d, r=2, support=4, seed=2)
    g = split_iid(n, K, seed=0)
    return [np.ascontiguousarray(sp.X[g == k]).astype(dtype) for k in range(K)]


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _support(z):
    return [tuple(np.flatnonzero(z[:, j])) for j in range(z.shape[1])]


def _both(blocks, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit_fsspca(blocks, 2, plan="torch", **kw), fit_fsspca(blocks, 2, plan="host", **kw)


CASES = {
    "one_worker": dict(K=1),
    "workers_unsmoothed": dict(K=4, lambda_2=0.0),
    "trials_rho_worker": dict(K=4, trials=3, alpha=[0.0, 40.0, 120.0], rho="worker"),
    "no_centre_huber": dict(K=3, center=False, smoothing="huber"),
    "logexp_quantized": dict(K=3, smoothing="logexp", aggregation="quantized", max_iter=60),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_host_plan_equals_the_torch_plan_to_rounding(case):
    kw = dict(CASES[case])
    K = kw.pop("K")
    kw = dict(dict(alpha=60.0, tol=1e-7, max_iter=400, seed=1, aggregation="plain"), **kw)
    ref, host = _both(_blocks(K), **kw)
    assert (ref.plan, host.plan) == ("torch", "host")
    assert torch.equal(ref.n_iter, host.n_iter) and torch.equal(ref.converged, host.converged)
    for t in range(ref.z.shape[0]):
        assert _support(host.z[t].numpy()) == _support(ref.z[t].numpy())
    for name in ("z", "w", "u", "components", "explained_variance"):
        assert _rel(getattr(host, name), getattr(ref, name)) < 1e-9, name
    assert set(host.history) == set(HISTORY_KEYS)
    for key in HISTORY_KEYS:
        assert host.history[key].shape == ref.history[key].shape and host.history[key].dtype == torch.float64
        assert torch.allclose(host.history[key], ref.history[key], rtol=1e-9, atol=1e-12), key
    assert host.costs["rounds"] == ref.costs["rounds"] and host.costs["bytes"] == ref.costs["bytes"]


@pytest.mark.parametrize("K", [1, 3])
def test_float32_and_deflation(K):
    """float32 (rounding 1e-7: a looser tolerance; one worker takes the one-point path) and
    deflation's projector."""
    ref, host = _both(_blocks(K, dtype=np.float32), alpha=60.0, tol=1e-5, max_iter=300, seed=1, aggregation="plain")
    assert host.z.dtype == torch.float32 and host.history["objective"].dtype == torch.float32
    assert abs(int(ref.n_iter[0]) - int(host.n_iter[0])) <= 2
    assert _support(host.z[0].numpy()) == _support(ref.z[0].numpy())
    assert _rel(host.z, ref.z) < 1e-4
    if K == 1:
        return
    blocks = _blocks(3)
    first = fit_fsspca(blocks, 2, alpha=60.0, tol=1e-7, seed=1, aggregation="plain")
    G = deflation_projector(first.components[0])
    ref, host = _both(blocks, alpha=60.0, tol=1e-7, max_iter=300, seed=2, aggregation="plain", projector=G)
    assert torch.equal(ref.n_iter, host.n_iter)
    assert _rel(host.z, ref.z) < 1e-9 and _rel(host.components, ref.components) < 1e-9


def test_the_plan_is_chosen_once_and_shown():
    blocks = _blocks(2)
    kw = dict(alpha=60.0, max_iter=3, tol=0.0, aggregation="plain")
    assert fit_fsspca(blocks, 2, **kw).plan == "host"  # auto: the polar solver on the CPU
    assert fit_fsspca(blocks, 2, local_solver="riemannian", **kw).plan == "torch"
    with pytest.raises(ConfigError, match="plan"):
        fit_fsspca(blocks, 2, local_solver="riemannian", plan="host", **kw)
    with pytest.raises(ConfigError, match="plan"):
        fit_fsspca(blocks, 2, plan="gpu", **kw)


def test_callback_values_match_and_a_checkpoint_resumes_across_plans(tmp_path):
    blocks = _blocks(3)
    kw = dict(alpha=60.0, tol=1e-7, max_iter=400, seed=1, aggregation="plain", trials=2)
    seen = {}

    def record(plan):
        def cb(info):
            seen.setdefault(plan, []).append((info.iteration, {k: v.clone() for k, v in info.values.items()},
                                              info.active.clone()))
        return cb

    ref = fit_fsspca(blocks, 2, plan="torch", callback=record("torch"), **kw)
    host = fit_fsspca(blocks, 2, plan="host", callback=record("host"), **kw)
    assert len(seen["torch"]) == len(seen["host"]) == int(ref.n_iter.max())
    for (k1, v1, a1), (k2, v2, a2) in zip(seen["torch"], seen["host"]):
        assert k1 == k2 and torch.equal(a1, a2) and a2.dtype == torch.bool
        for key in HISTORY_KEYS:
            assert v2[key].shape == (2,) and torch.allclose(v2[key], v1[key], rtol=1e-9, atol=1e-12)
    for first, second in (("host", "torch"), ("torch", "host"), ("host", "host")):
        folder = tmp_path / f"{first}_{second}"
        fit_fsspca(blocks, 2, plan=first, checkpoint_dir=folder, checkpoint_every=10,
                   callback=lambda info: info.iteration == 25, **kw)
        out = fit_fsspca(blocks, 2, plan=second, checkpoint_dir=folder, checkpoint_every=10, resume=True, **kw)
        whole = host if second == "host" else ref
        assert torch.equal(out.n_iter, whole.n_iter)
        if first == second == "host":  # the same plan resumes bit for bit
            assert torch.equal(out.z, whole.z) and torch.equal(out.u, whole.u)
            assert all(torch.equal(out.history[k], whole.history[k]) for k in HISTORY_KEYS)
        else:
            assert _rel(out.z, whole.z) < 1e-9 and _rel(out.u, whole.u) < 1e-9


def test_the_one_point_polar_factor_is_the_batched_one_bit_for_bit():
    """:func:`polar_rows_array`'s float path (one float64 point, r = 2) gives the batched
    arrays' bits, ill-conditioned points (the SVD) included; a 2-D point (``np.dot`` where the
    batch takes ``np.matmul``: the same BLAS products here, not promised by NumPy) to rounding."""
    rng = np.random.default_rng(0)
    for i in range(300):
        M = rng.standard_normal((1, 2, int(rng.integers(2, 30)))) * 10.0 ** rng.uniform(-4, 4)
        if i % 5 == 0:
            M[0, 1] = M[0, 0] * (1 + 1e-3 * rng.standard_normal())  # near rank 1: the SVD
        one = polar_rows_array(M)
        assert np.array_equal(one, polar_rows_array(np.concatenate([M, M]))[:1])
        np.testing.assert_allclose(polar_rows_array(M[0]), one[0], rtol=0, atol=1e-14)
