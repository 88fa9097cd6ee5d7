#!/usr/bin/env python
"""Agreement study (issue 21): the paper's settings against the library's defaults.

For each data set and graph, the same batched trials run twice, with the paper's
settings (``penalty_schedule="paper"``, ``init="ones"``, ``y_solver="admm"``) and with the
library's defaults (:data:`ppdnmf_torch.models.ppdnmf.config.SOLVER_DEFAULTS`), each against its own
centralized baseline (the same settings, one agent). Reported per row: the final NMSE
(mean over trials), the centralized run's NMSE on the same blocks, the gap between the
two means, the range of the per-trial gaps, the whole data's relative error of both,
the consensus error ``max_i ||X_i - Xbar|| / ||Xbar||`` (mean and worst trial), the
worst-agent NMSE (``nmse_worst``: every block scored with the farthest agent's ``X_w``,
right factors refit) and the wall time per BCD iteration of the batch.

``--timing`` adds single-trial seconds per BCD iteration, paper settings and defaults
alternated (medians), and the Y-step's solvers compared per iteration and per second
(ADMM iterations against HALS sweeps on the same NNLS, from a CBCL-sized state).

    python scripts/consensus_study.py --quick                   # a smoke run, minutes
    python scripts/consensus_study.py --json out.json --md out.md --timing
    python scripts/consensus_study.py --only cbcl --trials 10

The data sets: the paper's synthetic setup (``paper_synthetic``, random graph, and the
same data on a ring and on a star), CBCL (``paper_cbcl``; skipped when the file is
missing; ring and star too), and generated sparse-factor Poisson data
(:func:`ppdnmf_torch.data.sparse_poisson`, ``K = 8``) with ``fit``'s defaults for
``mu``, ``eta`` and ``g_max`` (no tuning for it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import ppdnmf_torch as pp  # noqa: E402
from ppdnmf_torch.models.ppdnmf.config import PAPER_SETTINGS, SOLVER_DEFAULTS  # noqa: E402

#: the library's defaults of the keywords the paper sets
DEFAULTS = {"penalty_schedule": SOLVER_DEFAULTS.penalty_schedule, "init": SOLVER_DEFAULTS.init,
            "y_solver": SOLVER_DEFAULTS.y_solver}
SETTINGS = {"paper": dict(PAPER_SETTINGS), "defaults": dict(DEFAULTS),
            # the earlier default: each agent's own cap (unequal weights; issue 32)
            "adaptive": dict(DEFAULTS, penalty_schedule="adaptive")}
#: the settings a run compares unless --settings says otherwise
COMPARED = ("paper", "defaults")

#: name -> (source, graph kind, trials, quick trials)
CASES = {
    "synthetic": ("paper_synthetic", "random", 100, 4),
    "synthetic_ring": ("paper_synthetic", "ring", 20, 2),
    "synthetic_star": ("paper_synthetic", "star", 20, 2),
    "cbcl": ("paper_cbcl", "random", 10, 1),
    "cbcl_ring": ("paper_cbcl", "ring", 2, 1),
    "cbcl_star": ("paper_cbcl", "star", 2, 1),
    "sparse_poisson": ("sparse_poisson", "random", 20, 2),
    "sparse_poisson_ring": ("sparse_poisson", "ring", 20, 2),
}
SPARSE = dict(n_agents=10, rank=8, lo=10, hi=70)


def _graph(kind: str, n: int, seed: int):
    return pp.graph.make_graph(kind, n, seed=seed, **({"avg_degree": 3.0} if kind == "random" else {}))


def _sparse_trials(kind: str, seeds):
    """The generated trials: sparse-factor Poisson data, uneven splits (10 to 70 columns)."""
    blocks, graphs = [], []
    for s in seeds:
        Z = pp.data.sparse_poisson(seed=s).Z
        counts = pp.data.split_counts(Z.shape[1], SPARSE["n_agents"], SPARSE["lo"], SPARSE["hi"], seed=s)
        blocks.append(pp.data.split_columns(Z, counts))
        graphs.append(_graph(kind, SPARSE["n_agents"], s))
    return blocks, graphs


def _trials(source: str, kind: str, seeds, cbcl_path: str):
    """Blocks, graphs, rank and fit keywords of the trials (the presets' data, splits and
    parameters; the graph kind replaced)."""
    if source == "sparse_poisson":
        blocks, graphs = _sparse_trials(kind, seeds)
        return blocks, graphs, SPARSE["rank"], {}
    preset = pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS[source]
    cfg = dataclasses.replace(preset, graph=pp.models.ppdnmf.config.GraphConfig(kind=kind, **({"avg_degree": 3.0} if kind == "random"
                                                                                else {})))
    Z = pp.data.load_cbcl(cbcl_path) if source == "paper_cbcl" else None
    pairs = [pp.models.ppdnmf.experiments.make_trial(cfg, s, Z) for s in seeds]
    solver = {k: v for k, v in dataclasses.asdict(cfg.solver).items() if k not in SETTINGS["paper"] and v is not None}
    solver.pop("init_seed", None)
    rank = solver.pop("rank")
    return [p[0] for p in pairs], [p[1] for p in pairs], rank, dict(solver, negative=cfg.data.negative)


def _block_errors(blocks, X, Y):
    """``||Z_i - X_i Y_i|| / ||Z_i||`` per agent, and ``||Z - [X_i Y_i]|| / ||Z||`` of the whole
    data, for one trial (``X (N or 1, L, K)``, ``Y`` the matching ``(K, M_i)`` blocks)."""
    res = [torch.linalg.norm(b - X[min(i, X.shape[0] - 1)] @ y) for i, (b, y) in enumerate(zip(blocks, Y))]
    norms = [torch.linalg.norm(b) for b in blocks]
    whole = torch.sqrt(sum(r * r for r in res)) / torch.sqrt(sum(n * n for n in norms))
    return [float(r / n) for r, n in zip(res, norms)], float(whole)


def run_case(source: str, kind: str, trials: int, settings: dict, bcd_iters: int, cbcl_path: str) -> dict:
    """One row: ``trials`` batched trials and their centralized baselines (the same settings).

    The paper's NMSE averages the agents' relative errors, so blocks of a few columns weigh
    as much as large ones; the centralized run's own NMSE is the whole matrix's relative
    error, another quantity. Both runs are therefore scored both ways: the paper's NMSE on
    the agents' blocks (the centralized factors split by the same columns) and the whole
    data's relative error ``||Z - X Y|| / ||Z||``.
    """
    seeds = list(range(trials))
    blocks, graphs, rank, kw = _trials(source, kind, seeds, cbcl_path)
    kw = dict(kw, bcd_iters=bcd_iters, device="cpu", **settings)
    t0 = time.perf_counter()
    # the study ran the plain exchange (the library's default is the secure sum since)
    dist = pp.fit_trials(blocks, graphs, rank, seeds=seeds, **dict({"exchange": "plain"}, **kw))
    seconds = time.perf_counter() - t0
    cent = pp.fit_trials([[torch.cat(b, dim=1)] for b in blocks], [pp.graph.complete(1)] * trials, rank,
                         seeds=seeds, align_trials=False, **dict({"exchange": "plain"}, **kw))
    d_nmse, c_nmse, d_whole, c_whole = [], [], [], []
    for t in range(trials):
        per, whole = _block_errors(blocks[t], dist.X[t], dist.trial_Y(t))
        d_nmse.append(np.mean(per))
        d_whole.append(whole)
        Yc = torch.split(cent.Y[t, 0, :, :sum(b.shape[1] for b in blocks[t])], [b.shape[1] for b in blocks[t]], dim=1)
        per, whole = _block_errors(blocks[t], cent.X[t], Yc)
        c_nmse.append(np.mean(per))
        c_whole.append(whole)
    d_nmse, c_nmse, d_whole, c_whole = (np.asarray(v) for v in (d_nmse, c_nmse, d_whole, c_whole))
    hist = dist.history
    gaps = (d_nmse - c_nmse) / c_nmse
    return {
        "trials": trials, "bcd_iters": bcd_iters,
        "nmse": float(d_nmse.mean()), "central_nmse": float(c_nmse.mean()),
        "gap": float((d_nmse.mean() - c_nmse.mean()) / c_nmse.mean()),
        "gap_min": float(gaps.min()), "gap_max": float(gaps.max()),
        "whole": float(d_whole.mean()), "central_whole": float(c_whole.mean()),
        "gap_whole": float((d_whole.mean() - c_whole.mean()) / c_whole.mean()),
        "central_nmse_own": float(cent.history["nmse"][-1].mean()),
        "history_nmse": float(hist["nmse"][-1].mean()),
        "consensus_mean": float(hist["consensus"][-1].mean()), "consensus_max": float(hist["consensus"][-1].max()),
        "nmse_worst": float(hist["nmse_worst"][-1].mean()),
        "seconds_per_bcd": seconds / bcd_iters,
    }


def timing(cbcl_path: str, bcd_iters: int = 10, rounds: int = 3) -> dict:
    """Single-trial seconds per BCD iteration (the batch's X-step, Y-step and metrics), paper
    settings and defaults alternated ``rounds`` times; medians."""
    out = {}
    probs = {"synthetic": None, "sparse_poisson": None}
    if os.path.exists(cbcl_path):
        probs["cbcl"] = None
    for name in probs:
        if name == "synthetic":
            blocks, g = pp.models.ppdnmf.experiments.make_trial(pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS["paper_synthetic"], 0)
            args = dict(rank=5, mu=0.1, eta=1.0, g_max=0.033, negative="allow")
        elif name == "cbcl":
            Z = pp.data.load_cbcl(cbcl_path)
            blocks, g = pp.models.ppdnmf.experiments.make_trial(pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS["paper_cbcl"], 0, Z)
            args = dict(rank=49, mu=2.0, eta=2.0, g_max=0.05)
        else:
            (blocks,), (g,) = _sparse_trials("random", [0])
            args = dict(rank=SPARSE["rank"])
        rank = args.pop("rank")
        per = {k: [] for k in ("paper", "defaults", "defaults_hals")}
        for _ in range(rounds):
            for key in per:
                settings = dict(SETTINGS["defaults"], y_solver="hals") if key == "defaults_hals" else SETTINGS[key]
                r = pp.fit(blocks, g, rank, bcd_iters=bcd_iters, device="cpu", exchange="plain", **args, **settings)
                h = r.history
                per[key].append(float(np.median(np.add(np.add(h["time_x"], h["time_y"]), h["time_metrics"]))))
        out[name] = {k: float(np.median(v)) for k, v in per.items()}
    return out


def y_step_study(cbcl_path: str, iters=(1, 2, 5, 10, 30)) -> dict:
    """The Y-step's NNLS ``min_{Y>=0} ||Z_i - X_i Y||`` of BCD iteration 21 of a CBCL run
    (defaults): ``X`` of iteration 21's X-step, warm start from iteration 20's ``Y`` (HALS) or
    ``Y, V, R`` (ADMM, eqs. 12-14). The objective's excess over the optimum (HALS, 500 sweeps)
    after ``k`` iterations, relative, and the seconds they take."""
    from ppdnmf_torch.models.ppdnmf.solver import solver_params, y_step
    from ppdnmf_torch.models.ppdnmf.solver.hals import hals_loop

    if not os.path.exists(cbcl_path):
        return {}
    Z = pp.data.load_cbcl(cbcl_path)
    blocks, g = pp.models.ppdnmf.experiments.make_trial(pp.models.ppdnmf.experiments.PAPER_EXPERIMENTS["paper_cbcl"], 0, Z)
    grabbed = {}

    def grab(info):
        grabbed[info.iteration] = {k: v.clone() for k, v in info.state.tensors().items()}

    pp.fit(blocks, g, 49, mu=2.0, eta=2.0, g_max=0.05, bcd_iters=21, device="cpu", callback=grab, exchange="plain",
           **dict(DEFAULTS, y_solver="admm"))
    from ppdnmf_torch.models.ppdnmf.problem import build_problem
    from ppdnmf_torch.models.ppdnmf.solver.state import SolverState

    prob = build_problem([blocks], [g], torch.full((1, 10), 0.05, dtype=torch.float64), [0],
                         dtype=torch.float64, device=torch.device("cpu"))
    s0 = dict(grabbed[20], X=grabbed[21]["X"])
    X, Zb = s0["X"], prob.Z
    G, C = X.mT @ X, X.mT @ Zb

    def objective(Y):
        return float(0.5 * torch.linalg.matrix_norm(Zb - X @ Y).square().sum())

    best = objective(hals_loop(s0["Y"], G, C, 500, prob.width)[0])
    out = {"optimum": best, "admm": {}, "hals": {}}
    for k in iters:
        for solver in ("admm", "hals"):
            st = SolverState(**{n: v.clone() for n, v in s0.items()})
            params = solver_params(49, mu=2.0, eta=2.0, y_iters=k, y_solver=solver)
            t0 = time.perf_counter()
            y_step(prob, st, params)
            sec = time.perf_counter() - t0
            out[solver][k] = {"excess": (objective(st.Y) - best) / best, "seconds": sec}
    return out


def markdown(rows: dict) -> str:
    head = ("| case | settings | trials | NMSE | centralized NMSE (same blocks) | gap | per-trial gaps | "
            "whole-data error: distributed / centralized (gap) | consensus (mean / max) | worst-agent NMSE | "
            "s per BCD iteration (batch) |")
    lines = [head, "|" + "---|" * 11]
    for case, per in rows.items():
        for setting, r in per.items():
            lines.append(
                f"| {case} | {setting} | {r['trials']} | {r['nmse']:.4f} | {r['central_nmse']:.4f} | {r['gap']:+.2%} | "
                f"{r['gap_min']:+.1%} .. {r['gap_max']:+.1%} | {r['whole']:.4f} / {r['central_whole']:.4f} "
                f"({r['gap_whole']:+.2%}) | {r['consensus_mean']:.1e} / {r['consensus_max']:.1e} | "
                f"{r['nmse_worst']:.4f} | {r['seconds_per_bcd']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few trials and 20 BCD iterations: a smoke run")
    ap.add_argument("--only", nargs="*", choices=sorted(CASES), help="run only these cases")
    ap.add_argument("--trials", type=int, help="trials of every case (default: the case's own)")
    ap.add_argument("--bcd-iters", type=int, default=100)
    ap.add_argument("--cbcl", default=pp.models.ppdnmf.experiments.default_cbcl_path(),
                    help="the CBCL .mat file (cases on CBCL are skipped when it is missing)")
    ap.add_argument("--timing", action="store_true", help="also time single trials and the Y-step's solvers")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--json", help="write the numbers to this file")
    ap.add_argument("--md", help="write the markdown table to this file")
    ap.add_argument("--settings", nargs="*", choices=sorted(SETTINGS), default=list(COMPARED),
                    help=f"the settings compared (default: {' '.join(COMPARED)})")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    bcd = 20 if args.quick else args.bcd_iters
    rows = {}
    for case, (source, kind, trials, quick) in CASES.items():
        if args.only and case not in args.only:
            continue
        if source == "paper_cbcl" and not (args.cbcl and os.path.exists(args.cbcl)):
            print(f"{case}: skipped, no CBCL file at {args.cbcl}", file=sys.stderr)
            continue
        n = args.trials or (quick if args.quick else trials)
        rows[case] = {}
        for setting in args.settings:
            values = SETTINGS[setting]
            t0 = time.perf_counter()
            rows[case][setting] = r = run_case(source, kind, n, values, bcd, args.cbcl)
            print(f"{case:20s} {setting:8s} nmse {r['nmse']:.4f} central {r['central_nmse']:.4f} gap {r['gap']:+.2%} "
                  f"consensus max {r['consensus_max']:.1e} worst {r['nmse_worst']:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    out = {"rows": rows, "settings": {k: SETTINGS[k] for k in args.settings}, "bcd_iters": bcd}
    table = markdown(rows)
    if args.timing:
        out["timing"] = timing(args.cbcl, bcd_iters=5 if args.quick else 10, rounds=1 if args.quick else 3)
        out["y_step"] = y_step_study(args.cbcl, iters=(1, 5) if args.quick else (1, 2, 5, 10, 30))
        table += ("\n\nSeconds per BCD iteration, one trial (medians):\n\n"
                  "| data | paper | defaults | defaults, HALS |\n|---|---|---|---|\n")
        table += "\n".join(f"| {k} | {v['paper']:.4f} | {v['defaults']:.4f} | {v['defaults_hals']:.4f} |"
                           for k, v in out["timing"].items())
        if out["y_step"]:
            table += ("\n\nY-step on CBCL (one trial, 10 agents, BCD iteration 21): objective above the "
                      "optimum, seconds\n\n| iterations | ADMM excess | ADMM s | HALS excess | HALS s |\n"
                      "|---|---|---|---|---|\n")
            ys = out["y_step"]
            table += "\n".join(f"| {k} | {ys['admm'][k]['excess']:.2e} | {ys['admm'][k]['seconds']:.4f} | "
                               f"{ys['hals'][k]['excess']:.2e} | {ys['hals'][k]['seconds']:.4f} |" for k in ys["admm"])
    print(table)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
