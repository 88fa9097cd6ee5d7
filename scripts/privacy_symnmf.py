#!/usr/bin/env python
"""The privacy audit of symmetric NMF across agents (``ppdnmf_torch.models.symnmf.audit``;
docs/THREAT_MODEL.md, "Symmetric NMF across agents").

    python scripts/privacy_symnmf.py [--out DIR] [--data digits|orl] [--n 200] [--rank 10]
                                     [--graphs ring10 random10 star10] [--settings agreed paper equal]
                                     [--start private|common]
                                     [--max-iter 20] [--x-iters 10] [--max-calls 10] [--paillier]

The data: ``--n`` samples drawn at random (seed 0) from scikit-learn's digits or from ORL
(``--orl PATH``, default ``../shared/data/orl_faces.mat`` beside the checkout), Kuang et al.'s
kNN similarity (``similarity.similarity_matrix``), the scaled start (``estimator.scaled_start``),
agents holding random balanced node sets. Graphs: ``ringN`` (every agent of degree 2), ``randomN``
(``random_connected(N, 3.0, seed=0)``, the model's default graph), ``starN`` (N - 1 leaves of
degree 1). Settings: ``agreed`` (the model's default schedule: one common random draw per ADMM
iteration under the one cap ``g_cap = 0.3``), ``paper`` (random draws per directed edge under equal
caps), ``equal`` (``paper`` with ``penalty_mode="fixed"``: equal weights at every call).
``--start``: the agents' ``V_j`` at the start, ``private`` (the model's default) or ``common``
(``U_0[S_j]``, public: the before of the first-message inversion). ``--paillier``:
also a real Paillier run (128-bit keys, protocol ``masked``, 2 x 3 iterations) on the first
graph, its transcript scanned. Writes ``symnmf_audit.json`` and ``symnmf_audit.md`` under
``--out`` (default ``outputs/privacy_symnmf/<timestamp>/``). Exit status 0 whatever the findings.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))


def make_graph(name: str):
    from ppdnmf_torch.graph import random_connected, ring, star

    for prefix, make in (("ring", ring), ("star", star), ("random", lambda n: random_connected(n, 3.0, seed=0))):
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            return make(int(name[len(prefix):]))
    raise SystemExit(f"unknown graph {name!r}; use ringN, randomN or starN")


def load_samples(data: str, n: int, orl: Path):
    import numpy as np

    from ppdnmf_torch.models.symnmf.data import load_orl
    from ppdnmf_torch.models.symnmf.datasets import load_digits_samples

    M, y = load_digits_samples() if data == "digits" else load_orl(orl)
    sel = np.sort(np.random.default_rng(0).choice(len(y), min(n, len(y)), replace=False))
    return M[sel], y[sel]


def _f(v, fmt=".3f"):
    return "-" if v is None else format(v, fmt)


def markdown(rep: dict) -> str:
    m = rep["meta"]
    lines = [f"# Symmetric NMF across agents: privacy audit ({m['created']})", "",
             f"n = {m['n']}, rank {m['rank']}, codec n_max = {m['n_max']:g}, g_bits = {m['g_bits']}, "
             f"x_max = {m['x_max']}, start {m['fit'].get('start', 'private')}, {m['sums_max_calls']} informative calls per receiver for the sums audit; "
             f"fit: {m['fit']}; {m['seconds']:.0f} s", "",
             "## Sums attacks (integer decomposition at degree 2, LLL at degree >= 3)", "",
             "| case | E | consensus | degree | calls | exact calls | exact values | pairs with any exact | "
             "certified (wrong) | unequal-weight receiver-calls | rho changes: pinned (correct) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in rep["cases"].items():
        sl = c.get("schedule_leak", {}).get("all", {})
        for d, b in c.get("sums", {}).get("by_degree", {}).items():
            lines.append(f"| {name} | {c['fit']['E']:.4f} | {c['fit']['consensus']:.1e} | {d} | {b['informative_calls']} | "
                         f"{b['exact_calls']} | {b['exact_neighbour_values']} / {b['neighbour_values']} | "
                         f"{b['pairs_any_exact']} / {b['pairs']} | {b['certified']} ({b['false_positives']}) | "
                         f"{c['weights']['unequal_weights']} / {c['weights']['informative_receiver_calls']} | "
                         f"{sl.get('changes', '-')} / {sl.get('calls', '-')}: {sl.get('attributed', '-')} "
                         f"({sl.get('attributed_correct', '-')}) |")
    lines += ["", "## Every degree-2 call with unequal weights attacked", "",
              "| case | calls attacked | exact | certified | (outer, ADMM) iterations of the exact calls |",
              "|---|---|---|---|---|"]
    for name, c in rep["cases"].items():
        r = c.get("recoveries")
        if r is not None:
            its = sorted({(x["outer_iter"], x["admm_iter"]) for x in r["calls"]})
            lines.append(f"| {name} | {r['attacked']} | {r['exact']} | {r['certified']} | {its} |")
    lines += ["", "## Curious neighbour on the messages (pairs recovered exactly at >= 50% of informative calls)", "",
              "| case | protocol | pairs | exact: degree 1 | exact: degree >= 2 | >= 2x better than the baseline |",
              "|---|---|---|---|---|---|"]
    for name, c in rep["cases"].items():
        for proto, s in c["neighbour"].items():
            lines.append(f"| {name} | {proto} | {s['pairs_informative']} | {s.get('exact_recovery_pairs_degree1')} | "
                         f"{s.get('exact_recovery_pairs_degree2plus')} | {s['beats_baseline_pairs']} |")
    lines += ["", "## What U_j gives: agent j's unknown columns X[R, S_j] (median over pairs)", "",
              "Relative error (`sym`: U[R] U[S_j]^T; `ls`: V fitted on X[S_i, S_j]; `first`: the first call's "
              "local solve inverted, NNLS per row) and neighbour precision (`prec`), from the recovered U_j "
              "(`attack`), from the attacker's own copy U_i at the same call (`own`) and from its data alone "
              "(`nystrom`); chance: the block's density.", "",
              "| case | at | attack sym / ls | own sym / ls | nystrom | first | "
              "prec: attack sym / own sym / nystrom / first / chance |",
              "|---|---|---|---|---|---|---|"]

    def first(r):
        if r.get("first") is None:
            return "-"
        return (f"{r['first']:.1e} ({r['first_exact']} / {r['first_pairs']} exact, worst {r['first_max']:.1e}, "
                f"precision >= {r['first_prec_min']:.3f})")

    def row(name, at, r):
        return (f"| {name} | {at} | {_f(r['attack_sym'])} / {_f(r['attack_ls'])} | {_f(r['own_sym'])} / "
                f"{_f(r['own_ls'])} | {_f(r['nystrom'])} | {first(r)} | {_f(r['attack_sym_prec'])} / "
                f"{_f(r['own_sym_prec'])} / {_f(r['nystrom_prec'])} / {_f(r.get('first_prec'))} / "
                f"{_f(r['chance_prec'])} |")

    for name, c in rep["cases"].items():
        r = c.get("recoveries")
        if r is not None and r["exact"]:
            lines.append(row(name, f"the {r['exact']} exact sums recoveries", r["reconstruction"]))
        per = c.get("reconstruction_plain") or []
        for p in per[:2] + per[-1:]:
            lines.append(row(name, f"plain, call {p['call'] + 1} (outer {p['outer_iter']}, ADMM {p['admm_iter']})", p))
    eav = [(name, c["eavesdropper_first_call"]) for name, c in rep["cases"].items() if "eavesdropper_first_call" in c]
    if eav:
        lines += ["", "## The plain eavesdropper: every agent's whole columns X[:, S_j] from its first message "
                  "(rho_j from the penalties on the wire)", "",
                  "| case | agents exact (< 1e-8) | worst relative error | lowest precision |", "|---|---|---|---|"]
        lines += [f"| {name} | {sum(a['error'] < 1e-8 for a in e['agents'])} / {len(e['agents'])} | "
                  f"{e['error_max']:.1e} | {e['precision_min']:.3f} |" for name, e in eav]
    gr = [(name, c["gram"]) for name, c in rep["cases"].items() if "gram" in c]
    if gr:
        lines += ["", "## Against the start itself: G_j = V_j^T V_j and X_j V_j from exact messages (plain)", "",
                  "eavesdropper: from each agent's first two messages (worst relative error over the agents); "
                  "pairs: from the first message alone, G_j from the rows of the attacker's block X[S_i, S_j] that "
                  "are zero (`zero rows`), or the eavesdropper's exact G_j (`known G`: an agent that also "
                  "eavesdrops), then V_j by least squares and NNLS per row (medians over the directed edges).", "",
                  "| case | eavesdropper G / X_j V_j error | G from | pairs | solvable | G exact | zero rows | G error | "
                  "columns' error | precision | chance |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {name} | {g['eavesdropper']['gram_error_max']:.1e} / {g['eavesdropper']['xv_error_max']:.1e} | "
                  f"{label} | {p['pairs']} | {p['solvable']} | {p['gram_exact']} | {p['zero_rows']:.0f} | "
                  f"{p['gram_error']:.2e} | {p['gram_first']:.3g} | {p['gram_first_prec']:.3f} | {p['chance']:.3f} |"
                  for name, g in gr for label, p in (("zero rows", g["pairs"]), ("known G", g["pairs_known_gram"]))]
    fs = [(name, c["first_call_sum"]) for name, c in rep["cases"].items() if "first_call_sum" in c]
    if fs:
        lines += ["", "## Equal weights: the neighbours' columns from the sum of their first messages (NNLS, "
                  "rho_j public)", "", "| case | receiver degree | pairs | error | precision | chance |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {d} | {b['pairs']} | {b['error']:.3f} | {b['precision']:.3f} | {b['chance']:.3f} |"
                  for name, f in fs for d, b in f["by_degree"].items()]
    if rep.get("paillier"):
        lines += ["", "## Real Paillier run: transcript scan", "", "| protocol | key bits | calls | plaintexts | seeds | "
                  "hits | unobfuscated | repeated | bit-identical to quantized | seconds |", "|---|---|---|---|---|---|---|---|---|---|"]
        for proto, ev in rep["paillier"].items():
            s = ev["scan"]
            lines.append(f"| {proto} | {ev['key_bits']} | {ev['n_calls']} | {s['n_plaintexts']} | {s['n_seeds']} | "
                         f"{s['n_hits']} | {s['unobfuscated']} | {s['repeated_ciphertexts']} | {ev['bit_identical']} | "
                         f"{ev['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--data", choices=("digits", "orl"), default="digits")
    ap.add_argument("--orl", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "orl_faces.mat")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--rank", type=int, default=10)
    ap.add_argument("--graphs", nargs="+", default=["ring10", "random10", "star10"])
    ap.add_argument("--settings", nargs="*", default=["agreed", "paper", "equal"])  # none: only --paillier
    ap.add_argument("--start", choices=("private", "common"), default="private")
    ap.add_argument("--max-iter", type=int, default=20)
    ap.add_argument("--x-iters", type=int, default=10)
    ap.add_argument("--max-calls", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--paillier", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from ppdnmf_torch.models.symnmf.audit_report import paillier_scan, run_symnmf_audit
    from ppdnmf_torch.models.symnmf.estimator import scaled_start
    from ppdnmf_torch.models.symnmf.similarity import similarity_matrix

    out = args.out or REPO_ROOT / "outputs" / "privacy_symnmf" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    M, _ = load_samples(args.data, args.n, args.orl)
    X = similarity_matrix(M, device="cpu", sparse=False, dtype=torch.float64)
    U0 = scaled_start(X, args.rank, 1, args.seed)[0]
    graphs = {g: make_graph(g) for g in args.graphs}
    t0 = time.perf_counter()

    def say(s):
        print(f"[{time.perf_counter() - t0:7.1f} s] {s}", flush=True)

    rep = run_symnmf_audit(X, args.rank, graphs, settings=args.settings, U0=U0, max_iter=args.max_iter,
                           x_iters=args.x_iters, seed=args.seed, sums_max_calls=args.max_calls, progress=say,
                           start=args.start)
    rep["meta"].update(data=args.data, command=" ".join(["python scripts/privacy_symnmf.py", *sys.argv[1:]]))
    if args.paillier:
        from ppdnmf_torch.exchange.paillier import generate_keypairs

        g = graphs[args.graphs[0]]
        say(f"real Paillier run on {args.graphs[0]} (128-bit keys, 2 x 3 iterations, protocol masked)")
        rep["paillier"] = paillier_scan(X, args.rank, g, generate_keypairs(128, g.n_agents), U0=U0, max_iter=2,
                                        x_iters=3, seed=args.seed, start=args.start)
    (out / "symnmf_audit.json").write_text(json.dumps(rep, indent=1, default=float))
    md = markdown(rep)
    (out / "symnmf_audit.md").write_text(md)
    print(md)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
