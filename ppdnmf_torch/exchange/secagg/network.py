"""The parties of a secure sum in one process, their seed agreement and their masked rounds.

:class:`SecAggNetwork` holds one :class:`~.party.Party` per node of a :class:`~.plan.SecAggPlan`
(the agents of an exchange; the workers and the server of an aggregation), the run's
:class:`~.ledger.SecAggLedger` and, when recording, the transcript (:class:`WireMessage`: what an
eavesdropper on every link sees).

Setup (:meth:`SecAggNetwork.agree`, once per run; Bonawitz et al., CCS 2017, with the receiver of
each group as its server):

1. every party's identity key is published (the public-key infrastructure the protocol assumes);
2. the two ends of every link send each other their signed ephemeral keys (:class:`~.party.SignedKey`);
3. every receiver relays to each of its senders the signed keys of that sender's partners in its
   group: the pair seeds of two senders are agreed *through* their receiver, who relays public
   keys only and cannot compute the seeds (X25519's Diffie-Hellman problem), nor substitute a key
   (every party checks every key it gets against its owner's identity key);
4. every party derives its seeds (:meth:`~.party.Party.agree`) and drops its ephemeral key.

Round ``t`` (:meth:`SecAggNetwork.masked_sums`): sender ``j``'s message to receiver ``r`` is
``m = q_j + sum_k sigma_jk PRG(s^r_jk, t, r) + PRG(s_rj, t, r) mod 2^64``; ``r`` adds its messages and
subtracts ``sum_j PRG(s_rj, t, r)``: the pair masks cancel, and what is left is ``sum_j q_j mod 2^64``,
read as a signed integer (exact: the callers' range checks keep it below ``2^62`` in magnitude).
Every party computes its own keystreams from its own seeds (:meth:`~.party.Party.fill`, the work a
deployment does); the arithmetic runs in int64 tensors, whose additions wrap modulo ``2^64``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...errors import PPDNMFError
from .ledger import SecAggLedger
from .party import SIGNED_KEY_BYTES, Party
from .plan import SecAggPlan
from .prg import BLOCK_BYTES, MAX_ENTRIES, as_words, n_blocks, stream_rows

__all__ = ["SecAggNetwork", "WireMessage", "DroppedNeighbourError", "RowPlan", "finish_agreement"]


def finish_agreement(parties: dict, plan: SecAggPlan, got: dict, pki: dict, ledger: SecAggLedger, nbytes: int,
                     t0: float) -> None:
    """Step 4 of the seed agreement, in one process and on a rank alike: every party checks every
    signed key it received (``got[n][peer]``: ``[(signed key, relayed via)]``) against the peer's
    public identity key in ``pki``, derives its seeds from the first copy, and drops its ephemeral
    secret; the ledger gets the setup's counters, ``nbytes`` and the time since ``t0``."""
    for n, party in parties.items():
        for peer, tags in plan.seeds_of(n).items():
            copies = got[n][peer]
            for sk, via in copies:
                party.verify(sk, peer, pki[peer], via)
            party.agree(copies[0][0], tags)
        party.finish_setup()
    for key in ("signatures", "verifications", "key_agreements"):
        ledger.add(f"setup_{key}", sum(getattr(p, key) for p in parties.values()))
    ledger.add("setup_bytes", nbytes)
    ledger.add("time_setup", time.perf_counter() - t0)


class DroppedNeighbourError(PPDNMFError):
    """A sender did not answer in a round: its receivers' masked sums cannot be unmasked.

    Attributes
    ----------
    senders, receivers : tuple of int
    round : int
    """

    def __init__(self, message, *, senders=(), receivers=(), round_no=0):
        super().__init__(message)
        self.senders, self.receivers, self.round = tuple(senders), tuple(receivers), int(round_no)


@dataclass(frozen=True)
class WireMessage:
    """One message on a link as an eavesdropper records it: a signed key (``payload``: its bytes)
    or a masked message (``payload``: int64 ndarray ``(P,)``)."""

    bcd_iter: int
    admm_iter: int
    round: int
    sender: int
    receiver: int
    kind: str
    payload: object


class RowPlan:
    """Where every keystream of a round goes, and who computes it.

    In a deployment each holder of a seed computes its keystream: sender ``j`` those of its pair
    seeds and of its edge seed for each message, the receiver those of its edge seeds. In one process
    the two holders' keystreams are the same bytes, so each is computed once, by one of its holders
    that is here (a pair keystream by the first sender to need it, an edge keystream by its sender,
    or by the receiver when the sender is elsewhere): one row per (seed, receiver) of the round, the
    masks of a receiver in one pass over its rows. :attr:`n_streams` counts the keystreams of the
    deployment (what the ledger's ``prg_bytes`` reports), :attr:`n_rows` those computed here.

    The arithmetic is numpy int64 (its additions wrap modulo ``2^64``): a message is its sender's
    value plus its ``+1`` rows less its ``-1`` rows; a receiver's sum is the sum of its messages less
    its edge rows. The buffers are kept from round to round while the message length stays the same
    (each party keeps its part of the work ready, :meth:`~.party.Party.prepare`).

    Parameters
    ----------
    plan : SecAggPlan
    messages : list of (receiver, sender)
        The round's messages that the parties here send, in the order of the message array.
    receivers : list of int, optional
        The receivers here, whose sums are unmasked here (default: every group of ``plan``).
    """

    def __init__(self, plan: SecAggPlan, messages, receivers=None):
        index, rows = {}, []

        def row(tag, r, owner) -> int:
            if (tag, r) not in index:
                index[(tag, r)] = len(rows)
                rows.append((owner, tag, r))
            return index[(tag, r)]

        self.pos, self.neg = [], []
        n_streams = 0
        for r, j in messages:
            tags = plan.sender_tags(r, j)
            n_streams += len(tags)
            self.pos.append([row(t, r, j) for t, sign in tags if sign > 0])
            self.neg.append([row(t, r, j) for t, sign in tags if sign < 0])
        receivers = sorted(plan.groups) if receivers is None else sorted(int(r) for r in receivers)
        self.receivers = receivers
        self.slot = {r: k for k, r in enumerate(receivers)}
        self.strip = []
        for r in receivers:
            tags = plan.receiver_tags(r)
            n_streams += len(tags)
            self.strip.append([row(t, r, r) for t, _ in tags])
        self.n_rows, self.n_streams = len(rows), n_streams
        self.jobs: dict = {}
        for k, (owner, tag, r) in enumerate(rows):
            self.jobs.setdefault(owner, []).append((k, tag, r))
        self._counted = sorted({x[2] for x in rows})
        self._count = None
        self.msg_slot = [self.slot.get(r, -1) for r, _ in messages]
        if all(k >= 0 for k in self.msg_slot):
            self.incoming(self.msg_slot)

    def incoming(self, slots) -> None:
        """The receivers (places in :attr:`receivers`) of the messages :meth:`unmask` will get, in
        their order."""
        self._incoming = [[] for _ in self.receivers]
        for m, k in enumerate(slots):
            self._incoming[int(k)].append(m)

    def _prepare(self, parties: dict, count: int) -> None:
        nb = n_blocks(count)
        self._rows = stream_rows(self.n_rows, count)
        self._M = np.empty((len(self.pos), count), dtype=np.int64)
        self._sums = np.empty((len(self.receivers), count), dtype=np.int64)
        ctr = np.empty((len(self._counted), nb, 2), dtype=">u8")
        for k, r in enumerate(self._counted):
            ctr[k, :, 1] = np.arange(nb, dtype=np.uint64) + np.uint64(int(r) << 32)
        self._ctr = ctr
        views = {r: ctr[k].view(np.uint8).reshape(nb, BLOCK_BYTES) for k, r in enumerate(self._counted)}
        for owner, jobs in self.jobs.items():
            parties[owner].prepare(id(self), [(tag, views[r], self._rows[k]) for k, tag, r in jobs])
        self._count = count

    def keystreams(self, parties: dict, round_no: int, count: int) -> np.ndarray:
        """Every party here computes its rows: ``(n_rows, count)`` int64 (a view of the buffer, valid
        until the next round)."""
        if not 0 <= int(count) <= MAX_ENTRIES or not 0 <= int(round_no) < 2 ** 64:
            raise ValueError(f"a round number below 2^64 and at most {MAX_ENTRIES} entries, got {round_no}, {count}")
        if self._count != count:
            self._prepare(parties, count)
        self._ctr[:, :, 0] = int(round_no)
        for owner in self.jobs:
            parties[owner].run(id(self))
        return as_words(self._rows, count)

    def messages(self, q: np.ndarray, senders: np.ndarray, W: np.ndarray) -> np.ndarray:
        """The masked messages ``(n_msgs, count)`` (a buffer, valid until the next round): the senders'
        values (rows ``senders`` of ``q``, in message order) plus each sender's signed keystreams,
        modulo ``2^64``."""
        M = self._M
        for m, (s, pos, neg) in enumerate(zip(senders.tolist(), self.pos, self.neg)):
            out = M[m]
            np.add(q[s], W[pos[0]], out=out)  # every message has its edge keystream, a +1 row
            for k in pos[1:]:
                np.add(out, W[k], out=out)
            for k in neg:
                np.subtract(out, W[k], out=out)
        return M

    def unmask(self, M: np.ndarray, W: np.ndarray) -> np.ndarray:
        """Every receiver's sum of its messages less its edge keystreams ``(n_receivers, count)`` (a
        buffer, valid until the next round); ``M``: the messages to the receivers here, in the order
        given to :meth:`incoming` (default: this plan's own messages)."""
        out = self._sums
        for k, (msgs, strip) in enumerate(zip(self._incoming, self.strip)):
            acc = out[k]
            np.copyto(acc, M[msgs[0]])
            for m in msgs[1:]:
                np.add(acc, M[m], out=acc)
            for r in strip:
                np.subtract(acc, W[r], out=acc)
        return out


class SecAggNetwork:
    """The parties of one run and their rounds (module docstring).

    Parameters
    ----------
    plan : SecAggPlan
    messages : list of (receiver, sender)
        The messages of a round, in the order of the values handed to :meth:`masked_sums`.
    ledger : SecAggLedger
    transcript : list or None
        Receives every :class:`WireMessage` (None: nothing is recorded).
    name : callable(int) -> str, optional
        How an error names a node (default ``"party <id>"``).
    """

    def __init__(self, plan: SecAggPlan, messages, ledger: SecAggLedger, transcript=None, name=None):
        self.plan, self.ledger, self.transcript = plan, ledger, transcript
        self.name = name or (lambda n: f"party {n}")
        self.messages = [(int(r), int(j)) for r, j in messages]
        nodes = set(plan.groups)
        for snd in plan.groups.values():
            nodes.update(snd)
        self.parties = {n: Party(n) for n in sorted(nodes)}
        self.rows = RowPlan(plan, self.messages)
        self._iteration = (0, 0)

    # -- setup ---------------------------------------------------------------------------------
    def _record(self, sender, receiver, kind, payload, round_no=0) -> None:
        if self.transcript is not None:
            self.transcript.append(WireMessage(self._iteration[0], self._iteration[1], round_no, int(sender),
                                               int(receiver), kind, payload))

    def agree(self) -> None:
        """The seed agreement (module docstring), counted in the ledger's ``setup_*`` keys."""
        led, parties, plan = self.ledger, self.parties, self.plan
        t0 = time.perf_counter()
        pki = {n: p.identity_key for n, p in parties.items()}  # step 1: the identity keys are public
        got: dict = {n: {} for n in parties}  # what each party received: {peer: [(signed key, via)]}
        nbytes = 0
        for lo, hi in plan.links():  # step 2: both ends of a link
            for a, b in ((lo, hi), (hi, lo)):
                sk = parties[a].signed_key
                got[b].setdefault(a, []).append((sk, None))
                self._record(a, b, "signed_key", sk.to_bytes())
                nbytes += SIGNED_KEY_BYTES
        for r, j, k in plan.relays():  # step 3: r relays k's key to j
            sk = got[r][k][0][0]
            got[j].setdefault(k, []).append((sk, r))
            self._record(r, j, "relayed_key", sk.to_bytes())
            nbytes += SIGNED_KEY_BYTES
        finish_agreement(parties, plan, got, pki, led, nbytes, t0)  # step 4

    # -- a round -------------------------------------------------------------------------------
    def begin(self, bcd_iter: int, admm_iter: int) -> None:
        self.ledger.begin(bcd_iter, admm_iter)
        self._iteration = (int(bcd_iter), int(admm_iter))

    def check_answers(self, dropped) -> None:
        """Refuse a round in which some senders do not answer (``dropped``: node ids), naming them."""
        if not dropped:
            return
        gone = sorted({int(d) for d in dropped})
        hit = sorted({r for r, j in self.messages if j in gone})
        rnd = self.plan.round + 1
        who = ", ".join(self.name(d) for d in gone)
        raise DroppedNeighbourError(
            f"secagg: {who} did not answer in round {rnd}; the masked sums of "
            f"{', '.join(self.name(r) for r in hit) or 'no receiver'} cannot be unmasked without "
            f"{'their' if len(gone) > 1 else 'its'} messages (the pair masks cancel only in full sums), so the "
            "round is refused (there is no seed recovery)", senders=gone, receivers=hit, round_no=rnd)

    def masked_sums(self, q: np.ndarray, senders: np.ndarray) -> np.ndarray:
        """One round: ``q (n, P)`` int64 and the row of every message's sender (``senders``, in message
        order) -> every receiver's ``sum_j q_j`` ``(n_receivers, P)`` int64 (receivers in
        :attr:`RowPlan.receivers` order; a buffer, valid until the next round), through masked
        messages (module docstring)."""
        led, rows = self.ledger, self.rows
        P = int(q.shape[1])
        rnd = self.plan.next_round()
        t0 = time.perf_counter()
        W = rows.keystreams(self.parties, rnd, P)
        t1 = time.perf_counter()
        M = rows.messages(q, senders, W)
        sums = rows.unmask(M, W)
        t2 = time.perf_counter()
        led.add("time_prg", t1 - t0)
        led.add("time_mask", t2 - t0)
        led.add("prg_bytes", rows.n_streams * 16 * n_blocks(P))
        led.add("messages", len(self.messages))
        for (r, j) in self.messages:
            led.add_edge_bytes(j, r, 8 * P)
        if self.transcript is not None:
            for k, (r, j) in enumerate(self.messages):
                self._record(j, r, "masked", M[k].copy(), rnd)
        return sums

    def close(self) -> None:
        for p in self.parties.values():
            p.forget()
        self.parties = {}

    def __repr__(self) -> str:
        return (f"SecAggNetwork({len(self.parties)} parties, {len(self.messages)} messages per round, "
                f"{self.rows.n_rows} keystreams per round)")
