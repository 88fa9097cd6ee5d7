"""A CLI run killed mid-run (SIGINT or SIGKILL) resumes to bit-identical results."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ARGS = ["solver.bcd_iters=150", "solver.x_iters=30", "solver.y_iters=30", "checkpoint_every=1",
        "logger=none", "progress=false", "centralized=false"]


ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)  # this tree, whatever is installed
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _cli(args, cwd):
    return [sys.executable, "-m", "ppdnmf_torch", *args], dict(cwd=cwd, env=_env())


def _finished(run_dir: Path):
    factors = torch.load(run_dir / "factors.pt", weights_only=True)
    hist = json.loads((run_dir / "history.json").read_text())["distributed"]
    return factors, {k: v for k, v in hist.items() if not k.startswith("time_")}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    cmd, kw = _cli([*ARGS, f"hydra.run.dir={tmp / 'run'}"], tmp)
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, **kw)
    return _finished(tmp / "run")


def _newest_checkpoint(folder: Path) -> int:
    files = sorted(folder.glob("ckpt_bcd*.pt")) if folder.exists() else []
    return int(files[-1].stem.replace("ckpt_bcd", "")) if files else 0


# SIGKILL (no checkpoint written at the signal) in the slow run: the default run keeps SIGINT,
# and tests/test_checkpoint.py resumes from the periodic checkpoints a killed run leaves behind
@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGKILL"])
def test_killed_run_resumes_bit_identical(tmp_path, uninterrupted, sig):
    run_dir = tmp_path / "run"
    cmd, kw = _cli([*ARGS, f"hydra.run.dir={run_dir}"], tmp_path)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    deadline = time.monotonic() + 120
    while _newest_checkpoint(run_dir / "checkpoints") < 3:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    done = _newest_checkpoint(run_dir / "checkpoints")
    assert done < 150, "the run finished before the signal; the test proves nothing"
    assert not (run_dir / "factors.pt").exists()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert b"interrupted" in err and b"Traceback" not in err
        # the message gives the exact command that continues the run
        assert f"continue with: ppdnmf resume={run_dir}".encode() in err, err
    else:
        assert proc.returncode == -signal.SIGKILL
    # resume, from another working directory, by naming the run folder
    cmd, kw = _cli([f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'resume_call'}"], tmp_path)
    r = subprocess.run(cmd, capture_output=True, timeout=300, **kw)
    assert r.returncode == 0, r.stderr.decode()
    assert "final NMSE after 150 BCD iterations" in (run_dir / "ppdnmf.log").read_text()  # the run's own log
    factors, hist = _finished(run_dir)
    ref_factors, ref_hist = uninterrupted
    assert torch.equal(factors["X"], ref_factors["X"])
    assert all(torch.equal(a, b) for a, b in zip(factors["Y"], ref_factors["Y"]))
    assert hist == ref_hist


def test_resume_of_a_folder_that_is_not_a_run(tmp_path):
    cmd, kw = _cli([f"resume={tmp_path}", f"hydra.run.dir={tmp_path / 'x'}"], tmp_path)
    r = subprocess.run(cmd, capture_output=True, timeout=120, **kw)
    assert r.returncode == 2
    assert b"resume" in r.stderr and b"Traceback" not in r.stderr


def test_resume_of_a_finished_run_changes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    cmd, kw = _cli([*ARGS[1:], "solver.bcd_iters=2", f"hydra.run.dir={run_dir}"], tmp_path)
    subprocess.run(cmd, check=True, capture_output=True, timeout=300, **kw)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    cmd, kw = _cli([f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'again'}"], tmp_path)
    r = subprocess.run(cmd, capture_output=True, timeout=120, **kw)
    assert r.returncode == 2 and b"finished run" in r.stderr and b"Traceback" not in r.stderr
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == before


def test_ctrl_c_in_the_centralized_baseline_says_there_is_nothing_to_resume(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in ARGS if not a.startswith("centralized")] + ["solver.bcd_iters=100000", "centralized=true"]
    cmd, kw = _cli([*args, f"hydra.run.dir={run_dir}"], tmp_path)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)
    deadline = time.monotonic() + 60
    while not (run_dir / "config.yaml").exists():  # written before the baseline starts
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert b"centralized baseline" in err and b"nothing to resume" in err and b"checkpoint: None" not in err
    cmd, kw = _cli([f"resume={run_dir}", f"hydra.run.dir={tmp_path / 'again'}"], tmp_path)
    r = subprocess.run(cmd, capture_output=True, timeout=120, **kw)
    assert r.returncode == 2 and b"no checkpoints" in r.stderr
