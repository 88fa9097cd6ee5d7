#!/usr/bin/env python
"""Symmetric NMF across agents over ranks against one process: bits and seconds per outer iteration.

On scikit-learn's digits (the first ``--n`` samples, Kuang et al.'s similarity, the start of
``scaled_start(init="scaled")``) it runs :func:`~ppdnmf_torch.models.symnmf.agents.fit_symnmf_agents` in this
process and :func:`~ppdnmf_torch.models.symnmf.distributed.fit_symnmf_distributed` on ``--nproc``
local ranks (gloo), alternately ``--repeats`` times, and prints whether the factors and
``lambda`` are the same bits, the largest relative difference of the history's ``E``, and the
seconds per outer iteration of each (from the history's ``time``: the iterations' own time,
not the ranks' start) with their ratio's range. Both take the library's defaults
(``penalty_schedule="agreed"``) and the lambda sums' ``plain`` aggregation, the only one over
ranks (with ``--exchange quantized`` one process would otherwise aggregate them ``quantized``)::

    python scripts/bench_symnmf_distributed.py --n 400 --agents 10 --rank 10 --iters 5 --nproc 2

On a 2-core machine the ranks share the cores: the ratio measures the halo's and the
reductions' overhead, not a speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents  # noqa: E402
from ppdnmf_torch.models.symnmf.distributed import fit_symnmf_distributed  # noqa: E402
from ppdnmf_torch.models.symnmf.estimator import scaled_start  # noqa: E402
from ppdnmf_torch.models.symnmf.datasets import load_digits_samples  # noqa: E402
from ppdnmf_torch.models.symnmf.similarity import similarity_matrix  # noqa: E402


def per_iteration(history) -> float:
    """Median seconds of one outer iteration (differences of the history's cumulative ``time``)."""
    t = np.asarray(history["time"], dtype=float).reshape(-1)
    return float(np.median(np.diff(np.concatenate([[0.0], t]))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="digits samples (the first n)")
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--iters", type=int, default=5, help="outer iterations")
    ap.add_argument("--x-iters", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--exchange", default="plain", choices=("plain", "quantized"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (one process and each rank)")
    ap.add_argument("--json", help="write the numbers here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    M, _ = load_digits_samples()
    S = similarity_matrix(M[: a.n], device="cpu")
    S = S.to_dense() if S.layout != torch.strided else S
    U0 = scaled_start(S, a.rank, 1, 0, "scaled")[0]  # the start of docs/RESULTS.md's agents runs
    kw = dict(n_agents=a.agents, max_iter=a.iters, tol=0.0, x_iters=a.x_iters, U0=U0, seed=0, start_seed=0,
              exchange=a.exchange,
              exchange_options={"n_max": 1e6} if a.exchange == "quantized" else None,
              aggregation="plain")  # the lambda sums' only aggregation over ranks (plain's default anyway)
    one, ranks, same, dE = [], [], [], []
    for _ in range(a.repeats):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = fit_symnmf_agents(S, a.rank, device="cpu", **kw)
            got = fit_symnmf_distributed(S, a.rank, world_size=a.nproc, threads=a.threads, **kw)
        one.append(per_iteration(ref.history))
        ranks.append(per_iteration(got.history))
        same.append(all(torch.equal(getattr(ref, k), getattr(got, k)) for k in ("U", "V", "U_agents", "lam")))
        e1, e2 = np.asarray(ref.history["E"], dtype=float), np.asarray(got.history["E"], dtype=float)
        dE.append(float(np.max(np.abs(e1 - e2) / np.abs(e1))))
    ratio = np.asarray(ranks) / np.asarray(one)
    out = {"n": a.n, "agents": a.agents, "rank": a.rank, "iters": a.iters, "x_iters": a.x_iters, "nproc": a.nproc,
           "exchange": a.exchange, "threads": a.threads, "same_bits": all(same), "E_rel_diff_max": max(dE),
           "E_last": float(np.asarray(ref.history["E"]).reshape(-1)[-1]),
           "seconds_per_iteration_one_process": one, "seconds_per_iteration_ranks": ranks,
           "ratio_min": float(ratio.min()), "ratio_max": float(ratio.max())}
    print(f"digits n={a.n}, N={a.agents} agents, r={a.rank}, {a.iters} outer x {a.x_iters} ADMM iterations, "
          f"{a.exchange}, {a.threads} thread(s) per process")
    print(f"  factors and lambda the same bits: {all(same)}; history E, largest relative difference {max(dE):.1e}; "
          f"E after {a.iters}: {out['E_last']:.6f}")
    print(f"  s / outer iteration: one process {min(one):.3f}-{max(one):.3f}, {a.nproc} ranks "
          f"{min(ranks):.3f}-{max(ranks):.3f}; ratio {ratio.min():.2f}-{ratio.max():.2f}")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
