"""The CLI's rough edges of issue 31: Ctrl-C never aborts the process, a refused run leaves no
run folder, your own data and graph get the library's defaults, the degree-1 warning as one
short line, ``--help`` and its pipe, cost lines in words, counted nouns, the trials' baseline
progress, no dated test count in the docs."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
TINY = ["solver.bcd_iters=2", "solver.x_iters=2", "solver.y_iters=2", "logger=none", "centralized=false"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    env.pop("PYTHONWARNINGS", None)
    return env


def _cli(args, cwd, timeout=240, **kw):
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def _run_config(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


# --------------------------------------------------------------------------------------
# 3. Ctrl-C
# --------------------------------------------------------------------------------------

class _InterruptingFile:
    """A file whose write number ``at`` sends this process SIGINT (Ctrl-C inside torch.save)."""

    def __init__(self, fh, at: int):
        self.fh, self.at, self.n = fh, at, 0

    def write(self, b):
        self.n += 1
        if self.n == self.at:
            os.kill(os.getpid(), signal.SIGINT)
        return self.fh.write(b)

    def flush(self):
        self.fh.flush()


@pytest.mark.parametrize("at", [1, 3, 7, 12])
def test_ctrl_c_inside_torch_save_waits_for_the_write(tmp_path, at):
    """A SIGINT landing inside ``torch.save`` (where Python's own handler aborts the process
    with ``terminate called ... write to closed file`` or turns it into a ``RuntimeError``) is
    delivered after the write: the file is whole and a KeyboardInterrupt follows."""
    from ppdnmf_torch.app import interrupts
    from ppdnmf_torch.checkpoint import write_atomically

    payload = {"X": torch.arange(1000.0), "history": list(range(500))}
    path = tmp_path / "ckpt.pt"
    old = signal.getsignal(signal.SIGINT)
    interrupts.install()
    try:
        with pytest.raises(KeyboardInterrupt):
            write_atomically(str(path), lambda fh: torch.save(payload, _InterruptingFile(fh, at)))
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the deferred interrupt arrives here
                time.sleep(0.005)
    finally:
        signal.signal(signal.SIGINT, old)
    back = torch.load(path)
    assert torch.equal(back["X"], payload["X"]) and back["history"] == payload["history"]


_UNPROTECTED = textwrap.dedent("""
    import os, signal, sys, torch
    sys.path.insert(0, {root!r})
    from ppdnmf_torch.checkpoint import write_atomically
    from tests.test_cli_edges import _InterruptingFile
    try:
        write_atomically(sys.argv[1], lambda fh: torch.save({{"X": torch.arange(1000.0)}}, _InterruptingFile(fh, 7)))
    except BaseException as exc:
        print("raised", type(exc).__name__)
""")


@pytest.mark.slow
def test_without_the_handler_the_write_breaks(tmp_path):
    """The failure the handler prevents: Python's own handler raises inside torch.save, and no
    file is written (or the process aborts)."""
    script = tmp_path / "save.py"
    script.write_text(_UNPROTECTED.format(root=str(ROOT)))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpt.pt")], env=_env(), capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert "raised" in r.stdout or r.returncode == -signal.SIGABRT, (r.stdout, r.stderr)
    assert not (tmp_path / "ckpt.pt").exists()


def _interrupt_cli(tmp_path: Path, delay: float) -> subprocess.CompletedProcess:
    """Start a long run, wait for its first progress line, wait ``delay`` s more, Ctrl-C."""
    run_dir = tmp_path / f"run{time.monotonic_ns()}"  # a folder of its own per try
    p = subprocess.Popen([sys.executable, "-m", "ppdnmf_torch", "solver.bcd_iters=1000", "solver.x_iters=5",
                          "solver.y_iters=5", "centralized=false", "logger=none", "checkpoint_every=1",
                          "progress_interval=1e-6", f"hydra.run.dir={run_dir}"],
                         cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in p.stdout:  # Hydra's console log (the progress lines) is stdout
            seen.append(line)
            if "BCD iteration" in line:
                break
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, "".join(seen) + out, err)


def _check_interrupted(r: subprocess.CompletedProcess) -> None:
    assert "terminate called" not in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == 130, (r.returncode, r.stderr[-2000:])
    assert "ppdnmf: interrupted after BCD iteration" in r.stderr and "ppdnmf resume=" in r.stderr


@pytest.mark.parametrize("seed", [0, 1, pytest.param(2, marks=pytest.mark.slow)])
def test_ctrl_c_never_aborts_the_cli(tmp_path, seed):
    """Ctrl-C at a random moment of a run writing a checkpoint every iteration: exit code 130,
    the resume command, never an abort (exit 134) or a traceback."""
    _check_interrupted(_interrupt_cli(tmp_path, random.Random(seed).uniform(0.0, 0.6)))


@pytest.mark.slow
def test_ctrl_c_never_aborts_the_cli_many_times(tmp_path):
    rng = random.Random(31)
    for _ in range(40):
        _check_interrupted(_interrupt_cli(tmp_path, rng.uniform(0.0, 1.5)))


# --------------------------------------------------------------------------------------
# 5. A refused run leaves no run folder
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["solver.mu=-1"], "solver.mu: must be > 0"),
    pytest.param(["data=csv", "data.path=missing.csv"], "data.path: CSV file not found", marks=pytest.mark.slow),
])
def test_a_refused_run_leaves_no_run_folder(tmp_path, args, message):
    r = _cli([*args, *TINY], cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "outputs").exists(), sorted(p.name for p in tmp_path.rglob("*"))


@pytest.mark.slow
def test_a_refused_run_keeps_a_folder_it_did_not_make(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    r = _cli(["solver.mu=-1", *TINY, f"hydra.run.dir={folder}"], cwd=tmp_path)
    assert r.returncode == 2
    assert (folder / "notes.txt").read_text() == "mine\n"


# --------------------------------------------------------------------------------------
# 6. Your own data and graph: the library's defaults, n_agents from the edge file
# --------------------------------------------------------------------------------------


@pytest.fixture()
def own_inputs(tmp_path):
    Z = np.random.default_rng(0).random((12, 36))
    np.savetxt(tmp_path / "z.csv", Z, delimiter=",")
    np.save(tmp_path / "z.npy", Z)
    (tmp_path / "g.txt").write_text("# n_agents: 6\n0 1\n1 2\n2 3\n3 4\n4 5\n5 0\n0 3\n")
    return tmp_path


@pytest.mark.parametrize("args, preset", [
    (["data=csv", "data.path=z.csv", "graph=file", "graph.path=g.txt"], False),
    pytest.param(["data=npy", "data.path=z.npy", "n_agents=4", "graph=ring"], False, marks=pytest.mark.slow),
    pytest.param(["data=synthetic", "graph=file", "graph.path=g.txt"], False, marks=pytest.mark.slow),
    pytest.param(["data=csv", "data.path=z.csv", "graph=file", "graph.path=g.txt", "experiment=paper_synthetic"],
                 True, marks=pytest.mark.slow),
])
def test_own_data_and_graph_get_the_library_defaults(own_inputs, args, preset):
    run_dir = own_inputs / "run"
    r = _cli([*args, *TINY, f"hydra.run.dir={run_dir}"], cwd=own_inputs)
    assert r.returncode == 0, r.stderr
    cfg = _run_config(run_dir)
    s = cfg["solver"]
    if preset:  # named: the paper's settings
        assert cfg["name"] == "paper_synthetic" and (s["penalty_schedule"], s["init"]) == ("paper", "ones")
    else:
        defaults = yaml.safe_load((ROOT / "conf" / "solver" / "default.yaml").read_text())
        assert cfg["name"] == "custom"
        for key in ("penalty_schedule", "init", "rank", "mu", "g_max"):
            assert s[key] == defaults[key], key
    if "graph=file" in args:
        assert cfg["n_agents"] == 6  # the edge file's header, not the config's 10
    else:
        assert cfg["n_agents"] == 4


@pytest.mark.slow
def test_graph_file_n_agents_on_the_command_line_wins(own_inputs):
    r = _cli(["graph=file", "graph.path=g.txt", "n_agents=8", *TINY], cwd=own_inputs)
    assert r.returncode == 2 and "graph" in r.stderr and "n_agents: 6" in r.stderr, r.stderr


# --------------------------------------------------------------------------------------
# 7. The degree-1 warning: once, short, not a library file's; 10. the trials' baseline line
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("trials", [pytest.param(1, marks=pytest.mark.slow), 100])
def test_degree_one_warning_is_one_short_line(tmp_path, trials):
    r = _cli(["exchange=quantized", f"trials={trials}", "solver.bcd_iters=1", "solver.x_iters=1",
              "solver.y_iters=1", "logger=none", "progress_interval=1e-6", f"hydra.run.dir={tmp_path / 'run'}"],
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "single neighbour" in ln]
    assert len(lines) == 1, lines
    assert lines[0].startswith("ppdnmf: warning: agents [") and len(lines[0]) < 400, lines[0]
    assert "graph.min_degree=2" in lines[0]
    assert ".py:" not in r.stderr and "DegreeOneWarning" not in r.stderr
    if trials > 1:  # the centralized baseline of batched trials reports its progress too
        assert re.search(rf"centralized \({trials} trials\): BCD iteration 1/1", r.stdout), r.stdout


def test_long_lists_in_warnings_are_shortened():
    from ppdnmf_torch.app.cli import _short_lists

    long = "agents [" + ", ".join(f"{a} (trial {t})" for t in range(50) for a in (0, 5)) + "] have"
    assert _short_lists(long) == "agents [0 (trial 0), 5 (trial 0), 0 (trial 1), 5 (trial 1), 0 (trial 2), " \
                                 "... (100 in all)] have"
    assert _short_lists("agents [0, 5] have") == "agents [0, 5] have"


# --------------------------------------------------------------------------------------
# 10. --help, its pipe, cost lines, counted nouns, the docs' test count
# --------------------------------------------------------------------------------------


def test_help_lists_the_distributed_keys():
    """``ppdnmf --help`` is conf/hydra/help/ppdnmf.yaml's template: every key of the
    ``distributed`` section is in it (``ppdnmf --help`` runs the one-process app, which does
    not compose that section)."""
    from ppdnmf_torch.app.distributed import DistConfig

    help_text = (ROOT / "conf" / "hydra" / "help" / "ppdnmf.yaml").read_text()
    for f in fields(DistConfig):
        assert f"distributed.{f.name}=" in help_text, f.name


def test_help_into_a_closed_pipe_prints_no_traceback(tmp_path):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has gone (``ppdnmf --help | head`` after head's lines)
    try:
        r = subprocess.run([sys.executable, "-m", "ppdnmf_torch", "--help"], cwd=tmp_path, env=_env(),
                           stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert "Traceback" not in r.stderr and "BrokenPipeError" not in r.stderr, r.stderr
    assert r.returncode != 0


def test_cost_lines_are_words_not_keys():
    from ppdnmf_torch.app.costs import format_costs

    costs = {"encryptions": 1, "decryptions": 1800, "homomorphic_additions": 134100, "scalar_multiplications": 2,
             "key_pairs": 10, "ciphertext_bytes": 17.5e6, "setup_encryptions": 55, "setup_decryptions": 1,
             "setup_ciphertext_bytes": 66600, "time_setup": 0.25, "estimated_seconds": 510.0,
             "estimated_seconds_keygen": 2.02, "estimated_seconds_setup": 0.5767}
    text = format_costs(costs)
    assert "_" not in text, text
    assert text.startswith("1 encryption, 1,800 decryptions,")
    assert "seed agreement before the rounds: 55 encryptions, 1 decryption, 66.6 kB of ciphertexts" in text
    assert "estimated seed agreement (cost model) 0.577 s" in text


def test_counted_nouns():
    from ppdnmf_torch import fit
    from ppdnmf_torch.errors import DataError
    from ppdnmf_torch.app.outputs import format_summary

    summary = {"nmse": {"distributed": 0.5, "centralized": None}, "wall_time": {"distributed": 1.0},
               "n_iter": {"distributed": 1}, "device": "cpu", "dtype": "float64", "threads": 1,
               "exchange": {"kind": "plain"}, "out_dir": "x"}
    text = format_summary(summary)
    assert "after 1 BCD iteration:" in text and "1 thread," in text
    Z = torch.rand(4, 6, dtype=torch.float64)
    Z[0, 0] = -1.0
    with pytest.raises(DataError, match=r"has 1 negative entry \(min"):
        fit(Z, torch.ones(2, 2) - torch.eye(2), 2, bcd_iters=1, x_iters=1, y_iters=1)


def test_usage_states_no_dated_test_count():
    text = (ROOT / "docs" / "USAGE.md").read_text()
    assert not re.search(r"\d+ tests in", text)


# --------------------------------------------------------------------------------------
# 4. A multi-process run folder: its ranks' checkpoints removed, its result in ppdnmf.log
# --------------------------------------------------------------------------------------


def test_remove_checkpoints_takes_the_ranks_folders(tmp_path):
    from ppdnmf_torch.app.rundir import remove_checkpoints

    ckpt = tmp_path / "checkpoints"
    for r in range(2):
        (ckpt / f"rank{r:03d}").mkdir(parents=True)
        (ckpt / f"rank{r:03d}" / "ckpt_bcd000010.pt").write_bytes(b"x")
    (ckpt / "partition.json").write_text("{}")
    assert remove_checkpoints(tmp_path) == 3
    assert not ckpt.exists()


@pytest.mark.slow
def test_multi_process_run_folder_as_one_process(tmp_path):
    run_dir = tmp_path / "run"
    r = _cli(["distributed.nproc=2", "exchange=quantized", *TINY, "checkpoint_every=1", f"hydra.run.dir={run_dir}"],
             cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not (run_dir / "checkpoints").exists()
    assert "final NMSE after 2 BCD iterations" in (run_dir / "ppdnmf.log").read_text()


# --------------------------------------------------------------------------------------
# 4 and 6 over several processes: the run folder, the log, progress and warnings as in one
# process; the user's own data gets the library's defaults there too
# --------------------------------------------------------------------------------------


def test_a_run_over_two_ranks_reports_and_cleans_up_like_one_process(tmp_path):
    data = tmp_path / "z.csv"
    np.savetxt(data, np.random.default_rng(0).random((8, 24)), delimiter=",")
    out = tmp_path / "run"
    p = _cli(["distributed.nproc=2", "data=csv", f"data.path={data}", "n_agents=4", "graph=star",
              "exchange=quantized", "exchange.n_max=1e4", "solver.bcd_iters=3", "logger=none", "centralized=false",
              "progress_interval=0.01", f"hydra.run.dir={out}"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert not (out / "checkpoints").exists()  # removed once the run finished, as in one process
    log = (out / "ppdnmf.log").read_text(encoding="utf-8")
    assert "BCD iteration 3/3" in log and "final NMSE" in log
    assert "BCD iteration 3/3" in p.stdout  # the progress lines reach the console too (stdout, as Hydra's)
    # the star's leaves have one neighbour: one short warning, once, in the console and the log
    assert p.stderr.count("have a single neighbour") == 1 and "graph.min_degree=2" in p.stderr
    assert "have a single neighbour" in log
    cfg = _run_config(out)
    assert cfg["name"] == "custom" and cfg["solver"]["penalty_schedule"] == "agreed"  # not the paper's preset
