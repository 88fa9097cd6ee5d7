"""Bad input gets a clear error naming the parameter and the problem, before any work starts."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.exchange import CodecRangeError

from conftest import small_problem

RING4 = graph.ring(4)
FAST = dict(bcd_iters=1, x_iters=1, y_iters=1, device="cpu")


def _blocks():
    return small_problem(counts=(3, 4, 3, 4))


def _with(block_index, row, col, value):
    b = [x.clone() for x in _blocks()]
    b[block_index][row, col] = value
    return b


@pytest.mark.parametrize("value,match", [(math.nan, "NaN or Inf"), (math.inf, "NaN or Inf"),
                                         (-math.inf, "NaN or Inf")])
def test_nonfinite_data(value, match):
    with pytest.raises(pp.DataError, match=r"agent 2's block has a " + match + " entry at row 1, column 0"):
        pp.fit(_with(2, 1, 0, value), RING4, 2, **FAST)


def test_negative_data_names_the_first_block_and_counts_every_entry():
    bad = _with(3, 0, 1, -0.25)
    bad[1][2, 0] = -0.5
    with pytest.raises(pp.DataError, match=r"2 negative entries \(min -0\.5, first in agent 1's block\)"):
        pp.fit(bad, RING4, 2, **FAST)


def test_negative_data_refused_by_default_and_handled_on_request():
    bad = _with(1, 0, 0, -0.5)
    with pytest.raises(pp.DataError, match="negative"):
        pp.fit(bad, RING4, 2, **FAST)
    clipped = pp.fit(bad, RING4, 2, negative="clip", **FAST)
    shifted = pp.fit(bad, RING4, 2, negative="shift", **FAST)
    assert clipped.X.shape == shifted.X.shape == (4, 8, 2)
    with pytest.raises(pp.ConfigError, match="negative"):
        pp.fit(bad, RING4, 2, negative="sometimes", **FAST)


@pytest.mark.parametrize("Z,kw,match", [
    (torch.rand(3, 4, 5), {}, "2-D"),
    (torch.rand(8, 14), {"columns": [3, 4, 3, 5]}, "sum to 15"),
    (torch.rand(8, 14), {"columns": [3, 4, 7, 0]}, "no columns"),
    (torch.rand(8, 14), {"columns": [7, 7]}, "2 counts"),
    (torch.rand(8, 3), {}, "fewer than the 4 agents"),
    ([torch.rand(8, 3)] * 3, {}, "3 blocks"),
    ([torch.rand(8, 3), torch.rand(7, 3), torch.rand(8, 3), torch.rand(8, 3)], {}, "same L"),
])
def test_shapes_and_columns(Z, kw, match):
    with pytest.raises(pp.DataError, match=match):
        pp.fit(Z, RING4, 2, **kw, **FAST)


@pytest.mark.parametrize("rank,match", [(0, "rank"), (9, "larger than L"), (2.5, "rank")])
def test_rank(rank, match):
    with pytest.raises(pp.ConfigError, match=match):
        pp.fit(_blocks(), RING4, rank, **FAST)


@pytest.mark.parametrize("adj,match", [
    (np.ones((4, 3)), "square"),
    (np.array([[0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]]), "symmetric"),
    (np.array([[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1], [0, 0, 1, 0]]), "self loop"),
    (np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]), "disconnected"),
])
def test_bad_adjacency(adj, match):
    with pytest.raises(pp.GraphError, match=match):
        pp.fit(_blocks(), adj, 2, **FAST)


def test_adjacency_agent_count_mismatch():
    with pytest.raises(pp.DataError, match="4 blocks but the graph has 5 agents"):
        pp.fit(_blocks(), graph.ring(5), 2, **FAST)


@pytest.mark.parametrize("kw,match", [
    ({"mu": 0}, "mu"), ({"mu": -1.0}, "mu"), ({"eta": 0.0}, "eta"), ({"eta": math.nan}, "eta"),
    ({"g_max": 0.0}, "g_max"), ({"g_max": [0.1, 0.1, -0.1, 0.1]}, "g_max"), ({"g_max": [0.1, 0.1]}, "g_max"),
    ({"n_max": 0.5}, "n_max"), ({"bcd_iters": 0}, "bcd_iters"), ({"x_iters": 0}, "x_iters"),
    ({"y_iters": -3}, "y_iters"), ({"tol": -1e-3}, "tol"), ({"exchange": "telepathy"}, "exchange"),
    ({"protocol": "gossip"}, "protocol"), ({"device": "tpu"}, "device"), ({"dtype": "float16"}, "dtype"),
    ({"penalty": "huge"}, "penalty"), ({"consensus_form": "other"}, "consensus_form"),
])
def test_bad_parameters(kw, match):
    args = dict(FAST)
    args.update(kw)
    with pytest.raises(pp.ConfigError, match=match):
        pp.fit(_blocks(), RING4, 2, **args)


def test_key_too_small_for_n_max_fails_before_the_run():
    calls = []
    with pytest.raises(pp.ConfigError, match="key_bits/n_max"):
        pp.fit(_blocks(), RING4, 2, exchange="quantized", n_max=1e14, key_bits=2048,
               callback=lambda info: calls.append(info.iteration), **FAST)
    assert calls == []  # no iteration ran


def test_value_out_of_range_mid_run_names_agent_and_iteration():
    # the settings pass the preflight, but a penalty far above mu on a bipartite ring makes
    # the iterates diverge (see docs/ALGORITHM.md, "Notes on the algorithm as implemented") until they outgrow it
    with pytest.raises(CodecRangeError) as err:
        pp.fit(_blocks(), RING4, 2, exchange="quantized", n_max=1e6, g_bits=4, key_bits=128, mu=1e-3, g_max=30.0,
               penalty="fixed", penalty_schedule="paper", bcd_iters=60, x_iters=30, y_iters=5, device="cpu")
    msg = str(err.value)
    assert "agent" in msg and "BCD iteration" in msg and "limit" in msg
    assert err.value.limit == 2 ** 62


def test_missing_cbcl_path(tmp_path):
    missing = tmp_path / "nope.mat"
    with pytest.raises(pp.DataError, match="nope.mat"):
        pp.data.load_cbcl(missing)


def test_nan_during_iterations_names_iterations_and_agents():
    # a huge penalty on a bipartite ring makes the derived update diverge (see ALGORITHM notes)
    with pytest.raises(pp.NumericalError, match=r"BCD iteration \d+.*agents \["):
        pp.fit(_blocks(), RING4, 2, mu=1e-3, g_max=30.0, penalty="fixed", penalty_schedule="paper", exchange="plain",
               bcd_iters=60, x_iters=30, y_iters=5,
               device="cpu")


@pytest.mark.parametrize("scale,dtype", [(0.0, torch.float64), (1e-30, torch.float32)])
def test_zero_norm_block_is_refused_naming_the_agent(scale, dtype):
    # all zeros, or entries whose squares underflow in the run's dtype: the NMSE's
    # ||Z_i|| would be 0; refused before any iteration (not a NumericalError at 0/0)
    blocks = _blocks()
    blocks[2] = blocks[2] * scale
    calls = []
    with pytest.raises(pp.DataError, match=r"agents \[2\].*Frobenius norm 0"):
        pp.fit(blocks, RING4, 2, dtype=dtype, callback=lambda info: calls.append(info.iteration), **FAST)
    assert calls == []


def test_zero_norm_block_in_one_trial_names_the_trial():
    good, bad = _blocks(), _blocks()
    bad[0] = torch.zeros_like(bad[0])
    with pytest.raises(pp.DataError, match=r"agents \[0\] in trials \[1\]"):
        pp.fit_trials([good, bad], [RING4, RING4], 2, seeds=[0, 1], **FAST)


@pytest.mark.parametrize("exchange", ["quantized", "paillier"])
@pytest.mark.parametrize("g_bits,g_max,hint", [(0, 0.033, "use g_bits >= 4"), (4, 0.01, "use g_bits >= 6"),
                                               (8, 1e-12, "no g_bits up to 30 holds it")])
def test_penalty_cap_that_quantizes_to_zero_is_refused(exchange, g_bits, g_max, hint):
    # round(g_max 2^g_bits) = 0 would make every penalty 0: consensus silently off; the
    # hint names the smallest g_bits that works (round(0.033 * 16) = 1, round(0.01 * 64) = 1)
    with pytest.raises(pp.ConfigError, match=r"g_bits: .* quantizes to 0.*" + hint):
        pp.fit(_blocks(), RING4, 2, exchange=exchange, g_bits=g_bits, g_max=g_max, key_bits=128, **FAST)


def test_smallest_linked_cap_is_the_one_checked():
    caps = [0.033, 0.033, 0.001, 0.033]  # agent 2's cap: round(0.001 * 2^8) = 0
    own = dict(FAST, penalty_schedule="adaptive")  # per-agent caps (the default, agreed, takes one)
    with pytest.raises(pp.ConfigError, match="cap 0.001 quantizes to 0"):
        pp.fit(_blocks(), RING4, 2, exchange="quantized", g_bits=8, g_max=caps, **own)
    pp.fit(_blocks(), RING4, 2, exchange="quantized", g_bits=16, g_max=caps, **own)  # 65.5 -> 66: runs


@pytest.mark.parametrize("n_real", [5, 3])
def test_nonfinite_agents_matches_the_entrywise_check(n_real):
    # the solver's per-BCD check sums each agent first; finite entries whose sum overflows
    # (agent 2 of trial 1) must not count as non-finite
    from ppdnmf_torch.models.ppdnmf.solver.bcd import nonfinite_agents

    t = torch.rand(2, 5, 3, 4, dtype=torch.float64)
    t[0, 1, 2, 3] = math.nan
    t[1, 0, 0, 0], t[1, 0, 0, 1] = math.inf, -math.inf
    t[1, 2, 0, 0] = t[1, 2, 0, 1] = 1e308
    t[0, 4, 1, 1] = -math.inf
    view = t[:, :n_real]
    assert math.isinf(float(view[1, 2].sum()))
    expected = ~torch.isfinite(view).flatten(2).all(-1)
    assert torch.equal(nonfinite_agents(view), expected)
    assert int(expected.sum()) == (3 if n_real == 5 else 2)
