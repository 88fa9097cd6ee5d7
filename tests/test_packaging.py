"""The package as a user installs it: the wheel holds every module and every config file,
and an installed (not editable) package runs its CLI from any directory."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300, cwd=out)
    (found,) = out.glob("ppdnmf_torch-*.whl")
    return found


def test_wheel_holds_every_module_and_config_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "ppdnmf_torch").rglob("*.py")}
    configs = {"ppdnmf_torch/conf/" + p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs and "ppdnmf_torch/conf/config.yaml" in configs
    assert not modules - names, f"modules missing from the wheel: {sorted(modules - names)}"
    assert not configs - names, f"config files missing from the wheel: {sorted(configs - names)}"
    assert not any(n.startswith(("tests/", "scripts/", "conf/")) for n in names)


def _env():
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


@pytest.mark.slow
def test_installed_wheel_runs_the_cli_from_another_directory(wheel, tmp_path):
    """A fresh venv (this interpreter's packages visible, the project itself not): the
    console script, ``python -m``, ``--help``, ``--cfg job``, a run and a joblib multirun."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    work = tmp_path / "elsewhere"
    work.mkdir()

    def cli(*args):
        r = subprocess.run([str(venv / "bin" / "ppdnmf"), *args], cwd=work, env=_env(), capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r

    # the installed copy, not the checkout, is imported
    where = subprocess.run([str(py), "-c", "import ppdnmf_torch.app.cli as c; print(c.__file__, c.CONFIG_DIR)"],
                           cwd=work, env=_env(), capture_output=True, text=True, check=True)
    assert str(ROOT) not in where.stdout and "site-packages" in where.stdout
    assert "ppdnmf" in cli("--help").stdout
    assert "n_agents: 10" in cli("--cfg", "job").stdout
    short = ["solver.bcd_iters=2", "solver.x_iters=2", "solver.y_iters=2", "logger=none", "centralized=false"]
    assert "final NMSE" in cli(*short, f"hydra.run.dir={work / 'run'}").stdout
    assert (work / "run" / "summary.json").exists()
    r = subprocess.run([str(py), "-m", "ppdnmf_torch", *short, f"hydra.run.dir={work / 'run2'}"], cwd=work,
                       env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    cli("-m", "seed=0,1", "hydra/launcher=joblib", *short, f"hydra.sweep.dir={work / 'sweep'}")
    assert sorted(p.name for p in (work / "sweep").iterdir() if p.is_dir()) == ["0", "1"]
    # the same command over two local ranks (the multi-process app, from the installed wheel)
    cli("distributed.nproc=2", *short, f"hydra.run.dir={work / 'run3'}")
    assert json.loads((work / "run3" / "summary.json").read_text())["distributed"]["world_size"] == 2
