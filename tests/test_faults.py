"""Issue 33, replayed case by case: the faults that crashed, hung or overwrote.

Each test fails on the code before the fix. The multi-process cases that take tens of
seconds (a stopped rank, a held port) are marked ``slow``; the rest run in-process or as
one short subprocess each.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.checkpoint import CheckpointError, checkpoint_files, load_checkpoint
from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.folderlock import FolderLock

ROOT = Path(__file__).resolve().parents[1]
RING4 = graph.ring(4)
KW = dict(bcd_iters=6, x_iters=2, y_iters=2, device="cpu")


def _Z(seed=0):
    return torch.rand(8, 20, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _stop_at(n):
    def cb(info):
        if info.iteration == n:
            raise KeyboardInterrupt

    return cb


# --------------------------------------------------------------------------------------
# 1. fit(checkpoint_dir=D) never overwrites another run's checkpoints
# --------------------------------------------------------------------------------------


def test_a_fresh_fit_refuses_a_checkpoint_dir_holding_another_runs_checkpoints(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path, callback=_stop_at(3), seed=0, **KW)
    before = {p: Path(p).read_bytes() for p in checkpoint_files(tmp_path)}
    assert before
    with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* holds the checkpoints of another run .*"
                                              r"resume_from="):
        pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path, seed=1, **KW)
    assert {p: Path(p).read_bytes() for p in checkpoint_files(tmp_path)} == before  # nothing lost
    # the first run still resumes from its own checkpoints, into its own folder
    full = pp.fit(_Z(), RING4, 2, seed=0, **KW)
    resumed = pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path, resume_from=tmp_path, seed=0, **KW)
    assert torch.equal(resumed.X, full.X)
    assert not (tmp_path / ".ppdnmf.lock").exists()  # released at the end


def test_a_fit_refuses_a_checkpoint_dir_another_run_is_writing(tmp_path):
    with FolderLock(tmp_path):  # another run (here: this process) holds the folder
        with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* is being written by another ppdnmf run "
                                                  r"\(pid \d+"):
            pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path, **KW)
    assert checkpoint_files(tmp_path) == []
    pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path, **KW)  # free again


# --------------------------------------------------------------------------------------
# 2-5, 8. Ranks: bounded waits, resource bounds and settings checked before any process
# --------------------------------------------------------------------------------------


def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(extra)
    return env


#: a small run of the app: 4 agents, 8 x 20 data, rank 2
SMALL = ["n_agents=4", "data.L=8", "data.M=20", "data.K=2", "solver.rank=2", "solver.x_iters=2", "solver.y_iters=2",
         "centralized=false", "logger=none", "progress=false"]


def _popen(args, cwd, **env):
    return subprocess.Popen([sys.executable, "-m", "ppdnmf_torch", *SMALL, *args], cwd=cwd, env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _error_line(stderr: str) -> str:
    assert "Traceback" not in stderr and "frame #" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("ppdnmf: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("threads", [20000, 10 ** 6])
def test_threads_above_the_bound_are_refused_before_a_thread_is_made(threads, monkeypatch):
    from ppdnmf_torch.models.ppdnmf.config import from_dict
    from ppdnmf_torch.threads import max_threads

    made = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: made.append(n))
    with pytest.raises(ConfigError, match=rf"^threads: {threads} is above the limit of 4 per usable CPU core"):
        pp.fit(_Z(), RING4, 2, threads=threads, **KW)
    with pytest.raises(ConfigError, match=r"^threads: .* at most"):
        from_dict({"threads": threads})
    assert made == []
    assert max_threads() >= 4


def test_local_ranks_are_bounded_before_any_process_starts(monkeypatch):
    import multiprocessing

    from ppdnmf_torch.distributed.launch import check_local_ranks, launch_local, max_local_ranks

    monkeypatch.setattr(multiprocessing, "get_context", lambda *a: pytest.fail("a process was about to start"))
    with pytest.raises(ConfigError, match=r"^world_size: 1000 local ranks is above the limit"):
        launch_local(1000, print)
    with pytest.raises(ConfigError, match=r"^distributed.nproc: 1000 ranks for 10 agents; every rank needs an agent"):
        check_local_ranks(1000, 10, key="distributed.nproc")
    assert check_local_ranks(2, 10) == 2 and max_local_ranks() >= 4


@pytest.mark.parametrize("env, match", [
    ({"RANK": "5", "WORLD_SIZE": "2"}, r"^RANK: the environment variable is 5, but WORLD_SIZE = 2"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, r"^RANK: the environment variable is '-1', not an integer >= 0"),
    ({"RANK": "0", "WORLD_SIZE": "abc"}, r"^WORLD_SIZE: the environment variable is 'abc', not an integer >= 1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "x"}, r"^LOCAL_RANK: the environment variable is 'x'"),
])
def test_the_launchers_variables_are_checked_up_front(env, match, monkeypatch):
    from ppdnmf_torch.distributed.launch import env_world

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ConfigError, match=match):
        env_world()


def test_the_app_refuses_what_its_ranks_could_not_run_before_starting_them():
    from ppdnmf_torch.models.ppdnmf.config import from_dict
    from ppdnmf_torch.app.distributed import DistConfig, _preflight

    cfg = from_dict({"trials": 3, "n_agents": 10})
    with pytest.raises(ConfigError, match=r"^trials: a multi-process run fits one trial, got trials=3"):
        _preflight(cfg, DistConfig(nproc=2), None)
    cfg = from_dict({"n_agents": 10, "device": "cpu"})
    with pytest.raises(ConfigError, match=r"^distributed.nproc: 11 ranks for 10 agents"):
        _preflight(cfg, DistConfig(nproc=11), None)
    with pytest.raises(ConfigError, match=r"^distributed.backend: 'nccl' moves CUDA tensors only.*on cpu"):
        _preflight(cfg, DistConfig(nproc=2, backend="nccl"), None)
    _preflight(cfg, DistConfig(nproc=2), None)


def _rank_pids(launcher: int) -> list:
    """The launcher's rank processes (multiprocessing's spawned children), oldest first."""
    with open(f"/proc/{launcher}/task/{launcher}/children") as fh:
        children = [int(c) for c in fh.read().split()]
    ranks = []
    for pid in children:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"spawn_main" in fh.read():
                ranks.append(pid)
    return sorted(ranks)


@pytest.mark.slow
def test_a_stopped_rank_ends_the_whole_run_within_its_timeout(tmp_path):
    # SIGSTOP one rank: before, rank 0 reported the missing heartbeat and the launcher waited for
    # the stopped process forever ("rank 1: exit code None")
    timeout, heartbeat = 5, 2
    run_dir = tmp_path / "run"
    p = _popen(["distributed.nproc=2", "exchange=quantized", f"distributed.timeout={timeout}",
                f"distributed.heartbeat={heartbeat}", "solver.bcd_iters=100000", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not checkpoint_files(run_dir / "checkpoints" / "rank001"):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.5)
        ranks = _rank_pids(p.pid)
        assert len(ranks) == 2, ranks
        os.kill(ranks[1], signal.SIGSTOP)
        stopped = time.monotonic()
        bound = heartbeat + timeout + 30 + 5 + 30  # watchdog, launcher's grace, SIGTERM's wait, slack
        _, err = p.communicate(timeout=bound + 60)
        took = time.monotonic() - stopped
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert took < bound, (took, err)
    assert p.returncode == 3, err
    line = _error_line(err)
    assert "rank 1" in line and "ended by the launcher" in line, line
    assert not any(os.path.exists(f"/proc/{pid}") for pid in ranks)
    assert checkpoint_files(run_dir / "checkpoints" / "rank000")  # nothing written is lost


@pytest.mark.slow
def test_a_rank_whose_store_port_is_held_by_another_program_ends_within_its_timeout(tmp_path):
    # another listener on MASTER_PORT accepts the connection and never answers: rank 1 hung for
    # minutes, whatever distributed.timeout said
    timeout = 5
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(8)
        port = held.getsockname()[1]
        t0 = time.monotonic()
        p = _popen([f"distributed.timeout={timeout}", f"hydra.run.dir={tmp_path / 'r1'}"], tmp_path, RANK="1", WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        try:
            _, err = p.communicate(timeout=240)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        took = time.monotonic() - t0
        assert p.returncode == 3, err
        line = _error_line(err)
        assert f"127.0.0.1:{port}" in line and "MASTER_PORT" in line, line
        # rank 0 cannot host the store there: one line with the reason
        q = _popen([f"distributed.timeout={timeout}", f"hydra.run.dir={tmp_path / 'r0'}"], tmp_path, RANK="0", WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        _, err0 = q.communicate(timeout=240)
    assert q.returncode == 3 and "EADDRINUSE" in _error_line(err0), err0
    assert took < 120, took  # the interpreter's start (seconds on a busy machine), the timeout, 10 s


# --------------------------------------------------------------------------------------
# 9. PPDNMF.transform checks its input as fit does
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fitted():
    model = pp.PPDNMF(n_components=2, graph=RING4, random_state=0, max_iter=2, tol=0.0, x_iters=2, y_iters=2,
                      device="cpu")
    return model.fit(_Z().T.numpy())


# the estimator takes scikit-learn's X (samples x features, the transpose of Z) and checks it
# with scikit-learn's own validation (ValueError messages of its own), as fit does
@pytest.mark.parametrize("X, error, match", [
    (np.full((3, 8), np.nan), ValueError, r"Input X contains NaN"),
    (np.full((3, 8), np.inf), ValueError, r"Input X contains infinity"),
    (-np.ones((3, 8)), ValueError, r"Negative values in data passed to PPDNMF"),
    (np.array([["a"] * 8] * 3), ValueError, r"string|could not convert"),
    (np.zeros((0, 8)), ValueError, r"0 sample\(s\)"),
    (torch.empty(3, 8, device="meta"), DataError, r"^X: a meta tensor"),
    (np.ma.array(np.ones((3, 8)), mask=np.eye(3, 8, dtype=bool)), DataError, r"^X: a masked array with masked"),
    (np.ones((3, 7)), ValueError, r"X has 7 features, but PPDNMF is expecting 8 features"),
])
def test_transform_checks_its_input_as_fit_does(fitted, X, error, match):
    with pytest.raises(error, match=match):
        fitted.transform(X)


@pytest.mark.parametrize("key, value", [("transform_iters", -5), ("transform_iters", 0), ("transform_iters", 2.5),
                                        ("transform_tol", float("nan")), ("transform_tol", -1.0)])
def test_transform_refuses_bad_settings(fitted, key, value):
    old = getattr(fitted, key)
    fitted.set_params(**{key: value})
    try:
        with pytest.raises(ConfigError, match=rf"^{key}: must be"):
            fitted.transform(_Z()[:, :3].T.numpy())
    finally:
        fitted.set_params(**{key: old})
    W = fitted.transform(_Z()[:, :3].T.numpy())
    assert W.shape == (3, 2) and bool((W >= 0).all()) and float(W.sum()) > 0


def test_fit_refuses_meta_tensors_and_masked_arrays():
    with pytest.raises(DataError, match=r"^Z: is a meta tensor"):
        pp.fit(torch.empty(8, 20, device="meta"), RING4, 2, **KW)
    masked = np.ma.array(_Z().numpy(), mask=np.zeros((8, 20), dtype=bool))
    masked.mask[0, 0] = True
    with pytest.raises(DataError, match=r"^Z: a masked array with 1 masked entries"):
        pp.fit(masked, RING4, 2, **KW)
    pp.fit(np.ma.array(_Z().numpy()), RING4, 2, **KW)  # nothing masked: the values are the data


# --------------------------------------------------------------------------------------
# 10. Smaller: data files, seeds, a closed exchange's keys
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("content, match", [
    (b"", r"matrix is empty"),
    (b"# only a comment\n", r"matrix is empty"),
])
def test_an_empty_csv_is_one_error_without_numpys_warning(tmp_path, content, match):
    from ppdnmf_torch.data import load_csv

    path = tmp_path / "z.csv"
    path.write_bytes(content)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's UserWarning would fail here
        with pytest.raises(DataError, match=match):
            load_csv(path)


@pytest.mark.parametrize("content, match", [
    (b"1,2\n3,4\n", r"does not start with the .npy magic bytes: it is a text file \(a CSV\?"),
    (b"\x00\x01\x02garbage\xff", r"does not start with the .npy magic bytes: it is not a .npy file"),
    (b"", r"does not start with the .npy magic bytes: it is empty"),
])
def test_a_npy_file_that_is_not_one_is_named_for_what_it_is(tmp_path, content, match):
    from ppdnmf_torch.data import load_npy

    path = tmp_path / "z.npy"
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"^path: .*{match}") as err:
        load_npy(path)
    assert "pickled" not in str(err.value)


@pytest.mark.parametrize("seed", [-1, 2 ** 70])
def test_fit_refuses_seeds_the_cli_refuses(seed):
    with pytest.raises(ConfigError, match=r"^seed: must be an integer from 0 to 2\*\*63 - 1"):
        pp.fit(_Z(), RING4, 2, seed=seed, **KW)
    with pytest.raises(ConfigError, match=r"^seeds\[1\]: must be an integer from 0"):
        pp.fit_trials([_Z(), _Z()], [RING4, RING4], 2, seeds=[0, seed], **KW)


@pytest.mark.crypto
def test_a_closed_exchange_leaves_no_private_key_in_the_agents_a_caller_kept():
    import pickle
    import warnings

    from ppdnmf_torch.exchange import IntegerCodec
    from ppdnmf_torch.exchange.paillier import PaillierExchange

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ex = PaillierExchange(IntegerCodec(key_bits=128, n_max=1e5))  # keys made inside, at bind
        kept = []

        def keep(info):
            kept.extend(ex.agents)
            return False

        pp.fit(_Z(), RING4, 2, exchange=ex, callback=keep, bcd_iters=1, x_iters=1, y_iters=1, device="cpu")
    assert kept
    for agent in kept:
        for name in ("_Agent__private_key", "_Agent__crt"):
            held = getattr(agent, name)
            assert held is None, f"{name} still held after close"
        assert pickle.dumps([getattr(agent, "_Agent__private_key")]) == pickle.dumps([None])
        with pytest.raises(RuntimeError, match="its exchange was closed and its private key dropped"):
            agent.decrypt_residues(agent.encrypt([1]))


# --------------------------------------------------------------------------------------
# 6. A write that fails (a full disk) names its file; the earlier checkpoints stay
# --------------------------------------------------------------------------------------


def test_a_checkpoint_write_that_fails_names_its_file(tmp_path):
    # a file size limit (for the fit only) stands in for a full disk: the write fails part-way
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, hard))
    try:
        with pytest.raises(OSError) as err:
            pp.fit(torch.rand(40, 80, dtype=torch.float64), graph.ring(4), 3, checkpoint_dir=tmp_path,
                   bcd_iters=2, x_iters=1, y_iters=1, device="cpu")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert err.value.filename == str(tmp_path / "ckpt_bcd000001.pt") and err.value.strerror, err.value
    assert os.listdir(tmp_path) == []  # no temporary file, no torn checkpoint


# --------------------------------------------------------------------------------------
# 7. Ctrl-C on a multi-process run: one line with the resume command, and resume= finds its ranks
# --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_ctrl_c_on_two_ranks_is_one_line_and_resume_finds_the_ranks(tmp_path):
    run_dir = tmp_path / "run"
    p = _popen(["distributed.nproc=2", "solver.bcd_iters=100000", f"hydra.run.dir={run_dir}"], tmp_path)
    try:
        deadline = time.monotonic() + 240
        while not checkpoint_files(run_dir / "checkpoints" / "rank001"):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.5)
        os.killpg(p.pid, signal.SIGINT)  # a terminal's Ctrl-C: the launcher and its ranks
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 130, err
    assert "frame #" not in err and "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ppdnmf: interrupted after BCD iteration "), err
    assert f"continue with: ppdnmf resume={run_dir}" in lines[0], lines[0]
    done = int(lines[0].split("BCD iteration ")[1].split(";")[0])
    # without distributed.nproc: the run's two ranks are found from its checkpoints
    r = subprocess.run([sys.executable, "-m", "ppdnmf_torch", f"resume={run_dir}", f"solver.bcd_iters={done + 2}"],
                       cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"after {done + 2} BCD iterations" in r.stdout, r.stdout


def test_an_empty_config_yaml_is_named_as_such(tmp_path):
    from ppdnmf_torch.app.resume import resume_target as _resume_target

    (tmp_path / "config.yaml").write_text("")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match=r"^resume: .*config.yaml is empty \(damaged or truncated\)"):
        _resume_target(str(tmp_path))


def test_tensorboard_on_a_full_disk_is_one_line_naming_its_folder(tmp_path, capsys):
    import threading

    from ppdnmf_torch.app.cli import _io_text, _thread_errors
    from ppdnmf_torch.app.tensorboard import TensorBoardLogger

    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hook, threading.excepthook = threading.excepthook, _thread_errors
    logger = TensorBoardLogger(tmp_path / "tb", flush_secs=1)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        with pytest.raises(OSError) as err:
            for step in range(100000):
                logger.writer.add_text("t", "x" * 1000, step)
                logger.writer.flush()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
        threading.excepthook = hook
    assert "Traceback" not in capsys.readouterr().err  # the writer thread's traceback is not shown
    text = _io_text(err.value, str(tmp_path))
    assert text.startswith(f"cannot write {tmp_path / 'tb'} (TensorBoard's events file): "), text


@pytest.mark.slow
def test_a_multi_process_run_never_takes_over_an_interrupted_runs_folder(tmp_path):
    # as ppdnmf's own run folders: the ranks would have overwritten and pruned these checkpoints
    ckpt = tmp_path / "run" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "ckpt_bcd000003.pt").write_bytes(b"an interrupted run's work")
    p = _popen(["distributed.nproc=2", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    _, err = p.communicate(timeout=300)
    assert p.returncode == 2, err
    line = _error_line(err)
    assert line.startswith(f"ppdnmf: error: hydra.run.dir: {tmp_path / 'run'} holds the checkpoints of an "
                           "interrupted run"), line
    assert os.listdir(ckpt) == ["ckpt_bcd000003.pt"]
    assert (ckpt / "ckpt_bcd000003.pt").read_bytes() == b"an interrupted run's work"


def test_fit_rank_refuses_a_checkpoint_dir_holding_another_runs_checkpoints(tmp_path):
    from ppdnmf_torch.distributed.comm import Comm
    from ppdnmf_torch.models.ppdnmf.distributed.engine import fit_rank
    from ppdnmf_torch.distributed.launch import free_port

    comm = Comm.connect(f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=30, heartbeat=None)
    kw = dict(bcd_iters=3, x_iters=2, y_iters=2, device="cpu", checkpoint_dir=tmp_path)
    try:
        fit_rank(comm, _Z(), RING4, 2, seed=0, **kw)
        before = {p: Path(p).read_bytes() for p in checkpoint_files(tmp_path / "rank000")}
        assert before
        with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .*rank000 holds the checkpoints of another run"):
            fit_rank(comm, _Z(), RING4, 2, seed=1, **kw)
        assert {p: Path(p).read_bytes() for p in checkpoint_files(tmp_path / "rank000")} == before
    finally:
        comm.close()


def test_resume_of_a_multi_process_run_is_routed_to_its_ranks(tmp_path):
    from ppdnmf_torch.__main__ import resumed_ranks

    for r in (0, 1, 2):
        (tmp_path / "run" / "checkpoints" / f"rank{r:03d}").mkdir(parents=True)
    (tmp_path / "one" / "checkpoints").mkdir(parents=True)
    assert resumed_ranks([f"resume={tmp_path / 'run'}", "solver.bcd_iters=9"]) == 3
    assert resumed_ranks([f"resume={tmp_path / 'one'}"]) == 0  # a one-process run
    assert resumed_ranks([f"resume={tmp_path / 'missing'}"]) == 0  # the app says what is wrong
    assert resumed_ranks(["seed=1"]) == 0
