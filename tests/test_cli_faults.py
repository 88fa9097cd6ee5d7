"""The app's faults for every task (issue 44) and what a user sees (issue 43): one guard for any
task's unfinished run, a resume that would change the numbers refused before anything is
written, exit codes (2 bad input, 3 a lost rank, 130 Ctrl-C, 143 SIGTERM to a launcher) with one
``ppdnmf:`` line, a failed job of a sweep listed while the sweep goes on, the run folder first
and the ``resume=`` command on Ctrl-C for every task, a resumed PPDNMF run that does not fit its
baseline again, the PNG figures, the progress' ETA and lines, ``--help`` per task and without
torch, and the Paillier estimate measured on the run's own exchange.

Subprocess tests start Python (seconds each): the default run keeps the few that need no fit;
the rest are ``slow``.
"""
from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ppdnmf_torch.app.runner import run
from ppdnmf_torch.app.rundir import RunFolderError
from ppdnmf_torch.app.tasks import get_task
from ppdnmf_torch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore", **extra)
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if k not in extra:
            env.pop(k, None)
    return env


def _cli(args, cwd, timeout=300, **env):
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def _cfg(name, **kw):
    base = {"task": name, "progress": False, "logger": {"kind": "none"}}
    for k, v in kw.items():
        node = base
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return get_task(name).config_from_dict(base)


TINY = {"ppdnmf": dict(n_agents=4, centralized=False, **{"data.kind": "synthetic", "data.negative": "allow",
                                                        "data.L": 8, "data.M": 20, "data.K": 2, "graph.kind": "ring",
                                                        "solver.rank": 2, "solver.bcd_iters": 6, "solver.x_iters": 2,
                                                        "solver.y_iters": 2}),
        "symnmf": {"data.n": 30, "rank": 3, "solver.max_iter": 6, "solver.tol": 0.0},
        "fsspca": {"solver.max_iter": 6, "solver.tol": 0.0}}


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


# --------------------------------------------------------------------------------------
# One guard for every task
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("held", ["config", "checkpoints"])
@pytest.mark.parametrize("task", ["ppdnmf", "symnmf", "fsspca"])
def test_a_run_of_any_task_refuses_any_unfinished_run_and_writes_nothing(tmp_path, task, held):
    """Another task's interrupted folder (its config.yaml without summary.json, or its
    checkpoints, whatever their format) is refused before anything is written into it."""
    folder = tmp_path / "held"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "config.yaml").write_text("task: fsspca\n")
    if held == "checkpoints":
        (folder / "checkpoints" / "ckpt_bcd000120.pt").write_bytes(b"someone's work")
    before = _snapshot(folder)
    with pytest.raises(RunFolderError) as info:
        run(_cfg(task, **TINY[task]), folder)
    assert info.value.key == "out_dir" and "resume=" in str(info.value) or "config.yaml" in str(info.value)
    assert _snapshot(folder) == before


def test_a_finished_runs_folder_is_still_reused(tmp_path):
    folder = tmp_path / "done"
    run(_cfg("symnmf", **TINY["symnmf"]), folder)
    again = run(_cfg("symnmf", **TINY["symnmf"], seed=1), folder)
    assert again["seed"] == 1 and json.loads((folder / "summary.json").read_text())["seed"] == 1


def test_the_cli_refuses_an_unfinished_folder_before_hydra_writes_into_it(tmp_path):
    folder = tmp_path / "held"
    folder.mkdir()
    (folder / "config.yaml").write_text("task: symnmf\n")
    before = _snapshot(folder)
    r = _cli(["task=fsspca", f"hydra.run.dir={folder}"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith(f"ppdnmf: error: hydra.run.dir: {folder} holds an unfinished run")
    assert _snapshot(folder) == before and not (folder / ".hydra").exists()


# --------------------------------------------------------------------------------------
# resume=
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task, cap", [("symnmf", "solver.max_iter"), ("fsspca", "solver.max_iter"),
                                       ("ppdnmf", "solver.bcd_iters")])
def test_a_resume_below_what_is_done_is_refused_by_name_and_rewrites_nothing(tmp_path, task, cap):
    from ppdnmf_torch.checkpoint import CheckpointError

    folder = tmp_path / "run"
    t = get_task(task)
    cfg = _cfg(task, **{**TINY[task], "checkpoint_every": 2, "keep_checkpoints": True})
    run(cfg, folder)
    (folder / "summary.json").unlink()  # as interrupted after its last iteration
    before = _snapshot(folder)
    done = t.resume_point(folder / "checkpoints")
    assert done >= 2
    d = t.config_to_dict(cfg)
    head, last = cap.split(".")
    d[head] = {**d[head], last: done - 1}
    with pytest.raises(CheckpointError) as info:
        run(t.config_from_dict(d), folder, resume_from=folder / "checkpoints")
    assert info.value.key == cap and f"has done {done} " in str(info.value) and "nothing was written" in str(info.value)
    assert _snapshot(folder) == before


def test_a_resume_composes_the_saved_runs_task_and_variant(tmp_path):
    from ppdnmf_torch.app.resume import saved_groups

    folder = tmp_path / "r"
    folder.mkdir()
    (folder / "config.yaml").write_text("task: symnmf\nvariant: agents\n")
    assert saved_groups([f"resume={folder}", "agents.max_iter=9"]) == ["task=symnmf", "symnmf/variant=agents"]
    assert saved_groups([f"resume={folder}", "task=symnmf"]) == []
    (folder / "config.yaml").write_text("task: ppdnmf\n")
    assert saved_groups([f"resume={folder}"]) == [] and saved_groups([f"resume={tmp_path / 'none'}"]) == []


# --------------------------------------------------------------------------------------
# Exit codes, one line each
# --------------------------------------------------------------------------------------


def test_a_launchers_variable_that_is_no_integer_is_refused_with_one_line(tmp_path):
    r = _cli(["solver.bcd_iters=2"], tmp_path, timeout=120, WORLD_SIZE="abc", RANK="1")
    assert r.returncode == 2
    assert r.stderr.strip() == ("ppdnmf: error: WORLD_SIZE: the environment variable is 'abc', not an integer >= 1 "
                                "(torchrun, SLURM or the user set it); unset it to run in one process")
    assert not (tmp_path / "outputs").exists()


def _interrupt(args, cwd, *, after=None, delay=0.0, sig=signal.SIGINT, timeout=300):
    """Start ``ppdnmf args``; ``after``: wait for a stderr/stdout line holding it; then ``delay``
    seconds, then ``sig``. Returns the completed process (its output as seen)."""
    p = subprocess.Popen([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        if after is not None:
            for line in p.stdout:
                seen.append(line)
                if after in line:
                    break
        time.sleep(delay)
        p.send_signal(sig)
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return subprocess.CompletedProcess(p.args, p.returncode, "".join(seen) + out, "")


def test_ctrl_c_during_the_imports_is_one_line_and_130(tmp_path):
    """Before the app's own handler is in place (the imports, Hydra's composition)."""
    r = _interrupt(["solver.bcd_iters=2", f"hydra.run.dir={tmp_path / 'r'}"], tmp_path, delay=1.2)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ppdnmf:") or "Traceback" in ln or "Error" in ln]
    assert r.returncode == 130, r.stdout[-2000:]
    assert lines and lines[-1].startswith("ppdnmf: interrupted") and "Traceback" not in r.stdout, r.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("task, args, cap", [
    ("symnmf", ["task=symnmf", "data.n=400", "solver.max_iter=100000", "solver.tol=0"], "solver.max_iter"),
    ("fsspca", ["task=fsspca", "solver.max_iter=100000", "solver.tol=0"], "solver.max_iter"),
    ("fsspca", ["task=fsspca", "fsspca/variant=serverless", "graph=ring", "solver.max_iter=100000", "solver.tol=0"],
     "solver.max_iter"),
    ("symnmf", ["task=symnmf", "symnmf/variant=agents", "data.n=200", "agents.max_iter=100000"], "agents.max_iter"),
])
def test_ctrl_c_names_the_checkpoint_and_the_resume_command_for_every_task(tmp_path, task, args, cap):
    folder = tmp_path / "run"
    r = _interrupt([*args, "checkpoint_every=1", "logger=none", "progress_interval=1e-6", f"hydra.run.dir={folder}"],
                   tmp_path, after=" 3/", delay=0.5)
    last = [ln for ln in r.stdout.splitlines() if ln.startswith("ppdnmf:")][-1]
    assert r.returncode == 130, r.stdout[-2000:]
    # the model's own checkpoint of the iteration the interrupt ended (the driver's RunInterrupted)
    done = get_task(task).resume_point(folder / "checkpoints")
    newest = sorted((folder / "checkpoints").glob("ckpt_bcd*.pt"))[-1]
    assert done >= 3 and last.startswith("ppdnmf: interrupted after ") and get_task(task).step in last, last
    assert f" {done}; checkpoint {newest}; " in last and f"resume={folder}" in last, last
    assert "run folder " + str(folder) in r.stdout.split("iteration")[0]  # the folder comes first
    # the run's own task and variant are composed from its folder: its keys may be given
    again = _cli([f"resume={folder}", "progress=false", f"{cap}={done + 2}"], tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["task"] == task and max(summary["n_iter"]) == done + 2


@pytest.mark.slow
@pytest.mark.parametrize("sig, code, first", [
    (signal.SIGINT, 130, "ppdnmf: interrupted after BCD iteration"),
    (signal.SIGTERM, 143, "ppdnmf: terminated (SIGTERM) after BCD iteration"),
    (signal.SIGKILL, -9, "ppdnmf: error: the launcher (pid"),
])
def test_a_signal_to_the_launcher_alone_ends_in_one_line(tmp_path, sig, code, first):
    """``kill -INT``, ``kill -TERM`` or ``kill -9`` to the ``distributed.nproc=2`` launcher (not to
    its ranks): the ranks stop with their checkpoints, one ``ppdnmf:`` line says how to resume,
    no C++ frames; after ``kill -9`` the launcher's ranks end too."""
    folder = tmp_path / "run"
    r = _interrupt(["distributed.nproc=2", "solver.bcd_iters=100000", "solver.x_iters=5", "solver.y_iters=5",
                    "centralized=false", "logger=none", "checkpoint_every=1", "progress_interval=1e-6",
                    f"hydra.run.dir={folder}"], tmp_path, after="BCD iteration 3/", delay=0.5, sig=sig)
    time.sleep(3 if sig == signal.SIGKILL else 0)  # the orphaned ranks see their launcher gone
    lines = [ln for ln in r.stdout.splitlines() if "progress]" not in ln and ln.strip()]
    assert r.returncode == code, r.stdout[-3000:]
    assert len([ln for ln in lines if ln.startswith("ppdnmf:")]) == 1, r.stdout[-3000:]
    assert "frame #" not in r.stdout and "Traceback" not in r.stdout, r.stdout[-3000:]
    assert any(ln.startswith(first) and f"resume={folder}" in ln for ln in lines), r.stdout[-3000:]


@pytest.mark.slow
def test_a_failed_job_of_a_sweep_is_listed_and_the_sweep_goes_on(tmp_path):
    np.save(tmp_path / "good.npy", np.random.default_rng(0).normal(size=(40, 6)))
    (tmp_path / "bad.npy").write_text("not an array\n")
    r = _cli(["-m", "task=fsspca", "fsspca/data=npy", "data.path=bad.npy,good.npy", "solver.max_iter=2",
              "logger=none", "progress=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "ppdnmf: 1 of 2 jobs failed:" in r.stderr and "job 0: " in r.stderr, r.stderr[-2000:]
    assert (tmp_path / "sweep" / "1" / "summary.json").is_file() and (tmp_path / "sweep" / "0" / "FAILED").is_file()


def test_a_task_without_a_run_over_ranks_says_so_by_name():
    assert get_task("fsspca").n_agents(_cfg("fsspca", n_workers=4)) == 5  # the server and the workers
    with pytest.raises(ConfigError, match=r"^variant: a run over ranks places agents on ranks"):
        get_task("symnmf").n_agents(_cfg("symnmf"))
    assert get_task("ppdnmf").n_agents(_cfg("ppdnmf", n_agents=7)) == 7


@pytest.mark.slow
def test_symmetric_nmf_across_agents_over_ranks_gives_the_one_process_bits(tmp_path):
    # the adaptive lambda's sums: plain in both (over ranks with share="all" they cross in a plain
    # all-reduce, and the secure default is refused there with a line naming this setting)
    args = ["task=symnmf", "symnmf/variant=agents", "data.n=40", "rank=3", "agents.max_iter=6", "agents.n_agents=4",
            "agents.start_seed=0", "agents.aggregation=plain", "progress=false", "logger=none"]
    one = _cli([*args, f"hydra.run.dir={tmp_path / 'one'}"], tmp_path)
    two = _cli([*args, "distributed.nproc=2", f"hydra.run.dir={tmp_path / 'two'}"], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr[-1000:], two.stderr[-1000:])
    assert "2 ranks" in two.stdout
    assert np.array_equal(np.load(tmp_path / "one" / "U.npy"), np.load(tmp_path / "two" / "U.npy"))
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["distributed"]["world_size"] == 2


# --------------------------------------------------------------------------------------
# A resumed PPDNMF run keeps its baseline; the figures
# --------------------------------------------------------------------------------------


def test_a_resumed_ppdnmf_run_reads_its_baseline_back(tmp_path, monkeypatch):
    from ppdnmf_torch.app.tasks import ppdnmf as task_module
    from ppdnmf_torch.models.ppdnmf.solver import RunInterrupted

    cfg = _cfg("ppdnmf", **{**TINY["ppdnmf"], "centralized": True, "checkpoint_every": 1})

    def stop(info):
        if info.iteration == 3:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        run(cfg, tmp_path / "r", callback=stop)
    assert (tmp_path / "r" / "checkpoints" / task_module.BASELINE_NAME).is_file()
    whole = run(_cfg("ppdnmf", **{**TINY["ppdnmf"], "centralized": True}), tmp_path / "whole")

    def refit(*a, **k):
        raise AssertionError("the baseline was fitted again")

    monkeypatch.setattr(task_module, "_fit_centralized", refit)
    again = run(cfg, tmp_path / "r", resume_from=tmp_path / "r" / "checkpoints")
    assert again["nmse"]["centralized"] == whole["nmse"]["centralized"]
    assert again["nmse"]["distributed"] == whole["nmse"]["distributed"]
    assert not (tmp_path / "r" / "checkpoints").exists()  # removed with the checkpoints


@pytest.mark.parametrize("task, extra, names", [
    ("ppdnmf", {}, ["curves.png", "factors.png"]),
    ("symnmf", {}, ["curves.png", "clusters.png"]),
    ("fsspca", {}, ["curves.png", "loadings.png"]),
    ("symnmf", {"variant": "agents", "agents": {"n_agents": 3, "max_iter": 4, "exchange": "plain"}, "graph": {"kind": "ring"},
                "exchange": {"kind": "plain"}}, ["curves.png", "clusters.png"]),
    ("fsspca", {"variant": "serverless", "serverless": {"exchange": "quantized"}, "graph": {"kind": "ring"},
                "exchange": {"kind": "quantized"}}, ["curves.png", "loadings.png"]),
])
def test_every_task_writes_its_figures(tmp_path, task, extra, names):
    t = get_task(task)
    d = t.config_to_dict(_cfg(task, **TINY[task]))
    for k, v in extra.items():
        d[k] = {**(d.get(k) or {}), **v} if isinstance(v, dict) else v
    summary = run(t.config_from_dict(d), tmp_path / "r")
    assert summary["figures"] == names
    for name in names:
        assert (tmp_path / "r" / name).read_bytes()[:8] == PNG, name
    assert not list((tmp_path / "r").glob(".*.tmp"))


# --------------------------------------------------------------------------------------
# Progress: the ETA, and lines above the bar
# --------------------------------------------------------------------------------------


def test_the_eta_leaves_out_the_first_iterations_setup(monkeypatch):
    from ppdnmf_torch.app import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    p = progress.Progress(True, 100, "x", bar=False, interval=1e9)
    clock[0] += 60.0  # a minute of setup before the first iteration
    p.update(1, {})
    assert "ETA" not in p.line(1, {})
    for i in range(2, 6):
        clock[0] += 0.5  # then half a second per iteration
        p.update(i, {})
    assert p.eta(5) == pytest.approx(0.5 * 95)
    assert p.line(5, {}).endswith("ETA 47.5 s")


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_log_records_and_warnings_go_above_a_drawn_bar(monkeypatch):
    from ppdnmf_torch.app import progress

    tty, err = _Tty(), _Tty()
    monkeypatch.setattr(sys, "stderr", err)
    handler = logging.StreamHandler(tty)
    root = logging.getLogger()
    root.addHandler(handler)
    written = []
    monkeypatch.setattr("tqdm.auto.tqdm.write", classmethod(lambda cls, s, file=None, **k: written.append(s)))
    try:
        with progress.Progress(True, 10, "x", bar=True) as bar:
            assert handler not in root.handlers  # stood in for by a writer above the bar
            logging.getLogger("ppdnmf_torch.runner").warning("a record")
            progress.write_line("ppdnmf: warning: a warning")
            bar.update(1, {"nmse": 0.5})
            assert progress.log.name == "ppdnmf_torch.progress"
            progress.log.info("a progress line")  # the log files' only: never on the terminal
        assert handler in root.handlers and not progress._ACTIVE
    finally:
        root.removeHandler(handler)
    assert written == ["a record", "ppdnmf: warning: a warning"]


# --------------------------------------------------------------------------------------
# --help
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["ppdnmf", "symnmf"])
def test_help_shows_the_tasks_own_text_without_torch(tmp_path, task):
    code = ("import sys; sys.argv = ['ppdnmf', 'task=%s', '--help']\n"
            "from ppdnmf_torch.__main__ import main\n"
            "main()\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO TORCH')\n" % task)
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.rstrip().endswith("NO TORCH")
    assert r.stdout.startswith("ppdnmf task=symnmf: symmetric NMF" if task == "symnmf" else "ppdnmf: privacy")
    assert ("symnmf/variant: agents, centralized" in r.stdout) == (task == "symnmf")
    assert ("task: fsspca, ppdnmf, symnmf" in r.stdout) == (task == "ppdnmf")


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["task=fsspca", "--help"]])
def test_the_fast_help_is_hydras_help(tmp_path, args):
    from ppdnmf_torch.app.cli import show_help

    hydra_text = subprocess.run([sys.executable, "-c", "import sys; from ppdnmf_torch.app.cli import _app; "
                                 f"sys.argv = ['ppdnmf', *{args!r}]; _app()"], cwd=tmp_path, env=_env(),
                                capture_output=True, text=True, timeout=300).stdout
    assert show_help([a for a in args if not a.startswith("-")]).strip() == hydra_text.strip()


# --------------------------------------------------------------------------------------
# The Paillier estimate: the run's operations, priced on the run's own exchange path
# --------------------------------------------------------------------------------------


@pytest.mark.crypto
def test_the_paillier_estimate_prices_the_runs_own_path():
    pytest.importorskip("phe")
    from ppdnmf_torch.app.costs import format_estimate, paillier_estimate
    from ppdnmf_torch.exchange import PaillierSpec
    from ppdnmf_torch.graph import ring

    spec = PaillierSpec(n_max=1e3, key_bits=128, workers=0)
    est = paillier_estimate(spec, ring(4), 6, 2, 3, 5)
    assert est["rounds"] == 15 and est["op_costs"].path_factor > 0 and est["seconds_operations"] > 0
    assert est["seconds"] == est["seconds_operations"] + est["seconds_keygen"] + est["seconds_setup"]
    assert "measured here" in format_estimate(spec, est).splitlines()[0]
