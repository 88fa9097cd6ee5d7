"""PPDNMF's X-step through the incremental consensus engine (``x_solver`` = "i_admm",
"pi_admm", "pi_admm2"): one token walks the agents instead of the secure neighbour sums.

With ``Y`` fixed, the X-step is the consensus problem ``min_X sum_i f_i(X)``,
``f_i(X) = 1/2 ||Z_i - X Y_i||_F^2``, ``X >= 0`` (docs/INCREMENTAL_ADMM.md, "As PPDNMF's
X-step"; docs/INCREMENTAL.md). Each round the token ``z`` visits every agent once along
the trial's visiting order (a Hamiltonian cycle of its graph, or, with ``x_walk="auto"``
and no cycle found, the order of a closed walk whose relays forward the token
unchanged); the active agent takes the exact step

    x_i = (Z_i Y_i^T + y_i + c P(z)) (Y_i Y_i^T + c I)^{-1},   c = rho gamma,

with ``P(z) = max(z, 0)``: the token carries the unconstrained average and every agent
uses its projection. **The paper's analysis does not cover the projection.** (At a fixed
point ``x_i = P(z) = X`` and ``grad f_i(X) = y_i``, so the invariant gives
``X = P(X - sum_i grad f_i(X) / (N rho))``: the nonnegative least-squares condition.)

What carries across BCD iterations (warm starts): ``x_i`` (in ``state.U``; the factor is
``X_i = max(x_i, 0)``), the multipliers ``y_i`` (``state.inc_y``), the token
(``state.inc_z``) and the visiting orders (``state.inc_cycle``), all in the checkpoint.
Each X-step draws its step-size perturbations (and noises) from fresh streams seeded by
the trial's seed and the BCD iteration, so a resumed run continues bit for bit. The
start (Algorithm 2 around the solver's ``X^0``): ``x_i^0 = X^0 + v_i``, ``v_i ~ U(x_start)``
private, ``y_i^0 = rho v_i``, ``z^0 = X^0``, which keeps ``z = mean_i(x_i - y_i / rho)``.

Trials run batched: each trial's agents are relabelled along its visiting order, so that
every trial's step ``k`` touches agent ``k`` (one shared cycle for the engine), and
labelled back afterwards. Only the real agents walk (alignment dummies are left alone).
"""
from __future__ import annotations

import warnings

import torch

from ....consensus import IncrementalADMM, IncrementalState, LeastSquares, hamiltonian_cycle, make_method
from ....consensus import project_nonnegative
from ....consensus.randomness import TrialStreams, stream_seed
from ....errors import GraphError
from ....graph import Graph
from ..problem import Problem
from .kernels import Workspace, column_gram, eigh_psd
from .state import SolverParams, SolverState

__all__ = ["incremental_x_step", "visiting_orders", "relay_routes", "trial_graphs", "method_of"]


def method_of(params: SolverParams):
    """The engine's :class:`~ppdnmf_torch.consensus.Method` for ``params.x_solver`` (exact step;
    the start is the solver's, see the module docstring)."""
    name = params.x_solver
    if name == "i_admm":
        return make_method("i_admm", step="exact")
    if name == "pi_admm":
        return make_method("pi_admm1", spread=params.x_gamma_spread, start=None, step="exact")
    if name == "pi_admm2":
        return make_method("pi_admm2", sigma=params.x_sigma, start=None, step="exact")
    raise ValueError(f"x_solver {name!r} is not an incremental solver")  # the caller dispatches


def trial_graphs(problem: Problem) -> list[Graph]:
    """Each trial's graph on its real agents, from the problem's block-diagonal topology."""
    topo, n = problem.topology, problem.n_agents
    Np = topo.n_agents
    src, dst = topo.src.cpu().tolist(), topo.dst.cpu().tolist()
    edges = [[] for _ in range(topo.n_trials)]
    for s, d in zip(src, dst):
        if s < d:
            t = s // Np
            edges[t].append((s - t * Np, d - t * Np))
    return [Graph(n, tuple(e)) for e in edges]


def _hops(g: Graph, order) -> int:
    """Vectors one round sends: the shortest-path hops from each agent to the next (and back to the first)."""
    n = len(order)
    if n == 1:
        return 0
    if n == 2:
        return 2
    return sum(g.distances_from(order[k])[order[(k + 1) % n]] for k in range(n))


def relay_routes(g: Graph, order) -> list[list[int]]:
    """The agents that relay the token from ``order[k]`` to the next one (a shortest path's
    inner nodes, networkx's choice; empty between neighbours), for every ``k``."""
    import networkx as nx

    n = len(order)
    if n <= 2:
        return [[] for _ in range(n)]
    G = nx.Graph()
    G.add_nodes_from(range(g.n_agents))
    G.add_edges_from(g.edges)
    return [[int(v) for v in nx.shortest_path(G, order[k], order[(k + 1) % n])[1:-1]] for k in range(n)]


def _closed_walk_order(g: Graph) -> tuple[int, ...]:
    """The order of first visits of a short closed walk through every agent (networkx's
    travelling-salesman approximation on the shortest-path metric), from agent 0."""
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(g.n_agents))
    G.add_edges_from(g.edges)
    walk = nx.approximation.traveling_salesman_problem(G, cycle=True)
    order = list(dict.fromkeys(int(v) for v in walk))
    k = order.index(0)
    return tuple(order[k:] + order[:k])


def visiting_orders(graphs, walk: str = "auto"):
    """Every trial's visiting order and the vectors one round sends.

    Parameters
    ----------
    graphs : list of Graph
    walk : {"auto", "cycle"}
        "cycle": a Hamiltonian cycle (:func:`~ppdnmf_torch.consensus.hamiltonian_cycle`) or a
        :class:`~ppdnmf_torch.errors.GraphError`; "auto": that cycle when one is found, else
        the order of a closed walk that relays the token along shortest paths.

    Returns
    -------
    orders : list of tuple of int
    hops : list of int
        Vectors per round (``N`` on a Hamiltonian cycle of ``N >= 3`` agents).
    """
    orders, hops = [], []
    for t, g in enumerate(graphs):
        try:
            order = hamiltonian_cycle(g)
        except GraphError as exc:
            if walk == "cycle":
                raise GraphError(f"adjacency: trial {t}'s graph: {exc.reason}; {{x_walk}}='cycle' needs a "
                                 "Hamiltonian cycle: use {x_walk}='auto' (a closed walk that relays the token) "
                                 "or another graph") from None
            order = _closed_walk_order(g)
        orders.append(tuple(order))
        hops.append(_hops(g, order))
    return orders, hops


def _cache(ws: Workspace) -> dict:
    # the engine (and its compiled round) and the walks live as long as the run's workspace
    return ws.__dict__.setdefault("_incremental", {})


def _walks(problem: Problem, params: SolverParams, state: SolverState, cache: dict):
    key = ("walks", id(problem))
    if key not in cache:
        graphs = trial_graphs(problem)
        if state.inc_cycle is not None:  # resumed: the run's own orders
            orders = [tuple(int(v) for v in row) for row in state.inc_cycle.cpu()]
            hops = [_hops(g, o) for g, o in zip(graphs, orders)]
        else:
            orders, hops = visiting_orders(graphs, params.x_walk)
        perm = torch.tensor(orders, dtype=torch.long, device=problem.Z.device)
        cache[key] = (perm, hops)
    return cache[key]


def _start(problem: Problem, state: SolverState, params: SolverParams):
    """Algorithm 2 around ``X^0 = U``: ``x = X^0 + v``, ``y = rho v``, ``z = mean_i X^0_i``."""
    n = problem.n_agents
    X0 = state.U[:, :n]
    T, _, L, K = X0.shape
    lo, hi = params.x_start_range
    if lo == hi == 0.0:
        v = torch.zeros_like(X0)
    else:
        v = TrialStreams(problem.seeds).start_values(n, (L, K), [lo] * T, [hi] * T).to(X0)
    return X0 + v, params.x_rho * v, X0.mean(1)


def _relabel(t, rows, perm):
    return t[rows, perm]


def _unlabel(t, rows, perm):
    out = torch.empty_like(t)
    out[rows, perm] = t
    return out


def _engine(cache, loss, params, seeds, start: IncrementalState):
    """The run's engine, warm: the same object (and compiled round) across X-steps, its state
    overwritten with ``start`` and its streams reseeded, so a fresh engine gives the same bits."""
    eng = cache.get("engine")
    if eng is not None and eng.batch == len(seeds) and eng.shape == tuple(loss.shape) \
            and eng.n_agents == loss.n_agents and eng.dtype == loss.dtype and eng.device == loss.device:
        eng.set_loss(loss)
        eng.load_state(start)
        eng.reseed(seeds)
        return eng
    eng = IncrementalADMM(loss, method_of(params), params.x_rho, seeds=seeds, projection=project_nonnegative,
                          initial_state=start, compile="round" if params.fuse else "none")
    cache["engine"] = eng
    return eng


def incremental_x_step(problem: Problem, state: SolverState, params: SolverParams, exchange=None, sampler=None,
                       *, bcd_iter: int = 1, ws: Workspace | None = None) -> dict:
    """X-step by the incremental engine: ``x_rounds`` rounds of the token (default ``x_iters``).

    :func:`~ppdnmf_torch.models.ppdnmf.solver.x_step`'s signature (``exchange`` and ``sampler`` are not
    used: nothing goes through the secure exchange) and result; updates ``state`` in place.

    Returns
    -------
    dict
        ``iters (T, N)``: local solves per agent (the rounds; 0 for alignment dummies);
        ``primal (T,)``: ``sqrt(sum_i ||x_i - P(z)||^2)``, the distance to consensus;
        ``dual (T,)``: ``rho sqrt(n) ||P(z^R) - P(z^{R-1})||``, the last round's move of
        the projected token (ADMM's dual residual with ``P(z)`` as the consensus variable);
        ``first_bad (T, N)``: the first round (1-based) after which an agent's ``x_i`` was
        not finite (0: never); ``history``: ``x_vectors`` and ``x_bytes (T,)``, the token
        messages this X-step sent (relays included) and their plaintext bytes.
    """
    Z = problem.Z
    T, Np, L, _ = Z.shape
    n, K = problem.n_agents, state.U.shape[-1]
    ws = ws if ws is not None else Workspace()
    cache = _cache(ws)
    perm, hops = _walks(problem, params, state, cache)
    rows = torch.arange(T, device=Z.device).unsqueeze(1)
    # the products and the decomposition of the ADMM X-step (bit-stable whatever the batch)
    ZYt = column_gram(Z, state.Y)
    YYt = column_gram(state.Y, state.Y)
    lam, E = eigh_psd(YYt)
    loss = LeastSquares(YYt[:, :n], ZYt[:, :n], _eig=(lam[:, :n], E[:, :n]), check_finite=False).relabel(perm)
    if state.inc_y is None:
        x, y, z = _start(problem, state, params)
    else:
        x, y, z = state.U[:, :n], state.inc_y[:, :n], state.inc_z
    start = IncrementalState(_relabel(x, rows, perm), _relabel(y, rows, perm), z)
    seeds = [stream_seed(s, f"x_step:{int(bcd_iter)}") for s in problem.seeds]
    eng = _engine(cache, loss, params, seeds, start)
    rounds = params.x_rounds or params.x_iters
    sums, tokens = [], [None, None]

    def record(info):
        sums.append(eng.x.sum(dim=(-2, -1)))
        tokens[0], tokens[1] = tokens[1], project_nonnegative(eng.z).clone()

    # an exchange with a ``record_tokens`` method (the privacy audit's recorder) gets the
    # X-step's transcript: what an eavesdropper hears, and the states as ground truth
    recorder = getattr(exchange, "record_tokens", None)
    with warnings.catch_warnings():
        # non-finite iterates: the solver's finiteness check names the iteration and agents
        warnings.filterwarnings("ignore", message="IncrementalADMM: the iterates are not finite")
        res = eng.run(rounds, record_every=1, callback=record, transcript=recorder is not None,
                      watch=None if recorder is None else range(n))
    if recorder is not None:
        recorder(bcd_iter=int(bcd_iter), rho=params.x_rho, **_in_labels(res.transcript, perm))
    x_new, y_new = _unlabel(res.x, rows, perm), _unlabel(res.y, rows, perm)
    U, X = state.U.clone(), state.X.clone()
    U[:, :n] = x_new
    X[:, :n] = x_new.clamp_min(0)
    inc_y = torch.zeros_like(U) if state.inc_y is None else state.inc_y.clone()
    inc_y[:, :n] = y_new
    state.U, state.X, state.inc_y, state.inc_z, state.inc_cycle = U, X, inc_y, res.z, perm.clone()
    return _result(problem, params, res, x_new, tokens, sums, perm, hops, rounds, K)


def _in_labels(tr, perm) -> dict:
    """A :class:`~ppdnmf_torch.consensus.Transcript` of the relabelled engine in the agents'
    own labels: ``tokens (S + 1, T, L, K)``, ``agents (S, T)``, ``order (T, n)`` and every
    agent's ``x``, ``y`` after ``0 .. S`` steps, ``(S + 1, T, n, L, K)``."""
    p = perm.cpu()
    rows = torch.arange(p.shape[0]).unsqueeze(1)
    agents = p.gather(1, tr.agents.T.contiguous()).T.contiguous()
    return {"tokens": tr.tokens, "agents": agents, "order": p.clone(),
            "x": _unlabel_steps(tr.x, rows, p), "y": _unlabel_steps(tr.y, rows, p)}


def _unlabel_steps(t, rows, perm):
    out = torch.empty_like(t)
    out[:, rows, perm] = t
    return out


def _result(problem, params, res, x_new, tokens, sums, perm, hops, rounds, K) -> dict:
    Z = problem.Z
    T, Np = Z.shape[:2]
    n = problem.n_agents
    zp = res.z_projected
    primal = (x_new - zp.unsqueeze(1)).square().sum(dim=(1, 2, 3)).sqrt()
    dual = params.x_rho * n ** 0.5 * (tokens[1] - tokens[0]).square().sum(dim=(1, 2)).sqrt()
    iters = torch.zeros((T, Np), dtype=torch.int64, device=Z.device)
    iters[:, :n] = rounds
    first_bad = torch.zeros((T, Np), dtype=torch.int64, device=Z.device)
    bad = ~torch.isfinite(torch.stack(sums[1:]))  # (rounds, T, n), cycle labels
    rows = torch.arange(T, device=Z.device).unsqueeze(1)
    first_bad[:, :n] = _unlabel(torch.where(bad.any(0), bad.to(torch.int8).argmax(0) + 1, 0), rows, perm)
    vectors = torch.tensor([float(rounds * h) for h in hops], dtype=torch.float64)
    nbytes = vectors * (Z.shape[2] * K * Z.element_size())
    return {"iters": iters, "primal": primal, "dual": dual, "first_bad": first_bad,
            "history": {"x_vectors": vectors, "x_bytes": nbytes}}
