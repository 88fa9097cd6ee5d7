"""Results that finished but mean nothing, and data that invites them.

Algorithm 1's penalties ``mu``, ``eta`` and the caps ``g_i`` act on absolute values, so data
far from unit scale, or penalties far larger than the data, can end a run with exit code 0
and useless factors: every ``X_i`` zero, an NMSE of 1 (no better than ``X Y = 0``), or ``X``
held at its start. :func:`degenerate_reasons` names what happened to one trial,
:func:`likely_cause` what to try; :func:`scale_warning` is the warning given up front.
Plain torch; the API raises the warnings (:class:`~ppdnmf_torch.errors.DegenerateResultWarning`,
:class:`~ppdnmf_torch.errors.DataScaleWarning`).
"""
from __future__ import annotations

import torch

__all__ = ["degenerate_reasons", "likely_cause", "scale_warning", "x_sketch", "NMSE_EPS", "MOVE_TOL",
           "SCALE_RANGE"]

#: an NMSE of at least ``1 - NMSE_EPS`` is no better than the zero factorization
NMSE_EPS = 1e-3
#: ``X`` that moved less than this (relative) since the first BCD iteration did not move
MOVE_TOL = 1e-3
#: the range of the largest absolute data entry outside which the run warns up front (the
#: paper's data have entries of order 0.1 to 1; docs/RELIABILITY.md has the measurements)
SCALE_RANGE = (1e-2, 1e6)


def x_sketch(X: torch.Tensor) -> torch.Tensor:
    """A small summary of ``X (..., L, K)`` that moves when ``X`` moves: its column sums and
    column sums of squares, ``(2, ..., K)`` (a copy of ``X`` itself can be large)."""
    X = X.detach()
    return torch.stack([X.sum(dim=-2), X.square().sum(dim=-2)]).to("cpu", torch.float64)


def degenerate_reasons(X: torch.Tensor, nmse: float, sketch_first: torch.Tensor | None = None,
                       n_iter: int = 0) -> list:
    """What is degenerate about one trial's result (an empty list: nothing).

    Parameters
    ----------
    X : Tensor (N, L, K)
        The agents' final left factors.
    nmse : float
        The final NMSE (the paper's, not squared).
    sketch_first : Tensor, optional
        :func:`x_sketch` of ``X`` after the first BCD iteration (None: not known, e.g. a
        resumed run; the "did not move" test is then skipped).
    n_iter : int
        BCD iterations run (the NMSE test needs at least 2, the "did not move" test 3).
    """
    reasons = []
    zero = (X.detach().flatten(1).abs().amax(dim=1) == 0).nonzero().flatten().tolist()
    if zero:
        reasons.append(f"X_i is all zeros for agents {zero}")
    # after a single BCD iteration of a single Y-step ADMM iteration Y is still its zero start
    # (Y = max(0, V + R) with V = R = 0): NMSE 1 is then the start, not a collapse
    if n_iter >= 2 and not nmse < 1 - NMSE_EPS:
        reasons.append(f"the NMSE is {nmse:.6g}, no better than the zero factorization (1)")
    if sketch_first is not None and n_iter >= 3 and not zero:
        now = x_sketch(X)
        moved = float((now - sketch_first).norm() / sketch_first.norm().clamp_min(torch.finfo(torch.float64).tiny))
        if moved < MOVE_TOL:
            reasons.append(f"X did not move after the first BCD iteration (relative change {moved:.2g} over "
                           f"{n_iter - 1} iterations)")
    return reasons


def likely_cause(zmax: float, mu: float, eta: float) -> str:
    """The likely cause of a degenerate result and what to try, from the data's largest absolute
    entry ``zmax`` and the ADMM penalties ``mu`` (X-step) and ``eta`` (Y-step)."""
    lo, hi = SCALE_RANGE
    if not lo <= zmax <= hi:
        return (f"likely cause: the data's scale (largest entry {zmax:.3g}) against mu = {mu:g} and eta = {eta:g}, "
                "which act on absolute values; try: rescale the data to entries of order 1 (Z / Z.max(); "
                "data.normalize=true on the command line), or scale mu and eta with the data")
    big = [f"{name} = {v:g}" for name, v in (("mu", mu), ("eta", eta)) if v > 1e3 * max(1.0, zmax)]
    if big:
        return (f"likely cause: {' and '.join(big)}, far larger than the data (largest entry {zmax:.3g}): the "
                "penalty holds the factors at their start; try values of order 0.1 to 10 (the paper uses "
                "mu = 0.1, eta = 1 for its synthetic data and mu = eta = 2 for the faces)")
    return (f"likely cause: mu = {mu:g}, eta = {eta:g} or the penalty caps g_max do not suit this data (largest "
            f"entry {zmax:.3g}); try the paper's values (mu = 0.1, eta = 1, g_max = 0.033), more BCD iterations "
            "or another rank")


def scale_warning(zmax: float) -> str | None:
    """The up-front warning for data whose largest absolute entry ``zmax`` lies outside
    :data:`SCALE_RANGE` (None when it lies inside)."""
    lo, hi = SCALE_RANGE
    if lo <= zmax <= hi:
        return None
    return (f"Z: the largest entry is {zmax:.3g}, far from 1; mu, eta and g_max act on absolute values, so the "
            "factors may stay at their start or collapse to zero. Rescale the data to entries of order 1 "
            "(Z / Z.max(); data.normalize=true on the command line) or scale mu and eta with it")
