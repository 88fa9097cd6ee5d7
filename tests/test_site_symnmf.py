"""Symmetric NMF across agents in site mode (issue 39): each site holds its agents' columns
``X[:, S_i]`` only; the factors are fit_symnmf_agents' bits."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local

N_NODES, PARTS = 24, [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
COMMON = dict(n_agents=3, max_iter=4, x_iters=3, y_iters=3, tol=0.0, seed=3, start_seed=7)


def _X():
    rng = np.random.default_rng(1)
    W = rng.random((N_NODES, 3))
    return torch.from_numpy(W @ W.T)


def _site(kind: str, penalty):
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.symnmf.site import fit_symnmf_site

    r = int(os.environ["RANK"])
    own = _X()[:, PARTS[r]].clone()
    with Comm.connect("env://", timeout=120) as comm:
        out = fit_symnmf_site(comm, own, 2, n=N_NODES, parts=PARTS, graph=pp.graph.ring(3), exchange=kind,
                              penalty=penalty, **COMMON, **_options(kind, penalty))
    return {"own": out.own, "history": out.history}


def _options(kind, penalty):
    opts = {"exchange_options": {"n_max": 1e6}} if kind == "quantized" else {}
    return dict(opts, aggregation="plain") if penalty == "adaptive" else opts


@pytest.mark.parametrize("kind, penalty", [("plain", 0.5), pytest.param("quantized", 0.5, marks=pytest.mark.slow),
                                           pytest.param("plain", "adaptive", marks=pytest.mark.slow)])
def test_three_symnmf_sites_give_the_bits_of_one_process(kind, penalty):
    """A fixed penalty: each site's U_i, V_i are one process's bits. The adaptive penalty's sums
    are per-site sums in site mode (share='sums'): the factors agree to rounding (1e-10)."""
    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents

    outs = launch_local(3, _site, (kind, penalty), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = fit_symnmf_agents(_X(), 2, graph=pp.graph.ring(3), parts=torch.tensor(PARTS), exchange=kind,
                            penalty=penalty, device="cpu", **COMMON, **_options(kind, penalty))
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert own["agents"] == [r]
        if penalty == "adaptive":
            assert torch.allclose(own["U"][0], ref.U_agents[0, r], rtol=1e-10, atol=1e-12)
        else:
            assert torch.equal(own["U"][0], ref.U_agents[0, r])
        for key in ("E", "stationarity"):  # the stop's residual: per-site sums (share='sums'), to rounding
            got = o.value["history"][key]
            assert np.allclose(np.ravel(got), np.ravel(ref.history[key]), rtol=1e-10, atol=0), key
