"""What a run reports to while it runs: one interface, TensorBoard or nothing.

The runner calls :meth:`RunLogger.centralized` once the baseline is done,
:meth:`RunLogger.iteration` after every BCD iteration of the distributed fit, and
:meth:`RunLogger.finished` with the results; :meth:`RunLogger.close` always. The other
models' tasks report their own scalars through :meth:`RunLogger.scalars` and images through
:meth:`RunLogger.image`, then call :meth:`RunLogger.finished` without a result. The
TensorBoard implementation lives in :mod:`ppdnmf_torch.app.tensorboard`, which the runner
imports only when asked for, so the numerical core never imports TensorBoard.
"""
from __future__ import annotations

__all__ = ["RunLogger", "NullLogger"]


class RunLogger:
    """A run's logger: every method does nothing unless a subclass says otherwise."""

    def centralized(self, history: dict) -> None:
        """The centralized baseline's history (lists of floats per BCD iteration)."""

    def iteration(self, info, x_iters: int) -> None:
        """One BCD iteration of the distributed fit: ``info`` is the solver's
        :class:`~ppdnmf_torch.models.ppdnmf.solver.IterationInfo` (metrics as floats), with the exchange's
        cumulative ``costs`` and its per-ADMM-iteration ``iteration_costs``."""

    def finished(self, result, central, *, hparams: dict, metrics: dict, images: dict | None = None,
                 config_text: str = "") -> None:
        """The run's end: its results, the hparams and final metrics, image grids when the data
        are images (``images``: ``shape``, ``Z``, ``columns``, ``scale``), the config as text."""

    def scalars(self, step: int, values: dict) -> None:
        """A task's own scalars of one outer iteration: ``{tag: float}`` at ``step`` (the models
        other than PPDNMF report through this and :meth:`image`)."""

    def image(self, tag: str, images, step: int = 0, *, scale: int = 1, normalize: bool = False) -> None:
        """One image ``(H, W)`` or a grid of images ``(B, H, W)``, values in [0, 1] (``normalize``:
        each image scaled to [0, 1] on its own first)."""

    def close(self) -> None:
        """Flush and release."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class NullLogger(RunLogger):
    """``logger.kind=none``: nothing is logged."""
