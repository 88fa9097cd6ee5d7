"""The app's task interface: every task composes from conf/ and converts to its typed config,
tasks are found by name, and the runner works through the interface alone (a toy task runs
with the same folder, lock, config.yaml and summary.json as PPDNMF)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import yaml

from ppdnmf_torch.app.rundir import RunFolderError, RunFolderLock
from ppdnmf_torch.app.runner import run
from ppdnmf_torch.app.tasks import DEFAULT_TASK, Task, get_task, task_names, task_of
from ppdnmf_torch.errors import ConfigError, DataError

hydra = pytest.importorskip("hydra")
from hydra import compose, initialize_config_dir  # noqa: E402

from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config  # noqa: E402

CONF = Path(CONFIG_DIR)


def _compose(overrides=()):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def test_the_tasks_are_the_task_group():
    names = task_names()
    assert DEFAULT_TASK in names and "base" not in names
    assert names == tuple(sorted(p.stem for p in (CONF / "task").glob("*.yaml")))


@pytest.mark.parametrize("name", task_names())
def test_every_task_composes_and_converts_to_its_config(name):
    task = get_task(name)
    cfg = to_run_config(_compose([f"task={name}"]))
    assert cfg.task == name and task_of(cfg) is task
    d = task.config_to_dict(cfg)
    assert d["task"] == name
    again = task.config_from_dict(yaml.safe_load(yaml.safe_dump(d)))  # config.yaml round trip
    assert task.config_to_dict(again) == d
    assert task.inner_iterations(cfg) >= 1


def test_the_default_task_is_ppdnmf_with_todays_defaults():
    cfg = to_run_config(_compose())
    assert cfg.task == "ppdnmf" and cfg.name == "paper_synthetic" and cfg.n_agents == 10
    assert cfg.solver.bcd_iters == 100 and cfg.exchange.kind == "plain" and cfg.logger.kind == "tensorboard"


@pytest.mark.parametrize("bad", ["nmf", "", None, "base"])
def test_an_unknown_task_is_one_config_error(bad):
    with pytest.raises(ConfigError, match=r"^task: unknown value .*; use one of .*ppdnmf"):
        get_task(bad)


def test_a_config_without_a_task_is_ppdnmfs():
    """Run folders written before tasks existed have no ``task`` key: they are PPDNMF runs."""
    assert task_of({"seed": 0}).name == "ppdnmf"
    cfg = get_task("ppdnmf").config_from_dict({"seed": 3})
    assert cfg.task == "ppdnmf" and cfg.seed == 3
    with pytest.raises(ConfigError, match="^task: unknown value 'symnmf'"):
        get_task("ppdnmf").config_from_dict({"task": "symnmf"})  # another model's config is not PPDNMF's


# --------------------------------------------------------------------------------------
# The runner through the interface alone
# --------------------------------------------------------------------------------------


@dataclass
class _Logger:
    kind: str = "none"
    flush_secs: int = 30


@dataclass
class _ToyConfig:
    """The app's run keys (:class:`~ppdnmf_torch.app.tasks.base.RunSettings`) and one of its own."""

    task: str = "toy"
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float64"
    progress: bool = False
    progress_interval: float = 5.0
    threads: int | None = None
    trials: int = 1
    checkpoint_every: int = 0
    keep_checkpoints: bool = False
    resume: str | None = None
    logger: _Logger = field(default_factory=_Logger)
    value: float = 1.0

    def validate(self):
        if self.value < 0:
            raise ConfigError("value: must be >= 0")
        return self


class _ToyTask(Task):
    name = "toy"
    config_keys = {"value": "toy.value"}

    def __init__(self):
        self.calls = []

    def config_from_dict(self, d):
        return _ToyConfig(**d)

    def config_to_dict(self, cfg):
        return asdict(cfg)

    def build_inputs(self, cfg):
        self.calls.append("build_inputs")
        if cfg.value == 13:
            raise DataError("unlucky", key="value")
        return {"x": cfg.value}

    def fit(self, cfg, inputs, logger, out, *, show, callback=None, resume_from=None):
        self.calls.append("fit")
        return {"y": 2 * inputs["x"]}

    def write_outputs(self, cfg, inputs, fits, out, logger):
        self.calls.append("write_outputs")
        (out / "toy.txt").write_text(str(fits["y"]))
        return {"y": fits["y"], "wall_time": {"total": None}}

    def run_trials(self, cfg, out, logger, *, show, callback=None):
        self.calls.append("run_trials")
        return {"trials": cfg.trials, "wall_time": {"total": None}}

    def format_summary(self, summary):
        return f"y = {summary['y']}"


def test_the_runner_runs_any_task_through_the_interface(tmp_path):
    toy = _ToyTask()
    summary = run(_ToyConfig(value=3.0), tmp_path / "a", task=toy)
    assert toy.calls == ["build_inputs", "fit", "write_outputs"]
    assert summary["y"] == 6.0 and summary["wall_time"]["total"] > 0
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["y"] == 6.0
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text()) == asdict(_ToyConfig(value=3.0))
    assert (tmp_path / "a" / "toy.txt").read_text() == "6.0"
    toy.calls.clear()
    summary = run(_ToyConfig(trials=4), tmp_path / "b", task=toy)
    assert toy.calls == ["run_trials"] and summary["trials"] == 4


def test_the_runner_keeps_its_folder_rules_and_error_keys_for_any_task(tmp_path):
    toy = _ToyTask()
    with pytest.raises(DataError, match=r"^toy\.value: unlucky"):  # the task's config key
        run(_ToyConfig(value=13.0), tmp_path / "a", task=toy)
    assert not (tmp_path / "a" / "summary.json").exists()
    with pytest.raises(ConfigError, match=r"^toy\.value: must be >= 0"):  # validated again by the runner
        run(_ToyConfig(value=-1.0), tmp_path / "b", task=toy)
    with RunFolderLock(tmp_path / "c"):
        with pytest.raises(RunFolderError, match="being written by another ppdnmf run"):
            run(_ToyConfig(), tmp_path / "c", task=toy)


def test_ppdnmfs_task_reads_its_summary():
    task = get_task("ppdnmf")
    assert task.objective({"nmse": {"distributed": 0.25}}) == 0.25
    assert task.objective({"nmse": {"distributed": {"mean": 0.5, "std": 0.1}}}) == 0.5
    assert task.resume_safe_keys == ("solver.bcd_iters",)
    assert task.config_keys["g_bits"] == "exchange.g_bits"
