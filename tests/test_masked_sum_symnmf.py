"""Symmetric NMF's sites under ``exchange="secagg"`` with the adaptive penalty (issue 39): its three
sums, the metric sums, the sum of copies and ``||X||^2`` cross in masked all-reduces
(:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`), so the run needs no
``aggregation="plain"``; the factors equal one process's (``aggregation="plain"``, the exact float
sums) to 1e-10 (the masked totals are the sums to about 2^-60 of their largest entry, in another
order than one process's), not bit for bit; no seed of the masked sums or of the exchange is in any
byte a site sends or any file it writes (``slow``: three spawned sites)."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.distributed import launch_local
from ppdnmf_torch.errors import ConfigError

N_NODES, PARTS = 24, [list(range(0, 8)), list(range(8, 16)), list(range(16, 24))]
COMMON = dict(n_agents=3, max_iter=4, x_iters=3, y_iters=3, tol=0.0, seed=3, start_seed=7, penalty="adaptive")


def _X():
    rng = np.random.default_rng(1)
    W = rng.random((N_NODES, 3))
    return torch.from_numpy(W @ W.T)


def _site(folder: str):
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.exchange.secagg import party
    from ppdnmf_torch.models.symnmf.site import fit_symnmf_site

    secrets, real = [], party._derive_seed

    def spy(shared, info):  # the test's copy of every seed and shared secret this site derives
        s = real(shared, info)
        secrets.extend([s, shared])
        return s

    party._derive_seed = spy
    r = int(os.environ["RANK"])
    own = _X()[:, PARTS[r]].clone()
    with Comm.connect("env://", timeout=120, record=True) as comm:
        out = fit_symnmf_site(comm, own, 2, n=N_NODES, parts=PARTS, graph=pp.graph.ring(3), exchange="secagg",
                              checkpoint_dir=os.path.join(folder, f"site{r}"), checkpoint_every=2, **COMMON)
        sent = b"".join(m for c, _, m in comm.sent_log if c == "metrics")
        every = b"".join(m for _, _, m in comm.sent_log)
    return {"own": out.own, "history": out.history, "metrics": sent, "x2": float(own.square().sum()),
            "secrets": secrets, "sent": every}


@pytest.mark.slow
def test_three_symnmf_sites_run_the_adaptive_penalty_under_secagg_to_rounding(tmp_path):
    from pathlib import Path

    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents

    outs = launch_local(3, _site, (str(tmp_path),), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0, 0], [o.error for o in outs]
    ref = fit_symnmf_agents(_X(), 2, graph=pp.graph.ring(3), parts=torch.tensor(PARTS), exchange="secagg",
                            device="cpu", aggregation="plain", **COMMON)
    lam = np.ravel(ref.history["lambda"])
    assert len(set(lam.tolist())) > 1  # the penalty moved: its sums were used
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert torch.allclose(own["U"][0], ref.U_agents[0, r], rtol=1e-10, atol=1e-12)
        for key in ("lambda", "E", "objective", "stationarity"):
            np.testing.assert_allclose(np.ravel(o.value["history"][key]), np.ravel(ref.history[key]), rtol=1e-10)
        # the site's sum of copies and its ||X_i||^2 are not in its metrics bytes (masked)
        mine = [row.numpy().tobytes() for row in own["U"].sum(0)] + [np.float64(o.value["x2"]).tobytes()]
        assert len(o.value["metrics"]) > 0 and not [p for p in mine if p in o.value["metrics"]]
        # no seed or shared secret (the exchange's and the masked sums') in any byte sent or file written
        files = b"".join(p.read_bytes() for p in Path(tmp_path).rglob("*") if p.is_file())
        assert len(o.value["secrets"]) >= 4 and files
        assert not [x for x in o.value["secrets"] for other in outs if x in other.value["sent"] or x in files]


@pytest.mark.parametrize("kw, text", [
    (dict(exchange="quantized", exchange_options={"n_max": 1e6}), "'quantized' (None takes the exchange's kind"),
    (dict(exchange="secagg", aggregation="quantized"), "'quantized' has no protocol across ranks"),
])
def test_aggregations_without_a_protocol_across_ranks_are_refused(kw, text):
    from ppdnmf_torch.models.symnmf.distributed import _rank_aggregation

    kind = kw["exchange"]
    with pytest.raises(ConfigError, match="^aggregation: " + re.escape(text)):
        _rank_aggregation(kw.get("aggregation"), None, kind, "adaptive", 3, "sums")
    _rank_aggregation("plain", None, kind, "adaptive", 3, "sums")  # named: accepted


def test_share_all_under_secagg_still_needs_the_plain_aggregation():
    from ppdnmf_torch.models.symnmf.distributed import _rank_aggregation

    _rank_aggregation(None, None, "secagg", "adaptive", 3, "sums")
    with pytest.raises(ConfigError, match="share='sums' masks the ranks' sums under exchange='secagg'"):
        _rank_aggregation(None, None, "secagg", "adaptive", 3, "all")
