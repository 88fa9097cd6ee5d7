"""FSSPCA with a server as sites from the command line (issue 39): ``ppdnmf task=fsspca
fsspca/variant=server site.rank=0 ...`` (the server, no ``site.data``) and the workers'
``site.rank=i site.data=own.npy``; a wrong file is one line before connecting (the default run's
test), the rest slow."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from site_cli import site_env

D, ROWS = 6, [8, 9]
PUBLIC = ["task=fsspca", "fsspca/variant=server", "n_workers=2", f"data.n_features={D}", "solver.max_iter=4",
          "solver.tol=0", "alpha=0.05", "logger=none", "progress=false"]


def _rows(i):
    return np.random.default_rng(30 + i).standard_normal((ROWS[i], D)) + 1.0 + i


def _start(tmp_path, r, port, args=(), data=None):
    """Site ``r``: the server (0, no data file) or worker ``r - 1`` with its own rows in its folder."""
    folder = tmp_path / f"site{r}"
    folder.mkdir(exist_ok=True)
    own = []
    if r > 0 or data is not None:
        np.save(folder / "own.npy", _rows(r - 1) if data is None else data)
        own = ["site.data=own.npy"]
    cmd = [sys.executable, "-m", "ppdnmf_torch", f"site.rank={r}", "site.world=3", f"site.rendezvous=127.0.0.1:{port}",
           *own, "site.timeout=60", "site.heartbeat=10", "hydra.run.dir=run", *PUBLIC, *args]
    return subprocess.Popen(cmd, cwd=folder, env=site_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _errors(out: str) -> list:
    return [ln for ln in out.splitlines() if ln.startswith("ppdnmf:")]


def test_a_worker_site_given_rows_of_another_width_is_one_line_before_connecting(tmp_path):
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, 1, free_port(), data=np.zeros((7, D + 1)))
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2 and _errors(out) == [f"ppdnmf: error: site.data (own.npy): has shape (7, {D + 1}); a worker's "
                                          f"rows are (n_i >= 1, data.n_features={D})"], out


@pytest.mark.slow
@pytest.mark.parametrize("r, args, data, line", [
    (0, [], np.zeros((3, D)), "ppdnmf: error: site.data: the server (site 0) holds no rows; leave site.data out, "
                              "got 'own.npy'"),
    (0, ["n_workers=3"], None, "ppdnmf: error: n_workers: one worker per site beside the server (site 0), got "
                               "n_workers=3 for site.world=3"),
])
def test_what_a_server_site_cannot_run_is_one_line_before_connecting(tmp_path, r, args, data, line):
    from ppdnmf_torch.distributed import free_port

    p = _start(tmp_path, r, free_port(), args, data)
    code, out = p.wait(timeout=120), p.stdout.read()
    assert code == 2 and _errors(out) == [line], out


@pytest.mark.slow
@pytest.mark.crypto
def test_a_server_site_and_two_worker_sites_from_the_command_line_follow_fit_fsspca(tmp_path):
    """The default secure sum (solver.aggregation=secagg): every site writes the same z, within the
    server-over-ranks tests' 1e-6 of fit_fsspca's (aggregation="plain") with the settings the
    sites ran; the server's folder holds no rows and its summary says so."""
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, r, port) for r in range(3)]
    outs = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [0, 0, 0], outs
    ref = _reference(tmp_path / "site1" / "run" / "config.yaml")
    zs = [np.load(tmp_path / f"site{r}" / "run" / "z.npy") for r in range(3)]
    assert all(np.array_equal(zs[0], z) for z in zs)
    assert np.abs(zs[0][0] - ref.z[0].numpy()).max() < 1e-6
    server = yaml.safe_load((tmp_path / "site0" / "run" / "summary.json").read_text())
    assert server["site"]["rows"] == 0 and server["site"]["workers"] == []
    assert sorted(p.name for p in (tmp_path / "site0").iterdir()) == ["run"]


@pytest.mark.slow
def test_a_server_site_run_with_another_description_is_refused_naming_the_field(tmp_path):
    from ppdnmf_torch.distributed import free_port

    port = free_port()
    procs = [_start(tmp_path, 0, port), _start(tmp_path, 1, port), _start(tmp_path, 2, port, ["alpha=0.07"])]
    outs = [(p.wait(timeout=240), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [2, 2, 2], outs
    assert _errors(outs[0][1]) == ["ppdnmf: error: site: site 2 has alpha=0.07, this site (site 0) alpha=0.05: every "
                                   "site must start with the same public description"], outs[0][1]


def _reference(config: Path):
    """fit_fsspca (aggregation="plain") of both workers' rows with the settings the sites ran."""
    from ppdnmf_torch.app.tasks.fsspca import TASK
    from ppdnmf_torch.models.fsspca import fit_fsspca
    from ppdnmf_torch.models.fsspca.server_ranks import SERVER_SETTINGS

    cfg = TASK.config_from_dict(yaml.safe_load(config.read_text()))
    s = {k: v for k, v in {**asdict(cfg.solver), "alpha": cfg.alpha, "seed": cfg.seed}.items() if k in SERVER_SETTINGS}
    return fit_fsspca([torch.from_numpy(_rows(i)) for i in range(2)], cfg.n_components, aggregation="plain", **s)


@pytest.mark.slow
@pytest.mark.crypto
def test_a_killed_worker_site_ends_the_others_and_all_resume_from_their_run_folders(tmp_path):
    """Worker site 2 killed mid-run: the others stop (exit 3) with one line naming it; the same
    commands with ``resume=run`` (a cap past the newest checkpoint) finish with z within 1e-6 of
    fit_fsspca's to that cap (the Python test shows the resumed bits equal the uninterrupted run's)."""
    import signal
    import time

    from ppdnmf_torch.checkpoint import PREFIX
    from ppdnmf_torch.distributed import free_port

    long = ["solver.max_iter=1000000", "checkpoint_every=5", "keep_checkpoints=true", "site.timeout=20"]
    port = free_port()
    procs = [_start(tmp_path, r, port, long) for r in range(3)]
    ck = tmp_path / "site2" / "run" / "checkpoints" / "rank002"
    t0 = time.monotonic()
    # a finished checkpoint (the writer's temporary .tmp_*.pt would match "*.pt" before its rename)
    while not (ck.is_dir() and any(ck.glob(f"{PREFIX}*.pt"))) and time.monotonic() - t0 < 180:
        time.sleep(0.2)
    procs[2].send_signal(signal.SIGKILL)
    for p in procs[:2]:
        code, out = p.wait(timeout=120), p.stdout.read()
        errors = [ln for ln in out.splitlines() if ln.startswith("ppdnmf: error:")]
        assert code == 3 and len(errors) == 1 and "rank 2" in errors[0], out
    done = max(int("".join(c for c in p.stem if c.isdigit()))
               for r in range(3) for p in (tmp_path / f"site{r}" / "run" / "checkpoints").rglob(f"{PREFIX}*.pt"))
    port = free_port()
    procs = [_start(tmp_path, r, port, [*long, "resume=run", f"solver.max_iter={done + 4}"]) for r in range(3)]
    outs = [(p.wait(timeout=300), p.stdout.read()) for p in procs]
    assert [c for c, _ in outs] == [0, 0, 0], outs
    ref = _reference(tmp_path / "site1" / "run" / "config.yaml")
    assert int(ref.n_iter[0]) == done + 4
    for r in range(3):
        z = np.load(tmp_path / f"site{r}" / "run" / "z.npy")
        assert np.abs(z[0] - ref.z[0].numpy()).max() < 1e-6, r
