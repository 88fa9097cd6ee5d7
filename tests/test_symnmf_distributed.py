"""Symmetric NMF across agents over ranks (models/symnmf/distributed.py): the engine's layout keeps
every per-agent block's alignment, one rank in this process and spawned gloo ranks give
``fit_symnmf_agents``'s factors and penalty bit for bit (the history's metrics, from per-rank
sums, to rounding), ``share="sums"`` to rounding, and a bad setting is refused by name. Under the
single process's defaults (``penalty_schedule="agreed"``, the lambda sums' ``plain`` aggregation)
and its other settings (``"paper"``, a sparse ``X``) the bits are the same; a secure aggregation of
the lambda sums is refused over ranks. Checkpoints are per rank: an interrupted and resumed run
equals the uninterrupted one and one process's bit for bit, a rank's file holds its own agents'
state only, and another run's checkpoints, world size or partition are refused by name.

The default run has the unit tests, one rank in this process (checkpoints and resume included) and
one spawned run of 2 ranks (which writes checkpoints); the rest (3 ranks, quantized and paillier,
the stopping rules, 2 ranks interrupted and resumed) is ``slow``.
"""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch

from ppdnmf_torch.distributed import (Comm, DistributedError, HaloExchange, RankLayout, RankSampler, block_period,
                                      free_port, launch_local, partition_agents)
from ppdnmf_torch.distributed.layout import ALIGN_BYTES
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange.costmodel import PaillierOpCosts
from ppdnmf_torch.graph import erdos_renyi, ring
from ppdnmf_torch.models.ppdnmf import distributed as ppdnmf_distributed
from ppdnmf_torch.models.ppdnmf.problem import TRIAL_ALIGN_BYTES
from ppdnmf_torch.checkpoint import CheckpointError, checkpoint_files, checkpoint_iteration
from ppdnmf_torch.models.symnmf.agent_setup import private_start
from ppdnmf_torch.models.symnmf.agent_steps import lambda_from_sums, lambda_terms
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_distributed, fit_symnmf_rank, initial_rank_state

FAKE_COSTS = PaillierOpCosts(key_bits=2048, keygen=1e-3, encryption=1e-4, decryption=2e-4,
                             homomorphic_addition=1e-6, scalar_multiplication=1e-5)
FACTORS = ("U", "V", "U_agents", "lam", "parts")
METRICS = ("E", "objective", "uv_dist", "consensus", "stationarity")


def _similarity(n=24, r=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    X = W @ W.T + 0.01 * torch.rand((n, n), generator=gen, dtype=torch.float64)
    X = (X + X.T) / 2
    return X / torch.linalg.matrix_norm(X, ord=2)


def _kwargs(**kw):
    # reproducible private starts; the adaptive lambda's sums in the plain all-reduce, which a run over
    # ranks needs named (the default, the exchange's kind, secagg, has no protocol across ranks)
    return dict(dict(n_agents=5, max_iter=4, x_iters=3, seed=1, start_seed=1, aggregation="plain"), **kw)


def _assert_same(ref, got, bits=True, same_bytes=True):
    """The factors and ``lambda`` bit for bit (or, ``bits=False``, to 1e-12), the metrics to rounding,
    the bytes (``same_bytes``: the same exchange kind) equal."""
    for key in FACTORS:
        a, b = getattr(ref, key), getattr(got, key)
        if bits or key == "parts":
            assert torch.equal(a, b), key
        else:
            assert torch.allclose(b, a, rtol=1e-12, atol=1e-14), key
    assert got.n_iter == ref.n_iter and got.converged == ref.converged
    assert (np.array(got.history["lambda"]) == np.array(ref.history["lambda"])).all() or not bits
    for key in METRICS:
        np.testing.assert_allclose(np.array(got.history[key]), np.array(ref.history[key]), rtol=1e-12, atol=1e-15)
    assert got.history["bytes"] == ref.history["bytes"] or not same_bytes
    assert len(got.history["time"]) == got.n_iter


# -- the engine's pieces --------------------------------------------------------------------------
def test_the_halo_pieces_are_the_engines_alone():
    """PPDNMF's runs over ranks use the engine's halo and layout; its package re-exports none of them."""
    assert HaloExchange.__module__ == RankSampler.__module__ == "ppdnmf_torch.distributed.halo"
    assert RankLayout.__module__ == "ppdnmf_torch.distributed.layout"
    assert not {"HaloExchange", "RankSampler", "RankLayout"} & set(vars(ppdnmf_distributed))
    assert ALIGN_BYTES == TRIAL_ALIGN_BYTES


@pytest.mark.parametrize("sizes,itemsize,p", [((24 * 5, 24 * 3, 5 * 3, 9), 8, 8), ((64, 8), 8, 1),
                                              ((30 * 6, 30 * 4, 6 * 4, 16), 8, 2), ((7,), 4, 16)])
def test_block_period_fills_whole_lines(sizes, itemsize, p):
    assert block_period(sizes, itemsize) == p
    assert all(p * b * itemsize % 64 == 0 for b in sizes)
    assert all(any(q * b * itemsize % 64 for b in sizes) for q in range(1, p))


@pytest.mark.parametrize("P,period", [(2, 8), (3, 4), (2, 1)])
def test_a_ranks_slots_keep_each_agents_residue(P, period):
    g = erdos_renyi(11, 0.4, seed=2)
    part = partition_agents(g, P)
    seen = []
    for q in range(P):
        lay = RankLayout.build(part, g, q, period=period)
        assert lay.period == period and lay.n_slots % period == 11 % period
        assert ((lay.slots - lay.agents) % period == 0).all()
        src = lay.edge_src(g)
        assert (lay.agents[(lay.slots[:, None] == src[None]).int().argmax(0)] == g.src[lay.edge_ids]).all()
        seen += lay.edge_ids.tolist()
    assert sorted(seen) == list(range(g.src.numel()))


def test_lambda_terms_give_the_adaptive_rule():
    gen = torch.Generator().manual_seed(0)
    U, V = torch.rand((2, 4, 3, 2), generator=gen, dtype=torch.float64), torch.rand((2, 4, 3, 2), generator=gen,
                                                                                     dtype=torch.float64)
    lam = torch.tensor([0.1, 2.0], dtype=torch.float64)
    want = lam * (U.square().sum((1, 2, 3)) + V.square().sum((1, 2, 3))) / (2 * (U * V).sum((1, 2, 3)))
    assert torch.allclose(lambda_from_sums(lam, lambda_terms(U, V).sum(1)), want.clamp_min(lam), rtol=1e-14, atol=0)
    assert torch.equal(lambda_from_sums(lam, lambda_terms(U, U).sum(1)), lam)  # U = V: constant


# -- one rank in this process ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def solo():
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    yield comm
    comm.close()


def _sparse_similarity(layout):
    X = _similarity()
    X = X * (X > X.median())  # about half the entries
    if layout == "scipy":
        import scipy.sparse as sp
        return sp.csr_matrix(X.numpy())
    return X.to_sparse_csr()


@pytest.mark.parametrize("kw", [dict(), dict(exchange="quantized", exchange_options={"n_max": 1e4}, penalty=0.5),
                                dict(penalty_schedule="paper", g_cap=[0.2, 0.3, 0.25, 0.3, 0.1], exchange="plain"),
                                dict(exchange="quantized", exchange_options={"n_max": 1e6}, aggregation="plain"),
                                dict(X="scipy"), dict(X="torch", penalty_mode="fixed")])
def test_one_rank_gives_the_single_process_bits(solo, kw):
    kw = dict(kw)
    X = _sparse_similarity(kw.pop("X")) if "X" in kw else _similarity()
    ref = fit_symnmf_agents(X, 3, device="cpu", **_kwargs(**kw))
    got = fit_symnmf_rank(solo, X, 3, **_kwargs(**kw))
    _assert_same(ref, got.result)
    assert got.partition.world_size == 1 and got.ranks[0]["peers"] == []
    assert got.own["agents"] == list(range(5)) and torch.equal(got.own["U"], got.result.U_agents[0])


def test_per_rank_sums_agree_to_rounding(solo):
    X = _similarity()
    ref = fit_symnmf_agents(X, 3, device="cpu", **_kwargs(max_iter=6))
    got = fit_symnmf_rank(solo, X, 3, share="sums", **_kwargs(max_iter=6))
    _assert_same(ref, got.result, bits=False)


@pytest.mark.parametrize("kw,match", [(dict(share="some"), "share"), (dict(exchange="plain", rank=0), "rank"),
                                      (dict(parts=torch.zeros((5, 5), dtype=torch.long)), "parts"),
                                      (dict(graph=ring(4)), "graph"), (dict(penalty=-1.0), "penalty"),
                                      (dict(exchange="paillier", exchange_options={"key_bits": 128, "fast": False}),
                                       "fast"),
                                      (dict(partition=partition_agents(ring(5), 2)), "partition"),
                                      (dict(penalty_schedule="adaptive"), "penalty_schedule"),
                                      (dict(g_cap=[0.2, 0.3, 0.3, 0.3, 0.3]), "g_max"),
                                      (dict(exchange="quantized", aggregation=None),
                                       "aggregation: 'quantized' .None takes"),
                                      (dict(aggregation=None), "aggregation: 'secagg' .None takes"),
                                      (dict(aggregation="paillier"), "aggregation: 'paillier' has no protocol"),
                                      (dict(aggregation="plain", aggregation_options={"n_max": 4}),
                                       "aggregation_options"),
                                      (dict(resume=True), "resume"), (dict(checkpoint_every=-1), "checkpoint_every")])
def test_bad_settings_are_refused_by_name(solo, kw, match):
    X = _similarity()
    rank = kw.pop("rank", 3)
    with pytest.raises(ConfigError, match=match):
        fit_symnmf_rank(solo, X, rank, **_kwargs(**kw))


def test_a_fixed_penalty_needs_no_aggregation(solo):
    X = _similarity()
    kw = _kwargs(exchange="quantized", exchange_options={"n_max": 1e4}, penalty=0.5, aggregation="quantized")
    _assert_same(fit_symnmf_agents(X, 3, device="cpu", **kw), fit_symnmf_rank(solo, X, 3, **kw).result)


@pytest.mark.parametrize("start", ["private", "common"])
def test_the_ranks_start_is_the_single_processs(start):
    gen = torch.Generator().manual_seed(0)
    U0 = torch.rand((7, 2), generator=gen, dtype=torch.float64)
    idx = torch.tensor([[[0, 3, 7], [7, 7, 7], [1, 2, 6], [4, 5, 7]]])  # slot 1 free
    lay = RankLayout.build(partition_agents(ring(3), 1), ring(3), 0)
    st = initial_rank_state(U0, idx, lay, 0, torch.zeros(6, dtype=torch.float64), torch.ones(1, dtype=torch.float64),
                            start, start_seed=5)
    assert st.Xc.shape == (1, 4, 7, 2) and torch.equal(st.Xc[0, 2], U0) and torch.equal(st.U, st.Xc)
    assert not st.V[0, 1].any() and not st.V[0, 0, 2].any()
    if start == "common":
        assert torch.equal(st.V[0, 2], U0[[1, 2, 6]])
    else:  # each agent's own draw, whatever slot it sits in: the single process's private_start
        for agent, slot in zip(lay.agents.tolist(), lay.slots.tolist()):
            own = private_start(U0[None], idx[:, [slot]], [5], agents=[agent])[0, 0]
            assert torch.equal(st.V[0, slot], own) and bool(own[idx[0, slot] < 7].gt(0).all())
    assert not (st.P.any() or st.Q.any() or st.Q_prev.any())


# -- checkpoints over ranks -----------------------------------------------------------------------
#: what a rank's checkpoint holds (the engine's format): its agents' variables, its generators,
#: counters and the shared bookkeeping; nothing else (no key, mask seed or private value of an exchange)
BODY_KEYS = {"format", "model", "done", "settings", "inputs", "state", "rng", "history", "ledgers", "extra", "hashes"}
STATE_KEYS = {"Xc", "U", "P", "Q", "Q_prev", "V", "g", "lam"}


def _iterations(folder):
    return [checkpoint_iteration(f) for f in checkpoint_files(folder)]


def _latest(folder):
    return checkpoint_files(folder)[-1]


def _check_body(path, agents, n=24, r=3):
    """A rank's checkpoint: the known keys only, its own agents' slots only."""
    body = torch.load(path, weights_only=True)
    settings = body["settings"]
    assert set(body) == BODY_KEYS and body["model"] == "symnmf_agents"
    assert [a for a, o in enumerate(settings["owner"]) if o == settings["process"]] == agents
    assert set(body["state"]) - {"mu"} == STATE_KEYS
    assert body["state"]["Xc"].shape == (len(agents), n, r) and body["state"]["V"].shape[0] == len(agents)
    assert set(body["ledgers"]) == {"exchange"} and set(body["extra"]["model"]) == {"plain_bytes"}
    return body


@pytest.mark.parametrize("kw,stop", [(dict(), 3), (dict(exchange="quantized", exchange_options={"n_max": 1e4},
                                                        penalty=0.5, mu=1.0), 2),
                                     (dict(X="torch", penalty_schedule="paper", checkpoint_every=2, exchange="plain"),
                                      3)])
def test_one_rank_resumes_bit_for_bit(solo, tmp_path, kw, stop):
    kw = dict(kw)
    X = _sparse_similarity(kw.pop("X")) if "X" in kw else _similarity()
    every = kw.pop("checkpoint_every", 1)
    ref = fit_symnmf_agents(X, 3, device="cpu", **_kwargs(max_iter=5, **kw))
    first = fit_symnmf_rank(solo, X, 3, checkpoint_dir=tmp_path, checkpoint_every=every, **_kwargs(max_iter=stop, **kw))
    assert first.result.n_iter == stop
    assert _iterations(tmp_path / "rank000")[-1] == stop
    _check_body(_latest(tmp_path / "rank000"), list(range(5)))
    assert json.loads((tmp_path / "partition.json").read_text())["world_size"] == 1
    got = fit_symnmf_rank(solo, X, 3, checkpoint_dir=tmp_path, checkpoint_every=every, resume=True,
                          **_kwargs(max_iter=5, **kw))
    _assert_same(ref, got.result)
    assert _iterations(tmp_path / "rank000")[-1] == 5


def test_resume_from_an_empty_folder_starts_afresh(solo, tmp_path):
    X = _similarity()
    ref = fit_symnmf_rank(solo, X, 3, **_kwargs(max_iter=2))
    got = fit_symnmf_rank(solo, X, 3, checkpoint_dir=tmp_path / "new", resume=True, **_kwargs(max_iter=2))
    _assert_same(ref.result, got.result)


@pytest.mark.parametrize("change,match", [(dict(seed=2), "different run"), (dict(lam0=0.2), "different run"),
                                          ("world", "2 ranks with the owners .* this run has 1 ranks"),
                                          ("damaged", r"hash .*\(on rank 0\)$")])
def test_another_runs_checkpoints_are_refused(solo, tmp_path, change, match):
    X = _similarity()
    fit_symnmf_rank(solo, X, 3, checkpoint_dir=tmp_path, **_kwargs(max_iter=2))
    kw = _kwargs(max_iter=3)
    if change == "world":
        (tmp_path / "partition.json").write_text(json.dumps({"world_size": 2, "owner": [0, 1, 0, 1, 0]}))
    elif change == "damaged":
        body = torch.load(_latest(tmp_path / "rank000"), weights_only=True)
        body["state"]["V"][0, 0, 0] += 1.0
        torch.save(body, _latest(tmp_path / "rank000"))
    else:
        kw.update(change)
    with pytest.raises(CheckpointError, match=match):
        fit_symnmf_rank(solo, X, 3, checkpoint_dir=tmp_path, resume=True, **kw)


# -- spawned ranks --------------------------------------------------------------------------------
def test_two_ranks_give_the_single_process_bits(tmp_path):
    X = _similarity()
    ref = fit_symnmf_agents(X, 3, device="cpu", **_kwargs())
    got = fit_symnmf_distributed(X, 3, world_size=2, timeout=240, checkpoint_dir=str(tmp_path), checkpoint_every=3,
                                 **_kwargs())
    _assert_same(ref, got)
    owner = json.loads((tmp_path / "partition.json").read_text())["owner"]
    for q in range(2):  # each rank writes its own agents' state only (at 3, and at the end)
        assert _iterations(tmp_path / f"rank{q:03d}") == [3, 4]
        agents = [i for i, o in enumerate(owner) if o == q]
        body = _check_body(_latest(tmp_path / f"rank{q:03d}"), agents)
        assert 0 < len(agents) < 5 and body["done"] == 4


def _rank_resumes(X, folders, cases):
    """Runs under one process group, each ``(kwargs, resume)`` in its folder; a checkpoint error is
    returned as its message (module level: the spawned ranks import it)."""
    with Comm.connect("env://", timeout=120) as comm:
        out = []
        for folder, (kw, resume) in zip(folders, cases):
            try:
                r = fit_symnmf_rank(comm, X, 3, checkpoint_dir=folder, resume=resume, **kw)
                out.append((r.result, r.partition.agents(comm.rank)))
            except CheckpointError as exc:
                out.append(str(exc))
        return out


@pytest.mark.slow
def test_two_ranks_interrupted_and_resumed_equal_one_run(tmp_path):
    X = _similarity()
    ref = fit_symnmf_agents(X, 3, device="cpu", **_kwargs(max_iter=5))
    secure = dict(exchange="paillier", exchange_options={"n_max": 1e4, "key_bits": 128}, aggregation="plain",
                  x_iters=2)
    quantized = dict(secure, exchange="quantized", exchange_options={"n_max": 1e4})
    cases = [(_kwargs(max_iter=5, checkpoint_every=0), False), (_kwargs(max_iter=2, checkpoint_every=1), False),
             (_kwargs(max_iter=5, checkpoint_every=1), True),
             (_kwargs(max_iter=6, assignment=[1, 1, 1, 0, 0], partition="block"), True),
             (_kwargs(max_iter=3, **secure), False), (_kwargs(max_iter=1, **secure), False),
             (_kwargs(max_iter=3, **secure), True),  # new keys, the same numbers
             (_kwargs(max_iter=1, **quantized), False), (_kwargs(max_iter=3, **secure), True)]
    folders = [str(tmp_path / name) for name in ("whole", "parts", "parts", "parts", "pw", "pp", "pp", "qp", "qp")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 128-bit keys
        outs = launch_local(2, _rank_resumes, (X, folders, cases), timeout=400, grace=60)
    assert all(o.error is None and o.exitcode == 0 for o in outs), [o.error for o in outs]
    (whole, _), (first, _), (resumed, _), moved = outs[0].value[:4]
    assert first.n_iter == 2 and resumed.n_iter == 5
    _assert_same(ref, whole)
    _assert_same(whole, resumed)
    _assert_same(ref, resumed)
    assert "same world size and partition" in moved and "same world size and partition" in outs[1].value[3]
    for q in range(2):
        agents = outs[q].value[2][1]
        assert _iterations(tmp_path / "parts" / f"rank{q:03d}") == [4, 5]  # the newest two kept
        assert 0 < len(agents) < 5
        _check_body(tmp_path / "parts" / f"rank{q:03d}" / "ckpt_bcd000005.pt", agents)
        costs = _check_body(_latest(tmp_path / "pp" / f"rank{q:03d}"), agents)["ledgers"]["exchange"]
        assert all(isinstance(v, (int, float)) for part in costs.values() for v in part.values())
    (pw, _), (pp, _), (qp, _) = (outs[0].value[i] for i in (4, 6, 8))
    _assert_same(pw, pp)  # the bytes and the operations too: the counters continue
    assert pp.costs["encryptions"] == pw.costs["encryptions"] > 0
    _assert_same(pw, qp, same_bytes=False)  # a quantized run resumed as paillier: the same numbers


def _rank_fits(cases):
    """Several runs under one process group (module level: the spawned ranks import it)."""
    with Comm.connect("env://", timeout=120) as comm:
        out = []
        for X, kw in cases:
            r = fit_symnmf_rank(comm, X, 3, **kw)
            out.append((r.result, dict(comm.sent)))
        return out


def _spawn(P, cases):
    outs = launch_local(P, _rank_fits, (cases,), timeout=400, grace=60)
    assert all(o.error is None and o.exitcode == 0 for o in outs), [o.error for o in outs]
    return outs[0].value


def _stop_at_2(k, metrics):
    return k == 2


@pytest.mark.slow
def test_three_ranks_every_exchange_and_stopping_rule():
    X = _similarity(n=30)
    cases = [_kwargs(n_agents=7, exchange="quantized", exchange_options={"n_max": 1e4}, aggregation="plain"),
             _kwargs(n_agents=7, exchange="quantized", exchange_options={"n_max": 1e4, "protocol": "masked",
                                                                          "cost_model": FAKE_COSTS}, penalty=0.3),
             _kwargs(n_agents=7, exchange="paillier", exchange_options={"n_max": 1e4, "key_bits": 128}, max_iter=2,
                     x_iters=2, aggregation="plain"),
             _kwargs(n_agents=7, tol=1e-2, max_iter=60, mu=1.0),
             _kwargs(n_agents=7, callback=_stop_at_2, assignment=[0, 1, 2, 0, 1, 2, 0], partition="block"),
             _kwargs(n_agents=7, share="sums"), _kwargs(n_agents=7, penalty_schedule="paper", exchange="plain"), _kwargs(n_agents=7)]
    Xs = [X] * (len(cases) - 1) + [(X * (X > X.median())).to_sparse_csr()]  # the last: a torch sparse X
    got = _spawn(3, list(zip(Xs, cases)))
    for X, kw, (res, sent) in zip(Xs, cases, got):
        kw = dict(kw)
        kw.pop("assignment", None), kw.pop("partition", None)
        share = kw.pop("share", "all")
        paillier = kw.get("exchange") == "paillier"
        if paillier:  # the integer sums are exact: paillier's numbers are quantized's (its bytes: ciphertexts)
            kw["exchange"] = "quantized"
        if kw.get("callback") is not None:
            kw["callback"] = _stop_at_2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = fit_symnmf_agents(X, 3, device="cpu", **kw)
        _assert_same(ref, res, bits=share == "all", same_bytes=not paillier)
        assert sent.get("halo", 0) + sent.get("crypto", 0) > 0
    assert np.diff(got[2][0].history["bytes"]).min() > 0 and got[2][0].history["bytes"][0] > 0  # ciphertexts
    assert got[3][0].converged and got[3][0].n_iter < 60 and got[4][0].n_iter == 2
    assert got[1][0].costs["encryptions"] > 0 and got[1][0].costs == fit_symnmf_agents(
        Xs[1], 3, device="cpu", **cases[1]).costs


def _fail_on_rank_1(k, metrics):
    if os.environ.get("RANK") == "1" and k == 2:
        raise RuntimeError("injected failure")


@pytest.mark.slow
def test_a_failed_rank_stops_the_run_and_is_named():
    with pytest.raises(DistributedError, match="rank 1 failed.*injected failure"):
        fit_symnmf_distributed(_similarity(), 3, world_size=2, timeout=240, comm_timeout=60,
                               **_kwargs(callback=_fail_on_rank_1))
