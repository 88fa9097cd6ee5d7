#!/usr/bin/env python
"""Does more entropy in the penalty weights hide a degree-2 receiver's neighbours? (issue 32)

    python scripts/weight_entropy.py [--g-bits 16] [--caps 0.033 1.056 8.0] [--draws 2000] [--seed 0]

A receiver ``i`` of degree 2 knows its own integer draws ``a_j = gamma_ij`` and the sum
``rho_int_i = a_1 x_1 + a_2 x_2`` of its weights, ``x_j = gamma_ji`` its neighbours' draws. Per
cap ``g`` (draws uniform on ``[1, G]``, ``G = round(2^g_bits g)``: more entropy as ``g`` grows)
it counts the pairs ``(x_1, x_2)`` in ``[1, G]^2`` that solve the equation, over ``--draws``
random draws of ``(a_1, a_2, x_1, x_2)``: the candidates the attacker then splits ``S_int_i``
over. Printed per cap: ``log2 G`` (the entropy of one draw), the mean and median count, and
the fraction of draws with one solution (the true one). Exact integer arithmetic (gcd and the
extended Euclidean algorithm), no floating point.
"""
from __future__ import annotations

import argparse
import math
import random
import statistics


def count_solutions(a1: int, a2: int, rho: int, G: int) -> int:
    """Pairs ``(x1, x2)`` with ``1 <= x1, x2 <= G`` and ``a1 x1 + a2 x2 = rho``."""
    g = math.gcd(a1, a2)
    if rho % g:
        return 0
    a1, a2, rho = a1 // g, a2 // g, rho // g
    x1_0 = (rho * pow(a1, -1, a2)) % a2 if a2 > 1 else 0  # x1 = x1_0 (mod a2)
    # x1 = x1_0 + k a2 with x2 = (rho - a1 x1) / a2 in [1, G]: x1 in [ceil((rho - a2 G) / a1), floor((rho - a2) / a1)]
    lo = max(1, -(-(rho - a2 * G) // a1))
    hi = min(G, (rho - a2) // a1)
    if hi < lo:
        return 0
    first = x1_0 + ((lo - x1_0 + a2 - 1) // a2) * a2
    return 0 if first > hi else (hi - first) // a2 + 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--g-bits", type=int, default=16)
    ap.add_argument("--caps", type=float, nargs="+", default=[0.033, 1.056, 8.0])
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    print("| cap g | log2 G | mean solutions | median | one solution (the true one) |")
    print("|---|---|---|---|---|")
    for cap in args.caps:
        G = max(1, round(2 ** args.g_bits * cap))
        counts = []
        for _ in range(args.draws):
            a1, a2, x1, x2 = (rng.randint(1, G) for _ in range(4))
            counts.append(count_solutions(a1, a2, a1 * x1 + a2 * x2, G))
        assert min(counts) >= 1  # the true pair always solves it
        one = sum(c == 1 for c in counts) / len(counts)
        print(f"| {cap:g} | {math.log2(G):.1f} | {statistics.mean(counts):.2f} | {statistics.median(counts):g} | "
              f"{one:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
