"""What the app (``ppdnmf task=symnmf``) calls: one fit with per-iteration scalars out, then a
summary of plain numbers and the arrays to write (no TensorBoard or Hydra here: the app
owns its loggers and turns its config into these arguments).
"""
from __future__ import annotations

import time

import torch

from ..._utils import CALLBACK
from ...errors import ConfigError
from ...specs import check_call, check_value
from .fit import fit_symnmf
from .operator import as_similarity

__all__ = ["run_symnmf", "run_symnmf_agents", "reorder_by_labels", "SCALAR_TAGS", "AGENTS_SCALAR_TAGS", "IMAGE_MAX_N"]

#: the scalar tags handed to ``log_scalars`` each iteration (one value per trial)
SCALAR_TAGS = {"E": "symnmf/E", "objective": "symnmf/objective", "rel_gap": "symnmf/rel_gap_UV",
               "gap": "symnmf/gap_UV_sq", "lam": "symnmf/lambda"}
#: the reordered similarity image is made for ``n`` up to this (a dense ``n x n`` image)
IMAGE_MAX_N = 4096


def _check_hooks(*, trial, **hooks) -> None:
    """The run's own keywords (the fit's are the fit's to check): callables or None, and ``trial``."""
    check_call(hooks, also={name: CALLBACK for name in hooks})
    check_value("trial", trial, int | None, {"ge": 0})


def _chosen(trial: int, T: int) -> int:
    if trial >= T:
        raise ConfigError(f"trial: {trial}, but the fit ran {T} trial(s)")
    return int(trial)


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
    _check_hooks(log_scalars=log_scalars, score=score, trial=trial)
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
    t = res.best_trial() if trial is None else _chosen(trial, res.trials)
    summary["reported_trial"] = t
    arrays = {"U": res.U[t].cpu(), "V": res.V[t].cpu(), "labels": labels[t],
              "cluster_sizes": torch.bincount(labels[t], minlength=rank)}
    arrays.update({f"history/{k}": v for k, v in res.history.items()})
    n = int(res.U.shape[1])
    if n <= IMAGE_MAX_N:
        Xt = X[t] if (isinstance(X, torch.Tensor) and X.dim() == 3) else X
        arrays["reordered_similarity"] = reorder_by_labels(Xt, labels[t])
    return summary, arrays


#: the scalar tags of a fit across agents (one value per trial)
AGENTS_SCALAR_TAGS = {"E": "symnmf/E", "objective": "symnmf/objective", "uv_dist": "symnmf/gap_UV",
                      "consensus": "symnmf/consensus", "stationarity": "symnmf/stationarity", "lambda": "symnmf/lambda",
                      "bytes": "symnmf/bytes"}


def run_symnmf_agents(X, rank, *, log_scalars=None, score=None, trial: int | None = None, fit=None, **fit_kwargs):
    """:func:`run_symnmf` for the fit across agents: fit (``fit``, default
    :func:`~.agents.fit_symnmf_agents`; a run over ranks passes ``functools.partial(fit_symnmf_rank,
    comm)``), streaming scalars, and return ``(summary, arrays)`` (None on a rank other than 0).

    ``log_scalars(k, {tag: list of T floats})`` gets :data:`AGENTS_SCALAR_TAGS` every outer
    iteration. The summary holds per-trial lists as :func:`run_symnmf`'s (``E``, ``objective``,
    ``rel_gap`` (``||U - V||_F / ||V||_F``), ``consensus``, ``lam``, ``n_iter``, ``converged``),
    the exchange's ``costs`` and ``n_agents``; the arrays those of :func:`run_symnmf` and
    ``U_agents`` ``(N, n, r)`` of the chosen trial.
    """
    _check_hooks(log_scalars=log_scalars, score=score, fit=fit, trial=trial)
    if fit is None:
        from .agents import fit_symnmf_agents as fit
    user_cb = fit_kwargs.pop("callback", None)

    def cb(k, metrics):
        if log_scalars is not None:
            log_scalars(k, {tag: [float(x) for x in torch.as_tensor(metrics[key]).reshape(-1).tolist()]
                            for key, tag in AGENTS_SCALAR_TAGS.items() if key in metrics})
        return bool(user_cb(k, metrics)) if user_cb is not None else False

    t0 = time.perf_counter()
    out = fit(X, rank, callback=cb, **fit_kwargs)
    res = getattr(out, "result", out)  # a run over ranks: its result (None on ranks other than 0)
    if res is None:
        return None
    seconds = time.perf_counter() - t0
    T = int(res.U.shape[0])
    labels = res.U.argmax(dim=-1).cpu()
    hist = {k: torch.as_tensor([list(map(float, torch.as_tensor(v).reshape(-1).tolist())) for v in vals],
                               dtype=torch.float64).reshape(len(vals), -1)
            for k, vals in res.history.items()}
    last = {k: v[-1].tolist() if len(v) else [] for k, v in hist.items()}
    v_norm = torch.linalg.matrix_norm(res.V.double()).cpu().clamp_min(torch.finfo(torch.float64).tiny)
    summary = {"method": "agents", "penalty": str(fit_kwargs.get("penalty", "adaptive")), "trials": T,
               "n_iter": [int(res.n_iter)] * T, "converged": [bool(res.converged)] * T, "E": last["E"],
               "objective": last["objective"], "rel_gap": (torch.as_tensor(last["uv_dist"]) / v_norm).tolist(),
               "consensus": last["consensus"], "lam": res.lam.detach().cpu().reshape(-1).tolist(),
               "n_agents": int(res.U_agents.shape[1]), "costs": dict(res.costs), "wall_time": seconds}
    if score is not None:
        scores = [score(labels[t]) for t in range(T)]
        for name in scores[0]:
            summary[name] = [float(s[name]) for s in scores]
    t = int(torch.as_tensor(summary["E"]).argmin()) if trial is None else _chosen(trial, T)
    summary["reported_trial"] = t
    arrays = {"U": res.U[t].cpu(), "V": res.V[t].cpu(), "labels": labels[t], "U_agents": res.U_agents[t].cpu(),
              "cluster_sizes": torch.bincount(labels[t], minlength=rank)}
    arrays.update({f"history/{k}": v for k, v in hist.items()})
    if int(res.U.shape[1]) <= IMAGE_MAX_N:
        arrays["reordered_similarity"] = reorder_by_labels(X, labels[t])
    return summary, arrays
