#!/usr/bin/env python
"""Time one checkpoint write against the run's length, for every model (issue 44: a write must
cost the same at iteration 2000 as at 500, within 5x), side by side in one process.

Each model runs a small problem for ``N`` iterations with a checkpoint every ``--every``
iterations (the engine's format: the state, and the history packed incrementally); the driver's
writes (:meth:`ppdnmf_torch.driver.Checkpoints.write`) are timed, and the mean of the last five
writes of each run is reported, with the ratio of the longest run's to the shortest's::

    python scripts/bench_checkpoint.py --lengths 500 2000 --every 50
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch.driver import checkpoints as driver_checkpoints  # noqa: E402
from ppdnmf_torch.graph import ring  # noqa: E402
from ppdnmf_torch.models.fsspca import fit_fsspca  # noqa: E402
from ppdnmf_torch.models.fsspca.serverless import fit_serverless  # noqa: E402
from ppdnmf_torch.models.symnmf import fit_symnmf  # noqa: E402
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents  # noqa: E402


def _similarity(n=30, r=3):
    gen = torch.Generator().manual_seed(0)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    X = W @ W.T
    return X / torch.linalg.matrix_norm(X, ord=2)


def _blocks():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((20, 8)) for _ in range(4)]


MODELS = {
    "ppdnmf": lambda n, d, e: pp.fit(torch.rand(8, 40, generator=torch.Generator().manual_seed(0),
                                                dtype=torch.float64), ring(4), 2, bcd_iters=n, x_iters=1, y_iters=1,
                                     tol=0.0, device="cpu", checkpoint_dir=d, checkpoint_every=e, exchange="plain"),
    "symnmf": lambda n, d, e: fit_symnmf(_similarity(), 3, max_iter=n, tol=0.0, device="cpu", checkpoint_dir=d,
                                         checkpoint_every=e),
    "symnmf_agents": lambda n, d, e: fit_symnmf_agents(_similarity(), 3, n_agents=4, x_iters=1, max_iter=n,
                                                       start_seed=0, tol=0.0, device="cpu", checkpoint_dir=d,
                                                       checkpoint_every=e, exchange="plain"),
    "fsspca": lambda n, d, e: fit_fsspca(_blocks(), 2, alpha=1.0, inner_steps=1, max_iter=n, tol=0.0,
                                         checkpoint_dir=d, checkpoint_every=e, aggregation="plain"),
    "fsspca_serverless": lambda n, d, e: fit_serverless(_blocks(), 2, ring(4), inner_iters=1, inner_steps=1,
                                                        alpha=1.0, max_iter=n, tol=0.0, checkpoint_dir=d,
                                                        checkpoint_every=e, exchange="plain"),
}


def timed_writes(run, n: int, every: int) -> list:
    """The durations of the run's checkpoint writes."""
    times = []
    real = driver_checkpoints.Checkpoints.write

    def write(self, good):
        t0 = time.perf_counter()
        out = real(self, good)
        times.append(time.perf_counter() - t0)
        return out

    driver_checkpoints.Checkpoints.write = write
    try:
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run(n, folder, every)
    finally:
        driver_checkpoints.Checkpoints.write = real
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[500, 2000])
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--only", nargs="*", help="models to time (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    names = args.only or list(MODELS)
    print(f"{'model':18s} " + " ".join(f"{f'N={n}: last write':>18s}" for n in args.lengths) + f" {'ratio':>7s}")
    for name in names:
        means = []
        for n in args.lengths:
            times = timed_writes(MODELS[name], n, args.every)
            means.append(sum(times[-5:]) / len(times[-5:]))
        cells = " ".join(f"{m * 1e3:>15.2f} ms" for m in means)
        print(f"{name:18s} {cells} {means[-1] / means[0]:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
