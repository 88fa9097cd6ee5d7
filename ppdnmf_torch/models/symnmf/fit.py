"""The functional entry point: :func:`fit_symnmf`, every method batched over trials."""
from __future__ import annotations

import numbers

import numpy as np
import torch

from ... import budget
from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...driver import Checkpoints, check_checkpoint_args, drive
from ...errors import ConfigError, DataError
from ...specs import check_call
from .config import METHODS, RUN, SPEC
from .data import initial_factor
from .operator import as_similarity
from .penalty import PenaltyRule, parse_penalty
from .result import SymNMFResult
from .central import CentralRun
from .host import HostRun, choose_plan
from .symhals import SymHALS

__all__ = ["fit_symnmf", "METHODS", "make_method", "DEFAULT_PENALTY", "CentralRun"]

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


def fit_symnmf(X, rank, *, method=SPEC.method, penalty=SPEC.penalty, lam0=SPEC.lam0, U0=None, trials=RUN.trials,
               seed=RUN.seed, max_iter=SPEC.max_iter, tol=SPEC.tol, device="auto", dtype=None, callback=None,
               checkpoint_dir=None, checkpoint_every=RUN.checkpoint_every, resume=False,
               method_options=None, plan="auto") -> SymNMFResult:
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
        ``lambda_0`` of ``"adaptive"`` (default 1e-5) or ``"kuang"`` (default 1e-5, the paper's Fig. 3).
    U0 : array_like, optional
        ``(n, r)`` or ``(T, n, r)``; default i.i.d. uniform on ``[0, 1]`` per trial from
        ``seed``. ``V_0 = U_0``.
    trials : int
        ``T`` (taken from a ``(T, n, n)`` ``X`` or a ``(T, n, r)`` ``U0`` when given).
    seed : int
    max_iter : int
        Outer iterations.
    tol : float
        A trial stops (and is frozen) once the scaled projected-gradient residual of (2) at
        ``U``, ``||P[(U U^T - X) U]||_F / (||X||_F ||U||_F)``
        (:func:`~.objective.stationarity`), is ``<= tol``; the run ends when every trial has.
        0: run ``max_iter`` iterations.
    device : {"auto", "cpu", "cuda"}
        ``"auto"`` follows a torch ``X``, else CUDA when there is one.
    dtype : torch.dtype or str, optional
        Default: ``X``'s float dtype (float64 otherwise).
    callback : callable, optional
        ``callback(SymNMFIteration)`` after each iteration; returning True stops the run.
    checkpoint_dir : path, optional
        Where checkpoints go (the engine's format, :mod:`ppdnmf_torch.checkpoint`): every
        ``checkpoint_every`` iterations, at the end and on Ctrl-C (then
        :class:`~ppdnmf_torch.driver.RunInterrupted`); the newest two are kept. The folder is
        locked: a second run into it is refused, as is a fresh run into another run's checkpoints.
    checkpoint_every : int
        0: only at the end.
    resume : bool
        Continue from the newest checkpoint in ``checkpoint_dir`` when there is one (the
        same ``X``, start, method, penalty, options and ``tol``: a change is refused by name;
        ``max_iter`` may differ). The iterates continue bit for bit.
    method_options : dict, optional
        The method's own options (A-SymHALS: ``inner_max``, ``delta``; ADMM: ``prox``;
        PGD: ``step0``, ``armijo``, ``max_backtracks``; SymANLS: ``max_pivot_iter``).
    plan : {"auto", "torch", "host"}
        How the iterations run, chosen once for the fit (:func:`~.host.choose_plan`): ``"torch"``
        on tensors on ``X``'s device; ``"host"`` (SymHALS, A-SymHALS, SymANLS and ``kuang`` on
        the CPU) on NumPy views of the same memory, faster on the CPU (docs/PERFORMANCE.md); the
        same numbers up to rounding. ``"auto"`` (default): the host plan for those methods on
        the CPU, the torch plan otherwise. The result's ``plan`` says which ran.

    Returns
    -------
    SymNMFResult
        ``U``, ``V`` ``(T, n, r)``, ``lam``, the histories, ``n_iter``, ``converged``.

    Warns
    -----
    ConvergenceWarning
        ``tol > 0`` and a trial did not meet it in ``max_iter`` iterations.
    """
    # every keyword's type and rule at once (max_iter may be 0 here: the start's evaluation)
    check_call(locals(), SPEC, RUN, skip=("max_iter", "checkpoint_every"), arrays=("penalty",),
               also={"U0": ARRAY, "callback": CALLBACK, "method_options": OPTIONS, "plan": str})
    rank = _check_int("rank", rank, 1)
    max_iter = _check_int("max_iter", max_iter, 0)
    if not isinstance(tol, numbers.Real) or not tol >= 0:
        raise ConfigError(f"tol: must be a number >= 0, got {tol!r}")
    if callback is not None and not callable(callback):
        raise ConfigError("callback: must be callable")
    check_checkpoint_args(checkpoint_dir, checkpoint_every, resume)
    meth = make_method(method, method_options)
    sim = as_similarity(X, device=device, dtype=dtype)
    T = _check_int("trials", trials, 1)
    if sim.batched:
        if trials not in (1, sim.trials):
            raise ConfigError(f"trials: {trials}, but X holds {sim.trials} matrices (one per trial)")
        T = sim.trials
    elif U0 is not None and getattr(U0, "ndim", 2) == 3 and trials == 1:
        T = int(U0.shape[0])
    budget.check(budget.symnmf(n=sim.n, rank=rank, trials=T, nnz=int(sim.data.values().numel()) if sim.sparse else None,
                               max_iter=max_iter, dtype=sim.dtype, device=sim.device, similarity_copies=0, key_n="X"))
    if rank > sim.n:
        raise ConfigError(f"rank: {rank} exceeds n = {sim.n}")
    U0 = _start(U0, sim, rank, T, seed, sim.device, sim.dtype)
    if penalty is None:
        penalty = DEFAULT_PENALTY[method]
    if not meth.split and penalty is not None:
        raise ConfigError(f"penalty: method {method!r} has no split penalty; leave penalty unset")
    if method == "admm" and penalty in ("adaptive", "kuang"):
        raise ConfigError("penalty: the ADMM takes a fixed rho: a number, a number per trial, or 'bound'")
    rule = PenaltyRule("none") if penalty is None else parse_penalty(penalty, T, lam0=lam0)
    chosen = choose_plan(plan, sim, meth.name)
    run = (HostRun if chosen == "host" else CentralRun)(sim, meth, rule, U0, tol=float(tol), max_iter=max_iter)
    plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                             device=sim.device)
    out = drive(run, max_iter=max_iter, tol=float(tol), callback=callback, checkpoints=plan)
    hist = {key: torch.stack(vals) for key, vals in out.history.items()}
    U, V, lam, n_iter, conv = run.final()
    return SymNMFResult(U=U, V=V, lam=lam, history=hist, n_iter=n_iter, converged=conv, wall_time=out.elapsed,
                        method=meth.name, penalty=rule.kind, options=meth.options(), plan=chosen)
