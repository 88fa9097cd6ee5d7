"""Symmetric NMF across agents over ``torch.distributed`` ranks: one rank's run of
:func:`~.agents.fit_symnmf_agents` (:func:`fit_symnmf_rank`) and a launcher on this machine
(:func:`fit_symnmf_distributed`).

Every rank holds its agents' columns ``X_i = X[:, S_i]`` and states only (copies ``U_i``,
duals, ``V_i``), laid out in the engine's slots (:class:`~ppdnmf_torch.distributed.RankLayout`,
which keep the single-process memory alignment of every per-agent block: ``(n, m)``,
``(n, r)``, ``(m, r)``, ``(r, r)``). An outer iteration is the single process's, step for step:

* the X-step (:func:`~.agents.x_step`, ALGORITHM.md steps 1-6) with the rank's
  :class:`~ppdnmf_torch.distributed.HaloExchange` (``plain``, ``quantized``: the boundary
  agents' ``U_i`` rows and the cut edges' penalties cross to the peer ranks, then the run's
  kind computes ``S_i`` and ``rho_i`` on the rank's extended nodes, the same terms in the same
  order as in one process) or :class:`~ppdnmf_torch.distributed.SecureHalo` (``paillier``:
  ciphertexts and public keys only; keys and mask seeds never leave their rank), and the
  rank's :class:`~ppdnmf_torch.distributed.RankSampler` (each edge's single-process draws:
  under ``penalty_schedule="agreed"``, the default, every rank draws the trial's common
  penalty, ``shared=True``, as PPDNMF's agreed schedule over ranks does);
* the Y-step (:func:`~.agents.y_step`): local, nothing crosses a rank;
* the adaptive penalty (20) (:func:`rank_lambda`): its three sums
  (``sum_i ||U_i[S_i]||^2``, ``sum_i ||V_i||^2``, ``sum_i <U_i[S_i], V_i>``) over every rank's
  agents in one all-reduce. ``share="all"`` (default) all-reduces a ``(N, 3)`` table in which
  each rank fills its agents' rows (each entry is one rank's value plus zeros: exact), so that
  every rank sums the agents in the single-process order: the run's factors equal
  :func:`~.agents.fit_symnmf_agents`'s bit for bit. ``share="sums"`` all-reduces each rank's
  three partial sums (3 numbers per rank, no per-agent value): ``lambda`` and the factors
  then agree with one process to rounding, not bit for bit. Under ``exchange="secagg"`` the
  ``"sums"`` all-reduce is masked (:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`: only
  the totals revealed; to about ``2^-60`` of the largest term, so ``lambda`` and the factors agree
  with one process's ``aggregation="plain"`` to rounding), and ``aggregation`` may be ``None``,
  ``"secagg"`` or ``"plain"``. Otherwise both are the ``plain`` aggregation's arithmetic, not a
  protected sum: one process's other secure aggregations (``aggregation="quantized"``,
  ``"paillier"``, ``None``'s default for those exchanges, and ``secagg`` with ``share="all"``)
  have no cross-rank protocol here and are refused
  (:class:`~ppdnmf_torch.errors.ConfigError`; ``aggregation="plain"`` or a fixed ``penalty``).

A sparse ``X`` stays sparse (:func:`~.agent_columns.agent_columns` over the rank's slots).
The rank's start comes from one function, :func:`initial_rank_state`.

The run is the engine's driver over the single process's model (:class:`~.agents_run.AgentsRun`)
on the rank's agents (:class:`RankAgentsRun`: the penalty's sums and the metrics across ranks, the
rank's slots in its checkpoints), with the driver's rank coordination
(:class:`~ppdnmf_torch.driver.RankCoordinator`): the stop decision agreed after every outer
iteration, and checkpoints per rank, ``<checkpoint_dir>/rank<r>/`` (the engine's format), with
``partition.json`` beside them (rank 0's). A rank writes its own agents' variables only (their
slots of the copies, duals and ``V_i``, and ``mu_i``), the penalty draws of its edges and its
generators' states, its cost counters, and what every rank has alike (``lambda`` and the
history); no key, mask seed or private value of the exchange (rebuilt on resume, with
new keys and seeds). A resumed run (the same world size and partition, settings and inputs,
checked on every rank) continues from the newest outer iteration every rank has a checkpoint
of, bit for bit: the factors equal an uninterrupted run's, and the single process's under
``share="all"``.

The history's metrics (``E``, ``objective``, ``uv_dist``, ``consensus``) come from per-rank
sums (masked under ``exchange="secagg"``, in both ``share`` modes: :func:`~ppdnmf_torch.distributed.masked_sum.rank_sums`):
the agents' mean copy ``Ubar`` is an all-reduce of each rank's sum of copies
``(n, r)``, then one all-reduce of three per-rank scalar sums (``sum_i <X_i^T Ubar, Ubar[S_i]>``,
``sum_i <X_i^T Ubar, V_i>``, ``||Ubar - V||^2`` over the rank's agents) with the rank's
``sum_i V_i^T V_i`` ``(r, r)``, the fits by :mod:`.objective`'s expansion from ``||X||^2`` (taken
before the rank drops the other columns), and one all-reduce of the largest ``||U_i - Ubar||``.
They equal one process's to rounding (not bit for bit; the metrics do not feed the iterates).
The stopping rule (``tol``: the stationarity residual and the consensus error, :mod:`.agents_run`)
has the same numbers on every rank (one all-reduce decides): the residual's two sums
(:meth:`RankAgentsRun.stationarity_sums`) cross as a per-agent table under ``share="all"`` with an
unmasked sum (the single process's bits, so the same stop), else as the ranks' partial sums
(masked under ``exchange="secagg"``; to rounding, so a residual within rounding of ``tol`` could
stop one iteration apart from one process). At
the end rank 0 gathers every agent's copy and ``V_i`` (evaluation only, as the single-process
result assembles them) into the same :class:`~.agents.AgentsResult`.

One trial per run (the engine's layout is one trial's); ``trials`` batches belong to the
single process.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...distributed.comm import EXIT_PEER_FAILED, Comm, DistributedError
from ...distributed.halo import HALO_KINDS, HaloExchange, RankSampler
from ...distributed.launch import check_local_ranks, launch_local
from ...distributed.masked_sum import PlainSums, rank_sums
from ...distributed.layout import RankLayout, block_period, gather_agents
from ...distributed.partition import Partition, partition_agents
from ...distributed.secure import SecureHalo
from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...checkpoint import digest
from ...driver import (Checkpoints, Ledgers, RankCoordinator, Resources, check_checkpoint_args, drive, warn_degree_one,
                       warn_sum_leak)
from ...errors import ConfigError, DataError
from ...exchange import Exchange
from ...exchange.aggregation import AGGREGATION_KINDS
from ...exchange.spec import exchange_spec
from ...graph import check_min_degree
from ...penalties import check_shared_caps
from ...specs import check_call
from ...threads import with_threads
from .agent_columns import agent_columns, local_t_product
from .agent_setup import (agent_caps, agent_graphs, check_settings, common_start, node_parts, private_start,
                          start_seeds)
from .agent_steps import STATE_NAMES, AgentsState, gather_rows, lambda_from_sums, lambda_terms
from .agents import AgentsResult, agents_costs, agents_result, settings_of
from .agents_run import HISTORY_KEYS, AgentsRun, AgentsSetup
from .config import AGENTS, RANKS, RUN, SHARE_MODES
from .operator import as_similarity

__all__ = ["SHARE_MODES", "SymRankResult", "fit_symnmf_rank", "fit_symnmf_distributed", "rank_lambda",
           "initial_rank_state", "RankAgentsRun"]

# SHARE_MODES, what crosses ranks for the adaptive penalty (:func:`rank_lambda`): .config
_FLAT = ("protocol", "n_max", "key_bits", "g_bits")


@dataclass
class SymRankResult:
    """What :func:`fit_symnmf_rank` returns on every rank.

    Attributes
    ----------
    result : AgentsResult or None
        The run's result on rank 0 (None elsewhere).
    partition : Partition
        Which rank held which agent.
    ranks : list of dict
        On rank 0 every rank's layout summary and bytes sent per category (``sent``); on
        the other ranks their own.
    own : dict
        This rank's agents: ``agents`` (global ids, increasing), ``U`` ``(n_own, n, r)`` their
        nonnegative copies, ``V`` ``(n_own, m, r)`` their ``V_i`` (padded rows zero) and ``parts``
        ``(n_own, m)`` their ``S_i``.
    history : dict or None
        A site's run (:mod:`.site`): the history, on every site (nothing is gathered).
    """

    result: AgentsResult | None
    partition: Partition
    ranks: list = field(default_factory=list)
    own: dict = field(default_factory=dict)
    history: dict | None = None


def rank_lambda(lam: torch.Tensor, U_own: torch.Tensor, V: torch.Tensor, layout: RankLayout, comm: Comm, *,
                share: str, what: str, sums=None) -> torch.Tensor:
    """Eq. (20) over every rank's agents: ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` from this
    rank's ``U_own = U_i[S_i]`` and ``V_i``, ``(1, n_slots, m, r)`` each; ``(1,)``, the same on
    every rank (see the module: ``share="all"`` sums the agents in the single-process order,
    ``"sums"`` adds the ranks' partial sums with ``sums``, a
    :class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums` under ``exchange="secagg"``, default
    the plain all-reduce)."""
    slots = layout.slots.to(U_own.device)
    terms = lambda_terms(U_own, V)[0, slots]  # (n_own, 3)
    if share == "all":
        table = terms.new_zeros(layout.n_agents, 3)
        table[layout.agents.to(terms.device)] = terms
        total = comm.all_reduce(table, category="metrics", what=what).to(terms.device)[None].sum(1)
    else:
        sums = sums if sums is not None else PlainSums(comm)
        total = sums.all_reduce(terms.sum(0), category="metrics", what=what, split=(1, 1, 1)).to(terms.device)[None]
    return lambda_from_sums(lam, total)


def _rank_metrics(Z, st: AgentsState, idx, layout: RankLayout, comm: Comm, x_norm2, k: int, sums=None):
    """The history's ``E``, ``objective``, ``uv_dist``, ``consensus`` of outer iteration ``k`` from
    per-rank sums (``sums``: masked under ``exchange="secagg"``, default plain), and ``Ubar (1, n, r)``
    (module docstring); every value the same on every rank.

    As :mod:`.objective` (``||X - U W^T||^2 = ||X||^2 - 2 <X W, U> + <U^T U, W^T W>``), summed over
    the agents' column blocks: ``<X W, Ubar> = sum_i <X_i^T Ubar, W_i>`` and
    ``W^T W = sum_i W_i^T W_i`` with ``W_i`` = ``Ubar[S_i]`` or ``V_i``; a sparse ``X_i`` stays
    sparse."""
    slots = layout.slots.to(st.Xc.device)
    N = layout.n_agents
    red = sums if sums is not None else PlainSums(comm)
    Ubar = red.all_reduce(st.Xc[0, slots].sum(0), category="metrics",
                           what=f"the mean copy of outer iteration {k}").to(st.Xc.device)[None] / N
    XtU = local_t_product(Z, Ubar[:, None].expand_as(st.Xc))[:, slots]  # X_i^T Ubar, (1, n_own, m, r)
    Xc, Vo, io = st.Xc[:, slots], st.V[:, slots], idx[:, slots]
    Urows = gather_rows(Ubar[:, None].expand_as(Xc), io)  # Ubar[S_i], zero on padding
    r = Vo.shape[-1]
    local = torch.cat([torch.stack([(XtU * Urows).sum(), (XtU * Vo).sum(), (Urows - Vo).square().sum()]),
                       (Vo.mT @ Vo).sum(dim=(0, 1)).reshape(-1)])  # and this rank's share of V^T V
    sums = red.all_reduce(local, category="metrics", what=f"the metrics of outer iteration {k}",
                           split=(1, 1, 1, r * r)).to(Xc.device)
    G = Ubar[0].mT @ Ubar[0]
    UtU = torch.linalg.matrix_norm(G).square()  # <Ubar^T Ubar, Ubar^T Ubar>
    VtV = sums[3:].view(r, r)
    fit_E = (x_norm2 - 2 * sums[0] + UtU).clamp_min(0)
    fit_V = (x_norm2 - 2 * sums[1] + (G * VtV).sum()).clamp_min(0)
    worst = torch.linalg.matrix_norm(Xc - Ubar[:, None]).amax().reshape(1)
    worst = comm.all_reduce(worst, category="metrics", op=dist.ReduceOp.MAX,
                            what=f"the consensus error of outer iteration {k}").to(Xc.device)
    unorm = torch.linalg.matrix_norm(Ubar).clamp_min(torch.finfo(Ubar.dtype).tiny)
    uv = sums[2].sqrt().reshape(1)
    return {"E": (fit_E / x_norm2).reshape(1), "objective": (0.5 * fit_V + 0.5 * st.lam * uv.square()),
            "uv_dist": uv, "consensus": worst / unorm, "lambda": st.lam}, Ubar


def _digest(sim_digest: str, graph, idx, U0, params: dict) -> str:
    """What every rank must agree on: the data (``sim_digest``, its :meth:`~.operator.Similarity.digest`),
    the graph, the parts, the start and the settings."""
    h = hashlib.sha256(sim_digest.encode())
    for t in (idx, U0):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    h.update(repr((graph.n_agents, graph.edges, sorted(params.items()))).encode())
    return h.hexdigest()


def _spec(exchange, exchange_options):
    if isinstance(exchange, Exchange):
        raise ConfigError("exchange: a run over ranks builds its exchange on every rank; pass a kind name or a spec")
    opts = dict(exchange_options or {})
    flat = {key: opts.pop(key) for key in _FLAT if key in opts}
    spec = exchange_spec(exchange, options=opts, **flat)
    if spec.kind not in HALO_KINDS + ("paillier",):
        raise ConfigError(f"exchange: the {spec.kind!r} kind has no cross-rank protocol; use one of "
                          f"{HALO_KINDS + ('paillier',)}")
    if spec.kind == "paillier" and not spec.fast:
        raise ConfigError("exchange: a paillier run over ranks takes the fast host path (fast=true)")
    if spec.kind == "paillier" and spec.record_transcript:
        raise ConfigError("exchange: record_transcript is a single-process tool (the privacy audit)")
    return spec


def _rank_aggregation(aggregation, options, kind: str, penalty, n_agents: int, share: str = "sums") -> None:
    """Refuse an adaptive penalty's aggregation that has no protocol across ranks: its three sums are
    an all-reduce (:func:`rank_lambda`), the ``plain`` aggregation's arithmetic, or under
    ``exchange="secagg"`` with ``share="sums"`` the masked sum
    (:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`, which ``aggregation="secagg"`` or
    ``"plain"`` accept); ``share="all"`` shares per-agent values (``"plain"`` only), and the
    ``quantized`` and ``paillier`` aggregations have no cross-rank protocol. ``None`` resolves as in
    one process (the exchange's kind)."""
    if penalty != "adaptive":
        return  # a fixed lambda needs no sums (one process ignores the aggregation too)
    if aggregation is not None and not isinstance(aggregation, str):
        raise ConfigError("aggregation: a run over ranks takes a kind name ('plain'), not an Aggregator object")
    resolved = aggregation if aggregation is not None else (
        kind if kind in AGGREGATION_KINDS and n_agents > 1 else "plain")
    masked = kind == "secagg" and share == "sums"
    if resolved != "plain" and not (masked and resolved == "secagg"):
        why = "" if aggregation is not None else f" (None takes the exchange's kind, {kind!r})"
        how = ("share='all' all-reduces per-agent values; share='sums' masks the ranks' sums under "
               "exchange='secagg'. " if kind == "secagg" and resolved == "secagg" else "")
        raise ConfigError(
            f"aggregation: {resolved!r}{why} has no protocol across ranks; the adaptive penalty's three sums "
            f"cross ranks in a plain all-reduce (share={share!r}). {how}Pass aggregation='plain' "
            "(fit_symnmf_agents with aggregation='plain' gives the same bits) or a fixed penalty")
    if options:
        raise ConfigError(f"aggregation_options: the plain all-reduce takes none, got {sorted(options)}")


class RankAgentsRun(AgentsRun):
    """:class:`~.agents_run.AgentsRun` on a rank's agents (slots of the rank's layout): the
    adaptive penalty's sums (:func:`rank_lambda`) and the metrics (:func:`_rank_metrics`) cross the
    ranks, and a checkpoint holds the rank's own slots."""

    def __init__(self, setup: AgentsSetup, state: AgentsState, *, settings: dict, inputs, layout: RankLayout,
                 comm: Comm, share: str, sums=None):
        super().__init__(setup, state, settings=settings, inputs=inputs)
        self.lay, self.comm, self.share = layout, comm, share
        self.sums = sums if sums is not None else PlainSums(comm)
        self._slots = layout.slots.to(state.Xc.device)

    def update_lambda(self, k: int) -> torch.Tensor:
        st = self.st
        return rank_lambda(st.lam, gather_rows(st.Xc, self.s.idx), st.V, self.lay, self.comm, share=self.share,
                           what=f"the adaptive penalty of outer iteration {k}", sums=self.sums)

    def stationarity_sums(self, terms: torch.Tensor, k: int) -> torch.Tensor:
        """The stationarity residual's two sums over every rank's agents, ``(1, 2)``, the same on every
        rank: under ``share="all"`` (and not masked) a ``(N, 2)`` table of the agents' terms, summed in
        the single process's order (its bits); otherwise the ranks' partial sums through the run's
        metric sums (masked under ``exchange="secagg"``: only the totals revealed)."""
        mine, what = terms[0, self._slots], f"the stationarity residual of outer iteration {k}"
        if self.share == "all" and not self.sums.masked:
            table = mine.new_zeros(self.lay.n_agents, 2)
            table[self.lay.agents.to(mine.device)] = mine
            return self.comm.all_reduce(table, category="metrics", what=what).to(mine.device)[None].sum(1)
        return self.sums.all_reduce(mine.sum(0), category="metrics", what=what, split=(1, 1)).to(mine.device)[None]

    def metrics(self, k: int) -> tuple:
        return _rank_metrics(self.s.Z, self.st, self.s.idx, self.lay, self.comm, self.s.x_norm2, k, self.sums)

    def not_converged(self, k: int, tol: float) -> str:
        return (f"fit_symnmf_rank: the stationarity residual and the consensus error did not both reach tol={tol} "
                f"in {k} outer iterations")

    def slots(self, t: torch.Tensor) -> torch.Tensor:
        return t[0, self._slots]

    def load_state(self, tensors: dict, extra: dict) -> None:
        """The checkpoint's variables into the rank's own slots (the free slots keep the start)."""
        st, dev = self.st, self.st.Xc.device
        for key in STATE_NAMES:
            getattr(st, key)[0, self._slots] = tensors[key].to(dev)
        st.g, st.lam = tensors["g"].to(dev), tensors["lam"].to(dev)
        if "mu" in tensors:
            st.mu = torch.ones((1, st.Xc.shape[1], 1, 1), dtype=st.Xc.dtype, device=dev)
            st.mu[0, self._slots] = tensors["mu"].to(dev)
        self.plain_bytes = int(extra["plain_bytes"])


def initial_rank_state(U0: torch.Tensor, idx_loc: torch.Tensor, layout: RankLayout, seed: int,
                       g0: torch.Tensor, lam: torch.Tensor, start: str = "private",
                       start_seed: int | None = None) -> AgentsState:
    """The rank's start, the single process's (:func:`~.agents.fit_symnmf_agents`) for the rank's
    agents: every copy ``U_0``, ``P = Q = Q_prev = 0``, and ``V_i`` as ``start`` says: agent
    ``layout.agents[j]``'s own private draw (:func:`~.agents.private_start`: its own CSPRNG seed,
    or ``start_seed``'s stream for a reproducible simulation) in slot ``layout.slots[j]``, or
    ``U_0[S_i]`` (``"common"``);
    ``(1, n_slots, ...)``. Free slots keep zero rows.

    Parameters
    ----------
    U0 : Tensor (n, r)
    idx_loc : LongTensor (1, n_slots, m)
        ``S_i`` of each slot's agent, padded with ``n`` (free slots: all ``n``).
    layout : RankLayout
    seed : int
    g0 : Tensor (D,)
        The penalties' start (:meth:`~ppdnmf_torch.penalties.PenaltySampler.initial`).
    lam : Tensor (1,)
    """
    S = idx_loc.shape[1]
    copies = U0[None, None].expand(1, S, *U0.shape).clone()
    zeros = torch.zeros_like(copies)
    if start == "private":
        slots = layout.slots.to(idx_loc.device)
        V = torch.zeros((1, S, idx_loc.shape[-1], U0.shape[-1]), dtype=U0.dtype, device=U0.device)
        V[0, slots] = private_start(U0[None], idx_loc[:, slots], start_seeds(start_seed, 1),
                                    agents=layout.agents.tolist())[0]
    else:
        V = gather_rows(copies, idx_loc)
    return AgentsState(Xc=copies, U=copies.clone(), P=zeros, Q=zeros.clone(), Q_prev=zeros.clone(), V=V, g=g0, lam=lam)


@with_threads
def fit_symnmf_rank(comm: Comm, X, rank: int, *, n_agents: int = AGENTS.n_agents, graph=None, parts=None,
                    exchange=AGENTS.exchange, exchange_options: dict | None = None, penalty=AGENTS.penalty,
                    lam0: float = AGENTS.lam0, mu=AGENTS.mu, g_cap=AGENTS.g_cap,
                    penalty_mode: str = AGENTS.penalty_mode, x_iters: int = AGENTS.x_iters,
                    y_iters: int = AGENTS.y_iters, max_iter: int = AGENTS.max_iter, tol: float = AGENTS.tol, U0=None,
                    seed: int = RUN.seed, dtype=None, min_degree: int | None = AGENTS.min_degree,
                    penalty_schedule: str = AGENTS.penalty_schedule, aggregation=AGENTS.aggregation,
                    aggregation_options: dict | None = None, checkpoint_dir=None,
                    checkpoint_every: int = RUN.checkpoint_every, resume: bool = False, start: str = AGENTS.start,
                    start_seed: int | None = AGENTS.start_seed, partition=RANKS.partition, assignment=None,
                    share: str = RANKS.share, callback=None, threads=None) -> SymRankResult:
    """:func:`~.agents.fit_symnmf_agents` (one trial) on this rank's agents; every rank of ``comm``
    calls it with the same arguments (checked: ranks that disagree stop with a
    :class:`~ppdnmf_torch.distributed.DistributedError`).

    Parameters
    ----------
    comm : Comm
    X : array-like, Tensor, scipy.sparse or torch sparse (n, n)
        The similarity matrix (:func:`~.operator.as_similarity`); the rank keeps its agents'
        columns ``X[:, S_i]`` only: dense, or sparse (block-diagonal CSR,
        :class:`~.agent_columns.SparseColumns`) for a sparse ``X``, never made dense.
    rank, n_agents, graph, parts, penalty, lam0, mu, g_cap, penalty_mode, penalty_schedule,
    x_iters, y_iters, max_iter, tol, U0, seed, start, start_seed
        As :func:`~.agents.fit_symnmf_agents` (``graph``: one :class:`~ppdnmf_torch.graph.Graph`;
        ``parts (N, m)`` or ``(1, N, m)``; ``U0 (n, r)``; ``g_cap`` a number or ``(N,)``;
        ``penalty_schedule="agreed"`` by default: every rank draws the common penalties from the
        trial's one generator); also ``dtype`` and ``min_degree``.
    exchange, exchange_options
        ``plain``, ``quantized`` (the halo) or ``paillier`` (its fast path, :class:`SecureHalo`),
        with the options of :func:`~ppdnmf_torch.exchange.make_exchange`.
    aggregation, aggregation_options
        With an adaptive penalty ``"plain"`` (:func:`rank_lambda`'s all-reduce is its
        arithmetic), or under ``exchange="secagg"`` with ``share="sums"`` also ``"secagg"`` (the
        masked all-reduce, whatever the name): ``None`` resolves as in one process, to the
        exchange's kind, so a ``quantized`` or ``paillier`` exchange (or ``secagg`` with
        ``share="all"``) needs ``aggregation="plain"``; anything else raises
        :class:`~ppdnmf_torch.errors.ConfigError`. Unused with a fixed ``penalty``.
    checkpoint_dir : path, optional
        Per-rank checkpoints in ``checkpoint_dir/rank<r>/`` (every ``checkpoint_every`` outer
        iterations and at the end), ``partition.json`` beside them (see the module): this rank's
        agents' variables only, no key, mask seed or private value of the exchange.
    checkpoint_every : int
        0: only at the end.
    resume : bool
        Continue from the newest outer iteration every rank has a checkpoint of (the same
        problem, settings, world size and partition; ``max_iter`` may differ), bit for bit; no
        checkpoint on any rank: a fresh start. Another run's checkpoints, or another world size
        or partition, raise :class:`~ppdnmf_torch.checkpoint.CheckpointError` (naming what differs).
    partition : {"rcm", "block"} or Partition
        Which rank holds which agent (:func:`~ppdnmf_torch.distributed.partition_agents`).
    assignment : sequence of N ints, optional
        The rank of every agent (overrides ``partition``).
    share : {"all", "sums"}
        What crosses ranks for the adaptive penalty (:func:`rank_lambda`): per-agent scalars
        (the single-process bits) or per-rank sums.
    callback : callable, optional
        ``callback(k, metrics)`` on every rank after outer iteration ``k`` (the history's newest
        entries, the same on every rank); the run stops after an iteration where any rank's
        returns a true value.
    threads : int, optional
        Torch threads of this rank (:func:`~ppdnmf_torch.threads.using_threads`).

    Returns
    -------
    SymRankResult
    """
    check_call(locals(), AGENTS, RANKS, RUN,
               skip=("exchange", "g_cap", "aggregation", "partition", "checkpoint_every"),
               also={"comm": Comm, "parts": ARRAY, "U0": ARRAY, "assignment": ARRAY, "callback": CALLBACK,
                     "exchange_options": OPTIONS, "aggregation_options": OPTIONS})
    if share not in SHARE_MODES:
        raise ConfigError(f"share: must be one of {SHARE_MODES}, got {share!r}")
    mu = check_settings(mu=mu, tol=tol, penalty=penalty, penalty_schedule=penalty_schedule, penalty_mode=penalty_mode,
                        start=start, rank=rank, n_agents=n_agents, x_iters=x_iters, y_iters=y_iters, max_iter=max_iter)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    sim = as_similarity(X, device=comm.device, dtype=dtype)
    if sim.batched:
        raise DataError("X: one (n, n) similarity matrix; a run over ranks is one trial")
    N, r, seeds = int(n_agents), int(rank), [int(seed)]
    g = agent_graphs(graph, N, 1, seeds)[0]
    check_min_degree(g, min_degree)
    caps = agent_caps(g_cap, 1, N, comm.device)
    check_shared_caps(caps, penalty_schedule)
    idx = node_parts(parts, sim.n, N, seeds)
    U0 = common_start(U0, sim.n, r, seeds, comm.device, sim.dtype)[0]
    spec = _spec(exchange, exchange_options)
    _rank_aggregation(aggregation, aggregation_options, spec.kind, penalty, N, share)
    part = partition if isinstance(partition, Partition) else partition_agents(g, comm.world_size, partition,
                                                                               assignment)
    if part.world_size != comm.world_size or part.n_agents != N:
        raise ConfigError(f"partition: made for {part.world_size} ranks and {part.n_agents} agents, the run has "
                          f"{comm.world_size} ranks and {N} agents")
    o = dict(mu=mu, penalty=penalty, lam0=lam0, x_iters=int(x_iters), y_iters=int(y_iters), tol=float(tol),
             penalty_mode=penalty_mode, penalty_schedule=penalty_schedule, start=start, start_seed=start_seed)
    settings = dict(settings_of(o, r, sim.dtype), seeds=seeds, g_cap=caps.tolist(), share=share,
                    world_size=part.world_size, owner=list(part.owner), process=comm.rank)
    sim_digest = sim.digest()
    common = {k: v for k, v in settings.items() if k != "process"}
    site = getattr(sim, "site", None)  # a site's own columns (:class:`.site.SiteColumns`)
    with Resources() as res:  # the sums of "metrics" across ranks: masked under exchange="secagg"
        sums = res.own(rank_sums(comm, spec.kind))
        if site is not None:  # the public description, field by field; ||X||^2 summed over the sites
            site.agree(comm, dict(common, max_iter=int(max_iter), exchange=repr(spec), lam0=float(lam0),
                                  parts=digest(idx), graph=digest(g.src, g.dst), n=sim.n), sums=sums)
        else:
            _agree_problem(comm, _digest(sim_digest, g, idx, U0, dict(common, max_iter=int(max_iter), spec=repr(spec),
                                                                      lam0=float(lam0))))
        inputs = {"X": sim_digest, "U0": digest(U0), "parts": digest(idx), "graph": digest(g.src, g.dst)}
        coordinator = RankCoordinator(comm, part.summary())
        run = _rank_run(comm, sim, idx, U0, g, caps, part, spec, o, res, settings=settings, inputs=inputs,
                        share=share, sums=sums)
        del sim, X  # the rank keeps its agents' columns only
        exch = run.s.exchange
        ledgers = Ledgers(exchange=exch)
        plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume)
        out = drive(run, max_iter=int(max_iter), tol=tol, callback=callback, checkpoints=plan, ledgers=ledgers,
                    ranks=coordinator)
        costs = agents_costs(run, ledgers)
    return _rank_result(comm, run, out, costs, part, idx, site=site is not None)


def _agree_problem(comm: Comm, mine: str) -> None:
    """Every rank's digest of the problem (:func:`_digest`) equals rank 0's."""
    digests = comm.all_gather_object(mine, category="setup", what="the check that every rank runs the same problem")
    odd = [q for q, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise DistributedError(f"ranks {odd} run another problem than rank 0 (similarity, graph, parts, start or "
                               "settings differ): give every rank the same inputs")


def _rank_run(comm: Comm, sim, idx, U0, g, caps, part: Partition, spec, o: dict, res: Resources, *, settings: dict,
              inputs: dict, share: str, sums=None) -> RankAgentsRun:
    """The model of this rank's run: the rank's layout and agents' columns, its halo exchange (bound),
    its penalties and its start."""
    n, r, dev, dt = sim.n, U0.shape[-1], comm.device, sim.dtype
    m = idx.shape[-1]
    itemsize = sim.data.element_size()
    # every per-agent block the solver hands to BLAS/LAPACK: Z_i, the copies, V_i, V_i^T V_i
    lay = RankLayout.build(part, g, comm.rank, period=block_period((n * m, n * r, m * r, r * r), itemsize))
    S = lay.n_slots
    slots = lay.slots.to(dev)
    # the rank's agents' columns in their slots; free slots: no data, no nodes, no edges
    idx_loc = torch.full((1, S, m), n, dtype=torch.long, device=dev)
    idx_loc[0, slots] = idx[0, lay.agents].to(dev)
    Z = agent_columns(sim, idx_loc)  # (1, S, n, m) dense, or SparseColumns
    mask = torch.zeros((1, S, n + 1), dtype=dt, device=dev).scatter_(-1, idx_loc, 1.0)[..., :n, None]
    slot_caps = torch.full((S,), float(caps[0, 0]), dtype=torch.float64, device=dev)
    slot_caps[slots] = caps[0, lay.agents.to(dev)]
    exch = res.own(SecureHalo(spec, lay, comm, g, part.owner, caps[0].cpu()) if spec.kind == "paillier"
                   else HaloExchange(spec, lay, comm))
    warn_degree_one(exch, [g])
    warn_sum_leak(exch, o["penalty_schedule"], caps, [g.degree])
    exch.bind(lay.local_topology(g), dtype=dt, device=dev)  # the halo binds the layout's own
    sampler = RankSampler(slot_caps, lay.edge_src(g).to(dev), lay.edge_ids, g.src.numel(), int(settings["seeds"][0]),
                          o["penalty_mode"], o["x_iters"], shared=o["penalty_schedule"] == "agreed")
    adaptive = o["penalty"] == "adaptive"
    lam = torch.full((1,), float(o["lam0"] if adaptive else o["penalty"]), dtype=dt, device=dev)
    st = initial_rank_state(U0, idx_loc, lay, int(settings["seeds"][0]), sampler.initial(), lam, o["start"],
                            o["start_seed"])
    setup = AgentsSetup(Z=Z, idx=idx_loc, mask=mask, n=n, x_norm2=sim.sq_norm.reshape(1), sim=None, mu=o["mu"],
                        x_iters=o["x_iters"], y_iters=o["y_iters"], adaptive=adaptive, tol=o["tol"], sampler=sampler,
                        exchange=exch, aggregator=None, plain_bytes=g.src.numel() * n * r * itemsize * o["x_iters"])
    return RankAgentsRun(setup, st, settings=settings, inputs=lambda: inputs, layout=lay, comm=comm,
                         share=share, sums=sums)


def _rank_result(comm: Comm, run: RankAgentsRun, out, costs: dict, part: Partition, idx,
                 site: bool = False) -> SymRankResult:
    """Rank 0 gathers every agent's copy and ``V_i`` into the single process's result (evaluation
    only); every rank keeps its own agents' and the ranks' summaries. A site gathers nothing: its
    own agents' and the history."""
    st, lay, slots = run.st, run.lay, run._slots
    if site:
        own = {"agents": lay.agents.tolist(), "U": st.Xc[0, slots].clone(), "V": st.V[0, slots].clone(),
               "parts": run.s.idx[0, slots].clone()}
        history = {key: [v.numpy() if isinstance(v, torch.Tensor) else v for v in out.history.get(key, [])]
                   for key in HISTORY_KEYS}
        return SymRankResult(None, part, [dict(lay.summary(), sent=dict(comm.sent))], own, history)
    gathered = {name: gather_agents(comm, lay, t, part.counts(), part.agents, what=f"the output gather of {name}")
                for name, t in (("U", st.Xc), ("V", st.V))}
    own = {"agents": lay.agents.tolist(), "U": st.Xc[0, slots].clone(), "V": st.V[0, slots].clone(),
           "parts": run.s.idx[0, slots].clone()}
    mine = dict(lay.summary(), sent=dict(comm.sent))
    ranks = comm.all_gather_object(mine, what="the ranks' summaries")
    result = None
    if comm.rank == 0:
        result = agents_result(run, out, costs, gathered["U"], gathered["V"], idx.to(st.Xc.device))
    return SymRankResult(result, part, ranks if comm.rank == 0 else [mine], own)


def _rank_main(X, rank, kwargs: dict, comm_options: dict):
    """One local rank of :func:`fit_symnmf_distributed` (module level: the spawned process imports it)."""
    with Comm.connect("env://", backend="gloo", device="cpu", **comm_options) as comm:
        out = fit_symnmf_rank(comm, X, rank, **kwargs)
        return out.result if comm.rank == 0 else None


def fit_symnmf_distributed(X, rank: int, world_size: int = 2, *, timeout: float | None = None,
                           comm_timeout: float = 300.0, **kwargs) -> AgentsResult:
    """:func:`fit_symnmf_rank` on ``world_size`` local processes (``gloo`` on ``127.0.0.1``,
    :func:`~ppdnmf_torch.distributed.launch_local`): the same :class:`~.agents.AgentsResult` as
    :func:`~.agents.fit_symnmf_agents` (one trial; with ``share="all"``, the default, the same
    factors and ``lambda`` bit for bit under the same settings, the defaults included: a secure
    exchange with an adaptive penalty needs ``aggregation="plain"`` on both sides).

    Parameters
    ----------
    X : array-like, Tensor or scipy.sparse (n, n)
        Sent to every rank, which keeps its agents' columns.
    rank : int
    world_size : int
        Local ranks (at most ``n_agents``).
    timeout : float, optional
        Seconds for the whole run (the launcher ends the ranks after it).
    comm_timeout : float
        Seconds a rank waits for a message.
    **kwargs
        :func:`fit_symnmf_rank`'s (``callback`` must be importable: a module-level function).

    Raises
    ------
    DistributedError
        When a rank fails (the failing rank's message, not its peers' that stopped after it).
    """
    check_local_ranks(world_size, int(kwargs.get("n_agents", 10)))
    if isinstance(X, torch.Tensor):
        X = X.detach().cpu()
    outs = launch_local(world_size, _rank_main, (X, rank, dict(kwargs), {"timeout": comm_timeout}), timeout=timeout)
    failed = [o for o in outs if o.error is not None or o.exitcode != 0]
    if failed:
        # the cause first: a rank that stopped because another failed exits with EXIT_PEER_FAILED
        first = min(failed, key=lambda o: (o.exitcode == EXIT_PEER_FAILED, o.error is None, o.rank))
        raise DistributedError(f"rank {first.rank} failed (exit code {first.exitcode}): {first.error}",
                               failed_rank=first.rank)
    return outs[0].value
