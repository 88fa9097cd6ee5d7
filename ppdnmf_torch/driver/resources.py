"""The lifetime of a run's exchange and aggregation: :class:`Resources`."""
from __future__ import annotations

from ..exchange import Exchange, make_exchange

__all__ = ["Resources"]


class Resources:
    """What a run made and must close (worker pools, keys): an exchange or aggregation made here
    is closed at the end, one handed in is used and left open.

    Use as a context manager: ``with Resources() as res: exch = res.exchange(exchange, options)``.
    """

    def __init__(self):
        self._owned: list = []

    def own(self, obj):
        """``obj`` (with ``close()``) is this run's: closed at the end; returns it."""
        self._owned.append(obj)
        return obj

    def exchange(self, exchange, options: dict | None = None) -> Exchange:
        """The run's exchange: ``exchange`` itself when it is one (left open), else
        :func:`~ppdnmf_torch.exchange.make_exchange` of the kind or spec with ``options`` (closed
        at the end)."""
        if isinstance(exchange, Exchange):
            return exchange
        return self.own(make_exchange(exchange, **(options or {})))

    def close(self) -> None:
        """Close what the run made, the last made first."""
        error = None
        while self._owned:
            try:
                self._owned.pop().close()
            except Exception as exc:  # noqa: BLE001 - close the others, then raise the first
                error = error or exc
        if error is not None:
            raise error

    def __enter__(self) -> "Resources":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False
