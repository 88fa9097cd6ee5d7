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
