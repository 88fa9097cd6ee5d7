#!/usr/bin/env python
"""A distributed run against one process: bits, seconds per iteration, bytes per rank.

For each exchange kind it runs ``fit`` in this process and ``fit_rank`` on ``P`` local ranks
(gloo on the CPU; with ``--device cuda`` and a GPU per rank, NCCL), and prints whether
``X``, ``Y``, ``U`` and every history key are the same bits, the seconds per BCD and per
ADMM iteration (from the solver's step timers, rank 0), and per rank the bytes its halo
sent per ADMM iteration with the layout's model of them (``halo_bytes``; for ``paillier`` the
cost model's bytes of the rank's cut edges, ``cut_protocol_bytes``) and, for the tensor kinds,
what the Paillier protocol would send across the cut::

    python scripts/bench_distributed.py --nproc 1 2 --kinds plain quantized
    python scripts/bench_distributed.py --nproc 1 2 --kinds paillier --key-bits 512 --protocol masked
    python scripts/bench_distributed.py --device cuda --nproc 2 --json out.json

On a 2-core machine the times are correctness-scale figures: several ranks share the
cores, so P = 2 measures the halo's overhead, not a speed-up.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch.distributed import Comm, launch_local  # noqa: E402
from ppdnmf_torch.models.ppdnmf.distributed import fit_rank  # noqa: E402
from ppdnmf_torch.distributed.costs import cut_protocol_bytes  # noqa: E402


def problem(n, L, K, m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    M = n * m
    Z = torch.rand(L, K, generator=gen, dtype=torch.float64) @ torch.rand(K, M, generator=gen, dtype=torch.float64)
    return Z + 0.01 * torch.rand(L, M, generator=gen, dtype=torch.float64), pp.graph.random_geometric(n, 0.3, seed=seed)


def fit_kw(a, kind):
    kw = dict(pp.PAPER_SETTINGS, bcd_iters=a.bcd, x_iters=a.x_iters, y_iters=a.y_iters, exchange=kind)
    if kind == "quantized":
        kw["n_max"] = 1e4
    if kind == "paillier":  # real keys on every rank (the protocol's parties split over the ranks)
        kw.update(key_bits=a.key_bits, protocol=a.protocol)
    return kw


def rank_run(a, kind, device):
    with Comm.connect("env://", device=device, timeout=300, heartbeat=60) as comm:
        Z, G = problem(a.n_agents, a.L, a.K, a.m)
        t0 = time.perf_counter()
        r = fit_rank(comm, Z, G, a.K, partition=a.partition, **fit_kw(a, kind))
        wall = time.perf_counter() - t0
        if r.result is None:
            return None
        res = r.result
        return {"X": res.X.cpu(), "Y": [y.cpu() for y in res.Y], "U": res.U.cpu(), "history": res.history,
                "wall": wall, "ranks": r.ranks, "partition": r.partition, "backend": comm.backend}


def same(out, ref):
    keys = [k for k in ref.history if "time" not in k and "seconds" not in k]
    return (torch.equal(out["X"], ref.X.cpu()) and torch.equal(out["U"], ref.U.cpu())
            and all(torch.equal(x, y.cpu()) for x, y in zip(out["Y"], ref.Y))
            and all(out["history"][k] == ref.history[k] for k in keys))


def per_iteration(history, a):
    """Seconds per BCD iteration (both steps) and per X-step ADMM iteration, the first BCD
    iteration left out (its allocations and first calls)."""
    tx, ty = history["time_x"][1:] or history["time_x"], history["time_y"][1:] or history["time_y"]
    return (sum(tx) + sum(ty)) / len(tx), sum(tx) / (len(tx) * a.x_iters)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    p.add_argument("--kinds", nargs="+", default=["plain", "quantized"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--n-agents", type=int, default=40)
    p.add_argument("--L", type=int, default=30)
    p.add_argument("--K", type=int, default=5)
    p.add_argument("--m", type=int, default=20, help="columns per agent")
    p.add_argument("--bcd", type=int, default=5, help="BCD iterations (timed from the second on)")
    p.add_argument("--x-iters", type=int, default=10)
    p.add_argument("--y-iters", type=int, default=10)
    p.add_argument("--partition", default="rcm")
    p.add_argument("--key-bits", type=int, default=128, help="Paillier key size (kind paillier)")
    p.add_argument("--protocol", default="masked", help="Paillier protocol (kind paillier)")
    p.add_argument("--json")
    a = p.parse_args()
    Z, G = problem(a.n_agents, a.L, a.K, a.m)
    print(f"N = {a.n_agents} agents ({G.n_edges} edges, random geometric, radius 0.3), L = {a.L}, K = {a.K}, "
          f"{a.m} columns each; {a.bcd} BCD iterations of {a.x_iters} + {a.y_iters}; device {a.device}; "
          f"{os.cpu_count()} CPUs")
    report = []
    pp.fit(Z, G, a.K, device=a.device, bcd_iters=1, x_iters=1, y_iters=1)  # warm-up
    for kind in a.kinds:
        t0 = time.perf_counter()
        ref = pp.fit(Z, G, a.K, device=a.device, **fit_kw(a, kind))
        wall = time.perf_counter() - t0
        bcd_s, admm_s = per_iteration(ref.history, a)
        print(f"\n{kind}: one process: {bcd_s * 1e3:.1f} ms per BCD iteration, X-step {admm_s * 1e3:.2f} ms per "
              f"ADMM iteration, fit {wall:.2f} s")
        report.append({"kind": kind, "P": 0, "bcd_ms": bcd_s * 1e3, "admm_ms": admm_s * 1e3, "wall_s": wall})
        for P in a.nproc:
            dev = "cuda" if a.device == "cuda" else "cpu"
            outs = launch_local(P, rank_run, (a, kind, dev), timeout=600)
            bad = [o for o in outs if o.exitcode != 0]
            if bad:
                print(f"  P = {P}: failed: {[o.error for o in bad]}")
                continue
            out = outs[0].value
            bcd_s, admm_s = per_iteration(out["history"], a)
            part = out["partition"]
            print(f"  P = {P} ({out['backend']}): bits {'identical' if same(out, ref) else 'DIFFER'}; "
                  f"{bcd_s * 1e3:.1f} ms per BCD iteration, X-step {admm_s * 1e3:.2f} ms per ADMM iteration, "
                  f"fit {out['wall']:.2f} s; cut {part.cut_edges} of {G.n_edges} edges")
            rows = []
            for r in out["ranks"]:
                n = max(1, r["admm_iterations"])
                model = r["model_per_admm_iteration"]
                sent = {k: r["sent"].get(k, 0) / n for k in model}
                paillier = cut_protocol_bytes(part, G, r["rank"], protocol="aggregated", key_bits=2048,
                                              lk=a.L * a.K, slots=32)
                parts = ", ".join(f"{k} {sent[k]:.0f} B (model {model[k]})" for k in model)
                extra = ("" if kind == "paillier" else
                         f"; Paillier (2048-bit, packed, aggregated) across the cut would be {paillier} B")
                print(f"    rank {r['rank']}: {r['agents']} agents ({r['slots']} slots), {r['ghosts']} ghosts; per "
                      f"ADMM iteration sent {parts}{extra}; metrics {r['sent'].get('metrics', 0)} B, setup "
                      f"{r['sent'].get('setup', 0)} B in all")
                rows.append(dict(r, sent_per_admm=sent, paillier_cut_bytes=paillier))
            report.append({"kind": kind, "P": P, "same_bits": same(out, ref), "bcd_ms": bcd_s * 1e3,
                           "admm_ms": admm_s * 1e3, "wall_s": out["wall"], "cut_edges": part.cut_edges, "ranks": rows})
    if a.json:
        with open(a.json, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)


if __name__ == "__main__":
    main()
