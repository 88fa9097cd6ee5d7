#!/usr/bin/env python
"""Benchmark exchange="secagg" against plain, quantized and paillier, side by side in one run.

    python scripts/bench_secagg.py [--sizes paper cbcl] [--rounds 30] [--repeats 3] [--paillier-rounds 2]
                                   [--no-paillier] [--fit-bcd 3] [--no-trial] [--json out.json]

Measures, in one process, on the paper-synthetic graph (``make_trial(PAPER_EXPERIMENTS["paper_synthetic"],
0)``: N = 10 agents, 15 edges) with the agreed schedule's equal penalties:

1. **The exchange per ADMM iteration** (step 1 and step 5, ``penalty_sums`` then ``exchange`` on the
   same ``U`` and ``g``), at the paper's synthetic size (``L K = 30 x 5 = 150``) and at CBCL's
   (``L K = 361 x 49 = 17,689``). The kinds run interleaved round by round on the same inputs, after
   one warm-up round each; every secagg round is checked bit for bit against quantized's. Seconds per
   round (median and range over ``--rounds`` rounds, in ``--repeats`` blocks) and, per round, the
   ratio secagg / quantized (median and range), and the ratio of the two kinds' fastest rounds (on a
   shared machine the least disturbed, the closest to the work itself). ``paillier``: the masked protocol with DJN
   obfuscators and 2048-bit keys (made once, 10 key pairs, before the timing; the defaults' worker
   pool), timed for ``--paillier-rounds`` rounds at the paper's size; at CBCL's size it is timed at
   two small message lengths (``32 x 5`` and ``32 x 20`` values: 5 and 20 ciphertexts per
   message) and **extrapolated** linearly in the ciphertexts per message to CBCL's 553 (marked
   ``*``): a round's cost is a fixed part plus a part per ciphertext block of every message.
2. **The solver's ADMM iteration** under each kind except paillier: ``fit`` on data of the size
   (paper: the trial's data; CBCL: a random nonnegative ``361 x 2429`` matrix of rank 49, columns split
   224-245, ``mu = eta = 2``, ``g_max = 0.05``), ``--fit-bcd`` BCD iterations of 30 ADMM and 30 Y
   iterations, ``tol = 0``: the X-steps' seconds (``history["time_x"]``) per ADMM iteration, and
   the ratio to quantized in the same run. ``X`` and ``Y`` of secagg are checked against quantized's.
3. **The full paper-synthetic trial end to end** (``run_experiment("paper_synthetic", exchange=...,
   penalty_schedule="agreed", centralized=False)``: the paper's 100 BCD x 30 ADMM iterations under
   the library's default, agreed, schedule; the preset's own ``paper`` schedule gives each edge its
   weight, which secagg refuses) for plain, quantized and secagg, wall seconds, and the bits of
   secagg against quantized.

4. **The adversary across calls** (``--privacy-seeds K``): paper-synthetic trials ``0 .. K - 1`` under
   secagg with fit's defaults (agreed schedule, ``tol = 1e-4``, up to 1000 BCD iterations: the
   stop agreed network-wide), recorded, and :func:`~ppdnmf_torch.audit.across_calls.difference_attack`
   on the receivers' sums: how many neighbour increments a receiver reads exactly.
5. **The other models end to end** (``--models ORL_PATH``): symmetric NMF across 10 agents on ORL
   (rank 40) and on scikit-learn's digits (rank 10), 100 outer x 10 ADMM iterations
   (``scripts/studies/symnmf.agents_run``), and FSSPCA serverless on digits (10 workers on a ring,
   3 components, ``alpha = 5``, 100 ADMM iterations, ``tol = 0``), each under plain, quantized and
   secagg: wall seconds, and the clustering accuracy of each symmetric run.

Read the ratios, not the absolute seconds: the machine is shared; the load (``os.getloadavg``)
is printed before and after. Torch runs one thread by default (``--threads``): on a loaded 2-core
machine two threads per operation measured mostly their contention.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {"paper": (30, 5), "cbcl": (361, 49)}
KINDS = ("plain", "quantized", "secagg")


def _load() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _graph():
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial

    return make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 0)


def _bound(kind, topo, **kw):
    from ppdnmf_torch.exchange import make_exchange

    t0 = time.perf_counter()
    ex = make_exchange(kind, **kw)
    ex.bind(topo, dtype=torch.float64, device=torch.device("cpu"))
    return ex, time.perf_counter() - t0


def _round(ex, U, g, m):
    t0 = time.perf_counter()
    ex.penalty_sums(g, bcd_iter=1, admm_iter=m)
    out = ex.exchange(U, g, bcd_iter=1, admm_iter=m)
    return time.perf_counter() - t0, out


def _stats(xs) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def exchange_rounds(size: str, rounds: int, repeats: int, seed: int = 0) -> dict:
    """Section 1 for plain, quantized and secagg: seconds per round and the per-round ratios."""
    from ppdnmf_torch.graph.topology import Topology

    L, K = SIZES[size]
    _, graph = _graph()
    topo = Topology.from_graphs([graph])
    gen = torch.Generator().manual_seed(seed)
    out = {"size": size, "lk": L * K, "kinds": {}}
    times = {k: [] for k in KINDS}
    ratios = []
    setup = {}
    for rep in range(repeats):
        exs = {}
        for k in KINDS:
            exs[k], s = _bound(k, topo)
            setup.setdefault(k, []).append(s)
        g = torch.zeros(topo.n_directed_edges, dtype=torch.float64)
        for m in range(rounds + 1):
            g = g + (0.033 - g) * float(torch.rand((), generator=gen))  # one common draw: agreed
            U = torch.rand((topo.n_nodes, L * K), generator=gen, dtype=torch.float64)
            res = {k: _round(exs[k], U, g, m + 1) for k in KINDS}
            if not (torch.equal(res["secagg"][1].S, res["quantized"][1].S)
                    and torch.equal(res["secagg"][1].rho, res["quantized"][1].rho)):
                raise AssertionError(f"{size}: secagg differs from quantized at round {m + 1}")
            if m == 0:
                continue  # warm-up
            for k in KINDS:
                times[k].append(res[k][0])
            ratios.append(res["secagg"][0] / res["quantized"][0])
        out["secagg_costs"] = {k: v for k, v in exs["secagg"].costs().items()}
        for ex in exs.values():
            ex.close()
    for k in KINDS:
        out["kinds"][k] = dict(_stats(times[k]), setup_s=_stats(setup[k]))
    out["secagg_over_quantized"] = _stats(ratios)
    # the least-disturbed rounds: on a shared machine the minimum is the closest to the work itself
    out["secagg_over_quantized_min"] = min(times["secagg"]) / min(times["quantized"])
    return out


def _paillier_seconds(topo, keys, lk: int, rounds: int, seed: int) -> tuple:
    """(seconds per round (list), setup seconds) of paillier masked + DJN at ``lk`` values per message."""
    gen = torch.Generator().manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex, setup = _bound("paillier", topo, protocol="masked", key_bits=2048, djn=True, keypairs=list(keys))
        q, _ = _bound("quantized", topo)
    g = torch.full((topo.n_directed_edges,), 0.02, dtype=torch.float64)
    out = []
    try:
        for m in range(rounds):
            U = torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
            dt, res = _round(ex, U, g, m + 1)
            _, ref = _round(q, U, g, m + 1)
            if not torch.equal(res.S, ref.S):
                raise AssertionError("paillier differs from quantized")
            out.append(dt)
    finally:
        ex.close()
    return out, setup


def paillier_rounds(rounds: int, sizes, seed: int = 0) -> dict:
    """Section 1's paillier row(s): masked protocol, DJN, 2048-bit keys (module docstring)."""
    from ppdnmf_torch.exchange.paillier import generate_keypairs
    from ppdnmf_torch.exchange.packing import derive_layout
    from ppdnmf_torch.exchange.codec import IntegerCodec
    from ppdnmf_torch.graph.topology import Topology

    _, graph = _graph()
    topo = Topology.from_graphs([graph])
    t0 = time.perf_counter()
    keys = generate_keypairs(2048, topo.n_nodes)
    out = {"keygen_s": time.perf_counter() - t0}
    slots = derive_layout(IntegerCodec(key_bits=2048)).slots
    if "paper" in sizes:
        ts, setup = _paillier_seconds(topo, keys, 150, rounds, seed)
        out["paper"] = dict(_stats(ts), setup_s=setup, extrapolated=False)
    if "cbcl" in sizes:
        small = {}
        for blocks in (5, 20):
            ts, setup = _paillier_seconds(topo, keys, slots * blocks, rounds, seed)
            small[blocks] = statistics.median(ts)
        C = -(-SIZES["cbcl"][0] * SIZES["cbcl"][1] // slots)
        per_block = (small[20] - small[5]) / 15
        est = small[5] + per_block * (C - 5)
        out["cbcl"] = {"median": est, "extrapolated": True, "measured": {f"{b} blocks": v for b, v in small.items()},
                       "ciphertexts_per_message": C}
    return out


def _cbcl_like(seed=0):
    gen = torch.Generator().manual_seed(seed)
    L, K, M = 361, 49, 2429
    Z = torch.rand((L, K), generator=gen, dtype=torch.float64) @ torch.rand((K, M), generator=gen,
                                                                             dtype=torch.float64)
    Z = Z / Z.max()
    counts = [224 + int(v) for v in torch.randint(0, 22, (10,), generator=gen)]
    counts[-1] += M - sum(counts)
    return list(torch.split(Z, counts, dim=1))


def fit_iterations(size: str, bcd: int) -> dict:
    """Section 2: X-step seconds per ADMM iteration under plain, quantized and secagg."""
    import ppdnmf_torch as pp

    blocks, graph = _graph()
    kw = dict(rank=5, mu=0.1, eta=1.0, g_max=0.033)
    if size == "cbcl":
        blocks = _cbcl_like()
        kw = dict(rank=49, mu=2.0, eta=2.0, g_max=0.05)
    out = {}
    res = {}
    for kind in KINDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            r = pp.fit(blocks, graph, kw["rank"], mu=kw["mu"], eta=kw["eta"], g_max=kw["g_max"], bcd_iters=bcd,
                       x_iters=30, y_iters=30, tol=0.0, exchange=kind, device="cpu", negative="allow")
        res[kind] = r
        x = sum(r.history["time_x"])
        out[kind] = {"x_seconds_per_admm_iteration": x / (30 * bcd), "fit_s": time.perf_counter() - t0}
    same = torch.equal(res["secagg"].X, res["quantized"].X) and all(
        torch.equal(a, b) for a, b in zip(res["secagg"].Y, res["quantized"].Y))
    if not same:
        raise AssertionError(f"{size}: secagg's fit differs from quantized's")
    out["secagg_over_quantized"] = (out["secagg"]["x_seconds_per_admm_iteration"]
                                    / out["quantized"]["x_seconds_per_admm_iteration"])
    return out


def full_trial() -> dict:
    """Section 3: the paper-synthetic trial end to end under the agreed schedule."""
    from ppdnmf_torch.models.ppdnmf.experiments import run_experiment

    out, res = {}, {}
    for kind in KINDS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            r = run_experiment("paper_synthetic", exchange=kind, penalty_schedule="agreed", centralized=False,
                               device="cpu")
        res[kind] = r
        out[kind] = {"seconds": time.perf_counter() - t0, "nmse": float(r.history["nmse"][-1][0])}
    a, b = res["secagg"].distributed, res["quantized"].distributed
    out["secagg_equals_quantized"] = bool(torch.equal(a.X, b.X) and torch.equal(a.Y, b.Y))
    out["secagg_costs"] = {k: v for k, v in a.costs.items() if isinstance(v, (int, float))}
    return out


def across_calls(seeds) -> dict:
    """Section 4: the adversary across calls on paper-synthetic trials under secagg with fit's defaults."""
    from ppdnmf_torch.audit.across_calls import difference_attack
    from ppdnmf_torch.models.ppdnmf.audit import record_fit
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial

    out = {}
    for seed in seeds:
        blocks, graph = make_trial(PAPER_EXPERIMENTS["paper_synthetic"], seed)
        t0 = time.perf_counter()
        rec = record_fit(blocks, graph, 5, kind="secagg", transcript=False, mu=0.1, eta=1.0, g_max=0.033,
                         x_iters=30, y_iters=30, seed=seed, negative="allow")
        sm = difference_attack(rec)["summary"]
        out[seed] = {"seconds": time.perf_counter() - t0, "calls": rec.n_calls, "degrees": graph.degree.tolist(),
                     "nmse": rec.nmse, **sm}
    return out


def models_end_to_end(orl_path) -> dict:
    """Section 5: symmetric NMF across agents (ORL, digits) and FSSPCA serverless (digits), per kind."""
    import numpy as np
    from sklearn.datasets import load_digits

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from studies import symnmf as ex

    from ppdnmf_torch.graph import ring
    from ppdnmf_torch.models.fsspca.serverless import fit_serverless
    from ppdnmf_torch.models.symnmf.data import load_orl
    from ppdnmf_torch.models.symnmf.datasets import load_digits_samples

    kinds = ("plain", "quantized", "secagg")
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (M, y), r in (("symnmf ORL", load_orl(orl_path), 40), ("symnmf digits", load_digits_samples(), 10)):
            res = ex.agents_run(M, y, r, n_agents=(10,), kinds=kinds, iters=100, x_iters=10)
            out[name] = {k: {"seconds": res[(10, k)]["seconds"], "accuracy": res[(10, k)]["accuracy"]} for k in kinds}
        X = load_digits().data.astype(np.float64)
        X /= X.max()
        blocks = np.array_split(X[np.random.default_rng(0).permutation(len(X))], 10)
        out["fsspca serverless digits"] = {}
        for k in kinds:
            t0 = time.perf_counter()
            fit_serverless(blocks, 3, ring(10), exchange=k, alpha=5.0, max_iter=100, tol=0.0, seed=0)
            out["fsspca serverless digits"][k] = {"seconds": time.perf_counter() - t0}
    return out


def _fmt(s: dict) -> str:
    return f"{s['median']:.3g} ({s['min']:.3g}-{s['max']:.3g})"


def _ms(v) -> str:
    return f"{v * 1e3:.3g} ms"


def _tables(report: dict, args) -> tuple[list, list]:
    """The report as flat rows (one per measured quantity, a column per kind) for docs blocks."""
    rows = []
    for size in args.sizes:
        kinds = report["exchange"][size]["kinds"]
        row = {"quantity": f"exchange per ADMM iteration, {size} size",
               **{k: _ms(kinds[k]["median"]) for k in ("plain", "quantized", "secagg")}, "paillier": ""}
        if "paillier" in report:
            v = report["paillier"][size]
            row["paillier"] = f"{v['median']:.3g} s" + (" (extrapolated)" if v["extrapolated"] else "")
        rows.append(row)
    for size, f in report["fit"].items():
        rows.append({"quantity": f"X-step per ADMM iteration, {size} size", "paillier": "",
                     **{k: _ms(f[k]["x_seconds_per_admm_iteration"]) for k in ("plain", "quantized", "secagg")}})
    if "trial" in report:
        t = report["trial"]
        rows.append({"quantity": "full paper-synthetic trial (agreed schedule)", "paillier": "",
                     **{k: f"{t[k]['seconds']:.1f} s" for k in ("plain", "quantized", "secagg")}})
    models = [{"run": name, **{k: f"{v['seconds']:.1f} s" for k, v in per.items()}}
              for name, per in report.get("models", {}).items()]
    return rows, models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", choices=tuple(SIZES), default=list(SIZES))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paillier-rounds", type=int, default=2)
    ap.add_argument("--no-paillier", action="store_true")
    ap.add_argument("--fit-bcd", type=int, default=3, help="BCD iterations of section 2's fits (0: skip)")
    ap.add_argument("--no-trial", action="store_true", help="skip section 3")
    ap.add_argument("--privacy-seeds", type=int, default=0,
                    help="section 4 on this many paper-synthetic trials (seeds 0, 1, ...; each a full run)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a shared 2-core machine two threads per op time noise)")
    ap.add_argument("--models", metavar="ORL_PATH", default=None,
                    help="section 5: the other models end to end (the ORL faces' .mat file)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    report = {"load_before": _load(), "torch_threads": torch.get_num_threads(), "exchange": {}, "fit": {}}
    print(report["load_before"], f"torch threads {report['torch_threads']}", flush=True)
    for size in args.sizes:
        report["exchange"][size] = r = exchange_rounds(size, args.rounds, args.repeats)
        print(f"\n[{size}, L K = {r['lk']}] seconds per ADMM iteration (step 1 + step 5), median (range) over "
              f"{r['kinds']['plain']['n']} rounds:", flush=True)
        for k, v in r["kinds"].items():
            print(f"  {k:10s} {_fmt(v)}   setup {v['setup_s']['median']:.3g} s")
        print(f"  secagg / quantized per round: {_fmt(r['secagg_over_quantized'])}; of the fastest rounds: "
              f"{r['secagg_over_quantized_min']:.3g}", flush=True)
    if not args.no_paillier:
        report["paillier"] = p = paillier_rounds(args.paillier_rounds, args.sizes)
        print(f"\npaillier (masked, DJN, 2048-bit keys; 10 key pairs in {p['keygen_s']:.1f} s):")
        for size in args.sizes:
            v = p[size]
            star = "*" if v["extrapolated"] else ""
            q = report["exchange"][size]["kinds"]["quantized"]["median"]
            print(f"  {size:6s} {v['median']:.3g} s per ADMM iteration{star} ({v['median'] / q:.3g} x quantized)"
                  + (f", from {v['measured']} at {v['ciphertexts_per_message']} ciphertexts per message"
                     if v["extrapolated"] else f" ({v['n']} rounds, range {v['min']:.3g}-{v['max']:.3g})"))
    if args.fit_bcd > 0:
        for size in args.sizes:
            report["fit"][size] = f = fit_iterations(size, args.fit_bcd)
            print(f"\n[{size}] fit, {args.fit_bcd} BCD x 30 ADMM iterations: X-step seconds per ADMM iteration "
                  + ", ".join(f"{k} {f[k]['x_seconds_per_admm_iteration']:.3g}" for k in KINDS)
                  + f"; secagg / quantized {f['secagg_over_quantized']:.3g}", flush=True)
    if not args.no_trial:
        report["trial"] = t = full_trial()
        print("\nfull paper-synthetic trial (100 BCD x 30 ADMM, agreed schedule), seconds: "
              + ", ".join(f"{k} {t[k]['seconds']:.1f}" for k in KINDS)
              + f"; secagg bits == quantized bits: {t['secagg_equals_quantized']}", flush=True)
    if args.privacy_seeds > 0:
        report["across_calls"] = a = across_calls(range(args.privacy_seeds))
        print("\nthe adversary across calls, paper-synthetic under secagg with fit's defaults (tol=1e-4, agreed):")
        for seed, v in a.items():
            d1 = v["degree1"]
            print(f"  seed {seed}: {v['calls']} calls, {v['seconds']:.0f} s; receivers of degree >= 2: {v['exact']} of "
                  f"{v['increments']} neighbour increments read exactly ({v['isolated']} isolated), "
                  f"{v['pairs_with_exact']} of {v['pairs']} pairs, {v['receivers_with_exact']} receivers; degree 1 "
                  f"(inherent): {d1['exact']} of {d1['increments']}", flush=True)
    if args.models:
        report["models"] = m = models_end_to_end(args.models)
        print("\nthe other models end to end (seconds per run):")
        for name, per in m.items():
            print(f"  {name}: " + ", ".join(f"{k} {v['seconds']:.1f} s" + (f" (accuracy {v['accuracy']:.3f})"
                                                                          if "accuracy" in v else "")
                                            for k, v in per.items()), flush=True)
    report["table"], report["models_table"] = _tables(report, args)
    report["load_after"] = _load()
    print("\n" + report["load_after"])
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
