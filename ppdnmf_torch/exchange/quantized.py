"""``exchange="quantized"``: the integer protocol emulated exactly on the device (int64)."""
from __future__ import annotations

import torch

from .base import Exchange, ExchangeOutput
from .codec import IntegerCodec

__all__ = ["QuantizedExchange", "integer_neighbour_sums"]


def integer_neighbour_sums(q: torch.Tensor, w: torch.Tensor, src, dst, n_nodes: int):
    """``S_int_i = sum_j w_ij (q_j - q_i)`` and ``rho_int_i = sum_j w_ij`` in exact int64.

    Parameters
    ----------
    q : int64 Tensor (A, L*K)
    w : int64 Tensor (2E,)
        ``gamma_ij gamma_ji`` per directed edge ``i -> j``.
    src, dst : LongTensor (2E,)

    Integer addition is associative, so the result does not depend on the order in
    which ``index_add_`` accumulates (unlike floats): it is deterministic on every device.
    """
    S_int = torch.zeros((n_nodes,) + tuple(q.shape[1:]), dtype=torch.int64, device=q.device)
    rho_int = torch.zeros(n_nodes, dtype=torch.int64, device=q.device)
    rho_int.index_add_(0, src, w)
    if src.numel():
        S_int.index_add_(0, src, w[:, None] * (q[dst] - q[src]))
    return S_int, rho_int


class QuantizedExchange(Exchange):
    """Emulates the Paillier exchange's integer arithmetic without encryption.

    Parameters
    ----------
    codec : IntegerCodec
        Shared with :class:`~ppdnmf_torch.exchange.paillier.PaillierExchange`; its limit is
        the one of the key size it stands in for.
    """

    name = "quantized"

    def __init__(self, codec: IntegerCodec):
        super().__init__()
        self.codec = codec

    def penalty_sums(self, g, *, bcd_iter=0, admm_iter=0):
        topo = self.topology
        w = self.codec.pair_weights(self.codec.encode_penalties(g), topo.rev)
        rho_int = torch.zeros(topo.n_nodes, dtype=torch.int64, device=g.device)
        rho_int.index_add_(0, topo.src, w)
        return self.codec.decode_rho(rho_int)

    def encode(self, U, g, *, bcd_iter=0, admm_iter=0):
        """Quantize and range-check: returns ``(q (A, L*K), w (2E,))`` as int64."""
        topo = self.topology
        q = self.codec.encode_values(U, n_agents=topo.n_agents, bcd_iter=bcd_iter, admm_iter=admm_iter)
        w = self.codec.pair_weights(self.codec.encode_penalties(g), topo.rev)
        self.codec.check_sums(
            q, w, topo.src, topo.dst, n_nodes=topo.n_nodes, n_agents=topo.n_agents,
            bcd_iter=bcd_iter, admm_iter=admm_iter,
        )
        return q, w

    def exchange(self, U, g, *, bcd_iter=0, admm_iter=0):
        topo = self.topology
        q, w = self.encode(U, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        S_int, rho_int = integer_neighbour_sums(q, w, topo.src, topo.dst, topo.n_nodes)
        S, rho = self.codec.decode(S_int, rho_int, dtype=U.dtype)
        return ExchangeOutput(S, rho)
