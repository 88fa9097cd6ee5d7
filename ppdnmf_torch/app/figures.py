"""PNG figures of a finished run, for a reader without TensorBoard (matplotlib's Agg canvas).

:func:`write_figures` writes, into the run folder, what a task has of:

* ``curves.png``: the loss curves from the history (one panel per quantity, a line per trial,
  log scale where a quantity spans decades);
* ``factors.png``: images (PPDNMF's columns of ``X`` on image data; symmetric NMF's cluster
  means), or a heat map of a factor (PPDNMF's ``X`` otherwise);
* ``loadings.png``: FSSPCA's loadings ``z`` ``(d, r)``, a heat map with its zeros white;
* ``clusters.png``: symmetric NMF's similarity with rows and columns sorted by cluster, and the
  cluster sizes.

It draws on a :class:`matplotlib.figure.Figure` with its own Agg canvas, never through pyplot,
so no global backend is chosen or changed and nothing is shown on a screen. A figure that fails
(a full disk, a value matplotlib cannot draw) is left out with a warning: the run's results are
already written.
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np

__all__ = ["write_figures", "columns_as_images", "FIGURE_NAMES", "MAX_PANELS"]

log = logging.getLogger("ppdnmf_torch.app.figures")

#: the files :func:`write_figures` may write
FIGURE_NAMES = ("curves.png", "factors.png", "loadings.png", "clusters.png")
#: at most this many curves (panels) and images per figure
MAX_PANELS = 8
#: pixels per inch of the PNG files
DPI = 100


def _as_array(v) -> np.ndarray:
    if hasattr(v, "detach"):
        v = v.detach().cpu().double().numpy()
    return np.asarray(v, dtype=np.float64)


def columns_as_images(M, shape, order: str = "F") -> np.ndarray:
    """The columns of ``M (h*w, B)`` as ``B`` images ``(B, h, w)`` (``order="F"``: each column read
    column-major, the CBCL file's convention, as TensorBoard's images are)."""
    h, w = int(shape[0]), int(shape[1])
    cols = _as_array(M).T
    if order.upper() == "F":
        return np.ascontiguousarray(cols.reshape(-1, w, h).transpose(0, 2, 1))
    return cols.reshape(-1, h, w)


def _figure(n_panels: int, width: float = 4.0, height: float = 3.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cols = min(n_panels, 3)
    rows = math.ceil(n_panels / cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]


def _save(fig, path: Path) -> str:
    """The figure as ``path``, written beside and renamed into place (a reader never sees half a PNG)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path.name


def _series(histories: dict, name: str):
    if name not in histories:
        return None
    a = _as_array(histories[name])
    a = a[:, None] if a.ndim == 1 else a.reshape(a.shape[0], -1)
    return a if a.size and np.isfinite(a).any() else None


def _curves(path: Path, histories: dict, names, title: str) -> str | None:
    shown = []
    for name in names:  # a name, or (a panel's title, the names drawn in it)
        panel, keys = (name, (name,)) if isinstance(name, str) else name
        series = [(k, a) for k in keys if (a := _series(histories, k)) is not None]
        if series:
            shown.append((panel, series))
    if not shown:
        return None
    shown = shown[:MAX_PANELS]
    fig, axes = _figure(len(shown))
    for ax, (panel, series) in zip(axes, shown):
        for key, a in series:
            steps = np.arange(1, a.shape[0] + 1)
            for t in range(min(a.shape[1], 16)):
                ax.plot(steps, a[:, t], linewidth=1.2, alpha=0.8 if a.shape[1] > 1 else 1.0,
                        label=key.replace("_", " ") if t == 0 and len(series) > 1 else None)
        finite = np.concatenate([a[np.isfinite(a)] for _, a in series])
        if finite.size and (finite > 0).all() and finite.max() / finite.min() > 100:
            ax.set_yscale("log")
        if len(series) > 1:
            ax.legend(fontsize=8)
        ax.set_title(panel.replace("_", " "))
        ax.set_xlabel("iteration")
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _images(path: Path, images, title: str) -> str | None:
    a = _as_array(images)
    if a.ndim == 2:  # one factor as a heat map
        fig, (ax,) = _figure(1, width=6.0, height=4.0)
        im = ax.imshow(a, aspect="auto", cmap="viridis", interpolation="nearest")
        fig.colorbar(im, ax=ax)
        ax.set_xlabel("component")
        ax.set_ylabel("row")
    else:
        a = a[:MAX_PANELS * 2]
        fig, axes = _figure(len(a), width=2.0, height=2.0)
        for i, (ax, img) in enumerate(zip(axes, a)):
            ax.imshow(img, cmap="gray", interpolation="nearest")
            ax.set_title(str(i), fontsize=8)
            ax.set_axis_off()
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _loadings(path: Path, z) -> str:
    z = _as_array(z)
    fig, (ax,) = _figure(1, width=max(3.0, 0.6 * z.shape[1] + 2.0), height=min(12.0, 2.0 + 0.08 * z.shape[0]))
    lim = float(np.abs(z).max()) or 1.0
    masked = np.ma.masked_where(z == 0, z)
    im = ax.imshow(masked, aspect="auto", cmap="coolwarm", vmin=-lim, vmax=lim, interpolation="nearest")
    fig.colorbar(im, ax=ax)
    ax.set_xlabel("loading")
    ax.set_ylabel("feature")
    ax.set_title(f"loadings z ({int((z == 0).sum())} of {z.size} entries zero, white)")
    fig.tight_layout()
    return _save(fig, path)


def _clusters(path: Path, similarity, sizes) -> str:
    fig, axes = _figure(2 if sizes is not None else 1, width=4.5, height=4.0)
    axes[0].imshow(_as_array(similarity), cmap="magma", interpolation="nearest")
    axes[0].set_title("similarity, sorted by cluster")
    axes[0].set_axis_off()
    if sizes is not None:
        s = _as_array(sizes)
        axes[1].bar(np.arange(s.size), s)
        if s.size <= 20:
            axes[1].set_xticks(np.arange(s.size))
        axes[1].set_xlabel("cluster")
        axes[1].set_title("cluster sizes")
    fig.tight_layout()
    return _save(fig, path)


def write_figures(out, histories: dict | None = None, *, title: str = "", curves=(), images=None,
                  images_title: str = "factors", loadings=None, clusters=None, sizes=None) -> list:
    """Write the run's PNG figures into ``out`` and return their file names.

    Parameters
    ----------
    out : path
        The run folder.
    histories : dict, optional
        ``{name: (n_iter,) or (n_iter, T)}``; the names in ``curves`` that it holds are drawn.
    title : str
    curves : sequence of str or (str, sequence of str)
        The history keys to draw, in order, one panel each (at most :data:`MAX_PANELS`), or a
        panel's title with the keys drawn together in it.
    images : array (B, H, W) or (H, W), optional
        Images (``factors.png``; a 2-D array is drawn as a heat map).
    loadings : array (d, r), optional
        ``loadings.png``.
    clusters : array (n, n), optional
        The sorted similarity (``clusters.png``, with ``sizes`` ``(r,)``).
    """
    out = Path(out)
    jobs = [("curves.png", lambda p: _curves(p, histories or {}, curves, title)),
            ("factors.png", lambda p: _images(p, images, f"{title}: {images_title}") if images is not None else None),
            ("loadings.png", lambda p: _loadings(p, loadings) if loadings is not None else None),
            ("clusters.png", lambda p: _clusters(p, clusters, sizes) if clusters is not None else None)]
    written = []
    for name, draw in jobs:
        try:
            done = draw(out / name)
        except (OSError, ValueError, TypeError, ImportError) as exc:
            log.warning("figure %s not written: %s", name, " ".join(str(exc).split()) or type(exc).__name__)
            continue
        if done:
            written.append(done)
    return written
