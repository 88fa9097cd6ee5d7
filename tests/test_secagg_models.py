"""exchange="secagg" in the other models (issue 38, "every model uses it"): symmetric NMF across agents
(its exchange and its adaptive lambda's sums through the secagg aggregation), FSSPCA with a server
(aggregation="secagg") and serverless: the same bits as quantized."""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ppdnmf_torch.graph import ring
from ppdnmf_torch.models.fsspca.fit import fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents


def _quiet(fn, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*a, **kw)


def test_symmetric_nmf_across_agents_same_bits_as_quantized():
    gen = torch.Generator().manual_seed(0)
    H = torch.rand(24, 3, generator=gen, dtype=torch.float64)
    X = H @ H.T
    a, b = (_quiet(fit_symnmf_agents, X, 3, n_agents=4, exchange=k, max_iter=3, x_iters=2, device="cpu",
                   start_seed=0) for k in ("quantized", "secagg"))
    assert torch.equal(a.U, b.U) and torch.equal(a.V, b.V)
    assert b.costs["messages"] > 0 and b.costs["lambda_sums_messages"] > 0  # the lambda sums: secagg too


def _blocks(K=4, d=6, seed=0):
    rng = np.random.default_rng(seed)
    scale = 3.0 * 0.6 ** np.arange(d)
    return [rng.standard_normal((12 + 5 * i, d)) * scale + 0.3 for i in range(K)]


def test_fsspca_server_and_serverless_same_bits_as_quantized():
    kw = dict(alpha=20.0, max_iter=4, tol=0)
    a, b = (_quiet(fit_fsspca, _blocks(), 2, aggregation=k, **kw) for k in ("quantized", "secagg"))
    assert torch.equal(a.z, b.z) and b.costs["messages"] > 0
    a, b = (_quiet(fit_serverless, _blocks(), 2, ring(4), inner_iters=2, exchange=k, **kw)
            for k in ("quantized", "secagg"))
    assert torch.equal(a.z, b.z) and torch.equal(a.components, b.components) and b.costs["messages"] > 0
