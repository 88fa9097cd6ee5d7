"""The test run names its machine: the CPU, what torch uses of it, threads and versions at the
top of the run (also under ``-q``) and again after failures; a failing test's report holds no
torch compiler chatter (issue 42: a failure on another CPU must say which one)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from conftest import machine_header

TESTS = Path(__file__).resolve().parent


def test_the_header_names_the_machine():
    text = "\n".join(machine_header())
    assert f"CPU capability {torch.backends.cpu.get_cpu_capability()}" in text
    assert f"{os.cpu_count()} cores" in text
    assert f"{torch.get_num_threads()} threads" in text
    assert f"torch {torch.__version__}" in text and f"numpy {np.__version__}" in text
    assert "python " in text and "machine: " in text


def test_a_run_starts_with_the_machine_and_a_failure_repeats_it_without_torch_chatter(tmp_path):
    # a tiny suite under this conftest: a test that lets torch's structured trace propagate,
    # then one that fails after the trace logged at DEBUG (torch's own handler would print it)
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("project_conftest", {str(TESTS / "conftest.py")!r})
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        pytest_configure, pytest_sessionstart = mod.pytest_configure, mod.pytest_sessionstart
        pytest_terminal_summary, pytest_report_header = mod.pytest_terminal_summary, mod.pytest_report_header
        pytest_runtest_setup = mod.pytest_runtest_setup
    """))
    (tmp_path / "test_fails.py").write_text(textwrap.dedent("""
        import logging

        def test_an_earlier_test_lets_the_trace_propagate():  # as a logging setup that resets loggers does
            logging.getLogger("torch.__trace").propagate = True

        def test_fails():
            trace = logging.getLogger("torch.__trace")
            for k in range(50):
                trace.debug("compile event %d", k)
            logging.getLogger("torch._inductor").warning("a warning of torch stays")
            logging.getLogger("ppdnmf_torch.runner").warning("the package's line stays")
            assert 1 == 2
    """))
    env = dict(os.environ, PYTHONPATH=str(TESTS.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_fails.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1, out + r.stderr
    first = out.splitlines()[:4]
    assert first[0].startswith("machine: ") and "CPU capability" in first[1], out
    assert "compile event 7" not in out, out  # (the test's source, shown with the failure, names the logger)
    assert "a warning of torch stays" in out and "the package's line stays" in out, out
    assert out.count("CPU capability") == 2  # at the top, and in the "machine" section after the failure
