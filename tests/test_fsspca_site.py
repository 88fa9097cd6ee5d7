"""Serverless FSSPCA in site mode (issue 39, :mod:`ppdnmf_torch.models.fsspca.serverless_site`):
each site holds its own worker's rows only; z, w, u are fit_serverless's bits (under secagg, whose
sums over the sites are masked, to rounding), and under secagg no site sends or writes another
site's rows."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local
from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.fsspca.serverless_site import fit_fsspca_site

ROWS = [8, 11, 9]
D = 5
SHORT = dict(max_iter=5, inner_iters=2, center_iters=4, seed=6, alpha=0.05, tol=0.0)
OPTIONS = {"plain": {}, "quantized": {"n_max": 1e6}, "secagg": {"n_max": 1e6}}


def _own(r):
    rng = np.random.default_rng(10 + r)
    return torch.from_numpy(rng.standard_normal((ROWS[r], D)) + 0.5 * r)


def _graph():
    return pp.graph.ring(len(ROWS))


def _site(kind: str, folder):
    from ppdnmf_torch.distributed.comm import Comm

    from ppdnmf_torch.distributed import RankLayout, block_period, partition_agents

    r = int(os.environ["RANK"])
    lay = RankLayout.build(partition_agents(_graph(), 3, assignment=[0, 1, 2]), _graph(), r,
                           period=block_period((D * D, D * 2), 8))
    slot, seen = int(lay.slots[0]), []

    def cb(k, values):  # the site's own worker's values (its slot; the free slots are no one's), to scan for
        seen.append(torch.cat([values["w"][0, slot].reshape(-1), values["v"][0, slot].reshape(-1)]).clone())

    ckpt = None if folder is None else os.path.join(folder, f"site{r}")
    with Comm.connect("env://", timeout=120, record=folder is not None) as comm:
        out = fit_fsspca_site(comm, _own(r), 2, _graph(), n_features=D, exchange=kind, callback=cb,
                              exchange_options=OPTIONS[kind] or None, checkpoint_dir=ckpt, checkpoint_every=1,
                              **SHORT)
        log = b"".join(m for _, _, m in comm.sent_log)
    return {"own": out.own, "history": out.history, "log": log, "seen": seen}


def _reference(kind):
    return fit_serverless([_own(r) for r in range(len(ROWS))], 2, _graph(), exchange=kind,
                          exchange_options=OPTIONS[kind] or None, **SHORT)


def _check_bits(outs, ref, *, exact=True):
    """One process's bits; with ``exact=False`` (secagg: the sums over the sites are masked, a
    fixed-point total within about 2^-60 of the largest term) to 1e-9 relative."""
    same = torch.equal if exact else (lambda a, b: torch.allclose(a, b, rtol=1e-9, atol=1e-12))
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert own["workers"] == [r]
        for name in ("z", "w", "u"):
            assert same(own[name][0], getattr(ref, name)[0, r]), (r, name)
        assert same(o.value["history"]["consensus"], ref.consensus[:, 0])
        assert "disagreement" not in o.value["history"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "quantized"])
def test_three_sites_give_the_bits_of_one_process(kind):
    outs = launch_local(3, _site, (kind, None), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    _check_bits(outs, _reference(kind))


def _pieces(r, seen) -> list:
    """Site ``r``'s values as they would appear on the wire: every data entry as float64, every
    pair of neighbouring entries as float32, every w_i and v_i row it held as float64."""
    X = _own(r)
    out = [bytes(v.numpy().tobytes()) for v in X.reshape(-1)]
    x32 = X.to(torch.float32)
    out += [x32[i, j:j + 2].numpy().tobytes() for i in range(x32.shape[0]) for j in range(x32.shape[1] - 1)]
    for t in seen:
        out += [t[j:j + 2].numpy().tobytes() for j in range(0, t.numel() - 1, 2)]
    return out


@pytest.mark.slow
@pytest.mark.crypto
def test_under_secagg_no_site_sends_or_writes_another_sites_rows(tmp_path):
    outs = launch_local(3, _site, ("secagg", str(tmp_path)), timeout=600, grace=60)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    _check_bits(outs, _reference("secagg"), exact=False)
    held = [set(_pieces(r, o.value["seen"])) for r, o in enumerate(outs)]
    for r in range(len(outs)):
        for s, other in enumerate(outs):
            if s == r:
                continue
            pieces = [p for p in held[r] if p not in held[s]]
            assert len(pieces) > 100
            blob = other.value["log"]
            assert len(blob) > 1000
            hits = [p for p in pieces if p in blob]
            assert not hits, f"site {s} sent {len(hits)} pieces of site {r}'s values"
            files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{s}").rglob("*") if p.is_file())
            assert files and not [p for p in pieces if p in files], f"site {s} wrote site {r}'s values"
        own_files = b"".join(p.read_bytes() for p in Path(tmp_path, f"site{r}").rglob("*") if p.is_file())
        assert sum(p in own_files for p in held[r]) > 0  # the scan finds what is there: its own checkpoints


def test_a_site_refuses_rows_of_another_width_before_any_message(comm):
    with pytest.raises(DataError, match="public description has"):
        fit_fsspca_site(comm, [_own(0), torch.zeros((4, D + 1), dtype=torch.float64), _own(2)], 2, pp.graph.ring(3),
                        n_features=D, assignment=[0, 0, 0])
    with pytest.raises(DataError, match="need 3"):
        fit_fsspca_site(comm, _own(0), 2, pp.graph.ring(3), n_features=D, assignment=[0, 0, 0])
    with pytest.raises(ConfigError, match="share"):
        fit_fsspca_site(comm, _own(0), 2, pp.graph.ring(3), n_features=D, share="all")


def _other_settings(alpha):
    from ppdnmf_torch.distributed.comm import Comm

    r = int(os.environ["RANK"])
    with Comm.connect("env://", timeout=60) as comm:
        fit_fsspca_site(comm, _own(r), 2, pp.graph.path(2) if hasattr(pp.graph, "path") else pp.graph.ring(2),
                        n_features=D, exchange="plain", **dict(SHORT, alpha=alpha[r]))


@pytest.mark.slow
def test_a_site_with_another_description_is_refused_with_one_line():
    outs = launch_local(2, _other_settings, ([0.05, 0.07],), timeout=120)
    errors = [str(o.error) for o in outs]
    assert all(o.exitcode != 0 for o in outs), errors
    assert any("alpha=0.05" in e and "alpha=0.07" in e for e in errors), errors
