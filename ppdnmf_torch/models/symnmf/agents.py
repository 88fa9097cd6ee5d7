"""Symmetric NMF across agents, with privacy (docs/SYMMETRIC_NMF.md, last section).

Agent ``i`` of a connected graph holds the columns ``X_i = X[:, S_i] (n, m_i)`` of its own
nodes ``S_i`` (a partition of ``0..n-1``) and nothing else. The split objective (3) is a
sum over agents::

    g(U, V) = sum_i [ 1/2 ||X_i - U V_i^T||^2 + lambda/2 ||U[S_i] - V_i||^2 ],  V_i = V[S_i],

so it is PPDNMF's problem with ``Z_i = X_i``, the consensus factor ``U`` (PPDNMF's ``X``)
and ``Y_i = V_i^T``, plus a coupling term that touches only the rows ``S_i`` of agent
``i``'s copy of ``U``. Every outer iteration is

* the **X-step** (:func:`~.agent_steps.x_step`): ``x_iters`` iterations of PPDNMF's consensus ADMM
  (ALGORITHM.md, X-step steps 1-6, eqs. 8-11) on the agents' copies ``U_i``, whose local
  solve (step 3) gains ``lambda`` on the diagonal for the rows in ``S_i`` and
  ``lambda V_i`` on the right-hand side: one ``eigh`` of ``V_i^T V_i`` serves every row
  (a scalar shift per row); the neighbour sums ``S_i`` come from the library's exchange
  (``plain``, ``quantized``, ``paillier``, any protocol, masked included), the penalties
  from its :class:`~ppdnmf_torch.penalties.PenaltySampler`;
* the **Y-step** (:func:`~.agent_steps.y_step`): ``y_iters`` HALS sweeps of eq. (17) on ``V_i`` against
  the agent's own nonnegative copy: ``A = X_i^T U_i + lambda U_i[S_i]``,
  ``B = U_i^T U_i + lambda I``; local, nothing is sent;
* the **penalty** ``lambda``: fixed, or the adaptive rule (20)
  ``lambda <- lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` with ``U`` the agents' own rows
  ``U_i[S_i]`` (:func:`~.agent_steps.adaptive_lambda`), from three network-wide sums
  (:func:`~.agent_steps.lambda_terms`, :func:`~.agent_steps.lambda_from_sums`).

**Penalty schedule.** ``penalty_schedule="agreed"`` (the default, as PPDNMF's): every edge of
a trial carries one common draw ``g^(m)`` per ADMM iteration under the one cap ``g``
(:class:`~ppdnmf_torch.penalties.PenaltySampler` with ``shared=True``), so a receiver's
weights are equal and its two sums give it ``rho_i = d_i g^2`` and ``sum_j q_j`` only
(docs/SECURE_EXCHANGE.md, "What the sums reveal"). The cap stays fixed: PPDNMF's agreed cap
growth (``solver/schedule.py``) is not used, because ``mu = "auto"`` already scales the
X-step to each agent's ``V_i`` and the fixed common cap reached consensus errors as small as
the per-edge draws' or smaller (docs/SYMNMF.md, "Across agents"). ``"paper"``: each directed
edge its own draw under its agent's cap (``g_cap`` may then differ per agent; unequal caps
on a secure exchange warn :class:`~ppdnmf_torch.errors.SumLeakWarning`).

**What crosses an edge**: only what the exchange sends (for the secure kinds, ciphertexts of
the quantized ``U_i``). ``V_i`` and ``X_i`` never leave agent ``i``; the result's ``V`` and
``U`` (the mean of the copies) are assembled for evaluation only. **What the aggregating
party learns**: the adaptive rule's three sums per trial and outer iteration
(``sum_i ||U_i[S_i]||^2``, ``sum_i ||V_i||^2``, ``sum_i <U_i[S_i], V_i>``) go through the
library's secure aggregation (:func:`~ppdnmf_torch.exchange.aggregation.make_aggregator`,
``aggregation=``: ``plain``, ``quantized``, ``paillier``; by default the exchange's kind).
With a secure kind, each agent's upload is masked (and, for ``paillier``, encrypted), and the
aggregating party (one agent or a helper) learns the three totals and hence the new
``lambda``, which every agent needs anyway; no agent's own terms. ``quantized`` and
``paillier`` give the same bits (``lambda`` from the exact integer sums ``sum_i round(n_max
v_i)``, ``n_max = 2^32`` by default); they differ from ``plain`` by the quantization alone.
A fixed ``lambda`` (``penalty=float``) needs no sums.

**Sparse ``X``**: agent ``i`` holds ``X[:, S_i]`` sparse; all agents' columns are two
block-diagonal CSR matrices (:class:`~.agent_columns.SparseColumns`,
:func:`~.agent_columns.agent_columns`), so each local
product is one sparse pass for every agent and trial, ``O(T nnz)`` memory; the metrics come
from ``X U`` products (:mod:`.objective`), so ``X`` is never made dense. The iterates equal the
dense path's to rounding.

**The run** is the engine's driver (:func:`~ppdnmf_torch.driver.drive`) over this model's hooks
(:class:`~.agents_run.AgentsRun`; the maths of one outer iteration is :mod:`.agent_steps`, the
setup :mod:`.agent_setup`). **Checkpoints** (``checkpoint_dir``, ``checkpoint_every``,
``resume``; the engine's format, :mod:`ppdnmf_torch.checkpoint`): the agents' variables,
``lambda``, the penalty generators' states, the histories and the cost counters, with the
settings and a digest of each input (a resume refuses a change by name); no key, mask seed or
private value of the exchange or the aggregation (both are rebuilt on resume, with new keys and
seeds, and give the same numbers). A resumed run continues bit for bit; the aggregation's setup
is counted again for the new process.

**Private start** (``start="private"``, the default; :func:`~.agent_setup.private_start`): the copies start
at the common ``U_0``, and each ``V_i`` is drawn from a stream only agent ``i`` holds, i.i.d.
uniform on ``[0, max U_0]``, the common start's scale. The stream's seed is the operating
system's CSPRNG's (:mod:`secrets`, drawn per agent and run, used once and never kept), unless a
simulation asks for reproducible starts with ``start_seed`` (``derive_seed(start_seed + t,
"symnmf private start", i)``; whoever knows ``start_seed`` knows every ``V_i``, so it is a
simulation's setting, like a fixed mask seed). Not ``seed``: every agent knows the run's seed
(the graph, the parts, ``U_0`` and the agreed penalties come from it), so a start derived from
it would be public. With the old public start ``V_i = U_0[S_i]`` (``start="common"``) everything
in agent ``i``'s first local solve (eq. 9) but ``X_i`` is public, so its first message ``U_i^(1)``
is a linear function of ``X_i`` and inverts to its columns
(:func:`~ppdnmf_torch.models.symnmf.audit.first_call_errors`; measured in docs/THREAT_MODEL.md,
"Symmetric NMF across agents", with what the private start leaves).

Choices (pinned in ``tests/test_symnmf_agents.py``): the copies start at ``U_0``, ``V_i`` as
``start`` says; ``P = Q = Q_prev = 0``; the penalties' draws carry over between outer
iterations (ALGORITHM.md's warm start); with one agent there are no neighbours
(``rho = 0``) and, with enough inner iterations, an outer iteration is SymANLS's.
The run over ``torch.distributed`` ranks is :mod:`.distributed`'s (the same model and driver on
a rank's agents, the same bits under the same settings); the privacy audit is :mod:`.audit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...checkpoint import digest
from ...driver import Checkpoints, Ledgers, Resources, check_checkpoint_args, drive, trial_seeds, warn_degree_one, \
    warn_sum_leak
from ...errors import DataError
from ...graph import Topology, check_min_degree
from ...penalties import PenaltySampler, check_shared_caps
from ...specs import check_call
from .agent_columns import agent_columns
from .agent_setup import (agent_caps, agent_graphs, arithmetic, check_settings, common_start, initial_state,
                          lambda_aggregator, node_parts)
from .agent_steps import scatter_rows
from .agents_run import HISTORY_KEYS, AgentsRun, AgentsSetup
from .config import AGENTS, RUN
from .operator import as_similarity

__all__ = ["AgentsResult", "fit_symnmf_agents", "agents_result", "agents_costs", "settings_of"]


@dataclass
class AgentsResult:
    """What :func:`fit_symnmf_agents` returns.

    Attributes
    ----------
    U : Tensor (T, n, r)
        The mean of the agents' nonnegative copies (evaluation only: no agent computes it).
    V : Tensor (T, n, r)
        The agents' ``V_i`` in node order (evaluation only: ``V_i`` stays with agent ``i``).
    U_agents : Tensor (T, N, n, r)
        Every agent's nonnegative copy.
    lam : Tensor (T,)
        The last penalty.
    history : dict of list
        One entry per outer iteration, each a list of ``(T,)`` arrays (``time`` and the
        cost counters: floats): ``E`` (``||X - U U^T||_F^2 / ||X||_F^2``), ``objective``
        (``g(U, V)``), ``uv_dist`` (``||U - V||_F``), ``consensus``
        (``max_i ||U_i - U||_F / ||U||_F``), ``stationarity`` (the stopping rule's residual,
        :func:`~.agent_steps.stationarity_from_sums`), ``lambda``, ``time`` (seconds since the
        start), ``bytes`` (cumulative bytes over all edges: the exchange's count for the
        integer kinds, ``n r`` floats per directed edge and ADMM iteration for ``plain``).
    n_iter : int
    parts : LongTensor (T, N, m_max)
        ``S_i`` per trial and agent, padded with ``n``.
    costs : dict
        The exchange's cumulative :meth:`~ppdnmf_torch.exchange.Exchange.costs` (for
        ``quantized`` with ``cost_model``: the estimated Paillier operations and seconds), and
        the lambda sums' aggregation's :meth:`~ppdnmf_torch.exchange.aggregation.Aggregator.costs`
        as ``lambda_sums_<key>`` (``rounds``, ``uploads``, ``bytes``, ``seconds``; the integer
        kinds' ``model_*`` Paillier counts; ``paillier``'s real operations) when ``lambda`` is
        adaptive.
    converged : bool
    """

    U: torch.Tensor
    V: torch.Tensor
    U_agents: torch.Tensor
    lam: torch.Tensor
    history: dict
    n_iter: int
    parts: torch.Tensor
    costs: dict = field(default_factory=dict)
    converged: bool = False


def fit_symnmf_agents(X, rank: int, *, n_agents: int = AGENTS.n_agents, graph=None, parts=None,
                      exchange=AGENTS.exchange, exchange_options: dict | None = None, penalty=AGENTS.penalty,
                      lam0: float = AGENTS.lam0, mu=AGENTS.mu, g_cap=AGENTS.g_cap,
                      penalty_mode: str = AGENTS.penalty_mode, x_iters: int = AGENTS.x_iters,
                      y_iters: int = AGENTS.y_iters, max_iter: int = AGENTS.max_iter, tol: float = AGENTS.tol, U0=None,
                      trials: int = RUN.trials, seed: int = RUN.seed, device="auto", dtype=None,
                      min_degree: int | None = AGENTS.min_degree, callback=None,
                      penalty_schedule: str = AGENTS.penalty_schedule, aggregation=AGENTS.aggregation,
                      aggregation_options: dict | None = None, checkpoint_dir=None,
                      checkpoint_every: int = RUN.checkpoint_every, resume: bool = False, start: str = AGENTS.start,
                      start_seed: int | None = AGENTS.start_seed) -> AgentsResult:
    """Symmetric NMF of ``X`` with its columns held by ``n_agents`` agents (see the module).

    Parameters
    ----------
    X : array-like, Tensor, scipy.sparse or torch sparse (n, n)
        The symmetric nonnegative similarity matrix (:func:`~.operator.as_similarity`). Agent
        ``i`` holds ``X[:, S_i]``: dense columns for a dense ``X``; sparse ones for a sparse ``X``.
    rank : int
    n_agents : int
    graph : Graph or list of Graph, optional
        The agents' graph (one per trial); default the paper's random connected graph of
        average degree 3, seeded per trial.
    parts : LongTensor (N, m) or (T, N, m), optional
        ``S_i`` padded with ``n`` (default :func:`~.agent_setup.partition_nodes`: random, balanced).
    exchange : str, ExchangeSpec or Exchange
        ``plain``, ``quantized``, ``paillier``, ``secagg`` (under ``penalty_schedule="agreed"``;
        :func:`~ppdnmf_torch.exchange.make_exchange` with
        ``exchange_options``: ``protocol``, ``n_max``, ``key_bits``, ``cost_model``); made here and
        closed at the end, or handed in and left open.
    penalty : "adaptive" or float
        ``lambda``: eq. (20) from ``lam0`` (default :data:`~.config.ADAPTIVE_LAMBDA0`), or fixed.
    mu : "auto" or float
        The X-step's ADMM penalty of ``X_i = U_i`` (eq. 8); ``"auto"``: :func:`~.agent_steps.auto_mu`.
    g_cap : float, or sequence (N,) or (T, N)
        The caps ``g_i`` of the consensus penalties (``rho_ij = g_{i->j} g_{j->i}``); 0.3 suits a
        normalized similarity (largest eigenvalue 1). ``"agreed"`` takes one cap per trial.
    penalty_mode : {"random", "fixed"}
        The penalties' draws (:class:`~ppdnmf_torch.penalties.PenaltySampler`).
    penalty_schedule : {"agreed", "paper"}
        ``"agreed"``: every edge of a trial one common draw per ADMM iteration under the one cap
        (a receiver's sums reveal ``rho_i = d_i g^2`` and ``sum_j q_j`` only;
        docs/SECURE_EXCHANGE.md); ``"paper"``: each directed edge its own draw under its agent's
        cap (unequal caps on a secure exchange warn :class:`~ppdnmf_torch.errors.SumLeakWarning`).
    aggregation : {"plain", "quantized", "paillier", "secagg"}, Aggregator or None
        How the adaptive rule's three network-wide sums are added
        (:func:`~ppdnmf_torch.exchange.aggregation.make_aggregator` with ``aggregation_options``,
        made here and closed at the end; one handed in is left open). None: the exchange's kind
        (``plain`` for one agent), at its key size. Unused with a fixed ``lambda``.
    x_iters, y_iters : int
        ADMM iterations per X-step, HALS sweeps per Y-step.
    max_iter : int
        Outer iterations (a resumed run's included).
    tol : float
        Stop after the outer iteration where, in every trial, the stationarity residual of (2) and
        the consensus error are both ``<= tol`` (:mod:`.agents_run`; the history's
        ``stationarity`` and ``consensus``); 0: never. A run that does not warns
        :class:`~ppdnmf_torch.errors.ConvergenceWarning`.
    U0 : array-like or Tensor (n, r) or (T, n, r), optional
        The start (default i.i.d. uniform on [0, 1] per trial seed).
    start : {"private", "common"}
        The agents' ``V_i`` at the start: drawn from each agent's own stream
        (:func:`~.agent_setup.private_start`), or ``U_0[S_i]`` (public: the first message then
        inverts to the agent's columns; docs/THREAT_MODEL.md).
    start_seed : int, optional
        Reproducible private starts for a simulation (trial ``t``: ``start_seed + t``); default
        None, each agent's own CSPRNG draw. Never stored in a checkpoint (the checkpoint holds ``V``).
    trials : int
        Independent trials, batched (trial ``t`` uses seed ``seed + t``).
    callback : callable, optional
        ``callback(k, metrics)`` after outer iteration ``k`` (1-based), ``metrics`` the history's
        newest entries; a true return value stops the run.
    checkpoint_dir : path, optional
        Checkpoints every ``checkpoint_every`` outer iterations (0: only at the end), at the end and
        on Ctrl-C (then :class:`~ppdnmf_torch.driver.RunInterrupted`); the newest two are kept. The
        folder is locked: a second run into it is refused, as is one into another run's checkpoints.
    resume : bool
        Continue from the newest checkpoint in ``checkpoint_dir`` (none: a fresh start), bit for
        bit; changed settings or inputs are refused by name
        (:class:`~ppdnmf_torch.checkpoint.CheckpointError`; only ``max_iter`` may change).

    Returns
    -------
    AgentsResult
    """
    check_call(locals(), AGENTS, RUN, skip=("exchange", "g_cap", "aggregation", "checkpoint_every"),
               also={"parts": ARRAY, "U0": ARRAY, "callback": CALLBACK, "exchange_options": OPTIONS,
                     "aggregation_options": OPTIONS})
    mu = check_settings(mu=mu, tol=tol, penalty=penalty, penalty_schedule=penalty_schedule, penalty_mode=penalty_mode,
                        start=start, rank=rank, n_agents=n_agents, x_iters=x_iters, y_iters=y_iters,
                        max_iter=max_iter, trials=trials)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    sim = as_similarity(X, device=device, dtype=dtype)
    if sim.batched:
        raise DataError("X: one (n, n) similarity matrix for every trial; got one per trial")
    T, N, seeds = int(trials), int(n_agents), trial_seeds(seed, trials)
    graphs = agent_graphs(graph, N, T, seeds)
    for t, g in enumerate(graphs):
        check_min_degree(g, min_degree, trial=t if T > 1 else None)
    caps = agent_caps(g_cap, T, N, sim.device)
    check_shared_caps(caps, penalty_schedule)
    idx = node_parts(parts, sim.n, N, seeds).to(sim.device).contiguous()
    U0 = common_start(U0, sim.n, int(rank), seeds, sim.device, sim.dtype)
    options = dict(mu=mu, penalty=penalty, lam0=lam0, x_iters=int(x_iters), y_iters=int(y_iters), tol=float(tol),
                   penalty_mode=penalty_mode, penalty_schedule=penalty_schedule, start=start, start_seed=start_seed)
    with Resources() as res:
        exch = res.exchange(exchange, exchange_options)
        warn_degree_one(exch, graphs)
        warn_sum_leak(exch, penalty_schedule, caps, [g.degree for g in graphs])
        agg = lambda_aggregator(aggregation, aggregation_options, exch, N, res) if penalty == "adaptive" else None
        run = _agents_run(sim, idx, U0, graphs, caps, seeds, exch, agg, options)
        ledgers = Ledgers(exchange=exch, aggregation=agg)
        plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume)
        out = drive(run, max_iter=int(max_iter), tol=tol, callback=callback, checkpoints=plan, ledgers=ledgers)
        return agents_result(run, out, agents_costs(run, ledgers), run.st.Xc, run.st.V, idx)


def _agents_run(sim, idx, U0, graphs, caps, seeds, exch, agg, o: dict) -> AgentsRun:
    """The model of one process's run: its agents' columns, the bound exchange, the penalties and
    the start (:func:`~.agent_setup.initial_state`)."""
    T, N = idx.shape[:2]
    n, r, dev, dt = sim.n, U0.shape[-1], sim.device, sim.dtype
    topo = Topology.from_graphs(graphs)
    Z = agent_columns(sim, idx)  # agent i's data: the columns S_i (empty columns on padding)
    mask = torch.zeros((T, N, n + 1), dtype=dt, device=dev).scatter_(-1, idx, 1.0)[..., :n, None]
    exch.bind(topo, dtype=dt, device=dev)
    edges_per_trial = torch.bincount(torch.div(topo.src, N, rounding_mode="floor"), minlength=T).tolist()
    sampler = PenaltySampler(caps.reshape(-1), topo.src.to(dev), edges_per_trial, seeds, o["penalty_mode"],
                             o["x_iters"], shared=o["penalty_schedule"] == "agreed")
    adaptive = o["penalty"] == "adaptive"
    lam = torch.full((T,), float(o["lam0"] if adaptive else o["penalty"]), dtype=dt, device=dev)
    st = initial_state(U0, idx, sampler.initial(), lam, o["start"], o["start_seed"])
    setup = AgentsSetup(Z=Z, idx=idx, mask=mask, n=n, x_norm2=sim.sq_norm.expand(T), sim=sim, mu=o["mu"],
                        x_iters=o["x_iters"], y_iters=o["y_iters"], adaptive=adaptive, tol=o["tol"], sampler=sampler,
                        exchange=exch, aggregator=agg,
                        plain_bytes=topo.n_directed_edges * n * r * sim.data.element_size() * o["x_iters"])
    settings = dict(settings_of(o, r, dt), seeds=list(seeds), g_cap=caps.tolist(), arithmetic=arithmetic(exch, agg))
    return AgentsRun(setup, st, settings=settings,
                     inputs=lambda: {"X": sim.digest(), "U0": digest(U0), "parts": digest(idx),
                                     "graph": digest(topo.src, topo.dst)})


def settings_of(o: dict, rank: int, dtype) -> dict:
    """The settings that fix a run's numbers (compared by name on resume), from its options."""
    adaptive = o["penalty"] == "adaptive"
    return {"penalty": o["penalty"], "lam0": float(o["lam0"]) if adaptive else None, "mu": o["mu"], "rank": int(rank),
            "penalty_mode": o["penalty_mode"], "penalty_schedule": o["penalty_schedule"], "x_iters": o["x_iters"],
            "y_iters": o["y_iters"], "tol": o["tol"], "dtype": str(dtype), "start": o["start"]}


def agents_costs(run: AgentsRun, ledgers: Ledgers) -> dict:
    """The exchange's cumulative costs, and the lambda sums' aggregation's as ``lambda_sums_<key>``."""
    costs = dict(ledgers.costs("exchange"))
    if run.s.aggregator is not None:
        costs.update({f"lambda_sums_{key}": v for key, v in ledgers.costs("aggregation").items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return costs


def agents_result(run: AgentsRun, out, costs: dict, U_agents, V_agents, idx) -> AgentsResult:
    """The result of a run from its agents' copies ``U_agents (T, N, n, r)`` and ``V_agents``
    ``(T, N, m, r)`` (all of them: gathered on rank 0 over ranks), its costs and the driver's
    outcome."""
    history = {key: [v.numpy() if isinstance(v, torch.Tensor) else v for v in out.history.get(key, [])]
               for key in HISTORY_KEYS}
    return AgentsResult(U=U_agents.mean(1), V=scatter_rows(V_agents, idx, run.s.n).sum(1), U_agents=U_agents,
                        lam=run.st.lam, history=history, n_iter=out.done, parts=idx, costs=costs,
                        converged=out.converged)
