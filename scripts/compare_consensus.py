#!/usr/bin/env python
"""PPDNMF's X-step (decentralized ADMM + secure exchange) against the incremental X-step
(I-ADMM / PI-ADMM1 / PI-ADMM2 through ``ppdnmf_torch.consensus``), at equal local work.

    python scripts/compare_consensus.py [--quick] [--out DIR] [--threads 1] [--bench]

Equal local work: every agent solves its local X problem once per ADMM iteration (PPDNMF's
U-update, eq. 9) or once per round of the token (the incremental exact step): ``x_iters = 30``
ADMM iterations against ``x_rounds = 30`` rounds per X-step, the same Y-step (30 ADMM
iterations), the same 100 BCD iterations, data, graphs and seeds (``run_experiment``:
trial ``t`` uses seed ``t``; trials batched). Rows:

* ``admm/plain``: PPDNMF with the insecure plain exchange (the reference for the numbers);
* ``admm/paillier``: PPDNMF with the integer protocol (``aggregated``), run as
  ``exchange="quantized"`` with ``cost_model=True`` (bit-identical to ``paillier``): its
  seconds are the emulation's, ``est_paillier_s`` the cost model's estimate of real
  2048-bit Paillier arithmetic (per-operation costs measured on this machine);
* ``i_admm``, ``pi_admm``, ``pi_admm2``: the incremental X-step (``x_rho = 0.1``, PI-ADMM1
  ``gamma in [0.5, 1.5]``, PI-ADMM2 ``sigma = 1e-3``).

Columns (means over trials, per trial): the final NMSE (each agent's own ``X_i``), the NMSE at
the agents' mean ``Xbar`` (what a single agreed factor gives), the consensus error
``max_i ||X_i - Xbar|| / ||Xbar||``, the vectors (``L x K`` messages) and bytes sent in the
X-steps, wall seconds, and the estimated seconds with real encryption. PPDNMF's vectors:
per ADMM iteration one message per directed edge (plain) or two (the encrypted ask and the
reply); its encrypted bytes are the cost model's ``ciphertext_bytes`` (public keys
included). The incremental X-step sends one token per hop (relays included), ``8 L K``
bytes in float64.

``--privacy`` (on by default; ``--no-privacy``) adds the adversaries: for PPDNMF the existing
audit (:func:`ppdnmf_torch.models.ppdnmf.audit.run_audit`: Paillier transcript scan, curious neighbour),
for the incremental X-step :mod:`ppdnmf_torch.models.ppdnmf.audit.incremental` (eavesdropper on the
tokens: offsets, recursion (11), consensus + offsets, the least-squares attack; curious
agent on the walk). ``--bench`` times the incremental X-step eager against compiled rounds
(``fuse=True``). Writes ``results.json`` and ``results.md`` under ``--out`` (default
``outputs/compare_consensus/<timestamp>/``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

#: (row name, run_experiment keywords) at equal local work
METHODS = (
    ("admm/plain", {}),
    ("admm/paillier", {"exchange": "quantized", "protocol": "aggregated", "exchange_options": {"cost_model": True}}),
    ("i_admm", {"x_solver": "i_admm"}),
    ("pi_admm", {"x_solver": "pi_admm"}),
    ("pi_admm2", {"x_solver": "pi_admm2"}),
)
INCREMENTAL = dict(x_rho=0.1, x_gamma_spread=0.05, x_sigma=1e-3)
FULL = {"synthetic": dict(preset="paper_synthetic", trials=5, bcd_iters=100),
        "cbcl": dict(preset="paper_cbcl", trials=2, bcd_iters=100)}
QUICK = {"synthetic": dict(preset="paper_synthetic", trials=2, bcd_iters=4),
         "cbcl": dict(preset="paper_cbcl", trials=1, bcd_iters=2)}


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run (few trials and BCD iterations)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--setups", nargs="+", choices=sorted(FULL), default=sorted(FULL))
    p.add_argument("--cbcl", default=os.environ.get("PPDNMF_CBCL", str(REPO_ROOT.parent / "shared" / "data"
                                                                        / "cbcl_faces_train.mat")))
    p.add_argument("--no-privacy", action="store_true")
    p.add_argument("--bench", action="store_true", help="also time eager vs compiled incremental X-steps")
    return p.parse_args(argv)


def _nmse_at_mean(res, blocks) -> list[float]:
    """Per trial, ``(1/N) sum_i ||Z_i - Xbar Y_i|| / ||Z_i||`` (the paper's NMSE, ``metrics.nmse``)
    with the agents' mean ``Xbar`` in place of their own ``X_i``."""
    out = []
    for t in range(res.n_trials):
        Xbar = res.X[t].mean(0)
        errs = [float(torch.linalg.matrix_norm(Z.to(Xbar) - Xbar @ Y) / torch.linalg.matrix_norm(Z.to(Xbar)))
                for Z, Y in zip(blocks[t], res.trial_Y(t))]
        out.append(statistics.fmean(errs))
    return out


def _directed_edges(graphs) -> list[int]:
    return [2 * g.n_edges for g in graphs]


def _row(name, exp, blocks, bcd_iters, x_iters) -> dict:
    res = exp.distributed
    T = res.n_trials
    h = exp.history
    L, K = res.X.shape[-2], res.X.shape[-1]
    row = {"method": name, "trials": T, "nmse": float(h["nmse"][-1].mean()),
           "nmse_at_mean": statistics.fmean(_nmse_at_mean(res, blocks)), "consensus": float(h["consensus"][-1].mean()),
           "seconds": exp.seconds["distributed"] / T, "time_x": float(h["time_x"].sum()) / T}
    if "x_vectors" in h:
        row["vectors"] = float(h["x_vectors"].sum(0).mean())
        row["bytes"] = float(h["x_bytes"].sum(0).mean())
        row["est_paillier_s"] = None
    else:
        D = statistics.fmean(_directed_edges(res.graphs))
        encrypted = "crypto_ciphertext_bytes" in h
        row["vectors"] = (2 if encrypted else 1) * D * x_iters * bcd_iters
        row["bytes"] = float(h["crypto_ciphertext_bytes"][-1]) / T if encrypted else row["vectors"] * 8 * L * K
        row["est_paillier_s"] = float(h["crypto_estimated_seconds"][-1]) / T if encrypted else None
    if "centralized_nmse" in h:
        row["centralized_nmse"] = float(h["centralized_nmse"][-1].mean())
    return row


def compare(setup: dict, *, cbcl_path, say) -> list[dict]:
    from ppdnmf_torch import data as data_mod
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial, run_experiment

    preset, T, bcd = setup["preset"], setup["trials"], setup["bcd_iters"]
    cfg = PAPER_EXPERIMENTS[preset]
    kw = dict(trials=T, seed=0, bcd_iters=bcd, device="cpu")
    if cfg.data.kind == "cbcl":
        kw["data_path"] = cbcl_path
    Z_fixed = data_mod.load_cbcl(cbcl_path) if cfg.data.kind == "cbcl" else None
    blocks = [make_trial(cfg, s, Z_fixed)[0] for s in range(T)]
    rows = []
    for i, (name, extra) in enumerate(METHODS):
        say(f"[{preset}] {name}: {T} trials x {bcd} BCD iterations")
        over = dict(extra, **(INCREMENTAL if "x_solver" in extra else {}))
        exp = run_experiment(preset, centralized=(i == 0), **kw, **over)
        rows.append(_row(name, exp, blocks, bcd, cfg.solver.x_iters))
    return rows


def privacy(*, seed: int, bcd_iters: int, say) -> dict:
    """Both audits on the paper's synthetic setup (trial ``seed``) and, for the token, a star."""
    from ppdnmf_torch.models.ppdnmf.audit import run_audit
    from ppdnmf_torch.models.ppdnmf.audit.incremental import incremental_audit
    from ppdnmf_torch.models.ppdnmf.experiments import PAPER_EXPERIMENTS, make_trial
    from ppdnmf_torch.graph import star

    spec = PAPER_EXPERIMENTS["paper_synthetic"]
    blocks, g = make_trial(spec, seed)
    s = spec.solver
    fit_kw = dict(g_max=s.g_max, mu=s.mu, eta=s.eta, bcd_iters=bcd_iters, x_iters=s.x_iters, y_iters=s.y_iters,
                  negative="allow", seed=seed, device="cpu", **INCREMENTAL)
    inc = incremental_audit({"paper_synthetic": (blocks, g, s.rank), "star": (blocks, star(len(blocks)), s.rank)},
                            progress=say, **fit_kw)
    say("[PPDNMF] the existing audit (paper_synthetic, real Paillier transcript scan)")
    ppd = run_audit(["paper_synthetic"], seed=seed, bcd_iters=bcd_iters, progress=say)
    return {"incremental": inc, "ppdnmf": _ppdnmf_summary(ppd), "seed": seed, "graph_edges": [list(e) for e in g.edges]}


def _ppdnmf_summary(rep: dict) -> dict:
    sc = rep["scenarios"]["paper_synthetic"]
    out = {"fit": sc["fit"], "neighbour": {}, "eavesdropper_paillier": {}}
    for proto, entry in sc["protocols"].items():
        out["neighbour"][proto] = entry["summary"]
    for proto, ev in rep["eavesdropper_paillier"].items():
        out["eavesdropper_paillier"][proto] = {k: ev["scan"][k] for k in ev["scan"] if not isinstance(ev["scan"][k], (list, dict))}
    out["eavesdropper_plain_all_exact"] = sc.get("eavesdropper_plain", {}).get("all_recovered_exactly")
    return out


def bench(*, cbcl_path, say, bcd_iters: int = 6) -> list[dict]:
    """Per-X-step seconds of the incremental X-step, eager against compiled rounds (``fuse=True``,
    a fresh inductor cache: the first X-step includes the cold compile)."""
    from ppdnmf_torch.models.ppdnmf.experiments import run_experiment

    rows = []
    for preset, extra in (("paper_synthetic", {}), ("paper_cbcl", {"data_path": cbcl_path})):
        for fuse in (False, True):
            say(f"[bench] {preset} fuse={fuse}")
            with tempfile.TemporaryDirectory() as cache:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
                exp = run_experiment(preset, trials=1, seed=0, bcd_iters=bcd_iters, centralized=False,
                                     device="cpu", x_solver="pi_admm", fuse=fuse, **INCREMENTAL, **extra)
            tx = [float(v) for v in exp.history["time_x"]]
            rows.append({"setup": preset, "mode": "round (fuse=True)" if fuse else "eager", "first_x_step_s": tx[0],
                         "later_x_step_s_median": statistics.median(tx[2:]) if len(tx) > 2 else tx[-1],
                         "steps_per_x_step": float(exp.history["x_vectors"][0][0]),
                         "nmse": float(exp.history["nmse"][-1][0])})
    return rows


def markdown(report: dict) -> str:
    lines = [f"# PPDNMF vs the incremental X-step ({report['meta']['created']})", ""]
    for setup, rows in report["comparison"].items():
        cen = rows[0].get("centralized_nmse")
        lines += [f"## {setup} ({rows[0]['trials']} trials, {report['meta']['setups'][setup]['bcd_iters']} BCD iterations; "
                  f"centralized NMSE {cen:.5f})" if cen is not None else f"## {setup}", "",
                  "| method | NMSE | NMSE at mean X | consensus | vectors | bytes | seconds | X-step s | est. Paillier s |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            est = "-" if r["est_paillier_s"] is None else f"{r['est_paillier_s']:.4g}"
            lines.append(f"| {r['method']} | {r['nmse']:.5f} | {r['nmse_at_mean']:.5f} | {r['consensus']:.3g} | "
                         f"{r['vectors']:.4g} | {r['bytes']:.4g} | {r['seconds']:.3g} | {r['time_x']:.3g} | {est} |")
        lines.append("")
    if "privacy" in report:
        lines += _privacy_md(report["privacy"])
    if "bench" in report:
        lines += ["## Incremental X-step: eager vs compiled rounds", "",
                  "| setup | mode | first X-step s | later X-step s (median) | token steps per X-step |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['setup']} | {r['mode']} | {r['first_x_step_s']:.3g} | {r['later_x_step_s_median']:.3g} | "
                  f"{r['steps_per_x_step']:.0f} |" for r in report["bench"]]
        lines.append("")
    return "\n".join(lines)


def _privacy_md(pv: dict) -> list[str]:
    lines = ["## Privacy: the adversaries on both", "",
             "Incremental X-step (relative errors, median over agents; exact = below 1e-9):", "",
             "| graph | method | eavesdropper u (offsets) | recursion (11) x / y | consensus + offsets x / y | "
             "lsqr y err (converged / MATLAB) vs the norm of y | curious agent: predecessor u / y |",
             "|---|---|---|---|---|---|---|"]
    for sc, ms in pv["incremental"].items():
        for m, e in ms.items():
            ev, cu = e["eavesdropper"], e["curious"]
            ls = ev["lsqr"]
            lines.append(
                f"| {sc} | {m} | max {ev['offsets_u']['max']:.1e} ({ev['offsets_u']['exact']}/{ev['offsets_u']['of']} exact) | "
                f"{ev['recursion_x']['median']:.2g} / {ev['recursion_y']['median']:.2g} | "
                f"{ev['consensus_x']['median']:.2g} / {ev['consensus_y']['median']:.2g} | "
                f"{ls['converged']['y_err']:.2g} / {ls['matlab_defaults']['y_err']:.2g} vs {abs(ls['converged']['y_true']):.2g} | "
                f"{cu['predecessor_u']['median']:.2g} ({cu['predecessor_u']['exact']} exact) / "
                f"{cu['predecessor_y']['median']:.2g} |")
    p = pv["ppdnmf"]
    lines += ["", "PPDNMF (the existing audit, paper_synthetic):", ""]
    for proto, s in p["neighbour"].items():
        sums = s.get("nbr_mean_rel_err_median")
        lines.append(f"* curious neighbour, protocol={proto}: exact recovery of U_j on {s['exact_recovery_pairs']}/"
                     f"{s['pairs']} pairs (median rel. error {s['best_rel_err_median']:.3g}, baseline "
                     f"{s['baseline_rel_err_median']:.3g})"
                     + ("" if sums is None else f"; an agent that decrypts only the sums: median rel. error {sums:.3g}"))
    for proto, s in p["eavesdropper_paillier"].items():
        lines.append(f"* eavesdropper on the Paillier wire (128-bit keys), protocol={proto}: {s['n_hits']} of "
                     f"{s['n_plaintexts']} plaintexts found among {s['n_payload_integers']} transcript integers, "
                     f"{s['unobfuscated']} unobfuscated, {s['repeated_ciphertexts']} repeated ciphertexts")
    lines.append(f"* eavesdropper on the plain exchange recovers every U_j exactly: {p['eavesdropper_plain_all_exact']}")
    lines.append("")
    return lines


def main(argv=None) -> int:
    a = _args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    out = a.out or REPO_ROOT / "outputs" / "compare_consensus" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    say = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    setups = {k: (QUICK if a.quick else FULL)[k] for k in a.setups}
    t0 = time.perf_counter()
    report = {"meta": {"created": _dt.datetime.now().isoformat(timespec="seconds"), "quick": a.quick,
                       "threads": torch.get_num_threads(), "python": platform.python_version(),
                       "torch": torch.__version__, "machine": platform.machine(), "setups": setups,
                       "incremental": INCREMENTAL},
              "comparison": {}}
    for name, setup in setups.items():
        report["comparison"][name] = compare(setup, cbcl_path=a.cbcl, say=say)
    if not a.no_privacy:
        report["privacy"] = privacy(seed=2, bcd_iters=2 if a.quick else 10, say=say)
    if a.bench:
        report["bench"] = bench(cbcl_path=a.cbcl, say=say, bcd_iters=3 if a.quick else 6)
    report["meta"]["seconds"] = time.perf_counter() - t0
    (out / "results.json").write_text(json.dumps(report, indent=1, default=float))
    md = markdown(report)
    (out / "results.md").write_text(md)
    print(md)
    print(f"wrote {out / 'results.json'} and {out / 'results.md'} ({report['meta']['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
