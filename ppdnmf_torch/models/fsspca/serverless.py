"""FSSPCA without a server: ``z`` agreed over a graph of workers through the library's exchange
(docs/FSSPCA.md, "Serverless variant").

For users with no trusted server. Step 2 of Algorithm 1 is the proximal problem

    ``z = argmin_z sum_i rho/2 ||z - v_i||^2 + lambda_1 ||z||_1 = soft(mean_i v_i, lambda_1 / (K rho))``,
    ``v_i = w_i + u_i / rho``,

whose data ``v_i`` are spread over the workers. Here every worker keeps its own copy ``z_i``
and the workers solve that problem together over the communication graph with
``inner_iters`` iterations of decentralized consensus per ADMM iteration; the only thing that
crosses an edge is what the library's :class:`~ppdnmf_torch.exchange.Exchange` sends at
PPDNMF's step 5 (``plain``: the values; ``quantized``/``paillier``: the integer protocol,
``masked`` by default), and a worker learns only its neighbour sums
``S_i = sum_j rho_ij (z_j - z_i)`` and ``rho_i``. The penalties come from
:class:`~ppdnmf_torch.penalties.PenaltySampler` with ``shared=True`` (the agreed schedule: one
draw per inner iteration on every edge, so a receiver's weights are all equal and its sums
reveal ``rho_i = d_i g^2`` and ``g^2`` times the sum of its neighbours' messages only). Two
consensus methods, chosen by ``consensus``:

* ``"laplacian"`` (default): dynamic average tracking. Each worker keeps ``x_i`` with
  ``sum_i x_i = sum_i v_i`` (it adds ``v_i - v_i_prev`` at every ADMM iteration), takes
  ``inner_iters`` Laplacian steps ``x_i += eps S_i`` through the exchange
  (``eps = 1 / (g^2 (d_max + 1))``, stable for every draw ``<= g``; :func:`laplacian_step`),
  and sets ``z_i = soft(x_i, lambda_1 / (K rho))``. The steps keep the sum, so the error of
  one ADMM iteration is corrected at the next ones instead of accumulating.
* ``"admm"``: PPDNMF's X-step (ALGORITHM.md, steps 1, 3, 5, 6; eqs. 8-11) on the local
  problems ``f_i(z) = 1/2 ||z - v_i||^2 + lambda_1 / (K rho) ||z||_1`` (Problem (12) divided by
  ``rho``, split evenly): step 3 is a soft threshold (:func:`admm_local_step`), step 5 the
  exchange, step 6 ``Q_i += S_i``. Step 3 uses ``2 rho_i`` where the X-step has ``rho_i``
  (Shi et al.'s decentralized ADMM with ``c_ij = rho_ij``): with the X-step's ``rho_i`` the
  iteration diverged on a ring of 8 workers (measured with ``g = 1``: ``max_i ||z_i - mean z||``
  1e67 after 300 ADMM iterations with one inner iteration). The ``Q_i`` sum to zero over the workers, so
  a consensus fixed point is the server's ``z``. ``z_i``, ``Q_i`` and the draws carry over
  between ADMM iterations (ALGORITHM.md's warm start).

Both run warm, so every worker's ``z_i`` ends near the server's ``z`` whatever ``inner_iters``
(measured within 3e-5); the inner count trades ADMM iterations against bytes. Why
``laplacian`` with 3 inner iterations is the default (measured, docs/RESULTS.md "Without a
server", ring and random graph of 8 workers): after 50 ADMM iterations its ``z_i`` are closer
to the server's than ``admm``'s at 1, 3 and 10 inner iterations on both graphs; at 3 inner
iterations it stops in 115 and 132 ADMM iterations (``admm``: 204 and 223) with 0.60 and 0.62
times the bytes; with 1 inner iteration on the random graph ``admm`` stops first (229 against
266); and on a complete graph one Laplacian step is the exact average. Privacy differs
(docs/THREAT_MODEL.md): under ``plain`` a Laplacian worker's first message is its ``v_j``;
under the masked integer exchange neither method gave a neighbour of degree >= 2 an exact
value.

The global mean for centring is agreed the same way, once, before the first ADMM iteration
(:func:`agreed_centring`). Computed by the simulation over all workers, not agreed: ``rho="auto"``
(the workers' mean largest Gram eigenvalue; pass a number) and the stopping test.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...checkpoint import digest
from ...driver import Checkpoints, Ledgers, Resources, check_checkpoint_args, drive, warn_degree_one
from ...errors import ConfigError
from ...graph import Graph, Topology
from ...penalties import PenaltySampler
from ...specs import check_call
from . import admm
from .centring import worker_sums
from .config import CONSENSUS_METHODS, RUN, SERVERLESS, SPEC, TASK
from .fit import as_blocks, check_alpha_scale, initial_z, per_trial
from .manifold import qf
from .serverless_run import ServerlessOptions, ServerlessRun, WorkerSums, laplacian_eps, laplacian_step
from .smoothing import get_smoothing

__all__ = ["ServerlessResult", "fit_serverless", "agreed_centring", "agreed_problem", "HeldWorkers", "serverless_model",
           "serverless_options", "SETTINGS", "CONSENSUS_METHODS"]

# the defaults of fit_serverless beyond fit_fsspca's, and the consensus methods: .config (ServerlessSpec)


@dataclass
class ServerlessResult:
    """What :func:`fit_serverless` returns.

    Attributes
    ----------
    z : Tensor (T, K, d, r)
        Every worker's own sparse loadings ``z_i``.
    z_mean : Tensor (T, d, r)
        Their mean (evaluation only: no worker computes it).
    components : Tensor (T, d, r)
        ``qf(z_mean)``.
    w, u : Tensor (T, K, d, r)
    n_iter : LongTensor (T,)
    converged : BoolTensor (T,)
    disagreement : Tensor (n_iter, T)
        ``max_i ||z_i - mean_j z_j||`` per ADMM iteration.
    consensus : Tensor (n_iter, T)
        ``max_i ||w_i - z_i||`` per ADMM iteration.
    exchange_calls : int
        Step-5 calls (``center_iters`` for the mean, then one per inner iteration and ADMM iteration).
    bytes : float
        Bytes sent over all directed edges of trial 0: the exchange's count for the integer
        kinds, ``d r`` floats per directed edge and call for ``plain``.
    costs : dict
        The exchange's :meth:`~ppdnmf_torch.exchange.Exchange.costs` (``quantized`` with
        ``cost_model``: the Paillier operations and their estimated seconds).
    settings : dict
    mean_error : Tensor (T,) or None
        With ``center``: ``max_i ||m_i - m|| / ||m||``, the workers' agreed means against the
        exact one (evaluation only; :func:`agreed_centring`).
    """

    z: torch.Tensor
    z_mean: torch.Tensor
    components: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    n_iter: torch.Tensor
    converged: torch.Tensor
    disagreement: torch.Tensor
    consensus: torch.Tensor
    exchange_calls: int = 0
    bytes: float = 0.0
    costs: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    mean_error: torch.Tensor | None = None


#: fit_serverless's method settings (what :func:`serverless_options` resolves), by name
SETTINGS = ("consensus", "inner_iters", "g_cap", "penalty_mode", "alpha", "lambda_2", "smoothing", "mu", "rho",
            "rho_scale", "line_search", "inner_steps", "local_solver", "center", "center_iters", "alpha_scale",
            "max_iter", "tol", "trials", "seed", "init")


def serverless_options(kw) -> dict:
    """The method's settings of a call (``kw``: :data:`SETTINGS` by name) checked, as the run takes
    them (the smoothing resolved to ``psi``); one :class:`~ppdnmf_torch.errors.ConfigError` naming
    the first bad one."""
    if kw["consensus"] not in CONSENSUS_METHODS:
        raise ConfigError(f"consensus: unknown method {kw['consensus']!r}; use one of {CONSENSUS_METHODS}")
    inner_iters, g_cap = kw["inner_iters"], kw["g_cap"]
    if isinstance(inner_iters, bool) or int(inner_iters) != inner_iters or int(inner_iters) < 1:
        raise ConfigError(f"inner_iters: must be an integer >= 1, got {inner_iters!r}")
    if not (isinstance(g_cap, (int, float)) and g_cap > 0):
        raise ConfigError(f"g_cap: must be a number > 0, got {g_cap!r}")
    psi = get_smoothing(kw["smoothing"])
    admm.check_settings(kw["line_search"], kw["inner_steps"], kw["mu"], kw["local_solver"], psi)
    for name in ("center_iters", "max_iter", "trials"):
        v = kw[name]
        if isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
    if not kw["tol"] >= 0:
        raise ConfigError(f"tol: must be >= 0, got {kw['tol']}")
    rho = kw["rho"]
    if isinstance(rho, str) and rho != "auto":
        raise ConfigError(f"rho: expected a positive number or 'auto', got {rho!r}")
    if isinstance(kw["init"], str):
        raise ConfigError(f"init: the serverless variant takes None or an array, got {kw['init']!r} (no pooled Gram)")
    check_alpha_scale(kw["alpha_scale"])
    o = {k: kw[k] for k in SETTINGS if k not in ("smoothing", "max_iter", "trials", "init")}
    o.update(inner_iters=int(inner_iters), g_cap=float(g_cap), psi=psi, center=bool(kw["center"]),
             center_iters=int(kw["center_iters"]))
    return o


def _check_exchange_graph(exch, graph, g_cap, value_scale):
    """Refuse a codec too small for the run, and warn about workers with one neighbour."""
    codec = getattr(exch, "codec", None)
    if codec is None:
        return
    deg = graph.degree.tolist()
    codec.preflight(value_scale=value_scale, g_max=g_cap, max_degree=int(max(deg)), g_min=g_cap)
    warn_degree_one(exch, [graph], who="workers", value="z_j")


def fit_serverless(data, n_components, graph: Graph, *, consensus=SERVERLESS.consensus,
                   inner_iters=SERVERLESS.inner_iters, exchange=SERVERLESS.exchange, exchange_options=None,
                   g_cap=SERVERLESS.g_cap, penalty_mode=SERVERLESS.penalty_mode, groups=None, alpha=TASK.alpha,
                   lambda_2=SPEC.lambda_2, smoothing=SPEC.smoothing, mu=SPEC.mu, rho=SPEC.rho,
                   rho_scale=SPEC.rho_scale, line_search=SPEC.line_search, inner_steps=SPEC.inner_steps,
                   local_solver=SPEC.local_solver,
                   center=SPEC.center, center_iters=SERVERLESS.center_iters, alpha_scale=SPEC.alpha_scale,
                   max_iter=SPEC.max_iter, tol=SPEC.tol,
                   trials=RUN.trials, seed=RUN.seed, init=SPEC.init, device=None, dtype=None, callback=None,
                   checkpoint_dir=None, checkpoint_every=RUN.checkpoint_every, resume=False) -> ServerlessResult:
    """Algorithm 1 over a graph of workers, step 2 agreed through the library's exchange.

    Arguments not listed are :func:`.fit.fit_fsspca`'s.

    Parameters
    ----------
    graph : Graph
        The workers' communication graph (``K`` agents, connected).
    consensus : {"laplacian", "admm"}
        The decentralized method of step 2 (see the module; default ``"laplacian"``).
    inner_iters : int
        Consensus iterations (exchange calls) per ADMM iteration.
    exchange : str, ExchangeSpec or Exchange
        ``"plain"``, ``"quantized"``, ``"paillier"``, ``"secagg"`` with ``exchange_options`` (``protocol``,
        default ``"masked"``; ``n_max``, ``key_bits``, ``g_bits``, ``cost_model``, ``keypairs``),
        as PPDNMF has them; made here and closed at the end, or an Exchange used as it is.
    g_cap : float
        The agreed cap ``g`` of the penalties (``rho_ij <= g^2``; the local problems have unit
        curvature). ``laplacian`` scales its step by ``1 / g^2`` and depends on ``g`` only through
        the draws. For ``admm`` no single best ``g`` was found (docs/RESULTS.md: with 3 inner
        iterations ``g = 0.3`` and ``0.5`` stopped later than ``0.7`` on the ring of 8, ``0.5``
        earlier on the random graph).
    penalty_mode : {"random", "fixed"}
        The agreed draws of :class:`~ppdnmf_torch.penalties.PenaltySampler` (``shared=True``).
    local_solver : {"polar", "riemannian"}
        A worker's step (14), as :func:`.fit.fit_fsspca` takes it.
    tol : float
        The server's rule (:func:`.fit.fit_fsspca`) with each worker's own ``z_i``: a trial stops
        when ``sqrt(sum_i ||w_i - z_i||^2 / (K r))`` and ``sqrt(sum_i ||z_i - z_i_old||^2 / (K r))``
        are both ``<= tol``. The simulation evaluates it over the network; a deployment would
        agree on it with one more consensus (or run ``max_iter`` iterations).
    center : bool
        Centre the pooled data with the global mean, agreed over the graph through the same
        exchange (:func:`agreed_centring`, ``center_iters`` Laplacian steps, before the first
        ADMM iteration); each worker centres with its own estimate.
    center_iters : int
    callback : callable, optional
        ``callback(iteration, values)`` after each ADMM iteration, ``values`` a dict of ``v``,
        ``z``, ``w`` ``(T, K, d, r)`` and ``disagreement``, ``consensus`` ``(T,)`` (the audit
        keeps the ``v_i`` from it); a true return value stops the run.
    checkpoint_dir, checkpoint_every, resume
        As :func:`.fit.fit_fsspca`'s (the engine's checkpoints: the iterates, the consensus
        variables, the draws and generators, the counters; no key or mask seed of the exchange).

    Returns
    -------
    ServerlessResult
    """
    check_call(locals(), SERVERLESS, SPEC, TASK, RUN, skip=("exchange", "checkpoint_every", "smoothing"),
               arrays=("alpha", "lambda_2", "rho"),
               also={"init": ARRAY | str, "callback": CALLBACK, "exchange_options": OPTIONS})
    o = serverless_options(locals())
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    blocks = as_blocks(data, groups, device=device, dtype=dtype)
    K, d, like = len(blocks), blocks[0].shape[1], blocks[0]
    if not isinstance(graph, Graph) or graph.n_agents != K:
        raise ConfigError(f"graph: expected a Graph of {K} agents (one per worker), got {graph!r}")
    r, T = int(n_components), int(trials)
    if not 1 <= r <= d:
        raise ConfigError(f"n_components: must be in 1..{d} (the number of features), got {n_components}")
    z0 = initial_z(d, r, T, seed, init, like.dtype, like.device)
    with Resources() as res:
        exch = res.exchange(exchange, exchange_options)
        run, settings, mean_error = _serverless_run(blocks, graph, z0, exch, o)
        ledgers = Ledgers(exchange=exch)
        plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                                 device=like.device)
        out = drive(run, max_iter=int(max_iter), tol=tol, callback=callback, checkpoints=plan, ledgers=ledgers)
        counted = sum(exch.bytes_per_edge().values())
        st, zm = run.st, run.st.z.mean(1)
        return ServerlessResult(z=st.z, z_mean=zm, components=qf(zm), w=st.w, u=st.u, n_iter=run.n_iter,
                                converged=run.conv, disagreement=torch.stack(out.history["disagreement"]),
                                consensus=torch.stack(out.history["consensus"]), exchange_calls=run.calls,
                                bytes=float(counted if counted else run.plain_bytes),
                                costs=dict(ledgers.costs("exchange")), settings=settings, mean_error=mean_error)


@dataclass
class HeldWorkers:
    """What a process holds of the workers, one slot each (every worker in one process; a rank's
    own, with free slots of zeros, in a run over ranks): each worker's Gram matrix, squared norm,
    row sum and row count, computed by the worker from its own rows.

    Attributes
    ----------
    gram : Tensor (S, d, d)
    sqnorm, n : Tensor (S,)
    s : Tensor (S, d)
    n_workers : int
        ``K``, every worker of the run.
    n_edges : int
        The draws ``g`` of the process's directed edges (what its exchange takes).
    sums : WorkerSums
        The reductions over every worker.
    own : BoolTensor (S,), optional
        The slots that hold a worker (None: every slot).
    """

    gram: torch.Tensor
    sqnorm: torch.Tensor
    s: torch.Tensor
    n: torch.Tensor
    n_workers: int
    n_edges: int
    sums: WorkerSums = field(default_factory=WorkerSums)
    own: torch.Tensor | None = None

    @classmethod
    def of_blocks(cls, blocks, n_edges: int) -> "HeldWorkers":
        """Every worker's share from its block ``(n_i, d)`` (one process)."""
        s, n = worker_sums(blocks)
        gram = torch.stack([b.mT @ b for b in blocks])
        sqnorm = torch.stack([b.square().sum() for b in blocks])
        return cls(gram, sqnorm, s, n, len(blocks), int(n_edges))


def serverless_model(held: HeldWorkers, graph, z0, exch, sampler, o: dict) -> tuple:
    """The model of a run on the workers a process holds (``exch`` bound, ``sampler`` the agreed
    penalties): the mean agreed (with ``center``), the penalties, the run's settings as the result
    reports them and the centring's ``start`` (:func:`agreed_problem`)."""
    T, K, like = z0.shape[0], held.n_workers, z0
    _check_exchange_graph(exch, graph, o["g_cap"], value_scale=2.0)
    start = dict(calls=0, bytes=0.0, mean=None)
    if o["center"]:
        problem, start = agreed_problem(held, exch, graph, T, o["g_cap"], o["center_iters"])
    else:
        g = held.gram
        problem = admm.FSSPCAProblem(g.expand(T, *g.shape), held.sqnorm.expand(T, *held.sqnorm.shape),
                                     held.n.expand(T, *held.n.shape), None)
    # the workers' lambda_max(C_i): their mean is rho="auto"'s (and alpha_scale="gram"'s unit, times K)
    lam = None
    if o["alpha_scale"] != "none" or isinstance(o["rho"], str):
        lam = torch.linalg.eigvalsh(problem.gram).amax(dim=-1)
    unit = (torch.ones(T, dtype=like.dtype, device=like.device) if o["alpha_scale"] == "none"
            else (1.0 * held.sums.mean(lam)) * K)
    lam1 = per_trial(o["alpha"], T, "alpha", like) * unit
    lam2 = lam1 / K if o["lambda_2"] is None else per_trial(o["lambda_2"], T, "lambda_2", like)
    rho_t = o["rho_scale"] * held.sums.mean(lam) if isinstance(o["rho"], str) else per_trial(o["rho"], T, "rho",
                                                                                              like)
    settings = dict(consensus=o["consensus"], inner_iters=o["inner_iters"], g_cap=o["g_cap"],
                    penalty_mode=o["penalty_mode"], exchange=exch.name, n_workers=K, rho=rho_t.tolist(),
                    alpha=lam1.tolist(), lambda_2=lam2.tolist(), center=o["center"], center_iters=o["center_iters"],
                    seed=o["seed"])
    codec = getattr(exch, "codec", None)
    checked = dict({k: v for k, v in settings.items() if k != "exchange"}, smoothing=o["psi"].name, mu=o["mu"],
                   line_search=o["line_search"], inner_steps=int(o["inner_steps"]),
                   local_solver=o["local_solver"], tol=o["tol"], trials=T,
                   arithmetic=None if codec is None else [float(codec.n_max), int(codec.g_bits)])
    opts = ServerlessOptions(lam1=lam1, lam2=lam2, rho=rho_t, method=o["consensus"], inner_iters=o["inner_iters"],
                             g_cap=o["g_cap"], smoothing=o["psi"], mu=o["mu"], line_search=o["line_search"],
                             inner_steps=o["inner_steps"], local_solver=o["local_solver"], tol=o["tol"], n_workers=K)
    run = ServerlessRun(problem, z0, exch, sampler, graph, opts, start=start, settings=checked, sums=held.sums,
                        inputs=lambda: {"data": digest(problem.gram, problem.sqnorm),
                                        "graph": digest(graph.src, graph.dst), "start": digest(z0)})
    return run, settings, start


def _serverless_run(blocks, graph, z0, exch, o: dict) -> tuple:
    """The model of a run in one process (the exchange bound, the mean agreed, the penalties), the
    run's settings as the result reports them, and the agreed mean's error (None without centring)."""
    T, K, like = z0.shape[0], len(blocks), blocks[0]
    topo = Topology.from_graphs([graph] * T)
    exch.bind(topo, dtype=like.dtype, device=like.device)
    seeds = [int(o["seed"]) + t for t in range(T)]
    sampler = PenaltySampler(torch.full((T * K,), o["g_cap"], dtype=torch.float64, device=like.device),
                             topo.src.to(like.device), [graph.n_edges * 2] * T, seeds, o["penalty_mode"],
                             o["inner_iters"], shared=True)
    held = HeldWorkers.of_blocks(blocks, exch.topology.n_directed_edges)
    run, settings, start = serverless_model(held, graph, z0, exch, sampler, o)
    return run, settings, None if start["mean"] is None else _mean_error(held, start["mean"])


def _mean_error(held: HeldWorkers, mean) -> torch.Tensor:
    """``max_i ||m_i - m|| / ||m||`` ``(T,)`` against the exact mean (evaluation only)."""
    exact = held.s.sum(0) / held.n.sum()
    return (torch.linalg.vector_norm(mean - exact, dim=-1).amax(-1)
            / torch.linalg.vector_norm(exact).clamp_min(1e-300))


def agreed_centring(blocks, exch, graph, T, g_cap, iters):
    """:func:`agreed_problem` of every worker's block in one process (``exch`` bound to ``T`` copies
    of ``graph``), with the agreed mean's error: ``start["mean_error"]`` ``(T,)``,
    ``max_i ||m_i - m|| / ||m||`` against the exact mean (evaluation only)."""
    held = HeldWorkers.of_blocks(blocks, exch.topology.n_directed_edges)
    problem, start = agreed_problem(held, exch, graph, T, g_cap, iters)
    return problem, dict(start, mean_error=_mean_error(held, start["mean"]))


def agreed_problem(held: HeldWorkers, exch, graph, T, g_cap, iters):
    """Each worker's centred Gram matrix with the global mean agreed over the graph.

    Worker ``i`` holds ``y_i = [s_i, n_i] / c`` (its row sum and count, ``d + 1`` numbers, over a
    common scale ``c``) and takes ``iters`` Laplacian steps through the exchange with the fixed
    agreed penalty ``g``; every ``x_i`` tends to ``mean_j y_j``, and its mean estimate is the
    ratio ``m_i = x_i[:d] / x_i[d]`` (``c`` cancels; the steps are convex combinations, so
    ``x_i[d] > 0``). It then centres its own Gram matrix with its own ``m_i`` (as
    :func:`.centring.centred_gram` does with the server's ``m``). ``c`` only keeps the
    messages in the codec's range: here the largest ``|s_i|`` entry or ``n_i`` of any worker, a
    public bound a deployment would agree on (over ranks: one maximum across them).

    Returns
    -------
    problem : FSSPCAProblem
        ``gram (T, S, d, d)``, ``sqnorm``, ``n_rows (T, S)``.
    start : dict
        ``calls``, ``bytes`` (plain count: ``d + 1`` values per directed edge and call) and
        ``mean`` ``(T, S, d)``, each worker's own estimate (free slots: zero).
    """
    s, n = held.s, held.n
    S, d = s.shape
    y = torch.cat([s, n[:, None]], dim=1)
    x = (y / held.sums.largest(y.abs())).expand(T, S, d + 1).reshape(T * S, d + 1).clone()
    g = torch.full((held.n_edges,), g_cap, dtype=torch.float64, device=x.device)
    eps = laplacian_eps(graph, g_cap)
    for m in range(iters):  # bcd_iter 0: before the first ADMM iteration
        exch.penalty_sums(g, bcd_iter=0, admm_iter=m + 1)
        x = laplacian_step(x, exch.exchange(x, g, bcd_iter=0, admm_iter=m + 1).S.to(x.dtype), eps)
    x = x.view(T, S, d + 1)
    mean = x[..., :d] / x[..., d:]  # (T, S, d), every worker its own
    if held.own is not None:  # a free slot has no rows (0 / 0)
        mean = torch.where(held.own[:, None].to(mean.device), mean, torch.zeros_like(mean))
    sm = s[:, :, None] * mean[..., None, :]
    C = held.gram - sm - sm.mT + n[:, None, None] * (mean[..., :, None] * mean[..., None, :])
    q = held.sqnorm - 2.0 * (s * mean).sum(-1) + n * mean.square().sum(-1)
    start = dict(calls=iters, bytes=float(iters * 2 * graph.n_edges * (d + 1) * x.element_size()), mean=mean)
    return admm.FSSPCAProblem(C, q, n.expand(T, S)), start
