"""Issue 43: one Paillier figure for the same run whichever process prints it. The calibration is
kept per machine (exchange/paillier/cc.py), read before timing; a damaged or
foreign file is ignored with one warning; ``PPDNMF_RECALIBRATE=1`` times again; the file holds
no key and no seed. The conftest points every test's cache at a folder of its own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ppdnmf_torch.exchange import QuantizedSpec
from ppdnmf_torch.exchange.paillier import calibration
from ppdnmf_torch.exchange.paillier import calibration_cache as cc

from conftest import FAKE_COSTS

ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)  # PPDNMF_CACHE: the test's folder (conftest)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    return env


def test_the_cache_lives_where_the_environment_says(calibration_cache, monkeypatch, tmp_path):
    assert cc.cache_path() == calibration_cache / cc.FILE_NAME
    monkeypatch.delenv(cc.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cc.cache_path() == tmp_path / "ppdnmf_torch" / cc.FILE_NAME


def test_a_stored_calibration_comes_back_bit_for_bit_and_keyed_by_the_settings():
    path = calibration.path_settings(QuantizedSpec(key_bits=128, n_max=1e3))
    key = cc.entry_key(128, 12, 32, path)
    other = cc.entry_key(128, 12, 32, dict(path, packing=not path["packing"]))
    assert cc.load(key) is None
    cc.store(key, FAKE_COSTS)
    assert cc.load(key) == FAKE_COSTS and cc.load(other) is None
    assert json.loads(key)["machine"] == cc.machine()


@pytest.mark.parametrize("content", ["{not json", '["a list"]', '{"format": "something else", "entries": {}}',
                                     "ENTRY"])
def test_a_damaged_or_foreign_file_is_ignored_with_one_warning(monkeypatch, content):
    key = cc.entry_key(128, 12, 32, None)
    file = cc.cache_path()
    file.parent.mkdir(parents=True)
    if content == "ENTRY":  # our format, an entry with fields PaillierOpCosts has not
        content = json.dumps({"format": cc.FORMAT, "version": cc.VERSION,
                              "entries": {key: {"encryption": "fast"}}})
    file.write_text(content, encoding="utf-8")
    monkeypatch.setattr(cc, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cc.load(key) is None
        assert cc.load(key) is None
        cc.store(key, FAKE_COSTS)  # replaces the damaged file
    assert len(caught) == 1 and "ignored" in str(caught[0].message) and str(file) in str(caught[0].message)
    assert cc.load(key) == FAKE_COSTS


def test_an_unwritable_folder_costs_the_persistence_only(monkeypatch, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    monkeypatch.setenv(cc.CACHE_ENV, str(blocker / "below"))  # a folder under a file
    monkeypatch.setattr(cc, "_WARNED", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cc.store("k", FAKE_COSTS)
    assert len(caught) == 1 and str(blocker) in str(caught[0].message)  # one warning, nothing raised


def _no_timing(monkeypatch):
    from ppdnmf_torch.exchange.paillier import keys

    def refuse(*a, **k):
        raise AssertionError("calibrated again: the cache was not read")

    monkeypatch.setattr(keys, "generate_keypair", refuse)


def test_calibrate_reads_the_file_before_timing_and_recalibrate_times_again(monkeypatch):
    key = cc.entry_key(128, 12, 32, None)
    cc.store(key, FAKE_COSTS)  # what another process measured
    monkeypatch.setattr(calibration, "_CACHE", {})
    _no_timing(monkeypatch)
    assert calibration.calibrate(128) == FAKE_COSTS  # from the file, nothing timed
    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setenv(cc.RECALIBRATE_ENV, "1")
    with pytest.raises(AssertionError, match="calibrated again"):
        calibration.calibrate(128)


@pytest.mark.crypto
def test_the_file_holds_no_key_and_no_seed(monkeypatch):
    pytest.importorskip("phe")
    from test_key_hygiene import _secrets

    from ppdnmf_torch.exchange.paillier import keys, seeds
    from ppdnmf_torch.exchange.paillier.exchange import calibrate_for

    made_keys, made_seeds = [], []
    real_gen, real_token = keys.generate_keypair, seeds._token
    monkeypatch.setattr(keys, "generate_keypair", lambda *a, **k: (lambda kp: made_keys.append(kp[1]) or kp)(
        real_gen(*a, **k)))
    monkeypatch.setattr(seeds, "_token", lambda k: (lambda s: made_seeds.append(s) or s)(real_token(k)))
    monkeypatch.setattr(calibration, "_CACHE", {})
    costs = calibrate_for(QuantizedSpec(key_bits=128, n_max=1e3, packing=True))
    assert made_keys and made_seeds  # the triangle's keys and the masked protocol's seeds
    data = cc.cache_path().read_bytes()
    assert str(costs.encryption).encode() in data
    for s in _secrets(made_keys, made_seeds):
        assert s not in data


SMALL = ["n_agents=4", "graph=ring", "data.L=6", "data.M=16", "data.K=2", "data.split.lo=2", "data.split.hi=6",
         "solver.rank=2", "solver.bcd_iters=1", "solver.x_iters=2", "solver.y_iters=2", "exchange.key_bits=128",
         "exchange.n_max=1e3", "centralized=false", "progress=false"]

#: the CLI's pre-run estimate of SMALL under exchange=paillier: the function and the arguments its
#: ``_announce`` passes (app/tasks/ppdnmf.py), its figure printed to the last bit
ESTIMATE = """
from ppdnmf_torch import graph
from ppdnmf_torch.app.costs import paillier_estimate
from ppdnmf_torch.exchange import PaillierSpec
est = paillier_estimate(PaillierSpec(key_bits=128, n_max=1e3), graph.ring(4), 6, 2, 2, 1)
print(repr(est["seconds"]))
"""


@pytest.mark.crypto
def test_two_commands_in_two_processes_print_one_figure(tmp_path, calibration_cache):
    pytest.importorskip("phe")
    env = _env()
    first = subprocess.run([sys.executable, "-c", ESTIMATE], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    file = calibration_cache / cc.FILE_NAME
    stored = file.read_bytes()  # the first process timed the path and kept it
    second = subprocess.run([sys.executable, "-m", "ppdnmf_torch", *SMALL, "exchange=quantized",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert file.read_bytes() == stored  # the second read it: nothing timed, nothing rewritten
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    # the same stored costs and the same integer counts through run_seconds: equal to the last bit
    assert float(first.stdout.strip().splitlines()[-1]) == summary["costs"]["estimated_seconds_total"]
