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
  then agree with one process to rounding, not bit for bit.
  Both are the ``plain`` aggregation's arithmetic, and neither is a protected sum: one process's
  secure aggregations (``aggregation="quantized"``, ``"paillier"``, and ``None``'s default for
  those exchanges) have no cross-rank protocol here and are refused
  (:class:`~ppdnmf_torch.errors.ConfigError`; ``aggregation="plain"`` or a fixed ``penalty``).

A sparse ``X`` stays sparse (:func:`~.agent_columns.agent_columns` over the rank's slots).
The rank's start comes from one function, :func:`initial_rank_state`.

Checkpoints are per rank, ``<checkpoint_dir>/rank<r>/`` (:mod:`.checkpoint`'s files and checks:
``symnmf_it<k>.pt``, written atomically, a content hash, a fingerprint), with ``partition.json``
beside them (rank 0's), as PPDNMF's engine lays them out. A rank writes its own agents' variables
only (their slots of the copies, duals and ``V_i``, and ``mu_i``), the penalty draws of its edges
and its generators' states, its cost counters, and what every rank has alike (``lambda``, the
history, the last mean copy); no key, mask seed or private value of the exchange (rebuilt on
resume, with new keys and seeds). A resumed run (the same world size and partition: checked
against ``partition.json`` and each checkpoint's fingerprint) continues from the newest outer
iteration every rank has a checkpoint of, bit for bit: the factors equal an uninterrupted run's,
and the single process's under ``share="all"``.

The history's metrics (``E``, ``objective``, ``uv_dist``, ``consensus``) come from per-rank
sums: the agents' mean copy ``Ubar`` is an all-reduce of each rank's sum of copies
``(n, r)``, then one all-reduce of three per-rank scalar sums (``sum_i <X_i^T Ubar, Ubar[S_i]>``,
``sum_i <X_i^T Ubar, V_i>``, ``||Ubar - V||^2`` over the rank's agents) with the rank's
``sum_i V_i^T V_i`` ``(r, r)``, the fits by :mod:`.objective`'s expansion from ``||X||^2`` (taken
before the rank drops the other columns), and one all-reduce of the largest ``||U_i - Ubar||``.
They equal one process's to rounding (not bit for bit; the metrics do not feed the iterates).
The stopping rule (``tol``) uses the same ``Ubar`` on every rank (one all-reduce decides); a
relative change within rounding of ``tol`` could stop one iteration apart from one process. At
the end rank 0 gathers every agent's copy and ``V_i`` (evaluation only, as the single-process
result assembles them) into the same :class:`~.agents.AgentsResult`.

One trial per run (the engine's layout is one trial's); ``trials`` batches belong to the
single process.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from ..._utils import derive_seed
from ...checkpoint import write_atomically
from ...distributed.comm import EXIT_PEER_FAILED, Comm, DistributedError
from ...distributed.halo import HALO_KINDS, HaloExchange, RankSampler
from ...distributed.launch import check_local_ranks, launch_local
from ...distributed.layout import RankLayout, block_period, gather_agents
from ...distributed.partition import Partition, partition_agents
from ...distributed.secure import SecureHalo
from ...errors import ConfigError, ConvergenceWarning, DataError
from ...exchange import Exchange
from ...exchange.aggregation import AGGREGATION_KINDS
from ...exchange.spec import exchange_spec
from ...graph import check_min_degree
from ...penalties import check_shared_caps
from ...threads import with_threads
from . import checkpoint as ckpt
from .agent_columns import agent_columns, local_t_product
from .config import AGENTS, RANKS, RUN, SHARE_MODES
from .agents import (AgentsResult, _caps, _check_settings, _gather_rows, _graphs, _history_lists,
                     _history_tensors, _scatter_rows, _State, _warn_degree_one, _warn_sum_leak, lambda_from_sums,
                     lambda_terms, partition_nodes, private_start, _start_seeds, x_step, y_step)
from .operator import as_similarity

__all__ = ["SHARE_MODES", "SymRankResult", "fit_symnmf_rank", "fit_symnmf_distributed", "rank_lambda",
           "initial_rank_state"]

#: what crosses ranks for the adaptive penalty (:func:`rank_lambda`)

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
    """

    result: AgentsResult | None
    partition: Partition
    ranks: list = field(default_factory=list)
    own: dict = field(default_factory=dict)


def rank_lambda(lam: torch.Tensor, U_own: torch.Tensor, V: torch.Tensor, layout: RankLayout, comm: Comm, *,
                share: str, what: str) -> torch.Tensor:
    """Eq. (20) over every rank's agents: ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` from this
    rank's ``U_own = U_i[S_i]`` and ``V_i``, ``(1, n_slots, m, r)`` each; ``(1,)``, the same on
    every rank (see the module: ``share="all"`` sums the agents in the single-process order,
    ``"sums"`` adds the ranks' partial sums)."""
    slots = layout.slots.to(U_own.device)
    terms = lambda_terms(U_own, V)[0, slots]  # (n_own, 3)
    if share == "all":
        table = terms.new_zeros(layout.n_agents, 3)
        table[layout.agents.to(terms.device)] = terms
        sums = comm.all_reduce(table, category="metrics", what=what).to(terms.device)[None].sum(1)
    else:
        sums = comm.all_reduce(terms.sum(0), category="metrics", what=what).to(terms.device)[None]
    return lambda_from_sums(lam, sums)


def _rank_metrics(Z, st: _State, idx, layout: RankLayout, comm: Comm, x_norm2, k: int):
    """The history's ``E``, ``objective``, ``uv_dist``, ``consensus`` of outer iteration ``k`` from
    per-rank sums, and ``Ubar (1, n, r)`` (module docstring); every value the same on every rank.

    As :mod:`.objective` (``||X - U W^T||^2 = ||X||^2 - 2 <X W, U> + <U^T U, W^T W>``), summed over
    the agents' column blocks: ``<X W, Ubar> = sum_i <X_i^T Ubar, W_i>`` and
    ``W^T W = sum_i W_i^T W_i`` with ``W_i`` = ``Ubar[S_i]`` or ``V_i``; a sparse ``X_i`` stays
    sparse."""
    slots = layout.slots.to(st.Xc.device)
    N = layout.n_agents
    Ubar = comm.all_reduce(st.Xc[0, slots].sum(0), category="metrics",
                           what=f"the mean copy of outer iteration {k}").to(st.Xc.device)[None] / N
    XtU = local_t_product(Z, Ubar[:, None].expand_as(st.Xc))[:, slots]  # X_i^T Ubar, (1, n_own, m, r)
    Xc, Vo, io = st.Xc[:, slots], st.V[:, slots], idx[:, slots]
    Urows = _gather_rows(Ubar[:, None].expand_as(Xc), io)  # Ubar[S_i], zero on padding
    r = Vo.shape[-1]
    local = torch.cat([torch.stack([(XtU * Urows).sum(), (XtU * Vo).sum(), (Urows - Vo).square().sum()]),
                       (Vo.mT @ Vo).sum(dim=(0, 1)).reshape(-1)])  # and this rank's share of V^T V
    sums = comm.all_reduce(local, category="metrics", what=f"the metrics of outer iteration {k}").to(Xc.device)
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


def _rank_aggregation(aggregation, options, kind: str, penalty, n_agents: int) -> None:
    """Refuse an adaptive penalty's aggregation other than ``plain``: across ranks its three sums are
    an all-reduce (:func:`rank_lambda`), which is the ``plain`` aggregation's arithmetic; the
    secure kinds have no cross-rank protocol here. ``None`` resolves as in one process (the
    exchange's kind), so a secure exchange with an adaptive penalty needs ``aggregation="plain"``."""
    if penalty != "adaptive":
        return  # a fixed lambda needs no sums (one process ignores the aggregation too)
    if aggregation is not None and not isinstance(aggregation, str):
        raise ConfigError("aggregation: a run over ranks takes a kind name ('plain'), not an Aggregator object")
    resolved = aggregation if aggregation is not None else (
        kind if kind in AGGREGATION_KINDS and n_agents > 1 else "plain")
    if resolved != "plain":
        why = "" if aggregation is not None else f" (None takes the exchange's kind, {kind!r})"
        raise ConfigError(
            f"aggregation: {resolved!r}{why} has no protocol across ranks; the adaptive penalty's three sums "
            "cross ranks in a plain all-reduce (share=). Pass aggregation='plain' (fit_symnmf_agents with "
            "aggregation='plain' gives the same bits) or a fixed penalty")
    if options:
        raise ConfigError(f"aggregation_options: the plain all-reduce takes none, got {sorted(options)}")


#: the agents' variables a rank's checkpoint holds, its own slots only (``mu`` too, once set)
_SLOT_STATE = ("Xc", "U", "P", "Q", "Q_prev", "V")


def _rank_dir(checkpoint_dir, rank: int) -> str:
    return os.path.join(os.fspath(checkpoint_dir), f"rank{rank:03d}")


def _rank_fingerprint(sim_digest: str, graph, idx, U0, caps, params: dict, codec, part: Partition, rank: int) -> str:
    """What fixes a rank's numbers: the data, the start, the parts, the graph, the caps, the settings
    (``max_iter`` aside: a resumed run may run longer), the exchange's arithmetic (``plain`` or the
    integer codec's: ``quantized`` and ``paillier`` resume each other), this rank and the partition."""
    settings = {key: v for key, v in params.items() if key not in ("max_iter", "spec", "owner")}
    arith = None if codec is None else (float(codec.n_max), int(codec.g_bits))
    return ckpt.digest("symnmf-rank", sim_digest, U0, idx, graph.src, graph.dst, caps, settings, arith, int(rank),
                       part.world_size, list(part.owner))


def _resume_body(comm: Comm, checkpoint_dir, part: Partition, fingerprint: str) -> dict | None:
    """The checkpoint of the newest outer iteration every rank has (None when no rank has one: a
    fresh start, as one process's ``resume``), after the checks. A failed check on any rank stops
    every rank with that rank's reason (:class:`~.checkpoint.SymNMFCheckpointError`), also where
    the ranks see different folders (``partition.json`` on rank 0's machine only, say)."""
    where = os.fspath(checkpoint_dir)
    meta = os.path.join(where, "partition.json")
    why = None
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8") as fh:
            saved = json.load(fh)
        if saved.get("world_size") != part.world_size or list(saved.get("owner", [])) != list(part.owner):
            why = (f"resume: the checkpoints in {where!r} were written by {saved.get('world_size')} ranks with the "
                   f"owners {saved.get('owner')}; this run has {part.world_size} ranks with the owners "
                   f"{list(part.owner)}. Resume with the same world size and partition (each rank holds its own "
                   "agents' state)")
    _agree_or_raise(comm, why)
    every = comm.all_gather_object(ckpt.iterations(_rank_dir(where, comm.rank)), category="setup",
                                   what="the checkpoints' outer iterations")
    if not any(every):
        return None
    common = set(every[0]).intersection(*map(set, every[1:]))
    if not common:
        raise ckpt.SymNMFCheckpointError(f"resume: no outer iteration has a checkpoint on every rank in {where!r} "
                                         f"(the ranks have {every})")
    body, why = None, None
    try:
        body = ckpt.load(ckpt.checkpoint_path(_rank_dir(where, comm.rank), max(common)), fingerprint)
    except ckpt.SymNMFCheckpointError as exc:
        why = str(exc)
    _agree_or_raise(comm, why)
    return body


def _agree_or_raise(comm: Comm, why: str | None) -> None:
    """Every rank's check: the first failing rank's reason on every rank, or nothing."""
    whys = comm.all_gather_object(why, category="setup", what="the checkpoints' checks")
    bad = [(q, w) for q, w in enumerate(whys) if w is not None]
    if bad:
        raise ckpt.SymNMFCheckpointError(f"rank {bad[0][0]}: {bad[0][1]}")


def _restore(st: _State, body: dict, slots: torch.Tensor) -> None:
    """A checkpoint's variables into the rank's own slots of ``st`` (the free slots keep the start)."""
    saved = body["state"]
    dev = st.Xc.device
    for key in _SLOT_STATE:
        getattr(st, key)[0, slots] = saved[key].to(dev)
    st.g, st.lam = saved["g"].to(dev), saved["lam"].to(dev)
    if "mu" in saved:
        st.mu = torch.ones((1, st.Xc.shape[1], 1, 1), dtype=st.Xc.dtype, device=dev)
        st.mu[0, slots] = saved["mu"].to(dev)


def initial_rank_state(U0: torch.Tensor, idx_loc: torch.Tensor, layout: RankLayout, seed: int,
                       g0: torch.Tensor, lam: torch.Tensor, start: str = "private",
                       start_seed: int | None = None) -> _State:
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
        V[0, slots] = private_start(U0[None], idx_loc[:, slots], _start_seeds(start_seed, 1),
                                    agents=layout.agents.tolist())[0]
    else:
        V = _gather_rows(copies, idx_loc)
    return _State(Xc=copies, U=copies.clone(), P=zeros, Q=zeros.clone(), Q_prev=zeros.clone(), V=V, g=g0, lam=lam)


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
        Only ``"plain"`` with an adaptive penalty (:func:`rank_lambda`'s all-reduce is its
        arithmetic): ``None`` resolves as in one process, to the exchange's kind, so a
        ``quantized`` or ``paillier`` exchange needs ``aggregation="plain"``; anything else raises
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
        or partition, raise :class:`~.checkpoint.SymNMFCheckpointError`.
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
    if share not in SHARE_MODES:
        raise ConfigError(f"share: must be one of {SHARE_MODES}, got {share!r}")
    mu = _check_settings(mu=mu, tol=tol, penalty=penalty, penalty_schedule=penalty_schedule,
                         penalty_mode=penalty_mode, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                         resume=resume, start=start, rank=rank, n_agents=n_agents, x_iters=x_iters,
                         y_iters=y_iters, max_iter=max_iter)
    dev = comm.device
    sim = as_similarity(X, device=dev, dtype=dtype)
    if sim.batched:
        raise DataError("X: one (n, n) similarity matrix; a run over ranks is one trial")
    n, dt = sim.n, sim.dtype
    N, r = int(n_agents), int(rank)
    g = _graphs(graph, N, 1, [int(seed)])[0]
    check_min_degree(g, min_degree)
    caps = _caps(g_cap, 1, N, dev)
    check_shared_caps(caps, penalty_schedule)
    idx = partition_nodes(n, N, [int(seed)]) if parts is None else torch.as_tensor(parts, dtype=torch.long)
    idx = idx[None] if idx.dim() == 2 else idx
    if idx.shape[:2] != (1, N):
        raise ConfigError(f"parts: expected shape (n_agents, m) = ({N}, m), got {tuple(idx.shape)}")
    hits = torch.bincount(idx.reshape(-1).clamp(0, n), minlength=n + 1)
    if bool((hits[:n] != 1).any()) or bool((idx < 0).any()) or bool((idx > n).any()):
        raise ConfigError("parts: the parts must cover every node exactly once")
    if U0 is None:
        U0 = torch.rand((n, r), generator=torch.Generator().manual_seed(derive_seed(int(seed), "symnmf_agents_init")),
                        dtype=torch.float64)
    U0 = torch.as_tensor(np.asarray(U0) if not isinstance(U0, torch.Tensor) else U0).to(dev, dt)
    U0 = U0[0] if U0.dim() == 3 and U0.shape[0] == 1 else U0
    if U0.shape != (n, r) or bool((U0 < 0).any()):
        raise DataError(f"U0: expected a nonnegative ({n}, {r}) matrix, got {tuple(U0.shape)}")
    spec = _spec(exchange, exchange_options)
    _rank_aggregation(aggregation, aggregation_options, spec.kind, penalty, N)
    part = partition if isinstance(partition, Partition) else partition_agents(g, comm.world_size, partition,
                                                                               assignment)
    if part.world_size != comm.world_size or part.n_agents != N:
        raise ConfigError(f"partition: made for {part.world_size} ranks and {part.n_agents} agents, the run has "
                          f"{comm.world_size} ranks and {N} agents")
    params = dict(rank=r, penalty=penalty, lam0=float(lam0), mu=mu, caps=caps.tolist(), penalty_mode=penalty_mode,
                  penalty_schedule=penalty_schedule, start=start, x_iters=int(x_iters), y_iters=int(y_iters),
                  max_iter=int(max_iter), tol=float(tol), seed=int(seed), spec=repr(spec), owner=part.owner,
                  share=share, dtype=str(dt))
    sim_digest = sim.digest()
    digests = comm.all_gather_object(_digest(sim_digest, g, idx, U0, params), category="setup",
                                     what="the check that every rank runs the same problem")
    odd = [q for q, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise DistributedError(f"ranks {odd} run another problem than rank 0 (similarity, graph, parts, start or "
                               "settings differ): give every rank the same inputs")
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
    x_norm2 = sim.sq_norm.reshape(1)
    del sim, X  # the rank keeps its agents' columns only
    mask = torch.zeros((1, S, n + 1), dtype=dt, device=dev).scatter_(-1, idx_loc, 1.0)[..., :n, None]
    slot_caps = torch.full((S,), float(caps[0, 0]), dtype=torch.float64, device=dev)
    slot_caps[slots] = caps[0, lay.agents.to(dev)]
    exch = (SecureHalo(spec, lay, comm, g, part.owner, caps[0].cpu()) if spec.kind == "paillier"
            else HaloExchange(spec, lay, comm))
    _warn_degree_one(exch, [g])
    _warn_sum_leak(exch, penalty_schedule, caps, [g])
    try:
        exch.bind(lay.local_topology(g), dtype=dt, device=dev)  # the halo binds the layout's own
        sampler = RankSampler(slot_caps, lay.edge_src(g).to(dev), lay.edge_ids, g.src.numel(), int(seed),
                              penalty_mode, int(x_iters), shared=penalty_schedule == "agreed")
        lam = torch.full((1,), float(lam0 if penalty == "adaptive" else penalty), dtype=dt, device=dev)
        st = initial_rank_state(U0, idx_loc, lay, int(seed), sampler.initial(), lam, start, start_seed)
        history = {key: [] for key in ("E", "objective", "uv_dist", "consensus", "lambda", "time", "bytes")}
        plain_bytes, elapsed, U_prev, converged, stopped, k = 0, 0.0, U0[None], False, False, 0
        body = fp = None
        if checkpoint_dir is not None:
            fp = _rank_fingerprint(sim_digest, g, idx, U0, caps, params, exch.codec, part, comm.rank)
            if resume:
                body = _resume_body(comm, checkpoint_dir, part, fp)
            if comm.rank == 0:
                write_atomically(os.path.join(os.fspath(checkpoint_dir), "partition.json"),
                                 lambda fh: json.dump(part.summary(), fh), binary=False)
        if body is not None:
            _restore(st, body, slots)
            sampler.load_state_dict(body["sampler"])
            exch.load_cost_state(body["exchange_costs"])
            history = _history_lists(body["history"])
            k, elapsed, plain_bytes = int(body["k"]), float(body["elapsed"]), int(body["plain_bytes"])
            U_prev, converged = body["U_prev"].to(dev), bool(body["converged"])

        def save():
            state = {key: getattr(st, key)[0, slots].detach().cpu() for key in _SLOT_STATE}
            state.update(g=st.g.detach().cpu(), lam=st.lam.detach().cpu())
            if st.mu is not None:
                state["mu"] = st.mu[0, slots].detach().cpu()
            ckpt.save(_rank_dir(checkpoint_dir, comm.rank), {
                "k": k, "fingerprint": fp, "agents": lay.agents.tolist(), "state": state,
                "sampler": sampler.state_dict(), "exchange_costs": exch.cost_state(),
                "history": _history_tensors(history), "elapsed": elapsed, "plain_bytes": plain_bytes,
                "U_prev": U_prev.detach().cpu(), "converged": converged})

        t0 = time.perf_counter() - elapsed
        while k < int(max_iter) and not converged and not stopped:
            k += 1
            x_step(Z, st, idx_loc, mask, sampler, exch, mu=mu, x_iters=int(x_iters), bcd_iter=k)
            y_step(Z, st, idx_loc, y_iters=int(y_iters))
            if penalty == "adaptive":
                st.lam = rank_lambda(st.lam, _gather_rows(st.Xc, idx_loc), st.V, lay, comm, share=share,
                                     what=f"the adaptive penalty of outer iteration {k}")
            row, Ubar = _rank_metrics(Z, st, idx_loc, lay, comm, x_norm2, k)
            plain_bytes += g.src.numel() * n * r * itemsize * int(x_iters)
            counted = sum(exch.bytes_per_edge().values())
            elapsed = time.perf_counter() - t0
            row.update(time=elapsed, bytes=float(counted if counted else plain_bytes))
            for key, v in row.items():
                history[key].append(v.detach().cpu().numpy().copy() if isinstance(v, torch.Tensor) else v)
            change = torch.linalg.matrix_norm(Ubar - U_prev) / torch.linalg.matrix_norm(Ubar).clamp_min(
                torch.finfo(dt).tiny)
            U_prev = Ubar
            stop = bool(callback(k, {key: history[key][-1] for key in history})) if callback is not None else False
            done = tol > 0 and bool((change < tol).all())
            flags = comm.all_reduce(torch.tensor([int(stop), int(done)], dtype=torch.int64), category="metrics",
                                    op=dist.ReduceOp.MAX, what=f"the stop decision of outer iteration {k}")
            stopped = bool(int(flags[0]))
            converged = not stopped and bool(int(flags[1]))
            if checkpoint_dir is not None and checkpoint_every and k % checkpoint_every == 0:
                save()
        if checkpoint_dir is not None and not (checkpoint_every and k % checkpoint_every == 0) and (
                body is None or k > int(body["k"])):
            save()
        if tol > 0 and not converged:
            warnings.warn(f"fit_symnmf_rank: no convergence to tol={tol} in {k} iterations", ConvergenceWarning,
                          stacklevel=2)
        costs = dict(exch.costs())
    finally:
        exch.close()
    gathered = {name: gather_agents(comm, lay, t, part.counts(), part.agents, what=f"the output gather of {name}")
                for name, t in (("U", st.Xc), ("V", st.V))}
    own = {"agents": lay.agents.tolist(), "U": st.Xc[0, slots].clone(), "V": st.V[0, slots].clone(),
           "parts": idx_loc[0, slots].clone()}
    mine = dict(lay.summary(), sent=dict(comm.sent))
    ranks = comm.all_gather_object(mine, what="the ranks' summaries")
    result = None
    if comm.rank == 0:
        U_agents, V_agents = gathered["U"], gathered["V"]
        idx_d = idx.to(dev)
        result = AgentsResult(U=U_agents.mean(1), V=_scatter_rows(V_agents, idx_d, n).sum(1), U_agents=U_agents,
                              lam=st.lam, history=history, n_iter=k, parts=idx_d, costs=costs, converged=converged)
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
