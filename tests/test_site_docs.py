"""docs/DEPLOYMENT.md's first bash block, run as written from an empty directory (issue 39): three
sites on one machine, each with its own file, each run folder with its own factors."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "DEPLOYMENT.md"


def first_bash_block(text: str) -> str:
    return re.search(r"```bash\n(.*?)```", text, re.S).group(1)


def test_the_first_block_is_the_three_site_example():
    block = first_bash_block(PAGE.read_text(encoding="utf-8"))
    assert block.count("site.rank=$i") == 1 and "wait" in block and "site.data=own.npy" in block
    assert "127.0.0.1:29577" in block


@pytest.mark.slow
def test_the_three_site_example_runs_as_written(tmp_path):
    from ppdnmf_torch.distributed import free_port

    block = first_bash_block(PAGE.read_text(encoding="utf-8"))
    block = block.replace("127.0.0.1:29577", f"127.0.0.1:{free_port()}")  # a port nobody else holds now
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(re.findall(r"site \d: exit \d+", out.stdout)) == [f"site {i}: exit 0" for i in range(3)], out.stdout
    for i in range(3):
        folder = tmp_path / f"site{i}"
        assert sorted(p.name for p in folder.iterdir()) == ["own.npy", "run", "site.log"]
        own = torch.load(folder / "run" / "factors.pt", weights_only=False)
        assert own["agents"].tolist() == [i] and own["X"].shape == (1, 30, 4)
