"""Symmetric NMF across agents (docs/SYMMETRIC_NMF.md, last section): the X-step's local solve
and the Y-step are exact block minimizers, one agent is the centralized solver, N agents reach
its accuracy, the secure exchanges give the same numbers, only U crosses an edge; the agreed
penalty schedule, the adaptive lambda's sums through the secure aggregation, checkpoints and
resume, and a sparse X."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from ppdnmf_torch.errors import ConfigError, ConvergenceWarning, DegreeOneWarning, GraphError, SumLeakWarning
from ppdnmf_torch.exchange import PlainExchange
from ppdnmf_torch.graph import Graph, ring
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents as agents_fit
from ppdnmf_torch.models.symnmf.agent_setup import partition_nodes
from ppdnmf_torch.models.symnmf.config import ADAPTIVE_LAMBDA0
from ppdnmf_torch.models.symnmf.agent_steps import AgentsState, adaptive_lambda, lambda_from_sums, lambda_terms, y_step
from ppdnmf_torch.models.symnmf.clustering import cluster_labels, clustering_accuracy
from ppdnmf_torch.models.symnmf.estimator import scaled_start
from ppdnmf_torch.models.symnmf.fit import fit_symnmf
from ppdnmf_torch.models.symnmf.similarity import similarity_matrix


def fit_symnmf_agents(*args, **kw):
    """The agents' fit with reproducible private starts (``start_seed = seed``), so that runs can
    be compared bit for bit; the default CSPRNG start is tested on ``agents.fit_symnmf_agents``."""
    kw.setdefault("start_seed", kw.get("seed", 0))
    return agents_fit(*args, **kw)


def _blob_similarity(n=90, k=3, seed=0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k
    M = 6.0 * rng.standard_normal((k, 4))[y] + rng.standard_normal((n, 4))
    return similarity_matrix(M, device="cpu"), y


def _tiny(n=10, r=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    X = W @ W.T + 0.01 * torch.rand((n, n), generator=gen, dtype=torch.float64)
    return (X + X.T) / 2, torch.rand((n, r), generator=gen, dtype=torch.float64)


def test_partition_covers_every_node_once():
    parts = partition_nodes(23, 4, [0, 1])
    assert parts.shape == (2, 4, 6)
    for t in range(2):
        real = parts[t][parts[t] < 23]
        assert sorted(real.tolist()) == list(range(23))
    assert not torch.equal(parts[0], parts[1])
    with pytest.raises(ConfigError, match="n_agents"):
        partition_nodes(3, 4, [0])


def test_y_step_is_the_exact_block_minimizer():
    """Many HALS sweeps of the Y-step reach the NNLS solution of each row of V_i (scipy's nnls on
    the stacked system [U; sqrt(lam) I] v ~ [X_i[:, j]; sqrt(lam) U[j]])."""
    X, U = _tiny(n=9, r=3)
    lam = 0.3
    idx = partition_nodes(9, 2, [0])
    Z = torch.cat([X, X.new_zeros(9, 1)], 1)[:, idx].permute(1, 2, 0, 3)
    copies = U[None, None].expand(1, 2, 9, 3).clone()
    st = AgentsState(Xc=copies, U=copies, P=copies, Q=copies, Q_prev=copies, V=torch.zeros(1, 2, idx.shape[-1], 3),
                g=torch.zeros(0), lam=torch.tensor([lam], dtype=torch.float64))
    st.V = st.V.to(torch.float64)
    y_step(Z, st, idx, y_iters=500)
    A = np.vstack([U.numpy(), np.sqrt(lam) * np.eye(3)])
    for a in range(2):
        for slot, j in enumerate(idx[0, a].tolist()):
            if j == 9:  # padding stays zero
                assert st.V[0, a, slot].abs().max() == 0
                continue
            v, _ = nnls(A, np.concatenate([X[:, j].numpy(), np.sqrt(lam) * U[j].numpy()]))
            np.testing.assert_allclose(st.V[0, a, slot].numpy(), v, atol=1e-9)


def test_one_agent_equals_the_centralized_symanls():
    """N = 1 (no neighbours, rho = 0): with enough ADMM iterations the X-step is the exact U-update
    and the Y-step the exact V-update of SymANLS (fixed lambda)."""
    pytest.importorskip("ppdnmf_torch.models.symnmf.symanls")
    X, U0 = _tiny()
    lam = 0.5
    central = fit_symnmf(X, 2, method="symanls", penalty=lam, U0=U0, max_iter=2, tol=0, device="cpu")
    agents = fit_symnmf_agents(X, 2, n_agents=1, penalty=lam, U0=U0, max_iter=2, x_iters=250, y_iters=150,
                               device="cpu", start="common")  # SymANLS starts V at U0
    torch.testing.assert_close(agents.U[0], central.U[0], atol=1e-7, rtol=0)
    torch.testing.assert_close(agents.V[0], central.V[0], atol=1e-7, rtol=0)


def test_one_agent_adaptive_matches_centralized_symhals_clustering():
    S, y = _blob_similarity(n=60)
    U0 = scaled_start(S, 3, 1, 0)[0]
    central = fit_symnmf(S, 3, method="symhals", penalty="adaptive", lam0=ADAPTIVE_LAMBDA0, U0=U0, max_iter=40,
                         tol=0, device="cpu")
    one = fit_symnmf_agents(S, 3, n_agents=1, U0=U0, max_iter=40, device="cpu")
    acc_c = clustering_accuracy(y, cluster_labels(central.U[0]))
    assert clustering_accuracy(y, cluster_labels(one.U[0])) == acc_c == 1.0
    assert abs(one.history["E"][-1][0] - float(central.E[0])) < 1e-2


@pytest.mark.parametrize("kind,n_agents", [("plain", 4), ("quantized", 6)])
def test_n_agents_reach_the_centralized_accuracy(kind, n_agents):
    from tests.conftest import FAKE_COSTS

    S, y = _blob_similarity(n=60)
    U0 = scaled_start(S, 3, 1, 1)[0]
    central = fit_symnmf(S, 3, method="symhals", penalty="adaptive", lam0=ADAPTIVE_LAMBDA0, U0=U0, max_iter=40,
                         tol=0, device="cpu")
    res = fit_symnmf_agents(S, 3, n_agents=n_agents, exchange=kind, U0=U0, max_iter=40, device="cpu",
                            exchange_options={"n_max": 10**6, "cost_model": FAKE_COSTS} if kind == "quantized" else None)
    if kind == "quantized":  # the estimated Paillier cost of the same run
        assert res.costs["encryptions"] > 0 and res.costs["estimated_seconds"] > 0
    h = res.history
    assert clustering_accuracy(y, cluster_labels(res.U[0])) >= clustering_accuracy(y, cluster_labels(central.U[0]))
    assert h["consensus"][-1][0] < 1e-2 and h["uv_dist"][-1][0] < 0.1
    assert abs(h["E"][-1][0] - float(central.E[0])) < 0.05
    lam = np.array([v[0] for v in h["lambda"]])
    assert (np.diff(lam) >= 0).all()  # eq. (20): lambda never decreases
    assert h["bytes"][-1] > 0


def test_quantized_tracks_plain():
    S, _ = _blob_similarity(n=30, k=2)
    kw = dict(n_agents=4, U0=scaled_start(S, 2, 1, 0)[0], max_iter=5, x_iters=4, device="cpu", graph=ring(4))
    plain = fit_symnmf_agents(S, 2, **kw)
    quant = fit_symnmf_agents(S, 2, exchange="quantized", exchange_options={"n_max": 10**6}, **kw)
    torch.testing.assert_close(quant.U, plain.U, atol=1e-5, rtol=0)


@pytest.mark.crypto
def test_paillier_equals_quantized_bit_for_bit(paillier_keypairs):
    """The exchange and the lambda sums' aggregation (the exchange's kind by default): real
    Paillier with small keys gives the bits of the emulated integer protocols."""
    S, _ = _blob_similarity(n=12, k=2)
    kw = dict(n_agents=3, U0=scaled_start(S, 2, 1, 0)[0], max_iter=2, x_iters=2, device="cpu", graph=ring(3))
    opts = {"n_max": 10**6, "key_bits": 128, "protocol": "masked"}
    keys = paillier_keypairs(128, 7)
    quant = fit_symnmf_agents(S, 2, exchange="quantized", exchange_options=opts, **kw)
    real = fit_symnmf_agents(S, 2, exchange="paillier", exchange_options={**opts, "keypairs": keys[:3]},
                             aggregation_options={"keypairs": keys[3:]}, **kw)
    assert torch.equal(real.U, quant.U) and torch.equal(real.V, quant.V) and torch.equal(real.lam, quant.lam)
    # the sums' real decryptions: as many as the emulation's cost model predicts (2 rounds x 2 ciphertexts)
    assert real.costs["lambda_sums_decryptions"] == quant.costs["lambda_sums_model_decryptions"] == 4
    plain = fit_symnmf_agents(S, 2, exchange="plain", **kw)
    assert not np.array_equal(real.history["lambda"][-1], plain.history["lambda"][-1])


def test_batched_trial_equals_the_same_trial_alone():
    S, _ = _blob_similarity(n=40, k=2)
    U0 = scaled_start(S, 2, 2, 0)
    both = fit_symnmf_agents(S, 2, n_agents=3, U0=U0, trials=2, seed=5, max_iter=6, device="cpu")
    alone = fit_symnmf_agents(S, 2, n_agents=3, U0=U0[1], trials=1, seed=6, max_iter=6, device="cpu")
    torch.testing.assert_close(both.U[1], alone.U[0], atol=1e-12, rtol=0)


def test_only_u_crosses_an_edge():
    """What the exchange is handed is the agents' U copies, (A, n r), never V_i or X_i."""
    seen = []

    class Spy(PlainExchange):
        def exchange(self, U, g, **kw):
            seen.append(U.clone())
            return super().exchange(U, g, **kw)

    S, _ = _blob_similarity(n=30, k=2)
    res = fit_symnmf_agents(S, 2, n_agents=3, exchange=Spy(), U0=scaled_start(S, 2, 1, 0)[0], max_iter=2,
                            x_iters=3, device="cpu")
    assert len(seen) == 6 and all(u.shape == (3, 30 * 2) for u in seen)
    # each call carries every agent's current copy U_i (its own rows included), in order
    torch.testing.assert_close(seen[-1].view(1, 3, 30, 2).clamp_min(0), res.U_agents, atol=0.2, rtol=0)


def test_adaptive_lambda_rule():
    U = torch.rand(1, 2, 5, 3, dtype=torch.float64)
    lam = torch.tensor([0.2], dtype=torch.float64)
    assert adaptive_lambda(lam, U, U).item() == pytest.approx(0.2)  # constant once U = V
    V = U + 0.1 * torch.rand(1, 2, 5, 3, dtype=torch.float64)
    assert adaptive_lambda(lam, U, V).item() > 0.2
    assert adaptive_lambda(lam, U, -U).item() == 0.2  # <U, V> <= 0: kept


def test_bad_input_and_warnings():
    S, _ = _blob_similarity(n=20, k=2)
    with pytest.raises(ConfigError, match="rank"):
        fit_symnmf_agents(S, 0, n_agents=2)
    with pytest.raises(GraphError, match="min_degree"):
        fit_symnmf_agents(S, 2, n_agents=3, graph=Graph(3, [(0, 1), (1, 2)]), min_degree=2, device="cpu")
    with pytest.warns(DegreeOneWarning):
        fit_symnmf_agents(S, 2, n_agents=3, graph=Graph(3, [(0, 1), (1, 2)]), exchange="quantized",
                          max_iter=1, x_iters=1, device="cpu")
    with pytest.warns(ConvergenceWarning):
        fit_symnmf_agents(S, 2, n_agents=2, max_iter=2, tol=1e-12, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = fit_symnmf_agents(S, 2, n_agents=2, max_iter=300, tol=1e-2, device="cpu")
    assert res.converged and res.n_iter < 300


# -- the penalty schedule (issue 32's agreed draws) -----------------------------------------
class _GSpy(PlainExchange):
    """Records the penalty draws ``g (2E,)`` of every exchange call."""

    def __init__(self):
        super().__init__()
        self.g = []

    def exchange(self, U, g, **kw):
        self.g.append(g.clone())
        return super().exchange(U, g, **kw)


@pytest.mark.parametrize("schedule", ["agreed", "paper"])
def test_agreed_schedule_gives_every_edge_one_draw(schedule):
    """``agreed`` (the default): one common draw per trial and ADMM iteration on every edge, rising
    towards the cap; ``paper``: each directed edge its own draw."""
    S, _ = _blob_similarity(n=30, k=2)
    spy = _GSpy()
    kw = {} if schedule == "agreed" else {"penalty_schedule": schedule}
    fit_symnmf_agents(S, 2, n_agents=4, exchange=spy, U0=scaled_start(S, 2, 2, 0), trials=2, max_iter=2,
                      x_iters=3, device="cpu", **kw)
    per_trial = torch.split(torch.stack(spy.g), torch.bincount(spy.topology.src // 4).tolist(), dim=1)
    for g in per_trial:
        equal = bool((g == g[:, :1]).all())
        assert equal == (schedule == "agreed")
        assert bool((g > 0).all()) and bool((g <= 0.3).all())
        assert bool((g[1:] >= g[:-1]).all())  # monotone, carried over between outer iterations


def test_schedule_settings_and_the_sum_leak_warning():
    S, _ = _blob_similarity(n=24, k=2)
    kw = dict(n_agents=4, graph=ring(4), max_iter=1, x_iters=1, device="cpu")
    caps = [0.2, 0.3, 0.3, 0.3]
    with pytest.raises(ConfigError, match="g_max"):  # agreed needs one cap
        fit_symnmf_agents(S, 2, g_cap=caps, **kw)
    with pytest.raises(ConfigError, match="penalty_schedule"):
        fit_symnmf_agents(S, 2, penalty_schedule="adaptive", **kw)
    with pytest.raises(ConfigError, match="g_cap"):
        fit_symnmf_agents(S, 2, g_cap=[0.3, 0.3], **kw)
    with pytest.warns(SumLeakWarning, match="unequal"):
        fit_symnmf_agents(S, 2, g_cap=caps, penalty_schedule="paper", exchange="quantized",
                          exchange_options={"n_max": 10**6}, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SumLeakWarning)
        for sched, c in (("paper", 0.3), ("agreed", 0.3), ("paper", caps)):  # equal caps, or nothing secure
            fit_symnmf_agents(S, 2, g_cap=c, penalty_schedule=sched,
                              exchange="plain" if isinstance(c, list) else "quantized",
                              exchange_options=None if isinstance(c, list) else {"n_max": 10**6}, **kw)


# -- the adaptive lambda's sums through the secure aggregation --------------------------------
def test_lambda_sums_through_the_aggregation():
    """``plain`` gives the bits of the direct sums; ``quantized`` (the exchange's kind by default)
    follows from the exact integer sums: the same lambda to ~1e-9 relative, costs counted."""
    S, _ = _blob_similarity(n=40, k=2)
    kw = dict(n_agents=4, U0=scaled_start(S, 2, 1, 0)[0], max_iter=8, x_iters=3, device="cpu", graph=ring(4),
              exchange="plain")
    plain = fit_symnmf_agents(S, 2, **kw)
    quant = fit_symnmf_agents(S, 2, aggregation="quantized", **kw)
    assert plain.costs["lambda_sums_rounds"] == 8 and plain.costs["lambda_sums_uploads"] == 8 * 3
    assert quant.costs["lambda_sums_bytes"] == 8 * 4 * 3 * 8  # rounds x agents x sums x 8 bytes
    lp = np.array([v[0] for v in plain.history["lambda"]])
    lq = np.array([v[0] for v in quant.history["lambda"]])
    assert not np.array_equal(lp, lq) and np.abs(lq / lp - 1).max() < 1e-8
    # plain aggregation = the direct sums of adaptive_lambda, bit for bit
    st_lam = torch.tensor([ADAPTIVE_LAMBDA0], dtype=torch.float64)
    U_own = torch.rand(1, 4, 10, 2, dtype=torch.float64)
    V = U_own + 0.1 * torch.rand(1, 4, 10, 2, dtype=torch.float64)
    from ppdnmf_torch.exchange.aggregation import make_aggregator

    agg = make_aggregator("plain", 4)
    assert torch.equal(lambda_from_sums(st_lam, agg.total(lambda_terms(U_own, V), dim=1)),
                       adaptive_lambda(st_lam, U_own, V))
    with pytest.raises(ConfigError, match="3 workers"):
        fit_symnmf_agents(S, 2, aggregation=make_aggregator("plain", 3), **kw)
    with pytest.raises(ConfigError, match="aggregation_options"):
        fit_symnmf_agents(S, 2, aggregation=agg, aggregation_options={"n_max": 2.0**20}, **kw)
    with pytest.raises(ConfigError, match="aggregation"):
        fit_symnmf_agents(S, 2, aggregation="sealed", **kw)
    fixed = fit_symnmf_agents(S, 2, penalty=0.5, **kw)  # a fixed lambda needs no sums
    assert not any(k.startswith("lambda_sums") for k in fixed.costs)


# -- checkpoints and resume ---------------------------------------------------------------------
def _strip_time(h):
    return {k: v for k, v in h.items() if k != "time"}


def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
    S, _ = _blob_similarity(n=30, k=2)
    kw = dict(n_agents=3, U0=scaled_start(S, 2, 1, 0)[0], max_iter=6, x_iters=3, device="cpu", graph=ring(3),
              exchange="quantized", exchange_options={"n_max": 10**6})
    whole = fit_symnmf_agents(S, 2, **kw)

    class Crash(Exception):
        pass

    def crash(k, m):
        if k == 4:
            raise Crash  # after iteration 4's work, before its checkpoint: resume from 3

    with pytest.raises(Crash):
        fit_symnmf_agents(S, 2, checkpoint_dir=tmp_path, checkpoint_every=3, callback=crash, **kw)
    again = fit_symnmf_agents(S, 2, checkpoint_dir=tmp_path, checkpoint_every=3, resume=True, **kw)
    for name in ("U", "V", "U_agents", "lam"):
        assert torch.equal(getattr(again, name), getattr(whole, name))
    assert again.n_iter == 6
    for key, vals in _strip_time(whole.history).items():
        assert all(np.array_equal(a, b) for a, b in zip(vals, again.history[key])) and len(vals) == 6
    for key in ("lambda_sums_rounds", "lambda_sums_bytes", "lambda_sums_model_encryptions"):
        assert again.costs[key] == whole.costs[key]  # per-round counters continue (a new setup adds its own)


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    from ppdnmf_torch.checkpoint import CheckpointError

    S, _ = _blob_similarity(n=30, k=2)
    kw = dict(n_agents=3, U0=scaled_start(S, 2, 1, 0)[0], max_iter=2, x_iters=2, device="cpu", graph=ring(3),
              checkpoint_dir=tmp_path, exchange="plain")
    fit_symnmf_agents(S, 2, **kw)
    for change in ({"g_cap": 0.2}, {"penalty_schedule": "paper"}, {"x_iters": 3}, {"X": S * 0.5}):
        args = {**kw, **change}
        with pytest.raises(CheckpointError, match="different run"):
            fit_symnmf_agents(args.pop("X", S), 2, resume=True, **args)
    with pytest.raises(ConfigError, match="resume"):
        fit_symnmf_agents(S, 2, resume=True, **{k: v for k, v in kw.items() if k != "checkpoint_dir"})


def test_no_mask_seed_in_a_checkpoint(tmp_path, monkeypatch):
    """The quantized aggregation's pair seeds (drawn from the OS) appear in no checkpoint file."""
    import secrets

    drawn = []
    real = secrets.token_bytes
    monkeypatch.setattr(secrets, "token_bytes", lambda k: drawn.append(real(k)) or drawn[-1])
    S, _ = _blob_similarity(n=20, k=2)
    fit_symnmf_agents(S, 2, n_agents=3, U0=scaled_start(S, 2, 1, 0)[0], max_iter=2, x_iters=2, device="cpu",
                      graph=ring(3), exchange="quantized", exchange_options={"n_max": 10**6},
                      checkpoint_dir=tmp_path, checkpoint_every=1)
    files = sorted(tmp_path.iterdir())
    assert len(drawn) == 3 and len(files) == 2
    for f in files:
        raw = f.read_bytes()
        assert not any(s in raw or s[::-1] in raw for s in drawn)


@pytest.mark.crypto
def test_paillier_resumes_a_quantized_checkpoint_and_writes_no_key(tmp_path, paillier_keypairs):
    """quantized and paillier compute the same bits, so either resumes the other; the files of a
    paillier run hold no private key's p, q or phi(n) (decimal, hex, raw bytes either way)."""
    S, _ = _blob_similarity(n=12, k=2)
    kw = dict(n_agents=3, U0=scaled_start(S, 2, 1, 0)[0], x_iters=2, device="cpu", graph=ring(3),
              checkpoint_dir=tmp_path, checkpoint_every=1)
    opts = {"n_max": 10**6, "key_bits": 128}
    keys = paillier_keypairs(128, 7)
    whole = fit_symnmf_agents(S, 2, exchange="quantized", exchange_options=opts, max_iter=2,
                              **{**kw, "checkpoint_dir": None})
    fit_symnmf_agents(S, 2, exchange="quantized", exchange_options=opts, max_iter=1, **kw)
    real = fit_symnmf_agents(S, 2, exchange="paillier", exchange_options={**opts, "keypairs": keys[:3]},
                             aggregation_options={"keypairs": keys[3:]}, max_iter=2, resume=True, **kw)
    assert torch.equal(real.U_agents, whole.U_agents) and torch.equal(real.lam, whole.lam)
    pats = set()
    for _, sk in keys:
        for v in (sk.p, sk.q, (sk.p - 1) * (sk.q - 1)):
            raw = v.to_bytes((v.bit_length() + 7) // 8, "big")
            pats |= {str(v).encode(), format(v, "x").encode(), raw, raw[::-1]}
    files = sorted(tmp_path.iterdir())
    assert len(files) == 2
    assert not any(pat in f.read_bytes() for f in files for pat in pats)


# -- a sparse X across agents ---------------------------------------------------------------------
def test_agent_columns_of_a_sparse_x_are_the_dense_ones():
    import scipy.sparse as sp

    from ppdnmf_torch.models.symnmf.agent_columns import SparseColumns, agent_columns
    from ppdnmf_torch.models.symnmf.operator import as_similarity

    S, _ = _blob_similarity(n=23, k=2)
    S = S * (S > 0.05)
    idx = partition_nodes(23, 4, [0, 1])
    dense = agent_columns(as_similarity(S, device="cpu"), idx)
    sparse = agent_columns(as_similarity(sp.csr_matrix(S.numpy()), device="cpu"), idx)
    assert isinstance(sparse, SparseColumns) and sparse.shape == tuple(dense.shape)
    T, N, n, m = dense.shape
    blocks = sparse.cols.to_dense().view(T * N, n, T * N, m)
    for a in range(T * N):
        torch.testing.assert_close(blocks[a, :, a], dense.view(T * N, n, m)[a], atol=0, rtol=0)
        assert int((blocks[a] != 0).sum()) == int((blocks[a, :, a] != 0).sum())  # nothing outside its own block
    torch.testing.assert_close(sparse.rows.to_dense(), sparse.cols.to_dense().T, atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["scipy", "torch_csr"])
def test_sparse_x_gives_the_dense_iterates(layout, device):
    import scipy.sparse as sp

    S, _ = _blob_similarity(n=40, k=3)
    S = S * (S > 0.02)  # a sparse similarity
    Xs = sp.csr_matrix(S.numpy()) if layout == "scipy" else S.to_sparse_csr()
    kw = dict(n_agents=4, U0=scaled_start(S, 3, 2, 0), trials=2, max_iter=6, x_iters=3, device=device.type)
    dense = fit_symnmf_agents(S, 3, **kw)
    sparse = fit_symnmf_agents(Xs, 3, **kw)
    for name in ("U_agents", "V"):
        d, s = getattr(dense, name), getattr(sparse, name)
        assert s.device.type == device.type and float((d - s).norm() / d.norm()) < 1e-12
    assert abs(sparse.history["E"][-1] - dense.history["E"][-1]).max() < 1e-12


@pytest.mark.slow
def test_bench_script_smoke_run(tmp_path):
    """scripts/bench_symnmf_agents.py: both layouts run and reach the same E."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_symnmf_agents.py"
    out = tmp_path / "rows.json"
    subprocess.run([sys.executable, str(script), "--n", "300", "--agents", "3", "--rank", "4", "--iters", "2",
                    "--out", str(out)], check=True, capture_output=True, env=os.environ.copy())
    rows = json.loads(out.read_text())
    assert [r["layout"] for r in rows] == ["sparse", "dense"]
    assert abs(rows[0]["E_last"] - rows[1]["E_last"]) < 1e-12 and rows[0]["s_per_iter_median"] > 0


def test_private_start_is_the_default_per_agent_and_reproducible(monkeypatch):
    """``V_i`` starts from agent i's own stream: not ``U0[S_i]``, different per agent, the same
    from the same seed, at the common start's scale, and a subset of agents (a run over ranks)
    gets the same rows; ``start="common"`` keeps the old public ``U0[S_i]``."""
    import ppdnmf_torch.models.symnmf.agent_setup as setup_mod
    import ppdnmf_torch.models.symnmf.agent_steps as steps_mod
    import ppdnmf_torch.models.symnmf.agents_run as run_mod

    S, _ = _blob_similarity(n=40)
    U0 = scaled_start(S, 3, 2, 0)
    idx = partition_nodes(40, 4, [3, 4])
    V = setup_mod.private_start(U0, idx, [3, 4])
    assert V.shape == (2, 4, 10, 3) and V.dtype == U0.dtype
    assert bool((V >= 0).all()) and bool((V <= U0.amax(dim=(-2, -1)).view(2, 1, 1, 1)).all())
    assert not torch.allclose(V[:, 0], V[:, 1]) and not torch.allclose(V[0], V[1])
    torch.testing.assert_close(setup_mod.private_start(U0, idx, [3, 4]), V, atol=0, rtol=0)
    torch.testing.assert_close(setup_mod.private_start(U0, idx[:, [2]], [3, 4], agents=[2]), V[:, [2]],
                               atol=0, rtol=0)
    assert not torch.allclose(setup_mod.private_start(U0, idx, [5, 6]), V)
    wider = torch.cat([idx[:, [2]], torch.full((2, 1, 3), 40)], dim=-1)  # more padding: the same rows
    torch.testing.assert_close(setup_mod.private_start(U0, wider, [3, 4], agents=[2])[..., :10, :], V[:, [2]],
                               atol=0, rtol=0)
    common = steps_mod.gather_rows(U0[:, None].expand(2, 4, 40, 3), idx)
    seen = []
    orig = run_mod.x_step

    def x_step(Z, st, *a, **k):  # the V the first X-step sees: the start
        seen.append(st.V.clone())
        return orig(Z, st, *a, **k)

    monkeypatch.setattr(run_mod, "x_step", x_step)
    kw = dict(n_agents=4, U0=U0, trials=2, seed=3, max_iter=1, x_iters=1, device="cpu", parts=idx, graph=ring(4))
    fit_symnmf_agents(S, 3, **kw)  # start_seed = seed = 3: the stream of private_start(..., [3, 4])
    fit_symnmf_agents(S, 3, start="common", **kw)
    agents_fit(S, 3, **kw)  # the default: each agent's own CSPRNG seed, not the run's seed
    agents_fit(S, 3, **kw)
    torch.testing.assert_close(seen[0], V, atol=0, rtol=0)
    torch.testing.assert_close(seen[1], common, atol=0, rtol=0)
    for fresh in seen[2:]:
        assert not torch.allclose(fresh, V) and not torch.allclose(fresh, common)
        assert bool((fresh >= 0).all()) and bool((fresh <= U0.amax(dim=(-2, -1)).view(2, 1, 1, 1)).all())
        assert bool((fresh[idx >= 40] == 0).all())  # padded rows stay zero
    assert not torch.allclose(seen[2], seen[3])
    with pytest.raises(ConfigError, match="start"):
        fit_symnmf_agents(S, 3, n_agents=2, start="public", device="cpu")
