"""The errors and warnings this package raises: :class:`PPDNMFError` and its kinds.

Every error is a ``ValueError``, so callers that catch ``ValueError`` keep working.

An error names the parameter it is about: :attr:`PPDNMFError.key` (``"mu"``,
``"data.path"``, ``"key_bits/n_max"``) and :attr:`PPDNMFError.reason`; ``str(exc)`` is
``"<key>: <reason>"``. A message written as ``"mu: must be > 0"`` gets its key from its
head. The reason may name other parameters as ``{name}`` (``"use {g_bits} >= 4"``): they
are shown by their name, and move with the key when a caller that knows the parameters
under other names re-roots the error (:meth:`PPDNMFError.within`,
:meth:`PPDNMFError.renamed`): the CLI shows ``exchange.g_bits: ... use exchange.g_bits >= 4``
for the API's ``g_bits: ... use g_bits >= 4``, and no message is ever rewritten.
"""
from __future__ import annotations

import os
import re
import sys
import warnings

__all__ = ["warn_at_caller", "PPDNMFError", "ConfigError", "DataError", "GraphError", "ConvergenceWarning", "DegenerateResultWarning",
           "DataScaleWarning", "DegreeOneWarning"]

# a leading "key: " (dotted, indexed or composite names: data.split.counts[0], key_bits/n_max)
_HEAD = re.compile(r"^([A-Za-z_][\w.\[\]]*(?:/[A-Za-z_][\w.\[\]]*)*): (.*)$", re.S)
# parameter names inside the reason
_REF = re.compile(r"\{([A-Za-z_][\w.]*)\}")


class PPDNMFError(ValueError):
    """Base class of the errors this package raises for bad input.

    Parameters
    ----------
    message : str
        ``"<key>: <reason>"`` or the reason alone; ``{name}`` in the reason names another
        parameter.
    key : str, optional
        The offending parameter, when the message does not start with it.

    Attributes
    ----------
    key : str or None
    reason : str
    names : dict
        How each ``{name}`` of the reason is shown.
    """

    def __init__(self, message: str = "", *args, key: str | None = None):
        super().__init__(message, *args)
        message = str(message)
        if key is None:
            head = _HEAD.match(message)
            key, message = (head.group(1), head.group(2)) if head else (None, message)
        self.key = key
        self.reason = message
        self.names = {name: name for name in _REF.findall(message)}

    def __str__(self) -> str:
        reason = _REF.sub(lambda m: self.names.get(m.group(1), m.group(0)), self.reason)
        return f"{self.key}: {reason}" if self.key else reason

    def within(self, section: str) -> "PPDNMFError":
        """The same error, its key and named parameters inside config section ``section``
        (``"exchange"``: ``g_bits`` -> ``exchange.g_bits``); returns ``self``."""
        self.key = section if not self.key else "/".join(f"{section}.{k}" for k in self.key.split("/"))
        self.names = {n: f"{section}.{shown}" for n, shown in self.names.items()}
        return self

    def renamed(self, mapping: dict) -> "PPDNMFError":
        """The same error with the key's parts and the named parameters shown under the names
        ``mapping`` gives them (others unchanged); returns ``self``."""
        if self.key:
            self.key = "/".join(mapping.get(k, k) for k in self.key.split("/"))
        self.names = {n: mapping.get(n, shown) for n, shown in self.names.items()}
        return self


class ConfigError(PPDNMFError):
    """A parameter or config value is out of its allowed range or unknown."""


class DataError(PPDNMFError):
    """The data matrix, its blocks or its file is unusable."""


class GraphError(PPDNMFError):
    """The communication graph is invalid (asymmetric, self loops, disconnected, ...)."""


class ConvergenceWarning(UserWarning):
    """A run with ``tol > 0`` hit its iteration cap before every agent converged."""


class DegenerateResultWarning(UserWarning):
    """A run finished, but its factors are degenerate (all-zero, no better than zero, unmoved)."""


class DataScaleWarning(UserWarning):
    """The data's largest entry is far from 1 (the penalties act on absolute values)."""


class DegreeOneWarning(UserWarning):
    """Agents with a single neighbour on a secure exchange: the sums such an agent obtains are
    that neighbour's term, so it learns the neighbour's ``U_j`` whatever the protocol
    (docs/THREAT_MODEL.md); ``min_degree=2`` refuses such graphs."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: frames of scikit-learn's wrappers (set_output, Pipeline, GridSearchCV) are skipped too
_SKLEARN_PART = os.sep + "sklearn" + os.sep


def _library_frame(frame) -> bool:
    name = os.path.abspath(frame.f_code.co_filename)
    return name.startswith(_PACKAGE_DIR) or _SKLEARN_PART in name


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside this package (and outside
    scikit-learn's wrappers): the user's own line (``fit(...)``, ``model.fit(...)``,
    ``pipeline.fit(...)``), not a module of the library, so that Python's default filter shows
    it once per calling line and says where it came from."""
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is the caller of this function
    while frame is not None and _library_frame(frame):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
