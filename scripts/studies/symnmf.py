"""Symmetric NMF studies (moved out of the library): the paper's Sec. IV and this project's
across-agents study, as functions that return numbers.

Each function runs one experiment of ``scripts/reproduce_symnmf.py`` and returns plain data
(numpy arrays, floats, lists) for its figures and tables; nothing here plots or writes
files. Sizes and iteration counts are arguments: the script chooses them, and
docs/RESULTS.md ("Symmetric NMF") says which it used and where the reconstruction
(docs/SYMMETRIC_NMF.md) or the missing data leave room.

* :func:`split_convergence`: Fig. 1 (``||U_k - V_k||_F^2``, ``lambda_k``) and Fig. 2
  (``E^k``, the split objective) of SymANLS, SymHALS and A-SymHALS;
* :func:`adaptive_vs_kuang`: Fig. 3, the adaptive rule against Kuang's 1.01 schedule;
* :func:`compare_methods`: Fig. 4 and Fig. 6, ``E^k`` of every method against iterations
  and wall time, all in one process;
* :func:`final_error_sweep`: Fig. 5, final ``E`` over ``n``, ``r`` or ``sigma``; a sweep
  over ``sigma`` runs as one batch of trials (one ``(T, n, n)`` ``X``);
* :func:`clustering_run`: Table I and Fig. 7, accuracy and NMI of every method on a data
  set's similarity, accuracy against iterations;
* :func:`agents_run`: the across-agents version against the centralized solver.
"""
from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from ppdnmf_torch.errors import ConvergenceWarning, DataError
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
from ppdnmf_torch.models.symnmf.clustering import cluster_labels, clustering_accuracy, normalized_mutual_info
from ppdnmf_torch.models.symnmf.config import ADAPTIVE_LAMBDA0
from ppdnmf_torch.models.symnmf.data import initial_factor, synthetic_similarity
from ppdnmf_torch.models.symnmf.estimator import scaled_start
from ppdnmf_torch.models.symnmf.fit import METHODS, fit_symnmf
from ppdnmf_torch.models.symnmf.similarity import similarity_matrix

__all__ = ["SPLIT_METHODS", "available_methods", "split_convergence", "adaptive_vs_kuang", "compare_methods",
           "final_error_sweep", "clustering_run", "agents_run"]

#: the paper's three methods (the splitting (3))
SPLIT_METHODS = ("symanls", "symhals", "a_symhals")
#: the ADMM's stop in Table I: the library's default stationarity tolerance (SymNMFSpec.tol)
ADMM_TOL = 1e-5


def available_methods(methods=METHODS) -> list[str]:
    """The methods of ``methods`` that run here (a two-iteration probe on a tiny problem)."""
    X = torch.eye(4, dtype=torch.float64) + 0.1
    ok = []
    for m in methods:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit_symnmf(X, 2, method=m, max_iter=2, tol=0, device="cpu")
            ok.append(m)
        except (ImportError, NotImplementedError):
            pass
    return ok


def _run(X, r, method, U0, iters, penalty=None, callback=None, device="cpu", tol=0, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return fit_symnmf(X, r, method=method, penalty=penalty, U0=U0, max_iter=iters, tol=tol, device=device,
                          callback=callback, **kw)


def _hist(res, keys=("E", "objective", "gap", "rel_gap", "lam", "time")) -> dict:
    return {k: res.history[k].numpy() for k in keys}


def split_convergence(n=300, r=20, sigmas=(0.0, 0.1), iters=300, seed=0, methods=None, device="cpu"):
    """Fig. 1 and 2: the three split methods under the adaptive rule (20), ``lambda_0 = 1e-5``.

    Returns ``{sigma: {method: history}}`` (history: ``(iters + 1, 1)`` arrays ``E``,
    ``objective``, ``gap`` (``||U - V||_F^2``), ``rel_gap``, ``lam``, ``time``).
    """
    out = {}
    methods = available_methods(SPLIT_METHODS) if methods is None else methods
    U0 = initial_factor(n, r, seed=seed)
    for s in sigmas:
        X, _ = synthetic_similarity(n, r, s, seed=seed)
        out[s] = {m: _hist(_run(X[0], r, m, U0, iters, "adaptive", device=device)) for m in methods}
    return out


def adaptive_vs_kuang(n=300, r=20, sigma=0.0, iters=1000, seed=0, methods=None, device="cpu"):
    """Fig. 3: ``E^k`` of the split methods (adaptive rule) and of SymANLS under Kuang's schedule
    (``method="kuang"``). Returns ``{label: history}``."""
    methods = available_methods(SPLIT_METHODS) if methods is None else methods
    X, _ = synthetic_similarity(n, r, sigma, seed=seed)
    U0 = initial_factor(n, r, seed=seed)
    out = {m: _hist(_run(X[0], r, m, U0, iters, "adaptive", device=device)) for m in methods}
    if "kuang" in available_methods(("kuang",)):
        out["kuang"] = _hist(_run(X[0], r, "kuang", U0, iters, device=device))
    return out


def compare_methods(n=300, r=20, sigma=0.0, iters=300, seed=0, noise="gaussian", methods=None, device="cpu"):
    """Fig. 4 (Gaussian noise) and Fig. 6 (``noise="uniform"`` or ``"lognormal"``): every method
    from the same ``U_0`` on the same ``X``, one after the other in this process.

    Returns ``{method: history}`` (with ``time``, the wall clock of the run)."""
    methods = available_methods() if methods is None else methods
    X, _ = synthetic_similarity(n, r, sigma, noise=noise, seed=seed)
    U0 = initial_factor(n, r, seed=seed)
    return {m: _hist(_run(X[0], r, m, U0, iters, device=device)) for m in methods}


def final_error_sweep(kind: str, values, *, n=300, r=20, sigma=0.1, iters=500, seed=0, methods=None,
                      device="cpu") -> dict:
    """Fig. 5: the final ``E`` of every method as ``kind`` (``"n"``, ``"r"`` or ``"sigma"``) takes
    ``values``, the others fixed. A ``sigma`` sweep is one batch of trials (one ``(T, n, n)``
    ``X``, one start per trial); ``n`` and ``r`` change the shapes and run one by one.

    Returns ``{"values": list, method: final E array (len(values),)}``.
    """
    methods = available_methods() if methods is None else methods
    out = {"values": list(values)}
    if kind == "sigma":
        X, _ = synthetic_similarity(n, r, list(values), trials=len(values), seed=seed)
        U0 = initial_factor(n, r, trials=len(values), seed=seed)
        for m in methods:
            out[m] = _run(X, r, m, U0, iters, device=device).E.numpy()
        return out
    if kind not in ("n", "r"):
        raise DataError(f"kind: expected 'n', 'r' or 'sigma', got {kind!r}")
    for m in methods:
        finals = []
        for v in values:
            nn, rr = (int(v), r) if kind == "n" else (n, int(v))
            X, _ = synthetic_similarity(nn, rr, sigma, seed=seed)
            finals.append(float(_run(X[0], rr, m, initial_factor(nn, rr, seed=seed), iters, device=device).E[0]))
        out[m] = np.array(finals)
    return out


def clustering_run(M, y, r, *, methods=None, iters=500, trials=3, seed=0, eval_every=10, init="uniform",
                   admm_iters=None, admm_tol=ADMM_TOL, device="cpu") -> dict:
    """Table I and Fig. 7 on samples ``M`` with labels ``y``: Kuang et al.'s similarity, every
    method from the same ``trials`` starts (one batch), labels ``argmax U``.

    Every method runs ``iters`` iterations but the ADMM, which the paper runs "enough iterations
    [...] so that it obtains its best results" (its Table I; ~6000 on COIL-20, its Fig. 7): up to
    ``admm_iters`` (None: ``iters``), a trial stopping once the stationarity of (2) at its ``U``
    is ``<= admm_tol`` (:func:`~.objective.stationarity`, the library's default tolerance).

    ``init``: ``"uniform"`` (the paper's ``U_0`` on ``[0, 1]``) or ``"scaled"``
    (:func:`~.estimator.scaled_start`). Returns ``{method: {"iters": (K,), "accuracy": (K, T)
    every eval_every iterations, "final_accuracy": (T,), "final_nmi": (T,), "E": (T,),
    "n_iter": (T,), "converged": (T,), "tol": float, "seconds": float}}`` and ``"n"``, ``"nnz"``,
    ``"similarity_seconds"``.
    """
    methods = available_methods() if methods is None else methods
    t0 = time.perf_counter()
    S = similarity_matrix(M, device=device)
    out = {"n": int(S.shape[0]), "nnz": int((S > 0).sum()), "similarity_seconds": time.perf_counter() - t0}
    U0 = scaled_start(S, r, trials, seed, init)
    y = np.asarray(y)
    for m in methods:
        curve, ks = [], []

        def track(it, curve=curve, ks=ks):
            if it.k % eval_every == 0:
                ks.append(it.k)
                curve.append(clustering_accuracy(y, cluster_labels(it.U).cpu()))

        t = time.perf_counter()
        long = m == "admm" and admm_iters is not None
        tol = admm_tol if m == "admm" else 0
        res = _run(S, r, m, U0, admm_iters if long else iters, callback=track, device=device, tol=tol)
        secs = time.perf_counter() - t
        labels = cluster_labels(res.U).cpu()
        out[m] = {"iters": np.array(ks), "accuracy": np.array(curve), "final_accuracy": clustering_accuracy(y, labels),
                  "final_nmi": normalized_mutual_info(y, labels), "E": res.E.numpy(), "n_iter": res.n_iter.numpy(),
                  "converged": res.converged.numpy(), "tol": tol, "seconds": secs}
    return out


def agents_run(M, y, r, *, n_agents=(10, 20), kinds=("plain",), iters=200, x_iters=10, seed=0, init="scaled",
               penalty="adaptive", lam0=ADAPTIVE_LAMBDA0, exchange_options=None, central_method="symhals",
               device="cpu") -> dict:
    """The across-agents version against the centralized solver on one data set's similarity.

    Every run starts from the same ``U_0``; the centralized run is ``central_method`` with the
    same ``penalty`` (and ``lam0``) and iterations. ``exchange_options`` maps a kind to its options (e.g.
    ``{"quantized": {"cost_model": True, "n_max": 10**6}}``).

    Returns ``{"central": row, (N, kind): row}``, a row: ``accuracy``, ``nmi``, ``E``,
    ``consensus`` (last), ``uv_dist``, ``bytes``, ``seconds``, ``lam``, ``costs``, and the
    curves ``E_curve``, ``consensus_curve``.
    """
    S = similarity_matrix(M, device=device)
    U0 = scaled_start(S, r, 1, seed, init)
    y = np.asarray(y)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        res = fit_symnmf(S, r, method=central_method, penalty=penalty, lam0=lam0 if penalty == "adaptive" else None,
                         U0=U0, max_iter=iters, tol=0, device=device)
    labels = cluster_labels(res.U[0]).cpu()
    out = {"central": {"accuracy": clustering_accuracy(y, labels), "nmi": normalized_mutual_info(y, labels),
                       "E": float(res.E[0]), "uv_dist": float(res.history["gap"][-1, 0]) ** 0.5,
                       "lam": float(res.lam[0]), "seconds": time.perf_counter() - t, "bytes": 0.0,
                       "E_curve": res.history["E"][:, 0].numpy()}}
    options = exchange_options or {}
    for N in n_agents:
        for kind in kinds:
            t = time.perf_counter()
            ag = fit_symnmf_agents(S, r, n_agents=N, exchange=kind, exchange_options=options.get(kind),
                                   penalty=penalty, lam0=lam0, x_iters=x_iters, max_iter=iters, tol=0.0, U0=U0[0],
                                   seed=seed, start_seed=seed, device=device)  # reproducible private starts; every iteration
            labels = cluster_labels(ag.U[0]).cpu()
            h = ag.history
            out[(N, kind)] = {"accuracy": clustering_accuracy(y, labels), "nmi": normalized_mutual_info(y, labels),
                              "E": float(h["E"][-1][0]), "consensus": float(h["consensus"][-1][0]),
                              "uv_dist": float(h["uv_dist"][-1][0]), "lam": float(h["lambda"][-1][0]),
                              "bytes": float(h["bytes"][-1]), "seconds": time.perf_counter() - t,
                              "costs": {k: v for k, v in ag.costs.items() if isinstance(v, (int, float))},
                              "E_curve": np.array([e[0] for e in h["E"]]),
                              "consensus_curve": np.array([c[0] for c in h["consensus"]])}
    return out
