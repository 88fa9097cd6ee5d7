"""Symmetric NMF's data: the paper's synthetic model, the random start, and a user's files.

``U* = |G|`` with ``G`` (n x r) i.i.d. standard normal; ``X = U* U*^T + sigma |N|``; ``U_0``
i.i.d. uniform on ``[0, 1]`` and ``V_0 = U_0``; both batched over trials.

The file loaders (:func:`load_samples`, :func:`load_similarity`, :func:`load_labels`,
:func:`load_orl`) refuse a bad file with one :class:`~ppdnmf_torch.errors.DataError` keyed
by the parameter that named it (``path``, ``labels_path``): missing, empty, truncated, not
of its kind, strings where numbers belong, labels that are not integers or do not match the
samples. numpy and scipy are imported inside them.
"""
from __future__ import annotations

import os

import torch

from ... import budget
from ..._utils import derive_seed, resolve_device, resolve_dtype
from ...data.files import check_matrix, existing_file, read_npy, read_text
from ...errors import ConfigError, DataError

__all__ = ["synthetic_similarity", "initial_factor", "NOISE_KINDS", "load_samples", "load_similarity",
           "load_labels", "load_orl", "SAMPLE_SUFFIXES", "SIMILARITY_SUFFIXES"]

#: noise kinds: Gaussian (Fig. 1-5), uniform on [0, 1] and standard lognormal (Fig. 6)
NOISE_KINDS = ("gaussian", "uniform", "lognormal")


def _noise(kind, shape, gen, dtype):
    if kind == "gaussian":
        return torch.randn(shape, generator=gen, dtype=dtype)
    if kind == "uniform":
        return torch.rand(shape, generator=gen, dtype=dtype)
    return torch.randn(shape, generator=gen, dtype=dtype).exp()


def synthetic_similarity(n: int, r: int, sigma=0.0, *, noise: str = "gaussian", trials: int = 1, seed: int = 0,
                         symmetric_noise: bool = True, device="cpu", dtype=torch.float64):
    """``X = U* U*^T + sigma |N|``, batched over trials.

    Parameters
    ----------
    n, r : int
    sigma : float or sequence of float
        The noise level, or one per trial (Fig. 5's sweeps as batched trials).
    noise : {"gaussian", "uniform", "lognormal"}
    trials : int
    seed : int
        Trial ``t`` draws from its own stream (``derive_seed(seed, "symnmf-data", t)``), so a
        trial's data do not depend on how many trials are drawn with it.
    symmetric_noise : bool
        The paper's ``X`` must be symmetric for (2) to make sense, but its copy does not say
        how ``N`` is made so: by default the noise is ``(|N| + |N|^T) / 2`` (spec choice);
        False keeps ``|N|`` as drawn (then ``X`` is not symmetric and the solvers refuse it).

    Returns
    -------
    X : torch.Tensor
        ``(T, n, n)``.
    U_star : torch.Tensor
        ``(T, n, r)``.
    """
    if noise not in NOISE_KINDS:
        raise ConfigError(f"noise: unknown kind {noise!r}; use one of {NOISE_KINDS}")
    for name, v in (("n", n), ("r", r), ("trials", trials)):
        if not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}: must be an integer >= 1, got {v!r}")
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    # each trial's X, its noise and their float64 sum, then the stacked (T, n, n) and its cast
    budget.check(budget.symnmf(n=n, rank=r, trials=trials, dtype=dt, device=dev, similarity_copies=2 * trials + 3))
    sig = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1)
    if sig.numel() not in (1, trials) or bool((sig < 0).any()):
        raise ConfigError(f"sigma: one level >= 0, or one per trial; got {sigma!r}")
    sig = sig.expand(trials)
    Xs, Us = [], []
    for t in range(trials):  # data generation, once per trial: a stream per trial keeps trials independent
        gen = torch.Generator().manual_seed(derive_seed(seed, "symnmf-data", t))
        Ustar = torch.randn((n, r), generator=gen, dtype=torch.float64).abs()
        N = _noise(noise, (n, n), gen, torch.float64).abs()
        if symmetric_noise:
            N = (N + N.T) / 2
        Xs.append(Ustar @ Ustar.T + sig[t] * N)
        Us.append(Ustar)
    return torch.stack(Xs).to(dev, dt), torch.stack(Us).to(dev, dt)


def initial_factor(n: int, r: int, *, trials: int = 1, seed: int = 0, scale: float = 1.0, device="cpu",
                   dtype=torch.float64) -> torch.Tensor:
    """``U_0`` i.i.d. uniform on ``[0, scale]``, ``(T, n, r)``; trial ``t`` from its own stream,
    so a trial's start is the same alone and in a batch."""
    dt, dev = resolve_dtype(dtype), resolve_device(device)
    budget.check(budget.Estimate("symmetric NMF", f"n = {n}, rank {r}", (budget.Part(
        "trials", f"{trials} starts", 16.0 * trials * n * r),), str(dev), pieces={"trials": "use fewer starts"}))
    out = torch.empty((trials, n, r), dtype=torch.float64)
    for t in range(trials):  # one stream per trial (see synthetic_similarity)
        gen = torch.Generator().manual_seed(derive_seed(seed, "symnmf-init", t))
        out[t] = torch.rand((n, r), generator=gen, dtype=torch.float64)
    return (scale * out).to(dev, dt)


# --------------------------------------------------------------------------------------
# A user's files
# --------------------------------------------------------------------------------------

#: the samples files :func:`load_samples` reads (one sample per row)
SAMPLE_SUFFIXES = (".npy", ".csv", ".txt")
#: the similarity files :func:`load_similarity` reads (``.npz``: a scipy.sparse matrix)
SIMILARITY_SUFFIXES = (".npy", ".npz", ".csv", ".txt")


def _suffix(p: str, allowed, key: str, what: str) -> str:
    ext = os.path.splitext(p)[1].lower()
    if ext not in allowed:
        raise DataError(f"{key}: {p!r} is not a {', '.join(allowed)} file (the {what})")
    return ext


def _matrix(path, key: str, what: str, allowed=SAMPLE_SUFFIXES):
    p = existing_file(path, what, key)
    ext = _suffix(p, allowed, key, what)
    return p, (read_npy(p, key) if ext == ".npy" else read_text(p, key, what=f"{what} (CSV)"))


def load_samples(path, key: str = "path"):
    """Samples ``(n, p)`` float64, one per row, from a ``.npy``, ``.csv`` or ``.txt`` file.

    Raises
    ------
    DataError
        Keyed ``key``: missing, not of its kind, not 2-D numbers, empty, NaN or infinite.
    """
    p, arr = _matrix(path, key, "samples")
    return check_matrix(arr, repr(p), key, "(n_samples, n_features) matrix")


def _load_sparse(p: str, key: str):
    import scipy.sparse as sp

    try:
        S = sp.load_npz(p)
    except Exception as exc:  # zipfile, pickle-free numpy and scipy's own errors for bad files
        why = str(exc).strip().split("\n")[0] or type(exc).__name__
        raise DataError(f"{key}: cannot read {p!r} as a scipy.sparse .npz matrix ({why})") from None
    S = S.tocsr()
    if S.ndim != 2 or S.shape[0] != S.shape[1] or S.shape[0] < 1:
        raise DataError(f"{key}: the similarity in {p!r} must be a square (n, n) matrix, got shape {S.shape}")
    import numpy as np

    if not np.issubdtype(S.dtype, np.number) or np.issubdtype(S.dtype, np.complexfloating):
        raise DataError(f"{key}: the similarity in {p!r} must hold real numbers, got dtype {S.dtype}")
    S = S.astype(np.float64)
    if not np.isfinite(S.data).all():
        raise DataError(f"{key}: the similarity in {p!r} holds NaN or infinite entries")
    return S


def load_similarity(path, key: str = "path"):
    """A similarity ``(n, n)``: dense float64 from ``.npy``/``.csv``/``.txt``, or scipy.sparse
    CSR from ``.npz``; square, finite, nonnegative and symmetric (to ``1e-8`` of its largest
    entry), as :func:`~.fit.fit_symnmf` needs it.

    Raises
    ------
    DataError
        Keyed ``key``, naming the file and the problem.
    """
    import numpy as np

    p = existing_file(path, "similarity", key)
    if _suffix(p, SIMILARITY_SUFFIXES, key, "similarity") == ".npz":
        S = _load_sparse(p, key)
        values, lowest = S.data, (S.data.min() if S.nnz else 0.0)
        asym = abs(S - S.T)
        asym = asym.data.max() if asym.nnz else 0.0
    else:
        S = check_matrix(_matrix(p, key, "similarity", SIMILARITY_SUFFIXES)[1], repr(p), key, "(n, n) similarity")
        if S.shape[0] != S.shape[1]:
            raise DataError(f"{key}: the similarity in {p!r} must be square (n, n), got shape {S.shape}")
        values, lowest, asym = S, S.min(), np.abs(S - S.T).max()
    top = float(np.abs(values).max()) if values.size else 0.0
    if lowest < 0:
        raise DataError(f"{key}: the similarity in {p!r} must be nonnegative (smallest entry {lowest:.3g})")
    if top == 0:
        raise DataError(f"{key}: the similarity in {p!r} is all zero (no similarity to factor)")
    if asym > 1e-8 * top:
        raise DataError(f"{key}: the similarity in {p!r} must be symmetric (largest |X - X^T| {asym:.3g}, "
                        f"largest entry {top:.3g})")
    return S


def load_labels(path, n: int | None = None, key: str = "labels_path"):
    """Class labels ``(n,)`` int64 from a ``.npy``, ``.csv`` or ``.txt`` file (one per sample,
    in any shape that flattens to ``n``): integers, or floats that are whole numbers; never
    strings, booleans or fractions (a fraction is not truncated).

    Parameters
    ----------
    n : int, optional
        The number of samples the labels must match.

    Raises
    ------
    DataError
        Keyed ``key``.
    """
    import numpy as np

    p = existing_file(path, "labels", key)
    ext = _suffix(p, SAMPLE_SUFFIXES, key, "labels")
    if ext == ".npy":
        arr = read_npy(p, key)
    else:
        arr = read_text(p, key, dtype=str, what="labels (CSV)")
        try:
            arr = arr.astype(np.float64)
        except ValueError:
            bad = next(v for v in arr.reshape(-1) if not _is_number(v))
            raise DataError(f"{key}: {p!r} holds {str(bad)!r}, not a number; labels must be integers "
                            "(map class names to 0, 1, ... first)") from None
    arr = np.asarray(arr).reshape(-1)
    if arr.size == 0:
        raise DataError(f"{key}: {p!r} holds no labels")
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype,
                                                                                           np.complexfloating):
        raise DataError(f"{key}: {p!r} holds {arr.dtype} values; labels must be integers")
    if np.issubdtype(arr.dtype, np.floating):
        whole = np.isfinite(arr) & (arr == np.round(arr))
        if not whole.all():
            i = int(np.flatnonzero(~whole)[0])
            raise DataError(f"{key}: label {i} in {p!r} is {float(arr[i])!r}, not an integer (labels are never "
                            "truncated)")
    labels = arr.astype(np.int64)
    if n is not None and labels.size != n:
        raise DataError(f"{key}: {p!r} holds {labels.size} labels for {n} samples; give one label per sample")
    return labels


def _is_number(text) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_orl(path, key: str = "path"):
    """ORL faces from ``orl_faces.mat`` (docs/SYMMETRIC_NMF.md): samples ``(400, 10304)`` float64
    (one 112 x 92 image per row) and labels ``(400,)`` in ``0..39``.

    Raises
    ------
    DataError
        Keyed ``key``: missing, not a MATLAB file (or damaged), without ``data`` and
        ``label`` of matching sizes, or holding NaN.
    """
    import numpy as np
    from scipy.io import loadmat

    p = existing_file(path, "ORL (orl_faces.mat)", key)
    try:
        d = loadmat(p)
    except Exception as exc:  # scipy raises several unrelated types for bad files
        why = str(exc).strip().split("\n")[0] or type(exc).__name__
        raise DataError(f"{key}: cannot read {p!r} as a MATLAB .mat file ({why})") from None
    if "data" not in d or "label" not in d:
        raise DataError(f"{key}: {p} has no 'data' and 'label' arrays (expected ORL's orl_faces.mat)")
    samples = check_matrix(np.asarray(d["data"]), f"the 'data' array of {p!r}", key, "(n_images, n_pixels) matrix")
    labels = np.asarray(d["label"]).reshape(-1)
    if labels.size != samples.shape[0] or not np.issubdtype(labels.dtype, np.number):
        raise DataError(f"{key}: {p!r} has {labels.size} labels ({labels.dtype}) for {samples.shape[0]} images")
    return samples, labels.astype(np.int64) - 1
