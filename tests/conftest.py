"""Shared fixtures: devices, small problems, and Paillier keys made once per session; the
machine named at the top of the run (``pytest_report_header``), so that a failure that
depends on the CPU says which one."""
from __future__ import annotations

import logging
import os
import platform
import signal
import sys
import tempfile
from pathlib import Path

import pytest
import torch


def _machine_setup() -> None:
    """What the run needs of its process, before any test.

    * SIGINT handled: a shell starts a background job (``pytest &``, a CI step's ``nohup``)
      with SIGINT ignored, and the kernel passes "ignored" on to every process it starts, so
      the tests that send Ctrl-C to a CLI run would see it ignored; a handled signal goes back
      to its default in a started process.
    * TorchInductor's cache per CPU capability: its FX graph cache returns the code compiled
      under another ``ATEN_CPU_CAPABILITY`` (torch 2.13: AVX512 kernels reused under
      ``ATEN_CPU_CAPABILITY=avx2`` gave wrong sums and NaN in the fused solver), so a run
      under another capability gets a cache of its own unless ``TORCHINDUCTOR_CACHE_DIR`` is
      set. Subprocesses inherit both.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    cap = os.environ.get("ATEN_CPU_CAPABILITY")
    if cap and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        user = os.environ.get("USER") or str(os.getuid())
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{cap.lower()}")


_machine_setup()


#: the vector units whose presence changes which kernels torch, MKL and the compiler pick
_VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def _cpu_model() -> str:
    """``"AMD EPYC (avx, avx2, fma, avx512f)"``: the model name and its vector units."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = model or platform.processor() or platform.machine() or "unknown"
    units = [f for f in _VECTOR_FLAGS if f in flags]
    return f"{model} ({', '.join(units)})" if units else model


def machine_header() -> list[str]:
    """The lines ``pytest_report_header`` prints: the CPU, what torch uses of it, the threads and
    the versions (the pieces that vary across machines and change a float's last bits)."""
    import numpy as np

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS",
                                                    "MKL_NUM_THREADS", "TORCHINDUCTOR_CACHE_DIR") if k in os.environ)
    blas = "MKL" if torch.backends.mkl.is_available() else "no MKL"
    return [
        f"machine: {_cpu_model()}; {os.cpu_count()} cores, {usable} usable; {platform.system()} {platform.machine()}",
        f"torch {torch.__version__}: CPU capability {torch.backends.cpu.get_cpu_capability()}, {blas}, "
        f"{torch.get_num_threads()} threads ({torch.get_num_interop_threads()} inter-op); "
        f"CUDA {'available: ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'not available'}",
        f"versions: python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}",
        f"environment: {env or '(no ATEN_CPU_CAPABILITY, MKL_CBWR, OMP_NUM_THREADS, MKL_NUM_THREADS set)'}",
    ]


def _torch_chatter(record) -> bool:
    """False for torch's own records below WARNING (its compiler's structured trace
    ``torch.__trace`` is always at DEBUG), so that a failing test's report holds the
    package's log lines, not hundreds of the compiler's."""
    return record.levelno >= 30 or not (record.name == "torch" or record.name.startswith("torch."))


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    plugin = config.pluginmanager.get_plugin("logging-plugin")
    for name in ("report_handler", "caplog_handler"):
        handler = getattr(plugin, name, None)
        if handler is not None:
            handler.addFilter(_torch_chatter)


def pytest_runtest_setup(item):
    """torch's structured trace (``torch.__trace``) is always at DEBUG and must never
    propagate (torch sets it so); a logging configuration that resets the loggers below one
    it names (``logging.config.dictConfig`` naming ``torch``) turns propagation on, and then
    every compilation event prints to stderr through torch's own handler, hundreds of lines
    in a failing test's report. Each test starts with it off again."""
    logging.getLogger("torch.__trace").propagate = False


def pytest_report_header(config):
    return machine_header()


def pytest_sessionstart(session):
    """The machine at the top of the run also under ``-q`` (which hides the report header)."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and session.config.get_verbosity() < 0:
        for line in machine_header():
            reporter.write_line(line)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After failures, the machine again, next to them."""
    if terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.section("machine")
        for line in machine_header():
            terminalreporter.write_line(line)

CBCL_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "cbcl_faces_train.mat"


@pytest.fixture(scope="session")
def _calibration_cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("paillier_calibration")


@pytest.fixture(autouse=True)
def calibration_cache(request, monkeypatch, _calibration_cache_root):
    """Every test's Paillier calibration cache in a folder of its own (created at the first write):
    no test reads or writes the user's real cache (exchange/paillier/calibration_cache.py), nor
    another test's; subprocesses inherit it."""
    folder = _calibration_cache_root / f"t{abs(hash(request.node.nodeid)):x}"
    monkeypatch.setenv("PPDNMF_CACHE", str(folder))
    monkeypatch.delenv("PPDNMF_RECALIBRATE", raising=False)
    return folder


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    """Every device test runs on CPU, and on CUDA where there is one."""
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    return torch.device(request.param)


def small_problem(L=8, K=3, counts=(3, 5, 4, 6), seed=0, dtype=torch.float64):
    """Random nonnegative low-rank-plus-noise blocks ``(L, M_i)`` for solver tests."""
    gen = torch.Generator().manual_seed(seed)
    M = sum(counts)
    X = torch.rand((L, K), generator=gen, dtype=torch.float64)
    Y = torch.rand((K, M), generator=gen, dtype=torch.float64)
    Z = X @ Y + 0.01 * torch.rand((L, M), generator=gen, dtype=torch.float64)
    return list(torch.split(Z.to(dtype), list(counts), dim=1))


@pytest.fixture(scope="session")
def cbcl_path():
    if not CBCL_PATH.exists():
        pytest.skip(f"CBCL data not found at {CBCL_PATH}")
    return CBCL_PATH


@pytest.fixture(scope="session")
def paillier_keypairs():
    """``keys(bits, count)``: ``count`` distinct Paillier key pairs of ``bits`` bits, made once
    per test session and reused (small keys only: tests, never a real run)."""
    from ppdnmf_torch.exchange.paillier import generate_keypairs

    cache: dict = {}

    def keys(bits: int, count: int):
        cache[bits] = generate_keypairs(bits, count, cache.get(bits, ()))
        return list(cache[bits][:count])

    return keys


# -- shared by the exchange tests (test_crypto.py, test_fast_crypto.py) ----------------
def _graphs():
    from ppdnmf_torch.graph import Graph, ring

    return Graph(3, [(0, 1), (1, 2)]), Graph(4, [(0, 1), (1, 2), (2, 3)]), ring(4)


PATH3, PATH4, CYCLE4 = _graphs()
PROTOCOLS = ["masked", "aggregated", "paper"]


def _fake_costs():
    from ppdnmf_torch.exchange.costmodel import PaillierOpCosts

    return PaillierOpCosts(key_bits=128, keygen=1e-3, encryption=1e-4, decryption=2e-4,
                           homomorphic_addition=1e-6, scalar_multiplication=1e-5)


#: made-up per-operation costs, for cost-model tests that must not calibrate
FAKE_COSTS = _fake_costs()


def drive(exchanges, topo, lk, n_iter, seed, scale=1.0, skip_step1=(), agreed=False):
    """ADMM-like iterations with monotone random penalties, the same inputs for every
    exchange; iterations in ``skip_step1`` go without the penalty round of step 1.
    ``agreed``: one draw per trial for all its edges (``penalty_schedule="agreed"``).

    Returns, per exchange, a list of ``(rho from step 1 or None, S, rho from step 5, U, g)``.
    """
    gen = torch.Generator().manual_seed(seed)
    g = torch.zeros(topo.n_directed_edges, dtype=torch.float64)
    trial_of_edge = topo.src // max(1, topo.n_agents)
    outs = [[] for _ in exchanges]
    for m in range(n_iter):
        step = torch.rand(g.shape if not agreed else (topo.n_trials,), generator=gen, dtype=torch.float64)
        g = g + (1.0 - g) * (step[trial_of_edge] if agreed else step)
        U = scale * (2 * torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64) - 0.5)
        for ex, out in zip(exchanges, outs):
            rho = None if m in skip_step1 else ex.penalty_sums(g, bcd_iter=1, admm_iter=m + 1)
            res = ex.exchange(U, g, bcd_iter=1, admm_iter=m + 1)
            out.append((rho, res.S, res.rho, U, g))
    return outs


def penalty_encodings(monkeypatch, topo, seed, lk):
    """Count ``IntegerCodec.encode_penalties`` calls (the returned list grows by one per
    call), and draw an exchange input ``(U (A, lk), g (2E,))``."""
    from ppdnmf_torch.exchange import IntegerCodec

    calls = []
    real = IntegerCodec.encode_penalties
    monkeypatch.setattr(IntegerCodec, "encode_penalties", lambda self, g: calls.append(g) or real(self, g))
    gen = torch.Generator().manual_seed(seed)
    U = torch.rand((topo.n_nodes, lk), generator=gen, dtype=torch.float64)
    g = 0.03 * torch.rand(topo.n_directed_edges, generator=gen, dtype=torch.float64)
    return calls, U, g


@pytest.fixture(scope="module")
def comm():
    """A one-rank process group for the tests that call a run over ranks in this process (one per
    test module: a port each)."""
    from ppdnmf_torch.distributed import Comm, free_port

    c = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=60, heartbeat=None)
    yield c
    c.close()
