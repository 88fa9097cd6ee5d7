"""Issue 44's checkpoint cases for every model on the engine's driver: symmetric NMF (centralized
and across agents) and FSSPCA (with a server and serverless); PPDNMF's are in test_reliability.py,
test_faults.py and test_checkpoint.py, the driver's own in test_driver.py.

Per model: a damaged newest checkpoint (emptied, truncated, random bytes, a flipped bit in a
tensor) is one CheckpointError line naming the file; a resume refuses a changed setting by name
and a cap below the iterations done; a fresh run into another run's folder is refused and changes
nothing; a second run into a folder being written is refused; only the newest two files are kept;
Ctrl-C writes the last completed iteration and the resumed run ends as an uninterrupted one, bit
for bit; bad checkpoint arguments are refused by name."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from ppdnmf_torch.checkpoint import CheckpointError, checkpoint_files, load_checkpoint
from ppdnmf_torch.driver import RunInterrupted
from ppdnmf_torch.errors import ConfigError
from ppdnmf_torch.folderlock import FolderLock
from ppdnmf_torch.graph import ring
from ppdnmf_torch.models.fsspca import fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import fit_serverless
from ppdnmf_torch.models.symnmf import fit_symnmf
from ppdnmf_torch.models.symnmf.agents import fit_symnmf_agents


def _similarity(n=20, r=3):
    gen = torch.Generator().manual_seed(0)
    W = torch.rand((n, r), generator=gen, dtype=torch.float64)
    X = W @ W.T
    return X / torch.linalg.matrix_norm(X, ord=2)


def _blocks():
    rng = np.random.default_rng(0)
    return [rng.standard_normal((15, 6)) for _ in range(4)]


#: model -> (fit(folder, **kw), the result's iterate, a setting that changes the numbers, its cap's name,
#: how the callback sees the iteration number)
MODELS = {
    "symnmf": (lambda d, **kw: fit_symnmf(_similarity(), 3, **{"max_iter": 6, "tol": 0.0, "device": "cpu",
                                                               "checkpoint_dir": d, **kw}),
               lambda r: r.U, ("penalty", 2.0), "max_iter", lambda info: info.k),
    "symnmf_agents": (lambda d, **kw: fit_symnmf_agents(_similarity(), 3, **{"n_agents": 4, "x_iters": 2,
                                                                             "max_iter": 6, "start_seed": 0,
                                                                             "device": "cpu", "checkpoint_dir": d,
                                                                             **kw}),
                      lambda r: r.U_agents, ("x_iters", 3), "max_iter", None),
    "fsspca": (lambda d, **kw: fit_fsspca(_blocks(), 2, **{"alpha": 1.0, "max_iter": 6, "tol": 0.0,
                                                          "checkpoint_dir": d, **kw}),
               lambda r: r.z, ("alpha", 2.0), "max_iter", lambda info: info.iteration),
    "fsspca_serverless": (lambda d, **kw: fit_serverless(_blocks(), 2, ring(4), **{"alpha": 1.0, "max_iter": 6,
                                                                                  "tol": 0.0, "checkpoint_dir": d,
                                                                                  **kw}),
                          lambda r: r.z, ("g_cap", 0.5), "max_iter", None),
}


def _fit(name, folder, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MODELS[name][0](folder, **kw)


def _stop_at(name, n):
    """A callback that raises KeyboardInterrupt (Ctrl-C) after iteration n."""
    number = MODELS[name][4]

    def cb(*args):
        k = args[0] if number is None else number(args[0])
        if k == n:
            raise KeyboardInterrupt

    return cb


@pytest.fixture(params=list(MODELS))
def model(request):
    return request.param


def test_ctrl_c_writes_the_last_iteration_and_the_resumed_run_is_the_uninterrupted_one(model, tmp_path):
    whole = _fit(model, None)
    with pytest.raises(RunInterrupted) as err:
        _fit(model, tmp_path, checkpoint_every=0, callback=_stop_at(model, 4))
    assert err.value.done == 4 and Path(err.value.checkpoint).name == "ckpt_bcd000004.pt"
    again = _fit(model, tmp_path, resume=True)
    iterate = MODELS[model][1]
    assert torch.equal(iterate(again), iterate(whole))
    assert [os.path.basename(f) for f in checkpoint_files(tmp_path)] == ["ckpt_bcd000004.pt", "ckpt_bcd000006.pt"]


@pytest.mark.parametrize("damage", ["emptied", "truncated", "random", "flipped"])
def test_a_damaged_checkpoint_is_one_line_naming_its_file(model, tmp_path, damage):
    _fit(model, tmp_path, max_iter=3)
    path = checkpoint_files(tmp_path)[-1]
    raw = open(path, "rb").read()
    if damage == "flipped":
        t = next(v for v in load_checkpoint(path)["state"].values() if v.is_floating_point() and v.numel() > 4)
        at = raw.find(t.numpy().tobytes())
        assert at > 0
        raw = raw[:at + 3] + bytes([raw[at + 3] ^ 0x20]) + raw[at + 4:]
    else:
        raw = {"emptied": b"", "truncated": raw[: len(raw) // 2], "random": os.urandom(len(raw))}[damage]
    open(path, "wb").write(raw)
    with pytest.raises(CheckpointError) as err:
        _fit(model, tmp_path, resume=True)
    text = str(err.value)
    assert path in text and "\n" not in text and "Error" not in text, text
    assert ("does not match its hash" if damage == "flipped" else "is damaged or not a checkpoint") in text


def test_a_resume_refuses_a_changed_setting_by_name_and_a_lower_cap(model, tmp_path):
    key, value = MODELS[model][2]
    _fit(model, tmp_path, max_iter=4)
    with pytest.raises(CheckpointError, match=rf"^resume: checkpoint .* belongs to a different run: .*its {key} is "):
        _fit(model, tmp_path, resume=True, **{key: value})
    cap = MODELS[model][3]
    with pytest.raises(CheckpointError, match=rf"^{cap}: the checkpoint .* has done 4 .*, more than {cap} = 2"):
        _fit(model, tmp_path, resume=True, **{cap: 2})


def test_a_fresh_run_never_takes_over_another_runs_folder(model, tmp_path):
    _fit(model, tmp_path, max_iter=3)
    before = {f: open(f, "rb").read() for f in checkpoint_files(tmp_path)}
    with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* holds the checkpoints of another run .*"
                                              r"resume=True"):
        _fit(model, tmp_path)
    assert {f: open(f, "rb").read() for f in checkpoint_files(tmp_path)} == before
    with FolderLock(tmp_path / "busy"):  # a run writing there: refused, not killed
        with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* is being written by another ppdnmf run"):
            _fit(model, tmp_path / "busy")
    assert checkpoint_files(tmp_path / "busy") == []


def test_only_the_newest_two_checkpoints_are_kept(model, tmp_path):
    _fit(model, tmp_path, checkpoint_every=1)
    assert [os.path.basename(f) for f in checkpoint_files(tmp_path)] == ["ckpt_bcd000005.pt", "ckpt_bcd000006.pt"]
    assert load_checkpoint(tmp_path)["model"] == model


@pytest.mark.parametrize("kw,match", [(dict(checkpoint_every=-1), "^checkpoint_every: must be an integer >= 0"),
                                      (dict(checkpoint_every=1.5), "^checkpoint_every: "),
                                      (dict(checkpoint_every=True), "^checkpoint_every: "),
                                      (dict(checkpoint_dir=""), "^checkpoint_dir: the empty path names no folder")])
def test_bad_checkpoint_arguments_are_refused_by_name(model, tmp_path, kw, match):
    args = dict(kw)
    folder = args.pop("checkpoint_dir", tmp_path)
    with pytest.raises(ConfigError, match=match):
        _fit(model, folder, **args)
    assert not os.listdir(tmp_path)
