"""Slow, plain, per-agent reference implementation of PPDNMF (Algorithm 1).

Written straight from ``/work/shared/docs/ALGORITHM.md`` as Python loops over
agents and neighbours, one agent's small matrices at a time, in float64 on the
CPU. It exists only so that the fast batched solver can be tested against it:
clarity over speed, no batching, no sparse matrices.

Contract shared with the batched solver (so both use the same numbers)
---------------------------------------------------------------------
* Neighbour lists are sorted. Directed edges are all pairs ``(i, j)`` with ``j`` a
  neighbour of ``i``, ordered lexicographically by ``(i, j)``: ``e = 0 .. 2E-1``.
* ``gen = torch.Generator().manual_seed(derive_seed(seed, "penalties"))`` (CPU),
  created once per run.
* ``penalty == "random"``: at the start of every BCD iteration draw
  ``u = torch.rand((x_iters, 2E), generator=gen, dtype=torch.float64)`` once; ADMM
  iteration ``m`` (0-based) uses row ``u[m]``:
  ``g_{i->j}^(m) = g_i - u[m, e] * (g_i - g_{i->j}^(m-1))``, uniform on
  ``(g_prev, g_i]``; the draws carry over between BCD iterations (initially 0).
* ``penalty == "fixed"``: ``g_{i->j} = g_i`` always; no random numbers are drawn.
* ``rho_ij = g_{i->j} g_{j->i}``, ``rho_i = sum_{j in N_i} rho_ij``.
* ``exchange == "plain"``: ``S_i = sum_j rho_ij (U_j - U_i)`` in float64, and step 3
  uses the float ``rho_i``.
* ``exchange == "quantized"``: the integer codec with Python ints, per entry:
  ``q = round(U[a, b] * n_max)`` (Python ``round`` on the float64 product, i.e.
  round-half-even), ``gamma_{i->j} = round(g_{i->j} * 2**g_bits)``,
  ``S_int_i = sum_j gamma_{i->j} gamma_{j->i} (q_j - q_i)``,
  ``rho_int_i = sum_j gamma_{i->j} gamma_{j->i}``; decoded
  ``S_i = float(S_int_i) / float(n_max * 2**(2 g_bits))`` and
  ``rho_i = float(rho_int_i) / float(2**(2 g_bits))``. Step 3 of the same ADMM
  iteration uses this decoded ``rho_i`` (what the agent obtains from the secure
  exchange). Penalties (and both forms of ``rho_i``) are computed at step 1.
"""
from __future__ import annotations

import torch

from ppdnmf_torch._utils import derive_seed

__all__ = ["reference_fit", "directed_edges", "neighbour_lists"]


def neighbour_lists(n_agents, edges):
    """Sorted neighbour lists from undirected ``(i, j)`` pairs (validated)."""
    nbrs = [set() for _ in range(n_agents)]
    for edge in edges:
        i, j = (int(v) for v in edge)
        if not (0 <= i < n_agents and 0 <= j < n_agents):
            raise ValueError(f"edge {edge!r} names an agent outside 0..{n_agents - 1}")
        if i == j:
            raise ValueError(f"edge {edge!r} is a self loop")
        nbrs[i].add(j)
        nbrs[j].add(i)
    return [sorted(s) for s in nbrs]


def directed_edges(nbrs):
    """All ``(i, j)`` with ``j`` in ``N_i``, ordered lexicographically."""
    return [(i, j) for i in range(len(nbrs)) for j in nbrs[i]]


def reference_fit(Z_blocks, edges, rank, *, mu=0.1, eta=1.0, g_max=0.033,
                  bcd_iters=100, x_iters=30, y_iters=30,
                  penalty="random", consensus_form="derived",
                  exchange="plain", n_max=10**6, g_bits=16, seed=0):
    """Z_blocks: list of N float64 tensors (L, M_i). edges: list of undirected (i, j) pairs.
    g_max: float or list of N per-agent caps g_i.
    Returns dict: X (list of N (L,K) tensors), Y (list of (K,M_i)), U, history: dict with lists
    'nmse', 'consensus', 'objective' (one entry per BCD iteration), and 'penalties': list over BCD
    iterations of list over ADMM iterations of dict {(i, j): g_{i->j}} (only when penalty == 'random'
    and the run is small; always record it, tests are small).

    The penalties are recorded in both penalty modes (in "fixed" mode every value is g_i).
    The returned dict also holds the rest of the final state, for comparisons:
    P, Q, Q_prev (lists of (L,K)), V, R (lists of (K,M_i)) and g (dict {(i, j): g_{i->j}}).
    """
    # ---------------------------------------------------------------- inputs
    if penalty not in ("random", "fixed"):
        raise ValueError(f"penalty must be 'random' or 'fixed', got {penalty!r}")
    if consensus_form not in ("derived", "paper_literal"):
        raise ValueError(f"consensus_form must be 'derived' or 'paper_literal', got {consensus_form!r}")
    if exchange not in ("plain", "quantized"):
        raise ValueError(f"exchange must be 'plain' or 'quantized', got {exchange!r}")

    Z = [torch.as_tensor(z).detach().to(device="cpu", dtype=torch.float64).clone() for z in Z_blocks]
    N = len(Z)
    if N == 0:
        raise ValueError("Z_blocks is empty")
    L = Z[0].shape[0]
    for i, z in enumerate(Z):
        if z.ndim != 2 or z.shape[0] != L or z.shape[1] == 0:
            raise ValueError(f"Z_blocks[{i}] has shape {tuple(z.shape)}; expected ({L}, M_i>0)")
    K = int(rank)
    if K < 1:
        raise ValueError("rank must be >= 1")

    if isinstance(g_max, (int, float)):
        g_cap = [float(g_max)] * N
    else:
        g_cap = [float(v) for v in g_max]
    if len(g_cap) != N or any(not (v > 0) for v in g_cap):
        raise ValueError("g_max must be a positive float or a list of N positive floats")

    if float(n_max) != int(n_max) or int(n_max) < 1:
        raise ValueError("n_max must be a positive integer")
    n_max = int(n_max)
    g_scale = 2 ** int(g_bits)

    nbrs = neighbour_lists(N, edges)
    dir_edges = directed_edges(nbrs)          # e = 0 .. 2E-1
    n_dir = len(dir_edges)

    # -------------------------------------------------------- initial values
    X = [torch.ones(L, K, dtype=torch.float64) for _ in range(N)]
    U = [torch.ones(L, K, dtype=torch.float64) for _ in range(N)]
    P = [torch.zeros(L, K, dtype=torch.float64) for _ in range(N)]
    Q = [torch.zeros(L, K, dtype=torch.float64) for _ in range(N)]
    Q_prev = [torch.zeros(L, K, dtype=torch.float64) for _ in range(N)]
    Y = [torch.zeros(K, z.shape[1], dtype=torch.float64) for z in Z]
    V = [torch.zeros(K, z.shape[1], dtype=torch.float64) for z in Z]
    R = [torch.zeros(K, z.shape[1], dtype=torch.float64) for z in Z]
    g = {(i, j): 0.0 for (i, j) in dir_edges}   # g_{i->j}

    gen = torch.Generator().manual_seed(derive_seed(seed, "penalties"))
    eye_K = torch.eye(K, dtype=torch.float64)

    history = {"nmse": [], "consensus": [], "objective": [], "penalties": []}

    for _n in range(bcd_iters):
        if penalty == "random":
            u = torch.rand((x_iters, n_dir), generator=gen, dtype=torch.float64)
        bcd_penalties = []

        # ============================ X-step: ADMM with consensus (eqs. 8-11)
        for m in range(x_iters):
            # ---- step 1: penalties, rho_ij, rho_i (float and decoded-integer forms)
            for e, (i, j) in enumerate(dir_edges):
                if penalty == "random":
                    g[(i, j)] = g_cap[i] - float(u[m, e]) * (g_cap[i] - g[(i, j)])
                else:
                    g[(i, j)] = g_cap[i]
            bcd_penalties.append(dict(g))

            rho_float = [0.0] * N
            gamma = {}
            rho_int = [0] * N
            for i in range(N):
                for j in nbrs[i]:
                    rho_float[i] += g[(i, j)] * g[(j, i)]
            if exchange == "quantized":
                for (i, j) in dir_edges:
                    gamma[(i, j)] = round(g[(i, j)] * g_scale)
                for i in range(N):
                    for j in nbrs[i]:
                        rho_int[i] += gamma[(i, j)] * gamma[(j, i)]
                rho_step3 = [float(rho_int[i]) / float(g_scale * g_scale) for i in range(N)]
            else:
                rho_step3 = rho_float

            # ---- steps 2-4, each agent on its own (uses its own old U_i in step 3)
            for i in range(N):
                rho_i = rho_step3[i]
                # step 2
                X[i] = torch.clamp(U[i] + P[i], min=0.0)
                # step 3
                if consensus_form == "derived":
                    consensus_term = rho_i * U[i] + 2.0 * Q[i] - Q_prev[i]
                else:  # "paper_literal"
                    consensus_term = rho_i * (U[i] + 2.0 * Q[i] - Q_prev[i])
                rhs = Z[i] @ Y[i].T + mu * (X[i] - P[i]) + consensus_term       # (L, K)
                A = Y[i] @ Y[i].T + (mu + rho_i) * eye_K                       # (K, K)
                U[i] = torch.linalg.solve(A, rhs, left=False)                  # rhs @ A^-1
                # step 4 (new U_i)
                P[i] = P[i] - (X[i] - U[i])

            # ---- step 5: exchange, using the new U_j of all agents
            S = []
            for i in range(N):
                if exchange == "plain":
                    S_i = torch.zeros(L, K, dtype=torch.float64)
                    for j in nbrs[i]:
                        rho_ij = g[(i, j)] * g[(j, i)]
                        S_i = S_i + rho_ij * (U[j] - U[i])
                else:
                    S_i = torch.zeros(L, K, dtype=torch.float64)
                    denom = float(n_max * g_scale * g_scale)
                    for a in range(L):
                        for b in range(K):
                            q_i = round(float(U[i][a, b]) * n_max)
                            s_int = 0
                            for j in nbrs[i]:
                                q_j = round(float(U[j][a, b]) * n_max)
                                s_int += gamma[(i, j)] * gamma[(j, i)] * (q_j - q_i)
                            S_i[a, b] = float(s_int) / denom
                S.append(S_i)

            # ---- step 6
            for i in range(N):
                Q_prev[i], Q[i] = Q[i], Q[i] + S[i]

        history["penalties"].append(bcd_penalties)

        # ============================ Y-step: local ADMM (eqs. 12-14)
        for i in range(N):
            G = X[i].T @ X[i] + eta * eye_K                                   # (K, K)
            XtZ = X[i].T @ Z[i]                                               # (K, M_i)
            for _k in range(y_iters):
                Y[i] = torch.clamp(V[i] + R[i], min=0.0)                      # step 1
                V[i] = torch.linalg.solve(G, XtZ + eta * (Y[i] - R[i]))       # step 2
                R[i] = R[i] - (Y[i] - V[i])                                   # step 3

        # ============================ metrics
        nmse = 0.0
        objective = 0.0
        for i in range(N):
            resid = torch.linalg.norm(Z[i] - X[i] @ Y[i])
            nmse += float(resid / torch.linalg.norm(Z[i]))
            objective += 0.5 * float(resid) ** 2
        nmse /= N
        X_bar = sum(X) / N
        X_bar_norm = torch.linalg.norm(X_bar)
        consensus = max(float(torch.linalg.norm(X[i] - X_bar) / X_bar_norm) for i in range(N))
        history["nmse"].append(nmse)
        history["consensus"].append(consensus)
        history["objective"].append(objective)

    return {
        "X": X, "Y": Y, "U": U,
        "P": P, "Q": Q, "Q_prev": Q_prev, "V": V, "R": R,
        "g": dict(g),
        "history": history,
    }
