"""Which digits of the default run's result line hold across machines (issue 42).

Runs ``python -m ppdnmf_torch`` (the README's default run) in fresh processes under the
vector units and kernel paths this machine can stand in for another's: torch's
``ATEN_CPU_CAPABILITY`` (default, avx2, avx512 where the CPU has it, which also picks
TorchInductor's code), MKL's code path ``MKL_CBWR`` (unset: its choice for this CPU;
COMPATIBLE, AVX2) and ``OMP_NUM_THREADS`` 1 and 2, each with a TorchInductor cache of its
own, and prints the line of each and the digits all of them share.

    python scripts/default_run_digits.py              # 3 x 3 x 2 = 18 runs where AVX512 exists
    python scripts/default_run_digits.py --quick      # 4 runs
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LINE = re.compile(r"final NMSE after (\d+) BCD iterations: distributed ([\d.e+-]+) \| centralized ([\d.e+-]+) \| "
                  r"consensus ([\d.e+-]+)")


def _shared(values: list[str]) -> str:
    """The leading significant digits every value shares (``"0.1076"`` of ``0.107624``, ``0.107658``)."""
    floats = [float(v) for v in values]
    for sig in range(8, 0, -1):
        shown = {f"{v:.{sig}g}" for v in floats}
        if len(shown) == 1:
            return shown.pop()
    lo, hi = min(floats), max(floats)
    return f"between {lo:.3g} and {hi:.3g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    caps = ["default", "avx2"] + (["avx512"] if torch.backends.cpu.get_cpu_capability() == "AVX512" else [])
    cbwr = ["", "COMPATIBLE", "AVX2"]
    threads = ["1", "2"]
    grid = list(itertools.product(caps, cbwr, threads))
    if args.quick:
        grid = [("avx2", "", "2"), ("default", "COMPATIBLE", "1"), (caps[-1], "", "2"), (caps[-1], "AVX2", "1")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for cap, cb, th in grid:
            env = dict(os.environ, ATEN_CPU_CAPABILITY=cap, OMP_NUM_THREADS=th,
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, f"inductor_{cap}"),
                       PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            env.pop("MKL_CBWR", None)
            if cb:
                env["MKL_CBWR"] = cb
            t0 = time.perf_counter()
            r = subprocess.run([sys.executable, "-m", "ppdnmf_torch", f"hydra.run.dir={tmp}/run_{cap}_{cb}_{th}",
                                "progress=false", "logger=none"], cwd=tmp, env=env, capture_output=True, text=True)
            m = LINE.search(r.stdout)
            if not m:
                print(f"{cap:8s} MKL_CBWR={cb or '(unset)':10s} threads {th}: no result line (exit {r.returncode})")
                continue
            rows.append(m.groups())
            print(f"{cap:8s} MKL_CBWR={cb or '(unset)':10s} threads {th}: distributed {m[2]} | centralized {m[3]} | "
                  f"consensus {m[4]}   ({time.perf_counter() - t0:.0f} s)", flush=True)
    if rows:
        cols = list(zip(*rows))
        print(f"{len(rows)} runs, torch {torch.__version__}, this CPU's capability "
              f"{torch.backends.cpu.get_cpu_capability()}: shared digits: distributed {_shared(list(cols[1]))} | "
              f"centralized {_shared(list(cols[2]))} | consensus {_shared(list(cols[3]))}")
        for name, col in (("distributed", cols[1]), ("centralized", cols[2]), ("consensus", cols[3])):
            vals = sorted(float(v) for v in col)
            print(f"  {name}: {vals[0]:.6g} to {vals[-1]:.6g}")


if __name__ == "__main__":
    main()
