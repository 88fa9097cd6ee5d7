"""Symmetric NMF for graph clustering: the similarity construction (docs/SYMMETRIC_NMF.md,
"Graph clustering"), the clustering metrics and the SymmetricNMF estimator."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from sklearn.metrics import normalized_mutual_info_score

from ppdnmf_torch.errors import ConfigError, DataError
from ppdnmf_torch.models.symnmf.clustering import (
    cluster_labels,
    cluster_scores,
    clustering_accuracy,
    contingency,
    normalized_mutual_info,
)
from ppdnmf_torch.models.symnmf.similarity import default_neighbors, knn_graph, similarity_matrix


def reference_similarity(M, kk=None, nn=7):
    """A direct numpy transcription of the spec's steps 1-3 (Kuang et al.'s ``scale_dist3_knn`` and
    the authors' ``calcu_similarity_matrix.m``): dense distances, a sort of every column."""
    M = np.asarray(M, dtype=np.float64)
    n = M.shape[0]
    kk = int(np.floor(np.log2(n))) + 1 if kk is None else kk
    kk, nn = min(kk, n - 1), min(nn, n - 1)
    D = ((M[:, None, :] - M[None, :, :]) ** 2).sum(-1)  # step 1
    order = np.argsort(D, axis=0, kind="stable")  # column j sorted; the point itself first
    sigma = np.sqrt(D[order[nn], np.arange(n)])  # the nn-th neighbour, unsquared
    A = np.zeros((n, n))
    for j in range(n):  # step 2: the symmetric kNN graph
        for i in order[1:kk + 1, j]:
            A[i, j] = A[j, i] = np.exp(-D[i, j] / (sigma[i] * sigma[j]))
    np.fill_diagonal(A, 0.0)
    dd = np.sqrt(1.0 / A.sum(0))  # step 3: column sums, as bsxfun does
    A = (A * dd[None, :]).T * dd[None, :]
    return (A + A.T) / 2


def _blobs(n, p, k, seed):
    rng = np.random.default_rng(seed)
    centers = 5.0 * rng.standard_normal((k, p))
    y = np.arange(n) % k
    return centers[y] + rng.standard_normal((n, p)), y


@pytest.mark.parametrize("n,p,kk", [(40, 3, None), (75, 6, 4), (12, 2, 20)])
def test_similarity_equals_the_numpy_transcription(n, p, kk):
    M = np.random.default_rng(n).random((n, p))
    X = similarity_matrix(M, n_neighbors=kk, device="cpu").numpy()
    R = reference_similarity(M, kk)
    np.testing.assert_allclose(X, R, rtol=1e-12, atol=1e-15)
    assert np.array_equal(X, X.T) and (np.diag(X) == 0).all() and (X >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_similarity_sparse_equals_dense_and_follows_dtype(dtype, device):
    M = torch.rand((90, 5), generator=torch.Generator().manual_seed(1), dtype=dtype).to(device)
    dense = similarity_matrix(M, sparse=False, device=device, block_rows=7)
    csr = similarity_matrix(M, sparse=True, device=device)
    assert csr.layout == torch.sparse_csr and dense.dtype == dtype and dense.device.type == device.type
    assert torch.equal(csr.to_dense(), dense)
    # O(n kk) entries: every point has between kk and (a few times) kk neighbours
    nnz = csr.crow_indices().diff()
    assert int(nnz.min()) >= default_neighbors(90) and int(nnz.sum()) <= 90 * 3 * default_neighbors(90)


def test_similarity_choices_pinned():
    # self first: coincident points (a duplicate) stay each other's neighbour
    M = np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [3.0, 0.0], [7.0, 0.0], [8.0, 1.0], [2.0, 5.0],
                  [4.0, 4.0], [9.0, 9.0], [6.0, 2.0]])
    d, idx = knn_graph(torch.as_tensor(M), 3)
    assert idx[0, 0] == 1 and idx[1, 0] == 0 and d[0, 0] == 0
    # seven copies of a point: sigma = 0, the kernel between copies is 1 (not NaN)
    M = np.vstack([np.zeros((8, 2)), np.random.default_rng(0).random((8, 2)) + 1.0])
    X = similarity_matrix(M, device="cpu").numpy()
    assert np.isfinite(X).all() and X[0, 1] > 0
    # kk = floor(log2 n) + 1
    assert default_neighbors(400) == 9 and default_neighbors(1797) == 11


def test_similarity_bad_input():
    with pytest.raises(DataError, match="M:"):
        similarity_matrix(np.ones((2, 3)))
    with pytest.raises(DataError, match="NaN"):
        similarity_matrix(np.array([[0.0, np.nan], [1, 2], [3, 4]]))
    with pytest.raises(ConfigError, match="n_neighbors"):
        similarity_matrix(np.random.rand(10, 2), n_neighbors=0)
    with pytest.raises(ConfigError, match="sparse"):
        similarity_matrix(np.random.rand(10, 2), sparse="yes")


def test_accuracy_hungarian_on_known_labels():
    y = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    assert clustering_accuracy(y, (y + 1) % 3) == 1.0  # a renaming
    assert clustering_accuracy(y, np.array([5, 5, 7, 7, 7, 9, 9, 9, 9])) == pytest.approx(8 / 9)
    # greedy matching would give cluster 0 to class 0 (3 points) and lose class 1's two
    y = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2])
    p = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1])
    assert clustering_accuracy(y, p) == pytest.approx(6 / 9)
    # more clusters than classes: an unmatched cluster counts as wrong
    assert clustering_accuracy(np.zeros(4, int), np.array([0, 0, 1, 2])) == 0.5
    # batched over trials
    acc = clustering_accuracy(y, np.stack([y, p]))
    np.testing.assert_allclose(acc, [1.0, 6 / 9])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nmi_equals_scikit_learn(seed):
    rng = np.random.default_rng(seed)
    y, p = rng.integers(0, 5, 200), rng.integers(0, 7, 200)
    assert normalized_mutual_info(y, p) == pytest.approx(normalized_mutual_info_score(y, p), abs=1e-12)
    assert normalized_mutual_info(y, y) == pytest.approx(1.0)
    assert normalized_mutual_info(np.zeros(5), np.zeros(5)) == 1.0
    assert normalized_mutual_info(np.zeros(6), np.arange(6) % 2) == 0.0
    batch = normalized_mutual_info(y, np.stack([p, y]))
    np.testing.assert_allclose(batch, [normalized_mutual_info_score(y, p), 1.0], atol=1e-12)


def test_labels_and_contingency():
    U = torch.tensor([[[0.1, 0.9], [0.8, 0.2], [0.0, 0.0]]])
    assert cluster_labels(U).tolist() == [[1, 0, 0]]
    C = contingency([0, 0, 1], [1, 1, 1])
    assert C.tolist() == [[2.0], [1.0]]
    assert cluster_scores([1, 0, 0], U[0]) == {"accuracy": 1.0, "nmi": pytest.approx(1.0)}
    with pytest.raises(DataError, match="y_true/y_pred"):
        clustering_accuracy([0, 1], [0, 1, 2])


# -- the estimator -------------------------------------------------------------------------
from ppdnmf_torch.models.symnmf.estimator import SymmetricNMF  # noqa: E402


def test_estimator_clusters_blobs_and_follows_conventions():
    M, y = _blobs(120, 4, 3, seed=0)
    est = SymmetricNMF(3, random_state=0, max_iter=200)
    labels = est.fit_predict(M)
    assert clustering_accuracy(y, labels) == 1.0
    assert est.embedding_.shape == (120, 3) and isinstance(est.embedding_, np.ndarray)
    assert np.array_equal(est.labels_, est.embedding_.argmax(1)) and est.n_features_in_ == 4
    assert est.n_iter_ >= 1 and est.lambda_ > 0 and 0 <= est.relative_err_ < 1
    params = est.get_params()
    assert params["n_clusters"] == 3 and params["affinity"] == "knn" and params["random_state"] == 0
    est.set_params(max_iter=7)
    assert est.max_iter == 7
    # the same random_state, the same result; precomputed equals knn on the same similarity
    again = SymmetricNMF(3, random_state=0, max_iter=200).fit(M)
    np.testing.assert_array_equal(again.embedding_, SymmetricNMF(3, random_state=0, max_iter=200).fit(M).embedding_)
    pre = SymmetricNMF(3, affinity="precomputed", random_state=0, max_iter=200).fit(again.affinity_matrix_)
    np.testing.assert_allclose(pre.embedding_, again.embedding_, rtol=1e-10, atol=1e-12)
    sparse = SymmetricNMF(3, affinity="precomputed", random_state=0, max_iter=200).fit(
        sp.csr_matrix(again.affinity_matrix_))
    assert clustering_accuracy(y, sparse.labels_) == 1.0


def test_estimator_bad_parameters():
    M, _ = _blobs(30, 2, 2, seed=1)
    with pytest.raises(ConfigError, match="affinity"):
        SymmetricNMF(2, affinity="rbf").fit(M)
    with pytest.raises(ConfigError, match="n_clusters"):
        SymmetricNMF(0).fit(M)
    with pytest.raises(DataError, match="square"):
        SymmetricNMF(2, affinity="precomputed").fit(M)
    with pytest.raises(DataError, match="symmetric"):
        SymmetricNMF(2, affinity="precomputed").fit(np.triu(np.ones((5, 5))))


@pytest.mark.parametrize("affinity", ["knn", "precomputed"])
def test_check_estimator(affinity):
    """scikit-learn's estimator checks. Not applicable: ``check_array_api_input`` (skipped by
    scikit-learn itself without SCIPY_ARRAY_API); with ``affinity="precomputed"``,
    ``check_clustering`` (it fits raw ``(50, 2)`` samples, not a square similarity)."""
    from sklearn.utils.estimator_checks import check_estimator

    results = check_estimator(SymmetricNMF(3, affinity=affinity, max_iter=5), on_fail=None)
    bad = [(r["check_name"], str(r["exception"])[:200]) for r in results if r["status"] == "failed"]
    allowed = {"check_clustering"} if affinity == "precomputed" else set()
    assert {name for name, _ in bad} <= allowed, bad
    assert sum(r["status"] == "passed" for r in results) >= 40


# -- the app's presets ---------------------------------------------------------------------
from ppdnmf_torch.models.symnmf.presets import cluster_means, load_preset, run_preset  # noqa: E402

ORL_PATH = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data" / "orl_faces.mat"


def test_presets_samples_and_similarity_files(tmp_path):
    M, y = _blobs(45, 3, 3, seed=2)
    np.save(tmp_path / "m.npy", M)
    np.savetxt(tmp_path / "y.csv", y[:, None], delimiter=",")
    logs = []
    summary, arrays = run_preset("samples", path=tmp_path / "m.npy", labels_path=tmp_path / "y.csv", max_iter=60,
                                 tol=0, device="cpu", log_scalars=lambda k, d: logs.append(d))
    assert summary["rank"] == 3 and summary["accuracy"] == [1.0] and summary["nmi"][0] == pytest.approx(1.0)
    assert "symnmf/accuracy" in logs[-1] and "symnmf/E" in logs[0]
    np.testing.assert_allclose(arrays["cluster_means"].numpy(), cluster_means(M, arrays["labels"].numpy(), 3))
    S = similarity_matrix(M, device="cpu").numpy()
    sp.save_npz(tmp_path / "s.npz", sp.csr_matrix(S))
    again, arr2 = run_preset("similarity", path=tmp_path / "s.npz", rank=3, max_iter=60, tol=0, device="cpu")
    np.testing.assert_allclose(arr2["U"].numpy(), arrays["U"].numpy(), rtol=1e-9, atol=1e-12)
    with pytest.raises(ConfigError, match="path"):
        load_preset("orl")
    with pytest.raises(DataError, match="not found"):
        load_preset("samples", path=tmp_path / "none.npy")


@pytest.mark.skipif(not ORL_PATH.exists(), reason=f"ORL data not found at {ORL_PATH}")
def test_orl_preset_images():
    data = load_preset("orl", path=ORL_PATH)
    assert data["samples"].shape == (400, 10304) and data["rank"] == 40 and data["labels"].min() == 0
    _, arrays = run_preset("orl", path=ORL_PATH, max_iter=3, tol=0, device="cpu")
    assert arrays["cluster_mean_images"].shape == (40, 112, 92)
