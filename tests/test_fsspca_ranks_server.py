"""FSSPCA with a server over ranks (:mod:`ppdnmf_torch.models.fsspca.server_ranks`): rank 0 the
server, the workers' rows on the other ranks; the server's sums through the halo exchange on a
star (masked under secagg); z agrees with fit_fsspca's to rounding (plain) or to the codec's
resolution (secagg)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from ppdnmf_torch.distributed import launch_local
from ppdnmf_torch.models.fsspca import fit_fsspca

ROWS, D = [7, 9, 6, 8], 6
SHORT = dict(max_iter=5, seed=4, alpha=0.05, tol=0.0)
OPTIONS = {"plain": None, "secagg": {"n_max": 1e7}}


def _blocks():
    rng = np.random.default_rng(3)
    basis = rng.standard_normal((2, D))
    return [torch.from_numpy(rng.standard_normal((n, 2)) @ basis + 0.3 * rng.standard_normal((n, D)) + 1.0)
            for n in ROWS]


def _rank(kind):
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.fsspca.server_ranks import fit_server_rank

    r = int(os.environ["RANK"])
    assignment = [1, 1, 2, 2]
    mine = [b for i, b in enumerate(_blocks()) if assignment[i] == r]
    with Comm.connect("env://", timeout=120, record=True) as comm:
        out = fit_server_rank(comm, mine or None, 2, n_workers=len(ROWS), n_features=D, assignment=assignment,
                              exchange=kind, exchange_options=OPTIONS[kind], **SHORT)
        log = b"".join(m for _, _, m in comm.sent_log)
    return {"z": out.z, "own": out.own, "history": out.history, "log": log}


def _pieces(workers) -> list:
    """The workers' rows as they would appear on the wire: every entry as float64, every pair of
    neighbouring entries as float32."""
    out = []
    for i in workers:
        X = _blocks()[i]
        out += [bytes(v.numpy().tobytes()) for v in X.reshape(-1)]
        x32 = X.to(torch.float32)
        out += [x32[a, b:b + 2].numpy().tobytes() for a in range(x32.shape[0]) for b in range(x32.shape[1] - 1)]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind, tol", [("plain", 1e-10), ("secagg", 1e-6)])
def test_a_server_rank_and_two_worker_ranks_follow_fit_fsspca(kind, tol):
    outs = launch_local(3, _rank, (kind,), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = fit_fsspca(_blocks(), 2, aggregation="plain", **SHORT)
    for r, o in enumerate(outs):
        assert torch.allclose(o.value["z"], ref.z[0], rtol=0, atol=tol), (r, (o.value["z"] - ref.z[0]).abs().max())
        assert torch.allclose(o.value["history"]["primal_residual"], ref.history["primal_residual"][:, 0],
                              rtol=1e-6 if kind == "secagg" else 1e-9)
    assert outs[0].value["own"]["workers"] == [] and outs[1].value["own"]["workers"] == [0, 1]
    assert torch.allclose(outs[2].value["own"]["w"], ref.w[0, 2:], rtol=0, atol=tol)
    if kind == "secagg":  # the workers' ranks send no entry of their rows (masked integers, public penalties)
        for r, workers in ((1, [0, 1]), (2, [2, 3])):
            blob = outs[r].value["log"]
            assert len(blob) > 1000 and not [p for p in _pieces(workers) if p in blob]
