"""make_aggregator("secagg"): the server's secure sum by pairwise masks (issue 38): the same bits as
quantized's aggregation, a curious server (alone, with a colluder) that learns only the sum,
an eavesdropper that does not even learn that, dropouts refused, key material kept in."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from ppdnmf_torch.audit.server import run_server_audit
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.exchange.aggregation import AGGREGATION_KINDS, DroppedWorkerError, make_aggregator

from test_secagg_audit import fixed_keys  # noqa: F401 (a fixture: the statistical tests' masks fixed)


@pytest.mark.parametrize("K, h, bits", [(2, None, None), (3, None, None), (7, 1, None), (4, None, 40)])
def test_same_bits_as_quantized(K, h, bits):
    a = make_aggregator("quantized", K, mask_neighbours=h, bits=bits)
    b = make_aggregator("secagg", K, mask_neighbours=h, bits=bits)
    gen = torch.Generator().manual_seed(K)
    for _ in range(3):
        v = torch.randn((2, K, 5, 3), generator=gen, dtype=torch.float64)
        assert torch.equal(a.total(v, dim=1), b.total(v, dim=1))
    assert "secagg" in AGGREGATION_KINDS
    c = b.costs()
    P = 2 * 5 * 3
    assert c["rounds"] == 3 and c["messages"] == 3 * K and c["bytes"] == 3 * 8 * K * P
    per_round = K + K + 2 * len(b.pairs)  # every worker's edge stream (twice: worker, server), pair streams
    assert c["prg_bytes"] == 3 * per_round * 16 * (P // 2)
    assert c["setup_signatures"] == K + 1 and c["setup_key_agreements"] == 2 * (K + len(b.pairs))
    assert len(b.pop_round_costs()) == 3


def test_refuses_the_range_where_quantized_does():
    from ppdnmf_torch.exchange.codec import CodecRangeError

    v = torch.full((3, 4), 2.0 ** 31, dtype=torch.float64)  # n_max 2^32: 2^63 per upload
    msgs = []
    for kind in ("quantized", "secagg"):
        with pytest.raises(CodecRangeError) as err:
            make_aggregator(kind, 3).total(v, 0)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("K", [2, 3, 5])
def test_a_curious_server_learns_only_the_sum(K, fixed_keys):
    rep = run_server_audit("secagg", K, rounds=6, n_values=48)
    assert rep["sums_exact"] and rep["verdict"]["server"] == "only the sum"
    if K == 2:  # a colluder and the sum give the other upload: inherent, flagged
        assert all(v["inherent"] and v["exact_fraction"] == 1.0 for v in rep["views"] if v["colluder"] is not None)
    else:
        assert rep["verdict"]["server+worker"] == "only the sum"


def test_an_eavesdropper_does_not_learn_the_sum():
    agg = make_aggregator("secagg", 4, record=True)
    v = torch.rand((4, 32), dtype=torch.float64)
    s = agg.total(v, 0)
    ups = agg.transcript[-1]["uploads"]
    q = agg.transcript[-1]["q"]
    # uploads on their own are far from the values; their sum still carries the edge masks
    assert not bool((ups == q).any()) and not bool((ups.sum(0) == q.sum(0)).any())
    assert torch.equal(s, q.sum(0).to(torch.float64) / agg.n_max)


def test_dropped_workers_options_and_key_material():
    agg = make_aggregator("secagg", 3)
    v = torch.rand((3, 8), dtype=torch.float64)
    with pytest.raises(DroppedWorkerError, match="worker 1 did not upload in round 1; the secagg aggregation"):
        agg.total(v, 0, dropped=[1])
    with pytest.raises(ConfigError, match="^djn: not an option of kind='secagg'"):
        make_aggregator("secagg", 3, djn=True)
    for obj in (agg, agg._net.parties[0]):
        with pytest.raises(TypeError):
            pickle.dumps(obj)
        with pytest.raises(TypeError):
            copy.deepcopy(obj)
    assert repr(agg) == "SecAggAggregator(n_workers=3, n_max=4.29497e+09, bits=63, rounds=0, 3 pair seeds)"
    party = agg._net.parties[3]  # the server
    agg.close()
    assert len(party) == 0
    with pytest.raises(ConfigError, match="closed"):
        agg.total(v, 0)
