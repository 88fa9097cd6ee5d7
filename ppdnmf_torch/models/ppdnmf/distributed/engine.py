"""One rank of a distributed run: :func:`fit_rank` (the API's :func:`~ppdnmf_torch.fit` on a
rank's agents; a CLI run of it is :func:`ppdnmf_torch.app.distributed.run_rank`).

Every rank holds its agents' data blocks and states only (:mod:`.layout`), draws its
edges' penalties (:class:`~ppdnmf_torch.distributed.halo.RankSampler`), exchanges with the
ranks of its agents' neighbours (:class:`~ppdnmf_torch.distributed.halo.HaloExchange`;
``paillier``: :class:`~ppdnmf_torch.distributed.secure.SecureHalo`, whose keys and seeds never
leave their rank), sees its graph through :class:`~.topology.RankTopology`
(every edge out of its agents; the stopping rule's flags and decisions across ranks) and
reduces the metrics across ranks (:class:`~.reduce.RankReduction`); the BCD loop is the single-process one
(:func:`ppdnmf_torch.models.ppdnmf.solver.run_bcd`). The result, gathered on rank 0, is bit-identical to
the single-process eager run's (``fuse=False``).

``share="sums"`` is the deployment mode: no agent's ``X_i``, ``U_i``, ``Y_i`` or per-agent
metric value leaves its rank. The metrics are reduced from per-rank sums and maxima of
scalars (:class:`~.reduce.RankSums`; the consensus error and ``nmse_worst`` are not
measured), and each rank keeps its own agents' factors (:attr:`RankResult.own`; a CLI run
writes them to ``<out_dir>/rank<r>/factors.pt``). The factors' bits are the single-process
ones all the same (the metrics do not feed the solver).

The loop is the engine's driver with the rank's coordination
(:class:`~ppdnmf_torch.driver.RankCoordinator`): the stop decision agreed after every BCD
iteration, and checkpoints per rank, ``<checkpoint_dir>/rank<r>/`` (the engine's format), with
``partition.json`` beside them; a resumed run (same world size, same partition, settings and
data, checked on every rank) continues from the newest BCD iteration every rank has a
checkpoint of, bit for bit.
"""
from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...._utils import resolve_dtype
from ....errors import ConfigError
from ....specs import check_value
from ..config import OPTION_DEFAULTS as _O, SOLVER_DEFAULTS as _S, settings
from ..result import FitResult, history_single
from ..run import preflight, start_seed, warn_sum_leak
from ....checkpoint import write_atomically
from ....driver import Checkpoints, RankCoordinator, check_checkpoint_args, warn_degree_one
from ....exchange import exchange_spec
from ....exchange.base import Exchange
from ....penalties import cap_bounds, check_shared_caps
from ..memory import check_fit
from ..problem import as_blocks, as_caps, as_graph, check_data, check_rank
from ..solver import SolverParams, run_bcd
from ....threads import with_threads
from ....distributed.comm import Comm, DistributedError
from ....distributed.costs import AGREED_DECISION_BYTES, cut_protocol_bytes, flag_bytes, halo_bytes
from ....distributed.halo import HALO_KINDS, HaloExchange, RankSampler
from ....distributed.layout import RankLayout, gather_agents
from ....distributed.masked_sum import rank_sums
from .layout import rank_problem
from ....distributed.partition import PARTITION_METHODS, Partition, partition_agents
from .topology import rank_topology
from .public import check_own_agents, site_blocks, site_description
from ....distributed.site import agree_description
from .reduce import RankReduction, RankSums
from ....distributed.secure import SecureHalo

__all__ = ["RankResult", "fit_rank", "global_digest", "SHARE_MODES", "distributed_summary", "write_own_factors"]

#: what a distributed run shares across ranks beyond its exchange's messages (``fit_rank``'s ``share``)
SHARE_MODES = ("all", "sums")


@dataclass
class RankResult:
    """What :func:`fit_rank` returns on every rank.

    Attributes
    ----------
    result : FitResult or None
        The whole run's result, on rank 0 (None on the other ranks). With ``share="sums"``
        it holds the reduced history, ``n_iter``, ``converged``, ``columns``, ``graph`` and
        the costs, and no factors (``X``, ``U`` and ``Y`` are None; each rank's are in
        :attr:`own`).
    partition : Partition
    ranks : list of dict
        On rank 0: every rank's layout (:meth:`~ppdnmf_torch.distributed.layout.RankLayout.summary`), bytes sent
        per category (``sent``) and the halo's model of them per ADMM iteration
        (``model_per_admm_iteration``); on other ranks, its own only.
    admm_iterations : int
        ADMM iterations of the X-steps this process ran (a resumed run: its own; under the
        stopping rule, the loops' actual lengths).
    own : dict
        This rank's own agents' factors, on every rank: ``agents`` (their global ids, in
        increasing order), ``X`` and ``U`` ``(n_own, L, K)``, ``Y`` (a list of ``(K, M_i)``)
        and ``columns`` (their ``M_i``).
    share : {"all", "sums"}
    """

    result: FitResult | None
    partition: Partition
    ranks: list = field(default_factory=list)
    admm_iterations: int = 0
    own: dict = field(default_factory=dict)
    share: str = "all"


def global_digest(blocks, graph, caps, seed, params, spec) -> str:
    """SHA-256 of what every rank must agree on: the data, the graph, the caps, the seed, the
    solver parameters and the exchange."""
    h = hashlib.sha256()
    for b in blocks:
        t = b.detach().cpu().contiguous()
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    h.update(repr((graph.n_agents, graph.edges, caps.tolist(), int(seed), sorted(asdict(params).items()),
                   repr(spec))).encode())
    return h.hexdigest()


def _check_supported(spec) -> None:
    if isinstance(spec, Exchange):
        raise ConfigError("exchange: a distributed run builds its exchange on every rank; pass a kind name or a spec")
    if spec.kind not in HALO_KINDS + ("paillier",):
        raise ConfigError(f"exchange: the {spec.kind!r} kind has no cross-rank protocol; use one of "
                          f"{HALO_KINDS + ('paillier',)}")
    if spec.kind == "paillier" and not spec.fast:
        raise ConfigError("exchange: a distributed paillier run takes the fast host path (fast=true); the naive "
                          "path (fast=false) is a single-process reference")
    if spec.kind == "paillier" and spec.record_transcript:
        raise ConfigError("exchange: record_transcript is a single-process tool (the privacy audit); a distributed "
                          "run's traffic is recorded per rank by Comm(record=True)")


def _resolve_partition(comm: Comm, graph, partition, assignment) -> Partition:
    part = partition if isinstance(partition, Partition) else (
        partition_agents(graph, comm.world_size, partition, assignment) if comm.rank == 0 else None)
    part = comm.broadcast_object(part, 0, what="the partition")
    if part.world_size != comm.world_size or part.n_agents != graph.n_agents:
        raise ConfigError(f"partition: made for {part.world_size} ranks and {part.n_agents} agents, the run has "
                          f"{comm.world_size} ranks and {graph.n_agents} agents")
    return part


def _agree(comm: Comm, digest: str) -> None:
    """Every rank runs the same problem, or every rank stops with the same error."""
    digests = comm.all_gather_object(digest, category="setup", what="the check that every rank runs the same problem")
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    if odd:
        raise DistributedError(f"ranks {odd} run another problem than rank 0 (data, graph, caps, seed, solver or "
                               "exchange settings differ): give every rank the same inputs")


def _rank_setup(comm: Comm, blocks, graph, caps, part: Partition, spec, params: SolverParams, *, seed, init_seed,
                dtype, device, width: int) -> tuple:
    """The rank's layout, its exchange (the halo, or the Paillier parties), its problem (its own
    agents' blocks, the rank's view of the graph) and its penalties' sampler. ``blocks``: every
    agent's (a list), or a site's own agents' only (a dict by agent id; the preflight checks its
    own values)."""
    seen = list(blocks.values()) if isinstance(blocks, dict) else blocks
    L, rank = seen[0].shape[0], params.rank
    itemsize = torch.empty((), dtype=dtype).element_size()
    lay = RankLayout.build(part, graph, comm.rank, L=L, K=rank, itemsize=itemsize)
    # paillier's public range bound holds for the largest caps the schedule can reach
    exch = (SecureHalo(spec, lay, comm, graph, part.owner, cap_bounds(caps, params.penalty_schedule))
            if spec.kind == "paillier" else HaloExchange(spec, lay, comm))
    try:  # the exchange is this run's: closed when its setup fails
        preflight(exch, seen, caps, graph.degree, params)
        warn_degree_one(exch, [graph])
        warn_sum_leak(exch, params, caps[None], [graph.degree])  # secagg refuses a per-edge schedule here
        check_fit([seen], [graph], params, dtype=dtype, device=device, exchange=exch)  # a site: its own blocks
        problem = rank_problem(lay, graph, {i: blocks[i] for i in lay.agents.tolist()}, caps, seed, width=width,
                               dtype=dtype, device=device, topology=rank_topology(lay, graph, comm, device))
        problem.init_seeds = [start_seed(init_seed, seed)]
    except BaseException:
        exch.close()
        raise
    sampler = RankSampler(problem.caps.reshape(-1), problem.topology.src, lay.edge_ids, graph.src.numel(), seed,
                          params.penalty, params.x_iters, shared=params.penalty_schedule == "agreed")
    return exch, lay, problem, sampler


def _check_rank_arguments(comm, partition, assignment, resume, share) -> None:
    """``fit_rank``'s own arguments (the others are the spec's, :mod:`..config`)."""
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    if not isinstance(partition, Partition):
        check_value("partition", partition, str, {"choices": PARTITION_METHODS})
    if assignment is not None:
        check_value("assignment", list(assignment) if isinstance(assignment, (list, tuple)) else assignment,
                    list[int], {"ge": 0})
    check_value("resume", resume, bool)
    check_value("share", share, str, {"choices": SHARE_MODES})


@with_threads
def fit_rank(comm: Comm, Z, adjacency, rank, *, columns=None, mu=_S.mu, eta=_S.eta, g_max=_S.g_max,
             bcd_iters=_S.bcd_iters, x_iters=_S.x_iters, y_iters=_S.y_iters, tol=_S.tol, admm_tol=_S.admm_tol,
             exchange=_O.exchange, protocol=_O.protocol, n_max=_O.n_max, key_bits=_O.key_bits, g_bits=_O.g_bits,
             penalty=_S.penalty, consensus_form=_S.consensus_form, negative=_O.negative, seed=_O.seed, device=None, dtype=_O.dtype,
             callback=_O.callback, exchange_options=_O.exchange_options, checkpoint_dir=_O.checkpoint_dir,
             checkpoint_every=_O.checkpoint_every, resume=False, fuse=_S.fuse, partition="rcm", assignment=None,
             threads=_O.threads, penalty_schedule=_S.penalty_schedule, init=_S.init, init_seed=_S.init_seed,
             y_solver=_S.y_solver, share="all") -> RankResult:
    """:func:`ppdnmf_torch.fit` on this rank's agents; every rank of ``comm`` calls it with the
    same arguments (checked: ranks that disagree stop with a :class:`DistributedError`).

    Parameters
    ----------
    comm : Comm
    Z, adjacency, rank, columns, mu, eta, g_max, bcd_iters, x_iters, y_iters, penalty, consensus_form, negative, seed
        As :func:`~ppdnmf_torch.fit`, with its defaults (every default is the spec's,
        :class:`~ppdnmf_torch.models.ppdnmf.config.SolverConfig`). Every rank reads the whole
        ``Z`` and keeps its agents' blocks; or, a site (:func:`~.site.fit_site`), ``Z`` is a dict
        of its own agents' blocks by id, ``columns`` every agent's ``M_i`` (public) and
        ``share="sums"``: the ranks compare the public description field by field, not a digest
        of the data, and every rank's ``result`` holds the history.
    tol, admm_tol
        As :func:`~ppdnmf_torch.fit` (the stopping rule of Sec. II-C; ``admm_tol`` defaults to
        fit's, the ADMM loops at their fixed counts, also when ``tol > 0``): every rank's loops end at
        the single-process iteration. The flags cross the cut edges one hop per iteration
        (:mod:`.topology`; one byte per boundary agent and peer, and one ``int64`` sum over the
        ranks, per iteration of a tracked loop); the BCD loop and the X-step stop network-wide
        (the agents with the flag counted over the ranks, two ``int64`` per decision,
        :mod:`~ppdnmf_torch.models.ppdnmf.solver.stopping`).
    exchange, protocol, n_max, key_bits, g_bits, exchange_options
        As :func:`~ppdnmf_torch.fit`: the kinds :data:`~ppdnmf_torch.distributed.halo.HALO_KINDS` through the halo,
        ``paillier`` (its fast path) through :class:`~.secure.SecureHalo`.
    device : str or torch.device, optional
        Default (None): ``comm.device``.
    callback : callable, optional
        Called on every rank after every BCD iteration (``info.metrics`` as floats, the
        same on every rank); the run stops after an iteration where any rank's returns True.
    checkpoint_dir, checkpoint_every
        Per-rank checkpoints in ``checkpoint_dir/rank<r>``.
    resume : bool
        Continue from the newest BCD iteration every rank has a checkpoint of.
    fuse : bool
        As :func:`~ppdnmf_torch.fit`; the bits equal the single-process run's with
        ``fuse=False`` (the fused plans round differently anyway).
    partition : {"rcm", "block"} or Partition
    assignment : sequence of N ints, optional
        The rank of every agent (overrides ``partition``).
    threads : int, optional
        As :func:`~ppdnmf_torch.fit`.
    penalty_schedule, init, init_seed, y_solver
        As :func:`~ppdnmf_torch.fit` (the paper's settings are
        :data:`~ppdnmf_torch.PAPER_SETTINGS`). Every value gives the single-process bits:
        ``penalty_schedule="agreed"`` (every rank draws the common penalties from the shared
        stream; the cap's one bit per BCD iteration is counted over the ranks in one
        ``int64`` all-reduce, category ``flags``, :meth:`.topology.FlagHalo.counts`),
        ``penalty_schedule="adaptive"`` (each agent adapts its cap and ``mu_i`` from what it
        holds, its whole degree included; its neighbours' caps reach it inside their penalty
        draws, which the halo carries anyway), ``y_solver="hals"`` (per agent, no message)
        and both starts (``init="ones"`` or ``"random"``).
    share : {"all", "sums"}
        What crosses ranks beyond the exchange's messages. ``"all"`` (default): the ranks
        share per-agent metric values and rank 0 gathers every agent's ``X_i`` per BCD
        iteration (the consensus error; ``nmse_worst`` shares the farthest agent's ``X_i``)
        and every agent's ``X_i``, ``U_i``, ``Y_i`` at the end: the single-process history
        and result, bit for bit. ``"sums"`` (a deployment, one site per rank): no per-agent
        value leaves its rank. The metrics come from per-rank sums and maxima of scalars
        (:class:`~.reduce.RankSums`: the history's ``nmse``, ``objective`` and ADMM residuals
        equal one process's to the last bits, about ``1e-16`` relative, not bit for bit;
        ``x_iters_mean``/``x_iters_max`` and ``y_iters_mean``/``y_iters_max`` replace the
        per-agent counts; ``consensus`` and ``nmse_worst`` are left out of the history),
        ``result`` carries no factors and every rank's :attr:`RankResult.own` holds its
        agents' factors, whose bits are still the single-process ones. The stopping rule's
        flags (one hop to neighbours, and a count summed over the ranks) and the adaptive
        schedule (per agent) work as in ``"all"``.

    Returns
    -------
    RankResult
    """
    _check_rank_arguments(comm, partition, assignment, resume, share)
    solver, _ = settings(locals(), device="auto" if device is None else device)  # every keyword checked, once
    dtype = resolve_dtype(dtype)
    device = comm.device if device is None else torch.device(device)
    graph = as_graph(adjacency)
    N = graph.n_agents
    site = isinstance(Z, dict)  # a site's own agents' blocks (:func:`~.site.fit_site`)
    blocks, counts = site_blocks(Z, N, columns, negative) if site else (check_data(as_blocks(Z, N, columns), negative),
                                                                        None)
    counts = [b.shape[1] for b in blocks] if counts is None else counts
    caps = as_caps(g_max, N)
    check_shared_caps(caps, penalty_schedule)
    L = (next(iter(blocks.values())) if site else blocks[0]).shape[0]
    check_rank(rank, L)
    params = SolverParams.of(solver)
    spec = exchange_spec(exchange, protocol=protocol, n_max=n_max, key_bits=key_bits, g_bits=g_bits,
                         options=exchange_options)
    _check_supported(spec)
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    part = _resolve_partition(comm, graph, partition, assignment)
    if site:  # the public description, field by field; never the data
        if share != "sums":
            raise ConfigError("share: a site's run shares sums only (share='sums'); its blocks are its own")
        agree_description(comm, site_description(graph, caps, seed, params, spec, part, counts, L, share,
                                                 init_seed))
        check_own_agents(blocks, part, comm.rank)
    else:
        _agree(comm, global_digest(blocks, graph, caps, seed, params, spec) + repr(part) + share)
    exch, lay, problem, sampler = _rank_setup(comm, blocks, graph, caps, part, spec, params, seed=seed,
                                              init_seed=init_seed, dtype=dtype, device=device, width=max(counts))
    del blocks, Z  # the rank keeps its own blocks only (in the problem)
    plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                             missing_ok=False)
    exch.bind(problem.topology, dtype=dtype, device=device, fuse=params.fuse)
    sums = rank_sums(comm, spec.kind)  # share="sums": masked under exchange="secagg"
    agents = (RankReduction(lay, comm, part, mu=mu, eta=eta, y_solver=y_solver) if share == "all"
              else RankSums(lay, comm, mu=mu, eta=eta, y_solver=y_solver, sums=sums))

    def cb(info):
        info.metrics = {k: float(v[0]) for k, v in info.metrics.items()}
        info.iteration_costs = exch.pop_iteration_costs()
        return bool(callback(info)) if callback is not None else False

    try:  # a rank's checkpoints are its own; its partition and share are its settings
        state, history, info = run_bcd(problem, params, exch, sampler=sampler, callback=cb, checkpoints=plan,
                                       agents=agents, ranks=RankCoordinator(comm, part.summary()),
                                       settings={"process": comm.rank, "world_size": part.world_size,
                                                 "owner": list(part.owner), "share": share})
        costs = exch.costs()
        per_edge = exch.bytes_per_edge()
        if per_edge:
            costs = dict(costs, bytes_per_edge=_edge_order(per_edge, graph))
    finally:
        exch.close()
        sums.close()
    return _rank_result(comm, state, history, info, costs, part, lay, graph, spec, params, counts, share,
                        exch.layout.slots if spec.kind == "paillier" else None, site=site)


def _rank_result(comm: Comm, state, history, info, costs, part: Partition, lay: RankLayout, graph, spec, params,
                 counts: list, share: str, secure_slots, site: bool = False) -> RankResult:
    """Every rank's summary (its layout, the bytes it sent and the halo's model of them), its own
    agents' factors, and on rank 0 the run's result (every agent's factors with ``share="all"``;
    a site's run: on every rank, without factors)."""
    L, rank = state.X.shape[-2:]
    # the X-step loops' lengths (the stopping rule ends a loop early on every rank at once)
    iters = sum(int(v.max()) for v in history["x_iters" if share == "all" else "x_iters_max"][info["start"]:])
    if spec.kind == "paillier":
        model = {"crypto": cut_protocol_bytes(part, graph, comm.rank, protocol=spec.protocol,
                                              key_bits=spec.key_bits, lk=L * rank, slots=secure_slots)}
    else:
        model = halo_bytes(lay, L * rank, state.X.element_size())
    if params.inner_tol > 0:
        model["flags"] = flag_bytes(lay)  # a Y-step iteration's; an X-step's adds the agreed stop
        model["flags_x"] = model["flags"] + AGREED_DECISION_BYTES
    own = _own_factors(state, lay, counts)
    gathered = {}
    if share == "all":
        gathered = {name: gather_agents(comm, lay, getattr(state, name), part.counts(), part.agents,
                                        what=f"the output gather of {name}") for name in ("X", "U", "Y")}
    mine = dict(lay.summary(), sent=dict(comm.sent), admm_iterations=iters, model_per_admm_iteration=model)
    ranks = [mine] if site else comm.all_gather_object(mine, what="the ranks' summaries")
    result = None
    if comm.rank == 0 or site:
        X = U = Y = None
        if share == "all":
            X, U, Y = (gathered[k][0] for k in ("X", "U", "Y"))
            Y = [Y[i, :, :c] for i, c in enumerate(counts)]
        result = FitResult(X=X, Y=Y, U=U, history=history_single(history), graph=graph, columns=counts,
                           n_iter=info["n_iter"], converged=info["converged"], costs=costs)
    return RankResult(result, part, ranks if comm.rank == 0 and not site else [mine], iters, own=own, share=share)


def _own_factors(state, lay: RankLayout, counts: list) -> dict:
    """The rank's agents' ``X``, ``U``, ``Y`` (trimmed to their columns), in global id order."""
    slots = lay.slots.to(state.X.device)
    agents = lay.agents.tolist()
    Y = state.Y[0, slots]
    return {"agents": agents, "X": state.X[0, slots].clone(), "U": state.U[0, slots].clone(),
            "Y": [Y[k, :, :counts[i]].clone() for k, i in enumerate(agents)],
            "columns": [counts[i] for i in agents]}


def _edge_order(per_edge: dict, graph) -> dict:
    """The per-edge byte counts in the single-process order (both directions of each directed
    edge, in CSR order, first occurrence first)."""
    order = {}
    for a, b in zip(graph.src.tolist(), graph.dst.tolist()):
        for key in (f"{a}->{b}", f"{b}->{a}"):
            if key in per_edge and key not in order:
                order[key] = per_edge[key]
    order.update({k: v for k, v in per_edge.items() if k not in order})
    return order


def distributed_summary(comm: Comm, fit: RankResult) -> dict:
    """The ``distributed`` section of ``summary.json``: world size, backend, ``share``, the partition (with
    its cut) and, per rank, its layout, the bytes it sent and the halo's model of them."""
    per_iter = []
    for r in fit.ranks:
        n = max(1, r["admm_iterations"])
        per_iter.append({k: r["sent"].get(k, 0) / n for k in ("halo", "penalty", "crypto", "framing", "flags")
                         if k in r["sent"]})
    return {"world_size": comm.world_size, "backend": comm.backend, "share": fit.share,
            "partition": fit.partition.summary(), "ranks": fit.ranks, "bytes_per_admm_iteration": per_iter}


def write_own_factors(path: Path, fit: RankResult, rank: int, scale: float = 1.0) -> None:
    """A rank's own agents' factors (``share="sums"``): ``torch.save`` of a dict with ``rank``,
    ``agents (n_own,)`` (global ids), ``X``, ``U`` ``(n_own, L, K)``, ``Y`` (list of
    ``(K, M_i)``), ``columns (n_own,)`` and ``data_scale`` when the data were divided by it."""
    own = fit.own
    factors = {"rank": torch.tensor(int(rank)),
               "agents": torch.tensor(own["agents"], dtype=torch.long), "X": own["X"].detach().cpu(),
               "U": own["U"].detach().cpu(), "Y": [y.detach().cpu() for y in own["Y"]],
               "columns": torch.tensor(own["columns"], dtype=torch.long)}
    if scale != 1.0:
        factors["data_scale"] = torch.tensor(float(scale), dtype=torch.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(str(path), lambda fh: torch.save(factors, fh))
