"""A scikit-learn estimator over :func:`ppdnmf_torch.fit`: :class:`PPDNMF`.

The maths stays in the functional API; the estimator validates its input once (at the
boundary, with scikit-learn's own checks), holds the hyperparameters (unknown ones are
refused at construction and by ``set_params``, as :class:`sklearn.base.BaseEstimator`
does), and behaves like scikit-learn's ``NMF``: ``fit(X, y=None)``, ``transform``,
``fit_transform``, ``inverse_transform``, ``score``, ``get_feature_names_out``,
``components_``, ``n_iter_``, ``reconstruction_err_``, ``random_state``, ``max_iter`` and
``tol``, and it fits in a ``Pipeline`` and ``GridSearchCV``.

Orientation: scikit-learn's. ``X (n_samples, n_features)`` is the transpose of the paper's
``Z (L, M)``: each sample is a column of ``Z``, and each agent holds some samples. The graph
is a constructor parameter (``graph``; by default a ring of ``n_agents`` agents), so that
``fit``'s second argument is scikit-learn's ``y`` (ignored). NumPy (or SciPy sparse) input
gives NumPy output; a torch tensor gives a tensor on its device.

Units: the penalties ``mu``, ``eta`` and ``g_max`` are absolute numbers chosen for data in
``[0, 1]``, so the estimator fits ``X / scale_`` (``scale="max"``: the largest absolute entry of
``X``; or a bound the agents agreed on) and gives ``components_``, ``reconstruction_err_`` and
``inverse_transform`` in ``X``'s units; the coefficients ``W`` are those of ``X / scale_``. The
answer on ``c X`` is then the answer on ``X`` with ``components_`` times ``c``, to rounding.
"""
from __future__ import annotations

import math
import numbers

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from ...driver import seed_of
from ...driver.progress import FitProgress, check_verbose
from ...errors import ConfigError, DataError, GraphError, PPDNMFError
from ...graph import Graph, complete, ring
from ...threads import using_threads
from .api import fit
from .config import OPTION_DEFAULTS as _O, SOLVER_DEFAULTS as _S
from .problem import as_graph, build_problem
from .result import FitResult
from .solver import init_state, solver_params
from .solver.admm import y_step

__all__ = ["PPDNMF"]

#: the estimator's parameters that :func:`~ppdnmf_torch.fit` knows by other names
_FIT_NAMES = {"bcd_iters": "max_iter", "rank": "n_components", "adjacency": "graph", "seed": "random_state",
              "init_seed": "random_state"}

#: densified blocks of a ``scipy.sparse`` input above this many bytes are refused
MAX_DENSE_BYTES = 2 << 30


def _shown(info) -> tuple:
    """What ``verbose`` shows of a BCD iteration: its number, NMSE and consensus error."""
    m = info.metrics
    return info.iteration, {"NMSE": float(m["nmse"]), "consensus": float(m["consensus"])}


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


def _divided(Xs, scale: float):
    """``Xs / scale`` (the penalties' units, module docstring), entry by entry as torch divides: a
    ``scipy.sparse`` matrix's stored values divided in NumPy (SciPy's ``/`` multiplies by the
    reciprocal, which would make a sparse ``X`` fit other bits than the same ``X`` dense)."""
    if not hasattr(Xs, "toarray"):
        return Xs / scale
    out = Xs.copy()
    out.data = out.data / scale
    return out


class PPDNMF(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Privacy-preserving distributed NMF as a scikit-learn estimator: ``X ~ W H`` over N agents.

    ``X (n_samples, n_features)`` is the transpose of the paper's ``Z (L, M)``; its samples
    are split over the agents of ``graph`` (each agent holds its own rows of ``X``), which
    agree on the basis ``H = components_`` (the paper's ``X^T``) while each keeps its own
    coefficients ``W`` (the paper's ``Y_i^T``).

    Parameters
    ----------
    n_components : int or None
        ``K``, the inner rank (None: ``n_features``, as scikit-learn's ``NMF``).
    graph : Graph, adjacency matrix, networkx graph or None
        The agents and who talks to whom. None: a ring of ``min(n_agents, n_samples // 2)``
        agents (at least two samples each; every agent has two neighbours from three agents on).
    n_agents : int
        Agents of the default ring (ignored when ``graph`` is given).
    columns : list of int or None
        Samples per agent, in order (None: an equal split).
    init : {"random", "ones"}
        The start: ``"random"``, an ``X_0`` every agent draws from a shared seed (the local
        copies start equal without sharing data), or the paper's all-ones start.
    random_state : int, numpy generator or None
        Seeds the start and the penalty draws (``None``: a fresh seed, as in scikit-learn).
    max_iter : int
        Cap on the BCD iterations (:func:`ppdnmf_torch.fit`'s ``bcd_iters``).
    tol : float
        The stopping rule's tolerance (:func:`ppdnmf_torch.fit`: a fit stops at the first BCD
        iteration at which every agent's model ``X_i Y_i`` moved by less than ``tol ||Z_i||`` and
        its copy of the basis disagrees with its neighbours' by less than ``tol``, relative;
        free of the data's units); when ``max_iter`` is hit
        first, a :class:`~ppdnmf_torch.ConvergenceWarning` says so. ``0`` runs ``max_iter``
        iterations.
    mu, eta, g_max, x_iters, y_iters, admm_tol, exchange, protocol, n_max, key_bits, g_bits,
    penalty, penalty_schedule, y_solver, negative, min_degree, device, dtype, fuse, threads,
    exchange_options
        As in :func:`ppdnmf_torch.fit`, with its defaults (its spec's,
        :class:`~ppdnmf_torch.models.ppdnmf.config.SolverConfig` and
        :class:`~ppdnmf_torch.models.ppdnmf.config.FitOptions`) and its rules (checked by
        :meth:`fit`). ``dtype`` is ``"float64"`` or ``"float32"``.
    transform_iters : int
        Cap on the Y-step iterations of :meth:`transform` (ADMM iterations or HALS sweeps,
        whichever ``y_solver`` the fit used), run in rounds of ``y_iters`` until the relative
        change falls below ``transform_tol``.
    transform_tol : float
    scale : "max" or float
        The data are divided by this number before the fit (see Units in the module docstring):
        ``"max"``, the largest absolute entry of ``X`` (in a deployment the max over the agents'
        maxima, one number every agent learns), or a positive number the agents agreed on in
        public (e.g. 16 for digits, 255 for 8-bit images: nothing crosses). ``1.0`` fits ``X`` as
        it is, as :func:`ppdnmf_torch.fit` does.
    verbose : int or bool
        0 (the default): silent. 1: progress of the fit (a tqdm bar when stderr is a terminal,
        else a line every few seconds: BCD iteration, NMSE, consensus error, elapsed time, ETA);
        2: a line after every BCD iteration (:class:`~ppdnmf_torch.driver.progress.FitProgress`,
        through the fit's callback).

    ``threads`` holds torch's intra-op threads for all of ``fit``, ``transform`` and ``score``,
    restored after each call (None: the package's default, :func:`ppdnmf_torch.threads.default_threads`).

    Attributes
    ----------
    components_ : ndarray or Tensor (n_components, n_features)
        ``X^T`` of the consensus basis (the agents' mean ``X``).
    n_components_ : int
    scale_ : float
        The number ``X`` was divided by for the fit (``scale``'s value, or ``X``'s largest
        absolute entry; 1.0 for all-zero data).
    n_iter_ : int
        BCD iterations run.
    reconstruction_err_ : float
        ``||X - W H||_F`` for ``W = fit_transform(X)`` (the agents' own coefficients) and
        ``H = components_`` (the consensus basis), as scikit-learn's ``NMF`` has it; ``X`` as
        the fit factorized it (after ``negative="clip"`` or ``"shift"``).
    agent_reconstruction_err_ : float
        ``||X - [W_1 H_1; ...; W_N H_N]||_F``, each agent's rows rebuilt with its own copy
        ``H_i`` of the basis (what the run minimized: ``sqrt(2 objective)``); the two figures
        agree as the copies agree.
    nmse_, consensus_ : float
        The paper's NMSE and the consensus error ``max_i ||X_i - Xbar|| / ||Xbar||``.
    history_ : dict
        Per BCD iteration (:attr:`ppdnmf_torch.FitResult.history`), of the fit of ``X / scale_``.
    result_ : FitResult
        Everything :func:`ppdnmf_torch.fit` returned (every agent's factors as tensors, the
        exchange's costs), in the paper's orientation, for ``X / scale_``.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        When ``X`` had string column names.

    Examples
    --------
    >>> import ppdnmf_torch as pp
    >>> d = pp.data.synthetic(seed=0)
    >>> model = pp.PPDNMF(n_components=5, random_state=0, max_iter=20, negative="allow")
    >>> W = model.fit_transform(d.Z.T.numpy())
    >>> W.shape, model.components_.shape
    ((200, 5), (5, 30))
    """

    def __init__(self, n_components=None, *, graph=None, n_agents=10, columns=None, init=_S.init,
                 random_state=None, max_iter=_S.bcd_iters, tol=_S.tol, mu=_S.mu, eta=_S.eta, g_max=_S.g_max,
                 x_iters=_S.x_iters, y_iters=_S.y_iters, admm_tol=_S.admm_tol, exchange=_O.exchange,
                 protocol=_O.protocol, n_max=_O.n_max, key_bits=_O.key_bits, g_bits=_O.g_bits, penalty=_S.penalty,
                 penalty_schedule=_S.penalty_schedule, y_solver=_S.y_solver, negative=_O.negative,
                 min_degree=_O.min_degree, device=_O.device, dtype=_O.dtype, fuse=_S.fuse, threads=_O.threads,
                 exchange_options=_O.exchange_options, transform_iters=3000, transform_tol=1e-8, scale="max",
                 verbose=0):
        self.n_components = n_components
        self.graph = graph
        self.n_agents = n_agents
        self.columns = columns
        self.init = init
        self.random_state = random_state
        self.max_iter = max_iter
        self.tol = tol
        self.mu = mu
        self.eta = eta
        self.g_max = g_max
        self.x_iters = x_iters
        self.y_iters = y_iters
        self.admm_tol = admm_tol
        self.exchange = exchange
        self.protocol = protocol
        self.n_max = n_max
        self.key_bits = key_bits
        self.g_bits = g_bits
        self.penalty = penalty
        self.penalty_schedule = penalty_schedule
        self.y_solver = y_solver
        self.negative = negative
        self.min_degree = min_degree
        self.device = device
        self.dtype = dtype
        self.fuse = fuse
        self.threads = threads
        self.exchange_options = exchange_options
        self.transform_iters = transform_iters
        self.transform_tol = transform_tol
        self.scale = scale
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.positive_only = self.negative != "allow"
        tags.transformer_tags.preserves_dtype = ["float64"]
        return tags

    # -- validation, once, at the boundary ------------------------------------------------
    def _torch_dtype(self) -> torch.dtype:
        dtypes = {"float64": torch.float64, "float32": torch.float32, torch.float64: torch.float64,
                  torch.float32: torch.float32}
        if not isinstance(self.dtype, (str, torch.dtype)) or self.dtype not in dtypes:
            raise ConfigError(f"dtype: must be 'float64' or 'float32', got {self.dtype!r}")
        return dtypes[self.dtype]

    def _check_params(self) -> None:
        n = self.n_components
        if n is not None and (not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 1):
            raise ConfigError(f"n_components: must be None or an integer >= 1, got {n!r}")
        for name, low in (("max_iter", 1), ("n_agents", 1), ("transform_iters", 1), ("x_iters", 1), ("y_iters", 1)):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < low:
                raise ConfigError(f"{name}: must be an integer >= {low}, got {v!r}")
        for name in ("tol", "transform_tol"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{name}: must be a finite number >= 0, got {v!r}")
        c = self.columns
        if c is not None and (isinstance(c, (str, bytes)) or not hasattr(c, "__len__") or not all(
                isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in c)):
            raise ConfigError(f"columns: must be None or a list of sample counts, one integer >= 1 per agent, got {c!r}")
        v = self.scale
        if not (isinstance(v, str) and v == "max") and (
                not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) or v <= 0):
            raise ConfigError(f"scale: must be 'max' or a finite number > 0, got {v!r}")
        self._torch_dtype()
        check_verbose(self.verbose)

    def _as_samples(self, X, reset: bool):
        """``X`` validated, as a float64 tensor ``(n_samples, n_features)`` on the CPU (NumPy,
        SciPy sparse, pandas, lists) or as given (a torch tensor), and whether the caller
        gave a tensor."""
        if isinstance(X, np.ma.MaskedArray) and bool(np.ma.getmaskarray(X).any()):
            raise DataError("X: a masked array with masked entries; PPDNMF has no notion of missing values: "
                            "fill them (X.filled(...)) or drop those samples")
        if isinstance(X, torch.Tensor):
            if X.is_meta:
                raise DataError("X: a meta tensor holds no values; materialize it first")
            if X.is_sparse or X.layout != torch.strided:
                X = X.to_dense()
            if X.dim() != 2:
                raise DataError(f"X: expected a 2-d (n_samples, n_features) tensor, got shape {tuple(X.shape)}")
            if not X.is_floating_point():
                X = X.to(torch.float64)
            # scikit-learn's checks (finite values, sample and feature counts, feature names)
            validate_data(self, X.detach().cpu().numpy(), reset=reset, dtype=[np.float64, np.float32])
            self._check_negative(float(X.min()) if X.numel() else 0.0, reset)
            return X, True
        Xv = validate_data(self, X, reset=reset, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32])
        self._check_negative(float(Xv.min()) if Xv.shape[0] * Xv.shape[1] else 0.0, reset)
        if hasattr(Xv, "toarray"):
            return Xv, False
        return torch.as_tensor(np.ascontiguousarray(Xv), dtype=torch.float64), False

    def _check_negative(self, low: float, fitting: bool) -> None:
        """Negative entries: refused under ``negative="error"`` (and by ``transform`` unless
        ``negative="allow"``), naming the settings that take them; ``fit`` hands the others
        to :func:`ppdnmf_torch.fit`, which clips or shifts them."""
        if low >= 0 or self.negative == "allow" or (fitting and self.negative != "error"):
            return
        raise DataError(f"X: Negative values in data passed to {type(self).__name__} (min {low:.4g}); NMF needs "
                        "nonnegative data. Set "
                        + ("{negative}='clip' or 'shift' (or {negative}='allow' to factorize as is)" if fitting
                           else "{negative}='allow' to project them as they are"))

    def _graph(self, n_samples: int) -> Graph:
        if self.graph is None:
            # at least two samples per agent: an agent with one sample that happens to be zero
            # has no data to fit (its NMSE term is undefined)
            n = min(int(self.n_agents), max(1, n_samples // 2))
            return ring(n) if n >= 3 else complete(n)
        try:
            g = as_graph(self.graph)
        except GraphError as exc:  # a parameter that is no graph: fit's name of the graph is adjacency
            raise ConfigError(str(exc.renamed({"adjacency": "graph"}))) from None
        except PPDNMFError as exc:
            raise exc.renamed({"adjacency": "graph"}) from None
        if g.n_agents > n_samples:
            raise DataError(f"graph: {g.n_agents} agents but X has only {n_samples} samples; every agent needs one")
        return g

    def _output(self, T: torch.Tensor, as_tensor: bool):
        return T if as_tensor else T.detach().cpu().numpy()

    # -- fitting ------------------------------------------------------------------------
    def _fit_keywords(self, seed: int) -> dict:
        return dict(mu=self.mu, eta=self.eta, g_max=self.g_max, bcd_iters=int(self.max_iter),
                    x_iters=int(self.x_iters), y_iters=int(self.y_iters), tol=float(self.tol), admm_tol=self.admm_tol,
                    exchange=self.exchange, protocol=self.protocol, n_max=self.n_max, key_bits=self.key_bits,
                    g_bits=self.g_bits, penalty=self.penalty, penalty_schedule=self.penalty_schedule,
                    y_solver=self.y_solver, negative=self.negative, device=self.device, dtype=self._torch_dtype(),
                    fuse=self.fuse, threads=self.threads, exchange_options=self.exchange_options, seed=seed,
                    init=self.init, init_seed=seed, min_degree=self.min_degree)

    def fit(self, X, y=None, callback=None) -> "PPDNMF":
        """Fit the factorization of ``X (n_samples, n_features)``, its samples over the agents.

        Parameters
        ----------
        X : array-like, SciPy sparse matrix or Tensor (n_samples, n_features)
            Nonnegative data (unless ``negative="allow"``). A sparse matrix is densified per
            agent (a size check refuses blocks above :data:`MAX_DENSE_BYTES`).
        y : ignored
            scikit-learn's convention. The graph is the ``graph`` parameter.
        callback : callable, optional
            As in :func:`ppdnmf_torch.fit`.
        """
        self._fit(X, y, callback)
        return self

    def _fit(self, X, y, callback):
        self._check_params()
        with using_threads(self.threads):  # the whole fit, its checks and the rebuilt error too
            return self._fit_under_threads(X, y, callback)

    def _fit_under_threads(self, X, y, callback):
        if y is not None and (isinstance(y, Graph) or hasattr(y, "adj") or (
                hasattr(y, "shape") and len(getattr(y, "shape", ())) == 2 and y.shape[0] == y.shape[1])):
            raise ConfigError("graph: PPDNMF.fit(X, y=None) takes the graph as the constructor's parameter, "
                              "PPDNMF(graph=...), and X with the samples as rows (the transpose of the paper's Z)")
        Xs, as_tensor = self._as_samples(X, reset=True)
        scale = self._scale_of(Xs)
        Xs = _divided(Xs, scale)
        n_samples, n_features = Xs.shape
        g = self._graph(n_samples)
        K = self.n_components if self.n_components is not None else n_features
        Z, columns = _dense_columns(Xs.T.tocsc() if hasattr(Xs, "toarray") else Xs.T, self.columns, g.n_agents)
        seed = seed_of(self.random_state)
        kw = self._fit_keywords(seed)
        progress = FitProgress(self.verbose, int(self.max_iter), "PPDNMF", step="BCD iteration")
        try:
            result = fit(Z, g, int(K), columns=columns if columns is not None else self.columns,
                         callback=progress.wrap(callback, _shown), **kw)
        except PPDNMFError as exc:  # fit's names of the estimator's parameters
            progress.close()
            raise self._named(exc) from None
        except BaseException:
            progress.close()
            raise
        progress.done(result.n_iter, {"NMSE": result.nmse, "consensus": result.consensus})
        self._set_fitted(result, kw["y_solver"], as_tensor, scale)
        self.reconstruction_err_ = scale * self._rebuilt_error(Xs, result)
        return result

    def _scale_of(self, Xs) -> float:
        """``scale``'s number: the given bound, or ``X``'s largest absolute entry (1.0 when all
        are 0: the fit then refuses the data by name)."""
        if not isinstance(self.scale, str):
            return float(self.scale)
        if hasattr(Xs, "toarray"):
            high = float(abs(Xs).max()) if Xs.nnz else 0.0
        else:
            high = float(Xs.detach().abs().max()) if Xs.numel() else 0.0
        return high if high > 0 else 1.0

    def _named(self, exc: PPDNMFError) -> PPDNMFError:
        """``exc`` under the estimator's names: fit's names of its parameters, and a setting of
        ``exchange_options`` under that name."""
        exc = exc.renamed(_FIT_NAMES)
        head = (exc.key or "").split("/")[0].split(".")[0].split("[")[0]
        if isinstance(self.exchange_options, dict) and head in self.exchange_options and head not in \
                self.get_params(deep=False):
            exc = exc.within("exchange_options")
        return exc

    def _rebuilt_error(self, Xs, result: FitResult) -> float:
        """``||X - W H||_F`` for ``W = fit_transform(X)``, ``H = components_``, with ``X`` as the fit
        factorized it (``negative``'s clip or shift applied)."""
        Xd = torch.as_tensor(Xs.toarray(), dtype=torch.float64) if hasattr(Xs, "toarray") else Xs
        H = result.X_mean.T  # (K, n_features)
        Xd = Xd.detach().to(device=H.device, dtype=H.dtype)
        low = float(Xd.min()) if Xd.numel() else 0.0
        if low < 0 and self.negative == "clip":
            Xd = Xd.clamp(min=0)
        elif low < 0 and self.negative == "shift":
            Xd = Xd - low
        W = torch.cat(list(result.Y), dim=1).T  # (n_samples, K), sample order
        return float(torch.linalg.matrix_norm(Xd - W @ H))

    def _set_fitted(self, result: FitResult, y_solver: str, as_tensor: bool, scale: float) -> None:
        self.result_ = result
        self._y_solver = y_solver
        self._as_tensor = as_tensor
        self.scale_ = scale
        self._basis = result.X_mean  # (L, K) of X / scale_, the fit's dtype and device
        self._components = (result.X_mean.T * scale).contiguous()  # (K, L) in X's units
        self.components_ = self._output(self._components, as_tensor)
        self.n_components_ = int(result.X_mean.shape[1])
        self.n_iter_ = result.n_iter
        self.history_ = result.history
        self.agent_reconstruction_err_ = scale * math.sqrt(2.0 * float(result.history["objective"][-1]))
        self.nmse_ = result.nmse
        self.consensus_ = result.consensus

    @property
    def _n_features_out(self):
        return self.n_components_

    def fit_transform(self, X, y=None, callback=None):
        """:meth:`fit`, then the agents' own coefficients stacked in sample order,
        ``(n_samples, n_components)`` (no refit)."""
        result = self._fit(X, y, callback)
        return self._output(torch.cat(list(result.Y), dim=1).T.contiguous(), self._as_tensor)

    # -- projecting new samples ---------------------------------------------------------
    def _check_fitted(self):
        check_is_fitted(self, "components_", msg="This PPDNMF instance is not fitted yet: call fit() before "
                                                 "transform(), inverse_transform() or score().")

    def transform(self, X):
        """Coefficients of new samples on the consensus basis: ``min_{W >= 0} ||X - W H||_F``.

        The same nonnegative solver as the fit's Y-step (the ``y_solver`` the fit ran): the
        Y-step's ADMM (eqs. 12-14) or HALS sweeps (:mod:`ppdnmf_torch.models.ppdnmf.solver.hals`), on one
        agent holding ``X^T`` with the basis fixed to the consensus ``Xbar``. It starts from
        zero and runs in warm-started rounds of ``y_iters`` iterations (sweeps) until the
        coefficients change by less than ``transform_tol`` (relative) or ``transform_iters``
        ran. Runs under the ``threads`` setting, as ``fit`` does.

        Parameters
        ----------
        X : array-like, SciPy sparse matrix or Tensor (n_samples, n_features)

        Returns
        -------
        W : ndarray or Tensor (n_samples, n_components)
            Nonnegative; a tensor (on the fit's device) for tensor input, else NumPy.

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before :meth:`fit`.
        ValueError (DataError)
            For NaN/Inf, negative entries (unless ``negative="allow"``), strings, no samples,
            or another number of features than the fit's.
        """
        self._check_fitted()
        self._check_params()
        Xs, as_tensor = self._as_samples(X, reset=False)
        if hasattr(Xs, "toarray"):
            Xs = torch.as_tensor(Xs.toarray(), dtype=torch.float64)
        with using_threads(self.threads):
            W = self._project(Xs.T / self.scale_)
        return self._output(W.T.contiguous(), as_tensor)

    def _project(self, Zt: torch.Tensor) -> torch.Tensor:
        """``Y (K, M)`` of the columns ``Zt (L, M)`` on the fitted basis (see :meth:`transform`)."""
        X = self._basis
        Zt = Zt.detach().to(device="cpu", dtype=torch.float64)
        problem = build_problem([[Zt]], [complete(1)], torch.ones((1, 1), dtype=torch.float64), [0], dtype=X.dtype,
                                device=X.device)
        K = int(X.shape[1])
        params = solver_params(K, mu=float(self.mu), eta=float(self.eta), bcd_iters=1, x_iters=1,
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

    def inverse_transform(self, W):
        """Samples from coefficients: ``W H``, ``(n_samples, n_features)``."""
        self._check_fitted()
        as_tensor = isinstance(W, torch.Tensor)
        Wt = (W.detach().to(self._basis.device, self._basis.dtype) if as_tensor
              else torch.as_tensor(np.asarray(W, dtype=np.float64), dtype=self._basis.dtype, device=self._basis.device))
        if Wt.dim() != 2 or Wt.shape[1] != self.n_components_:
            raise DataError(f"W: expected (n_samples, {self.n_components_}) coefficients, got shape {tuple(Wt.shape)}")
        return self._output(Wt @ self._components, as_tensor)

    def score(self, X, y=None) -> float:
        """Minus the relative reconstruction error of ``X`` on the fitted basis,
        ``-||X - transform(X) H||_F / ||X||_F`` (greater is better, for ``GridSearchCV``)."""
        self._check_fitted()
        self._check_params()
        Xs, _ = self._as_samples(X, reset=False)
        Xd = torch.as_tensor(Xs.toarray(), dtype=torch.float64) if hasattr(Xs, "toarray") else Xs
        Xd = Xd.detach().to(device=self._basis.device, dtype=self._basis.dtype) / self.scale_
        with using_threads(self.threads):
            rec = self._basis @ self._project(Xd.T)  # (L, n_samples)
        return -float(torch.linalg.matrix_norm(Xd.T - rec) / torch.linalg.matrix_norm(Xd).clamp_min(1e-300))
