"""Progress of a CLI run: a tqdm bar on a terminal (stderr), nothing elsewhere."""
from __future__ import annotations

__all__ = ["Progress"]


class Progress:
    """One phase of a run (the centralized baseline, the distributed fit), ``total`` BCD iterations.

    :meth:`update` after every BCD iteration with the values to show; :meth:`close` at the end.
    """

    def __init__(self, enabled: bool, total: int, label: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            # disable=None: tqdm switches itself off when stderr is not a terminal
            self.bar = tqdm(total=total, desc=label, unit="it", leave=True, dynamic_ncols=True, disable=None)

    def update(self, shown: dict) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(shown, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
