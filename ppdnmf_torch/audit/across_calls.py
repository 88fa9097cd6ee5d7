"""The adversary across calls (issue 38, "Private across calls"): a receiver that differences its
sums from one exchange call to the next.

Under the agreed schedule agent ``i`` obtains, per call ``t``, ``s_i(t) = sum_{j in N_i} q_j(t)`` and
nothing else (``exchange="secagg"``; ``masked`` gives ``w`` times it, ``w`` known to ``i``). One call
hides every neighbour behind the others. Across calls it need not: when every neighbour of ``i`` but
one, ``j``, keeps its value from call ``t - 1`` to call ``t`` (frozen by the stopping rule, whose flags
``i`` sees, or constant for another reason), then

    s_i(t) - s_i(t - 1) = q_j(t) - q_j(t - 1),

``j``'s exact increment. :func:`difference_attack` is that adversary on a recording: for every
receiver and neighbour it counts the calls at which ``j`` was the only neighbour of ``i`` whose value
changed (the attacker knows which: the others are frozen; the audit reads it off the recording) and
checks the increment it reads against ``j``'s true one, entry by entry. A receiver with a single
neighbour reads that neighbour's value itself (the inherent case, reported apart). The general
case, "any X-step in which exactly one neighbour's value varies", is the same count over all calls.
"""
from __future__ import annotations

import numpy as np

from .recording import Recording

__all__ = ["difference_attack", "neighbour_sums", "across_calls_flags", "md_across_calls"]


def neighbour_sums(rec: Recording) -> np.ndarray:
    """``s (T, N, P)``: every receiver's ``sum_{j in N_i} q_j`` at every call (what ``secagg`` gives it)."""
    rec.need_ints()
    s = np.zeros(rec.q.shape, dtype=np.int64)
    np.add.at(s, (slice(None), rec.src), rec.q[:, rec.dst])
    return s


def difference_attack(rec: Recording, sums: np.ndarray | None = None) -> dict:
    """The receivers' increments read from the differences of their sums (module docstring).

    Parameters
    ----------
    rec : Recording
        An integer recording (``quantized``, ``paillier`` or ``secagg``: the same integers).
    sums : ndarray (T, N, P), optional
        The sums the receivers obtained (e.g. unmasked from a ``secagg`` transcript); default
        :func:`neighbour_sums` of the recording.

    Returns
    -------
    dict
        ``pairs``: per directed edge ``receiver -> target`` with ``degree`` (the receiver's),
        ``increments`` (calls at which the target's value changed), ``isolated`` (of those, calls at
        which it was the receiver's only neighbour to change) and ``exact`` (isolated calls whose
        increment the receiver read exactly, every entry); ``summary``: the totals over receivers of
        degree >= 2 (``increments``, ``exact``, ``pairs_with_exact``, ``receivers_with_exact``,
        ``pairs``), the same per degree (``by_degree``), and ``degree1`` (the inherent case).
    """
    s = neighbour_sums(rec) if sums is None else np.asarray(sums)
    q = rec.q
    if q.shape[0] < 2:
        return {"pairs": [], "summary": _summary([])}
    moved = (np.diff(q, axis=0) != 0).any(-1)  # (T - 1, N): the agent's value changed into call t
    ds = np.diff(s, axis=0)
    dq = np.diff(q, axis=0)
    deg = rec.degree
    nbrs = {i: rec.dst[rec.src == i] for i in range(rec.n_agents)}
    pairs = []
    for i, j in zip(rec.src.tolist(), rec.dst.tolist()):
        others = [k for k in nbrs[i].tolist() if k != j]
        alone = moved[:, j] & ~(moved[:, others].any(1) if others else np.zeros(len(moved), dtype=bool))
        exact = alone & np.all(ds[:, i] == dq[:, j], axis=-1)
        pairs.append({"receiver": i, "target": j, "degree": int(deg[i]), "increments": int(moved[:, j].sum()),
                      "isolated": int(alone.sum()), "exact": int(exact.sum())})
    return {"pairs": pairs, "summary": _summary(pairs)}


def _summary(pairs: list) -> dict:
    def total(sel):
        return {"pairs": len(sel), "increments": sum(p["increments"] for p in sel),
                "isolated": sum(p["isolated"] for p in sel), "exact": sum(p["exact"] for p in sel),
                "pairs_with_exact": sum(1 for p in sel if p["exact"]),
                "receivers_with_exact": len({p["receiver"] for p in sel if p["exact"]})}

    multi = [p for p in pairs if p["degree"] >= 2]
    out = total(multi)
    out["by_degree"] = {str(d): total([p for p in multi if p["degree"] == d])
                        for d in sorted({p["degree"] for p in multi})}
    out["degree1"] = total([p for p in pairs if p["degree"] == 1])
    return out


def across_calls_flags(sname: str, summary: dict, protocol: str = "any") -> list:
    """A flag when receivers of degree >= 2 read exact increments of a neighbour across calls."""
    if not summary or not summary.get("exact"):
        return []
    return [{"scenario": sname, "protocol": protocol, "agent": None, "view": "sums_only",
             "flag": "sums_differenced_across_calls_give_increments", "neighbours": [], "inherent": False,
             "count": summary["exact"], "receivers": summary["receivers_with_exact"]}]


def md_across_calls(summary: dict, where: str) -> list:
    """A Markdown paragraph of :func:`difference_attack`'s summary."""
    if not summary:
        return []
    d1 = summary["degree1"]
    per = ", ".join(f"degree {d}: {b['exact']} of {b['increments']}" for d, b in summary["by_degree"].items())
    return [f"A receiver that differences its sums across calls ({where}): of the {summary['increments']} "
            f"increments of neighbours of receivers of degree >= 2, {summary['isolated']} came while every other "
            f"neighbour of the receiver kept its value, and {summary['exact']} were read exactly "
            f"({summary['pairs_with_exact']} of {summary['pairs']} (receiver, neighbour) pairs, "
            f"{summary['receivers_with_exact']} receivers; {per}); degree 1 (inherent): {d1['exact']} of "
            f"{d1['increments']}.", ""]
