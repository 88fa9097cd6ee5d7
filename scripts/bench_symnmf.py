"""Benchmarks of the symmetric-NMF solvers (docs/PERFORMANCE.md, "Symmetric NMF").

Parts, each side by side in one process:

* ``numpy``: the batched torch SymHALS and SymANLS against a careful numpy implementation of
  the same updates (``np_fit`` in ``scripts/symnmf_numpy_ref.py``: the column sweep on
  contiguous rows, and Kim and Park's block principal pivoting with the columns grouped by
  passive set, as in their own code), one trial after another, at ``n`` = 300..5000,
  ``r`` = 20, 40, one and 20 trials; both check that they computed the same iterates;
* ``one-trial`` (issue 41): one trial of SymHALS and SymANLS with a fixed ``lambda``, the torch
  and the host plan (``fit_symnmf(plan=...)``), against the same numpy implementation, at
  ``(n, r)`` = (150, 6), (1000, 20), (3000, 40);
* ``plans``: the torch plan against the host plan (``fit_symnmf(plan=...)``) with 20 trials and on
  a sparse ``X``, the sizes behind ``plan="auto"``;
* ``time-to-E``: every method on the synthetic model of Sec. IV (``n = 300``, ``r = 20``),
  the wall time each needs to reach a given ``E``;
* ``sparse``: SymHALS on a sparse kNN similarity at ``n`` = 10k, 50k, 100k, each in a child
  process that reports its time per iteration and the peak memory of the fit alone;
* ``before-after``: one trial of SymHALS and A-SymHALS, the package at a commit beside the
  current one (the same bits checked);
* ``gemm``: the product ``W^T X`` alone, torch's BLAS against numpy's.

Usage::

    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part numpy --ns 300 --out bench_numpy.json
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part one-trial --out bench_one.json
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part one-trial --against 477b2ec   # and a commit
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part plans --out bench_plans.json
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part time-to-E --out bench_tte.json
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part sparse --out bench_sparse.json
    OMP_NUM_THREADS=1 python scripts/bench_symnmf.py --part before-after --against 5490475
    python scripts/bench_symnmf.py --part all --quick        # a small smoke run (tests)
    python scripts/bench_symnmf.py --device cuda --part sparse numpy --ns 300 1000 5000 \
        --numpy-max-n 300 --sparse-ns 50000                 # the torch side on a GPU (gpu_check.sh)

Timings are medians of repeats on a shared machine: read them as ratios and ranges.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

from ppdnmf_torch.models.symnmf import fit_symnmf, initial_factor, synthetic_similarity
from ppdnmf_torch.models.symnmf.fit import METHODS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the NumPy reference beside this script
from symnmf_numpy_ref import np_fit, np_hals_sweep, np_nnls_bpp, np_products  # noqa: E402,F401  (tests use np_fit)


def _median_time(fn, repeats):
    times = []
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


#: iterations and repeats of the numpy part by n: the fewest that give a stable time per
#: iteration (the in-loop clocks leave out the setup, so one iteration is enough at n = 5000)
GRID_ITERS = {300: (5, 3), 1000: (3, 1), 2000: (2, 1)}
GRID_ITERS_LARGE = (1, 1)


def part_numpy(quick: bool, device="cpu", ns=None, ranks=None, trials_list=None, methods=None, iters=None,
               repeats=None, numpy_max_n=None):
    """The grid ``n x r x trials x method``; ``iters`` and ``repeats`` default to
    :data:`GRID_ITERS`.

    Two times per side: the whole call over ``iters`` (``*_s_per_iter``: the torch side's
    includes ``fit_symnmf``'s input checks and its first products) and the iterations alone
    (``*_loop_s_per_iter``, from ``history["time"]`` and ``np_fit``'s clock), the median of
    ``repeats`` runs. Above ``numpy_max_n`` only the torch side runs (its device's times;
    the numpy columns are NaN): a device check whose host would take minutes per numpy row.
    """
    ns = ns or ([60, 120] if quick else [300, 1000, 2000, 5000])
    ranks = ranks or ([4] if quick else [20, 40])
    trials_list = trials_list or ([1, 3] if quick else [1, 20])
    methods = methods or ("symhals", "symanls")
    rows = []
    Xw, _ = synthetic_similarity(50, 4, 0.1)  # warm-up: the first calls pay one-time costs
    for method in methods:
        fit_symnmf(Xw[0].to(device), 4, method=method, max_iter=3, tol=0)
        np_fit(Xw[0].numpy(), initial_factor(50, 4)[0].numpy(), 0.5, 3, method)
    for n in ns:
        X, _ = synthetic_similarity(n, 20 if not quick else 4, 0.1, seed=n)
        Xn = X[0].numpy()
        Xt = X[0].to(device)
        for r in ranks:
            for T in trials_list:
                its, reps = (2, 1) if quick else next((v for k, v in GRID_ITERS.items() if n <= k), GRID_ITERS_LARGE)
                its, reps = iters or its, repeats or reps
                U0 = initial_factor(n, r, trials=T, seed=1)  # on the CPU: fit_symnmf moves it
                lam0 = 0.5
                for method in methods:
                    loops_torch, loops_np = [], []

                    def run_torch():
                        res = fit_symnmf(Xt, r, method=method, U0=U0, penalty="adaptive", lam0=lam0, max_iter=its,
                                         tol=0)
                        loops_torch.append(float(res.history["time"][-1, 0]))
                        return res

                    t_torch, res = _median_time(run_torch, reps)

                    def run_np():
                        clock = []
                        outs = [np_fit(Xn, U0[t].numpy(), lam0, its, method, clock) for t in range(T)]
                        loops_np.append(sum(clock))
                        return outs

                    if numpy_max_n is None or n <= numpy_max_n:
                        t_np, outs = _median_time(run_np, reps)
                        diff = max(float(np.abs(outs[t][0] - res.U[t].cpu().numpy()).max()) for t in range(T))
                    else:
                        t_np, diff = float("nan"), float("nan")
                        loops_np.append(float("nan"))
                    loop_torch, loop_np = float(np.median(loops_torch)), float(np.median(loops_np))
                    rows.append({"n": n, "r": r, "trials": T, "method": method, "iters": its, "repeats": reps,
                                 "device": str(device), "threads": torch.get_num_threads(), "plan": res.plan,
                                 "torch_s_per_iter": t_torch / its, "numpy_s_per_iter": t_np / its,
                                 "numpy_over_torch": t_np / t_torch,
                                 "torch_loop_s_per_iter": loop_torch / its, "numpy_loop_s_per_iter": loop_np / its,
                                 "loop_numpy_over_torch": loop_np / loop_torch, "max_abs_diff_U": diff})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


#: issue 41's sizes: one trial of SymHALS and SymANLS, ``(n, r)``
ONE_TRIAL_SIZES = ((150, 6), (1000, 20), (3000, 40))


def part_one_trial(quick: bool, device="cpu", ns=None, ranks=None, methods=None, iters=None, repeats=None,
                   lam=0.5, against=None, plans=None):
    """One trial, fixed ``lambda``, the torch solver (``fit_symnmf``) on each of ``plans``
    against :func:`np_fit` (issue 41): per size and method, ``repeats`` alternating runs of
    ``iters`` iterations on each side; seconds per iteration from the in-loop clocks
    (``history["time"]`` and ``np_fit``'s, the iterations alone) and of the whole call, the best of
    the repeats and the ratio's range over them (numpy over the plan: above 1 the plan is faster),
    and the largest ``|U|`` difference of each plan's iterates from numpy's. The GEMM floor per
    repeat (:func:`np_products`: the iteration's two products ``W^T X`` alone, NumPy's BLAS, the
    calls both sides make): ``gemm_floor_s_per_iter`` (the best), ``bound_numpy_over_floor_*``
    (numpy's time over the floor's, the range: the largest ratio any implementation making those
    products could reach) and each plan's time besides the products (``*_rest_s_per_iter``). ``plans``: default
    ``torch`` and ``host`` on the CPU, ``torch`` on a GPU (the host plan runs on the CPU only).
    ``against``: a commit whose package runs as a further side in the same alternation (its
    default plan; ``before_*``: its times and its ratio to numpy's)."""
    sizes = ((60, 4),) if quick else (tuple(zip(ns, ranks)) if ns and ranks else ONE_TRIAL_SIZES)
    methods = methods or ("symhals", "symanls")
    plans = plans or (("torch", "host") if str(device) == "cpu" else ("torch",))
    rows = []
    old_fit = _fit_of_commit(against) if against else None
    Xw, _ = synthetic_similarity(50, 4, 0.1)  # warm-up: the first calls pay one-time costs
    for method in methods:
        for plan in plans:
            fit_symnmf(Xw[0].to(device), 4, method=method, max_iter=3, tol=0, plan=plan)
        if old_fit is not None:
            old_fit(Xw[0].to(device), 4, method=method, max_iter=3, tol=0)
        np_fit(Xw[0].numpy(), initial_factor(50, 4)[0].numpy(), 0.5, 3, method)
    for n, r in sizes:
        X, _ = synthetic_similarity(n, r, 0.1, seed=n)
        Xn, Xt = X[0].numpy(), X[0].to(device)
        U0 = initial_factor(n, r, trials=1, seed=1)
        its = iters or (2 if quick else 200 if n <= 300 else 10 if n <= 1000 else 3)
        reps = repeats or (1 if quick else 5 if n <= 1000 else 3)
        for method in methods:
            loop = {p: [] for p in plans}
            call = {p: [] for p in plans}
            res = {}
            np_loop, np_call, before_loop, floor = [], [], [], []
            for _ in range(reps):
                if old_fit is not None:
                    old = old_fit(Xt, r, method=method, U0=U0, penalty=lam, max_iter=its, tol=0)
                    before_loop.append(float(old.history["time"][-1, 0]) / its)
                for plan in plans:
                    t0 = time.perf_counter()
                    res[plan] = fit_symnmf(Xt, r, method=method, U0=U0, penalty=lam, max_iter=its, tol=0, plan=plan)
                    call[plan].append((time.perf_counter() - t0) / its)
                    loop[plan].append(float(res[plan].history["time"][-1, 0]) / its)
                clock = []
                t0 = time.perf_counter()
                Un, _ = np_fit(Xn, U0[0].numpy(), lam, its, method, clock, adaptive=False)
                np_call.append((time.perf_counter() - t0) / its)
                np_loop.append(clock[0] / its)
                floor.append(np_products(Xn, Un, its))
            row = {"n": n, "r": r, "method": method, "lam": lam, "iters": its, "repeats": reps,
                   "device": str(device), "threads": torch.get_num_threads(), "plans": list(plans),
                   "numpy_loop_s_per_iter": min(np_loop), "numpy_call_s_per_iter": min(np_call),
                   "gemm_floor_s_per_iter": min(floor),
                   "bound_numpy_over_floor_min": min(a / b for a, b in zip(np_loop, floor)),
                   "bound_numpy_over_floor_max": max(a / b for a, b in zip(np_loop, floor)),
                   "load_average": os.getloadavg()[0]}
            for plan in plans:  # the torch plan's keys keep their names of before the plans
                key = "torch" if plan == "torch" else plan
                ratios = [a / b for a, b in zip(np_loop, loop[plan])]
                row.update({f"{key}_loop_s_per_iter": min(loop[plan]), f"{key}_call_s_per_iter": min(call[plan]),
                            f"{key}_rest_s_per_iter": min(loop[plan]) - min(floor),
                            f"numpy_over_{key}_min": min(ratios), f"numpy_over_{key}_max": max(ratios),
                            f"max_abs_diff_U_{key}": float(np.abs(Un - res[plan].U[0].cpu().numpy()).max())})
            if "torch" in res:
                row["max_abs_diff_U"] = row["max_abs_diff_U_torch"]
            if "torch" in res and "host" in res:
                row["max_rel_diff_U_host_torch"] = float((res["host"].U - res["torch"].U).abs().max()
                                                         / res["torch"].U.abs().max())
            if old_fit is not None:
                before = [a / b for a, b in zip(np_loop, before_loop)]
                ref = res[plans[0]]
                row.update({"against": against, "before_loop_s_per_iter": min(before_loop),
                            "numpy_over_before_min": min(before), "numpy_over_before_max": max(before),
                            "max_rel_diff_U_before": float((old.U - ref.U).abs().max() / old.U.abs().max())})
            rows.append(row)
            print(json.dumps(rows[-1]), flush=True)
    return rows


def _count_sweeps():
    """A counter of HALS sweeps (A-SymHALS's inner sweeps per block), by wrapping the sweep."""
    from ppdnmf_torch.models.symnmf import symhals

    count = [0]
    inner = symhals._Rows.sweep

    def counted(self):
        count[0] += 1
        return inner(self)

    return count, counted, inner


def part_time_to_e(quick: bool, device="cpu", ns=None, methods=None, max_iter=None, rank=None, penalty=None):
    """Every method (or ``methods``) on the synthetic model at ``n = ns[0]`` (default 300),
    ``r = rank`` (default 20), from one ``U_0``: seconds and iterations to reach each target
    ``E``, and A-SymHALS's mean inner sweeps per block. ``penalty``: the split methods'
    (default each method's own)."""
    from ppdnmf_torch.models.symnmf import symhals

    n, r = (60, 4) if quick else ((ns or [300])[0], rank or 20)
    max_iter = max_iter or (30 if quick else 300)
    rows = []
    for sigma in (0.0, 0.1):
        X, _ = synthetic_similarity(n, r, sigma, seed=7)
        U0 = initial_factor(n, r, trials=1, seed=8)
        runs, sweeps = {}, {}
        for method in methods or METHODS:
            count, counted, plain = _count_sweeps()
            symhals._Rows.sweep = counted
            try:
                pen = penalty if penalty is not None and method in ("symhals", "a_symhals", "symanls") else None
                runs[method] = fit_symnmf(X[0].to(device), r, method=method, U0=U0, max_iter=max_iter, tol=0,
                                          penalty=pen)
            finally:
                symhals._Rows.sweep = plain
            sweeps[method] = count[0] / (2 * max_iter)
        best = min(float(res.history["E"][:, 0].min()) for res in runs.values())
        targets = [1e-2, 1e-3, 1e-4, 1e-5] if sigma == 0 else [1e-2, 1e-3, 1.5 * best, 1.05 * best]
        for target in targets:
            for method, res in runs.items():
                E, tt = res.history["E"][:, 0], res.history["time"][:, 0]
                hit = torch.nonzero(E <= target)
                k = int(hit[0]) if hit.numel() else None
                rows.append({"n": n, "r": r, "sigma": sigma, "penalty": penalty, "target_E": target, "method": method,
                             "iterations": k,
                             "seconds": float(tt[k]) if k is not None else None,
                             "final_E": float(E[-1]), "max_iter": max_iter,
                             "s_per_iter": float(tt[-1]) / max_iter, "sweeps_per_block": sweeps[method],
                             # how far apart U and V are early, and the penalty then
                             "rel_gap_at": {k: float(res.history["rel_gap"][k, 0]) for k in (10, 30) if k <= max_iter},
                             "lam_at": {k: float(res.history["lam"][k, 0]) for k in (10, 30) if k <= max_iter}})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def _swap_modules(modules: dict) -> dict:
    """Put ``modules`` (the package's) in ``sys.modules`` and return the ones they replace."""
    out = {k: sys.modules.pop(k) for k in [k for k in sys.modules if k.split(".")[0] == "ppdnmf_torch"]}
    sys.modules.update(modules)
    return out


def _fit_of_commit(commit: str):
    """``fit_symnmf`` of the package at ``commit`` (``git archive`` into a temporary folder),
    imported beside the current one: both run in this process. While it runs, that commit's
    modules stand in ``sys.modules`` (and its folder on the path), so that its lazy imports
    (``make_method``'s ``from .symanls import ...``) load its own code, not the current one's."""
    import importlib
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = tempfile.mkdtemp(prefix="bench_symnmf_")
    archive = subprocess.run(["git", "-C", root, "archive", commit, "ppdnmf_torch"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    theirs = {}

    def fit(*args, **kwargs):
        current = _swap_modules(theirs)
        sys.path.insert(0, folder)
        try:
            return importlib.import_module("ppdnmf_torch.models.symnmf").fit_symnmf(*args, **kwargs)
        finally:
            sys.path.remove(folder)
            theirs.update(_swap_modules(current))

    return fit


def part_before_after(quick: bool, device="cpu", ns=None, against=None, methods=None, ranks=None, iters=None,
                      repeats=None):
    """One trial of SymHALS and A-SymHALS (or ``methods``): the package at commit ``against``
    and the current one, alternating in this process (and the numpy reference for SymHALS and
    SymANLS), ``repeats`` runs of ``iters`` iterations each, medians and ranges of the in-loop
    times. Reports whether both gave the same ``U`` bit for bit, and else their largest
    difference relative to ``max |U|`` (a change of rounding); above 1e-8 it raises."""
    ns = ns or ([60] if quick else [300, 1000])
    ranks = ranks or ([4] if quick else [20, 40])
    methods = methods or ("symhals", "a_symhals")
    its, reps = iters or (3 if quick else 10), repeats or (2 if quick else 7)
    old_fit = _fit_of_commit(against or "HEAD")
    rows = []
    for n in ns:
        X, _ = synthetic_similarity(n, 20 if not quick else 4, 0.1, seed=n)
        Xt, Xn = X[0].to(device), X[0].numpy()
        for r in ranks:
            U0 = initial_factor(n, r, trials=1, seed=1)
            for method in methods:
                times = {"before": [], "after": [], "numpy": []}
                same, rel = True, 0.0
                for _ in range(reps):
                    for key, fit in (("before", old_fit), ("after", fit_symnmf)):
                        res = fit(Xt, r, method=method, U0=U0, lam0=0.5, max_iter=its, tol=0)
                        times[key].append(float(res.history["time"][-1, 0]) / its)
                        U = res.U if key == "before" else U
                        if key == "after" and not torch.equal(U, res.U):
                            same = False
                            rel = max(rel, float((U - res.U).abs().max() / U.abs().max()))
                    if method in ("symhals", "symanls"):
                        clock = []
                        np_fit(Xn, U0[0].numpy(), 0.5, its, method, clock)
                        times["numpy"].append(clock[0] / its)
                if rel > 1e-8:
                    raise AssertionError(f"{method}, n = {n}, r = {r}: the two versions' U differ by {rel:.3g}")
                med = {k: float(np.median(v)) if v else float("nan") for k, v in times.items()}
                ratio = [b / a for a, b in zip(times["after"], times["before"])]
                rows.append({"n": n, "r": r, "method": method, "iters": its, "repeats": reps, "against": against,
                             "before_s_per_iter": med["before"], "after_s_per_iter": med["after"],
                             "numpy_s_per_iter": med["numpy"], "before_over_after": med["before"] / med["after"],
                             "before_over_after_min": min(ratio), "before_over_after_max": max(ratio),
                             "numpy_over_before": med["numpy"] / med["before"],
                             "numpy_over_after": med["numpy"] / med["after"], "same_bits": same,
                             "max_rel_diff_U": rel, "threads": torch.get_num_threads()})
                print(json.dumps(rows[-1]), flush=True)
    return rows


#: the plans part: ``(n, r, trials, layout)``, the sizes behind ``fit_symnmf``'s ``plan="auto"``
PLAN_SIZES = ((150, 6, 20, "dense"), (300, 20, 20, "dense"), (1000, 20, 20, "dense"), (150, 6, 1, "sparse"),
              (2000, 20, 1, "sparse"), (20000, 20, 1, "sparse"))


def part_plans(quick: bool, device="cpu", ns=None, methods=None, repeats=None):
    """The torch plan against the host plan of ``fit_symnmf`` (the rule of ``plan="auto"`` on the
    CPU), several trials and a sparse ``X``: seconds per iteration from ``history["time"]``, the
    best of ``repeats`` alternating runs, the ratio's range (torch over host: above 1 the host
    plan is faster) and the largest relative ``U`` difference of the two."""
    sizes = ((60, 4, 3, "dense"), (200, 4, 1, "sparse")) if quick else PLAN_SIZES
    methods = methods or ("symhals", "a_symhals", "symanls")
    reps = repeats or (1 if quick else 3)
    rows = []
    for n, r, T, layout in sizes:
        if layout == "dense":
            X = synthetic_similarity(n, r, 0.1, seed=n)[0][0]
        else:
            X = knn_similarity(n)[0]
        U0 = initial_factor(n, r, trials=T, seed=1)
        its = 2 if quick else max(2, min(50, int(3e8 / (T * n * n * r + 1))))
        for method in methods:
            times = {"torch": [], "host": []}
            out = {}
            for plan in times:  # warm-up: the first call at a size pays one-time costs
                fit_symnmf(X, r, method=method, U0=U0, penalty=0.5, max_iter=1, tol=0, plan=plan)
            for _ in range(reps):
                for plan in times:
                    out[plan] = fit_symnmf(X, r, method=method, U0=U0, penalty=0.5, max_iter=its, tol=0, plan=plan)
                    times[plan].append(float(out[plan].history["time"][-1, 0]) / its)
            ratios = [a / b for a, b in zip(times["torch"], times["host"])]
            rows.append({"n": n, "r": r, "trials": T, "layout": layout, "method": method, "iters": its, "repeats": reps,
                         "threads": torch.get_num_threads(), "load_average": os.getloadavg()[0],
                         "torch_s_per_iter": min(times["torch"]), "host_s_per_iter": min(times["host"]),
                         "torch_over_host_min": min(ratios), "torch_over_host_max": max(ratios),
                         "max_rel_diff_U": float((out["host"].U - out["torch"].U).abs().max()
                                                 / out["torch"].U.abs().max())})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def part_gemm(quick: bool, device="cpu", ns=None):
    """The product every iteration makes twice, ``W^T X`` (``(r, n) x (n, n)``), in torch (its
    BLAS) and numpy (its BLAS), side by side: the median of 7 (3 at n = 5000)."""
    ns = ns or ([60, 120] if quick else [300, 1000, 2000, 5000])
    rows = []
    rng = np.random.default_rng(0)
    for n in ns:
        Xn = rng.random((n, n))
        Xn = Xn + Xn.T
        Xt = torch.from_numpy(Xn).to(device)
        for r in ([4] if quick else [20, 40]):
            Wn = rng.random((r, n))
            Wt = torch.from_numpy(Wn).to(device)
            reps = 3 if n >= 5000 else 7
            t_torch, _ = _median_time(lambda: Wt @ Xt, reps)
            t_np, _ = _median_time(lambda: Wn @ Xn, reps)
            rows.append({"n": n, "r": r, "torch_s": t_torch, "numpy_s": t_np, "numpy_over_torch": t_np / t_torch})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def knn_similarity(n: int, seed: int = 0, dim: int = 5, clusters: int = 20):
    """A sparse kNN similarity like the spec's construction (kk = floor(log2 n) + 1
    neighbours, self-tuning scales from the 7th neighbour, symmetric, normalized), built
    with scikit-learn's kd-tree on Gaussian blobs; scipy CSR."""
    import scipy.sparse as sp
    from sklearn.neighbors import NearestNeighbors

    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=4.0, size=(clusters, dim))
    pts = centers[rng.integers(clusters, size=n)] + rng.normal(size=(n, dim))
    kk = int(np.floor(np.log2(n))) + 1
    dist, ind = NearestNeighbors(n_neighbors=max(kk, 7) + 1).fit(pts).kneighbors(pts)
    sig = dist[:, 7]
    rows = np.repeat(np.arange(n), kk)
    cols = ind[:, 1:kk + 1].reshape(-1)
    d2 = dist[:, 1:kk + 1].reshape(-1) ** 2
    A = sp.csr_matrix((np.exp(-d2 / (sig[rows] * sig[cols])), (rows, cols)), shape=(n, n))
    A = A.maximum(A.T)
    deg = np.asarray(A.sum(axis=0)).reshape(-1)
    Dm = sp.diags(1 / np.sqrt(deg))
    A = Dm @ A @ Dm
    return ((A + A.T) / 2).tocsr(), clusters


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> tuple:
    """``(RSS now in MB, whether the peak was reset)``: resets ``VmHWM`` so that a later read of
    the peak is what follows (Linux ``/proc/self/clear_refs``)."""
    base = _rss_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return base, True
    except OSError:
        return base, False


def sparse_child(n: int, iters: int, rank: int, device="cpu"):
    """In a child process: build X, reset the peak RSS, fit, report."""
    t = time.perf_counter()
    X, _ = knn_similarity(n)
    build = time.perf_counter() - t
    base, reset = reset_peak_rss()
    t = time.perf_counter()
    # Kuang et al.'s start, 2 sqrt(mean(X) / r) U(0, 1): a [0, 1] start is far off the scale of
    # a normalized similarity
    U0 = initial_factor(n, rank, scale=2 * float(np.sqrt(X.sum() / n ** 2 / rank)))
    res = fit_symnmf(X, rank, method="symhals", U0=U0, max_iter=iters, tol=0, device=device)
    fit = time.perf_counter() - t
    out = {"n": n, "device": str(device), "nnz": int(X.nnz), "rank": rank, "iters": iters, "build_s": build, "fit_s": fit,
           "s_per_iter": fit / iters, "rss_before_fit_mb": base, "peak_rss_mb": _rss_mb("VmHWM"),
           "peak_reset": reset, "fit_peak_over_base_mb": _rss_mb("VmHWM") - base,
           "factor_mb": 2 * n * rank * 8 / 2 ** 20, "csr_mb": (X.nnz * 16 + (n + 1) * 8) / 2 ** 20,
           "E_first": float(res.history["E"][0, 0]), "E_last": float(res.E[0]),
           "rel_gap_last": float(res.history["rel_gap"][-1, 0]),
           "lam_last": float(res.lam[0])}
    print(json.dumps(out), flush=True)


def part_sparse(quick: bool, device="cpu", ns=None):
    """SymHALS on a sparse kNN similarity at each ``n``, a child process per ``n``."""
    ns = ns or ([2000, 5000] if quick else [10_000, 50_000, 100_000])
    rows = []
    for n in ns:
        cmd = [sys.executable, __file__, "--sparse-child", str(n), "--iters", "3" if quick else "50",
               "--rank", "5" if quick else "20", "--device", str(device)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", nargs="+", choices=["numpy", "one-trial", "plans", "time-to-E", "sparse", "before-after",
                                                  "gemm", "all"],
                    default=["all"], help="all: numpy, time-to-E and sparse")
    ap.add_argument("--against", help="before-after part: the commit to compare with (default HEAD); one-trial "
                                      "part: a commit run as a third side")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    ap.add_argument("--out", "--json", dest="out", help="write the rows as JSON here")
    ap.add_argument("--device", default="cpu", help="the torch side's device (cpu, cuda)")
    ap.add_argument("--ns", type=int, nargs="+", help="the sizes n of the numpy part (and of the sparse part "
                                                      "when --sparse-ns is not given)")
    ap.add_argument("--sparse-ns", type=int, nargs="+", help="the sizes n of the sparse part")
    ap.add_argument("--numpy-max-n", type=int, help="numpy part: above this n only the torch side runs")
    ap.add_argument("--ranks", type=int, nargs="+", help="numpy part: the ranks r (default 20 40)")
    ap.add_argument("--trials", type=int, nargs="+", help="numpy part: the trial counts (default 1 20)")
    ap.add_argument("--methods", nargs="+", choices=["symhals", "symanls"],
                    help="numpy, one-trial and plans parts: the methods")
    ap.add_argument("--grid-iters", type=int, help="numpy part: iterations per run (default by n)")
    ap.add_argument("--repeats", type=int, help="numpy part: runs per timing, the median kept (default by n)")
    ap.add_argument("--plans", nargs="+", choices=["torch", "host"],
                    help="one-trial part: fit_symnmf's plans beside numpy (default: torch host on the CPU, torch on "
                         "a GPU)")
    ap.add_argument("--ba-methods", nargs="+", choices=["symhals", "a_symhals", "symanls"],
                    help="before-after part: the methods (default symhals a_symhals)")
    ap.add_argument("--tte-methods", nargs="+", choices=list(METHODS), help="time-to-E part: the methods")
    ap.add_argument("--tte-iters", type=int, help="time-to-E part: iterations per method (default 300)")
    ap.add_argument("--tte-rank", type=int, help="time-to-E part: r (default 20; n is --ns's first)")
    ap.add_argument("--tte-penalty", help="time-to-E part: the split methods' penalty (default their own)")
    ap.add_argument("--sparse-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=50, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=20, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    if args.sparse_child:
        sparse_child(args.sparse_child, args.iters, args.rank, args.device)
        return None
    parts = {"numpy": part_numpy, "one-trial": part_one_trial, "time-to-E": part_time_to_e, "sparse": part_sparse,
             "before-after": part_before_after, "gemm": part_gemm, "plans": part_plans}
    chosen = ["numpy", "time-to-E", "sparse"] if "all" in args.part else list(dict.fromkeys(args.part))
    result = {"threads": torch.get_num_threads(), "torch": torch.__version__, "numpy_version": np.__version__,
              "peak_rss_mb_parent": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    for name in chosen:
        extra = (dict(ranks=args.ranks, trials_list=args.trials, methods=args.methods, iters=args.grid_iters,
                      repeats=args.repeats, numpy_max_n=args.numpy_max_n) if name == "numpy" else
                 dict(methods=args.tte_methods, max_iter=args.tte_iters, rank=args.tte_rank,
                      penalty=args.tte_penalty) if name == "time-to-E"
                 else dict(against=args.against, ranks=args.ranks, iters=args.grid_iters, repeats=args.repeats,
                           methods=args.ba_methods)
                 if name == "before-after" else
                 dict(ranks=args.ranks, methods=args.methods, iters=args.grid_iters, repeats=args.repeats,
                      against=args.against, plans=args.plans)
                 if name == "one-trial" else
                 dict(methods=args.methods, repeats=args.repeats) if name == "plans" else {})
        ns = args.sparse_ns or args.ns if name == "sparse" else args.ns
        result[name] = parts[name](args.quick, args.device, ns, **extra)
        if args.out:  # after each part: a run stopped by a time limit keeps the parts it finished
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
