"""The parties of a bound Paillier exchange and what goes over their links.

:class:`Network` holds the agents, the directed edges as Python lists (CSR order) and the
run's :class:`~ppdnmf_torch.exchange.costmodel.CostLedger`; it accounts every message
(bytes per edge, and with ``record_transcript`` the message itself, as an eavesdropper
on the link sees it: a :class:`WireMessage`) and every transfer between the device and
the host. The protocol rounds (:mod:`.rounds`) send through it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..costmodel import CostLedger

__all__ = ["WireMessage", "Network"]


@dataclass(frozen=True)
class WireMessage:
    """One message on a link, as an eavesdropper records it: for the Paillier protocols,
    ciphertexts and public keys only (the audit also records the plain protocol's
    messages, values in the clear, in this form)."""

    bcd_iter: int
    admm_iter: int
    sender: int
    receiver: int
    kind: str
    payload: tuple
    #: the node whose public key the ciphertexts are under, when neither the kind nor the ends
    #: say it (the masked protocol's seeds travel under a third agent's key); -1 otherwise
    under: int = -1


class Network:
    """The agents and links of one bound exchange, and the accounting of their traffic.

    Parameters
    ----------
    topology : Topology
        The bound topology (``A`` nodes, ``2E`` directed edges ``src -> dst``, ``rev``).
    agents : tuple of _Agent
        One per node.
    ledger : CostLedger
    device : torch.device
        Where the exchange's inputs and outputs live.
    transcript : list or None
        Receives every :class:`WireMessage` sent (None: nothing is recorded).
    """

    def __init__(self, topology, agents: tuple, ledger: CostLedger, device, transcript=None):
        self.agents = agents
        self.n_nodes = topology.n_nodes
        self.src = topology.src.cpu().tolist()
        self.dst = topology.dst.cpu().tolist()
        self.rev = topology.rev.cpu().tolist()
        #: every node's degree, and the nodes with at least one neighbour
        self.degree = [0] * self.n_nodes
        for i in self.src:
            self.degree[i] += 1
        self.senders = [i for i, d in enumerate(self.degree) if d > 0]
        self.ledger = ledger
        self.device = device
        self.transcript = transcript
        self._iteration = (0, 0)

    def begin(self, bcd_iter: int, admm_iter: int) -> None:
        """Open the cost record of this ADMM iteration; messages sent from now on carry it."""
        self.ledger.begin(bcd_iter, admm_iter)
        self._iteration = (bcd_iter, admm_iter)

    def send(self, sender: int, receiver: int, nbytes: int, kind: str = "", payload=(), *, under: int = -1,
             setup: bool = False) -> None:
        """Account a message on the wire; with a transcript, keep what an eavesdropper sees.

        ``setup``: a message of the masked protocol's once-per-run setup, counted in
        ``setup_ciphertext_bytes`` (not in the rounds' ``ciphertext_bytes`` nor per edge).
        """
        if setup:
            self.ledger.add("setup_ciphertext_bytes", nbytes)
        else:
            self.ledger.add_edge_bytes(sender, receiver, nbytes)
        if self.transcript is not None:
            self.transcript.append(WireMessage(self._iteration[0], self._iteration[1], sender, receiver,
                                               kind, tuple(int(v) for v in payload), int(under)))

    def to_host(self, t: torch.Tensor) -> list:
        """``t`` as nested Python lists (the device -> host transfer, timed)."""
        with self.ledger.timed("time_transfer"):
            return t.cpu().tolist()

    def to_device(self, values, shape) -> torch.Tensor:
        """Python integers as an int64 tensor of ``shape`` on the device (timed)."""
        with self.ledger.timed("time_transfer"):
            return torch.tensor(values, dtype=torch.int64).reshape(shape).to(self.device)

    def weighted_reply_sums(self, decrypted: list, gamma: list, P: int) -> torch.Tensor:
        """``S_int_i = sum_j gamma_ij d_ij`` on the host from the decrypted replies ``d_ij`` (one
        list of ``P`` values per edge, in edge order), then on the device (timed transfer).

        Exact in int64: every partial sum is bounded by ``B_i``, which the codec holds below
        its limit.
        """
        d = torch.tensor(decrypted, dtype=torch.int64).reshape(len(self.src), P)
        gamma_ij = torch.tensor(gamma, dtype=torch.int64)
        src = torch.tensor(self.src, dtype=torch.int64)
        S_int = torch.zeros((self.n_nodes, P), dtype=torch.int64).index_add_(0, src, gamma_ij[:, None] * d)
        with self.ledger.timed("time_transfer"):
            return S_int.to(self.device)  # the one host -> device transfer
