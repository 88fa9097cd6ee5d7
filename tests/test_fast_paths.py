"""The solver's fast paths give the numbers of the plain paths they replace.

* the X-step's penalty block (all ADMM iterations' penalties, rho_i and spectral factors
  at once) against the per-iteration path the stopping rule uses: bit for bit;
* the plain exchange's CSR product with the diagonal inside, and (``fuse=True``) its
  compiled padded gather, against the edge formula and against each other;
* the eager Y-step's narrow elementwise updates against full-width updates: bit for bit;
* ``fuse=True`` (whole compiled iterations for small problems, compiled chains into
  reused buffers for large ones) against the eager solver, to rounding.

Bit for bit where both paths run the same operations in the same order by construction (the
same eager kernels; Inductor's code for the same nodes fused otherwise: it compiles with
``-ffp-contract=off``, checked under ``ATEN_CPU_CAPABILITY`` default/avx2/avx512 and on issue
42's Intel Xeon); compiled against eager or MKL code to rounding (fused multiply-adds differ).
"""
from __future__ import annotations

import math

import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.models.ppdnmf.solver import admm, eager as eager_mod, fused as fused_mod, kernels
from ppdnmf_torch.exchange import make_exchange
from ppdnmf_torch.exchange.base import Topology
from ppdnmf_torch.exchange.plain import PlainExchange
from ppdnmf_torch.penalties import PenaltySampler
from ppdnmf_torch.models.ppdnmf.solver.fused import CompiledGraph, small_matmul
from ppdnmf_torch.models.ppdnmf.solver.kernels import Workspace, bmm, eigh_psd

from conftest import small_problem

#: the solver parameters the solver-level tests here were written with (the paper's)
PAPER_PARAMS = dict(penalty_schedule="paper", init="ones", bcd_iters=100)

CPU = torch.device("cpu")


def _topology(n=7, seed=3):
    return Topology.from_graphs([graph.random_connected(n, 3.0, seed=seed)])


@pytest.mark.parametrize("mode", ["random", "fixed"])
def test_penalty_steps_equal_the_step_sequence(mode):
    topo = _topology()
    caps = torch.linspace(0.01, 0.05, topo.n_nodes, dtype=torch.float64)

    def sampler():
        s = PenaltySampler(caps, topo.src, [topo.n_directed_edges], [5], mode, 12)
        s.begin_bcd_iteration()
        return s

    g0 = torch.rand(topo.n_directed_edges, dtype=torch.float64) * 0.01
    block = sampler().steps(g0, 12)
    s, g = sampler(), g0
    for m in range(12):
        g = s.step(g, m)
        assert torch.equal(block[m], g)
    assert bool((block[1:] >= block[:-1]).all())  # monotone draws


def test_plain_penalty_block_equals_the_per_iteration_sums():
    topo = _topology()
    G = torch.rand((6, topo.n_directed_edges), dtype=torch.float64) * 0.05
    U = torch.rand((topo.n_nodes, 12), dtype=torch.float64)
    one = PlainExchange()
    one.bind(topo, dtype=torch.float64, device=CPU)
    blk = PlainExchange()
    blk.bind(topo, dtype=torch.float64, device=CPU)
    rho_block = blk.penalty_block(G)
    for m, row in enumerate(G.unbind(0)):
        g = row.clone()  # not a view of the block: the per-iteration path
        assert torch.equal(rho_block[m], one.penalty_sums(g))
        assert torch.equal(blk.exchange(U, row).S, one.exchange(U, g).S)


@pytest.mark.parametrize("fuse", [False, True])
def test_plain_exchange_matches_the_edge_formula(monkeypatch, fuse):
    monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    topo = _topology(9, seed=1)
    ex = PlainExchange()
    ex.bind(topo, dtype=torch.float64, device=CPU, fuse=fuse)
    g = torch.rand(topo.n_directed_edges, dtype=torch.float64) * 0.05
    U = torch.rand((topo.n_nodes, 20), dtype=torch.float64)
    out = ex.exchange(U, g)
    w = g * g[topo.rev]
    expect = torch.zeros_like(U)
    for e, (i, j) in enumerate(zip(topo.src.tolist(), topo.dst.tolist())):
        expect[i] += w[e] * (U[j] - U[i])
    assert torch.allclose(out.S, expect, rtol=0, atol=1e-15)
    rho = torch.zeros(topo.n_nodes, dtype=torch.float64).index_add_(0, topo.src, w)
    assert torch.equal(out.rho, rho)


def test_compiled_gather_equals_the_csr_product(monkeypatch):
    """The padded gather adds the CSR row's terms in the same order; padding adds exact zeros.

    To rounding: two kernels (the compiled gather, MKL's sparse product), whose use of fused
    multiply-adds depends on the CPU (bit-equal here, not on issue 42's Intel Xeon). Each of
    a row's ``d + 1`` terms is rounded at most twice: ``2 (d + 1) eps sum_j |w_ij U_j|``."""
    monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    topo = _topology(12, seed=2)
    csr, ell = PlainExchange(), PlainExchange()
    csr.bind(topo, dtype=torch.float64, device=CPU)
    ell.bind(topo, dtype=torch.float64, device=CPU, fuse=True)
    assert csr.neighbour_operator(torch.zeros(topo.n_directed_edges, dtype=torch.float64), torch.float64) is None
    g = torch.rand(topo.n_directed_edges, dtype=torch.float64) * 0.05
    U = torch.rand((topo.n_nodes, 33), dtype=torch.float64)
    S_ell, S_csr = ell.exchange(U, g).S, csr.exchange(U, g).S
    nbr, wv = ell.neighbour_operator(g, torch.float64)
    scale = (wv.abs()[:, :, None] * U.abs()[nbr]).sum(1)  # sum_j |w_ij U_j| per entry
    bound = 2 * nbr.shape[1] * torch.finfo(torch.float64).eps * scale
    assert bool(((S_ell - S_csr).abs() <= bound).all())
    assert float((S_ell - S_csr).abs().max()) < 1e-15  # and tiny: not some other sum
    nbr, wv = ell.neighbour_operator(g, torch.float64)
    assert nbr.shape == wv.shape == (topo.n_nodes, int(topo.degree.max()) + 1)


def test_neighbour_operator_only_where_it_applies():
    star = Topology.from_graphs([graph.star(40)])  # one row of 40 entries, 39 of 2: too uneven to pad
    ex = PlainExchange()
    ex.bind(star, dtype=torch.float64, device=CPU, fuse=True)
    assert ex.neighbour_operator(torch.ones(star.n_directed_edges, dtype=torch.float64), torch.float64) is None
    q = make_exchange("quantized")
    q.bind(_topology(), dtype=torch.float64, device=CPU, fuse=True)
    assert q.neighbour_operator(torch.ones(q.topology.n_directed_edges, dtype=torch.float64), torch.float64) is None


@pytest.mark.parametrize("kind", ["plain", "quantized"])
@pytest.mark.parametrize("penalty", ["random", "fixed"])
@pytest.mark.parametrize("form", ["derived", "paper_literal"])
@pytest.mark.parametrize("rank", [3, 9])
def test_penalty_block_path_equals_the_tracked_path(kind, penalty, form, rank):
    """Without a stopping rule the X-step precomputes its penalties, rho_i, spectral
    factors and (small problems) every ``E diag(d) E^T``; with one (a tolerance that never
    triggers) it runs the per-iteration path. Same bits, from a state where no agent is
    stationary (rank 3 and 9: torch's small-matrix kernel and the BLAS one)."""
    from ppdnmf_torch.models.ppdnmf.problem import build_problem
    from ppdnmf_torch.models.ppdnmf.solver import init_state, make_sampler, solver_params, x_step

    blocks = small_problem(counts=(3, 5, 4, 6, 2))
    caps = torch.tensor([[0.01, 0.02, 0.03, 0.04, 0.05]], dtype=torch.float64)
    prob = build_problem([blocks], [graph.random_connected(5, 3.0, seed=2)], caps, [3], dtype=torch.float64,
                         device=CPU, rank=rank)
    out = []
    for tol in (0.0, 1e-300):
        params = solver_params(rank, x_iters=6, tol=tol, admm_tol=None, penalty=penalty, consensus_form=form,
                               **PAPER_PARAMS)
        ex = make_exchange(kind, **({} if kind == "plain" else {"n_max": 1e5}))
        ex.bind(prob.topology, dtype=torch.float64, device=CPU)
        state = init_state(prob, rank)
        gen = torch.Generator().manual_seed(0)
        state.Y = torch.rand(state.Y.shape, generator=gen, dtype=torch.float64) * prob.column_mask()
        state.P = 0.1 * torch.randn(state.P.shape, generator=gen, dtype=torch.float64)
        sampler = make_sampler(prob, params)
        for bcd_iter in (1, 2):
            info = x_step(prob, state, params, ex, sampler, bcd_iter=bcd_iter)
        assert int(info["iters"].min()) == 6  # nobody stopped
        out.append(state)
    for name in ("X", "U", "P", "Q", "Q_prev", "g"):
        assert torch.equal(getattr(out[0], name), getattr(out[1], name)), name


def test_narrow_y_updates_equal_full_width_updates():
    """The eager Y-step updates only the real columns; the full-width iteration gives the same bits."""
    from ppdnmf_torch.models.ppdnmf.problem import build_problem
    from ppdnmf_torch.models.ppdnmf.solver import init_state, solver_params, y_step

    blocks = small_problem(L=6, counts=(2, 9, 4))
    caps = torch.full((1, 3), 0.03, dtype=torch.float64)
    prob = build_problem([blocks], [graph.ring(3)], caps, [0], dtype=torch.float64, device=CPU, rank=3)
    state = init_state(prob, 3)
    gen = torch.Generator().manual_seed(0)
    state.X = torch.rand(state.X.shape, generator=gen, dtype=torch.float64)
    mask = prob.column_mask()
    state.V = torch.randn(state.V.shape, generator=gen, dtype=torch.float64) * mask
    state.R = torch.randn(state.R.shape, generator=gen, dtype=torch.float64) * mask
    V, R, X = state.V.clone(), state.R.clone(), state.X
    params = solver_params(3, eta=0.7, y_iters=5, **PAPER_PARAMS)
    y_step(prob, state, params)
    from ppdnmf_torch.models.ppdnmf.solver.kernels import spd_inverse

    G_inv = spd_inverse(bmm(X.mT, X) + 0.7 * torch.eye(3, dtype=torch.float64))
    XtZ = bmm(X.mT, prob.Z)
    for _ in range(5):
        Y = torch.add(V, R).clamp_(min=0)
        B = torch.add(XtZ, torch.sub(Y, R), alpha=0.7)
        V = bmm(G_inv, B)
        R = torch.sub(R, Y).add_(V)
    assert torch.equal(state.Y, Y) and torch.equal(state.V, V) and torch.equal(state.R, R)
    assert not bool((state.Y * ~mask).any())  # the padding stays zero


def test_eigen_factors_of_non_finite_input_are_not_finite():
    A = torch.eye(3, dtype=torch.float64).repeat(2, 1, 1)
    A[1, 0, 0] = float("nan")
    lam, E = eigh_psd(A)
    Minv = bmm(E * (1.0 / (lam + 0.1)).unsqueeze(-2), E.mT)
    assert bool(torch.isfinite(Minv[0]).all()) and not bool(torch.isfinite(Minv[1]).all())
    lam, E = eigh_psd(torch.eye(3, dtype=torch.float64).repeat(2, 1, 1) * 2)
    assert torch.equal(lam, torch.full((2, 3), 2.0, dtype=torch.float64))


@pytest.mark.parametrize("form", ["derived", "paper_literal"])
@pytest.mark.parametrize("n_iters", [1, 2, 5])
@pytest.mark.parametrize("star", [False, True], ids=["degree-3", "hub-of-7"])
def test_deferred_neighbour_sum_gives_the_bits_of_its_own_pass(monkeypatch, n_iters, star, form):
    """fuse=True, large sizes, plain exchange: an iteration's neighbour sum runs in the next
    iteration's pass (``DEFER_NEIGHBOUR_SUM``) with the same bits as in a pass of its own,
    whatever the iteration count (the last one keeps its own pass) and whatever the padded
    operator's width (a hub of 7 neighbours: 8 slots, past Inductor's default limit on the
    reads of one fused node)."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
    monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    blocks = small_problem(counts=(3, 5, 4, 6, 2, 4, 3, 5))
    g = graph.star(8) if star else graph.random_connected(8, 3.0, seed=2)
    args = dict(bcd_iters=2, x_iters=n_iters, y_iters=n_iters, device="cpu", seed=1, g_max=0.04, fuse=True,
                consensus_form=form, exchange="plain")
    calls = []
    fused = fused_mod.compiled_kernels(True)
    monkeypatch.setattr(fused, "x_carry_nbr", tuple(
        (lambda f: lambda *a: (calls.append(1), f(*a))[1])(f) for f in fused.x_carry_nbr))
    deferred = pp.fit(blocks, g, 3, **args)
    assert len(calls) == 2 * (n_iters - 1)  # every iteration but the last of each X-step
    monkeypatch.setattr(kernels, "DEFER_NEIGHBOUR_SUM", False)
    own_pass = pp.fit(blocks, g, 3, **args)
    assert len(calls) == 2 * (n_iters - 1)
    assert torch.equal(deferred.X, own_pass.X) and torch.equal(deferred.U, own_pass.U)
    assert all(torch.equal(a, b) for a, b in zip(deferred.Y, own_pass.Y))
    assert deferred.history["nmse"] == own_pass.history["nmse"]


def _same_run(a, b):
    """Factors and every history key but the timings: bit for bit."""
    assert torch.equal(a.X, b.X) and torch.equal(a.U, b.U)
    assert all(torch.equal(x, y) for x, y in zip(a.Y, b.Y))
    for key, vals in a.history.items():
        if not key.startswith("time"):
            assert torch.equal(torch.as_tensor(b.history[key]), torch.as_tensor(vals)), key


# the fused case compiles for tens of seconds on a cold cache: one of them in the default run
@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("n_agents, group", [pytest.param(7, 4, marks=pytest.mark.slow), (6, 3)],
                         ids=["groups-4-3", "groups-3-3"])
def test_grouped_y_step_gives_the_bits_of_the_whole_batch(monkeypatch, fuse, n_agents, group):
    """Large Y-steps with fixed counts run group by group, each through all its iterations;
    the agents do not talk in the Y-step, so the factors and every metric keep their bits."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)  # every size takes the large paths
    blocks = small_problem(counts=(3, 5, 4, 6, 2, 5, 3)[:n_agents])
    g = graph.random_connected(n_agents, 3.0, seed=2)
    args = dict(bcd_iters=2, x_iters=4, y_iters=5, device="cpu", seed=1, g_max=0.04, fuse=fuse, exchange="plain")
    monkeypatch.setattr(kernels, "Y_TILE_BYTES", 0)
    whole = pp.fit(blocks, g, 3, **args)
    per_agent = 6 * 3 * kernels.COLUMN_CHUNK * 8  # six (K, M) float64 tensors, M padded to one chunk
    monkeypatch.setattr(kernels, "Y_TILE_BYTES", group * per_agent)
    sizes = []
    real = admm.y_loop
    monkeypatch.setattr(admm, "y_loop", lambda Y, *a, **k: sizes.append(Y.shape[0]) or real(Y, *a, **k))
    grouped = pp.fit(blocks, g, 3, **args)
    assert sizes == [group, n_agents - group] * 2 if n_agents % group else sizes == [group] * (2 * n_agents // group)
    _same_run(whole, grouped)


def test_y_groups_only_for_fixed_counts(monkeypatch):
    """With a tolerance the stopping flags travel between agents: no groups."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
    monkeypatch.setattr(kernels, "Y_TILE_BYTES", 1)
    sizes = []
    real = admm.y_loop
    monkeypatch.setattr(admm, "y_loop", lambda Y, *a, **k: sizes.append(Y.shape[:2]) or real(Y, *a, **k))
    blocks = small_problem(counts=(3, 5, 4, 6))
    pp.fit(blocks, graph.ring(4), 3, bcd_iters=1, x_iters=3, y_iters=3, tol=1e-9, admm_tol=1e-9, seed=0)
    assert sizes == [(1, 4)]  # the whole (T, N) batch, once
    assert admm.y_group(8, torch.zeros(1, 1, 2, 4), True) == 1  # the byte budget floors at one agent
    assert admm.y_group(8, torch.zeros(1, 1, 2, 4), False) == 0


@pytest.mark.parametrize("form", ["derived", "paper_literal"])
@pytest.mark.parametrize("exchange,tol", [("plain", 0.0), ("quantized", 0.0), ("plain", 1e-6)],
                         ids=["plain", "quantized", "plain-tol"])
@pytest.mark.parametrize("n_agents, group", [(7, 4), (6, 3)], ids=["groups-4-3", "groups-3-3"])
def test_grouped_x_chains_give_the_bits_of_the_whole_batch(monkeypatch, form, exchange, tol, n_agents, group):
    """Large eager X-steps run their elementwise chains group by group of agents (the
    product and the exchange on the whole batch): the same operations on slices, so the
    factors and every metric keep their bits, with and without a stopping rule."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)  # every size takes the large paths
    blocks = small_problem(counts=(3, 5, 4, 6, 2, 5, 3)[:n_agents])
    g = graph.random_connected(n_agents, 3.0, seed=2)
    args = dict(bcd_iters=2, x_iters=5, y_iters=3, device="cpu", seed=1, g_max=0.04, consensus_form=form,
                exchange=exchange, tol=tol, admm_tol=tol)
    monkeypatch.setattr(kernels, "X_TILE_BYTES", 0)
    whole = pp.fit(blocks, g, 3, **args)
    sizes = []
    real = eager_mod.x_pre_into
    monkeypatch.setattr(eager_mod, "x_pre_into", lambda U, *a: sizes.append(U.shape[0]) or real(U, *a))
    monkeypatch.setattr(kernels, "X_TILE_BYTES", group * 8 * 8 * 3 * 8)  # eight (L, K) float64 tensors
    grouped = pp.fit(blocks, g, 3, **args)
    per_step = [group] * (n_agents // group) + ([n_agents % group] if n_agents % group else [])
    assert sizes[:len(per_step)] == per_step and len(sizes) % len(per_step) == 0
    _same_run(whole, grouped)


def test_grouped_x_chains_in_batched_trials(monkeypatch):
    """Groups run across the trials of a batch (and over their dummy agents): the same bits."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
    blocks = [small_problem(counts=(3, 5, 4, 6, 2), seed=s) for s in (0, 1)]
    graphs = [graph.random_connected(5, 3.0, seed=2), graph.star(5)]
    args = dict(seeds=[0, 1], bcd_iters=2, x_iters=4, y_iters=3, device="cpu", g_max=0.04)
    monkeypatch.setattr(kernels, "X_TILE_BYTES", 0)
    whole = pp.fit_trials(blocks, graphs, 3, **args)
    monkeypatch.setattr(kernels, "X_TILE_BYTES", 4 * 8 * 8 * 3 * 8)
    grouped = pp.fit_trials(blocks, graphs, 3, **args)
    assert torch.equal(whole.X, grouped.X) and torch.equal(whole.U, grouped.U)
    assert (whole.history["nmse"] == grouped.history["nmse"]).all()


def test_agent_groups():
    assert kernels.agent_group(10, 100, 300) == 2  # 3 rounds down to a divisor within 2x
    assert kernels.agent_group(13, 100, 1000) == 10  # none in [5, 10]: groups of 10 and 3
    assert kernels.agent_group(12, 100, 400) == 4
    assert kernels.agent_group(12, 100, 500) == 4  # 5 rounds down to a divisor within 2x
    assert kernels.agent_group(12, 100, 50) == 1  # at least one agent
    assert kernels.agent_group(12, 100, 1200) == 0  # one group would hold every agent
    assert kernels.agent_group(12, 100, 0) == 0


@pytest.mark.parametrize("large", [False, True], ids=["whole-iterations", "buffered-chains"])
@pytest.mark.parametrize("kw", [dict(), dict(tol=1e-6, admm_tol=1e-4), dict(exchange="quantized", n_max=1e6),
                                dict(consensus_form="paper_literal", penalty="fixed"),
                                dict(x_iters=1, y_iters=1)])
def test_fused_solver_agrees_with_eager(monkeypatch, large, kw):
    """fuse=True: the same algorithm, to rounding (2 BCD iterations: the all-ones start is a
    saddle that amplifies rounding differences ~100x per iteration)."""
    if large:  # every size takes the buffered path, and the exchange its compiled gather
        monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
        monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    blocks = small_problem(counts=(3, 5, 4, 6, 2))
    g = graph.random_connected(5, 3.0, seed=2)
    args = dict(bcd_iters=2, x_iters=8, y_iters=8, device="cpu", seed=1, g_max=0.04)
    args.update(kw)
    eager = pp.fit(blocks, g, 3, **args)
    fused = pp.fit(blocks, g, 3, fuse=True, **args)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    assert rel(fused.X, eager.X) < 1e-10 and rel(fused.U, eager.U) < 1e-10
    assert max(rel(a, b) for a, b in zip(fused.Y, eager.Y)) < 1e-10
    assert fused.history["nmse"] == pytest.approx(eager.history["nmse"], rel=1e-10)


def test_fused_whole_iterations_with_rank_8_take_the_blas_product_and_agree_with_eager():
    """Ranks of 8 and up keep the batched product (``small=False``) in the whole-iteration
    graphs; still the same algorithm, to rounding."""
    blocks = small_problem(L=12, K=8, counts=(9, 10, 11, 9))
    g = graph.ring(4)
    args = dict(bcd_iters=2, x_iters=6, y_iters=6, device="cpu", seed=1, g_max=0.04)
    eager = pp.fit(blocks, g, 8, **args)
    fused = pp.fit(blocks, g, 8, fuse=True, **args)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())  # noqa: E731
    assert rel(fused.X, eager.X) < 1e-10 and rel(fused.U, eager.U) < 1e-10


@pytest.mark.parametrize("shapes", [((4, 6, 3), (4, 3, 5)), ((2, 3, 7, 7), (2, 3, 7, 7)), ((5, 1, 2), (5, 2, 9))])
def test_small_matmul_is_the_matrix_product(shapes):
    gen = torch.Generator().manual_seed(0)
    A, B = (torch.rand(s, generator=gen, dtype=torch.float64) for s in shapes)
    assert torch.allclose(small_matmul(A, B, True), A @ B, rtol=1e-14, atol=0)
    assert torch.equal(small_matmul(A, B, False), A @ B)


def _affine(a, b, *, scale):
    return a * scale + b, (a * b).sum()


def test_graph_compiles_once_per_layout_and_static_keyword(monkeypatch):
    """``CompiledGraph`` stands in for Dynamo's guards with its layout key: a new shape, stride or
    static keyword gets a graph of its own (and the right answer), a repeated one reuses
    its graph, and only the most recently used graphs are kept."""
    monkeypatch.setattr(CompiledGraph, "MAX_GRAPHS", 2)
    f = CompiledGraph(_affine)
    a, b = torch.arange(6.0, dtype=torch.float64).view(2, 3), torch.ones(2, 3, dtype=torch.float64)

    def check(a, b, scale):
        got = f(a, b, scale=scale)
        want = _affine(a, b, scale=scale)
        assert all(torch.allclose(x, y, rtol=1e-15, atol=0) for x, y in zip(got, want))  # FMAs may round

    check(a, b, 2)
    check(a + 1, b, 2)  # the same layout: the same graph
    assert len(f.graphs) == 1
    check(a, b, 3)  # a static keyword is part of the key
    assert len(f.graphs) == 2
    check(a, b, 2)  # used again: now the most recent
    check(a.view(3, 2).mT, b, 2)  # the same shape, transposed strides: a graph of its own
    assert len(f.graphs) == 2  # the least recently used graph (scale=3) was dropped
    assert [k[2][1] for k in f.graphs] == [(3, 1), (1, 2)]


def test_graph_key_tells_repeated_arguments_and_static_types_apart():
    """What Dynamo's guards would catch: a trace with one tensor passed twice reads it once,
    so ``(a, a)`` and ``(a, b)`` need graphs of their own; ``True == 1`` must not share a
    graph; a float static keyword is refused (``2 == 2.0``, ``0.0 == -0.0``, NaN)."""
    f = CompiledGraph(_affine)
    a, b = torch.arange(6.0, dtype=torch.float64), torch.full((6,), 0.5, dtype=torch.float64)
    for x, y in [(a, a), (a, b), (b, b)]:
        got = f(x, y, scale=2)
        want = _affine(x, y, scale=2)
        assert all(torch.allclose(g, w, rtol=1e-15, atol=0) for g, w in zip(got, want))
    assert len(f.graphs) == 2  # (a, a) and (b, b) share the repeated-argument graph
    f(a, b, scale=True)
    assert len(f.graphs) == 3
    with pytest.raises(TypeError, match="bool, int or str"):
        f(a, b, scale=2.0)


def test_fuse_without_a_cpp_compiler_is_a_clear_error(monkeypatch):
    """No working C++ compiler: one error that names fuse=True and the way out, not
    Inductor's traceback; other compile failures pass through unchanged."""
    import torch._inductor
    from torch._inductor.exc import InvalidCxxCompiler

    from ppdnmf_torch import ConfigError

    def no_compiler(gm, example_inputs, options=None):
        raise InvalidCxxCompiler()

    monkeypatch.setattr(torch._inductor, "compile", no_compiler)
    monkeypatch.setattr(fused_mod, "_FUSED", None)  # fresh graph caches: every shape compiles anew
    blocks = small_problem(counts=(3, 5, 4, 6, 2))
    args = dict(bcd_iters=1, x_iters=2, y_iters=2, device="cpu", fuse=True)
    with pytest.raises(ConfigError, match=r"fuse=True: .*no working C\+\+ compiler.*fuse=False"):
        pp.fit(blocks, graph.ring(5), 2, **args)

    def broken(gm, example_inputs, options=None):
        raise RuntimeError("something else")

    monkeypatch.setattr(torch._inductor, "compile", broken)
    with pytest.raises(RuntimeError, match="something else"):
        pp.fit(blocks, graph.ring(5), 2, **args)
    assert pp.fit(blocks, graph.ring(5), 2, **dict(args, fuse=False)).n_iter == 1


def test_a_recording_subclass_gets_every_exchange_call_under_fuse():
    """A PlainExchange subclass that overrides step 5 (the audit's recorder) is called every
    iteration: the solver's compiled shortcut around the exchange stays off for it."""
    from ppdnmf_torch.models.ppdnmf.audit import record_fit

    blocks = small_problem(counts=(3, 5, 4, 6))
    rec = record_fit(blocks, graph.ring(4), 3, kind="plain", bcd_iters=1, x_iters=4, y_iters=2, fuse=True)
    assert len(rec.U) == 4


def test_fused_buffered_run_resumes_bit_identically(monkeypatch, tmp_path):
    """fuse=True with the buffered chains: the carried differences live within an X-step
    (Y-step); a checkpoint between BCD iterations holds the whole state."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
    monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    blocks = small_problem(counts=(3, 5, 4, 6, 2))
    g = graph.random_connected(5, 3.0, seed=2)
    args = dict(bcd_iters=4, x_iters=8, y_iters=8, device="cpu", seed=1, g_max=0.04, fuse=True)
    full = pp.fit(blocks, g, 3, **args)
    pp.fit(blocks, g, 3, checkpoint_dir=tmp_path, callback=lambda info: info.iteration == 2, **args)
    resumed = pp.fit(blocks, g, 3, resume_from=tmp_path, **args)
    assert torch.equal(resumed.X, full.X) and torch.equal(resumed.U, full.U)
    assert all(torch.equal(a, b) for a, b in zip(resumed.Y, full.Y))
    assert resumed.history["nmse"] == full.history["nmse"]

@pytest.mark.parametrize("derived", [True, False])
@pytest.mark.parametrize("n_iters", [1, 2, 5])
def test_carried_differences_give_the_bits_of_the_plain_chains(derived, n_iters):
    """The large fused loop carries ``D = X - P_prev`` (``Y - R_prev``) instead of X and P
    (Y and R): the same operations, so the same bits, X-step and Y-step (run uncompiled)."""
    from ppdnmf_torch.models.ppdnmf.solver import fused as s

    gen = torch.Generator().manual_seed(n_iters)
    r = lambda *shape: torch.randn(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    shape = (2, 3, 6, 4)
    U0, P0, ZYt, Q, Q_prev, W = r(*shape), r(*shape), r(*shape), r(*shape), r(*shape), r(2, 3, 4, 4)
    rho, mu = r(2, 3, 1, 1).abs(), torch.tensor(0.3, dtype=torch.float64)
    out = lambda: torch.empty(shape, dtype=torch.float64)  # noqa: E731

    # plain chains: eqs. 8-9, a stand-in for the U-update, eq. 10
    U, P, sums = U0, P0, []
    for _ in range(n_iters):
        X, rhs, P_new, usum = out(), out(), out(), torch.empty(2, 3, dtype=torch.float64)
        s.fx_pre_into(U, P, ZYt, Q, Q_prev, rho, mu, derived, X, rhs)
        U = rhs @ W
        s.fx_post_into(P, X, U, P_new, usum)
        P = P_new
        sums.append(usum)
    # carried differences
    Uc, Dc, sums_c = U0, None, []
    for m in range(n_iters):
        D_new, rhs, last = out(), out(), m == n_iters - 1
        args = (ZYt, Q, Q_prev, rho, mu, derived, D_new, rhs)
        if Dc is not None:
            sums_c.append(torch.empty(2, 3, dtype=torch.float64))
            args += (sums_c[-1],)
        if last:
            Xc = out()
            (s.fx_carry_first_x_into if Dc is None else s.fx_carry_x_into)(Uc, P0 if Dc is None else Dc, *args, Xc)
        else:
            (s.fx_carry_first_into if Dc is None else s.fx_carry_into)(Uc, P0 if Dc is None else Dc, *args)
        Dc, Uc = D_new, rhs @ W
    Pc = out()
    sums_c.append(torch.empty(2, 3, dtype=torch.float64))
    s.fx_carry_last_into(Uc, Dc, Pc, sums_c[-1])
    assert torch.equal(Uc, U) and torch.equal(Xc, X) and torch.equal(Pc, P)
    assert all(torch.equal(a, b) for a, b in zip(sums_c, sums))

    V0, R0, XtZ, eta = r(*shape), r(*shape), r(*shape), torch.tensor(0.7, dtype=torch.float64)
    V, R = V0, R0
    for _ in range(n_iters):
        Y, B, R_new = out(), out(), out()
        s.fy_pre_into(V, R, XtZ, eta, Y, B)
        V = B @ W
        s.fy_post_into(R, Y, V, R_new)
        R = R_new
    Vc, Dc = V0, None
    for m in range(n_iters):
        D_new, B = out(), out()
        first = Dc is None
        if m == n_iters - 1:
            Yc = out()
            (s.fy_carry_first_y_into if first else s.fy_carry_y_into)(Vc, R0 if first else Dc, XtZ, eta, D_new, B, Yc)
        else:
            (s.fy_carry_first_into if first else s.fy_carry_into)(Vc, R0 if first else Dc, XtZ, eta, D_new, B)
        Dc, Vc = D_new, B @ W
    Rc = out()
    s.fy_carry_last_into(Vc, Dc, Rc)
    assert torch.equal(Vc, V) and torch.equal(Yc, Y) and torch.equal(Rc, R)


def test_deferred_neighbour_sum_in_batched_trials(monkeypatch):
    """The deferred neighbour sum over a batch of trials (one padded operator over all
    ``T * N`` nodes): the bits of its own pass."""
    monkeypatch.setattr(Workspace, "MIN_BYTES", 0)
    monkeypatch.setattr(PlainExchange, "ELL_MIN_BYTES", 0)
    blocks = [small_problem(counts=(3, 5, 4, 6, 2), seed=s) for s in (0, 1)]
    graphs = [graph.random_connected(5, 3.0, seed=2), graph.star(5)]
    args = dict(seeds=[0, 1], bcd_iters=2, x_iters=4, y_iters=3, device="cpu", g_max=0.04, fuse=True,
                exchange="plain")
    calls = []
    fused = fused_mod.compiled_kernels(True)
    monkeypatch.setattr(fused, "x_carry_nbr", tuple(
        (lambda f: lambda *a: (calls.append(1), f(*a))[1])(f) for f in fused.x_carry_nbr))
    deferred = pp.fit_trials(blocks, graphs, 3, **args)
    assert len(calls) == 2 * 3
    monkeypatch.setattr(kernels, "DEFER_NEIGHBOUR_SUM", False)
    own_pass = pp.fit_trials(blocks, graphs, 3, **args)
    assert torch.equal(deferred.X, own_pass.X) and torch.equal(deferred.U, own_pass.U)
    assert (deferred.history["nmse"] == own_pass.history["nmse"]).all()


@pytest.mark.parametrize("slots", [6, 12, PlainExchange.ELL_MAX_SLOTS])
def test_joint_pass_writes_no_state_sized_buffer_of_its_own(slots):
    """The deferred neighbour sum's compiled pass keeps every value in registers, up to the
    widest operator the plain exchange pads: Inductor's default limits on one fused node
    would store the gathered sum and the chain in fresh state-sized buffers (a page-in of
    the whole state per call; 4-5x slower at N = 2000 from 6 slots on)."""
    import re

    from torch._inductor.utils import run_and_get_code

    fused = fused_mod.compiled_kernels(True)
    if fused.x_carry_nbr is None:  # pragma: no cover - a torch without the settings
        pytest.skip("this torch lacks Inductor's realize_* settings: the solver keeps two passes")
    A, L, K = 12, 4, 3
    gen = torch.Generator().manual_seed(slots)
    r = lambda *shape: torch.rand(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    U, D, ZYt, Q = (r(1, A, L, K) for _ in range(4))
    nbr = torch.randint(0, A, (A, slots), generator=gen)
    outs = [torch.empty_like(U), torch.empty_like(U), torch.empty(1, A, dtype=torch.float64), torch.empty_like(U)]
    _, code = run_and_get_code(fused.x_carry_nbr[0], U, D, ZYt, Q, r(1, A, 1, 1), nbr, r(A, slots),
                               torch.tensor(0.5, dtype=torch.float64), True, *outs)
    shapes = re.findall(r"buf\d+ = empty_strided\w*\(\(([^)]*)\)", "\n".join(code))
    sizes = [math.prod(int(x) for x in sh.split(",") if x.strip()) for sh in shapes]
    assert shapes, "the pattern no longer matches Inductor's generated code"
    assert all(n <= A for n in sizes), shapes  # the per-agent sums only
