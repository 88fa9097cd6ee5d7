"""Serverless FSSPCA from the command line over ranks and as sites (issue 39): each entry point
once, short, with the single process's bits; a site's faults before connecting are one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from ppdnmf_torch.checkpoint import PREFIX

from site_cli import site_env

D, ROWS = 5, [12, 9]
PUBLIC = ["task=fsspca", "fsspca/variant=serverless", "graph=ring", "n_workers=2", f"data.n_features={D}",
          "exchange=plain", "solver.max_iter=4", "solver.tol=0", "serverless.center_iters=5", "alpha=0.05",
          "logger=none", "progress=false"]


def _rows(r):
    return np.random.default_rng(20 + r).standard_normal((ROWS[r], D)) + r


def _start(tmp_path, r, port, args=()):
    folder = tmp_path / f"site{r}"
    folder.mkdir(exist_ok=True)
    np.save(folder / "own.npy", _rows(r))
    cmd = [sys.executable, "-m", "ppdnmf_torch", f"site.rank={r}", "site.world=2", f"site.rendezvous=127.0.0.1:{port}",
           "site.data=own.npy", "site.timeout=60", "site.heartbeat=10", "hydra.run.dir=run", *PUBLIC, *args]
    return subprocess.Popen(cmd, cwd=folder, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _reference(config: Path):
    """fit_serverless of both sites' rows with the settings a site ran (its config.yaml)."""
    from ppdnmf_torch.app.tasks import _common as common
    from ppdnmf_torch.app.tasks.fsspca import TASK
    from ppdnmf_torch.models.fsspca.serverless import fit_serverless

    cfg = TASK.config_from_dict(yaml.safe_load(config.read_text()))
    kw = {k: v for k, v in TASK.rank_kwargs(cfg, config.parent, False).items()
          if k not in ("checkpoint_dir", "checkpoint_every", "resume")}
    graph = common.make_graphs(cfg.graph, cfg.n_workers, [cfg.seed])[0]
    return fit_serverless([torch.from_numpy(_rows(r)) for r in range(2)], cfg.n_components, graph, **kw)


def test_two_fsspca_sites_from_the_command_line_give_one_process_bits(tmp_path):
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, r, port) for r in range(2)]
    outs = [(p.wait(timeout=240), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [0, 0], outs
    ref = _reference(tmp_path / "site0" / "run" / "config.yaml")
    for r in range(2):
        run = tmp_path / f"site{r}" / "run"
        assert np.array_equal(np.load(run / "z.npy")[0], ref.z[0, r].numpy())
        assert (run / "history.csv").is_file() and not (run / "z_mean.npy").exists()
        assert f"outputs: {run}" in outs[r][1]


@pytest.mark.slow
@pytest.mark.parametrize("args, line", [
    (["data.n_features=6"], "ppdnmf: error: site.data (own.npy): has shape (12, 5); a worker's rows are "
                            "(n_i >= 1, data.n_features=6)"),
    (["n_workers=3"], "ppdnmf: error: n_workers: one worker per site, got n_workers=3 for site.world=2"),
    (["site.columns=[3,4]"], "ppdnmf: error: site.columns: PPDNMF's column counts; an FSSPCA site's file holds its "
                             "worker's rows, of the public width data.n_features"),
])
def test_what_an_fsspca_site_cannot_run_is_one_line_before_connecting(tmp_path, args, line):
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, 0, free_port(), args)
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2 and [ln for ln in out.splitlines() if ln.startswith("ppdnmf:")] == [line], out


@pytest.mark.slow
def test_serverless_fsspca_over_ranks_from_the_command_line_gives_the_one_process_bits(tmp_path):
    args = [sys.executable, "-m", "ppdnmf_torch", "task=fsspca", "fsspca/variant=serverless", "graph=ring",
            "n_workers=4", "solver.max_iter=4", "serverless.center_iters=5", "exchange=plain", "logger=none",
            "progress=false"]
    one = subprocess.run([*args, f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path, env=site_env(), capture_output=True,
                         text=True, timeout=300)
    two = subprocess.run([*args, "distributed.nproc=2", f"hydra.run.dir={tmp_path / 'two'}"], cwd=tmp_path,
                         env=site_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-2000:], two.stderr[-2000:])
    assert np.array_equal(np.load(tmp_path / "one" / "z_workers.npy"), np.load(tmp_path / "two" / "z_workers.npy"))
    assert np.array_equal(np.load(tmp_path / "one" / "z.npy"), np.load(tmp_path / "two" / "z.npy"))
    summary = yaml.safe_load((tmp_path / "two" / "summary.json").read_text())
    assert summary["distributed"]["world_size"] == 2


@pytest.mark.slow
def test_fsspca_with_a_server_over_ranks_from_the_command_line_follows_one_process(tmp_path):
    """The server on rank 0, four workers on ranks 1 and 2, the default secure sum (secagg): z
    agrees with the one-process run's to the codecs' resolution."""
    args = [sys.executable, "-m", "ppdnmf_torch", "task=fsspca", "n_workers=4", "solver.max_iter=4", "solver.tol=0",
            "logger=none", "progress=false"]
    one = subprocess.run([*args, f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path, env=site_env(), capture_output=True,
                         text=True, timeout=300)
    three = subprocess.run([*args, "distributed.nproc=3", f"hydra.run.dir={tmp_path / 'three'}"], cwd=tmp_path,
                           env=site_env(), capture_output=True, text=True, timeout=300)
    assert one.returncode == 0 and three.returncode == 0, (one.stderr[-2000:], three.stderr[-2000:])
    assert "3 ranks" in three.stdout
    z1, z3 = np.load(tmp_path / "one" / "z.npy"), np.load(tmp_path / "three" / "z.npy")
    assert np.abs(z1 - z3).max() < 1e-5


@pytest.mark.slow
def test_an_fsspca_site_with_another_description_is_refused_saying_what_differs(tmp_path):
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, 0, port), _start(tmp_path, 1, port, ["alpha=0.07"])]
    outs = [(p.wait(timeout=240), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [2, 2], outs
    assert ("ppdnmf: error: site: site 1 has alpha=0.07, this site (site 0) alpha=0.05: every site must start with "
            "the same public description") in outs[0][1]


@pytest.mark.slow
def test_an_fsspca_site_that_dies_ends_the_other_with_one_line_and_both_resume_from_their_checkpoints(tmp_path):
    """Site 1 killed mid-run: site 0 stops (exit 3) with one line naming it; started again with
    ``resume=run`` (and a cap past the newest checkpoint), both finish with one process's bits."""
    import signal
    import time

    from ppdnmf_torch.distributed import free_port

    long = ["solver.max_iter=1000000", "checkpoint_every=5", "keep_checkpoints=true", "site.timeout=20"]
    port = free_port()
    procs = [_start(tmp_path, r, port, long) for r in range(2)]
    ck = tmp_path / "site1" / "run" / "checkpoints" / "rank001"
    t0 = time.monotonic()
    while not (ck.is_dir() and any(ck.glob(f"{PREFIX}*.pt"))) and time.monotonic() - t0 < 180:
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    code, out = procs[0].wait(timeout=120), procs[0].stdout.read()
    errors = [ln for ln in out.splitlines() if ln.startswith("ppdnmf: error:")]
    assert code == 3 and len(errors) == 1 and "rank 1" in errors[0], out
    done = max(int("".join(c for c in p.stem if c.isdigit()))
               for r in range(2) for p in (tmp_path / f"site{r}" / "run" / "checkpoints").rglob(f"{PREFIX}*.pt"))
    cap = f"solver.max_iter={done + 4}"
    port = free_port()
    procs = [_start(tmp_path, r, port, [*long, "resume=run", cap]) for r in range(2)]
    outs = [(p.wait(timeout=240), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [0, 0], outs
    ref = _reference(tmp_path / "site0" / "run" / "config.yaml")
    assert int(ref.n_iter[0]) == done + 4
    for r in range(2):
        assert np.array_equal(np.load(tmp_path / f"site{r}" / "run" / "z.npy")[0], ref.z[0, r].numpy())
