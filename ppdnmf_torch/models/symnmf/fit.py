"""The functional entry point: :func:`fit_symnmf`, every method batched over trials."""
from __future__ import annotations

import numbers

import numpy as np
import torch

from ... import budget
from ..._utils import ARRAY, CALLBACK, OPTIONS
from ...checkpoint import digest
from ...driver import Checkpoints, LoopModel, check_checkpoint_args, drive
from ...errors import ConfigError, DataError
from ...specs import check_call
from .config import METHODS, RUN, SPEC
from .data import initial_factor
from .objective import metrics, stationarity
from .operator import as_similarity
from .penalty import PenaltyRule, initial_lambda, next_lambda, parse_penalty
from .result import HISTORY_KEYS, SymNMFIteration, SymNMFResult
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
               method_options=None) -> SymNMFResult:
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
               also={"U0": ARRAY, "callback": CALLBACK, "method_options": OPTIONS})
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
    run = CentralRun(sim, meth, rule, U0, tol=float(tol), max_iter=max_iter)
    plan = None if checkpoint_dir is None else Checkpoints(checkpoint_dir, every=checkpoint_every, resume=resume,
                                                             device=sim.device)
    out = drive(run, max_iter=max_iter, tol=float(tol), callback=callback, checkpoints=plan)
    hist = {key: torch.stack(vals) for key, vals in out.history.items()}
    return SymNMFResult(U=run.W["U"], V=_v(run.W), lam=run.lam, history=hist, n_iter=run.n_iter.cpu(),
                        converged=run.conv.cpu(), wall_time=out.elapsed, method=meth.name, penalty=rule.kind,
                        options=meth.options())


class CentralRun(LoopModel):
    """The driver's hooks of a centralized symmetric-NMF method (one solver step per iteration),
    batched over trials: a trial that meets ``tol`` is frozen (its iterate kept bit for bit)
    while the others go on; the history's row 0 is the start. A checkpoint holds the method's
    state ``W``, ``lambda``, the trials' flags and counts."""

    name = "symnmf"
    start_rows = 1
    fresh_state = False  # a method's step may reuse its tensors

    def __init__(self, sim, meth, rule: PenaltyRule, U0, *, tol: float, max_iter: int):
        self.sim, self.meth, self.rule, self.U0, self.tol, self.max_iter = sim, meth, rule, U0, tol, max_iter
        T, dev = U0.shape[0], sim.device
        self.W = meth.init_state(sim, U0)
        self.prods = _products(sim, self.W)
        self.lam = initial_lambda(rule, sim, U0, U0, self.prods["XV"])
        self.sqX = sim.sq_norm_per_trial(T)
        self.active = torch.ones(T, dtype=torch.bool, device=dev)
        self.n_iter = torch.zeros(T, dtype=torch.int64, device=dev)
        self.conv = torch.zeros(T, dtype=torch.bool, device=dev)

    def _row(self, now: float) -> dict:
        W, T = self.W, self.U0.shape[0]
        m = metrics(self.sqX, W["U"], _v(W), self.prods["XU"], self.prods["XV"], self.lam)
        # one copy to the host for every key (with few trials each call costs more than its data)
        vals = torch.stack([m[key] for key in HISTORY_KEYS[:-1]]).detach().to("cpu", torch.float64)
        row = dict(zip(HISTORY_KEYS[:-1], vals.unbind()))
        row["time"] = torch.full((T,), now, dtype=torch.float64)
        return row

    def start_row(self) -> dict:
        return self._row(0.0)

    def step(self, k: int, clock) -> dict:
        new, new_prods = self.meth.step(self.sim, self.W, self.prods, self.lam)
        active = self.active
        if not bool(active.all()):  # frozen trials keep their iterate bit for bit
            a3 = active[:, None, None]
            new = {n: torch.where(a3, new[n], self.W[n]) for n in new}
            new_prods = {n: torch.where(a3, new_prods[n], self.prods[n]) for n in new_prods}
        self.W, self.prods = new, new_prods
        self.n_iter = self.n_iter + active.to(torch.int64)
        if self.sim.device.type == "cuda":
            torch.cuda.synchronize(self.sim.device)
        row = self._row(clock())
        if not bool(torch.isfinite(torch.stack([row["E"], row["objective"]])).all()):
            raise DataError(f"X: the iterates of {self.meth.name} became non-finite at iteration {k} "
                            f"(penalty {self.rule.describe()}); check the scale of X")
        W = self.W
        self.lam = torch.where(active, next_lambda(self.rule, self.lam, W["U"], _v(W)), self.lam)
        if self.tol > 0:
            done = active & (stationarity(self.sqX, W["U"], self.prods["XU"]) <= self.tol)
            self.conv = self.conv | done
            self.active = active & ~done
        return row

    def converged(self, k: int, row: dict) -> bool:
        return not bool(self.active.any())

    def report(self, callback, k: int, row: dict, clock) -> bool:
        return bool(callback(SymNMFIteration(k, self.max_iter, row, self.W["U"], _v(self.W), self.active.clone())))

    def not_converged(self, k: int, tol: float) -> str:
        return (f"{self.meth.name}: {int(self.active.sum())} of {self.U0.shape[0]} trials did not reach tol={tol} in "
                f"{k} iterations")

    # -- what a checkpoint holds ----------------------------------------------------------
    def state(self) -> dict:
        out = {f"W_{name}": self.W[name] for name in self.meth.state_names}
        out.update(lam=self.lam, active=self.active, n_iter=self.n_iter, converged=self.conv)
        return out

    def load_state(self, tensors: dict, extra: dict) -> None:
        dev = self.sim.device
        self.W = {name: tensors[f"W_{name}"].to(dev) for name in self.meth.state_names}
        self.lam, self.active = tensors["lam"].to(dev), tensors["active"].to(dev)
        self.n_iter, self.conv = tensors["n_iter"].to(dev), tensors["converged"].to(dev)
        self.prods = _products(self.sim, self.W)

    def settings(self) -> dict:
        return {"method": self.meth.name, "options": _plain(self.meth.options()), "penalty": self.rule.describe(),
                "tol": self.tol, "dtype": str(self.U0.dtype)}

    def inputs(self) -> dict:
        return {"X": self.sim.digest(), "U0": digest(self.U0)}


def _plain(value):
    """A method's options as plain values (a checkpoint's settings)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return repr(value)


def _products(sim, state):
    """``{"XU": X U, "XV": X V}`` of a state (one product when there is no ``V``)."""
    XU = sim.matmul(state["U"])
    return {"XU": XU, "XV": sim.matmul(state["V"]) if "V" in state else XU}


def _v(state):
    return state["V"] if "V" in state else state["U"]
