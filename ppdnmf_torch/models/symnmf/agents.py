"""Symmetric NMF across agents, with privacy (docs/SYMMETRIC_NMF.md, last section).

Agent ``i`` of a connected graph holds the columns ``X_i = X[:, S_i] (n, m_i)`` of its own
nodes ``S_i`` (a partition of ``0..n-1``) and nothing else. The split objective (3) is a
sum over agents::

    g(U, V) = sum_i [ 1/2 ||X_i - U V_i^T||^2 + lambda/2 ||U[S_i] - V_i||^2 ],  V_i = V[S_i],

so it is PPDNMF's problem with ``Z_i = X_i``, the consensus factor ``U`` (PPDNMF's ``X``)
and ``Y_i = V_i^T``, plus a coupling term that touches only the rows ``S_i`` of agent
``i``'s copy of ``U``. Every outer iteration is

* the **X-step** (:func:`x_step`): ``x_iters`` iterations of PPDNMF's consensus ADMM
  (ALGORITHM.md, X-step steps 1-6, eqs. 8-11) on the agents' copies ``U_i``, whose local
  solve (step 3) gains ``lambda`` on the diagonal for the rows in ``S_i`` and
  ``lambda V_i`` on the right-hand side: one ``eigh`` of ``V_i^T V_i`` serves every row
  (a scalar shift per row); the neighbour sums ``S_i`` come from the library's exchange
  (``plain``, ``quantized``, ``paillier``, any protocol, masked included), the penalties
  from its :class:`~ppdnmf_torch.penalties.PenaltySampler`;
* the **Y-step** (:func:`y_step`): ``y_iters`` HALS sweeps of eq. (17) on ``V_i`` against
  the agent's own nonnegative copy: ``A = X_i^T U_i + lambda U_i[S_i]``,
  ``B = U_i^T U_i + lambda I``; local, nothing is sent;
* the **penalty** ``lambda``: fixed, or the adaptive rule (20)
  ``lambda <- lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` with ``U`` the agents' own rows
  ``U_i[S_i]`` (:func:`adaptive_lambda`), from three network-wide sums
  (:func:`lambda_terms`, :func:`lambda_from_sums`).

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
block-diagonal CSR matrices (:class:`SparseColumns`, :func:`agent_columns`), so each local
product is one sparse pass for every agent and trial, ``O(T nnz)`` memory; the metrics come
from ``X U`` products (:mod:`.objective`), so ``X`` is never made dense. The iterates equal the
dense path's to rounding.

**Checkpoints** (``checkpoint_dir``, ``checkpoint_every``, ``resume``;
:mod:`.checkpoint`'s files, format and checks): the agents' variables, ``lambda``, the
penalty generators' states, the histories and the cost counters, with a fingerprint of the
problem and settings; no key, mask seed or private value of the exchange or the aggregation
(both are rebuilt on resume, with new keys and seeds, and give the same numbers). A resumed
run continues bit for bit; the aggregation's setup is counted again for the new process.

**Private start** (``start="private"``, the default; :func:`private_start`): the copies start
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
The run over ``torch.distributed`` ranks is :mod:`.distributed`'s (these steps, the same bits under the
same settings); the privacy audit is :mod:`.audit`.
"""
from __future__ import annotations

import secrets
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from ..._utils import derive_seed
from ...errors import ConfigError, ConvergenceWarning, DataError, DegreeOneWarning, SumLeakWarning
from ...exchange import Exchange, make_exchange
from ...exchange.aggregation import AGGREGATION_KINDS, Aggregator, make_aggregator
from ...graph import Graph, Topology, check_min_degree, random_connected
from ...metrics import consensus_error
from ...penalties import PENALTY_MODES, PenaltySampler, check_shared_caps, sum_leak_message
from . import checkpoint as ckpt
from .agent_columns import SparseColumns, agent_columns, local_product, local_t_product
from .objective import fitting_error, gap_sq, split_objective
from .operator import as_similarity

__all__ = ["AgentsResult", "fit_symnmf_agents", "partition_nodes", "x_step", "y_step", "adaptive_lambda", "auto_mu",
           "lambda_terms", "lambda_from_sums", "SparseColumns", "agent_columns", "ADAPTIVE_LAMBDA0",
           "AGENTS_SCHEDULES", "AGENTS_STARTS", "private_start"]

#: ``lambda_0`` of the adaptive rule (20) across agents. Not the paper's 1e-5: with a near-zero
#: ``lambda`` nothing fixes the gauge ``U -> U A``, ``V -> V A^-T`` of ``X ~ U V^T``, and the agents'
#: copies drift apart in it (measured on digits, 600 points, N = 10: E blows up to 1e6 from
#: 1e-5 and 1e-2, converges from 0.1; docs/RESULTS.md, "Symmetric NMF")
ADAPTIVE_LAMBDA0 = 0.1

#: the consensus penalties' schedules across agents: one common draw per ADMM iteration on every
#: edge (``agreed``, :class:`~ppdnmf_torch.penalties.PenaltySampler` with ``shared=True``), or
#: every directed edge its own monotone draw under its agent's cap (``paper``)
AGENTS_SCHEDULES = ("agreed", "paper")

#: the starts of the agents' ``V_i``: drawn from each agent's own stream (``private``,
#: :func:`private_start`), or the rows of the common start ``U_0[S_i]`` (``common``: public, so the
#: first message inverts to the agent's columns; kept for the audit's before/after)
AGENTS_STARTS = ("private", "common")


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
        (``max_i ||U_i - U||_F / ||U||_F``), ``lambda``, ``time`` (seconds since the
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


@dataclass
class _State:
    """The agents' variables, ``(T, N, ...)``: ``Xc`` the nonnegative copies (ALGORITHM.md's
    ``X_i``), ``U`` the unconstrained ones, ``P``, ``Q``, ``Q_prev`` the duals ``(T, N, n, r)``;
    ``V (T, N, m_max, r)``; ``g (2E,)`` the penalty draws; ``lam (T,)``."""

    Xc: torch.Tensor
    U: torch.Tensor
    P: torch.Tensor
    Q: torch.Tensor
    Q_prev: torch.Tensor
    V: torch.Tensor
    g: torch.Tensor
    lam: torch.Tensor
    mu: torch.Tensor | None = None


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


def _start_seeds(start_seed, trials: int) -> list:
    """The trials' seeds for :func:`private_start`: ``start_seed + t``, or None (the CSPRNG)."""
    if start_seed is None:
        return [None] * int(trials)
    if isinstance(start_seed, bool) or not isinstance(start_seed, (int, np.integer)):
        raise ConfigError(f"start_seed: expected an integer or None, got {start_seed!r}")
    return [int(start_seed) + t for t in range(int(trials))]


def _gather_rows(U: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``U[..., S_i, :]`` per agent: ``U (T, N, n, r)``, ``idx (T, N, m)`` padded with ``n`` (zero rows)."""
    pad = torch.cat([U, U.new_zeros(*U.shape[:-2], 1, U.shape[-1])], dim=-2)
    return torch.gather(pad, -2, idx[..., None].expand(*idx.shape, U.shape[-1]))


def _scatter_rows(V: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """``E_i^T V_i``: ``V (T, N, m, r)`` at the rows ``S_i`` of an ``(T, N, n, r)`` zero matrix."""
    out = V.new_zeros(*V.shape[:-2], n + 1, V.shape[-1])
    out.scatter_(-2, idx[..., None].expand(*idx.shape, V.shape[-1]), V)
    return out[..., :n, :]


def auto_mu(st: _State) -> torch.Tensor:
    """``mu_i = trace(V_i^T V_i) / r + lambda`` per agent, ``(T, N, 1, 1)``: the mean eigenvalue of
    the local system (eq. 9), so that the ADMM of ``X_i = U_i`` is equally fast at every scale
    of the data and of ``V_i`` (a fixed ``mu`` stalls when ``V_i`` is far larger or smaller)."""
    r = st.V.shape[-1]
    return (st.V.square().sum(dim=(-2, -1)) / r + st.lam[:, None]).clamp_min(torch.finfo(st.V.dtype).tiny)[..., None, None]


def x_step(Z, st: _State, idx, mask, sampler: PenaltySampler, exchange: Exchange, *, mu, x_iters: int,
           bcd_iter: int) -> None:
    """The X-step: ``x_iters`` consensus ADMM iterations (ALGORITHM.md steps 1-6, eqs. 8-11),
    the local solve (eq. 9) with the coupling term; updates ``st`` in place.

    Step 3 per agent and row ``l``::

        U_i[l] = (Z_i V_i + lambda E_i^T V_i + mu (X_i - P_i) + rho_i U_i + 2 Q_i - Q_i_prev)[l]
                 (V_i^T V_i + (mu + rho_i + lambda [l in S_i]) I)^-1

    with ``V_i^T V_i = E diag(ev) E^T`` decomposed once per X-step.

    Parameters
    ----------
    Z : Tensor (T, N, n, m) or SparseColumns
        ``X_i``, padded with zero columns (:func:`agent_columns`).
    idx : LongTensor (T, N, m)
        ``S_i``, padded with ``n``. ``mask (T, N, n, 1)``: 1 on the rows ``S_i``.
    """
    T, N, n, r = st.U.shape
    lam = st.lam.view(T, 1, 1, 1)
    if mu == "auto":
        mu = auto_mu(st)
        if st.mu is not None:  # the scaled dual P belongs to the last mu
            st.P = st.P * (st.mu / mu)
        st.mu = mu
    fixed_rhs = local_product(Z, st.V) + lam * _scatter_rows(st.V, idx, n)
    ev, E = torch.linalg.eigh(st.V.mT @ st.V)
    ev = ev.clamp_min(0.0)[..., None, :]
    shift = mu + lam * mask  # (T, N, n, 1), plus rho_i below
    sampler.begin_bcd_iteration()
    A = T * N
    for m in range(x_iters):
        st.g = sampler.step(st.g, m)  # 1. penalties and rho_i
        rho = exchange.penalty_sums(st.g, bcd_iter=bcd_iter, admm_iter=m + 1).to(st.U.dtype).view(T, N, 1, 1)
        st.Xc = (st.U + st.P).clamp_min(0.0)  # 2.
        rhs = fixed_rhs + mu * (st.Xc - st.P) + rho * st.U + 2 * st.Q - st.Q_prev
        st.U = ((rhs @ E) / (ev + shift + rho)) @ E.mT  # 3. eq. 9, a scalar shift per row
        st.P = st.P - (st.Xc - st.U)  # 4.
        S = exchange.exchange(st.U.reshape(A, n * r), st.g, bcd_iter=bcd_iter, admm_iter=m + 1).S  # 5. eq. 11
        st.Q_prev, st.Q = st.Q, st.Q + S.view(T, N, n, r).to(st.U.dtype)  # 6.
    st.Xc = (st.U + st.P).clamp_min(0.0)


def y_step(Z, st: _State, idx, *, y_iters: int) -> None:
    """The Y-step: ``y_iters`` HALS sweeps of eq. (17) over the columns of every ``V_i``
    (padded rows stay zero), against the agent's own copy ``U_i``; local, updates ``st.V``.
    ``Z``: as :func:`x_step`.

    ``v_c <- max(0, v_c + (A[:, c] - V B[:, c]) / B_cc)`` with ``A = X_i^T U_i + lambda U_i[S_i]``
    and ``B = U_i^T U_i + lambda I`` (the exact minimizer of each column's block).
    """
    r = st.V.shape[-1]
    lam = st.lam.view(-1, 1, 1, 1)
    A = local_t_product(Z, st.Xc) + lam * _gather_rows(st.Xc, idx)
    B = st.Xc.mT @ st.Xc + lam * torch.eye(r, dtype=st.V.dtype, device=st.V.device)
    diag = B.diagonal(dim1=-2, dim2=-1).clamp_min(torch.finfo(B.dtype).tiny)
    V = st.V.clone()
    for _ in range(y_iters):
        for c in range(r):  # HALS: one column at a time, each an exact block minimizer
            step = (A[..., c] - (V @ B[..., c, None])[..., 0]) / diag[..., c, None]
            V[..., c] = (V[..., c] + step).clamp_min(0.0)
    st.V = V


def _own_rows(st: _State, idx) -> torch.Tensor:
    """``U_i[S_i]`` for every agent, ``(T, N, m, r)`` (zero on padded rows)."""
    return _gather_rows(st.Xc, idx)


def lambda_terms(U_own: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Each agent's share of the three sums of the adaptive rule (20), ``(T, N, 3)``:
    ``||U_i[S_i]||^2``, ``||V_i||^2`` and ``<U_i[S_i], V_i>`` from ``U_own, V (T, N, m, r)``."""
    return torch.stack([U_own.square().sum(dim=(-2, -1)), V.square().sum(dim=(-2, -1)),
                        (U_own * V).sum(dim=(-2, -1))], dim=-1)


def lambda_from_sums(lam: torch.Tensor, sums: torch.Tensor) -> torch.Tensor:
    """Eq. (20) from the network-wide sums ``(T, 3)`` of :func:`lambda_terms`:
    ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)``, ``(T,)``; the ratio is clamped at 1 (so
    ``lambda`` never decreases), and a nonpositive ``<U, V>`` keeps ``lambda``."""
    num = sums[..., 0] + sums[..., 1]
    den = 2 * sums[..., 2]
    return torch.where(den > 0, lam * (num / den.where(den > 0, 1.0)).clamp_min(1.0), lam)


def adaptive_lambda(lam: torch.Tensor, U_own: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """Eq. (20) as docs/SYMMETRIC_NMF.md reconstructs it, from per-agent pieces:
    ``lambda (||U||^2 + ||V||^2) / (2 <U, V>)`` with ``U`` the agents' own rows
    ``(T, N, m, r)`` and ``V`` their ``V_i``; ``(T,)``. The ratio is >= 1 (so ``lambda``
    never decreases) and 1 exactly when ``U = V``; a nonpositive ``<U, V>`` keeps ``lambda``.
    The same bits as :func:`lambda_from_sums` of the ``plain`` aggregation of
    :func:`lambda_terms`."""
    return lambda_from_sums(lam, lambda_terms(U_own, V).sum(dim=1))


def _check_settings(*, mu, tol, penalty, penalty_schedule, penalty_mode, checkpoint_dir=None,
                    checkpoint_every=0, resume=False, start="private", **counts):
    """The settings' checks at the boundary, shared by :func:`fit_symnmf_agents` and the run over
    ranks (:mod:`.distributed`): ``counts`` integers >= 1, ``checkpoint_every`` >= 0; returns ``mu``
    as used (``"auto"`` or a float). ``g_cap`` is checked by :func:`_caps`."""
    for key, v, lo in [(key, v, 1) for key, v in counts.items()] + [("checkpoint_every", checkpoint_every, 0)]:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise ConfigError(f"{key}: expected an integer >= {lo}, got {v!r}")
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
    if resume and checkpoint_dir is None:
        raise ConfigError("resume: needs a checkpoint_dir to resume from")
    return mu if mu == "auto" else float(mu)


def _warn_degree_one(exchange, graphs) -> None:
    if getattr(exchange, "codec", None) is None:
        return
    found = sorted({a for g in graphs for a, d in enumerate(g.degree.tolist()) if d == 1})
    if found:
        warnings.warn(f"agents {found} have a single neighbour: whatever the protocol, each learns that "
                      "neighbour's U_j from the sums the exchange gives it; pass min_degree=2 to refuse such "
                      "graphs (docs/THREAT_MODEL.md)", DegreeOneWarning, stacklevel=3)


def _graphs(graph, n_agents: int, trials: int, seeds) -> list[Graph]:
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


def _caps(g_cap, T: int, N: int, dev) -> torch.Tensor:
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


def _warn_sum_leak(exchange, schedule: str, caps: torch.Tensor, graphs) -> None:
    if hasattr(exchange, "check_schedule"):  # a schedule the exchange cannot serve is refused (secagg)
        exchange.check_schedule(schedule, caps)
    if getattr(exchange, "codec", None) is None:
        return
    message = sum_leak_message(schedule, caps, [g.degree for g in graphs])
    if message is not None:
        warnings.warn(message, SumLeakWarning, stacklevel=3)


def _aggregator(aggregation, options, exch: Exchange, N: int):
    """The lambda sums' aggregator: the one handed in, or one made here (``None``: the exchange's
    kind, ``plain`` for one agent or a custom exchange), with the exchange's key size by default.
    Returns ``(aggregator, made_here)``."""
    if isinstance(aggregation, Aggregator):
        if options:
            raise ConfigError("aggregation_options: an aggregator handed in is used as it is; pass its options "
                              "to make_aggregator, or a kind name here")
        if aggregation.n_workers != N:
            raise ConfigError(f"aggregation: the aggregator has {aggregation.n_workers} workers, the run "
                              f"{N} agents")
        return aggregation, False
    if aggregation is None:
        aggregation = exch.name if exch.name in AGGREGATION_KINDS and N > 1 else "plain"
    if aggregation not in AGGREGATION_KINDS:
        raise ConfigError(f"aggregation: expected one of {AGGREGATION_KINDS} or an Aggregator, got {aggregation!r}")
    opts = dict(options or {})
    codec = getattr(exch, "codec", None)
    if aggregation != "plain" and codec is not None:
        opts.setdefault("key_bits", int(codec.key_bits))
    return make_aggregator(aggregation, N, **opts), True


def _fingerprint(sim, U0, idx, topo, caps, settings: dict, exch, agg) -> str:
    """What fixes a run's numbers: ``X``'s content, the start, the parts, the graphs, the caps, the
    settings, and the arithmetic of the exchange and of the aggregation (``plain`` or the integer
    ``n_max``: ``quantized`` and ``paillier`` give the same bits, so either resumes the other)."""
    codec = getattr(exch, "codec", None)
    arith = (None if codec is None else (float(codec.n_max), int(codec.g_bits)),
             None if agg is None or agg.kind == "plain" else float(agg.n_max))
    return ckpt.digest("symnmf-agents", sim.digest(), U0, idx, topo.src, topo.dst, caps, settings, arith)


def _history_tensors(history: dict) -> dict:
    """The history as tensors (a checkpoint loads with ``weights_only``): ``(k, T)`` or ``(k,)``."""
    return {key: torch.from_numpy(np.stack(v)) if v and isinstance(v[0], np.ndarray)
            else torch.tensor(v, dtype=torch.float64) for key, v in history.items()}


def _history_lists(packed: dict) -> dict:
    return {key: [row.numpy().copy() for row in t] if t.dim() == 2 else t.tolist() for key, t in packed.items()}


def fit_symnmf_agents(X, rank: int, *, n_agents: int = 10, graph=None, parts=None, exchange="plain",
                      exchange_options: dict | None = None, penalty="adaptive", lam0: float = ADAPTIVE_LAMBDA0,
                      mu="auto", g_cap=0.3, penalty_mode: str = "random", x_iters: int = 10,
                      y_iters: int = 1, max_iter: int = 300, tol: float = 0.0, U0=None, trials: int = 1,
                      seed: int = 0, device="auto", dtype=None, min_degree: int | None = None,
                      callback=None, penalty_schedule: str = "agreed", aggregation=None,
                      aggregation_options: dict | None = None, checkpoint_dir=None, checkpoint_every: int = 0,
                      resume: bool = False, start: str = "private", start_seed: int | None = None) -> AgentsResult:
    """Symmetric NMF of ``X`` with its columns held by ``n_agents`` agents (see the module).

    Parameters
    ----------
    X : array-like, Tensor, scipy.sparse or torch sparse (n, n)
        The symmetric nonnegative similarity matrix (validated by
        :func:`~ppdnmf_torch.models.symnmf.operator.as_similarity`). Agent ``i`` holds
        ``X[:, S_i]``: dense columns for a dense ``X``; for a sparse one, sparse
        (:class:`SparseColumns`), never made dense.
    rank : int
    n_agents : int
    graph : Graph or list of Graph, optional
        The agents' graph (one per trial); default the paper's random connected graph of
        average degree 3, seeded per trial.
    parts : LongTensor (T, N, m), optional
        ``S_i`` padded with ``n`` (:func:`partition_nodes`; default random and balanced).
    exchange : str, ExchangeSpec or Exchange
        ``plain``, ``quantized``, ``paillier`` (:func:`~ppdnmf_torch.exchange.make_exchange`,
        with ``exchange_options`` such as ``protocol``, ``n_max``, ``key_bits``,
        ``cost_model``). The exchange is closed at the end when made here.
    penalty : "adaptive" or float
        ``lambda``: eq. (20) from ``lam0`` (default :data:`ADAPTIVE_LAMBDA0`), or fixed.
    mu : "auto" or float
        The X-step's ADMM penalty of ``X_i = U_i`` (eq. 8); ``"auto"``: :func:`auto_mu`,
        per agent and X-step, from the agent's own ``V_i``.
    g_cap : float, or sequence (N,) or (T, N)
        The caps ``g_i`` of the consensus penalties (``rho_ij = g_{i->j} g_{j->i}``); the
        default 0.3 suits a normalized similarity (largest eigenvalue 1); caps of 1 and more
        made the runs of docs/RESULTS.md diverge. ``"agreed"`` takes one cap per trial.
    penalty_mode : {"random", "fixed"}
        The penalties' draws (:class:`~ppdnmf_torch.penalties.PenaltySampler`).
    penalty_schedule : {"agreed", "paper"}
        ``"agreed"`` (the library's default): every edge of a trial carries one common draw
        ``g^(m)`` per ADMM iteration under the one cap, so each receiver's weights are equal
        and its sums reveal ``rho_i = d_i g^2`` and ``sum_j q_j`` only
        (docs/SECURE_EXCHANGE.md, "What the sums reveal"); the cap stays fixed (PPDNMF's cap
        growth is not needed here: docs/SYMNMF.md). ``"paper"``: every directed edge draws its
        own penalty under its agent's cap; with unequal caps and a secure exchange it warns
        :class:`~ppdnmf_torch.errors.SumLeakWarning`.
    aggregation : {"plain", "quantized", "paillier"}, Aggregator or None
        How the three network-wide sums of the adaptive rule (20) are added
        (:func:`~ppdnmf_torch.exchange.aggregation.make_aggregator` with
        ``aggregation_options``, made here and closed at the end; one handed in is used and
        left open). None: the exchange's kind (``plain`` for one agent), at the exchange's
        key size. The aggregating party learns the three sums per trial and outer iteration,
        and the new ``lambda``, which every agent needs anyway. Unused with a fixed ``lambda``.
    x_iters, y_iters : int
        ADMM iterations per X-step, HALS sweeps per Y-step.
    max_iter : int
        Outer iterations.
    tol : float
        Stop when every trial's ``||U_k - U_{k-1}||_F / ||U_k||_F`` falls below it (0: never);
        a run that does not warns :class:`~ppdnmf_torch.errors.ConvergenceWarning`.
    U0 : array-like or Tensor (n, r) or (T, n, r), optional
        The start (default i.i.d. uniform on [0, 1], per trial seed
        ``derive_seed(seed + t, "symnmf_agents_init")``).
    start : {"private", "common"}
        The agents' ``V_i`` at the start: ``"private"`` (default) drawn from each agent's own
        stream (:func:`private_start`); ``"common"``: ``U_0[S_i]``, public, so the first message
        inverts to the agent's columns (docs/THREAT_MODEL.md, "Symmetric NMF across agents").
        The copies start at ``U_0`` either way.
    start_seed : int, optional
        Reproducible private starts for a simulation (trial ``t``: ``start_seed + t``); default
        None, each agent's own CSPRNG draw (runs then differ in their starts: pass ``start_seed``
        to compare runs bit for bit). Never stored in a checkpoint (the checkpoint holds ``V``).
    trials : int
        Independent trials, batched (trial ``t`` uses seed ``seed + t``).
    callback : callable, optional
        ``callback(k, metrics)`` after outer iteration ``k`` (1-based), ``metrics`` the
        history's newest entries; a true return value stops the run.
    checkpoint_dir : path, optional
        Where checkpoints go (every ``checkpoint_every`` outer iterations and at the end;
        :mod:`~ppdnmf_torch.models.symnmf.checkpoint`): the agents' variables, the penalty
        generators' states, the histories and the cost counters; no key, mask seed or other
        private value of the exchange or the aggregation.
    checkpoint_every : int
        0: only at the end.
    resume : bool
        Continue from the latest checkpoint in ``checkpoint_dir`` (the same problem and
        settings; ``max_iter`` may differ): the iterates continue bit for bit. A checkpoint of
        another run raises :class:`~ppdnmf_torch.models.symnmf.checkpoint.SymNMFCheckpointError`.

    Returns
    -------
    AgentsResult
    """
    mu = _check_settings(mu=mu, tol=tol, penalty=penalty, penalty_schedule=penalty_schedule,
                         penalty_mode=penalty_mode, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                         resume=resume, rank=rank, n_agents=n_agents, x_iters=x_iters, y_iters=y_iters,
                         max_iter=max_iter, trials=trials, start=start)
    sim = as_similarity(X, device=device, dtype=dtype)
    if sim.batched:
        raise DataError("X: one (n, n) similarity matrix for every trial; got one per trial")
    n, dev, dt = sim.n, sim.device, sim.dtype
    T, N, r = int(trials), int(n_agents), int(rank)
    seeds = [int(seed) + t for t in range(T)]
    graphs = _graphs(graph, N, T, seeds)
    for t, g in enumerate(graphs):
        check_min_degree(g, min_degree, trial=t if T > 1 else None)
    caps = _caps(g_cap, T, N, dev)
    check_shared_caps(caps, penalty_schedule)
    topo = Topology.from_graphs(graphs)
    idx = partition_nodes(n, N, seeds) if parts is None else torch.as_tensor(parts, dtype=torch.long)
    if idx.dim() == 2:
        idx = idx.expand(T, *idx.shape)
    if idx.shape[:2] != (T, N):
        raise ConfigError(f"parts: expected shape (trials, n_agents, m) = ({T}, {N}, m), got {tuple(idx.shape)}")
    idx = idx.to(dev).contiguous()
    hits = torch.zeros((T, n + 1), dtype=torch.long, device=dev).scatter_add_(1, idx.reshape(T, -1),
                                                                               torch.ones_like(idx.reshape(T, -1)))
    if bool((hits[:, :n] != 1).any()) or bool((idx < 0).any()) or bool((idx > n).any()):
        raise ConfigError("parts: every trial's parts must cover every node exactly once")
    Z = agent_columns(sim, idx)  # agent i's data: the columns S_i (empty columns on padding)
    mask = torch.zeros((T, N, n + 1), dtype=dt, device=dev).scatter_(-1, idx, 1.0)[..., :n, None]
    if U0 is None:
        U0 = torch.stack([torch.rand((n, r), generator=torch.Generator().manual_seed(
            derive_seed(s, "symnmf_agents_init")), dtype=torch.float64) for s in seeds])
    U0 = torch.as_tensor(np.asarray(U0) if not isinstance(U0, torch.Tensor) else U0).to(dev, dt)
    U0 = U0.expand(T, n, r) if U0.dim() == 2 else U0
    if U0.shape != (T, n, r) or bool((U0 < 0).any()):
        raise DataError(f"U0: expected a nonnegative ({n}, {r}) or ({T}, {n}, {r}) matrix, got {tuple(U0.shape)}")
    adaptive = penalty == "adaptive"
    own_exchange = not isinstance(exchange, Exchange)
    exch = make_exchange(exchange, **(exchange_options or {})) if own_exchange else exchange
    agg, own_agg = None, False
    _warn_degree_one(exch, graphs)
    _warn_sum_leak(exch, penalty_schedule, caps, graphs)
    try:
        if adaptive:
            agg, own_agg = _aggregator(aggregation, aggregation_options, exch, N)
        exch.bind(topo, dtype=dt, device=dev)
        edges_per_trial = torch.bincount(torch.div(topo.src, N, rounding_mode="floor"), minlength=T).tolist()
        sampler = PenaltySampler(caps.reshape(-1), topo.src.to(dev), edges_per_trial, seeds, penalty_mode, x_iters,
                                 shared=penalty_schedule == "agreed")
        copies = U0[:, None].expand(T, N, n, r).clone()
        zeros = torch.zeros_like(copies)
        lam = torch.full((T,), float(lam0 if adaptive else penalty), dtype=dt, device=dev)
        st = _State(Xc=copies, U=copies.clone(), P=zeros, Q=zeros.clone(), Q_prev=zeros.clone(),
                    V=private_start(U0, idx, _start_seeds(start_seed, T)) if start == "private"
                    else _gather_rows(copies, idx),
                    g=sampler.initial(), lam=lam)
        history = {key: [] for key in ("E", "objective", "uv_dist", "consensus", "lambda", "time", "bytes")}
        plain_bytes, elapsed, U_prev, converged, k = 0, 0.0, U0, False, 0
        agg_offset: dict = {}
        fp = None
        if checkpoint_dir is not None:
            settings = {"penalty": penalty, "lam0": float(lam0) if adaptive else None, "mu": mu, "rank": r,
                        "penalty_mode": penalty_mode, "penalty_schedule": penalty_schedule, "x_iters": int(x_iters),
                        "y_iters": int(y_iters), "tol": float(tol), "seeds": seeds, "dtype": str(dt),
                        "start": start}
            fp = _fingerprint(sim, U0, idx, topo, caps, settings, exch, agg)
        path = ckpt.latest(checkpoint_dir) if (resume and checkpoint_dir is not None) else None
        if path is not None:
            body = ckpt.load(path, fp)
            state = {key: v.to(dev) for key, v in body["state"].items()}
            st = _State(**state)
            sampler.load_state_dict(body["sampler"])
            exch.load_cost_state(body["exchange_costs"])
            agg_offset = dict(body["aggregation_costs"])
            history = _history_lists(body["history"])
            k, elapsed, plain_bytes = int(body["k"]), float(body["elapsed"]), int(body["plain_bytes"])
            U_prev, converged = body["U_prev"].to(dev), bool(body["converged"])

        def save():
            tensors = {key: getattr(st, key).detach().cpu() for key in ("Xc", "U", "P", "Q", "Q_prev", "V", "g", "lam")}
            if st.mu is not None:
                tensors["mu"] = st.mu.detach().cpu()
            ckpt.save(checkpoint_dir, {
                "k": k, "fingerprint": fp, "state": tensors, "sampler": sampler.state_dict(),
                "exchange_costs": exch.cost_state(), "aggregation_costs": _agg_costs(agg, agg_offset),
                "history": _history_tensors(history), "elapsed": elapsed, "plain_bytes": plain_bytes,
                "U_prev": U_prev.detach().cpu(), "converged": converged})

        x_norm2 = sim.sq_norm.expand(T)
        t0 = time.perf_counter() - elapsed
        stopped = False
        while k < int(max_iter) and not converged and not stopped:
            k += 1
            x_step(Z, st, idx, mask, sampler, exch, mu=mu, x_iters=int(x_iters), bcd_iter=k)
            y_step(Z, st, idx, y_iters=int(y_iters))
            if adaptive:  # eq. (20) from the three sums, through the aggregation
                st.lam = lambda_from_sums(st.lam, agg.total(lambda_terms(_own_rows(st, idx), st.V), dim=1))
            Ubar = st.Xc.mean(1)
            Vall = _scatter_rows(st.V, idx, n).sum(1)
            uv2 = gap_sq(Ubar, Vall)
            plain_bytes += topo.n_directed_edges * n * r * sim.data.element_size() * int(x_iters)
            counted = sum(exch.bytes_per_edge().values())
            elapsed = time.perf_counter() - t0
            row = {"E": fitting_error(x_norm2, Ubar, sim.matmul(Ubar)),
                   "objective": split_objective(x_norm2, Ubar, Vall, sim.matmul(Vall), st.lam),
                   "uv_dist": uv2.sqrt(), "consensus": consensus_error(st.Xc), "lambda": st.lam,
                   "time": elapsed, "bytes": float(counted if counted else plain_bytes)}
            for key, v in row.items():
                history[key].append(v.detach().cpu().numpy().copy() if isinstance(v, torch.Tensor) else v)
            change = torch.linalg.matrix_norm(Ubar - U_prev) / torch.linalg.matrix_norm(Ubar).clamp_min(
                torch.finfo(dt).tiny)
            U_prev = Ubar
            if callback is not None and callback(k, {key: history[key][-1] for key in history}):
                stopped = True
            if tol > 0 and bool((change < tol).all()):
                converged = True
            if checkpoint_dir is not None and checkpoint_every and k % checkpoint_every == 0:
                save()
        if checkpoint_dir is not None and not (checkpoint_every and k % checkpoint_every == 0) and (
                path is None or k > int(body["k"])):
            save()
        if tol > 0 and not converged and not stopped:
            warnings.warn(f"fit_symnmf_agents: no convergence to tol={tol} in {k} iterations",
                          ConvergenceWarning, stacklevel=2)
        costs = dict(exch.costs())
        costs.update({f"lambda_sums_{key}": v for key, v in _agg_costs(agg, agg_offset).items()})
    finally:
        if own_exchange:
            exch.close()
        if own_agg:
            agg.close()
    return AgentsResult(U=st.Xc.mean(1), V=_scatter_rows(st.V, idx, n).sum(1), U_agents=st.Xc, lam=st.lam,
                        history=history, n_iter=k, parts=idx, costs=costs, converged=converged)


def _agg_costs(agg, offset: dict) -> dict:
    """The aggregation's cumulative costs (plain numbers), continued from a resumed run's."""
    if agg is None:
        return dict(offset)
    out = {key: v for key, v in agg.costs().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for key, v in offset.items():
        out[key] = out.get(key, 0) + v
    return out
