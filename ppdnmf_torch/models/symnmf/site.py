"""Symmetric NMF across agents in site mode: :func:`fit_symnmf_site`, one party's process that
holds only its own agents' columns of the similarity, ``X[:, S_i]`` (docs/DEPLOYMENT.md).

What a site holds corresponds to real data as a graph whose parties each hold their own nodes'
links: party ``i`` knows the similarities (edges, weights) of its nodes ``S_i`` to every node of
the graph, a column block of the symmetric ``X`` (a social network whose operators each hold
their users' links, hospitals that each hold their patients' similarities to a shared reference
panel). The node sets ``parts`` and the graph of agents are public.

A site is one rank of :func:`~.distributed.fit_symnmf_rank` given its own columns only
(:class:`SiteColumns`, whose other columns are zero and never read): the ranks compare the
public description field by field at rendezvous
(:func:`~ppdnmf_torch.distributed.site.agree_description`), not a digest of ``X``; ``||X||^2``
for the metrics is summed over the sites (one all-reduce of one number per site); nothing is
gathered at the end: each site keeps its agents' ``U_i``, ``V_i`` and the history. The factors'
bits are :func:`~.agents.fit_symnmf_agents`'s with the same seeds; the metrics equal one
process's to rounding (``||X||^2`` is summed in another order).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...distributed.comm import Comm
from ...distributed.site import agree_description, own_agents, site_owner
from ...errors import ConfigError, DataError
from .distributed import SymRankResult, fit_symnmf_rank
from .operator import Similarity

__all__ = ["SiteColumns", "fit_symnmf_site"]


class SiteColumns(Similarity):
    """A site's columns of ``X`` in an ``(n, n)`` matrix whose other columns are zero (never read:
    each agent's columns are gathered from its own ``S_i``); :attr:`site` marks it for the rank run."""

    def __init__(self, data: torch.Tensor):
        super().__init__(data)
        self.site = self

    def agree(self, comm: Comm, description: dict) -> None:
        """Compare the public description with every other site's, then sum ``||X||^2``."""
        agree_description(comm, description)
        total = self.sq_norm.detach().to(torch.float64).reshape(1).clone()
        self.sq_norm = comm.all_reduce(total, category="metrics", what="the sum of ||X||^2 over the sites",
                                       op=dist.ReduceOp.SUM).reshape(()).to(self.data.dtype)


def site_matrix(X_own, parts, agents, n: int) -> torch.Tensor:
    """The ``(n, n)`` matrix holding a site's columns (its agents' blocks side by side, in increasing
    agent id, each in its ``S_i``'s order) and zeros elsewhere."""
    idx = torch.as_tensor(parts, dtype=torch.long)
    cols = [int(j) for i in agents for j in idx[i].tolist() if 0 <= int(j) < n]
    X_own = torch.as_tensor(X_own)
    if X_own.dim() != 2 or tuple(X_own.shape) != (n, len(cols)):
        raise DataError(f"has shape {tuple(X_own.shape)}, this site's agents {agents} hold ({n}, {len(cols)}) by the "
                        "public parts", key="X")
    full = torch.zeros((n, n), dtype=X_own.dtype if X_own.is_floating_point() else torch.float64)
    full[:, cols] = X_own.to(full.dtype)
    return full


def fit_symnmf_site(comm: Comm, X_own, rank: int, *, n: int, parts, n_agents: int, graph, assignment=None,
                    **kwargs) -> SymRankResult:
    """One site of symmetric NMF across agents: :func:`~.distributed.fit_symnmf_rank` on this site's
    own columns.

    Parameters
    ----------
    comm : Comm
    X_own : Tensor (n, sum of its agents' |S_i|)
        The site's columns ``X[:, S_i]`` of its agents, side by side in increasing agent id.
    rank : int
        ``r``, the factorization rank.
    n : int
        The number of nodes (public).
    parts : (N, m) ints
        Every agent's nodes ``S_i`` (public), padded with ``n``.
    n_agents : int
    graph : Graph
        The agents' graph (public).
    assignment : sequence of N ints, optional
        The site of every agent; default agent ``i`` on site ``i``.
    **kwargs
        :func:`~.distributed.fit_symnmf_rank`'s other keywords; ``share`` is ``"sums"``.

    Returns
    -------
    SymRankResult
        ``own`` (this site's agents' ``U``, ``V``, ``parts``) and ``history``; ``result`` is None.
    """
    for k in ("share", "partition", "U0"):
        if k in kwargs:
            raise ConfigError(f"{k}: a site's run sets it (share='sums', the partition is the assignment, the "
                              "start is drawn from the seed)", key=k)
    owner = site_owner(assignment, int(n_agents), comm.world_size)
    sim = SiteColumns(site_matrix(X_own, parts, own_agents(owner, comm.rank), int(n)))
    return fit_symnmf_rank(comm, sim, rank, n_agents=n_agents, graph=graph, parts=parts, assignment=owner,
                           share="sums", **kwargs)
