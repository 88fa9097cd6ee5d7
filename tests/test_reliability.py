"""Issue 20, replayed case by case: nothing lost, nothing silent.

Run folders never collide and a fresh run never takes over another's checkpoints;
checkpoints are verified; degenerate results are flagged; resume applies or refuses its
overrides; key sizes are bounded and key generation stops on Ctrl-C; worker pools die with
their parent; I/O faults and bad input give one line (exit 2 on the CLI); a multirun goes
on past a failed job. The CLI cases share their runs (one subprocess each, a few seconds);
everything else calls the library or :func:`ppdnmf_torch.app.runner.run` in-process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import ppdnmf_torch as pp
from ppdnmf_torch import graph
from ppdnmf_torch.checkpoint import (CheckpointError, Checkpointer, _run_hashes, checkpoint_files, load_checkpoint,
                                     save_checkpoint)
from ppdnmf_torch.models.ppdnmf.config import from_dict
from ppdnmf_torch.errors import DataScaleWarning, DegenerateResultWarning
from ppdnmf_torch.app.rundir import RunFolderError, RunFolderLock
from ppdnmf_torch.app.runner import run
from ppdnmf_torch.models.ppdnmf.solver import RunInterrupted

from conftest import small_problem

ROOT = Path(__file__).resolve().parents[1]
RING4 = graph.ring(4)
FAST = dict(bcd_iters=1, x_iters=1, y_iters=1, device="cpu")


def _cfg(**over) -> dict:
    d = {"n_agents": 4, "centralized": False, "progress": False, "checkpoint_every": 1,
         "data": {"kind": "synthetic", "negative": "allow", "L": 8, "M": 20, "K": 2}, "graph": {"kind": "ring"},
         "solver": {"rank": 2, "bcd_iters": 6, "x_iters": 2, "y_iters": 2}, "logger": {"kind": "none"}}
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def _stop_at(n):
    def cb(info):
        if info.iteration == n:
            raise KeyboardInterrupt

    return cb


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    return env


def _cli(args, cwd, timeout=180, warn=False):
    env = _env()
    if warn:  # the package's warnings shown (PYTHONWARNINGS=ignore hides them, as it should)
        env.pop("PYTHONWARNINGS")
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _one_error_line(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ppdnmf: error: "), lines[0]
    return lines[0]


# ======================================================================================
# 1. A fresh run never prunes another run's checkpoints
# ======================================================================================


def test_a_checkpointer_prunes_only_its_own_files(tmp_path):
    # an older run's higher-numbered files survive; the new run keeps its own newest two
    foreign = [tmp_path / f"ckpt_bcd{n:06d}.pt" for n in (20, 21)]
    for f in foreign:
        f.write_bytes(b"another run")
    ck = Checkpointer(str(tmp_path), every=1)
    for n in range(1, 5):
        ck.write({"done": n, "state": {}})
    names = sorted(p.name for p in tmp_path.glob("ckpt_bcd*.pt"))
    assert names == ["ckpt_bcd000003.pt", "ckpt_bcd000004.pt", "ckpt_bcd000020.pt", "ckpt_bcd000021.pt"]
    assert all(f.read_bytes() == b"another run" for f in foreign)


def test_a_fresh_run_refuses_a_folder_holding_an_interrupted_runs_checkpoints(tmp_path):
    # the case: run 1 interrupted, run 2 (solver.mu=0.2) into the same folder
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted):
        run(from_dict(_cfg()), out, callback=_stop_at(3))
    kept = {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()}
    with pytest.raises(RunFolderError, match=r"^out_dir: .* holds the checkpoints of an interrupted run "
                                             r"\(newest: ckpt_bcd000003\.pt\); continue it with: ppdnmf resume="):
        run(from_dict(_cfg(solver={"mu": 0.2})), out)
    assert {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()} == kept
    # and the interrupted run still resumes
    summary = run(from_dict(_cfg()), out, resume_from=out / "checkpoints")
    assert summary["n_iter"]["distributed"] == 6


def test_a_finished_run_removes_its_checkpoints_unless_kept(tmp_path):
    run(from_dict(_cfg()), tmp_path / "a")
    assert not (tmp_path / "a" / "checkpoints").exists()
    run(from_dict(_cfg(keep_checkpoints=True)), tmp_path / "b")
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["ckpt_bcd000005.pt",
                                                                                "ckpt_bcd000006.pt"]


# ======================================================================================
# 2. Run folders: unique names, a lock naming its owner
# ======================================================================================


def test_run_folder_names_are_unique_and_below_the_second():
    from ppdnmf_torch.app.cli import _run_id

    ids = {_run_id() for _ in range(200)}
    assert len(ids) == 200
    day, rest = next(iter(ids)).split("/")
    assert len(day) == 10 and len(rest.split("-")[-1]) == 6 and "." in rest  # HH-MM-SS.mmm-xxxxxx
    text = (ROOT / "conf" / "config.yaml").read_text()
    assert "dir: outputs/${ppdnmf.run_id:}" in text and "dir: outputs/multirun/${ppdnmf.run_id:}" in text


def test_a_second_run_into_a_locked_folder_is_refused_with_the_owner_named(tmp_path):
    out = tmp_path / "run"
    with RunFolderLock(out):
        with pytest.raises(RunFolderError, match=rf"^out_dir: .* is being written by another ppdnmf run "
                                                 rf"\(pid {os.getpid()} on "):
            run(from_dict(_cfg()), out)
        assert not (out / "config.yaml").exists()  # refused before writing anything
    run(from_dict(_cfg()), out)  # released: the folder is free again
    assert not (out / ".ppdnmf.lock").exists()


def test_a_killed_lock_holder_leaves_the_folder_free(tmp_path):
    code = f"from ppdnmf_torch.app.rundir import RunFolderLock; import time; RunFolderLock({str(tmp_path)!r}).acquire(); " \
           "print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderError, match=f"pid {proc.pid}"):
            RunFolderLock(tmp_path).acquire()
    finally:
        proc.kill()
        proc.wait()
    RunFolderLock(tmp_path).acquire().release()  # the kernel dropped the dead holder's lock


# ======================================================================================
# 3. Checkpoints are verified
# ======================================================================================


@pytest.fixture
def checkpointed(tmp_path):
    """A run interrupted after BCD iteration 3 (checkpoint of iteration 3), and its kwargs."""
    kw = dict(bcd_iters=6, x_iters=2, y_iters=2, device="cpu", checkpoint_every=1)
    blocks = small_problem()
    with pytest.raises(RunInterrupted):
        pp.fit(blocks, RING4, 2, checkpoint_dir=tmp_path, callback=_stop_at(3), **kw)
    return blocks, kw, tmp_path


def _resume(checkpointed):
    blocks, kw, folder = checkpointed
    return pp.fit(blocks, RING4, 2, checkpoint_dir=folder, resume_from=folder, **kw)


def _edit(folder, change, rehash=False):
    path = checkpoint_files(folder)[-1]
    payload = torch.load(path, map_location="cpu", weights_only=True)
    change(payload)
    if rehash:  # a consistent file of another run's shape: the structural checks must catch it
        payload["hashes"] = _run_hashes(payload)
    save_checkpoint(path, payload)


def test_a_flipped_byte_inside_a_tensor_is_refused(checkpointed):
    folder = checkpointed[2]
    path = checkpoint_files(folder)[-1]
    X = load_checkpoint(folder)["state"]["X"]
    raw = bytearray(open(path, "rb").read())
    at = bytes(raw).find(X.numpy().tobytes())
    assert at > 0  # torch stores tensors uncompressed: the bytes are there to flip
    raw[at + 3] ^= 0x10
    open(path, "wb").write(bytes(raw))
    with pytest.raises(CheckpointError, match=r"content of state tensor 'X' does not match its hash"):
        _resume(checkpointed)


@pytest.mark.parametrize("change,rehash,match", [
    (lambda p: p.update(done=5), False, r"the run's settings and counters do not match the hash"),
    (lambda p: p.update(done=5), True, r"5 BCD iterations done but its history holds 3 'nmse' entries"),
    (lambda p: p.update(done=2), True, r"2 BCD iterations done but its history holds 3 'nmse' entries"),
    (lambda p: p.update(done=100), True, r"^bcd_iters: the checkpoint .* has done 100 BCD iterations, more than "
                                         r"bcd_iters = 6"),
    # the history is packed, one tensor per key: drop its last entry
    (lambda p: p["history"]["nmse"].update({k: v[:-1] for k, v in p["history"]["nmse"].items()}), False,
     r"the history do not match the hash"),
    (lambda p: p["history"]["nmse"].update({k: v[:-1] for k, v in p["history"]["nmse"].items()}), True,
     r"3 BCD iterations done but its history holds 2 'nmse' entries"),
    (lambda p: p["state"].update(X=p["state"]["X"][:, :, :5]), True, r"state tensor 'X' has shape \(1, 4, 5, 2\), "
                                                                      r"the run needs \(1, 4, 8, 2\)"),
    (lambda p: p["state"].update(X=p["state"]["X"].float()), True, r"state tensor 'X' holds torch.float32"),
    (lambda p: p["state"].pop("V"), True, r"state tensors differ from the model's; missing \['V'\]"),
    (lambda p: p["settings"].update(mu=0.5), True, r"belongs to a different run: its mu is 0.5, this run's 0.1"),
    (lambda p: p.update(model="fsspca"), True, r"is a checkpoint of another model \('fsspca'\); this run is 'ppdnmf'"),
    (lambda p: p.pop("rng"), False, r"lacks its 'rng' entry"),
    (lambda p: p.pop("hashes"), False, r"lacks its 'hashes' entry"),
])
def test_an_edited_checkpoint_is_refused_naming_what_differs(checkpointed, change, rehash, match):
    _edit(checkpointed[2], change, rehash)
    with pytest.raises(CheckpointError, match=match):
        _resume(checkpointed)


def test_a_verified_checkpoint_resumes_bit_identical(checkpointed):
    blocks, kw, _ = checkpointed
    full = pp.fit(blocks, RING4, 2, **{k: v for k, v in kw.items() if k != "checkpoint_every"})
    res = _resume(checkpointed)
    assert torch.equal(res.X, full.X) and res.history["nmse"] == full.history["nmse"]


def test_final_outputs_are_written_atomically(tmp_path, monkeypatch):
    # a write that dies half-way leaves the previous file, never a truncated one
    from ppdnmf_torch.app import outputs

    out = tmp_path / "run"
    run(from_dict(_cfg()), out)
    before = {n: (out / n).read_bytes() for n in ("factors.pt", "summary.json")}
    res = pp.fit(_Z(), RING4, 2, **FAST)

    def dies(obj, fh, *a, **k):
        fh.write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", dies)
    with pytest.raises(OSError):
        outputs.write_factors(out / "factors.pt", res, None, RING4)
    monkeypatch.undo()

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)  # the text outputs die after their bytes went out
    with pytest.raises(OSError):
        outputs.write_summary(out / "summary.json", {"x": 1})
    assert {n: (out / n).read_bytes() for n in before} == before
    assert not list(out.glob(".tmp_*"))


# ======================================================================================
# 4. Degenerate results are flagged
# ======================================================================================


def _fit_warnings(Z, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = pp.fit(Z, RING4, kw.pop("rank", 2), device="cpu", bcd_iters=kw.pop("bcd_iters", 5), **kw)
    return res, caught


def test_huge_data_is_warned_up_front_and_its_collapse_flagged():
    # fit(torch.ones(6, 16) * 1e12, ring4, 2) with the paper's fixed penalties: X == 0, NMSE 1,
    # exit 0 before
    res, caught = _fit_warnings(torch.ones(6, 16) * 1e12, exchange="plain", **pp.PAPER_SETTINGS)
    cats = [w.category for w in caught]
    assert DataScaleWarning in cats and DegenerateResultWarning in cats
    assert cats.index(DataScaleWarning) < cats.index(DegenerateResultWarning)  # up front
    msg = str(next(w.message for w in caught if w.category is DegenerateResultWarning))
    assert "X_i is all zeros for agents" in msg or "the NMSE is" in msg
    assert "likely cause: the data's scale (largest entry 1e+12)" in msg and "data.normalize=true" in msg


@pytest.mark.parametrize("kw,why,cause", [
    ({"eta": 1e300}, "the NMSE is 1", "eta = 1e+300"),
    ({"mu": 1e300}, "X did not move after the first BCD iteration", "mu = 1e+300"),
])
def test_penalties_far_above_the_data_are_flagged(kw, why, cause):
    Z = pp.data.synthetic(L=12, M=40, K=2, seed=0).Z.clamp(min=0)
    _, caught = _fit_warnings(Z, **kw, exchange="plain", **pp.PAPER_SETTINGS)
    msgs = [str(w.message) for w in caught if w.category is DegenerateResultWarning]
    assert len(msgs) == 1 and why in msgs[0] and cause in msgs[0], msgs


def test_a_good_run_is_not_flagged():
    Z = pp.data.synthetic(L=12, M=40, K=2, seed=0).Z.clamp(min=0)
    _, caught = _fit_warnings(Z, bcd_iters=8, x_iters=5, y_iters=5)
    assert not [w for w in caught if w.category in (DegenerateResultWarning, DataScaleWarning)]


def test_the_adaptive_schedule_follows_the_data_scale():
    # the library's defaults raise each mu_i to the data's scale: the 1e12 data that
    # collapses under the paper's fixed penalties (above) is factorized
    res, caught = _fit_warnings(torch.ones(6, 16) * 1e12, bcd_iters=10)
    cats = [w.category for w in caught]
    assert DataScaleWarning in cats and DegenerateResultWarning not in cats
    assert res.nmse < 0.1 and bool((res.X > 0).any())


def test_data_normalize_rescales_and_the_summary_says_so(tmp_path):
    Z = small_problem(counts=(5, 5, 5, 5))
    np.save(tmp_path / "z.npy", (torch.cat(Z, dim=1) * 1e12).numpy())
    d = _cfg(data={"kind": "npy", "path": str(tmp_path / "z.npy"), "negative": "error"},
             solver={"rank": 2, "bcd_iters": 6, "x_iters": 2, "y_iters": 2, **pp.PAPER_SETTINGS},
             exchange={"kind": "plain"})
    for k in ("L", "M", "K"):
        d["data"].pop(k)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bad = run(from_dict(d), tmp_path / "raw")
    assert bad["degenerate"] and any(w.category is DegenerateResultWarning for w in caught)
    d["data"]["normalize"] = True
    good = run(from_dict(d), tmp_path / "normalized")
    assert good["degenerate"] == [] and good["data"]["scale"] == pytest.approx(float(torch.cat(Z, 1).max()) * 1e12)
    assert good["nmse"]["distributed"] < 0.9


# ======================================================================================
# 5. resume= applies safe overrides or refuses, listing them
# ======================================================================================


@pytest.fixture
def interrupted(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted):
        run(from_dict(_cfg(exchange={"kind": "quantized", "n_max": 1e4})), out, callback=_stop_at(3))
    return out


def test_resume_refuses_overrides_that_change_the_run_listing_them(interrupted):
    from ppdnmf_torch.app.resume import resume_target as _resume_target

    new = from_dict(_cfg(solver={"bcd_iters": 10, "mu": 0.5}, exchange={"kind": "plain"}))
    with pytest.raises(pp.ConfigError, match=r"^resume: these overrides would change the run being resumed: "
                                             r"exchange\.kind \('quantized' -> 'plain'\), solver\.mu \(0\.1 -> 0\.5\); "
                                             r"a resumed run keeps its own config and takes only solver\.bcd_iters"):
        _resume_target(str(interrupted), new, ["solver.bcd_iters=10", "exchange=plain", "solver.mu=0.5"])


def test_resume_applies_more_iterations(interrupted):
    from ppdnmf_torch.app.resume import resume_target as _resume_target

    new = from_dict(_cfg(solver={"bcd_iters": 10}, progress=True))
    cfg, folder, ckpt = _resume_target(str(interrupted), new, ["solver.bcd_iters=10", "progress=true",
                                                               "hydra.run.dir=x"])
    assert cfg.solver.bcd_iters == 10 and cfg.exchange.kind == "quantized" and cfg.progress
    summary = run(cfg, folder, resume_from=ckpt, progress=False)
    assert summary["n_iter"]["distributed"] == 10


def test_resume_to_fewer_iterations_than_done_is_refused(interrupted):
    from ppdnmf_torch.app.resume import resume_target as _resume_target

    cfg, folder, ckpt = _resume_target(str(interrupted), from_dict(_cfg(solver={"bcd_iters": 1})),
                                       ["solver.bcd_iters=1"])
    with pytest.raises(CheckpointError, match=r"^solver\.bcd_iters: the checkpoint .* has done 3 BCD iterations, "
                                              r"more than bcd_iters = 1"):
        run(cfg, folder, resume_from=ckpt)


def test_an_empty_resume_is_an_error_not_a_fresh_run():
    with pytest.raises(pp.ConfigError, match=r"^resume: is empty"):
        from_dict(_cfg(resume=""))


def test_a_corrupted_config_yaml_is_one_error(interrupted):
    from ppdnmf_torch.app.resume import resume_target as _resume_target

    (interrupted / "config.yaml").write_text("solver: {rank: [unclosed\n")
    with pytest.raises(pp.ConfigError, match=r"^resume: .*config\.yaml is not a readable run config"):
        _resume_target(str(interrupted))
    (interrupted / "config.yaml").write_text("solver:\n  mu: -1\n")
    with pytest.raises(pp.ConfigError, match=r"^resume: .*config\.yaml holds an invalid run config \(solver\.mu"):
        _resume_target(str(interrupted))
    assert checkpoint_files(interrupted / "checkpoints")  # the checkpoints are left as they are


# ======================================================================================
# 6. Key size: an upper bound, and key generation that Ctrl-C stops
# ======================================================================================


def test_key_size_above_the_limit_is_refused_before_any_work(tmp_path, monkeypatch):
    pytest.importorskip("phe")
    monkeypatch.delenv("PPDNMF_MAX_KEY_BITS", raising=False)
    t0 = time.perf_counter()
    with pytest.raises(pp.ConfigError, match=r"^exchange\.key_bits: 65536-bit Paillier keys are above the limit of "
                                             r"8192 bits .* PPDNMF_MAX_KEY_BITS=65536"):
        run(from_dict(_cfg(centralized=True, exchange={"kind": "paillier", "key_bits": 65536})), tmp_path / "k")
    assert time.perf_counter() - t0 < 10  # no baseline, no key generation first
    from ppdnmf_torch.exchange.paillier.keys import check_key_bits

    monkeypatch.setenv("PPDNMF_MAX_KEY_BITS", "65536")
    assert check_key_bits(65536) == 65536


def test_generated_keys_are_paillier_keys_of_the_asked_size():
    pytest.importorskip("phe")
    from ppdnmf_torch.exchange.paillier.keys import generate_keypair

    for bits in (64, 128, 256):
        pk, sk = generate_keypair(bits)
        assert pk.n.bit_length() == bits and sk.p * sk.q == pk.n and sk.p != sk.q
        assert sk.decrypt(pk.encrypt(12345)) == 12345


@pytest.mark.crypto
def test_ctrl_c_ends_key_generation_within_seconds(tmp_path):
    pytest.importorskip("phe")
    code = textwrap.dedent("""
        import os, sys, time
        os.environ["PPDNMF_MAX_KEY_BITS"] = "12288"
        from ppdnmf_torch.exchange.paillier.keys import generate_keypair
        print("start", flush=True)
        try:
            generate_keypair(12288)  # many seconds of work: the signal lands in the middle
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "start"
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    # the bound covers the interpreter's exit on a loaded machine; a 12288-bit key takes far
    # longer than it, so a signal that waited for the key would still fail the check
    assert time.monotonic() - t0 < 5.0 and proc.returncode == 130 and "interrupted" in out


# ======================================================================================
# 7. Worker pools die with their parent
# ======================================================================================


def _gone(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


@pytest.mark.crypto
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc to find the workers")
def test_workers_die_when_their_parent_is_killed():
    pytest.importorskip("gmpy2")
    code = textwrap.dedent("""
        import multiprocessing.forkserver as fs, time
        from ppdnmf_torch.exchange.paillier.pool import WorkerPool
        pool = WorkerPool(2)
        pids = list(pool._executor._processes) + [fs._forkserver._forkserver_pid]
        print(" ".join(map(str, pids)), flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env(), stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3 and not any(_gone(p) for p in pids)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    left = [p for p in pids if not _gone(p)]
    for p in left:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    assert not left, f"processes {left} outlived their parent"


# ======================================================================================
# 8, 9. Bad input: one clear error, nothing silently coerced
# ======================================================================================


def _Z():
    return torch.cat(small_problem(counts=(3, 4, 3, 4)), dim=1)


@pytest.mark.parametrize("call,error,match", [
    (lambda: pp.fit(np.random.rand(8, 14) + 1j, RING4, 2, **FAST), pp.DataError, "complex values"),
    (lambda: pp.fit(_Z(), RING4, 2, columns=[3.5, 3.5, 3, 4], **FAST), pp.ConfigError, r"count 0 is 3\.5"),
    (lambda: pp.fit(_Z(), RING4, 2, columns="3434", **FAST), pp.ConfigError, "expected a sequence of 4 integer"),
    (lambda: pp.fit(_Z(), RING4, 2, seed=1.5, **FAST), pp.ConfigError, r"^seed: must be an integer, got 1\.5"),
    (lambda: pp.fit(_Z(), RING4, 2, seed=None, **FAST), pp.ConfigError, r"^seed: is required, got None \(it must be an integer\)"),
    (lambda: pp.fit(torch.zeros(0, 16), RING4, 2, **FAST), pp.DataError, r"^Z: the matrix is empty \(shape \(0, 16\)"),
    (lambda: pp.fit(_Z(), RING4, 2, mu=True, **FAST), pp.ConfigError, r"^mu: must be a number, got True \(bool\)"),
    (lambda: pp.fit(_Z(), RING4, 2, g_max=None, **FAST), pp.ConfigError, r"^g_max: is required, got None"),
    (lambda: pp.fit(_Z(), RING4, 2, g_max=[0.1, True, 0.1, 0.1], **FAST), pp.ConfigError, r"^g_max: every cap"),
    (lambda: pp.fit(_Z(), RING4, 2, bcd_iters=1, x_iters=10 ** 9, y_iters=1, device="cpu"), pp.ConfigError,
     r"^x_iters: 1000000000 ADMM iterations per X-step need about .* GiB"),
    (lambda: pp.fit(_Z(), RING4, 2, device="meta", bcd_iters=1), pp.ConfigError, r"^device: unknown device 'meta'"),
    (lambda: pp.fit(_Z(), RING4, 2, exchange=pp.exchange.make_exchange("quantized"), n_max=1e3, **FAST),
     pp.ConfigError, r"^n_max: 1000\.0 contradicts the given exchange's n_max"),
    (lambda: pp.fit(_Z(), np.array([[0, 0.9999999, 0, 1], [0.9999999, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0]]), 2,
                    **FAST), pp.GraphError, r"entry \(0, 1\) is 0\.9999999;"),
])
def test_bad_input_is_one_clear_error(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_networkx_labels_of_mixed_types_are_one_clear_error():
    nx = pytest.importorskip("networkx")
    g = nx.Graph([(0, "a"), ("a", 2), (2, 3), (3, 0)])
    with pytest.raises(pp.GraphError, match=r"node labels mix types \(int, str\)"):
        pp.fit(_Z(), g, 2, **FAST)


def test_a_nested_list_of_rows_is_a_matrix_not_blocks():
    rows = _Z().tolist()  # 8 rows of 14 numbers: a matrix, never 8 "blocks"
    res = pp.fit(rows, RING4, 2, **FAST)
    assert res.columns == [4, 4, 3, 3]


def test_integral_float_counts_and_numpy_seeds_are_accepted():
    res = pp.fit(_Z(), RING4, 2, columns=[3.0, 4.0, 3.0, 4.0], seed=np.int64(3), **FAST)
    assert res.columns == [3, 4, 3, 4]


def test_a_checkpoint_dir_that_is_a_file_is_one_clear_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* is a file, not a folder"):
        pp.fit(_Z(), RING4, 2, checkpoint_dir=tmp_path / "f", **FAST)


@pytest.mark.parametrize("loader,ext", [("load_npy", ".npy"), ("load_csv", "CSV")])
def test_a_folder_given_as_a_data_file_says_so(tmp_path, loader, ext):
    with pytest.raises(pp.DataError, match=rf"is a folder; expected a {ext} file"):
        getattr(pp.data, loader)(tmp_path)


# ======================================================================================
# 8. I/O faults: a full disk keeps every earlier checkpoint
# ======================================================================================


def _mount(folder: Path, options: str):
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root on Linux")
    folder.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


def _umount(folder: Path):
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture
def tiny_disk(tmp_path):
    disk = tmp_path / "disk"
    _mount(disk, "size=4m")
    yield disk
    _umount(disk)


@pytest.fixture
def read_only_disk(tmp_path):
    disk = tmp_path / "ro"
    if sys.platform == "linux" and os.geteuid() == 0:
        _mount(disk, "ro,size=1m")
    else:  # a user's own folder, made read-only
        disk.mkdir()
        disk.chmod(0o555)
    yield disk
    if sys.platform == "linux" and os.geteuid() == 0:
        _umount(disk)
    else:
        disk.chmod(0o755)


def _fill(path) -> None:
    """Write zeros to ``path`` until its file system is full."""
    with open(path, "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError:
            pass


def test_a_full_disk_mid_run_keeps_every_earlier_checkpoint(tiny_disk):
    out = tiny_disk / "run"

    def fill(info):
        if info.iteration == 3:  # after checkpoint 3: the disk fills up
            _fill(tiny_disk / "filler")

    with pytest.raises(OSError) as err:
        run(from_dict(_cfg()), out, callback=fill)
    assert err.value.errno == 28
    files = checkpoint_files(out / "checkpoints")
    assert [Path(f).name for f in files] == ["ckpt_bcd000002.pt", "ckpt_bcd000003.pt"]
    assert load_checkpoint(out / "checkpoints")["done"] == 3  # whole, and verified on resume
    assert not list((out / "checkpoints").glob(".tmp_*"))
    (tiny_disk / "filler").unlink()
    summary = run(from_dict(_cfg()), out, resume_from=out / "checkpoints")
    assert summary["n_iter"]["distributed"] == 6


# ======================================================================================
# The CLI: one line, exit 2
# ======================================================================================


@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cli")


TINY = ["solver.bcd_iters=3", "solver.x_iters=2", "solver.y_iters=2", "centralized=false", "logger=none",
        "progress=false"]


def test_cli_read_only_folder_is_one_line(cli_dir, read_only_disk):
    line = _one_error_line(_cli([*TINY, f"hydra.run.dir={read_only_disk / 'run'}"], cli_dir))
    assert "hydra.run.dir: cannot write" in line and ("Read-only" in line or "Permission denied" in line)


def test_cli_full_disk_is_one_line(cli_dir, tiny_disk):
    _fill(tiny_disk / "filler")
    line = _one_error_line(_cli([*TINY, f"hydra.run.dir={tiny_disk / 'run'}"], cli_dir))
    assert "No space left on device" in line


def test_cli_corrupted_config_is_one_line(cli_dir, tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "config.yaml").write_text("{{{ not yaml")
    line = _one_error_line(_cli([f"resume={tmp_path}", f"hydra.run.dir={cli_dir / 'resume_call'}"], cli_dir))
    assert "config.yaml is not a readable run config" in line


def test_cli_multirun_goes_on_past_a_failed_job_and_reports_it(cli_dir):
    sweep = cli_dir / "sweep"
    r = _cli(["-m", "solver.mu=0.1,-1,0.2", *TINY, f"hydra.sweep.dir={sweep}"], cli_dir)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert (sweep / "0" / "summary.json").is_file() and (sweep / "2" / "summary.json").is_file()
    assert (sweep / "1" / "FAILED").read_text().startswith("solver.mu: must be > 0")
    assert "ppdnmf: 1 of 3 jobs failed:" in r.stderr and "job 1: solver.mu: must be > 0" in r.stderr


@pytest.mark.slow
def test_cli_resume_refuses_changing_overrides_and_applies_more_iterations(cli_dir):
    run_dir = cli_dir / "to_resume"
    r = _cli([*TINY, "checkpoint_every=1", "exchange=quantized", f"hydra.run.dir={run_dir}", "keep_checkpoints=true"],
             cli_dir)
    assert r.returncode == 0, r.stderr
    (run_dir / "summary.json").unlink()  # as if it had been interrupted after iteration 3
    line = _one_error_line(_cli([f"resume={run_dir}", "solver.bcd_iters=10", "exchange=plain",
                                 f"hydra.run.dir={cli_dir / 'r1'}"], cli_dir))
    assert "exchange.kind ('quantized' -> 'plain')" in line and "solver.bcd_iters" not in line.split("takes only")[0]
    r = _cli([f"resume={run_dir}", "solver.bcd_iters=5", f"hydra.run.dir={cli_dir / 'r2'}"], cli_dir)
    assert r.returncode == 0, r.stderr
    assert "final NMSE after 5 BCD iterations" in r.stdout


def test_cli_degenerate_result_is_one_warning_line_naming_the_cause(cli_dir):
    r = _cli([*TINY, "solver.eta=1e300", f"hydra.run.dir={cli_dir / 'degenerate'}"], cli_dir, warn=True)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("ppdnmf: warning: degenerate result")]
    assert len(warn) == 1 and "likely cause: eta = 1e+300" in warn[0], r.stderr
    assert "Traceback" not in r.stderr and "warnings.warn" not in r.stderr
    assert "degenerate result" in (cli_dir / "degenerate" / "ppdnmf.log").read_text()
