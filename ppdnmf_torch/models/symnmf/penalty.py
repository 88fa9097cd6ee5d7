"""The penalty parameter ``lambda`` of the split problem (3): fixed, the theorem's bound,
the adaptive rule (20) or Kuang et al.'s 1.01 schedule, one value per trial.

A rule is parsed once (:func:`parse_penalty`), gives ``lambda_0`` per trial
(:func:`initial_lambda`) and ``lambda_{k+1}`` from ``(U_k, V_k)`` (:func:`next_lambda`).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ...errors import ConfigError
from .objective import fit_sq, inner

__all__ = ["PenaltyRule", "parse_penalty", "initial_lambda", "next_lambda", "bound_lambda",
           "ADAPTIVE_LAMBDA0", "KUANG_LAMBDA0", "KUANG_FACTOR", "KUANG_TOL", "BOUND_MARGIN"]

#: ``lambda_0`` of the adaptive rule (the paper: "with lambda_0 = 1e-5 for all experiments")
ADAPTIVE_LAMBDA0 = 1e-5
#: ``lambda_0`` of Kuang et al.'s schedule as the paper ran it: its Fig. 3 text has the schedule
#: reach ~97 after 1619 iterations and 7e7 after 3000, ``97 / 1.01^1619 = 9.8e-6`` and
#: ``7e7 / 1.01^3000 = 7.6e-6``, so ``1e-5``, the adaptive rule's (Kuang et al.'s own code,
#: symnmf_anls.m, starts from ``max(X)^2``; pass ``lam0`` for it)
KUANG_LAMBDA0 = 1e-5
#: Kuang et al.'s schedule: ``lambda_{k+1} = 1.01 lambda_k`` ...
KUANG_FACTOR = 1.01
#: ... until ``||U_k - V_k||_F / ||V_k||_F < 1e-8``
KUANG_TOL = 1e-8
#: the theorem's bound is strict: ``lambda = 1.01 x`` the bound (spec)
BOUND_MARGIN = 1.01

KINDS = ("fixed", "bound", "adaptive", "kuang", "none")


@dataclass(frozen=True)
class PenaltyRule:
    """A parsed penalty rule.

    Attributes
    ----------
    kind : {"fixed", "bound", "adaptive", "kuang", "none"}
        ``"none"``: a method without a split penalty (PGD, beta-SNMF), ``lambda = 0``.
    values : tuple of float or None
        ``"fixed"``: one value, or one per trial (a hyperparameter batched over trials).
    lam0 : float or None
        ``lambda_0`` of ``"adaptive"`` (default 1e-5) and ``"kuang"`` (default 1e-5, what the
        paper's Fig. 3 implies: :data:`KUANG_LAMBDA0`).
    """

    kind: str
    values: tuple | None = None
    lam0: float | None = None

    def describe(self) -> str:
        """A short stable text for fingerprints and summaries."""
        return f"{self.kind}:{self.values}:{self.lam0}"


def parse_penalty(penalty, trials: int, *, lam0=None) -> PenaltyRule:
    """Parse ``penalty``: a rule name, a number, or a sequence of ``trials`` numbers.

    Raises
    ------
    ConfigError
        Unknown name, a negative or non-finite value, or a sequence of the wrong length.
    """
    if lam0 is not None and (not isinstance(lam0, numbers.Real) or not lam0 > 0 or lam0 != lam0):
        raise ConfigError(f"lam0: must be a number > 0, got {lam0!r}")
    if isinstance(penalty, str):
        if penalty not in KINDS[1:]:
            raise ConfigError(f"penalty: unknown rule {penalty!r}; use 'adaptive', 'fixed' (a number), 'bound', "
                              "'kuang', or a number per trial")
        return PenaltyRule(penalty, None, None if lam0 is None else float(lam0))
    if isinstance(penalty, torch.Tensor):
        penalty = penalty.detach().cpu().reshape(-1).tolist()
    if isinstance(penalty, numbers.Real) and not isinstance(penalty, bool):
        vals = (float(penalty),)
    elif isinstance(penalty, (list, tuple)) and all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                                  for v in penalty):
        vals = tuple(float(v) for v in penalty)
        if len(vals) not in (1, trials):
            raise ConfigError(f"penalty: {len(vals)} values for {trials} trials; give one, or one per trial")
    else:
        raise ConfigError(f"penalty: expected a rule name, a number or a sequence of numbers, got {penalty!r}")
    if not all(v >= 0 and v < float("inf") for v in vals):
        raise ConfigError(f"penalty: values must be finite and >= 0, got {vals}")
    return PenaltyRule("fixed", vals, None)


def bound_lambda(sim, U0: torch.Tensor, V0: torch.Tensor, XV0: torch.Tensor) -> torch.Tensor:
    """The theorem's sufficient penalty, ``1.01 x 1/2 (||X||_2 + ||X - U_0 V_0^T||_F - sigma_n(X))``,
    ``(T,)`` (NeurIPS Theorem 2; for a sparse ``X``, ``sigma_n`` is taken as 0, which only
    raises the bound)."""
    T = U0.shape[0]
    hi, lo = sim.spectrum_ends(T)
    resid = fit_sq(sim.sq_norm_per_trial(T), U0, V0, XV0).sqrt()
    return (BOUND_MARGIN * 0.5 * (hi + resid - lo)).clamp_min(0)


def initial_lambda(rule: PenaltyRule, sim, U0, V0, XV0) -> torch.Tensor:
    """``lambda_0`` per trial, ``(T,)``, in ``U0``'s dtype and device."""
    T = U0.shape[0]
    opts = dict(dtype=U0.dtype, device=U0.device)
    if rule.kind == "none":
        return torch.zeros(T, **opts)
    if rule.kind == "fixed":
        return torch.tensor(rule.values, **opts).expand(T).clone()
    if rule.kind == "bound":
        return bound_lambda(sim, U0, V0, XV0)
    if rule.kind == "adaptive":
        return torch.full((T,), ADAPTIVE_LAMBDA0 if rule.lam0 is None else rule.lam0, **opts)
    return torch.full((T,), KUANG_LAMBDA0 if rule.lam0 is None else rule.lam0, **opts)


def next_lambda(rule: PenaltyRule, lam: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """``lambda_{k+1}`` from ``lambda_k`` and ``(U_k, V_k)``, ``(T,)``.

    - ``"adaptive"``, eq. (20) as the spec reconstructs it:
      ``lambda_{k+1} = lambda_k (||U_k||_F^2 + ||V_k||_F^2) / (2 <U_k, V_k>)``. The ratio is
      ``>= 1`` by (19) and exactly 1 when ``U_k = V_k`` (the three sums are the same
      reductions, so ``U = V`` gives the same bits); it is clamped at 1 against rounding,
      and a trial with ``<U_k, V_k> <= 0`` keeps its ``lambda``.
    - ``"kuang"``: ``1.01 lambda_k`` while ``||U_k - V_k||_F / ||V_k||_F >= 1e-8``.
    - otherwise unchanged.
    """
    if rule.kind == "adaptive":
        uu, vv, uv = inner(U, U), inner(V, V), inner(U, V)
        ratio = torch.where(uv > 0, (uu + vv) / (2 * uv.clamp_min(torch.finfo(U.dtype).tiny)),
                            torch.ones_like(uv))
        return lam * ratio.clamp_min(1)
    if rule.kind == "kuang":
        D = U - V
        rel = inner(D, D).sqrt() / inner(V, V).sqrt().clamp_min(torch.finfo(U.dtype).tiny)
        return torch.where(rel >= KUANG_TOL, lam * KUANG_FACTOR, lam)
    return lam
