"""exchange="secagg" over ranks (:class:`~ppdnmf_torch.distributed.halo.SecAggHalo`): one rank in
process and two spawned ranks give the single-process bits and counters; only masked messages,
signed public keys and the common penalties cross the cut, never a value, a data block, a private
key or a seed."""
from __future__ import annotations

import warnings

import pytest
import torch

from ppdnmf_torch.distributed import Comm, free_port, launch_local
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.models.ppdnmf.distributed import fit_rank

from test_distributed import SHORT, _assert_same, _data, _data_pieces, _holds, _rank_fit, _reference

AGREED = {"exchange": "secagg", "penalty_schedule": "agreed"}


def _watched_rank_fit(case: dict):
    """A spawned rank: record the private keys, Diffie-Hellman secrets and seeds its parties make (the
    test's copy, to scan the traffic), then the run."""
    from ppdnmf_torch.exchange.secagg import party

    found = {"secret": [], "own_q": []}
    real_id, real_eph, real_seed = party._new_identity, party._new_ephemeral, party._derive_seed

    def ident():
        k = real_id()
        found["secret"].append(k.private_bytes_raw())
        return k

    def eph():
        k = real_eph()
        found["secret"].append(k.private_bytes_raw())
        return k

    def seed(shared, info):
        s = real_seed(shared, info)
        found["secret"] += [s, shared]
        return s

    party._new_identity, party._new_ephemeral, party._derive_seed = ident, eph, seed
    out = _rank_fit(case)
    out["secrets"] = found["secret"]
    return out


@pytest.fixture(scope="module")
def solo():
    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    yield comm
    comm.close()


def _one_rank(comm, case):
    Z, G, counts = _data(**case["data"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = fit_rank(comm, Z, G, 3, columns=counts, **dict(SHORT, **case["fit"]))
    return dict(X=r.result.X, U=r.result.U, Y=r.result.Y, history=r.result.history, costs=r.result.costs)


def test_one_rank_gives_the_single_process_bits_and_counters(solo):
    case = {"data": dict(N=6, K=3), "fit": dict(AGREED)}
    out = _one_rank(solo, case)
    ref = _reference(case)
    _assert_same(out, ref)  # X, U, Y, every history key and every counter (times aside)
    q = _reference(dict(case, fit=dict(AGREED, exchange="quantized")))
    assert torch.equal(out["X"], q.X) and torch.equal(out["U"], q.U)
    assert out["costs"]["bytes_per_edge"] == ref.costs["bytes_per_edge"]


def test_per_edge_schedules_are_refused_over_ranks(solo):
    Z, G, counts = _data(N=4)
    with pytest.raises(ConfigError, match="^exchange: 'secagg' .*penalty_schedule='paper' draws a weight per edge"):
        fit_rank(solo, Z, G, 2, columns=counts, **dict(SHORT, exchange="secagg", penalty_schedule="paper"))
    with pytest.raises(ConfigError, match="record_transcript is a single-process tool"):
        fit_rank(solo, Z, G, 2, columns=counts, exchange="secagg", exchange_options={"record_transcript": True},
                 **SHORT)


@pytest.mark.slow  # two spawned ranks: about 20 s, beyond this topic's share of the default run
def test_two_ranks_same_bits_and_no_value_or_secret_crosses():
    """2 gloo ranks on a graph with cut edges: the single-process bits and counters; the masked
    messages cross as 8 bytes per value and cut edge (category crypto), the common penalties as
    quantized's halo does, no U row (halo) at all; no data block, private key, Diffie-Hellman
    secret or seed in any byte either rank sends."""
    case = {"data": dict(N=7, K=3), "fit": dict(AGREED), "record": True}
    outs = launch_local(2, _watched_rank_fit, (case,), timeout=240, grace=90)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    out = outs[0].value
    _assert_same(out, _reference(case))
    P = 8 * 3  # L K values per message
    cut = sum(1 for i, j in _data(**case["data"])[1].edges if out["owner"][i] != out["owner"][j])
    assert cut > 0
    for r in out["ranks"]:
        n = r["admm_iterations"]
        assert "halo" not in r["sent"] and r["sent"]["penalty"] > 0
        # each cut edge carries one message per direction and ADMM iteration: half of them leave this rank
        assert r["sent"]["crypto"] == n * cut * 8 * P
        assert r["sent"]["setup"] > 0
    blob = b"".join(msg for o in outs for _, _, msg in o.value["log"])
    secrets = [s for o in outs for s in o.value["secrets"]]
    assert len(secrets) > 2 * 7 and all(len(s) in (16, 32) for s in secrets)  # seeds, secrets and keys
    assert not any(s in blob for s in secrets)
    for o in outs:
        assert not any(_holds(blob, piece) for piece in _data_pieces(case, o.value["agents"]))
