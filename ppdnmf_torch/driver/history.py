"""A run's metric history: :class:`History`, one list per key, one entry per row."""
from __future__ import annotations

import torch

from ..checkpoint import HistoryPacker, unpack_history

__all__ = ["History", "RowBuffer"]


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


class RowBuffer:
    """The memory of a host plan's history rows: a row's ``n_keys`` values ``(n_keys, T)`` are
    written into a NumPy view of a tensor of ``dtype``, and its ``n_keys`` tensors ``(T,)`` are made
    in bulk (one ``unbind`` per :attr:`CHUNK` rows costs a fraction of one per row). A chunk is
    written once and never reused, so the tensors handed out stay valid."""

    CHUNK = 64

    def __init__(self, T: int, n_keys: int, dtype=torch.float64):
        self.T, self.n_keys, self.dtype, self.i = T, n_keys, dtype, self.CHUNK

    def next(self):
        """The next row: its values ``(n_keys, T)`` to write and its ``n_keys`` tensors."""
        K = self.n_keys
        if self.i == self.CHUNK:
            buf = torch.empty((self.CHUNK * K, self.T), dtype=self.dtype)
            self.arr, self.views, self.i = buf.numpy().reshape(self.CHUNK, K, self.T), buf.unbind(0), 0
        i = self.i
        self.i = i + 1
        return self.arr[i], self.views[K * i:K * i + K]
