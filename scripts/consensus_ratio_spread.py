"""How much one run's final consensus ratio (paper-literal over derived X-step) depends on
rounding: the problem of ``tests/test_reference.py::test_paper_like_penalty_consensus_ordering``
run on its data and on copies perturbed by at most ``--ulps`` units in the last place (the
rounding differences another CPU's kernels would make), by the tests' per-agent reference.

    python scripts/consensus_ratio_spread.py --copies 150

prints the ratios' minimum, 5th percentile, median and maximum, and how many fall below the
test's threshold (3). The test asserts the median of the data and 8 copies.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from reference import reference_fit  # noqa: E402
from test_reference import CYCLE4, make_blocks, perturbed_copies  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copies", type=int, default=150)
    ap.add_argument("--ulps", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threshold", type=float, default=3.0)
    args = ap.parse_args()
    kw = dict(g_max=0.033, bcd_iters=40, x_iters=10, y_iters=10)
    t0 = time.perf_counter()
    ratios = []
    for Z in perturbed_copies(make_blocks(8, 3, [4, 6, 5, 7], seed=1), args.copies, args.seed, args.ulps):
        c_d = reference_fit(Z, CYCLE4, 3, consensus_form="derived", **kw)["history"]["consensus"][-1]
        c_l = reference_fit(Z, CYCLE4, 3, consensus_form="paper_literal", **kw)["history"]["consensus"][-1]
        ratios.append(c_l / c_d)
    r = sorted(ratios[1:]) or ratios
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"unperturbed data: ratio {ratios[0]:.2f}")
    print(f"{len(r)} copies perturbed by < {args.ulps:g} ulp: min {r[0]:.2f}, 5th percentile {r[len(r) // 20]:.2f}, "
          f"median {statistics.median(r):.2f}, max {r[-1]:.2f}; below {args.threshold:g}: "
          f"{sum(x < args.threshold for x in r)} of {len(r)}")


if __name__ == "__main__":
    main()
