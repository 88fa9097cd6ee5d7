"""The exchange interface the solver calls at step 5 of the X-step (lines 10-16).

The solver never sees how ``S_i`` is obtained. It hands the exchange the agents'
``U`` and this iteration's penalty draws, and gets back

* ``S_i = sum_{j in N_i} rho_ij (U_j - U_i)`` for every agent, and
* ``rho_i = sum_{j in N_i} rho_ij`` with ``rho_ij = g_{i->j} g_{j->i}``.

Three kinds implement it: ``plain`` (float arithmetic), ``quantized`` (the
integer codec, emulated exactly on the device) and ``paillier`` (the real
protocol on the host, with :mod:`phe`). ``quantized`` and ``paillier`` share one
:class:`~ppdnmf_torch.exchange.codec.IntegerCodec`, so they return the same bits.

All tensors here are flattened over trials and agents: ``A = T * N`` nodes,
``U (A, L*K)``, penalties ``g (2E,)`` over directed edges in CSR order.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

import torch

from ..graph.topology import Topology

__all__ = ["Topology", "Exchange", "ExchangeOutput", "ell_gather_sum"]


@dataclass
class ExchangeOutput:
    """What one secure exchange gives every agent: ``S (A, L*K)`` and ``rho (A,)``."""

    S: torch.Tensor
    rho: torch.Tensor


class Exchange(abc.ABC):
    """Base class of the step-5 exchange.

    Lifecycle: :meth:`bind` once with the run's topology, then per ADMM
    iteration :meth:`penalty_sums` (step 1, the agent's ``rho_i``) and
    :meth:`exchange` (step 5), and :meth:`close` at the end.
    """

    #: name used in configs and logs
    name: str = "base"
    #: the cumulative cost counters (a ``costmodel.CostLedger``) of kinds that count costs
    _ledger = None

    def __init__(self) -> None:
        self.topology: Topology | None = None

    @property
    def spec(self):
        """The :class:`~.spec.ExchangeSpec` this exchange was made from (equal settings), or
        None for an exchange kind without one (a custom subclass): such an exchange takes no
        flat values or options through :func:`~.spec.exchange_spec`."""
        return None

    def bind(self, topology: Topology, *, dtype: torch.dtype, device: torch.device, fuse: bool = False) -> None:
        """Attach the run's topology (moved to ``device``) before the first iteration.

        ``fuse`` is the solver's ``fuse``: kinds with tensor kernels of their own may
        compile them too (same numbers).
        """
        self.topology = topology.to(device)
        self.dtype = dtype
        self.device = device
        self.fuse = bool(fuse)

    def check_schedule(self, schedule: str, caps=None) -> None:
        """Refuse, before a run starts, a penalty schedule this kind cannot serve (a
        :class:`~ppdnmf_torch.errors.ConfigError`); every schedule is fine by default. ``caps``:
        the agents' penalty caps, ``(T, N)`` or ``(N,)``, when the caller has them."""

    @abc.abstractmethod
    def penalty_sums(self, g: torch.Tensor, *, bcd_iter: int = 0, admm_iter: int = 0) -> torch.Tensor:
        """``rho_i = sum_j g_{i->j} g_{j->i}`` as agent ``i`` obtains it, shape ``(A,)``."""

    def penalty_block(self, G: torch.Tensor, *, bcd_iter: int = 0) -> torch.Tensor | None:
        """``rho_i`` of several ADMM iterations at once, ``(n, A)`` from ``G (n, 2E)``, or None.

        Kinds whose step 1 costs nothing (no protocol round) compute the penalty sums of a
        whole X-step in one batched operation; the solver then passes the rows of ``G``
        (views of it, in order) to :meth:`exchange`. Kinds that run step 1 as a round of
        their own per iteration return None, and the solver calls :meth:`penalty_sums`.
        The numbers are the same either way.
        """
        return None

    def neighbour_operator(self, g: torch.Tensor, dtype: torch.dtype):
        """Step 5 as a padded gather, for a solver that fuses it into its own compiled graph.

        Returns ``(nbr, wv)``, LongTensor and ``dtype`` Tensor of shape ``(A, D)``, with
        ``S_i = sum_k wv[i, k] U[nbr[i, k]]`` (terms in order ``k``), or None when this
        kind has no such form: the integer kinds (quantization, range checks, cost
        accounting or encryption happen in :meth:`exchange`), or a graph whose degrees
        are too uneven to pad. A solver that uses it does not call :meth:`exchange`.
        """
        return None

    @abc.abstractmethod
    def exchange(
        self, U: torch.Tensor, g: torch.Tensor, *, bcd_iter: int = 0, admm_iter: int = 0,
        out: torch.Tensor | None = None,
    ) -> ExchangeOutput:
        """Step 5: ``S_i`` and ``rho_i`` for every agent from ``U (A, L*K)`` and ``g (2E,)``.

        ``out`` is an optional ``(A, L*K)`` buffer of ``U``'s dtype that ``S`` may be
        written into (the solver reuses buffers at large sizes); kinds may ignore it.
        """

    def costs(self) -> dict:
        """Cumulative cost counters of the exchange (empty for kinds that cost nothing)."""
        return {}

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration cost dicts (``bcd_iter``, ``admm_iter`` and the counters of
        that iteration) recorded since the last call; empty for kinds that cost nothing."""
        return []

    def bytes_per_edge(self) -> dict:
        """Cumulative bytes sent over each directed edge, ``{"i->j": bytes}`` (trial-0 node
        ids); kept out of :meth:`costs` so that it stays a flat dict of numbers."""
        return {}

    def cost_state(self) -> dict:
        """The cumulative counters as plain numbers, for a checkpoint (no key material).

        Kinds that keep a ``costmodel.CostLedger`` in ``_ledger`` get this for free; a
        subclass that counts in its own attributes overrides this and
        :meth:`load_cost_state`, or its counters restart when a run is resumed.
        """
        led = self._ledger
        if led is None:
            return {}
        return {"total": dict(led.total), "edges": dict(led.edges)}

    def load_cost_state(self, state: dict) -> None:
        """Continue the counters of an interrupted run (after :meth:`bind`): they are added to
        what this process has counted so far (a resumed ``paillier`` run's new keys, say)."""
        led = self._ledger
        if led is None or not state:
            return
        for k, v in state.get("total", {}).items():
            if k in led.total:
                led.total[k] += v
        for k, v in state.get("edges", {}).items():
            led.edges[k] = led.edges.get(k, 0) + v

    def close(self) -> None:
        """Release resources (worker pools, keys)."""

    def _pair_weights(self, g: torch.Tensor) -> torch.Tensor:
        """``rho_ij = g_{i->j} g_{j->i}`` per directed edge, float64, shape ``(..., 2E)``."""
        return g * g[..., self.topology.rev]


def ell_gather_sum(U, nbr, wv):
    """``S[i] = sum_k wv[i, k] U[nbr[i, k]]`` for ``U (A, C)``, terms added in slot order.

    Written for ``torch.compile`` (one pass, the gathers fused); eager it would
    materialize every gathered row.
    """
    acc = wv[:, 0:1] * U[nbr[:, 0]]
    for k in range(1, nbr.shape[1]):
        acc = acc + wv[:, k:k + 1] * U[nbr[:, k]]
    return acc
