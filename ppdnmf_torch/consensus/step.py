"""One step of the incremental methods, and one round of ``N`` steps (what gets compiled).

The active agent ``i`` holds the token ``z^k`` (agents use ``P(z^k)`` when a projection
``P`` is given; the token itself carries the unconstrained average). With ``c = rho gamma``
(``c = rho`` unless Algorithm 3 draws ``gamma``):

* primal, exact (4a / 12): ``x_i <- argmin f_i(x) + <y_i, z - x> + (c/2)||z - x||^2``;
  linearised (8): ``x_i <- z + (y_i - grad f_i(x_i)) / c``;
* Algorithm 4 adds ``omega ~ N(0, sigma^2 I)`` to the new ``x_i``;
* dual (4b / 13): ``y_i <- y_i + c (z - x_i_new)``;
* token (4c / 5), with the fixed ``rho``:
  ``z^{k+1} = z^k + [(x_i_new - y_i_new / rho) - (x_i_old - y_i_old / rho)] / N``,
  which keeps ``z = mean_i(x_i - y_i / rho)``.
"""
from __future__ import annotations

import torch

__all__ = ["token_step", "run_round"]


def token_step(x, y, z, agent, rho, c, noise, loss, linearized: bool, projection, rows=None):
    """One step, in place on ``x``, ``y`` and ``z``.

    Parameters
    ----------
    x, y : Tensor (B, N, *shape)
    z : Tensor (B, *shape)
    agent : int or LongTensor (B,)
        The active agent (the same in every trial, or one per trial).
    rho, c : Tensor (B, 1, ...)
        The fixed ``rho`` and this step's ``rho gamma``, shaped to broadcast against ``(B, *shape)``.
    noise : Tensor (B, *shape) or None
        Algorithm 4's ``omega``.
    loss : LocalLoss
    linearized : bool
        Step (8) instead of the exact step.
    projection : callable or None
    rows : LongTensor (B,), optional
        ``arange(B)``, for a per-trial ``agent``.
    """
    if isinstance(agent, int):
        xi, yi = x[:, agent], y[:, agent]
    else:
        xi, yi = x[rows, agent], y[rows, agent]
    zt = z if projection is None else projection(z)
    if linearized:
        xn = zt + (yi - loss.grad(agent, xi)) / c
    else:
        xn = loss.exact_step(agent, zt, yi, c)
    if noise is not None:
        xn = xn + noise
    yn = yi + c * (zt - xn)
    z.add_(((xn - yn / rho) - (xi - yi / rho)) / x.shape[1])
    if isinstance(agent, int):
        x[:, agent] = xn
        y[:, agent] = yn
    else:
        x[rows, agent] = xn
        y[rows, agent] = yn


def run_round(x, y, z, agents, rho, cs, noises, loss, linearized: bool, projection, rows=None,
              record: bool = False, watch=None, step=token_step):
    """``len(agents)`` steps of :func:`token_step`, in place.

    Parameters
    ----------
    agents : list of int, or LongTensor (n, B)
        The active agent of each step.
    cs : Tensor (n, B, 1, ...) or None
        ``rho gamma`` per step; None for ``c = rho``.
    noises : Tensor (n, B, *shape) or None
    record : bool
        Return the token after every step.
    watch : LongTensor (W,), optional
        Agents whose states are returned after every step.
    step : callable
        :func:`token_step` or a compiled version of it.

    Returns
    -------
    tokens : Tensor (n, B, *shape) or None
        ``z`` after each step, when ``record``.
    xs, ys : Tensor (n, B, W, *shape) or None
        The watched agents' ``x``, ``y`` after each step.
    """
    tokens, xs, ys = [], [], []
    for k in range(len(agents)):
        c = rho if cs is None else cs[k]
        step(x, y, z, agents[k], rho, c, None if noises is None else noises[k], loss,
                   linearized, projection, rows)
        if record:
            tokens.append(z.clone())
        if watch is not None:
            xs.append(x[:, watch].clone())
            ys.append(y[:, watch].clone())
    stack = lambda ts: torch.stack(ts) if ts else None
    return stack(tokens), stack(xs), stack(ys)
