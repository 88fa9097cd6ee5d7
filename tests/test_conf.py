"""``conf/``: every option of every group of every task composes and converts into the task's
typed config (and back, unchanged), and the composed defaults are the models' specs."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("hydra")
from hydra import compose, initialize_config_dir  # noqa: E402

from ppdnmf_torch.app.cli import CONFIG_DIR, to_run_config  # noqa: E402
from ppdnmf_torch.app.tasks import get_task, task_names  # noqa: E402
from ppdnmf_torch.models.fsspca import config as fcfg  # noqa: E402
from ppdnmf_torch.models.symnmf import config as scfg  # noqa: E402

CONF = Path(CONFIG_DIR)
#: the groups each task composes, with the overrides an option needs beside it (a file's path,
#: the variant that brings the graph and exchange groups, a labelled data set for a class split)
GROUPS = {
    "symnmf": {"symnmf/data": [], "symnmf/solver": [], "symnmf/variant": [],
               "graph": ["symnmf/variant=agents"], "exchange": ["symnmf/variant=agents"], "logger": []},
    "fsspca": {"fsspca/data": [], "fsspca/split": ["fsspca/data=digits"], "fsspca/solver": [], "fsspca/variant": [],
               "graph": ["fsspca/variant=serverless"], "exchange": ["fsspca/variant=serverless"], "logger": []},
    "ppdnmf": {"data": [], "graph": [], "solver": [], "consensus": [], "exchange": [], "experiment": [],
               "logger": []},
}
#: values a group's option leaves required (``???``)
REQUIRED = {"data.path": {"symnmf": "x.npy", "fsspca": None, "ppdnmf": None}, "graph.path": "edges.txt"}


def _options(group: str) -> list:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _cases():
    for task, groups in GROUPS.items():
        for group, extra in groups.items():
            for option in _options(group):
                yield task, group, option, extra


def _fill(task: str, group: str, option: str) -> list:
    """The overrides an option's required values need."""
    out = []
    if group.endswith("data") and option in ("npy", "csv"):
        out.append(f"data.path=rows.{option}")
    elif group.endswith("data") and option in ("orl", "samples", "similarity", "cbcl"):
        out.append("data.path=x.mat" if option in ("orl", "cbcl") else "data.path=x.npy")
    if group == "graph" and option == "file":
        out.append("graph.path=edges.txt")
    if task == "ppdnmf" and group == "experiment" and "cbcl" in option:
        out.append("data.path=faces.mat")
    return out


CASES = list(_cases())


@pytest.fixture(scope="module", autouse=True)
def hydra_conf():
    """One Hydra initialization for the module (each is slow)."""
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        yield


def test_every_group_folder_is_listed():
    """A group folder added under conf/ (besides Hydra's) is covered by the cases here."""
    listed = {g for groups in GROUPS.values() for g in groups} | {"task"}
    found = {str(p.parent.relative_to(CONF)) for p in CONF.rglob("*.yaml")
             if p.parent != CONF and not str(p.relative_to(CONF)).startswith("hydra")}
    assert found == listed


@pytest.mark.parametrize("task, group, option, extra", CASES, ids=[f"{t}:{g}={o}" for t, g, o, _ in CASES])
def test_every_option_composes_and_converts(task, group, option, extra):
    overrides = [f"task={task}", *extra, f"{group}={option}", *_fill(task, group, option)]
    cfg = to_run_config(compose(config_name="config", overrides=overrides))
    assert cfg.task == task
    t = get_task(task)
    d = t.config_to_dict(cfg)
    assert t.config_to_dict(t.config_from_dict(d)) == d
    cfg.validate()


def _compose(*overrides):
    return to_run_config(compose(config_name="config", overrides=list(overrides)))


def test_the_composed_defaults_are_the_models_specs():
    s = _compose("task=symnmf")
    assert s.solver == scfg.SPEC and s.variant == "centralized" and s.agents is None
    a = _compose("task=symnmf", "symnmf/variant=agents")
    assert a.agents == scfg.AGENTS and a.exchange.kind == scfg.AGENTS.exchange
    f = _compose("task=fsspca")
    assert f.solver == fcfg.SPEC and (f.n_components, f.alpha, f.n_workers) == (
        fcfg.TASK.n_components, fcfg.TASK.alpha, fcfg.TASK.n_workers)
    assert (f.split.kind, f.split.concentration) == (fcfg.TASK.split, fcfg.TASK.concentration)
    sl = _compose("task=fsspca", "fsspca/variant=serverless")
    assert sl.serverless == fcfg.SERVERLESS and sl.exchange.kind == fcfg.SERVERLESS.exchange


def test_a_yaml_key_the_spec_does_not_have_is_refused():
    """The yaml files hold exactly the specs' keys: one more is a one-line error naming it."""
    from ppdnmf_torch.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^solver\.bogus: unknown key"):
        _compose("task=symnmf", "+solver.bogus=1")
    assert set(asdict(scfg.SPEC)) == set(asdict(_compose("task=symnmf").solver))


def test_every_task_has_its_own_help():
    for name in task_names():
        assert (CONF / "hydra" / "help" / f"{name}.yaml").is_file(), name
        text = (CONF / "task" / f"{name}.yaml").read_text()
        assert f"override /hydra/help: {name}" in text, name


@pytest.mark.parametrize("task", ["symnmf", "fsspca", "ppdnmf"])
def test_a_tasks_help_lists_its_groups_and_every_option(task):
    """``ppdnmf task=<name> --help`` names the task's own groups with all their options (and only
    those: PPDNMF's help names the tasks, not their groups)."""
    text = (CONF / "hydra" / "help" / f"{task}.yaml").read_text()
    for group in GROUPS[task]:
        assert f"{group}: {', '.join(_options(group))}" in text, group
    others = {g for t, groups in GROUPS.items() if t != task for g in groups} - set(GROUPS[task])
    assert not [g for g in others if f"\n  {g}: " in text]
    if task == "ppdnmf":
        assert f"task: {', '.join(_options('task'))} (" in text
