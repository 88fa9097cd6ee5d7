"""The agreed penalty schedule (issue 32, the fix): one penalty per ADMM iteration on every
edge, so each receiver's weights are equal and its sums reveal ``w`` and ``sum_j q_j`` only;
the library's default; resume and two ranks give the one-process bits (quantized = paillier
under it: tests/test_agree.py, ``test_exchange_kinds_agree_under_the_adaptive_schedules``);
the leak warning fires for the schedules with unequal weights."""
from __future__ import annotations

import warnings

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.graph.topology import Topology
from ppdnmf_torch.penalties import MAX_CAP_RATIO, PenaltySampler
from ppdnmf_torch.models.ppdnmf import config as ppdnmf_config, problem as ppdnmf_problem
from ppdnmf_torch.models.ppdnmf.solver import schedule
from ppdnmf_torch.models.ppdnmf.config import SOLVER_DEFAULTS
from ppdnmf_torch.models.ppdnmf.solver.state import SolverState

SHORT = dict(bcd_iters=6, x_iters=4, y_iters=4, device="cpu", negative="allow")
GRAPHS = {"ring": lambda n: graph.ring(n), "star": lambda n: graph.star(n),
          "random": lambda n: graph.random_connected(n, 3.0, seed=1)}


def _blocks(N=6, seed=0, M=60, L=12, K=3):
    d = pp.data.synthetic(L=L, M=M, K=K, seed=seed, noise_var=0.0)
    return pp.data.split_columns(d.Z, pp.data.split_counts(M, N, lo=4, hi=20, seed=seed))


def _same(a, b):
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    for k, v in a.history.items():
        if "time" not in k and "seconds" not in k:
            assert b.history[k] == v, k


@pytest.fixture
def drawn(monkeypatch):
    """Every penalty vector ``g (2E,)`` the solver draws, one per ADMM iteration, in order."""
    seen = []
    step, steps = PenaltySampler.step, PenaltySampler.steps

    def spy_step(self, g_prev, m, active_edges=None):
        g = step(self, g_prev, m, active_edges)
        seen.append(g.clone())
        return g

    def spy_steps(self, g_prev, n):
        G = steps(self, g_prev, n)
        seen.extend(G.clone().unbind(0))
        return G

    monkeypatch.setattr(PenaltySampler, "step", spy_step)
    monkeypatch.setattr(PenaltySampler, "steps", spy_steps)
    return seen


def test_agreed_is_the_default():
    import inspect
    from pathlib import Path

    assert SOLVER_DEFAULTS.penalty_schedule == "agreed"
    for fn in (pp.fit, pp.fit_trials):
        assert inspect.signature(fn).parameters["penalty_schedule"].default == "agreed"
    assert ppdnmf_config.SolverConfig().penalty_schedule == "agreed"
    yaml = (Path(__file__).resolve().parents[1] / "conf" / "solver" / "default.yaml").read_text()
    assert "\npenalty_schedule: agreed\n" in yaml
    assert pp.PPDNMF(3).get_params()["penalty_schedule"] == "agreed"


@pytest.mark.parametrize("kind", sorted(GRAPHS))
@pytest.mark.parametrize("stopping", [False, True], ids=["fixed-counts", "stopping-rule"])
def test_every_edge_has_one_penalty_at_every_admm_iteration(kind, stopping, drawn):
    """Under the default every directed edge carries the same ``g^(m)`` at every ADMM iteration
    (stopped agents' edges too), the draws climb, and the common cap grew (the run disagreed)."""
    g = GRAPHS[kind](6)
    caps = []
    extra = dict(tol=1e-3, admm_tol=5e-2, bcd_iters=12) if stopping else {}
    pp.fit(_blocks(), g, 3, g_max=0.02, exchange="quantized", n_max=1e5,
           callback=lambda i: caps.append(i.state.caps.clone()), **dict(SHORT, **extra))
    assert len(drawn) >= 6 * 4 if not stopping else len(drawn) > 0
    prev = 0.0
    for g_m in drawn:
        assert g_m.numel() == Topology.from_graphs([g]).n_directed_edges
        assert bool((g_m == g_m[0]).all()), "two edges with different penalties in one ADMM iteration"
        assert float(g_m[0]) >= prev
        prev = float(g_m[0])
    for c in caps:
        assert bool((c == c[0]).all()) and float(c[0]) <= 0.02 * MAX_CAP_RATIO
    assert float(caps[-1][0]) > 0.02, "the common cap never grew"


@pytest.mark.parametrize("schedule,equal", [("agreed", True), ("adaptive", False)])
def test_a_receivers_integer_weights_are_equal_and_its_weight_sum_is_its_own(schedule, equal, monkeypatch):
    """What a receiver learns of the schedule from ``rho_int_i`` alone: under the default the
    weights ``w_ij = gamma_ij gamma_ji`` of every call are one number ``w = gamma^2``, so
    ``rho_int_i = d_i w`` is computed from what ``i`` holds (its own draw and degree): nothing.
    Under ``adaptive`` they differ (the positive control)."""
    from ppdnmf_torch.exchange import quantized

    calls = []
    real = quantized.integer_penalty_sums

    def spy(w, src, n_nodes):
        rho_int = real(w, src, n_nodes)
        calls.append((w.clone(), src.clone(), rho_int.clone()))
        return rho_int

    monkeypatch.setattr(quantized, "integer_penalty_sums", spy)
    g = graph.random_connected(6, 3.0, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.SumLeakWarning)
        pp.fit(_blocks(), g, 3, g_max=0.02, exchange="quantized", n_max=1e5, penalty_schedule=schedule, **SHORT)
    assert len(calls) == 6 * 4
    degree = g.degree
    unequal = 0
    for w, src, rho_int in calls:
        if equal:
            assert bool((w == w[0]).all())
            assert torch.equal(rho_int, degree * w[0])
        unequal += int(not bool((w == w[0]).all()))
    assert (unequal == 0) == equal


def test_trials_draw_their_own_common_penalty_and_match_single_runs(drawn):
    blocks = [_blocks(seed=s) for s in (0, 1)]
    graphs = [graph.ring(6), graph.random_connected(6, 3.0, seed=1)]
    batch = pp.fit_trials(blocks, graphs, 3, seeds=[3, 4], g_max=0.02, **SHORT)
    src = Topology.from_graphs(graphs).src
    trial = torch.div(src, 6, rounding_mode="floor")
    for g_m in drawn:
        for t in (0, 1):
            part = g_m[trial == t]
            assert bool((part == part[0]).all())
    assert not torch.equal(drawn[0][trial == 0][:1], drawn[0][trial == 1][:1])  # each trial its own stream
    for t in (0, 1):
        alone = pp.fit(blocks[t], graphs[t], 3, seed=3 + t, g_max=0.02, **SHORT)
        assert torch.equal(batch.X[t], alone.X)


def test_unequal_caps_are_refused_under_the_agreed_schedule():
    with pytest.raises(pp.ConfigError, match="g_max: .*one cap"):
        pp.fit(_blocks(), graph.ring(6), 3, g_max=[0.02] * 5 + [0.03], **SHORT)
    with pytest.raises(pp.ConfigError, match=r"trials \[1\]"):
        pp.fit_trials([_blocks()] * 2, [graph.ring(6)] * 2, 3, seeds=[0, 1],
                      g_max=[[0.02] * 6, [0.02] * 5 + [0.03]], **SHORT)


def _state(T, N, delta_agents, mu=1.0):
    """A state whose agents ``delta_agents`` disagree (``S_i != 0``), all with ``mu_i = mu``."""
    L, K, M = 4, 2, 3
    U = torch.ones(T, N, L, K, dtype=torch.float64)
    Q = torch.zeros_like(U)
    for t, a in delta_agents:
        Q[t, a] = 1.0
    return SolverState(X=U.clone(), U=U, P=torch.zeros_like(U), Q=Q, Q_prev=torch.zeros_like(U),
                       Y=torch.zeros(T, N, K, M, dtype=torch.float64), V=torch.zeros(T, N, K, M, dtype=torch.float64),
                       R=torch.zeros(T, N, K, M, dtype=torch.float64), g=torch.zeros(1, dtype=torch.float64),
                       caps=torch.full((T * N,), 0.1, dtype=torch.float64),
                       mu=torch.full((T, N), mu, dtype=torch.float64))


@pytest.mark.parametrize("mu,disagree,grows", [
    (1.0, [(0, 2)], [True, False]),      # one agent of trial 0 disagrees: trial 0 grows, trial 1 does not
    (1.0, [], [False, False]),           # nobody disagrees
    (0.03, [(0, 2), (1, 0)], [True, True]),  # mu below the bound: the cap grows, each mu_i rises to it
])
def test_adapt_agreed_grows_on_an_or_of_disagreement_and_each_agent_raises_its_mu(mu, disagree, grows):
    T, N = 2, 5
    problem = ppdnmf_problem.build_problem([[torch.ones(4, 3, dtype=torch.float64)] * N] * T, [graph.ring(N)] * T,
                                       torch.full((T, N), 0.1, dtype=torch.float64), [0, 1],
                                       dtype=torch.float64, device="cpu")
    state = _state(T, N, disagree, mu)
    state.P.fill_(1.0)
    rho = torch.full((T, N), 2 * 0.01, dtype=torch.float64)
    schedule.adapt_agreed(problem, state, rho)
    caps, mus = state.caps.view(T, N), state.mu
    for t in range(T):
        g = 0.12 if grows[t] else 0.1
        assert bool((caps[t] == caps[t, 0]).all())
        assert float(caps[t, 0]) == pytest.approx(g, rel=0, abs=1e-15)
        need = 2 * g * g / schedule.STABILITY  # degree 2: rho_i = 2 g^2 <= STABILITY mu_i
        assert torch.allclose(mus[t], torch.full((N,), max(mu, need), dtype=torch.float64), rtol=1e-15, atol=0)
        # the unscaled multiplier mu_i P_i is kept
        torch.testing.assert_close(state.P[t] * mus[t].view(N, 1, 1), torch.full_like(state.P[t], mu),
                                   rtol=1e-14, atol=0)


def test_resume_is_bit_for_bit(tmp_path):
    kw = dict(SHORT, seed=2, exchange="quantized", n_max=1e5)
    whole = pp.fit(_blocks(), graph.ring(6), 3, **kw)
    pp.fit(_blocks(), graph.ring(6), 3, checkpoint_dir=tmp_path, callback=lambda i: i.iteration == 3, **kw)
    resumed = pp.fit(_blocks(), graph.ring(6), 3, resume_from=tmp_path, **kw)
    _same(whole, resumed)
    assert {"caps", "mu"} <= set(pp.checkpoint.load_checkpoint(tmp_path)["state"])


def _leak_warnings(**kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pp.fit(_blocks(), graph.ring(6), 3, **dict(SHORT, bcd_iters=1, x_iters=1, y_iters=1, **kw))
    return [w for w in caught if issubclass(w.category, pp.SumLeakWarning)]


@pytest.mark.parametrize("kw,fires", [
    (dict(exchange="quantized", n_max=1e5, penalty_schedule="adaptive"), True),
    (dict(exchange="quantized", n_max=1e5, penalty_schedule="paper", g_max=[0.02] * 5 + [0.03]), True),
    (dict(exchange="quantized", n_max=1e5), False),  # the default, agreed
    (dict(exchange="quantized", n_max=1e5, penalty_schedule="paper"), False),  # equal caps
    (dict(exchange="plain", penalty_schedule="adaptive"), False),  # no secure sums
])
def test_the_leak_warning_fires_once_at_the_callers_line(kw, fires):
    found = _leak_warnings(**kw)
    assert len(found) == (1 if fires else 0)
    if fires:
        assert found[0].filename == __file__
        assert "agreed" in str(found[0].message)


def test_two_ranks_give_the_one_process_bits():
    """The common draws and the cap's bit (one all-reduce of one int64 per BCD iteration,
    counted as ``flags``) give the single-process run, bit for bit; the schedule acted."""
    from test_distributed import _assert_same, _reference, _spawn

    case = {"data": dict(N=8, K=3), "fit": {"exchange": "quantized", "penalty_schedule": "agreed", "bcd_iters": 4}}
    outs = _spawn(2, case)
    assert [o.exitcode for o in outs] == [0, 0], [o.error for o in outs]
    ref = _reference(case)
    _assert_same(outs[0].value, ref)
    assert outs[0].value["sent"].get("flags", 0) == 4 * 8  # one int64 per BCD iteration
    paper = _reference(dict(case, fit=dict(case["fit"], penalty_schedule="paper")))
    assert not torch.equal(ref.X, paper.X)
