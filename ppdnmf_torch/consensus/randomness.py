"""Per-trial random streams (CPU ``torch.Generator`` s, as in ``ppdnmf_torch/penalties.py``).

Trial ``b`` owns four generators, seeded from its seed and a label by a hash: the start
(Algorithm 2), the step-size perturbations (Algorithm 3), the primal noise (Algorithm 4)
and the random walk (W-ADMM). Each draws a fixed block per round of ``N`` steps, in
float64 on the host, whatever the batch, the device, the dtype or the compile mode, so a
batched trial sees exactly the numbers of its single run and one stream's consumption
never shifts another's.
"""
from __future__ import annotations

import hashlib

import torch

__all__ = ["TrialStreams", "stream_seed"]


def stream_seed(seed: int, label: str) -> int:
    """A 63-bit seed for stream ``label`` of a trial with seed ``seed`` (stable: a SHA-256 hash)."""
    digest = hashlib.sha256(f"{int(seed)}:consensus:{label}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _gens(seeds, label):
    return [torch.Generator().manual_seed(stream_seed(s, label)) for s in seeds]


class TrialStreams:
    """The random draws of ``B`` trials.

    Parameters
    ----------
    seeds : list of int
        One per trial.
    """

    def __init__(self, seeds):
        self.seeds = [int(s) for s in seeds]
        self.start = _gens(self.seeds, "start")
        self.gamma = _gens(self.seeds, "gamma")
        self.noise = _gens(self.seeds, "noise")
        self.walk = _gens(self.seeds, "walk")

    def start_values(self, n: int, shape: tuple, low, high) -> torch.Tensor:
        """``x^0 ~ U(low_b, high_b)``, float64 ``(B, n, *shape)`` on the host."""
        return torch.stack([lo + (hi - lo) * torch.rand((n, *shape), generator=g, dtype=torch.float64)
                            for g, lo, hi in zip(self.start, low, high)])

    def gammas(self, n: int, low, high) -> torch.Tensor:
        """One round's step-size perturbations ``gamma ~ U(low_b, high_b)``, float64 ``(n, B)``."""
        return torch.stack([lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)
                            for g, lo, hi in zip(self.gamma, low, high)], dim=1)

    def noises(self, n: int, shape: tuple) -> torch.Tensor:
        """One round's standard normals, float64 ``(n, B, *shape)`` (scaled by sigma on the device)."""
        return torch.stack([torch.randn((n, *shape), generator=g, dtype=torch.float64)
                            for g in self.noise], dim=1)

    def first_agents(self, n_agents: int) -> list[int]:
        """The random walk's first agent of every trial, uniform on ``0 .. N-1``."""
        return [int(torch.randint(n_agents, (1,), generator=g)) for g in self.walk]

    def walk_round(self, n: int, current: list[int], neighbors) -> tuple[torch.Tensor, list[int]]:
        """``n`` steps of the simple random walk from ``current``.

        Returns the agents active at each step, LongTensor ``(n, B)`` (step 0 is ``current``),
        and the agents that receive the token after the last step.
        """
        cols, nxt = [], []
        for b, (g, a) in enumerate(zip(self.walk, current)):
            u = torch.rand(n, generator=g, dtype=torch.float64).tolist()
            nb, col = neighbors[b], []
            for k in range(n):
                col.append(a)
                choices = nb[a]
                a = choices[min(int(u[k] * len(choices)), len(choices) - 1)]
            cols.append(col)
            nxt.append(a)
        return torch.tensor(cols, dtype=torch.long).T.contiguous(), nxt

    def state_dict(self) -> dict:
        return {name: [g.get_state() for g in getattr(self, name)]
                for name in ("start", "gamma", "noise", "walk")}

    def load_state_dict(self, state: dict) -> None:
        for name, states in state.items():
            for g, s in zip(getattr(self, name), states):
                g.set_state(s)
