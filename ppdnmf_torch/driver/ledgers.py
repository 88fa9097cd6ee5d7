"""The cost ledgers of a run, continued on resume: :class:`Ledgers`."""
from __future__ import annotations

from .._utils import plain_number

__all__ = ["Ledgers"]


class Ledgers:
    """The run's cost counters by source, as a checkpoint holds them and a resume continues them.

    Parameters
    ----------
    **sources
        ``name=object`` (None: left out). An exchange keeps its own counters
        (:meth:`~ppdnmf_torch.exchange.Exchange.cost_state` /
        :meth:`~ppdnmf_torch.exchange.Exchange.load_cost_state`); any other object with
        ``costs()`` (an aggregator) is continued by adding the checkpoint's numbers to its own
        (its setup, counted again by a resumed process, stays counted twice).
    """

    def __init__(self, **sources):
        self.sources = {name: src for name, src in sources.items() if src is not None}
        self._offsets: dict = {}

    def state(self) -> dict:
        """``{name: {counter: number}}`` (plain numbers: no key material)."""
        out = {}
        for name, src in self.sources.items():
            if hasattr(src, "cost_state"):
                out[name] = src.cost_state()
            else:
                out[name] = {k: v for k, v in self.costs(name).items() if plain_number(v) is not None}
        return out

    def load(self, saved: dict) -> None:
        """Continue the counters of a checkpoint's :meth:`state` (after the sources are bound)."""
        for name, src in self.sources.items():
            if hasattr(src, "load_cost_state"):
                src.load_cost_state(saved.get(name, {}))
            else:
                self._offsets[name] = dict(saved.get(name, {}))

    def costs(self, name: str) -> dict:
        """Source ``name``'s cumulative costs, a resumed run's earlier segments included."""
        src = self.sources.get(name)
        offset = self._offsets.get(name, {})
        out = dict(src.costs()) if src is not None else {}
        for key, v in offset.items():
            mine = plain_number(out.get(key, 0))
            out[key] = v if mine is None else mine + v
        return out
