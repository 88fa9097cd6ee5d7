"""The memory budget's estimates against measured peaks (ppdnmf_torch.budget).

Each case runs in a fresh process: its resident memory after the imports is the baseline,
the kernel's peak (``ru_maxrss``) after the run the high-water mark; the table gives the
estimate, the measured increase and their ratio (estimate / measured: above 1 the estimate
is cautious; the budget refuses only when the estimate exceeds all available memory).

    python scripts/measure_memory.py            # every case (a few minutes on 2 cores)
    python scripts/measure_memory.py --quick    # the three smallest
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

#: name -> (model, keyword arguments of the case)
CASES = {
    "ppdnmf 1 trial, 10 agents, 30x200, rank 5": ("ppdnmf", dict(trials=1, n_agents=10, L=30, M=200, rank=5)),
    "ppdnmf 500 trials, 10 agents, 30x200, rank 5": ("ppdnmf", dict(trials=500, n_agents=10, L=30, M=200, rank=5)),
    "ppdnmf 1 trial, 500 agents, 100x5000, rank 10": ("ppdnmf", dict(trials=1, n_agents=500, L=100, M=5000,
                                                                     rank=10)),
    "ppdnmf 4 trials, 20 agents, 361x2429, rank 49": ("ppdnmf", dict(trials=4, n_agents=20, L=361, M=2429,
                                                                     rank=49)),
    "symnmf n=1500 dense, rank 10, 8 trials": ("symnmf", dict(n=1500, rank=10, trials=8)),
    "symnmf n=4000 dense, rank 20, 1 trial": ("symnmf", dict(n=4000, rank=20, trials=1)),
    "fsspca 20000x300, 8 workers, 3 components, 4 trials": ("fsspca", dict(n=20000, d=300, workers=8, r=3,
                                                                           trials=4)),
    "fsspca 2000x1000, 4 workers, 2 components, 1 trial": ("fsspca", dict(n=2000, d=1000, workers=4, r=2,
                                                                          trials=1)),
}
QUICK = ("ppdnmf 1 trial, 10 agents, 30x200, rank 5", "symnmf n=1500 dense, rank 10, 8 trials",
         "fsspca 20000x300, 8 workers, 3 components, 4 trials")

_CHILD = r'''
import json, os, resource, sys, warnings
warnings.simplefilter("ignore")
import torch
import ppdnmf_torch as pp
from ppdnmf_torch import budget
from ppdnmf_torch.models import symnmf, fsspca
model, kw = sys.argv[1], json.loads(sys.argv[2])
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
torch.set_num_threads(1)
base = rss()
if model == "ppdnmf":
    bcd, x, T, N = 5, 30, kw["trials"], kw["n_agents"]
    est = budget.ppdnmf(trials=T, n_agents=N, L=kw["L"], M=kw["M"], rank=kw["rank"], M_max=-(-kw["M"] // N),
                        bcd_iters=bcd, x_iters=x, edges=6 * N)
    blocks = [pp.data.split_columns(pp.data.synthetic(L=kw["L"], M=kw["M"], K=kw["rank"], seed=t).Z,
                                    pp.data.split_counts(kw["M"], N)) for t in range(T)]
    graphs = [pp.graph.random_connected(N, 3.0, seed=t) for t in range(T)]
    pp.fit_trials(blocks, graphs, kw["rank"], seeds=list(range(T)), bcd_iters=bcd, x_iters=x, y_iters=x, tol=0.0,
                  device="cpu", negative="allow")
elif model == "symnmf":
    est = budget.symnmf(n=kw["n"], rank=kw["rank"], trials=kw["trials"], max_iter=20, similarity_copies=5)
    X = symnmf.synthetic_similarity(kw["n"], kw["rank"], 0.1)[0][0]
    symnmf.fit_symnmf(X, kw["rank"], trials=kw["trials"], max_iter=20, tol=0.0, device="cpu")
else:
    import numpy as np
    est = budget.fsspca(n=kw["n"], d=kw["d"], n_workers=kw["workers"], n_components=kw["r"], trials=kw["trials"],
                        max_iter=30, data_copies=4)
    X = np.random.default_rng(0).standard_normal((kw["n"], kw["d"]))
    fsspca.fit_fsspca(X, kw["r"], groups=np.arange(kw["n"]) % kw["workers"], trials=kw["trials"], max_iter=30,
                      alpha=0.1, device="cpu")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"estimate": est.bytes, "measured": peak - base}))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    print(f"{'case':55s} {'estimate':>10s} {'measured':>10s} {'ratio':>6s}")
    for name, (model, kw) in CASES.items():
        if args.quick and name not in QUICK:
            continue
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", _CHILD, model, json.dumps(kw)], capture_output=True, text=True,
                           env=env, cwd=ROOT)
        if r.returncode:
            print(f"{name:55s} failed: {r.stderr.strip().splitlines()[-1]}")
            continue
        out = json.loads(r.stdout.strip().splitlines()[-1])
        est, got = out["estimate"] / 2**20, out["measured"] / 2**20
        print(f"{name:55s} {est:8.1f} MiB {got:8.1f} MiB {est / max(got, 1e-9):6.2f}   ({time.perf_counter() - t0:.0f} s)",
              flush=True)


if __name__ == "__main__":
    main()
