"""FSSPCA without a server against the server version: the study behind docs/RESULTS.md's "Without a
server" and docs/THREAT_MODEL.md's serverless runs (moved out of the library; ``scripts/reproduce_fsspca.py
--only serverless`` runs :func:`serverless_table`)."""
from __future__ import annotations

import warnings

import torch

from ppdnmf_torch.errors import ConvergenceWarning, DegreeOneWarning
from ppdnmf_torch.models.fsspca.fit import fit_fsspca
from ppdnmf_torch.models.fsspca.serverless import CONSENSUS_METHODS, fit_serverless
from ppdnmf_torch.models.fsspca.serverless_audit import audit_serverless

__all__ = ["compare_with_server", "spiked_setup", "serverless_table", "audit_runs"]


def compare_with_server(data, n_components, graph, inner=(1, 3, 10, 30), *, consensus="laplacian", exchange="plain",
                        exchange_options=None, serverless_options=None, at_iteration=50, **kwargs):
    """The serverless variant against the server version
    (:func:`~ppdnmf_torch.models.fsspca.fit.fit_fsspca`, plain upload) on
    the same problem and start, per number of inner consensus iterations; ``kwargs`` go to both,
    ``serverless_options`` (``g_cap``, ``penalty_mode``, ``center_iters``) to the serverless runs.

    Returns
    -------
    list of dict, one per ``inner`` value: ``max_z_distance`` (the largest ``||z_i - z||`` of a
    worker's ``z_i`` to the server's ``z`` at the end of both runs), ``max_sine`` (principal-angle
    sine between ``qf`` of the mean ``z_i`` and the server's loadings), ``n_iter``,
    ``server_n_iter``, ``z_distance_at`` (the largest ``||z_i - z||`` after ``at_iteration``
    iterations of both, ``tol=0``), ``bytes`` (trial 0, all directed edges), ``server_bytes``
    (the plain uploads and downloads of ``z``: ``2 K d r`` floats per iteration); per trial
    where a list.
    """
    def distance(res, server):
        return torch.linalg.matrix_norm(res.z - server.z[:, None]).amax(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", DegreeOneWarning)
        server = fit_fsspca(data, n_components, **dict({"aggregation": "plain"}, **kwargs))
        fixed = dict(kwargs, max_iter=at_iteration, tol=0)
        server_at = fit_fsspca(data, n_components, **dict({"aggregation": "plain"}, **fixed))
        out = []
        for m in inner:
            opts = dict(serverless_options or {}, consensus=consensus, inner_iters=m, exchange=exchange,
                        exchange_options=exchange_options)
            res = fit_serverless(data, n_components, graph, **opts, **kwargs)
            res_at = fit_serverless(data, n_components, graph, **opts, **fixed)
            s = torch.linalg.svdvals(server.components.mT @ res.components).amin(-1)
            K, d, r = res.z.shape[1:]
            out.append(dict(consensus=consensus, inner_iters=m, max_z_distance=distance(res, server).tolist(),
                            max_sine=torch.sqrt((1 - s.square()).clamp_min(0)).tolist(), n_iter=res.n_iter.tolist(),
                            server_n_iter=server.n_iter.tolist(), z_distance_at=distance(res_at, server_at).tolist(),
                            at_iteration=at_iteration, bytes=res.bytes, costs=res.costs,
                            mean_error=None if res.mean_error is None else res.mean_error.tolist(),
                            server_bytes=float(2 * K * d * r * server.z.element_size() * int(server.n_iter[0]))))
    return out


def spiked_setup(n_workers=8, seed=0):
    """The problem of docs/RESULTS.md's "Without a server": the spiked model (``n = 800``,
    ``d = 30``, ``r = 2``, support 5) dealt IID over ``n_workers`` workers, and two graphs of them, a
    ring and a random connected graph (average degree 3, ``seed``); ``(X, groups, {name: Graph})``."""
    from ppdnmf_torch.graph import random_connected, ring
    from ppdnmf_torch.models.fsspca.data import spiked_covariance, split_rows

    sp = spiked_covariance(n=800, d=30, r=2, support=5, seed=seed)
    groups = split_rows("iid", n_workers, n=len(sp.X), seed=seed)
    return sp.X, groups, {"ring": ring(n_workers), "random": random_connected(n_workers, 3.0, seed=seed)}


def serverless_table(n_workers=8, inner=(1, 3, 10, 30), methods=CONSENSUS_METHODS, graphs=("ring", "random"),
                     alpha=200.0, seed=0, max_iter=300, exchange="plain", exchange_options=None):
    """docs/RESULTS.md's "Without a server": rows of :func:`compare_with_server` on
    :func:`spiked_setup`'s problem per graph, consensus method and inner iteration count, with
    the graph's name (trial 0's numbers; ``estimated_paillier_seconds`` from the exchange's cost
    model, None without one)."""
    X, groups, made = spiked_setup(n_workers, seed)
    rows = []
    for name in graphs:
        for method in methods:
            for row in compare_with_server(X, 2, made[name], inner, consensus=method, exchange=exchange,
                                           exchange_options=exchange_options, groups=groups, alpha=alpha,
                                           max_iter=max_iter, tol=1e-6, seed=seed):
                costs = row.pop("costs")
                rows.append(dict(graph=f"{name}({n_workers})", **{k: (v[0] if isinstance(v, list) else v)
                                                                   for k, v in row.items()},
                                 estimated_paillier_seconds=costs.get("estimated_seconds")))
    return rows


def audit_runs(n_workers=8, inner_iters=3, max_iter=60, alpha=200.0, seed=0, methods=CONSENSUS_METHODS):
    """docs/THREAT_MODEL.md's runs: :func:`audit_serverless` on :func:`spiked_setup`'s
    problem and graphs, per consensus method; a list of dicts (graph, method, degrees, report)."""
    X, groups, graphs = spiked_setup(n_workers, seed)
    out = []
    for name, graph in graphs.items():
        for method in methods:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ConvergenceWarning)  # a fixed number of iterations
                rep = audit_serverless(X, 2, graph, consensus=method, inner_iters=inner_iters, groups=groups,
                                       alpha=alpha, max_iter=max_iter, tol=1e-6, seed=seed)
            out.append(dict(graph=name, method=method, degree=rep["graph"]["degree"], plain=rep["plain"],
                            masked=rep["masked"]))
    return out
