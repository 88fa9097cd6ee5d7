"""The batched solver against the plain per-agent reference, and its properties."""
from __future__ import annotations

import warnings

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import data, graph
from ppdnmf_torch.models.ppdnmf.solver import ConvergenceWarning

from conftest import small_problem
from reference import reference_fit

#: the paper's start, caps and Y-step: what the per-agent reference implements
PAPER = dict(pp.PAPER_SETTINGS, exchange="plain")  # per-edge penalties: not a plain sum (secagg refuses)

GRAPHS = {
    "path3": (3, [(0, 1), (1, 2)]),
    "cycle4": (4, [(0, 1), (1, 2), (2, 3), (0, 3)]),
    "star5": (5, [(0, 1), (0, 2), (0, 3), (0, 4)]),
    "random6": (6, list(graph.random_connected(6, 3.0, seed=4).edges)),
}
COUNTS = {3: (2, 7, 4), 4: (3, 5, 4, 6), 5: (1, 6, 3, 9, 2), 6: (4, 2, 8, 3, 5, 6)}


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def _fit_both(name, *, bcd_iters=2, **kw):
    n, edges = GRAPHS[name]
    blocks = small_problem(counts=COUNTS[n], seed=n)
    g = graph.Graph(n, edges)
    fuse = kw.pop("fuse", False)
    r = pp.fit(blocks, g, 3, bcd_iters=bcd_iters, device="cpu", fuse=fuse, **dict(PAPER, **kw))
    ref = reference_fit(blocks, edges, 3, bcd_iters=bcd_iters, **kw)
    return r, ref


# The all-ones start of Algorithm 1 is a symmetric saddle (every column of X equal);
# only rounding noise breaks the symmetry, and it grows ~100x per BCD iteration, so
# two correct implementations that round differently agree to 1e-10 for ~2-3 BCD
# iterations only (see tests/test_reference.py). The comparisons below use 2 BCD
# iterations of 8-10 ADMM iterations each, so every update and exchange is exercised.
@pytest.mark.parametrize("name", list(GRAPHS))
@pytest.mark.parametrize("penalty", ["random", "fixed"])
@pytest.mark.parametrize("form", ["derived", "paper_literal"])
def test_batched_matches_reference(name, penalty, form):
    n = GRAPHS[name][0]
    caps = [0.02 + 0.03 * i for i in range(n)]
    r, ref = _fit_both(name, penalty=penalty, consensus_form=form, g_max=caps, x_iters=10, y_iters=10, seed=7)
    for i in range(n):
        assert _rel(r.X[i], ref["X"][i]) < 1e-10
        assert _rel(r.U[i], ref["U"][i]) < 1e-10
        assert _rel(r.Y[i], ref["Y"][i]) < 1e-10
    for key in ("nmse", "consensus", "objective"):
        assert r.history[key] == pytest.approx(ref["history"][key], rel=1e-10)


@pytest.mark.parametrize("name", ["path3", "random6"])
@pytest.mark.parametrize("n_max", [10, 1e4, 1e6])
def test_quantized_matches_reference_integer_codec(name, n_max):
    r, ref = _fit_both(name, exchange="quantized", n_max=n_max, g_bits=12, x_iters=8, y_iters=8, seed=1)
    for i in range(GRAPHS[name][0]):
        assert _rel(r.X[i], ref["X"][i]) < 1e-10
        assert _rel(r.Y[i], ref["Y"][i]) < 1e-10


def test_random_penalties_follow_the_contract():
    """Penalty draws are monotone, within (g_prev, g_i], and the ones the reference uses."""
    r, ref = _fit_both("cycle4", penalty="random", g_max=[0.1, 0.2, 0.3, 0.4], x_iters=5, y_iters=2, bcd_iters=2)
    pens = ref["history"]["penalties"]
    flat = [p for bcd in pens for p in bcd]
    caps = [0.1, 0.2, 0.3, 0.4]
    for prev, cur in zip(flat, flat[1:]):
        for (i, j), g in cur.items():
            assert prev[(i, j)] <= g <= caps[i]
    assert all(g > 0 for g in flat[0].values())
    # the batched solver ends on the same draws: compare the final U to 1e-10
    for i in range(4):
        assert _rel(r.U[i], ref["U"][i]) < 1e-10


def test_single_agent_equals_centralized():
    blocks = small_problem(counts=(11,), seed=2)
    r1 = pp.fit(blocks, [[0]], 3, bcd_iters=5, x_iters=5, y_iters=5, device="cpu")
    rc = pp.fit_centralized(blocks[0], 3, bcd_iters=5, x_iters=5, y_iters=5, device="cpu")
    assert torch.equal(r1.X, rc.X)
    assert torch.equal(r1.Y[0], rc.Y[0])
    ref = reference_fit(blocks, [], 3, bcd_iters=3, x_iters=5, y_iters=5)
    r3 = pp.fit_centralized(blocks[0], 3, bcd_iters=3, x_iters=5, y_iters=5, device="cpu", **pp.PAPER_SETTINGS)
    assert _rel(r3.X[0], ref["X"][0]) < 1e-10


@pytest.mark.parametrize("exchange", ["plain", "quantized"])
@pytest.mark.parametrize("form", ["derived", "paper_literal"])
def test_factors_nonnegative(device, exchange, form):
    blocks = small_problem(counts=(3, 5, 4, 6))
    g = graph.ring(4)
    nmax = {} if exchange == "plain" else {"n_max": 1e4}  # plain has no codec
    r = pp.fit(blocks, g, 3, bcd_iters=15, x_iters=10, y_iters=10, device=device, exchange=exchange,
               consensus_form=form, **nmax)
    assert bool((r.X >= 0).all())
    assert all(bool((y >= 0).all()) for y in r.Y)
    assert r.X.device.type == device.type


def test_padding_is_exact():
    """Padded columns stay exactly zero, and padding changes no number of the real ones."""
    blocks = small_problem(counts=(2, 9, 4, 5))
    g = graph.ring(4)
    kw = dict(bcd_iters=2, x_iters=6, y_iters=6, device="cpu", seed=3, **PAPER)
    seen = {}

    def grab(info):
        seen["state"] = info.state
    r = pp.fit(blocks, g, 3, callback=grab, **kw)
    state = seen["state"]
    for i, c in enumerate(r.columns):
        for name in ("Y", "V", "R"):
            pad = getattr(state, name)[0, i, :, c:]
            assert bool((pad == 0).all()), f"{name} padding of agent {i} is not zero"
    # equal column counts need no padding: the same agents, the same numbers
    blocks_eq = small_problem(counts=(5, 5, 5, 5))
    r_eq = pp.fit(blocks_eq, g, 3, **kw)
    ref = reference_fit(blocks_eq, list(g.edges), 3, bcd_iters=2, x_iters=6, y_iters=6, seed=3)
    for i in range(4):
        assert _rel(r_eq.Y[i], ref["Y"][i]) < 1e-10
        assert _rel(r.Y[i], reference_fit(blocks, list(g.edges), 3, bcd_iters=2, x_iters=6, y_iters=6,
                                          seed=3)["Y"][i]) < 1e-10


def test_float32_agrees_with_float64(device):
    blocks = small_problem(counts=(4, 6, 5, 5), L=10)
    g = graph.ring(4)
    # 2 BCD iterations: the all-ones start is a symmetric saddle that float32 rounding
    # leaves along a different path than float64 rounding after a few more.
    kw = dict(bcd_iters=2, x_iters=10, y_iters=10, device=device, seed=0)
    r64 = pp.fit(blocks, g, 3, dtype=torch.float64, **kw)
    r32 = pp.fit(blocks, g, 3, dtype="float32", **kw)
    assert r32.X.dtype == torch.float32
    assert _rel(r32.X.double(), r64.X) < 1e-4
    assert r32.history["nmse"][-1] == pytest.approx(r64.history["nmse"][-1], rel=1e-4)


def test_deterministic_same_seed():
    blocks = small_problem()
    g = graph.ring(4)
    a = pp.fit(blocks, g, 3, bcd_iters=5, x_iters=5, y_iters=5, seed=11, device="cpu")
    b = pp.fit(blocks, g, 3, bcd_iters=5, x_iters=5, y_iters=5, seed=11, device="cpu")
    c = pp.fit(blocks, g, 3, bcd_iters=5, x_iters=5, y_iters=5, seed=12, device="cpu")
    assert torch.equal(a.X, b.X) and a.history["nmse"] == b.history["nmse"]
    assert not torch.equal(a.X, c.X)


@pytest.fixture(scope="module")
def paper_synthetic():
    d = data.synthetic(seed=0)
    g = graph.random_connected(10, 3.0, seed=0)
    cols = data.split_counts(200, 10, 4, 40, seed=0)
    return d.Z, g, cols


def test_derived_form_reaches_consensus_and_paper_literal_does_not(paper_synthetic):
    """Documents ALGORITHM.md's finding on the paper's synthetic setup (100 BCD iterations)."""
    Z, g, cols = paper_synthetic
    kw = dict(columns=cols, negative="allow", device="cpu", seed=0, bcd_iters=100, **PAPER)
    derived = pp.fit(Z, g, 5, consensus_form="derived", **kw)
    literal = pp.fit(Z, g, 5, consensus_form="paper_literal", **kw)
    central = pp.fit_centralized(Z, 5, negative="allow", device="cpu", bcd_iters=100, **pp.PAPER_SETTINGS)
    assert derived.history["consensus"][-1] < 1e-3
    assert literal.history["consensus"][-1] > 0.1
    # the distributed fit tracks the centralized one
    assert derived.nmse == pytest.approx(central.nmse, rel=0.05)
    assert len(derived.history["nmse"]) == 100


def _first_flag_distances(x_iters_per_agent, g):
    """Each agent's stop iteration minus the earliest, and its hop distance to the earliest agents."""
    first = min(x_iters_per_agent)
    starters = [i for i, c in enumerate(x_iters_per_agent) if c == first]
    dist = [min(g.distances_from(s)[i] for s in starters) for i in range(g.n_agents)]
    return [c - first for c in x_iters_per_agent], dist


@pytest.mark.parametrize("make", [lambda: graph.ring(9), lambda: graph.grid_2d(3, 4),
                                  lambda: graph.random_connected(12, 2.5, seed=2)])
def test_stopping_rule_spreads_one_hop_per_iteration(make):
    g = make()
    n = g.n_agents
    counts = [3 + (i % 4) for i in range(n)]
    blocks = small_problem(L=8, K=3, counts=counts, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        r = pp.fit(blocks, g, 3, bcd_iters=4, x_iters=200, y_iters=200, tol=1e-3, admm_tol=None, device="cpu",
                   penalty="fixed", g_max=0.05)
    stopped_early = False
    for key in ("x_iters", "y_iters"):
        for per_agent in r.history[key]:
            extra, dist = _first_flag_distances(per_agent, g)
            if max(per_agent) < 200:
                stopped_early = True
            # every agent stops within its hop distance of the first flag (<= diameter)
            assert all(e <= d for e, d in zip(extra, dist))
            assert max(extra) <= g.diameter
    assert stopped_early, "the tolerance never stopped an ADMM loop early; the test proves nothing"


@pytest.mark.parametrize("penalty", ["random", "fixed"])
def test_single_agent_runs_with_either_penalty_rule(penalty):
    # no edges: the fixed rule's penalty block is empty; one agent gets rho_i = 0 either way
    blocks = small_problem(counts=(9,), seed=1)
    kw = dict(bcd_iters=3, x_iters=4, y_iters=4, device="cpu")
    r = pp.fit_centralized(blocks[0], 3, penalty=penalty, **kw)
    ref = pp.fit_centralized(blocks[0], 3, **kw)
    assert torch.equal(r.X, ref.X) and torch.equal(r.Y[0], ref.Y[0])


def test_bcd_rule_does_not_stop_on_the_start():
    # after one ADMM iteration per step, X = max(0, U + P) and Y = max(0, V + R) still
    # equal their start: a relative change of 0 there is not convergence
    blocks = small_problem()
    r = pp.fit(blocks, graph.ring(4), 3, bcd_iters=4, x_iters=1, y_iters=1, tol=1e-3, device="cpu")
    assert r.n_iter > 1
    assert r.history["nmse"][-1] < 0.99


def test_fixed_counts_with_zero_tol():
    blocks = small_problem()
    r = pp.fit(blocks, graph.ring(4), 3, bcd_iters=3, x_iters=4, y_iters=5, device="cpu")
    assert r.n_iter == 3 and not r.converged
    assert all(c == [4] * 4 for c in r.history["x_iters"])
    assert all(c == [5] * 4 for c in r.history["y_iters"])


def test_bcd_stopping_converges_and_warns_otherwise():
    blocks = small_problem()
    r = pp.fit(blocks, graph.complete(4), 3, bcd_iters=300, x_iters=20, y_iters=20, tol=1e-4, admm_tol=0,
               device="cpu", penalty="fixed")
    assert r.converged and r.n_iter < 300
    with pytest.warns(ConvergenceWarning, match="did not converge"):
        pp.fit(blocks, graph.complete(4), 3, bcd_iters=2, x_iters=3, y_iters=3, tol=1e-12, device="cpu")


def test_callback_sees_every_iteration_and_can_stop():
    blocks = small_problem()
    seen = []

    def cb(info):
        seen.append((info.iteration, info.metrics["nmse"]))
        return info.iteration == 3

    r = pp.fit(blocks, graph.ring(4), 3, bcd_iters=10, x_iters=3, y_iters=3, callback=cb, device="cpu")
    assert [s[0] for s in seen] == [1, 2, 3]
    assert r.n_iter == 3
    assert [s[1] for s in seen] == r.history["nmse"]


@pytest.mark.parametrize("form", ["derived", "paper_literal"])
def test_fused_kernels_match_the_reference(form):
    """fuse=True compiles the elementwise chains (torch.compile); same algorithm, to rounding."""
    r, ref = _fit_both("random6", penalty="random", consensus_form=form, x_iters=8, y_iters=8, seed=2, fuse=True)
    for i in range(6):
        assert _rel(r.X[i], ref["X"][i]) < 1e-10
        assert _rel(r.Y[i], ref["Y"][i]) < 1e-10


@pytest.mark.parametrize("kw", [dict(), dict(tol=1e-6, admm_tol=1e-3), dict(exchange="quantized", n_max=1e5),
                                dict(consensus_form="paper_literal", penalty="fixed")])
def test_workspace_buffers_change_no_bits(monkeypatch, tmp_path, kw):
    """Large problems write the updates into reused buffers (solver.Workspace); that must give
    the same bits as fresh allocations, also when resuming from a checkpoint."""
    from ppdnmf_torch.exchange import QuantizedExchange
    from ppdnmf_torch.models.ppdnmf.solver import Workspace

    blocks = small_problem(counts=(3, 5, 4, 6))
    g = graph.ring(4)
    args = dict(dict(bcd_iters=6, x_iters=5, y_iters=5, device="cpu", seed=1, exchange="plain"), **kw)
    fresh = pp.fit(blocks, g, 3, **args)
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)  # buffers for every size
    monkeypatch.setattr(QuantizedExchange, "BUFFER_MIN_BYTES", 0)  # the exchange's too
    reused = pp.fit(blocks, g, 3, **args)
    assert torch.equal(fresh.X, reused.X) and torch.equal(fresh.U, reused.U)
    assert all(torch.equal(a, b) for a, b in zip(fresh.Y, reused.Y))
    for key, vals in fresh.history.items():  # the metrics and residuals too (they use buffers as well)
        if not key.startswith("time_"):
            assert reused.history[key] == vals, key
    pp.fit(blocks, g, 3, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 3, **args)
    resumed = pp.fit(blocks, g, 3, resume_from=tmp_path, **args)
    assert torch.equal(resumed.X, fresh.X) and resumed.history["nmse"] == fresh.history["nmse"]
