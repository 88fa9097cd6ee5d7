"""The torch plan's run: :class:`CentralRun`, a centralized symmetric-NMF method as the driver's
:class:`~ppdnmf_torch.driver.LoopModel` (its state and products torch tensors on ``X``'s device)."""
from __future__ import annotations

import torch

from ...checkpoint import digest
from ...driver import LoopModel
from ...errors import DataError
from .objective import metrics, stationarity
from .penalty import PenaltyRule, initial_lambda, next_lambda
from .result import HISTORY_KEYS, SymNMFIteration

__all__ = ["CentralRun"]


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

    def final(self):
        """``(U, V, lambda, n_iter, converged)`` of the run, as the result holds them."""
        return self.W["U"], _v(self.W), self.lam, self.n_iter.cpu(), self.conv.cpu()

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
