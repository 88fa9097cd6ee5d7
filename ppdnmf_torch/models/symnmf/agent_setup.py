"""The setup of symmetric NMF across agents, shared by the single process
(:func:`~.agents.fit_symnmf_agents`) and the run over ranks (:func:`~.distributed.fit_symnmf_rank`):
the settings' checks, the agents' graphs, caps and parts, the common start, each agent's private
start, and the adaptive penalty's aggregation (:mod:`.agents` describes the model)."""
from __future__ import annotations

import secrets

import numpy as np
import torch

from ..._utils import derive_seed
from ...errors import ConfigError, DataError
from ...exchange import Exchange
from ...exchange.aggregation import AGGREGATION_KINDS, Aggregator, make_aggregator
from ...graph import Graph, random_connected
from ...penalties import PENALTY_MODES
from .agent_steps import AgentsState, gather_rows
from .config import AGENTS_SCHEDULES, AGENTS_STARTS

__all__ = ["check_settings", "agent_graphs", "agent_caps", "node_parts", "partition_nodes", "common_start",
           "private_start", "start_seeds", "initial_state", "lambda_aggregator", "arithmetic"]

# the settings' defaults and choices (ADAPTIVE_LAMBDA0, AGENTS_SCHEDULES, AGENTS_STARTS): .config


def check_settings(*, mu, tol, penalty, penalty_schedule, penalty_mode, start="private", **counts):
    """The settings' checks at the boundary: ``counts`` integers >= 1; returns ``mu`` as used
    (``"auto"`` or a float). ``g_cap`` is checked by :func:`agent_caps`, the checkpoint
    arguments by :func:`~ppdnmf_torch.driver.check_checkpoint_args`."""
    for key, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ConfigError(f"{key}: expected an integer >= 1, got {v!r}")
    if not ((mu == "auto" or (isinstance(mu, (int, float)) and mu > 0)) and tol >= 0):
        raise ConfigError("mu/tol: need mu='auto' or > 0 and tol >= 0")
    if penalty != "adaptive" and not (isinstance(penalty, (int, float)) and penalty >= 0):
        raise ConfigError(f"penalty: expected 'adaptive' or a number >= 0, got {penalty!r}")
    if penalty_schedule not in AGENTS_SCHEDULES:
        raise ConfigError(f"penalty_schedule: expected one of {AGENTS_SCHEDULES} across agents, got "
                          f"{penalty_schedule!r}")
    if penalty_mode not in PENALTY_MODES:
        raise ConfigError(f"penalty_mode: expected one of {PENALTY_MODES}, got {penalty_mode!r}")
    if start not in AGENTS_STARTS:
        raise ConfigError(f"start: expected one of {AGENTS_STARTS}, got {start!r}")
    return mu if mu == "auto" else float(mu)


def agent_graphs(graph, n_agents: int, trials: int, seeds) -> list[Graph]:
    """The agents' graph per trial: the one(s) given, or the paper's random connected graph of
    average degree 3 seeded per trial (one agent: no edges)."""
    if graph is None:
        if n_agents == 1:
            return [Graph(1, [])] * trials
        return [random_connected(n_agents, min(3.0, n_agents - 1.0), seed=s) for s in seeds]
    graphs = list(graph) if isinstance(graph, (list, tuple)) else [graph] * trials
    if len(graphs) != trials or not all(isinstance(g, Graph) for g in graphs):
        raise ConfigError(f"graph: expected a Graph or a list of {trials} Graphs")
    if any(g.n_agents != n_agents for g in graphs):
        raise ConfigError(f"graph: every graph must have n_agents={n_agents} agents")
    return graphs


def agent_caps(g_cap, T: int, N: int, dev) -> torch.Tensor:
    """The agents' caps ``g_i`` as ``(T, N)`` float64 from a number, ``(N,)`` or ``(T, N)``."""
    try:
        caps = torch.as_tensor(np.asarray(g_cap, dtype=np.float64))
    except (TypeError, ValueError):
        caps = None
    if caps is None or caps.dim() > 2 or (caps.dim() >= 1 and caps.shape[-1] != N) or (
            caps.dim() == 2 and caps.shape[0] != T):
        raise ConfigError(f"g_cap: expected a number, {N} caps (one per agent) or ({T}, {N}), got {g_cap!r}")
    if not bool(torch.isfinite(caps).all()) or bool((caps <= 0).any()):
        raise ConfigError(f"g_cap: every cap must be a finite number > 0, got {g_cap!r}")
    return caps.expand(T, N).to(dev).contiguous()


def partition_nodes(n: int, n_agents: int, seeds, device=None) -> torch.Tensor:
    """A random balanced partition of the nodes ``0..n-1`` per trial: ``(T, N, ceil(n / N))``,
    padded with ``n``; trial ``t`` permutes with ``derive_seed(seeds[t], "symnmf_parts")``."""
    if n_agents > n:
        raise ConfigError(f"n_agents: {n_agents} agents for {n} nodes; every agent needs a node")
    m = -(-n // n_agents)
    out = torch.full((len(seeds), n_agents, m), n, dtype=torch.long)
    for t, s in enumerate(seeds):  # a host-side permutation per trial, before the run
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(derive_seed(s, "symnmf_parts")))
        for a, part in enumerate(torch.tensor_split(perm, n_agents)):
            out[t, a, : part.numel()] = part.sort().values
    return out.to(device)


def node_parts(parts, n: int, N: int, seeds) -> torch.Tensor:
    """``S_i`` per trial and agent, ``(T, N, m)`` padded with ``n``: ``parts`` (``(N, m)`` for every
    trial, or ``(T, N, m)``) checked to cover every node once, or :func:`partition_nodes`'s."""
    T = len(seeds)
    if parts is None:
        return partition_nodes(n, N, seeds)
    idx = torch.as_tensor(parts, dtype=torch.long)
    if idx.dim() == 2:
        idx = idx.expand(T, *idx.shape)
    if idx.dim() != 3 or idx.shape[:2] != (T, N):
        raise ConfigError(f"parts: expected shape (n_agents, m) = ({N}, m) or (trials, n_agents, m) = ({T}, {N}, m), "
                          f"got {tuple(idx.shape)}")
    flat = idx.reshape(T, -1)
    hits = torch.zeros((T, n + 1), dtype=torch.long).scatter_add_(1, flat.clamp(0, n), torch.ones_like(flat))
    if bool((hits[:, :n] != 1).any()) or bool((idx < 0).any()) or bool((idx > n).any()):
        raise ConfigError("parts: every trial's parts must cover every node exactly once")
    return idx


def common_start(U0, n: int, r: int, seeds, device, dtype) -> torch.Tensor:
    """The copies' common start ``(T, n, r)``: ``U0`` (``(n, r)`` or ``(T, n, r)``, nonnegative), or
    i.i.d. uniform on ``[0, 1]`` per trial seed (``derive_seed(seed_t, "symnmf_agents_init")``)."""
    T = len(seeds)
    if U0 is None:
        U0 = torch.stack([torch.rand((n, r), generator=torch.Generator().manual_seed(
            derive_seed(s, "symnmf_agents_init")), dtype=torch.float64) for s in seeds])
    U0 = torch.as_tensor(np.asarray(U0) if not isinstance(U0, torch.Tensor) else U0).to(device, dtype)
    U0 = U0.expand(T, n, r) if U0.dim() == 2 else U0
    if U0.shape != (T, n, r) or bool((U0 < 0).any()):
        raise DataError(f"U0: expected a nonnegative ({n}, {r}) or ({T}, {n}, {r}) matrix, got {tuple(U0.shape)}")
    return U0


def private_start(U0: torch.Tensor, idx: torch.Tensor, seeds, agents=None) -> torch.Tensor:
    """Each agent's private start ``V_i``, ``(T, N_a, m, r)``: i.i.d. uniform on ``[0, max U_0]``
    (the common start's scale; per trial), from a stream only agent ``i`` holds, zero on the
    padded rows: seeded by ``derive_seed(seeds[t], "symnmf private start", i)``, or, where
    ``seeds[t]`` is None, by a fresh 63-bit seed of the operating system's CSPRNG
    (:func:`secrets.randbits`, used once, never kept).

    Agent ``i``'s rows (``|S_i|`` draws, in the order of its slots) depend on its own seed and
    ``U_0``'s scale only, not on the padding or the other agents, so a run over ranks computes
    just its own agents' (``agents``) and gets the same numbers. The seed is never
    logged or checkpointed; the draw is the agent's own state (a checkpoint holds ``V`` anyway).

    Parameters
    ----------
    U0 : Tensor (T, n, r)
        The common start (its dtype and device are the result's).
    idx : LongTensor (T, N_a, m)
        ``S_i`` of the agents computed, padded with ``n`` (:func:`partition_nodes`, or its rows
        ``agents``).
    seeds : sequence of int or None (T,)
        The trials' start seeds (``start_seed + t``), or None for the CSPRNG.
    agents : sequence of int (N_a,), optional
        The agents' global indices (default ``0..N_a-1``): the streams' labels.
    """
    T, n, r = U0.shape
    agents = range(idx.shape[1]) if agents is None else [int(a) for a in agents]
    if len(agents) != idx.shape[1] or len(seeds) != T:
        raise ConfigError(f"private_start: {len(agents)} agents and {len(seeds)} seeds for parts of shape "
                          f"{tuple(idx.shape)} and {T} trials")
    valid = (idx < n).cpu()
    draws = torch.zeros((T, len(agents), idx.shape[-1], r), dtype=torch.float64)
    for t, s in enumerate(seeds):  # host streams, once per run: exactly |S_i| rows from agent i's own
        for k, a in enumerate(agents):
            own = secrets.randbits(63) if s is None else derive_seed(s, "symnmf private start", a)
            gen = torch.Generator().manual_seed(own)
            draws[t, k, valid[t, k]] = torch.rand((int(valid[t, k].sum()), r), dtype=torch.float64, generator=gen)
    return draws.to(U0.device, U0.dtype) * U0.amax(dim=(-2, -1)).view(T, 1, 1, 1)


def start_seeds(start_seed, trials: int) -> list:
    """The trials' seeds for :func:`private_start`: ``start_seed + t``, or None (the CSPRNG)."""
    if start_seed is None:
        return [None] * int(trials)
    if isinstance(start_seed, bool) or not isinstance(start_seed, (int, np.integer)):
        raise ConfigError(f"start_seed: expected an integer or None, got {start_seed!r}")
    return [int(start_seed) + t for t in range(int(trials))]


def initial_state(U0: torch.Tensor, idx: torch.Tensor, g0: torch.Tensor, lam: torch.Tensor, start: str,
                  start_seed) -> AgentsState:
    """Every agent's start: its copy ``U_0`` (``U0 (T, n, r)``), ``P = Q = Q_prev = 0``, and ``V_i``
    as ``start`` says (:func:`private_start`, or ``U_0[S_i]``)."""
    T, n, r = U0.shape
    N = idx.shape[1]
    copies = U0[:, None].expand(T, N, n, r).clone()
    zeros = torch.zeros_like(copies)
    V = private_start(U0, idx, start_seeds(start_seed, T)) if start == "private" else gather_rows(copies, idx)
    return AgentsState(Xc=copies, U=copies.clone(), P=zeros, Q=zeros.clone(), Q_prev=zeros.clone(), V=V, g=g0,
                       lam=lam)


def lambda_aggregator(aggregation, options, exch: Exchange, N: int, resources):
    """The lambda sums' aggregator: the one handed in (left open), or one made here and owned by
    ``resources`` (``None``: the exchange's kind, ``plain`` for one agent or a custom exchange),
    with the exchange's key size by default."""
    if isinstance(aggregation, Aggregator):
        if options:
            raise ConfigError("aggregation_options: an aggregator handed in is used as it is; pass its options "
                              "to make_aggregator, or a kind name here")
        if aggregation.n_workers != N:
            raise ConfigError(f"aggregation: the aggregator has {aggregation.n_workers} workers, the run "
                              f"{N} agents")
        return aggregation
    if aggregation is None:
        aggregation = exch.name if exch.name in AGGREGATION_KINDS and N > 1 else "plain"
    if aggregation not in AGGREGATION_KINDS:
        raise ConfigError(f"aggregation: expected one of {AGGREGATION_KINDS} or an Aggregator, got {aggregation!r}")
    opts = dict(options or {})
    codec = getattr(exch, "codec", None)
    if aggregation != "plain" and codec is not None:
        opts.setdefault("key_bits", int(codec.key_bits))
    return resources.own(make_aggregator(aggregation, N, **opts))


def arithmetic(exch, agg) -> list:
    """The numbers' arithmetic of the exchange and the aggregation: ``plain`` (None) or the integer
    codec's ``n_max`` and ``g_bits`` (``quantized`` and ``paillier`` give the same bits, so either
    resumes the other)."""
    codec = getattr(exch, "codec", None)
    return [None if codec is None else [float(codec.n_max), int(codec.g_bits)],
            None if agg is None or agg.kind == "plain" else float(agg.n_max)]
