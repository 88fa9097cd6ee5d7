"""Clustering quality of the private start against the common start: digits, N = 10 agents, plain.

    PYTHONPATH=. OMP_NUM_THREADS=1 python3 scripts/symnmf_start_quality.py N_SAMPLES OUTER_ITERS TRIALS

N_SAMPLES digits drawn with seed 0, Kuang et al.'s kNN similarity, rank 10, the scaled start per
trial (trial t: seed t, its own random graph and partition), the model's defaults otherwise; prints
accuracy, NMI, E and the consensus error per trial for start="common" and start="private".
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))


def main(argv=None) -> int:
    from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents
    from ppdnmf_torch.models.symnmf.clustering import cluster_labels, clustering_accuracy, normalized_mutual_info
    from ppdnmf_torch.models.symnmf.estimator import scaled_start
    from ppdnmf_torch.models.symnmf.datasets import load_digits_samples
    from ppdnmf_torch.models.symnmf.similarity import similarity_matrix

    n, iters, trials = (int(a) for a in (argv if argv is not None else sys.argv[1:]))
    M, y = load_digits_samples()
    sel = np.sort(np.random.default_rng(0).choice(len(y), n, replace=False))
    X = similarity_matrix(M[sel], device="cpu", sparse=False, dtype=torch.float64)
    U0 = scaled_start(X, 10, trials, 0)
    for start in ("common", "private"):
        t = time.perf_counter()
        res = fit_symnmf_agents(X, 10, n_agents=10, U0=U0, trials=trials, seed=0, max_iter=iters, tol=0.0, device="cpu",
                                start=start, start_seed=0, exchange="plain")
        for k in range(trials):
            lab = cluster_labels(res.U[k]).cpu()
            print(f"{start} trial {k}: accuracy {clustering_accuracy(y[sel], lab):.4f} nmi "
                  f"{normalized_mutual_info(y[sel], lab):.4f} E {res.history['E'][-1][k]:.5f} "
                  f"consensus {res.history['consensus'][-1][k]:.1e}", flush=True)
        print(f"{start}: {time.perf_counter() - t:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
