"""Symmetric NMF across agents in site mode: :func:`fit_symnmf_site`, one party's process that
holds only its own agents' columns of the similarity, ``X[:, S_i]`` (docs/DEPLOYMENT.md).

What a site holds corresponds to real data as a graph whose parties each hold their own nodes'
links: party ``i`` knows the similarities (edges, weights) of its nodes ``S_i`` to every node of
the graph, a column block of the symmetric ``X`` (a social network whose operators each hold
their users' links, hospitals that each hold their patients' similarities to a shared reference
panel). The node sets ``parts`` and the graph of agents are public. A party makes its file from
the links it knows with :func:`columns_from_links`; a similarity of samples (Kuang et al.'s kNN
graph, :mod:`.similarity`) is not a site's own data: it needs every party's samples.

A site is one rank of :func:`~.distributed.fit_symnmf_rank` given its own columns only
(:class:`SiteColumns`, whose other columns are zero and never read): the ranks compare the
public description field by field at rendezvous
(:func:`~ppdnmf_torch.distributed.site.agree_description`), not a digest of ``X``; ``||X||^2``
for the metrics is summed over the sites (one all-reduce of one number per site, masked under
``exchange="secagg"`` as the run's other sums); nothing is
gathered at the end: each site keeps its agents' ``U_i``, ``V_i`` and the history. The factors'
bits are :func:`~.agents.fit_symnmf_agents`'s with the same seeds; the metrics equal one
process's to rounding (``||X||^2`` is summed in another order).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ...distributed.comm import Comm
from ...distributed.masked_sum import PlainSums
from ...distributed.site import agree_description, own_agents, site_owner
from ...errors import ConfigError, DataError
from .distributed import SymRankResult, fit_symnmf_rank
from .operator import Similarity

__all__ = ["SiteColumns", "fit_symnmf_site", "columns_from_links", "cut_columns"]


class SiteColumns(Similarity):
    """A site's columns of ``X`` in an ``(n, n)`` matrix whose other columns are zero (never read:
    each agent's columns are gathered from its own ``S_i``); :attr:`site` marks it for the rank run."""

    def __init__(self, data: torch.Tensor):
        super().__init__(data)
        self.site = self

    def agree(self, comm: Comm, description: dict, sums=None) -> None:
        """Compare the public description with every other site's, then sum ``||X||^2`` (with ``sums``:
        masked under ``exchange="secagg"``, :class:`~ppdnmf_torch.distributed.masked_sum.MaskedSums`;
        default the plain all-reduce)."""
        agree_description(comm, description)
        total = self.sq_norm.detach().to(torch.float64).reshape(1).clone()
        sums = sums if sums is not None else PlainSums(comm)
        self.sq_norm = sums.all_reduce(total, category="metrics", what="the sum of ||X||^2 over the sites",
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


def columns_from_links(links, nodes, n: int, *, dtype=torch.float64) -> torch.Tensor:
    """A site's file from its own raw data: the links it knows, as its columns ``X[:, nodes]``.

    Parameters
    ----------
    links : array-like (E, 2) or (E, 3)
        The links this party knows, one per row: node ids ``i``, ``j`` (``0 .. n-1``, the public
        numbering) and a weight ``w`` (default 1); each has an endpoint among ``nodes``. A link
        is undirected: ``X[i, j] = X[j, i] = w`` (``i == j``: the diagonal); repeated links add up.
    nodes : sequence of int
        The party's nodes, in its agents' order (the public ``S_i`` side by side).
    n : int
        The number of nodes of the whole graph (public).

    Returns
    -------
    Tensor (n, len(nodes))
        Column ``c`` holds node ``nodes[c]``'s links to every node; save it as the site's file
        (``numpy.save("own.npy", X_own.numpy())``).

    Raises
    ------
    DataError
        A node id outside ``0 .. n-1``, a repeated own node, or a link that touches none of ``nodes``
        (one line naming ``links`` or ``nodes``).
    """
    n = int(n)
    own = torch.as_tensor([int(j) for j in nodes], dtype=torch.long)
    if own.numel() == 0 or bool(((own < 0) | (own >= n)).any()) or own.unique().numel() != own.numel():
        raise DataError(f"give distinct node ids in 0..{n - 1}, got {own.tolist()[:10]}", key="nodes")
    try:
        L = torch.as_tensor(np.asarray(links, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise DataError(f"expected rows (i, j) or (i, j, w) of numbers: {exc}", key="links") from None
    if L.dim() != 2 or L.shape[1] not in (2, 3):
        raise DataError(f"expected rows (i, j) or (i, j, w), got shape {tuple(L.shape)}", key="links")
    ij = L[:, :2].round().to(torch.long)
    if bool((ij != L[:, :2]).any()) or bool(((ij < 0) | (ij >= n)).any()):
        raise DataError(f"node ids must be integers in 0..{n - 1}", key="links")
    w = L[:, 2] if L.shape[1] == 3 else torch.ones(L.shape[0], dtype=torch.float64)
    col = torch.full((n,), -1, dtype=torch.long)
    col[own] = torch.arange(own.numel())
    ci, cj = col[ij[:, 0]], col[ij[:, 1]]
    stray = ((ci < 0) & (cj < 0)).nonzero()
    if stray.numel():
        k = int(stray[0])
        raise DataError(f"row {k} links nodes {ij[k].tolist()}, neither of them this party's", key="links")
    out = torch.zeros((n, own.numel()), dtype=torch.float64)
    a = cj >= 0  # X[i, j]: column j's row i
    out.index_put_((ij[a, 0], cj[a]), w[a], accumulate=True)
    b = (ci >= 0) & (ij[:, 0] != ij[:, 1])  # X[j, i], once for a self-link
    out.index_put_((ij[b, 1], ci[b]), w[b], accumulate=True)
    return out.to(dtype)


def cut_columns(X, parts, agents) -> torch.Tensor:
    """A site's file cut from a whole similarity (a public toy, or a simulation): ``X[:, S_i]`` of
    ``agents`` side by side, in increasing agent id, each in its ``S_i``'s order (padding ``>= n``
    dropped); ``(n, sum of their |S_i|)``."""
    X = torch.as_tensor(X)
    n = X.shape[0]
    cols = [int(j) for i in sorted(int(a) for a in agents) for j in torch.as_tensor(parts[i]).reshape(-1).tolist()
            if 0 <= int(j) < n]
    return X[:, cols].clone()
