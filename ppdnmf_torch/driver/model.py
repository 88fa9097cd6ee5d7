"""What a model plugs into the run driver: :class:`LoopModel`.

A model's loop is its start, its step (one outer iteration: PPDNMF's BCD iteration, FSSPCA's
ADMM iteration, ...), its metrics (the history row a step returns), its state tensors (what a
checkpoint holds) and its stopping test. Everything around them is the driver's
(:func:`~.loop.drive`): the iteration loop, the decision to stop and the
:class:`~ppdnmf_torch.errors.ConvergenceWarning` at the cap, the callback, the history, the
checkpoints and resume, the cost ledgers and Ctrl-C.
"""
from __future__ import annotations

import torch

__all__ = ["LoopModel"]


class LoopModel:
    """The hooks of one model's run; subclass and override what the model has.

    Class attributes
    ----------------
    name : str
        The checkpoint's ``model`` entry: a checkpoint of another model is refused by it.
    step_name : str
        What one iteration is called in messages (``"BCD iteration"``, ``"ADMM iteration"``).
    cap_key : str
        The iteration cap's parameter (``"max_iter"``, ``"bcd_iters"``): the one setting a
        resume may change, named when a checkpoint has done more iterations than it.
    fresh_state : bool
        True when a step replaces the state's tensors instead of writing into them: the driver
        then keeps references to the last completed iteration's tensors (for the checkpoint
        that Ctrl-C writes) instead of copies.
    start_rows : int
        History rows recorded before the first iteration (:meth:`start_row`).
    partial_keys : tuple of str
        History keys (prefixes) whose rows may start later than the run's (counters that appear
        with a resumed run's exchange).
    """

    name = "model"
    step_name = "iteration"
    cap_key = "max_iter"
    fresh_state = True
    start_rows = 0
    partial_keys: tuple = ()

    # -- the iterations -------------------------------------------------------------------
    def start_row(self) -> dict:
        """The history's row before the first iteration (when :attr:`start_rows` is 1)."""
        raise NotImplementedError

    def step(self, k: int, clock) -> dict:
        """Outer iteration ``k`` (1-based): update the state, return the history's row
        ``{key: value}`` (tensors ``(T, ...)`` or floats). ``clock()``: seconds since the run
        started, resumed segments included."""
        raise NotImplementedError

    def converged(self, k: int, row: dict) -> bool:
        """The stopping test after iteration ``k`` (the model's tolerance; 0: normally never true):
        True ends the run."""
        return False

    def report(self, callback, k: int, row: dict, clock) -> bool:
        """Call the user's ``callback`` in the model's form after iteration ``k``; its true
        return value stops the run."""
        return bool(callback(k, row))

    def not_converged(self, k: int, tol: float) -> str:
        """The :class:`~ppdnmf_torch.errors.ConvergenceWarning`'s text at the cap."""
        return f"{self.name}: no convergence to tol={tol:g} in {k} {self.step_name}s"

    # -- what a checkpoint holds ----------------------------------------------------------
    def state(self) -> dict:
        """The state tensors ``{name: Tensor}`` that continue the run bit for bit."""
        raise NotImplementedError

    def state_spec(self) -> dict:
        """``{name: (shape or None, dtype, optional)}`` a checkpoint's state must match;
        default: the names, shapes and dtypes of :meth:`state` at the start."""
        return {k: (tuple(v.shape), v.dtype, False) for k, v in self.state().items()}

    def load_state(self, tensors: dict, extra: dict) -> None:
        """Continue from a checkpoint's state tensors (on the CPU) and its :meth:`extra`."""
        raise NotImplementedError

    def resumed(self, done: int, history) -> None:
        """Called once a resumed run's state is loaded, with its iterations done and its history."""

    def rng_state(self):
        """The random generators' states (plain values and tensors), or None."""
        return None

    def load_rng_state(self, state) -> None:
        """Continue the generators from :meth:`rng_state`'s value."""

    def extra(self) -> dict:
        """The model's plain bookkeeping a checkpoint holds (counters, flags)."""
        return {}

    def settings(self) -> dict:
        """The settings that fix the run's numbers, as plain values (compared by name on resume;
        the iteration cap left out: a resumed run may run longer)."""
        return {}

    def inputs(self) -> dict:
        """``{name: digest}`` of the inputs that fix the run's numbers (data, graph, start;
        :func:`~ppdnmf_torch.checkpoint.digest`), compared by name on resume."""
        return {}


def tensor_spec(tensors: dict, optional=()) -> dict:
    """:meth:`LoopModel.state_spec` from example tensors, the names in ``optional`` optional."""
    return {k: (tuple(v.shape), v.dtype, k in optional) for k, v in tensors.items()
            if isinstance(v, torch.Tensor)}
