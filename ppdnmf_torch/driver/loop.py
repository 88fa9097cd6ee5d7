"""The run driver: one iteration loop for every model (:func:`drive`).

A model plugs in its hooks (:class:`~.model.LoopModel`); the driver runs iterations until the
cap, the model's stopping test or the callback ends the run, records the history, writes
checkpoints on schedule, at the end and on Ctrl-C (the last completed iteration's, then
:class:`RunInterrupted`), resumes from them (:class:`~.checkpoints.Checkpoints`), carries the
cost ledgers across a resume (:class:`~.ledgers.Ledgers`), agrees with the other ranks on every
decision (:class:`~.ranks.RankCoordinator`) and warns
:class:`~ppdnmf_torch.errors.ConvergenceWarning` when ``tol > 0`` and the cap came first.

Per iteration ``k``, in this order: the model's step (its history row), its stopping test, the
checkpoint when one is due, the callback, the ranks' agreement; then the loop ends when the run
converged or was stopped.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

from .._utils import caller_stacklevel
from ..errors import ConvergenceWarning
from .checkpoints import Start
from .history import History
from .ledgers import Ledgers

__all__ = ["drive", "Outcome", "RunInterrupted", "Clock", "GoodPoint"]


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run: a checkpoint of the last completed iteration was written.

    Attributes
    ----------
    checkpoint : str or None
        Path of the checkpoint written (None when the run had no checkpoint folder).
    done : int
        The iterations completed.
    step_name : str
        What an iteration is called (``"BCD iteration"``, ...).
    """

    def __init__(self, checkpoint, done: int, step_name: str = "iteration"):
        super().__init__(f"interrupted after {step_name} {done}; checkpoint: {checkpoint}")
        self.checkpoint = checkpoint
        self.done = done
        self.step_name = step_name


class Clock:
    """Seconds since the run started, a resumed run's earlier segments (``offset``) included."""

    def __init__(self, offset: float = 0.0):
        self.offset = float(offset)
        self._t0 = time.perf_counter()

    def __call__(self) -> float:
        return self.offset + (time.perf_counter() - self._t0)


@dataclass
class GoodPoint:
    """The last completed iteration: what a checkpoint (on schedule, at the end, on Ctrl-C) holds."""

    done: int
    history: History
    state: dict = field(default_factory=dict)
    rng: object = None
    lengths: dict = field(default_factory=dict)
    ledgers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    elapsed: float = 0.0
    converged: bool = False


@dataclass
class Outcome:
    """How a run ended.

    Attributes
    ----------
    done : int
        Iterations completed, a resumed run's earlier ones included.
    converged, stopped : bool
        Whether the stopping test or the callback ended it.
    history : History
    elapsed : float
        Seconds on the run's clock (resumed segments included).
    start : int
        The iterations done before this process (a resumed run's checkpoint).
    resumed_from : str or None
        The checkpoint continued.
    """

    done: int
    converged: bool
    stopped: bool
    history: History
    elapsed: float
    start: int = 0
    resumed_from: str | None = None


def _good_point(model, done, history, ledgers, clock, converged, keep: bool) -> GoodPoint:
    if not keep:
        return GoodPoint(done, history)
    state = model.state()
    if not model.fresh_state:  # the model writes into these tensors later: copy them now
        state = {k: v.clone() for k, v in state.items()}
    return GoodPoint(done, history, state, model.rng_state(), history.lengths(), ledgers.state(), model.extra(),
                     clock(), converged)


def drive(model, *, max_iter: int, tol: float = 0.0, callback=None, checkpoints=None, ledgers: Ledgers | None = None,
          ranks=None) -> Outcome:
    """Run ``model``'s iterations up to ``max_iter`` (see the module).

    Parameters
    ----------
    model : LoopModel
        Its state is the start (or is restored from ``checkpoints``).
    max_iter : int
        The iteration cap, resumed iterations included.
    tol : float
        The run's tolerance (the model's stopping test holds its own): with ``tol > 0`` a run that
        reaches ``max_iter`` unconverged warns :class:`~ppdnmf_torch.errors.ConvergenceWarning`.
    callback : callable, optional
        Handed to :meth:`LoopModel.report` after every iteration; a true return value stops
        the run after that iteration.
    checkpoints : Checkpoints, optional
    ledgers : Ledgers, optional
        The cost counters a checkpoint holds and a resume continues.
    ranks : RankCoordinator, optional
        On a rank of a run over ranks.

    Returns
    -------
    Outcome
    """
    ledgers = ledgers if ledgers is not None else Ledgers()
    start = checkpoints.open(model, ledgers, cap=max_iter, ranks=ranks) if checkpoints is not None else Start()
    try:
        out = _loop(model, start, max_iter, tol, callback, checkpoints, ledgers, ranks)
    finally:
        if checkpoints is not None:
            checkpoints.close()
    if tol > 0 and not out.converged and out.done >= max_iter:
        warnings.warn(model.not_converged(out.done, tol), ConvergenceWarning, stacklevel=caller_stacklevel())
    return out


def _loop(model, start: Start, max_iter, tol, callback, checkpoints, ledgers, ranks) -> Outcome:
    history = start.history
    if start.path is not None:
        model.resumed(start.done, history)
    elif model.start_rows:
        history.append(model.start_row())
    clock = Clock(start.elapsed)
    keep = checkpoints is not None
    done, converged, stopped = start.done, start.converged, False
    good = _good_point(model, done, history, ledgers, clock, converged, keep)
    unwritten = False  # whether the last completed iteration has no checkpoint yet
    try:
        while done < max_iter and not converged and not stopped:
            k = done + 1
            row = model.step(k, clock)
            history.append(row, pad=model.partial_keys)
            conv = bool(model.converged(k, row))
            done = k
            good = _good_point(model, done, history, ledgers, clock, conv, keep)
            unwritten = True
            if keep and checkpoints.due(k):
                checkpoints.write(good)
                unwritten = False
            stop = bool(model.report(callback, k, row, clock)) if callback is not None else False
            if ranks is not None:
                stop, conv = ranks.decide(stop, conv, k, model.step_name)
            converged, stopped = conv, stop
        if keep and unwritten:
            good.converged = converged
            checkpoints.write(good)
    except KeyboardInterrupt:
        path = checkpoints.write(good) if keep else None
        raise RunInterrupted(path, good.done, model.step_name) from None
    return Outcome(done, converged, stopped, history, clock(), start.done, start.path)
