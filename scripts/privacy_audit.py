#!/usr/bin/env python
"""Privacy audit of PPDNMF's secure exchange: eavesdropper and honest-but-curious neighbours.

    python scripts/privacy_audit.py [--out DIR] [--bcd-iters 10] [--scenarios paper_synthetic star ...]

Runs :func:`ppdnmf_torch.models.ppdnmf.audit.run_audit` and writes, under ``<out>`` (default
``outputs/privacy_audit/<timestamp>/``):

* ``report.json``: every measured number (per scenario, protocol, attacker/target pair and
  agent; the flags);
* ``report.md``: the same as tables.

Per scenario, also a run to its stopping rule's end (``fit``'s ``tol``; ``--to-stop``) attacked by a
receiver that differences its sums across calls, and the integer and lattice attacks on the two sums (``audit.sums_audit``;
``--no-sums`` skips them) and what the changes of ``rho_int_i`` reveal. Three protocols: ``paper`` and ``aggregated`` (the printed ones; two views of ``aggregated``:
the honest-but-curious agent, which decrypts each neighbour's reply on its own, attack
``decrypt_each``, and an agent that decrypts only the two sums, ``sums_only``) and ``masked``
(the default: the attacks on the sums, two colluding agents, and, per scenario, a real
Paillier run whose replies are decrypted one by one and tested for uniformity and
independence from ``q_j``; see docs/THREAT_MODEL.md).

Default: the paper's synthetic setup (``make_trial(PAPER_EXPERIMENTS["paper_synthetic"],
seed)``: N = 10, average degree 3) with 10 BCD x 30 ADMM iterations, the same data on a
star graph (9 degree-1 leaves), the paper's graph with private random caps, the paper's
setup with 3 ADMM iterations (penalties still moving), and a real Paillier run (128-bit
keys, 2 BCD x 3 ADMM iterations, both protocols) whose transcript is scanned for
plaintexts, and whose ``aggregated`` replies are decrypted one by one with their receivers'
keys (the ``decrypt_each`` attack on real ciphertexts). Exit status 0 whatever the findings (the
audit measures; it does not gate), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))


def parse_args(argv=None):
    from ppdnmf_torch.models.ppdnmf.audit import ALL_SCENARIOS, SCENARIOS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default outputs/privacy_audit/<timestamp>/)")
    p.add_argument("--scenarios", nargs="+", choices=ALL_SCENARIOS, default=list(SCENARIOS))
    p.add_argument("--protocols", nargs="+", choices=("paper", "aggregated", "masked"),
                   default=["paper", "aggregated", "masked"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bcd-iters", type=int, default=10)
    p.add_argument("--x-iters", type=int, default=30)
    p.add_argument("--y-iters", type=int, default=30)
    p.add_argument("--n-max", type=float, default=None,
                   help="quantization scale (default: per scenario, the largest of 1e6, 5e5, ... the codec holds)")
    p.add_argument("--g-bits", type=int, default=16)
    p.add_argument("--key-bits", type=int, default=128, help="Paillier key size (and the codec's range)")
    p.add_argument("--no-paillier", action="store_true", help="skip the real Paillier transcript scan")
    p.add_argument("--no-plain", action="store_true", help="skip the plain-exchange eavesdropper runs")
    p.add_argument("--paillier-bcd-iters", type=int, default=2)
    p.add_argument("--paillier-x-iters", type=int, default=3)
    p.add_argument("--masked-bcd-iters", type=int, default=2,
                   help="BCD iterations of the real masked run per scenario whose replies are decrypted one by "
                        "one (0: none)")
    p.add_argument("--paper-settings", action="store_true",
                   help="record under ppdnmf_torch.PAPER_SETTINGS (default: the library's defaults)")
    p.add_argument("--no-sums", action="store_true", help="skip the integer and lattice attacks on the sums")
    p.add_argument("--sums-max-calls", type=int, default=20, help="informative calls attacked per receiver")
    p.add_argument("--to-stop", type=int, default=None,
                   help="per scenario, also a run to its stopping rule's end (fit's tol, at most this many BCD "
                        "iterations; default fit's bcd_iters, 0: none) attacked across calls")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    for name in ("bcd_iters", "x_iters", "y_iters", "paillier_bcd_iters", "paillier_x_iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.paillier_bcd_iters < 2 and not args.no_paillier:
        p.error("--paillier-bcd-iters must be >= 2: every U equals its all-ones start in BCD iteration 1")
    return args


def _settings(args):
    if not args.paper_settings:
        return None
    from ppdnmf_torch import PAPER_SETTINGS

    return dict(PAPER_SETTINGS)


def _to_stop(args):
    if args.to_stop is not None:
        return args.to_stop or None
    from ppdnmf_torch.models.ppdnmf.config import SOLVER_DEFAULTS

    return SOLVER_DEFAULTS.bcd_iters


def main(argv=None) -> int:
    args = parse_args(argv)
    from ppdnmf_torch.audit import format_markdown
    from ppdnmf_torch.models.ppdnmf.audit import run_audit

    out = args.out or REPO_ROOT / "outputs" / "privacy_audit" / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda s: None) if args.quiet else (lambda s: print(s, flush=True))
    report = run_audit(
        tuple(args.scenarios), seed=args.seed, bcd_iters=args.bcd_iters, x_iters=args.x_iters,
        y_iters=args.y_iters, n_max=args.n_max, g_bits=args.g_bits, key_bits=args.key_bits,
        protocols=tuple(args.protocols), paillier=not args.no_paillier, plain=not args.no_plain,
        paillier_bcd_iters=args.paillier_bcd_iters, paillier_x_iters=args.paillier_x_iters,
        masked_bcd_iters=args.masked_bcd_iters, progress=say, sums=not args.no_sums,
        sums_max_calls=args.sums_max_calls, settings=_settings(args), to_stop=_to_stop(args),
    )
    report["meta"]["command"] = " ".join(["python", "scripts/privacy_audit.py", *(argv or sys.argv[1:])])
    (out / "report.json").write_text(json.dumps(report, indent=1, allow_nan=False))
    (out / "report.md").write_text(format_markdown(report))
    if not args.quiet:
        print()
        for sname, sc in report["scenarios"].items():
            for proto, pa in sc["protocols"].items():
                sm = pa["summary"]
                print(f"{sname:16s} {proto:10s} exact recovery {sm['exact_recovery_pairs']:2d}/"
                      f"{sm['pairs_informative']:2d} pairs, beats baseline {sm['beats_baseline_pairs']:2d}; "
                      f"median rel. error baseline {sm['baseline_rel_err_median']:.3g}, "
                      f"best attack {sm['best_rel_err_median']:.3g}")
                if proto == "masked":
                    print(f"{'':16s} {'(masked)':10s} exact recovery by receivers of degree >= 2: "
                          f"{sm['exact_recovery_pairs_degree2plus']}; of degree 1 (inherent): "
                          f"{sm['exact_recovery_pairs_degree1']}")
                if "sums_only_exact_recovery_pairs" in sm:
                    print(f"{'':16s} {'(sums only)':10s} exact recovery {sm['sums_only_exact_recovery_pairs']:2d}/"
                          f"{sm['pairs_informative']:2d} pairs, beats baseline "
                          f"{sm['sums_only_beats_baseline_pairs']:2d}; median rel. error "
                          f"{sm['sums_only_best_rel_err_median']:.3g} (an agent that decrypts only the sums)")
        for sname, sc in report["scenarios"].items():
            for d, b in (sc.get("sums") or {}).get("by_degree", {}).items():
                print(f"{sname:16s} sums attack, degree {d}: exact values {b['exact_neighbour_values']}/"
                      f"{b['neighbour_values']} at {b['exact_calls']}/{b['informative_calls']} calls, certified "
                      f"{b['certified']} ({b['false_positives']} wrong)")
        for sname, sc in report["scenarios"].items():
            ts = sc.get("across_calls_to_stop")
            if ts:
                print(f"{sname:16s} across calls, run to its stop ({ts['bcd_iters_run']} BCD iterations, "
                      f"{'stopped' if ts['stopped'] else 'cap'}): exact increments read by receivers of degree >= 2 "
                      f"{ts['exact']} of {ts['increments']} ({ts['isolated']} calls with a lone neighbour moving); "
                      f"degree 1 (inherent) {ts['degree1']['exact']} of {ts['degree1']['increments']}")
        for sname, sc in report["scenarios"].items():
            mc = sc.get("masked_ciphertexts")
            if mc:
                ind = mc["independence"]["unmasked_term"]
                print(f"{sname:16s} masked replies decrypted one by one: uniform {mc['uniformity']['uniform']}, "
                      f"|r| with the term {abs(ind['r']):.4f} < {ind['bound']:.4f}: {ind['independent']}, "
                      f"plaintext matches {mc['plaintext_matches']}, listening neighbour unmasked "
                      f"{mc['eavesdropping_neighbour']['unmasked']}, colluders (degree >= 3) unmasked "
                      f"{mc['collusion']['higher_unmasked']}")
        for proto, ev in report["eavesdropper_paillier"].items():
            sc = ev["scan"]
            print(f"paillier/{proto}: {sc['n_hits']} plaintexts on the wire out of {sc['n_plaintexts']} checked, "
                  f"{sc['unobfuscated']} unobfuscated, {sc['repeated_ciphertexts']} repeated ciphertexts")
            de = ev.get("decrypt_each")
            if de:
                print(f"paillier/{proto}: decrypting each reply with the receiver's own key: penalties match "
                      f"{de['penalties_match']}, replies match {de['replies_match']}, q_j exact at "
                      f"{de['q_exact']}/{de['informative']} informative (call, edge) pairs")
        print(f"\nwrote {out / 'report.json'} and {out / 'report.md'} ({report['meta']['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
