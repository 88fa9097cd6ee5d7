"""PPDNMF's site mode: :func:`fit_site`, one party's process that holds only its own columns.

A site is one rank of :func:`~.engine.fit_rank` given its own agents' blocks only (a dict by
agent id) and the run's public description: the graph, the site of every agent
(``assignment``), every agent's column count ``M_i`` (``columns``) and the settings. What crosses
the site's boundary is the exchange's protocol, the stopping rule's flags and the metrics' per-rank
sums (``share="sums"``, always); the sites compare their public descriptions at rendezvous
(:func:`~ppdnmf_torch.distributed.site.agree_description`), never the data or a hash of it. The
factors' bits are the single-process run's (``fuse=False``) with the same seeds.
"""
from __future__ import annotations

import hashlib

import torch

from ....errors import ConfigError, DataError
from ....distributed.comm import Comm
from ....distributed.site import own_agents, site_owner, split_own_columns
from ..problem import as_graph, check_data

__all__ = ["fit_site", "site_blocks", "site_description", "check_own_agents"]


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


def site_description(graph, caps, seed, params, spec, part, counts, L, share) -> dict:
    """The run's public description as the sites compare it: one field per setting (named as the
    user names them), the graph and the caps by count and a short SHA-256."""
    edges = list(zip(graph.src.tolist(), graph.dst.tolist()))
    desc = {"n_agents": graph.n_agents, "graph": f"{len(edges)} directed edges, sha256 {_short(repr(edges))}",
            "assignment": list(part.owner), "rows": int(L), "columns": list(counts),
            "g_max": f"sha256 {_short(repr(caps.tolist()))}", "seed": int(seed), "share": share}
    desc.update({k: v for k, v in sorted(vars(params).items())})
    desc["exchange"] = repr(spec)
    return desc


def fit_site(comm: Comm, Z, adjacency, rank, *, columns, assignment=None, **kwargs):
    """One site of a PPDNMF run: :func:`~.engine.fit_rank` on this site's own columns.

    Parameters
    ----------
    comm : Comm
        The run's transport; ``comm.rank`` is this site.
    Z : Tensor (L, M_site), or dict {agent: Tensor (L, M_i)}
        This site's columns: its agents' blocks side by side in increasing agent id (or the
        blocks by agent id). No other site's data is needed or accepted.
    adjacency : Graph, adjacency matrix or edge list
        The public graph.
    rank : int
        ``K``, the factorization rank.
    columns : sequence of N ints
        Every agent's ``M_i`` (public: the shapes every site must know).
    assignment : sequence of N ints, optional
        The site of every agent; default: agent ``i`` on site ``i`` (then ``N`` equals the sites).
    **kwargs
        Every other keyword of :func:`~.engine.fit_rank` (``exchange``, ``seed``, ``bcd_iters``,
        checkpoints, ...); ``share`` is ``"sums"`` and ``partition`` the assignment.

    Returns
    -------
    RankResult
        (:class:`~.engine.RankResult`) On every site: ``result`` (the reduced history, ``n_iter``, ``converged``, no factors)
        and ``own`` (this site's agents' ``X``, ``U``, ``Y``; the single-process bits).
    """
    for k in ("share", "partition"):
        if k in kwargs:
            raise ConfigError(f"{k}: a site's run sets it (share='sums', the partition is the assignment)", key=k)
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    from .engine import fit_rank  # the engine imports this module's checks

    graph = as_graph(adjacency)
    owner = site_owner(assignment, graph.n_agents, comm.world_size)
    if not isinstance(Z, dict):
        Z = split_own_columns(torch.as_tensor(Z), own_agents(owner, comm.rank), columns, key="Z")
    return fit_rank(comm, Z, graph, rank, columns=list(columns), assignment=owner, share="sums", **kwargs)
