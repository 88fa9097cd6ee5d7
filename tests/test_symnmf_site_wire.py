"""Symmetric NMF's sites send and write nothing of another site's similarity columns (issue 39):
every byte each site (three of one agent; two of two agents) sends (the comm's sent log) and every file it writes (its
checkpoints) is scanned for the other sites' entries of ``X[:, S_i]``, under ``secagg`` (the
default exchange) and ``quantized``; the factors are ``fit_symnmf_agents``' bits. The scan also
measures what docs/DEPLOYMENT.md says about the metrics' sum of the site's copies: masked under
``secagg`` (no byte of it on the wire, :class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`),
in the clear under ``quantized``."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local

N_NODES = 30
COMMON = dict(max_iter=3, x_iters=3, y_iters=2, tol=0.0, seed=3, start_seed=7, penalty=0.5)
KINDS = {"secagg": {}, "quantized": {"exchange_options": {"n_max": 1e6}}}
#: (sites, the site of every agent, where the node permutation is split): under secagg one agent
#: per site; under quantized two agents on each of two sites, not contiguous
LAYOUTS = {"secagg": (3, None, [9, 20]), "quantized": (2, [0, 1, 0, 1], [7, 15, 23])}


def _parts(kind: str) -> list:
    """Public node sets, not contiguous, of unequal sizes."""
    return [[int(j) for j in p] for p in np.split(np.random.default_rng(8).permutation(N_NODES), LAYOUTS[kind][2])]


def _agents(kind: str, site: int) -> list:
    sites, assignment, _ = LAYOUTS[kind]
    return [site] if assignment is None else [i for i, a in enumerate(assignment) if a == site]


def _X():
    rng = np.random.default_rng(4)
    W = rng.random((N_NODES, 3))
    return torch.from_numpy(W @ W.T)


def _padded(kind: str):
    parts = _parts(kind)
    m = max(map(len, parts))
    return torch.tensor([p + [N_NODES] * (m - len(p)) for p in parts])


def _graph(kind: str):
    return pp.graph.ring(len(_parts(kind)))


def _site(kind: str, folder: str):
    """One site: its own columns only (cut here from the whole matrix, which it then drops), its
    traffic recorded by category."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.symnmf.site import cut_columns, fit_symnmf_site

    r = int(os.environ["RANK"])
    own = cut_columns(_X(), _parts(kind), _agents(kind, r))
    with Comm.connect("env://", timeout=120, record=True) as comm:
        out = fit_symnmf_site(comm, own, 2, n=N_NODES, parts=_padded(kind), n_agents=len(_parts(kind)),
                              graph=_graph(kind), assignment=LAYOUTS[kind][1], exchange=kind,
                              checkpoint_dir=os.path.join(folder, f"site{r}"), checkpoint_every=1, **COMMON,
                              **KINDS[kind])
        log = [(category, m) for category, _, m in comm.sent_log]
    return {"log": log, "own": out.own}


def _pieces(kind: str, r: int) -> set:
    """Site ``r``'s columns as they would appear on the wire: every entry as float64, every pair of
    neighbouring entries (along a row, and along a column) as float32."""
    from ppdnmf_torch.models.symnmf.site import cut_columns

    Z = cut_columns(_X(), _parts(kind), _agents(kind, r))
    out = {bytes(v.numpy().tobytes()) for v in Z.reshape(-1)}
    z32 = Z.to(torch.float32)
    for M in (z32, z32.T.contiguous()):
        out |= {M[i, j:j + 2].numpy().tobytes() for i in range(M.shape[0]) for j in range(M.shape[1] - 1)}
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["secagg", "quantized"])
def test_no_symnmf_site_sends_or_writes_another_sites_columns(tmp_path, kind):
    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents

    sites = LAYOUTS[kind][0]
    outs = launch_local(sites, _site, (kind, str(tmp_path)), timeout=300, grace=60)
    assert [o.exitcode for o in outs] == [0] * sites, [o.error for o in outs]
    ref = fit_symnmf_agents(_X(), 2, n_agents=len(_parts(kind)), graph=_graph(kind), parts=_padded(kind),
                            exchange=kind, device="cpu", **COMMON, **KINDS[kind])
    held = [_pieces(kind, r) for r in range(sites)]
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert own["agents"] == _agents(kind, r)
        for k, i in enumerate(own["agents"]):
            assert torch.equal(own["U"][k], ref.U_agents[0, i])
        for s, other in enumerate(outs):
            if s == r:
                continue
            # an entry X[j, i] with j in S_s is site s's own X[i, j] (X is symmetric): not r's secret
            pieces = [p for p in held[r] if p not in held[s]]
            assert len(pieces) > 500
            blob = b"".join(m for _, m in other.value["log"])
            assert len(blob) > 1000
            hits = [p for p in pieces if p in blob]
            assert not hits, f"site {s} sent {len(hits)} pieces of site {r}'s columns"
            files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{s}").rglob("*") if p.is_file())
            assert files and not [p for p in pieces if p in files], f"site {s} wrote site {r}'s columns"
        # the metrics' mean copy is an all-reduce of each site's sum of its agents' copies (with one
        # agent, its U_i): under quantized in the clear, where the scan finds it (so it would find X);
        # under secagg masked, and no byte that any site sends holds a row of any site's sum
        rows = {row.numpy().tobytes() for row in own["U"].sum(0).to(torch.float64)}
        by = {}
        for category, m in o.value["log"]:
            by[category] = by.get(category, b"") + m
        if kind == "quantized":
            assert all(row in by["metrics"] for row in rows)
        else:
            assert by["metrics"] and not [row for row in rows for other in outs
                                          for _, m in other.value["log"] if row in m]
        own_files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{r}").rglob("*") if p.is_file())
        copies = {row.numpy().tobytes() for row in own["U"].reshape(-1, own["U"].shape[-1]).to(torch.float64)}
        assert any(row in own_files for row in copies)  # its own checkpoints hold its copies
