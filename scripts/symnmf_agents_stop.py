#!/usr/bin/env python
"""Where the stop of symmetric NMF across agents would fire, per ``tol``, on the noise-free
``X = W W^T`` (docs/SYMNMF.md, "Across agents", **Stopping**)::

    python scripts/symnmf_agents_stop.py                      # n = 60, r = 3, N = 4, starts 0-7
    python scripts/symnmf_agents_stop.py --normalize          # the same X / ||X||_2

Each start ``s`` draws ``W`` uniform on ``[0, 1]`` from ``torch.manual_seed(s)``'s generator, runs
``fit_symnmf_agents(X, r, n_agents=N, seed=s, start_seed=s, exchange="plain", tol=0, max_iter=...)``
(``--private``: ``start_seed=None``, every agent's ``V_i`` from its own CSPRNG draw, the default
start, not reproducible; ``--exchange``: another kind) and reads
the history: the first outer iteration where both ``stationarity`` and ``consensus`` are
``<= tol`` (the rule), ``E`` there, and whether the residual alone would have stopped earlier.
Prints one line per start and a markdown row per ``tol`` (ranges over the starts).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--rank", type=int, default=3)
    ap.add_argument("--agents", type=int, default=4)
    ap.add_argument("--starts", type=int, default=8)
    ap.add_argument("--max-iter", type=int, default=3000)
    ap.add_argument("--normalize", action="store_true", help="X / ||X||_2")
    ap.add_argument("--tols", type=float, nargs="*", default=[1e-4, 3e-5, 1e-5])
    ap.add_argument("--exchange", default="plain")
    ap.add_argument("--private", action="store_true",
                    help="each agent's V_i from its own CSPRNG draw (the default start; not reproducible)")
    args = ap.parse_args(argv)
    found = {tol: [] for tol in args.tols}
    for s in range(args.starts):
        gen = torch.Generator().manual_seed(s)
        W = torch.rand((args.n, args.rank), generator=gen, dtype=torch.float64)
        X = W @ W.T
        if args.normalize:
            X = X / torch.linalg.matrix_norm(X, ord=2)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = fit_symnmf_agents(X, args.rank, n_agents=args.agents, max_iter=args.max_iter, tol=0.0, seed=s,
                                    start_seed=None if args.private else s, device="cpu", exchange=args.exchange)
        h = {k: np.array(res.history[k]).ravel() for k in ("E", "stationarity", "consensus")}
        line = [f"start {s} ({time.perf_counter() - t0:.1f} s)"]
        for tol in args.tols:
            both = np.nonzero((h["stationarity"] <= tol) & (h["consensus"] <= tol))[0]
            alone = np.nonzero(h["stationarity"] <= tol)[0]
            if not len(both):
                line.append(f"tol {tol:g}: not within {args.max_iter}")
                continue
            k = int(both[0])
            found[tol].append((k + 1, float(h["E"][k])))
            later = "" if int(alone[0]) == k else f" (the residual alone: {int(alone[0]) + 1})"
            line.append(f"tol {tol:g}: {k + 1} E {h['E'][k]:.1e}{later}")
        line.append(f"at {args.max_iter}: E {h['E'][-1]:.1e} R {h['stationarity'][-1]:.1e} "
                    f"consensus {h['consensus'][-1]:.1e}")
        print(" | ".join(line), flush=True)
    case = f"n = {args.n}, r = {args.rank}, N = {args.agents}" + (", X scaled to spectral norm 1" if args.normalize else "")
    print(f"\n| case | tol | outer iterations at the stop | E at the stop |\n|---|---|---|---|")
    for tol, got in found.items():
        if got:
            ks, Es = zip(*got)
            print(f"| {case} ({len(got)} of {args.starts} starts) | {tol:g} | {min(ks)}-{max(ks)} | "
                  f"{min(Es):.1e} to {max(Es):.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
