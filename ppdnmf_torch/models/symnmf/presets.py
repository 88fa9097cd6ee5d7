"""The data presets of ``ppdnmf task=symnmf`` and the one call the app makes: :func:`run_preset`.

A preset gives samples (rows) and their labels, or a similarity matrix:

* ``synthetic``: the paper's ``X = U* U*^T + sigma |N|`` (:func:`~.data.synthetic_similarity`);
* ``orl``: ORL faces from ``path`` (``orl_faces.mat``; 400 images of 112 x 92, 40 people);
* ``digits``: scikit-learn's digits (1797 images of 8 x 8, 10 classes);
* ``samples``: a user's ``.npy`` or ``.csv`` of samples (one per row);
* ``similarity``: a user's ``.npy``, ``.npz`` (scipy.sparse) or ``.csv`` similarity matrix.

:func:`run_preset` builds Kuang et al.'s similarity of samples (:mod:`.similarity`), fits
through :func:`~.run.run_symnmf` (scalars per iteration, summary, arrays), and adds what
needs the samples or the labels: the clustering accuracy and NMI per iteration and at the
end (:mod:`.clustering`), and the cluster means (as images when the samples are images).
"""
from __future__ import annotations


import numpy as np
import torch

from ...errors import ConfigError
from .clustering import cluster_labels, clustering_accuracy, normalized_mutual_info
from .config import RUN, SPEC
from .data import load_labels, load_orl, load_samples, load_similarity, synthetic_similarity
from .datasets import load_digits_samples
from .estimator import scaled_start
from .run import run_symnmf, run_symnmf_agents
from .similarity import similarity_matrix

__all__ = ["PRESETS", "load_preset", "run_preset", "cluster_means"]

PRESETS = ("synthetic", "orl", "digits", "samples", "similarity")
#: (height, width, order) of one sample of the image presets
_IMAGE_SHAPES = {"orl": (112, 92, "F"), "digits": (8, 8, "C")}


def load_preset(preset: str, *, path=None, labels_path=None, n: int = 300, rank: int = 20, sigma: float = 0.1,
                seed: int = 0) -> dict:
    """The data of ``preset``.

    Returns
    -------
    dict
        ``samples`` (ndarray ``(n, p)`` or None), ``similarity`` (None for samples: built
        by :func:`run_preset`), ``labels`` (ndarray ``(n,)`` or None), ``image_shape``
        (``(h, w, order)`` or None) and ``rank`` (the number of classes, or ``rank``).
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset: unknown preset {preset!r}; use one of {PRESETS}")
    out = {"samples": None, "similarity": None, "labels": None, "image_shape": _IMAGE_SHAPES.get(preset),
           "rank": rank}
    if preset == "synthetic":
        out["similarity"] = synthetic_similarity(n, rank, sigma, seed=seed)[0][0]
    elif preset == "orl":
        if path is None:
            raise ConfigError("path: the ORL preset needs the path of orl_faces.mat")
        out["samples"], out["labels"] = load_orl(path)
    elif preset == "digits":
        out["samples"], out["labels"] = load_digits_samples()
    elif path is None:
        raise ConfigError(f"path: the {preset!r} preset needs a file")
    elif preset == "samples":
        out["samples"] = load_samples(path)
    else:
        out["similarity"] = load_similarity(path)
    if labels_path is not None:
        n_rows = (out["samples"] if out["samples"] is not None else out["similarity"]).shape[0]
        out["labels"] = load_labels(labels_path, n_rows)
    if out["labels"] is not None:
        out["rank"] = int(np.unique(out["labels"]).size)
    return out


def cluster_means(samples: np.ndarray, labels: np.ndarray, rank: int) -> np.ndarray:
    """The mean sample of every cluster, ``(rank, p)`` (zeros for an empty cluster)."""
    onehot = np.eye(rank)[labels]
    counts = onehot.sum(0)
    return (onehot.T @ samples) / np.maximum(counts, 1)[:, None]


def run_preset(preset: str, rank: int | None = None, *, path=None, labels_path=None, n: int = 300,
               sigma: float = 0.1, n_neighbors: int | None = None, init: str = SPEC.init, seed: int = RUN.seed,
               trials: int = RUN.trials, log_scalars=None, device="auto", agents: bool = False, fit=None, **fit_kwargs):
    """Load ``preset``, fit, and return ``(summary, arrays)`` as :func:`~.run.run_symnmf` does.

    ``rank`` defaults to the number of classes (or 20 for ``synthetic``). With labels,
    ``log_scalars`` also receives ``symnmf/accuracy`` and ``symnmf/nmi`` every iteration
    (one value per trial), and the summary ``accuracy`` and ``nmi`` (lists over trials).
    Arrays added: ``cluster_means (r, p)`` and, for image presets, ``cluster_mean_images
    (r, h, w)``. ``fit_kwargs`` go to :func:`~.fit.fit_symnmf` (``method``, ``penalty``,
    ``max_iter``, ``tol``, ``checkpoint_dir``, ...), or with ``agents`` to
    :func:`~.agents.fit_symnmf_agents` (``n_agents``, ``graph``, ``exchange``, ...) through
    :func:`~.run.run_symnmf_agents` (``fit``: another fit across agents, such as a rank's
    ``functools.partial(fit_symnmf_rank, comm)``; then None on the ranks other than 0).
    """
    data = load_preset(preset, path=path, labels_path=labels_path, n=n, rank=rank or 20, sigma=sigma, seed=seed)
    r = int(rank or data["rank"])
    S = data["similarity"]
    if S is None:
        S = similarity_matrix(data["samples"], n_neighbors=n_neighbors, device=device)
    elif not isinstance(S, torch.Tensor):
        from .operator import as_similarity

        S = as_similarity(S, device=device).data
    y = data["labels"]
    user_cb = fit_kwargs.pop("callback", None)

    def cb(info):
        if y is not None and log_scalars is not None:
            labels = cluster_labels(info.U).cpu()
            log_scalars(info.k, {"symnmf/accuracy": np.atleast_1d(clustering_accuracy(y, labels)).tolist(),
                                 "symnmf/nmi": np.atleast_1d(normalized_mutual_info(y, labels)).tolist()})
        return bool(user_cb(info)) if user_cb is not None else False

    def agents_cb(k, metrics):  # the copies' mean is not handed out: the labels are scored at the end
        return bool(user_cb(k, metrics)) if user_cb is not None else False

    score = None
    if y is not None:
        def score(labels):
            return {"accuracy": clustering_accuracy(y, labels), "nmi": normalized_mutual_info(y, labels)}

    U0 = fit_kwargs.pop("U0", None)
    if U0 is None:
        U0 = scaled_start(S, r, trials, seed, init)
    if agents:
        out = run_symnmf_agents(S, r, log_scalars=log_scalars, score=score, callback=agents_cb, U0=U0[0] if trials == 1
                                else U0, seed=seed, fit=fit, **({"trials": trials} if fit is None else {}),
                                **({"device": device} if fit is None else {}), **fit_kwargs)
        if out is None:
            return None
        summary, arrays = out
    else:
        summary, arrays = run_symnmf(S, r, log_scalars=log_scalars, score=score, callback=cb, U0=U0, trials=trials,
                                     seed=seed, device=device, **fit_kwargs)
    summary.update({"preset": preset, "rank": r, "n": int(S.shape[0])})
    if data["samples"] is not None:
        means = cluster_means(data["samples"], arrays["labels"].numpy(), r)
        arrays["cluster_means"] = torch.as_tensor(means)
        if data["image_shape"] is not None:
            h, w, order = data["image_shape"]
            # column-major images (MATLAB's ORL) are stored width-major per row
            imgs = means.reshape(r, w, h).transpose(0, 2, 1) if order == "F" else means.reshape(r, h, w)
            arrays["cluster_mean_images"] = torch.as_tensor(np.ascontiguousarray(imgs))
    return summary, arrays
