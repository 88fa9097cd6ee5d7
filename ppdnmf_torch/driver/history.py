"""A run's metric history: :class:`History`, one list per key, one entry per row."""
from __future__ import annotations

import torch

from ..checkpoint import HistoryPacker, unpack_history

__all__ = ["History"]


class History(dict):
    """``{key: [value per row]}``: what a model's steps return, row after row (tensors ``(T, ...)``
    or floats, as the model gives them), packed incrementally into its checkpoints
    (:class:`~ppdnmf_torch.checkpoint.HistoryPacker`: each write packs only the new rows, so a
    write costs the same at every point of a long run)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.packer = HistoryPacker()

    def append(self, row: dict, pad=()) -> None:
        """One row: each value appended to its key's list. A key that starts late (a counter that a
        resumed run's exchange adds) gets NaN for the earlier rows when it starts with one of the
        prefixes ``pad``, so that rows stay aligned; otherwise its list is just shorter."""
        if not pad:  # nothing to align (every run but a resumed exchange's)
            for key, value in row.items():
                self.setdefault(key, []).append(value)
            return
        rows = max((len(vals) for vals in self.values()), default=0)
        for key, value in row.items():
            vals = self.setdefault(key, [])
            if len(vals) < rows and any(key.startswith(p) for p in pad):
                vals.extend([float("nan")] * (rows - len(vals)))
            vals.append(value)

    def lengths(self) -> dict:
        return {key: len(vals) for key, vals in self.items()}

    def packed(self, lengths: dict) -> dict:
        """The first ``lengths[key]`` rows of each key, packed (:meth:`HistoryPacker.pack`)."""
        return self.packer.pack(self, lengths)

    @classmethod
    def unpacked(cls, packed: dict, device=None) -> "History":
        """The history of a checkpoint; its tensors on ``device`` (default: the CPU)."""
        out = cls(unpack_history(packed))
        if device is not None:
            for key, vals in out.items():
                out[key] = [v.to(device) if isinstance(v, torch.Tensor) else v for v in vals]
        return out
