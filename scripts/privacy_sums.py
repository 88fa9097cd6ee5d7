#!/usr/bin/env python
"""What a receiver computes from its two sums: the sums attacks of ``ppdnmf_torch.audit.sums``
over graphs, solver settings and codecs (docs/THREAT_MODEL.md, "What the sums reveal").

    python scripts/privacy_sums.py [--out DIR] [--graphs ring8 paper ...] [--settings defaults paper ...]
                                   [--codecs default big_n big_g] [--max-calls 15] [--bcd-iters 8]

Every case records one integer run (``exchange="quantized"``, bit-identical to ``paillier``;
the sums are the same under every protocol) on its own data (``synthetic(L=10, M=50 N, K=3)``,
50 columns per agent, rank 3) and attacks each receiver's ``rho_int_i`` and ``S_int_i`` with
only what the receiver holds (``audit.sums_audit``), and the changes of ``rho_int_i``
(``audit.schedule_audit``). Writes ``sums.json`` and ``sums.md`` under ``--out`` (default
``outputs/privacy_sums/<timestamp>/``). Exit status 0 whatever the findings.

Settings: ``defaults`` (the library's: ``penalty_schedule`` and ``init`` as ``fit`` defaults
them), ``adaptive`` (``penalty_schedule="adaptive"``, ``init="random"``), ``paper``
(``PAPER_SETTINGS``, equal caps 0.033), ``random_caps`` (``PAPER_SETTINGS``, private caps
uniform in [0.5, 1.5] x 0.033), ``agreed`` (``penalty_schedule="agreed"``, where the library has
it). Codecs: ``default`` (n_max 1e6, g_bits 16), ``big_n`` (1e8, 16), ``big_g`` (1e6, 20),
``small_n`` (1e4, 16), ``big_g_small_n`` (1e4, 20: what ``adaptive`` admits with 20 bits); a codec the
run's preflight refuses is reported as refused.
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

GRAPHS = ("paper", "ring8", "ring12", "star9", "random9", "random12")
SETTINGS = ("defaults", "adaptive", "paper", "random_caps", "agreed")
CODECS = {"default": (1e6, 16), "big_n": (1e8, 16), "big_g": (1e6, 20), "small_n": (1e4, 16),
          "big_g_small_n": (1e4, 20)}
G_MAX = 0.033


def make_graph(name: str):
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial
    from ppdnmf_torch.graph import random_connected, ring, star

    if name == "paper":
        return make_trial(PAPER_EXPERIMENTS["paper_synthetic"], 0)[1]
    if name.startswith("ring"):
        return ring(int(name[4:]))
    if name.startswith("star"):
        return star(int(name[4:]))
    if name == "random9":
        return random_connected(9, 3.0, seed=1)
    if name == "random12":
        return random_connected(12, 3.5, seed=2)
    raise SystemExit(f"unknown graph {name!r}")


def solver_settings(name: str, n_agents: int, seed: int):
    """``(fit keywords, g_max, schedule)`` of a named setting."""
    import torch

    from ppdnmf_torch import PAPER_SETTINGS
    from ppdnmf_torch.models.ppdnmf.config import SOLVER_DEFAULTS

    if name == "defaults":
        return {}, G_MAX, SOLVER_DEFAULTS.penalty_schedule
    if name == "adaptive":
        return {"penalty_schedule": "adaptive", "init": "random"}, G_MAX, "adaptive"
    if name == "paper":
        return dict(PAPER_SETTINGS), G_MAX, "paper"
    if name == "random_caps":
        gen = torch.Generator().manual_seed(int(seed) + 7919)  # as the audit's random_caps scenario
        caps = (G_MAX * (0.5 + torch.rand(n_agents, generator=gen, dtype=torch.float64))).tolist()
        return dict(PAPER_SETTINGS), caps, "paper"
    if name == "agreed":
        return {"penalty_schedule": "agreed"}, G_MAX, "agreed"
    raise SystemExit(f"unknown setting {name!r}")


def run_case(graph_name, setting, codec, *, bcd_iters, x_iters, max_calls, seed=0, lattice_max_degree=9) -> dict:
    from ppdnmf_torch.audit import public_x_max, schedule_audit, sums_audit
    from ppdnmf_torch.models.ppdnmf.audit import record_fit
    from ppdnmf_torch.data import split_columns, synthetic
    from ppdnmf_torch.errors import PPDNMFError

    graph = make_graph(graph_name)
    N = graph.n_agents
    Z = synthetic(L=10, M=50 * N, K=3, seed=seed + 1).Z
    blocks = split_columns(Z, [50] * N)
    kw, g_max, schedule = solver_settings(setting, N, seed)
    n_max, g_bits = CODECS[codec]
    case = {"graph": graph_name, "setting": setting, "codec": codec, "n_max": n_max, "g_bits": g_bits,
            "degrees": graph.degree.tolist(), "penalty_schedule": schedule}
    t0 = time.perf_counter()
    try:
        rec = record_fit(blocks, graph, 3, kind="quantized", protocol="masked", n_max=n_max, g_bits=g_bits,
                         bcd_iters=bcd_iters, x_iters=x_iters, y_iters=30, g_max=g_max, mu=0.1, negative="allow",
                         seed=seed, **kw)
    except (PPDNMFError, TypeError, ValueError) as exc:  # a codec the preflight refuses, a missing schedule
        case["refused"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return case
    # the public bound of the neighbours' draws: the caps' largest reachable value
    x_max = public_x_max(g_max, g_bits, schedule)
    case.update(nmse=rec.nmse, consensus=rec.consensus, x_max=x_max,
                sums=sums_audit(rec, x_max=x_max, max_calls=max_calls, lattice_max_degree=lattice_max_degree),
                schedule=schedule_audit(rec, x_max=x_max),
                distinct_weights=_distinct_weights(rec))
    case["seconds"] = time.perf_counter() - t0
    return case


def _distinct_weights(rec) -> dict:
    """Informative receiver-calls of degree >= 2 at which the receiver's weights ``w_ij`` are not all equal."""
    from ppdnmf_torch.audit.sums import unequal_weights

    return unequal_weights(rec)


def table(cases) -> str:
    lines = ["| graph | setting | codec | degree | receivers | calls | exact calls | exact values | pairs any exact "
             "| certified (wrong) | penalties exact | calls with unequal weights | rho changes: pinned (correct) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        head = f"| {c['graph']} | {c['setting']} | {c['codec']} "
        if "refused" in c:
            lines.append(head + f"| refused: {c['refused'][:90]} |" + " |" * 9)
            continue
        sl = c["schedule"]["all"]
        dw = c["distinct_weights"]
        for j, (d, b) in enumerate(c["sums"]["by_degree"].items()):
            tail = (f"| {dw['unequal_weights']} / {dw['informative_calls']} | {sl['changes']}: {sl['attributed']} "
                    f"({sl['attributed_correct']}) |") if j == 0 else "| | |"
            frac = f"{b['exact_fraction']:.1%}" if b["exact_fraction"] is not None else "-"
            tried = b["informative_calls"] - b["calls_not_tried"]
            lines.append(head + f"| {d} | {b['receivers']} | {tried} | {b['exact_calls']} ({frac}) | "
                         f"{b['exact_neighbour_values']} / {b['neighbour_values']} | {b['pairs_any_exact']} / "
                         f"{b['pairs']} | {b['certified']} ({b['false_positives']}) | {b['penalties_exact']} " + tail)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--graphs", nargs="+", default=list(GRAPHS))
    p.add_argument("--settings", nargs="+", choices=SETTINGS, default=["defaults", "paper", "random_caps"])
    p.add_argument("--codecs", nargs="+", choices=tuple(CODECS), default=["default"])
    p.add_argument("--bcd-iters", type=int, default=8)
    p.add_argument("--x-iters", type=int, default=30)
    p.add_argument("--max-calls", type=int, default=15, help="informative calls attacked per receiver")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lattice-max-degree", type=int, default=9,
                   help="the lattice attack's largest receiver degree (9: a star of 10's hub; seconds per call)")
    args = p.parse_args(argv)
    out = args.out or REPO_ROOT / "outputs" / "privacy_sums" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for g in args.graphs:
        for s in args.settings:
            for c in args.codecs:
                case = run_case(g, s, c, bcd_iters=args.bcd_iters, x_iters=args.x_iters, max_calls=args.max_calls,
                                seed=args.seed, lattice_max_degree=args.lattice_max_degree)
                cases.append(case)
                print(table([case]).splitlines()[-1] if "refused" in case else table([case]).split("\n", 2)[2],
                      flush=True)
                (out / "sums.json").write_text(json.dumps({"command": " ".join(["python", "scripts/privacy_sums.py",
                                                                                 *(argv or sys.argv[1:])]),
                                                           "cases": cases}, indent=1, default=float))
    (out / "sums.md").write_text(table(cases))
    print(f"wrote {out / 'sums.json'} and {out / 'sums.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
