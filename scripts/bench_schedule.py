#!/usr/bin/env python
"""The penalty schedules side by side under real Paillier: what ``penalty_schedule="agreed"``
(the default) costs against ``"adaptive"`` (and ``"paper"``).

    python scripts/bench_schedule.py [--bits 2048] [--bcd 2] [--admm 3] [--rounds 2] [--json out.json]

One process, one set of keys for every run (made once, timed apart): the paper-synthetic
trial 0 (10 agents, 15 edges, ``L K = 150``), ``exchange="paillier"``, ``protocol="masked"``,
``--bcd`` BCD iterations of ``--admm`` ADMM iterations (the second BCD iteration is the first
whose messages carry information, and the first after a cap can change). The schedules run
in turn, ``--rounds`` times (alternated: the machine is shared and its load moves); reported
per schedule: the median seconds per ADMM iteration (the masked setup left out), and the
exchange's counters (encryptions, decryptions, homomorphic operations, ciphertext bytes, bytes
per directed edge), which must not depend on the schedule: the schedule changes the
penalties' values, never the messages. Every paillier run is checked bit for bit against
``exchange="quantized"`` under the same schedule.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch.exchange.paillier import generate_keypairs  # noqa: E402
from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial  # noqa: E402

SCHEDULES = ("agreed", "adaptive", "paper")
#: the counters that describe the messages (the rest are timers)
COUNTERS = ("encryptions", "decryptions", "homomorphic_additions", "scalar_multiplications", "ciphertext_bytes",
            "setup_encryptions", "setup_ciphertext_bytes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=int, default=2048)
    ap.add_argument("--bcd", type=int, default=2)
    ap.add_argument("--admm", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    ap.add_argument("--json", help="write the numbers to this file")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # SumLeakWarning for adaptive: measured here on purpose
    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    blocks, graph = make_trial(spec, seed=0)
    s = spec.solver
    kw = dict(mu=s.mu, eta=s.eta, g_max=s.g_max, bcd_iters=args.bcd, x_iters=args.admm, y_iters=s.y_iters,
              key_bits=args.bits, n_max=1e6, protocol="masked", negative="allow", seed=0, device="cpu",
              init="random")
    t0 = time.perf_counter()
    keys = generate_keypairs(args.bits, graph.n_agents)
    keygen = time.perf_counter() - t0
    print(f"{graph.n_agents} key pairs of {args.bits} bits in {keygen:.1f} s", file=sys.stderr, flush=True)
    out = {name: {"seconds_per_admm_iter": []} for name in args.schedules}
    for r in range(args.rounds):
        for name in args.schedules:
            ref = pp.fit(blocks, graph, s.rank, exchange="quantized", penalty_schedule=name, **kw)
            t0 = time.perf_counter()
            res = pp.fit(blocks, graph, s.rank, exchange="paillier", penalty_schedule=name,
                         exchange_options={"keypairs": keys}, **kw)
            wall = time.perf_counter() - t0
            same = (torch.equal(res.X, ref.X) and torch.equal(res.U, ref.U)
                    and all(torch.equal(a, b) for a, b in zip(res.Y, ref.Y)))
            if not same:
                raise SystemExit(f"bench_schedule: {name}: paillier differs from quantized")
            per = (wall - res.costs.get("time_setup", 0.0) - res.costs.get("time_keygen", 0.0)) / (args.bcd * args.admm)
            row = out[name]
            row["seconds_per_admm_iter"].append(per)
            row["counters"] = {k: res.costs.get(k) for k in COUNTERS}
            row["bytes_per_edge"] = dict(res.costs.get("bytes_per_edge", {}))
            row["nmse"], row["consensus"] = float(res.history["nmse"][-1]), float(res.history["consensus"][-1])
            print(f"round {r} {name:8s} {per:.3f} s per ADMM iteration (setup {res.costs.get('time_setup', 0):.1f} s)",
                  file=sys.stderr, flush=True)
    base = args.schedules[0]
    print(f"| schedule | s per ADMM iteration (median of {args.rounds}) | ratio to {base} | encryptions | "
          "decryptions | ciphertext bytes | messages as agreed's |")
    print("|---|---|---|---|---|---|---|")
    med = {n: statistics.median(out[n]["seconds_per_admm_iter"]) for n in args.schedules}
    for name in args.schedules:
        c = out[name]["counters"]
        same = c == out[base]["counters"] and out[name]["bytes_per_edge"] == out[base]["bytes_per_edge"]
        out[name]["same_messages_as_" + base] = same
        print(f"| {name} | {med[name]:.3f} | {med[name] / med[base]:.2f} | {c['encryptions']} | {c['decryptions']} | "
              f"{c['ciphertext_bytes']} | {'yes' if same else 'NO'} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"bits": args.bits, "bcd": args.bcd, "admm": args.admm, "keygen_s": keygen, "rows": out}, fh,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
