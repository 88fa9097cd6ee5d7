"""The local losses ``f_i`` of the consensus problem ``min_x sum_i f_i(x)``: the protocol.

An incremental method touches one agent per step, so a loss answers for one agent at a
time (the active one), for every trial of a batch at once. The agent is given either
as a Python ``int`` (the same agent in every trial: a shared cycle) or as a
``LongTensor (B,)`` (a per-trial agent: a random walk, or per-trial cycles).

Shapes: the variable of one agent has shape ``shape`` (``(p,)`` for a vector,
``(L, K)`` for PPDNMF's X-step); a batch of them is ``(B, *shape)``. Data carry a
leading batch dimension ``Bd`` that is either ``B`` or 1 (shared by every trial).
"""
from __future__ import annotations

import abc
from typing import Callable

import torch

from ..errors import ConfigError

__all__ = ["LocalLoss", "CallableLoss", "take_agent"]


def take_agent(data: torch.Tensor, agent) -> torch.Tensor:
    """The rows of ``data (Bd, N, ...)`` that belong to ``agent``.

    Parameters
    ----------
    data : Tensor (Bd, N, ...)
    agent : int or LongTensor (B,)

    Returns
    -------
    Tensor
        ``(Bd, ...)`` for an ``int`` (a view; broadcasts against ``(B, ...)`` when
        ``Bd = 1``), ``(B, ...)`` for a tensor.
    """
    if isinstance(agent, int):
        return data[:, agent]
    if data.shape[0] == 1:
        return data[0, agent]
    return data[torch.arange(agent.shape[0], device=agent.device), agent]


class LocalLoss(abc.ABC):
    """A smooth local loss ``f_i`` per agent, batched over trials.

    Subclasses set ``n_agents``, ``shape`` (the variable's shape), ``batch_size``
    (``Bd``: 1 when every trial shares the data), ``device`` and ``dtype``, and
    implement :meth:`grad` (for the linearised step (8)) and, where it has a closed
    form, :meth:`exact_step` (step (4a) / (12)).
    """

    n_agents: int
    shape: tuple[int, ...]
    batch_size: int
    device: torch.device
    dtype: torch.dtype

    @abc.abstractmethod
    def grad(self, agent, x: torch.Tensor) -> torch.Tensor:
        """``grad f_agent(x)``.

        Parameters
        ----------
        agent : int or LongTensor (B,)
        x : Tensor (B, *shape)

        Returns
        -------
        Tensor (B, *shape)
        """

    def exact_step(self, agent, z: torch.Tensor, y: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """``argmin_x f_agent(x) + <y, z - x> + (c / 2) ||z - x||^2`` (eq. 4a; eq. 12 with ``c = rho gamma``).

        Parameters
        ----------
        agent : int or LongTensor (B,)
        z, y : Tensor (B, *shape)
            The token (projected, where a projection is used) and the agent's multiplier.
        c : Tensor (B, 1, ...)
            ``rho gamma`` per trial, shaped to broadcast against ``(B, *shape)``.

        Returns
        -------
        Tensor (B, *shape)
        """
        raise NotImplementedError(f"{type(self).__name__} has no exact step; use step='linearized'")

    @property
    def has_exact_step(self) -> bool:
        """Whether :meth:`exact_step` is implemented."""
        return type(self).exact_step is not LocalLoss.exact_step

    def relabel(self, perm: torch.Tensor) -> "LocalLoss | None":
        """The same loss with agent ``perm[b, j]`` of trial ``b`` as its agent ``j``.

        Parameters
        ----------
        perm : LongTensor (B, N)

        Returns
        -------
        LocalLoss or None
            None when the loss cannot relabel its data (the engine then indexes per trial).
        """
        return None


class CallableLoss(LocalLoss):
    """A user loss from plain callables.

    Parameters
    ----------
    n_agents : int
    shape : tuple of int
        Shape of one agent's variable, e.g. ``(p,)`` or ``(L, K)``.
    grad : callable ``(agent, x) -> Tensor``
        ``agent`` is an ``int`` or a ``LongTensor (B,)``, ``x`` is ``(B, *shape)``.
    exact_step : callable ``(agent, z, y, c) -> Tensor``, optional
        ``argmin_x f(x) + <y, z - x> + (c/2)||z - x||^2``, ``c (B, 1, ...)``; without it
        only the linearised step (8) can be used.
    device, dtype : optional
        Of the state the engine makes (default: CPU, float64).
    batch_size : int, default 1
        ``B`` when the callables only accept a batch of that size; 1 for any.
    """

    def __init__(self, n_agents: int, shape, grad: Callable, exact_step: Callable | None = None,
                 device=None, dtype=torch.float64, batch_size: int = 1):
        if not callable(grad):
            raise ConfigError(f"grad: expected a callable (agent, x) -> Tensor, got {type(grad).__name__}")
        if exact_step is not None and not callable(exact_step):
            raise ConfigError(f"exact_step: expected a callable (agent, z, y, c) -> Tensor or None, got "
                              f"{type(exact_step).__name__}")
        try:
            self.shape = tuple(int(s) for s in shape)
        except TypeError:
            raise ConfigError(f"shape: expected a tuple of ints, got {shape!r}") from None
        if not self.shape or min(self.shape) < 1:
            raise ConfigError(f"shape: every dimension must be >= 1, got {shape!r}")
        if int(n_agents) < 1:
            raise ConfigError(f"n_agents: must be >= 1, got {n_agents!r}")
        self.n_agents = int(n_agents)
        self.batch_size = int(batch_size)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.dtype = dtype
        self._grad = grad
        self._exact = exact_step

    def grad(self, agent, x):
        return self._grad(agent, x)

    def exact_step(self, agent, z, y, c):
        if self._exact is None:
            return super().exact_step(agent, z, y, c)
        return self._exact(agent, z, y, c)

    @property
    def has_exact_step(self) -> bool:
        return self._exact is not None
