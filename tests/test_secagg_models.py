"""exchange="secagg" in the other models (issue 38, "every model uses it"): symmetric NMF across agents
(its exchange and its adaptive lambda's sums through the secagg aggregation), FSSPCA with a server
(aggregation="secagg") and serverless: the same bits as quantized."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.distributed import Comm, free_port
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.graph import ring
from ppdnmf_torch.models.fsspca.fit import fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_rank


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


def test_symmetric_nmf_over_a_rank_same_bits_and_per_edge_schedules_refused_up_front():
    """Over ranks (one rank in this process) secagg gives quantized's bits in one process (the
    adaptive lambda's sums cross ranks in the plain all-reduce there); the driver's privacy check
    refuses the per-edge ``paper`` schedule before any work, across agents and over ranks alike."""
    gen = torch.Generator().manual_seed(0)
    H = torch.rand(20, 3, generator=gen, dtype=torch.float64)
    X = H @ H.T
    kw = dict(n_agents=4, max_iter=3, x_iters=2, start_seed=0, aggregation="plain")
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    try:
        a = _quiet(fit_symnmf_agents, X, 3, exchange="quantized", device="cpu", **kw)
        b = _quiet(fit_symnmf_rank, comm, X, 3, exchange="secagg", **kw).result
        assert torch.equal(a.U, b.U) and torch.equal(a.V, b.V) and b.costs["messages"] > 0
        for run in (lambda: fit_symnmf_agents(X, 3, exchange="secagg", penalty_schedule="paper", device="cpu", **kw),
                    lambda: fit_symnmf_rank(comm, X, 3, exchange="secagg", penalty_schedule="paper", **kw)):
            with pytest.raises(ConfigError, match=r"^exchange: 'secagg' .*penalty_schedule='paper'"):
                run()
    finally:
        comm.close()
