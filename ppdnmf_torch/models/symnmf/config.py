"""Symmetric NMF's specs: every setting's default, type and range, written once.

* :class:`SymNMFSpec`: the centralized fit (:func:`~.fit.fit_symnmf`, ``task=symnmf``'s
  ``solver`` section);
* :class:`AgentsSpec`: the fit across agents (:func:`~.agents.fit_symnmf_agents`, its run over
  ranks :func:`~.distributed.fit_symnmf_rank`, ``task=symnmf variant=agents``'s ``agents`` section);
* :class:`ClusteringSpec`: the clusterer's own settings (:class:`~.estimator.SymmetricNMF`, beside
  :class:`SymNMFSpec`'s solver settings);
* :class:`RankSpec`: how a run over ranks places and shares the agents;
* :class:`RunSpec`: the functions' run settings (trials, seed, checkpoints; the app has its own,
  ``conf/config.yaml``).

:data:`SPEC`, :data:`AGENTS`, :data:`CLUSTERING`, :data:`RANKS` and :data:`RUN` are the defaults: the keyword
defaults of the functions and the estimator read them (``max_iter=SPEC.max_iter``), and the app's
``conf/symnmf/`` configs hold the same values (a test checks each against its spec). A spec
refuses a value of the wrong type rather than converting it (:mod:`ppdnmf_torch.specs`):
``SymNMFSpec(max_iter=2.5)``, ``ClusteringSpec(n_clusters="2")``, ``ClusteringSpec(dtype="float16")``
are one :class:`~ppdnmf_torch.errors.ConfigError` each, naming the key.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...distributed.partition import PARTITION_METHODS
from ...exchange.aggregation import AGGREGATION_KINDS
from ...exchange.spec import EXCHANGE_KINDS
from ...penalties import PENALTY_MODES
from ...specs import check_fields, rule

__all__ = ["SymNMFSpec", "AgentsSpec", "ClusteringSpec", "RankSpec", "RunSpec", "SPEC", "AGENTS", "CLUSTERING",
           "RANKS", "RUN",
           "METHODS", "PENALTY_RULES", "INITS", "AFFINITIES", "DTYPES", "AGENTS_SCHEDULES", "AGENTS_STARTS",
           "SHARE_MODES", "ADAPTIVE_LAMBDA0"]

#: every method name; ``kuang`` is SymANLS under Kuang et al.'s 1.01 schedule
METHODS = ("symhals", "a_symhals", "symanls", "kuang", "pgd", "admm", "beta", "tsvd")
#: the rules of ``lambda`` by name (a number, or one per trial, is a fixed ``lambda``)
PENALTY_RULES = ("adaptive", "bound", "kuang")
#: the starts ``U_0``: uniform on ``[0, 2 sqrt(mean(S) / r)]`` (``scaled``) or on ``[0, 1]`` (``uniform``)
INITS = ("scaled", "uniform")
#: the similarity of the clusterer: Kuang et al.'s kNN graph of samples, or one given
AFFINITIES = ("knn", "precomputed")
DTYPES = ("float64", "float32")
#: the consensus penalties' schedules across agents: one common draw per ADMM iteration on every
#: edge (``agreed``, :class:`~ppdnmf_torch.penalties.PenaltySampler` with ``shared=True``), or
#: every directed edge its own monotone draw under its agent's cap (``paper``)
AGENTS_SCHEDULES = ("agreed", "paper")
#: the starts of the agents' ``V_i``: drawn from each agent's own stream (``private``), or the rows
#: of the common start ``U_0[S_i]`` (``common``: public, so the first message inverts to the
#: agent's columns; kept for the audit's before/after)
AGENTS_STARTS = ("private", "common")
#: what crosses ranks besides the exchange's messages: per-agent scalars, or per-rank sums
SHARE_MODES = ("all", "sums")
#: ``lambda_0`` of the adaptive rule (20) across agents. Not the paper's 1e-5: with a near-zero
#: ``lambda`` nothing fixes the gauge ``U -> U A``, ``V -> V A^-T`` of ``X ~ U V^T``, and the agents'
#: copies drift apart in it (measured on digits, 600 points, N = 10: E blows up to 1e6 from
#: 1e-5 and 1e-2, converges from 0.1; docs/RESULTS.md, "Symmetric NMF")
ADAPTIVE_LAMBDA0 = 0.1


@dataclass(frozen=True)
class SymNMFSpec:
    """The centralized fit's settings (:func:`~.fit.fit_symnmf`).

    Attributes
    ----------
    method : str
        One of :data:`METHODS`.
    penalty : {"adaptive", "bound", "kuang"}, float, list of float, or None
        ``lambda``: a rule, a fixed value, or one fixed value per trial; None: the method's
        default (``adaptive`` for the split methods, ``kuang`` for ``kuang``, ``bound`` for
        ``admm``, none for ``pgd``, ``beta``, ``tsvd``).
    lam0 : float or None
        ``lambda_0`` of ``adaptive`` (None: 1e-5, the paper's) or ``kuang`` (None: 1e-5, what the paper's Fig. 3 implies).
    max_iter : int
        Outer iterations. 5000: SymHALS under the adaptive rule from the paper's ``lambda_0 = 1e-5``
        spends up to ~1000 iterations raising ``lambda`` and ended the noise-free ``n = 150,
        r = 6`` case within 3534 (12 starts; docs/SYMNMF.md, "Stopping"); 500 cut it near ``E = 1e-2``.
    tol : float
        A trial stops once the scaled projected-gradient residual of (2) at ``U``
        (:func:`~.objective.stationarity`) is ``<= tol``; 0: never.
    init : {"scaled", "uniform"}
        The start of the presets and the estimator (:func:`~.estimator.scaled_start`).
    """

    method: str = rule("symhals", choices=METHODS)
    penalty: str | float | list[float] | None = rule(None, ge=0, choices=PENALTY_RULES)
    lam0: float | None = rule(None, gt=0)
    max_iter: int = rule(5000, ge=1)
    tol: float = rule(1e-5, ge=0)
    init: str = rule("scaled", choices=INITS)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class AgentsSpec:
    """The settings of the fit across agents (:func:`~.agents.fit_symnmf_agents`; over ranks,
    :func:`~.distributed.fit_symnmf_rank`).

    Attributes
    ----------
    n_agents : int
        ``N``, each holding the columns ``X[:, S_i]``.
    exchange : {"plain", "quantized", "paillier", "secagg"}
        How neighbours exchange (the kind's settings: the functions' ``exchange_options``).
    penalty : "adaptive" or float
        ``lambda``: eq. (20) from ``lam0``, or fixed.
    lam0 : float
        ``lambda_0`` of the adaptive rule (:data:`ADAPTIVE_LAMBDA0`).
    mu : "auto" or float
        The X-step's ADMM penalty (``"auto"``: per agent and X-step, from its own ``V_i``).
    g_cap : float
        The cap of the consensus penalties (0.3 suits a normalized similarity).
    penalty_mode : {"random", "fixed"}
    penalty_schedule : {"agreed", "paper"}
    x_iters, y_iters : int
        ADMM iterations per X-step, HALS sweeps per Y-step.
    max_iter : int
        Outer iterations. 5000, the centralized fit's: on the noise-free ``X = W W^T`` (n = 60,
        r = 3, 4 agents, 16 reproducible starts, ``scripts/symnmf_agents_stop.py``) the default
        ``tol`` stopped 14 runs within 1985; two starts of ``X / ||X||_2`` had not reached it at
        5000 (``E`` 3.5e-9 and 9.2e-9 there: they warn). docs/SYMNMF.md, "Across agents", Stopping.
    tol : float
        Stop once, in every trial, the agents' stationarity residual of (2) (the scaled
        projected gradient at their own copies, summed over agents:
        :func:`~.agent_steps.stationarity_terms`) and their consensus error are both ``<= tol``;
        0: never. 1e-5, the centralized fit's: on the runs above it stopped at ``E <= 4.5e-7``
        but once at ``E = 8.3e-6`` (near a critical point); 3e-5 let ``E`` up to 4.3e-6.
    min_degree : int or None
        Refuse a graph with an agent of fewer neighbours.
    aggregation : {"plain", "quantized", "paillier", "secagg"} or None
        How the adaptive rule's three sums are added (None: the exchange's kind).
    start : {"private", "common"}
        The agents' ``V_i`` at the start.
    start_seed : int or None
        Reproducible private starts (None: each agent's own CSPRNG draw).
    """

    n_agents: int = rule(10, ge=1)
    exchange: str = rule("secagg", choices=EXCHANGE_KINDS)
    penalty: str | float = rule("adaptive", ge=0, choices=("adaptive",))
    lam0: float = rule(ADAPTIVE_LAMBDA0, gt=0)
    mu: str | float = rule("auto", gt=0, choices=("auto",))
    g_cap: float = rule(0.3, gt=0)
    penalty_mode: str = rule("random", choices=PENALTY_MODES)
    penalty_schedule: str = rule("agreed", choices=AGENTS_SCHEDULES)
    x_iters: int = rule(10, ge=1)
    y_iters: int = rule(1, ge=1)
    max_iter: int = rule(5000, ge=1)
    tol: float = rule(1e-5, ge=0)
    min_degree: int | None = rule(None, ge=1)
    aggregation: str | None = rule(None, choices=AGGREGATION_KINDS)
    start: str = rule("private", choices=AGENTS_STARTS)
    start_seed: int | None = rule(None, ge=0)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class ClusteringSpec:
    """The clusterer's settings beside the solver's (:class:`~.estimator.SymmetricNMF`).

    Attributes
    ----------
    n_clusters : int
        ``r``, the number of clusters (scikit-learn's ``SpectralClustering`` name).
    affinity : {"knn", "precomputed"}
    n_neighbors : int or None
        ``kk`` of the kNN graph (None: ``floor(log2 n) + 1``).
    n_init : int
        Starts run as one batch; the lowest ``E`` is kept.
    tol : float
        The clusterer's stopping tolerance on the stationarity residual (:class:`SymNMFSpec`'s
        ``tol``, the same value: the noise-free ``X = U U^T`` ends at ``E <= 1e-6`` under it).
    device : {"auto", "cpu", "cuda"} or "cuda:<k>"
    dtype : {"float64", "float32"} or None
        None: float64.
    threads : int or None
        torch's intra-op threads for ``fit`` and ``predict`` (None: the package's default).
    verbose : int
        0: silent; 1 or more: the fit's progress (:class:`~ppdnmf_torch.driver.progress.FitProgress`).
    """

    n_clusters: int = rule(2, ge=1)
    affinity: str = rule("knn", choices=AFFINITIES)
    n_neighbors: int | None = rule(None, ge=1)
    n_init: int = rule(1, ge=1)
    tol: float = rule(1e-5, ge=0)
    device: str = "auto"
    dtype: str | None = rule(None, choices=DTYPES)
    threads: int | None = rule(None, ge=1)
    verbose: int = rule(0, ge=0)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RankSpec:
    """How a run over ranks (:func:`~.distributed.fit_symnmf_rank`) places and shares the agents.

    Attributes
    ----------
    partition : {"rcm", "block"}
        Which rank holds which agent.
    share : {"all", "sums"}
        What crosses ranks for the adaptive penalty: per-agent scalars (the one-process bits)
        or per-rank sums.
    """

    partition: str = rule("rcm", choices=PARTITION_METHODS)
    share: str = rule("all", choices=SHARE_MODES)

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RunSpec:
    """The run settings of the functions (:func:`~.fit.fit_symnmf`, :func:`~.agents.fit_symnmf_agents`,
    :func:`~.distributed.fit_symnmf_rank`); the app's are its run keys (``conf/config.yaml``).

    Attributes
    ----------
    trials : int
        Independent trials batched in one fit.
    seed : int
        Trial ``t``'s start (and graph, split) from ``seed + t``.
    checkpoint_every : int
        Outer iterations between two checkpoints in ``checkpoint_dir`` (0: only at the end).
    """

    trials: int = rule(1, ge=1)
    seed: int = rule(0, ge=0)
    checkpoint_every: int = rule(0, ge=0)

    def __post_init__(self):
        check_fields(self)


#: the defaults of every entry point
SPEC = SymNMFSpec()
AGENTS = AgentsSpec()
CLUSTERING = ClusteringSpec()
RANKS = RankSpec()
RUN = RunSpec()
