"""What a FSSPCA run returns: :class:`FSSPCAResult`, and what its callback receives."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["FSSPCAResult", "IterationInfo", "HISTORY_KEYS"]

#: the per-iteration histories, each a Tensor (n_iter, T)
HISTORY_KEYS = ("objective", "lagrangian", "explained_variance", "sparsity", "consensus",
                "primal_residual", "dual_residual")


@dataclass
class IterationInfo:
    """After every ADMM iteration: its number (1-based) and the iteration's values ``(T,)``
    (keys of :data:`HISTORY_KEYS`), and which trials are still running. Returning True from
    the callback stops the run."""

    iteration: int
    values: dict
    active: torch.Tensor


@dataclass
class FSSPCAResult:
    """A FSSPCA run (T trials, K workers, d features, r loadings).

    Attributes
    ----------
    z : Tensor (T, d, r)
        The server's sparse consensus loadings (``components_`` of the estimator).
    components : Tensor (T, d, r)
        ``qf(z)``: orthonormal loadings (Algorithm 1's last step).
    w, u : Tensor (T, K, d, r)
        The workers' points and duals.
    n_iter : Tensor (T,) int
        ADMM iterations each trial ran.
    converged : Tensor (T,) bool
    history : dict of Tensor (n_iter_max, T)
        :data:`HISTORY_KEYS`; a trial's entries after it stopped repeat its last values.
    mean : Tensor (d,) or None
        The global mean the data were centred with (None when not centred).
    explained_variance : Tensor (T,)
        Adjusted explained variance of ``z`` as a fraction of the total (Zou et al.).
    variance_components : Tensor (T, r)
        Each loading's adjusted variance ``R_jj^2`` in the units of ``A^T A``.
    total_variance : Tensor (T,)
        ``tr(A^T A)`` of the (centred) pooled data.
    settings : dict
        The run's parameters (no key, no seed of a secure aggregator).
    costs : dict
        The aggregator's counted costs (``{}`` for the plain upload).
    line_search : dict
        ``evals`` (trial steps, batch-wide) and ``failures`` (worker searches that met no condition).
    plan : str
        How the iterations ran: ``"torch"`` or ``"host"`` (:func:`.server_host.choose_plan`).
    """

    z: torch.Tensor
    components: torch.Tensor
    w: torch.Tensor
    u: torch.Tensor
    n_iter: torch.Tensor
    converged: torch.Tensor
    history: dict
    mean: torch.Tensor | None
    explained_variance: torch.Tensor
    variance_components: torch.Tensor
    total_variance: torch.Tensor
    settings: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    line_search: dict = field(default_factory=dict)
    plan: str = "torch"

    @property
    def sparsity(self) -> torch.Tensor:
        """Fraction of zero entries of ``z``, ``(T,)``."""
        return (self.z == 0).to(self.z.dtype).mean(dim=(-2, -1))
