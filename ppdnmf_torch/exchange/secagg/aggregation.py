"""``make_aggregator("secagg", K)``: a server that learns the sum of the workers' uploads and nothing
else, by pairwise masks (Bonawitz et al., CCS 2017), the classic case of secure aggregation.

The same protocol as the exchange (:mod:`.network`) with one group: the server (node ``K``) is the
receiver, the ``K`` workers its senders; pairs of workers share a pair seed on the aggregation's
mask graph (:func:`~..secure_sum.mask_pairs`: every pair, or ``mask_neighbours`` ring partners), and
every worker shares an edge seed with the server. Setup, once per aggregator: every worker sends
the server its signed ephemeral key, the server sends its own to every worker and relays to each
worker the keys of its mask partners (which it cannot use: X25519); every party derives its seeds.
Round ``r``: worker ``i`` uploads ``y_i = q_i + sum_k sigma_ik PRG(s_ik, r) + PRG(s_iS, r) mod 2^64``;
the server adds the uploads and subtracts ``sum_i PRG(s_iS, r)``: ``sum_i q_i``, exact.

Integers, range and decoding are :class:`~..secure_sum.IntegerAggregator`'s, as for ``quantized``
and ``paillier``: the three return the same bits (``bits`` and ``key_bits`` set the range exactly
as they do for ``quantized``; no Paillier key is made). What the server sees: each upload, less its
edge mask, is ``q_i`` plus pair masks it does not know (uniform on ``Z_{2^64}`` for ``K >= 2``), and
jointly only the sum; an eavesdropper sees the uploads with their edge masks too, so not even the
sum.
"""
from __future__ import annotations

import numpy as np
import torch

from ..secure_sum import DEFAULT_N_MAX, IntegerAggregator
from .ledger import SecAggLedger
from .network import SecAggNetwork
from .plan import SecAggPlan, edge_tag, pair_tag
from .prg import as_words, counter_blocks, stream_rows

__all__ = ["SecAggAggregator"]

#: the network's counters, as the aggregator reports them
_ROUND = {"messages": "messages", "message_bytes": "bytes", "prg_bytes": "prg_bytes", "time_prg": "seconds_prg",
          "time_mask": "seconds_mask"}
_SETUP = {"setup_key_agreements": "setup_key_agreements", "setup_signatures": "setup_signatures",
          "setup_verifications": "setup_verifications", "setup_bytes": "setup_bytes", "time_setup": "seconds_setup"}


class SecAggAggregator(IntegerAggregator):
    """``kind="secagg"`` (module docstring). Parameters as :class:`~..aggregation.QuantizedAggregator`
    (``n_max``, ``bits``, ``key_bits``: the range; ``record``, ``mask_neighbours``); no ``seed``: the
    seeds are agreed by the parties, never derived from an integer.

    Costs: per round ``messages`` (``K``), ``bytes`` (``8 K P``), ``prg_bytes`` (every party's
    keystreams), ``seconds_prg``, ``seconds_mask``; once ``setup_key_agreements``,
    ``setup_signatures``, ``setup_verifications``, ``setup_bytes``, ``seconds_setup``.
    """

    kind = "secagg"
    __slots__ = ()

    def __init__(self, n_workers: int, *, n_max=DEFAULT_N_MAX, bits=None, key_bits: int = 2048, record: bool = False,
                 mask_neighbours=None):
        super().__init__(n_workers, n_max=n_max, bits=bits, key_bits=key_bits, record=record,
                         mask_neighbours=mask_neighbours)
        K = self.n_workers
        self._led = SecAggLedger(0)
        self._wire = [] if record else None
        plan = SecAggPlan({K: range(K)}, pairs={K: self.pairs})
        self._net = SecAggNetwork(plan, [(K, i) for i in range(K)], self._led, self._wire,
                                  name=lambda n: "the server" if n == K else f"worker {n}")
        self._net.agree()
        for src, dst in _SETUP.items():
            self._add(dst, self._led.total[src])

    def _masked_sum(self, q):
        K, P = q.shape
        led = self._led
        before = {k: led.total[k] for k in _ROUND}
        s = torch.from_numpy(self._net.masked_sums(q.cpu().numpy(), np.arange(K))[0].copy())
        for src, dst in _ROUND.items():
            self._add(dst, led.total[src] - before[src])
        if self.record:
            ups = [m.payload for m in self._wire[-K:]]
            self._wire.clear()  # the uploads go into the aggregator's own transcript
            self.transcript.append({"round": self.rounds, "uploads": torch.from_numpy(np.stack(ups))})
        return s

    # -- what the audit's adversaries compute (never a key or a seed) ---------------------------
    def _stream(self, owner: int, tag, round_no: int, count: int) -> torch.Tensor:
        rows = stream_rows(1, count)
        self._net.parties[owner].fill([(0, tag, self.n_workers)], {self.n_workers: counter_blocks(
            round_no, self.n_workers, count)}, rows)
        return torch.from_numpy(as_words(rows, count)[0].copy())

    def mask_stream(self, worker: int, peer: int, round_no: int, count: int) -> torch.Tensor:
        """What ``worker`` computes with its seed shared with ``peer``: the pair's keystream of a round."""
        return self._stream(worker, pair_tag(self.n_workers, worker, peer), round_no, count)

    def edge_stream(self, worker: int, round_no: int, count: int) -> torch.Tensor:
        """What the server computes with its seed shared with ``worker``: that edge's keystream of a round."""
        return self._stream(self.n_workers, edge_tag(worker, self.n_workers), round_no, count)

    def _forget(self) -> None:
        net = getattr(self, "_net", None)
        if net is not None:
            net.close()

    def __repr__(self) -> str:
        return (f"SecAggAggregator(n_workers={self.n_workers}, n_max={self.n_max:g}, bits={self.bits}, "
                f"rounds={self.rounds}, {len(self.pairs)} pair seeds)")
