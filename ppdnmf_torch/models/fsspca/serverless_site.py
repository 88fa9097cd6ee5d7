"""Serverless FSSPCA in site mode: :func:`fit_fsspca_site`, one party's process that holds only its
own workers' rows (docs/DEPLOYMENT.md, "FSSPCA").

A site is one rank of :func:`~.serverless_ranks.fit_serverless_rank` given its own workers' row
blocks only and the run's public description: the workers' graph, the site of every worker
(``assignment``), the number of features ``d``, the number of components and the settings (the
seed of the start and of the agreed penalties among them). The sites compare their descriptions
at rendezvous, field by field (:func:`~ppdnmf_torch.distributed.site.agree_description`), never
the data or a hash of it. What crosses a site's boundary: the exchange's protocol (under
``secagg``, the default, masked messages and the cut edges' agreed penalties only), and per
site one number per sum or maximum the method needs over every worker (``share="sums"``: the
centring's scale, the workers' summed ``lambda_max(C_i)`` for ``rho="auto"`` and
``alpha_scale="gram"``, the stopping test's two sums, the largest ``||w_i - z_i||``); no
``z_i``, no per-worker value of another site, nothing gathered at the end: each site keeps its
own ``z_i``, ``w_i``, ``u_i`` and the history (without ``disagreement``, which would need the
workers' mean ``z``). The factors' bits are :func:`~.serverless.fit_serverless`'s with the same
seeds where every site holds one worker (with several, the sums round differently).
"""
from __future__ import annotations

import torch

from ...distributed.comm import Comm
from ...distributed.site import own_agents, site_owner
from ...errors import ConfigError, DataError
from ...graph import Graph
from .serverless_ranks import ServerlessRankResult, fit_serverless_rank

__all__ = ["fit_fsspca_site", "site_blocks"]


def site_blocks(X_own, agents, n_features: int) -> list:
    """A site's row blocks in increasing worker id, checked against the public ``n_features``.

    Parameters
    ----------
    X_own : array (n_i, d), list of arrays or dict {worker: array}
        One block when the site holds one worker; else one per worker (a list in increasing
        worker id, or by id).
    agents : list of int
        The site's workers (:func:`~ppdnmf_torch.distributed.site.own_agents`).
    n_features : int

    Raises
    ------
    DataError
        One line naming ``X`` (wrong count, shape or a block of no rows).
    """
    if isinstance(X_own, dict):
        if sorted(int(k) for k in X_own) != list(agents):
            raise DataError(f"holds the workers {sorted(X_own)}, this site's workers are {agents}", key="X")
        blocks = [X_own[i] for i in agents]
    elif isinstance(X_own, (list, tuple)):
        blocks = list(X_own)
    else:
        blocks = [X_own]
    if len(blocks) != len(agents):
        raise DataError(f"{len(blocks)} row blocks, this site's workers {agents} need {len(agents)}", key="X")
    out = []
    for i, b in zip(agents, blocks):
        t = b if isinstance(b, torch.Tensor) else torch.as_tensor(b)
        if t.dim() != 2 or t.shape[1] != n_features or t.shape[0] == 0:
            raise DataError(f"worker {i}'s rows have shape {tuple(t.shape)}; the public description has "
                            f"(n_i >= 1, {n_features}) features", key="X")
        out.append(t)
    return out


def fit_fsspca_site(comm: Comm, X_own, n_components: int, graph: Graph, *, n_features: int, assignment=None,
                    **kwargs) -> ServerlessRankResult:
    """One site of serverless FSSPCA: :func:`~.serverless_ranks.fit_serverless_rank` on this site's
    own rows with ``share="sums"``.

    Parameters
    ----------
    comm : Comm
        The run's transport; ``comm.rank`` is this site.
    X_own : array (n_i, d), list of arrays or dict {worker: array}
        This site's workers' rows (:func:`site_blocks`); no other site's rows are needed.
    n_components : int
    graph : Graph
        The workers' graph (public).
    n_features : int
        ``d`` (public): a block of another width is refused before any message.
    assignment : sequence of K ints, optional
        The site of every worker; default worker ``i`` on site ``i``.
    **kwargs
        :func:`~.serverless_ranks.fit_serverless_rank`'s other keywords (``exchange``, the
        settings, checkpoints, ``callback``); ``share`` and ``partition`` are the site's.

    Returns
    -------
    ServerlessRankResult
        ``own`` (this site's workers' ``z``, ``w``, ``u``), the history, ``n_iter``, ``converged``.
    """
    for k in ("share", "partition"):
        if k in kwargs:
            raise ConfigError(f"{k}: a site's run sets it (share='sums', the partition is the assignment)")
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    if not isinstance(graph, Graph):
        raise ConfigError(f"graph: expected a Graph (one agent per worker), got {graph!r}")
    owner = site_owner(assignment, graph.n_agents, comm.world_size)
    blocks = site_blocks(X_own, own_agents(owner, comm.rank), int(n_features))
    return fit_serverless_rank(comm, blocks, n_components, graph, assignment=owner, share="sums", **kwargs)
