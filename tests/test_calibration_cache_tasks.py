"""Issue 43: every CLI task says the Paillier estimate before a ``paillier`` run (``task=symnmf``
``variant=agents``, ``task=fsspca variant=serverless``, PPDNMF and symmetric NMF over ranks, as
PPDNMF in one process), from the same
:func:`~ppdnmf_torch.exchange.costmodel.run_seconds` and the run's predicted counts: equal to the
last bit to the figure of the ``quantized`` twin's cost model (the same op costs handed in; the
calibration itself is tests/test_calibration_cache.py's)."""
from __future__ import annotations

import logging

import pytest

from ppdnmf_torch.app import costs as app_costs
from ppdnmf_torch.app.runner import run

from conftest import FAKE_COSTS

pytest.importorskip("phe")
hydra = pytest.importorskip("hydra")
from hydra import compose, initialize_config_dir  # noqa: E402

from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config  # noqa: E402

SYMNMF = ["task=symnmf", "symnmf/variant=agents", "graph=ring", "agents.n_agents=3", "data.n=12", "rank=2",
          "agents.max_iter=3", "agents.tol=0", "agents.x_iters=2"]
PPDNMF = ["n_agents=4", "graph=ring", "data.L=6", "data.M=16", "data.K=2", "data.split.lo=2", "data.split.hi=6",
          "solver.rank=2", "solver.bcd_iters=2", "solver.x_iters=2", "solver.y_iters=1", "solver.tol=0",
          "centralized=false"]
COMMON = ["exchange.key_bits=128", "exchange.n_max=1e3", "progress=false", "logger=none"]


def _compose(overrides):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_run_config(compose(config_name="config", overrides=list(overrides)))


@pytest.fixture
def estimates(monkeypatch):
    """The estimates the runs say before they start; every calibration replaced by FAKE_COSTS."""
    from ppdnmf_torch.exchange.paillier import exchange

    monkeypatch.setattr(exchange, "calibrate_for", lambda spec: FAKE_COSTS)
    seen, real = [], app_costs.exchange_estimate
    monkeypatch.setattr(app_costs, "exchange_estimate", lambda *a, **k: (lambda e: seen.append(e) or e)(real(*a, **k)))
    return seen


def _twin(task, tmp_path):
    """The ``quantized`` twin's figure: its cost model's ``estimated_seconds_total``."""
    summary = run(_compose(task + COMMON + ["exchange=quantized"]), tmp_path / "quantized")
    return summary["costs"]["estimated_seconds_total"]


@pytest.mark.crypto
def test_symnmf_across_agents_says_the_figure_of_its_quantized_twin(tmp_path, estimates, caplog):
    with caplog.at_level(logging.INFO, logger="ppdnmf_torch.runner"):
        summary = run(_compose(SYMNMF + COMMON + ["exchange=paillier"]), tmp_path / "paillier")
    assert len(estimates) == 1 and "paillier estimate at 128-bit keys" in caplog.text
    est = estimates[0]
    # the run counted what the estimate predicted (3 iterations of 2 exchange calls: tol=0 runs them all)
    assert {k: summary["costs"][k] for k in est["counts"]} == est["counts"]
    assert est["seconds"] == _twin(SYMNMF, tmp_path)


@pytest.mark.crypto
@pytest.mark.parametrize("task", ["ppdnmf", pytest.param("symnmf", marks=pytest.mark.slow)])
def test_a_run_over_ranks_says_the_figure_of_its_quantized_twin(tmp_path, estimates, comm, task):
    from ppdnmf_torch.app.distributed import run_rank

    # symmetric NMF over ranks: the lambda sums in a plain all-reduce (its paillier aggregation has no
    # protocol across ranks); the exchange is the one the estimate prices
    overrides = PPDNMF if task == "ppdnmf" else SYMNMF + ["agents.aggregation=plain"]
    run_rank(_compose(overrides + COMMON + ["exchange=paillier"]), tmp_path / "ranks", comm)
    assert len(estimates) == 1
    assert estimates[0]["seconds"] == _twin(overrides, tmp_path)


FSSPCA = ["task=fsspca", "fsspca/variant=serverless", "graph=ring", "n_workers=3", "solver.max_iter=3", "solver.tol=0",
          "serverless.inner_iters=2", "serverless.center_iters=2"]


@pytest.mark.crypto
@pytest.mark.parametrize("consensus", ["laplacian", pytest.param("admm", marks=pytest.mark.slow)])
def test_fsspca_serverless_says_the_figure_of_its_quantized_twin(tmp_path, estimates, caplog, consensus):
    task = FSSPCA + [f"serverless.consensus={consensus}"]
    with caplog.at_level(logging.INFO, logger="ppdnmf_torch.runner"):
        summary = run(_compose(task + COMMON + ["exchange=paillier"]), tmp_path / "paillier")
    assert len(estimates) == 1 and "paillier estimate at 128-bit keys" in caplog.text
    est = estimates[0]
    # the centring's calls (d + 1 values) and the ADMM iterations' (d r values), as the run counted them
    assert {k: summary["costs"][k] for k in est["counts"]} == est["counts"]
    assert est["seconds"] == _twin(task, tmp_path)
