"""scripts/gpu_check.sh: valid shell, fits one device call, calls the benchmarks with flags they take."""
from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

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
    # tests, bench_solver, bench_crypto, bench_distributed, bench_fsspca, bench_symnmf, and issue 41's
    # FSSPCA grid and one-trial symmetric NMF, and the CPU's host plans: each bounded
    assert len(limits) == 9
    assert sum(limits) <= GPU_CHECK_SECONDS


@pytest.mark.parametrize("script", ["bench_solver.py", "bench_crypto.py", "bench_fsspca.py", "bench_symnmf.py"])
def test_gpu_check_passes_flags_the_benchmarks_take(script):
    text = GPU_CHECK.read_text()
    # every --flag on the benchmark's own command lines and in the arrays fed to them
    used = set()
    for line in text.splitlines():
        if script in line or (script == "bench_solver.py" and "solver_extra=" in line) or (
                script == "bench_crypto.py" and "crypto=(" in line) or (
                script == "bench_symnmf.py" and "symnmf=(" in line):
            used.update(re.findall(r"(--[a-z][a-z-]*)", line))
        if (script == "bench_fsspca.py" and "fsspca_grid=(" in line) or (
                script == "bench_symnmf.py" and "one_trial=(" in line):
            used.update(re.findall(r"(--[a-z][a-z-]*)", line))
    used.discard("--json")  # checked below with the rest, listed here for clarity
    help_text = subprocess.run([sys.executable, str(ROOT / "scripts" / script), "--help"], capture_output=True,
                               text=True, check=True).stdout
    accepted = set(re.findall(r"(--[a-z][a-z-]*)", help_text))
    assert used, "no flags found: the pattern no longer matches the script"
    assert used <= accepted, f"{script} does not take {sorted(used - accepted)}"
    assert "--json" in accepted


def _bench_solver():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_solver", ROOT / "scripts" / "bench_solver.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_marginal_cost_alternates_lengths_and_cancels_fixed_work():
    """The benchmark's two-length difference: fixed per-run work cancels, the best of each
    length counts, the lengths alternate, and noise that makes the short runs the slower
    gives NaN, not a speed."""
    bench = _bench_solver()
    calls, slow = [], iter([0.5, 0.0, 0.0, 0.0, 0.0, 0.0])  # a slow moment on the first run

    def run(n):
        calls.append(n)
        return 2.0 + 0.01 * n + next(slow)  # 2 s of setup, 10 ms per iteration

    assert bench._marginal(run, 50, 3) == pytest.approx(0.01)
    assert calls == [100, 50] * 3
    assert math.isnan(bench._marginal(lambda n: 1.0 - 0.001 * n, 50, 2))  # longer runs were faster


def test_flops_per_iteration_counts_the_three_products():
    """Eq. 9's product and its E diag(d) E^T, and eq. 13's product, real columns only: the
    count of a naive triple loop, 2 operations per multiply-add."""
    bench = _bench_solver()
    N, L, K, cols = 3, 7, 4, [5, 2, 6]
    u_update = sum(2 * L * K * K for _ in cols)
    inverse = sum(2 * K * K * K for _ in cols)
    v_update = sum(2 * K * K * m for m in cols)
    assert bench.flops_per_iteration(N, L, K, sum(cols)) == u_update + inverse + v_update


@pytest.mark.parametrize("flop_rate, binding", [(1e9, "compute"), (1e12, "memory")])
def test_roofline_bound_takes_the_binding_ceiling(flop_rate, binding):
    bench = _bench_solver()
    roof = bench.roofline_bound(nbytes=2e9, flops=4e9, copy_bw=50e9, flop_rate=flop_rate)
    assert roof["memory_s"] == pytest.approx(0.04)
    assert roof["compute_s"] == pytest.approx(4e9 / flop_rate)
    assert roof["bound"] == binding
    assert roof["bound_s"] == pytest.approx(max(0.04, 4e9 / flop_rate))
    # when compute binds, no implementation of these products moves the bytes faster
    expected = 0.04 / 4.0 if binding == "compute" else 1.0
    assert roof["max_fraction_of_copy"] == pytest.approx(expected)


def test_gemm_rate_times_the_solver_products():
    bench = _bench_solver()
    rate = bench.gemm_rate(torch.device("cpu"), N=4, L=6, K=3, M=5, repeats=2)
    assert math.isfinite(rate) and rate > 0


def test_bytes_per_iteration_is_one_pass_over_the_state():
    """8 ``(L, K)`` tensors per agent (read U, P, Z Y^T, Q, the neighbours' U; write U, P, Q)
    and 5 ``(K, M_i)`` per agent (read V, R, X^T Z; write V, R), 8 bytes an entry."""
    bench = _bench_solver()
    N, L, K, cols = 3, 7, 4, [5, 2, 6]
    assert bench.bytes_per_iteration(N, L, K, sum(cols)) == 8 * (8 * N * L * K + 5 * K * sum(cols))


def test_bench_devices_auto_is_the_cpu_and_cuda_when_present():
    bench = _bench_solver()
    cpu = torch.device("cpu")
    want = [cpu] + ([torch.device("cuda", torch.cuda.current_device())] if torch.cuda.is_available() else [])
    assert bench.resolve_devices(["auto"]) == want
    assert bench.resolve_devices(["cpu", "auto", "cpu"]) == want  # each device once


def test_bench_loop_max_n_times_the_batched_solver_only_above_it(monkeypatch):
    """Above ``--loop-max-n`` the loop is not run (NaN, no ratio); every row is handed on as
    it is measured, so a run stopped by a time limit keeps it."""
    bench = _bench_solver()
    monkeypatch.setattr(bench, "SIZES", {"tiny": dict(L=4, K=2, cols=3)})
    looped = []
    monkeypatch.setattr(bench, "time_reference", lambda blocks, *a, **k: looped.append(len(blocks)) or 1.0)
    monkeypatch.setattr(bench, "time_batched", lambda blocks, *a, **k: 0.01)
    rows, seen = [], []
    out = bench.bench_loop_vs_batched(torch.device("cpu"), [3, 5], False, ["eager"], loop_max_n=4, rows=rows,
                                      on_row=lambda: seen.append(len(rows)))
    assert out is rows and seen == [1, 2] and looped == [3]
    assert rows[0]["eager_speedup"] == pytest.approx(100.0) and rows[0]["device"] == "cpu"
    assert math.isnan(rows[1]["loop_s_per_iter"]) and math.isnan(rows[1]["eager_speedup"])
    # a second device reuses the loop's times (the loop runs on the CPU either way)
    times = {}
    bench.bench_loop_vs_batched(torch.device("cpu"), [3], False, ["eager"], loop_times=times)
    bench.bench_loop_vs_batched(torch.device("cpu"), [3], False, ["eager"], loop_times=times)
    assert looped == [3, 3] and times == {("tiny", 3): 1.0}


def test_numpy_loop_equals_the_per_agent_reference():
    """bench_solver's per-agent NumPy loop (issue 41's baseline) computes tests/reference.py's
    iterates: the same draws and equations, NumPy's solves and sums rounding their own way."""
    from reference import reference_fit

    bench = _bench_solver()
    blocks, g = bench.problem(5, 6, 3, 4, seed=1)
    edges = list(g.edges)
    kw = dict(bcd_iters=2, x_iters=4, y_iters=3, mu=1.0, eta=1.0, g_max=0.05)
    ref = reference_fit(blocks, edges, 3, **kw)
    X, Y = bench.numpy_loop([b.numpy() for b in blocks], edges, 3, **kw)
    for i in range(5):
        np.testing.assert_allclose(X[i], ref["X"][i].numpy(), rtol=0, atol=1e-10)
        np.testing.assert_allclose(Y[i], ref["Y"][i].numpy(), rtol=0, atol=1e-10)
