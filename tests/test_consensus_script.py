"""scripts/reproduce_incremental.py: the smoke run writes its figures and numbers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reproduce_incremental", ROOT / "scripts" / "reproduce_incremental.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("argv", [["--trials", "0"], ["--rounds", "-1"], ["--bogus"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _script()._args(argv)
    assert e.value.code == 2 and argv[0] in capsys.readouterr().err


@pytest.mark.slow
def test_quick_run_writes_figures_and_summary(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    figs = tmp_path / "figs"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce_incremental.py"), "--quick",
                        "--out", str(tmp_path / "out"), "--figures-dir", str(figs)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    names = {p.name for p in figs.iterdir()}
    assert names == {"incremental_ls_accuracy.png", "incremental_logistic_accuracy.png",
                     "incremental_privacy_ls.png", "incremental_privacy_logistic.png"}
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    rec = s["ls"]["privacy"]["I-ADMM"]["recursion (11)"]
    assert rec["x_err_max"] < 1e-10 and rec["y_err_max"] < 1e-10      # I-ADMM is not private
    final = {r["method"]: r["final_median"] for r in s["ls"]["accuracy"]}
    assert final["I-ADMM"] < 1e-20 and final["PI-ADMM1"] < 1e-16 and final["PI-ADMM2 sigma=0.01"] > 1e-6
