"""Batched trials (run_experiment / fit_trials) against trials run one by one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial, run_experiment

SHORT = dict(bcd_iters=6, x_iters=8, y_iters=8)


@pytest.mark.parametrize("exchange", ["plain", "quantized"])
def test_batched_trials_equal_one_by_one(exchange):
    nmax = {} if exchange == "plain" else {"n_max": 1e4}  # plain has no codec: n_max does not apply
    res = run_experiment("paper_synthetic", trials=4, seed=3, exchange=exchange, **nmax, **SHORT)
    assert res.history["nmse"].shape == (6, 4)
    assert res.history["consensus"].shape == (6, 4)
    assert res.history["centralized_nmse"].shape == (6, 4)
    for t in range(4):
        blocks, g = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 3 + t)
        one = pp.fit(blocks, g, 5, negative="allow", seed=3 + t, mu=0.1, eta=1.0, g_max=0.033,
                     exchange=exchange, device="cpu", **nmax, **pp.PAPER_SETTINGS, **SHORT)
        assert torch.equal(one.X, res.distributed.X[t])
        for a, b in zip(one.Y, res.distributed.trial_Y(t)):
            assert torch.equal(a, b)
        np.testing.assert_allclose(one.history["nmse"], res.history["nmse"][:, t], rtol=1e-12)
        # the batched centralized baseline is not trial-aligned: equal up to rounding, which
        # the symmetric all-ones start amplifies, so compare its first iterations tightly
        cent = pp.fit_centralized(torch.cat(blocks, dim=1), 5, negative="allow", seed=3 + t, mu=0.1, eta=1.0,
                                  g_max=0.033, device="cpu", **pp.PAPER_SETTINGS, **SHORT)
        np.testing.assert_allclose(cent.history["nmse"][:2], res.history["centralized_nmse"][:2, t], rtol=1e-10)


def test_single_trial_reproduces_a_single_run():
    res = run_experiment("paper_synthetic", trials=1, seed=5, **SHORT)
    blocks, g = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 5)
    one = pp.fit(blocks, g, 5, negative="allow", seed=5, device="cpu", exchange="plain",  # the preset's
                 **pp.PAPER_SETTINGS, **SHORT)
    assert torch.equal(one.X, res.distributed.X[0])
    assert one.history["nmse"] == res.history["nmse"][:, 0].tolist()


def test_trials_differ_in_data_graph_and_split():
    res = run_experiment("paper_synthetic", trials=3, seed=0, centralized=False, bcd_iters=1, x_iters=1, y_iters=1)
    g = res.distributed.graphs
    assert len({tuple(x.edges) for x in g}) == 3
    assert len({tuple(c) for c in res.distributed.columns}) == 3
    assert all(sum(c) == 200 for c in res.distributed.columns)
    assert all(4 <= m <= 40 for c in res.distributed.columns for m in c)


def test_summary_reports_mean_and_spread():
    res = run_experiment("paper_synthetic", trials=3, seed=0, **SHORT)
    s = res.summary()
    final = res.history["nmse"][-1]
    assert s["nmse"]["mean"] == pytest.approx(final.mean())
    assert s["nmse"]["std"] == pytest.approx(final.std(ddof=1))
    assert "centralized_nmse" in s


def test_unknown_experiment_and_override_are_refused():
    with pytest.raises(pp.ConfigError, match="unknown experiment"):
        run_experiment("paper_foo")
    with pytest.raises(pp.ConfigError, match="bogus"):
        run_experiment("paper_synthetic", bogus=1)
    with pytest.raises(pp.ConfigError, match="trials"):
        run_experiment("paper_synthetic", trials=0)


def test_cbcl_trials_use_the_faces(cbcl_path):
    res = run_experiment("paper_cbcl", trials=2, seed=0, data_path=str(cbcl_path), bcd_iters=2, x_iters=2,
                         y_iters=2, centralized=False)
    assert res.distributed.X.shape == (2, 10, 361, 49)
    assert all(224 <= m <= 245 and sum(c) == 2429 for c in res.distributed.columns for m in c)


@pytest.mark.slow
def test_paper_synthetic_100_trials():
    """The paper's claims on its synthetic setup, averaged over 100 trials."""
    res = run_experiment("paper_synthetic", trials=100, seed=0, exchange="quantized", n_max=1e6)
    dist = res.history["nmse"][-1].mean()
    cent = res.history["centralized_nmse"][-1].mean()
    assert abs(dist - cent) <= 0.05 * cent
    low = run_experiment("paper_synthetic", trials=100, seed=0, exchange="quantized", n_max=10, centralized=False)
    assert low.history["consensus"][-1].mean() > res.history["consensus"][-1].mean()


@pytest.mark.parametrize("name", ["paper_synthetic", "paper_cbcl", "incremental_synthetic", "incremental_cbcl"])
def test_hydra_experiment_configs_match_the_python_presets(name):
    """conf/experiment/*.yaml compose to the PAPER_EXPERIMENTS run configs (every section)."""
    from hydra import compose, initialize_config_dir

    from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        # the CBCL file need not exist: only the values are compared
        extra = ["data.path=/nonexistent/x.mat"] if name.endswith("cbcl") else []
        cfg = to_run_config(compose(config_name="config", overrides=[f"experiment={name}", *extra]))
    preset = PAPER_EXPERIMENTS[name]
    for section in ("graph", "solver", "exchange", "logger"):
        assert getattr(cfg, section) == getattr(preset, section), section
    assert cfg.n_agents == preset.n_agents and cfg.name == preset.name
    cfg.data.path = preset.data.path  # only the values are compared
    assert cfg.data == preset.data


def test_cbcl_experiment_takes_the_path_from_the_environment(cbcl_path, tmp_path, monkeypatch):
    # as the CLI's default does: PPDNMF_CBCL, whatever the working directory
    monkeypatch.chdir(tmp_path)  # the relative default ../shared/... does not resolve from here
    monkeypatch.setenv("PPDNMF_CBCL", str(cbcl_path))
    res = run_experiment("paper_cbcl", trials=1, seed=0, centralized=False, bcd_iters=1, x_iters=1, y_iters=1)
    assert res.history["nmse"].shape == (1, 1)
    monkeypatch.setenv("PPDNMF_CBCL", str(tmp_path / "missing.mat"))
    with pytest.raises(pp.DataError, match=r"missing\.mat.*data_path=.*PPDNMF_CBCL"):
        run_experiment("paper_cbcl", trials=1, centralized=False, bcd_iters=1, x_iters=1, y_iters=1)
