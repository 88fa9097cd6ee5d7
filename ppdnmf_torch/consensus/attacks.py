"""The eavesdropper of Sec. IV-V: it hears every token, knows ``rho``, ``N`` and the cycle.

* :func:`eavesdrop_recursion`: against the zero-started I-ADMM the recursion (11),
  ``x_new = (N (z^{k+1} - z^k) + x_old + z^k) / 2``, then (4b), ``y_new = y_old + rho (z^k - x_new)``,
  recovers every state exactly (and, with the exact step, ``grad f_i(x_new) = y_new``).
  It follows from (4b) and (5): ``N (z^{k+1} - z^k) = 2 x_new - z^k - x_old``.
* :func:`eavesdrop_offsets`: whatever the step sizes and noises, each token increment is
  ``(u_new - u_old) / N`` with ``u_i = x_i - y_i / rho`` (eq. 5), so the eavesdropper holds
  ``u_i^k - u_i^0`` exactly for every agent and step; with Algorithm 2's start as the spec
  resolves it (``y_i^0 = rho x_i^0``, i.e. ``u_i^0 = 0`` for every agent) that is ``u_i^k``
  itself, and at consensus (``x_i -> z``) the multiplier ``y_i = rho (x_i - u_i)`` follows.
* :func:`lsqr_attack`: against the randomised variants, the least-squares estimate on the
  sparse linear system of all agents' states (the reconstruction of the paper's (16)/(18)),
  with ``gamma = 1`` assumed, see :func:`lsqr_attack`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError

__all__ = ["eavesdrop_recursion", "eavesdrop_offsets", "lsqr_attack", "LsqrAttack"]


def _transcript(tokens, agents, n_agents):
    z = torch.as_tensor(tokens).detach().cpu().double()
    a = torch.as_tensor(agents).detach().cpu().long().reshape(-1)
    if z.shape[0] != a.shape[0] + 1:
        raise ConfigError(f"tokens: expected K + 1 = {a.shape[0] + 1} tokens for K = {a.shape[0]} steps, "
                          f"got {z.shape[0]}")
    if a.numel() and (int(a.min()) < 0 or int(a.max()) >= n_agents):
        raise ConfigError(f"agents: ids must lie in 0..{n_agents - 1}")
    return z, a.tolist()


def eavesdrop_recursion(tokens, agents, n_agents: int, rho: float, x0=None, y0=None, projection=None):
    """The states of every agent from the tokens, by recursion (11) and (4b).

    With a projection ``P`` (agents use ``P(z^k)``, the token keeps the plain average) the
    same two equations read ``x_new = (N (z^{k+1} - z^k) + x_old + P(z^k)) / 2`` and
    ``y_new = y_old + rho (P(z^k) - x_new)``.

    Parameters
    ----------
    tokens : Tensor (K + 1, *shape)
        ``z^0 .. z^K`` of one trial (a :class:`Transcript` column).
    agents : LongTensor (K,)
        The active agent of each step.
    n_agents : int
    rho : float
    x0, y0 : Tensor (N, *shape), optional
        The assumed start (default zero: I-ADMM's).
    projection : callable, optional
        The public ``P`` the agents apply to the token (e.g. ``max(z, 0)``).

    Returns
    -------
    x, y : Tensor (K + 1, N, *shape) float64
        The estimates after ``0 .. K`` steps.
    """
    z, a = _transcript(tokens, agents, n_agents)
    shape = tuple(z.shape[1:])
    x = torch.zeros((n_agents, *shape), dtype=torch.float64) if x0 is None else torch.as_tensor(x0).double().clone()
    y = torch.zeros_like(x) if y0 is None else torch.as_tensor(y0).double().clone()
    zt = z if projection is None else projection(z)
    xs, ys = [x.clone()], [y.clone()]
    for k, i in enumerate(a):
        x[i] = (n_agents * (z[k + 1] - z[k]) + x[i] + zt[k]) / 2
        y[i] = y[i] + rho * (zt[k] - x[i])
        xs.append(x.clone())
        ys.append(y.clone())
    return torch.stack(xs), torch.stack(ys)


def eavesdrop_offsets(tokens, agents, n_agents: int, u0=None):
    """``u_i^k = x_i^k - y_i^k / rho`` of every agent from the tokens alone (eq. 5).

    Parameters
    ----------
    tokens : Tensor (K + 1, *shape)
    agents : LongTensor (K,)
    n_agents : int
    u0 : Tensor (N, *shape), optional
        The assumed ``u_i^0`` (default zero: Algorithm 2 as resolved, and the zero start).

    Returns
    -------
    Tensor (K + 1, N, *shape) float64
        Exact (to rounding) for every method of this package, perturbed or not.
    """
    z, a = _transcript(tokens, agents, n_agents)
    u = torch.zeros((n_agents, *z.shape[1:]), dtype=torch.float64) if u0 is None else torch.as_tensor(u0).double().clone()
    us = [u.clone()]
    for k, i in enumerate(a):
        u[i] = u[i] + n_agents * (z[k + 1] - z[k])
        us.append(u.clone())
    return torch.stack(us)


@dataclass
class LsqrAttack:
    """The least-squares estimate of one agent's trajectory (one coordinate).

    Attributes
    ----------
    x, y : ndarray (K + 1,)
        Estimated ``x_target^k(coord)``, ``y_target^k(coord)`` after ``0 .. K`` steps.
    n_rows, n_cols : int
        Size of the sparse system ``A v = b`` (after the substitution).
    istop, itn : int
        scipy's lsqr stop reason and iterations.
    residual : float
        ``||A v* - b||``.
    """

    x: np.ndarray
    y: np.ndarray
    n_rows: int
    n_cols: int
    istop: int
    itn: int
    residual: float


def _system(z, a, n, rho, gamma, start_rows, kkt, zt=None, u0=None):
    """Rows ``(cols, vals, rhs)`` of the eavesdropper's model and the variable layout."""
    counts = [0] * n
    for i in a:
        counts[i] += 1
    xoff = np.cumsum([0] + [c + 1 for c in counts])
    yoff = xoff[-1] + xoff[:-1]
    zt = z if zt is None else zt
    u0 = np.zeros(n) if u0 is None else u0
    rows, act, where = [], [0] * n, []
    for k, i in enumerate(a):
        s = act[i]
        xo, xn, yo, yn = xoff[i] + s, xoff[i] + s + 1, yoff[i] + s, yoff[i] + s + 1
        c = rho * gamma
        rows.append(([xn, yn, xo, yo], [1.0, -1.0 / rho, -1.0, 1.0 / rho], n * (z[k + 1] - z[k])))  # (5)
        rows.append(([yn, yo, xn], [1.0, -1.0, c], c * zt[k]))                                     # (13)
        where.append(xn)
        act[i] = s + 1
    if start_rows:  # Algorithm 2: y_i^0 = rho (x_i^0 - u_i^0), u_i^0 public (0 in the paper)
        rows += [([xoff[i], yoff[i]], [1.0, -1.0 / rho], float(u0[i])) for i in range(n)]
    if kkt:  # the KKT condition sum_i y_i = 0 at the last states
        rows.append(([yoff[i] + counts[i] for i in range(n)], [1.0] * n, 0.0))
    return rows, where, xoff, yoff, 2 * int(xoff[-1])


def lsqr_attack(tokens, agents, n_agents: int, rho: float, target: int = 0, coord: int = 0,
                gamma: float = 1.0, start_rows: bool = True, kkt: bool = True, substitute_last: bool = True,
                atol: float = 1e-12, btol: float = 1e-12, iter_lim: int | None = None, projection=None,
                u0=None) -> LsqrAttack:
    """Least-squares estimate of agent ``target``'s trajectory from the tokens (Sec. V).

    The unknowns are every agent's ``x`` and ``y`` at its start and after each of its
    activations (one coordinate). Each step gives two rows: the token update (5) and the
    dual update (13) with the assumed ``gamma`` (Sec. V: 1); Algorithm 2's start gives
    ``x_i^0 - y_i^0 / rho = 0`` per agent; the KKT condition gives ``sum_i y_i = 0`` at the
    end; and the new ``x`` of each of the last ``N`` steps is replaced by the token that
    follows it (``x^{k+1} := z^{k+1}``, consensus being nearly reached). With ``K`` steps the
    system has ``2K + N + 1`` rows and ``2K + N`` unknowns; it is solved by
    ``scipy.sparse.linalg.lsqr``.

    Parameters
    ----------
    tokens : Tensor (K + 1, *shape)
    agents : LongTensor (K,)
    n_agents : int
    rho : float
    target : int
        The agent whose trajectory is returned.
    coord : int
        Index into the flattened variable.
    gamma : float
        The attacker's guess of the step-size perturbation.
    start_rows, kkt, substitute_last : bool
        Which extra knowledge goes in (all of it by default, as in the paper).
    atol, btol, iter_lim
        scipy's lsqr tolerances (tight by default: the estimate, not the solver, is studied);
        ``iter_lim`` defaults to ``10 * n_cols``.
    projection : callable, optional
        The public ``P`` the agents apply to the token: rows (13) and the substitution use
        ``P(z)`` (PPDNMF's X-step: ``max(z, 0)``).
    u0 : Tensor (N, *shape), optional
        The public ``u_i^0 = x_i^0 - y_i^0 / rho`` of the start rows (default 0, Algorithm 2
        as resolved; PPDNMF's X-step starts around ``X^0``: ``u_i^0 = X^0``).

    Returns
    -------
    LsqrAttack
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.linalg import lsqr

    z3, a = _transcript(tokens, agents, n_agents)
    z = z3.reshape(z3.shape[0], -1)[:, coord].numpy()
    zt = z if projection is None else projection(z3).reshape(z3.shape[0], -1)[:, coord].numpy()
    u = None if u0 is None else torch.as_tensor(u0).double().reshape(n_agents, -1)[:, coord].numpy()
    if not 0 <= target < n_agents:
        raise ConfigError(f"target: must lie in 0..{n_agents - 1}, got {target}")
    rows, where, xoff, yoff, m = _system(z, a, n_agents, float(rho), float(gamma), start_rows, kkt, zt, u)
    r_idx = np.concatenate([np.full(len(c), r) for r, (c, _, _) in enumerate(rows)])
    A = csr_matrix((np.concatenate([v for _, v, _ in rows]), (r_idx, np.concatenate([c for c, _, _ in rows]))),
                   shape=(len(rows), m))
    b = np.array([r for _, _, r in rows])
    known = np.zeros(m, dtype=bool)
    values = np.zeros(m)
    if substitute_last:
        K = len(a)
        for k in range(max(0, K - n_agents), K):
            known[where[k]] = True
            values[where[k]] = zt[k + 1]
    b = b - A[:, known] @ values[known]
    free = np.flatnonzero(~known)
    A_free = A[:, free]
    sol = lsqr(A_free, b, atol=atol, btol=btol, iter_lim=10 * len(free) if iter_lim is None else iter_lim)
    v = values.copy()
    v[free] = sol[0]
    xs, ys, s = [v[xoff[target]]], [v[yoff[target]]], 0
    for i in a:
        if i == target:
            s += 1
        xs.append(v[xoff[target] + s])
        ys.append(v[yoff[target] + s])
    return LsqrAttack(np.array(xs), np.array(ys), A_free.shape[0], A_free.shape[1], int(sol[1]), int(sol[2]),
                      float(sol[3]))
