"""Step 1 of a run: what it works on, built from its config: the data, the column split,
the graph, the device and the dtype (:func:`build_inputs`). The runner and the batched
experiments build every trial this way, so a trial of :func:`~ppdnmf_torch.run_experiment`
with seed ``s`` is the CLI run with ``seed=s``. Errors name the config's keys."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from ... import data as data_mod
from ...graph import check_min_degree
from ..._utils import resolve_device, resolve_dtype
from .config import RunConfig
from ...errors import ConfigError, PPDNMFError
from ...graph import Graph, make_graph

__all__ = ["RunInputs", "build_inputs", "load_data", "make_split", "build_graph"]

log = logging.getLogger("ppdnmf_torch.runner")

# --------------------------------------------------------------------------------------


@dataclass
class RunInputs:
    """What a run works on: ``Z (L, M)`` float64 on the CPU, its image shape (or None), the
    columns per agent, the graph, and the resolved device and dtype."""

    Z: torch.Tensor
    image_shape: tuple | None
    counts: list
    graph: Graph
    device: torch.device
    dtype: torch.dtype
    #: what the data were divided by (``data.normalize``; 1.0 otherwise): ``Z = scale * self.Z``
    scale: float = 1.0


def normalized(Z: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``(Z / max|Z|, max|Z|)`` (``data.normalize``): the largest entry becomes 1 (an all-zero
    ``Z`` is left as it is, with scale 1)."""
    scale = float(Z.abs().max()) if Z.numel() else 0.0
    if not scale > 0 or scale == 1.0:
        return Z, 1.0
    return Z / scale, scale


def load_data(cfg: RunConfig) -> tuple[torch.Tensor, tuple[int, int] | None]:
    """``Z (L, M)`` float64 on the CPU (divided by its largest absolute entry with
    ``data.normalize``), and the image shape (or None) of ``cfg.data``."""
    d = cfg.data
    try:
        if d.kind == "synthetic":
            Z = data_mod.synthetic(**d.synthetic_kwargs(), seed=cfg.seed).Z
        else:
            kw = {"delimiter": d.delimiter if d.delimiter is not None else ","} if d.kind == "csv" else {}
            Z = data_mod.load_matrix(d.kind, d.path, **kw)
    except PPDNMFError as exc:
        raise exc.within("data") from None
    if d.normalize:
        Z = normalized(Z)[0]
    shape = tuple(d.image_shape) if d.image_shape is not None else None
    if shape is None and d.kind == "cbcl":
        shape = tuple(data_mod.CBCL_SHAPE)
    if shape is not None and shape[0] * shape[1] != Z.shape[0]:
        raise ConfigError(
            f"data.image_shape: {shape[0]}x{shape[1]} = {shape[0] * shape[1]} pixels, but the data has "
            f"L = {Z.shape[0]} rows"
        )
    return Z, shape


def make_split(cfg: RunConfig, M: int) -> list[int]:
    """Columns per agent from ``cfg.data.split`` (errors name ``data.split.<key>``)."""
    s = cfg.data.split
    N = cfg.n_agents
    if s.counts is not None:
        if len(s.counts) != N:
            raise ConfigError(f"data.split.counts: got {len(s.counts)} counts but n_agents = {N}")
        if sum(s.counts) != M:
            raise ConfigError(f"data.split.counts: sum to {sum(s.counts)} but the data has M = {M} columns")
        return list(s.counts)
    if M < N:
        raise ConfigError(f"n_agents: {N} agents, but the data has only M = {M} columns (at least one each)")
    try:
        return data_mod.split_counts(M, N, lo=s.lo, hi=s.hi, seed=cfg.seed)
    except PPDNMFError as exc:
        raise exc.within("data.split") from None


def build_graph(cfg: RunConfig) -> Graph:
    """The communication graph of ``cfg.graph`` with ``cfg.n_agents`` agents."""
    g = cfg.graph
    try:
        graph = make_graph(g.kind, cfg.n_agents, seed=cfg.seed, **g.params())
        check_min_degree(graph, g.min_degree)
    except PPDNMFError as exc:
        raise exc.within("graph") from None
    return graph


def build_inputs(cfg: RunConfig) -> RunInputs:
    """Step 1: the data, its split over the agents, the graph, the device and the dtype."""
    device, dtype = resolve_device(cfg.device), resolve_dtype(cfg.dtype)
    normalize = cfg.data.normalize
    if normalize:  # load as is, to know the scale; load_data would divide without saying by what
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, normalize=False))
    Z, image_shape = load_data(cfg)
    scale = 1.0
    if normalize:
        Z, scale = normalized(Z)
    counts = make_split(cfg, Z.shape[1])
    graph = build_graph(cfg)
    log.info("data %s: Z %d x %d%s; %d agents, %d edges (%s graph); columns per agent %s",
             cfg.data.kind, Z.shape[0], Z.shape[1], f" (divided by {scale:.6g})" if scale != 1.0 else "",
             graph.n_agents, graph.n_edges, cfg.graph.kind, counts)
    return RunInputs(Z, image_shape, counts, graph, device, dtype, scale)
