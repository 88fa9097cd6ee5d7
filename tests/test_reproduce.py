"""Smoke test of scripts/reproduce_paper.py: tiny sweeps, every output written and consistent."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reproduce_paper.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("reproduce_paper", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _read_csv(path: Path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], np.array([[float(x) for x in r] for r in rows[1:]])


def _check_curves(result, key: str, n_iter: int):
    header, data = _read_csv(result["csv"][key])
    assert header[0] == "iteration"
    assert data.shape[0] == n_iter
    np.testing.assert_array_equal(data[:, 0], np.arange(1, n_iter + 1))
    curves = result["curves"][key]
    for label, (mean, std) in curves.items():
        np.testing.assert_array_equal(data[:, header.index(f"{label}_mean")], mean)
        np.testing.assert_array_equal(data[:, header.index(f"{label}_std")], std)
    return curves


def test_reproduce_smoke(tmp_path, cbcl_path_or_none):
    mod = _load_script()
    out, figs = tmp_path / "out", tmp_path / "figs"
    argv = ["--out", str(out), "--figures-dir", str(figs), "--trials", "2", "--bcd-iters", "3",
            "--admm-iters", "5", "--nmax", "10,1e6", "--no-paillier-check", "--quiet"]
    if cbcl_path_or_none is None:
        argv.append("--skip-cbcl")
    else:
        argv += ["--data-path", str(cbcl_path_or_none), "--trials-cbcl", "1", "--bcd-iters-cbcl", "1"]
    res = mod.main(argv)

    a = _check_curves(res, "fig1a_synthetic_nmse", 3)
    assert set(a) == {"nmax_1e1", "nmax_1e6", "centralized"}
    sw = res["sweeps"]["synthetic"]
    # mean/std are over the trials of the run's history
    np.testing.assert_allclose(a["nmax_1e6"][0], sw["runs"][1e6]["nmse"].mean(axis=1))
    np.testing.assert_allclose(a["nmax_1e6"][1], sw["runs"][1e6]["nmse"].std(axis=1, ddof=1))
    np.testing.assert_allclose(a["centralized"][0], sw["centralized"]["nmse"].mean(axis=1))
    assert sw["runs"][1e6]["nmse"].shape == (3, 2)
    c = _check_curves(res, "consensus_synthetic", 3)
    np.testing.assert_allclose(c["nmax_1e1"][0], sw["runs"][10.0]["consensus"].mean(axis=1))

    keys = ["fig1a_synthetic_nmse", "consensus_synthetic"]
    if cbcl_path_or_none is not None:
        _check_curves(res, "fig1b_cbcl_nmse", 1)
        _check_curves(res, "consensus_cbcl", 1)
        keys += ["fig1b_cbcl_nmse", "consensus_cbcl", "fig1c_cbcl_faces"]
        faces = res["faces"]
        assert [f["number"] for f in faces] == [1, 2429]
        assert (faces[0]["agent"], faces[0]["local_column"]) == (0, 0)
        assert faces[1]["agent"] == 9
        header, data = _read_csv(res["csv"]["fig1c_cbcl_faces"])
        assert data.shape == (361, 6)
        np.testing.assert_array_equal(data[:, 2], faces[0]["original"][data[:, 0].astype(int),
                                                                       data[:, 1].astype(int)])
        np.testing.assert_array_equal(data[:, 5], faces[1]["reconstruction"][data[:, 0].astype(int),
                                                                             data[:, 1].astype(int)])
    for k in keys:
        png = res["figures"][k]
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size < 300_000
        assert (figs / png.name).exists()

    with open(res["csv"]["final_values"], newline="") as fh:
        fv = list(csv.DictReader(fh))
    syn = [r for r in fv if r["dataset"] == "synthetic" and r["curve"] == "nmax_1e6"]
    assert [int(r["seed"]) for r in syn] == [0, 1]
    np.testing.assert_array_equal([float(r["final_nmse"]) for r in syn], sw["runs"][1e6]["nmse"][-1])

    # redraw from the CSVs alone
    for k in keys:
        res["figures"][k].unlink()
    redrawn = mod.main(["--replot", str(out), "--no-copy-figures", "--quiet"])["figures"]
    assert set(redrawn) == set(keys) and all(p.exists() for p in redrawn.values())

    summary = json.loads((out / "summary.json").read_text())
    rows = summary["experiments"]["synthetic"]["rows"]
    assert [r["curve"] for r in rows] == ["nmax_1e1", "nmax_1e6", "centralized"]
    assert rows[1]["final_nmse_mean"] == pytest.approx(a["nmax_1e6"][0][-1])
    assert rows[1]["final_nmse_std"] == pytest.approx(a["nmax_1e6"][1][-1])
    assert rows[2]["final_nmse_mean"] == pytest.approx(a["centralized"][0][-1])
    diff = sw["runs"][10.0]["nmse"][-1] - sw["centralized"]["nmse"][-1]
    assert rows[0]["nmse_minus_centralized"]["mean"] == pytest.approx(diff.mean())
    assert summary["machine"]["cpu_count"] >= 1 and summary["machine"]["torch"]
    assert "| centralized |" in (out / "summary.md").read_text()
    assert any((out / "tb").iterdir())


def test_missing_default_cbcl_is_skipped_with_a_message(tmp_path, monkeypatch, capsys):
    mod = _load_script()
    monkeypatch.setattr(mod, "REPO_ROOT", tmp_path / "nowhere" / "repo")
    monkeypatch.delenv("PPDNMF_CBCL", raising=False)  # no default path: the message says where to get it
    res = mod.main(["--out", str(tmp_path / "o"), "--no-copy-figures", "--no-tensorboard", "--trials", "1",
                    "--bcd-iters", "1", "--admm-iters", "2", "--nmax", "1e3", "--skip-synthetic",
                    "--no-paillier-check"])
    assert "cbcl" not in res["curves"] and not res["figures"]
    why = res["summary"]["experiments"]["cbcl"]["skipped"]
    assert "no CBCL data path given" in why and "cbcl.mit.edu" in why and "--data-path" in why
    assert "skipped" in capsys.readouterr().out


def test_batching_does_not_change_the_numbers():
    mod = _load_script()
    kw = dict(name="paper_synthetic", trials=3, nmax_list=[1e2], seed=4, device="cpu", dtype=torch.float64,
              fit_over={"bcd_iters": 2, "x_iters": 3, "y_iters": 3}, data_path=None, log=mod._Log(True))
    whole = mod.run_sweep(batch=0, **kw)
    ones = mod.run_sweep(batch=2, **kw)
    for key in ("nmse", "consensus"):
        np.testing.assert_array_equal(whole["runs"][1e2][key], ones["runs"][1e2][key])
    np.testing.assert_array_equal(whole["centralized"]["nmse"], ones["centralized"]["nmse"])
    assert ones["keep"].distributed.seeds == [4, 5]


@pytest.mark.crypto
def test_paillier_check_matches_quantized(tmp_path):
    pytest.importorskip("phe")
    mod = _load_script()
    pc = mod.paillier_check(trials=1, bcd_iters=1, admm_iters=2, key_bits=128, seed=0, nmax=1e6,
                            log=mod._Log(True))
    assert pc["status"] == "ok", pc
    t = pc["trials"][0]
    assert t["identical"] and t["max_abs_nmse_diff"] == 0.0
    assert t["costs"].get("encryptions", 0) > 0


@pytest.fixture
def cbcl_path_or_none():
    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "cbcl_faces_train.mat"
    return path if path.exists() else None
