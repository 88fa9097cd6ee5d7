"""PPDNMF: privacy-preserving distributed NMF (arXiv 2403.18326, Algorithm 1).

The model's package, in the shape every model of :mod:`ppdnmf_torch.models` has:

* :mod:`.config`: its spec, the single source of every setting's default and rule
  (:class:`~.config.SolverConfig`, :class:`~.config.FitOptions`), and the typed config of a
  run of the app (:class:`~.config.RunConfig`);
* :mod:`.problem` and :mod:`.solver`: the batched problem and the batched BCD/ADMM solver;
* :mod:`.api`: the functional :func:`~.api.fit` (and :func:`~.api.fit_trials`,
  :func:`~.api.fit_centralized`) returning a result object (:mod:`.result`:
  :class:`~.result.FitResult`), through :mod:`.run` (the exchange made, the checks and
  warnings, checkpoints, the loop);
* :mod:`.estimator`: :class:`~.estimator.PPDNMF`, a scikit-learn-style estimator;
* :mod:`.inputs` and :mod:`.experiments`: a run's inputs built from its spec, and the
  paper's experiments as batched trials (:func:`~.experiments.run_experiment`);
* :mod:`.distributed`: its agents over ``torch.distributed`` ranks (:func:`~.distributed.fit_rank`);
* :mod:`.audit`: the privacy audit's scenarios of its runs (:func:`~.audit.run_audit`).

It imports the shared engine only (never another model, never the app); the app runs it
through :mod:`ppdnmf_torch.app.tasks.ppdnmf`.
"""
from .api import fit, fit_centralized, fit_trials
from .config import PAPER_SETTINGS
from .result import FitResult, TrialsResult
from .estimator import PPDNMF
from .experiments import ExperimentResult, run_experiment

__all__ = ["fit", "fit_trials", "fit_centralized", "PPDNMF", "run_experiment", "PAPER_SETTINGS", "FitResult",
           "TrialsResult", "ExperimentResult"]
