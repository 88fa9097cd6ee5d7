"""The privacy warnings of a run on a secure exchange, written once for every model."""
from __future__ import annotations

import warnings

from .._utils import caller_stacklevel
from ..errors import DegreeOneWarning, SumLeakWarning
from ..penalties import sum_leak_message

__all__ = ["warn_degree_one", "warn_sum_leak", "is_secure"]


def is_secure(exchange) -> bool:
    """Whether ``exchange`` is an integer (secure) kind: only there does what a receiver learns
    from its sums matter (``plain`` sends the values)."""
    return getattr(exchange, "codec", None) is not None


def warn_degree_one(exchange, graphs, *, who: str = "agents", value: str = "U_j") -> None:
    """:class:`~ppdnmf_torch.errors.DegreeOneWarning` naming the ``who`` with one neighbour in
    ``graphs`` (one per trial), on a secure exchange: the sums such a receiver obtains are its
    neighbour's term, so it learns the neighbour's ``value`` whatever the protocol."""
    if not is_secure(exchange):
        return
    graphs = list(graphs)
    found = [(t, a) for t, g in enumerate(graphs) for a, d in enumerate(g.degree.tolist()) if d == 1]
    if not found:
        return
    names = [str(a) if len(graphs) == 1 else f"{a} (trial {t})" for t, a in found]
    shown = ", ".join(names[:5]) + (f", ... ({len(names)} in all)" if len(names) > 5 else "")
    warnings.warn(f"{who} [{shown}] have a single neighbour: whatever the protocol, each learns that neighbour's "
                  f"{value} exactly from its sums; min_degree=2 refuses such graphs (docs/THREAT_MODEL.md)",
                  DegreeOneWarning, stacklevel=caller_stacklevel())


def warn_sum_leak(exchange, schedule: str, caps, degrees) -> None:
    """:class:`~ppdnmf_torch.errors.SumLeakWarning` when a secure exchange runs under a penalty
    schedule whose weights differ across a receiver's neighbours
    (:func:`~ppdnmf_torch.penalties.sum_leak_message`; ``caps (T, N)``, ``degrees`` one ``(N,)``
    per trial). First the exchange refuses, up front, a schedule it cannot serve
    (:meth:`~ppdnmf_torch.exchange.Exchange.check_schedule`: ``secagg`` sums only under
    ``agreed``), so that every model refuses it before any work.

    Raises
    ------
    ConfigError
        From the exchange's ``check_schedule``, naming ``penalty_schedule``.
    """
    check = getattr(exchange, "check_schedule", None)
    if check is not None:
        check(schedule, caps)
    if not is_secure(exchange):
        return
    message = sum_leak_message(schedule, caps, degrees)
    if message is not None:
        warnings.warn(message, SumLeakWarning, stacklevel=caller_stacklevel())
