"""The sums attacks (ppdnmf_torch.audit.sums): integer decomposition at degree 2, lattice
reduction at degree >= 3, the attacker's self-certification rule, what the changes of
rho reveal, and the audit's n_max default under the library's schedule."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ppdnmf_torch.audit import (
    attack_degree2,
    attack_lattice,
    certify,
    diophantine2,
    public_x_max,
    schedule_audit,
    sums_audit,
)
from ppdnmf_torch.models.ppdnmf.audit import fitting_n_max, run_audit
from ppdnmf_torch.audit.attacks import lattice_available

needs_flint = pytest.mark.skipif(not lattice_available(), reason="the lattice attack needs python-flint (audit extra)")

X_MAX = public_x_max(0.033, 16, "adaptive")  # 69206: caps may grow 32-fold


def _sums(a, x, d):
    """What a receiver with own draws ``a`` decrypts when its neighbours drew ``x`` and differ by ``d``."""
    w = [int(ai) * int(xi) for ai, xi in zip(a, x)]
    S = [sum(w[j] * int(d[j][p]) for j in range(len(w))) for p in range(len(d[0]))]
    return sum(w), S


@pytest.mark.parametrize("seed", range(20))
def test_diophantine2_lists_every_solution_in_range(seed):
    rng = np.random.default_rng(seed)
    a1, a2 = (int(v) for v in rng.integers(1, 60, 2))
    xm = int(rng.integers(1, 80))
    x1, x2 = (int(v) for v in rng.integers(1, xm + 1, 2))
    rho = a1 * x1 + a2 * x2
    brute = {(u, (rho - a1 * u) // a2) for u in range(1, xm + 1)
             if (rho - a1 * u) % a2 == 0 and 1 <= (rho - a1 * u) // a2 <= xm}
    assert {tuple(v) for v in diophantine2(a1, a2, rho, xm).tolist()} == brute
    assert (x1, x2) in brute


@pytest.mark.parametrize("a, x", [([3001, 4999], [2503, 3701]), ([41117, 38011], [52001, 61003]),
                                  ([2163, 2164], [60013, 2161])])
@pytest.mark.parametrize("P", [1, 30])
def test_degree2_recovers_and_certifies_unequal_weights(a, x, P):
    """Positive control: unequal weights, differences small against them."""
    rng = np.random.default_rng(P)
    d = rng.integers(-50, 51, size=(2, P))
    rho, S = _sums(a, x, d)
    r = attack_degree2(a, rho, S, X_MAX)
    assert r["d"] == d.tolist()
    assert r["x"] == x
    assert r["certified"]
    assert r["window"] > 1e6 and r["runner_up"] >= 100 * r["cost"]


@pytest.mark.parametrize("a", [2163, 40000])
@pytest.mark.parametrize("seed", range(3))
def test_degree2_fails_on_equal_weights(a, seed):
    """Equal weights ``w`` reveal only ``sum_j d_j``: no certified recovery, no exact one either."""
    rng = np.random.default_rng(seed)
    d = rng.integers(-50, 51, size=(2, 30))
    rho, S = _sums([a, a], [a, a], d)
    r = attack_degree2([a, a], rho, S, X_MAX)
    assert not r["certified"]
    assert r["d"] != d.tolist()
    assert not (r["d"] is not None and (r["d"][0] == d[0].tolist() or r["d"][1] == d[1].tolist()))


def test_certification_has_no_false_positive_on_constructed_cases():
    """Random draws, equal or unequal, differences from tiny to as large as the weights: whatever
    the attacker certifies is right (and it certifies some: the check is not vacuous)."""
    certified = 0
    for seed in range(24):
        rng = np.random.default_rng(1000 + seed)
        equal = seed % 3 == 0
        a = [int(rng.integers(2000, 70000))] * 2 if equal else [int(v) for v in rng.integers(2000, 70000, 2)]
        x = [int(v) for v in rng.integers(2000, 69000, 2)]
        scale = int(10 ** rng.uniform(0, 6))
        d = rng.integers(-scale, scale + 1, size=(2, 8))
        rho, S = _sums(a, x, d)
        r = attack_degree2(a, rho, S, 20000 if equal else X_MAX)  # equal draws: fewer candidates, same point
        if r["certified"]:
            certified += 1
            assert r["d"] == d.tolist()
    assert certified >= 3


def test_certify_rule():
    assert certify(10, 10_000, 2e6)
    assert not certify(10, 999, 2e6)          # runner-up not 100x worse
    assert not certify(10, 10_000, 5e5)       # window too small
    assert not certify(30_000, 1e9, 2e6)      # differences not below 1% of the window
    assert not certify(None, None, None)


@needs_flint
@pytest.mark.parametrize("k", [3, 4])
def test_lattice_recovers_degree3_and_4(k):
    rng = np.random.default_rng(k)
    a = [int(v) for v in rng.integers(20000, 69000, k)]
    x = [int(v) for v in rng.integers(20000, 69000, k)]
    d = rng.integers(-30, 31, size=(k, 20))
    rho, S = _sums(a, x, d)
    r = attack_lattice(a, rho, S, X_MAX)
    assert r["d"] == d.tolist() and r["x"] == x
    assert r["certified"]


@needs_flint
def test_lattice_in_blocks_and_on_equal_weights():
    rng = np.random.default_rng(7)
    a = [int(v) for v in rng.integers(20000, 69000, 3)]
    x = [int(v) for v in rng.integers(20000, 69000, 3)]
    d = rng.integers(-20, 21, size=(3, 60))  # three blocks of entries
    rho, S = _sums(a, x, d)
    r = attack_lattice(a, rho, S, X_MAX)
    assert r["d"] == d.tolist() and r["certified"]
    # equal weights: the hidden vectors cannot be told apart
    rho, S = _sums([3000] * 3, [3000] * 3, d[:, :20])
    r = attack_lattice([3000] * 3, rho, S, X_MAX)
    assert not r["certified"] and r["d"] != d[:, :20].tolist()


@needs_flint
@pytest.mark.parametrize("seed", range(6))
def test_lattice_certification_has_no_false_positive(seed):
    rng = np.random.default_rng(50 + seed)
    k = 3
    a = [int(v) for v in rng.integers(2000, 69000, k)]
    x = [int(v) for v in rng.integers(2000, 69000, k)]
    d = rng.integers(-(10 ** (seed % 3 + 1)), 10 ** (seed % 3 + 1) + 1, size=(k, 20))
    rho, S = _sums(a, x, d)
    r = attack_lattice(a, rho, S, X_MAX)
    if r["certified"]:
        assert r["d"] == d.tolist()


def _record(graph, **kw):
    from ppdnmf_torch.models.ppdnmf.audit import record_fit
    from ppdnmf_torch.data import split_columns, synthetic

    N = graph.n_agents
    Z = synthetic(L=10, M=20 * N, K=3, seed=1).Z
    return record_fit(split_columns(Z, [20] * N), graph, 3, kind="quantized", protocol="masked", bcd_iters=3,
                      x_iters=12, y_iters=10, g_max=0.033, mu=0.1, negative="allow", seed=0, **kw)


def test_sums_audit_on_a_recorded_ring_under_the_adaptive_schedule():
    """The adaptive schedule's unequal weights: degree-2 receivers recover exact values, every
    certified recovery is right, rho's changes are pinned to a neighbour correctly."""
    from ppdnmf_torch.graph import ring

    rec = _record(ring(6), penalty_schedule="adaptive", init="random")
    x_max = public_x_max(0.033, 16, "adaptive")
    out = sums_audit(rec, x_max=x_max, max_calls=8)
    b = out["by_degree"]["2"]
    assert b["receivers"] == 6 and b["informative_calls"] == 48
    assert b["exact_neighbour_values"] > 0
    assert b["false_positives"] == 0 and b["certified_correct"] == b["certified"]
    sl = schedule_audit(rec, x_max=x_max)["all"]
    assert sl["changes"] > 0 and sl["attributed_correct"] == sl["attributed"]


def test_run_audit_default_n_max_fits_the_default_schedule():
    """Issue 31, item 10: n_max=1e6 is refused where the adaptive caps may grow 32-fold; the
    default picks a scale that fits, per scenario."""
    from ppdnmf_torch.errors import ConfigError
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial
    from ppdnmf_torch.graph import star

    blocks, _ = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 0)
    # the exchanged values are bounded by the start's scale (2), whatever the data's: the caps decide
    sc = ("scaled_star", blocks, star(len(blocks)), 0.05)
    kw = dict(bcd_iters=2, x_iters=2, y_iters=2, paillier=False, plain=False, protocols=("masked",),
              settings={"penalty_schedule": "adaptive"}, sums_max_calls=1)
    with pytest.raises(ConfigError, match="n_max"):
        run_audit([sc], n_max=1e6, **kw)
    n = fitting_n_max(blocks, star(len(blocks)), 0.05, penalty_schedule="adaptive")
    assert n < 1e6
    rep = run_audit([sc], **kw)
    assert rep["scenarios"]["scaled_star"]["n_max"] == n
    assert fitting_n_max(blocks, star(len(blocks)), 0.05, penalty_schedule="paper") == 1e6
    assert torch.is_tensor(blocks[0])


@pytest.mark.parametrize("graph_name", ["paper", "ring"])
def test_the_default_agreed_schedule_leaves_nothing_to_the_sums_attacks(graph_name):
    """After the fix (the library's default, penalty_schedule="agreed"): every receiver's weights
    are equal at every call, no receiver of degree >= 2 recovers any exact value, and rho's
    changes pin nothing to a neighbour."""
    from ppdnmf_torch.models.ppdnmf.config import SOLVER_DEFAULTS
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial
    from ppdnmf_torch.graph import ring

    graph = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 0)[1] if graph_name == "paper" else ring(6)
    rec = _record(graph)
    w = rec.w
    assert (w == w[:, :1]).all()  # one weight per call on every edge
    schedule = SOLVER_DEFAULTS.penalty_schedule
    x_max = public_x_max(0.033, 16, schedule)
    out = sums_audit(rec, x_max=x_max, max_calls=6)
    assert out["by_degree"]
    for d, b in out["by_degree"].items():
        assert b["informative_calls"] > 0
        assert b["exact_neighbour_values"] == 0 and b["certified"] == 0, d
        assert b["calls_not_tried"] == 0 or (int(d) > 2 and not lattice_available())
    sl = schedule_audit(rec, x_max=x_max)["all"]
    assert sl["attributed"] == 0
