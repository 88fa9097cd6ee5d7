"""The symmetric-NMF study behind Table I (scripts/studies/symnmf.py, out of the library): the
ADMM runs to its own convergence or its own cap, the other methods a fixed count."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.fixture(scope="module")
def blobs():
    rng = np.random.default_rng(0)
    centers = rng.uniform(0, 10, size=(3, 8))
    y = np.repeat(np.arange(3), 20)
    return centers[y] + rng.normal(size=(60, 8)), y


@pytest.mark.parametrize("admm_tol, admm_stops_early", [(0.0, False), (1.0, True)])
def test_admm_runs_to_its_own_stop_and_the_others_a_fixed_count(blobs, admm_tol, admm_stops_early):
    from studies.symnmf import clustering_run

    M, y = blobs
    res = clustering_run(M, y, 3, methods=["symhals", "admm"], iters=4, trials=2, eval_every=2, admm_iters=12,
                         admm_tol=admm_tol)
    assert res["symhals"]["n_iter"].tolist() == [4, 4] and res["symhals"]["tol"] == 0
    admm = res["admm"]
    assert admm["tol"] == admm_tol
    if admm_stops_early:  # a loose tolerance: each start stops on it before the cap
        assert bool(admm["converged"].all()) and int(admm["n_iter"].max()) < 12
    else:
        assert admm["n_iter"].tolist() == [12, 12] and not bool(admm["converged"].any())
        assert admm["iters"].max() == 12  # the accuracy curve follows it to the cap


def test_without_admm_iters_the_admm_runs_the_common_count(blobs):
    from studies.symnmf import clustering_run

    M, y = blobs
    res = clustering_run(M, y, 3, methods=["admm"], iters=4, trials=1, eval_every=2, admm_tol=0.0)
    assert res["admm"]["n_iter"].tolist() == [4]
