"""Clustering by symmetric NMF: labels, accuracy with Hungarian matching, NMI.

docs/SYMMETRIC_NMF.md ("Metrics"): the label of point ``i`` is ``argmax_c U[i, c]``; the
accuracy is the fraction of points whose cluster, under the best one-to-one matching of
clusters to classes (Hungarian algorithm, :func:`scipy.optimize.linear_sum_assignment` on
the contingency table, as the authors' ``ClusteringMeasure.m`` does with ``bestMap``), is
their class; NMI is the mutual information over the arithmetic mean of the two entropies
(scikit-learn's ``normalized_mutual_info_score`` default).

Everything takes a batch of labelings (trial dimension first): the contingency tables
and the NMI are one batched torch computation; the assignment is scipy's, one small
``(c, c)`` problem per trial.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ...errors import DataError

__all__ = ["cluster_labels", "contingency", "clustering_accuracy", "normalized_mutual_info", "cluster_scores"]


def cluster_labels(U) -> torch.Tensor:
    """``argmax`` over the last dimension: ``U (..., n, r)`` -> labels ``(..., n)`` in ``0..r-1``.

    A row of zeros (a point no cluster claims) gets label 0, as MATLAB's ``max`` gives it.
    """
    U = torch.as_tensor(U)
    return U.argmax(dim=-1)


def _as_labels(y, what: str) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    if t.dtype.is_floating_point:
        if not bool((t == t.round()).all()):
            raise DataError(f"{what}: labels must be integers")
    elif t.dtype == torch.bool or t.is_complex():
        raise DataError(f"{what}: labels must be integers, got dtype {t.dtype}")
    return t.to(torch.long).cpu()


def _encode(y: torch.Tensor):
    """Labels ``(..., n)`` as indices ``0..c-1`` over the values that occur anywhere in the batch."""
    values, inv = torch.unique(y, return_inverse=True)
    return inv, values.numel()


def contingency(y_true, y_pred) -> torch.Tensor:
    """Counts ``C[..., a, b]`` of points of class ``a`` in cluster ``b``, float64.

    ``y_true (n,)`` or ``(T, n)``, ``y_pred (..., n)`` (broadcast against each other);
    classes and clusters are indexed by their sorted distinct values.
    """
    t, p = _as_labels(y_true, "y_true"), _as_labels(y_pred, "y_pred")
    if t.shape[-1] != p.shape[-1] or t.numel() == 0:
        raise DataError(f"y_true/y_pred: need the same number (>= 1) of points, got {t.shape[-1]} and {p.shape[-1]}")
    t, p = torch.broadcast_tensors(t, p)
    ti, ca = _encode(t)
    pi, cb = _encode(p)
    lead = t.shape[:-1]
    flat_t, flat_p = ti.reshape(-1, t.shape[-1]), pi.reshape(-1, t.shape[-1])
    B = flat_t.shape[0]
    code = (torch.arange(B)[:, None] * ca + flat_t) * cb + flat_p
    C = torch.bincount(code.reshape(-1), minlength=B * ca * cb).to(torch.float64)
    return C.view(*lead, ca, cb)


def clustering_accuracy(y_true, y_pred):
    """Accuracy under the best one-to-one matching of clusters to classes (Hungarian).

    Parameters
    ----------
    y_true : array-like (n,) or (T, n)
    y_pred : array-like (..., n)
        Labels of any integer values; a cluster matched to no class (more clusters than
        classes) counts as wrong.

    Returns
    -------
    float, or ndarray of the batch shape
    """
    C = contingency(y_true, y_pred)
    lead = C.shape[:-2]
    flat = C.reshape(-1, *C.shape[-2:]).numpy()
    n = flat[0].sum()
    acc = np.empty(flat.shape[0])
    for b, table in enumerate(flat):  # one small assignment problem per labeling
        rows, cols = linear_sum_assignment(table, maximize=True)
        acc[b] = table[rows, cols].sum() / n
    return float(acc[0]) if not lead else acc.reshape(lead)


def normalized_mutual_info(y_true, y_pred):
    """NMI ``I(y_true; y_pred) / mean(H(y_true), H(y_pred))``, natural logarithms.

    Equals scikit-learn's ``normalized_mutual_info_score`` (``average_method="arithmetic"``):
    1 when both labelings are constant, or identical up to a renaming.
    Returns a float, or an array of the batch shape.
    """
    C = contingency(y_true, y_pred)
    lead = C.shape[:-2]
    n = C.sum(dim=(-2, -1), keepdim=True)
    P = C / n
    pa, pb = P.sum(-1, keepdim=True), P.sum(-2, keepdim=True)
    ratio = torch.where(P > 0, P / (pa * pb), 1.0)
    mi = (P * ratio.log()).sum(dim=(-2, -1)).clamp_min(0.0)

    def entropy(p):
        return -(p * torch.where(p > 0, p, 1.0).log()).sum(dim=(-2, -1))

    ha, hb = entropy(pa), entropy(pb)
    denom = 0.5 * (ha + hb)
    # both labelings constant: identical partitions (scikit-learn's convention)
    nmi = torch.where(denom > 0, mi / denom.clamp_min(torch.finfo(torch.float64).tiny), 1.0)
    nmi = torch.where((ha == 0) ^ (hb == 0), 0.0, nmi).numpy()
    return float(nmi) if not lead else nmi


def cluster_scores(y_true, U) -> dict:
    """``{"accuracy", "nmi"}`` of the labels ``argmax U`` against ``y_true`` (floats, or
    arrays over the leading dimensions of ``U (..., n, r)``)."""
    labels = cluster_labels(U)
    return {"accuracy": clustering_accuracy(y_true, labels), "nmi": normalized_mutual_info(y_true, labels)}
