"""exchange="secagg": the pairwise-masked secure sum of the agreed schedule (issue 38).

The same integers as ``quantized`` (so the same S, rho and every iterate), its refusals, its
seed agreement, dropouts, costs and the key material it keeps to itself."""
from __future__ import annotations

import copy
import pickle
import warnings

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange import CodecRangeError, IntegerCodec, SecAggSpec, make_exchange
from ppdnmf_torch.exchange.base import Topology
from ppdnmf_torch.exchange.secagg import (DroppedNeighbourError, KeyAgreementError, SecAggExchange, SignedKey,
                                          party as party_mod)
from ppdnmf_torch.exchange.secagg.prg import as_words, counter_blocks, stream_rows

from conftest import CYCLE4, PATH3, PATH4, drive, small_problem

CPU = torch.device("cpu")
G5 = graph.random_connected(5, 2.4, seed=1)
KW = dict(bcd_iters=4, x_iters=4, y_iters=3, device="cpu", seed=4)


def _bound(kind, topo, **kw):
    ex = make_exchange(kind, **kw)
    ex.bind(topo, dtype=torch.float64, device=CPU)
    return ex


def _topo(graphs):
    return Topology.from_graphs(graphs)


@pytest.mark.parametrize("graphs, lk, scale", [
    ([PATH3], 5, 1.0), ([CYCLE4, CYCLE4], 7, 3.0), ([PATH4, CYCLE4], 1, 1.0), ([G5], 64, 20.0),
    ([graph.complete(6), graph.star(6)], 9, 1.0)])
def test_same_integers_as_quantized(graphs, lk, scale):
    # uniform masks mod 2^64 overflow int64 all the time: the sums are exact only if every
    # addition wraps; the integers, hence S and rho, equal quantized's bit for bit
    topo = _topo(graphs)
    q, s = _bound("quantized", topo), _bound("secagg", topo)
    for a, b in zip(*drive([q, s], topo, lk, 6, seed=3, scale=scale, agreed=True)):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and torch.equal(a[2], b[2])
    s.close()


def _fits(kinds, **kw):
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind in kinds:
            out[kind] = pp.fit(small_problem(counts=(3, 4, 2, 5, 3), seed=9), G5, 2, exchange=kind, n_max=1e5,
                               **dict(KW, **kw))
    return out


@pytest.mark.parametrize("extra", [{}, {"tol": 1e-3, "admm_tol": 1e-3}])
def test_fit_is_bit_identical_to_quantized(extra):
    # the default schedule (agreed), with and without the stopping rule (stopped agents keep
    # sending their frozen values, and keep the common draw)
    r = _fits(("quantized", "secagg"), **extra)
    a, b = r["quantized"], r["secagg"]
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    assert a.history["nmse"] == b.history["nmse"] and a.history["x_iters"] == b.history["x_iters"]
    assert b.costs["messages"] > 0 and b.costs["setup_key_agreements"] > 0


def test_fit_trials_is_bit_identical_to_quantized():
    blocks = [small_problem(counts=(3, 4, 2, 5, 3), seed=s) for s in (1, 2)]
    graphs = [G5, graph.ring(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = (pp.fit_trials(blocks, graphs, 2, exchange=k, n_max=1e5, bcd_iters=3, x_iters=3, y_iters=2,
                              device="cpu", seeds=[1, 2]) for k in ("quantized", "secagg"))
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)


@pytest.mark.parametrize("schedule", ["paper", "adaptive"])
def test_per_edge_schedules_are_refused_up_front_in_one_line(schedule):
    with pytest.raises(ConfigError) as err:
        pp.fit(small_problem(), graph.ring(4), 2, exchange="secagg", penalty_schedule=schedule, bcd_iters=1)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("exchange: 'secagg'")
    assert f"penalty_schedule={schedule!r}" in msg
    assert "penalty_schedule='agreed'" in msg and "'paillier'" in msg and "'plain'" in msg


def test_unequal_weights_are_refused_per_call():
    # the guard of every call: per-edge draws (drive without agreed) differ across a receiver's edges
    topo = _topo([CYCLE4])
    ex = _bound("secagg", topo)
    with pytest.raises(ConfigError, match=r"^exchange: 'secagg' .* agent \d \(trial 0\) at BCD iteration 1, "
                                          r"ADMM iteration 1 has unequal weights.*'agreed'"):
        drive([ex], topo, 3, 1, seed=0)
    g = torch.full((topo.n_directed_edges,), 0.5, dtype=torch.float64)
    g[0] = 0.25
    U = torch.rand((4, 3), dtype=torch.float64)
    with pytest.raises(ConfigError, match="unequal weights"):
        ex.exchange(U, g, bcd_iter=2, admm_iter=3)
    with pytest.raises(ConfigError, match="agent 0 .* BCD iteration 2, ADMM iteration 3"):
        ex.penalty_sums(g, bcd_iter=2, admm_iter=3)


def test_refuses_exactly_where_quantized_does():
    topo = _topo([CYCLE4])
    U = torch.full((4, 3), 1e7, dtype=torch.float64)  # q = 1e13, sums of w q beyond 2^62
    g = torch.full((topo.n_directed_edges,), 0.5, dtype=torch.float64)
    errs = []
    for kind in ("quantized", "secagg"):
        with pytest.raises(CodecRangeError) as err:
            _bound(kind, topo).exchange(U, g, bcd_iter=1, admm_iter=1)
        errs.append(str(err.value))
    assert errs[0] == errs[1]


def test_spec_settings():
    assert SecAggSpec().codec() == IntegerCodec(n_max=1e6, g_bits=16)
    for bad, key in ((dict(n_max=0.5), "n_max"), (dict(g_bits=40), "g_bits"), (dict(record_transcript=1),
                                                                               "record_transcript")):
        with pytest.raises(ConfigError, match=f"^{key}: "):
            SecAggSpec(**bad)
    for key in ("key_bits", "protocol", "cost_model"):
        with pytest.raises(ConfigError, match=f"^{key}: does not apply to exchange='secagg'"):
            make_exchange("secagg", **{key: {"key_bits": 2048, "protocol": "masked", "cost_model": True}[key]})


def test_a_dropped_neighbour_ends_the_round_naming_it():
    topo = _topo([G5])
    ex = _bound("secagg", topo)
    U = torch.rand((5, 4), dtype=torch.float64)
    g = torch.full((topo.n_directed_edges,), 0.3, dtype=torch.float64)
    ex.exchange(U, g, bcd_iter=1, admm_iter=1)
    with pytest.raises(DroppedNeighbourError) as err:
        ex.exchange(U, g, bcd_iter=1, admm_iter=2, dropped=[2])
    nbrs = sorted(int(j) for j in topo.dst[topo.src == 2])
    assert err.value.senders == (2,) and list(err.value.receivers) == nbrs and err.value.round == 2
    assert str(err.value).startswith("secagg: agent 2 (trial 0) did not answer in round 2; the masked sums of agent")
    assert "\n" not in str(err.value)


def test_seeds_are_agreed_afresh_on_every_bind(monkeypatch):
    seeds = []
    real = party_mod._derive_seed
    monkeypatch.setattr(party_mod, "_derive_seed", lambda s, i: seeds.append(real(s, i)) or seeds[-1])
    topo = _topo([G5])
    U = torch.rand((5, 4), dtype=torch.float64)
    g = torch.full((topo.n_directed_edges,), 0.3, dtype=torch.float64)
    outs = []
    ex = make_exchange("secagg", record_transcript=True)
    for _ in range(2):
        ex.bind(topo, dtype=torch.float64, device=CPU)
        outs.append(ex.exchange(U, g, bcd_iter=1, admm_iter=1).S)
    n_seeds = len(seeds) // 2
    # per receiver i: a pair seed per pair of its neighbours (both holders derive it) and an edge
    # seed per link (both ends)
    d = G5.degree.tolist()
    assert n_seeds == sum(x * (x - 1) for x in d) + 2 * len(G5.edges)
    assert not set(seeds[:n_seeds]) & set(seeds[n_seeds:])
    masked = [m for m in ex.transcript if m.kind == "masked"]
    first, second = masked[:topo.n_directed_edges], masked[topo.n_directed_edges:]
    assert all(not np.array_equal(a.payload, b.payload) for a, b in zip(first, second))
    assert torch.equal(outs[0], outs[1])


def test_a_relay_that_changes_a_key_stops_the_agreement(monkeypatch):
    from ppdnmf_torch.exchange.secagg import network

    real = network.SecAggPlan.relays

    def forged(plan):  # receiver r hands its own key on as its neighbour k's
        for r, j, k in real(plan):
            yield r, j, k

    ex = make_exchange("secagg")
    topo = _topo([CYCLE4])
    real_verify = party_mod.Party.verify

    def verify(self, signed, node, identity_key, via=None):
        if via is not None:  # the relay substitutes its own signed key
            signed = SignedKey(signed.node, b"\x01" * 32, signed.signature)
        return real_verify(self, signed, node, identity_key, via)

    monkeypatch.setattr(party_mod.Party, "verify", verify)
    with pytest.raises(KeyAgreementError, match=r"^secagg: party \d: the key of party \d relayed by party \d does "
                                                "not verify"):
        ex.bind(topo, dtype=torch.float64, device=CPU)


def test_every_message_is_masked_and_the_masks_cancel():
    topo = _topo([G5])
    ex = _bound("secagg", topo, record_transcript=True)
    U = torch.rand((5, 6), dtype=torch.float64)
    g = torch.full((topo.n_directed_edges,), 0.3, dtype=torch.float64)
    ex.exchange(U, g, bcd_iter=1, admm_iter=1)
    q = torch.round(U * 1e6).to(torch.int64).numpy()
    masked = [m for m in ex.transcript if m.kind == "masked"]
    assert len(masked) == topo.n_directed_edges
    for m in masked:  # a message on its own is nowhere near its value
        assert not np.any(m.payload == q[m.sender]) and np.abs(m.payload).max() > 2 ** 56
    total = {}
    for m in masked:  # an eavesdropper's sum of a receiver's messages is still masked (edge masks)
        total[m.receiver] = total.get(m.receiver, 0) + m.payload
    for i, t in total.items():
        true = q[[m.sender for m in masked if m.receiver == i]].sum(0)
        assert not np.any(t == true)
    kinds = {m.kind for m in ex.transcript}
    assert kinds == {"signed_key", "relayed_key", "masked"}


def test_prg_is_aes_ctr_and_reads_the_same_everywhere():
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from ppdnmf_torch.exchange.secagg.prg import aes_context

    seed = bytes(range(16))
    rows = stream_rows(1, 5)
    aes_context(seed).update_into(counter_blocks(7, 3, 5), rows[0])
    head = (7).to_bytes(8, "big") + (3).to_bytes(4, "big") + bytes(4)
    ctr = Cipher(algorithms.AES(seed), modes.CTR(head)).encryptor().update(bytes(48))
    assert as_words(rows, 5).tolist()[0] == np.frombuffer(ctr[:40], dtype="<i8").tolist()
    # another round or receiver: another keystream
    other = stream_rows(2, 5)
    aes_context(seed).update_into(counter_blocks(8, 3, 5), other[0])
    aes_context(seed).update_into(counter_blocks(7, 4, 5), other[1])
    w = as_words(other, 5)
    assert not np.array_equal(w[0], as_words(rows, 5)[0]) and not np.array_equal(w[1], as_words(rows, 5)[0])


def test_costs_count_messages_keystreams_and_setup():
    topo = _topo([G5])
    ex = _bound("secagg", topo)
    D, P = topo.n_directed_edges, 6
    U = torch.rand((5, P), dtype=torch.float64)
    g = torch.full((D,), 0.3, dtype=torch.float64)
    for m in range(3):
        ex.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
        ex.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
    c = ex.costs()
    d = G5.degree.tolist()
    rows = sum(x * x + x for x in d)  # per receiver: d_i messages of d_i keystreams, d_i to strip
    assert c["messages"] == 3 * D and c["message_bytes"] == 3 * D * 8 * P
    assert c["prg_bytes"] == 3 * rows * 16 * 3  # 3 AES blocks hold 6 entries
    pairs = sum(x * (x - 1) // 2 for x in d)
    assert c["setup_signatures"] == 5 and c["setup_bytes"] == 100 * (2 * len(G5.edges) + 2 * pairs)
    assert c["setup_verifications"] == 2 * len(G5.edges) + 2 * pairs
    assert 0 < c["time_prg"] <= c["time_mask"] and c["time_setup"] > 0
    recs = ex.pop_iteration_costs()
    assert [(r["bcd_iter"], r["admm_iter"]) for r in recs] == [(1, 1), (1, 2), (1, 3)]
    assert all(r["messages"] == D and "setup_bytes" not in r for r in recs)
    per_edge = ex.bytes_per_edge()
    assert len(per_edge) == D and set(per_edge.values()) == {3 * 8 * P}
    state = ex.cost_state()
    fresh = _bound("secagg", topo)
    fresh.load_cost_state(state)
    assert fresh.costs()["messages"] == 3 * D


def test_resume_gets_new_seeds_and_the_same_numbers(tmp_path, monkeypatch):
    seeds = []
    real = party_mod._derive_seed
    monkeypatch.setattr(party_mod, "_derive_seed", lambda s, i: seeds.append(real(s, i)) or seeds[-1])
    full = _fits(("secagg",))["secagg"]
    n = len(seeds)
    kw = dict(KW, exchange="secagg", n_max=1e5)
    blocks = small_problem(counts=(3, 4, 2, 5, 3), seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pp.fit(blocks, G5, 2, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 2, **kw)
        resumed = pp.fit(blocks, G5, 2, resume_from=tmp_path, **kw)
    # three runs, three sets of seeds (each derived by its two holders)
    assert len(seeds) == 3 * n and len(set(seeds)) == 3 * n // 2
    assert torch.equal(resumed.X, full.X) and resumed.history["nmse"] == full.history["nmse"]
    assert resumed.costs["messages"] == full.costs["messages"]
    assert resumed.costs["setup_key_agreements"] == 2 * full.costs["setup_key_agreements"]


def test_keys_and_seeds_stay_in_their_objects():
    topo = _topo([CYCLE4])
    ex = _bound("secagg", topo)
    party = ex._net.parties[0]
    for obj in (ex, party, ex._net.parties):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)
    for obj in (ex, party):
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
        with pytest.raises(TypeError):
            copy.copy(obj)
    assert repr(party) == "Party(node=0, 4 seeds)" and "parties=4" in repr(ex)  # 2 edge seeds, 2 pair seeds
    assert not any(callable(getattr(party, n, None)) for n in ("seed", "seeds", "private_key", "key"))
    ex.close()
    assert len(party) == 0 and party._ephemeral is None and party._identity is None
    with pytest.raises(RuntimeError, match="closed"):
        ex.exchange(torch.zeros((4, 2), dtype=torch.float64), torch.zeros(8, dtype=torch.float64))


def test_follows_the_input_device(device):
    # the masking runs on the host (as Paillier's stage does); S and rho come back on U's device, the
    # same bits as quantized there
    topo = _topo([G5, graph.ring(5)])
    exs = [make_exchange(k) for k in ("quantized", "secagg")]
    for ex in exs:
        ex.bind(topo, dtype=torch.float64, device=device)
    gen = torch.Generator().manual_seed(2)
    U = torch.rand((10, 40), generator=gen, dtype=torch.float64).to(device)
    g = torch.full((topo.n_directed_edges,), 0.4, dtype=torch.float64, device=device)
    a, b = (ex.exchange(U, g, bcd_iter=1, admm_iter=1) for ex in exs)
    assert b.S.device == U.device and b.rho.device == U.device
    assert torch.equal(a.S, b.S) and torch.equal(a.rho, b.rho)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_data_of_any_scale_run_under_the_defaults_to_the_codec_rounding(scale):
    """The default exchange (secagg, n_max = 1e6) takes data at any scale: the exchanged copies U_i
    keep the public start's scale (the Y-step takes the data's), so the preflight bounds them by it;
    the result is plain's to the codec's rounding (1e-6 per exchanged value, 20 BCD x 5 ADMM)."""
    blocks = [b * scale for b in small_problem(L=8, K=3, counts=(3, 4, 2, 5, 3, 4), seed=0)]
    kw = dict(bcd_iters=20, x_iters=5, y_iters=5, tol=0.0, device="cpu")
    ref = pp.fit(blocks, graph.ring(6), 3, exchange="plain", **kw)
    assert float(ref.U.abs().max()) < 2 * 2.0  # the start's scale (uniform on [0, 2)), not the data's
    got = pp.fit(blocks, graph.ring(6), 3, **kw)  # exchange="secagg", the default
    assert got.costs and not ref.costs  # the secure sum ran (its counters), plain has none
    assert not torch.equal(got.X, ref.X)
    assert float((got.X - ref.X).abs().max()) < 1e-4 * float(ref.X.abs().max())
    assert all(float((a - b).abs().max()) < 1e-4 * float(b.abs().max()) for a, b in zip(got.Y, ref.Y))
    assert abs(got.nmse - ref.nmse) < 1e-4 * ref.nmse
