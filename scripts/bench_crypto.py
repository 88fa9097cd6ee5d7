#!/usr/bin/env python
"""Benchmark the Paillier host stage: the naive per-value path against each fast path.

    python scripts/bench_crypto.py [--bits 128 1024 2048] [--protocols aggregated masked] [--configs ...]
                                   [--json out.json]

Measures, in one run and with the same keys for every configuration,

* **seconds per ADMM iteration** of the secure exchange (step 1's penalty mini-round plus
  step 5's exchange) on the paper-synthetic graph: ``N = 10`` agents, 15 edges (30
  directed), ``L K = 150`` values per message;
* **values securely exchanged per second over one directed edge**: two agents, one
  edge, ``L K = 150``; ``2 x 150`` values per iteration over the two directed edges.

Configurations (``exchange_options`` of ``exchange="paillier"``):

==========  ===================================================================
naive       ``fast=False``: one phe ``raw_encrypt`` per value, serial (the baseline)
raw         ``fast=True`` with every switch off: raw ``mpz`` arithmetic only
packing     slot packing alone (32 values per plaintext at 2048 bits)
crt         ``precompute`` alone, in-process: the owner's CRT obfuscators
djn         DJN short-exponent obfuscators alone (fixed-base table)
pool        the worker pool alone (``os.cpu_count()`` processes), no stock
default     the defaults: packing + precompute (stock refilled by the pool) + pool
all         the defaults + ``djn=True``
==========  ===================================================================

Every protocol of ``--protocols`` (default ``aggregated`` and ``masked``) is measured for every
configuration in turn, with the same keys, side by side in one run; a ``masked`` row also
reports its setup (the seed agreement, in ``bind``: ``setup_s``, ``setup_encryptions``), apart
from the seconds per iteration. Every iteration of every configuration is checked against
``exchange="quantized"``: ``S`` and ``rho`` must be bit-identical.

Unpacked configurations at 1024 and 2048 bits cost seconds to minutes per iteration at
``L K = 150`` (the naive path about a minute at 2048 bits on 2 cores). To keep the
default run within a few minutes they are measured with a small ``L K`` (``--small-lk``)
and extrapolated per value: the exchange round's time is scaled by ``150 / small_lk``
(every operation of an unpacked round is per value), the penalty round is measured as
is. Extrapolated entries are marked ``*``. Packed configurations are always measured at
``L K = 150``.

The summary extrapolates one full paper-synthetic trial (100 BCD x 30 ADMM = 3,000 ADMM
iterations) at the largest key size, for ``default`` and ``all``, from the measured
seconds per iteration (plus key generation for the 10 agents), and the speedup of the
Paillier stage over the naive path. It then runs a real paper-synthetic fit end to end
(trial 0's data, column split and graph; ``--fit-bcd`` BCD iterations of 30 ADMM
iterations, fresh keys, ``--fit-configs``, default ``all``), checks ``X`` and ``Y`` bit for
bit against ``exchange="quantized"``, extrapolates its seconds per ADMM iteration to
the 3,000 of a full trial, and shows beside its wall time the estimate the CLI prints
before such a run (:func:`ppdnmf_torch.app.costs.paillier_estimate`, the cost model's one
figure; ``scripts/bench_estimate.py`` sets the two side by side at several key sizes).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
import warnings

import torch

# run from a checkout without installing, as bench_solver.py does
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = {
    "naive": dict(fast=False),
    "raw": dict(packing=False, precompute=False, djn=False, workers=0),
    "packing": dict(packing=True, precompute=False, djn=False, workers=0),
    "crt": dict(packing=False, precompute=True, djn=False, workers=0),
    "djn": dict(packing=False, precompute=False, djn=True, workers=0),
    "pool": dict(packing=False, precompute=False, djn=False, workers=None),
    "default": dict(packing=True, precompute=True, djn=False, workers=None),
    "all": dict(packing=True, precompute=True, djn=True, workers=None),
}
PACKED = {"packing", "default", "all"}
LK = 150
TRIAL_ITERS = 3000  # 100 BCD x 30 ADMM iterations (the paper's setting)


def _topology(graph):
    from ppdnmf_torch.exchange.base import Topology

    return Topology.from_graphs([graph])


def _keys(bits, count):
    from ppdnmf_torch.exchange.paillier import generate_keypairs

    t0 = time.perf_counter()
    out = generate_keypairs(bits, count)
    return out, time.perf_counter() - t0


def _measure(topo, keys, bits, opts, *, protocol, lk, iters, max_seconds, seed=0):
    """Time ``iters`` iterations after one warm-up: returns per-iteration (penalty, exchange) seconds."""
    from ppdnmf_torch.exchange import IntegerCodec, QuantizedExchange
    from ppdnmf_torch.exchange.paillier import PaillierExchange

    codec = IntegerCodec(n_max=1e6, g_bits=16, key_bits=bits)
    workers = opts.get("workers", 0)
    opts = dict(opts, workers=os.cpu_count() if workers is None else workers) if "workers" in opts else opts
    ex = PaillierExchange(codec, protocol=protocol, keypairs=keys[:topo.n_nodes], **opts)
    setup = {}
    ref = QuantizedExchange(codec, protocol=protocol)
    cpu = torch.device("cpu")
    t0 = time.perf_counter()
    ex.bind(topo, dtype=torch.float64, device=cpu)
    t_bind = time.perf_counter() - t0
    ref.bind(topo, dtype=torch.float64, device=cpu)
    c0 = ex.costs()
    if protocol == "masked":
        setup = {"setup_s": c0["time_setup"], "setup_encryptions": c0["setup_encryptions"],
                 "setup_bytes": c0["setup_ciphertext_bytes"]}
    gen = torch.Generator().manual_seed(seed)
    D = topo.n_directed_edges
    g = torch.zeros(D, dtype=torch.float64)
    pen, exc = [], []
    enc = {"penalty": 0, "exchange": 0}  # encryptions of each round, apart: only the exchange's scale with LK
    identical = True
    start = time.perf_counter()
    for m in range(iters + 1):
        g = g + (0.033 - g) * torch.rand(D, generator=gen, dtype=torch.float64)  # the paper's caps
        U = torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
        e0 = ex.costs()["encryptions"]
        t0 = time.perf_counter()
        rho = ex.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
        t1 = time.perf_counter()
        e1 = ex.costs()["encryptions"]
        out = ex.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
        t2 = time.perf_counter()
        e2 = ex.costs()["encryptions"]
        enc["penalty"] += e1 - e0
        enc["exchange"] += e2 - e1
        want = ref.exchange(U, g)
        identical &= torch.equal(out.S, want.S) and torch.equal(out.rho, want.rho) and torch.equal(rho, want.rho)
        if m > 0:  # the first iteration warms up (stock fill, DJN tables)
            pen.append(t1 - t0)
            exc.append(t2 - t1)
            if time.perf_counter() - start > max_seconds:
                break
    costs = ex.costs()
    ex.close()
    if not identical:
        raise SystemExit(f"bench_crypto: {opts} gave different bits from exchange='quantized'")
    n = len(pen)
    return {"penalty_s": sum(pen) / n, "exchange_s": sum(exc) / n, "iters": n, "bind_s": t_bind, **setup,
            "penalty_encryptions_per_iter": enc["penalty"] / (n + 1),
            "exchange_encryptions_per_iter": enc["exchange"] / (n + 1),
            "decryptions_per_iter": costs["decryptions"] / (n + 1),
            "slots": (ex.layout.slots if ex.layout is not None else 1)}


def _row(bits, name, where, protocol, topo, keys, small_lk, iters, max_seconds):
    """One measurement: ``name``'s switches, ``protocol``, on ``topo``; extrapolated where unpacked."""
    extrap = bits >= 1024 and name not in PACKED
    lk = small_lk.get(bits, 8) if extrap else LK
    r = _measure(topo, keys, bits, CONFIGS[name], protocol=protocol, lk=lk, iters=iters, max_seconds=max_seconds)
    ex_s = r["exchange_s"] * (LK / lk)
    s_iter = r["penalty_s"] + ex_s
    return dict(bits=bits, config=name, graph=where, protocol=protocol, measured_lk=lk, extrapolated=extrap,
                seconds_per_iter=s_iter, penalty_s=r["penalty_s"], exchange_s=ex_s,
                values_per_s=topo.n_directed_edges * LK / s_iter, values_per_s_per_edge=LK / s_iter,
                iters=r["iters"], bind_s=r["bind_s"], slots=r["slots"],
                encryptions_per_iter=(r["penalty_encryptions_per_iter"]
                                      + r["exchange_encryptions_per_iter"] * (LK / lk if extrap else 1)),
                bit_identical=True, **{k: r[k] for k in ("setup_s", "setup_encryptions", "setup_bytes") if k in r})


def bench(bits_list, protocols, small_lk, iters, max_seconds, graph_seed, log, on_row=None, configs=None):
    """Every configuration (``configs``: names, default all) and protocol at every key size, the
    protocols of one configuration measured one after the other; ``on_row(rows)`` after each."""
    from ppdnmf_torch.graph import Graph, random_connected

    paper_graph = random_connected(10, 3.0, seed=graph_seed)
    topos = (("paper", _topology(paper_graph)), ("edge", _topology(Graph(2, [(0, 1)]))))
    rows = []
    keygen = {}
    for bits in bits_list:
        keys, t_keys = _keys(bits, 10)
        keygen[bits] = t_keys
        log(f"[{bits} bits] 10 key pairs in {t_keys:.1f} s")
        for name in CONFIGS:
            if configs and name not in configs:
                continue
            for where, topo in topos:
                for protocol in protocols:
                    t0 = time.perf_counter()
                    row = _row(bits, name, where, protocol, topo, keys, small_lk, iters, max_seconds)
                    rows.append(row)
                    if on_row is not None:
                        on_row(rows)
                    setup = f", setup {row['setup_s']:.2f} s" if "setup_s" in row else ""
                    log(f"  {name:8s} {where:5s} {protocol:10s} lk={row['measured_lk']:3d} "
                        f"{'*' if row['extrapolated'] else ' '} {row['seconds_per_iter']:10.4f} s/iter "
                        f"({row['iters']} timed, {time.perf_counter() - t0:.1f} s{setup})")
    return rows, keygen


def fit_check(bits, bcd_iters, configs, protocols, log):
    """A real paper-synthetic fit (trial 0: data, column split, graph) with ``bcd_iters`` BCD
    iterations of 30 ADMM iterations, fresh ``bits``-bit keys (timed), per configuration and
    protocol; checked bit for bit against ``exchange="quantized"``. Returns one row each; its
    seconds per ADMM iteration leave out the key generation and the masked setup, which the
    trial estimate adds once."""
    from ppdnmf_torch import fit
    from ppdnmf_torch.app.costs import paillier_estimate
    from ppdnmf_torch.exchange import PaillierSpec
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial

    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    blocks, graph = make_trial(spec, seed=0)
    sol = dict(dataclasses.asdict(spec.solver), bcd_iters=bcd_iters)
    kw = dict(mu=sol["mu"], eta=sol["eta"], g_max=sol["g_max"], bcd_iters=bcd_iters, x_iters=sol["x_iters"],
              y_iters=sol["y_iters"], key_bits=bits, n_max=1e6, negative="allow", seed=0, device="cpu")
    ref = fit(blocks, graph, sol["rank"], exchange="quantized", **kw)
    rows = []
    for name in configs:
        for protocol in protocols:
            opts = dict(CONFIGS[name])
            if opts.get("workers", 0) is None:
                opts["workers"] = os.cpu_count()
            # what the CLI would say before this run (the cost model's one figure; its calibration untimed)
            est = paillier_estimate(PaillierSpec(protocol=protocol, n_max=1e6, key_bits=bits, **opts), graph,
                                    blocks[0].shape[0], sol["rank"], sol["x_iters"], bcd_iters)["seconds"]
            t0 = time.perf_counter()
            res = fit(blocks, graph, sol["rank"], exchange="paillier", protocol=protocol, exchange_options=opts, **kw)
            wall = time.perf_counter() - t0
            same = (torch.equal(res.X, ref.X) and torch.equal(res.U, ref.U)
                    and all(torch.equal(a, b) for a, b in zip(res.Y, ref.Y)))
            if not same:
                raise SystemExit(f"bench_crypto: the {name} fit ({protocol}) differs from exchange='quantized'")
            admm = bcd_iters * sol["x_iters"]
            keygen = res.costs.get("time_keygen", 0.0)
            setup = res.costs.get("time_setup", 0.0)
            per_admm = (wall - keygen - setup) / admm
            rows.append(dict(bits=bits, config=name, protocol=protocol, bcd_iters=bcd_iters, admm_iters=admm,
                             wall_s=wall, estimate_s=est, keygen_s=keygen, setup_s=setup,
                             seconds_per_admm_iter=per_admm,
                             trial_minutes=(per_admm * TRIAL_ITERS + keygen + setup) / 60,
                             encryptions=res.costs["encryptions"], decryptions=res.costs["decryptions"],
                             setup_encryptions=res.costs.get("setup_encryptions", 0), bit_identical=True))
            log(f"  fit {name:8s} {protocol:10s} {bits} bits: {bcd_iters} BCD x {sol['x_iters']} ADMM in {wall:.1f} s "
                f"(estimated {est:.1f} s before it) "
                f"(keygen {keygen:.1f} s, setup {setup:.2f} s) -> {per_admm:.3f} s per ADMM iteration")
    return rows


def _fmt_s(v):
    return f"{v:7.3f} s" if v >= 0.1 else f"{v * 1e3:6.1f} ms"


def _fmt_x(v):
    """A ratio: one decimal below 10 (1.3x, not 1x)."""
    return f"{v:.1f}x" if v < 10 else f"{v:.0f}x"


def table(rows, bits_list):
    by = {(r["bits"], r["config"], r["graph"], r["protocol"]): r for r in rows}
    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))

    def section(title, graph, label, cell, protocol):
        """One row per configuration, a ``cell(row, naive_row)`` per key size."""
        head = "config  " + "".join(f"| {b:>5} bits: {label} x naive " for b in bits_list)
        lines = [f"{title}, protocol={protocol}", head, "-" * len(head)]
        for c in configs:
            cells = []
            for b in bits_list:
                r, n = by[(b, c, graph, protocol)], by.get((b, "naive", graph, protocol))
                cells.append(cell(r, n, "*" if r["extrapolated"] else " "))
            lines.append(f"{c:8s}" + "".join(cells))
        return lines

    def ratio(a, b):
        return f"{a / b:9.1f}x" if b else "        -"

    out = []
    for protocol in protocols:
        out += section("Seconds per ADMM iteration, paper-synthetic graph (N=10, 15 edges, LK=150), penalty + "
                       "exchange round", "paper", "s/iter ",
                       lambda r, n, mark: (f"| {_fmt_s(r['seconds_per_iter'])}{mark} "
                                           f"{ratio(n['seconds_per_iter'], r['seconds_per_iter']) if n else '        -'} "),
                       protocol)
        out.append("")
    for protocol in protocols:
        out += section("Values securely exchanged per second over one directed edge (2 agents, LK=150 per message)",
                       "edge", "values/s",
                       lambda r, n, mark: (f"| {r['values_per_s_per_edge']:10.0f}{mark} "
                                           f"{ratio(r['values_per_s_per_edge'], n['values_per_s_per_edge']) if n else '        -'}"),
                       protocol)
        out.append("")
    if "masked" in protocols and "aggregated" in protocols:
        head = "config  " + "".join(f"| {b:>5} bits: masked / aggregated " for b in bits_list)
        out += ["Side by side, paper-synthetic graph: seconds per ADMM iteration, masked over aggregated (same "
                "switches, same keys)", head, "-" * len(head)]
        for c in configs:
            cells = []
            for b in bits_list:
                m, a = by[(b, c, "paper", "masked")], by[(b, c, "paper", "aggregated")]
                cells.append(f"| {m['seconds_per_iter'] / a['seconds_per_iter']:24.2f} ")
            lines_c = f"{c:8s}" + "".join(cells)
            out.append(lines_c)
        setups = [r for r in rows if r["protocol"] == "masked" and r["graph"] == "paper" and "setup_s" in r]
        for b in bits_list:
            ss = [r["setup_s"] for r in setups if r["bits"] == b]
            if ss:
                r0 = next(r for r in setups if r["bits"] == b)
                out.append(f"masked setup at {b} bits (seed agreement, once per run, in bind): "
                           f"{min(ss):.3f}-{max(ss):.3f} s, {r0['setup_encryptions']} encryptions, "
                           f"{r0['setup_bytes']} bytes")
        out.append("")
    out.append("(* measured with a small LK and extrapolated per value; see the script's docstring)")
    return "\n".join(out)


def estimate(rows, keygen, bits, protocol):
    by = {(r["config"], r["graph"]): r for r in rows if r["bits"] == bits and r["protocol"] == protocol}
    out = {"key_bits": bits, "protocol": protocol, "admm_iterations": TRIAL_ITERS, "keygen_s": keygen[bits]}
    naive = by.get(("naive", "paper"), {}).get("seconds_per_iter")
    if naive:
        out.update(naive_seconds_per_iter=naive, naive_trial_hours=naive * TRIAL_ITERS / 3600)
    for c in ("default", "all"):
        if (c, "paper") not in by:
            continue
        r = by[(c, "paper")]
        s_i = r["seconds_per_iter"]
        out[f"{c}_seconds_per_iter"] = s_i
        out[f"{c}_trial_minutes"] = (s_i * TRIAL_ITERS + keygen[bits] + r.get("setup_s", 0.0)) / 60
        if naive:
            out[f"{c}_speedup"] = naive / s_i
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, nargs="+", default=[128, 1024, 2048])
    ap.add_argument("--protocols", nargs="+", default=["aggregated", "masked"], choices=["masked", "aggregated", "paper"])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                    help="configurations to measure (default: all)")
    ap.add_argument("--iters", type=int, default=4, help="timed iterations per configuration (after one warm-up)")
    ap.add_argument("--max-seconds", type=float, default=10.0, help="stop timing a configuration after this long")
    ap.add_argument("--small-lk", type=int, nargs=2, action="append", metavar=("BITS", "LK"),
                    help="LK for the extrapolated (unpacked) configurations at BITS (default: 1024 -> 10, "
                         "2048 -> 4, others 8)")
    ap.add_argument("--graph-seed", type=int, default=0)
    ap.add_argument("--fit-bcd", type=int, default=2,
                    help="BCD iterations of the end-to-end paper-synthetic fit at the largest key size "
                         "(0: skip)")
    ap.add_argument("--fit-configs", nargs="+", default=["all"], choices=list(CONFIGS),
                    help="configurations of the end-to-end fit (each protocol of --protocols)")
    ap.add_argument("--json", metavar="PATH", help="also write every row and the estimate as JSON")
    args = ap.parse_args(argv)
    small = {1024: 10, 2048: 4}
    for b, lk in args.small_lk or []:
        small[b] = lk
    warnings.filterwarnings("ignore", category=UserWarning, message=r"key_bits=\d+: Paillier keys shorter")

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None

    def save(rows, loadavg_end=None, **done):
        # after every measurement too: a run stopped by a time limit keeps what it measured
        if args.json:  # atomically: a run killed mid-write keeps the previous file
            from ppdnmf_torch.checkpoint import write_atomically

            payload = {"machine": {"cpu_count": os.cpu_count(), "machine": platform.machine(),
                                   "python": platform.python_version(), "loadavg_start": load0,
                                   "loadavg_end": loadavg_end},
                       "protocols": args.protocols, "lk": LK, "rows": rows, "complete": bool(done), **done}
            write_atomically(args.json, lambda fh: json.dump(payload, fh, indent=1), binary=False)

    t0 = time.perf_counter()
    rows, keygen = bench(args.bits, args.protocols, small, args.iters, args.max_seconds, args.graph_seed, log,
                         on_row=save, configs=args.configs)
    fits = (fit_check(max(args.bits), args.fit_bcd, args.fit_configs, args.protocols, log)
            if args.fit_bcd > 0 else [])
    wall = time.perf_counter() - t0
    load1 = os.getloadavg() if hasattr(os, "getloadavg") else None
    big = max(args.bits)
    ests = {p: estimate(rows, keygen, big, p) for p in args.protocols}
    print(f"Paillier host stage, protocols {', '.join(args.protocols)}, phe + gmpy2, {os.cpu_count()} CPU cores "
          f"({platform.machine()}), load average {load0[0]:.1f} -> {load1[0]:.1f}" if load0 else "")
    print(table(rows, args.bits))
    print()
    print(f"Extrapolated at {big} bits from the seconds per iteration measured above, one full paper-synthetic trial "
          f"({TRIAL_ITERS} ADMM iterations, exchange stage only, plus {keygen[big]:.1f} s of key generation and, "
          "masked, its setup):")
    for p, est in ests.items():
        if "naive_seconds_per_iter" in est:
            print(f"  {p:10s} naive   {est['naive_seconds_per_iter']:8.3f} s/iter -> {est['naive_trial_hours']:8.1f} "
                  "hours")
        for c in ("default", "all"):
            if f"{c}_seconds_per_iter" not in est:
                continue
            speed = f" ({_fmt_x(est[f'{c}_speedup'])} the naive path)" if f"{c}_speedup" in est else ""
            print(f"  {p:10s} {c:7s} {est[f'{c}_seconds_per_iter']:8.3f} s/iter -> "
                  f"{est[f'{c}_trial_minutes']:8.1f} minutes{speed}")
    for f in fits:
        print(f"  end-to-end fit ({f['config']}, {f['protocol']}): {f['bcd_iters']} BCD x 30 ADMM iterations of the "
              f"paper-synthetic trial in {f['wall_s']:.1f} s (the CLI's estimate: {f['estimate_s']:.1f} s) with fresh "
              f"keys ({f['keygen_s']:.1f} s keygen, "
              f"{f['setup_s']:.2f} s setup) -> {f['seconds_per_admm_iter']:.3f} s per ADMM iteration -> "
              f"{f['trial_minutes']:.1f} minutes for {TRIAL_ITERS} (X-step, Y-step and exchange; X, Y, U "
              "bit-identical to quantized)")
    print(f"All S and rho bit-identical to exchange='quantized'. Bench wall time {wall:.0f} s.")
    if args.json:
        save(rows, keygen_s=keygen, estimates=ests, fits=fits, wall_s=wall, loadavg_end=load1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
