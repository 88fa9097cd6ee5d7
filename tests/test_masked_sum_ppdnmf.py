"""PPDNMF's sites under ``exchange="secagg"`` (issue 39): the per-site metric sums of
``share="sums"`` cross in a masked all-reduce
(:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`); the factors are ``fit``'s bits (the
metrics do not feed the iterates), the history's NMSE and objective equal ``fit``'s to 1e-12,
and no entry of a site's own per-site sums (recorded on the side: the test's copy), in the clear
under ``quantized``, is in any byte it sends under secagg."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local

COLUMNS = [7, 9, 8]
SHORT = dict(bcd_iters=3, x_iters=4, y_iters=3, seed=2, tol=0.0)
KINDS = {"secagg": dict(exchange="secagg"), "quantized": dict(exchange="quantized", n_max=1e6)}


def _whole():
    rng = np.random.default_rng(3)
    return torch.from_numpy(rng.random((10, 3)) @ rng.random((3, sum(COLUMNS))))


def _own(r):
    start = sum(COLUMNS[:r])
    return _whole()[:, start:start + COLUMNS[r]].clone()


def _site(kind: str):
    from ppdnmf_torch.distributed import masked_sum
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.ppdnmf.distributed import fit_site

    local = []  # what the site hands the SUM all-reduce of float sums (recorded on the side)
    for cls in (masked_sum.MaskedSums, masked_sum.PlainSums):
        def spy(self, t, *, _real=cls.all_reduce, **kw):
            if t.is_floating_point() and kw.get("op") is None:
                local.append(t.detach().cpu().clone())
            return _real(self, t, **kw)
        cls.all_reduce = spy
    r = int(os.environ["RANK"])
    with Comm.connect("env://", timeout=120, record=True) as comm:
        out = fit_site(comm, _own(r), pp.graph.ring(3), 3, columns=COLUMNS, **SHORT, **KINDS[kind])
        sent = b"".join(m for _, _, m in comm.sent_log)
    return {"own": out.own, "history": out.result.history, "sent": sent, "local": local}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["secagg", "quantized"])
def test_ppdnmf_sites_mask_their_metric_sums_under_secagg(kind):
    outs = launch_local(3, _site, (kind,), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = pp.fit(_whole(), pp.graph.ring(3), 3, columns=COLUMNS, fuse=False, **SHORT, **KINDS[kind])
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert torch.equal(own["X"][0], ref.X[r]) and torch.equal(own["Y"][0], ref.Y[r])
        for key in ("nmse", "objective"):
            np.testing.assert_allclose(np.ravel(o.value["history"][key]), np.ravel(ref.history[key]), rtol=1e-12)
        # its per-site sums (the counts, integers, left out: 8 bytes of a small integer are anywhere)
        pieces = {np.float64(v).tobytes() for t in o.value["local"] for v in t.reshape(-1).tolist()
                  if v != round(v)}
        assert len(o.value["local"]) == SHORT["bcd_iters"] and len(pieces) > 10
        hits = [p for p in pieces if p in o.value["sent"]]
        if kind == "quantized":  # in the clear: the scan finds them where they are
            assert len(hits) == len(pieces)
        else:
            assert not hits, f"site {r} sent {len(hits)} of its per-site sums unmasked"
