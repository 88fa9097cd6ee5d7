"""Serverless FSSPCA over ``torch.distributed`` ranks: :func:`fit_serverless_rank`, one rank's run of
:func:`~.serverless.fit_serverless` on the workers it holds (docs/FSSPCA.md, "Over ranks").

Each rank holds its own workers' rows only and computes their shares (Gram matrix, squared
norm, row sum and count) itself, in the engine's slots (:class:`~ppdnmf_torch.distributed.RankLayout`,
which keep the single-process memory alignment of every per-worker block: ``(d, d)`` and
``(d, r)``; free slots are dummies of zeros that no sum counts). One ADMM iteration is the single
process's (:class:`~.serverless_run.ServerlessRun`, driven by the engine's ``drive`` with the
driver's rank coordination), step for step:

* the consensus rounds of step 2 and the agreed centring go through the rank's
  :class:`~ppdnmf_torch.distributed.HaloExchange` (``plain``, ``quantized``: the boundary workers'
  values and the cut edges' penalties cross to the peer ranks, then the run's kind computes the
  neighbour sums on the rank's extended nodes, the same terms in the same order as in one
  process) or :class:`~ppdnmf_torch.distributed.SecAggHalo` (``secagg``, the default: masked
  messages only), with the rank's :class:`~ppdnmf_torch.distributed.RankSampler` (each edge's
  single-process draw of the agreed schedule);
* what the method needs over every worker beyond the exchange (:class:`RankSums`): the
  centring's scale (one maximum), the workers' mean ``lambda_max(C_i)`` of ``rho="auto"`` and
  ``alpha_scale="gram"``, the stopping test's two sums and the history's ``consensus`` (a
  maximum), all reduced across the ranks, so that every rank holds the same numbers and stops
  at the same iteration. ``share="all"`` (default) all-reduces a table with a row per worker in
  which each rank fills its own (each entry one rank's value plus zeros: exact), and reduces it
  in the single-process order: ``z``, ``w``, ``u`` and the history equal
  :func:`~.serverless.fit_serverless`'s bit for bit; the history's ``disagreement``
  (``max_i ||z_i - mean_j z_j||``) all-reduces every worker's ``z_i`` for it (evaluation only).
  ``share="sums"`` (a deployment, :mod:`.serverless_site`) reduces each sum from the ranks'
  partial sums and sends no ``z_i``: the history has no ``disagreement``. Under ``exchange="secagg"``
  the partial sums are masked (:class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`: only the
  total is revealed; the iterates then equal one process's to rounding); under ``plain`` and
  ``quantized`` each rank's partial sum crosses in the clear, and the bits are one process's where
  every rank holds one worker (else to rounding). The maxima cross in the clear in every mode.

Checkpoints are per rank, ``<checkpoint_dir>/rank<r>/`` (the engine's format: the rank's slots'
iterates, consensus variables and draws, its generators' states and counters; no key or mask
seed of the exchange), ``partition.json`` beside them. One trial per run.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ...distributed.comm import Comm
from ...distributed.halo import HaloExchange, RankSampler
from ...distributed.layout import RankLayout, block_period, gather_agents
from ...distributed.masked_sum import rank_sums
from ...distributed.partition import Partition, partition_agents
from ...distributed.site import agree_description
from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...checkpoint import digest
from ...driver import Checkpoints, Ledgers, RankCoordinator, Resources, check_checkpoint_args, drive
from ...errors import ConfigError, DataError
from ...exchange import Exchange
from ...exchange.spec import exchange_spec
from ...graph import Graph
from ...specs import check_call
from .config import RUN, SERVERLESS, SPEC, TASK
from .fit import as_blocks, initial_z
from .serverless import SETTINGS, HeldWorkers, fit_serverless, serverless_model, serverless_options
from .serverless_run import WorkerSums

__all__ = ["fit_serverless_rank", "rank_exchange_spec", "ServerlessRankResult", "RankSums", "RANK_KINDS", "SHARE_MODES"]

#: the exchange kinds with a protocol across ranks here
RANK_KINDS = ("plain", "quantized", "secagg")
#: what crosses ranks beyond the exchange (:class:`RankSums`)
SHARE_MODES = ("all", "sums")
_FLAT = ("protocol", "n_max", "key_bits", "g_bits")


@dataclass
class ServerlessRankResult:
    """What :func:`fit_serverless_rank` returns on every rank.

    Attributes
    ----------
    own : dict
        This rank's workers: ``workers`` (global ids, increasing) and their ``z``, ``w``, ``u``
        ``(n_own, d, r)``.
    history : dict
        ``consensus`` (and ``disagreement`` with ``share="all"``) per ADMM iteration, ``(n_iter,)``
        tensors, the same on every rank.
    n_iter : int
    converged : bool
    partition : Partition
    settings : dict
        As :class:`~.serverless.ServerlessResult`'s.
    exchange_calls : int
    bytes : float
        The exchange's count summed over the ranks (``plain``: the plain count, every edge).
    costs : dict
    z_all : Tensor (K, d, r) or None
        With ``share="all"``, on rank 0: every worker's ``z_i`` (gathered at the end, evaluation
        only); None elsewhere.
    """

    own: dict
    history: dict
    n_iter: int
    converged: bool
    partition: Partition
    settings: dict = field(default_factory=dict)
    exchange_calls: int = 0
    bytes: float = 0.0
    costs: dict = field(default_factory=dict)
    z_all: torch.Tensor | None = None


class RankSums(WorkerSums):
    """The sums and maxima over every worker across the ranks (see the module, ``share``).

    Parameters
    ----------
    comm : Comm
    layout : RankLayout
    share : {"all", "sums"}
    """

    def __init__(self, comm: Comm, layout: RankLayout, share: str, sums=None):
        self.comm, self.lay, self.share = comm, layout, share
        self.sums = sums  # share="sums" under secagg: a MaskedSums, which reveals the total only
        self._slots, self._agents = layout.slots, layout.agents

    def _masked(self) -> bool:
        return self.share == "sums" and bool(getattr(self.sums, "masked", False))

    def _own(self, t):
        return t[:, self._slots.to(t.device)]

    def _table(self, t, what: str):
        """``(T, rows)``: every worker's value (``all``) or every rank's partial sum (``sums``)."""
        own = self._own(t)
        if self.share == "all":
            table = own.new_zeros((own.shape[0], self.lay.n_agents) + tuple(own.shape[2:]))
            table[:, self._agents.to(own.device)] = own
        else:
            table = own.new_zeros((own.shape[0], self.lay.world_size) + tuple(own.shape[2:]))
            table[:, self.comm.rank] = own.sum(1)
        got = self.comm.all_reduce(table, category="metrics", what=what).to(t.device)
        return _like(t, got.shape).copy_(got)

    def _total(self, t, what: str):
        """The masked total over every worker (no rank's partial sum crosses in the clear)."""
        own = self._own(t).sum(1)
        got = self.sums.all_reduce(own, category="metrics", what=what).to(t.device)
        return _like(own, got.shape).copy_(got)

    def sum(self, t):
        if self._masked():
            return self._total(t, "a sum over the workers")
        return self._table(t, "a sum over the workers").sum(1)

    def mean(self, t):
        if self._masked():
            return self._total(t, "a mean over the workers") / self.lay.n_agents
        table = self._table(t, "a mean over the workers")
        return table.mean(dim=1) if self.share == "all" else table.sum(1) / self.lay.n_agents

    def largest(self, t):
        own = t[self._slots.to(t.device)].amax().reshape(1)
        return self.comm.all_reduce(own, category="metrics", op=dist.ReduceOp.MAX,
                                    what="the largest share (the centring's scale)").to(t.device)[0]

    def max(self, t):
        return self.comm.all_reduce(self._own(t).amax(1), category="metrics", op=dist.ReduceOp.MAX,
                                    what="a maximum over the workers").to(t.device)

    def disagreement(self, z):
        if self.share != "all":
            return None  # it needs the workers' mean z, which no worker holds
        return super().disagreement(self._table(z, "the workers' z (the history's disagreement)"))


def _like(t, shape):
    """Zeros of ``shape`` in ``t``'s memory layout (its dimensions' stride order): a reduction over
    them then runs in the order it runs over ``t`` (the run's ``z`` is stored column-major)."""
    order = sorted(range(t.dim()), key=lambda i: (-t.stride(i), i))
    base = t.new_zeros([shape[i] for i in order])
    return base.permute([order.index(i) for i in range(t.dim())])


def rank_exchange_spec(exchange, exchange_options):
    """The exchange spec of a run over ranks: a kind with a protocol across ranks (:data:`RANK_KINDS`)."""
    if isinstance(exchange, Exchange):
        raise ConfigError("exchange: a run over ranks builds its exchange on every rank; pass a kind name or a spec")
    opts = dict(exchange_options or {})
    flat = {key: opts.pop(key) for key in _FLAT if key in opts}
    spec = exchange_spec(exchange, options=opts, **flat)
    if spec.kind not in RANK_KINDS:
        raise ConfigError(f"exchange: the {spec.kind!r} kind has no protocol across ranks for serverless FSSPCA; "
                          f"use one of {RANK_KINDS}")
    return spec


def _settings(given: dict) -> dict:
    """fit_serverless's method settings: its defaults, then ``given`` (one trial)."""
    params = inspect.signature(fit_serverless).parameters
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: not a setting of fit_serverless_rank (its settings: {', '.join(SETTINGS)})")
    kw = {k: params[k].default for k in SETTINGS}
    kw.update(given)
    if kw["trials"] != 1:
        raise ConfigError(f"trials: a run over ranks is one trial, got {kw['trials']!r}")
    return kw


def _held(blocks, lay: RankLayout, like) -> HeldWorkers:
    """The rank's workers' shares in their slots (free slots: zeros)."""
    one = HeldWorkers.of_blocks(blocks, 0)
    S, dev = lay.n_slots, like.device
    slots = lay.slots.to(dev)

    def place(t):
        out = t.new_zeros((S,) + tuple(t.shape[1:]))
        out[slots] = t
        return out

    own = torch.zeros(S, dtype=torch.bool, device=dev)
    own[slots] = True
    return HeldWorkers(place(one.gram), place(one.sqnorm), place(one.s), place(one.n), lay.n_agents,
                       int(lay.edge_ids.numel()), own=own)


def description(o: dict, kw: dict, graph: Graph, part: Partition, spec, d: int, r: int, max_iter: int) -> dict:
    """The run's public description: what every rank (site) must start with alike."""
    public = {k: (v if isinstance(v, (bool, int, float, str, type(None))) else repr(v))
              for k, v in o.items() if k != "psi"}
    init = kw["init"]
    return dict(public, smoothing=o["psi"].name, max_iter=int(max_iter), n_features=d, n_components=r,
                exchange=repr(spec), workers=graph.n_agents, graph=digest(graph.src, graph.dst),
                owner=list(part.owner), init=None if init is None else digest(torch.as_tensor(init)))


def fit_serverless_rank(comm: Comm, data_own, n_components: int, graph: Graph, *, assignment=None,
                        partition: str = "block", share: str = "all", exchange=SERVERLESS.exchange,
                        exchange_options: dict | None = None, callback=None, checkpoint_dir=None,
                        checkpoint_every: int = RUN.checkpoint_every, resume: bool = False, dtype=None,
                        **settings) -> ServerlessRankResult:
    """:func:`~.serverless.fit_serverless` (one trial) on this rank's workers; every rank of ``comm``
    calls it with the same public description (compared at the start, field by field:
    :func:`~ppdnmf_torch.distributed.site.agree_description`) and its own workers' rows.

    Parameters
    ----------
    comm : Comm
    data_own : list of array (n_i, d)
        This rank's workers' row blocks, in increasing worker id (no other worker's rows).
    n_components : int
    graph : Graph
        The workers' communication graph (public; ``K`` agents).
    assignment : sequence of K ints, optional
        The rank of every worker (overrides ``partition``).
    partition : {"block", "rcm"}
        Which rank holds which worker (:func:`~ppdnmf_torch.distributed.partition_agents`):
        ``"block"`` (default), consecutive workers.
    share : {"all", "sums"}
        What crosses ranks beyond the exchange (:class:`RankSums`).
    exchange, exchange_options
        ``plain``, ``quantized`` or ``secagg`` (default), with the options of
        :func:`~ppdnmf_torch.exchange.make_exchange`.
    callback : callable, optional
        ``callback(iteration, values)`` on every rank, ``values`` as :func:`~.serverless.fit_serverless`
        gives them for the rank's slots; the run stops after an iteration where any rank's
        returns a true value.
    checkpoint_dir, checkpoint_every, resume
        Per-rank checkpoints (see the module).
    dtype : torch dtype or str, optional
    **settings
        :func:`~.serverless.fit_serverless`'s method settings (:data:`~.serverless.SETTINGS`), with its
        defaults; ``trials`` is 1.

    Returns
    -------
    ServerlessRankResult
    """
    kw = _settings(settings)
    check_call(dict(kw, exchange_options=exchange_options, callback=callback, checkpoint_every=checkpoint_every,
                    resume=resume), SERVERLESS, SPEC, TASK, RUN, skip=("exchange", "checkpoint_every", "smoothing"),
               arrays=("alpha", "lambda_2", "rho"),
               also={"init": ARRAY | str, "callback": CALLBACK, "exchange_options": OPTIONS})
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    if share not in SHARE_MODES:
        raise ConfigError(f"share: must be one of {SHARE_MODES}, got {share!r}")
    o = serverless_options(kw)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    if not isinstance(graph, Graph):
        raise ConfigError(f"graph: expected a Graph (one agent per worker), got {graph!r}")
    part = partition_agents(graph, comm.world_size, partition, assignment)
    mine = part.agents(comm.rank)
    blocks = as_blocks(list(data_own) if isinstance(data_own, (list, tuple)) else [data_own], device=comm.device,
                       dtype=dtype)
    if len(blocks) != len(mine):
        raise DataError(f"this rank holds the workers {mine} by the partition, got {len(blocks)} row blocks",
                        key="data")
    d, r, like = blocks[0].shape[1], int(n_components), blocks[0]
    if not 1 <= r <= d:
        raise ConfigError(f"n_components: must be in 1..{d} (the number of features), got {n_components}")
    spec = rank_exchange_spec(exchange, exchange_options)
    agree_description(comm, description(o, kw, graph, part, spec, d, r, kw["max_iter"]))
    z0 = initial_z(d, r, 1, kw["seed"], kw["init"], like.dtype, like.device)
    lay = RankLayout.build(part, graph, comm.rank, period=block_period((d * d, d * r), like.element_size()))
    held = _held(blocks, lay, like)
    del blocks, data_own
    with Resources() as res:
        held.sums = RankSums(comm, lay, share, res.own(rank_sums(comm, spec.kind)) if share == "sums" else None)
        exch = res.own(HaloExchange(spec, lay, comm))
        exch.bind(lay.local_topology(graph), dtype=like.dtype, device=like.device)
        sampler = RankSampler(torch.full((lay.n_slots,), o["g_cap"], dtype=torch.float64, device=like.device),
                              lay.edge_src(graph).to(like.device), lay.edge_ids, graph.n_edges * 2, int(kw["seed"]),
                              o["penalty_mode"], o["inner_iters"], shared=True)
        run, settings_out, _ = serverless_model(held, graph, z0, exch, sampler, o)
        ledgers = Ledgers(exchange=exch)
        plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                                 device=like.device)
        out = drive(run, max_iter=int(kw["max_iter"]), tol=o["tol"], callback=callback, checkpoints=plan,
                    ledgers=ledgers, ranks=RankCoordinator(comm, part.summary()))
        counted = sum(exch.bytes_per_edge().values())
        costs = dict(ledgers.costs("exchange"))
    slots, st = lay.slots.to(like.device), run.st
    z_all = None
    if share == "all":  # evaluation only: rank 0 gathers every worker's z_i (a site gathers nothing)
        z_all = gather_agents(comm, lay, st.z, part.counts(), part.agents, what="the output gather of z")
        z_all = None if z_all is None else z_all[0]
    own = {"workers": lay.agents.tolist(), "z": st.z[0, slots].clone(), "w": st.w[0, slots].clone(),
           "u": st.u[0, slots].clone()}
    history = {k: torch.stack(v)[:, 0] for k, v in out.history.items() if k in ("disagreement", "consensus")}
    return ServerlessRankResult(own, history, int(run.n_iter[0]), bool(run.conv[0]), part, settings_out,
                                exchange_calls=run.calls, bytes=float(counted if counted else run.plain_bytes),
                                costs=costs, z_all=z_all)
