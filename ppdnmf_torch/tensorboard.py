"""TensorBoard logging of a PPDNMF run (scalars, crypto costs, hparams, image grids).

Only the runner, the CLI and this module import :mod:`torch.utils.tensorboard`; the
numerical core never does. The image helpers (:func:`make_grid`, :func:`basis_images`,
:func:`column_images`) are plain torch and need no torchvision.

Tags written by :class:`TensorBoardLogger`, one step per BCD iteration:

* ``nmse/distributed``, ``nmse/centralized``, ``consensus``, ``objective``,
  ``centralized/objective``
* ``admm/x_primal``, ``admm/x_dual``, ``admm/y_primal``, ``admm/y_dual``
* ``time/x_step``, ``time/y_step`` (seconds per step), ``time/iteration`` (wall time
  between two callbacks, metrics and logging included)
* ``crypto/<name>``: cumulative exchange costs (after each BCD iteration, when the
  exchange reports any); ``crypto_admm/<name>``: per-ADMM-iteration records, step
  ``(bcd_iter - 1) * x_iters + admm_iter``
* ``images/basis``, ``images/samples`` for image data; an hparams summary under ``hparams/``.
"""
from __future__ import annotations

import math
import numbers
import os
import time

import torch
from torch.utils.tensorboard import SummaryWriter

__all__ = [
    "TensorBoardLogger",
    "make_grid",
    "normalize_images",
    "basis_images",
    "column_images",
    "numeric_items",
    "SCALAR_TAGS",
]

#: per-BCD-iteration history keys of :class:`~ppdnmf_torch.api.FitResult` and their tags
SCALAR_TAGS = {
    "nmse": "nmse/distributed",
    "consensus": "consensus",
    "nmse_worst": "nmse/worst_agent_refit",
    "objective": "objective",
    "x_primal": "admm/x_primal",
    "x_dual": "admm/x_dual",
    "y_primal": "admm/y_primal",
    "y_dual": "admm/y_dual",
}
_TIME_TAGS = {"time_x": "time/x_step", "time_y": "time/y_step"}


def numeric_items(d: dict | None):
    """``(name, float)`` for the finite-or-not real numbers of ``d`` (bools, strings, lists skipped)."""
    for k, v in (d or {}).items():
        if isinstance(v, bool):
            continue
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                continue
            v = v.item()
        if isinstance(v, numbers.Real):
            yield str(k), float(v)


# --------------------------------------------------------------------------------------
# Image helpers (torch only)
# --------------------------------------------------------------------------------------


def normalize_images(images: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Scale every image of ``(B, H, W)`` to [0, 1] on its own (a constant image becomes 0)."""
    flat = images.reshape(images.shape[0], -1)
    lo = flat.min(dim=1).values[:, None, None]
    hi = flat.max(dim=1).values[:, None, None]
    return (images - lo) / (hi - lo).clamp_min(eps)


def column_images(M: torch.Tensor, shape, order: str = "F") -> torch.Tensor:
    """Columns of ``M (h*w, B)`` as images ``(B, h, w)``.

    ``order="F"`` reads each column in Fortran (column-major) order, the convention
    of the CBCL file (``Z[:, i].reshape(19, 19, order="F")`` is upright).
    """
    h, w = int(shape[0]), int(shape[1])
    if M.dim() != 2 or M.shape[0] != h * w:
        raise ValueError(f"column_images: expected ({h * w}, B) columns for {h}x{w} images, got {tuple(M.shape)}")
    cols = M.detach().to("cpu", torch.float32).T  # (B, h*w)
    if order.upper() == "F":
        return cols.reshape(-1, w, h).transpose(1, 2).contiguous()
    return cols.reshape(-1, h, w)


def basis_images(X: torch.Tensor, shape, order: str = "F") -> torch.Tensor:
    """The columns of a left factor ``X (L, K)`` as ``K`` images, each normalised to [0, 1]."""
    return normalize_images(column_images(X, shape, order))


def make_grid(images: torch.Tensor, nrow: int | None = None, padding: int = 1, pad_value: float = 1.0,
              scale: int = 1) -> torch.Tensor:
    """Tile ``(B, H, W)`` images (values in [0, 1]) into one ``(1, H', W')`` image, row-major.

    Parameters
    ----------
    images : Tensor (B, H, W)
        Values in [0, 1].
    nrow : int, optional
        Images per row (default ``ceil(sqrt(B))``).
    padding : int
        Pixels between images and around the border (before scaling).
    pad_value : float
    scale : int
        Every pixel becomes a ``scale x scale`` block (nearest neighbour), so that
        19x19 images are visible.
    """
    if images.dim() != 3 or images.shape[0] < 1:
        raise ValueError(f"make_grid: expected (B, H, W) images, got shape {tuple(images.shape)}")
    B, H, W = images.shape
    ncol = nrow or max(1, math.ceil(math.sqrt(B)))
    nrows = math.ceil(B / ncol)
    grid = torch.full(
        (nrows * (H + padding) + padding, ncol * (W + padding) + padding), float(pad_value), dtype=torch.float32
    )
    for b in range(B):  # B is a few dozen images at most
        r, c = divmod(b, ncol)
        top, left = padding + r * (H + padding), padding + c * (W + padding)
        grid[top:top + H, left:left + W] = images[b].to(torch.float32)
    if scale > 1:
        grid = grid.repeat_interleave(scale, dim=0).repeat_interleave(scale, dim=1)
    return grid.clamp(0, 1)[None]


# --------------------------------------------------------------------------------------
# The logger
# --------------------------------------------------------------------------------------


class TensorBoardLogger:
    """Writes a run's TensorBoard events under ``log_dir``.

    Use :meth:`callback` as (part of) the ``callback`` of :func:`ppdnmf_torch.fit`; it logs
    the scalars of every BCD iteration. After the run call :meth:`log_timing`,
    :meth:`log_centralized`, :meth:`log_costs`, :meth:`log_images` and
    :meth:`log_hparams` as they apply, then :meth:`close`.
    """

    def __init__(self, log_dir, flush_secs: int = 30):
        self.log_dir = os.fspath(log_dir)
        self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=flush_secs)
        self._last = None

    # -- per BCD iteration ---------------------------------------------------------------
    def callback(self, info) -> bool:
        """Log ``info.metrics`` (floats or 1-element tensors) at step ``info.iteration``; never stops the run."""
        step = int(info.iteration)
        metrics = dict(numeric_items(info.metrics))
        for key, tag in SCALAR_TAGS.items():
            if key in metrics:
                self.writer.add_scalar(tag, metrics[key], step)
        now = time.perf_counter()
        elapsed = float(getattr(info, "elapsed", 0.0))
        if self._last is None:
            self.writer.add_scalar("time/iteration", elapsed, step)
        else:
            self.writer.add_scalar("time/iteration", now - self._last, step)
        self._last = now
        return False

    __call__ = callback

    def log_history(self, history: dict, prefix_map: dict | None = None, start: int = 1) -> None:
        """Log a whole per-BCD-iteration history (lists of floats) with steps ``start, start+1, ...``."""
        for key, tag in (prefix_map or SCALAR_TAGS).items():
            for i, v in enumerate(history.get(key, [])):
                if isinstance(v, numbers.Real) and not isinstance(v, bool):
                    self.writer.add_scalar(tag, float(v), start + i)

    def log_timing(self, history: dict) -> None:
        """``time/x_step`` and ``time/y_step`` (seconds) of every BCD iteration, from a run's history."""
        self.log_history(history, _TIME_TAGS)

    def log_centralized(self, history: dict) -> None:
        """The centralized baseline's history: ``nmse/centralized`` and ``centralized/objective``."""
        self.log_history(history, {"nmse": "nmse/centralized", "objective": "centralized/objective"})

    # -- crypto costs ------------------------------------------------------------------
    def log_costs(self, costs: dict | None, step: int, prefix: str = "crypto") -> None:
        """Log the numeric entries of a cost dict as ``<prefix>/<name>`` at ``step`` (others are skipped)."""
        for name, v in numeric_items(costs):
            self.writer.add_scalar(f"{prefix}/{name}", v, int(step))

    def log_iteration_costs(self, records, x_iters: int, prefix: str = "crypto_admm") -> None:
        """Per-ADMM-iteration cost records (dicts with ``bcd_iter``, ``admm_iter`` and numbers).

        The step is ``(bcd_iter - 1) * x_iters + admm_iter``, a global ADMM iteration counter.
        """
        for rec in records or ():
            b, a = int(rec.get("bcd_iter", 0)), int(rec.get("admm_iter", 0))
            step = max(b - 1, 0) * int(x_iters) + a
            self.log_costs({k: v for k, v in rec.items() if k not in ("bcd_iter", "admm_iter")}, step, prefix)

    # -- images ------------------------------------------------------------------------
    def log_images(self, X: torch.Tensor, shape, *, Z: torch.Tensor | None = None,
                   reconstructions: dict | None = None, columns=None, step: int = 0,
                   scale: int = 4, order: str = "F") -> None:
        """Basis images and original vs reconstructed samples.

        Parameters
        ----------
        X : Tensor (L, K)
            The (mean) left factor; its columns become ``images/basis``, each normalised.
        shape : (h, w)
            Image shape, ``h * w == L``.
        Z : Tensor (L, M), optional
            The data. With ``reconstructions`` ({label: Tensor (L, M)}) and ``columns``
            (indices into M), ``images/samples`` shows one column per sample: the original
            on the first row and one row per reconstruction, clamped to [0, 1].
        reconstructions : dict of str to Tensor (L, M), optional
        columns : sequence of int, optional
        step : int
            TensorBoard step of the images.
        scale : int
            Pixels per image pixel in the grids (19x19 faces are tiny).
        order : {"F", "C"}
            How a column of ``L`` pixels folds into ``shape``: column-major (``"F"``, the
            CBCL file's convention; see :func:`column_images`) or row-major.
        """
        basis = basis_images(X, shape, order)
        self.writer.add_image("images/basis", make_grid(basis, scale=scale), step, dataformats="CHW")
        if Z is None or not columns:
            return
        idx = torch.as_tensor(list(columns), dtype=torch.long)
        rows = [column_images(Z[:, idx], shape, order)]
        for R in (reconstructions or {}).values():
            rows.append(column_images(R[:, idx], shape, order))
        tiles = torch.cat(rows, dim=0).clamp(0, 1)
        self.writer.add_image("images/samples", make_grid(tiles, nrow=len(idx), scale=scale), step, dataformats="CHW")
        labels = ["original"] + list(reconstructions or {})
        self.writer.add_text(
            "images/samples_legend",
            f"rows: {', '.join(labels)}; columns: data columns {', '.join(str(int(i)) for i in idx)} (0-based)",
            step,
        )

    # -- end of run --------------------------------------------------------------------
    def log_text(self, tag: str, text: str, step: int = 0) -> None:
        self.writer.add_text(tag, text, step)

    def log_hparams(self, hparams: dict, metrics: dict) -> None:
        """An hparams summary (written to ``<log_dir>/hparams``); values other than
        bool/int/float/str become strings, None values are left out; metrics are
        logged under ``hparam/<name>``."""
        hp = {}
        for k, v in hparams.items():
            if v is None:
                continue
            hp[k] = v if isinstance(v, (bool, int, float, str)) else str(v)
        md = {f"hparam/{k}": float(v) for k, v in numeric_items(metrics)}
        self.writer.add_hparams(hp, md, run_name="hparams")

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
