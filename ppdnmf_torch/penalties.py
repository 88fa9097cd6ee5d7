"""Random, monotone, bounded penalties ``g_{i->j}`` (Sec. III-B, "privacy through randomness").

Agent ``i`` owns a private cap ``g_i > 0``. For each neighbour ``j`` and ADMM iteration
``m`` it draws ``g_{i->j}^(m)`` uniformly from ``(g_{i->j}^(m-1), g_i]``, starting from
``g_{i->j}^(0) = 0``; draws carry over between BCD iterations. With
``mode="fixed"``, ``g_{i->j} = g_i`` always.

With ``shared=True`` (``penalty_schedule="agreed"``, :mod:`ppdnmf_torch.models.ppdnmf.solver.schedule`) every
agent of a trial holds the same cap ``g`` and draws from the same stream (a seed the agents
agree on, like the graph): ``g^(m)`` uniform in ``(g^(m-1), g]``, one draw per ADMM
iteration, the same on every directed edge, so every ``rho_ij = g^(m)^2``. Each receiver's
weights are then equal, and its two sums reveal ``rho_i = d_i g^2`` and ``sum_j q_j`` only
(docs/SECURE_EXCHANGE.md, "What the sums reveal").

Reproducibility contract (the per-agent reference in ``tests/`` follows it):

* directed edges are ordered by ``(i, j)`` (CSR order), per trial;
* trial ``t`` draws from ``torch.Generator().manual_seed(derive_seed(seed_t, "penalties"))``
  on the CPU, so CPU and CUDA runs see the same numbers (``shared=True``:
  ``derive_seed(seed_t, "agreed penalties")``);
* at the start of every BCD iteration it draws ``u = torch.rand((x_iters, 2E_t), float64)``,
  and ADMM iteration ``m`` uses ``u[m]``: ``g = g_i - u[m, e] (g_i - g_prev)``, which lies in
  ``(g_prev, g_i]`` because ``u`` lies in ``[0, 1)``.
"""
from __future__ import annotations

import torch

from ._utils import derive_seed
from .errors import ConfigError

__all__ = ["PenaltySampler", "PENALTY_MODES", "PENALTY_SCHEDULES", "MAX_CAP_RATIO", "cap_bounds", "check_shared_caps",
           "sum_leak_message"]

PENALTY_MODES = ("random", "fixed")
#: how the caps ``g_i`` evolve: fixed (the paper), each agent's own consensus-seeking rule, or
#: one cap and one draw per ADMM iteration for every edge, grown by a rule all agents agree on
PENALTY_SCHEDULES = ("paper", "adaptive", "agreed")


class PenaltySampler:
    """Draws the penalties of all trials' directed edges, batched.

    Parameters
    ----------
    caps : Tensor (A,) float64
        Per-node cap ``g_i`` (``A = T * N``), on the run's device.
    src : LongTensor (2E,)
        Source node of each directed edge (all trials, CSR order).
    edges_per_trial : list of int
        Number of directed edges of each trial, in order.
    seeds : list of int
        One seed per trial.
    mode : {"random", "fixed"}
    x_iters : int
    shared : bool
        One draw per trial and ADMM iteration for every edge (``penalty_schedule="agreed"``;
        the caps of a trial must be equal, :func:`check_shared_caps`). Stopped agents'
        edges take the common draw too, so every weight a receiver sees stays equal.
    """

    def __init__(self, caps, src, edges_per_trial, seeds, mode, x_iters, shared: bool = False):
        if mode not in PENALTY_MODES:
            raise ConfigError(f"penalty: unknown mode {mode!r}; use one of {PENALTY_MODES}")
        self.mode = mode
        self.cap_e = caps[src]
        self._src = src
        self.edges_per_trial = list(edges_per_trial)
        self.x_iters = int(x_iters)
        self.shared = bool(shared)
        label = "agreed penalties" if self.shared else "penalties"
        self.generators = [torch.Generator().manual_seed(derive_seed(s, label)) for s in seeds]
        self._block = None
        self._block_host = None
        self._cap_host = self.cap_e.cpu()

    def set_caps(self, caps: torch.Tensor) -> None:
        """New per-node caps ``(A,)`` float64 (``penalty_schedule="adaptive"``), from the next
        draw on; a cap never falls below the draws already made, so the draws stay in
        ``(g_prev, g_i]``."""
        self.cap_e = caps.to(device=self.cap_e.device, dtype=torch.float64)[self._src]
        self._cap_host = self.cap_e.cpu()

    def initial(self) -> torch.Tensor:
        """``g^(0) = 0`` for every directed edge, float64 ``(2E,)``."""
        return torch.zeros_like(self.cap_e)

    def begin_bcd_iteration(self) -> None:
        """Draw this BCD iteration's uniforms: one ``(x_iters, 2E_t)`` block per trial, on the host
        (:meth:`steps` uses them there; :meth:`step` moves them to the device, once, on first use)."""
        if self.mode != "random":
            return
        if self.shared:  # one column per trial, the same on each of its edges
            blocks = [torch.rand((self.x_iters, 1), generator=gen, dtype=torch.float64).expand(-1, e)
                      for gen, e in zip(self.generators, self.edges_per_trial)]
        else:
            blocks = [
                torch.rand((self.x_iters, e), generator=gen, dtype=torch.float64)
                for gen, e in zip(self.generators, self.edges_per_trial)
            ]
        self._block_host = torch.cat(blocks, dim=1)
        self._block = None

    def step(self, g_prev: torch.Tensor, m: int, active_edges: torch.Tensor | None = None) -> torch.Tensor:
        """Penalties of ADMM iteration ``m`` (0-based) from the previous ones, ``(2E,)``.

        Edges whose source agent has stopped (``active_edges`` False) keep their value,
        except with ``shared``: there every edge takes the common draw.
        """
        if self.mode == "fixed":
            return self.cap_e
        if self._block is None:
            self._block = self._block_host.to(self.cap_e.device)
        g = self.cap_e - self._block[m] * (self.cap_e - g_prev)
        if active_edges is not None and not self.shared:
            g = torch.where(active_edges, g, g_prev)
        return g

    def steps(self, g_prev: torch.Tensor, n: int) -> torch.Tensor:
        """The penalties of ADMM iterations ``0 .. n-1`` at once, ``(n, 2E)``, when no agent stops.

        Row ``m`` equals what :meth:`step` returns at iteration ``m`` (same operations,
        same order, each correctly rounded): the recurrence runs on the host in float64,
        and the block goes to the device in one transfer.
        """
        if self.mode == "fixed":
            return self.cap_e.expand(n, -1).clone()
        cap, u = self._cap_host, self._block_host
        out = torch.empty((n, cap.shape[0]), dtype=torch.float64)
        g = g_prev.detach().cpu()
        for m in range(n):
            g = torch.sub(cap, torch.sub(cap, g).mul_(u[m]), out=out[m])
        return out.to(self.cap_e.device)

    # -- checkpoint support: the generators' states. No key material, but they fix every
    # later penalty draw: a simulation's seeded draws (docs/SECURE_EXCHANGE.md, "The penalty
    # draws are a simulation's"), which a deployment would take from each agent's own CSPRNG ---
    def state_dict(self) -> dict:
        return {"generators": [gen.get_state() for gen in self.generators]}

    def load_state_dict(self, state: dict) -> None:
        for gen, s in zip(self.generators, state["generators"]):
            gen.set_state(s)


#: ``penalty_schedule="adaptive"`` or ``"agreed"`` grows a cap to at most this many times its configured value
MAX_CAP_RATIO = 32.0


def cap_bounds(caps: torch.Tensor, schedule: str) -> torch.Tensor:
    """The largest value each cap can take during a run: the caps themselves (``paper``), or
    :data:`MAX_CAP_RATIO` times them (``adaptive``, ``agreed``, :mod:`ppdnmf_torch.models.ppdnmf.solver.schedule`).
    The integer codec's range is checked against these before a run starts."""
    if schedule not in PENALTY_SCHEDULES:
        raise ConfigError(f"penalty_schedule: unknown value {schedule!r}; use one of {PENALTY_SCHEDULES}")
    return caps if schedule == "paper" else caps * MAX_CAP_RATIO


def check_shared_caps(caps: torch.Tensor, schedule: str) -> None:
    """``penalty_schedule="agreed"`` needs one cap per trial: refuse unequal caps in a row of
    ``caps (T, N)`` (or ``(N,)``) with a :class:`ConfigError` naming ``g_max``."""
    if schedule != "agreed":
        return
    rows = torch.as_tensor(caps, dtype=torch.float64).reshape(-1, caps.shape[-1])
    odd = torch.nonzero((rows != rows[:, :1]).any(-1)).reshape(-1).tolist()
    if odd:
        where = "" if rows.shape[0] == 1 else f" (trials {odd})"
        raise ConfigError(
            f"g_max: penalty_schedule='agreed' gives every edge one common penalty, so it needs one cap for all "
            f"agents; got unequal caps{where}. Pass a single number, or choose {{penalty_schedule}}='paper' or "
            "'adaptive' (their unequal weights let a receiver solve its sums for its neighbours' values: "
            "docs/SECURE_EXCHANGE.md)")


def sum_leak_message(schedule: str, caps, degrees) -> str | None:
    """Why a secure exchange's sums can give a receiver its neighbours' values under ``schedule``,
    or None: the text of :class:`~ppdnmf_torch.errors.SumLeakWarning` (issue 32).

    The weights ``rho_ij`` of a receiver's sum differ across its neighbours under ``adaptive``
    (each agent grows its own cap) and under ``paper`` with unequal caps in a trial; only
    receivers of degree >= 2 are at stake (degree 1 has
    :class:`~ppdnmf_torch.errors.DegreeOneWarning`). ``caps (T, N)``; ``degrees``: one
    ``(N,)`` integer sequence per trial. The caller decides whether its exchange is a secure
    (integer) one.
    """
    if schedule == "agreed" or not any(bool((torch.as_tensor(d) >= 2).any()) for d in degrees):
        return None
    caps = torch.as_tensor(caps, dtype=torch.float64).reshape(len(degrees), -1)
    if schedule == "paper" and not bool((caps == caps[:, :1]).all()):
        why = "penalty_schedule='paper' with unequal caps g_max"
    elif schedule == "adaptive":
        why = "penalty_schedule='adaptive' (each agent grows its own cap)"
    else:
        return None
    return (f"{why} gives a receiver unequal weights rho_ij: from its two sums it can compute its neighbours' "
            "exact values (a degree-2 receiver by integer arithmetic); penalty_schedule='agreed' (the default) "
            "keeps every weight equal (docs/SECURE_EXCHANGE.md)")
