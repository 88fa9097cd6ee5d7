"""Issue 43's ETA: it starts from the run's estimate per iteration (a Paillier run's cost
estimate) and settles on the measured rate of the latest iterations within a few of them (a
fake clock: no timing here)."""
from __future__ import annotations

import logging

import pytest

from conftest import FAKE_COSTS


class _Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


def test_the_eta_starts_from_the_estimate_and_then_takes_the_measured_rate():
    from ppdnmf_torch.app.progress import Progress

    clock = _Clock()
    p = Progress(True, 100, "x", bar=False, interval=1e9, seconds_per_iteration=2.0, clock=clock)
    clock.t += 60.0  # key generation and the first iteration
    p.update(1, {})
    assert p.eta(1) == 2.0 * 99  # one iteration timed: the estimate
    assert p.line(1, {}).endswith("ETA 3 min 18 s")
    clock.t += 0.5
    p.update(2, {})
    assert p.eta(2) == pytest.approx(0.5 * 98)  # from the second on: measured, the setup left out
    without = Progress(True, 100, "x", bar=False, interval=1e9, clock=clock)
    without.update(1, {})
    assert without.eta(1) is None and "ETA" not in without.line(1, {})


@pytest.mark.parametrize("estimate", [0.1, 2.5, 40.0])
def test_the_eta_settles_within_a_few_iterations_whatever_the_estimate(estimate):
    """Iterations of 2.5 s +- 10 % after a minute of setup: the first ETA is the estimate's; from
    the second iteration on the ETA is within 20 % of the time left (the rate of the latest
    iterations and the iterations still to come each within 10 % of 2.5 s), however far off the
    estimate was."""
    from ppdnmf_torch.driver.progress import Eta

    clock = _Clock(0.0)
    steps = [2.5 * (1 + 0.1 * ((-1) ** k) * (k % 3) / 2) for k in range(30)]
    eta = Eta(30, seconds_per_iteration=estimate, clock=clock)
    clock.t += 60.0 + steps[0]
    eta.mark(1)
    assert eta.seconds(1) == estimate * 29
    for k in range(2, 30):
        clock.t += steps[k - 1]
        eta.mark(k)
        left = sum(steps[k:])
        assert abs(eta.seconds(k) - left) <= 0.2 * left, k
    assert eta.seconds(30) is None


def test_the_estimators_progress_shares_the_eta():
    import io

    from ppdnmf_torch.driver.progress import FitProgress

    p = FitProgress(2, 10, "Test", file=io.StringIO(), bar=False)
    p._eta._clock = clock = _Clock()
    p.update(1, {})
    clock.t += 3.0
    p.update(2, {})
    assert p.eta(2) == pytest.approx(3.0 * 8)


def test_the_cli_hands_the_estimate_to_the_progress(monkeypatch, caplog):
    pytest.importorskip("phe")
    from ppdnmf_torch.app.costs import paillier_estimate
    from ppdnmf_torch.app.tasks import ppdnmf as task
    from ppdnmf_torch.exchange.paillier import exchange
    from ppdnmf_torch.models.ppdnmf.config import from_dict

    monkeypatch.setattr(exchange, "calibrate_for", lambda spec: FAKE_COSTS)
    cfg = from_dict({"n_agents": 4, "centralized": False, "progress": False, "graph": {"kind": "ring"},
                     "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2},
                     "solver": {"rank": 2, "bcd_iters": 5, "x_iters": 3, "y_iters": 1},
                     "exchange": {"kind": "paillier", "n_max": 1e3, "key_bits": 128, "workers": 0}})
    inputs = task.build_inputs(cfg)
    with caplog.at_level(logging.INFO, logger="ppdnmf_torch"):
        per = task._announce(cfg, inputs, 2)  # resumed after 2 of 5 BCD iterations
    est = paillier_estimate(cfg.exchange, inputs.graph, 8, 2, 3, 3, op_costs=FAKE_COSTS)
    assert per == est["seconds_operations"] / 3
    assert any(r.getMessage().startswith("paillier estimate at 128-bit keys") for r in caplog.records)
