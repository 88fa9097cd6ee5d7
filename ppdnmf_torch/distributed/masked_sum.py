"""Sums over ranks that reveal the total only: :class:`MaskedSums`, the pairwise-masked
all-reduce of the per-rank sums a run's metrics and penalty need (issue 39), and
:class:`PlainSums`, the plain all-reduce with the same interface.

A model's rank run sums per-rank partial results across ranks (symmetric NMF's sum of each
site's copies ``U_i``, its metric sums and the adaptive penalty's three sums; PPDNMF's
``share="sums"`` metric sums). With one agent per site a plain all-reduce hands every site each
other's values; under ``exchange="secagg"`` the run sums them with :class:`MaskedSums` instead,
and only the total is revealed. Callers make one with :func:`rank_sums` and call
:meth:`MaskedSums.all_reduce` where they called :meth:`~.comm.Comm.all_reduce`.

Setup, once per object (:meth:`MaskedSums.agree`; Bonawitz et al., CCS 2017, without dropouts):
every rank is one :class:`~ppdnmf_torch.exchange.secagg.party.Party` (its Ed25519 identity key,
published to the others, the run's public-key infrastructure as :class:`~.parties.SecAggRankParties`
has it; a fresh X25519 ephemeral key, signed); the ranks all-gather their signed ephemeral keys,
every rank checks each against its owner's identity key and derives one AES-128 seed per pair
(X25519, then HKDF-SHA256, tag ``("ranksum", i, j)``), then drops its ephemeral key. The seeds
never leave the rank's :class:`~ppdnmf_torch.exchange.secagg.party.Party`: no method returns
one, and the object refuses pickling and copying (not logged, checkpointed or printed).

One call (``t``, float, any shape; :meth:`MaskedSums.all_reduce`):

1. the **public scale**: per section of ``t`` (``split``; default the whole tensor) each rank
   sends the binary exponent ``e`` of its largest magnitude (``max |x| < 2^e``) to a MAX
   all-reduce; with ``E`` the largest and ``b = bit_length(W)`` for ``W`` ranks, the section's
   values are encoded as ``q = round(x 2^s)``, ``s = 62 - E - b``. Then every ``|q| < 2^(62-b)``
   and the sum of ``W < 2^b`` of them stays below ``2^62 + W`` in magnitude: it **cannot wrap**
   the ring ``Z_{2^64}`` (int64) whatever the ranks' values, so no call is refused. A section
   with a NaN or an infinity on some rank has the exponent :data:`NONFINITE`: its total is NaN
   on every rank (the plain sum would be NaN or infinite too; the callers' own checks name the
   agents). What this reveals beyond the total: per section, the exponent of the largest
   magnitude over the ranks (a max over sites, coarser than the MAX reductions the runs make
   anyway), and whether some rank's section was not finite.
2. the **masks**: rank ``i`` adds ``sum_{j>i} PRG(s_ij, t) - sum_{j<i} PRG(s_ij, t)`` modulo
   ``2^64`` (AES-128-CTR, :mod:`ppdnmf_torch.exchange.secagg.prg`, round ``t`` in every counter
   block); the rounds are numbered per object from 0, one per call, so no (seed, counter) pair
   is used twice (a resumed run agrees new seeds);
3. one ``dist.all_reduce`` of the int64 ring elements (their additions wrap modulo ``2^64`` on
   CPU, gloo, as on GPU): the masks cancel, the total of the ``q`` is left, exact;
4. every rank decodes ``total 2^-s`` in float64, then to ``t``'s dtype and device.

Accuracy: each rank's rounding is at most ``2^-(s+1)``, so the masked total differs from the
exact sum of the float64 values by at most ``W 2^-(s+1) < 2^(E-61)``, i.e. about ``2^-60`` of
the section's largest magnitude (``2^-59`` with the float64 conversion of the total): the
plain float64 all-reduce is as far from the exact sum. Equal to a plain sum to rounding, not
bit for bit. Entries below ``2^-900`` in magnitude are read as ``2^-900`` for the scale
(:data:`MIN_EXPONENT`).

MAX reductions and integer tensors (counts: flagged agents, iteration peaks, cost counters)
are not masked: :meth:`MaskedSums.all_reduce` hands them to the plain all-reduce, and their
callers' docs say what they reveal.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..exchange.sealed import HoldsPrivateKey
from ..exchange.secagg.party import SIGNED_KEY_BYTES, Party, SignedKey
from ..exchange.secagg.prg import MAX_ENTRIES, as_words, counter_blocks, stream_rows
from .comm import Comm, DistributedError

__all__ = ["MaskedSums", "PlainSums", "rank_sums", "NONFINITE", "MIN_EXPONENT", "TAG"]

#: the seed's tag (with the two ranks, smaller first)
TAG = "ranksum"
#: the exponent a rank sends for a section holding a NaN or an infinity
NONFINITE = 1 << 40
#: the smallest exponent of the public scale (a section of zeros sends it)
MIN_EXPONENT = -900


class PlainSums:
    """The plain all-reduce (``plain``, ``quantized`` and ``paillier`` runs): :meth:`all_reduce` is
    :meth:`~.comm.Comm.all_reduce`, the same bits; ``split`` is ignored."""

    masked = False

    def __init__(self, comm: Comm):
        self.comm = comm

    def all_reduce(self, t: torch.Tensor, *, category: str, what: str, op=None, split=None) -> torch.Tensor:
        return self.comm.all_reduce(t, category=category, what=what, op=op)

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"PlainSums(rank={self.comm.rank})"


def rank_sums(comm: Comm, kind: str):
    """The sums of a run whose exchange is ``kind``: :class:`MaskedSums` for ``"secagg"``, else
    :class:`PlainSums`. Every rank calls it with the same ``kind``; close the result at the end."""
    return MaskedSums(comm) if kind == "secagg" else PlainSums(comm)


def _exponents(x: torch.Tensor, bounds: list) -> torch.Tensor:
    """Per section ``[a, b)`` of the flat float64 ``x``: ``e`` with ``max |x| < 2^e`` (at least
    :data:`MIN_EXPONENT`), or :data:`NONFINITE`."""
    out = []
    for a, b in bounds:
        part = x[a:b]
        if part.numel() and not bool(torch.isfinite(part).all()):
            out.append(NONFINITE)
            continue
        peak = float(part.abs().max()) if part.numel() else 0.0
        out.append(max(int(np.frexp(peak)[1]), MIN_EXPONENT) if peak > 0 else MIN_EXPONENT)
    return torch.tensor(out, dtype=torch.int64)


class MaskedSums(HoldsPrivateKey):
    """The pairwise-masked all-reduce of one rank (module docstring).

    Parameters
    ----------
    comm : Comm
        Every rank of it makes its own, at the same point, and calls :meth:`all_reduce` in the
        same order (a collective).

    Attributes
    ----------
    rounds : int
        Masked calls so far (the next round's number).
    """

    masked = True

    def __init__(self, comm: Comm):
        self.comm = comm
        self.rounds = 0
        self._party = None
        self._peers: list = []
        self._closed = False

    # -- setup ------------------------------------------------------------------------------
    def agree(self) -> None:
        """The pair seeds with every other rank (module docstring); a collective, once."""
        comm, me = self.comm, self.comm.rank
        party = Party(me)
        pki = {}
        for part in comm.all_gather_object({me: party.identity_key}, category="setup",
                                           what="the ranks' identity keys (the masked sums' public-key infrastructure)"):
            pki.update(part)
        raw = torch.frombuffer(bytearray(party.signed_key.to_bytes()), dtype=torch.uint8)
        keys = comm.all_gather(raw, category="setup", what="the ranks' signed keys of the masked sums")
        for j, got in enumerate(keys):
            if j == me:
                continue
            blob = got.cpu().numpy().tobytes()
            if len(blob) != SIGNED_KEY_BYTES:
                raise DistributedError(f"rank {me}: the masked sums' key agreement: rank {j} sent {len(blob)} bytes, "
                                       f"a signed key has {SIGNED_KEY_BYTES}")
            sk = SignedKey.from_bytes(blob)
            party.verify(sk, j, pki[j])
            party.agree(sk, [(TAG, min(me, j), max(me, j))])
        party.finish_setup()
        self._party, self._peers = party, [j for j in range(comm.world_size) if j != me]

    # -- one sum ----------------------------------------------------------------------------
    def _masks(self, count: int) -> np.ndarray:
        """This rank's mask of round :attr:`rounds`, ``(count,)`` int64 (wrapping sums)."""
        me = self.comm.rank
        rows = stream_rows(len(self._peers), count)
        ctr = counter_blocks(self.rounds, 0, count)
        self._party.fill([(k, (TAG, min(me, j), max(me, j)), 0) for k, j in enumerate(self._peers)], {0: ctr}, rows)
        words = as_words(rows, count)
        mask = np.zeros(count, dtype=np.int64)
        for k, j in enumerate(self._peers):
            if j > me:
                np.add(mask, words[k], out=mask)
            else:
                np.subtract(mask, words[k], out=mask)
        return mask

    def all_reduce(self, t: torch.Tensor, *, category: str, what: str, op=None, split=None) -> torch.Tensor:
        """The sum of ``t`` over the ranks, only the total revealed (a float ``t`` and ``op`` SUM);
        ``op`` MAX and integer tensors go to the plain all-reduce.

        Parameters
        ----------
        t : Tensor
            The same shape and dtype on every rank.
        category, what : str
            As :meth:`~.comm.Comm.all_reduce` (the byte count's category; the operation's name in errors).
        op : torch.distributed.ReduceOp, optional
            SUM (default) is masked; any other is the plain all-reduce.
        split : sequence of int, optional
            Section lengths of the flattened ``t`` (summing to its size), one public scale each
            (module docstring); default one section. Sections of unlike magnitudes (a residual
            beside an objective) each keep ``2^-60`` of their own largest magnitude.

        Returns
        -------
        Tensor
            ``t``'s shape, dtype and device; the same on every rank.
        """
        if (op is not None and op != dist.ReduceOp.SUM) or not t.is_floating_point():
            return self.comm.all_reduce(t, category=category, what=what, op=op)
        if self._closed:
            raise RuntimeError("MaskedSums: closed (its seeds are gone); make a new one")
        if self._party is None:
            self.agree()
        x = t.detach().to("cpu", torch.float64).reshape(-1)
        P = x.numel()
        if P > MAX_ENTRIES:
            raise ValueError(f"{what}: a masked sum takes at most {MAX_ENTRIES} entries, got {P}")
        sizes = [P] if split is None else [int(v) for v in split]
        if sum(sizes) != P or min(sizes, default=0) < 0:
            raise ValueError(f"{what}: split {sizes} does not add up to the {P} entries of the tensor")
        bounds = list(zip(np.cumsum([0] + sizes[:-1]).tolist(), np.cumsum(sizes).tolist()))
        E = self.comm.all_reduce(_exponents(x, bounds), category=category, op=dist.ReduceOp.MAX,
                                 what=f"{what} (the public scale)").cpu()
        b = self.comm.world_size.bit_length()
        q = torch.empty(P, dtype=torch.int64)
        shift = torch.empty(P, dtype=torch.int64)
        for (lo, hi), e in zip(bounds, E.tolist()):
            s = 0 if e == NONFINITE else 62 - e - b
            shift[lo:hi] = s
            q[lo:hi] = 0 if e == NONFINITE else torch.round(torch.ldexp(x[lo:hi], torch.tensor(float(s),
                                                                                               dtype=torch.float64)))
        if self._peers:  # numpy's int64 additions wrap modulo 2^64
            np.add(q.numpy(), self._masks(P), out=q.numpy())
        self.rounds += 1
        total = self.comm.all_reduce(q, category=category, what=what).cpu()
        out = torch.ldexp(total.to(torch.float64), (-shift).to(torch.float64))
        for (lo, hi), e in zip(bounds, E.tolist()):
            if e == NONFINITE:
                out[lo:hi] = float("nan")
        return out.reshape(t.shape).to(dtype=t.dtype, device=t.device)

    def close(self) -> None:
        """Drop the seeds (the run is over)."""
        if self._party is not None:
            self._party.forget()
        self._party, self._closed = None, True

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._peers)} peers" if self._party is not None else "not agreed"
        return f"MaskedSums(rank={self.comm.rank}, {state}, rounds={self.rounds})"
