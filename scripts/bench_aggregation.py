#!/usr/bin/env python
"""The secure aggregation's cost per round against the plain round, side by side, and its audit.

    python scripts/bench_aggregation.py [--key-bits 2048] [--workers 3 10] [--values 192 2352]
                                        [--rounds 5] [--djn] [--audit] [--many K:h ...] [--json out.json]

For every ``K`` (workers) and ``P`` (values per worker and round; 192 = FSSPCA's ``w_i`` at
``d = 64, r = 3``, 2352 = ``d = 784, r = 3``) one process builds a ``plain``, a ``quantized`` and a
``paillier`` aggregator (``make_aggregator``, with fresh ``key_bits`` keys: the default, one worker's
fresh obfuscators; ``paillier_every``, ``obfuscators="every"``; with ``--djn`` one with DJN obfuscators) and runs ``--rounds`` rounds of the same
FSSPCA-like uploads through each in turn (round by round, the kinds interleaved, so that the
machine's load hits them alike). It checks every round's quantized and paillier sums bit for bit
against each other, and reports per kind the seconds per round (median and range), its ratio to
the plain round, the setup (key generation and the seed agreement) and the counted operations.

``--audit`` also runs the server audit (``ppdnmf_torch.audit.server``: a curious server, and one
colluding with a worker, against each single upload; the masks-off positive control) and prints
its table. ``--many 100:0 1000:5`` adds ``quantized`` rounds for many workers, on the complete mask
graph (``h = 0``) and with ``mask_neighbours = h``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ppdnmf_torch.exchange.aggregation import make_aggregator  # noqa: E402


def _uploads(K, P, rounds, seed=0):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(P, generator=gen, dtype=torch.float64)
    out = []
    for _ in range(rounds):
        z = z + 0.05 * torch.randn(P, generator=gen, dtype=torch.float64)
        out.append(z + 0.1 * torch.randn((K, P), generator=gen, dtype=torch.float64))
    return out


def bench(K: int, P: int, *, key_bits: int, rounds: int, djn: bool) -> dict:
    kinds = {"plain": {}, "quantized": {}, "paillier": {}, "paillier_every": {"obfuscators": "every"}}
    if djn:
        kinds["paillier_djn"] = {"djn": True}
    aggs, setup = {}, {}
    for name, opts in kinds.items():
        t0 = time.perf_counter()
        kind = "paillier" if name.startswith("paillier") else name
        extra = {"key_bits": key_bits} if kind != "plain" else {}
        aggs[name] = make_aggregator(kind, K, **extra, **opts)
        setup[name] = time.perf_counter() - t0
    times = {name: [] for name in aggs}
    for v in _uploads(K, P, rounds):
        sums = {}
        for name, agg in aggs.items():
            t0 = time.perf_counter()
            sums[name] = agg.total(v, 0)
            times[name].append(time.perf_counter() - t0)
        for name in aggs:
            if name.startswith("paillier") and not torch.equal(sums[name], sums["quantized"]):
                raise SystemExit(f"{name} differs from quantized at K={K}, P={P}")
    base = statistics.median(times["plain"])
    rows = []
    for name, agg in aggs.items():
        c = agg.costs()
        med = statistics.median(times[name])
        rows.append({
            "kind": name, "K": K, "P": P, "key_bits": key_bits if name != "plain" else None,
            "seconds_per_round_median": med, "seconds_per_round_min": min(times[name]),
            "seconds_per_round_max": max(times[name]), "ratio_to_plain": med / base,
            "setup_seconds": setup[name], "keygen_seconds": c.get("seconds_keygen", 0.0),
            "per_round": {k: c[k] / rounds for k in ("encryptions", "decryptions", "homomorphic_additions",
                                                      "mask_units", "bytes", "prg_bytes") if k in c},
            "setup_counts": {k: c[k] for k in ("setup_encryptions", "setup_decryptions", "setup_bytes")
                             if k in c},
            "seconds_by_step": {k: c[k] / rounds for k in c if k.startswith("seconds_") and k not in
                                ("seconds_setup", "seconds_keygen")},
        })
        agg.close()
    return {"K": K, "P": P, "rows": rows}


def many(K: int, h: int, *, rounds: int, P: int = 192) -> dict:
    """``quantized`` rounds for many workers against the plain round, side by side."""
    plain = make_aggregator("plain", K)
    t0 = time.perf_counter()
    agg = make_aggregator("quantized", K, mask_neighbours=h or None)
    setup = time.perf_counter() - t0
    tq, tp = [], []
    for v in _uploads(K, P, rounds):
        t0 = time.perf_counter()
        agg.total(v, 0)
        t1 = time.perf_counter()
        plain.total(v, 0)
        tq.append(t1 - t0)
        tp.append(time.perf_counter() - t1)
    med = statistics.median(tq)
    return {"K": K, "h": h, "pairs": len(agg.pairs), "median": med, "min": min(tq), "max": max(tq),
            "ratio": med / statistics.median(tp), "setup": setup}


def _table(results) -> str:
    lines = ["| K | P | kind | s / round (median, range) | x plain | setup s | encryptions / round | "
             "bytes / round |", "|---|---|---|---|---|---|---|---|"]
    for res in results:
        for r in res["rows"]:
            pr = r["per_round"]
            lines.append(
                f"| {r['K']} | {r['P']} | {r['kind']} | {r['seconds_per_round_median']:.3g} "
                f"({r['seconds_per_round_min']:.3g}-{r['seconds_per_round_max']:.3g}) | {r['ratio_to_plain']:.3g} | "
                f"{r['setup_seconds']:.3g} | {pr.get('encryptions', 0):.0f} | {pr.get('bytes', 0):.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--workers", type=int, nargs="+", default=[3, 10])
    ap.add_argument("--values", type=int, nargs="+", default=[192, 2352])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--djn", action="store_true", help="also a paillier aggregator with DJN obfuscators")
    ap.add_argument("--audit", action="store_true", help="also run the server audit and print its table")
    ap.add_argument("--many", type=str, nargs="*", default=None, metavar="K:h",
                    help="also quantized rounds of 192 values for many workers, K:h pairs (h = 0: every pair), "
                         "e.g. 100:0 100:5 1000:5 1000:20")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # small keys warn (InsecureKeyWarning): the user chose them
    results = [bench(K, P, key_bits=args.key_bits, rounds=args.rounds, djn=args.djn)
               for K in args.workers for P in args.values]
    print(f"# secure aggregation, {args.key_bits}-bit keys, {args.rounds} rounds, {platform.processor() or 'cpu'}, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(_table(results))
    out = {"argv": sys.argv[1:], "results": results}
    if args.many:
        out["many"] = [many(*(int(x) for x in spec.split(":")), rounds=args.rounds) for spec in args.many]
        print()
        print("| K | mask_neighbours | pairs | quantized s / round (median, range) | x plain | setup s |")
        print("|---|---|---|---|---|---|")
        for r in out["many"]:
            print(f"| {r['K']} | {r['h'] or 'every pair'} | {r['pairs']} | {r['median']:.3g} ({r['min']:.3g}-{r['max']:.3g}) "
                  f"| {r['ratio']:.3g} | {r['setup']:.3g} |")
    if args.audit:
        from ppdnmf_torch.audit.server import format_server_audit, run_server_audit

        reports = [run_server_audit("quantized", K, rounds=8, n_values=192, seed=K) for K in (2, 3, 10)]
        reports.append(run_server_audit("quantized", 3, rounds=8, n_values=192, masks=False))
        reports.append(run_server_audit("paillier", 3, rounds=4, n_values=192, key_bits=args.key_bits))
        print()
        print(format_server_audit(reports))
        out["audit"] = [{k: v for k, v in r.items()} for r in reports]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
