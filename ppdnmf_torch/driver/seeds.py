"""Seeds from what users pass: one way for every model's estimator and ``fit``."""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import ConfigError

__all__ = ["seed_of", "trial_seeds", "SEED_BOUND"]

#: seeds drawn from a generator are below this (scikit-learn's ``check_random_state`` range)
SEED_BOUND = 2**31 - 1


def seed_of(random_state, key: str = "random_state") -> int:
    """An integer seed from ``random_state``: an integer >= 0 (itself), None (a fresh seed from
    numpy's global generator, as scikit-learn does), or a ``numpy.random.RandomState`` /
    ``Generator`` (one draw below :data:`SEED_BOUND`)."""
    if random_state is None:
        return int(np.random.randint(0, SEED_BOUND))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ConfigError(f"{key}: must be >= 0, got {random_state!r}")
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, SEED_BOUND))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, SEED_BOUND))
    raise ConfigError(f"{key}: expected None, an integer >= 0 or a numpy random generator, got {random_state!r}")


def trial_seeds(seed: int, trials: int) -> list:
    """Trial ``t``'s seed ``seed + t``: the seed of a batch's trial is that of the same run alone."""
    return [int(seed) + t for t in range(int(trials))]
