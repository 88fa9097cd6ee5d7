"""The stop of symmetric NMF across agents (models/symnmf/agents_run.py): the stationarity residual
the agents compute from their own columns and copies is the centralized one's
(:func:`~ppdnmf_torch.models.symnmf.objective.stationarity`) when the copies agree, each agent's
share is its rows of the gradient at its own copy, the noise-free ``X = U U^T`` ends near the
answer under the defaults, a capped run warns, and one rank stops where one process does (bit for
bit: the same sums in the same order)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from ppdnmf_torch.distributed import Comm, free_port
from ppdnmf_torch.errors import ConvergenceWarning
from ppdnmf_torch.models.symnmf.agent_columns import agent_columns, local_t_product
from ppdnmf_torch.models.symnmf.agent_setup import partition_nodes
from ppdnmf_torch.models.symnmf.agent_steps import gather_rows, stationarity_from_sums, stationarity_terms
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
from ppdnmf_torch.models.symnmf.config import AGENTS
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_rank
from ppdnmf_torch.models.symnmf.objective import stationarity
from ppdnmf_torch.models.symnmf.operator import as_similarity


def _problem(n=23, r=3, N=4, T=2, seed=0, sparse=False):
    gen = torch.Generator().manual_seed(seed)
    X = torch.rand((n, n), generator=gen, dtype=torch.float64)
    X = (X + X.T) / 2
    if sparse:
        X = sp.csr_matrix((X * (X > 0.5)).numpy())
    U = torch.rand((T, n, r), generator=gen, dtype=torch.float64)
    U = U * (U > 0.3)  # zeros, where the projection keeps only the negative part
    sim = as_similarity(X, device="cpu")
    idx = partition_nodes(n, N, list(range(T)))
    return sim, U, idx


def _residual(sim, copies, idx):
    """The residual from the agents' terms: ``copies (T, N, n, r)``."""
    Z = agent_columns(sim, idx)
    terms = stationarity_terms(gather_rows(copies, idx), copies.mT @ copies, local_t_product(Z, copies))
    return stationarity_from_sums(sim.sq_norm.expand(copies.shape[0]), terms.sum(dim=1)), terms


@pytest.mark.parametrize("sparse", [False, True])
def test_agreeing_copies_give_the_centralized_residual(sparse):
    sim, U, idx = _problem(sparse=sparse)
    copies = U[:, None].expand(-1, idx.shape[1], -1, -1).contiguous()
    got, _ = _residual(sim, copies, idx)
    want = stationarity(sim.sq_norm.expand(U.shape[0]), U, sim.matmul(U))
    assert (want > 1e-3).all()  # a point far from stationary: the comparison means something
    # the same terms summed in another order (per agent's rows, then over agents): to rounding
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)


def test_each_agent_holds_its_rows_of_the_gradient_at_its_own_copy():
    sim, U, idx = _problem(T=1)
    gen = torch.Generator().manual_seed(1)
    copies = U[:, None] + 0.05 * torch.rand((1, idx.shape[1], *U.shape[1:]), generator=gen, dtype=torch.float64)
    _, terms = _residual(sim, copies, idx)
    X = sim.data
    for i in range(idx.shape[1]):
        S = idx[0, i][idx[0, i] < X.shape[0]]
        Ui = copies[0, i]
        G = (Ui @ Ui.T @ Ui - X @ Ui)[S]
        P = torch.where(Ui[S] > 0, G, G.clamp_max(0))
        torch.testing.assert_close(terms[0, i], torch.stack([P.square().sum(), Ui[S].square().sum()]),
                                   rtol=1e-13, atol=0)


def _noise_free(n=60, r=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    return W @ W.T


def test_the_noise_free_case_ends_near_the_answer_under_the_defaults():
    # n = 30, r = 3, 3 agents, the defaults (the secure sum included) but a reproducible private start
    # (start_seed): 156 outer iterations, E 1.1e-10; docs/SYMNMF.md has the spread over starts and sizes
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = fit_symnmf_agents(_noise_free(n=30, seed=2), 3, n_agents=3, seed=2, start_seed=2, device="cpu")
    h = {k: np.array(res.history[k]).ravel() for k in ("E", "stationarity", "consensus")}
    assert res.converged and res.n_iter < AGENTS.max_iter
    assert h["stationarity"][-1] <= AGENTS.tol and h["consensus"][-1] <= AGENTS.tol
    assert (h["stationarity"][:-1] > AGENTS.tol).any()  # the rule, not the cap, ended it
    assert h["E"][-1] <= 1e-6


def test_a_capped_run_warns_and_says_what_it_did_not_reach():
    with pytest.warns(ConvergenceWarning, match="stationarity residual and the consensus error .* tol=1e-05 in 3"):
        res = fit_symnmf_agents(_noise_free(n=20), 3, n_agents=2, max_iter=3, tol=1e-5, seed=1, device="cpu",
                                exchange="plain")
    assert not res.converged and len(res.history["stationarity"]) == 3


def test_tol_zero_never_stops():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # tol = 0: no test, no warning
        res = fit_symnmf_agents(_noise_free(n=20), 3, n_agents=2, max_iter=3, tol=0.0, seed=1, device="cpu",
                                exchange="plain")
    assert res.n_iter == 3 and not res.converged


@pytest.fixture(scope="module")
def solo():
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    yield comm
    comm.close()


@pytest.mark.parametrize("share", ["all", "sums"])
def test_one_rank_stops_where_one_process_does(solo, share):
    X = _noise_free(n=30)
    X = X / torch.linalg.matrix_norm(X, ord=2)
    kw = dict(n_agents=4, tol=1e-3, max_iter=200, seed=1, start_seed=1, exchange="plain", aggregation="plain")
    ref = fit_symnmf_agents(X, 3, device="cpu", **kw)
    got = fit_symnmf_rank(solo, X, 3, share=share, **kw).result
    assert ref.converged and got.converged and got.n_iter == ref.n_iter < 200
    want, have = np.array(ref.history["stationarity"]).ravel(), np.array(got.history["stationarity"]).ravel()
    if share == "all":  # the agents' terms in one table, summed in the single process's order
        assert np.array_equal(want, have)
    else:
        np.testing.assert_allclose(have, want, rtol=1e-10, atol=0)


SITE_PARTS = [list(range(0, 10)), list(range(10, 20)), list(range(20, 30))]
SITE_KW = dict(n_agents=3, tol=1e-3, max_iter=300, seed=1, start_seed=1)


def _site_X():
    X = _noise_free(n=30)
    return X / torch.linalg.matrix_norm(X, ord=2)


def _site_run():
    """One site of three under the defaults' secure sum (module level: the spawned sites import it)."""
    import os

    import ppdnmf_torch as pp
    from ppdnmf_torch.models.symnmf.site import fit_symnmf_site

    r = int(os.environ["RANK"])
    with Comm.connect("env://", timeout=120) as comm:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = fit_symnmf_site(comm, _site_X()[:, SITE_PARTS[r]].clone(), 3, n=30, parts=SITE_PARTS,
                                  graph=pp.graph.ring(3), **SITE_KW)
    return out.history


@pytest.mark.slow
def test_three_sites_under_secagg_stop_where_one_process_does():
    """The residual's sums masked across the sites (only the totals): the same residual to rounding
    and the same stop iteration as one process (whose lambda sums are plain: the sites' are masked)."""
    import ppdnmf_torch as pp
    from ppdnmf_torch.distributed import launch_local

    outs = launch_local(3, _site_run, (), timeout=400)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = fit_symnmf_agents(_site_X(), 3, graph=pp.graph.ring(3), parts=torch.tensor(SITE_PARTS), device="cpu",
                            aggregation="plain", **SITE_KW)
    want = np.ravel(ref.history["stationarity"])
    assert ref.converged and 1 < len(want) < SITE_KW["max_iter"]
    for o in outs:
        got = np.ravel(o.value["stationarity"])
        assert len(got) == len(want)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=0)
