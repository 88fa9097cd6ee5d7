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

import torch

from ....errors import ConfigError
from ....distributed.comm import Comm
from ....distributed.site import own_agents, site_owner, split_own_columns
from ..problem import as_graph
from .engine import RankResult, fit_rank

__all__ = ["fit_site"]


def fit_site(comm: Comm, Z, adjacency, rank, *, columns, assignment=None, **kwargs) -> RankResult:
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
        On every site: ``result`` (the reduced history, ``n_iter``, ``converged``, no factors)
        and ``own`` (this site's agents' ``X``, ``U``, ``Y``; the single-process bits).
    """
    for k in ("share", "partition"):
        if k in kwargs:
            raise ConfigError(f"{k}: a site's run sets it (share='sums', the partition is the assignment)", key=k)
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    graph = as_graph(adjacency)
    owner = site_owner(assignment, graph.n_agents, comm.world_size)
    if not isinstance(Z, dict):
        Z = split_own_columns(torch.as_tensor(Z), own_agents(owner, comm.rank), columns, key="Z")
    return fit_rank(comm, Z, graph, rank, columns=list(columns), assignment=owner, share="sums", **kwargs)
