"""What both integer exchange kinds share: the encoded inputs of step 5, step 1's integer
penalties, and the exact integer sums.

``exchange="quantized"`` (:mod:`.quantized`) computes the sums below on the device;
``exchange="paillier"`` (:mod:`.paillier`) encodes its inputs here, encrypts them and sends
them through the protocol. Both decode through the same
:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.decode`, so they return the same bits.
"""
from __future__ import annotations

import torch

from .._utils import sparse_matmul
from .codec import IntegerCodec, abs_max

__all__ = ["encode_inputs", "encode_penalties", "Step1Penalties", "integer_penalty_sums",
           "integer_neighbour_sums"]

#: integers up to 2^53 are exact in float64
_FLOAT_EXACT = float(2**53)


def integer_neighbour_sums(q: torch.Tensor, w: torch.Tensor, topology, buffers=None):
    """``S_int_i = sum_j w_ij (q_j - q_i)`` and ``rho_int_i = sum_j w_ij`` in exact int64.

    ``buffers``, optional: ``(float64, float64, int64)`` tensors of ``q``'s shape that the
    float path below computes in and writes ``S_int`` to, instead of fresh ones (the same
    values either way).

    Parameters
    ----------
    q : int64 Tensor (A, L*K)
    w : int64 Tensor (2E,)
        ``gamma_ij gamma_ji`` per directed edge ``i -> j``.
    topology : Topology
        The ``A`` nodes and their directed edges (CSR order).

    Integer addition is associative, so the result does not depend on the order in
    which ``index_add_`` accumulates (unlike floats): it is deterministic on every device.
    """
    src, dst, n_nodes = topology.src, topology.dst, topology.n_nodes
    rho_int = integer_penalty_sums(w, src, n_nodes)
    if src.numel() and q.numel():
        # Exact in float64 while every partial sum is an integer below 2^53, which the
        # bound sum_j w_ij (|q_j| + |q_i|) <= 2 max|q| max(w) max(deg) guarantees: then a
        # sparse float matmul (no (2E, L*K) gather) gives the same integers in any order.
        bound = 2.0 * abs_max(q) * float(w.abs().max()) * int(topology.degree.max())
        if bound < _FLOAT_EXACT:
            qf_buf, S_buf, out = (None, None, None) if buffers is None else buffers
            qf = q.to(torch.float64) if qf_buf is None else qf_buf.copy_(q)
            W = topology.neighbour_matrix(w.to(torch.float64))
            S = sparse_matmul(W, qf, S_buf).addcmul_(rho_int.to(torch.float64)[:, None], qf, value=-1.0)
            return (S.to(torch.int64) if out is None else out.copy_(S)), rho_int
    S_int = torch.zeros((n_nodes,) + tuple(q.shape[1:]), dtype=torch.int64, device=q.device)
    if src.numel():
        S_int.index_add_(0, src, w[:, None] * (q[dst] - q[src]))
    return S_int, rho_int


def integer_penalty_sums(w: torch.Tensor, src, n_nodes: int) -> torch.Tensor:
    """``rho_int_i = sum_j w_ij`` (int64, shape ``(A,)``)."""
    rho_int = torch.zeros(n_nodes, dtype=torch.int64, device=w.device)
    rho_int.index_add_(0, src, w)
    return rho_int


def encode_penalties(codec: IntegerCodec, topology, g, *, bcd_iter=0, admm_iter=0):
    """``(gamma, w)``: the integer penalties and ``w = gamma_ij gamma_ji`` (int64, ``(2E,)``),
    range-checked (:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.check_penalty_sums`)."""
    gamma = codec.encode_penalties(g)
    w = codec.pair_weights(gamma, topology.rev)
    codec.check_penalty_sums(gamma, w, topology.src, n_nodes=topology.n_nodes, n_agents=topology.n_agents,
                             bcd_iter=bcd_iter, admm_iter=admm_iter)
    return gamma, w


class Step1Penalties:
    """Step 1's integer penalties ``(gamma, w)``, handed to step 5 of the same ADMM iteration.

    The solver gives step 5 the very tensor ``g`` it gave step 1, so step 5 need not encode
    and range-check the penalties again: :meth:`encode` encodes (:func:`encode_penalties`)
    and keeps them, :meth:`take` hands them over once, for that same tensor only (None for
    another ``g`` or a direct call of step 5, which then encodes its own).
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._g = self._penalties = None

    def encode(self, codec: IntegerCodec, topology, g, *, bcd_iter=0, admm_iter=0):
        gamma, w = encode_penalties(codec, topology, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
        self._g, self._penalties = g, (gamma, w)
        return gamma, w

    def take(self, g):
        penalties = self._penalties if self._g is g else None
        self.clear()
        return penalties


def encode_inputs(codec: IntegerCodec, topology, U, g, *, bcd_iter=0, admm_iter=0, penalties=None, buffers=None):
    """Quantize and range-check step 5's inputs, as every integer exchange kind does.

    Returns ``(q (A, L*K), gamma (2E,), w (2E,))`` as int64 on ``U``'s device, with
    ``w = gamma_ij gamma_ji``. Raises :class:`~ppdnmf_torch.exchange.codec.CodecRangeError`
    (naming agent, iteration, value and limit) before anything is sent or encrypted.
    ``penalties``: ``(gamma, w)`` of ``g`` from :func:`encode_penalties` (step 1's), reused.
    ``buffers``: ``(float64, int64)`` tensors of ``U``'s shape for the scaled values and
    ``q`` (:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.encode_values`), optional.
    """
    scratch, out = (None, None) if buffers is None else buffers
    q = codec.encode_values(U, n_agents=topology.n_agents, bcd_iter=bcd_iter, admm_iter=admm_iter,
                            scratch=scratch, out=out)
    if penalties is None:
        penalties = encode_penalties(codec, topology, g, bcd_iter=bcd_iter, admm_iter=admm_iter)
    gamma, w = penalties
    codec.check_sums(
        q, w, topology.src, topology.dst, n_nodes=topology.n_nodes, n_agents=topology.n_agents,
        bcd_iter=bcd_iter, admm_iter=admm_iter,
    )
    return q, gamma, w
