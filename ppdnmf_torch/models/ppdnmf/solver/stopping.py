"""The stopping rule of Sec. II-C: converged agents raise a flag that travels one hop per iteration."""
from __future__ import annotations

import torch

from ....graph.topology import Topology
from .kernels import rel_change

__all__ = ["StopRule", "stop_flags"]


def stop_flags(flags, raised, topology: Topology):
    """Sec. II-C: a raised flag stops its agent and travels one hop per iteration."""
    T, N = flags.shape
    return (topology.spread(flags.reshape(-1)).reshape(T, N)) | raised


class StopRule:
    """Sec. II-C inside one ADMM loop: a converged agent raises a flag, the flag travels one
    hop per iteration, and an agent stops once it has it; every agent stops at the cap.

    With ``tol == 0`` and no agent frozen by the BCD-level rule nothing is tracked (the
    fixed counts run, without a device synchronization per iteration).
    """

    def __init__(self, frozen, tol, n_iters, topology, shape, device):
        self.frozen, self.tol, self.n_iters, self.topology = frozen, tol, n_iters, topology
        self.track = tol > 0 or frozen is not None
        self.flags = torch.zeros(shape, dtype=torch.bool, device=device)
        self.active = None if frozen is None else ~frozen
        self.counts = torch.full(shape, n_iters, dtype=torch.int64, device=device)
        if self.track:
            self.counts.zero_()

    def after(self, it: int, new, prev) -> bool:
        """Book-keeping after iteration ``it`` (0-based); True when the loop must end."""
        if not self.track:
            return False
        self.counts += self.active.to(torch.int64) if self.active is not None else 1
        if it == self.n_iters - 1:
            return True
        if self.tol > 0:  # with tol == 0 (agents frozen by the BCD-level rule) no flag is ever raised
            raised = rel_change(new, prev) < self.tol
            if self.active is not None:
                raised &= self.active
            self.flags = stop_flags(self.flags, raised, self.topology)
        self.active = ~self.flags if self.frozen is None else ~(self.flags | self.frozen)
        return not self.topology.any_set(self.active)


