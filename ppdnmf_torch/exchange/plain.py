"""``exchange="plain"``: float arithmetic, no quantization, no encryption."""
from __future__ import annotations

import torch

from .base import Exchange, ExchangeOutput

__all__ = ["PlainExchange"]


class PlainExchange(Exchange):
    """Neighbour sums in floating point through the sparse, ``rho``-weighted adjacency.

    ``S = W U - diag(rho) U`` with ``W[i, j] = rho_ij`` (eq. 11 with ``S_ij`` eliminated).
    """

    name = "plain"

    _cache = (None, None, None)

    def _weights(self, g):
        """``(rho_ij per edge, rho_i per node)``; step 5 reuses step 1's for the same draws."""
        if self._cache[0] is g:
            return self._cache[1], self._cache[2]
        w = self._pair_weights(g)
        rho = torch.zeros(self.topology.n_nodes, dtype=torch.float64, device=g.device)
        rho.index_add_(0, self.topology.src, w)
        self._cache = (g, w, rho)
        return w, rho

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        return self._weights(g)[1]

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0):
        w, rho = self._weights(g)
        if self.topology.n_directed_edges == 0:
            return ExchangeOutput(torch.zeros_like(U), rho)
        W = self.topology.neighbour_matrix(w.to(U.dtype))
        S = (W @ U).addcmul_(rho.to(U.dtype)[:, None], U, value=-1.0)
        return ExchangeOutput(S, rho)
