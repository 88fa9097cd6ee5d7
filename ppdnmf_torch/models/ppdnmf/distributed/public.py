"""What a PPDNMF site holds and what the sites compare (:mod:`.site`): a site's own blocks checked
(:func:`site_blocks`), the run's public description (:func:`site_description`), and the check
that the site holds the agents the assignment gives it."""
from __future__ import annotations

import dataclasses
import hashlib

import torch

from ....errors import ConfigError, DataError
from ....distributed.site import own_agents
from ..problem import check_data

__all__ = ["site_blocks", "site_description", "check_own_agents"]


def site_blocks(Z: dict, n_agents: int, columns, negative: str) -> tuple:
    """A site's own blocks (checked as :func:`~..problem.check_data` does, float64 on the CPU) and
    every agent's column count (public, ``columns``)."""
    if columns is None or len(columns) != n_agents:
        raise ConfigError(f"a site's run needs every agent's column count (public): {n_agents} numbers, got "
                          f"{None if columns is None else len(columns)}", key="columns")
    if negative == "shift":
        raise ConfigError("negative: 'shift' adds the whole data's minimum, which no site knows; use 'clip', "
                          "'allow' or 'error' in a site's run", key="negative")
    counts = [int(c) for c in columns]
    ids = sorted(Z)
    bad = [i for i in ids if not 0 <= int(i) < n_agents]
    if bad:
        raise DataError(f"Z: a block for agent {bad[0]}, the graph has agents 0..{n_agents - 1}", key="Z")
    blocks = [torch.as_tensor(Z[i]).to(device="cpu", dtype=torch.float64) for i in ids]
    for i, b in zip(ids, blocks):
        if b.dim() != 2 or b.shape[1] != counts[i] or b.shape[0] != blocks[0].shape[0] or b.shape[0] < 1:
            raise DataError(f"Z[{i}]: has shape {tuple(b.shape)}, the public description gives agent {i} "
                            f"{counts[i]} columns (and every block the same rows)", key="Z")
    checked = check_data(blocks, negative)
    return dict(zip(ids, checked)), counts


def check_own_agents(blocks: dict, part, rank: int) -> None:
    """The site was given the blocks of exactly the agents the partition puts on it."""
    mine = own_agents(part.owner, rank)
    if sorted(blocks) != mine:
        raise DataError(f"site {rank} was given the blocks of agents {sorted(blocks)}, the assignment puts agents "
                        f"{mine} on it", key="Z")


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def site_description(graph, caps, seed, params, spec, part, counts, L, share, init_seed=None) -> dict:
    """The run's public description as the sites compare it: one field per setting (named as the
    user names them), the graph and the caps by count and a short SHA-256."""
    edges = list(zip(graph.src.tolist(), graph.dst.tolist()))
    desc = {"n_agents": graph.n_agents, "graph": f"{len(edges)} directed edges, sha256 {_short(repr(edges))}",
            "assignment": list(part.owner), "rows": int(L), "columns": list(counts),
            "g_max": float(caps[0]) if bool((caps == caps[0]).all()) else f"sha256 {_short(repr(caps.tolist()))}",
            "seed": int(seed), "init_seed": init_seed, "share": share}
    desc.update({k: v for k, v in sorted(vars(params).items())})
    desc["exchange"] = spec.kind
    if dataclasses.is_dataclass(spec):  # each setting by its name (``n_max=1000000.0``)
        desc.update({f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})
    else:
        desc["exchange_spec"] = repr(spec)
    return desc
