"""FSSPCA with a server in site mode: :func:`fit_fsspca_server_site`, one party's process, the
server (site 0, no data) or a worker (sites ``1..K``, its own rows only) (docs/DEPLOYMENT.md,
"FSSPCA with a server").

A site is one rank of :func:`~.server_ranks.fit_server_rank` given its own rows only and the run's
public description: the number of workers and the site of each (``assignment``; default worker
``i`` on site ``i + 1``), the number of features ``d``, the number of components, the exchange,
the settings and the seed of the start. The sites compare their descriptions at rendezvous,
field by field (:func:`~ppdnmf_torch.distributed.site.agree_description`), never the data or a
hash of it. What crosses a site's boundary per ADMM iteration: the workers' uploads
``w_i + u_i / rho`` to the server through the halo exchange on the star (under ``secagg``, the
default, pairwise-masked integers: the server learns their sum only), ``z`` broadcast by the
server (the algorithm's public output), the stopping test's ``sum_i ||w_i - z||^2`` (one number per
site, masked under ``secagg``: only the total is revealed) and the largest ``||w_i - z||`` (a
maximum, in the clear). Once: the centring's sum ``[s_i, n_i]`` (through the star, as the uploads)
and its public scale (a maximum), and for ``rho="auto"``/``alpha_scale="gram"`` the summed
``lambda_max(C_i)`` with its scale. Nothing is gathered at the end: each site keeps ``z`` and its
own workers' ``w``, ``u``; the checkpoints are per site (``<checkpoint_dir>/rank<r>/``).
"""
from __future__ import annotations

from ...distributed.comm import Comm
from ...errors import ConfigError, DataError
from .server_ranks import ServerRankResult, fit_server_rank
from .serverless_site import site_blocks

__all__ = ["fit_fsspca_server_site", "server_site_owner"]


def server_site_owner(assignment, n_workers, world_size: int) -> list:
    """The site of every worker (``>= 1``; site 0 is the server): ``assignment`` as given, or
    worker ``i`` on site ``i + 1`` (then ``n_workers``, if given, is ``world_size - 1``)."""
    if world_size < 2:
        raise ConfigError(f"the server is site 0 and the workers need sites of their own; the run has {world_size} "
                          "site(s)", key="comm")
    if assignment is None:
        if n_workers is not None and int(n_workers) != world_size - 1:
            raise ConfigError(f"{n_workers} workers on {world_size - 1} worker sites: give the site of every worker "
                              "(assignment), or one worker per site", key="n_workers")
        return list(range(1, world_size))
    owner = [int(a) for a in assignment]
    if n_workers is not None and len(owner) != int(n_workers):
        raise ConfigError(f"gives {len(owner)} sites for {n_workers} workers", key="assignment")
    bad = [a for a in owner if not 1 <= a < world_size]
    if bad:
        raise ConfigError(f"names site {bad[0]}; the workers' sites are 1..{world_size - 1} (site 0 is the server)",
                          key="assignment")
    empty = sorted(set(range(1, world_size)) - set(owner))
    if empty:
        raise ConfigError(f"site {empty[0]} holds no worker; every site but the server holds at least one",
                          key="assignment")
    return owner


def fit_fsspca_server_site(comm: Comm, X_own, n_components: int, *, n_features: int, n_workers: int | None = None,
                           assignment=None, **kwargs) -> ServerRankResult:
    """One site of FSSPCA with a server: :func:`~.server_ranks.fit_server_rank` on this site's own
    rows (the server: none).

    Parameters
    ----------
    comm : Comm
        The run's transport; ``comm.rank`` is this site (0: the server).
    X_own : None, array (n_i, d), list of arrays or dict {worker: array}
        The server: None. A worker site: its workers' rows
        (:func:`~.serverless_site.site_blocks`); no other site's rows are needed.
    n_components : int
    n_features : int
        ``d`` (public): a block of another width is refused before any message.
    n_workers : int, optional
        ``K`` (default ``len(assignment)``, or one worker per site: ``world_size - 1``).
    assignment : sequence of K ints >= 1, optional
        The site of every worker; default worker ``i`` on site ``i + 1``.
    **kwargs
        :func:`~.server_ranks.fit_server_rank`'s other keywords (``exchange``, the settings,
        checkpoints, ``callback``, ``dtype``).

    Returns
    -------
    ServerRankResult
        ``z`` (public), ``own`` (this site's workers' ``w``, ``u``; none on the server), the
        history, ``n_iter``, ``converged``.
    """
    if not isinstance(comm, Comm):
        raise ConfigError(f"comm: must be a Comm (ppdnmf_torch.distributed.Comm), got {type(comm).__name__}")
    owner = server_site_owner(assignment, n_workers, comm.world_size)
    if comm.rank == 0:
        if X_own is not None:
            raise DataError("the server (site 0) holds no rows; give None", key="X")
        blocks = None
    else:
        blocks = site_blocks(X_own, [i for i, s in enumerate(owner) if s == comm.rank], int(n_features))
    return fit_server_rank(comm, blocks, n_components, n_workers=len(owner), n_features=int(n_features),
                           assignment=owner, **kwargs)
