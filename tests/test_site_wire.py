"""Site mode under a real protocol (issue 39): every byte each site sends, and every file it
writes, is scanned for the other sites' data and values; the factors are one process's bits."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local

COLUMNS = [14, 11, 17]
SHORT = dict(bcd_iters=3, x_iters=4, y_iters=4, seed=2, tol=0.0)
KINDS = {"secagg": dict(exchange="secagg"),
         "paillier": dict(exchange="paillier", key_bits=256, exchange_options={"precompute": False})}


def _whole(L=10, K=3):
    rng = np.random.default_rng(5)
    return torch.from_numpy(rng.random((L, K)) @ rng.random((K, sum(COLUMNS))))


def _own(r):
    start = sum(COLUMNS[:r])
    return _whole()[:, start:start + COLUMNS[r]].clone()


def _site(kind: str, folder: str):
    """One site: its own columns only, its traffic recorded, the U of every BCD iteration kept."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.ppdnmf.distributed import fit_site

    from ppdnmf_torch.distributed import RankLayout, partition_agents

    r = int(os.environ["RANK"])
    graph = pp.graph.ring(3)
    lay = RankLayout.build(partition_agents(graph, 3, "rcm", [0, 1, 2]), graph, r, L=10, K=3, itemsize=8)
    seen = []

    def cb(info):  # the site's own agent's U (its slot; the free slots are dummies of no one's data)
        seen.append(info.state.U[0, lay.slots].detach().cpu().clone())

    with Comm.connect("env://", timeout=120, record=True) as comm:
        out = fit_site(comm, _own(r), pp.graph.ring(3), 3, columns=COLUMNS, callback=cb,
                       checkpoint_dir=os.path.join(folder, f"site{r}"), checkpoint_every=1, **SHORT, **KINDS[kind])
        log = b"".join(m for _, _, m in comm.sent_log)
    return {"log": log, "U_seen": seen, "own": out.own}


def _pieces(r: int, U_seen, n_max=1e6) -> list:
    """Site ``r``'s values as they would appear on the wire: every data entry as float64, every
    pair of neighbouring entries as float32, every seen row of U as float64 and as the codec's
    int64 ``round(n_max U)``."""
    Z = _own(r)
    out = [bytes(v.numpy().tobytes()) for v in Z.reshape(-1)]
    z32 = Z.to(torch.float32)
    out += [z32[i, j:j + 2].numpy().tobytes() for i in range(z32.shape[0]) for j in range(z32.shape[1] - 1)]
    for U in U_seen:
        for row in U.reshape(-1, U.shape[-1]):
            out.append(row.to(torch.float64).numpy().tobytes())
            out.append(torch.round(row.to(torch.float64) * n_max).to(torch.int64).numpy().tobytes())
    return out


@pytest.mark.slow
@pytest.mark.crypto
@pytest.mark.parametrize("kind", ["secagg", "paillier"])
def test_under_a_real_protocol_no_site_sends_or_writes_another_sites_values(tmp_path, kind):
    outs = launch_local(3, _site, (kind, str(tmp_path)), timeout=600, grace=60)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = pp.fit(_whole(), pp.graph.ring(3), 3, columns=COLUMNS, fuse=False, **SHORT, **KINDS[kind])
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert own["agents"] == [r]
        assert torch.equal(own["X"][0], ref.X[r]) and torch.equal(own["U"][0], ref.U[r])
        assert torch.equal(own["Y"][0], ref.Y[r])
    held = [set(_pieces(r, o.value["U_seen"])) for r, o in enumerate(outs)]
    for r, o in enumerate(outs):
        for s, other in enumerate(outs):
            if s == r:
                continue
            # a value site s holds itself is not site r's secret: the agents' U rows can agree to
            # the bit (rows in exact consensus after the first BCD iteration, in this run)
            pieces = [p for p in held[r] if p not in held[s]]
            assert len(pieces) > 200
            blob = other.value["log"]
            assert len(blob) > 1000
            hits = [p for p in pieces if p in blob]
            assert not hits, f"site {s} sent {len(hits)} pieces of site {r}'s values"
            files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{s}").rglob("*") if p.is_file())
            assert files and not [p for p in pieces if p in files], f"site {s} wrote site {r}'s values"
        own_files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{r}").rglob("*") if p.is_file())
        assert sum(p in own_files for p in held[r]) > 0  # the scan finds what is there: its own checkpoints
