"""What the app (``ppdnmf task=symnmf``) calls: one fit with per-iteration scalars out, then a
summary of plain numbers and the arrays to write (no TensorBoard or Hydra here: the app
owns its loggers and turns its config into these arguments).
"""
from __future__ import annotations

import torch

from .fit import fit_symnmf
from .operator import as_similarity

__all__ = ["run_symnmf", "reorder_by_labels", "SCALAR_TAGS", "IMAGE_MAX_N"]

#: the scalar tags handed to ``log_scalars`` each iteration (one value per trial)
SCALAR_TAGS = {"E": "symnmf/E", "objective": "symnmf/objective", "rel_gap": "symnmf/rel_gap_UV",
               "gap": "symnmf/gap_UV_sq", "lam": "symnmf/lambda"}
#: the reordered similarity image is made for ``n`` up to this (a dense ``n x n`` image)
IMAGE_MAX_N = 4096


def reorder_by_labels(X, labels: torch.Tensor) -> torch.Tensor:
    """``X`` (dense or sparse, ``(n, n)``) with rows and columns sorted by cluster label,
    dense ``(n, n)`` on the CPU, scaled to ``[0, 1]``: the block structure image."""
    sim = as_similarity(X, device="cpu")
    D = sim.data.to_dense() if sim.sparse else sim.data
    if D.dim() == 3:
        D = D[0]
    order = torch.argsort(labels.cpu(), stable=True)
    D = D[order][:, order].double()
    return D / D.max().clamp_min(torch.finfo(D.dtype).tiny)


def run_symnmf(X, rank, *, log_scalars=None, score=None, trial: int | None = None, **fit_kwargs):
    """Fit, streaming scalars, and return ``(summary, arrays)``.

    Parameters
    ----------
    X : similarity matrix
        As :func:`~.fit.fit_symnmf` takes it.
    rank : int
    log_scalars : callable, optional
        ``log_scalars(k, {tag: list of T floats})`` after each iteration (tags:
        :data:`SCALAR_TAGS`); the app writes them to TensorBoard.
    score : callable, optional
        ``score(labels) -> {name: float}`` for labels ``(T, n)`` int64 (the app passes the
        clustering accuracy and NMI against known labels); its values go into the summary,
        one list over trials each.
    trial : int, optional
        The trial whose arrays are returned (default: the smallest final ``E``).
    **fit_kwargs
        Passed to :func:`~.fit.fit_symnmf` (``method``, ``penalty``, ``trials``, ``max_iter``,
        ``tol``, ``checkpoint_dir``, ...). A ``callback`` given here runs after
        ``log_scalars`` and may stop the run.

    Returns
    -------
    summary : dict
        :meth:`SymNMFResult.summary` plus the score's values.
    arrays : dict of torch.Tensor (CPU)
        ``U``, ``V`` ``(n, r)`` of the chosen trial, ``labels`` ``(n,)`` (row-wise argmax of
        ``U``), the histories ``(K + 1, T)`` under ``history/<key>``, ``reordered_similarity``
        ``(n, n)`` when ``n <= IMAGE_MAX_N``, and ``cluster_sizes`` ``(r,)``.
    """
    user_cb = fit_kwargs.pop("callback", None)

    def cb(info):
        if log_scalars is not None:
            log_scalars(info.k, {tag: info.metrics[key].tolist() for key, tag in SCALAR_TAGS.items()})
        return bool(user_cb(info)) if user_cb is not None else False

    res = fit_symnmf(X, rank, callback=cb, **fit_kwargs)
    labels = res.U.argmax(dim=-1).cpu()
    summary = res.summary()
    if score is not None:
        scores = [score(labels[t]) for t in range(res.trials)]  # the app's metric, once per trial
        for name in scores[0]:
            summary[name] = [float(s[name]) for s in scores]
    t = res.best_trial() if trial is None else int(trial)
    summary["reported_trial"] = t
    arrays = {"U": res.U[t].cpu(), "V": res.V[t].cpu(), "labels": labels[t],
              "cluster_sizes": torch.bincount(labels[t], minlength=rank)}
    arrays.update({f"history/{k}": v for k, v in res.history.items()})
    n = int(res.U.shape[1])
    if n <= IMAGE_MAX_N:
        Xt = X[t] if (isinstance(X, torch.Tensor) and X.dim() == 3) else X
        arrays["reordered_similarity"] = reorder_by_labels(Xt, labels[t])
    return summary, arrays
