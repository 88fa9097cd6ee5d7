"""Agents over torch.distributed ranks (ppdnmf_torch.distributed): partitions, rank layouts,
and spawned gloo process groups on 127.0.0.1 that give the single-process bits.

The default run has the unit tests, a world of one rank in this process and one spawned
run of 3 ranks (bit identity, the byte model, the byte scan); the rest is ``slow``.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import Comm, free_port, launch_local, partition_agents
from ppdnmf_torch.distributed.layout import RankLayout, alignment_period
from ppdnmf_torch.models.ppdnmf.distributed import fit_rank
from ppdnmf_torch.distributed.costs import halo_bytes
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange.costmodel import PaillierOpCosts
from ppdnmf_torch.graph import Graph, erdos_renyi, ring

ROOT = Path(__file__).resolve().parents[1]
FAKE_COSTS = PaillierOpCosts(key_bits=128, keygen=1e-3, encryption=1e-4, decryption=2e-4,
                             homomorphic_addition=1e-6, scalar_multiplication=1e-5)
# the paper's settings (fit_rank's defaults when these tests were written; fit's since)
SHORT = dict(pp.PAPER_SETTINGS, bcd_iters=3, x_iters=4, y_iters=3)


def _data(N=9, L=8, K=3, seed=0, p=0.5, graph="er"):
    """``Z (L, M)`` of rank ``K`` plus noise, an Erdos-Renyi graph (or a ring) and uneven columns
    per agent."""
    gen = torch.Generator().manual_seed(seed)
    counts = [int(c) for c in torch.randint(2, 9, (N,), generator=gen)]
    M = sum(counts)
    Z = torch.rand(L, K, generator=gen, dtype=torch.float64) @ torch.rand(K, M, generator=gen, dtype=torch.float64)
    Z = Z + 0.01 * torch.rand(L, M, generator=gen, dtype=torch.float64)
    return Z, (ring(N) if graph == "ring" else erdos_renyi(N, p, seed=seed)), counts


def _fit_kwargs(case):
    kw = dict(SHORT, **case.get("fit", {}))
    if case.get("cost_model"):
        kw["exchange_options"] = {"cost_model": FAKE_COSTS}
    return kw


# -- what every spawned rank runs (module level: the spawned processes import it) ----------
def _rank_fit(case: dict):
    with Comm.connect("env://", timeout=case.get("timeout", 60), heartbeat=case.get("heartbeat", 30),
                      record=case.get("record", False)) as comm:
        Z, G, counts = _data(**case["data"])
        kw = _fit_kwargs(case)

        def cb(info):
            act = case.get("act")
            if act and comm.rank == act[0] and info.iteration == act[1]:
                if act[2] == "raise":
                    raise RuntimeError("injected failure")
                if act[2] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if act[2] == "hang":
                    time.sleep(600)
            return case.get("stop_at") == info.iteration

        secrets = _watch_secrets() if case.get("secrets") else None
        r = fit_rank(comm, Z, G, case["data"].get("K", 3), columns=counts, callback=cb,
                     partition=case.get("partition", "rcm"), assignment=case.get("assignment"),
                     checkpoint_dir=case.get("checkpoint_dir"), checkpoint_every=1, resume=case.get("resume", False),
                     **dict(kw, **({"share": case["share"]} if "share" in case else {})))
        out = {"ranks": r.ranks, "sent": dict(comm.sent), "owner": r.partition.owner}
        if "share" in case:
            out["own"] = r.own
        if case.get("record"):
            out["log"] = comm.sent_log
            out["agents"] = r.partition.agents(comm.rank)
        if secrets is not None:
            out["secrets"] = secrets
        if r.result is not None:
            out.update(X=r.result.X, U=r.result.U, Y=r.result.Y, history=r.result.history, costs=r.result.costs,
                       n_iter=r.result.n_iter, converged=r.result.converged)
        return out


def _watch_secrets() -> dict:
    """In a rank: record the private keys (``p``, ``q``, ``(p - 1)(q - 1)``) and mask seeds it makes, for
    the scan of every rank's traffic (the test's own copy; the library never hands them out)."""
    from ppdnmf_torch.distributed import parties
    from ppdnmf_torch.exchange.paillier import seeds

    found = {"private": [], "public": [], "seeds": []}
    make_key, draw = parties.generate_keypair, seeds._token

    def keypair(bits):
        pk, sk = make_key(bits)
        found["private"] += [int(sk.p), int(sk.q), int((sk.p - 1) * (sk.q - 1))]
        found["public"].append(int(pk.n))
        return pk, sk

    def token(n):
        found["seeds"].append(draw(n))
        return found["seeds"][-1]

    parties.generate_keypair, seeds._token = keypair, token
    return found


def _spawn(P, case, timeout=240):
    outs = launch_local(P, _rank_fit, (case,), timeout=timeout, grace=90)
    return outs


def _reference(case):
    Z, G, counts = _data(**case["data"])
    return pp.fit(Z, G, case["data"].get("K", 3), columns=counts, device="cpu", **dict(pp.PAPER_SETTINGS, **_fit_kwargs(case)))


def _assert_same(out, ref):
    assert (out.get("n_iter", ref.n_iter), out.get("converged", ref.converged)) == (ref.n_iter, ref.converged)
    assert torch.equal(out["X"], ref.X) and torch.equal(out["U"], ref.U)
    assert len(out["Y"]) == len(ref.Y) and all(torch.equal(a, b) for a, b in zip(out["Y"], ref.Y))
    keys = [k for k in ref.history if "time" not in k and "seconds" not in k]
    assert sorted(keys) == sorted(k for k in out["history"] if "time" not in k and "seconds" not in k)
    for k in keys:
        assert out["history"][k] == ref.history[k], k
    for k, v in ref.costs.items():
        if "seconds" not in k and "time" not in k:
            assert out["costs"][k] == v, k


def _holds(blob: bytes, needle: bytes) -> bool:
    return len(needle) >= 16 and needle in blob


def _data_pieces(case, agents):
    """Every row and every column of the agents' data blocks, as bytes (float64)."""
    Z, G, counts = _data(**case["data"])
    blocks = torch.split(Z, counts, dim=1)
    out = []
    for i in agents:
        b = blocks[i].contiguous()
        out += [r.numpy().tobytes() for r in b] + [c.contiguous().numpy().tobytes() for c in b.T]
    return out


# -- partitions ------------------------------------------------------------------------
def _brute_cut(graph, owner):
    return sum(1 for i, j in graph.edges if owner[i] != owner[j])


@pytest.mark.parametrize("method", ["rcm", "block"])
@pytest.mark.parametrize("P", [1, 2, 3, 5])
def test_partition_methods_balance_and_count_the_cut(method, P):
    g = erdos_renyi(23, 0.2, seed=4)
    part = partition_agents(g, P, method)
    assert sorted(set(part.owner)) == list(range(P))
    assert max(part.counts()) - min(part.counts()) <= 1
    assert part.cut_edges == _brute_cut(g, part.owner)
    assert sorted(sum((part.agents(r) for r in range(P)), [])) == list(range(23))


def test_rcm_keeps_neighbours_together():
    # a ring numbered at random: consecutive blocks of ids cut it everywhere; RCM walks the ring
    # both ways from its start, so each piece is at most two arcs
    n, P = 40, 4
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    g = Graph(n, [(perm[k], perm[(k + 1) % n]) for k in range(n)])
    rcm, block = partition_agents(g, P, "rcm"), partition_agents(g, P, "block")
    assert rcm.cut_edges <= 2 * P < block.cut_edges


def test_partition_given_and_errors():
    g = ring(6)
    part = partition_agents(g, 3, assignment=[2, 2, 0, 0, 1, 1])
    assert part.method == "given" and part.owner == (2, 2, 0, 0, 1, 1) and part.cut_edges == 3
    for bad, key in [(dict(world_size=7), "world_size"), (dict(world_size=0), "world_size"),
                     (dict(world_size=3, assignment=[0, 1, 1, 1, 1, 1]), "assignment"),
                     (dict(world_size=2, assignment=[0, 1, 2, 0, 1, 0]), "assignment"),
                     (dict(world_size=2, assignment=[0, 1]), "assignment"),
                     (dict(world_size=2, method="metis"), "partition")]:
        with pytest.raises(ConfigError) as info:
            partition_agents(g, bad.pop("world_size"), **bad)
        assert info.value.key == key


# -- rank layouts ------------------------------------------------------------------------
@pytest.mark.parametrize("L,K,itemsize,p", [(8, 3, 8, 8), (8, 5, 8, 8), (20, 8, 8, 1), (30, 10, 8, 2),
                                             (361, 49, 8, 8), (16, 4, 4, 1), (9, 3, 4, 16)])
def test_alignment_period(L, K, itemsize, p):
    assert alignment_period(L, K, itemsize) == p


@pytest.mark.parametrize("N,P,K", [(7, 2, 3), (13, 3, 5), (30, 5, 3), (12, 3, 8)])
def test_layout_keeps_alignment_and_halo_lists_match(N, P, K):
    g = erdos_renyi(N, 0.3, seed=N)
    part = partition_agents(g, P, "rcm")
    lays = [RankLayout.build(part, g, r, L=8, K=K, itemsize=8) for r in range(P)]
    edges = []
    for lay in lays:
        p = lay.period
        assert torch.equal(lay.slots % p, lay.agents % p)  # an agent's blocks keep their alignment
        assert (lay.n_slots - N) % p == 0 and lay.slots.unique().numel() == lay.n_own
        assert lay.dummy_slots.numel() == lay.n_slots - lay.n_own
        assert torch.equal(lay.ext_nodes, lay.ext_nodes.sort().values)  # CSR rows in global column order
        edges += lay.edge_ids.tolist()
        assert (g.src[lay.edge_ids] == lay.agents[torch.searchsorted(lay.agents, g.src[lay.edge_ids])]).all()
    assert sorted(edges) == list(range(g.src.numel()))  # every directed edge drawn by one rank
    for r, s in itertools.permutations(range(P), 2):
        a, b = lays[r], lays[s]
        if s not in a.peers:
            assert r not in b.peers
            continue
        # what r sends s is what s expects from r, in the same order
        slot_to_agent = dict(zip(a.slots.tolist(), a.agents.tolist()))
        sent = [slot_to_agent[x] for x in a.send_rows[s].tolist()]
        assert sent == b.ext_nodes[b.recv_nodes[r]].tolist()
        assert a.edge_ids[a.send_edges[s]].tolist() == b.ext_edge_ids[b.recv_edges[r]].tolist()


def test_halo_byte_model_counts_boundary_rows_and_cut_edges():
    g = ring(6)
    part = partition_agents(g, 2, assignment=[0, 0, 0, 1, 1, 1])
    lay = RankLayout.build(part, g, 0, L=4, K=2, itemsize=8)
    # agents 0 and 2 border rank 1 (edges 0-5 and 2-3): two rows of L K values, two penalties
    assert halo_bytes(lay, 8, 8) == {"halo": 2 * 8 * 8, "penalty": 2 * 8}


# -- one rank in this process ------------------------------------------------------------------
@pytest.fixture(scope="module")
def solo():
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    yield comm
    comm.close()


def test_one_rank_gives_the_single_process_bits(solo):
    case = {"data": dict(N=6, K=3), "fit": {"exchange": "quantized"}, "cost_model": True}
    Z, G, counts = _data(**case["data"])
    r = fit_rank(solo, Z, G, 3, columns=counts, **_fit_kwargs(case))
    out = dict(X=r.result.X, U=r.result.U, Y=r.result.Y, history=r.result.history, costs=r.result.costs)
    _assert_same(out, _reference(case))
    assert r.partition.world_size == 1 and r.ranks[0]["peers"] == []


@pytest.mark.parametrize("kw,key", [(dict(exchange="paillier", key_bits=128, exchange_options={"fast": False}),
                                     "exchange"),
                                    (dict(exchange="paillier", key_bits=128,
                                          exchange_options={"record_transcript": True}), "exchange")])
def test_unsupported_settings_are_refused(solo, kw, key):
    Z, G, counts = _data(N=4)
    with pytest.raises(ConfigError) as info:
        fit_rank(solo, Z, G, 2, columns=counts, **dict(SHORT, **kw))
    assert info.value.key == key


def test_paillier_keys_handed_in_are_checked_and_not_kept_in_the_spec(solo, paillier_keypairs):
    from ppdnmf_torch.distributed.secure import _own_keypairs

    pairs = paillier_keypairs(128, 4)
    Z, G, counts = _data(N=4)
    for keys, why in [(pairs[:3], "3 key pairs for 4 agents"), ([pairs[0]] * 4, "duplicates")]:
        with pytest.raises(ConfigError, match=why):
            fit_rank(solo, Z, G, 2, columns=counts, exchange="paillier", key_bits=128,
                     exchange_options={"keypairs": keys}, **SHORT)
    mine = _own_keypairs(pairs, [1, 3], 4, 128)
    assert sorted(mine) == [1, 3] and mine[3] is pairs[3]
    from ppdnmf_torch.distributed.secure import SecureHalo
    from ppdnmf_torch.exchange import exchange_spec

    part = partition_agents(G, 1, "rcm")
    exch = SecureHalo(exchange_spec("paillier", key_bits=128, options={"keypairs": pairs}),
                      RankLayout.build(part, G, 0, L=8, K=2, itemsize=8), solo, G, part.owner, torch.full((4,), 0.033))
    assert exch.spec.keypairs is None and sorted(exch._own_keys) == [0, 1, 2, 3]
    exch.close()
    assert exch._own_keys is None


# -- spawned ranks -------------------------------------------------------------------------
def test_three_ranks_same_bits_bytes_as_modelled_and_no_data_crosses():
    """3 gloo ranks, quantized with the cost model, a cut edge between every pair of ranks in
    both directions: the single-process bits (factors, every history key, the costs), the halo
    bytes per ADMM iteration as the layout predicts, and no row or column of a data block in
    anything a rank sends."""
    case = {"data": dict(N=9, K=3), "fit": {"exchange": "quantized"}, "cost_model": True, "record": True}
    outs = _spawn(3, case)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    _assert_same(outs[0].value, _reference(case))
    ranks = outs[0].value["ranks"]
    assert all(sorted(r["peers"]) == sorted(set(range(3)) - {r["rank"]}) for r in ranks)
    for r in ranks:
        n = r["admm_iterations"]
        assert n == SHORT["bcd_iters"] * SHORT["x_iters"]
        assert r["sent"]["halo"] == n * r["model_per_admm_iteration"]["halo"] > 0
        assert r["sent"]["penalty"] == n * r["model_per_admm_iteration"]["penalty"] > 0
    for o in outs:
        pieces = _data_pieces(case, o.value["agents"])
        blob = b"".join(msg for _, _, msg in o.value["log"])
        assert blob and not any(_holds(blob, piece) for piece in pieces)
        assert _holds(blob + pieces[0], pieces[0])  # the scan finds a block where there is one


def _be(v: int) -> bytes:
    return int(v).to_bytes((int(v).bit_length() + 7) // 8, "big")


def _paillier_case(protocol, N=9, **extra):
    return dict({"data": dict(N=N, K=3), "fit": {"exchange": "paillier", "key_bits": 128, "protocol": protocol}},
                **extra)


def _assert_paillier_same(out, case):
    ref = _reference(case)
    _assert_same(out, ref)  # every count key too (the time keys differ by nature)
    # the host path's switches change no number: quantized takes none of them
    fit = {k: v for k, v in case["fit"].items() if k != "exchange_options"}
    quantized = _reference(dict(case, fit=dict(fit, exchange="quantized")))
    assert torch.equal(out["X"], quantized.X) and all(torch.equal(a, b) for a, b in zip(out["Y"], quantized.Y))


def test_paillier_masked_on_three_ranks_same_bits_model_bytes_and_no_secret_crosses():
    """3 gloo ranks, the masked protocol with real (128-bit) keys and a cut edge between every
    pair of ranks: the single-process paillier bits and counts (and the quantized bits), the
    bytes each rank sends for the rounds equal to the cost model's bytes of its cut edges,
    and no private key (p, q, lambda), mask seed or data block in any byte any rank sends."""
    case = _paillier_case("masked", record=True, secrets=True)
    outs = _spawn(3, case)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    _assert_paillier_same(outs[0].value, case)
    for r in outs[0].value["ranks"]:
        assert r["sent"]["crypto"] == r["admm_iterations"] * r["model_per_admm_iteration"]["crypto"] > 0
        assert "halo" not in r["sent"] and "penalty" not in r["sent"]  # no value, no penalty in the clear
    blob = b"".join(msg for o in outs for _, _, msg in o.value["log"])
    secrets = [o.value["secrets"] for o in outs]
    private = [_be(v) for s in secrets for v in s["private"]] + [x for s in secrets for x in s["seeds"]]
    assert len(private) == 3 * 9 + sum(len(s["seeds"]) for s in secrets) and all(len(x) >= 8 for x in private)
    assert not any(x in blob for x in private)
    # the scan finds what does cross: every agent's public key, in the same encoding
    assert all(_be(n) in blob for s in secrets for n in s["public"])
    for o in outs:
        assert not any(_holds(blob, piece) for piece in _data_pieces(case, o.value["agents"]))


@pytest.mark.parametrize("protocol", [pytest.param("aggregated", marks=pytest.mark.slow), "paper"])
def test_paillier_on_two_ranks_same_bits(protocol):
    case = _paillier_case(protocol, N=7)
    outs = _spawn(2, case)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    _assert_paillier_same(outs[0].value, case)
    for r in outs[0].value["ranks"]:
        assert r["sent"]["crypto"] == r["admm_iterations"] * r["model_per_admm_iteration"]["crypto"] > 0
        # the paper protocol's rho_i is handed over by the simulation: its penalties cross in the clear
        assert ("penalty" in r["sent"]) == (protocol == "paper")


# -- the solver's settings across ranks --------------------------------------------------
def _loop_hops(lengths, cap: int) -> int:
    """Flag hops of the tracked loops of these lengths: one after every iteration but a loop's
    last at the cap (a loop that stops early decided so after its last iteration)."""
    return sum(n if n < cap else cap - 1 for n in lengths)


def _assert_flag_bytes(out, fit: dict):
    """Every rank's ``flags`` bytes are the model's (:func:`~ppdnmf_torch.distributed.costs.flag_bytes`):
    one hop and one decision per iteration of a tracked ADMM loop, and the BCD-level rule's decision."""
    h = out["history"]
    n_bcd = len(h["nmse"])
    x_len = [int(torch.as_tensor(v).max()) for v in h["x_iters"]]
    y_len = [int(torch.as_tensor(v).max()) for v in h["y_iters"]]
    for r in out["ranks"]:
        model = r["model_per_admm_iteration"]
        # one hop (a byte per boundary agent and peer) + 8 per tracked iteration; the X-step and the
        # BCD loop add the stop agreed over the ranks (two int64 per decision)
        y_bytes = _loop_hops(y_len, fit["y_iters"]) * model["flags"]
        x_bytes = _loop_hops(x_len, fit["x_iters"]) * model["flags_x"]
        bcd = (n_bcd - 1) * 16 if fit.get("tol", 0) > 0 else 0  # the BCD rule's flags do not travel
        assert model["flags_x"] == model["flags"] + 16 and r["sent"]["flags"] == x_bytes + y_bytes + bcd
        assert r["admm_iterations"] == sum(x_len)
        assert r["sent"]["halo"] == r["admm_iterations"] * r["model_per_admm_iteration"]["halo"] > 0


def test_hals_y_step_on_two_ranks_same_bits():
    """y_solver=hals is per agent (no message): the single-process bits, and its unscaled
    Y-step residual in the history."""
    case = {"data": dict(N=7, K=3), "fit": {"exchange": "plain", "y_solver": "hals"}}
    outs = _spawn(2, case)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    _assert_same(outs[0].value, _reference(case))
    assert "flags" not in outs[0].value["sent"]


@pytest.mark.slow  # the default schedule's two-rank run is tests/test_schedule_agreed.py's
def test_adaptive_schedule_on_two_ranks_same_bits():
    """penalty_schedule=adaptive: each agent's cap and mu_i adapt from what it holds (its whole
    degree, its S_i and rho_i), so the caps, the draws and the mu_i-weighted residuals give the
    single-process bits; the schedule did act (the run differs from the paper schedule's)."""
    case = {"data": dict(N=8, K=3), "fit": {"exchange": "quantized", "penalty_schedule": "adaptive", "bcd_iters": 4},
            "cost_model": True}
    outs = _spawn(2, case)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    ref = _reference(case)
    _assert_same(outs[0].value, ref)
    paper = _reference(dict(case, fit=dict(case["fit"], penalty_schedule="paper")))
    assert not torch.equal(ref.X, paper.X)


def test_stopping_rule_on_two_ranks_same_iterations_and_flag_bytes():
    """tol and admm_tol: the X-step and the BCD loop stop network-wide (every agent at once), the
    Y-step's agents at different ADMM iterations (its flags cross every cut edge); every rank stops
    where one process does (the same counts, the same converged iteration), with the flag bytes as
    modelled."""
    # the adaptive schedule: under the paper's caps the copies still disagree by 10 % after 10
    # iterations, and the BCD rule waits for every agent's own test (its flags do not travel)
    fit = dict(SHORT, exchange="quantized", tol=1e-1, admm_tol=1e-3, bcd_iters=10, penalty_schedule="adaptive")
    case = {"data": dict(N=9, K=3), "fit": fit, "cost_model": True}
    outs = _spawn(2, case)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    ref = _reference(case)
    assert ref.converged and ref.n_iter < fit["bcd_iters"]
    counts = [torch.as_tensor(v).flatten().tolist() for v in ref.history["x_iters"]]
    assert all(len(set(c)) == 1 for c in counts)  # the X-step's agents stop together: no lone neighbour moves
    assert any(max(c) < fit["x_iters"] for c in counts)  # loops that every agent left early
    y_counts = [torch.as_tensor(v).flatten().tolist() for v in ref.history["y_iters"]]
    assert any(len(set(c)) > 1 for c in y_counts)  # the Y-step's agents stop one by one (no exchange)
    _assert_same(outs[0].value, ref)
    _assert_flag_bytes(outs[0].value, fit)


SOLVER_CASES = [
    (2, 12, 5, {"exchange": "quantized", "y_solver": "hals", "penalty_schedule": "adaptive", "bcd_iters": 5}),
    # both levels of the rule (written when admm_tol defaulted to tol; fit's and fit_rank's default is
    # now 0.0, the ADMM loops at fixed counts, which the paillier case below runs)
    (3, 23, 3, {"exchange": "plain", "tol": 1e-3, "admm_tol": 1e-3, "penalty_schedule": "adaptive",
                "bcd_iters": 30}),
    (3, 10, 5, {"exchange": "plain", "y_solver": "hals", "tol": 1e-3, "admm_tol": 1e-2, "init": "random",
                "bcd_iters": 30, "x_iters": 12, "y_iters": 12}),
    (2, 13, 4, {"exchange": "quantized", "protocol": "masked", "tol": 2e-3, "admm_tol": 1e-2,
                "penalty_schedule": "adaptive", "bcd_iters": 20, "x_iters": 10}),
    (2, 8, 3, {"exchange": "paillier", "key_bits": 128, "penalty_schedule": "adaptive", "tol": 3e-3,
               "bcd_iters": 12}),
    (3, 9, 3, {"exchange": "paillier", "key_bits": 128, "protocol": "aggregated", "y_solver": "hals",
               "admm_tol": 1e-2, "x_iters": 10, "y_iters": 10}),
]


@pytest.mark.slow
@pytest.mark.parametrize("P,N,K,fit", SOLVER_CASES)
def test_solver_settings_same_bits_across_ranks_sizes_and_kinds(P, N, K, fit):
    case = {"data": dict(N=N, K=K, p=0.35), "fit": fit}
    outs = _spawn(P, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_same(outs[0].value, _reference(case))
    if fit.get("tol", 0) > 0 or fit.get("admm_tol", 0) > 0:
        assert "flags" in outs[0].value["sent"]
        if fit["exchange"] != "paillier":
            _assert_flag_bytes(outs[0].value, dict(SHORT, **fit))


@pytest.mark.slow
def test_stopping_rule_resume_with_raised_flags_is_bit_for_bit(tmp_path):
    """A run stopped (callback) after a BCD iteration at which some agents' flags are up and others'
    not (BCD-level rule, agreed network-wide) resumes from its checkpoints, flags included, into the
    uninterrupted run's bits."""
    # the rule asks for agreement too (delta_i < tol): tol=1e-3 no longer stops within 30 iterations
    fit = {"exchange": "plain", "tol": 1e-2, "admm_tol": 0.0, "penalty_schedule": "adaptive", "bcd_iters": 40}
    full = {"data": dict(N=7, K=3), "fit": fit}
    Z, G, counts = _data(**full["data"])
    raised = []
    ref = pp.fit(Z, G, 3, columns=counts, device="cpu", **dict(pp.PAPER_SETTINGS, **_fit_kwargs(full)),
                 callback=lambda info: raised.append(0 if info.state.stop_flags is None
                                                     else int(info.state.stop_flags.sum())))
    partial = [k + 1 for k, n in enumerate(raised) if 0 < n < 7]  # BCD iterations after which some agents have the flag
    assert ref.converged and partial and partial[0] < ref.n_iter
    case = dict(full, checkpoint_dir=str(tmp_path / "ck"), stop_at=partial[0])
    outs = _spawn(2, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    outs = _spawn(2, dict(case, stop_at=None, resume=True))
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_same(outs[0].value, ref)


@pytest.mark.slow
@pytest.mark.parametrize("P,N,protocol", [(2, 12, "masked"), (3, 11, "aggregated"), (3, 10, "paper"),
                                          (2, 5, "masked"), (3, 13, "masked")])
def test_paillier_same_bits_across_ranks_and_protocols(P, N, protocol):
    case = _paillier_case(protocol, N=N)
    case["data"]["p"] = 0.4
    outs = _spawn(P, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_paillier_same(outs[0].value, case)


@pytest.mark.slow
@pytest.mark.parametrize("protocol,options,graph", [
    ("masked", {"precompute": False}, "er"), ("aggregated", {"precompute": False}, "ring"),
    ("masked", {"djn": True}, "ring"), ("paper", {"djn": True}, "er"), ("masked", {"packing": False}, "er"),
    ("masked", {"workers": 2}, "er"), ("aggregated", {"workers": 2}, "ring")])
def test_paillier_host_path_options_across_ranks(protocol, options, graph):
    case = _paillier_case(protocol, N=8)
    case["data"]["graph"] = graph
    case["fit"]["exchange_options"] = options
    outs = _spawn(3 if graph == "ring" else 2, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_paillier_same(outs[0].value, case)


@pytest.mark.slow
def test_paillier_resume_and_a_killed_rank(tmp_path):
    full = _paillier_case("masked", N=8)
    full["fit"]["bcd_iters"] = 4
    case = dict(full, checkpoint_dir=str(tmp_path / "ck"), stop_at=2)
    outs = _spawn(2, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    outs = _spawn(2, dict(case, stop_at=None, resume=True))
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    ref = _reference(full)
    out = outs[0].value
    assert torch.equal(out["X"], ref.X) and all(torch.equal(a, b) for a, b in zip(out["Y"], ref.Y))
    assert all(out["history"][k] == v for k, v in ref.history.items() if "time" not in k and "setup" not in k)
    dead = dict(full, act=(1, 2, "kill"), timeout=20, heartbeat=10)
    outs = _spawn(2, dead, timeout=200)
    assert outs[0].error is not None and "rank 1 died" in outs[0].error, outs[0].error


@pytest.mark.slow
@pytest.mark.parametrize("P,N,K,kind", [(2, 5, 3, "plain"), (2, 12, 5, "quantized"), (3, 23, 5, "plain"),
                                         (3, 12, 3, "quantized"), (2, 23, 3, "plain"), (3, 7, 5, "plain")])
def test_same_bits_across_ranks_sizes_and_kinds(P, N, K, kind):
    case = {"data": dict(N=N, K=K, p=0.3), "fit": {"exchange": kind}}
    outs = _spawn(P, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_same(outs[0].value, _reference(case))


@pytest.mark.slow
def test_plain_two_ranks_given_assignment_and_options():
    case = {"data": dict(N=8, K=3), "assignment": [1, 0, 1, 0, 1, 0, 1, 0],
            "fit": {"exchange": "plain", "penalty": "fixed", "consensus_form": "paper_literal"}}
    outs = _spawn(2, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    assert outs[0].value["owner"] == tuple(case["assignment"])
    _assert_same(outs[0].value, _reference(case))


@pytest.mark.slow
@pytest.mark.parametrize("act", ["raise", "kill", "hang"])
def test_a_failing_rank_stops_every_rank_with_a_clear_error(act):
    case = {"data": dict(N=9, K=3), "fit": {"bcd_iters": 40, "exchange": "quantized"}, "act": (1, 2, act),
            "timeout": 20, "heartbeat": 10}  # the paper's per-edge weights: an exchange that takes them
    t0 = time.monotonic()
    outs = _spawn(3, case, timeout=200)
    assert time.monotonic() - t0 < 150
    assert all(o.exitcode not in (0, None) for o in outs), [(o.exitcode, o.error) for o in outs]
    if act == "raise":
        assert outs[1].error == "RuntimeError: injected failure"
    for o in (outs[0], outs[2]):
        assert o.error is not None and o.error.startswith("DistributedError") and f"rank {o.rank}" in o.error
        if act == "raise":
            assert "rank 1 failed: RuntimeError: injected failure" in o.error
        elif act == "kill":
            assert "rank 1 died" in o.error
    if act == "hang":  # the hung rank is ended by its watchdog once the others are gone
        assert outs[1].exitcode == 3


@pytest.mark.slow
def test_resume_on_the_same_ranks_is_bit_for_bit(tmp_path):
    # aggregated: a resumed masked run agrees on new seeds and counts that setup again (as in
    # one process), so its crypto_setup_* keys differ from an uninterrupted run's by design
    full = {"data": dict(N=10, K=3), "fit": {"exchange": "quantized", "protocol": "aggregated", "bcd_iters": 5},
            "cost_model": True}
    case = dict(full, checkpoint_dir=str(tmp_path / "ck"), stop_at=3)
    outs = _spawn(3, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    assert json.loads((tmp_path / "ck" / "partition.json").read_text())["world_size"] == 3
    # rank 2 lost its newest checkpoint: every rank continues from the newest one all have
    (tmp_path / "ck" / "rank002" / "ckpt_bcd000003.pt").unlink()
    outs = _spawn(3, dict(case, stop_at=None, resume=True))
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    assert outs[0].value["ranks"][0]["admm_iterations"] == 3 * SHORT["x_iters"]
    _assert_same(outs[0].value, _reference(full))
    # another world size is refused, on every rank, with the same reason
    outs = _spawn(2, dict(case, stop_at=None, resume=True))
    assert all("were written by 3 ranks with the owners" in (o.error or "") and "this run has 2 ranks" in (o.error or "")
               for o in outs), [o.error for o in outs]


def _cli(args, cwd, module="ppdnmf_torch.distributed", timeout=300):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


CLI_ARGS = ["solver.bcd_iters=3", "solver.x_iters=4", "solver.y_iters=3", "centralized=false", "n_agents=8",
            "exchange=quantized"]


def _one_and_two(tmp_path, extra):
    """``CLI_ARGS`` in one process (``tmp_path/one``) and over two local ranks with ``extra``
    (``tmp_path/two``, TensorBoard on); returns the two-rank run's completed process."""
    one = _cli(CLI_ARGS + ["logger=none", f"hydra.run.dir={tmp_path / 'one'}"], tmp_path, module="ppdnmf_torch")
    assert one.returncode == 0, one.stderr
    two = _cli(CLI_ARGS + ["logger=tensorboard", "distributed.nproc=2", *extra, f"hydra.run.dir={tmp_path / 'two'}"],
               tmp_path)
    assert two.returncode == 0, two.stderr
    return two


@pytest.mark.slow
def test_cli_app_writes_what_ppdnmf_writes_from_rank_zero(tmp_path):
    _one_and_two(tmp_path, ["distributed.partition=block"])
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    dist = summary["distributed"]
    assert dist["world_size"] == 2 and dist["partition"]["method"] == "block"
    assert dist["partition"]["owner"] == [0, 0, 0, 0, 1, 1, 1, 1]
    a, b = (json.loads((tmp_path / d / "history.json").read_text())["distributed"] for d in ("one", "two"))
    measured = ("time", "seconds")
    assert ({k: v for k, v in a.items() if not any(m in k for m in measured)}
            == {k: v for k, v in b.items() if not any(m in k for m in measured)})
    fa, fb = (torch.load(tmp_path / d / "factors.pt") for d in ("one", "two"))
    assert torch.equal(fa["X"], fb["X"]) and all(torch.equal(x, y) for x, y in zip(fa["Y"], fb["Y"]))
    assert any((tmp_path / "two" / "tb").iterdir())  # TensorBoard on rank 0, in the run folder
    # a finished run removes its ranks' checkpoints and partition.json (keep_checkpoints=false), as one process
    assert not (tmp_path / "one" / "checkpoints").exists() and not (tmp_path / "two" / "checkpoints").exists()


@pytest.mark.slow
def test_cli_app_user_error_exits_2(tmp_path):
    res = _cli(["solver.x_solver=i_admm", "distributed.nproc=2", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path)
    assert res.returncode == 2 and "rank 0: ConfigError: solver.x_solver: a distributed run takes" in res.stderr
    # another folder: the refused run's folder is kept as an unfinished run (the folder guard)
    res = _cli(["distributed.nproc=0", f"hydra.run.dir={tmp_path / 'b'}"], tmp_path)
    assert res.returncode == 2 and "distributed.nproc" in res.stderr


@pytest.mark.slow
def test_submitit_local_sweep_of_distributed_runs(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    res = _cli(["-m", "hydra/launcher=local", "hydra.launcher.tasks_per_node=2", "seed=0,1", "logger=none",
                f"hydra.sweep.dir={tmp_path / 'sweep'}"] + CLI_ARGS, tmp_path, timeout=500)
    assert res.returncode == 0, res.stderr[-2000:]
    for job in ("0", "1"):
        summary = json.loads((tmp_path / "sweep" / job / "summary.json").read_text())
        assert summary["distributed"]["world_size"] == 2


def test_settings_a_distributed_run_does_not_take_are_refused(solo, tmp_path):
    """An exchange object (every rank builds its own) and the incremental X-step (a token that
    walks every agent: one process) stop with the reason; the solver settings of ``fit``
    (the adaptive schedule, HALS, the stopping rule) are all taken."""
    from ppdnmf_torch.models.ppdnmf.config import RunConfig, SolverConfig
    from ppdnmf_torch.app.distributed import run_rank
    from ppdnmf_torch.models.ppdnmf.distributed.engine import _check_supported
    from ppdnmf_torch.exchange import make_exchange
    from ppdnmf_torch.exchange.spec import PlainSpec

    with pytest.raises(pp.ConfigError) as err:
        _check_supported(make_exchange(PlainSpec()))
    assert err.value.key == "exchange" and "every rank" in str(err.value)
    cfg = RunConfig(centralized=False, solver=SolverConfig(x_solver="i_admm"), exchange=PlainSpec())
    cfg.logger.kind = "none"
    with pytest.raises(pp.ConfigError) as err:
        run_rank(cfg, tmp_path, solo)
    assert err.value.key == "solver.x_solver" and "distributed" in str(err.value)


# -- share="sums": no per-agent value leaves its rank ------------------------------------
SUMS_METRICS = ("nmse", "objective", "x_primal", "x_dual", "y_primal", "y_dual")


def test_share_is_validated(solo):
    from ppdnmf_torch.app.distributed import DistConfig

    Z, G, counts = _data(N=4)
    with pytest.raises(ConfigError) as info:
        fit_rank(solo, Z, G, 2, columns=counts, share="none", **SHORT)
    assert info.value.key == "share"
    with pytest.raises(ConfigError) as info:
        DistConfig(share="mean")
    assert info.value.key == "distributed.share"


def _assert_sums_history(h, ref, rel=1e-12):
    """A ``share="sums"`` history against the single-process one: the reduced metrics to ``rel``,
    the ADMM counts' means and maxima exactly, the cost counters exactly; no consensus error,
    no worst-agent NMSE (they need other agents' ``X_i``)."""
    assert "consensus" not in h and "nmse_worst" not in h and "x_iters" not in h and "y_iters" not in h
    n = len(ref.history["nmse"])
    for k in SUMS_METRICS:
        a, b = torch.tensor(h[k], dtype=torch.float64), torch.tensor(ref.history[k], dtype=torch.float64)
        assert a.shape == (n,) and torch.allclose(a, b, rtol=rel, atol=0), k
    for step in ("x_iters", "y_iters"):
        counts = [torch.as_tensor(v, dtype=torch.float64).flatten() for v in ref.history[step]]
        assert h[f"{step}_max"] == [float(c.max()) for c in counts]
        assert h[f"{step}_mean"] == [float(c.sum()) / c.numel() for c in counts]
    for k, v in ref.history.items():
        if k.startswith("crypto_") and "time" not in k and "seconds" not in k:
            assert h[k] == v, k


def _assert_own_factors(own, ref):
    assert own["agents"] == sorted(own["agents"]) and own["columns"] == [ref.columns[i] for i in own["agents"]]
    idx = torch.tensor(own["agents"], dtype=torch.long)
    assert torch.equal(own["X"], ref.X[idx]) and torch.equal(own["U"], ref.U[idx])
    assert all(torch.equal(y, ref.Y[i]) for y, i in zip(own["Y"], own["agents"]))


def test_share_sums_on_one_rank_with_the_stopping_rule_and_the_adaptive_schedule(solo):
    """One rank in this process: the factors are the single-process bits, the reduced metrics
    agree to 1e-12 (the per-agent counts of a stopping rule's loops as means and maxima)."""
    # the BCD rule waits for every agent's own test (its flags do not travel): 14 iterations here
    fit = dict(SHORT, exchange="quantized", tol=3e-2, admm_tol=1e-3, bcd_iters=30, penalty_schedule="adaptive")
    case = {"data": dict(N=6, K=3), "fit": fit, "cost_model": True}
    Z, G, counts = _data(**case["data"])
    r = fit_rank(solo, Z, G, 3, columns=counts, share="sums", **_fit_kwargs(case))
    ref = _reference(case)
    assert r.result.X is None and r.result.U is None and r.result.Y is None and r.result.consensus is None
    assert (r.result.n_iter, r.result.converged) == (ref.n_iter, ref.converged) and ref.converged
    _assert_own_factors(r.own, ref)
    _assert_sums_history(r.result.history, ref)


def _factor_pieces(own):
    """The rows of a rank's agents' final ``X_i``, ``U_i`` and ``Y_i`` as float64 bytes (rows whose
    entries are all equal, zeros say, are left out: they say nothing and match anywhere)."""
    out = []
    for name in ("X", "U", "Y"):
        for block in own[name]:
            out += [r.contiguous().numpy().tobytes() for r in block.to(torch.float64) if not bool((r == r[0]).all())]
    return out


def _scan_factors(outs, case, skip=()):
    """Per rank: how many of its own agents' final factor rows and data rows lie in what it sent
    (the categories in ``skip`` left out)."""
    found = []
    for o in outs:
        blob = b"".join(msg for cat, _, msg in o.value["log"] if cat not in skip)
        pieces = _factor_pieces(o.value["own"])
        assert pieces
        found.append((sum(_holds(blob, p) for p in pieces),
                      sum(_holds(blob, p) for p in _data_pieces(case, o.value["agents"]))))
    return found


SUMS_CASES = [
    pytest.param(3, {"exchange": "plain"}, id="plain-3", marks=pytest.mark.slow),
    pytest.param(2, {"exchange": "paillier", "key_bits": 128, "protocol": "masked"}, id="paillier-masked-2"),
    pytest.param(3, {"exchange": "paillier", "key_bits": 128, "protocol": "masked"}, id="paillier-masked-3",
                 marks=pytest.mark.slow),
    pytest.param(2, {"exchange": "quantized", "tol": 3e-3, "admm_tol": 1e-3, "bcd_iters": 10,
                     "penalty_schedule": "adaptive"}, id="quantized-stopping-adaptive-2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("P,fit", SUMS_CASES)
def test_share_sums_keeps_every_agents_factors_on_its_rank(P, fit):
    """share="sums": (a) each rank's own factors are the single-process bits of its agents, (b)
    the metrics reduced from per-rank sums agree with one process's to 1e-12, (c) no row of
    any agent's final X_i, U_i, Y_i, and no row or column of its data, is in anything its rank
    sends (plain: but for the halo, whose U_i rows are the plain kind's messages)."""
    case = {"data": dict(N=9, K=3), "fit": fit, "record": True, "share": "sums"}
    outs = _spawn(P, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    ref = _reference(case)
    assert sorted(a for o in outs for a in o.value["own"]["agents"]) == list(range(9))
    for o in outs:
        _assert_own_factors(o.value["own"], ref)
    out = outs[0].value
    assert out["X"] is None and out["U"] is None and out["Y"] is None
    assert (out["n_iter"], out["converged"]) == (ref.n_iter, ref.converged)
    _assert_sums_history(out["history"], ref)
    # no output gather (what "output" counts is the ranks' summaries: layouts and byte counts)
    assert not any(cat == "output" for o in outs for cat, _, _ in o.value["log"])
    skip = ("halo",) if fit["exchange"] != "paillier" else ()
    assert _scan_factors(outs, case, skip) == [(0, 0)] * P
    if fit["exchange"] == "plain":  # the plain kind's halo is the boundary agents' U_i rows, as they are
        assert all(n > 0 for n, _ in _scan_factors(outs, case))
    if fit["exchange"] == "paillier":
        assert all("halo" not in o.value["sent"] for o in outs)


def test_share_all_sends_the_factors_the_scan_finds():
    """The positive control of the scan above: with share="all" the ranks but 0 send every
    agent's final factors to rank 0 (the output gather), and the scan finds their rows."""
    case = {"data": dict(N=9, K=3), "fit": {"exchange": "plain"}, "record": True, "share": "all"}
    outs = _spawn(2, case)
    assert all(o.exitcode == 0 for o in outs), [o.error for o in outs]
    _assert_same(outs[0].value, _reference(case))
    found = _scan_factors(outs, case, skip=("halo",))
    n_pieces = len(_factor_pieces(outs[1].value["own"]))
    assert found[1][0] == n_pieces > 0 and found[1][1] == 0


@pytest.mark.slow
def test_cli_share_sums_writes_each_ranks_factors_and_the_reduced_summary(tmp_path):
    two = _one_and_two(tmp_path, ["distributed.share=sums"])
    run = tmp_path / "two"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["distributed"]["share"] == "sums" and summary["consensus"] is None
    assert summary["nmse_worst"] is None and "final NMSE" in two.stdout
    assert not (run / "factors.pt").exists() and any((run / "tb").iterdir())
    ref = torch.load(tmp_path / "one" / "factors.pt")
    agents = []
    for r in (0, 1):
        f = torch.load(run / f"rank{r:03d}" / "factors.pt")
        idx = f["agents"]
        agents += idx.tolist()
        assert int(f["rank"]) == r and f["columns"].tolist() == ref["columns"][idx].tolist()
        assert torch.equal(f["X"], ref["X"][idx]) and torch.equal(f["U"], ref["U"][idx])
        assert all(torch.equal(y, ref["Y"][i]) for y, i in zip(f["Y"], idx.tolist()))
    assert sorted(agents) == list(range(8))
    a, b = (json.loads((tmp_path / d / "history.json").read_text())["distributed"] for d in ("one", "two"))
    assert "consensus" not in b and b["x_iters_max"] == [float(max(c)) for c in a["x_iters"]]
    for k in SUMS_METRICS:
        assert torch.allclose(torch.tensor(b[k]), torch.tensor(a[k]), rtol=1e-12, atol=0), k
    csv = (run / "history.csv").read_text().splitlines()[0].split(",")
    assert "nmse" in csv and "x_iters_mean" in csv and "consensus" not in csv
