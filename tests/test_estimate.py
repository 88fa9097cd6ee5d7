"""Issue 43's Paillier estimate: one figure for the same run whichever command prints it (the
CLI's estimate before a ``paillier`` run, a ``quantized`` run's cost model, a ``paillier`` run's
own ``cost_model``), the key generation counted once and only when the run generates keys (the
same op costs handed in: no timing here; tests/test_progress_eta.py has the ETA)."""
from __future__ import annotations

import pytest

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.exchange import PaillierSpec, QuantizedSpec
from ppdnmf_torch.exchange.costmodel import ESTIMATE_KEYS, run_seconds

from conftest import FAKE_COSTS, small_problem

RING4 = graph.ring(4)


def _same_run(protocol, packing):
    """The CLI's estimate of a run and the ``quantized`` twin's cost model, the same op costs."""
    from ppdnmf_torch.app.costs import paillier_estimate

    blocks = small_problem(L=8, counts=(3, 5, 4, 6))
    spec = PaillierSpec(protocol=protocol, n_max=1e3, key_bits=128, packing=packing, workers=0)
    est = paillier_estimate(spec, RING4, blocks[0].shape[0], 2, 2, 3, op_costs=FAKE_COSTS)
    twin = QuantizedSpec(protocol=protocol, n_max=1e3, key_bits=128, packing=packing, cost_model=FAKE_COSTS)
    res = pp.fit(blocks, RING4, 2, bcd_iters=3, x_iters=2, y_iters=1, device="cpu", exchange=twin)
    return est, res.costs


@pytest.mark.parametrize("protocol", ["masked", "aggregated", "paper"])
@pytest.mark.parametrize("packing", [True, False])
def test_the_cli_estimate_and_the_quantized_cost_model_print_one_figure(protocol, packing):
    est, costs = _same_run(protocol, packing)
    # the same integer counts through the same function: equal to the last bit
    for k in ESTIMATE_KEYS:
        if k in costs:
            assert est["costs"][k] == costs[k], k
    assert est["seconds"] == costs["estimated_seconds_total"]
    assert est["seconds_keygen"] == costs["estimated_seconds_keygen"] == 4 * FAKE_COSTS.keygen
    assert ("estimated_seconds_setup" in costs) == (protocol == "masked")


def test_the_costs_line_of_the_run_says_the_figure_of_the_estimate():
    from ppdnmf_torch.app.costs import format_costs, format_estimate

    est, costs = _same_run("masked", True)
    before = format_estimate(PaillierSpec(n_max=1e3, key_bits=128, workers=0), est).splitlines()[0]
    after = format_costs(costs)
    assert f"about {est['seconds']:.1f} s" in before  # format_seconds below a minute
    assert f"estimated in all (cost model) {est['seconds']:.3g} s" in after


def test_run_seconds_counts_the_key_generation_once_and_only_for_keys_the_run_makes():
    counts = {"encryptions": 10, "decryptions": 4, "homomorphic_additions": 7, "scalar_multiplications": 3,
              "setup_encryptions": 2, "setup_decryptions": 2}
    made = run_seconds(counts, FAKE_COSTS, key_pairs=5)
    handed = run_seconds(counts, FAKE_COSTS, key_pairs=0)
    assert made["estimated_seconds_keygen"] == 5 * FAKE_COSTS.keygen and handed["estimated_seconds_keygen"] == 0
    rounds = 10 * 1e-4 + 4 * 2e-4 + 7 * 1e-6 + 3 * 1e-5
    assert made["estimated_seconds"] == pytest.approx(rounds, rel=1e-12)  # float sums in another order
    assert made["estimated_seconds_setup"] == pytest.approx(2 * 1e-4 + 2 * 2e-4, rel=1e-12)
    for est in (made, handed):
        assert est["estimated_seconds_total"] == (est["estimated_seconds"] + est["estimated_seconds_keygen"]
                                                  + est["estimated_seconds_setup"])


@pytest.mark.parametrize("handed_in", [False, True])
def test_a_paillier_run_prices_its_key_generation_only_when_it_generates_keys(handed_in):
    pytest.importorskip("phe")
    from ppdnmf_torch.exchange.paillier import generate_keypairs

    blocks = small_problem(L=8, counts=(3, 5, 4, 6))
    opts = {"workers": 0, "cost_model": FAKE_COSTS}
    if handed_in:
        opts["keypairs"] = generate_keypairs(128, 4)
    res = pp.fit(blocks, RING4, 2, bcd_iters=2, x_iters=2, y_iters=1, device="cpu", exchange="paillier", n_max=1e3,
                 key_bits=128, exchange_options=opts)
    c = res.costs
    assert c["estimated_seconds_keygen"] == (0 if handed_in else 4 * FAKE_COSTS.keygen)
    assert c["estimated_seconds_total"] == (c["estimated_seconds"] + c["estimated_seconds_keygen"]
                                            + c["estimated_seconds_setup"])


def test_a_quantized_and_a_paillier_spec_of_the_same_run_share_one_calibration(monkeypatch):
    pytest.importorskip("phe")
    from ppdnmf_torch.exchange.paillier import exchange

    asked = []
    monkeypatch.setattr(exchange, "calibrate", lambda bits, path=None, time_path=None: asked.append((bits, path))
                        or FAKE_COSTS)
    exchange.calibrate_for(PaillierSpec(key_bits=512))
    exchange.calibrate_for(QuantizedSpec(key_bits=512, packing=True))
    exchange.calibrate_for(QuantizedSpec(key_bits=512, packing=False))
    assert asked[0] == asked[1] and asked[2] != asked[0]
    assert asked[0][1]["packing"] is True and asked[2][1]["packing"] is False


def test_trials_side_by_side_multiply_the_figure():
    from ppdnmf_torch.app.costs import format_estimate, paillier_estimate

    spec = PaillierSpec(n_max=1e3, key_bits=128, workers=0)
    one = paillier_estimate(spec, RING4, 6, 2, 3, 5, op_costs=FAKE_COSTS)
    two = paillier_estimate(spec, RING4, 6, 2, 3, 5, op_costs=FAKE_COSTS, trials=2)
    assert two["seconds"] == pytest.approx(2 * one["seconds"], rel=1e-12) and two["key_pairs"] == 8
    assert "2 trials side by side" in format_estimate(spec, two) and "side by side" not in format_estimate(spec, one)


@pytest.mark.slow
@pytest.mark.crypto
def test_the_calibration_scales_the_operations_by_the_runs_own_path():
    pytest.importorskip("phe")
    from ppdnmf_torch.exchange import QuantizedSpec
    from ppdnmf_torch.exchange.paillier.calibration import calibrate
    from ppdnmf_torch.exchange.paillier.exchange import calibrate_for

    raw = calibrate(128, refresh=True)
    on_path = calibrate_for(QuantizedSpec(n_max=1e3, key_bits=128, packing=True))
    assert raw.path_factor == 1.0 and on_path.path_factor > 0
    for c in (raw, on_path):
        assert min(c.keygen, c.encryption, c.decryption, c.homomorphic_addition, c.scalar_multiplication) > 0
