"""Serverless FSSPCA over ranks (issue 39, :mod:`ppdnmf_torch.models.fsspca.serverless_ranks`): each
rank holds its own workers' rows; z, w, u and the history are fit_serverless's bits."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local
from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.fsspca.serverless_ranks import fit_serverless_rank

ROWS = [7, 9, 6, 8, 5, 10]
D = 6
SHORT = dict(max_iter=6, inner_iters=2, center_iters=5, seed=4, alpha=0.05, tol=0.0)
OPTIONS = {"plain": {}, "quantized": {"n_max": 1e6}, "secagg": {"n_max": 1e6}}


def _blocks():
    rng = np.random.default_rng(3)
    basis = rng.standard_normal((2, D))
    return [torch.from_numpy(rng.standard_normal((n, 2)) @ basis + 0.3 * rng.standard_normal((n, D)) + 1.0)
            for n in ROWS]


def _graph():
    return pp.graph.ring(len(ROWS))


def _reference(kind, **kw):
    return fit_serverless(_blocks(), 2, _graph(), exchange=kind, exchange_options=OPTIONS[kind] or None,
                          **dict(SHORT, **kw))


def _check_bits(own, history, ref, share="all"):
    ids = own["workers"]
    for name in ("z", "w", "u"):
        assert torch.equal(own[name], getattr(ref, name)[0, ids]), name
    assert torch.equal(history["consensus"], ref.consensus[:, 0])
    if share == "all":
        assert torch.equal(history["disagreement"], ref.disagreement[:, 0])
    else:
        assert "disagreement" not in history


@pytest.mark.parametrize("consensus", ["laplacian", "admm"])
def test_one_rank_is_the_single_process_run(comm, consensus):
    """One rank holding every worker: the layout's slots, the halo (no peer) and the table sums
    give fit_serverless's bits; the rho="auto" and alpha_scale="gram" means included."""
    out = fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="plain", consensus=consensus, **SHORT)
    ref = _reference("plain", consensus=consensus)
    _check_bits(out.own, out.history, ref)
    assert out.n_iter == SHORT["max_iter"] and out.own["workers"] == list(range(len(ROWS)))
    assert out.settings["rho"] == ref.settings["rho"] and out.settings["alpha"] == ref.settings["alpha"]
    assert torch.equal(out.z_all, ref.z[0])


def test_one_rank_stops_where_the_single_process_stops(comm):
    """tol > 0: the stopping test's sums across ranks are the single process's (the same iteration)."""
    kw = dict(SHORT, max_iter=80, tol=2e-3, center=False)
    out = fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="plain", **kw)
    ref = _reference("plain", **kw)
    assert out.converged and 1 < out.n_iter < 80 and out.n_iter == int(ref.n_iter[0])
    _check_bits(out.own, out.history, ref)


def test_one_rank_refuses_bad_input_with_one_line(comm):
    with pytest.raises(DataError, match="holds the workers"):
        fit_serverless_rank(comm, _blocks()[:2], 2, _graph(), exchange="plain", **SHORT)
    with pytest.raises(ConfigError, match="trials"):
        fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="plain", trials=2)
    with pytest.raises(ConfigError, match="not a setting"):
        fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="plain", groups=[0])
    with pytest.raises(ConfigError, match="no protocol across ranks"):
        fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="paillier")


def _rank(kind: str, share: str, assignment):
    from ppdnmf_torch.distributed.comm import Comm

    r = int(os.environ["RANK"])
    mine = [i for i, a in enumerate(assignment) if a == r]
    blocks = _blocks()
    with Comm.connect("env://", timeout=120) as comm:
        out = fit_serverless_rank(comm, [blocks[i] for i in mine], 2, _graph(), assignment=assignment, share=share,
                                  exchange=kind, exchange_options=OPTIONS[kind] or None, **SHORT)
    return {"own": out.own, "history": out.history, "n_iter": out.n_iter, "z_all": out.z_all}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "quantized", "secagg"])
def test_three_ranks_give_the_bits_of_one_process(kind):
    """Two workers a rank (a cut ring): every rank's z, w, u and the history are one process's
    bits; under secagg too (the masked sums are exact integers, as in one process)."""
    assignment = [0, 0, 1, 1, 2, 2]
    outs = launch_local(3, _rank, (kind, "all", assignment), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = _reference(kind)
    for r, o in enumerate(outs):
        assert o.value["own"]["workers"] == [2 * r, 2 * r + 1]
        _check_bits(o.value["own"], o.value["history"], ref)
    assert torch.equal(outs[0].value["z_all"], ref.z[0]) and outs[1].value["z_all"] is None


def test_a_rank_resumes_from_its_own_checkpoint_bit_for_bit(comm, tmp_path):
    """Checkpoints per rank (rank000/ and partition.json): 3 iterations, then resumed to 6, give an
    uninterrupted run's bits and history."""
    kw = dict(SHORT, exchange="plain")
    fit_serverless_rank(comm, _blocks(), 2, _graph(), checkpoint_dir=tmp_path, checkpoint_every=1,
                        **dict(kw, max_iter=3))
    assert (tmp_path / "rank000").is_dir() and (tmp_path / "partition.json").is_file()
    resumed = fit_serverless_rank(comm, _blocks(), 2, _graph(), checkpoint_dir=tmp_path, resume=True, **kw)
    whole = fit_serverless_rank(comm, _blocks(), 2, _graph(), **kw)
    assert resumed.n_iter == whole.n_iter == SHORT["max_iter"]
    for name in ("z", "w", "u"):
        assert torch.equal(resumed.own[name], whole.own[name]), name
    assert torch.equal(resumed.history["consensus"], whole.history["consensus"])


def test_one_rank_takes_a_given_start(comm):
    init = torch.linalg.qr(torch.from_numpy(np.random.default_rng(0).standard_normal((D, 2))))[0]
    out = fit_serverless_rank(comm, _blocks(), 2, _graph(), exchange="plain", init=init, **SHORT)
    _check_bits(out.own, out.history, _reference("plain", init=init))
