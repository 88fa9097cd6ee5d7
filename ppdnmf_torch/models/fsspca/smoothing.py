"""Smoothing functions ``psi_mu`` of ``|x|`` for the smooth term ``r(X) = sum_ij psi_mu(x_ij)``
of FSSPCA's problem (6) (docs/SPARSE_PCA.md, "Choice of psi"; Saheya et al.).

Each ``psi_mu`` tends to ``|x|`` as ``mu -> 0``; its derivative is what the workers' local
gradient needs (step 1 of Algorithm 1). All four are elementwise and follow the input's
device and dtype. The default (``"sqrt"``) is chosen by measurement: docs/FSSPCA.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ...errors import ConfigError

__all__ = ["Smoothing", "SMOOTHINGS", "DEFAULT_SMOOTHING", "get_smoothing", "smooth_l1"]


@dataclass(frozen=True)
class Smoothing:
    """One smoothing function: ``value(x, mu) = psi_mu(x)`` and ``grad(x, mu) = psi_mu'(x)``."""

    name: str
    value: Callable[[torch.Tensor, float], torch.Tensor]
    grad: Callable[[torch.Tensor, float], torch.Tensor]
    formula: str


def _logexp(x, mu):
    # mu [ln(1 + e^{-x/mu}) + ln(1 + e^{x/mu})], with softplus so that |x| >> mu never overflows
    return mu * (F.softplus(-x / mu) + F.softplus(x / mu))


def _logexp_grad(x, mu):
    # sigmoid(x/mu) - sigmoid(-x/mu)
    return torch.tanh(x / (2.0 * mu))


_SQRT2 = math.sqrt(2.0)
_SQRT_2_PI = math.sqrt(2.0 / math.pi)


def _erf(x, mu):
    return x * torch.erf(x / (_SQRT2 * mu)) + _SQRT_2_PI * mu * torch.exp(-(x * x) / (2.0 * mu * mu))


def _erf_grad(x, mu):
    # the two exponential terms of the product rule cancel
    return torch.erf(x / (_SQRT2 * mu))


def _sqrt(x, mu):
    return torch.sqrt(4.0 * mu * mu + x * x)


def _sqrt_grad(x, mu):
    return x / torch.sqrt(4.0 * mu * mu + x * x)


def _huber(x, mu):
    a = x.abs()
    return torch.where(a <= mu, x * x / (2.0 * mu), a - mu / 2.0)


def _huber_grad(x, mu):
    return (x / mu).clamp(-1.0, 1.0)


#: the four smoothing functions of Saheya et al., by name
SMOOTHINGS = {
    "logexp": Smoothing("logexp", _logexp, _logexp_grad, "mu [ln(1 + e^{-x/mu}) + ln(1 + e^{x/mu})]"),
    "erf": Smoothing("erf", _erf, _erf_grad, "x erf(x / (sqrt(2) mu)) + sqrt(2/pi) mu e^{-x^2/(2 mu^2)}"),
    "sqrt": Smoothing("sqrt", _sqrt, _sqrt_grad, "sqrt(4 mu^2 + x^2)"),
    "huber": Smoothing("huber", _huber, _huber_grad, "x^2/(2 mu) for |x| <= mu, |x| - mu/2 otherwise"),
}

#: chosen by the measurement in docs/FSSPCA.md ("The smoothing function")
DEFAULT_SMOOTHING = "sqrt"


def get_smoothing(smoothing) -> Smoothing:
    """A :class:`Smoothing` by name (``"logexp" | "erf" | "sqrt" | "huber"``), or one given."""
    if isinstance(smoothing, Smoothing):
        return smoothing
    if isinstance(smoothing, str) and smoothing in SMOOTHINGS:
        return SMOOTHINGS[smoothing]
    raise ConfigError(f"smoothing: unknown smoothing {smoothing!r}; use one of {sorted(SMOOTHINGS)}")


def smooth_l1(x: torch.Tensor, smoothing: Smoothing, mu: float) -> torch.Tensor:
    """``r(X) = sum_ij psi_mu(x_ij)`` over the last two dimensions: ``(..., d, r) -> (...)``."""
    return smoothing.value(x, mu).sum(dim=(-2, -1))
