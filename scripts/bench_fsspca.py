"""FSSPCA speed, side by side in one process (docs/PERFORMANCE.md, "Federated sparse PCA").

1. The batched workers (``fit_fsspca``: every worker's line search as one tensor operation)
   against a NumPy loop over the workers running the same algorithm (Huber smoothing, Armijo,
   the same step-size rule and constants), K = 10, 100, 1000, a fixed number of iterations;
   the two agree to rounding (printed).
2. Time to a target (adjusted explained variance and sparsity) against scikit-learn's
   ``SparsePCA`` on the pooled rows.

3. The server's round: plain, quantized and 2048-bit paillier (``--aggregation``).

    python scripts/bench_fsspca.py [--Ks 10,100,1000] [--iters 20] [--repeats 3] [--skip-loop]
                                   [--skip-sklearn] [--aggregation] [--device cuda]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this tree's package

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
                             smoothing="huber")  # the loop's psi
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
    res = fit_fsspca(sp.X, 2, groups=g, alpha=alpha, max_iter=400, tol=1e-6)
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--Ks", default="10,100,1000")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-sklearn", action="store_true")
    p.add_argument("--device", default="cpu", help="the batched side's device (cpu or cuda)")
    p.add_argument("--aggregation", action="store_true", help="also the secure round's cost (2048-bit paillier)")
    p.add_argument("--skip-loop", action="store_true")
    p.add_argument("--json", default="", help="write every row there")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, inner_steps {SPEC.inner_steps}")
    rows = {}
    if not args.skip_loop:
        rows["loop"] = bench_loop([int(k) for k in args.Ks.split(",")], args.iters, args.repeats, device=args.device)
    if not args.skip_sklearn:
        rows["sklearn"] = bench_sklearn()
    if args.aggregation:
        rows["aggregation"] = bench_aggregation()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
