"""Costs of a distributed run: the integer kinds' operation counts per rank, summed across
ranks (:class:`RankLedger`), and the bytes a rank's halo sends per ADMM iteration
(:func:`halo_bytes`, the model the measured traffic is checked against).

The counts of :mod:`ppdnmf_torch.exchange.costmodel` are sums over directed edges and
agents, so a rank counts the rounds of its own agents (the edges out of them, the agents
with a neighbour) and the sum over ranks is the single-process count, bit for bit.
"""
from __future__ import annotations

import torch

from ..exchange.costmodel import (COUNT_KEYS, SETUP_KEYS, CostLedger, add_estimates, estimate_seconds, round_counts,
                                  round_edge_bytes, setup_counts)
from ..exchange.packing import derive_layout
from ..exchange.spec import QuantizedSpec

__all__ = ["RankLedger", "halo_bytes", "flag_bytes", "cut_protocol_bytes", "AGREED_DECISION_BYTES"]


class RankLedger:
    """The cost counters of one rank's agents (``exchange="quantized"``, ``cost_model`` on).

    Counts what :class:`~ppdnmf_torch.exchange.quantized.QuantizedExchange` counts, for the
    rank's edges only; :meth:`costs` and :meth:`pop` sum across ranks (collectives: every
    rank calls them at the same points, as the solver does).
    """

    def __init__(self, layout, spec: QuantizedSpec, comm):
        self.layout, self.spec, self.comm = layout, spec, comm
        self.protocol = spec.protocol
        self.codec = spec.codec()
        self.slots = derive_layout(self.codec, packing=spec.packing, slot_bits=spec.slot_bits).slots
        self._op_costs = spec.cost_model if not isinstance(spec.cost_model, bool) else None
        self.led = CostLedger(layout.n_agents, timers=False, setup=self.protocol == "masked")

    # the cumulative counters, as the base Exchange's cost_state / load_cost_state read them
    @property
    def total(self) -> dict:
        return self.led.total

    @property
    def edges(self) -> dict:
        return self.led.edges

    def bind(self) -> None:
        lay = self.layout
        topo = lay.ext_topology
        self._src = lay.ext_nodes[topo.src[lay.ext_of_edges]].tolist()
        self._dst = lay.ext_nodes[topo.dst[lay.ext_of_edges]].tolist()
        self._n_senders = len(set(self._src))
        self._round_bytes = {}
        self._last_gamma = None
        if self.protocol == "masked":  # the seed agreement of the rank's agents: its sum over ranks is the run's
            self.led.add_counts(setup_counts(self._src, self._dst, key_bits=self.codec.key_bits))

    def _count(self, phase: str, lk: int) -> None:
        self.led.add_counts(round_counts(self.protocol, phase, n_edges=len(self._src), n_senders=self._n_senders,
                                         lk=lk, slots=self.slots))
        key = (phase, lk)
        if key not in self._round_bytes:
            self._round_bytes[key] = round_edge_bytes(self.protocol, phase, self._src, self._dst,
                                                      key_bits=self.codec.key_bits, lk=lk, slots=self.slots)
        for a, b, nbytes in self._round_bytes[key]:
            self.led.add_edge_bytes(a, b, nbytes)

    def penalty_round(self, g, bcd_iter: int, admm_iter: int) -> None:
        self.led.begin(bcd_iter, admm_iter)
        if self.protocol != "paper":
            self._count("penalty", 0)
            self._last_gamma = self.codec.encode_penalties(g)

    def exchange_round(self, g, bcd_iter: int, admm_iter: int, lk: int) -> None:
        self.led.begin(bcd_iter, admm_iter)
        if self.protocol != "paper":
            # the real stage reuses step 1's rho_i when the penalties of every edge are the same
            gamma = self.codec.encode_penalties(g)
            same = self._last_gamma is not None and torch.equal(self._last_gamma, gamma)
            flag = self.comm.all_reduce(torch.tensor([0 if same else 1], dtype=torch.int64), category="metrics",
                                        what=f"the cost count of BCD iteration {bcd_iter}, ADMM iteration {admm_iter}")
            if int(flag[0]):
                self._count("penalty", 0)
                self._last_gamma = gamma
        self._count("exchange", lk)

    def op_costs(self):
        """Per-operation seconds (given, or calibrated on rank 0 and shared: one set for the run)."""
        if self._op_costs is None:
            oc = None
            if self.comm.rank == 0:
                from ..exchange.paillier.exchange import calibrate_for  # imports phe, at the point of use

                oc = calibrate_for(self.spec)
            self._op_costs = self.comm.broadcast_object(oc, 0, what="the calibration of the cost model")
        return self._op_costs

    def _summed(self, rows: list) -> list:
        t = torch.tensor([[float(r[k]) for k in COUNT_KEYS] for r in rows], dtype=torch.float64).reshape(-1, len(COUNT_KEYS))
        t = self.comm.all_reduce(t, category="metrics", what="the sum of the cost counters").cpu()
        return [{k: int(v) for k, v in zip(COUNT_KEYS, row.tolist())} for row in t]

    def costs(self) -> dict:
        out = self._summed([self.led.total])[0]
        out["key_pairs"] = self.layout.n_agents
        masked = self.protocol == "masked"
        if masked:
            t = torch.tensor([float(self.led.total[k]) for k in SETUP_KEYS], dtype=torch.float64)
            t = self.comm.all_reduce(t, category="metrics", what="the sum of the setup counters").cpu()
            out.update({k: int(v) for k, v in zip(SETUP_KEYS, t.tolist())})
        return add_estimates(out, self.op_costs(), setup=masked)

    def pop(self) -> list:
        records = self.led.pop()
        if not records:
            return []
        oc = self.op_costs()
        out = []
        for rec, summed in zip(records, self._summed(records)):
            rec = dict(rec, **summed)
            rec["estimated_seconds"] = estimate_seconds(rec, oc)
            out.append(rec)
        return out

    def bytes_per_edge(self) -> dict:
        merged = {}
        for part in self.comm.all_gather_object(dict(self.led.edges), what="the per-edge byte counts"):
            for k, v in part.items():  # an edge's two directions may be counted on two ranks
                merged[k] = merged.get(k, 0) + v
        return merged


def halo_bytes(layout, lk: int, itemsize: int) -> dict:
    """What the halo of ``layout``'s rank sends per ADMM iteration, by the layout alone: the ``U``
    rows of its boundary agents (``lk`` values of ``itemsize`` bytes each) and the penalties of
    its cut edges (float64), ``{"halo": bytes, "penalty": bytes}``."""
    rows = sum(int(t.numel()) for t in layout.send_rows.values())
    edges = sum(int(t.numel()) for t in layout.send_edges.values())
    return {"halo": rows * lk * itemsize, "penalty": edges * 8}


def flag_bytes(layout) -> int:
    """What one ADMM iteration under the stopping rule (:mod:`.topology`) sends from ``layout``'s
    rank: one hop of the flags (a byte per boundary agent and peer) and its share of the decision
    (one ``int64`` in the sum over ranks). An X-step iteration adds the stop agreed network-wide
    (:data:`AGREED_DECISION_BYTES`). A loop's last iteration sends nothing; the BCD-level rule
    sends one hop and one agreed decision per BCD iteration from the second on."""
    return sum(int(t.numel()) for t in layout.send_rows.values()) + 8


#: one agreed stop decision (PPDNMF's ``solver/stopping.agreed_stop``): two ``int64`` in the sum over
#: ranks, the agents that have the flag and the agents counted
AGREED_DECISION_BYTES = 16


def cut_protocol_bytes(partition, graph, rank: int, *, protocol: str, key_bits: int, lk: int, slots: int = 1) -> int:
    """Bytes the Paillier protocol (:func:`~ppdnmf_torch.exchange.costmodel.round_edge_bytes`)
    would send from ``rank``'s agents to other ranks' in one ADMM iteration (step 1's
    mini-round of the aggregated protocol and step 5)."""
    owner = partition.owner
    src, dst = graph.src.tolist(), graph.dst.tolist()
    total = 0
    for phase in ("penalty", "exchange"):
        for a, b, n in round_edge_bytes(protocol, phase, src, dst, key_bits=key_bits, lk=lk, slots=slots):
            if owner[a] == rank and owner[b] != rank:
                total += n
    return total
