"""Mean-centring without pooling: the global mean as a secure sum (docs/FSSPCA.md, "Centring").

Problem (2) wants the pooled data mean-centred. Worker ``i`` shares ``s_i = 1^T A_i`` (the
sum of its rows, ``d`` numbers) and ``n_i`` through the same aggregator as the z-step; the
server (or whoever holds the aggregate) learns ``sum_i s_i`` and ``n = sum_i n_i`` only, and
returns ``m = sum_i s_i / n``. Each worker then centres its own Gram matrix locally:
``(A_i - 1 m^T)^T (A_i - 1 m^T) = A_i^T A_i - s_i m^T - m s_i^T + n_i m m^T``, and its
squared norm ``||A_i||^2 - 2 s_i^T m + n_i ||m||^2``: no row ever leaves its worker.
"""
from __future__ import annotations

import torch

__all__ = ["aggregate", "worker_sums", "global_mean", "centred_gram"]


def aggregate(aggregation, values: torch.Tensor, event_dims: int) -> torch.Tensor:
    """The workers' uploads summed over the worker dimension by ``aggregation``.

    Parameters
    ----------
    aggregation : ``"plain"`` or an aggregator (:func:`ppdnmf_torch.exchange.aggregation.make_aggregator`)
        An aggregator's ``total(values, dim)`` is one round; the string ``"plain"`` sums in the
        clear without counting.
    values : Tensor (..., K, *shape), ``len(shape) == event_dims``
    """
    if isinstance(aggregation, str):
        return values.sum(dim=-event_dims - 1)
    return aggregation.total(values, dim=values.dim() - event_dims - 1)


def worker_sums(blocks):
    """Each worker's share for the mean: ``(s (K, d), n (K,))`` (its row sum and row count)."""
    s = torch.stack([b.sum(dim=0) for b in blocks])
    n = torch.tensor([b.shape[0] for b in blocks], dtype=s.dtype, device=s.device)
    return s, n


def global_mean(s: torch.Tensor, n: torch.Tensor, aggregation="plain") -> torch.Tensor:
    """``m = sum_i s_i / sum_i n_i`` from one aggregated upload ``[s_i, n_i] (K, d + 1)``; ``(d,)``."""
    total = aggregate(aggregation, torch.cat([s, n[:, None]], dim=1), 1)
    return total[:-1] / total[-1]


def centred_gram(gram, sqnorm, s, n, m):
    """Each worker's centred ``C_i (K, d, d)`` and ``||A_i - 1 m^T||^2 (K,)`` from its own
    ``C_i = A_i^T A_i``, ``||A_i||^2``, ``s_i``, ``n_i`` and the shared mean ``m``."""
    sm = s[:, :, None] * m[None, None, :]
    C = gram - sm - sm.transpose(-2, -1) + n[:, None, None] * torch.outer(m, m)
    q = sqnorm - 2.0 * (s @ m) + n * (m @ m)
    return C, q
