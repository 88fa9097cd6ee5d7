"""What the pairwise-masked secure sum costs: its counters, per round and once per run.

Per round (every ADMM iteration's step 5; every :meth:`~..secure_sum.Aggregator.total`):
``messages`` (masked messages sent, one per directed edge), ``message_bytes`` (8 bytes per masked
integer on the wire), ``prg_bytes`` (keystream the parties of a deployment compute, each holder of
a seed its own; one process computes each shared keystream once, half of it:
:class:`~.network.RowPlan`), ``time_prg`` (seconds in the PRG) and ``time_mask`` (seconds of the
whole masking stage: the PRG, the messages, the receivers' sums and the removal of their edge masks;
``time_prg`` included).

Once per run (the seed agreement, :mod:`.agreement`): ``setup_key_agreements`` (X25519
operations), ``setup_signatures``, ``setup_verifications`` (Ed25519), ``setup_bytes`` (signed keys
on the wire, relays included) and ``time_setup``.
"""
from __future__ import annotations

from ..costmodel import CostLedger

__all__ = ["ROUND_KEYS", "SETUP_KEYS", "SecAggLedger"]

ROUND_KEYS = ("messages", "message_bytes", "prg_bytes", "time_prg", "time_mask")
SETUP_KEYS = ("setup_key_agreements", "setup_signatures", "setup_verifications", "setup_bytes", "time_setup")


class SecAggLedger(CostLedger):
    """A :class:`~..costmodel.CostLedger` with the secure sum's counters (module docstring); the
    bytes of every message go to ``message_bytes`` and, for trial 0, per directed link."""

    ONCE = SETUP_KEYS

    def __init__(self, n_agents: int = 0):
        super().__init__(n_agents, timers=False)
        self.keys = ROUND_KEYS + SETUP_KEYS
        self.total = {k: (0.0 if k.startswith("time_") else 0) for k in self.keys}

    def add_edge_bytes(self, sender: int, receiver: int, nbytes: int) -> None:
        self.add("message_bytes", nbytes)
        if sender < self.n_agents and receiver < self.n_agents:
            key = f"{sender}->{receiver}"
            self.edges[key] = self.edges.get(key, 0) + nbytes

    def costs(self) -> dict:
        """The cumulative counters (a copy)."""
        return dict(self.total)
