"""``ppdnmf task=fsspca`` and ``ppdnmf task=symnmf``: their configs compose with every preset,
a short CLI run of each writes its files (TensorBoard scalars and images, or none), a bad value
is one ``key: reason`` line, the trials are batched, and a run continues from its checkpoints."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ppdnmf_torch.app.runner import run
from ppdnmf_torch.app.tasks import get_task, task_names
from ppdnmf_torch.errors import ConfigError

hydra = pytest.importorskip("hydra")
from hydra import compose, initialize_config_dir  # noqa: E402

from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FSSPCA_TINY = ["task=fsspca", "solver.max_iter=6", "progress=false"]
SYMNMF_TINY = ["task=symnmf", "data.n=40", "rank=3", "solver.max_iter=6", "progress=false"]


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return to_run_config(compose(config_name="config", overrides=list(overrides)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HYDRA_FULL_ERROR="0", PYTHONWARNINGS="ignore")
    return env


def _cli(args, cwd):
    return subprocess.run([sys.executable, "-m", "ppdnmf_torch", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=300)


def test_the_model_tasks_are_found():
    assert {"fsspca", "symnmf", "ppdnmf"} <= set(task_names())
    assert not any(n.startswith("_") for n in task_names())


@pytest.mark.parametrize("overrides, check", [
    (["task=fsspca"], lambda c: (c.data.kind, c.split.kind, c.n_workers, c.solver.rho) == ("spiked", "iid", 4, "auto")),
    (["task=fsspca", "data.kind=digits", "split.kind=class", "n_components=3"],
     lambda c: (c.data.kind, c.split.kind, c.n_components) == ("digits", "class", 3)),
    (["task=fsspca", "fsspca/data=wine", "fsspca/split=dirichlet", "split.concentration=0.3", "trials=2",
      "alpha=[1,2]"], lambda c: c.split.concentration == 0.3 and c.alpha == [1.0, 2.0]),
    (["task=fsspca", "data.kind=breast_cancer", "logger=none"], lambda c: c.logger.kind == "none"),
    (["task=fsspca", "data.kind=csv", "data.path=rows.csv"], lambda c: os.path.isabs(c.data.path)),
    (["task=symnmf"], lambda c: (c.data.preset, c.solver.method, c.rank) == ("synthetic", "symhals", None)),
    (["task=symnmf", "data.preset=digits", "solver.method=symanls"], lambda c: c.solver.method == "symanls"),
    (["task=symnmf", "data.preset=orl", "data.path=orl_faces.mat"], lambda c: c.data.path.endswith("orl_faces.mat")),
    (["task=symnmf", "data.preset=samples", "data.path=x.npy", "data.labels_path=y.npy"],
     lambda c: os.path.isabs(c.data.labels_path)),
    (["task=symnmf", "symnmf/data=similarity", "data.path=S.npz", "rank=4", "trials=3", "solver.penalty=[0.1,1,10]"],
     lambda c: c.solver.penalty == [0.1, 1.0, 10.0] and c.rank == 4),
    (["task=symnmf", "symnmf/variant=agents", "graph=ring", "exchange=quantized", "agents.n_agents=6"],
     lambda c: (c.variant, c.graph.kind, c.exchange.kind, c.agents.exchange, c.agents.n_agents)
     == ("agents", "ring", "quantized", "quantized", 6)),
    (["task=fsspca", "fsspca/variant=serverless", "exchange=paillier", "serverless.consensus=admm"],
     lambda c: (c.variant, c.exchange.kind, c.serverless.exchange, c.serverless.consensus)
     == ("serverless", "paillier", "paillier", "admm")),
])
def test_every_preset_composes_and_round_trips(overrides, check):
    cfg = _compose(overrides)
    assert check(cfg)
    task = get_task(cfg.task)
    d = task.config_to_dict(cfg)
    assert task.config_to_dict(task.config_from_dict(d)) == d


@pytest.mark.parametrize("overrides, line", [
    (["task=fsspca", "split.kind=bogus"], "split.kind: unknown value 'bogus'"),
    (["task=fsspca", "alpha=-1"], "alpha: must be >= 0"),
    (["task=fsspca", "trials=2", "alpha=[1,2,3]"], "alpha: a list needs one value per trial (2), got 3"),
    (["task=fsspca", "solver.inner_steps=2.5"], "solver.inner_steps: must be an integer, got 2.5"),
    (["task=fsspca", "fsspca/variant=serverless", "serverless.exchange=paillier"], "serverless.exchange: 'paillier'"),
    (["task=symnmf", "symnmf/variant=agents", "agents.mu=big"], "agents.mu: unknown value 'big'; use one of auto"),
    (["task=symnmf", "+agents.n_agents=3"], "agents: only variant=agents takes it"),
    (["task=fsspca", "data.kind=npy"], "data.path: data.kind=npy needs the file's path"),
    (["task=fsspca", "split.kind=class"], "split.kind: 'class' needs class labels"),
    (["task=fsspca", "data.kind=csv", "data.path=rows.csv", "split.kind=dirichlet"],
     "split.kind: 'dirichlet' needs class labels; data.kind=csv has none"),
    (["task=fsspca", "data.kind=csv", "data.path=rows.npy"], "data.path: "),
    (["task=fsspca", "+n_agents=3"], "n_agents: unknown key"),
    (["task=symnmf", "solver.method=nmf"], "solver.method: unknown value 'nmf'"),
    (["task=symnmf", "data.preset=orl"], "data.path: data.preset=orl needs a file"),
    (["task=symnmf", "rank=0"], "rank: must be >= 1"),
    (["task=symnmf", "device=tpu"], "device: unknown value 'tpu'"),
])
def test_a_bad_value_names_its_key(overrides, line):
    with pytest.raises(ConfigError) as info:
        _compose(overrides)
    assert str(info.value).startswith(line)


@pytest.mark.slow  # a third interpreter start; the in-process test above checks the same key: reason lines
def test_the_cli_refuses_a_bad_value_with_one_line(tmp_path):
    r = _cli(["task=fsspca", "split.kind=bogus"], tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("ppdnmf: error: split.kind: unknown value 'bogus'; use one of iid, class, dirichlet")


def test_cli_fsspca_trials_without_logger(tmp_path):
    out = tmp_path / "run"
    r = _cli([*FSSPCA_TINY, "data.kind=wine", "split.kind=dirichlet", "trials=2", "alpha=[0,5]", "logger=none",
              f"hydra.run.dir={out}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "FSSPCA on wine (178 x 13, dirichlet split over 4 workers)" in r.stdout and "2 trial(s)" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["task"] == "fsspca" and len(s["explained_variance"]) == 2 and s["wall_time"]["total"] > 0
    assert np.load(out / "z.npy").shape == (2, 13, 2)
    img = np.load(out / "loadings_image.npy")
    assert img.shape == (13, 2) and img.max() == pytest.approx(1.0)
    rows = list(csv.DictReader(open(out / "history.csv")))
    assert len(rows) == 6 * 2 and rows[0]["iteration"] == "1" and {r["trial"] for r in rows} == {"0", "1"}
    assert not (out / "tb").exists() and not (out / "checkpoints").exists()


def test_cli_symnmf_with_tensorboard(tmp_path):
    acc_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    out = tmp_path / "run"
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 15)
    X = np.abs(rng.normal(size=(45, 6))) * 0.1 + np.eye(3)[y] @ np.abs(rng.normal(size=(3, 6))) * 3
    np.save(tmp_path / "x.npy", X)
    np.save(tmp_path / "y.npy", y)
    r = _cli([*SYMNMF_TINY, "data.preset=samples", "data.path=x.npy", "data.labels_path=y.npy", "rank=null",
              f"hydra.run.dir={out}"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "SymNMF on samples (n = 45, rank 3)" in r.stdout and "clustering accuracy" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["task"] == "symnmf" and 0 <= s["accuracy"][0] <= 1 and s["rank"] == 3
    assert np.load(out / "U.npy").shape == (45, 3) and np.load(out / "cluster_means.npy").shape == (3, 6)
    acc = acc_mod.EventAccumulator(str(out / "tb"), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    tags = acc.Tags()
    for tag in ("symnmf/E", "symnmf/objective", "symnmf/rel_gap_UV", "symnmf/lambda", "symnmf/accuracy"):
        assert tag in tags["scalars"], tag
        assert [e.step for e in acc.Scalars(tag)] == list(range(1, 7))
    assert "images/reordered_similarity" in tags["images"]


def _cfg(name, **kw):
    task = get_task(name)
    base = {"task": name, "progress": False, "logger": {"kind": "none"}}
    for k, v in kw.items():
        node = base
        *path, last = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[last] = v
    return task.config_from_dict(base)


@pytest.mark.parametrize("every", [5, 0])
@pytest.mark.parametrize("name, extra", [
    ("fsspca", {"solver.tol": 0.0}),
    ("symnmf", {"data.n": 40, "rank": 3, "solver.tol": 0.0}),
])
def test_a_run_continues_from_its_checkpoint(tmp_path, name, extra, every):
    """A run stopped after 10 of its 20 iterations and resumed from its checkpoint ends with the
    uninterrupted run's arrays; with checkpoint_every=0 from the one checkpoint written as it
    stopped (as PPDNMF's: at the end and on Ctrl-C)."""
    extra = {**extra, "solver.max_iter": 20, "checkpoint_every": every}
    whole = run(_cfg(name, **extra), tmp_path / "whole")
    part = tmp_path / "part"

    def stop(info):
        return getattr(info, "iteration", getattr(info, "k", 0)) >= 10

    run(_cfg(name, **extra, keep_checkpoints=True), part, callback=stop)
    assert get_task(name).resume_point(part / "checkpoints") == 10
    (part / "summary.json").unlink()
    again = run(_cfg(name, **extra), part, resume_from=part / "checkpoints")
    assert max(again["n_iter"]) == max(whole["n_iter"]) == 20
    first = "z.npy" if name == "fsspca" else "U.npy"
    np.testing.assert_allclose(np.load(part / first), np.load(tmp_path / "whole" / first), rtol=0, atol=1e-12)
    assert not (part / "checkpoints").exists()  # removed once the outputs are written


def test_the_estimators_are_top_level_names():
    import ppdnmf_torch
    from ppdnmf_torch.models.fsspca.estimator import FederatedSparsePCA
    from ppdnmf_torch.models.symnmf.estimator import SymmetricNMF

    assert ppdnmf_torch.SymmetricNMF is SymmetricNMF and ppdnmf_torch.FederatedSparsePCA is FederatedSparsePCA
    assert {"SymmetricNMF", "FederatedSparsePCA"} <= set(ppdnmf_torch.__all__)
