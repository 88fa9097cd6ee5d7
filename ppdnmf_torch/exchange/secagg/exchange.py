"""``exchange="secagg"``: step 5 of the X-step by pairwise-masked secure aggregation.

Under ``penalty_schedule="agreed"`` (the default) every edge of a trial carries one common penalty
in an ADMM iteration, so agent ``i``'s weights are all ``w = gamma^2`` and

    S_int_i = sum_j w (q_j - q_i) = w (sum_{j in N_i} q_j) - rho_int_i q_i,     rho_int_i = d_i w:

what ``i`` needs from its neighbours is the plain sum of their integers, which secure aggregation
(Bonawitz et al., CCS 2017) gives it and nothing else. Per ADMM iteration:

* step 1 costs nothing: ``i`` knows ``w`` (its own draw, squared) and its degree;
* step 5: every neighbour ``j`` sends ``i`` its ``q_j`` under pairwise masks (:mod:`.network`), ``i``
  adds the messages and removes its edge masks: ``sum_j q_j`` exactly.

The integers are those of ``exchange="quantized"`` (the same codec, :func:`~..integer.encode_inputs`,
and the same range checks as its default ``protocol="masked"``, which decrypts the same
``sum_j w q_j``; so ``secagg`` refuses a run exactly where ``quantized`` does), and ``S``, ``rho`` go
through the same :meth:`~..codec.IntegerCodec.decode`: bit for bit the same as ``quantized`` and
``paillier``.

Per-edge weights (``penalty_schedule="paper"`` or ``"adaptive"``, unequal caps) have no such
sum: :meth:`SecAggExchange.check_schedule` refuses them before a run, and every call checks that
each receiver's weights are equal.

Seeds: agreed in :meth:`~SecAggExchange.bind` (X25519 keys signed with Ed25519 identity keys, HKDF;
the pair seeds of two neighbours of ``i`` through ``i``, which relays public keys only), afresh in
every bound run (a resumed run agrees new seeds; its numbers do not depend on them). Masks:
AES-128-CTR keystreams (:mod:`.prg`) keyed per (seed, round, receiver). Costs: :mod:`.ledger`.
"""
from __future__ import annotations

import time

import torch

from ...errors import ConfigError
from ..base import Exchange, ExchangeOutput
from ..codec import IntegerCodec
from ..integer import encode_inputs, encode_penalties, integer_penalty_sums
from ..packing import check_protocol_range, derive_layout
from ..sealed import HoldsPrivateKey
from ..spec import SecAggSpec
from .ledger import SecAggLedger
from .network import SecAggNetwork
from .plan import SecAggPlan

__all__ = ["SecAggExchange", "unequal_weights_message", "check_equal_weights"]


def unequal_weights_message(where: str) -> str:
    """The one line that refuses per-edge weights (``where``: what has them)."""
    return (f"exchange: 'secagg' gives each agent the plain sum of its neighbours' values, which needs every "
            f"edge of a receiver to carry one weight; {where}. Use {{penalty_schedule}}='agreed' (one common "
            "penalty per edge), or exchange='paillier' (or 'plain': nothing protected) for per-edge weights")


def check_equal_weights(w: torch.Tensor, topology, *, bcd_iter=0, admm_iter=0) -> None:
    """Refuse (:class:`ConfigError`) integer weights ``w (..., 2E)`` that differ across a receiver's edges."""
    if w.shape[-1] == 0:
        return
    first = w[..., topology.crow[topology.src]]
    bad = w != first
    if not bool(bad.any()):
        return
    e = int(torch.nonzero(bad.reshape(-1, w.shape[-1]).any(0))[0, 0])
    trial, agent = divmod(int(topology.src[e]), max(1, int(topology.n_agents)))
    raise ConfigError(unequal_weights_message(
        f"agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, ADMM iteration {admm_iter} has unequal "
        "weights gamma_ij gamma_ji across its neighbours"))


class SecAggExchange(HoldsPrivateKey, Exchange):
    """The secure exchange by pairwise masks (module docstring).

    Parameters
    ----------
    codec : IntegerCodec
        Quantization (``n_max``, ``g_bits``) and range (``key_bits`` only sets the range: the int64
        limit ``2^62`` from 65 bits up; no Paillier key is made).
    record_transcript : bool
        Keep every message on the wire (:class:`~.network.WireMessage`; the audit and tests).
    """

    name = "secagg"

    def __init__(self, codec: IntegerCodec, *, record_transcript: bool = False):
        super().__init__()
        self._spec = SecAggSpec(n_max=codec.n_max, g_bits=codec.g_bits, record_transcript=record_transcript)
        self.codec = codec
        self._layout = derive_layout(codec, packing=False)
        self._ledger = SecAggLedger(0)
        self._net = None
        self._bufs = None
        self._closed = False
        #: every message on the wire when recording (signed keys, masked messages)
        self.transcript: list | None = [] if record_transcript else None

    @property
    def spec(self) -> SecAggSpec:
        return self._spec

    # -- lifecycle ---------------------------------------------------------------------
    def check_schedule(self, schedule: str, caps=None) -> None:
        """Refuse, before a run, a penalty schedule with per-edge weights (``paper``, ``adaptive``)."""
        if schedule != "agreed":
            raise ConfigError(unequal_weights_message(f"penalty_schedule={schedule!r} draws a weight per edge"))

    def bind(self, topology, *, dtype, device, fuse=False):
        """Make the parties and agree the seeds of this run (new ones on every bind)."""
        if self._closed:
            raise RuntimeError("SecAggExchange: closed (its keys and seeds are gone); make a new exchange")
        super().bind(topology, dtype=dtype, device=device, fuse=fuse)
        if self._net is not None:
            self._net.close()
        topo = self.topology
        src, dst = topo.src.cpu().tolist(), topo.dst.cpu().tolist()
        groups: dict = {}
        for i, j in zip(src, dst):
            groups.setdefault(i, []).append(j)
        self._ledger = SecAggLedger(topo.n_agents)
        # message e carries q_{dst[e]} to src[e]: the CSR edge order
        N = max(1, topo.n_agents)
        self._net = SecAggNetwork(SecAggPlan(groups), list(zip(src, dst)), self._ledger, self.transcript,
                                  name=lambda n: f"agent {n % N} (trial {n // N})")
        self._net.agree()
        self._senders = topo.dst.cpu().numpy()
        receivers = self._net.rows.receivers
        self._receivers = None if receivers == list(range(topo.n_nodes)) else torch.tensor(receivers,
                                                                                           dtype=torch.int64)
        self._linked = topo.degree > 0
        self._first = topo.crow[:-1].clamp(max=max(0, topo.src.numel() - 1))
        self._bufs = None

    def close(self) -> None:
        """Drop every key and seed; the exchange cannot be used again."""
        if self._net is not None:
            self._net.close()
        self._net = None
        self._closed = True

    def _check_ready(self):
        if self._closed:
            raise RuntimeError("SecAggExchange: closed (its keys and seeds are gone); make a new exchange")
        if self.topology is None:
            raise RuntimeError("SecAggExchange: call bind() before the first exchange")

    def _buffers(self, U):
        """``(float64, int64, int64)`` buffers of ``U``'s shape (the scaled values, ``q``, ``S_int``) from
        quantized's size up (:attr:`~..quantized.QuantizedExchange.BUFFER_MIN_BYTES`), else None."""
        from ..quantized import QuantizedExchange

        if U.numel() * 8 < QuantizedExchange.BUFFER_MIN_BYTES:
            return None
        bufs = self._bufs
        if bufs is None or bufs[0].shape != U.shape or bufs[0].device != U.device:
            bufs = self._bufs = tuple(torch.empty(U.shape, dtype=dt, device=U.device)
                                      for dt in (torch.float64, torch.int64, torch.int64))
        return bufs

    # -- step 1 ------------------------------------------------------------------------
    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        """``rho_i = d_i w / 4^s``: no round, ``i`` knows its weight and its degree."""
        self._check_ready()
        topo = self.topology
        _, w = encode_penalties(self.codec, topo, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        check_equal_weights(w, topo, bcd_iter=bcd_iter, admm_iter=admm_iter)
        return self.codec.decode_rho(integer_penalty_sums(w, topo.src, topo.n_nodes))

    # -- step 5 ------------------------------------------------------------------------
    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0, out=None, dropped=None):
        """``S_i`` and ``rho_i`` through the masked sums. ``dropped``: nodes that do not answer this
        round (a simulated dropout: refused with :class:`~.network.DroppedNeighbourError`)."""
        self._check_ready()
        topo, net = self.topology, self._net
        net.begin(bcd_iter, admm_iter)
        bufs = self._buffers(U)
        q, gamma, w = encode_inputs(self.codec, topo, U, g, bcd_iter=bcd_iter, admm_iter=admm_iter,
                                    buffers=None if bufs is None else bufs[:2])
        check_equal_weights(w, topo, bcd_iter=bcd_iter, admm_iter=admm_iter)
        check_protocol_range(self.codec, self._layout, topo, "masked", q, gamma, w, bcd_iter=bcd_iter,
                             admm_iter=admm_iter)
        net.check_answers(dropped)
        rho_int = integer_penalty_sums(w, topo.src, topo.n_nodes)
        if self._senders.size:
            A = torch.from_numpy(net.masked_sums(q.cpu().numpy(), self._senders))
        t0 = time.perf_counter()
        if not self._senders.size:
            A = torch.zeros(tuple(q.shape), dtype=torch.int64)
        elif self._receivers is not None:  # agents without neighbours: no sum
            A = torch.zeros(tuple(q.shape), dtype=torch.int64).index_copy_(0, self._receivers, A)
        # w of each receiver (equal over its edges), then S_int_i = w sum_j q_j - rho_int_i q_i, exact:
        # |w sum_j q_j| <= sum_j w |q_j| < 2^62 and |S_int_i| < 2^62, both checked above
        if w.numel():
            w_node = torch.where(self._linked, w[self._first], 0)[:, None]
        else:  # no edge at all (one agent): every sum is empty
            w_node = torch.zeros((q.shape[0], 1), dtype=w.dtype, device=w.device)
        S_int = torch.mul(A.to(q.device), w_node, out=None if bufs is None else bufs[2])
        S_int.addcmul_(rho_int[:, None], q, value=-1)
        self._ledger.add("time_mask", time.perf_counter() - t0)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype, out=out)
        return ExchangeOutput(S, rho)

    # -- costs -------------------------------------------------------------------------
    def costs(self) -> dict:
        """Cumulative counters (:mod:`.ledger`): per round and, once, the setup."""
        return self._ledger.costs()

    def pop_iteration_costs(self) -> list:
        """Per-ADMM-iteration counters since the last call (``bcd_iter``, ``admm_iter``, ...)."""
        return self._ledger.pop()

    def bytes_per_edge(self) -> dict:
        """Cumulative bytes sent ``"j->i"`` (trial-0 node ids): the masked messages."""
        return dict(self._ledger.edges)

    def __repr__(self) -> str:
        parties = 0 if self._net is None else len(self._net.parties)
        return (f"SecAggExchange(n_max={self.codec.n_max:g}, g_bits={self.codec.g_bits}, parties={parties}"
                f"{', closed' if self._closed else ''})")
