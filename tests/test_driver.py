"""The run driver (:mod:`ppdnmf_torch.driver`) on a toy model: the loop, stopping, the callback,
checkpoints (schedule, end, Ctrl-C, the newest two kept), resume bit for bit with the history
and the cost ledgers, refusals by name (settings, inputs, the cap, damaged files), the folder's
lock, and the consensus ADMM X-step's helpers. Each model's own use is tested with the model."""
from __future__ import annotations

import os
import signal
import warnings

import pytest
import torch

from ppdnmf_torch.checkpoint import CheckpointError, checkpoint_files, digest, load_checkpoint
from ppdnmf_torch.driver import (Checkpoints, History, Ledgers, LoopModel, Resources, RunInterrupted,
                                 check_checkpoint_args, drive, seed_of, warn_degree_one)
from ppdnmf_torch.errors import ConfigError, ConvergenceWarning, DegreeOneWarning
from ppdnmf_torch.folderlock import FolderLock


class Toy(LoopModel):
    """``x <- a x + noise``: a state tensor, a generator, a counter, a stopping test."""

    name = "toy"
    step_name = "toy iteration"

    def __init__(self, a=0.5, seed=0, stop_below=None, interrupt_at=None, data=None):
        self.a, self.seed, self.stop_below, self.interrupt_at = a, seed, stop_below, interrupt_at
        self.data = torch.arange(4.0, dtype=torch.float64) if data is None else data
        self.x = self.data.clone()
        self.gen = torch.Generator().manual_seed(seed)
        self.calls = 0

    def step(self, k, clock):
        if k == self.interrupt_at:
            raise KeyboardInterrupt
        self.x = self.a * self.x + 0.01 * torch.rand(self.x.shape, generator=self.gen, dtype=self.x.dtype)
        self.calls += 1
        return {"norm": self.x.norm().reshape(1), "k": float(k)}

    def converged(self, k, row):
        return self.stop_below is not None and float(row["norm"]) < self.stop_below

    def state(self):
        return {"x": self.x}

    def load_state(self, tensors, extra):
        self.x = tensors["x"].clone()
        self.calls = extra["calls"]

    def rng_state(self):
        return {"gen": self.gen.get_state()}

    def load_rng_state(self, s):
        self.gen.set_state(s["gen"])

    def extra(self):
        return {"calls": self.calls}

    def settings(self):
        return {"a": self.a, "seed": self.seed}

    def inputs(self):
        return {"data": digest(self.data)}


class Counter:
    """A cost source without cost_state (continued by the driver's offsets)."""

    def __init__(self):
        self.n = 0

    def costs(self):
        return {"rounds": self.n, "kind": "toy"}


class CountingToy(Toy):
    def __init__(self, counter, **kw):
        super().__init__(**kw)
        self.counter = counter

    def step(self, k, clock):
        self.counter.n += 1
        return super().step(k, clock)


def _plan(folder, every=1, resume=False, keep=2):
    return Checkpoints(folder, every=every, keep=keep, resume=resume)


def test_the_loop_runs_to_the_cap_and_warns_only_with_a_tolerance():
    out = drive(Toy(), max_iter=5)
    assert out.done == 5 and not out.converged and not out.stopped
    assert out.history["k"] == [1.0, 2.0, 3.0, 4.0, 5.0] and len(out.history["norm"]) == 5
    with pytest.warns(ConvergenceWarning, match="toy: no convergence to tol=0.1 in 5 toy iterations"):
        drive(Toy(stop_below=-1.0), max_iter=5, tol=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = drive(Toy(stop_below=1.0), max_iter=50, tol=0.1)  # converges: no warning
    assert out.converged and out.done < 50


def test_the_callback_stops_after_its_iteration():
    seen = []
    out = drive(Toy(), max_iter=10, callback=lambda k, row: seen.append(k) or k == 3)
    assert out.stopped and out.done == 3 and seen == [1, 2, 3]


@pytest.mark.parametrize("every,stop", [(1, 7), (3, 7), (0, 7), (4, 8)])
def test_an_interrupted_run_resumes_bit_for_bit(tmp_path, every, stop):
    counter = Counter()
    full = drive(CountingToy(counter), max_iter=12, ledgers=Ledgers(agg=counter))
    c1 = Counter()
    drive(CountingToy(c1), max_iter=stop, checkpoints=_plan(tmp_path, every), ledgers=Ledgers(agg=c1))
    # the newest two of the run's files, the end's among them
    names = [os.path.basename(f) for f in checkpoint_files(tmp_path)]
    assert names[-1] == f"ckpt_bcd{stop:06d}.pt" and len(names) <= 2
    c2 = Counter()
    model = CountingToy(c2)
    ledgers = Ledgers(agg=c2)
    out = drive(model, max_iter=12, checkpoints=_plan(tmp_path, every, resume=True), ledgers=ledgers)
    assert out.start == stop and out.done == 12
    ref = CountingToy(Counter())
    drive(ref, max_iter=12)
    assert torch.equal(model.x, ref.x)
    assert out.history["k"] == full.history["k"]
    assert all(torch.equal(a, b) for a, b in zip(out.history["norm"], full.history["norm"]))
    assert model.calls == 12  # the model's own counter continued
    assert ledgers.costs("agg") == {"rounds": 12, "kind": "toy"}  # the ledger continued


def test_ctrl_c_writes_the_last_completed_iteration(tmp_path):
    with pytest.raises(RunInterrupted) as err:
        drive(Toy(interrupt_at=5), max_iter=10, checkpoints=_plan(tmp_path, every=0))
    assert err.value.done == 4 and err.value.checkpoint.endswith("ckpt_bcd000004.pt")
    assert "interrupted after toy iteration 4" in str(err.value)
    model = Toy()
    drive(model, max_iter=10, checkpoints=_plan(tmp_path, every=0, resume=True))
    ref = Toy()
    drive(ref, max_iter=10)
    assert torch.equal(model.x, ref.x)


def test_only_the_newest_files_are_kept_and_another_runs_are_never_pruned(tmp_path):
    drive(Toy(), max_iter=9, checkpoints=_plan(tmp_path, every=1, keep=3))
    assert [os.path.basename(f) for f in checkpoint_files(tmp_path)] == [
        "ckpt_bcd000007.pt", "ckpt_bcd000008.pt", "ckpt_bcd000009.pt"]


@pytest.mark.parametrize("change,match", [
    (dict(a=0.6), r"belongs to a different run: its a is 0.5, this run's 0.6"),
    (dict(data=torch.ones(4, dtype=torch.float64)), r"belongs to a different run: its data differ"),
])
def test_a_resume_refuses_changed_settings_and_inputs_by_name(tmp_path, change, match):
    drive(Toy(), max_iter=3, checkpoints=_plan(tmp_path))
    with pytest.raises(CheckpointError, match=r"^resume: checkpoint .*ckpt_bcd000003.pt' " + match):
        drive(Toy(**change), max_iter=5, checkpoints=_plan(tmp_path, resume=True))


def test_a_cap_below_the_iterations_done_is_refused(tmp_path):
    drive(Toy(), max_iter=6, checkpoints=_plan(tmp_path))
    with pytest.raises(CheckpointError, match=r"^max_iter: the checkpoint .* has done 6 toy iterations, more than "
                                              r"max_iter = 4"):
        drive(Toy(), max_iter=4, checkpoints=_plan(tmp_path, resume=True))
    out = drive(Toy(), max_iter=6, checkpoints=_plan(tmp_path, resume=True))  # the same cap: nothing to do
    assert out.done == 6 and out.start == 6


def _flip_in_tensor(path, t):
    raw = bytearray(open(path, "rb").read())
    at = bytes(raw).find(t.numpy().tobytes())
    assert at > 0
    raw[at + 2] ^= 0x04
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("damage", ["emptied", "truncated", "random", "flipped"])
def test_a_damaged_checkpoint_is_one_line_naming_its_file(tmp_path, damage):
    drive(Toy(), max_iter=3, checkpoints=_plan(tmp_path))
    path = checkpoint_files(tmp_path)[-1]
    raw = open(path, "rb").read()
    if damage == "flipped":
        _flip_in_tensor(path, load_checkpoint(path)["state"]["x"])
    else:
        open(path, "wb").write({"emptied": b"", "truncated": raw[: len(raw) // 2],
                                "random": os.urandom(len(raw))}[damage])
    with pytest.raises(CheckpointError) as err:
        drive(Toy(), max_iter=5, checkpoints=_plan(tmp_path, resume=True))
    text = str(err.value)
    assert path in text and "\n" not in text, text
    assert ("content of state tensor 'x' does not match its hash" if damage == "flipped"
            else "is damaged or not a checkpoint") in text
    for raw_error in ("UnpicklingError", "EOFError", "Invalid argument", "Weights only"):
        assert raw_error not in text


def test_a_full_disk_is_the_write_error_naming_the_file_and_leaves_no_temporary(tmp_path):
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, hard))
    try:
        with pytest.raises(OSError) as err:
            drive(Toy(data=torch.arange(400.0, dtype=torch.float64)), max_iter=3, checkpoints=_plan(tmp_path))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert err.value.filename == str(tmp_path / "ckpt_bcd000001.pt") and err.value.strerror
    assert os.listdir(tmp_path) == []  # no temporary file, no torn checkpoint, the lock released


def test_a_folder_is_locked_and_another_runs_checkpoints_are_refused(tmp_path):
    with FolderLock(tmp_path):
        with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* is being written by another ppdnmf run"):
            drive(Toy(), max_iter=2, checkpoints=_plan(tmp_path))
    assert checkpoint_files(tmp_path) == []
    drive(Toy(), max_iter=2, checkpoints=_plan(tmp_path))
    before = {f: open(f, "rb").read() for f in checkpoint_files(tmp_path)}
    with pytest.raises(CheckpointError, match=r"^checkpoint_dir: .* holds the checkpoints of another run .*"
                                              r"resume=True"):
        drive(Toy(seed=1), max_iter=2, checkpoints=_plan(tmp_path))
    assert {f: open(f, "rb").read() for f in checkpoint_files(tmp_path)} == before
    assert not (tmp_path / ".ppdnmf.lock").exists()


@pytest.mark.parametrize("kw,match", [
    (dict(checkpoint_every=-1), r"^checkpoint_every: must be an integer >= 0 \(0: only at the end\), got -1"),
    (dict(checkpoint_every=1.5), r"^checkpoint_every: .* got 1.5"),
    (dict(checkpoint_every=True), r"^checkpoint_every: .* got True"),
    (dict(checkpoint_dir=""), r"^checkpoint_dir: the empty path names no folder"),
    (dict(checkpoint_dir=None, resume=True), r"^resume: needs a checkpoint_dir"),
    (dict(resume="yes"), r"^resume: expected True or False"),
    (dict(keep=0), r"^keep_checkpoints: must be an integer >= 1"),
])
def test_bad_checkpoint_arguments_are_refused(tmp_path, kw, match):
    args = dict(checkpoint_dir=tmp_path, checkpoint_every=1, resume=False, keep=2)
    args.update(kw)
    with pytest.raises(ConfigError, match=match):
        check_checkpoint_args(**args)


def test_a_checkpoints_size_grows_by_its_new_history_rows_only(tmp_path):
    """A write's cost does not grow with the run: its file holds the state and the packed history,
    so iteration 2000's file exceeds iteration 500's by 1500 rows of 8-byte floats (and a
    little framing), not by a copy per row."""
    sizes = {}
    for n in (500, 2000):
        folder = tmp_path / str(n)
        drive(Toy(), max_iter=n, checkpoints=_plan(folder, every=0))
        sizes[n] = os.path.getsize(checkpoint_files(folder)[-1])
    per_row = 2 * 8  # "norm" (one float64) and "k" (a float) per row
    assert abs(sizes[2000] - sizes[500] - 1500 * per_row) <= 1024, sizes


def test_history_and_ledgers_units():
    h = History()
    h.append({"a": 1.0, "b": torch.ones(2)})
    h.append({"a": 2.0, "b": torch.zeros(2), "c": 3.0})  # a key may start late
    assert h.lengths() == {"a": 2, "b": 2, "c": 1}
    back = History.unpacked(h.packed(h.lengths()))
    assert back["a"] == [1.0, 2.0] and torch.equal(back["b"][1], torch.zeros(2)) and back["c"] == [3.0]


def test_resources_close_what_they_made_only():
    closed = []

    class Thing:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    from ppdnmf_torch.exchange import make_exchange

    handed = make_exchange("plain")
    with Resources() as res:
        res.own(Thing("mine"))
        assert res.exchange(handed) is handed  # handed in: used, left open
        made = res.exchange("plain")
        assert made is not handed
        res.own(Thing("last"))
    assert closed == ["last", "mine"]


def test_seed_of_one_way():
    import numpy as np

    assert seed_of(5) == 5
    assert seed_of(np.random.RandomState(0)) == np.random.RandomState(0).randint(0, 2**31 - 1)
    with pytest.raises(ConfigError, match="^random_state: must be >= 0"):
        seed_of(-1)
    with pytest.raises(ConfigError, match="^random_state: expected None"):
        seed_of("0")


def test_degree_one_warning_names_the_agents_once():
    from ppdnmf_torch.exchange import make_exchange
    from ppdnmf_torch.graph import star

    exch = make_exchange("quantized")
    with pytest.warns(DegreeOneWarning, match=r"^workers \[1, 2, 3\] have a single neighbour: .* z_j exactly"):
        warn_degree_one(exch, [star(4)], who="workers", value="z_j")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_degree_one(make_exchange("plain"), [star(4)])  # plain sends the values anyway


def test_the_consensus_x_step_agrees_on_the_average():
    """consensus/xstep.consensus_admm with a quadratic local solve (f_i(z) = 1/2 ||z - a_i||^2,
    Shi et al.'s weights as FSSPCA's serverless step has them) on a ring: every agent's copy
    reaches the agents' mean; with the nonnegative split, X = max(0, U + P) stays >= 0."""
    from ppdnmf_torch.consensus.xstep import ConsensusVars, consensus_admm
    from ppdnmf_torch.exchange import make_exchange
    from ppdnmf_torch.graph import Topology, ring
    from ppdnmf_torch.penalties import PenaltySampler

    T, N = 1, 5
    topo = Topology.from_graphs([ring(N)])
    exch = make_exchange("plain")
    exch.bind(topo, dtype=torch.float64, device=torch.device("cpu"))
    sampler = PenaltySampler(torch.full((N,), 0.7, dtype=torch.float64), topo.src, [topo.n_directed_edges], [0],
                             "random", 400, shared=True)
    a = torch.randn((T, N, 3, 2), generator=torch.Generator().manual_seed(1), dtype=torch.float64)

    def local(U, X, P, Q, Q_prev, rho):
        return (a + 2 * rho * U + 2 * Q - Q_prev) / (1 + 2 * rho)

    zeros = torch.zeros_like(a)
    v = consensus_admm(ConsensusVars(U=zeros.clone(), Q=zeros.clone(), Q_prev=zeros.clone(), g=sampler.initial()),
                       local, sampler, exch, n_iters=400, bcd_iter=1)
    assert float((v.U - a.mean(1, keepdim=True)).abs().max()) < 1e-6
    split = consensus_admm(ConsensusVars(U=a.clone(), Q=zeros.clone(), Q_prev=zeros.clone(), g=sampler.initial(),
                                         X=zeros.clone(), P=zeros.clone()), local, sampler, exch, n_iters=5,
                           bcd_iter=2)
    assert bool((split.X >= 0).all()) and torch.equal(split.X, (split.U + split.P).clamp_min(0.0))
