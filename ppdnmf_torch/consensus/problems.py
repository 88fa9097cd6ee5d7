"""Sec. V's synthetic problems: least squares and logistic regression data per agent."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .randomness import stream_seed

__all__ = ["SampleData", "least_squares_data", "logistic_data"]


@dataclass
class SampleData:
    """Per-agent samples.

    Attributes
    ----------
    inputs : Tensor (B, N, b, p)
        ``o_ij``.
    targets : Tensor (B, N, b)
        ``t_ij`` (labels in {-1, +1} for logistic regression).
    x_true : Tensor (B, p) or None
        The logistic model's generating vector.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    x_true: torch.Tensor | None = None


def _gens(seed, label):
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not seeds:
        raise ConfigError("seed: needs at least one seed")
    return [torch.Generator().manual_seed(stream_seed(int(s), label)) for s in seeds]


def _check(n_agents, n_samples, dim):
    for name, v in (("n_agents", n_agents), ("n_samples", n_samples), ("dim", dim)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")


def least_squares_data(n_agents: int, n_samples: int = 30, dim: int = 2, seed=0,
                       dtype=torch.float64, device=None) -> SampleData:
    """``o_ij ~ U(0,1)^dim``, ``t_ij ~ U(0,1)``, i.i.d. (Sec. V, least squares).

    Parameters
    ----------
    seed : int or sequence of int
        One data set per seed (the batch dimension ``B``).
    """
    _check(n_agents, n_samples, dim)
    O, t = [], []
    for g in _gens(seed, "least_squares_data"):
        O.append(torch.rand((n_agents, n_samples, dim), generator=g, dtype=torch.float64))
        t.append(torch.rand((n_agents, n_samples), generator=g, dtype=torch.float64))
    return SampleData(torch.stack(O).to(device=device, dtype=dtype), torch.stack(t).to(device=device, dtype=dtype))


def logistic_data(n_agents: int, n_samples: int = 30, dim: int = 2, seed=0,
                  dtype=torch.float64, device=None) -> SampleData:
    """Sec. V's logistic regression: ``x_true ~ N(0, I)``, ``o_ij ~ N(0, I)``, ``v_ij ~ U(0,1)``,
    ``t_ij = +1`` if ``v_ij <= 1 / (1 + exp(-x_true^T o_ij))``, else ``-1``."""
    _check(n_agents, n_samples, dim)
    O, t, xs = [], [], []
    for g in _gens(seed, "logistic_data"):
        x = torch.randn(dim, generator=g, dtype=torch.float64)
        o = torch.randn((n_agents, n_samples, dim), generator=g, dtype=torch.float64)
        v = torch.rand((n_agents, n_samples), generator=g, dtype=torch.float64)
        t.append(torch.where(v <= 1 / (1 + torch.exp(-(o @ x))), 1.0, -1.0))
        O.append(o)
        xs.append(x)
    cast = lambda a: torch.stack(a).to(device=device, dtype=dtype)
    return SampleData(cast(O), cast(t), cast(xs))
