"""The errors this package raises for bad input: :class:`PPDNMFError` and its kinds.

Every one is a ``ValueError``, so callers that catch ``ValueError`` keep working.
"""
from __future__ import annotations

__all__ = ["PPDNMFError", "ConfigError", "DataError", "GraphError"]


class PPDNMFError(ValueError):
    """Base class of the errors this package raises for bad input."""


class ConfigError(PPDNMFError):
    """A parameter or config value is out of its allowed range or unknown."""


class DataError(PPDNMFError):
    """The data matrix, its blocks or its file is unusable."""


class GraphError(PPDNMFError):
    """The communication graph is invalid (asymmetric, self loops, disconnected, ...)."""
