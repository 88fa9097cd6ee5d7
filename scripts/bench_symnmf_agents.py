"""Symmetric NMF across agents on a sparse kNN similarity: time per outer iteration and peak
memory, the sparse path side by side with the dense one (docs/PERFORMANCE.md, "Symmetric NMF
across agents").

Each layout runs in a child process that builds the similarity of ``n`` Gaussian-blob points
with the library's construction (:func:`~ppdnmf_torch.models.symnmf.similarity.similarity_matrix`,
sparse CSR), resets the peak RSS, and runs :func:`~ppdnmf_torch.models.symnmf.agents.fit_symnmf_agents`
with ``N`` agents (``plain`` exchange, the defaults otherwise): ``sparse`` hands it the CSR matrix
(each agent holds its columns sparse), ``dense`` the same matrix made dense.

Usage::

    OMP_NUM_THREADS=1 python scripts/bench_symnmf_agents.py --n 10000 --agents 10 --iters 5
    python scripts/bench_symnmf_agents.py --n 500 --iters 2 --layouts sparse   # a smoke run

Timings on a shared machine: read them as ratios and ranges.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np

from bench_symnmf import _rss_mb, reset_peak_rss


def child(layout: str, n: int, agents: int, rank: int, iters: int, seed: int = 0) -> dict:
    import torch

    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
    from ppdnmf_torch.models.symnmf.estimator import scaled_start
    from ppdnmf_torch.models.symnmf.similarity import similarity_matrix

    rng = np.random.default_rng(seed)
    centers = rng.normal(scale=4.0, size=(rank, 5))
    pts = centers[rng.integers(rank, size=n)] + rng.normal(size=(n, 5))
    t = time.perf_counter()
    X = similarity_matrix(pts, sparse=True, device="cpu")
    build = time.perf_counter() - t
    nnz = int(X.values().numel())
    if layout == "dense":
        X = X.to_dense()
    U0 = scaled_start(X, rank, 1, seed)[0]
    base, reset = reset_peak_rss()  # the peak below is the fit's
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = fit_symnmf_agents(X, rank, n_agents=agents, U0=U0, max_iter=iters, tol=0.0, start_seed=0, device="cpu",
                                exchange="plain")
    fit = time.perf_counter() - t
    stamps = np.array([0.0] + [float(v) for v in res.history["time"]])
    per = np.diff(stamps)
    return {"layout": layout, "n": n, "nnz": nnz, "agents": agents, "rank": rank, "iters": iters,
            "build_s": build, "fit_s": fit, "s_per_iter_median": float(np.median(per)),
            "s_per_iter_min": float(per.min()), "s_per_iter_max": float(per.max()),
            "rss_before_fit_mb": base, "peak_rss_mb": _rss_mb("VmHWM"), "peak_reset": reset,
            "fit_peak_over_base_mb": _rss_mb("VmHWM") - base,
            "E_last": float(res.history["E"][-1][0]), "consensus_last": float(res.history["consensus"][-1][0]),
            "threads": torch.get_num_threads()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--rank", type=int, default=20)
    ap.add_argument("--iters", type=int, default=5, help="outer iterations (10 ADMM iterations each)")
    ap.add_argument("--layouts", default="sparse,dense")
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.n, args.agents, args.rank, args.iters)), flush=True)
        return 0
    rows = []
    for layout in args.layouts.split(","):
        cmd = [sys.executable, __file__, "--child", layout, "--n", str(args.n), "--agents", str(args.agents),
               "--rank", str(args.rank), "--iters", str(args.iters)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ.copy())
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
