"""The privacy audit of symmetric NMF across agents (:func:`~.agents.fit_symnmf_agents`;
docs/THREAT_MODEL.md, "Symmetric NMF across agents").

What crosses an edge is agent ``i``'s copy ``U_i (n, r)`` of the whole factor, through the
library's exchange, in PPDNMF's X-step; ``X_i = X[:, S_i]`` and ``V_i`` stay with the agent.
The audit records a run through a recording exchange
(:func:`ppdnmf_torch.audit.make_recording_exchange`: ``quantized`` is bit-identical to
``paillier``, and the sums are the same under every protocol) and runs the library's attacks on
it, unchanged:

* the eavesdropper: ``plain`` (:func:`~ppdnmf_torch.audit.eavesdropper_plain`, reads every
  ``U_j``) and ``paillier`` (:func:`~.audit_report.paillier_scan`: the transcript scan for every
  plaintext and seed of a real run);
* the curious neighbour on the messages of each protocol view
  (:func:`~ppdnmf_torch.audit.neighbour_audit`: ``paper``, ``aggregated``, ``masked``);
* the sums attacks (:func:`~ppdnmf_torch.audit.sums_audit`: integer decomposition at degree 2,
  LLL at degree >= 3 with python-flint) and :func:`~ppdnmf_torch.audit.schedule_audit`.

What is particular to this model is what a recovered ``U_j`` gives: :func:`column_errors`
reconstructs the block of agent ``j``'s columns ``X[R, S_j]`` that the attacker ``i`` does not
hold (``R`` = the rows outside ``S_i``: the rows ``S_i`` of ``X_j`` are ``i``'s own columns
transposed, ``X`` being symmetric) from an estimate of ``U_j``, and compares it with the same
reconstruction from ``i``'s own copy ``U_i`` at the same call (the consensus is the run's
output) and with a reconstruction from ``i``'s data alone (Nystrom's). The first message is
special: with the common start (``start="common"``) everything in its local solve (eq. 9) but
``X_j`` and ``rho_j`` is public (``U_0``, ``V_j = U_0[S_j]``, zero duals), so :func:`first_call_errors` inverts it (an exact ``U_j^(1)`` gives
``X_j V_j`` for a public ``V_j``, then NNLS per row), :func:`eavesdropper_first_call` does so for
the ``plain`` eavesdropper (``rho_j`` from the penalties on the wire), and
:func:`first_call_sum_errors` inverts the *sum* of a receiver's neighbours' first messages,
which is what it learns under equal weights. These three assume ``V_j = U_0[S_j]``; under the
default private start (:func:`~.agents.private_start`) ``V_j`` is agent ``j``'s secret and they
are run with that public guess, which is what the before/after of docs/THREAT_MODEL.md measures;
:func:`private_start_gram` measures what the ``plain`` eavesdropper still gets then (the Gram
``V_j^T V_j`` and ``X_j V_j`` from two consecutive messages). :func:`degree2_recoveries` lists the calls the
degree-2 sums attack recovers exactly; :mod:`.audit_report` runs the estimators over calls and
pairs (:func:`~.audit_report.reconstruction_audit`) and assembles the report
(:func:`~.audit_report.run_symnmf_audit`, :func:`~.audit_report.paillier_scan`).
The attacker is assumed to know the node sets ``S_j`` (who holds which node; metadata, like
the graph).
"""
from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import torch

from ...audit.recording import Recording, as_recording, make_recording_exchange
from ...audit.attacks import attack_degree2
from ...errors import ConfigError, DegreeOneWarning
from .agent_setup import private_start
from .agents import AgentsResult, fit_symnmf_agents
from .config import ADAPTIVE_LAMBDA0

__all__ = ["SETTINGS", "EQUAL_WEIGHT_SETTINGS", "record_symnmf_agents", "column_errors", "first_call_errors",
           "eavesdropper_first_call", "first_call_sum_errors", "private_start_gram", "first_call_gram_errors",
           "gram_audit", "true_starts", "degree2_recoveries", "median_of", "NYSTROM_RCOND"]

#: the solver settings audited: ``agreed`` (the model's default: one common random draw per ADMM
#: iteration on every edge under the one fixed cap, so every receiver's weights are equal),
#: ``paper`` (equal caps ``g_cap``, random monotone draws per directed edge,
#: ``penalties.PenaltySampler``) and ``equal`` (``paper`` with ``fixed`` draws: every
#: ``g_{i->j} = g_cap``, equal weights at every call)
SETTINGS = {"agreed": {"penalty_schedule": "agreed", "penalty_mode": "random"},
            "paper": {"penalty_schedule": "paper", "penalty_mode": "random"},
            "equal": {"penalty_schedule": "paper", "penalty_mode": "fixed"}}
#: the settings whose receivers' weights are equal at every call: the first messages' sum is inverted
EQUAL_WEIGHT_SETTINGS = ("agreed", "equal")
#: relative cut-off of the pseudo-inverse in the Nystrom baseline
NYSTROM_RCOND = 1e-3


def record_symnmf_agents(X, rank: int, graph, *, kind: str = "quantized", protocol: str = "masked",
                         n_max: float = 1e6, g_bits: int = 16, key_bits: int = 128, keypairs=None,
                         paillier_options=None, **fit_kwargs) -> tuple[Recording, AgentsResult]:
    """Run :func:`~.agents.fit_symnmf_agents` (one trial) through a recording exchange.

    Parameters
    ----------
    X : array-like or Tensor (n, n)
        The similarity matrix.
    rank : int
    graph : Graph
        The agents' graph (``n_agents`` is taken from it).
    kind : {"plain", "quantized", "paillier"}
    protocol : {"masked", "aggregated", "paper"}
        The integer kinds' message pattern (the recorded integers are the same under each).
    n_max, g_bits, key_bits, keypairs, paillier_options
        The codec and the Paillier exchange (:func:`~ppdnmf_torch.audit.make_recording_exchange`).
    **fit_kwargs
        Any other keyword of :func:`~.agents.fit_symnmf_agents` (``U0``, ``max_iter``,
        ``x_iters``, ``penalty_mode``, ``g_cap``, ...), except ``trials`` (one).

    Returns
    -------
    (Recording, AgentsResult)
        ``Recording.U (calls, N, n r)`` holds every ``U_i`` (row-major ``n x r``) that went into
        the exchange; ``nmse`` is the run's last ``E``, ``consensus`` its last consensus error.
    """
    if int(fit_kwargs.get("trials", 1)) != 1:
        raise ConfigError("trials: the audit records one trial")
    exch = make_recording_exchange(kind, protocol=protocol, n_max=n_max, g_bits=g_bits, key_bits=key_bits,
                                   keypairs=keypairs, paillier_options=paillier_options)
    fit_kwargs.setdefault("device", "cpu")
    # the agents' private starts from a known stream (start_seed = seed unless given), so that the
    # audit's scoring knows the truth (true_starts); no attack reads it
    fit_kwargs.setdefault("start_seed", int(fit_kwargs.get("seed", 0)))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegreeOneWarning)  # the audit flags these agents itself
            res = fit_symnmf_agents(X, rank, n_agents=graph.n_agents, graph=graph, exchange=exch, **fit_kwargs)
        # fit_symnmf_agents' costs carry no wire messages: a Paillier exchange keeps them itself
        costs = dict(res.costs, transcript=list(getattr(exch, "transcript", None) or []))
        summary = SimpleNamespace(costs=costs, nmse=float(res.history["E"][-1][0]),
                                  consensus=float(res.history["consensus"][-1][0]))
        rec = as_recording(exch, graph, kind, protocol, n_max, g_bits, summary)
    finally:
        exch.close()
    return rec, res


# --------------------------------------------------------------------------- what U_j gives
def _own_nodes(parts: torch.Tensor, n: int) -> list:
    """``S_i`` per agent from ``parts (N, m)`` padded with ``n``."""
    return [p[p < n].cpu().numpy() for p in parts]


def _estimates(X: np.ndarray, R: np.ndarray, Si: np.ndarray, Sj: np.ndarray, U: np.ndarray) -> tuple:
    """``(sym, ls)`` estimates of ``X[R, S_j]`` from a factor ``U (n, r)``: ``U[R] U[S_j]^T``
    (``V_j ~ U_j[S_j]`` at a solution of the split problem) and ``U[R] V^T`` with ``V`` fitted by
    least squares to the block the attacker holds, ``X[S_i, S_j] ~ U[S_i] V^T``; both clipped at 0
    (a similarity is nonnegative)."""
    sym = np.maximum(U[R] @ U[Sj].T, 0.0)
    Vt, *_ = np.linalg.lstsq(U[Si], X[np.ix_(Si, Sj)], rcond=None)
    return sym, np.maximum(U[R] @ Vt, 0.0)


def _rel(est: np.ndarray, target: np.ndarray) -> float:
    return float(np.linalg.norm(est - target) / max(np.linalg.norm(target), 1e-300))


def _precision(est: np.ndarray, target: np.ndarray) -> float:
    """Per column with ``k > 0`` true neighbours (nonzero entries of ``target``), the fraction of
    them among the estimate's ``k`` largest entries; the mean over those columns (NaN if none)."""
    vals = []
    order = np.argsort(-est, axis=0, kind="stable")
    for c in range(target.shape[1]):
        true = np.flatnonzero(target[:, c] > 0)
        if true.size:
            vals.append(np.isin(order[: true.size, c], true).mean())
    return float(np.mean(vals)) if vals else float("nan")


def column_errors(X, parts, i: int, j: int, U_hat, U_own) -> dict:
    """What an estimate of ``U_j`` gives attacker ``i`` about agent ``j``'s columns.

    Parameters
    ----------
    X : ndarray or Tensor (n, n)
        The similarity matrix (the truth: ``i`` holds ``X[:, S_i]`` only).
    parts : LongTensor (N, m)
        ``S_i`` per agent, padded with ``n`` (``AgentsResult.parts[0]``).
    i, j : int
        Attacker and target.
    U_hat, U_own : ndarray (n, r)
        The estimate of ``U_j`` and the attacker's own copy ``U_i`` at the same call.

    Returns
    -------
    dict
        Relative Frobenius errors on the unknown block ``X[R, S_j]`` (``R``: the rows outside
        ``S_i``): ``attack_sym``, ``attack_ls`` (from ``U_hat``, see :func:`_errors`),
        ``own_sym``, ``own_ls`` (the same from ``U_own``), ``nystrom`` (``i``'s data alone:
        ``X[R, S_i] X[S_i, S_i]^+ X[S_i, S_j]``, pseudo-inverse cut at :data:`NYSTROM_RCOND`; the
        zero guess has error 1); and, for ``attack_sym``, ``own_sym`` and ``nystrom``, ``*_prec``:
        how many of each column's true neighbours (nonzero similarities) in ``R`` are among the
        estimate's largest entries (:func:`_precision`), next to ``chance_prec`` (the density of
        the block: a random guess's expected precision).
    """
    X = X.detach().cpu().numpy() if isinstance(X, torch.Tensor) else np.asarray(X, dtype=np.float64)
    n = X.shape[0]
    S = _own_nodes(torch.as_tensor(parts), n)
    Si, Sj = S[i], S[j]
    R = np.setdiff1d(np.arange(n), Si)
    target = X[np.ix_(R, Sj)]
    W = np.linalg.pinv(X[np.ix_(Si, Si)], rcond=NYSTROM_RCOND, hermitian=True)
    ests = {"nystrom": np.maximum(X[np.ix_(R, Si)] @ W @ X[np.ix_(Si, Sj)], 0.0)}
    ests["attack_sym"], ests["attack_ls"] = _estimates(X, R, Si, Sj, np.asarray(U_hat, dtype=np.float64))
    ests["own_sym"], ests["own_ls"] = _estimates(X, R, Si, Sj, np.asarray(U_own, dtype=np.float64))
    out = {k: _rel(v, target) for k, v in ests.items()}
    for k in ("attack_sym", "own_sym", "nystrom"):
        out[f"{k}_prec"] = _precision(ests[k], target)
    out["chance_prec"] = float((target > 0).sum() / target.size)
    return out


def _as_array(A) -> np.ndarray:
    return A.detach().cpu().numpy() if isinstance(A, torch.Tensor) else np.asarray(A, dtype=np.float64)


def _first_solve(U1: np.ndarray, U0: np.ndarray, Sj: np.ndarray, lam0: float, mu) -> tuple:
    """``(V_j, base, D)`` of the first local solve: ``X_j V_j = base + rho_j D`` row by row
    (:func:`first_call_errors`), with ``V_j = U_0[S_j]`` and ``D = U_j^(1) - U_0``."""
    n, r = U1.shape
    V = U0[Sj]
    m = float((V * V).sum() / r + lam0) if mu == "auto" else float(mu)
    shift = np.full((n, 1), m)
    shift[Sj] += lam0
    D = U1 - U0
    return V, U1 @ (V.T @ V) + shift * D, D


def _nnls_rows(V: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Per row ``b`` of ``B``, the nonnegative least-squares ``x`` of ``V^T x = b``."""
    from scipy.optimize import nnls

    return np.stack([nnls(V.T, b)[0] for b in B])


def first_call_errors(X, parts, i: int, j: int, U1_hat, U0, *, lam0: float = ADAPTIVE_LAMBDA0, mu="auto") -> dict:
    """Agent ``j``'s unknown columns ``X[R, S_j]`` from its *first* message ``U_j^(1)`` by inverting
    the local solve (eq. 9) of the first ADMM iteration, where everything but ``X_j`` and ``rho_j``
    is public: ``P = Q = Q_prev = 0``, the common start ``U_0`` (every copy starts there),
    ``V_j = U_0[S_j]``, ``lambda = lam0``, ``mu`` (``"auto"``: ``||V_j||^2 / r + lambda``). Row ``l``:

        (X_j V_j)[l] = U_j^(1)[l] V_j^T V_j + (mu + rho_j + lambda [l in S_j]) (U_j^(1)[l] - U_0[l])

    ``rho_j`` (one unknown scalar) is fitted by least squares on the rows ``S_i``, where the
    attacker holds ``X[S_i, S_j]``; then every unknown row is the nonnegative least-squares
    solution (``scipy.optimize.nnls``) of ``V_j^T x = (X_j V_j)[l]``: ``r`` equations in ``|S_j|``
    unknowns, which a sparse nonnegative row (a kNN similarity) can satisfy exactly.

    Returns ``{"first": relative error, "first_prec": neighbour precision, "rho_hat": the fitted
    rho_j}`` (see :func:`column_errors`).
    """
    X, U0, U1 = _as_array(X), _as_array(U0), np.asarray(U1_hat, dtype=np.float64)
    n = U1.shape[0]
    S = _own_nodes(torch.as_tensor(parts), n)
    Si, Sj = S[i], S[j]
    R = np.setdiff1d(np.arange(n), Si)
    V, base, D = _first_solve(U1, U0, Sj, lam0, mu)
    res = X[np.ix_(Si, Sj)] @ V - base[Si]
    rho = float((res * D[Si]).sum() / max((D[Si] * D[Si]).sum(), 1e-300))
    est = _nnls_rows(V, (base + rho * D)[R])
    target = X[np.ix_(R, Sj)]
    return {"first": _rel(est, target), "first_prec": _precision(est, target), "rho_hat": rho}


def eavesdropper_first_call(rec: Recording, X, parts, rank: int, U0, *, lam0: float = ADAPTIVE_LAMBDA0,
                            mu="auto") -> dict:
    """The ``plain`` eavesdropper against every agent's whole columns ``X[:, S_j]``: the wire carries
    each ``U_j^(1)`` and each penalty ``g_{j->k}``, hence ``rho_j = sum_k g_jk g_kj`` (no fit), and
    every row of ``X_j`` is solved as in :func:`first_call_errors`.

    Returns ``{"agents": [{"agent", "error", "precision"}], "error_max", "precision_min"}``.
    """
    if rec.kind != "plain":
        raise ConfigError("eavesdropper_first_call: needs a recording of exchange='plain'")
    X, U0 = _as_array(X), _as_array(U0)
    n = X.shape[0]
    S = _own_nodes(torch.as_tensor(parts), n)
    first = int(np.flatnonzero((rec.bcd == 1) & (rec.admm == 1))[0])
    g = rec.g[first]
    rho = np.zeros(rec.n_agents)
    np.add.at(rho, rec.src, g * g[rec.rev])
    U1 = rec.U[first].reshape(rec.n_agents, n, rank)
    agents = []
    for j in range(rec.n_agents):
        V, base, D = _first_solve(U1[j], U0, S[j], lam0, mu)
        est = _nnls_rows(V, base + rho[j] * D)
        target = X[:, S[j]]
        agents.append({"agent": j, "error": _rel(est, target), "precision": _precision(est, target)})
    return {"agents": agents, "error_max": max(a["error"] for a in agents),
            "precision_min": min(a["precision"] for a in agents)}


def _symmetric_basis(r: int) -> list:
    """The ``r (r + 1) / 2`` unit symmetric matrices ``E_ab = E_ba = 1``: the unknowns of a Gram matrix."""
    basis = []
    for a in range(r):
        for b in range(a, r):
            E = np.zeros((r, r))
            E[a, b] = E[b, a] = 1.0
            basis.append(E)
    return basis


def private_start_gram(rec: Recording, X, parts, rank: int, U0, V0, *, lam0: float = ADAPTIVE_LAMBDA0) -> dict:
    """What the ``plain`` eavesdropper gets from each agent's first two messages under the private
    start, where ``V_j`` is secret but ``U_0`` is public: the first two local solves (eq. 9) of
    outer iteration 1 share ``G_j = V_j^T V_j`` and ``F_j = X_j V_j + lambda E_j^T V_j``; their
    difference,

        (U^(2) - U^(1)) G + (tr G / r) [(U^(2) - U^(1)) - (Xc^(2) - P^(1) - U_0)] = K,

    ``Xc^(2) = (2 U^(1) - U_0)_+``, ``P^(1) = U^(1) - U_0``, ``K`` from ``U_0``, the messages, the
    penalties on the wire and ``Q^(1) = sum_k w_jk (U_k^(1) - U_j^(1))`` (``mu = "auto"``), is linear in the
    ``r (r + 1) / 2`` entries of ``G``: solved by least squares over the ``n r`` equations, then
    ``F`` from the first solve.

    Parameters
    ----------
    V0 : ndarray or Tensor (N, m, r)
        The agents' true private starts (padded; the truth to compare with, unknown to the attacker).

    Returns
    -------
    dict
        ``gram_error_max``, ``xv_error_max``: the worst relative errors over the agents of the
        recovered ``G_j`` and ``F_j``; ``agents``: per agent (with ``G_hat``).
    """
    if rec.kind != "plain":
        raise ConfigError("private_start_gram: needs a recording of exchange='plain'")
    X, U0, V0 = _as_array(X), _as_array(U0), _as_array(V0)
    n, r = U0.shape
    S = _own_nodes(torch.as_tensor(parts), n)
    c1, c2 = (int(np.flatnonzero((rec.bcd == 1) & (rec.admm == a))[0]) for a in (1, 2))
    U = rec.U.reshape(rec.n_calls, rec.n_agents, n, r)
    rho = np.zeros((2, rec.n_agents))
    Q1 = np.zeros((rec.n_agents, n, r))
    for a, c in enumerate((c1, c2)):
        w = rec.g[c] * rec.g[c][rec.rev]
        np.add.at(rho[a], rec.src, w)
    w1 = rec.g[c1] * rec.g[c1][rec.rev]
    np.add.at(Q1, rec.src, w1[:, None, None] * (U[c1][rec.dst] - U[c1][rec.src]))
    basis = _symmetric_basis(r)
    agents = []
    for j in range(rec.n_agents):
        U1, U2 = U[c1, j], U[c2, j]
        ins = np.zeros((n, 1))
        ins[S[j]] = 1.0
        dU, P1 = U2 - U1, U1 - U0
        W = np.maximum(2 * U1 - U0, 0.0) - P1 - U0
        K = (-lam0 * dU - lam0 * ins * dU - rho[1, j] * U2 + rho[0, j] * U1 + lam0 * W + rho[1, j] * U1
             - rho[0, j] * U0 + 2 * Q1[j])
        A = np.stack([(dU @ E + np.trace(E) / r * (dU - W)).ravel() for E in basis], axis=1)
        coef, *_ = np.linalg.lstsq(A, K.ravel(), rcond=None)
        G = sum(c * E for c, E in zip(coef, basis))
        mu = np.trace(G) / r + lam0
        F = U1 @ G + (mu + lam0 * ins + rho[0, j]) * U1 - (mu + rho[0, j]) * U0
        V = V0[j][: len(S[j])]
        F_true = X[:, S[j]] @ V
        F_true[S[j]] += lam0 * V
        agents.append({"agent": j, "gram_error": _rel(G, V.T @ V), "xv_error": _rel(F, F_true), "G_hat": G})
    return {"agents": agents, "gram_error_max": max(a["gram_error"] for a in agents),
            "xv_error_max": max(a["xv_error"] for a in agents)}


def first_call_gram_errors(X, parts, i: int, j: int, U1_hat, U0, rho: float, *,
                           lam0: float = ADAPTIVE_LAMBDA0, G=None) -> dict:
    """Attacker ``i`` against agent ``j``'s private start from ``j``'s exact first message
    ``U_j^(1)`` (a ``plain`` eavesdropper's view, or a degree-1 receiver's under any protocol),
    knowing ``U_0``, ``lambda``, ``rho_j`` (public under equal weights: ``deg_j g^2``) and its own
    columns. Row ``l`` of the first local solve (eq. 9) is
    ``U_j^(1)[l] G + c_l D[l] = X[l, S_j] V_j`` with ``G = V_j^T V_j``, ``D = U_j^(1) - U_0``,
    ``c_l = tr(G) / r + lambda + rho_j + lambda [l in S_j]``; on the rows ``l`` of ``S_i`` where
    ``i`` holds ``X[l, S_j] = 0`` the right side vanishes, which is linear in ``G`` (``r`` equations
    per such row; they pin ``G`` once the rows ``U_j^(1)[l]`` span ``R^r``, so at least ``r`` rows).
    ``G``: the Gram known already (an eavesdropping agent: :func:`private_start_gram`), no fit. Then ``F = X_j V_j (+ lambda E_j^T V_j)`` for every
    row, ``V_j`` by least squares from ``X[S_i, S_j] V_j = F[S_i]`` (minimum norm: the block is
    rarely of full rank) and every unknown row by NNLS of ``V_j^T x = F[l]``, as
    :func:`first_call_errors`.

    Returns
    -------
    dict
        ``zero_rows`` (the rows of equations), ``gram_solvable`` (at least ``r`` of them, or ``G``
        given), ``G_hat`` (the estimate of ``G``, for the caller to compare with the truth),
        ``gram_first`` and ``gram_first_prec`` (the columns' error and neighbour precision, as
        :func:`first_call_errors`).
    """
    X, U0, U1 = _as_array(X), _as_array(U0), np.asarray(U1_hat, dtype=np.float64)
    n, r = U1.shape
    given = G is not None
    S = _own_nodes(torch.as_tensor(parts), n)
    Si, Sj = S[i], S[j]
    R = np.setdiff1d(np.arange(n), Si)
    D = U1 - U0
    Z = Si[(X[np.ix_(Si, Sj)] == 0).all(axis=1)]
    basis = _symmetric_basis(r)
    if G is None:
        A = np.stack([(U1[Z] @ E + np.trace(E) / r * D[Z]).ravel() for E in basis], axis=1)
        coef, *_ = np.linalg.lstsq(A, (-(lam0 + rho) * D[Z]).ravel(), rcond=None)
        G = sum(c * E for c, E in zip(coef, basis))
    else:
        G = np.asarray(G, dtype=np.float64)
    c = np.full((n, 1), np.trace(G) / r + lam0 + rho)
    c[Sj] += lam0
    F = U1 @ G + c * D
    V, *_ = np.linalg.lstsq(X[np.ix_(Si, Sj)], F[Si], rcond=None)
    est = _nnls_rows(V, F[R])
    target = X[np.ix_(R, Sj)]
    return {"zero_rows": int(len(Z)), "gram_solvable": bool(len(Z) >= r or given), "G_hat": G,
            "gram_first": _rel(est, target), "gram_first_prec": _precision(est, target)}


def true_starts(U0, parts, start: str, seed: int) -> torch.Tensor:
    """The agents' true ``V_j`` at the start, ``(N, m, r)`` padded with zero rows: the run's
    :func:`~.agents.private_start` (``start="private"``, ``seed`` the run's ``start_seed``,
    which :func:`record_symnmf_agents` fixes) or ``U_0[S_j]``
    (``"common"``). The audit's truth, never the attacker's."""
    U0, parts = torch.as_tensor(U0), torch.as_tensor(parts)
    if start == "private":
        return private_start(U0[None], parts[None], [int(seed)])[0]
    pad = torch.cat([U0, U0.new_zeros(1, U0.shape[1])])
    return pad[parts]


def gram_audit(rec: Recording, X, parts, rank: int, U0, V0, *, lam0: float = ADAPTIVE_LAMBDA0) -> dict:
    """The attacks on a private start from exact messages (a ``plain`` recording; ``mu = "auto"``):
    :func:`private_start_gram` (the eavesdropper, two messages) and :func:`first_call_gram_errors`
    for every directed edge ``(i, j)`` (the first message alone, ``rho_j`` from the wire).

    Returns
    -------
    dict
        ``eavesdropper``: ``gram_error_max``, ``xv_error_max``; ``pairs`` (``G_j`` from the zero
        rows) and ``pairs_known_gram`` (``G_j`` from :func:`private_start_gram`: an agent that also
        eavesdrops): ``pairs``, ``solvable`` (at least ``r`` zero rows), ``gram_exact``
        (``G_j`` within 1e-6 relative), medians of ``zero_rows``, ``gram_error``, ``gram_first``,
        ``gram_first_prec`` and ``chance``.
    """
    X, U0, V0 = _as_array(X), _as_array(U0), _as_array(V0)
    n = X.shape[0]
    S = _own_nodes(torch.as_tensor(parts), n)
    ev = private_start_gram(rec, X, parts, rank, U0, V0, lam0=lam0)
    first = int(np.flatnonzero((rec.bcd == 1) & (rec.admm == 1))[0])
    g = rec.g[first]
    rho = np.zeros(rec.n_agents)
    np.add.at(rho, rec.src, g * g[rec.rev])
    U1 = rec.U[first].reshape(rec.n_agents, n, rank)
    out = {"eavesdropper": {k: ev[k] for k in ("gram_error_max", "xv_error_max")}}
    for key, known in (("pairs", False), ("pairs_known_gram", True)):
        rows = []
        for i, j in zip(rec.src.tolist(), rec.dst.tolist()):
            e = first_call_gram_errors(X, parts, i, j, U1[j], U0, float(rho[j]), lam0=lam0,
                                       G=ev["agents"][j]["G_hat"] if known else None)
            V = V0[j][: len(S[j])]
            R = np.setdiff1d(np.arange(n), S[i])
            target = X[np.ix_(R, S[j])]
            rows.append({"zero_rows": e["zero_rows"], "solvable": e["gram_solvable"],
                         "gram_error": _rel(e["G_hat"], V.T @ V), "gram_first": e["gram_first"],
                         "gram_first_prec": e["gram_first_prec"], "chance": float((target > 0).sum() / target.size)})
        out[key] = {"pairs": len(rows), "solvable": sum(r["solvable"] for r in rows),
                    "gram_exact": sum(r["gram_error"] < 1e-6 for r in rows),
                    **{k: median_of(rows, k) for k in ("zero_rows", "gram_error", "gram_first", "gram_first_prec",
                                                      "chance")}}
    return out


def first_call_sum_errors(rec: Recording, X, parts, rank: int, U0, *, lam0: float = ADAPTIVE_LAMBDA0,
                          mu="auto") -> dict:
    """Equal weights (one common draw ``g`` on every edge: ``penalty_mode="fixed"``, or an agreed
    schedule): each receiver ``i`` of degree ``k >= 2`` learns the sum of its neighbours' first
    messages, ``sum_j q_j^(1)`` (``A_i / w``), and every ``rho_j = deg_j g^2`` from its own draw
    ``g`` and the graph. Row ``l`` of the
    first local solve is ``U_j^(1)[l] = (X[l, S_j] V_j + c_jl U_0[l]) (V_j^T V_j + c_jl I)^-1``,
    ``c_jl = mu_j + rho_j + lambda [l in S_j]`` (:func:`first_call_errors`), so the sum is linear in
    the unknown rows ``X[l, S_j]`` of all ``k`` neighbours together: ``r`` equations in
    ``sum_j |S_j|`` nonnegative unknowns per row, solved by NNLS for every row outside ``S_i``.

    Returns
    -------
    dict
        ``by_degree``: per receiver degree (str), the medians over (receiver, neighbour) pairs of
        the relative error and the neighbour precision on ``X[R, S_j]`` (``error``,
        ``precision``), next to ``chance`` (the blocks' density), and ``pairs``.
    """
    rec.need_ints()
    X, U0 = _as_array(X), _as_array(U0)
    n = X.shape[0]
    S = _own_nodes(torch.as_tensor(parts), n)
    first = int(np.flatnonzero((rec.bcd == 1) & (rec.admm == 1))[0])
    q = rec.q[first].reshape(rec.n_agents, n, rank)
    deg = rec.degree
    rows: dict = {}
    for i in range(rec.n_agents):
        nbrs = rec.dst[rec.src == i].tolist()
        if len(nbrs) < 2:
            continue
        s_hat = q[nbrs].sum(0) / rec.n_max
        g_own = float(rec.g[first, np.flatnonzero(rec.src == i)[0]])  # the common draw, as i holds it
        R = np.setdiff1d(np.arange(n), S[i])
        blocks, offsets, const = [], [0], np.zeros((n, rank))
        for j in nbrs:
            V = U0[S[j]]
            G = V.T @ V
            m = float((V * V).sum() / rank + lam0) if mu == "auto" else float(mu)
            c = np.full(n, m + deg[j] * g_own ** 2)
            c[S[j]] += lam0
            A = np.linalg.inv(G[None] + c[:, None, None] * np.eye(rank))  # (n, r, r)
            blocks.append(np.einsum("mr,lrs->lms", V, A))  # row l: V_j A_jl, (n, m_j, r)
            const += np.einsum("lr,lrs->ls", c[:, None] * U0, A)
            offsets.append(offsets[-1] + len(S[j]))
        M = np.concatenate(blocks, axis=1)  # (n, sum m_j, r)
        B = s_hat - const
        from scipy.optimize import nnls

        est = np.stack([nnls(M[l].T, B[l])[0] for l in R])
        for a, j in enumerate(nbrs):
            target = X[np.ix_(R, S[j])]
            e = est[:, offsets[a]:offsets[a + 1]]
            rows.setdefault(str(len(nbrs)), []).append(
                {"error": _rel(e, target), "precision": _precision(e, target),
                 "chance": float((target > 0).sum() / target.size)})
    return {"by_degree": {d: {"pairs": len(v), **{k: median_of(v, k) for k in ("error", "precision", "chance")}}
                          for d, v in sorted(rows.items(), key=lambda kv: int(kv[0]))}}


def degree2_recoveries(rec: Recording, *, x_max: int, max_calls: int | None = None,
                       unequal_only: bool = False) -> tuple[list, int]:
    """The calls at which a degree-2 receiver's sums attack
    (:func:`~ppdnmf_torch.audit.attack_degree2`) recovers both neighbours' exact ``q_j``.

    The informative calls attacked per receiver: those with unequal weights
    ``gamma_ij gamma_ji`` (``unequal_only``; with equal weights the sums give ``w`` and
    ``q_1 + q_2`` only), else ``max_calls`` evenly spread ones, as
    :func:`~ppdnmf_torch.audit.sums_audit` chooses them (None: all).

    Returns
    -------
    (list, int)
        ``(call, receiver, neighbours, certified)`` per exact call, and the calls attacked.
    """
    rec.need_ints()
    S_all, rho_all = rec.S_int, rec.rho_int
    out, tried = [], 0
    for i in range(rec.n_agents):
        edges = np.flatnonzero(rec.src == i)
        if len(edges) != 2:
            continue
        nbrs = rec.dst[edges]
        d_true = rec.q[:, nbrs] - rec.q[:, i][:, None]
        info = np.flatnonzero((d_true != 0).any(axis=(1, 2)))
        if unequal_only:
            w = rec.w[:, edges]
            info = info[w[info, 0] != w[info, 1]]
        elif max_calls is not None and info.size > max_calls:
            info = info[np.unique(np.linspace(0, info.size - 1, max_calls).round().astype(np.int64))]
        tried += int(info.size)
        for t in info:
            res = attack_degree2(rec.gamma[t, edges].tolist(), int(rho_all[t, i]), S_all[t, i].tolist(), x_max)
            if res["d"] is not None and np.array_equal(np.array(res["d"], dtype=np.int64), d_true[t]):
                out.append((int(t), int(i), [int(v) for v in nbrs], bool(res["certified"])))
    return out, tried


def median_of(rows: list, key: str):
    """The median of ``key`` over the rows that have it (None: none has)."""
    vals = [r[key] for r in rows if key in r]
    return float(np.median(vals)) if vals else None
