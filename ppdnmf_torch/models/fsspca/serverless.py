"""FSSPCA without a server: ``z`` agreed over a graph of workers (docs/FSSPCA.md, "Serverless").

For users with no trusted server. Step 2 of Algorithm 1 needs the average
``v = mean_i (w_i + u_i / rho)``; here every worker holds its own estimate ``v_i``, obtained by
``gossip_rounds`` rounds of average consensus over the communication graph
(:mod:`ppdnmf_torch.graph`): ``x <- W x`` with the Metropolis-Hastings weights
``W_ij = 1 / (1 + max(deg_i, deg_j))`` on edges (doubly stochastic, so the average is kept
and every ``x_i`` tends to it on a connected graph). Each worker then soft-thresholds its own
``v_i`` into ``z_i`` and updates its dual against ``z_i``. With enough gossip rounds this is
the server version; with few, the workers' ``z_i`` disagree by the gossip error (measured:
:func:`compare_with_server`).

What crosses an edge is a neighbour's ``x_j`` in the clear: the variant removes the trusted
server, not the exposure of the exchanged values (privacy not measured here).
"""
from __future__ import annotations

import math
import warnings

import torch

from ...errors import ConfigError, ConvergenceWarning
from ...graph import Graph
from . import admm
from .fit import _auto_rho, _initial_z, _per_trial, as_blocks, fit_fsspca, prepare_problem
from .manifold import qf
from .smoothing import DEFAULT_SMOOTHING, get_smoothing

__all__ = ["metropolis_weights", "fit_serverless", "compare_with_server"]


def metropolis_weights(graph: Graph, dtype=torch.float64, device=None) -> torch.Tensor:
    """``W (K, K)``: Metropolis-Hastings weights of the graph (symmetric, rows sum to 1)."""
    Adj = graph.to_dense(dtype=dtype).to(device)
    deg = Adj.sum(1)
    W = Adj / (1.0 + torch.maximum(deg[:, None], deg[None, :]))
    return W + torch.diag(1.0 - W.sum(1))


def fit_serverless(data, n_components, graph: Graph, *, gossip_rounds=10, groups=None, alpha=0.0, lambda_2=None,
                   smoothing=DEFAULT_SMOOTHING, mu=1e-3, rho="auto", rho_scale=2.0, line_search="armijo",
                   inner_steps=2, max_iter=500, tol=1e-6, trials=1, seed=0, device=None, dtype=None):
    """Algorithm 1 over a graph of workers (no server); arguments as :func:`.fit.fit_fsspca`.

    Returns
    -------
    dict with ``z (T, K, d, r)`` (every worker's own), ``z_mean (T, d, r)``, ``components``
    (``qf`` of ``z_mean``), ``w``, ``n_iter (T,)``, ``disagreement`` (``(n_iter, T)``:
    ``max_i ||z_i - mean_j z_j||``) and ``consensus`` (``(n_iter, T)``: ``max_i ||w_i - z_i||``).
    """
    blocks = as_blocks(data, groups, device=device, dtype=dtype)
    K, d, like = len(blocks), blocks[0].shape[1], blocks[0]
    if graph.n_agents != K:
        raise ConfigError(f"graph: has {graph.n_agents} agents for {K} workers")
    if int(gossip_rounds) < 1:
        raise ConfigError(f"gossip_rounds: must be >= 1, got {gossip_rounds}")
    r, T = int(n_components), int(trials)
    admm.check_settings(line_search, inner_steps, mu)
    psi = get_smoothing(smoothing)
    # the mean for centring is a gossip average too; exact here (the plain sum) for brevity
    problem, _ = prepare_problem(blocks, T)
    lam1 = _per_trial(alpha, T, "alpha", like)
    lam2 = lam1 / K if lambda_2 is None else _per_trial(lambda_2, T, "lambda_2", like)
    rho_t = _auto_rho(problem, rho_scale) if isinstance(rho, str) else _per_trial(rho, T, "rho", like)
    W = metropolis_weights(graph, like.dtype, like.device)
    z0 = _initial_z(d, r, T, seed, None, like.dtype, like.device)
    scale = 2.0 * torch.linalg.matrix_norm(problem.gram) + rho_t[:, None] + lam2[:, None] / mu
    state = admm.ADMMState(w=z0[:, None].expand(T, K, d, r).clone(), u=torch.zeros((T, K, d, r), dtype=like.dtype,
                           device=like.device), z=z0[:, None].expand(T, K, d, r).clone(), theta=1.0 / scale)
    active = torch.ones(T, dtype=torch.bool, device=like.device)
    n_iter = torch.zeros(T, dtype=torch.long, device=like.device)
    dis, cons = [], []
    tau = (lam1 / (K * rho_t))[:, None, None, None]
    while state.iteration < max_iter and bool(active.any()):
        state.iteration += 1
        w = admm.local_step(problem, state, lam2, rho_t, psi, mu, line_search=line_search,
                            inner_steps=inner_steps, active=active)
        x = w + state.u / rho_t[:, None, None, None]
        for _ in range(int(gossip_rounds)):  # rounds of communication, sequential by nature
            x = torch.einsum("kj,tjab->tkab", W, x)
        z = admm.soft_threshold(x, tau)
        a4 = active[:, None, None, None]
        z_new = torch.where(a4, z, state.z)
        u_new = torch.where(a4, admm.dual_step(state.u, w, z_new, rho_t), state.u)
        change = torch.linalg.matrix_norm(z_new - state.z).amax(1)
        state.w, state.z, state.u = w, z_new, u_new
        zbar = z_new.mean(1, keepdim=True)
        dis.append(torch.linalg.matrix_norm(z_new - zbar).amax(1))
        gap = torch.linalg.matrix_norm(w - z_new).amax(1)
        cons.append(gap)
        n_iter = torch.where(active, n_iter + 1, n_iter)
        active = active & ~((gap / math.sqrt(r) <= tol) & (change / math.sqrt(r) <= tol))
    if tol > 0 and bool(active.any()):
        warnings.warn(f"FSSPCA (serverless): trials {torch.nonzero(active).flatten().tolist()} did not reach "
                      f"tol={tol} in {max_iter} iterations", ConvergenceWarning, stacklevel=2)
    zm = state.z.mean(1)
    return dict(z=state.z, z_mean=zm, components=qf(zm), w=state.w, n_iter=n_iter,
                disagreement=torch.stack(dis), consensus=torch.stack(cons))


def compare_with_server(data, n_components, graph, gossip=(1, 3, 10, 30), **kwargs):
    """The serverless variant against the server version on the same problem and start: per
    number of gossip rounds, the largest distance of a worker's ``z_i`` to the server's ``z``
    and the principal-angle sine between their orthonormal loadings; ``list of dict``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        server = fit_fsspca(data, n_components, **kwargs)
        out = []
        for g in gossip:
            res = fit_serverless(data, n_components, graph, gossip_rounds=g, **kwargs)
            dz = torch.linalg.matrix_norm(res["z"] - server.z[:, None]).amax(1)
            s = torch.linalg.svdvals(server.components.transpose(-2, -1) @ res["components"]).amin(-1)
            out.append(dict(gossip_rounds=g, max_z_distance=dz.tolist(), n_iter=res["n_iter"].tolist(),
                            server_n_iter=server.n_iter.tolist(),
                            max_sine=torch.sqrt((1 - s.square()).clamp_min(0)).tolist()))
    return out
