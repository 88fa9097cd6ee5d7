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

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        topo = self.topology
        rho = torch.zeros(topo.n_nodes, dtype=torch.float64, device=g.device)
        rho.index_add_(0, topo.src, self._pair_weights(g))
        return rho

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0):
        w = self._pair_weights(g)
        rho = torch.zeros(self.topology.n_nodes, dtype=torch.float64, device=g.device)
        rho.index_add_(0, self.topology.src, w)
        if self.topology.n_directed_edges == 0:
            return ExchangeOutput(torch.zeros_like(U), rho)
        W = self.topology.neighbour_matrix(w.to(U.dtype))
        S = (W @ U).addcmul_(rho.to(U.dtype)[:, None], U, value=-1.0)
        return ExchangeOutput(S, rho)
