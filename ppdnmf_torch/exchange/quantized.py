"""``exchange="quantized"``: the integer protocol emulated exactly on the device (int64).

With ``cost_model=True`` it also counts the Paillier operations and the traffic that the
real stage (``exchange="paillier"``) would need for the chosen ``protocol``, with the
formulas of :mod:`ppdnmf_torch.exchange.costmodel`, and turns them into estimated host
seconds at the configured key size (:func:`~ppdnmf_torch.exchange.paillier.calibration.calibrate`,
measured once, lazily, the first time an estimate is asked for: the one place where this
kind imports the Paillier stage).
"""
from __future__ import annotations

import torch

from .base import Exchange, ExchangeOutput
from .codec import IntegerCodec
from .costmodel import (COUNT_KEYS, SETUP_KEYS, CostLedger, PaillierOpCosts, add_estimates, estimate_seconds,
                        round_counts, round_edge_bytes, setup_counts)
from .integer import Step1Penalties, encode_inputs, integer_neighbour_sums, integer_penalty_sums
from .packing import check_protocol_range, derive_layout
from .spec import QuantizedSpec

__all__ = ["QuantizedExchange"]


class QuantizedExchange(Exchange):
    """Emulates the Paillier exchange's integer arithmetic without encryption.

    Parameters
    ----------
    codec : IntegerCodec
        Shared with :class:`~ppdnmf_torch.exchange.paillier.PaillierExchange`; its limit is
        the one of the key size it stands in for.
    protocol : {"masked", "aggregated", "paper"}
        The message pattern whose cost the model counts (the numbers are the same), and
        whose range checks it applies (``masked`` decrypts ``sum_j rho_ij q_j`` slot by slot:
        :func:`~ppdnmf_torch.exchange.packing.check_masked_sums`).
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

    def __init__(self, codec: IntegerCodec, *, protocol: str = "masked", cost_model=False, packing: bool = False,
                 slot_bits=None):
        super().__init__()
        # the settings' rules (the spec's); the same spec comes back from ``spec``
        self._spec = QuantizedSpec(protocol=protocol, n_max=codec.n_max, key_bits=codec.key_bits,
                                   g_bits=codec.g_bits, cost_model=cost_model, packing=packing, slot_bits=slot_bits)
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

    @property
    def spec(self) -> QuantizedSpec:
        return self._spec

    # -- lifecycle ---------------------------------------------------------------------
    def bind(self, topology, *, dtype, device, fuse=False):
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        self._step1.clear()
        if self.cost_model:
            topo = self.topology
            self._src = topo.src.cpu().tolist()
            self._dst = topo.dst.cpu().tolist()
            self._n_senders = int((topo.degree > 0).sum())
            masked = self.protocol == "masked"
            self._ledger = CostLedger(topo.n_agents, timers=False, setup=masked)
            self._round_bytes = {}
            self._last_gamma = None
            if masked:  # the seed agreement, once per bound exchange (outside every iteration)
                self._ledger.add_counts(setup_counts(self._src, self._dst, key_bits=self.codec.key_bits))

    # -- the exchange ------------------------------------------------------------------
    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        topo = self.topology
        gamma, w = self._step1.encode(self.codec, topo, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        rho_int = integer_penalty_sums(w, topo.src, topo.n_nodes)
        if self._ledger is not None:
            self._ledger.begin(bcd_iter, admm_iter)
            if self.protocol != "paper":
                self._count_round("penalty", 0)
                self._last_gamma = gamma
        return self.codec.decode_rho(rho_int)

    def encode(self, U, g, *, bcd_iter=0, admm_iter=0):
        """Quantize and range-check: returns ``(q (A, L*K), w (2E,))`` as int64."""
        q, _, w = encode_inputs(self.codec, self.topology, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        return q, w

    #: from this size of ``U`` (bytes) up, an exchange computes in buffers it keeps (two
    #: float64, two int64 of ``U``'s shape) instead of fresh tensors, whose first touch of
    #: every page costs more than the arithmetic (see docs/PERFORMANCE.md)
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
            if self.protocol != "paper":
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
            from .paillier.exchange import calibrate_for  # at the point of use: it imports phe

            self._op_costs = calibrate_for(self._spec)
        return self._op_costs

    def costs(self) -> dict:
        """Predicted counts of the real stage, and ``estimated_seconds`` (empty without the model).

        Keys: :data:`~ppdnmf_torch.exchange.costmodel.COUNT_KEYS`, ``key_pairs``,
        ``estimated_seconds`` (the operations, serial, on this host) and
        ``estimated_seconds_keygen`` (one key pair per node, serial); under ``masked`` also
        :data:`~ppdnmf_torch.exchange.costmodel.SETUP_KEYS` and ``estimated_seconds_setup``
        (the seed agreement, once per run, apart from the rounds); ``estimated_seconds_total``,
        their sum (:func:`~ppdnmf_torch.exchange.costmodel.run_seconds`, the figure the CLI
        prints before a ``paillier`` run of the same settings).
        """
        if self._ledger is None:
            return {}
        out = {k: self._ledger.total[k] for k in COUNT_KEYS}
        out["key_pairs"] = self.topology.n_nodes
        masked = self.protocol == "masked"
        if masked:
            out.update({k: self._ledger.total[k] for k in SETUP_KEYS})
        # the run it stands in for generates one key pair per node
        return add_estimates(out, self.op_costs, setup=masked)

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
