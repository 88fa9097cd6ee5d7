"""The FSSPCA experiments (the paper's copy has none; designed from docs/SPARSE_PCA.md's list)
and the function the app calls (:func:`run_task`). Each experiment returns a dict of plain
numbers (JSON) and is run by ``scripts/reproduce_fsspca.py``; docs/RESULTS.md reports them.
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np
import torch

from ..._utils import CALLBACK
from ...errors import ConfigError, ConvergenceWarning
from ...graph import Graph
from ...specs import check_call
from .config import ESTIMATOR, RUN, SPEC, TASK
from .data import load_dataset, load_rows, spiked_covariance, split_rows
from .deflation import fit_sequential
from .fit import fit_fsspca
from .smoothing import SMOOTHINGS

__all__ = ["principal_sines", "fluctuation", "support_scores", "exp_pca_limit", "exp_fluctuation",
           "exp_smoothing", "exp_support", "exp_real_data", "exp_workers", "exp_workers_settings", "exp_deflation",
           "EXPERIMENTS",
           "run_task", "run_serverless"]


#: every experiment but the fluctuation study (a fixed count by design, ``tol = 0``) runs up to the
#: estimator's own cap, so that a row ends by the stopping rule rather than on a cap of its own
MAX_ITER = ESTIMATOR.max_iter


def _quiet(fn, *a, **k):
    """``fn(*a, **k)`` (``fit_fsspca``, ``fit_sequential``) without convergence warnings, with the plain
    upload the paper's experiments ran (the library's default is the secure sum since)."""
    k.setdefault("aggregation", "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fn(*a, **k)


def principal_sines(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Sines of the principal angles between ``span(Q)`` and the top-``r`` eigenvectors of the
    centred ``A^T A`` (``numpy.linalg.eigh``)."""
    A = A - A.mean(axis=0)
    r = Q.shape[1]
    V = np.linalg.eigh(A.T @ A)[1][:, -r:]
    return np.sqrt(np.clip(1 - np.linalg.svd(V.T @ Q, compute_uv=False) ** 2, 0, None))


def fluctuation(objective: np.ndarray, tail: float = 0.5) -> dict:
    """How much an objective trajectory ``(n_iter,)`` still moves over its last ``tail``:
    ``ups`` (iterations where it increased by more than ``1e-9`` relative), ``tv`` (its total
    variation there over ``|final|``)."""
    o = np.asarray(objective, dtype=np.float64)
    t = o[int(len(o) * (1 - tail)):]
    dif = np.diff(t)
    scale = max(abs(o[-1]), 1e-300)
    return {"ups": int((dif > 1e-9 * scale).sum()), "tv": float(np.abs(dif).sum() / scale)}


def support_scores(z: np.ndarray, truth: np.ndarray) -> dict:
    """Support recovery of loadings ``z (d, r)`` against the true nonzero pattern ``(d, r)``:
    precision, recall, F1 and exact recovery, after matching ``z``'s columns to the true ones
    (the permutation with the largest sum of absolute cosines; loadings come in any order)."""
    from itertools import permutations

    r = z.shape[1]
    zn = z / np.maximum(np.linalg.norm(z, axis=0, keepdims=True), 1e-300)
    tn = truth / np.maximum(np.linalg.norm(truth, axis=0, keepdims=True), 1e-300)
    cos = np.abs(zn.T @ tn)  # (r_z, r_true) on the supports' indicator
    best = max(permutations(range(r)), key=lambda p: sum(cos[p[j], j] for j in range(r)))
    nz, tr = z[:, list(best)] != 0, truth
    tp = float((nz & tr).sum())
    prec = tp / max(nz.sum(), 1)
    rec = tp / max(tr.sum(), 1)
    f1 = 0.0 if tp == 0 else 2 * prec * rec / (prec + rec)
    return {"precision": prec, "recall": rec, "f1": f1, "exact": bool((nz == tr).all())}


def exp_pca_limit(datasets=("wine", "breast_cancer"), n_workers=5, seed=0, max_iter=MAX_ITER):
    """lambda_1 = lambda_2 = 0: the federated loadings span the top-r principal subspace of the
    pooled data (IID and non-IID by class)."""
    out = []
    for name in datasets:
        X, y = load_dataset(name)
        for split in ("iid", "class"):
            groups = split_rows(split, n_workers, y=y, seed=seed)
            t0 = time.perf_counter()
            res = _quiet(fit_fsspca, X, 3, groups=groups, alpha=0.0, lambda_2=0.0, max_iter=max_iter, tol=1e-7,
                         seed=seed)
            out.append(dict(dataset=name, split=split, K=n_workers, r=3, n_iter=int(res.n_iter[0]),
                            converged=bool(res.converged[0]),
                            max_sine=float(principal_sines(X, res.components[0].numpy()).max()),
                            seconds=time.perf_counter() - t0))
    return out


def exp_fluctuation(Ks=(4, 16), rho_scales=(0.5, 2.0), alpha=200.0, seed=0, max_iter=300):
    """FSSPCA (Huber smoothing, lambda_2 = lambda_1 / K) against the unsmoothed ADMM of Tan et
    al. (lambda_2 = 0) on the spiked model: fluctuation of the objective over the second half
    of the run (:func:`fluctuation`), across K and rho."""
    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=seed)
    out = []
    for K in Ks:
        groups = split_rows("iid", K, n=len(sp.X), seed=seed)
        for rs in rho_scales:
            for label, lam2 in (("fsspca", None), ("unsmoothed", 0.0)):
                res = _quiet(fit_fsspca, sp.X, 2, groups=groups, alpha=alpha, lambda_2=lam2, rho_scale=rs,
                             max_iter=max_iter, tol=0.0, seed=seed)
                fl = fluctuation(res.history["objective"][:, 0].numpy())
                out.append(dict(method=label, K=K, rho_scale=rs, **fl,
                                final_objective=float(res.history["objective"][-1, 0]),
                                consensus=float(res.history["consensus"][-1, 0]),
                                **support_scores(res.z[0].numpy(), sp.support)))
    return out


def exp_smoothing(alphas=(100.0, 200.0), n_workers=8, seed=0, max_iter=MAX_ITER, mu=1e-3):
    """The four smoothing functions on the spiked model (the default's measurement): iterations
    to tol, fluctuation, support F1, adjusted explained variance; all alphas batched as trials."""
    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=seed)
    groups = split_rows("iid", n_workers, n=len(sp.X), seed=seed)
    out = []
    for name in sorted(SMOOTHINGS):
        t0 = time.perf_counter()
        res = _quiet(fit_fsspca, sp.X, 2, groups=groups, alpha=list(alphas), trials=len(alphas), smoothing=name,
                     mu=mu, max_iter=max_iter, tol=1e-6, seed=seed)
        sec = time.perf_counter() - t0
        for t, a in enumerate(alphas):
            n = int(res.n_iter[t])
            out.append(dict(smoothing=name, alpha=a, n_iter=n, converged=bool(res.converged[t]),
                            **fluctuation(res.history["objective"][:n, t].numpy()),
                            explained_variance=float(res.explained_variance[t]),
                            **support_scores(res.z[t].numpy(), sp.support), seconds_all_alphas=sec))
    return out


def exp_support(alphas=(0.0, 50.0, 100.0, 200.0, 300.0, 400.0), n_workers=8, seed=0, max_iter=MAX_ITER):
    """Support recovery on the spiked model against lambda_1: federated (K workers), centralized
    (one worker: the same algorithm on the pooled rows), federated from the pooled PCA start
    (``init="pca"``) and scikit-learn's SparsePCA (a different
    problem: no orthonormality; its alpha scanned on its own grid)."""
    from sklearn.decomposition import SparsePCA

    from .admm import adjusted_variance

    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=seed)
    A = sp.X - sp.X.mean(0)
    gram = torch.as_tensor(A.T @ A)[None]
    out = []
    for label, K, init in (("federated", n_workers, None), ("federated_pca_start", n_workers, "pca"),
                           ("centralized", 1, None)):
        groups = split_rows("iid", K, n=len(sp.X), seed=seed)
        res = _quiet(fit_fsspca, sp.X, 2, groups=groups, alpha=list(alphas), trials=len(alphas), max_iter=max_iter,
                     tol=1e-6, seed=seed, init=init)
        for t, a in enumerate(alphas):
            out.append(dict(method=label, alpha=a, n_iter=int(res.n_iter[t]),
                            sparsity=float(res.sparsity[t]), explained_variance=float(res.explained_variance[t]),
                            **support_scores(res.z[t].numpy(), sp.support)))
    for a in (0.5, 1.0, 2.0, 4.0, 8.0):
        t0 = time.perf_counter()
        sk = SparsePCA(2, alpha=a, random_state=seed).fit(sp.X)
        V = sk.components_.T
        out.append(dict(method="sklearn_sparsepca", alpha=a, n_iter=int(sk.n_iter_), sparsity=float((V == 0).mean()),
                        explained_variance=float(adjusted_variance(gram, torch.as_tensor(V)[None])[0]),
                        seconds=time.perf_counter() - t0, **support_scores(V, sp.support)))
    return out


def exp_real_data(datasets=("digits", "breast_cancer", "wine"), splits=("iid", "class"), n_workers=5,
                  alpha_fractions=(0.0, 0.02, 0.05, 0.1, 0.2), r=3, seed=0, max_iter=MAX_ITER):
    """Adjusted explained variance against sparsity on scikit-learn's data sets (standardized),
    IID and non-IID by class. ``lambda_1`` is a fraction of ``n`` (the data's scale: the
    objective grows with the row count), all fractions batched as trials."""
    out = []
    for name in datasets:
        X, y = load_dataset(name)
        alphas = [f * len(X) for f in alpha_fractions]
        for split in splits:
            groups = split_rows(split, n_workers, y=y, seed=seed)
            t0 = time.perf_counter()
            res = _quiet(fit_fsspca, X, r, groups=groups, alpha=alphas, trials=len(alphas), max_iter=max_iter,
                         tol=1e-6, seed=seed)
            sec = time.perf_counter() - t0
            for t, (f, a) in enumerate(zip(alpha_fractions, alphas)):
                out.append(dict(dataset=name, split=split, alpha_over_n=f, alpha=a, n_iter=int(res.n_iter[t]),
                                sparsity=float(res.sparsity[t]), explained_variance=float(res.explained_variance[t]),
                                seconds_all_alphas=sec))
    return out


#: the setting before the many-workers fix (docs/FSSPCA.md, "Many small workers"), side by side
BEFORE_WORKERS_FIX = dict(inner_steps=2, local_solver="riemannian")


def exp_workers(Ks=(2, 10, 100, 1000), n=4000, alpha=400.0, seed=0, max_iter=MAX_ITER,
                settings=(("default", {}), ("wolfe", dict(local_solver="riemannian", line_search="wolfe")),
                          ("before", BEFORE_WORKERS_FIX))):
    """The number of workers from 2 to 1,000, each a single batched computation (workers stacked
    along one dimension), with the default settings, with strong Wolfe instead of Armijo, and with
    the setting before the fix (2 inner steps): iterations,
    line-search trials, adjusted explained variance, support F1, the largest entry difference of
    ``z`` to the default run's at ``K = Ks[0]`` (columns matched in order and sign), seconds."""
    sp = spiked_covariance(n=n, d=30, r=2, support=5, seed=seed)
    out, first = [], None
    for label, options in settings:
        for K in Ks:
            groups = split_rows("iid", K, n=n, seed=seed)
            t0 = time.perf_counter()
            res = _quiet(fit_fsspca, sp.X, 2, groups=groups, alpha=alpha, max_iter=max_iter, tol=1e-6, seed=seed,
                         **options)
            sec = time.perf_counter() - t0
            z = res.z[0].numpy()
            first = z if first is None else first
            out.append(dict(settings=label, K=K, n_iter=int(res.n_iter[0]), converged=bool(res.converged[0]),
                            line_search_evals=int(res.line_search["evals"]),
                            explained_variance=float(res.explained_variance[0]), sparsity=float(res.sparsity[0]),
                            max_z_difference=_matched_difference(z, first), seconds=sec,
                            **support_scores(z, sp.support)))
    return out


def exp_workers_settings(K=300, rows=4, alpha_per_row=0.1, seed=0, max_iter=MAX_ITER,
                         settings=(("auto", "armijo", 2), ("auto", "armijo", 4), ("auto", "wolfe", 2),
                                   ("auto", "wolfe", 4), ("worker", "armijo", 2), ("worker", "wolfe", 2),
                                   ("worker", "wolfe", 4))):
    """What makes many small workers converge (the diagnosis behind the defaults): ``K`` workers
    of ``rows`` rows each on the spiked model (``d = 30``), the ``rho`` rule x line search x inner
    steps: iterations, line-search trials and failures, the largest and the RMS consensus gap at
    the end, explained variance, sparsity, and z's difference to the same problem on 2 workers."""
    n = K * rows
    sp = spiked_covariance(n=n, d=30, r=2, support=5, seed=seed)
    kw = dict(alpha=alpha_per_row * n, max_iter=max_iter, tol=1e-6, seed=seed)
    ref = _quiet(fit_fsspca, sp.X, 2, groups=split_rows("iid", 2, n=n, seed=seed), **kw).z[0].numpy()
    groups = split_rows("iid", K, n=n, seed=seed)
    out = []
    for rho, search, inner in settings:
        t0 = time.perf_counter()
        res = _quiet(fit_fsspca, sp.X, 2, groups=groups, rho=rho, line_search=search, inner_steps=inner,
                     local_solver="riemannian", **kw)
        n_it = int(res.n_iter[0])
        out.append(dict(rho=rho, line_search=search, inner_steps=inner, n_iter=n_it, converged=bool(res.converged[0]),
                        line_search_evals=int(res.line_search["evals"]),
                        line_search_failures=int(res.line_search["failures"]),
                        max_gap=float(res.history["consensus"][n_it - 1, 0]),
                        rms_gap=float(res.history["primal_residual"][n_it - 1, 0]) / math.sqrt(2 * K),
                        explained_variance=float(res.explained_variance[0]), sparsity=float(res.sparsity[0]),
                        max_z_difference=_matched_difference(res.z[0].numpy(), ref),
                        seconds=time.perf_counter() - t0))
    return out


def _matched_difference(z, ref):
    """Largest entry of ``|z - ref|`` after matching ``z``'s columns to ``ref``'s, order and signs
    (loadings in another order or negated are the same solution)."""
    from itertools import permutations

    best = math.inf
    for perm in permutations(range(z.shape[1])):  # r is small
        zp = z[:, perm]
        best = min(best, float(np.minimum(np.abs(zp - ref).max(axis=0), np.abs(zp + ref).max(axis=0)).max()))
    return best


def exp_deflation(n_workers=8, alpha=200.0, seed=0, max_iter=MAX_ITER):
    """Three loadings by deflation (one at a time, Algorithm 4) against all three at once."""
    sp = spiked_covariance(n=800, d=30, r=3, support=5, spikes=(8.0, 5.0, 3.0), seed=seed)
    groups = split_rows("iid", n_workers, n=len(sp.X), seed=seed)
    A = sp.X - sp.X.mean(0)
    from .admm import adjusted_variance

    gram = torch.as_tensor(A.T @ A)[None]
    out = []
    t0 = time.perf_counter()
    once = _quiet(fit_fsspca, sp.X, 3, groups=groups, alpha=alpha, max_iter=max_iter, tol=1e-6, seed=seed)
    sec = time.perf_counter() - t0
    Q = once.components[0].numpy()
    out.append(dict(method="all_at_once", n_iter=int(once.n_iter[0]), seconds=sec,
                    explained_variance=float(once.explained_variance[0]), sparsity=float(once.sparsity[0]),
                    max_offdiag=float(np.abs(Q.T @ Q - np.eye(3)).max()),
                    **support_scores(once.z[0].numpy(), sp.support)))
    t0 = time.perf_counter()
    results, z, comps = _quiet(fit_sequential, sp.X, [1, 1, 1], groups=groups, alpha=alpha, max_iter=max_iter,
                               tol=1e-6, seed=seed)
    sec = time.perf_counter() - t0
    Q = comps[0].numpy()
    out.append(dict(method="deflation", n_iter=int(sum(int(r.n_iter[0]) for r in results)), seconds=sec,
                    explained_variance=float(adjusted_variance(gram, z)[0]), sparsity=float((z == 0).double().mean()),
                    max_offdiag=float(np.abs(Q.T @ Q - np.eye(3)).max()),
                    **support_scores(z[0].numpy(), sp.support)))
    return out


EXPERIMENTS = {"pca_limit": exp_pca_limit, "fluctuation": exp_fluctuation, "smoothing": exp_smoothing,
               "support": exp_support, "real_data": exp_real_data, "workers": exp_workers,
               "workers_settings": exp_workers_settings,
               "deflation": exp_deflation}


def run_task(*, data="spiked", n_workers=TASK.n_workers, split=TASK.split, n_components=TASK.n_components,
             alpha=TASK.alpha, trials=RUN.trials, seed=RUN.seed, concentration=TASK.concentration, callback=None,
             graph=None, **fit_options):
    """What ``ppdnmf task=fsspca`` runs: load ``data``, split its rows over ``n_workers``, fit (with a
    server, or with ``graph`` without one: :func:`run_serverless`).

    Parameters
    ----------
    data : "spiked" | "digits" | "breast_cancer" | "wine" | path to a ``.npy`` / ``.csv`` (rows)
    split : "iid" | "class" | "dirichlet" (the last two need labels: scikit-learn's sets)
    alpha : float or list (one per trial)
    callback : callable, optional
        ``callback(IterationInfo)``: the app logs its ``values`` (TensorBoard scalars) from it.
    graph : Graph, optional
        The workers' communication graph: the serverless variant (:func:`.serverless.fit_serverless`).
    fit_options : passed to :func:`.fit.fit_fsspca` (``rho``, ``smoothing``, ``aggregation``, ...), or to
        :func:`.serverless.fit_serverless` with ``graph`` (``consensus``, ``inner_iters``, ``exchange``, ...)

    Returns
    -------
    summary : dict of plain numbers (per trial lists)
    arrays : dict of NumPy arrays to write: ``z (T, d, r)``, ``components (T, d, r)``,
        histories ``history_<key> (n_iter, T)``, and ``loadings_image (d, r)`` (``|z|`` of trial 0,
        scaled to [0, 1], for an image summary).
    """
    # the task's own keywords here; fit_options are fit_fsspca's (or fit_serverless's) to check
    check_call(locals(), TASK, RUN, arrays=("alpha",), also={"data": str, "callback": CALLBACK, "graph": Graph | None})
    y = None
    if data == "spiked":
        sp = spiked_covariance(seed=seed)
        X = sp.X
    elif data in ("digits", "breast_cancer", "wine"):
        X, y = load_dataset(data)
    elif isinstance(data, str) and data.endswith((".npy", ".csv")):
        X = load_rows(data)
    else:
        raise ConfigError(f"data: unknown data {data!r}; use spiked, digits, breast_cancer, wine or a .npy/.csv path")
    groups = split_rows(split, n_workers, y=y, n=len(X), seed=seed, concentration=concentration)
    if graph is not None:
        return run_serverless(X, groups, n_components, graph, alpha=alpha, trials=trials, seed=seed, callback=callback,
                              **fit_options)
    res = fit_fsspca(X, n_components, groups=groups, alpha=alpha, trials=trials, seed=seed, callback=callback,
                     **fit_options)
    z = res.z.cpu().numpy()
    img = np.abs(z[0])
    summary = dict(n_iter=res.n_iter.tolist(), converged=res.converged.tolist(),
                   explained_variance=res.explained_variance.tolist(), sparsity=res.sparsity.tolist(),
                   n_workers=n_workers, n_rows=int(len(X)), n_features=int(X.shape[1]), costs=res.costs,
                   settings=res.settings)
    arrays = dict(z=z, components=res.components.cpu().numpy(), loadings_image=img / max(img.max(), 1e-300),
                  **{f"history_{k}": v.cpu().numpy() for k, v in res.history.items()})
    return summary, arrays


def run_serverless(X, groups, n_components, graph, *, callback=None, **fit_options):
    """:func:`run_task` without a server: :func:`.serverless.fit_serverless` of the rows ``X`` dealt
    by ``groups``, then ``(summary, arrays)`` as :func:`run_task`'s.

    The callback gets an :class:`~.result.IterationInfo` per ADMM iteration whose ``values`` are
    ``disagreement`` (``max_i ||z_i - mean z||``) and ``consensus`` (``max_i ||w_i - z_i||``), ``(T,)``.
    The summary's ``explained_variance`` and ``sparsity`` are those of the workers' mean ``z``
    (evaluation only: no worker computes it) against the pooled, centred data; ``disagreement``,
    ``bytes``, ``exchange_calls``, ``costs`` and ``mean_error`` say what the agreement cost and
    reached. The arrays are :func:`run_task`'s for that mean, and ``z_workers (K, d, r)`` of trial 0.
    """
    check_call(locals(), also={"callback": CALLBACK})
    from .admm import adjusted_variance
    from .fit import as_blocks, prepare_problem
    from .result import IterationInfo
    from .serverless import fit_serverless

    def cb(k, values):
        if callback is None:
            return False
        return bool(callback(IterationInfo(k, {"disagreement": values["disagreement"],
                                               "consensus": values["consensus"]}, None)))

    blocks = as_blocks(X, groups, device=fit_options.get("device"), dtype=fit_options.get("dtype"))
    res = fit_serverless(blocks, n_components, graph, callback=cb, **fit_options)
    pooled = prepare_problem(blocks, 1, center=bool(res.settings.get("center", True)))[0].pooled_gram()[0]
    zm = res.z_mean
    variance = adjusted_variance(pooled, zm)
    sparsity = (res.z == 0).to(zm.dtype).mean(dim=(-2, -1)).mean(dim=1)
    z = zm.cpu().numpy()
    img = np.abs(z[0])
    summary = dict(n_iter=res.n_iter.tolist(), converged=res.converged.tolist(),
                   explained_variance=variance.tolist(), sparsity=sparsity.tolist(),
                   disagreement=res.disagreement[-1].tolist(), bytes=float(res.bytes),
                   exchange_calls=int(res.exchange_calls), costs=res.costs,
                   mean_error=None if res.mean_error is None else res.mean_error.tolist(),
                   n_workers=len(blocks), n_rows=int(len(X)), n_features=int(X.shape[1]), settings=res.settings)
    arrays = dict(z=z, components=res.components.cpu().numpy(), z_workers=res.z[0].cpu().numpy(),
                  loadings_image=img / max(img.max(), 1e-300),
                  history_disagreement=res.disagreement.cpu().numpy(), history_consensus=res.consensus.cpu().numpy())
    return summary, arrays
