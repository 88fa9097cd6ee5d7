"""The functional entry points of PPDNMF: :func:`fit`, :func:`fit_trials` and
:func:`fit_centralized`.

Their keywords are scikit-learn-style and explicit (the users' API), and their defaults and
rules are the spec's (:mod:`.config`): each call checks its keywords there once
(:func:`~.config.settings`), validates its inputs (:mod:`.problem`) and hands the rest to
:mod:`.run`.
"""
from __future__ import annotations

import torch

from ..._utils import resolve_device, resolve_dtype
from ...errors import ConfigError
from ...graph import check_min_degree, complete
from ...penalties import check_shared_caps
from ...specs import check_value
from .memory import check_fit
from ...threads import with_threads
from .config import MAX_SEED, OPTION_DEFAULTS as _O, SOLVER_DEFAULTS as _S, settings
from .problem import as_blocks, as_caps, as_graph, as_seed, build_problem, check_data
from .result import FitResult, TrialsResult, history_batched, history_single
from .run import prepare, preflight, run, start_seed, warn_degree_one, warn_sum_leak

__all__ = ["fit", "fit_trials", "fit_centralized"]


@with_threads
def fit(Z, adjacency, rank, *, columns=None, mu=_S.mu, eta=_S.eta, g_max=_S.g_max, bcd_iters=_S.bcd_iters,
        x_iters=_S.x_iters, y_iters=_S.y_iters, tol=_S.tol, admm_tol=_S.admm_tol, exchange=_O.exchange,
        protocol=_O.protocol, n_max=_O.n_max, key_bits=_O.key_bits, g_bits=_O.g_bits, penalty=_S.penalty,
        consensus_form=_S.consensus_form, negative=_O.negative, seed=_O.seed, device=_O.device, dtype=_O.dtype,
        callback=_O.callback, exchange_options=_O.exchange_options, checkpoint_dir=_O.checkpoint_dir,
        checkpoint_every=_O.checkpoint_every, resume_from=_O.resume_from, fuse=_S.fuse, threads=_O.threads,
        penalty_schedule=_S.penalty_schedule, init=_S.init, init_seed=_S.init_seed, y_solver=_S.y_solver,
        x_solver=_S.x_solver, x_rho=_S.x_rho, x_gamma_spread=_S.x_gamma_spread, x_sigma=_S.x_sigma,
        x_rounds=_S.x_rounds, x_start=_S.x_start, x_walk=_S.x_walk, min_degree=_O.min_degree) -> FitResult:
    """Factorize ``Z ~ X Y`` with N agents on a graph (PPDNMF, Algorithm 1).

    Parameters
    ----------
    Z : array-like or Tensor (L, M), or list of N blocks (L, M_i)
        Nonnegative data. A single matrix is split by columns (``columns``).
    adjacency : (N, N) symmetric 0/1 array-like, torch sparse tensor, networkx graph, or Graph
        Connected, without self loops.
    rank : int
        ``K``, ``1 <= K <= L``.
    columns : list of int, optional
        Per-agent column counts summing to M; equal split when omitted.
    mu, eta : float
        ADMM penalties of the X-step (eqs. 8-11) and Y-step (eqs. 12-14).
    g_max : float or sequence of N floats
        Penalty caps ``g_i``.
    bcd_iters, x_iters, y_iters : int
        Iteration caps.
    tol : float
        Tolerance of the BCD stopping rule: the run stops at the first BCD iteration at which
        every agent's model change ``||X_i Y_i - X'_i Y'_i||_F / ||Z_i||_F`` and disagreement
        are below it (:mod:`.solver.stopping`); ``0`` runs the fixed counts. The BCD loop
        checks from the second BCD iteration on (after the first, with one ADMM iteration per
        step, both factors still equal their start); the ADMM loops check the relative change
        of ``U_i`` and ``V_i``.
    admm_tol : float, optional
        Tolerance of the ADMM loops alone (default: ``tol``); ``0`` keeps fixed ADMM counts.
    exchange : {"plain", "quantized", "paillier", "secagg"}, ExchangeSpec or Exchange
        The exchange kind, a typed spec (:class:`~ppdnmf_torch.exchange.QuantizedSpec`,
        :class:`~ppdnmf_torch.exchange.PaillierSpec`, ...) or an exchange object. ``fit``
        owns the exchange: it closes it at the end (a Paillier exchange's keys go with it).
    protocol, n_max, key_bits, g_bits : optional
        Shorthand for the integer kinds' spec fields (None: the spec's default; a value
        that does not apply to the kind, or contradicts a given spec or exchange, is a
        :class:`~ppdnmf_torch.ConfigError`). ``protocol``: ``"masked"`` (hides each
        neighbour's term from the receiver), ``"aggregated"`` or ``"paper"`` (the printed
        protocols; docs/SECURE_EXCHANGE.md), the spec's default if not given; ``n_max``:
        quantization scale (the paper's ``N_max``, default 1e6);
        ``key_bits``: Paillier key size (default 2048; smaller sizes warn); ``g_bits``:
        penalties are scaled by ``2^g_bits`` (default 16).
    penalty : {"random", "fixed"}
        Monotone random draws (Sec. III-B) or ``g_{i->j} = g_i``.
    consensus_form : {"derived", "paper_literal"}
        See ALGORITHM.md, "The consensus term in step 3".
    negative : {"error", "clip", "shift", "allow"}
        What to do with negative entries of ``Z``.
    seed : int
        Seeds the penalty draws (and the seeded start, unless ``init_seed`` is given).
    device : {"auto", "cpu", "cuda", "cuda:<k>"} or torch.device
    dtype : {"float64", "float32"} or torch.float64 or torch.float32
    callback : callable, optional
        ``callback(info)`` after each BCD iteration, ``info.metrics`` holding floats;
        return True to stop.
    exchange_options : dict, optional
        Further settings of the kind's spec (e.g. ``workers``, ``cost_model``;
        :data:`~ppdnmf_torch.exchange.EXCHANGE_OPTIONS`).
    checkpoint_dir : str or Path, optional
        Write crash-safe checkpoints there (the engine's format, :mod:`ppdnmf_torch.checkpoint`):
        every ``checkpoint_every`` BCD iterations, at the end and on Ctrl-C, which then raises
        :class:`~ppdnmf_torch.driver.RunInterrupted`; the newest two are kept. The folder is locked.
    checkpoint_every : int
        BCD iterations between checkpoints (``0``: only at the end and on Ctrl-C).
    resume_from : str or Path, optional
        A checkpoint file, or a folder whose newest checkpoint is used. The run must be
        the same (data, graph, seed, parameters: a difference is refused by name; ``bcd_iters``
        may change, not below the iterations done); it continues bit for bit (on CPU: CUDA's
        atomic additions may round differently from run to run).
    fuse : bool
        Compile the ADMM iterations with TorchInductor: small problems run a whole
        iteration (with the ``plain`` exchange's neighbour sum, and for ranks below 8 the
        products too) as one compiled graph called without ``torch.compile``'s per-call
        guards, large ones compile the elementwise chains (``torch.compile``) into single
        passes over reused buffers. Faster than the eager default at every size measured
        (see docs/PERFORMANCE.md), at the cost of a compilation per shape
        (seconds, once per process while the shape stays among the 8 most recently used
        of each whole-iteration graph; past torch's limit of 8 recompilations of one
        chain it runs uncompiled); rounds slightly differently (fused multiply-adds).
        Needs a C++ compiler on CPU (without one, a ``ConfigError`` says so). With an
        incremental ``x_solver``: each round of the token runs as one compiled graph.
    threads : int, optional
        CPU threads of torch's intra-op pool for this call (restored afterwards); None: the
        package's default (:func:`~ppdnmf_torch.threads.default_threads`: one thread, or
        torch's current count when ``OMP_NUM_THREADS`` is set).
    penalty_schedule : {"agreed", "adaptive", "paper"}
        ``"agreed"`` (default): every edge takes one common penalty per ADMM iteration,
        ``g^(m)`` drawn monotone in ``(g^(m-1), g]`` from a stream all agents agree on, so
        every ``rho_ij = g^(m)^2`` and a receiver's sums reveal no single neighbour; the one
        cap ``g`` (``g_max``, which must be one number) grows by 1.2x after a BCD iteration,
        to at most 32x ``g_max``, when some agent still disagrees with its neighbours (one
        bit per BCD iteration, spread like the stopping rule's flags); each agent's ``mu_i``
        rises to a quarter of ``tr(Y_i Y_i^T) / K`` when ``mu`` is smaller, and to
        ``2 d_i g^2`` when the common cap needs it (``rho_i <= mu_i / 2``), privately
        (:mod:`ppdnmf_torch.models.ppdnmf.solver.schedule`).
        ``"adaptive"``: each agent raises its own cap ``g_i`` the same way from its own
        disagreement (unequal weights: an integer exchange warns,
        :class:`~ppdnmf_torch.SumLeakWarning`). The integer exchanges' range is checked
        against the 32x bound before the run. ``"paper"``: the fixed caps of Sec. III-B.
    init : {"random", "ones"}
        The start ``X_0 = U_0``: ``"random"`` (default) draws it from ``init_seed``, the same
        on every agent (uniform on ``[0, 2)``, :func:`~ppdnmf_torch.models.ppdnmf.solver.state.initial_factor`);
        ``"ones"`` is the paper's all-ones start, a symmetric saddle that only rounding breaks.
    init_seed : int, optional
        Seed of ``init="random"``; None (default) uses ``seed``.
    y_solver : {"admm", "hals"}
        The Y-step: ``y_iters`` ADMM iterations (eqs. 12-14, default) or ``y_iters`` HALS
        sweeps (:mod:`ppdnmf_torch.models.ppdnmf.solver.hals`).
    x_solver : {"admm", "i_admm", "pi_admm", "pi_admm2"}
        The X-step: the paper's decentralized ADMM with the secure exchange (default), or the
        incremental consensus engine (docs/INCREMENTAL.md): one token walks a Hamiltonian
        cycle of the graph (I-ADMM; PI-ADMM1 with a private step size per activation;
        PI-ADMM2 with Gaussian noise on every new ``x_i``), the agents use its projection
        ``max(z, 0)`` (outside the paper's analysis), and the state carries over between BCD
        iterations. Needs ``exchange="plain"`` (nothing is exchanged but the token); ``mu``
        and the penalty settings (``g_max``, ``penalty``, ``penalty_schedule``) do not enter
        it. History keys ``x_vectors`` / ``x_bytes`` count its messages per BCD iteration.
    x_rho : float
        The incremental methods' penalty ``rho``.
    x_gamma_spread : float
        ``pi_admm``: ``gamma ~ U(1 - s / x_rho, 1 + s / x_rho)``, ``s < x_rho``.
    x_sigma : float
        ``pi_admm2``: the noise's standard deviation.
    x_rounds : int, optional
        Rounds of the token per X-step (each agent solves once per round); default
        ``x_iters``: the same local work as the ADMM X-step.
    x_start : (low, high), optional
        The private start offsets ``v_i ~ U(low, high)`` (Algorithm 2 around ``X = 1``);
        default ``(0, 0)`` for ``i_admm``, ``(-1, 1)`` for the PI-ADMMs.
    x_walk : {"auto", "cycle"}
        "cycle" requires a Hamiltonian cycle (a ``GraphError`` otherwise); "auto" falls back
        to a closed walk whose relays forward the token (each hop counts a message).

    min_degree : int, optional
        Refuse graphs with an agent of fewer neighbours (:class:`~ppdnmf_torch.GraphError`).
        ``min_degree=2`` refuses agents with a single neighbour, whose sums are that
        neighbour's term under any protocol; without it, an integer exchange (``quantized``,
        ``paillier``) warns naming them (:class:`~ppdnmf_torch.DegreeOneWarning`).

    The paper's settings are ``penalty_schedule="paper", init="ones", y_solver="admm"``
    (:data:`PAPER_SETTINGS`); ``experiment=paper_*`` and :func:`~ppdnmf_torch.run_experiment`'s
    presets use them.

    Every keyword's default and rule is the spec's (:class:`~.config.SolverConfig`,
    :class:`~.config.FitOptions`): a value of the wrong type is refused by name
    (:class:`~ppdnmf_torch.ConfigError`), never converted.

    Returns
    -------
    FitResult

    Warns
    -----
    DegenerateResultWarning
        When the result is degenerate (an all-zero ``X_i``, an NMSE of 1, or ``X`` that did
        not move), with the likely cause and what to try.
    DataScaleWarning
        Up front, when the data's largest entry is far from 1.
    SumLeakWarning
        Up front, when an integer exchange runs under ``penalty_schedule="adaptive"``, or
        ``"paper"`` with unequal caps: a receiver's weights differ across its neighbours.
    """
    solver, options = settings(locals())  # every keyword checked, once
    device, dtype = resolve_device(options.device), resolve_dtype(options.dtype)
    graph = as_graph(adjacency)
    check_min_degree(graph, options.min_degree)
    blocks = check_data(as_blocks(Z, graph.n_agents, columns), options.negative)
    caps = as_caps(solver.g_max, graph.n_agents)
    params, exch = prepare(solver, options, blocks[0].shape[0])
    try:
        warn_degree_one(exch, [graph])
        warn_sum_leak(exch, params, caps[None], [graph.degree])  # secagg refuses a per-edge schedule here
        check_shared_caps(caps, params.penalty_schedule)
        preflight(exch, blocks, caps, graph.degree, params)
        check_fit([blocks], [graph], params, dtype=dtype, device=device, exchange=exch)
        problem = build_problem([blocks], [graph], caps[None], [options.seed], dtype=dtype, device=device,
                                init_seeds=[start_seed(solver.init_seed, options.seed)])
    except BaseException:
        exch.close()  # fit owns the exchange, also when it fails before the run
        raise
    state, history, info, costs = run(problem, params, exch, options, single=True)
    counts = [b.shape[1] for b in blocks]
    return FitResult(X=state.X[0], Y=[state.Y[0, i, :, :c] for i, c in enumerate(counts)], U=state.U[0],
                     history=history_single(history), graph=graph, columns=counts, n_iter=info["n_iter"],
                     converged=info["converged"], costs=costs)


def _trial_caps(g_max, T: int, N: int) -> torch.Tensor:
    """``(T, N)`` caps from one cap, ``N`` caps, or a ``(T, N)`` array."""
    caps_t = torch.as_tensor(g_max, dtype=torch.float64)
    if caps_t.dim() == 2:
        if tuple(caps_t.shape) != (T, N):
            raise ConfigError(f"g_max: a 2-D cap array must have shape ({T}, {N}), got {tuple(caps_t.shape)}")
        return torch.stack([as_caps(row.tolist(), N) for row in caps_t])
    return as_caps(g_max if caps_t.dim() == 0 else caps_t.tolist(), N).expand(T, N)


def _check_trials(block_lists, graphs, seeds, init_seeds, align_trials) -> tuple[list, list]:
    """``fit_trials``' own arguments: as many data sets, graphs and seeds (and start seeds);
    returns the graphs and the seeds."""
    for name, v in (("block_lists", block_lists), ("graphs", graphs), ("seeds", seeds)):
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{name}: must be a list (one entry per trial), got {type(v).__name__}")
    check_value("align_trials", align_trials, bool)
    T = len(block_lists)
    if T < 1 or len(graphs) != T or len(seeds) != T:
        raise ConfigError(
            f"trials: got {T} data sets, {len(graphs)} graphs and {len(seeds)} seeds; need the same number >= 1"
        )
    if init_seeds is not None:
        check_value("init_seeds", init_seeds, list[int], {"ge": 0, "le": MAX_SEED})
        if len(init_seeds) != T:
            raise ConfigError(f"init_seeds: got {len(init_seeds)} seeds for {T} trials; give one per trial (or None)")
    return [as_graph(g) for g in graphs], [as_seed(s, f"seeds[{t}]") for t, s in enumerate(seeds)]


@with_threads
def fit_trials(block_lists, graphs, rank, *, seeds, g_max=_S.g_max, mu=_S.mu, eta=_S.eta, bcd_iters=_S.bcd_iters,
               x_iters=_S.x_iters, y_iters=_S.y_iters, tol=_S.tol, admm_tol=_S.admm_tol, exchange=_O.exchange,
               protocol=_O.protocol, n_max=_O.n_max, key_bits=_O.key_bits, g_bits=_O.g_bits, penalty=_S.penalty,
               consensus_form=_S.consensus_form, negative=_O.negative, device=_O.device, dtype=_O.dtype,
               callback=_O.callback, exchange_options=_O.exchange_options, align_trials=True, fuse=_S.fuse,
               threads=_O.threads, penalty_schedule=_S.penalty_schedule, init=_S.init, init_seeds=None,
               y_solver=_S.y_solver, x_solver=_S.x_solver, x_rho=_S.x_rho, x_gamma_spread=_S.x_gamma_spread,
               x_sigma=_S.x_sigma, x_rounds=_S.x_rounds, x_start=_S.x_start, x_walk=_S.x_walk,
               min_degree=_O.min_degree) -> TrialsResult:
    """Solve ``T`` independent PPDNMF problems as one batched computation.

    Trial ``t`` is exactly what :func:`fit` computes for ``block_lists[t]`` on
    ``graphs[t]`` with ``seed=seeds[t]``: the trials share no random stream, and the
    batch only stacks them along a leading trial dimension (the graphs become one
    block-diagonal sparse matrix).

    Parameters
    ----------
    block_lists : list (T) of list (N) of (L, M_i) blocks
    graphs : list (T) of Graph or adjacency, each with N agents
    rank : int
    seeds : list (T) of int
        Penalty seeds, one per trial.
    g_max : float, (N,) or (T, N) caps
    align_trials : bool
        Pad each trial with isolated dummy agents so that every trial starts on a 64-byte
        boundary, which makes trial ``t`` bit-identical to the same problem run alone on CPU
        (small BLAS/LAPACK kernels round differently at different alignments). It costs
        at most 7 dummy agents per trial (for ``N = 10``: 16 agents computed); without it,
        trials agree with single runs only to rounding, which Algorithm 1's symmetric
        start amplifies over the BCD iterations.

    Other Parameters
    ----------------
    mu, eta, bcd_iters, x_iters, y_iters, tol, admm_tol, exchange, protocol, n_max, key_bits
        As in :func:`fit`.
    g_bits, penalty, consensus_form, negative, device, dtype, exchange_options, fuse, threads,
    min_degree
        As in :func:`fit`.
    x_solver, x_rho, x_gamma_spread, x_sigma, x_rounds, x_start, x_walk
        As in :func:`fit` (each trial walks its own graph's cycle). There is no ``columns``
        (each trial's blocks are given) and no checkpointing.
    penalty_schedule, init, y_solver
        As in :func:`fit`.
    init_seeds : list (T) of int, optional
        Seeds of ``init="random"``, one per trial; None (default) uses ``seeds``.
    callback : callable, optional
        As in :func:`fit`, with ``info.metrics`` as Tensors ``(T,)``.

    Returns
    -------
    TrialsResult
    """
    solver, options = settings(locals())  # every keyword checked, once
    device, dtype = resolve_device(options.device), resolve_dtype(options.dtype)
    graphs, seeds = _check_trials(block_lists, graphs, seeds, init_seeds, align_trials)
    T = len(graphs)
    for t, g in enumerate(graphs):
        check_min_degree(g, options.min_degree, trial=t)
    N = graphs[0].n_agents
    blocks = [check_data(as_blocks(b, N), options.negative) for b in block_lists]
    caps = _trial_caps(solver.g_max, T, N)
    params, exch = prepare(solver, options, blocks[0][0].shape[0])
    try:
        warn_degree_one(exch, graphs)
        warn_sum_leak(exch, params, caps, [g.degree for g in graphs])
        check_shared_caps(caps, params.penalty_schedule)
        for b, g, c in zip(blocks, graphs, caps):
            preflight(exch, b, c, g.degree, params)
        check_fit(blocks, graphs, params, dtype=dtype, device=device, exchange=exch)
        problem = build_problem(blocks, graphs, caps, seeds, dtype=dtype, device=device,
                                rank=solver.rank if align_trials else None,
                                init_seeds=[start_seed(None if init_seeds is None else init_seeds[t], seeds[t])
                                            for t in range(T)])
    except BaseException:
        exch.close()  # fit_trials owns the exchange, also when it fails before the run
        raise
    state, history, info, costs = run(problem, params, exch, options, single=False)
    N = problem.n_agents
    return TrialsResult(
        X=state.X[:, :N], Y=state.Y[:, :N], U=state.U[:, :N],
        columns=problem.counts[:, :N].cpu().tolist(),
        history=history_batched(history),
        graphs=graphs, seeds=[int(s) for s in seeds],
        n_iter=info["n_iter"], converged=info["converged"], costs=costs,
    )


def fit_centralized(Z, rank, **kwargs) -> FitResult:
    """The centralized baseline: the same BCD/ADMM on the whole ``Z`` with one agent.

    Takes the keyword arguments of :func:`fit` (``columns`` and the exchange
    settings do not apply: one agent has no neighbours).
    """
    for k in ("columns", "exchange", "protocol", "n_max", "key_bits", "g_bits", "exchange_options"):
        if k in kwargs:
            raise ConfigError(f"{k}: does not apply to the centralized baseline (one agent, no exchange)")
    if isinstance(Z, (list, tuple)):
        Z = torch.cat([torch.as_tensor(b, dtype=torch.float64) for b in Z], dim=1)
    return fit(Z, complete(1), rank, exchange="plain", **kwargs)  # one agent: nothing is exchanged
