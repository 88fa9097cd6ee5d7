"""The public structure of the pairwise masks: who masks against whom, for which receiver.

A *group* is a receiver ``r`` and the senders whose values it sums: in the exchange, agent ``i``
and its neighbours ``N_i`` (one group per agent); in the server's secure sum, the server and every
worker (one group). Within a group, pairs ``a < b`` of senders share a *pair seed* (every pair of
the group in the exchange; the aggregation's mask graph, :func:`~..secure_sum.mask_pairs`), and
every sender shares an *edge seed* with the receiver. Seed tags:

* ``("pair", r, a, b)``: the pair seed of ``a < b`` in ``r``'s group;
* ``("edge", lo, hi)``: the edge seed of the link ``{lo, hi}`` (``lo < hi``); in the exchange one
  link serves both directions, told apart by the receiver in the PRG's counter blocks (:mod:`.prg`).

Sender ``j``'s mask for ``r`` is ``sum_k sigma_jk PRG(pair seed of j, k) + PRG(edge seed of r, j)``
(``sigma_jk = +1`` if ``j < k`` else ``-1``, ``k`` over ``j``'s partners in the group): the pair terms
cancel in ``r``'s sum of the messages, and ``r`` subtracts the edge terms.
"""
from __future__ import annotations

from itertools import combinations

__all__ = ["SecAggPlan", "pair_tag", "edge_tag"]


def pair_tag(receiver: int, a: int, b: int) -> tuple:
    return ("pair", int(receiver), min(int(a), int(b)), max(int(a), int(b)))


def edge_tag(a: int, b: int) -> tuple:
    return ("edge", min(int(a), int(b)), max(int(a), int(b)))


class SecAggPlan:
    """The groups, their pairs and the round counter (public: every party can compute it).

    Parameters
    ----------
    groups : dict receiver -> iterable of senders
        Groups without senders are dropped.
    pairs : dict receiver -> iterable of (a, b), optional
        The pairs of senders that share a pair seed in each group; None: every pair of the group.
    """

    def __init__(self, groups: dict, pairs: dict | None = None):
        self.groups = {int(r): sorted(int(s) for s in snd) for r, snd in groups.items() if len(snd)}
        self.pairs = {}
        self.partners = {}
        for r, snd in self.groups.items():
            given = None if pairs is None else pairs.get(r)
            pr = sorted({(min(a, b), max(a, b)) for a, b in given}) if given is not None else list(combinations(snd, 2))
            self.pairs[r] = [(int(a), int(b)) for a, b in pr]
            part = {j: [] for j in snd}
            for a, b in self.pairs[r]:
                part[a].append(b)
                part[b].append(a)
            self.partners[r] = {j: sorted(ks) for j, ks in part.items()}
        #: the number of the last round (every party counts them; no seed sees a round twice)
        self.round = 0

    def next_round(self) -> int:
        self.round += 1
        return self.round

    def sender_tags(self, receiver: int, sender: int) -> list:
        """``[(tag, sign), ...]`` of ``sender``'s mask for ``receiver``: its pair seeds, then its edge seed."""
        out = [(pair_tag(receiver, sender, k), 1 if sender < k else -1) for k in self.partners[receiver][sender]]
        out.append((edge_tag(receiver, sender), 1))
        return out

    def receiver_tags(self, receiver: int) -> list:
        """``[(tag, -1), ...]``: the edge seeds ``receiver`` removes from its sum."""
        return [(edge_tag(receiver, j), -1) for j in self.groups[receiver]]

    def seeds_of(self, party: int) -> dict:
        """``{peer: [tag, ...]}``: the seeds ``party`` shares, by the peer it agrees them with."""
        out: dict = {}
        for r, snd in self.groups.items():
            if party == r:
                for j in snd:
                    out.setdefault(j, []).append(edge_tag(r, j))
            elif party in self.partners[r]:
                out.setdefault(r, []).append(edge_tag(r, party))
                for k in self.partners[r][party]:
                    out.setdefault(k, []).append(pair_tag(r, party, k))
        return {p: sorted(set(t)) for p, t in out.items()}

    def relays(self):
        """``(receiver, sender, partner)``: ``receiver`` relays ``partner``'s signed key to ``sender``."""
        for r, part in self.partners.items():
            for j, ks in part.items():
                for k in ks:
                    yield r, j, k

    def links(self) -> list:
        """The links ``(lo, hi)`` with an edge seed: the two ends send each other their signed keys."""
        return sorted({(min(r, j), max(r, j)) for r, snd in self.groups.items() for j in snd})

    def n_pairs(self) -> int:
        return sum(len(p) for p in self.pairs.values())
