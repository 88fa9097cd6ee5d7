"""``exchange="quantized"``: the integer protocol emulated exactly on the device (int64).

With ``cost_model=True`` it also counts the Paillier operations and the traffic that the
real stage (``exchange="paillier"``) would need for the chosen ``protocol``, with the
formulas of :mod:`ppdnmf_torch.exchange.costmodel`, and turns them into estimated host
seconds at the configured key size (:func:`~ppdnmf_torch.exchange.costmodel.calibrate`,
measured once, lazily, the first time an estimate is asked for).
"""
from __future__ import annotations

import torch

from .._utils import ConfigError, sparse_matmul
from .base import Exchange, ExchangeOutput
from .codec import IntegerCodec, abs_max
from .costmodel import (
    COUNT_KEYS,
    CostLedger,
    PaillierOpCosts,
    calibrate,
    estimate_seconds,
    round_counts,
    round_edge_bytes,
)
from .packing import check_protocol_range, derive_layout

__all__ = ["QuantizedExchange", "integer_neighbour_sums", "encode_inputs", "encode_penalties",
           "integer_penalty_sums", "Step1Penalties"]

_PROTOCOLS = ("aggregated", "paper")


def integer_neighbour_sums(q: torch.Tensor, w: torch.Tensor, topology, buffers=None):
    """``S_int_i = sum_j w_ij (q_j - q_i)`` and ``rho_int_i = sum_j w_ij`` in exact int64.

    ``buffers``, optional: ``(float64, float64, int64)`` tensors of ``q``'s shape that the
    float path below computes in and writes ``S_int`` to, instead of fresh ones (the same
    values either way).

    Parameters
    ----------
    q : int64 Tensor (A, L*K)
    w : int64 Tensor (2E,)
        ``gamma_ij gamma_ji`` per directed edge ``i -> j``.
    topology : Topology
        The ``A`` nodes and their directed edges (CSR order).

    Integer addition is associative, so the result does not depend on the order in
    which ``index_add_`` accumulates (unlike floats): it is deterministic on every device.
    """
    src, dst, n_nodes = topology.src, topology.dst, topology.n_nodes
    rho_int = integer_penalty_sums(w, src, n_nodes)
    if src.numel() and q.numel():
        # Exact in float64 while every partial sum is an integer below 2^53, which the
        # bound sum_j w_ij (|q_j| + |q_i|) <= 2 max|q| max(w) max(deg) guarantees: then a
        # sparse float matmul (no (2E, L*K) gather) gives the same integers in any order.
        bound = 2.0 * abs_max(q) * float(w.abs().max()) * int(topology.degree.max())
        if bound < _FLOAT_EXACT:
            qf_buf, S_buf, out = (None, None, None) if buffers is None else buffers
            qf = q.to(torch.float64) if qf_buf is None else qf_buf.copy_(q)
            W = topology.neighbour_matrix(w.to(torch.float64))
            S = sparse_matmul(W, qf, S_buf).addcmul_(rho_int.to(torch.float64)[:, None], qf, value=-1.0)
            return (S.to(torch.int64) if out is None else out.copy_(S)), rho_int
    S_int = torch.zeros((n_nodes,) + tuple(q.shape[1:]), dtype=torch.int64, device=q.device)
    if src.numel():
        S_int.index_add_(0, src, w[:, None] * (q[dst] - q[src]))
    return S_int, rho_int


#: integers up to 2^53 are exact in float64
_FLOAT_EXACT = float(2**53)


def integer_penalty_sums(w: torch.Tensor, src, n_nodes: int) -> torch.Tensor:
    """``rho_int_i = sum_j w_ij`` (int64, shape ``(A,)``)."""
    rho_int = torch.zeros(n_nodes, dtype=torch.int64, device=w.device)
    rho_int.index_add_(0, src, w)
    return rho_int


def encode_penalties(codec: IntegerCodec, topology, g, *, bcd_iter=0, admm_iter=0):
    """``(gamma, w)``: the integer penalties and ``w = gamma_ij gamma_ji`` (int64, ``(2E,)``),
    range-checked (:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.check_penalty_sums`)."""
    gamma = codec.encode_penalties(g)
    w = codec.pair_weights(gamma, topology.rev)
    codec.check_penalty_sums(gamma, w, topology.src, n_nodes=topology.n_nodes, n_agents=topology.n_agents,
                             bcd_iter=bcd_iter, admm_iter=admm_iter)
    return gamma, w


class Step1Penalties:
    """Step 1's integer penalties ``(gamma, w)``, handed to step 5 of the same ADMM iteration.

    The solver gives step 5 the very tensor ``g`` it gave step 1, so step 5 need not encode
    and range-check the penalties again: :meth:`encode` encodes (:func:`encode_penalties`)
    and keeps them, :meth:`take` hands them over once, for that same tensor only (None for
    another ``g`` or a direct call of step 5, which then encodes its own).
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._g = self._penalties = None

    def encode(self, codec: IntegerCodec, topology, g, *, bcd_iter=0, admm_iter=0):
        gamma, w = encode_penalties(codec, topology, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        self._g, self._penalties = g, (gamma, w)
        return gamma, w

    def take(self, g):
        penalties = self._penalties if self._g is g else None
        self.clear()
        return penalties


def encode_inputs(codec: IntegerCodec, topology, U, g, *, bcd_iter=0, admm_iter=0, penalties=None, buffers=None):
    """Quantize and range-check step 5's inputs, as every integer exchange kind does.

    Returns ``(q (A, L*K), gamma (2E,), w (2E,))`` as int64 on ``U``'s device, with
    ``w = gamma_ij gamma_ji``. Raises :class:`~ppdnmf_torch.exchange.codec.CodecRangeError`
    (naming agent, iteration, value and limit) before anything is sent or encrypted.
    ``penalties``: ``(gamma, w)`` of ``g`` from :func:`encode_penalties` (step 1's), reused.
    ``buffers``: ``(float64, int64)`` tensors of ``U``'s shape for the scaled values and
    ``q`` (:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.encode_values`), optional.
    """
    scratch, out = (None, None) if buffers is None else buffers
    q = codec.encode_values(U, n_agents=topology.n_agents, bcd_iter=bcd_iter, admm_iter=admm_iter,
                            scratch=scratch, out=out)
    if penalties is None:
        penalties = encode_penalties(codec, topology, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
    gamma, w = penalties
    codec.check_sums(
        q, w, topology.src, topology.dst, n_nodes=topology.n_nodes, n_agents=topology.n_agents,
        bcd_iter=bcd_iter, admm_iter=admm_iter,
    )
    return q, gamma, w


class QuantizedExchange(Exchange):
    """Emulates the Paillier exchange's integer arithmetic without encryption.

    Parameters
    ----------
    codec : IntegerCodec
        Shared with :class:`~ppdnmf_torch.exchange.paillier.PaillierExchange`; its limit is
        the one of the key size it stands in for.
    protocol : {"aggregated", "paper"}
        The message pattern whose cost the model counts (the numbers are the same).
    cost_model : bool or PaillierOpCosts
        ``False`` (default): no accounting, :meth:`costs` is empty. ``True``: count the
        operations the real stage would perform and estimate their host time at
        ``codec.key_bits`` (calibrated lazily on first use). A :class:`PaillierOpCosts`
        uses those per-operation costs instead of measuring.
    packing : bool
        Count the operations of the packed protocol (``S`` values per plaintext,
        :mod:`~ppdnmf_torch.exchange.packing`), as ``exchange="paillier"`` with
        ``packing=True`` (its default) performs them. Default False: the unpacked
        protocol (the paper's counts; ``exchange="paillier"`` with ``fast=False`` or
        ``packing=False``). Changes the counts only, never the numbers.
    slot_bits : int, optional
        As for ``exchange="paillier"``: narrower slots (counts only; with ``packing``).
    """

    name = "quantized"

    def __init__(self, codec: IntegerCodec, *, protocol: str = "aggregated", cost_model=False, packing: bool = False,
                 slot_bits=None):
        super().__init__()
        if protocol not in _PROTOCOLS:
            raise ConfigError(f"protocol: unknown protocol {protocol!r}; use one of {_PROTOCOLS}")
        if not isinstance(cost_model, (bool, PaillierOpCosts)):
            raise ConfigError(f"cost_model: expected True, False or PaillierOpCosts, got {cost_model!r}")
        if not isinstance(packing, bool):
            raise ConfigError(f"packing: expected True or False, got {packing!r}")
        layout = derive_layout(codec, packing=packing, slot_bits=slot_bits)
        #: values per plaintext whose counts the cost model predicts (1: unpacked)
        self.slots = layout.slots
        # the range checks of exchange="paillier" with the same packing and slot_bits
        self._layout = layout
        self._bufs = None  # see _buffers
        self.codec = codec
        self.protocol = protocol
        self.cost_model = cost_model is not False
        self._op_costs = cost_model if isinstance(cost_model, PaillierOpCosts) else None
        self._ledger = None
        self._step1 = Step1Penalties()

    # -- lifecycle ---------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        self._step1.clear()
        if self.cost_model:
            topo = self.topology
            self._src = topo.src.cpu().tolist()
            self._dst = topo.dst.cpu().tolist()
            self._n_senders = int((topo.degree > 0).sum())
            self._ledger = CostLedger(topo.n_agents, timers=False)
            self._round_bytes = {}
            self._last_gamma = None

    # -- the exchange ------------------------------------------------------------------
    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        topo = self.topology
        gamma, w = self._step1.encode(self.codec, topo, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        rho_int = integer_penalty_sums(w, topo.src, topo.n_nodes)
        if self._ledger is not None:
            self._ledger.begin(bcd_iter, admm_iter)
            if self.protocol == "aggregated":
                self._count_round("penalty", 0)
                self._last_gamma = gamma
        return self.codec.decode_rho(rho_int)

    def encode(self, U, g, *, bcd_iter=0, admm_iter=0):
        """Quantize and range-check: returns ``(q (A, L*K), w (2E,))`` as int64."""
        q, _, w = encode_inputs(self.codec, self.topology, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        return q, w

    #: from this size of ``U`` (bytes) up, an exchange computes in buffers it keeps (two
    #: float64, two int64 of ``U``'s shape) instead of fresh tensors, whose first touch of
    #: every page costs more than the arithmetic (by hand at N = 2000 with CBCL sizes: 0.61 s
    #: per call without them, 0.21 s with them)
    BUFFER_MIN_BYTES = 1 << 20

    def _buffers(self, U):
        """``(float64, float64, int64, int64)`` buffers of ``U``'s shape, or None for small ``U``."""
        if U.numel() * 8 < self.BUFFER_MIN_BYTES:
            return None
        bufs = self._bufs
        if bufs is None or bufs[0].shape != U.shape or bufs[0].device != U.device:
            bufs = self._bufs = tuple(torch.empty(U.shape, dtype=dt, device=U.device)
                                      for dt in (torch.float64, torch.float64, torch.int64, torch.int64))
        return bufs

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None):
        topo = self.topology
        bufs = self._buffers(U)
        # float buffer 0 holds the scaled values, then q as floats; int buffer 0 holds q
        q, gamma, w = encode_inputs(self.codec, topo, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter,
                                    penalties=self._step1.take(g), buffers=None if bufs is None else bufs[::2])
        check_protocol_range(self.codec, self._layout, topo, self.protocol, q, gamma, w, bcd_iter=bcd_iter,
                             admm_iter=admm_iter)
        S_int, rho_int = integer_neighbour_sums(q, w, topo, None if bufs is None else (bufs[0], bufs[1], bufs[3]))
        if self._ledger is not None:
            self._ledger.begin(bcd_iter, admm_iter)
            if self.protocol == "aggregated":
                # the real stage reuses step 1's rho_i when the penalties are the same,
                # and runs the mini-round here otherwise
                last = self._last_gamma
                if last is None or not torch.equal(last, gamma):
                    self._count_round("penalty", 0)
                    self._last_gamma = gamma
            self._count_round("exchange", int(q.shape[1]) if q.dim() > 1 else 1)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype, out=out)
        return ExchangeOutput(S, rho)

    # -- cost model --------------------------------------------------------------------
    def _count_round(self, phase: str, lk: int) -> None:
        led = self._ledger
        led.add_counts(round_counts(self.protocol, phase, n_edges=len(self._src),
                                    n_senders=self._n_senders, lk=lk, slots=self.slots))
        key = (phase, lk)
        if key not in self._round_bytes:
            self._round_bytes[key] = round_edge_bytes(self.protocol, phase, self._src, self._dst,
                                                      key_bits=self.codec.key_bits, lk=lk, slots=self.slots)
        for a, b, nbytes in self._round_bytes[key]:
            led.add_edge_bytes(a, b, nbytes)

    @property
    def op_costs(self) -> PaillierOpCosts:
        """Per-operation seconds at ``codec.key_bits`` (measured on first access)."""
        if self._op_costs is None:
            self._op_costs = calibrate(self.codec.key_bits)
        return self._op_costs

    def costs(self) -> dict:
        """Predicted counts of the real stage, and ``estimated_seconds`` (empty without the model).

        Keys: :data:`~ppdnmf_torch.exchange.costmodel.COUNT_KEYS`, ``key_pairs``,
        ``estimated_seconds`` (the operations, serial, on this host) and
        ``estimated_seconds_keygen`` (one key pair per node, serial).
        """
        if self._ledger is None:
            return {}
        out = {k: self._ledger.total[k] for k in COUNT_KEYS}
        out["key_pairs"] = self.topology.n_nodes
        oc = self.op_costs
        out["estimated_seconds"] = estimate_seconds(out, oc)
        out["estimated_seconds_keygen"] = self.topology.n_nodes * oc.keygen
        return out

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration predicted counts since the last call, with ``estimated_seconds``."""
        if self._ledger is None:
            return []
        records = self._ledger.pop()
        if records:
            oc = self.op_costs
            for rec in records:
                rec["estimated_seconds"] = estimate_seconds(rec, oc)
        return records

    def bytes_per_edge(self) -> dict:
        """Predicted bytes sent ``"i->j"`` (trial-0 node ids), cumulative."""
        return {} if self._ledger is None else dict(self._ledger.edges)
