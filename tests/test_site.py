"""Site mode (issue 39): one process per party, each started in its own directory that holds only
its own data file, over TCP on loopback; the same bits as one process; faults with one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from site_cli import site_env

COLUMNS = [20, 15, 25]
#: the public description every site of these tests runs (the library's defaults otherwise)
PUBLIC = ["n_agents=3", "graph=ring", "solver.rank=3", "solver.bcd_iters=5", "logger=none", "progress=false"]


def _data(tmp_path, columns=COLUMNS, seed=0, L=20, K=3):
    """Every site's folder with its own file only; the whole matrix elsewhere (for one process)."""
    rng = np.random.default_rng(seed)
    Z = rng.random((L, K)) @ rng.random((K, sum(columns)))
    start = 0
    for r, c in enumerate(columns):
        (tmp_path / f"site{r}").mkdir()
        np.save(tmp_path / f"site{r}" / "own.npy", Z[:, start:start + c])
        start += c
    (tmp_path / "whole").mkdir()
    np.save(tmp_path / "whole" / "all.npy", Z)
    return Z


def _start(tmp_path, r, port, args, world=3, public=PUBLIC):
    cmd = [sys.executable, "-m", "ppdnmf_torch", f"site.rank={r}", f"site.world={world}",
           f"site.rendezvous=127.0.0.1:{port}", "site.data=own.npy",
           f"site.columns=[{','.join(map(str, COLUMNS))}]", "site.timeout=60", "site.heartbeat=10", "hydra.run.dir=run",
           *public, *args]
    return subprocess.Popen(cmd, cwd=tmp_path / f"site{r}", env=site_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _sites(tmp_path, args=(), extra=None, timeout=240):
    """Start the three sites (``extra[r]``: overrides of site ``r`` alone), wait, return ``(code, output)`` each."""
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, r, port, [*args, *((extra or {}).get(r, ()))]) for r in range(3)]
    return [(p.wait(timeout=timeout), p.stdout.read()) for p in procs]


def _one_process(tmp_path, args=()):
    out = subprocess.run([sys.executable, "-m", "ppdnmf_torch", "data=npy", "data.path=all.npy",
                          f"data.split.counts=[{','.join(map(str, COLUMNS))}]", "centralized=false",
                          "solver.fuse=false", "hydra.run.dir=one", *PUBLIC, *args], cwd=tmp_path / "whole",
                         env=site_env(), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    return torch.load(tmp_path / "whole" / "one" / "factors.pt", weights_only=False)


def _assert_same_bits(tmp_path, one):
    for r in range(3):
        own = torch.load(tmp_path / f"site{r}" / "run" / "factors.pt", weights_only=False)
        assert own["agents"].tolist() == [r]
        for name in ("X", "U"):
            assert torch.equal(own[name][0], one[name][r]), (r, name)
        assert torch.equal(own["Y"][0], one["Y"][r]), r


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "quantized"])
def test_three_sites_each_with_its_own_file_give_the_bits_of_one_process(tmp_path, kind):
    """Each site's folder holds its own columns only; its run folder gets its agents' factors,
    the history (the same on every site) and no other site's factors; the factors are the
    one-process run's bits (``fuse=false``, the same seeds)."""
    Z = _data(tmp_path)
    args = [f"exchange={kind}"]
    outs = _sites(tmp_path, args)
    assert [c for c, _ in outs] == [0, 0, 0], outs
    if kind == "plain":  # the API with the library's defaults, as the command line's (one process fewer)
        import ppdnmf_torch as pp

        ref = pp.fit(torch.from_numpy(Z), pp.graph.ring(3), 3, columns=COLUMNS, bcd_iters=5, seed=0, fuse=False,
                     exchange=kind)
        one = {"X": ref.X, "U": ref.U, "Y": ref.Y}
    else:
        one = _one_process(tmp_path, args)
    _assert_same_bits(tmp_path, one)
    for r in range(3):
        run = tmp_path / f"site{r}" / "run"
        assert sorted(p.name for p in (tmp_path / f"site{r}").iterdir()) == ["own.npy", "run"]
        assert (run / "history.json").is_file() and (run / "summary.json").is_file()
    h = [json.loads((tmp_path / f"site{r}" / "run" / "history.json").read_text())["distributed"] for r in range(3)]
    metrics = ("nmse", "objective", "x_primal", "x_dual", "y_primal", "y_dual", "x_iters_max")
    assert [{k: d[k] for k in metrics} for d in h[1:]] == [{k: h[0][k] for k in metrics}] * 2  # reduced the same way
    assert "consensus" not in h[0] and "nmse_worst" not in h[0]  # they need other sites' X_i


def test_a_file_of_the_wrong_shape_is_one_line_before_connecting(tmp_path):
    """No other site is running: the refusal comes before the rendezvous (exit 2, at once)."""
    _data(tmp_path)
    np.save(tmp_path / "site1" / "own.npy", np.ones((20, 14)))
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, 1, free_port(), [])
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2
    lines = [ln for ln in out.splitlines() if ln.startswith("ppdnmf: error:")]
    assert lines == [("ppdnmf: error: site.data (own.npy): has shape (20, 14), this site's agents [1] hold (L, 15) "
                      "by the public description (columns [15])")], out


@pytest.mark.parametrize("args, line", [
    (["task=fsspca", "progress=false"], "ppdnmf: error: site.columns: PPDNMF's column counts; an FSSPCA site's file "
                                        "holds its worker's rows, of the public width data.n_features"),
    pytest.param(["centralized=true"], "ppdnmf: error: centralized: a site holds its own data only; the centralized "
                 "baseline needs all of it (centralized=false)", marks=pytest.mark.slow),
    pytest.param(["site.rendezvous=nowhere"], "ppdnmf: error: site.rendezvous: 'nowhere' is neither 'env' nor "
                 "host:port (e.g. 127.0.0.1:29500)", marks=pytest.mark.slow),
])
def test_what_a_site_cannot_run_is_one_line_before_connecting(tmp_path, args, line):
    _data(tmp_path)
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, 0, free_port(), args, public=PUBLIC if "task=fsspca" not in args else [])
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2 and [ln for ln in out.splitlines() if ln.startswith("ppdnmf:")] == [line], out


@pytest.mark.slow
def test_another_public_description_is_refused_at_rendezvous_saying_what_differs(tmp_path):
    _data(tmp_path)
    outs = _sites(tmp_path, extra={2: ["solver.rank=4"]})
    assert [c for c, _ in outs] == [2, 2, 2], outs
    assert ("ppdnmf: error: site: site 2 has rank=4, this site (site 0) rank=3: every site must start with the "
            "same public description") in outs[0][1]
    assert "site 0 has rank=3, this site (site 2) rank=4" in outs[2][1]


@pytest.mark.slow
def test_a_site_that_dies_ends_the_others_with_one_line_and_each_resumes_from_its_own_checkpoint(tmp_path):
    """Site 2 killed mid-run: sites 0 and 1 stop within the timeout (exit 3) with one line naming
    it; then the three, started again with ``resume=run``, finish with the bits of one process."""
    from ppdnmf_torch.distributed import free_port

    _data(tmp_path)
    long = ["solver.bcd_iters=400", "solver.tol=0", "checkpoint_every=5", "keep_checkpoints=true",
            "site.timeout=20"]
    port = free_port()
    procs = [_start(tmp_path, r, port, long) for r in range(3)]
    ck = tmp_path / "site2" / "run" / "checkpoints" / "rank002"
    t0 = time.monotonic()
    while not (ck.is_dir() and any(ck.glob("ckpt_bcd*.pt"))) and time.monotonic() - t0 < 180:
        time.sleep(0.5)
    procs[2].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    outs = [(p.wait(timeout=120), p.stdout.read()) for p in procs[:2]]
    assert time.monotonic() - killed < 20 + 30
    for code, out in outs:
        assert code == 3, out
        errors = [ln for ln in out.splitlines() if ln.startswith("ppdnmf: error:")]
        assert len(errors) == 1 and "rank 2" in errors[0], out
    outs = _sites(tmp_path, [*long, "resume=run"])
    assert [c for c, _ in outs] == [0, 0, 0], outs
    _assert_same_bits(tmp_path, _one_process(tmp_path, long[:2]))


def _api_site(kind: str, assignment: list, columns: list):
    """One site over ``env://`` (launch_local's variables): its own agents' columns only."""
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.ppdnmf.distributed import fit_site

    r = int(os.environ["RANK"])
    Z = _api_whole(columns)
    mine = [i for i, a in enumerate(assignment) if a == r]
    starts = np.cumsum([0] + columns)
    own = torch.cat([Z[:, starts[i]:starts[i + 1]] for i in mine], dim=1)
    with Comm.connect("env://", timeout=120) as comm:
        out = fit_site(comm, own, _api_graph(), 3, columns=columns, assignment=assignment, exchange=kind, seed=4,
                       bcd_iters=4, x_iters=5, y_iters=5, tol=0.0)
    return {"own": out.own, "nmse": out.result.history["nmse"]}


def _api_whole(columns):
    rng = np.random.default_rng(9)
    return torch.from_numpy(rng.random((12, 3)) @ rng.random((3, sum(columns))))


def _api_graph():
    import ppdnmf_torch as pp

    return pp.graph.ring(5)


@pytest.mark.parametrize("kind", ["plain", pytest.param("quantized", marks=pytest.mark.slow),
                                  pytest.param("secagg", marks=pytest.mark.slow)])
def test_fit_site_with_several_agents_per_site_gives_the_bits_of_fit(kind):
    """Five agents on two sites (``assignment``, not contiguous), over ``env://``: each site's
    agents' factors are ``fit``'s bits; the history's NMSE, reduced from per-site sums, equals
    ``fit``'s to 1e-12 (another summation order)."""
    import ppdnmf_torch as pp
    from ppdnmf_torch.distributed import launch_local

    columns, assignment = [6, 9, 7, 8, 5], [0, 1, 1, 0, 1]
    outs = launch_local(2, _api_site, (kind, assignment, columns), timeout=300)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    ref = pp.fit(_api_whole(columns), _api_graph(), 3, columns=columns, exchange=kind, seed=4, bcd_iters=4,
                 x_iters=5, y_iters=5, tol=0.0, fuse=False)
    for r, o in enumerate(outs):
        own = o.value["own"]
        assert own["agents"] == [i for i, a in enumerate(assignment) if a == r]
        for k, i in enumerate(own["agents"]):
            assert torch.equal(own["X"][k], ref.X[i]) and torch.equal(own["U"][k], ref.U[i])
            assert torch.equal(own["Y"][k], ref.Y[i])
        assert np.allclose(o.value["nmse"], ref.history["nmse"], rtol=1e-12, atol=0)


@pytest.mark.slow
def test_a_site_that_stops_answering_ends_the_others_naming_it(tmp_path):
    """Site 2 stopped (SIGSTOP): sites 0 and 1 end within the heartbeat (10 s) and a few seconds,
    each with one line naming site 2 (site 0, the store's host, keeps it up for a moment so that
    site 1 reads the same cause)."""
    from ppdnmf_torch.distributed import free_port

    _data(tmp_path)
    port = free_port()
    procs = [_start(tmp_path, r, port, ["solver.bcd_iters=100000", "solver.tol=0", "site.timeout=20"])
             for r in range(3)]
    try:
        time.sleep(40)
        procs[2].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        outs = [(p.wait(timeout=120), p.stdout.read()) for p in procs[:2]]
        took = time.monotonic() - t0
    finally:
        procs[2].send_signal(signal.SIGCONT)
        procs[2].wait(timeout=120)
    assert took < 10 + 10
    for r, (code, out) in enumerate(outs):
        lines = [ln for ln in out.splitlines() if ln.startswith("ppdnmf:")]
        assert code == 3 and len(lines) == 1, out
        assert lines[0].startswith(f"ppdnmf: error: rank {r}: rank 2 sent no heartbeat for ") and \
            lines[0].endswith(" s: it died or hangs"), out
