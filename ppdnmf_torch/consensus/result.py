"""What a run returns: the final state, the accuracy history, the eavesdropper's transcript."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .methods import Method

__all__ = ["IncrementalState", "Transcript", "IncrementalResult", "RoundInfo"]


@dataclass
class IncrementalState:
    """A state to continue from (warm start).

    Attributes
    ----------
    x, y : Tensor (B, N, *shape)
    z : Tensor (B, *shape) or None
        When None, ``z = mean_i(x_i - y_i / rho)`` (the invariant) is computed.
    """

    x: torch.Tensor
    y: torch.Tensor
    z: torch.Tensor | None = None


@dataclass
class Transcript:
    """Everything an eavesdropper on every link sees, plus (for evaluation) watched states.

    Attributes
    ----------
    tokens : Tensor (K + 1, B, *shape)
        ``z^0 .. z^K``: ``z^k`` is the token the agent of step ``k`` receives.
    agents : LongTensor (K, B)
        The agent active at step ``k`` (the holder of ``z^k``), in the original labels.
    watch : LongTensor (W,) or None
    x, y : Tensor (K + 1, B, W, *shape) or None
        The watched agents' states after ``0 .. K`` steps (ground truth for the attacks).
    """

    tokens: torch.Tensor
    agents: torch.Tensor
    watch: torch.Tensor | None = None
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None


@dataclass
class RoundInfo:
    """What a callback receives after each recorded round.

    Attributes
    ----------
    round : int
        Rounds of ``N`` steps done by the engine so far.
    vectors : int
        Vectors transmitted so far (one per step).
    accuracy : Tensor (B,) or None
        ``(1/N) sum_i ||x_i - x*||^2`` per trial, when ``x_star`` is known.
    consensus : Tensor (B,)
        ``(1/N) sum_i ||x_i - P(z)||^2`` per trial.
    """

    round: int
    vectors: int
    accuracy: torch.Tensor | None
    consensus: torch.Tensor


@dataclass
class IncrementalResult:
    """The result of :meth:`IncrementalADMM.run`.

    Attributes
    ----------
    x, y : Tensor (B, N, *shape)
        Final primal and dual variables, agents in their original labels.
    z : Tensor (B, *shape)
        Final token (the unconstrained average).
    z_projected : Tensor (B, *shape) or None
        ``P(z)`` when a projection is used.
    vectors : LongTensor (R,)
        Vectors transmitted at each record (the x-axis of Sec. V's figures).
    accuracy : Tensor (R, B) float64 or None
        ``(1/N) sum_i ||x_i - x*||^2``.
    consensus : Tensor (R, B) float64
        ``(1/N) sum_i ||x_i - P(z)||^2``.
    transcript : Transcript or None
    method : Method
    rho : Tensor (B,)
    steps : int
        Steps done by the engine in total.
    """

    x: torch.Tensor
    y: torch.Tensor
    z: torch.Tensor
    z_projected: torch.Tensor | None
    vectors: torch.Tensor
    accuracy: torch.Tensor | None
    consensus: torch.Tensor
    transcript: Transcript | None
    method: Method
    rho: torch.Tensor
    steps: int

    @property
    def state(self) -> IncrementalState:
        """The final state, to warm-start another engine."""
        return IncrementalState(self.x, self.y, self.z)
