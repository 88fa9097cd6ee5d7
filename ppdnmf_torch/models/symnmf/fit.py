"""The functional entry point: :func:`fit_symnmf`, every method batched over trials."""
from __future__ import annotations

import numbers
import time
import warnings

import numpy as np
import torch

from ... import budget
from ...errors import ConfigError, ConvergenceWarning, DataError
from . import checkpoint as ckpt
from .data import initial_factor
from .objective import inner, metrics
from .operator import as_similarity
from .penalty import PenaltyRule, initial_lambda, next_lambda, parse_penalty
from .result import HISTORY_KEYS, SymNMFIteration, SymNMFResult
from .symhals import SymHALS

__all__ = ["fit_symnmf", "METHODS", "make_method", "DEFAULT_PENALTY"]

#: every method name; ``kuang`` is SymANLS under Kuang et al.'s 1.01 schedule
METHODS = ("symhals", "a_symhals", "symanls", "kuang", "pgd", "admm", "beta", "tsvd")
#: each method's penalty when none is given
DEFAULT_PENALTY = {"symhals": "adaptive", "a_symhals": "adaptive", "symanls": "adaptive", "kuang": "kuang",
                   "admm": "bound", "pgd": None, "beta": None, "tsvd": None}


def make_method(method: str, options: dict | None = None):
    """The solver object of ``method`` with its ``options`` (keyword arguments of its class)."""
    options = dict(options or {})
    if method not in METHODS:
        raise ConfigError(f"method: unknown method {method!r}; use one of {METHODS}")
    try:
        if method == "symhals":
            return SymHALS(**options)
        if method == "a_symhals":
            return SymHALS(**{"inner_max": 10, **options})
        if method in ("symanls", "kuang"):
            from .symanls import SymANLS

            return SymANLS(name=method, **options)
        from . import baselines

        return {"pgd": baselines.PGD, "admm": baselines.ADMM, "beta": baselines.BetaSNMF,
                "tsvd": baselines.TSVD}[method](**options)
    except TypeError as exc:
        raise ConfigError(f"method_options: {exc}") from exc


def _start(U0, sim, rank, T, seed, device, dtype):
    n = sim.n
    if U0 is None:
        return initial_factor(n, rank, trials=T, seed=seed, device=device, dtype=dtype)
    U0 = torch.as_tensor(np.asarray(U0) if not isinstance(U0, torch.Tensor) else U0)
    U0 = U0.detach().to(device, dtype)
    if U0.dim() == 2:
        U0 = U0.unsqueeze(0).expand(T, -1, -1)
    if tuple(U0.shape) != (T, n, rank):
        raise DataError(f"U0: expected shape ({n}, {rank}) or ({T}, {n}, {rank}), got {tuple(U0.shape)}")
    if not bool(torch.isfinite(U0).all()) or bool((U0 < 0).any()):
        raise DataError("U0: must be finite and nonnegative")
    if bool((U0.abs().sum(dim=(-2, -1)) == 0).any()):
        raise DataError("U0: a trial's start is all zero (the updates would stay at zero)")
    return U0.contiguous().clone()


def _check_int(name, v, low):
    if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
        raise ConfigError(f"{name}: must be an integer >= {low}, got {v!r}")
    return int(v)


def fit_symnmf(X, rank, *, method="symhals", penalty=None, lam0=None, U0=None, trials=1, seed=0, max_iter=500,
               tol=1e-6, device="auto", dtype=None, callback=None, checkpoint_dir=None, checkpoint_every=0,
               resume=False, method_options=None) -> SymNMFResult:
    """Symmetric NMF ``X ~ U U^T`` by the splitting (3) or a baseline, batched over trials.

    Parameters
    ----------
    X : array_like, torch.Tensor, scipy.sparse matrix or torch sparse tensor
        ``(n, n)`` symmetric nonnegative similarity (dense or sparse CSR/COO), or ``(T, n, n)``
        dense, one per trial.
    rank : int
        ``r``.
    method : {"symhals", "a_symhals", "symanls", "kuang", "pgd", "admm", "beta", "tsvd"}
        SymHALS (Alg. 2, eq. (17)), A-SymHALS (Alg. 3), SymANLS (Alg. 1), SymANLS under Kuang
        et al.'s schedule, projected gradient descent on (2), the ADMM of Lu, Hong and Wang,
        beta-SNMF's multiplicative updates (beta = 1/2), tSVD (Huang et al.: ``max(0, B Q)``
        from the truncated eigendecomposition ``X ~ B B^T``, ``Q`` orthogonal).
    penalty : {"adaptive", "bound", "kuang", "fixed"} or float or sequence of float, optional
        ``lambda``: the adaptive rule (20), the theorem's bound, Kuang's 1.01 schedule, or
        fixed values (one, or one per trial: a hyperparameter batched over trials). Default:
        ``"adaptive"`` for the three split methods, ``"kuang"`` for ``kuang``, ``"bound"``
        for ``admm`` (its ``rho``); ``pgd``, ``beta`` and ``tsvd`` take none.
    lam0 : float, optional
        ``lambda_0`` of ``"adaptive"`` (default 1e-5) or ``"kuang"`` (default ``max X^2``).
    U0 : array_like, optional
        ``(n, r)`` or ``(T, n, r)``; default i.i.d. uniform on ``[0, 1]`` per trial from
        ``seed``. ``V_0 = U_0``.
    trials : int
        ``T`` (taken from a ``(T, n, n)`` ``X`` or a ``(T, n, r)`` ``U0`` when given).
    seed : int
    max_iter : int
        Outer iterations.
    tol : float
        A trial stops (and is frozen) once ``||W_k - W_{k-1}||_F <= tol ||W_k||_F`` with
        ``W = (U, V)``; the run ends when every trial has. 0: run ``max_iter`` iterations.
    device : {"auto", "cpu", "cuda"}
        ``"auto"`` follows a torch ``X``, else CUDA when there is one.
    dtype : torch.dtype or str, optional
        Default: ``X``'s float dtype (float64 otherwise).
    callback : callable, optional
        ``callback(SymNMFIteration)`` after each iteration; returning True stops the run.
    checkpoint_dir : path, optional
        Where checkpoints go (every ``checkpoint_every`` iterations and at the end).
    checkpoint_every : int
        0: only at the end.
    resume : bool
        Continue from the latest checkpoint in ``checkpoint_dir`` when there is one (the
        same ``X``, start, method, penalty, options and ``tol``; ``max_iter`` may differ).
        The iterates continue bit for bit.
    method_options : dict, optional
        The method's own options (A-SymHALS: ``inner_max``, ``delta``; ADMM: ``prox``;
        PGD: ``step0``, ``armijo``, ``max_backtracks``; SymANLS: ``max_pivot_iter``).

    Returns
    -------
    SymNMFResult
        ``U``, ``V`` ``(T, n, r)``, ``lam``, the histories, ``n_iter``, ``converged``.

    Warns
    -----
    ConvergenceWarning
        ``tol > 0`` and a trial did not meet it in ``max_iter`` iterations.
    """
    rank = _check_int("rank", rank, 1)
    max_iter = _check_int("max_iter", max_iter, 0)
    checkpoint_every = _check_int("checkpoint_every", checkpoint_every, 0)
    if not isinstance(tol, numbers.Real) or not tol >= 0:
        raise ConfigError(f"tol: must be a number >= 0, got {tol!r}")
    if callback is not None and not callable(callback):
        raise ConfigError("callback: must be callable")
    if resume and checkpoint_dir is None:
        raise ConfigError("resume: needs a checkpoint_dir to resume from")
    meth = make_method(method, method_options)
    sim = as_similarity(X, device=device, dtype=dtype)
    dev, dt = sim.device, sim.dtype
    T = _check_int("trials", trials, 1)
    if sim.batched:
        if trials not in (1, sim.trials):
            raise ConfigError(f"trials: {trials}, but X holds {sim.trials} matrices (one per trial)")
        T = sim.trials
    elif U0 is not None and getattr(U0, "ndim", 2) == 3 and trials == 1:
        T = int(U0.shape[0])
    budget.check(budget.symnmf(n=sim.n, rank=rank, trials=T, nnz=int(sim.data.values().numel()) if sim.sparse else None,
                               max_iter=max_iter, dtype=dt, device=dev, similarity_copies=0, key_n="X"))
    if rank > sim.n:
        raise ConfigError(f"rank: {rank} exceeds n = {sim.n}")
    U0 = _start(U0, sim, rank, T, seed, dev, dt)
    if penalty is None:
        penalty = DEFAULT_PENALTY[method]
    if not meth.split and penalty is not None:
        raise ConfigError(f"penalty: method {method!r} has no split penalty; leave penalty unset")
    if method == "admm" and penalty in ("adaptive", "kuang"):
        raise ConfigError("penalty: the ADMM takes a fixed rho: a number, a number per trial, or 'bound'")
    rule = PenaltyRule("none") if penalty is None else parse_penalty(penalty, T, lam0=lam0)
    # the fingerprint hashes X's content: only when there are checkpoints to write or read
    fp = (ckpt.digest(sim.digest(), U0, meth.name, meth.options(), rule.describe(), float(tol))
          if checkpoint_dir is not None else None)

    state = meth.init_state(sim, U0)
    prods = _products(sim, state)
    lam = initial_lambda(rule, sim, U0, U0, prods["XV"])
    sqX = sim.sq_norm_per_trial(T)
    active = torch.ones(T, dtype=torch.bool, device=dev)
    n_iter = torch.zeros(T, dtype=torch.int64, device=dev)
    converged = torch.zeros(T, dtype=torch.bool, device=dev)
    history = {key: [] for key in HISTORY_KEYS}
    k, elapsed = 0, 0.0

    def record(m, now):
        for key in HISTORY_KEYS[:-1]:
            history[key].append(m[key].detach().to("cpu", torch.float64))
        history["time"].append(torch.full((T,), now, dtype=torch.float64))

    path = ckpt.latest(checkpoint_dir) if (resume and checkpoint_dir is not None) else None
    if path is not None:
        body = ckpt.load(path, fp)
        state = {name: body["state"][name].to(dev) for name in meth.state_names}
        lam, active = body["lam"].to(dev), body["active"].to(dev)
        n_iter, converged = body["n_iter"].to(dev), body["converged"].to(dev)
        history = {key: list(body["history"][key]) for key in HISTORY_KEYS}
        k, elapsed = int(body["k"]), float(body["elapsed"])
        prods = _products(sim, state)
    else:
        record(metrics(sqX, state["U"], _v(state), prods["XU"], prods["XV"], lam), 0.0)

    def save():
        ckpt.save(checkpoint_dir, {
            "k": k, "fingerprint": fp, "state": {n: t.detach().cpu() for n, t in state.items()},
            "lam": lam.cpu(), "active": active.cpu(), "n_iter": n_iter.cpu(), "converged": converged.cpu(),
            "history": history, "elapsed": elapsed})

    t0 = time.perf_counter() - elapsed
    stopped = False
    while k < max_iter and bool(active.any()) and not stopped:
        new, new_prods = meth.step(sim, state, prods, lam)
        if not bool(active.all()):  # frozen trials keep their iterate bit for bit
            a3 = active[:, None, None]
            new = {n: torch.where(a3, new[n], state[n]) for n in new}
            new_prods = {n: torch.where(a3, new_prods[n], prods[n]) for n in new_prods}
        W_prev = state
        state, prods = new, new_prods
        k += 1
        n_iter = n_iter + active.to(torch.int64)
        m = metrics(sqX, state["U"], _v(state), prods["XU"], prods["XV"], lam)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - t0
        record(m, elapsed)
        if not all(bool(torch.isfinite(m[key]).all()) for key in ("E", "objective")):
            raise DataError(f"X: the iterates of {meth.name} became non-finite at iteration {k} "
                            f"(penalty {rule.describe()}); check the scale of X")
        lam = torch.where(active, next_lambda(rule, lam, state["U"], _v(state)), lam)
        if tol > 0:
            change = sum(inner(state[n] - W_prev[n], state[n] - W_prev[n]) for n in ("U", "V") if n in state)
            size = sum(inner(state[n], state[n]) for n in ("U", "V") if n in state)
            done = active & (change <= (tol * tol) * size)
            converged = converged | done
            active = active & ~done
        if callback is not None:
            info = SymNMFIteration(k, max_iter, {key: history[key][-1] for key in HISTORY_KEYS},
                                   state["U"], _v(state), active.clone())
            stopped = bool(callback(info))
        if checkpoint_dir is not None and checkpoint_every and k % checkpoint_every == 0:
            save()
    if checkpoint_dir is not None and (path is None or k > int(body["k"])) and not (
            checkpoint_every and k % checkpoint_every == 0 and k > 0):
        save()
    if tol > 0 and not stopped and bool(active.any()):
        warnings.warn(f"{meth.name}: {int(active.sum())} of {T} trials did not reach tol={tol} in "
                      f"{max_iter} iterations", ConvergenceWarning, stacklevel=2)
    hist = {key: torch.stack(vals) for key, vals in history.items()}
    return SymNMFResult(U=state["U"], V=_v(state), lam=lam, history=hist, n_iter=n_iter.cpu(),
                        converged=converged.cpu(), wall_time=elapsed, method=meth.name, penalty=rule.kind,
                        options=meth.options())


def _products(sim, state):
    """``{"XU": X U, "XV": X V}`` of a state (one product when there is no ``V``)."""
    XU = sim.matmul(state["U"])
    return {"XU": XU, "XV": sim.matmul(state["V"]) if "V" in state else XU}


def _v(state):
    return state["V"] if "V" in state else state["U"]
