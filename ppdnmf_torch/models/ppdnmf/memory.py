"""PPDNMF's memory budget at its entry points: a run config (the CLI's, ``run_experiment``'s,
the multi-process launcher's) and a fit's inputs, sized by :func:`ppdnmf_torch.budget.ppdnmf`
and refused with one line before anything is allocated."""
from __future__ import annotations

import torch

from ... import budget
from ...data import matrix_shape
from ...errors import PPDNMFError

__all__ = ["check_run", "check_fit"]

#: resident memory of one more interpreter with torch imported (a local rank)
_RANK_BYTES = 400 * 2**20


def _workers(exchange) -> int:
    """The Paillier worker processes a run of ``exchange`` (a spec or an exchange) starts."""
    spec = getattr(exchange, "spec", exchange)
    if getattr(spec, "kind", getattr(exchange, "name", None)) != "paillier":
        return 0
    from ...exchange.paillier.pool import resolve_workers

    return resolve_workers(getattr(spec, "workers", None), int(getattr(spec, "key_bits", 2048)))


def check_run(cfg, *, trials: int = 1, device="cpu", dtype=torch.float64, nproc: int = 1) -> budget.Estimate:
    """Refuse a run of ``cfg`` (``trials`` batched trials, or ``nproc`` local ranks) that cannot
    fit in memory, before its data is loaded or made.

    The data's shape comes from its file's header (or is counted), never from loading it;
    errors of the data file are keyed ``data.*`` as the loaders' are.

    Raises
    ------
    ConfigError
        Naming the dominant size (``trials``, ``n_agents``, ``x_iters``, ``bcd_iters``,
        ``distributed.nproc``), with what it needs, what the machine has and how to split it.
    """
    d, s = cfg.data, cfg.solver
    try:
        if d.kind == "synthetic":
            L, M = d.synthetic_kwargs()["L"], d.synthetic_kwargs()["M"]
        else:
            L, M = matrix_shape(d.kind, d.path, **({"delimiter": d.delimiter or ","} if d.kind == "csv" else {}))
    except PPDNMFError as exc:
        raise exc.within("data") from None
    counts = getattr(d.split, "counts", None)
    hi = getattr(d.split, "hi", None)
    m_max = max(counts) if counts else (min(int(hi), M) if hi is not None else None)
    est = budget.ppdnmf(trials=trials, n_agents=cfg.n_agents, L=L, M=M, rank=s.rank, M_max=m_max,
                        bcd_iters=s.bcd_iters, x_iters=s.x_iters, dtype=dtype, device=device,
                        centralized=bool(cfg.centralized), data_copies=2 if d.kind != "synthetic" else 1,
                        workers=_workers(cfg.exchange))
    if nproc > 1:  # every local rank loads the whole data and runs an interpreter of its own
        extra = (nproc - 1) * (8.0 * L * M + _RANK_BYTES)
        est = budget.Estimate(est.model, est.sizes + f", {nproc} local ranks",
                              est.parts + (budget.Part("distributed.nproc", f"{nproc} local ranks", extra),),
                              est.device, est.host, {**est.pieces, "distributed.nproc": (
                                  "each rank loads the whole data: use fewer local ranks, or ranks on other "
                                  "machines (torchrun)")})
    return budget.check(est)


def check_fit(block_lists, graphs, params, *, dtype, device, exchange=None, centralized: bool = False) -> budget.Estimate:
    """Refuse a fit of ``block_lists`` (``T`` lists of ``N`` blocks ``(L, M_i)``, already in
    memory) on ``graphs`` whose solver state, per-iteration buffers and history cannot fit,
    before the padded problem is built.

    Raises
    ------
    ConfigError
        Naming ``trials``, ``n_agents``, ``x_iters`` or ``bcd_iters``.
    """
    T, N = len(block_lists), len(block_lists[0])
    L = int(block_lists[0][0].shape[0])
    widths = [int(b.shape[1]) for blocks in block_lists for b in blocks]
    edges = max(2 * int(g.n_edges) for g in graphs) if graphs else None
    est = budget.ppdnmf(trials=T, n_agents=N, L=L, M=max(1, sum(widths) // T), rank=params.rank,
                        M_max=max(widths), bcd_iters=params.bcd_iters, x_iters=params.x_iters, edges=edges,
                        dtype=dtype, device=device, centralized=centralized, data_copies=0,
                        workers=_workers(exchange) if exchange is not None else 0)
    return budget.check(est)
