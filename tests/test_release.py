"""Issue 19's CLI and runner parts: threads, progress off a terminal, the Paillier cost up front,
batched trials from the CLI, outputs and TensorBoard (in-process unless a subprocess is the point)."""
from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.models.ppdnmf.config import from_dict
from ppdnmf_torch.app.runner import run

from conftest import FAKE_COSTS, small_problem

ROOT = Path(__file__).resolve().parents[1]
RING4 = graph.ring(4)


def _cfg(**over) -> dict:
    d = {"n_agents": 4, "centralized": False, "progress": False, "checkpoint_every": 1,
         "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2}, "graph": {"kind": "ring"},
         "solver": {"rank": 2, "bcd_iters": 3, "x_iters": 2, "y_iters": 2}, "logger": {"kind": "none"}}
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


# --------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------


@pytest.fixture
def clean_thread_env(monkeypatch):
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(k, raising=False)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_fit_sets_threads_for_the_call_and_restores_them(clean_thread_env):
    torch.set_num_threads(2)
    seen = []
    pp.fit(small_problem(), RING4, 2, bcd_iters=1, x_iters=1, y_iters=1, device="cpu", threads=1,
           callback=lambda info: seen.append(torch.get_num_threads()))
    assert seen == [1] and torch.get_num_threads() == 2
    pp.fit(small_problem(), RING4, 2, bcd_iters=1, x_iters=1, y_iters=1, device="cpu",
           callback=lambda info: seen.append(torch.get_num_threads()))
    assert seen[-1] == 1 and torch.get_num_threads() == 2  # the default: one thread


def test_an_explicit_omp_num_threads_wins_over_the_default(clean_thread_env, monkeypatch):
    from ppdnmf_torch.threads import default_threads

    assert default_threads() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    assert default_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_integer(bad):
    with pytest.raises(pp.ConfigError, match=r"^threads: "):
        pp.fit(small_problem(), RING4, 2, bcd_iters=1, device="cpu", threads=bad)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_bound_numpys_blas_during_a_fit_and_are_restored(threads):
    # the host plans multiply with NumPy: its BLAS must follow threads=, not its own default
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas():
        return sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})

    if not blas():
        pytest.skip("no BLAS thread pool visible to threadpoolctl")
    seen = []
    with threadpool_limits(limits=3, user_api="blas"):
        pp.fit(small_problem(), RING4, 2, bcd_iters=2, device="cpu", threads=threads,
               callback=lambda info: seen.append(blas()))
        assert blas() == [3]
    assert seen and all(s == [threads] for s in seen)


def test_the_config_threads_setting_reaches_the_run_and_is_restored(tmp_path, clean_thread_env):
    torch.set_num_threads(2)
    seen = []
    summary = run(from_dict(_cfg(threads=1)), tmp_path / "t", callback=lambda info: seen.append(torch.get_num_threads()))
    assert seen == [1, 1, 1] and summary["threads"] == 1 and torch.get_num_threads() == 2
    with pytest.raises(pp.ConfigError, match=r"^threads: must be >= 1"):
        from_dict(_cfg(threads=0))


# --------------------------------------------------------------------------------------
# Progress
# --------------------------------------------------------------------------------------


def test_progress_lines_off_a_terminal(caplog):
    from ppdnmf_torch.app.progress import Progress

    with caplog.at_level(logging.INFO, logger="ppdnmf_torch.progress"):
        with Progress(True, 4, "PPDNMF (plain)", interval=3600.0, bar=False) as bar:
            for i in range(1, 5):
                bar.update(i, {"nmse": 0.5 / i, "consensus": 1e-3, "central": 0.1})
    lines = [r.getMessage() for r in caplog.records]
    # the first and the last iteration always; in between, one line per interval
    assert len(lines) == 2 and lines[0].startswith("PPDNMF (plain): BCD iteration 1/4, NMSE 0.5, consensus 0.001")
    # no ETA after the first iteration alone (its setup would make it wild), nor after the last
    assert "centralized 0.1" in lines[0] and "ETA" not in lines[0] and "elapsed" in lines[1]
    assert lines[1].startswith("PPDNMF (plain): BCD iteration 4/4") and "ETA" not in lines[1]
    with Progress(True, 4, "x", interval=0.0, bar=False) as bar:
        for i in range(1, 3):
            bar.update(i, {})
        assert "ETA" in bar.line(2, {})


def test_progress_of_a_resumed_run_counts_from_its_checkpoint(caplog):
    from ppdnmf_torch.app.progress import Progress, format_seconds

    with caplog.at_level(logging.INFO, logger="ppdnmf_torch.progress"):
        with Progress(True, 10, "x", interval=0.0, start=6, bar=False) as bar:
            bar.update(7, {"nmse": 0.2})
    assert "BCD iteration 7/10" in caplog.records[0].getMessage()
    assert [format_seconds(s) for s in (4.24, 192, 8340)] == ["4.2 s", "3 min 12 s", "2 h 19 min"]


def test_fuse_compilation_is_announced(caplog):
    from ppdnmf_torch.models.ppdnmf.inputs import build_inputs
    from ppdnmf_torch.app.tasks.ppdnmf import _announce

    cfg = from_dict(_cfg(solver={"fuse": True}))
    with caplog.at_level(logging.INFO, logger="ppdnmf_torch.runner"):
        _announce(cfg, build_inputs(cfg), 0)
    assert any("fuse=true: compiling the solver's iterations" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------
# The Paillier cost up front, and costs with units
# --------------------------------------------------------------------------------------


def test_paillier_estimate_counts_what_the_run_does():
    pytest.importorskip("phe")
    from ppdnmf_torch.app.costs import paillier_estimate
    from ppdnmf_torch.exchange import PaillierSpec

    spec = PaillierSpec(n_max=1e3, key_bits=128, workers=0)
    blocks = small_problem()
    est = paillier_estimate(spec, RING4, blocks[0].shape[0], 2, 2, 2, op_costs=FAKE_COSTS)
    res = pp.fit(blocks, RING4, 2, bcd_iters=2, x_iters=2, y_iters=1, device="cpu", exchange=spec)
    for k in ("encryptions", "decryptions", "homomorphic_additions", "scalar_multiplications"):
        assert est["counts"][k] == res.costs[k], k
    assert est["ciphertext_bytes"] == res.costs["ciphertext_bytes"]
    assert est["seconds_keygen"] == pytest.approx(4 * FAKE_COSTS.keygen)


def test_paillier_estimate_names_the_faster_switches():
    from ppdnmf_torch.app.costs import format_estimate, paillier_estimate
    from ppdnmf_torch.exchange import PaillierSpec

    spec = PaillierSpec(n_max=1e3, key_bits=128, packing=False, precompute=False, workers=0)
    text = format_estimate(spec, paillier_estimate(spec, RING4, 8, 2, 30, 100, op_costs=FAKE_COSTS))
    first, faster = text.splitlines()
    assert first.startswith("paillier estimate at 128-bit keys (protocol=masked, fast=true, packing=false")
    assert " s " in first or " min " in first or " h " in first
    assert "of ciphertexts" in first and "encryptions" in first
    for switch in ("exchange.djn=true", "exchange.packing=true", "exchange.precompute=true", "exchange.workers="):
        assert switch in faster, switch
    assert "assumes DCR" in faster and "assumes the values fit their slots" in faster


@pytest.mark.crypto
def test_a_paillier_run_logs_its_estimate_first_and_its_costs_with_units(tmp_path, caplog):
    pytest.importorskip("phe")
    from ppdnmf_torch.app.outputs import format_summary

    cfg = from_dict(_cfg(exchange={"kind": "paillier", "n_max": 1e3, "key_bits": 128, "workers": 0}))
    with caplog.at_level(logging.INFO, logger="ppdnmf_torch"):
        summary = run(cfg, tmp_path / "p")
    assert any(r.getMessage().startswith("paillier estimate at 128-bit keys") for r in caplog.records)
    line = next(ln for ln in format_summary(summary).splitlines() if ln.startswith("exchange costs:"))
    assert "encryptions" in line and " kB of ciphertexts" in line or " B of ciphertexts" in line
    assert "key generation " in line and " s," in line


def test_costs_are_formatted_with_units():
    from ppdnmf_torch.app.costs import format_bytes, format_costs

    text = format_costs({"encryptions": 12345, "ciphertext_bytes": 2.5e6, "time_encrypt": 1.25, "key_pairs": 4})
    assert text == "12,345 encryptions, 4 key pairs, 2.5 MB of ciphertexts; time: encryption 1.25 s"
    assert [format_bytes(b) for b in (512, 4096, 3.2e9)] == ["512 B", "4.1 kB", "3.2 GB"]


# --------------------------------------------------------------------------------------
# Batched trials
# --------------------------------------------------------------------------------------


def test_trials_run_batched_and_write_per_trial_outputs(tmp_path):
    from ppdnmf_torch.models.ppdnmf.experiments import run_experiment

    cfg = from_dict(_cfg(trials=3, centralized=True, seed=5))
    summary = run(cfg, tmp_path / "t")
    out = tmp_path / "t"
    ref = run_experiment(from_dict(_cfg(seed=5)), trials=3, seed=5, centralized=True, device="cpu")
    trials = _rows(out / "trials.csv")
    assert [int(r["seed"]) for r in trials] == [5, 6, 7]
    assert [float(r["nmse"]) for r in trials] == pytest.approx(ref.history["nmse"][-1].tolist(), rel=0, abs=0)
    hist = _rows(out / "history.csv")
    assert len(hist) == 9 and {"trial", "seed", "iteration", "nmse", "consensus"} <= set(hist[0])
    s = json.loads((out / "summary.json").read_text())
    assert s["trials"] == 3 and s["seeds"] == [5, 6, 7]
    assert s["nmse"]["distributed"]["mean"] == pytest.approx(float(ref.history["nmse"][-1].mean()))
    assert set(s["nmse"]["centralized"]) == {"mean", "std", "min", "max"}
    f = torch.load(out / "factors.pt", weights_only=True)
    assert f["X_mean"].shape == (3, 8, 2) and f["seeds"].tolist() == [5, 6, 7]
    # trial 0 of the batch is the single run with that seed
    single = run(from_dict(_cfg(seed=5)), tmp_path / "single")
    assert float(trials[0]["nmse"]) == single["nmse"]["distributed"]
    assert summary["nmse"]["distributed"]["mean"] == s["nmse"]["distributed"]["mean"]


def test_trials_cannot_be_resumed():
    with pytest.raises(pp.ConfigError, match=r"^trials: batched trials keep no checkpoints"):
        from_dict(_cfg(trials=2, resume="somewhere"))


@pytest.mark.slow
def test_cli_trials_and_a_multirun_over_another_key(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    args = ["trials=4", "solver.bcd_iters=2", "solver.x_iters=2", "solver.y_iters=2", "logger=none"]
    r = subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args, f"hydra.run.dir={tmp_path / 'one'}"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "4 trials (seeds 0..3)" in r.stdout and (tmp_path / "one" / "trials.csv").is_file()
    r = subprocess.run([sys.executable, "-m", "ppdnmf_torch", "-m", "solver.mu=0.1,0.2", *args,
                        f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert all(len(_rows(tmp_path / "sweep" / j / "trials.csv")) == 4 for j in ("0", "1"))


# --------------------------------------------------------------------------------------
# Outputs and TensorBoard
# --------------------------------------------------------------------------------------


def test_a_csv_run_carries_the_data_sets_name(tmp_path):
    Z = torch.cat(small_problem(counts=(5, 5, 5, 5)), dim=1)
    with open(tmp_path / "faces.csv", "w") as fh:
        for row in Z.tolist():
            fh.write(",".join(f"{v:.17g}" for v in row) + "\n")
    d = _cfg(name="paper_synthetic", data={"kind": "csv", "path": str(tmp_path / "faces.csv"), "negative": "error"},
             logger={"kind": "tensorboard"})
    for k in ("L", "M", "K"):
        d["data"].pop(k)
    summary = run(from_dict(d), tmp_path / "run")
    assert summary["name"] == "faces.csv" and summary["data"] == {"kind": "csv", "name": "faces.csv", "scale": 1.0}
    from test_cli import _hparams

    hp = _hparams(tmp_path / "run" / "tb")
    assert hp["dataset"] == "faces.csv" and hp["name"] == "faces.csv" and hp["device"] == "cpu"


@pytest.mark.crypto
def test_tensorboard_hparams_carry_the_crypto_switches_and_costs(tmp_path):
    pytest.importorskip("phe")
    from test_cli import _hparams, _scalars

    cfg = from_dict(_cfg(logger={"kind": "tensorboard"},
                         exchange={"kind": "paillier", "n_max": 1e3, "key_bits": 128, "workers": 0, "djn": True}))
    run(cfg, tmp_path / "p")
    hp = _hparams(tmp_path / "p" / "tb")
    assert hp["key_bits"] == 128 and hp["exchange.djn"] == "true" and hp["exchange.packing"] == "true"
    tags = set(_scalars(tmp_path / "p" / "tb").Tags()["scalars"])
    assert {"hparam/crypto_encryptions", "hparam/crypto_ciphertext_MB", "hparam/crypto_time_keygen"} <= tags


def test_a_resumed_run_shows_every_tensorboard_step_once(tmp_path):
    from ppdnmf_torch.app.tensorboard import TensorBoardLogger
    from test_cli import _scalars

    class Info:
        def __init__(self, i):
            self.iteration, self.metrics, self.costs, self.iteration_costs = i, {"nmse": 1.0 / i}, {}, [
                {"bcd_iter": i, "admm_iter": a, "encryptions": 1} for a in (1, 2)]

    with TensorBoardLogger(tmp_path) as tb:  # the first segment got to 5; its checkpoint is of 3
        tb.centralized({"nmse": [0.5, 0.4]})
        for i in range(1, 6):
            tb.iteration(Info(i), 2)
    with TensorBoardLogger(tmp_path, resume_at=3, x_iters=2) as tb:
        tb.centralized({"nmse": [0.5, 0.4]})  # the resumed run runs its baseline again
        for i in range(4, 7):
            tb.iteration(Info(i), 2)
    acc = _scalars(tmp_path)
    assert [e.step for e in acc.Scalars("1_nmse/distributed")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in acc.Scalars("1_nmse/centralized")] == [1, 2]
    assert [e.step for e in acc.Scalars("crypto_admm/encryptions")] == list(range(1, 13))
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
