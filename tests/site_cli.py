"""What the site-mode CLI tests share: the environment of a site's subprocess."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def site_env() -> dict:
    """The environment of a site's process: this tree first on the path, one thread (tiny problems
    on shared CI cores), and no ``torch.distributed`` variables inherited from the caller (a site
    takes its rank and rendezvous from its own keys)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HYDRA_FULL_ERROR="0")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env
