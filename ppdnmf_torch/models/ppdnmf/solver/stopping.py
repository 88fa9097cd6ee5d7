"""The stopping rule of Sec. II-C, and its network-wide stop for the steps that exchange.

The paper's rule: a converged agent raises a flag, the flag travels one hop per iteration, and an
agent stops once it has it. An agent that stops keeps its values while its neighbours go on, and
its neighbours' secure sums then move by the neighbours still active: a receiver whose other
neighbours have all stopped reads the last one's exact increments from the differences of its
sums (``ppdnmf_torch.audit.across_calls``, docs/THREAT_MODEL.md "Across calls"). So wherever the
agents exchange (the BCD loop and the X-step's ADMM loop) the flags travel as in the paper, but an
agent that has one keeps computing and exchanging; a trial stops, every agent of it at once, at the
first iteration at which every agent has the flag (:func:`agreed_stop`): one bit per trial and
iteration, the AND of the flags, which a secure sum of the flags gives (over ranks each rank adds
its agents' count, so the ranks learn the count). Within a trial either every agent varies or none
does. The Y-step exchanges nothing and keeps the paper's rule (:class:`StopRule` with
``agreed=False``).

The BCD loop's rule (``bcd.BCDRun.step``) measures each agent's step by the change of its model
``X_i Y_i`` against ``||Z_i||`` (:func:`model_change`), not by the relative change of the
factors, together with its disagreement with its neighbours; and its flags do not travel: a
trial stops at the first BCD iteration at which every agent's own test holds (the same one bit
per trial and iteration, :func:`agreed_stop`). A travelling flag stays up, so under the paper's
rule the first agent whose step happened to be small stopped the network.
"""
from __future__ import annotations

import torch

from ....graph.topology import Topology
from .kernels import rel_change

__all__ = ["StopRule", "stop_flags", "agreed_stop", "trial_mask", "model_change"]


def model_change(X, Y, X_prev, Y_prev, z_norms, scratch=None) -> torch.Tensor:
    """The BCD rule's measure of an agent's step: ``||X_i Y_i - X'_i Y'_i||_F / ||Z_i||_F``,
    ``(T, N)``, for ``X (T, N, L, K)``, ``Y (T, N, K, M)`` and the previous iterate's
    ``X'``, ``Y'``; 0 where ``z_norms (T, N)`` is 0 (a padding slot, which holds no data).

    Why the product and not the factors: ``X_i D`` and ``D^-1 Y_i`` (``D`` positive diagonal),
    and at an exact factorization a whole family of factors, fit alike, and the ADMM steps'
    proximal terms do not pin the factors along them: the factors drift (``||X_i||`` grows by
    a few 1e-4 per iteration on scikit-learn's checks' 30 x 3 data at rank 3) while the model
    ``X_i Y_i`` holds still, and a relative change of the factors never meets ``tol``. Why
    ``||Z_i||``: it does not move, nor go to 0 with the iterate, and makes the measure free of
    the data's units. Each agent computes it from its own factors and data: nothing crosses.

    ``scratch`` (optional, contiguous, shaped like ``Z``) receives the difference.
    """
    T, N, L, K = X.shape
    M = Y.shape[-1]
    out = None if scratch is None else scratch.view(T * N, L, M)
    D = torch.bmm(X.reshape(T * N, L, K), Y.reshape(T * N, K, M), out=out)
    D.baddbmm_(X_prev.reshape(T * N, L, K), Y_prev.reshape(T * N, K, M), alpha=-1)
    num = torch.linalg.matrix_norm(D.view(T, N, L, M))
    held = z_norms > 0
    return torch.where(held, num / torch.where(held, z_norms, torch.ones_like(z_norms)), torch.zeros_like(num))


def stop_flags(flags, raised, topology: Topology):
    """Sec. II-C: a raised flag stops its agent and travels one hop per iteration."""
    T, N = flags.shape
    return (topology.spread(flags.reshape(-1)).reshape(T, N)) | raised


def agreed_stop(flags, topology: Topology) -> torch.Tensor:
    """``(T,)`` bool: the trials whose every agent has its flag up (``flags (T, N)``), counted over
    every agent of the trial (over ranks, every rank's: :meth:`~ppdnmf_torch.graph.topology.Topology.trial_counts`)."""
    counts = topology.trial_counts(torch.stack([flags, torch.ones_like(flags)]))  # (2, T): flagged, agents
    return counts[0] == counts[1]


def trial_mask(done, shape):
    """``done (T,)`` as the ``(T, N)`` mask of every agent of those trials (None when none is done)."""
    return done[:, None].expand(shape).contiguous() if bool(done.any()) else None


class StopRule:
    """Sec. II-C inside one ADMM loop: a converged agent raises a flag, the flag travels one hop
    per iteration; with ``agreed`` (a step that exchanges: the X-step) a trial stops once every
    agent has it, every agent at once (module docstring); without (the Y-step) an agent stops once
    it has it. Every agent stops at the cap.

    With ``tol == 0`` and no agent frozen by the BCD-level rule nothing is tracked (the
    fixed counts run, without a device synchronization per iteration).
    """

    def __init__(self, frozen, tol, n_iters, topology, shape, device, *, agreed: bool = False):
        self.frozen, self.tol, self.n_iters, self.topology = frozen, tol, n_iters, topology
        self.agreed, self.shape = agreed, shape
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
        stopped = self.flags
        if self.agreed and self.tol > 0:
            stopped = agreed_stop(self.flags, self.topology)[:, None].expand(self.shape)
        self.active = ~stopped if self.frozen is None else ~(stopped | self.frozen)
        return not self.topology.any_set(self.active)
