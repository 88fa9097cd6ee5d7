"""docs/DEPLOYMENT.md's symmetric-NMF example, run as written from an empty directory (issue 39):
three sites on one machine make their own files from the links of their own nodes, run, and
each run folder holds its own agents' factors."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "DEPLOYMENT.md"
PORT = "127.0.0.1:29578"


def symnmf_block() -> str:
    """The first ```bash block of the page's "Symmetric NMF across agents" section."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Symmetric NMF across agents\n", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def test_the_symnmf_section_starts_its_sites_from_their_own_files():
    block = symnmf_block()
    assert block.count("site.rank=$i") == 1 and "wait" in block and "site.data=own.npy" in block
    assert "columns_from_links" in block and PORT in block and "task=symnmf" in block


@pytest.mark.slow
def test_the_symnmf_example_runs_as_written(tmp_path):
    from ppdnmf_torch.distributed import free_port

    block = symnmf_block().replace(PORT, f"127.0.0.1:{free_port()}")  # a port nobody else holds now
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    out = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(re.findall(r"site \d: exit \d+", out.stdout)) == [f"site {i}: exit 0" for i in range(3)], out.stdout
    rng = np.random.default_rng(0)
    group = rng.permutation(np.repeat([0, 1, 2], 20))  # the block's communities (its first draw)
    for i in range(3):
        folder = tmp_path / f"sym{i}"
        assert sorted(p.name for p in folder.iterdir()) == ["own.npy", "run", "site.log"]
        assert np.load(folder / "own.npy").shape == (60, 20)
        own = torch.load(folder / "run" / "factors.pt", weights_only=False)
        assert own["agents"].tolist() == [i] and own["U"].shape == (1, 60, 3) and own["V"].shape == (1, 20, 3)
        # the page says every site's copy puts every node in its community
        labels = own["U"][0].argmax(1).numpy()
        assert len({(g, lab) for g, lab in zip(group.tolist(), labels.tolist())}) == 3
