"""Slot packing: several quantized integers in one Paillier plaintext.

Layout
------
A plaintext (an integer mod ``n``) holds ``S`` *slots* of ``w`` bits each; slot ``k``
of a packed vector ``v`` is the base-``2^w`` digit ``k``::

    M(v) = sum_{k < S} v_k 2^(w k)          (an integer, reduced mod n to encrypt)

Every operation of the protocol is linear over the integers and Paillier computes it
mod ``n``: ``E(M(a)) E(M(b)) = E(M(a + b) mod n)`` and ``E(M(a))^gamma = E(M(gamma a) mod n)``.
So whatever the homomorphic operations do, the decrypted residue is ``M(r) mod n`` where
``r`` is the exact integer result slot by slot: ``gamma_ji (q_j - q_i)`` per reply
(``protocol="paper"``) or ``sum_j gamma_ij gamma_ji (q_j - q_i)`` per agent
(``protocol="aggregated"``). Intermediate values never need to fit anywhere; only the
slots of the plaintext that is *decrypted* must.

Offsets. The slots of ``r`` are signed. Decoding adds the public offset word
``OFF = sum_k L 2^(w k)`` (``L = 2^(w-1)``, the slot limit) to the decrypted residue:
if every ``|r_k| < L``, then ``M(r) + OFF = sum_k (r_k + L) 2^(w k)`` has every digit
``r_k + L`` in ``[1, 2^w)``, no digit carries into its neighbour, and the whole sum is
below ``2^(w S) <= 2^(key_bits - margin) < n``, so ``(residue + OFF) mod n`` equals it
exactly. Each slot is then read with a shift and a mask, and ``L`` subtracted: exact,
with Python integers (a digit of 0, i.e. the value ``-L``, or any bit above the slots
means the plaintext did not decode and raises). The offset is added at decoding, by the agent that decrypts, rather
than at encryption: an offset added at encryption would be scaled by the penalties on
the way (``gamma_ji O`` per reply), and agent ``i`` could only remove it by knowing
``gamma_ji`` (the paper protocol) or would have to reserve room for ``rho_i O`` (the
aggregated one). Decoding-time offsets cost nothing and reveal nothing beyond ``r``.

Width. The codec already guarantees ``|r_k| < limit`` for the aggregated sums
(:meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.check_sums`: ``B_i = sum_j
gamma_ij gamma_ji |q_j - q_i| < limit``), and the paper protocol's per-reply values are
held to the same limit at decryption. The slot width follows from the codec's range:
``w = bits(limit) = log2(limit) + 1`` (63 bits for the int64-capped limit ``2^62``), and
``S = floor((key_bits - margin) / w)`` with ``margin = 2`` bits (``2^(key_bits - 2) <= n / 2``
for a ``key_bits``-bit ``n``). The int64 emulation caps the codec's limit at ``2^62`` at every
key size, so slots are 63 bits wide: at 2048 bits that is 32 slots, at 1024 bits 16, at 512
bits 8, and at 128 bits 2.
``slot_bits`` may ask for narrower slots (more per plaintext); values must then fit
``2^(slot_bits - 1)``, checked before anything is encrypted, and a value that does not fit
raises :class:`~ppdnmf_torch.exchange.codec.CodecRangeError` (packing never wraps
silently: a digit that overflowed would corrupt its neighbour).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .codec import CodecRangeError, IntegerCodec, abs_max, first_sum_over

__all__ = ["SlotLayout", "derive_layout", "PACKING_MARGIN_BITS", "SlotDecodeError",
           "check_slot_sums", "check_masked_sums", "first_reply_overflow", "natural_slot_bits",
           "decrypted_range_error", "check_protocol_range"]

#: bits kept free above the slots: ``2^(key_bits - 2) <= n / 2`` for any ``key_bits``-bit ``n``
PACKING_MARGIN_BITS = 2


class SlotDecodeError(ValueError):
    """A decrypted packed plaintext does not decode (it wrapped modulo ``n``)."""

    def __init__(self, message, value=0):
        super().__init__(message)
        self.value = value


@dataclass(frozen=True)
class SlotLayout:
    """Where the values sit in a plaintext: ``slots`` slots of ``slot_bits`` bits.

    Attributes
    ----------
    key_bits : int
    slot_bits : int
        ``w``; a slot holds a signed value ``|v| < 2^(w - 1)``.
    slots : int
        ``S = floor((key_bits - margin_bits) / w)``.
    margin_bits : int
    """

    key_bits: int
    slot_bits: int
    slots: int
    margin_bits: int = PACKING_MARGIN_BITS

    @property
    def limit(self) -> int:
        """Exclusive bound on ``|value|`` per slot, ``2^(w - 1)``."""
        return 1 << (self.slot_bits - 1)

    @property
    def offset_word(self) -> int:
        """``OFF = sum_k limit 2^(w k)``, added to a decrypted residue before reading the slots."""
        return self._unused_word(self.slots)

    def n_ciphertexts(self, count: int) -> int:
        """Plaintexts (ciphertexts) needed for ``count`` values: ``ceil(count / S)``."""
        return -(-int(count) // self.slots)

    # -- packing -----------------------------------------------------------------------
    def pack_signed(self, values) -> list:
        """``M(chunk)`` for every chunk of ``S`` values, as signed Python ints (independent of ``n``).

        Reduce each mod a key's ``n`` to encrypt it (:meth:`residues`).
        """
        S, w = self.slots, self.slot_bits
        vals = [int(v) for v in values]
        out = []
        for start in range(0, len(vals), S):
            m = 0
            for v in reversed(vals[start:start + S]):  # Horner from the top slot down
                m = (m << w) + v
            out.append(m)
        return out

    @staticmethod
    def residues(packed_signed, n) -> list:
        """Packed signed integers as residues mod ``n`` (what gets encrypted)."""
        n = int(n)
        return [m % n for m in packed_signed]

    def pack(self, values, n) -> list:
        """Residues mod ``n`` of the packed ``values`` (``ceil(len / S)`` of them)."""
        return self.residues(self.pack_signed(values), n)

    # -- unpacking ---------------------------------------------------------------------
    def unpack(self, residues, n, count: int) -> list:
        """The ``count`` signed slot values of decrypted ``residues`` (exact).

        Raises
        ------
        SlotDecodeError
            If a residue does not decode: a slot outgrew the layout, the plaintext wrapped
            modulo ``n``, or the ciphertext was not made under this key. With one slot per
            plaintext, ``value`` is the signed integer the residue stands for (as
            :meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.from_residue` reads it).
        """
        n = int(n)
        S, w, lim = self.slots, self.slot_bits, self.limit
        mask = (1 << w) - 1
        top = w * S
        off = self.offset_word
        out = []
        remaining = int(count)
        for r in residues:
            u = (int(r) + off) % n
            take = min(S, remaining)
            if u >> top:
                raise self._decode_error(int(r), n)
            for _ in range(take):
                d = u & mask
                if not d:  # the value -L: outside (-L, L), as from_residue reads it
                    raise self._decode_error(int(r), n)
                out.append(d - lim)
                u >>= w
            # unused slots of the last plaintext must decode to exactly 0
            if take < S and u != self._unused_word(S - take):
                raise self._decode_error(int(r), n)
            remaining -= take
        if remaining > 0:
            raise ValueError(f"unpack: {count} values asked, the residues hold {count - remaining}")
        return out

    def _unused_word(self, k: int) -> int:
        """``sum_{k' < k} limit 2^(w k')``: ``k`` slots that hold 0, offset (memoized)."""
        memo = self.__dict__.setdefault("_words", {})
        off = memo.get(k)
        if off is None:
            off, lim, w = 0, self.limit, self.slot_bits
            for _ in range(k):
                off = (off << w) + lim
            memo[k] = off
        return off

    def _decode_error(self, r: int, n: int) -> SlotDecodeError:
        if self.slots == 1:
            v = r if r <= n // 2 else r - n
            return SlotDecodeError(f"decrypted value {v} lies outside (-{self.limit}, {self.limit})", abs(v))
        return SlotDecodeError(
            f"a decrypted plaintext of {self.slots} slots x {self.slot_bits} bits does not decode", 0)


def natural_slot_bits(codec: IntegerCodec) -> int:
    """Slot width the codec's range needs: ``bits(limit)`` (values in ``(-limit, limit)``)."""
    return int(codec.limit).bit_length()


def derive_layout(codec: IntegerCodec, *, packing: bool = True, slot_bits=None,
                  margin_bits: int = PACKING_MARGIN_BITS) -> SlotLayout:
    """The slot layout for ``codec`` at ``codec.key_bits`` (see the module docstring).

    ``packing=False`` gives one slot per plaintext (the unpacked layout). ``slot_bits``
    (``None``: derived from the codec's limit) may narrow the slots, never widen them.
    """
    natural = natural_slot_bits(codec)
    kb = int(codec.key_bits)
    if slot_bits is None:
        w = natural
    else:
        if isinstance(slot_bits, bool) or not isinstance(slot_bits, int) or not 2 <= slot_bits <= natural:
            raise ConfigError(
                f"slot_bits: must be an integer in [2, {natural}] (the codec's range needs {natural} bits "
                f"per slot at key_bits={kb}, n_max={codec.n_max:g}), got {slot_bits!r}")
        w = slot_bits
    if not packing:
        return SlotLayout(kb, w, 1, margin_bits)
    S = (kb - margin_bits) // w
    if S < 1:  # pragma: no cover - natural <= key_bits - 2 by the codec's limit
        raise ConfigError(f"slot_bits: {w}-bit slots do not fit a {kb}-bit key")
    return SlotLayout(kb, w, S, margin_bits)


def check_slot_sums(layout: SlotLayout, q, w, src, dst, *, n_nodes, n_agents=1, bcd_iter=0, admm_iter=0) -> None:
    """Aggregated protocol with slots narrower than the codec needs: ``B_i < 2^(w - 1)``.

    Same bound as :meth:`~ppdnmf_torch.exchange.codec.IntegerCodec.check_sums` (float64 with
    a relative safety margin far above its rounding error), against the slot limit.
    """
    if src.numel() == 0:
        return
    lim = layout.limit
    hit = first_sum_over(lim, q, w, src, dst, n_nodes=n_nodes, n_agents=n_agents)
    if hit is not None:
        trial, agent, val = hit
        raise CodecRangeError(
            f"packing range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, ADMM iteration "
            f"{admm_iter}: neighbour sum bound {val:.6g} (= sum_j gamma_ij gamma_ji |q_j - q_i|) does not fit "
            f"the slot limit {lim} (2^{lim.bit_length() - 1}) of {layout.slot_bits}-bit slots; raise slot_bits "
            "(or leave it unset), or lower n_max",
            trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=int(val), limit=lim,
        )


def check_masked_sums(limit: int, q, w, topology, *, bcd_iter=0, admm_iter=0) -> None:
    """Masked protocol: raise :class:`~ppdnmf_torch.exchange.codec.CodecRangeError` if some
    ``sum_j w_ij |q_j|`` (a bound on the decrypted slots ``A_i``) reaches ``limit``.

    A cheap global bound first (``max |q| max w max deg``), the exact per-agent one when it
    does not already prove every sum in range.
    """
    src = topology.src
    if src.numel() == 0 or q.numel() == 0:
        return
    crude = abs_max(q) * float(w.abs().max()) * float(topology.degree.max())
    if crude < limit * (1 - 1e-9):
        return
    hit = first_sum_over(limit, q, w, src, topology.dst, n_nodes=topology.n_nodes, n_agents=topology.n_agents,
                         centred=False)
    if hit is None:
        return
    trial, agent, val = hit
    raise CodecRangeError(
        f"masked range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, ADMM iteration {admm_iter}: "
        f"the masked sum bound {val:.6g} (= sum_j gamma_ij gamma_ji |q_j|) does not fit the slot limit {limit} "
        f"(2^{limit.bit_length() - 1}); lower n_max or g_bits, leave slot_bits unset, or use protocol='aggregated'",
        trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=int(val), limit=limit,
    )


def first_reply_overflow(q, gamma, src, dst, rev, limit: int, edges=None):
    """Paper protocol: the first per-reply value ``|gamma_ji (q_j - q_i)| >= limit``.

    Replies are scanned in edge order (``e = i -> j``, CSR) and entries in order, as agent
    ``i`` decrypts them; ``edges`` (ascending edge indices) restricts the scan to those.
    Returns ``(e, value)`` with the exact magnitude, or None. A float64 screen with a wide
    margin runs first; exact Python integers decide.
    """
    if src.numel() == 0:
        return None
    g_ji = gamma[rev]
    if edges is not None:
        g_ji, src, dst = g_ji[edges], src[edges], dst[edges]
    dq = q[dst].to(torch.float64) - q[src].to(torch.float64)
    approx = g_ji.to(torch.float64)[:, None] * dq.abs()
    if float(approx.max()) < limit * (1 - 1e-9):
        return None
    suspects = torch.nonzero((approx >= limit * (1 - 1e-9)).any(dim=1)).flatten().tolist()
    qh = q.tolist()
    gl, sl, dl = g_ji.tolist(), src.tolist(), dst.tolist()
    index = list(range(len(sl))) if edges is None else edges.tolist()
    for e in suspects:
        qi, qj, g = qh[sl[e]], qh[dl[e]], gl[e]
        for a, b in zip(qj, qi):
            v = abs(g * (a - b))
            if v >= limit:
                return index[e], v
    return None


def decrypted_range_error(trial, agent, bcd_iter, admm_iter, value, limit, what=None) -> CodecRangeError:
    """The error agent ``agent`` of trial ``trial`` raises when a decrypted value (or, ``what``,
    a packed slot) does not fit the codec's range."""
    where = (f"codec range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, "
             f"ADMM iteration {admm_iter}: ")
    bits = f"(2^{limit.bit_length() - 1})"
    if what is None:
        why = (f"decrypted value magnitude {value} does not fit the codec limit {limit} {bits}; the plaintext "
               "wrapped modulo n or was not encrypted under this agent's key")
    else:
        why = (f"{what}; a slot outgrew its limit {limit} {bits}, the plaintext wrapped modulo n, or it was not "
               "encrypted under this agent's key")
    return CodecRangeError(where + why, trial=trial, agent=agent, bcd_iter=bcd_iter,
                           admm_iter=admm_iter, value=value, limit=limit)


def check_protocol_range(codec: IntegerCodec, layout, topology, protocol: str, q, gamma, w, *, bcd_iter=0,
                         admm_iter=0) -> None:
    """The range checks that the protocol's decryptions need beyond the codec's own sums.

    Run before anything is encrypted, by every integer exchange kind (``quantized``
    emulates them, so that it fails exactly where ``paillier`` would).

    * ``protocol="aggregated"``: every decrypted slot is ``S_int`` with ``|S_int| <= B_i``;
      the codec checked ``B_i < limit``, so only slots narrower than the codec's range
      (``layout`` with a small ``slot_bits``) need a check.
    * ``protocol="paper"``: every reply is decrypted on its own; its entries
      ``gamma_ji (q_j - q_i)`` must fit. At the codec's full width only replies that agent
      ``i`` weighs by ``gamma_ij = 0`` need a scan: the codec's sums bound the others.

    * ``protocol="masked"``: agent ``i`` decrypts ``A_i = sum_j gamma_ij gamma_ji q_j`` slot by
      slot (then ``S_int_i = A_i - rho_int_i q_i``), so ``sum_j w_ij |q_j|`` must fit the slot
      (:func:`check_masked_sums`), at every width.

    ``layout`` is None for an unpacked exchange.
    """
    lim = codec.limit if layout is None else min(layout.limit, codec.limit)
    if protocol == "masked":
        check_masked_sums(lim, q, w, topology, bcd_iter=bcd_iter, admm_iter=admm_iter)
        return
    if protocol == "aggregated":
        if layout is not None and lim < codec.limit:
            check_slot_sums(layout, q, w, topology.src, topology.dst, n_nodes=topology.n_nodes,
                            n_agents=topology.n_agents, bcd_iter=bcd_iter, admm_iter=admm_iter)
        return
    edges = None
    if lim >= codec.limit:
        # gamma_ji |q_j - q_i| <= w_ij |q_j - q_i| <= B_i < limit, which the codec's own sums
        # checked, whenever gamma_ij >= 1: only the replies that agent i weighs by 0 can overflow
        edges = torch.nonzero(gamma == 0).flatten()
        if edges.numel() == 0:
            return
    hit = first_reply_overflow(q, gamma, topology.src, topology.dst, topology.rev, lim, edges=edges)
    if hit is None:
        return
    e, value = hit
    n_agents = max(1, topology.n_agents)
    trial, agent = divmod(int(topology.src[e]), n_agents)
    if value >= codec.limit:
        raise decrypted_range_error(trial, agent, bcd_iter, admm_iter, value, codec.limit)
    raise CodecRangeError(
        f"packing range: agent {agent} (trial {trial}) at BCD iteration {bcd_iter}, "
        f"ADMM iteration {admm_iter}: the reply of agent {int(topology.dst[e]) % n_agents} holds "
        f"gamma_ji |q_j - q_i| = {value}, which does not fit the slot limit {lim} "
        f"(2^{lim.bit_length() - 1}) of {layout.slot_bits}-bit slots; raise slot_bits (or leave it unset), "
        "or lower n_max",
        trial=trial, agent=agent, bcd_iter=bcd_iter, admm_iter=admm_iter, value=value, limit=lim,
    )
