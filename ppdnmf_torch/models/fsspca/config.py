"""FSSPCA's specs: every setting's default, type and range, written once.

* :class:`FSSPCASpec`: Algorithm 1 with a server (:func:`~.fit.fit_fsspca`; the ``solver``
  section of ``task=fsspca``);
* :class:`ServerlessSpec`: what the serverless variant adds (:func:`~.serverless.fit_serverless`:
  the consensus over a graph of workers through the library's exchange; ``variant=serverless``);
* :class:`TaskSpec`: the problem of a data set (its loadings and ``lambda_1``, and how its rows
  are dealt to the workers: ``task=fsspca``'s ``n_components``, ``alpha``, ``n_workers`` and
  ``split``; the functions' ``alpha``);
* :class:`EstimatorSpec`: the estimator's own defaults (:class:`~.estimator.FederatedSparsePCA`,
  after scikit-learn's ``SparsePCA``);
* :class:`RunSpec`: the functions' run settings (trials, seed, checkpoints; the app has its own).

:data:`SPEC`, :data:`SERVERLESS`, :data:`TASK`, :data:`ESTIMATOR` and :data:`RUN` are the defaults the
functions' keywords, the estimator and ``conf/fsspca/`` read (a test checks each against its
spec). A spec refuses a value of the wrong type rather than converting it
(:mod:`ppdnmf_torch.specs`): ``FSSPCASpec(max_iter=2.5)``, ``EstimatorSpec(n_components="2")``
are one :class:`~ppdnmf_torch.errors.ConfigError` each, naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...exchange.aggregation import AGGREGATION_KINDS
from ...exchange.spec import EXCHANGE_KINDS
from ...penalties import PENALTY_MODES
from ...specs import check_fields, rule
from .admm import LINE_SEARCHES, LOCAL_SOLVERS
from .data import DATASETS, SPLITS
from .smoothing import DEFAULT_SMOOTHING, SMOOTHINGS

__all__ = ["FSSPCASpec", "ServerlessSpec", "TaskSpec", "EstimatorSpec", "RunSpec", "SPEC", "SERVERLESS", "TASK",
           "ESTIMATOR", "RUN",
           "RHO_RULES", "CONSENSUS_METHODS", "INITS", "DTYPES", "DATA_PRESETS"]

#: ``rho`` by rule: ``"auto"`` one penalty, ``rho_scale`` times the workers' mean ``lambda_max(C_i)``;
#: ``"worker"`` each worker ``rho_scale lambda_max(C_i)``
RHO_RULES = ("auto", "worker")
#: the decentralized methods of step 2 without a server
CONSENSUS_METHODS = ("admm", "laplacian")
#: the named starts (None: random per trial)
INITS = ("pca",)
#: what ``alpha`` is relative to: nothing (``lambda_1 = alpha``, problem (6) as written) or the sum of
#: the workers' largest Gram eigenvalues (``lambda_1 = alpha sum_i lambda_max(C_i)``, the sum that
#: ``rho="auto"`` aggregates: then the z-step's threshold ``lambda_1 / (K rho)`` is
#: ``alpha / rho_scale`` under ``rho="auto"``, the same sparsity at any scale of the data)
ALPHA_SCALES = ("none", "gram")
DTYPES = ("float64", "float32")
#: the data sets the app names (scikit-learn's bundled ones and the spiked-covariance generator)
DATA_PRESETS = ("spiked", *DATASETS)


@dataclass(frozen=True)
class FSSPCASpec:
    """Algorithm 1's settings (:func:`~.fit.fit_fsspca`; docs/FSSPCA.md says how each was chosen).

    Attributes
    ----------
    lambda_2 : float, list of float, or None
        The smooth term's weight (None: ``alpha / K``).
    smoothing : {"sqrt", "huber", "logexp", "erf"}
    mu : float
        The smoothing parameter.
    rho : "auto", "worker", float or list of float
        The ADMM penalty, or its rule.
    rho_scale : float
        The factor of ``rho``'s rules.
    line_search : {"armijo", "wolfe"}
    inner_steps : int
        Local steps per worker per ADMM iteration.
    local_solver : {"polar", "riemannian"}
        A worker's step (14): majorize-minimize polar steps (the default: docs/FSSPCA.md, "The polar
        step") or the paper's Riemannian steepest descent with ``line_search``.
    aggregation : {"plain", "quantized", "paillier", "secagg"}
        How the server gets the sums.
    center : bool
        Centre the pooled data with the (secure) global mean.
    alpha_scale : {"none", "gram"}
        What ``alpha`` is relative to (:data:`ALPHA_SCALES`; the estimator's is ``"gram"``).
    max_iter : int
    tol : float
    trials, seed : int
    init : "pca" or None
        The start (None: random per trial).
    """

    lambda_2: float | list[float] | None = rule(None, ge=0)
    smoothing: str = rule(DEFAULT_SMOOTHING, choices=tuple(SMOOTHINGS))
    mu: float = rule(1e-3, gt=0)
    rho: str | float | list[float] = rule("auto", gt=0, choices=RHO_RULES)
    rho_scale: float = rule(2.0, gt=0)
    line_search: str = rule("armijo", choices=LINE_SEARCHES)
    inner_steps: int = rule(4, ge=1)
    local_solver: str = rule("polar", choices=LOCAL_SOLVERS)
    aggregation: str = rule("secagg", choices=AGGREGATION_KINDS)
    center: bool = True
    alpha_scale: str = rule("none", choices=ALPHA_SCALES)
    max_iter: int = rule(500, ge=1)
    tol: float = rule(1e-6, ge=0)
    init: str | None = rule(None, choices=INITS)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class ServerlessSpec:
    """What :func:`~.serverless.fit_serverless` adds to :class:`FSSPCASpec` (docs/FSSPCA.md,
    "Serverless variant").

    Attributes
    ----------
    consensus : {"laplacian", "admm"}
        The decentralized method of step 2.
    inner_iters : int
        Consensus iterations (exchange calls) per ADMM iteration.
    exchange : {"plain", "quantized", "paillier", "secagg"}
        How neighbours exchange (its settings: the function's ``exchange_options``).
    g_cap : float
        The agreed cap of the penalties.
    penalty_mode : {"random", "fixed"}
    center_iters : int
        Laplacian steps that agree on the global mean.
    """

    consensus: str = rule("laplacian", choices=CONSENSUS_METHODS)
    inner_iters: int = rule(3, ge=1)
    exchange: str = rule("secagg", choices=EXCHANGE_KINDS)
    g_cap: float = rule(0.7, gt=0)
    penalty_mode: str = rule("random", choices=PENALTY_MODES)
    center_iters: int = rule(100, ge=1)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class TaskSpec:
    """The problem of a data set (:func:`~.experiments.run_task`): its loadings, and how its rows
    are dealt to the workers (:func:`~.data.split_rows`).

    Attributes
    ----------
    n_components : int
        ``r``, the number of loadings.
    alpha : float or list of float
        ``lambda_1``, the weight of ``||z||_1`` in problem (6) (one per trial: a list; 0: PCA).
    n_workers : int
        ``K``.
    split : {"iid", "class", "dirichlet"}
        IID, sorted by class and cut, or class shares per worker from ``Dirichlet(concentration)``.
    concentration : float
    """

    n_components: int = rule(2, ge=1)
    alpha: float | list[float] = rule(0.0, ge=0)
    n_workers: int = rule(4, ge=1)
    split: str = rule("iid", choices=SPLITS)
    concentration: float = rule(0.5, gt=0)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class EstimatorSpec:
    """The estimator's own defaults beside :class:`FSSPCASpec`'s (:class:`~.estimator.FederatedSparsePCA`).

    Attributes
    ----------
    n_components : int or None
        None: every feature (``SparsePCA``'s).
    alpha : float
        The weight of the l1 term relative to the data (the estimator fits with
        ``alpha_scale="gram"``: ``lambda_1 = alpha sum_i lambda_max(C_i)``; the functional fit's
        default is 0, plain PCA). 0.03: on scikit-learn's digits with every component the fit
        converges within ``max_iter`` (318-767 iterations over ``random_state`` 0-11; 0.01 does
        not within 500, 0.02 at 2 of 4 seeds) to 98.4 % zeros (docs/FSSPCA.md, "The estimator's
        alpha").
    n_workers : int
        Workers of an IID split of one array given without ``groups``.
    max_iter : int
        ADMM iterations at most: 1000, ``SparsePCA``'s (the functions' 500 cut digits with every
        component at 2 of 12 ``random_state`` values at the default ``alpha``).
    device : str
    dtype : {"float64", "float32"}
    threads : int or None
        torch's intra-op threads for ``fit`` (None: the package's default).
    verbose : int
        0: silent; 1 or more: the fit's progress (:class:`~ppdnmf_torch.driver.progress.FitProgress`).
    """

    n_components: int | None = rule(None, ge=1)
    alpha: float = rule(0.03, ge=0)
    n_workers: int = rule(1, ge=1)
    max_iter: int = rule(1000, ge=1)
    device: str = "cpu"
    dtype: str = rule("float64", choices=DTYPES)
    threads: int | None = rule(None, ge=1)
    verbose: int = rule(0, ge=0)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RunSpec:
    """The run settings of the functions (:func:`~.fit.fit_fsspca`, :func:`~.serverless.fit_serverless`,
    :func:`~.experiments.run_task`); the app's are its run keys (``conf/config.yaml``).

    Attributes
    ----------
    trials : int
        Independent trials batched in one fit.
    seed : int
        The starts (and the split) from ``seed``.
    checkpoint_every : int
        ADMM iterations between two checkpoints in ``checkpoint_dir``.
    """

    trials: int = rule(1, ge=1)
    seed: int = rule(0, ge=0)
    checkpoint_every: int = rule(50, ge=0)

    def __post_init__(self):
        check_fields(self)


#: the defaults of every entry point
SPEC = FSSPCASpec()
SERVERLESS = ServerlessSpec()
TASK = TaskSpec()
ESTIMATOR = EstimatorSpec()
RUN = RunSpec()
