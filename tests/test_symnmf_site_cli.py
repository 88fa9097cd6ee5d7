"""Symmetric NMF's site run from the command line (issue 39): each site process started in its
own directory that holds only its own columns of the similarity, over TCP on loopback; the
factors of ``fit_symnmf_agents`` with the same seeds; faults with one line."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from ppdnmf_torch.checkpoint import PREFIX

from site_cli import site_env

N_NODES = 12
#: the public node sets (not contiguous); site.columns are their sizes
PARTS = [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9, 10, 11]]
PUBLIC = ["task=symnmf", "symnmf/variant=agents", "agents.n_agents=2", "graph=complete", "rank=2", "seed=3",
          "agents.start_seed=7", "agents.x_iters=3", "site.world=2", "site.columns=[5,7]",
          "site.parts=[[0,2,4,6,8],[1,3,5,7,9,10,11]]", "progress=false"]
#: the fit's settings in the API's names (the command line's above)
API = dict(n_agents=2, seed=3, start_seed=7, x_iters=3)


def _X():
    rng = np.random.default_rng(1)
    W = rng.random((N_NODES, 2))
    return W @ W.T


def _data(tmp_path):
    """Every site's folder with its own columns only."""
    for r, nodes in enumerate(PARTS):
        (tmp_path / f"site{r}").mkdir()
        np.save(tmp_path / f"site{r}" / "own.npy", _X()[:, nodes])


def _start(tmp_path, r, port, args):
    cmd = [sys.executable, "-m", "ppdnmf_torch", f"site.rank={r}", f"site.rendezvous=127.0.0.1:{port}",
           "site.data=own.npy", "site.timeout=60", "site.heartbeat=10", "hydra.run.dir=run", *PUBLIC, *args]
    return subprocess.Popen(cmd, cwd=tmp_path / f"site{r}", env=site_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _sites(tmp_path, args=(), extra=None, timeout=240):
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, r, port, [*args, *((extra or {}).get(r, ()))]) for r in range(2)]
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]


def _reference(penalty, kind: str, **kw):
    import ppdnmf_torch as pp
    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents

    parts = torch.tensor([PARTS[0] + [N_NODES] * 2, PARTS[1]])
    opts = {"exchange_options": {"n_max": 1e4}} if kind == "quantized" else {}
    agg = {"aggregation": "plain"} if penalty == "adaptive" else {}
    return fit_symnmf_agents(torch.from_numpy(_X()), 2, graph=pp.graph.make_graph("complete", 2), parts=parts,
                             exchange=kind, penalty=penalty, device="cpu", **API, **opts, **agg, **kw)


def _assert_factors(tmp_path, ref, exact: bool):
    for r in range(2):
        own = torch.load(tmp_path / f"site{r}" / "run" / "factors.pt", weights_only=False)
        assert own["agents"].tolist() == [r] and own["parts"][0][:len(PARTS[r])].tolist() == PARTS[r]
        V = ref.V[0, PARTS[r]]
        for mine, theirs in ((own["U"][0], ref.U_agents[0, r]), (own["V"][0, :len(PARTS[r])], V)):
            if exact:
                assert torch.equal(mine, theirs), r
            else:  # the adaptive penalty's sums are per-site sums (another order): rounding
                assert torch.allclose(mine, theirs, rtol=1e-9, atol=1e-12), r


@pytest.mark.parametrize("kind, penalty", [
    ("secagg", 0.5), pytest.param("quantized", 0.5, marks=pytest.mark.slow),
    pytest.param("secagg", "adaptive", marks=pytest.mark.slow)])
def test_two_symnmf_sites_from_the_command_line_give_the_factors_of_one_process(tmp_path, kind, penalty):
    """Each site's folder holds its own columns; its run folder its agents' U_i, V_i (one process's
    bits with a fixed penalty), the history (the same on every site), the summary's site section."""
    _data(tmp_path)
    args = [f"exchange={kind}", f"agents.penalty={penalty}", "agents.max_iter=4"]
    args += ["exchange.n_max=1e4"] if kind == "quantized" else []
    args += ["logger=tensorboard"] if penalty == "adaptive" else ["logger=none"]  # secagg: masked sums
    outs = _sites(tmp_path, args)
    assert [c for c, _ in outs] == [0, 0], outs
    ref = _reference(penalty, kind, max_iter=4)
    _assert_factors(tmp_path, ref, exact=penalty != "adaptive")
    runs = [tmp_path / f"site{r}" / "run" for r in range(2)]
    for r, run in enumerate(runs):
        assert sorted(p.name for p in run.parent.iterdir()) == ["own.npy", "run"]
        names = {p.name for p in run.iterdir()}
        assert {"factors.pt", "history.csv", "history.json", "summary.json", "site.json"} <= names
        assert ("tb" in names) == (penalty == "adaptive")
        site = json.loads((run / "summary.json").read_text())["site"]
        assert site["agents"] == [r] and site["share"] == "sums" and site["sent"]["metrics"] > 0
    h = [json.loads((run / "history.json").read_text()) for run in runs]
    assert len(h[0]["E"]) == 4 and {k: h[1][k] for k in ("E", "objective")} == {k: h[0][k] for k in ("E", "objective")}
    for key in ("E", "objective", "consensus"):  # from per-site sums: one process's to rounding
        one = [float(np.ravel(v)[0]) for v in ref.history[key]]
        assert np.allclose(h[0][key], one, rtol=1e-9, atol=0), key


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    ([], "ppdnmf: error: site.data (own.npy): has shape (12, 4), this site's agents [1] hold (12, 7) by the public "
         "description (n = 12 nodes, columns [7])"),
    (["agents.penalty=adaptive", "exchange=quantized"],
     "ppdnmf: error: agents.aggregation: 'quantized' (null takes the exchange's kind, 'quantized') has no "
     "protocol across sites; the adaptive penalty's three sums cross the sites in a plain all-reduce (3 "
     "numbers per site and outer iteration): accept that with agents.aggregation=plain, or fix lambda "
     "with agents.penalty=<number>"),
])
def test_what_a_symnmf_site_cannot_run_is_one_line_before_connecting(tmp_path, args, line):
    """No other site is running: the refusal comes before the rendezvous (exit 2, at once); the
    checks themselves run in the default suite (tests/test_symnmf_site_files.py)."""
    _data(tmp_path)
    np.save(tmp_path / "site1" / "own.npy", _X()[:, :4])
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, 1, free_port(), ["logger=none", "agents.penalty=0.5", *args])
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2 and [ln for ln in out.splitlines() if ln.startswith("ppdnmf:")] == [line], out


@pytest.mark.slow
def test_another_symnmf_description_is_refused_at_rendezvous_saying_what_differs(tmp_path):
    _data(tmp_path)
    outs = _sites(tmp_path, ["logger=none", "agents.penalty=0.5"], extra={1: ["agents.x_iters=4"]})
    assert [c for c, _ in outs] == [2, 2], outs
    assert ("ppdnmf: error: site: site 1 has x_iters=4, this site (site 0) x_iters=3: every site must start with "
            "the same public description") in outs[0][1]
    assert "site 0 has x_iters=3, this site (site 1) x_iters=4" in outs[1][1]


@pytest.mark.slow
def test_a_symnmf_site_that_dies_ends_the_other_and_both_resume_from_their_checkpoints(tmp_path):
    """Site 1 killed after its first checkpoint: site 0 stops within the timeout (exit 3) with one
    line naming it; both, started again with ``resume=run`` (and a cap), end with one process's bits."""
    from ppdnmf_torch.distributed import free_port

    _data(tmp_path)
    # agents.tol=0: the run must still be going when site 1 is killed after its first checkpoint
    long = ["logger=none", "agents.penalty=0.5", "agents.max_iter=100000", "agents.tol=0", "checkpoint_every=50",
            "keep_checkpoints=true", "site.timeout=20"]
    port = free_port()
    procs = [_start(tmp_path, r, port, long) for r in range(2)]
    ck = tmp_path / "site1" / "run" / "checkpoints"
    t0 = time.monotonic()
    while not any(ck.rglob(f"{PREFIX}*.pt")) and time.monotonic() - t0 < 180:
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    code, out = procs[0].wait(timeout=120), procs[0].stdout.read()
    procs[1].wait(timeout=60)
    assert time.monotonic() - killed < 20 + 30
    errors = [ln for ln in out.splitlines() if ln.startswith("ppdnmf: error:")]
    assert code == 3 and len(errors) == 1 and "rank 1" in errors[0], out
    again = [a if a != "agents.max_iter=100000" else "agents.max_iter=400" for a in long]
    outs = _sites(tmp_path, [*again, "resume=run"])
    assert [c for c, _ in outs] == [0, 0], outs
    _assert_factors(tmp_path, _reference(0.5, "secagg", max_iter=400, tol=0.0), exact=True)
