"""FSSPCA speed, side by side in one process (docs/PERFORMANCE.md, "Federated sparse PCA").

1. ``--part grid`` (issue 41): time to the same support, every side to its own convergence
   (RMS consensus gap and change of ``z`` per column both <= ``--tol``), on spiked data over a
   grid of ``n`` rows, ``d`` features and ``K`` workers: ``fit_fsspca`` with its default local
   solver (the polar MM step) against an independent NumPy ADMM with the same MM polar step
   (:func:`numpy_admm`, one worker at a time), optionally the paper's Riemannian steps
   (``--riemannian-max-k``), scikit-learn's ``SparsePCA`` on the pooled rows
   (``--sklearn-max-nd``) and plain PCA (``eigh`` of the pooled Gram matrix, and scikit-learn's
   ``PCA``). Each row reports the seconds, iterations, whether the support (columns matched up
   to order and sign) equals the NumPy ADMM's, and the relative objective difference; with
   ``--plans auto,torch`` (the CPU's default) the library's host plan (``auto`` on the CPU) and
   its torch plan side by side.
2. ``--part loop``: the batched Riemannian workers (``local_solver="riemannian"``) against a
   NumPy loop over the workers running the same algorithm (Huber smoothing, Armijo, the same
   step-size rule and constants), K = 10, 100, 1000, a fixed number of iterations; the two
   agree to rounding (printed).
3. ``--part sklearn``: time to a target (adjusted explained variance and sparsity) against
   scikit-learn's ``SparsePCA`` on the pooled rows.
4. ``--part aggregation``: the server's round: plain, quantized and 2048-bit paillier.
5. ``--part plans``: ``fit_fsspca``'s host plan against its torch plan with ``--trials`` trials
   batched (``--sizes`` or ``--grid``), the same iterations to rounding (printed).

    python scripts/bench_fsspca.py --part grid [--grid small|full] [--repeats 3] [--json out.json]
    python scripts/bench_fsspca.py --part loop sklearn [--Ks 10,100,1000] [--iters 20] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

# this checkout's package, not an installed one
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppdnmf_torch.models.fsspca import fit_fsspca, manifold  # noqa: E402
from ppdnmf_torch.models.fsspca.admm import adjusted_variance  # noqa: E402
from ppdnmf_torch.models.fsspca.data import spiked_covariance, split_iid  # noqa: E402
from ppdnmf_torch.models.fsspca.config import SPEC  # noqa: E402


def _qf(Y):
    Q, R = np.linalg.qr(Y)
    s = np.sign(np.diag(R))
    s[s == 0] = 1
    return Q * s


def _huber(x, mu):
    a = np.abs(x)
    return np.where(a <= mu, x * x / (2 * mu), a - mu / 2)


def numpy_loop(blocks, r, z0, alpha, iters, mu=1e-3, inner=2, rho_scale=2.0):
    """The same algorithm, one worker at a time in NumPy (the reference of the comparison)."""
    A = np.vstack(blocks)
    m = A.mean(0)
    C = [(b - m).T @ (b - m) for b in blocks]
    q = [float(((b - m) ** 2).sum()) for b in blocks]
    K = len(blocks)
    rho = rho_scale * np.mean([np.linalg.eigvalsh(c)[-1] for c in C])
    lam2 = alpha / K
    z = z0.copy()
    w = [z0.copy() for _ in range(K)]
    u = [np.zeros_like(z0) for _ in range(K)]
    theta = [1.0 / (2 * np.linalg.norm(c) + rho + lam2 / mu) for c in C]
    c1, beta, max_ls = manifold.ARMIJO_C1, manifold.BACKTRACK, manifold.MAX_LINE_SEARCH

    for _ in range(iters):
        for i in range(K):
            def h(x):
                s = x - z + u[i] / rho
                return q[i] - np.sum(x * (C[i] @ x)) + lam2 * _huber(x, mu).sum() + 0.5 * rho * np.sum(s * s)

            for _ in range(inner):
                x = w[i]
                g = -2 * C[i] @ x + lam2 * np.clip(x / mu, -1, 1) + rho * (x - z) + u[i]
                g = g - x @ (0.5 * (x.T @ g + g.T @ x))
                f0, sl = h(x), -np.sum(g * g)
                t, acc = theta[i], 0.0
                for _ in range(max_ls):
                    cand = _qf(x - t * g)
                    fc = h(cand)
                    need = c1 * t * sl
                    if fc <= f0 + need or (-need <= 16 * np.finfo(float).eps * abs(f0) and fc <= f0):
                        w[i], acc = cand, t
                        break
                    t *= beta
                if acc > 0:
                    theta[i] = 2 * acc
        v = sum(w[i] + u[i] / rho for i in range(K)) / K
        z = np.sign(v) * np.maximum(np.abs(v) - alpha / (K * rho), 0)
        for i in range(K):
            u[i] = u[i] + rho * (w[i] - z)
    return z


# ------------------------------------------------------------------ the grid (issue 41)
def _polar(M):
    U, _, Vt = np.linalg.svd(M, full_matrices=False)
    return U @ Vt


def numpy_admm(blocks, r, z0, lam1, lam2, *, mu=1e-3, steps=4, rho_scale=2.0, tol=1e-6, max_iter=500):
    """Consensus ADMM for problem (6) with the ``sqrt`` smoothing, written from the maths in
    NumPy, one worker at a time (independent of the library's code).

    Centring by the pooled mean, ``C_i = (A_i - 1 m^T)^T (A_i - 1 m^T)``, ``rho = rho_scale``
    times the workers' mean largest eigenvalue of ``C_i``. Worker step: ``steps`` MM polar
    steps ``w <- polar(2 C_i w + rho z - u_i - lam2 psi'(w) + lam2 / (2 mu) w)`` (``psi'' <= 1 /
    (2 mu)`` for ``sqrt(4 mu^2 + x^2)``); server: ``z = soft(mean_i (w_i + u_i / rho), lam1 / (K
    rho))``; dual ``u_i += rho (w_i - z)``. Stops when ``sqrt(sum_i ||w_i - z||^2 / (K r))`` and
    ``||z - z_old|| / sqrt(r)`` are both ``<= tol``.

    Returns
    -------
    z (d, r), iterations, the pooled ``(C, q)`` (for :func:`common_objective`)
    """
    K = len(blocks)
    m = sum(b.sum(0) for b in blocks) / sum(len(b) for b in blocks)
    C = [(b - m).T @ (b - m) for b in blocks]
    rho = rho_scale * np.mean([np.linalg.eigvalsh(c)[-1] for c in C])
    L = lam2 / (2 * mu)
    z = z0.copy()
    w = [z0.copy() for _ in range(K)]
    u = [np.zeros_like(z0) for _ in range(K)]
    for it in range(1, max_iter + 1):
        for i in range(K):
            x, b = w[i], rho * z - u[i]
            for _ in range(steps):
                M = 2 * (C[i] @ x) + b
                if lam2:
                    M += L * x - lam2 * x / np.sqrt(4 * mu * mu + x * x)
                x = _polar(M)
            w[i] = x
        v = sum(w[i] + u[i] / rho for i in range(K)) / K
        zn = np.sign(v) * np.maximum(np.abs(v) - lam1 / (K * rho), 0)
        for i in range(K):
            u[i] += rho * (w[i] - zn)
        primal = np.sqrt(sum(np.sum((w[i] - zn) ** 2) for i in range(K)) / (K * r))
        change = np.linalg.norm(zn - z) / np.sqrt(r)
        z = zn
        if primal <= tol and change <= tol:
            break
    q = sum(float(((b - m) ** 2).sum()) for b in blocks)
    return z, it, (sum(C), q)


def common_objective(z, pooled, lam1, lam2_total, mu=1e-3):
    """Problem (6) at the consensus ``w_i = z``: ``q - tr(z^T C z) + K lam2 r(z) + lam1 ||z||_1``
    (pooled ``C``, ``q``), one function of ``z`` for every solver."""
    C, q = pooled
    return (q - float(np.sum(z * (C @ z))) + lam2_total * float(np.sqrt(4 * mu * mu + z * z).sum())
            + lam1 * float(np.abs(z).sum()))


def support_key(z):
    """The columns' supports, sorted: equal keys = the same support up to column order and sign."""
    return sorted(tuple(np.flatnonzero(z[:, j])) for j in range(z.shape[1]))


GRIDS = {
    "small": [(1000, 40, 1), (1000, 40, 10), (10000, 40, 100)],
    # sized to a 2-core machine: K d^2 Gram entries per worker set at most 4e7 (320 MB)
    "full": [(1000, 40, 1), (1000, 40, 10), (1000, 40, 100),
             (10000, 40, 1), (10000, 40, 10), (10000, 40, 100), (10000, 40, 1000),
             (100000, 40, 10), (100000, 40, 1000),
             (10000, 200, 1), (10000, 200, 10), (10000, 200, 100), (10000, 200, 1000),
             (10000, 2000, 1), (10000, 2000, 10), (100000, 2000, 10)],
}


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_grid(sizes, repeats=3, r=2, alpha_per_row=0.75, tol=1e-6, max_iter=500, riemannian_max_k=0,
               riemannian_max_d=200, sklearn_max_nd=2e6, device="cpu", smoothed=True, repeat_below=30.0, on_row=None,
               plans=("auto",)):
    """One row per ``(n, d, K)``: every side to its convergence from the same start; the
    library (``fit_fsspca`` with each of ``plans``, the first the row's ``library_*``, the others
    ``<plan>_s`` and ``<plan>_ratio_*``) and the NumPy ADMM alternate ``repeats`` times (the
    ratio's range over the repetitions; once only where a round took over ``repeat_below``
    seconds), the others run once."""
    import warnings

    out = []
    for n, d, K in sizes:
        sp = spiked_covariance(n=n, d=d, r=r, support=5, seed=0)
        g = split_iid(n, K, seed=0)
        blocks = [np.ascontiguousarray(sp.X[g == k]) for k in range(K)]
        z0 = _qf(np.random.default_rng(0).standard_normal((d, r)))
        lam1 = alpha_per_row * n
        lam2 = lam1 / K if smoothed else 0.0
        kw = dict(alpha=lam1, lambda_2=lam2, init=z0, tol=tol, max_iter=max_iter, device=device, aggregation="plain")
        times, tn, fits = {p: [] for p in plans}, [], {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(repeats):
                for p in plans:
                    fits[p], t = _timed(lambda: fit_fsspca(blocks, r, plan=p, **kw))
                    if device != "cpu":
                        torch.cuda.synchronize()
                    times[p].append(t)
                (zn, itn, pooled), t = _timed(lambda: numpy_admm(blocks, r, z0, lam1, lam2, tol=tol,
                                                                  max_iter=max_iter))
                tn.append(t)
                if sum(v[-1] for v in times.values()) + tn[-1] > repeat_below:
                    break
            res, tl = fits[plans[0]], times[plans[0]]
            zl = res.z[0].cpu().numpy()
            f_np = common_objective(zn, pooled, lam1, lam2 * K)
            row = dict(n=n, d=d, K=K, lambda_1=lam1, lambda_2=lam2, device=device,
                       numpy_s=min(tn), numpy_iter=itn, library_s=min(tl), library_iter=int(res.n_iter[0]),
                       ratio_min=min(a / b for a, b in zip(tl, tn)), ratio_max=max(a / b for a, b in zip(tl, tn)),
                       same_support=support_key(zl) == support_key(zn),
                       objective_rel_diff=abs(common_objective(zl, pooled, lam1, lam2 * K) - f_np) / abs(f_np),
                       true_support=support_key(zn) == support_key(sp.V), plan=res.plan)
            for p in plans[1:]:
                zp = fits[p].z[0].cpu().numpy()
                row.update({f"{p}_s": min(times[p]), f"{p}_iter": int(fits[p].n_iter[0]),
                            f"{p}_ratio_min": min(a / b for a, b in zip(times[p], tn)),
                            f"{p}_ratio_max": max(a / b for a, b in zip(times[p], tn)),
                            f"{p}_same_support": support_key(zp) == support_key(zn)})
            if K <= riemannian_max_k and d <= riemannian_max_d:
                rie, t = _timed(lambda: fit_fsspca(blocks, r, local_solver="riemannian", **kw))
                zr = rie.z[0].cpu().numpy()
                row.update(riemannian_s=t, riemannian_iter=int(rie.n_iter[0]),
                           riemannian_same_support=support_key(zr) == support_key(zn),
                           riemannian_objective_rel_diff=abs(common_objective(zr, pooled, lam1, lam2 * K) - f_np)
                           / abs(f_np))
        X = sp.X
        _, row["pca_eigh_s"] = _timed(lambda: np.linalg.eigh((X - X.mean(0)).T @ (X - X.mean(0))))
        if n * d <= sklearn_max_nd:  # scikit-learn only where asked (its import alone takes seconds)
            from sklearn.decomposition import PCA, SparsePCA

            _, row["sklearn_pca_s"] = _timed(lambda: PCA(r, random_state=0).fit(X))
            skl, row["sklearn_sparsepca_s"] = _timed(lambda: SparsePCA(r, random_state=0).fit(X))
            V = skl.components_.T
            row.update(sklearn_sparsepca_true_support=support_key(V) == support_key(sp.V),
                       sklearn_sparsepca_nonzeros=int((V != 0).sum()))
        print(json.dumps(row), flush=True)
        out.append(row)
        if on_row is not None:
            on_row(out)
    return out


def bench_plans(sizes, trials, repeats=2, r=2, tol=1e-6, max_iter=500):
    """The host plan against the torch plan on the CPU with ``trials`` trials batched (``lambda_1``
    spread over ``0.2 n .. n``), alternating in one process: each plan's best seconds, host / torch
    (the range over the repeats), whether the iteration counts agree and the largest
    ``abs(z_host - z_torch)``."""
    import warnings

    out = []
    for n, d, K in sizes:
        sp = spiked_covariance(n=n, d=d, r=r, support=5, seed=0)
        g = split_iid(n, K, seed=0)
        blocks = [np.ascontiguousarray(sp.X[g == k]) for k in range(K)]
        kw = dict(alpha=list(np.linspace(0.2, 1.0, trials) * n), tol=tol, max_iter=max_iter, aggregation="plain",
                  trials=trials)
        times, fits = {"torch": [], "host": []}, {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(repeats):
                for p in times:
                    fits[p], t = _timed(lambda: fit_fsspca(blocks, r, plan=p, **kw))
                    times[p].append(t)
        ratios = [a / b for a, b in zip(times["host"], times["torch"])]
        row = dict(n=n, d=d, K=K, trials=trials, torch_s=min(times["torch"]), host_s=min(times["host"]),
                   host_over_torch_min=min(ratios), host_over_torch_max=max(ratios),
                   max_iter_run=int(fits["host"].n_iter.max()),
                   same_iterations=bool(torch.equal(fits["host"].n_iter, fits["torch"].n_iter)),
                   max_abs_diff_z=float((fits["host"].z - fits["torch"].z).abs().max()))
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def bench_loop(Ks, iters, repeats, alpha=200.0, d=30, r=2, rows=20, device="cpu"):
    out = []
    for K in Ks:
        sp = spiked_covariance(n=rows * K, d=d, r=r, support=5, seed=0)
        g = split_iid(len(sp.X), K, seed=0)
        blocks = [sp.X[g == k] for k in range(K)]
        z0 = _qf(np.random.default_rng(0).standard_normal((d, r)))
        tb, tn = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            res = fit_fsspca(blocks, r, alpha=alpha, init=z0, max_iter=iters, tol=0.0, inner_steps=2, device=device,
                             smoothing="huber", local_solver="riemannian",  # the loop's psi and solver
                             aggregation="plain")
            if device != "cpu":
                torch.cuda.synchronize()
            tb.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            zn = numpy_loop(blocks, r, z0, alpha, iters)
            tn.append(time.perf_counter() - t0)
        diff = float(np.abs(res.z[0].cpu().numpy() - zn).max())
        ratios = [b / a for a, b in zip(tb, tn)]
        row = dict(K=K, device=device, iters=iters, batched_s=min(tb), numpy_loop_s=min(tn), ratio_min=min(ratios),
                   ratio_max=max(ratios), max_abs_diff_z=diff)
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def bench_sklearn(target_ev=0.9, alpha=200.0, K=8):
    """Time for FSSPCA (K workers) and for SparsePCA (pooled) to reach the support-recovering
    regime: report each one's time, explained variance and sparsity at its setting."""
    from sklearn.decomposition import SparsePCA

    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=0)
    A = sp.X - sp.X.mean(0)
    gram = torch.as_tensor(A.T @ A)[None]
    ref = float(adjusted_variance(gram, torch.as_tensor(np.linalg.eigh(A.T @ A)[1][:, -2:])[None])[0])
    g = split_iid(len(sp.X), K, seed=0)
    rows = []
    t0 = time.perf_counter()
    res = fit_fsspca(sp.X, 2, groups=g, alpha=alpha, max_iter=400, tol=1e-6, aggregation="plain")
    rows.append(dict(method=f"fsspca K={K}", seconds=time.perf_counter() - t0, n_iter=int(res.n_iter[0]),
                     ev_over_pca=float(res.explained_variance[0]) / ref, sparsity=float(res.sparsity[0])))
    for a in (1.0, 2.0, 4.0):
        t0 = time.perf_counter()
        sk = SparsePCA(2, alpha=a, random_state=0).fit(sp.X)
        V = sk.components_.T
        rows.append(dict(method=f"sklearn SparsePCA alpha={a}", seconds=time.perf_counter() - t0, n_iter=int(sk.n_iter_),
                         ev_over_pca=float(adjusted_variance(gram, torch.as_tensor(V)[None])[0]) / ref,
                         sparsity=float((V == 0).mean())))
    for row in rows:
        print(json.dumps(row), flush=True)
    return rows


def bench_aggregation(K=8, iters=3, key_bits=2048):
    """The server's round in a FSSPCA run: plain, quantized and paillier (``key_bits``) side by
    side on the same problem (spiked, d = 30, r = 2: 60 values per upload); seconds per round
    from the aggregator's own counters (key generation excluded), the ratio to plain, and the
    largest difference of ``z`` to the plain run."""
    import warnings

    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=0)
    g = split_iid(len(sp.X), K, seed=0)
    rows, z_plain = [], None
    for kind in ("plain", "quantized", "paillier"):
        opts = dict(key_bits=key_bits) if kind != "plain" else {}
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_fsspca(sp.X, 2, groups=g, alpha=200.0, max_iter=iters, tol=0.0, aggregation=kind,
                             aggregation_options=opts)
        wall = time.perf_counter() - t0
        c = res.costs
        z_plain = res.z if z_plain is None else z_plain
        rows.append(dict(kind=kind, K=K, key_bits=key_bits if kind != "plain" else None, rounds=c["rounds"],
                         seconds_per_round=c["seconds"] / c["rounds"], bytes_per_round=c["bytes"] / c["rounds"],
                         encryptions=c["encryptions"], decryptions=c["decryptions"], wall_s=wall,
                         max_abs_diff_z_vs_plain=float((res.z - z_plain).abs().max())))
    for row in rows:
        row["ratio_to_plain"] = row["seconds_per_round"] / rows[0]["seconds_per_round"]
        print(json.dumps(row), flush=True)
    return rows


def _sizes(text):
    return [tuple(int(float(v)) for v in item.split(":")) for item in text.split(",")]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", nargs="+", default=["grid"], choices=["grid", "loop", "sklearn", "aggregation", "plans"])
    p.add_argument("--trials", type=int, default=8, help="(plans part) trials batched in each fit")
    p.add_argument("--grid", default="small", choices=sorted(GRIDS), help="the grid's sizes (n, d, K)")
    p.add_argument("--sizes", default="", help="n:d:K,... instead of --grid")
    p.add_argument("--riemannian-max-k", type=int, default=10, help="the paper's Riemannian steps too, up to this K")
    p.add_argument("--riemannian-max-d", type=int, default=200, help="... and up to this d")
    p.add_argument("--repeat-below", type=float, default=30.0,
                   help="repeat a size only while a library + NumPy pair takes less than this (seconds)")
    p.add_argument("--sklearn-max-nd", type=float, default=2e6, help="SparsePCA only where n * d is at most this")
    p.add_argument("--plans", default=None,
                   help="fit_fsspca's plans, comma-separated (the first is the row's library_*; auto: the host plan on "
                        "the CPU); default auto,torch on the CPU, auto elsewhere (the torch plan there)")
    p.add_argument("--unsmoothed", action="store_true", help="lambda_2 = 0 (Tan et al.'s ADMM) in the grid")
    p.add_argument("--tol", type=float, default=1e-6)
    p.add_argument("--Ks", default="10,100,1000")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-sklearn", action="store_true", help="(loop part) without the sklearn part")
    p.add_argument("--device", default="cpu", help="the library's device (cpu or cuda)")
    p.add_argument("--aggregation", action="store_true", help="also the secure round's cost (2048-bit paillier)")
    p.add_argument("--skip-loop", action="store_true")
    p.add_argument("--json", default="", help="write every row there")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, numpy {np.__version__}, threads {torch.get_num_threads()}, "
          f"defaults {SPEC}", flush=True)
    parts = set(args.part)
    if args.aggregation:
        parts.add("aggregation")
    rows = {}

    def save():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)

    if "grid" in parts:
        plans = args.plans or ("auto,torch" if args.device == "cpu" else "auto")
        sizes = _sizes(args.sizes) if args.sizes else GRIDS[args.grid]
        rows["grid"] = bench_grid(sizes, args.repeats, tol=args.tol, riemannian_max_k=args.riemannian_max_k,
                                  riemannian_max_d=args.riemannian_max_d, sklearn_max_nd=args.sklearn_max_nd,
                                  device=args.device, smoothed=not args.unsmoothed, repeat_below=args.repeat_below,
                                  plans=tuple(plans.split(",")),
                                  on_row=lambda done: (rows.update(grid=done), save()))
        save()
    if "plans" in parts:
        rows["plans"] = bench_plans(_sizes(args.sizes) if args.sizes else GRIDS[args.grid], args.trials, args.repeats)
        save()
    if "loop" in parts and not args.skip_loop:
        rows["loop"] = bench_loop([int(k) for k in args.Ks.split(",")], args.iters, args.repeats, device=args.device)
        save()
    if "sklearn" in parts or ("loop" in parts and not args.skip_sklearn):
        rows["sklearn"] = bench_sklearn()
        save()
    if "aggregation" in parts:
        rows["aggregation"] = bench_aggregation()
        save()


if __name__ == "__main__":
    main()
