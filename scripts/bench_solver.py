#!/usr/bin/env python
"""Benchmark the batched solver against the plain per-agent loop reference (tests/reference.py).

Everything runs in one process, side by side, and is reported as ratios:

1. Seconds per ADMM iteration (one X-step plus one Y-step iteration, exchange
   included) of the per-agent loop and of the batched solver, eager (``fit``'s default)
   and compiled (``fit(..., fuse=True)``, timed after its compilation), at N in {10, 100, 1000}
   with the paper-synthetic (L=30, K=5, ~20 columns per agent) and CBCL (L=361, K=49,
   ~243 columns per agent) sizes, on CPU and on CUDA when present. Both sides are
   *marginal* costs, measured the same way: the difference between runs of two lengths
   divided by the extra iterations, so that once-per-BCD work (setup, the metrics, the
   loop's first-touch page faults) cancels on both sides (:func:`time_batched`,
   :func:`time_reference`; best of 3 alternating runs of each length, 2 for the loop at CBCL
   N=1000).
   The loop is the plain reference: it recomputes ``Z Y^T`` and ``Y Y^T`` and solves a
   linear system in every iteration, where the batched solver hoists them out of the
   ADMM loop, so the ratio measures the algorithmic hoisting as well as the batching.
2. The bytes an iteration must move at the least (:func:`bytes_per_iteration`: one pass
   over the state, real columns only) and the bandwidth this achieves, against the copy
   bandwidth measured right before and after (the larger of the two): the fraction of
   the memory roofline, at N=2000 with CBCL sizes (best of 3 runs of 8 and of 16 ADMM
   iterations per step). Beside it the compute ceiling, measured in the same run: the
   products' FLOP per iteration (:func:`flops_per_iteration`) at the rate the solver's
   own batched products reach alone at these shapes (:func:`gemm_rate`). The roofline's
   least time is the larger of the two (:func:`roofline_bound`); when compute binds, it
   also caps the share of the copy bandwidth any implementation of these products could
   reach, and the script prints that cap.
3. Batched trials: the full paper-synthetic 100-trial run (quantized exchange, all 100
   BCD iterations of 30 + 30 ADMM iterations) against the reference looped over trials
   (the loop is timed on a few trials and scaled, and says so). The reference quantizes
   entry by entry with Python integers, which is most of its time; the compiled solver's
   compilation is timed and reported beside its run.

Usage::

    python scripts/bench_solver.py                 # everything (several minutes on 2 cores)
    python scripts/bench_solver.py --quick         # smaller sizes, a smoke run
    python scripts/bench_solver.py --modes eager   # the default solver only (no compilation)
    python scripts/bench_solver.py --json out.json --device cuda
    python scripts/bench_solver.py --device cpu cuda --loop-max-n 1000 --ns 10 100 1000 10000
    python scripts/bench_solver.py --device cpu --loop-only --sizes synthetic --numpy-loop   # issue 41

``--device auto`` (the default) runs every section on the CPU and, when CUDA is present, again
on CUDA. The JSON holds the machine, the loop-vs-batched rows (each names its device) and the
roofline and trials rows by device; it is rewritten after every row, so a run stopped by a
time limit keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch import graph as graph_mod  # noqa: E402
from ppdnmf_torch.models.ppdnmf.solver import kernels as solver_mod  # noqa: E402
from ppdnmf_torch.checkpoint import write_atomically  # noqa: E402
from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial, run_experiment  # noqa: E402
from ppdnmf_torch.models.ppdnmf.problem import padded_width  # noqa: E402

from reference import reference_fit  # noqa: E402

SIZES = {"synthetic": dict(L=30, K=5, cols=20), "cbcl": dict(L=361, K=49, cols=243)}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device, nbytes=1 << 30, repeats=5) -> float:
    """Bytes per second of a large device copy (read + write counted)."""
    n = nbytes // 8
    a = torch.rand(n, dtype=torch.float64, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    del a, b
    return 2 * n * 8 / best


def bytes_per_iteration(N, L, K, columns, itemsize=8) -> int:
    """The least traffic of one X + one Y ADMM iteration, in one pass over the state.

    X-step (eqs. 8-11): read ``U``, ``P`` (or the difference ``X - P``), ``Z Y^T``, ``Q`` and
    the neighbours' ``U`` (counted once: a gather that hits the cache); write ``U``, ``P``
    and ``Q``: 8 ``(L, K)`` tensors per agent. ``Q_prev`` is the old ``Q``, read in the
    same pass that makes the new one (as the compiled solver does since its neighbour sum
    joined the next iteration's pass), and ``X = max(0, U + P)`` is needed only at the end
    of the step. Y-step (eqs. 12-14): read ``V``, ``R``, ``X^T Z``; write ``V``, ``R``: 5
    ``(K, M_i)`` tensors, real columns only (``columns``: the total ``sum_i M_i``).
    """
    return itemsize * (8 * N * L * K + 5 * K * int(columns))


def flops_per_iteration(N, L, K, columns) -> int:
    """The floating-point operations of one X + one Y ADMM iteration's products.

    The U-update (eq. 9), ``rhs (L, K) @ E diag(d) E^T``: ``2 L K^2`` per agent, and the
    ``E diag(d) E^T`` itself, ``2 K^3``; the V-update (eq. 13), ``G^-1 (K, K) @ B (K, M_i)``:
    ``2 K^2 M_i``, real columns only (``columns``: the total ``sum_i M_i``). The elementwise
    updates (a few operations per entry) are left out: :func:`bytes_per_iteration` bounds them.
    """
    return 2 * N * L * K * K + 2 * N * K ** 3 + 2 * K * K * int(columns)


def gemm_rate(device, N, L, K, M, dtype=torch.float64, repeats=5) -> float:
    """FLOP per second of the solver's three batched products alone, at its shapes.

    ``(N, L, K) @ (N, K, K)`` (eq. 9), ``(N, K, K) @ (N, K, K)`` (``E diag(d) E^T``) and
    ``(N, K, K) @ (N, K, M)`` (eq. 13), through the solver's own :func:`ppdnmf_torch.models.ppdnmf.solver.kernels.bmm`
    into preallocated outputs, best of ``repeats`` each: the compute ceiling of the
    roofline, the rate the machine's BLAS reaches on these shapes with nothing else running.
    """
    gen = torch.Generator().manual_seed(0)
    shapes = [((N, L, K), (N, K, K)), ((N, K, K), (N, K, K)), ((N, K, K), (N, K, M))]
    total_flops, total_s = 0, 0.0
    for sa, sb in shapes:
        a = torch.rand(sa, generator=gen, dtype=dtype).to(device)
        b = torch.rand(sb, generator=gen, dtype=dtype).to(device)
        out = torch.empty((N, sa[1], sb[2]), dtype=dtype, device=device)
        solver_mod.bmm(a, b, out=out)  # first touch of the output's pages
        _sync(device)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            solver_mod.bmm(a, b, out=out)
            _sync(device)
            best = min(best, time.perf_counter() - t0)
        total_flops += 2 * N * sa[1] * sa[2] * sb[2]
        total_s += best
        del a, b, out
    return total_flops / total_s


def roofline_bound(nbytes, flops, copy_bw, flop_rate) -> dict:
    """The roofline's least time for an iteration: the larger of its memory time at the copy
    bandwidth and its compute time at the products' measured rate (which ceiling binds), and
    the largest share of the copy bandwidth an iteration can reach when compute binds."""
    memory_s, compute_s = nbytes / copy_bw, flops / flop_rate
    bound_s = max(memory_s, compute_s)
    return {"memory_s": memory_s, "compute_s": compute_s, "bound_s": bound_s,
            "bound": "compute" if compute_s > memory_s else "memory",
            "max_fraction_of_copy": memory_s / bound_s}


def problem(N, L, K, cols, seed=0):
    gen = torch.Generator().manual_seed(seed)
    counts = [cols + (i % 3) - 1 for i in range(N)]
    blocks = [torch.rand((L, c), generator=gen, dtype=torch.float64) for c in counts]
    return blocks, graph_mod.random_connected(N, 3.0 if N > 3 else 2.0, seed=seed)


MODES = ("eager", "fused")
NO_MEASUREMENT = "no measurement (the longer runs were not the slower: the machine's noise exceeded the difference)"
#: a share of the roofline above 100 % is impossible: something else ran during the
#: ceilings' measurement (or the solver's two run lengths), so the fractions do not count
DISTURBED = "above 100 %: the ceilings or the solver were measured while the machine was busy; rerun on an idle machine"


def _marginal(run, iters, repeats):
    """``(best(2 iters) - best(iters)) / iters``: once-per-run work cancels. ``run(n)`` times
    one run of length ``n``; the two lengths alternate, ``repeats`` runs each, so that a
    slow phase of a shared machine falls on both rather than on one length's runs. When
    a slow moment still makes the shorter runs the slower ones: no measurement (NaN),
    rather than a made-up speed."""
    long = short = float("inf")
    for _ in range(repeats):
        long = min(long, run(2 * iters))
        short = min(short, run(iters))
    diff = long - short
    return diff / iters if diff > 0 else float("nan")


def time_batched(blocks, g, K, iters, device, dtype=torch.float64, repeats=3, fuse=False):
    """Marginal seconds per ADMM iteration (one X- plus one Y-step iteration) in a running solver.

    Runs of 3 BCD iterations with ``iters`` and with ``2 * iters`` ADMM iterations per
    step. The first BCD iteration warms up (it allocates the solver's reusable buffers,
    and compiles with ``fuse``); of the others, the solver's own timers
    (``history["time_x"] + history["time_y"]``) give the fastest. The difference between
    the two run lengths (the once-per-BCD work cancels) divided by ``iters`` is the
    marginal cost; best of ``repeats`` alternating runs of each length (NaN when the
    longer runs were not the slower: the machine's noise exceeded the difference).
    """
    kw = dict(bcd_iters=3, device=device, dtype=dtype, mu=1.0, eta=1.0, g_max=0.05, fuse=fuse, exchange="plain")

    def run(n):
        h = pp.fit(blocks, g, K, x_iters=n, y_iters=n, **kw).history
        return min(tx + ty for tx, ty in zip(h["time_x"][1:], h["time_y"][1:]))

    return _marginal(run, iters, repeats)


def time_reference(blocks, g, K, iters, repeats=3):
    """Marginal seconds per ADMM iteration of the per-agent loop, as :func:`time_batched`
    measures the batched solver: one BCD iteration of ``iters`` and of ``2 * iters`` ADMM
    iterations per step, best of ``repeats`` alternating runs each; the difference divided
    by ``iters`` (NaN when the longer runs were not the slower)."""
    edges = list(g.edges)

    def run(n):
        t0 = time.perf_counter()
        reference_fit(blocks, edges, K, bcd_iters=1, x_iters=n, y_iters=n, mu=1.0, eta=1.0, g_max=0.05)
        return time.perf_counter() - t0

    return _marginal(run, iters, repeats)


def numpy_loop(Z_blocks, edges, K, *, bcd_iters=1, x_iters=30, y_iters=30, mu=0.1, eta=1.0, g_max=0.033, seed=0):
    """PPDNMF (ALGORITHM.md, plain exchange, random penalties, the derived consensus form) as a
    plain per-agent NumPy loop, one agent's small matrices at a time: the independent baseline
    of issue 41. The penalties are drawn as tests/reference.py's contract says (one
    ``torch.rand`` block per BCD iteration from ``derive_seed(seed, "penalties")``), so its
    iterates are the reference's to rounding; the rest is NumPy (``numpy.linalg.solve``).

    Returns
    -------
    X, Y : lists of ``(L, K)`` and ``(K, M_i)`` arrays
    """
    import numpy as np

    from ppdnmf_torch._utils import derive_seed

    Z = [np.asarray(z, dtype=np.float64) for z in Z_blocks]
    N, L = len(Z), Z[0].shape[0]
    nbrs = [[] for _ in range(N)]
    for i, j in edges:
        nbrs[int(i)].append(int(j))
        nbrs[int(j)].append(int(i))
    nbrs = [sorted(set(a)) for a in nbrs]
    dir_edges = [(i, j) for i in range(N) for j in nbrs[i]]
    index = {e: k for k, e in enumerate(dir_edges)}
    X = [np.ones((L, K)) for _ in range(N)]
    U = [np.ones((L, K)) for _ in range(N)]
    P = [np.zeros((L, K)) for _ in range(N)]
    Q = [np.zeros((L, K)) for _ in range(N)]
    Q_prev = [np.zeros((L, K)) for _ in range(N)]
    Y = [np.zeros((K, z.shape[1])) for z in Z]
    V = [np.zeros((K, z.shape[1])) for z in Z]
    R = [np.zeros((K, z.shape[1])) for z in Z]
    g = np.zeros(len(dir_edges))
    src = np.array([i for i, _ in dir_edges], dtype=np.int64)
    rev = np.array([index[(j, i)] for i, j in dir_edges], dtype=np.int64)
    gen = torch.Generator().manual_seed(derive_seed(seed, "penalties"))
    eye = np.eye(K)
    for _ in range(bcd_iters):
        u = torch.rand((x_iters, len(dir_edges)), generator=gen, dtype=torch.float64).numpy()
        for m in range(x_iters):
            g = g_max - u[m] * (g_max - g)  # step 1: g_{i->j} uniform on (g_prev, g_max]
            rho_e = g * g[rev]
            rho = np.bincount(src, weights=rho_e, minlength=N)
            for i in range(N):  # steps 2-4
                X[i] = np.maximum(U[i] + P[i], 0.0)
                rhs = Z[i] @ Y[i].T + mu * (X[i] - P[i]) + rho[i] * U[i] + 2.0 * Q[i] - Q_prev[i]
                U[i] = np.linalg.solve(Y[i] @ Y[i].T + (mu + rho[i]) * eye, rhs.T).T  # rhs A^-1, A symmetric
                P[i] = P[i] - (X[i] - U[i])
            for i in range(N):  # steps 5-6 with every new U_j
                S = np.zeros((L, K))
                for j in nbrs[i]:
                    S += rho_e[index[(i, j)]] * (U[j] - U[i])
                Q_prev[i], Q[i] = Q[i], Q[i] + S
        for i in range(N):  # the Y-step, eqs. 12-14
            G = X[i].T @ X[i] + eta * eye
            XtZ = X[i].T @ Z[i]
            for _k in range(y_iters):
                Y[i] = np.maximum(V[i] + R[i], 0.0)
                V[i] = np.linalg.solve(G, XtZ + eta * (Y[i] - R[i]))
                R[i] = R[i] - (Y[i] - V[i])
    return X, Y


def time_numpy_loop(blocks, g, K, iters, repeats=3):
    """Marginal seconds per ADMM iteration of :func:`numpy_loop`, measured as
    :func:`time_reference` measures the torch loop."""
    edges = list(g.edges)
    Zs = [b.numpy() for b in blocks]

    def run(n):
        t0 = time.perf_counter()
        numpy_loop(Zs, edges, K, bcd_iters=1, x_iters=n, y_iters=n, mu=1.0, eta=1.0, g_max=0.05)
        return time.perf_counter() - t0

    return _marginal(run, iters, repeats)


def _batched_modes(blocks, g, K, iters, device, modes, **kw):
    """``{mode: marginal seconds per iteration}`` for the eager and the compiled solver."""
    return {mode: time_batched(blocks, g, K, iters, device, fuse=mode == "fused", **kw) for mode in modes}


def bench_loop_vs_batched(device, Ns, quick, modes, loop_max_n=None, rows=None, on_row=None, loop_times=None,
                          sizes=None, numpy=False):
    """Loop vs batched rows on ``device``, appended to ``rows``; ``on_row()`` after each.

    Above ``loop_max_n`` agents only the batched solver is timed (the loop's time is NaN):
    at N = 10,000 with CBCL sizes the loop alone would take minutes. ``loop_times`` (a dict)
    keeps the loop's times, which run on the CPU whatever the device, for the next device.
    ``sizes``: the names of :data:`SIZES` to run (default all); ``numpy``: the per-agent NumPy
    loop (:func:`numpy_loop`) too, with each mode's ratio to it.
    """
    rows = [] if rows is None else rows
    loop_times = {} if loop_times is None else loop_times
    for name, sz in ((k, SIZES[k]) for k in (SIZES if sizes is None else sizes)):
        for N in Ns:
            blocks, g = problem(N, sz["L"], sz["K"], sz["cols"])
            iters_b = 5 if name == "cbcl" else 50
            t_b = _batched_modes(blocks, g, sz["K"], iters_b, device, modes)
            big = name == "cbcl" and N >= 1000
            ref_iters = 1 if big else (2 if name == "cbcl" else 3)
            skip = loop_max_n is not None and N > loop_max_n
            if skip:
                t_r = float("nan")
            elif (name, N) in loop_times:
                t_r = loop_times[(name, N)]
            else:
                t_r = loop_times[(name, N)] = time_reference(blocks, g, sz["K"], ref_iters, repeats=2 if big else 3)
            nbytes = bytes_per_iteration(N, sz["L"], sz["K"], sum(b.shape[1] for b in blocks))
            row = {"device": str(device), "sizes": name, "N": N, "loop_s_per_iter": t_r, "loop_device": "cpu",
                   "bytes_per_iter": nbytes}
            text = f"  {str(device):6s} {name:9s} N={N:5d}  loop " + ("  not run" if skip else f"{t_r:9.4f} s/it")
            for mode, t in t_b.items():
                row[f"{mode}_s_per_iter"] = t
                row[f"{mode}_speedup"] = t_r / t
                text += f"  {mode} {t:9.5f} s/it" + ("" if skip else f" = {t_r / t:6.1f}x")
            if any(v != v for v in [*([] if skip else [t_r]), *t_b.values()]):
                text += f"  (nan: {NO_MEASUREMENT})"
            if numpy and not skip:
                key = ("numpy", name, N)
                # more iterations where one is short: the two lengths' difference must exceed the noise
                np_iters = 30 if N <= 100 else ref_iters
                t_n = loop_times[key] = loop_times.get(key) or time_numpy_loop(blocks, g, sz["K"], np_iters,
                                                                                repeats=2 if big else 3)
                row["numpy_loop_s_per_iter"] = t_n
                text += f"  | numpy loop {t_n:9.5f} s/it"
                for mode, t in t_b.items():
                    row[f"{mode}_vs_numpy"] = t_n / t
                    text += f"  {mode} {t_n / t:6.1f}x"
            rows.append(row)
            print(text, flush=True)
            if on_row is not None:
                on_row()
    return rows


def bench_roofline(device, N, modes, repeats=3, iters=8):
    """Seconds per iteration at CBCL sizes against the roofline measured in the same run.

    The memory ceiling is the copy bandwidth measured right before and right after the
    solver (the fraction is against the larger: the conservative reading); the compute
    ceiling is the rate of the solver's own batched products alone at the same shapes
    (:func:`gemm_rate`). Both sides are best-of measurements (the copy of 5, the products
    of 5, the solver of ``repeats`` runs of each length), so that one slow moment of a
    shared machine on either side does not decide the fraction. Reported: the share of the
    copy bandwidth the iteration's least traffic achieves, and the share of the roofline's
    least time (:func:`roofline_bound`: the larger of the memory and the compute time).
    """
    sz = SIZES["cbcl"]
    blocks, g = problem(N, sz["L"], sz["K"], sz["cols"])
    columns = sum(b.shape[1] for b in blocks)
    m_pad = padded_width(max(b.shape[1] for b in blocks))  # the solver's Y width
    bw_before = copy_bandwidth(device)
    flop_rate = gemm_rate(device, N, sz["L"], sz["K"], m_pad)
    t_b = _batched_modes(blocks, g, sz["K"], iters, device, modes, repeats=repeats)
    bw_after = copy_bandwidth(device)
    copy_bw = max(bw_before, bw_after)
    nbytes = bytes_per_iteration(N, sz["L"], sz["K"], columns)
    flops = flops_per_iteration(N, sz["L"], sz["K"], columns)
    roof = roofline_bound(nbytes, flops, copy_bw, flop_rate)
    row = {"sizes": "cbcl", "N": N, "bytes_per_iter": nbytes, "copy_GBps_before": bw_before / 1e9,
           "copy_GBps_after": bw_after / 1e9, "copy_GBps": copy_bw / 1e9, "flops_per_iter": flops,
           "gemm_GFLOPs": flop_rate / 1e9, "roofline_memory_s": roof["memory_s"],
           "roofline_compute_s": roof["compute_s"], "roofline_bound_s": roof["bound_s"],
           "roofline_binding": roof["bound"], "max_fraction_of_copy": roof["max_fraction_of_copy"]}
    print(f"  cbcl N={N}: {nbytes / 1e9:.2f} GB and {flops / 1e9:.2f} GFLOP per iteration; copy bandwidth "
          f"{bw_before / 1e9:.2f} GB/s before, {bw_after / 1e9:.2f} GB/s after; the products alone "
          f"{flop_rate / 1e9:.1f} GFLOP/s", flush=True)
    print(f"  roofline: {1e3 * roof['memory_s']:.0f} ms memory, {1e3 * roof['compute_s']:.0f} ms compute: "
          f"{roof['bound']} bound, at best {100 * roof['max_fraction_of_copy']:.0f}% of the copy bandwidth",
          flush=True)
    for mode, t in t_b.items():
        if t != t:
            row[f"{mode}_s_per_iter"] = t
            print(f"    {mode}: {NO_MEASUREMENT}", flush=True)
            continue
        bw = nbytes / t
        row[f"{mode}_s_per_iter"] = t
        row[f"{mode}_GBps"] = bw / 1e9
        row[f"{mode}_fraction_of_copy"] = bw / copy_bw
        row[f"{mode}_GFLOPs"] = flops / t / 1e9
        row[f"{mode}_fraction_of_roofline"] = roof["bound_s"] / t
        row[f"{mode}_disturbed"] = disturbed = roof["bound_s"] / t > 1
        print(f"    {mode}: {t:.3f} s/it, {bw / 1e9:.2f} GB/s = {100 * bw / copy_bw:.1f}% of "
              f"{copy_bw / 1e9:.2f} GB/s; {flops / t / 1e9:.1f} GFLOP/s; "
              f"{100 * roof['bound_s'] / t:.0f}% of the roofline" + (f" ({DISTURBED})" if disturbed else ""),
              flush=True)
    return row


def bench_trials(device, trials, ref_trials, bcd_iters, modes, ref_cache=None):
    """The batched trials on ``device`` against the looped reference (on the CPU; timed once
    per process when ``ref_cache``, a dict, is passed for every device)."""
    ref_cache = {} if ref_cache is None else ref_cache
    row = {"device": str(device), "trials": trials, "bcd_iters": bcd_iters}
    for mode in modes:
        fuse = mode == "fused"
        if fuse:  # compile outside the run's timing (once per shape and process), timed on its own
            t0 = time.perf_counter()
            run_experiment("paper_synthetic", trials=trials, seed=0, exchange="quantized", n_max=1e6,
                           centralized=False, device=device, bcd_iters=1, fuse=True)
            row["fused_compile_s"] = time.perf_counter() - t0  # one BCD iteration included
        _sync(device)
        t0 = time.perf_counter()
        res = run_experiment("paper_synthetic", trials=trials, seed=0, exchange="quantized", n_max=1e6,
                             centralized=False, device=device, bcd_iters=bcd_iters, fuse=fuse)
        _sync(device)
        row[f"{mode}_s"] = time.perf_counter() - t0
        row[f"{mode}_final_nmse_mean"] = float(res.history["nmse"][-1].mean())
    text = f"  {trials} trials x {bcd_iters} BCD (quantized) on {device}:"
    if ref_trials == 0:  # the loop over trials is not run (it takes about a minute per trial)
        for mode in modes:
            text += f" {mode} {row[f'{mode}_s']:.1f} s (mean final NMSE {row[f'{mode}_final_nmse_mean']:.4f});"
        print(text.rstrip(";"), flush=True)
        return row
    if (ref_trials, bcd_iters) not in ref_cache:
        spec = PAPER_EXPERIMENTS["paper_synthetic"]
        t0 = time.perf_counter()
        ref_nmse = []
        for t in range(ref_trials):
            blocks, g = make_trial(spec, t)
            ref = reference_fit(blocks, list(g.edges), 5, bcd_iters=bcd_iters, exchange="quantized", n_max=10**6,
                                seed=t, mu=0.1, eta=1.0, g_max=0.033)
            ref_nmse.append(float(ref["history"]["nmse"][-1]))
        ref_cache[(ref_trials, bcd_iters)] = ((time.perf_counter() - t0) / ref_trials, ref_nmse)
    per_trial, ref_nmse = ref_cache[(ref_trials, bcd_iters)]
    t_ref = per_trial * trials
    row.update({"loop_s_scaled": t_ref, "loop_trials_timed": ref_trials,
                "loop_final_nmse_mean": sum(ref_nmse) / len(ref_nmse)})
    text += (f" loop {t_ref:.0f} s (timed on {ref_trials} trials, "
             f"scaled; it quantizes entry by entry in Python; mean final NMSE of those "
             f"{row['loop_final_nmse_mean']:.4f})")
    for mode in modes:
        row[f"{mode}_speedup"] = t_ref / row[f"{mode}_s"]
        text += (f"; {mode} {row[f'{mode}_s']:.1f} s = {t_ref / row[f'{mode}_s']:.0f}x "
                 f"(mean final NMSE {row[f'{mode}_final_nmse_mean']:.4f})")
        if f"{mode}_compile_s" in row:
            text += f" + {row[f'{mode}_compile_s']:.1f} s compiling"
    print(text, flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", nargs="+", default=["auto"],
                    help="cpu, cuda, cuda:<k>; auto (default): the CPU, and CUDA too when present")
    ap.add_argument("--quick", action="store_true", help="small sizes only (smoke run)")
    ap.add_argument("--ns", type=int, nargs="*", default=None, help="agent counts (default 10 100 1000)")
    ap.add_argument("--loop-max-n", type=_positive_int, default=None,
                    help="time the per-agent loop only up to this many agents (default: at every N)")
    ap.add_argument("--roofline-n", type=_positive_int, default=2000)
    ap.add_argument("--roofline-repeats", type=_positive_int, default=3, help="solver runs of each length (best of)")
    ap.add_argument("--trials", type=_positive_int, default=100)
    ap.add_argument("--ref-trials", type=_nonnegative_int, default=2,
                    help="trials the looped reference is timed on (0: not run)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                    help="the batched solver eager (default fit) and/or compiled (fit(..., fuse=True))")
    ap.add_argument("--skip-loop", action="store_true", help="roofline and trials only")
    ap.add_argument("--numpy-loop", action="store_true",
                    help="also the per-agent NumPy loop (issue 41), each mode's ratio to it")
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES),
                    help="the loop-vs-batched rows' problem sizes")
    ap.add_argument("--loop-only", action="store_true", help="the loop-vs-batched rows only (no roofline, trials)")
    args = ap.parse_args(argv)
    devices = resolve_devices(args.device)
    Ns = args.ns or ([10, 100] if args.quick else [10, 100, 1000])
    info = {"devices": [str(d) for d in devices], "modes": args.modes, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "gpu": next((torch.cuda.get_device_name(d) for d in devices if d.type == "cuda"), None)}
    print(f"bench_solver on {info}", flush=True)
    out = {"machine": info, "loop_vs_batched": [], "roofline": {}, "trials": {}}

    def save():
        # after every row: a run stopped by a time limit keeps what it measured (written
        # aside and renamed, so that a kill mid-write keeps the previous file)
        if args.json:
            write_atomically(args.json, lambda fh: json.dump(_json_safe(out), fh, indent=2, allow_nan=False),
                             binary=False)

    loop_times, ref_cache = {}, {}

    for device in devices:
        if not args.skip_loop:
            print(f"per-agent loop vs batched on {device}, seconds per ADMM iteration (float64; the loop runs "
                  "on the CPU):", flush=True)
            bench_loop_vs_batched(device, Ns, args.quick, args.modes, args.loop_max_n,
                                  rows=out["loop_vs_batched"], on_row=save, loop_times=loop_times,
                                  sizes=args.sizes, numpy=args.numpy_loop)
        if args.loop_only:
            continue
        print(f"roofline (memory and compute) on {device}:", flush=True)
        out["roofline"][str(device)] = bench_roofline(device, 200 if args.quick else args.roofline_n, args.modes,
                                                      1 if args.quick else args.roofline_repeats,
                                                      4 if args.quick else 8)
        save()
        print(f"batched trials on {device}:", flush=True)
        out["trials"][str(device)] = bench_trials(device, 10 if args.quick else args.trials,
                                                  min(args.ref_trials, 1) if args.quick else args.ref_trials,
                                                  10 if args.quick else 100, args.modes, ref_cache)
        save()
    return out


def resolve_devices(names) -> list:
    """``--device`` values as devices: ``auto`` is the CPU, and CUDA too when present."""
    devices = []
    for name in names:
        if name == "auto":
            found = [torch.device("cpu")] + ([pp.resolve_device("cuda")] if torch.cuda.is_available() else [])
        else:
            found = [pp.resolve_device(name)]
        # "cuda" and "cuda:0" are one device (torch.device compares them unequal)
        found = [torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d
                 for d in found]
        devices += [d for d in found if d not in devices]
    return devices


def _json_safe(x):
    """NaN (a measurement the machine's noise voided) as JSON null, which strict parsers read."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def _int_at_least(low):
    """An argparse type: an integer ``>= low``."""
    def parse(text):
        v = int(text)
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v
    parse.__name__ = f"integer >= {low}"  # argparse's "invalid <name> value: ..." message
    return parse


_positive_int, _nonnegative_int = _int_at_least(1), _int_at_least(0)


if __name__ == "__main__":
    main()
