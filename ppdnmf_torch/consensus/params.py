"""Checking a run's inputs: the batch size, per-trial numbers, the walk (cycles or graphs)."""
from __future__ import annotations

import math
import numbers
from typing import Sequence

import torch

from ..errors import ConfigError, GraphError
from ..graph import Graph
from .cycles import hamiltonian_cycle, validate_cycle

__all__ = ["length_of", "per_trial", "batch_size", "resolve_cycles", "resolve_neighbors", "trial_seeds"]


def length_of(v) -> int | None:
    """The length of a per-trial value (None for a scalar)."""
    if isinstance(v, torch.Tensor):
        return None if v.ndim == 0 else int(v.shape[0])
    if isinstance(v, (str, bytes)) or isinstance(v, numbers.Number):
        return None
    try:
        return len(v)
    except TypeError:
        return None


def batch_size(named: dict) -> int:
    """The common ``B`` of the per-trial inputs; each has length 1 or ``B`` (or is a scalar)."""
    sizes = {k: n for k, n in named.items() if n is not None and n != 1}
    distinct = set(sizes.values())
    if len(distinct) > 1:
        raise ConfigError("batch: per-trial inputs disagree on the number of trials: "
                          + ", ".join(f"{k} has {n}" for k, n in sizes.items()))
    return distinct.pop() if distinct else 1


def per_trial(v, B: int, name: str, low: float | None = None, strict_low: bool = True) -> list[float]:
    """``B`` finite floats from a scalar or a length-1 / length-``B`` sequence, each ``> low``."""
    n = length_of(v)
    if isinstance(v, torch.Tensor):
        vals = v.detach().cpu().double().reshape(-1).tolist()
    elif n is None:
        vals = [v]
    else:
        vals = list(v)
    if len(vals) == 1:
        vals = vals * B
    if len(vals) != B:
        raise ConfigError(f"{name}: expected a number or {B} values (one per trial), got {len(vals)}")
    out = []
    for x in vals:
        try:
            f = float(x)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: must be a number, got {x!r}") from None
        if not math.isfinite(f) or (low is not None and (f <= low if strict_low else f < low)):
            rel = ">" if strict_low else ">="
            raise ConfigError(f"{name}: must be a finite number{'' if low is None else f' {rel} {low}'}, got {x!r}")
        out.append(f)
    return out


def trial_seeds(seeds, B: int) -> list[int]:
    """``B`` integer seeds: a scalar ``s`` gives ``s, s+1, ...``; a sequence is taken as is."""
    if length_of(seeds) is None:
        try:
            s = int(seeds)
        except (TypeError, ValueError):
            raise ConfigError(f"seeds: must be an int or a sequence of ints, got {seeds!r}") from None
        return [s + b for b in range(B)]
    vals = [int(s) for s in seeds]
    if len(vals) == 1 and B > 1:
        return [vals[0] + b for b in range(B)]
    if len(vals) != B:
        raise ConfigError(f"seeds: expected {B} seeds (one per trial), got {len(vals)}")
    return vals


def _graphs(graph, B: int):
    if graph is None:
        return None
    gs = [graph] * B if isinstance(graph, Graph) else list(graph)
    if len(gs) == 1:
        gs = gs * B
    if len(gs) != B or not all(isinstance(g, Graph) for g in gs):
        raise ConfigError(f"graph: expected a Graph or {B} Graphs (one per trial)")
    return gs


def _is_nested(cycle) -> bool:
    return length_of(cycle) is not None and len(cycle) > 0 and length_of(cycle[0]) is not None


def resolve_cycles(graph, cycle, n: int, B: int) -> list[tuple[int, ...]]:
    """The Hamiltonian cycle of every trial (validated, or found with :func:`hamiltonian_cycle`).

    Without ``graph`` and ``cycle`` the agents are taken as numbered along the cycle
    (``0, 1, ..., N-1``), unchecked.
    """
    gs = _graphs(graph, B)
    if gs is not None and any(g.n_agents != n for g in gs):
        raise GraphError(f"graph: has {[g.n_agents for g in gs if g.n_agents != n][0]} agents, the loss {n}")
    if cycle is None:
        if gs is None:
            return [tuple(range(n))] * B
        found = {}
        return [found.setdefault(id(g), hamiltonian_cycle(g)) for g in gs]
    cycles = [tuple(c) for c in cycle] if _is_nested(cycle) else [tuple(cycle)]
    if len(cycles) == 1:
        cycles = cycles * B
    if len(cycles) != B:
        raise ConfigError(f"cycle: expected one cycle or {B} (one per trial), got {len(cycles)}")
    if gs is None:
        return [_permutation(c, n) for c in cycles]
    return [validate_cycle(g, c) for g, c in zip(gs, cycles)]


def _permutation(c, n: int) -> tuple[int, ...]:
    try:
        order = tuple(int(v) for v in c)
    except (TypeError, ValueError):
        raise GraphError(f"cycle: expected a sequence of agent ids, got {c!r}") from None
    if sorted(order) != list(range(n)):
        raise GraphError(f"cycle: must be a permutation of 0..{n - 1} (each agent once), got {list(order)[:10]}")
    return order


def resolve_neighbors(graph, n: int, B: int) -> list[list[list[int]]]:
    """The neighbour lists of every trial's graph, for the random walk (W-ADMM)."""
    gs = _graphs(graph, B)
    if gs is None:
        raise ConfigError("graph: the random walk (W-ADMM) needs the graph")
    out = []
    for g in gs:
        if g.n_agents != n:
            raise GraphError(f"graph: has {g.n_agents} agents, the loss {n}")
        if n > 1 and g.n_edges == 0:
            raise GraphError("graph: has no edges for the walk")
        out.append([g.neighbors(i) if n > 1 else [0] for i in range(n)])
    return out


def check_tensor(t, shape: Sequence[int], name: str, device, dtype) -> torch.Tensor:
    """``t`` as a tensor of ``shape`` (a leading 1 broadcasts) on ``device`` / ``dtype``."""
    if not isinstance(t, torch.Tensor):
        t = torch.as_tensor(t)
    t = t.to(device=device, dtype=dtype)
    if t.ndim == len(shape) - 1:
        t = t.unsqueeze(0)
    if t.ndim != len(shape) or tuple(t.shape[1:]) != tuple(shape[1:]) or t.shape[0] not in (1, shape[0]):
        raise ConfigError(f"{name}: expected shape {tuple(shape)} (or without/with 1 as the batch "
                          f"dimension), got {tuple(t.shape)}")
    return t.expand(*shape).clone()
