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

import math
import warnings
from dataclasses import dataclass, field

import torch

from ...errors import ConfigError, ConvergenceWarning, DegreeOneWarning
from ...exchange import Exchange, make_exchange
from ...graph import Graph, Topology
from ...penalties import PenaltySampler
from . import admm
from .centring import worker_sums
from .fit import DEFAULTS, _auto_rho, _initial_z, _per_trial, as_blocks, fit_fsspca, prepare_problem
from .manifold import qf
from .smoothing import DEFAULT_SMOOTHING, get_smoothing

__all__ = ["ServerlessResult", "fit_serverless", "agreed_centring", "compare_with_server", "admm_local_step",
           "laplacian_step", "laplacian_eps", "CONSENSUS_METHODS", "SERVERLESS_DEFAULTS", "spiked_setup",
           "serverless_table"]

CONSENSUS_METHODS = ("admm", "laplacian")
#: the defaults of :func:`fit_serverless` beyond :func:`.fit.fit_fsspca`'s (docs/FSSPCA.md)
SERVERLESS_DEFAULTS = dict(consensus="laplacian", inner_iters=3, g_cap=0.7, penalty_mode="random")


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


def admm_local_step(v, z, Q, Q_prev, rho_i, tau):
    """Step 3 of the X-step (eq. 9's form) on ``f_i(z) = 1/2 ||z - v_i||^2 + tau ||z||_1``.

    ``argmin_z f_i(z) + rho_i/2 ||z||^2 - <z, rho_i z_i + 2 Q_i - Q_i_prev>``, a soft threshold.

    Parameters
    ----------
    v, z, Q, Q_prev : Tensor (T, K, d, r)
    rho_i : Tensor (T, K, 1, 1)
        ``sum_j rho_ij`` as the exchange's step 1 gives it.
    tau : Tensor (T, 1, 1, 1)
        ``lambda_1 / (K rho)``.
    """
    den = 1.0 + 2 * rho_i
    return admm.soft_threshold((v + 2 * rho_i * z + 2 * Q - Q_prev) / den, tau / den)


def laplacian_step(x, S, eps):
    """One Laplacian averaging step ``x_i <- x_i + eps S_i`` (``S_i = sum_j rho_ij (x_j - x_i)``);
    keeps ``sum_i x_i`` and contracts the disagreement for ``eps max_ij rho_ij (d_max + 1) <= 1``."""
    return x + eps * S


def laplacian_eps(graph: Graph, g_cap: float) -> float:
    """The step of :func:`laplacian_step` at the contraction bound: ``1 / (g^2 (d_max + 1))``
    (every ``rho_ij <= g^2``)."""
    return 1.0 / (g_cap ** 2 * (int(graph.degree.max()) + 1))


def _check_exchange_graph(exch, graph, g_cap, value_scale):
    """Refuse a codec too small for the run, and warn about workers with one neighbour."""
    codec = getattr(exch, "codec", None)
    if codec is None:
        return
    deg = graph.degree.tolist()
    codec.preflight(value_scale=value_scale, g_max=g_cap, max_degree=int(max(deg)), g_min=g_cap)
    ones = [a for a, d in enumerate(deg) if d == 1]
    if ones:
        warnings.warn(f"workers {ones} have a single neighbour: the sums each obtains are that neighbour's "
                      "z_j, whatever the protocol (docs/THREAT_MODEL.md)", DegreeOneWarning, stacklevel=3)


def fit_serverless(data, n_components, graph: Graph, *, consensus=SERVERLESS_DEFAULTS["consensus"],
                   inner_iters=SERVERLESS_DEFAULTS["inner_iters"], exchange="plain", exchange_options=None,
                   g_cap=SERVERLESS_DEFAULTS["g_cap"], penalty_mode=SERVERLESS_DEFAULTS["penalty_mode"],
                   groups=None, alpha=0.0, lambda_2=None, smoothing=DEFAULT_SMOOTHING, mu=DEFAULTS["mu"],
                   rho=DEFAULTS["rho"], rho_scale=DEFAULTS["rho_scale"], line_search=DEFAULTS["line_search"],
                   inner_steps=DEFAULTS["inner_steps"], local_solver=DEFAULTS["local_solver"], center=True,
                   center_iters=100, max_iter=DEFAULTS["max_iter"],
                   tol=DEFAULTS["tol"], trials=1, seed=0, init=None, device=None, dtype=None,
                   callback=None) -> ServerlessResult:
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
        ``"plain"``, ``"quantized"``, ``"paillier"`` with ``exchange_options`` (``protocol``,
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

    Returns
    -------
    ServerlessResult
    """
    if consensus not in CONSENSUS_METHODS:
        raise ConfigError(f"consensus: unknown method {consensus!r}; use one of {CONSENSUS_METHODS}")
    if isinstance(inner_iters, bool) or int(inner_iters) != inner_iters or int(inner_iters) < 1:
        raise ConfigError(f"inner_iters: must be an integer >= 1, got {inner_iters!r}")
    if not (isinstance(g_cap, (int, float)) and g_cap > 0):
        raise ConfigError(f"g_cap: must be a number > 0, got {g_cap!r}")
    blocks = as_blocks(data, groups, device=device, dtype=dtype)
    K, d, like = len(blocks), blocks[0].shape[1], blocks[0]
    if not isinstance(graph, Graph) or graph.n_agents != K:
        raise ConfigError(f"graph: expected a Graph of {K} agents (one per worker), got {graph!r}")
    r, T, M = int(n_components), int(trials), int(inner_iters)
    if not 1 <= r <= d:
        raise ConfigError(f"n_components: must be in 1..{d} (the number of features), got {n_components}")
    psi = get_smoothing(smoothing)
    admm.check_settings(line_search, inner_steps, mu, local_solver, psi)
    for name, v in (("center_iters", center_iters), ("max_iter", max_iter), ("trials", trials)):
        if isinstance(v, bool) or int(v) != v or int(v) < 1:
            raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
    if not tol >= 0:
        raise ConfigError(f"tol: must be >= 0, got {tol}")
    if isinstance(rho, str) and rho != "auto":
        raise ConfigError(f"rho: expected a positive number or 'auto', got {rho!r}")
    if isinstance(init, str):
        raise ConfigError(f"init: the serverless variant takes None or an array, got {init!r} (no pooled Gram)")
    z0 = _initial_z(d, r, T, seed, init, like.dtype, like.device)

    owned = not isinstance(exchange, Exchange)
    exch = make_exchange(exchange, **(exchange_options or {})) if owned else exchange
    try:
        topo = Topology.from_graphs([graph] * T)
        exch.bind(topo, dtype=like.dtype, device=like.device)
        _check_exchange_graph(exch, graph, float(g_cap), value_scale=2.0)
        start = dict(calls=0, bytes=0.0, mean_error=None)
        if center:
            problem, start = agreed_centring(blocks, exch, graph, T, float(g_cap), int(center_iters))
        else:
            problem, _ = prepare_problem(blocks, T, center=False)
        lam1 = _per_trial(alpha, T, "alpha", like)
        lam2 = lam1 / K if lambda_2 is None else _per_trial(lambda_2, T, "lambda_2", like)
        rho_t = _auto_rho(problem, rho_scale) if isinstance(rho, str) else _per_trial(rho, T, "rho", like)
        seeds = [int(seed) + t for t in range(T)]
        sampler = PenaltySampler(torch.full((T * K,), float(g_cap), dtype=torch.float64, device=like.device),
                                 topo.src.to(like.device), [graph.n_edges * 2] * T, seeds, penalty_mode, M,
                                 shared=True)
        settings = dict(consensus=consensus, inner_iters=M, g_cap=g_cap, penalty_mode=penalty_mode,
                        exchange=exch.name, n_workers=K, rho=rho_t.tolist(), alpha=lam1.tolist(),
                        lambda_2=lam2.tolist(), center=bool(center), center_iters=int(center_iters), seed=seed)
        return _run(problem, exch, sampler, graph, z0, lam1, lam2, rho_t, psi, mu, consensus, M, float(g_cap),
                    (line_search, inner_steps, local_solver), max_iter, tol, callback, settings, start)
    finally:
        if owned:
            exch.close()


def agreed_centring(blocks, exch, graph, T, g_cap, iters):
    """Each worker's centred Gram matrix with the global mean agreed over the graph.

    Worker ``i`` holds ``y_i = [s_i, n_i] / c`` (its row sum and count, ``d + 1`` numbers, over a
    common scale ``c``) and takes ``iters`` Laplacian steps through the exchange with the fixed
    agreed penalty ``g``; every ``x_i`` tends to ``mean_j y_j``, and its mean estimate is the
    ratio ``m_i = x_i[:d] / x_i[d]`` (``c`` cancels; the steps are convex combinations, so
    ``x_i[d] > 0``). It then centres its own Gram matrix with its own ``m_i`` (as
    :func:`.centring.centred_gram` does with the server's ``m``). ``c`` only keeps the
    messages in the codec's range: here the largest ``|s_i|`` entry or ``n_i`` of any worker, a
    public bound a deployment would agree on.

    Returns
    -------
    problem : FSSPCAProblem
        ``gram (T, K, d, d)``, ``sqnorm``, ``n_rows (T, K)``.
    start : dict
        ``calls``, ``bytes`` (plain count: ``d + 1`` values per directed edge and call) and
        ``mean_error`` (``(T,)``: ``max_i ||m_i - m|| / ||m||`` against the exact mean; evaluation only).
    """
    s, n = worker_sums(blocks)
    K, d = s.shape
    y = torch.cat([s, n[:, None]], dim=1)
    x = (y / y.abs().amax()).expand(T, K, d + 1).reshape(T * K, d + 1).clone()
    g = torch.full((exch.topology.n_directed_edges,), g_cap, dtype=torch.float64, device=x.device)
    eps = laplacian_eps(graph, g_cap)
    for m in range(iters):  # bcd_iter 0: before the first ADMM iteration
        exch.penalty_sums(g, bcd_iter=0, admm_iter=m + 1)
        x = laplacian_step(x, exch.exchange(x, g, bcd_iter=0, admm_iter=m + 1).S.to(x.dtype), eps)
    x = x.view(T, K, d + 1)
    mean = x[..., :d] / x[..., d:]  # (T, K, d), every worker its own
    gram = torch.stack([b.mT @ b for b in blocks])
    sqnorm = torch.stack([b.square().sum() for b in blocks])
    sm = s[:, :, None] * mean[..., None, :]
    C = gram - sm - sm.mT + n[:, None, None] * (mean[..., :, None] * mean[..., None, :])
    q = sqnorm - 2.0 * (s * mean).sum(-1) + n * mean.square().sum(-1)
    exact = s.sum(0) / n.sum()
    err = torch.linalg.vector_norm(mean - exact, dim=-1).amax(-1) / torch.linalg.vector_norm(exact).clamp_min(1e-300)
    start = dict(calls=iters, bytes=float(iters * 2 * graph.n_edges * (d + 1) * x.element_size()), mean_error=err)
    return admm.FSSPCAProblem(C, q, n.expand(T, K)), start


def _run(problem, exch, sampler, graph, z0, lam1, lam2, rho_t, psi, mu, method, M, g_cap, local,
         max_iter, tol, callback, settings, start) -> ServerlessResult:
    line_search, inner_steps, local_solver = local
    T, K, d, _ = problem.gram.shape
    r = z0.shape[-1]
    A, P, like = T * K, d * r, z0
    scale = 2.0 * torch.linalg.matrix_norm(problem.gram) + rho_t[:, None] + lam2[:, None] / mu
    zk = z0[:, None].expand(T, K, d, r).clone()
    state = admm.ADMMState(w=zk.clone(), u=torch.zeros_like(zk), z=zk, theta=1.0 / scale)
    Q, Q_prev = torch.zeros_like(zk), torch.zeros_like(zk)  # admm: the X-step's duals
    x, v_prev = torch.zeros_like(zk), torch.zeros_like(zk)  # laplacian: the tracked averages
    g = sampler.initial()
    eps = laplacian_eps(graph, g_cap)
    tau = (lam1 / (K * rho_t))[:, None, None, None]
    active = torch.ones(T, dtype=torch.bool, device=like.device)
    n_iter = torch.zeros(T, dtype=torch.long, device=like.device)
    converged = torch.zeros(T, dtype=torch.bool, device=like.device)
    dis, cons = [], []
    calls, plain_bytes = start["calls"], start["bytes"]
    while state.iteration < max_iter and bool(active.any()):
        state.iteration += 1
        k = state.iteration
        w = admm.local_step(problem, state, lam2, rho_t, psi, mu, line_search=line_search, inner_steps=inner_steps,
                            active=active, solver=local_solver)  # step 1, eq. (14)
        v = w + state.u / rho_t[:, None, None, None]
        sampler.begin_bcd_iteration()
        if method == "laplacian":
            x, v_prev = x + (v - v_prev), v
        z = state.z
        for m in range(M):  # rounds of communication, sequential by nature
            g = sampler.step(g, m)
            rho_i = exch.penalty_sums(g, bcd_iter=k, admm_iter=m + 1).to(like.dtype).view(T, K, 1, 1)
            if method == "admm":
                z = admm_local_step(v, z, Q, Q_prev, rho_i, tau)
                S = exch.exchange(z.reshape(A, P), g, bcd_iter=k, admm_iter=m + 1).S
                Q_prev, Q = Q, Q + S.view(T, K, d, r).to(like.dtype)
            else:
                S = exch.exchange(x.reshape(A, P), g, bcd_iter=k, admm_iter=m + 1).S
                x = laplacian_step(x, S.view(T, K, d, r).to(like.dtype), eps)
            calls += 1
            plain_bytes += 2 * graph.n_edges * P * like.element_size()
        if method == "laplacian":
            z = admm.soft_threshold(x, tau)
        a4 = active[:, None, None, None]
        z_new = torch.where(a4, z, state.z)
        u_new = torch.where(a4, admm.dual_step(state.u, w, z_new, rho_t), state.u)  # step 3, per worker
        # the server's stopping rule with each worker's own z_i (equal to it when the z_i agree)
        primal = torch.linalg.matrix_norm(w - z_new).square().sum(1).sqrt()
        dual = rho_t * torch.linalg.matrix_norm(z_new - state.z).square().sum(1).sqrt()
        state.w, state.z, state.u = w, z_new, u_new
        dis.append(torch.linalg.matrix_norm(z_new - z_new.mean(1, keepdim=True)).amax(1))
        cons.append(torch.linalg.matrix_norm(w - z_new).amax(1))
        n_iter = torch.where(active, n_iter + 1, n_iter)
        done = (primal / math.sqrt(K * r) <= tol) & (dual / (rho_t * math.sqrt(K * r)) <= tol) & active
        converged = converged | done
        active = active & ~done
        if callback is not None and callback(k, dict(v=v, z=z_new, w=w, disagreement=dis[-1], consensus=cons[-1])):
            break
    if tol > 0 and not bool(converged.all()):
        warnings.warn(f"FSSPCA (serverless): trials {torch.nonzero(~converged).flatten().tolist()} did not reach "
                      f"tol={tol} in {max_iter} iterations", ConvergenceWarning, stacklevel=3)
    counted = sum(exch.bytes_per_edge().values())
    zm = state.z.mean(1)
    return ServerlessResult(z=state.z, z_mean=zm, components=qf(zm), w=state.w, u=state.u, n_iter=n_iter,
                            converged=converged, disagreement=torch.stack(dis), consensus=torch.stack(cons),
                            exchange_calls=calls, bytes=float(counted if counted else plain_bytes),
                            costs=dict(exch.costs()), settings=settings, mean_error=start["mean_error"])


def compare_with_server(data, n_components, graph, inner=(1, 3, 10, 30), *, consensus="laplacian", exchange="plain",
                        exchange_options=None, serverless_options=None, at_iteration=50, **kwargs):
    """The serverless variant against the server version (:func:`.fit.fit_fsspca`, plain upload) on
    the same problem and start, per number of inner consensus iterations; ``kwargs`` go to both,
    ``serverless_options`` (``g_cap``, ``penalty_mode``, ``center_iters``) to the serverless runs.

    Returns
    -------
    list of dict, one per ``inner`` value: ``max_z_distance`` (the largest ``||z_i - z||`` of a
    worker's ``z_i`` to the server's ``z`` at the end of both runs), ``max_sine`` (principal-angle
    sine between ``qf`` of the mean ``z_i`` and the server's loadings), ``n_iter``,
    ``server_n_iter``, ``z_distance_at`` (the largest ``||z_i - z||`` after ``at_iteration``
    iterations of both, ``tol=0``), ``bytes`` (trial 0, all directed edges), ``server_bytes``
    (the plain uploads and downloads of ``z``: ``2 K d r`` floats per iteration); per trial
    where a list.
    """
    def distance(res, server):
        return torch.linalg.matrix_norm(res.z - server.z[:, None]).amax(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", DegreeOneWarning)
        server = fit_fsspca(data, n_components, **kwargs)
        fixed = dict(kwargs, max_iter=at_iteration, tol=0)
        server_at = fit_fsspca(data, n_components, **fixed)
        out = []
        for m in inner:
            opts = dict(serverless_options or {}, consensus=consensus, inner_iters=m, exchange=exchange,
                        exchange_options=exchange_options)
            res = fit_serverless(data, n_components, graph, **opts, **kwargs)
            res_at = fit_serverless(data, n_components, graph, **opts, **fixed)
            s = torch.linalg.svdvals(server.components.mT @ res.components).amin(-1)
            K, d, r = res.z.shape[1:]
            out.append(dict(consensus=consensus, inner_iters=m, max_z_distance=distance(res, server).tolist(),
                            max_sine=torch.sqrt((1 - s.square()).clamp_min(0)).tolist(), n_iter=res.n_iter.tolist(),
                            server_n_iter=server.n_iter.tolist(), z_distance_at=distance(res_at, server_at).tolist(),
                            at_iteration=at_iteration, bytes=res.bytes, costs=res.costs,
                            mean_error=None if res.mean_error is None else res.mean_error.tolist(),
                            server_bytes=float(2 * K * d * r * server.z.element_size() * int(server.n_iter[0]))))
    return out


def spiked_setup(n_workers=8, seed=0):
    """The problem of docs/RESULTS.md's "Without a server": the spiked model (``n = 800``,
    ``d = 30``, ``r = 2``, support 5) dealt IID over ``n_workers`` workers, and two graphs of them, a
    ring and a random connected graph (average degree 3, ``seed``); ``(X, groups, {name: Graph})``."""
    from ...graph import random_connected, ring
    from .data import spiked_covariance, split_rows

    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=seed)
    groups = split_rows("iid", n_workers, n=len(sp.X), seed=seed)
    return sp.X, groups, {"ring": ring(n_workers), "random": random_connected(n_workers, 3.0, seed=seed)}


def serverless_table(n_workers=8, inner=(1, 3, 10, 30), methods=CONSENSUS_METHODS, graphs=("ring", "random"),
                     alpha=200.0, seed=0, max_iter=300, exchange="plain", exchange_options=None):
    """docs/RESULTS.md's "Without a server": rows of :func:`compare_with_server` on
    :func:`spiked_setup`'s problem per graph, consensus method and inner iteration count, with
    the graph's name (trial 0's numbers; ``estimated_paillier_seconds`` from the exchange's cost
    model, None without one)."""
    X, groups, made = spiked_setup(n_workers, seed)
    rows = []
    for name in graphs:
        for method in methods:
            for row in compare_with_server(X, 2, made[name], inner, consensus=method, exchange=exchange,
                                           exchange_options=exchange_options, groups=groups, alpha=alpha,
                                           max_iter=max_iter, tol=1e-6, seed=seed):
                costs = row.pop("costs")
                rows.append(dict(graph=f"{name}({n_workers})", **{k: (v[0] if isinstance(v, list) else v)
                                                                   for k, v in row.items()},
                                 estimated_paillier_seconds=costs.get("estimated_seconds")))
    return rows
