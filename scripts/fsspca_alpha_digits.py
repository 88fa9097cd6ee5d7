"""FederatedSparsePCA's ``alpha`` on scikit-learn's digits beside SparsePCA's default, in one process
(docs/FSSPCA.md, "The estimator's alpha"; issue 40): for each ``n_components`` and ``alpha`` the
estimator with its other defaults and ``random_state=0``, then ``SparsePCA(n_components,
random_state=0)``.

One JSON object per line on stdout: ``n_components`` (``"all"`` for None), ``estimator``, ``alpha``,
``seconds``, ``n_iter``, ``max_iter``, ``converged`` (no ``ConvergenceWarning``), ``zeros`` (share
of zeros in ``components_``) and ``variance`` (Zou et al.'s adjusted variance ratio of
``components_``, as ``scripts/estimators_vs_sklearn.py`` computes it).

    python scripts/fsspca_alpha_digits.py [--ranks all 10] [--alphas 0.001 0.01 0.02 0.03 0.05]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sklearn.datasets import load_digits  # noqa: E402
from sklearn.decomposition import SparsePCA  # noqa: E402

from estimators_vs_sklearn import _run, adjusted_variance_ratio  # noqa: E402
from ppdnmf_torch import FederatedSparsePCA  # noqa: E402


def _row(X, rank, name, alpha, est, seconds, converged):
    print(json.dumps(dict(n_components="all" if rank is None else rank, estimator=name, alpha=alpha,
                          seconds=round(seconds, 1), n_iter=int(est.n_iter_), max_iter=int(est.max_iter),
                          converged=bool(converged), zeros=float((est.components_ == 0).mean()),
                          variance=adjusted_variance_ratio(X, est.components_))), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", nargs="*", default=["all", "10"], help="n_components values ('all': None)")
    ap.add_argument("--alphas", nargs="*", type=float, default=[0.001, 0.01, 0.02, 0.03, 0.05])
    args = ap.parse_args(argv)
    X = load_digits().data.astype(np.float64)
    for r in args.ranks:
        rank = None if r == "all" else int(r)
        for a in args.alphas:
            est, s, ok = _run(lambda: FederatedSparsePCA(n_components=rank, alpha=a, random_state=0), X)
            _row(X, rank, "FederatedSparsePCA", a, est, s, ok)
        est, s, ok = _run(lambda: SparsePCA(n_components=rank, random_state=0), X)
        _row(X, rank, "SparsePCA", est.alpha, est, s, ok)


if __name__ == "__main__":
    main()
