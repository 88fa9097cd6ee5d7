"""TensorBoard logging of a PPDNMF run (scalars, crypto costs, hparams, image grids).

Only the runner, the CLI and this module import :mod:`torch.utils.tensorboard`; the
numerical core never does. The image helpers (:func:`make_grid`, :func:`basis_images`,
:func:`column_images`) are plain torch and need no torchvision.

One run is one TensorBoard run: every event of it, the hparams summary included, is in its
``log_dir`` (no ``hparams/`` sub-run). The headline charts come first: TensorBoard orders
tag groups by name, so they carry a number, and the Custom Scalars tab holds a layout with
the distributed and centralized NMSE in one chart and the consensus error on a log scale.
Tags, one step per BCD iteration:

* ``1_nmse/distributed``, ``1_nmse/centralized``: the paper's NMSE (not squared);
  ``1_nmse/worst_agent_refit``: every block scored with the farthest agent's ``X_i``, right
  factors refit (``nmse_worst``: it cannot hide disagreement);
* ``2_consensus/error`` and ``2_consensus/log10`` (its base-10 logarithm: TensorBoard has no
  default log axis per chart, and the consensus error spans many decades);
* ``3_objective/distributed``, ``3_objective/centralized``;
* ``admm/x_primal``, ``admm/x_dual``, ``admm/y_primal``, ``admm/y_dual``;
* ``time/x_step``, ``time/y_step`` (seconds per step), ``time/iteration`` (wall time
  between two callbacks, metrics and logging included);
* ``crypto/<name>``: cumulative exchange costs (after each BCD iteration, when the
  exchange reports any); ``crypto_admm/<name>``: per-ADMM-iteration records, step
  ``(bcd_iter - 1) * x_iters + admm_iter``;
* ``images/basis``, ``images/samples`` for image data; the hparams summary (with
  ``hparam/<metric>`` scalars) at the end.

A resumed run (``resume_at``) first rewrites the folder's earlier event files without the
events after its checkpoint (and without the centralized baseline, which it runs again), so
that no step is shown twice.
"""
from __future__ import annotations

import glob
import math
import numbers
import os
import time

import torch
from torch.utils.tensorboard import SummaryWriter

from .loggers import RunLogger

__all__ = [
    "TensorBoardLogger",
    "make_grid",
    "normalize_images",
    "basis_images",
    "column_images",
    "numeric_items",
    "SCALAR_TAGS",
    "CENTRAL_TAGS",
    "CONSENSUS_LOG_TAG",
    "LAYOUT",
]

#: per-BCD-iteration history keys of :class:`~ppdnmf_torch.models.ppdnmf.result.FitResult` and their tags
SCALAR_TAGS = {
    "nmse": "1_nmse/distributed",
    "nmse_worst": "1_nmse/worst_agent_refit",
    "consensus": "2_consensus/error",
    "objective": "3_objective/distributed",
    "x_primal": "admm/x_primal",
    "x_dual": "admm/x_dual",
    "y_primal": "admm/y_primal",
    "y_dual": "admm/y_dual",
}
#: the centralized baseline's tags
CENTRAL_TAGS = {"nmse": "1_nmse/centralized", "objective": "3_objective/centralized"}
#: the base-10 logarithm of the consensus error
CONSENSUS_LOG_TAG = "2_consensus/log10"
_TIME_TAGS = {"time_x": "time/x_step", "time_y": "time/y_step"}

#: the Custom Scalars tab: the headline charts
LAYOUT = {
    "PPDNMF": {
        "NMSE: distributed and centralized": ["Multiline", [SCALAR_TAGS["nmse"], CENTRAL_TAGS["nmse"]]],
        "consensus error (log10)": ["Multiline", [CONSENSUS_LOG_TAG]],
        "objective: distributed and centralized": ["Multiline", [SCALAR_TAGS["objective"],
                                                                 CENTRAL_TAGS["objective"]]],
    },
}


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


class TensorBoardLogger(RunLogger):
    """Writes a run's TensorBoard events under ``log_dir``.

    As the runner's :class:`~ppdnmf_torch.app.loggers.RunLogger`: :meth:`centralized`,
    :meth:`iteration`, :meth:`finished`, :meth:`close`. On its own: :meth:`callback` as (part
    of) the ``callback`` of :func:`ppdnmf_torch.fit` logs the scalars of every BCD iteration;
    after the run :meth:`log_timing`, :meth:`log_centralized`, :meth:`log_costs`,
    :meth:`log_images` and :meth:`log_hparams` as they apply, then :meth:`close`.
    """

    def __init__(self, log_dir, flush_secs: int = 30, *, resume_at: int | None = None, x_iters: int = 1):
        self.log_dir = os.fspath(log_dir)
        old = sorted(glob.glob(os.path.join(self.log_dir, "events.out.tfevents.*"))) if resume_at is not None else []
        self.writer = SummaryWriter(log_dir=self.log_dir, flush_secs=flush_secs)
        self._last = None
        if old:
            self._carry_over(old, int(resume_at), int(x_iters))
        else:
            self.writer.add_custom_scalars(LAYOUT)

    def _carry_over(self, files, resume_at: int, x_iters: int) -> None:
        """Copy the events of ``files`` up to the checkpoint (BCD iteration ``resume_at``; the
        ADMM records up to ``resume_at * x_iters``) into this run's new file, leaving out the
        centralized baseline's, then remove ``files``."""
        from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader

        central = set(CENTRAL_TAGS.values())
        fw = self.writer._get_file_writer()
        for path in files:
            for event in LegacyEventFileLoader(path).Load():  # the events as written, unconverted
                if not event.HasField("summary"):
                    continue  # file_version and the like: the new file has its own
                tags = [v.tag for v in event.summary.value]
                if any(t in central for t in tags):
                    continue
                limit = resume_at * x_iters if any(t.startswith("crypto_admm/") for t in tags) else resume_at
                if event.step <= limit or any(t == "custom_scalars__config__" for t in tags):
                    fw.add_event(event)
        self.writer.flush()
        for path in files:
            os.unlink(path)

    # -- the runner's interface ---------------------------------------------------------
    def centralized(self, history: dict) -> None:
        self.log_centralized(history)

    def iteration(self, info, x_iters: int) -> None:
        self.callback(info)
        costs = dict(numeric_items(info.costs))
        if costs:
            self.log_costs(costs, info.iteration)
        self.log_iteration_costs(info.iteration_costs, x_iters)

    def finished(self, result, central, *, hparams, metrics, images=None, config_text=""):
        if result is not None:
            self.log_timing(result.history)  # crypto/ costs were logged after every BCD iteration
        if images is not None and result is not None:
            recons = {"distributed": result.reconstruction()}
            if central is not None:
                recons["centralized"] = central.reconstruction()
            self.log_images(result.X_mean, images["shape"], Z=images["Z"].to(result.X.dtype),
                            reconstructions=recons, columns=images["columns"], step=result.n_iter,
                            scale=images["scale"])
        if config_text:
            self.log_text("config", config_text)
        self.log_hparams(hparams, metrics, step=result.n_iter if result is not None else 0)

    def scalars(self, step: int, values: dict) -> None:
        for tag, v in numeric_items(values):
            self.writer.add_scalar(tag, v, int(step))

    def image(self, tag: str, images, step: int = 0, *, scale: int = 1, normalize: bool = False) -> None:
        images = torch.as_tensor(images, dtype=torch.float32).cpu()
        images = images[None] if images.dim() == 2 else images
        grid = make_grid(normalize_images(images) if normalize else images, scale=scale)
        self.writer.add_image(tag, grid, int(step), dataformats="CHW")

    # -- per BCD iteration ---------------------------------------------------------------
    def callback(self, info) -> bool:
        """Log ``info.metrics`` (floats or 1-element tensors) at step ``info.iteration``; never stops the run."""
        step = int(info.iteration)
        metrics = dict(numeric_items(info.metrics))
        for key, tag in SCALAR_TAGS.items():
            if key in metrics:
                self.writer.add_scalar(tag, metrics[key], step)
        c = metrics.get("consensus")
        if c is not None and c > 0 and math.isfinite(c):
            self.writer.add_scalar(CONSENSUS_LOG_TAG, math.log10(c), step)
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
        """The centralized baseline's history: ``1_nmse/centralized`` and ``3_objective/centralized``."""
        self.log_history(history, CENTRAL_TAGS)

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

    def log_hparams(self, hparams: dict, metrics: dict, step: int = 0) -> None:
        """An hparams summary, in this run's own folder (not a sub-run); values other than
        bool/int/float/str become strings, None values are left out; metrics are logged
        under ``hparam/<name>`` at ``step``."""
        from torch.utils.tensorboard.summary import hparams as hparams_summary

        hp = {}
        for k, v in hparams.items():
            if v is None:
                continue
            if isinstance(v, bool):  # else stored as the number 1 or 0
                v = "true" if v else "false"
            hp[k] = v if isinstance(v, (int, float, str)) else str(v)
        md = {f"hparam/{k}": float(v) for k, v in numeric_items(metrics)}
        fw = self.writer._get_file_writer()
        for summary in hparams_summary(hp, md):
            fw.add_summary(summary, int(step))
        for k, v in md.items():
            self.writer.add_scalar(k, v, int(step))

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

