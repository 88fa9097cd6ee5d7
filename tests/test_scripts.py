"""scripts/gpu_check.sh: valid shell, fits one device call, calls the benchmarks with flags they take."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"
#: the documented bound of one gpu_check call (a device call may run 10 minutes)
GPU_CHECK_SECONDS = 480


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_check_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(GPU_CHECK)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_gpu_check_steps_fit_one_device_call():
    limits = [int(s) for s in re.findall(r"\btimeout (\d+)\b", GPU_CHECK.read_text())]
    assert len(limits) == 3  # tests, bench_solver, bench_crypto: each step is bounded
    assert sum(limits) <= GPU_CHECK_SECONDS


@pytest.mark.parametrize("script", ["bench_solver.py", "bench_crypto.py"])
def test_gpu_check_passes_flags_the_benchmarks_take(script):
    text = GPU_CHECK.read_text()
    # every --flag on the benchmark's own command lines and in the arrays fed to them
    used = set()
    for line in text.splitlines():
        if script in line or (script == "bench_solver.py" and "solver_extra=" in line) or (
                script == "bench_crypto.py" and "crypto=(" in line):
            used.update(re.findall(r"(--[a-z][a-z-]*)", line))
    used.discard("--json")  # checked below with the rest, listed here for clarity
    help_text = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True,
                               text=True, check=True).stdout
    accepted = set(re.findall(r"(--[a-z][a-z-]*)", help_text))
    assert used, "no flags found: the pattern no longer matches the script"
    assert used <= accepted, f"{script} does not take {sorted(used - accepted)}"
    assert "--json" in accepted
