"""The methods as data: which walk, which start, which perturbation (Algorithms 1-4, W-ADMM).

Every method runs the same step (see :mod:`.step`); they differ in

* the walk: ``"cycle"`` (the Hamiltonian cycle, I-ADMM and the PI-ADMMs) or ``"random"``
  (a uniformly random neighbour each step: W-ADMM / Walkman);
* the start: zero (Algorithm 1) or Algorithm 2's private ``x_i^0 ~ U(low, high)``,
  ``y_i^0 = rho x_i^0``, ``z^0 = 0``;
* the step size: ``rho`` (Algorithms 1, 2, 4) or ``rho gamma``, ``gamma ~ U(low, high)``
  drawn at every activation (Algorithm 3, eqs. 12-13);
* the primal noise: none, or ``omega ~ N(0, sigma^2 I)`` added to the new ``x`` (Algorithm 4);
* the primal step: ``"exact"`` (4a / 12) or ``"linearized"`` (8).

Numbers may be scalars or one value per trial (length ``B``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

__all__ = ["Method", "i_admm", "pi_admm1", "pi_admm2", "w_admm", "make_method", "METHODS"]

METHODS = ("i_admm", "pi_admm1", "pi_admm2", "w_admm")
STEPS = ("exact", "linearized")
WALKS = ("cycle", "random")


@dataclass(frozen=True)
class Method:
    """One method's choices; see the module docstring.

    Attributes
    ----------
    name : str
    walk : {"cycle", "random"}
    step : {"exact", "linearized"}
    start : (low, high) or None
        Algorithm 2's ``x_i^0 ~ U(low, high)`` per entry; None for the zero start.
    gamma : (low, high) or None
        ``P_i = U(low, high)`` of Algorithm 3; None for ``gamma = 1``.
    gamma_spread : float or sequence, optional
        Instead of ``gamma``: ``P_i = U(1 - spread / rho, 1 + spread / rho)`` (Sec. V uses
        spread 1 for least squares, 0.1 for logistic regression).
    sigma : float or sequence
        Algorithm 4's noise level; 0 for none.
    """

    name: str
    walk: str = "cycle"
    step: str = "exact"
    start: Any = None
    gamma: Any = None
    gamma_spread: Any = None
    sigma: Any = 0.0

    def __post_init__(self):
        if self.walk not in WALKS:
            raise ConfigError(f"walk: unknown {self.walk!r}; use one of {WALKS}")
        if self.step not in STEPS:
            raise ConfigError(f"step: unknown {self.step!r}; use one of {STEPS}")
        for name in ("start", "gamma"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (tuple, list)) or len(v) != 2):
                raise ConfigError(f"{name}: expected a pair (low, high) or None, got {v!r}")
        if self.gamma is not None and self.gamma_spread is not None:
            raise ConfigError("gamma, gamma_spread: give at most one of them")


def i_admm(step: str = "exact", start=None) -> Method:
    """I-ADMM (Algorithm 1); with ``start=(low, high)`` Algorithm 2 (randomised start)."""
    return Method("i_admm", step=step, start=start)


def pi_admm1(gamma=None, spread=1.0, start=(0.0, 100.0), step: str = "exact") -> Method:
    """PI-ADMM1 (Algorithm 3): Algorithm 2's start and ``gamma ~ U(gamma)`` (or ``1 +- spread / rho``)."""
    return Method("pi_admm1", step=step, start=start, gamma=gamma,
                  gamma_spread=None if gamma is not None else spread)


def pi_admm2(sigma=1e-2, start=(0.0, 100.0), step: str = "exact") -> Method:
    """PI-ADMM2 (Algorithm 4): Algorithm 2's start and ``omega ~ N(0, sigma^2 I)`` on every new ``x``."""
    return Method("pi_admm2", step=step, start=start, sigma=sigma)


def w_admm(step: str = "exact", start=None) -> Method:
    """W-ADMM / Walkman: the same steps with the token moving to a uniformly random neighbour."""
    return Method("w_admm", walk="random", step=step, start=start)


_PRESETS = {"i_admm": i_admm, "pi_admm1": pi_admm1, "pi_admm2": pi_admm2, "w_admm": w_admm}


def make_method(method, **params) -> Method:
    """A :class:`Method` from a name in :data:`METHODS` (with its constructor's keywords) or as is."""
    if isinstance(method, Method):
        if params:
            raise ConfigError(f"method: keywords {sorted(params)} only go with a method name")
        return method
    if method not in _PRESETS:
        raise ConfigError(f"method: unknown {method!r}; use one of {METHODS} or a Method")
    try:
        return _PRESETS[method](**params)
    except TypeError as err:
        raise ConfigError(f"method: bad keywords for {method!r}: {err}") from None
