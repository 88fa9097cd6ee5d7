"""The receiver's two sums under attack: integer decomposition (degree 2) and lattice
reduction (degree >= 3) of ``rho_int_i`` and ``S_int_i`` (docs/THREAT_MODEL.md, "What the
sums reveal").

Agent ``i`` of degree ``k`` decrypts (any protocol that gives it the sums the algorithm
needs, ``masked`` included)

* ``rho_int_i = sum_j a_j x_j`` and
* ``S_int_i = sum_j a_j x_j d_j`` (a vector of ``P = L K`` entries),

with ``a_j = gamma_ij`` its own integer penalty draws (known to it), ``x_j = gamma_ji`` its
neighbours' (unknown, in the public range ``1 <= x_j <= x_max``, :func:`public_x_max`) and
``d_j = q_j - q_i`` the unknown differences of quantized values. The attacks use nothing
else: ``a``, ``q_i``, the two sums and the public codec parameters.

* :func:`attack_degree2`: ``rho = a_1 x_1 + a_2 x_2`` is a linear Diophantine equation
  whose solutions in the public range are few (:func:`diophantine2`); for each candidate
  ``(x_1, x_2)`` (weights ``w_j = a_j x_j``, ``g = gcd(w_1, w_2)``) every entry ``S_p =
  w_1 d_1 + w_2 d_2`` fixes ``d_1`` modulo ``w_2 / g`` and ``d_2`` modulo ``w_1 / g``
  (Chinese remainder theorem); the smallest split (in max-norm) of each entry is taken, and
  the candidate whose largest entry is smallest wins. Near consensus the differences are
  small against the *window* ``max(w_1, w_2) / g`` and the smallest split is the true one.
* :func:`attack_lattice` (degree >= 3; python-flint's ``fmpz_mat.lll``, the ``audit``
  extra): the vector ``S' = (S, rho) = sum_j w_j (d_j, 1)`` is a combination of ``k`` short
  hidden vectors with large coefficients. The orthogonal lattice of ``S'`` (LLL) has
  ``P + 1 - k`` short vectors orthogonal to every ``(d_j, 1)``; the orthogonal lattice of
  those (LLL again) is spanned by the hidden vectors (Nguyen and Stern's attack on the
  hidden subset-sum problem). Short combinations of that basis with last entry 1 are the
  candidate ``(d_j, 1)``; a set of ``k`` of them whose coefficients ``w`` are integers
  divisible by ``a_j`` with ``w_j / a_j`` in range, assigned to neighbours, is a solution.

**Self-certification.** The attacker accepts a recovery (it cannot check it against the
truth) when the *window* exceeds :data:`WINDOW_MIN`, the recovered differences are below
:data:`D_FRACTION` of the window, and the runner-up (the next best candidate, or the
next best split of any entry) is at least :data:`RUNNER_UP` times worse
(:func:`certify`). For the lattice attack the window is ``prod_j a_j`` (a wrong weight
vector is divisible by every ``a_j`` with chance about its inverse), and a unique consistent
solution counts as an infinitely worse runner-up. The audit counts the accepted calls and
how many of them are wrong (false positives).

:mod:`.sums` runs them on a recording (:func:`~.sums.sums_audit`).
"""
from __future__ import annotations

import itertools
import math
from math import gcd

import numpy as np

from ..errors import ConfigError

__all__ = ["WINDOW_MIN", "D_FRACTION", "RUNNER_UP", "LATTICE_MAX_DEGREE", "diophantine2", "attack_degree2",
           "attack_lattice", "certify", "lattice_available"]

#: the attacker accepts a recovery only when the window (the period of the splits) exceeds this
WINDOW_MIN = 1e6
#: ... and every recovered difference is below this fraction of the window ...
D_FRACTION = 0.01
#: ... and the runner-up is at least this many times worse
RUNNER_UP = 100.0
#: the lattice attack runs on receivers up to this degree by default (it costs seconds per call
#: beyond: the candidate sets grow as ``C(LATTICE_POOL, k)``)
LATTICE_MAX_DEGREE = 6
#: assignments of one weight vector to neighbours tried at most (equal weights fit every one)
MAX_ASSIGNMENTS = 24
#: the lattice attack's candidate hidden vectors: combinations of the reduced basis with
#: coefficients in ``[-RADIUS, RADIUS]`` ...
LATTICE_RADIUS = 1
#: ... at most this many of the shortest
LATTICE_POOL = 16
#: the lattice attack reduces blocks of at most this many entries of ``S`` (plus ``rho``)
LATTICE_BLOCK = 24


def lattice_available() -> bool:
    """Whether python-flint (the ``audit`` extra) is installed."""
    try:
        import flint  # noqa: F401
    except ImportError:
        return False
    return True


def _need_flint():
    try:
        from flint import fmpz_mat
    except ImportError as exc:  # pragma: no cover - the extra is in dev
        raise ConfigError("the lattice attack needs python-flint: pip install 'ppdnmf_torch[audit]'") from exc
    return fmpz_mat


# --------------------------------------------------------------------------- degree 2
def diophantine2(a1: int, a2: int, rho: int, x_max: int) -> np.ndarray:
    """Every ``(x1, x2)`` with ``a1 x1 + a2 x2 = rho`` and ``1 <= x1, x2 <= x_max``, ``(C, 2)`` int64."""
    a1, a2, rho, x_max = int(a1), int(a2), int(rho), int(x_max)
    none = np.zeros((0, 2), dtype=np.int64)
    if a1 <= 0 or a2 <= 0 or rho <= 0:
        return none
    g = gcd(a1, a2)
    if rho % g:
        return none
    p, r = a2 // g, rho // g
    x0 = (r * pow(a1 // g, -1, p)) % p if p > 1 else 0  # x1 = x0 + k p, k >= 0 (x0 = 0 needs k >= 1)
    # x2 = (rho - a1 x1) / a2 >= 1  <=>  x1 <= (rho - a2) / a1
    hi = min(x_max, (rho - a2) // a1)
    lo = 1 if x0 == 0 else x0
    if hi < lo:
        return none
    x1 = np.arange(lo + (-lo) % p if x0 == 0 else lo, hi + 1, p, dtype=np.int64)
    x2 = (rho - a1 * x1) // a2
    keep = (x2 >= 1) & (x2 <= x_max) & (x1 >= 1)
    return np.stack([x1[keep], x2[keep]], axis=1)


def _split(S: list, w1: int, w2: int, bound=math.inf):
    """The smallest splits ``S_p = w1 d1 + w2 d2`` (max-norm) of every entry.

    Returns ``None`` when ``gcd(w1, w2)`` does not divide every entry or some entry's
    smallest split exceeds ``bound``, else ``(d1, d2, cost, second, window)``: the split, its
    largest entry, the cost of the best alternative (one entry moved to its second-best
    split) and the window ``max(w1, w2) / g``.
    """
    g = gcd(w1, w2)
    b, c = w2 // g, w1 // g
    inv = pow(c, -1, b) if b > 1 else 0
    d1s, d2s, best, second = [], [], 0, math.inf
    for s in S:
        if s % g:
            return None
        s //= g
        r = (s * inv) % b if b > 1 else 0  # d1 = r + k b, d2 = e - k c
        e = (s - c * r) // b
        # max(|r + k b|, |e - k c|) is convex in k: its real minimum is at a vertex of one
        # |.| or a crossing of the two, the integer minimum at the floor or ceiling of it
        kr, fr = 0.0, math.inf
        for v in (-r / b, e / c, (e - r) / (b + c), (-e - r) / (b - c) if b != c else 0.0):
            fv = max(abs(r + v * b), abs(e - v * c))
            if fv < fr:
                kr, fr = v, fv
        k0 = math.floor(kr)
        f0 = max(abs(r + k0 * b), abs(e - k0 * c))
        f1 = max(abs(r + (k0 + 1) * b), abs(e - (k0 + 1) * c))
        if f1 < f0:
            k0, f0, fs = k0 + 1, f1, max(abs(r + (k0 + 2) * b), abs(e - (k0 + 2) * c))
        else:
            fs = min(f1, max(abs(r + (k0 - 1) * b), abs(e - (k0 - 1) * c)))
        if f0 > bound:
            return None
        d1s.append(r + k0 * b)
        d2s.append(e - k0 * c)
        best = max(best, f0)
        second = min(second, fs)
    return d1s, d2s, best, max(best, second), max(b, c)


#: the degree-2 attack screens its candidates on this many entries of ``S`` (the largest)
SCREEN_ENTRIES = 4
#: ... keeps this many candidates after the first entry ...
SCREEN_KEEP = 32
#: ... and splits at most this many more in full (an attacker's budget per call)
SCREEN_FULL = 64


def _modinv(c: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``c^-1 mod m`` elementwise (int64, ``gcd(c, m) = 1``; 0 where ``m = 1``), extended Euclid."""
    r0, r1 = c % m, m.copy()
    s0, s1 = np.ones_like(c), np.zeros_like(c)
    while (r1 != 0).any():
        nz = r1 != 0
        q = np.where(nz, r0 // np.where(nz, r1, 1), 0)
        r0, r1 = np.where(nz, r1, r0), np.where(nz, r0 - q * r1, r1)
        s0, s1 = np.where(nz, s1, s0), np.where(nz, s0 - q * s1, s1)
    return np.where(m > 1, s0 % m, 0)


def _mulmod(x: np.ndarray, y: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x y mod m`` elementwise without int64 overflow (``0 <= x, y < m < 2^61``): Horner over
    chunks of ``y`` small enough that ``m 2^chunk < 2^62``."""
    bits = int(m.max()).bit_length() if m.size else 1
    L = max(1, 61 - bits)
    n_chunks = -(-bits // L)
    out = np.zeros_like(x)
    for c in range(n_chunks - 1, -1, -1):
        chunk = (y >> (c * L)) & ((1 << L) - 1)
        out = ((out << L) % m + x * chunk % m) % m
    return out


def _screen(S: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """A lower bound (float) of each candidate's cost from a few entries ``S (P',)`` int64:
    the largest smallest split over those entries, ``inf`` where ``gcd(w1, w2)`` does not
    divide them (candidates ``(C,)`` int64)."""
    g = np.gcd(w1, w2)
    b, c = w2 // g, w1 // g
    Sg = S[None, :]
    ok = (Sg % g[:, None] == 0).all(1)
    s = Sg // g[:, None]
    inv = _modinv(c, b)
    r = _mulmod(s % b[:, None], np.broadcast_to(inv[:, None], s.shape).copy(), np.broadcast_to(b[:, None], s.shape).copy())
    bf, cf = b[:, None].astype(np.float64), c[:, None].astype(np.float64)
    rf = r.astype(np.float64)
    e = s / bf - cf * (rf / bf)  # d2 at k = 0, in floats: only a bound is screened

    def f(k):
        return np.maximum(np.abs(rf + k * bf), np.abs(e - k * cf))

    with np.errstate(divide="ignore", invalid="ignore"):
        reals = [-rf / bf, e / cf, (e - rf) / (bf + cf), np.where(bf != cf, (-e - rf) / (bf - cf), -rf / bf)]
    kr = reals[0]
    fr = f(kr)
    for v in reals[1:]:
        fv = f(v)
        kr, fr = np.where(fv < fr, v, kr), np.minimum(fv, fr)
    best = np.minimum(f(np.floor(kr)), f(np.floor(kr) + 1))
    return np.where(ok, best.max(1), np.inf)


def attack_degree2(a, rho: int, S, x_max: int) -> dict:
    """The integer-decomposition attack of a degree-2 receiver (module docstring).

    Parameters
    ----------
    a : (2,) ints
        The receiver's own integer draws ``gamma_ij`` towards its two neighbours.
    rho : int
        ``rho_int_i``.
    S : (P,) ints
        ``S_int_i``.
    x_max : int
        Public bound of the neighbours' integer draws.

    Returns
    -------
    dict
        ``d`` ((2, P) list of ints, or None when no candidate is consistent), ``x`` (the
        chosen penalties), ``candidates`` (Diophantine solutions in range), ``evaluated``
        (consistent candidates split in full after the screening), ``cost``
        (largest ``|d|``), ``runner_up``, ``window`` and ``certified`` (:func:`certify`).
    """
    S = [int(s) for s in S]
    cands = diophantine2(int(a[0]), int(a[1]), int(rho), int(x_max))
    searched = True
    found, costs = [], []

    def evaluate(idx):
        x1, x2 = int(cands[idx, 0]), int(cands[idx, 1])
        # a candidate worse than the runner-up so far is neither the best nor the runner-up
        sp = _split(S, int(a[0]) * x1, int(a[1]) * x2, sorted(costs)[1] if len(costs) >= 2 else math.inf)
        if sp is not None:
            found.append((sp[2], (x1, x2), sp))
            costs.append(sp[2])

    if len(cands) <= 2 * SCREEN_KEEP:
        for idx in range(len(cands)):
            evaluate(idx)
    else:
        # branch and bound: a cost on some entries bounds the cost on all of them from below;
        # first the largest entry, then a few, then in full
        Sa = np.array(S, dtype=np.int64)
        top = np.argsort(-np.abs(Sa.astype(np.float64)), kind="stable")[:SCREEN_ENTRIES]
        lb = _screen(Sa[top[:1]], int(a[0]) * cands[:, 0], int(a[1]) * cands[:, 1])
        first = np.argsort(lb, kind="stable")[:SCREEN_KEEP]
        for idx in first.tolist():
            evaluate(idx)
        bound = sorted(costs)[1] if len(costs) >= 2 else np.inf
        rest = np.setdiff1d(np.flatnonzero(lb * (1 - 1e-9) - 2 <= bound), first)
        if rest.size:
            lb4 = _screen(Sa[top], int(a[0]) * cands[rest, 0], int(a[1]) * cands[rest, 1])
            rest = rest[np.argsort(lb4, kind="stable")]
            lb4 = np.sort(lb4, kind="stable")
            truncated = rest.size > SCREEN_FULL
            for idx, v in zip(rest[:SCREEN_FULL].tolist(), lb4[:SCREEN_FULL].tolist()):
                if math.isinf(v) or (len(costs) >= 2 and v * (1 - 1e-9) - 2 > sorted(costs)[1]):
                    truncated = False
                    break  # neither the best nor the runner-up can be among the rest
                evaluate(idx)
            if truncated:
                searched = False
    found.sort(key=lambda t: t[0])
    out = {"candidates": len(cands), "evaluated": len(found), "exhaustive": searched, "d": None, "x": None,
           "cost": None, "runner_up": None, "window": None, "certified": False}
    if not found:
        return out
    cost, x, (d1, d2, _, second, window) = found[0]
    runner = min(second, found[1][0]) if len(found) > 1 else second
    out.update(d=[d1, d2], x=list(x), cost=cost, runner_up=runner, window=window)
    out["certified"] = certify(cost, runner, window)
    return out


def certify(cost, runner_up, window) -> bool:
    """The attacker's acceptance rule: ``window > WINDOW_MIN``, ``cost < D_FRACTION window`` and
    ``runner_up >= RUNNER_UP cost`` (``cost`` the largest recovered ``|d|``)."""
    if cost is None or window is None:
        return False
    return bool(window > WINDOW_MIN and cost < D_FRACTION * window and runner_up >= RUNNER_UP * max(cost, 1))


# --------------------------------------------------------------------------- degree >= 3
def _orthogonal(rows: list, n: int, fmpz_mat, keep: int):
    """An LLL-reduced basis of ``{u in Z^n: u . r = 0 for every r in rows}``, its first ``keep``
    vectors, and the norms of all reduced vectors (Nguyen-Stern's embedding with a large
    weight on the constraint columns)."""
    m = len(rows)
    # the constraint columns outweigh any reduced vector that is not orthogonal (2^(n/2): LLL's factor)
    big = 1 << (n // 2 + 32)
    M = [[big * int(rows[c][p]) for c in range(m)] + [1 if q == p else 0 for q in range(n)] for p in range(n)]
    red = fmpz_mat(M).lll()
    vecs = [[int(red[r, c]) for c in range(m + n)] for r in range(n)]
    ortho = [v[m:] for v in vecs if all(x == 0 for x in v[:m])]
    norms = [math.sqrt(sum(x * x for x in v)) for v in ortho]
    return ortho[:keep], norms


def _solve_int(T: np.ndarray, c: list):
    """The integer ``w`` with ``T^T w = c`` (``T`` a small integer matrix), or None."""
    try:
        w = np.linalg.solve(T.T.astype(np.float64), np.asarray(c, dtype=np.float64))
    except np.linalg.LinAlgError:
        return None
    wi = [int(round(v)) for v in w]
    k = len(wi)
    if any(sum(int(T[j, l]) * wi[j] for j in range(k)) != int(c[l]) for l in range(k)):
        return None
    return wi


def _assignments(w: list, a: list, x_max: int):
    """The assignments (at most :data:`MAX_ASSIGNMENTS`) of the coefficients ``w`` to neighbours ``j``
    with ``a_j | w`` and ``1 <= w / a_j <= x_max``: lists ``perm`` with ``w[perm[j]]`` neighbour
    ``j``'s weight."""
    k = len(a)
    ok = [[(wv > 0 and wv % a[j] == 0 and 1 <= wv // a[j] <= x_max) for wv in w] for j in range(k)]
    out = []

    def rec(j, used, perm):
        if len(out) >= MAX_ASSIGNMENTS:
            return
        if j == k:
            out.append(list(perm))
            return
        for m in range(k):
            if m not in used and ok[j][m]:
                rec(j + 1, used | {m}, perm + [m])

    rec(0, frozenset(), [])
    return out


def attack_lattice(a, rho: int, S, x_max: int) -> dict:
    """The lattice attack of a receiver of degree ``k >= 2`` (module docstring), on blocks of at
    most :data:`LATTICE_BLOCK` entries of ``S`` (each with ``rho``; the reductions cost grows
    steeply with the dimension): a call is recovered when every block is, with the same
    penalties ``x``; it stops at the first block that fails.

    Parameters and returns as :func:`attack_degree2` (``d`` is ``(k, P)``), with ``gap``
    (:func:`_lattice_block`); ``candidates`` and ``consistent`` are the first block's.
    """
    S = [int(v) for v in S]
    if len(S) <= LATTICE_BLOCK:
        return _lattice_block(a, rho, S, x_max)
    parts = [S[o:o + LATTICE_BLOCK] for o in range(0, len(S), LATTICE_BLOCK)]
    if len(parts[-1]) < LATTICE_BLOCK // 2:  # keep every block well above the degree
        parts[-2:] = [parts[-2] + parts[-1]]
    res = None
    for part in parts:
        r = _lattice_block(a, rho, part, x_max)
        if res is None:
            res = r
        else:
            if r["d"] is None or r["x"] != res["x"]:
                res.update(d=None, certified=False)
            else:
                res["d"] = [u + v for u, v in zip(res["d"], r["d"])]
                res["cost"] = max(res["cost"], r["cost"])
                res["runner_up"] = min(res["runner_up"], r["runner_up"])
                res["gap"] = min(res["gap"], r["gap"])
                res["certified"] = res["certified"] and r["certified"]
        if res["d"] is None:
            res.update(x=None, cost=None, runner_up=None, certified=False)
            break
    return res


def _lattice_block(a, rho: int, S, x_max: int) -> dict:
    """The lattice attack on ``S`` (a block of entries) and ``rho``.

    Parameters and returns as :func:`attack_degree2` (``d`` is ``(k, P)``); ``window`` is
    ``prod_j a_j`` (a wrong weight vector passes the divisibility checks with chance about its
    inverse), ``gap`` the ratio of the ``(P + 2 - k)``-th to the ``(P + 1 - k)``-th vector of the
    first reduction (large when the hidden vectors are short against the weights).
    """
    fmpz_mat = _need_flint()
    a = [int(v) for v in a]
    k = len(a)
    Sp = [int(s) for s in S] + [int(rho)]
    n = len(Sp)
    out = {"candidates": 0, "consistent": 0, "d": None, "x": None, "cost": None, "runner_up": None,
           "window": None, "certified": False}
    if n - k < 1:
        return out
    U, norms = _orthogonal([Sp], n, fmpz_mat, n - k)
    if len(U) < n - k:
        return out
    gap = norms[n - k] / max(norms[n - k - 1], 1e-300) if len(norms) > n - k else math.inf
    B, _ = _orthogonal(U, n, fmpz_mat, k)
    if len(B) < k:
        return out
    Bm = np.array(B, dtype=object)
    # the coordinates of S' in the basis B (exact: S' lies in the lattice the d'_j span)
    c = _solve_rows(Bm, Sp)
    if c is None:
        return out
    pool = []
    for t in itertools.product(range(-LATTICE_RADIUS, LATTICE_RADIUS + 1), repeat=k):
        if not any(t):
            continue
        v = [sum(t[l] * B[l][p] for l in range(k)) for p in range(n)]
        if v[-1] == 1:
            pool.append((max(abs(x) for x in v[:-1]), t, v))
    pool.sort(key=lambda z: z[0])
    pool = pool[:LATTICE_POOL]
    sols = []
    subs = np.array(list(itertools.combinations(range(len(pool)), k)), dtype=np.int64).reshape(-1, k)
    if len(subs):
        coef = np.array([p[1] for p in pool], dtype=np.float64)  # (m, k)
        Ts = coef[subs]  # (C, k, k): row j = the coefficients of the j-th chosen vector
        with np.errstate(all="ignore"):
            ok = np.abs(np.linalg.det(Ts)) > 0.5  # unimodular up to sign, or at least invertible
            W = np.full((len(subs), k), np.nan)
            if ok.any():
                W[ok] = np.linalg.solve(np.transpose(Ts[ok], (0, 2, 1)),
                                        np.broadcast_to(np.asarray(c, dtype=np.float64), (int(ok.sum()), k))[..., None])[..., 0]
        near = ok & np.all(np.abs(W - np.round(W)) < 1e-6 + 1e-9 * np.abs(W), axis=1) & np.all(W > 0.5, axis=1)
        # every coefficient must be some a_j times a draw in range, for a matching of coefficients to neighbours
        Wr = np.where(near[:, None], np.round(W), 1.0)
        av = np.asarray(a, dtype=np.float64)
        fits = (np.fmod(Wr[:, :, None], av) == 0) & (Wr[:, :, None] >= av) & (Wr[:, :, None] <= av * x_max)
        near &= fits.any(2).all(1) & fits.any(1).all(1)
        for s_idx in np.flatnonzero(near):
            sub = subs[s_idx]
            w = _solve_int(np.array([pool[s][1] for s in sub], dtype=np.int64), c)
            if w is None or min(w) <= 0:
                continue
            out["candidates"] += 1
            for perm in _assignments(w, a, x_max):
                d = [pool[sub[perm[j]]][2][:-1] for j in range(k)]
                x = [w[perm[j]] // a[j] for j in range(k)]
                sols.append((max(abs(v) for row in d for v in row), x, d))
    sols.sort(key=lambda z: z[0])
    out["consistent"] = len(sols)
    if not sols:
        return out
    cost, x, d = sols[0]
    runner = sols[1][0] if len(sols) > 1 else math.inf
    # window: a wrong weight vector passes the divisibility by every a_j with chance about 1 / prod a_j
    window = math.prod(a)
    out.update(d=d, x=x, cost=cost, runner_up=runner, window=window, gap=gap)
    out["certified"] = certify(cost, runner, window)
    return out


def _solve_rows(B: np.ndarray, target: list):
    """Integer ``c`` with ``sum_l c_l B[l] = target`` (exact), or None."""
    k = B.shape[0]
    Bf = B.astype(np.float64)
    c, *_ = np.linalg.lstsq(Bf.T, np.asarray(target, dtype=np.float64), rcond=None)
    ci = [int(round(v)) for v in c]
    if any(sum(ci[l] * int(B[l, p]) for l in range(k)) != int(target[p]) for p in range(B.shape[1])):
        return None
    return ci
