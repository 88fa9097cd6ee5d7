"""Synthetic data matrices: the paper's ``Z = X Y + noise`` and sparse Poisson counts."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .. import budget
from .._utils import derive_seed, resolve_dtype
from ..errors import ConfigError
from ._args import as_int as _as_int, device_or_cpu as _device

__all__ = ["SyntheticData", "synthetic", "sparse_poisson"]


@dataclass
class SyntheticData:
    """A synthetic data matrix and its ground-truth factors.

    Attributes
    ----------
    Z : torch.Tensor, shape (L, M)
        Data matrix ``X @ Y + noise``; may have a few slightly negative entries.
    X : torch.Tensor, shape (L, K)
        True left factor.
    Y : torch.Tensor, shape (K, M)
        True right factor.
    """

    Z: torch.Tensor
    X: torch.Tensor
    Y: torch.Tensor


def synthetic(
    L=30,
    M=200,
    K=5,
    x_mean=0.033,
    y_mean=0.8,
    noise_var=3.6e-4,
    seed=0,
    dtype=torch.float64,
    device=None,
) -> SyntheticData:
    """The paper's synthetic data: ``Z = X Y + Gamma``.

    ``X`` entries are i.i.d. exponential with mean ``x_mean``, ``Y`` entries
    i.i.d. exponential with mean ``y_mean``, and ``Gamma`` i.i.d. Gaussian with
    mean 0 and variance ``noise_var`` (about 20 dB SNR with the defaults).

    All draws are made on the CPU in float64 from one ``torch.Generator`` seeded
    with ``derive_seed(seed, "synthetic")``, in the order X, Y, noise, and only
    then cast and moved, so the same seed gives the same matrix (up to rounding
    to ``dtype``) on every device and in every dtype.

    Because of the noise, ``Z`` can have a few slightly negative entries. They
    are kept: the paper factorizes ``Z`` as is.

    Parameters
    ----------
    L, M, K : int, default 30, 200, 5
        Rows of ``Z``, columns of ``Z``, and the inner rank.
    x_mean, y_mean : float, default 0.033, 0.8
        Means of the exponential entries of ``X`` and ``Y`` (``> 0``).
    noise_var : float, default 3.6e-4
        Noise variance (``>= 0``; 0 gives an exact ``Z = X Y``).
    seed : int, default 0
    dtype : torch.dtype or str, default torch.float64
    device : torch.device or str, optional
        CPU when omitted.

    Returns
    -------
    SyntheticData
        ``Z (L, M)``, ``X (L, K)``, ``Y (K, M)``.

    Raises
    ------
    ConfigError
        If a size is not a positive integer, a mean is not positive, or the
        noise variance is negative.
    """
    L = _as_int(L, "L")
    M = _as_int(M, "M")
    K = _as_int(K, "K")
    for name, v in (("L", L), ("M", M), ("K", K)):
        if v < 1:
            raise ConfigError(f"{name}: must be >= 1, got {v}")
    for name, v in (("x_mean", x_mean), ("y_mean", y_mean)):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ConfigError(f"{name}: must be a finite number > 0, got {v!r}")
    if not (isinstance(noise_var, (int, float)) and math.isfinite(noise_var) and noise_var >= 0):
        raise ConfigError(f"noise_var: must be a finite number >= 0, got {noise_var!r}")
    dtype = resolve_dtype(dtype)
    device = _device(device)
    _check_fits(L, M, K)
    gen = torch.Generator(device="cpu").manual_seed(derive_seed(_as_int(seed, "seed"), "synthetic"))
    f64 = torch.float64
    X = torch.empty(L, K, dtype=f64).exponential_(1.0 / float(x_mean), generator=gen)
    Y = torch.empty(K, M, dtype=f64).exponential_(1.0 / float(y_mean), generator=gen)
    noise = torch.randn(L, M, dtype=f64, generator=gen) * math.sqrt(float(noise_var))
    Z = X @ Y + noise
    return SyntheticData(
        Z=Z.to(device=device, dtype=dtype),
        X=X.to(device=device, dtype=dtype),
        Y=Y.to(device=device, dtype=dtype),
    )


def sparse_poisson(
    L=64,
    M=400,
    K=8,
    density=0.25,
    mean_count=30.0,
    seed=0,
    dtype=torch.float64,
    device=None,
) -> SyntheticData:
    """Sparse nonnegative factors seen through Poisson counts: ``Z = Poisson(c X Y) / c``.

    A structure unlike the paper's synthetic data (dense exponential factors, Gaussian
    noise): each entry of ``X (L, K)`` and ``Y (K, M)`` is nonzero with probability
    ``density`` (then exponential with mean 1), every column of ``X`` and of ``Y`` keeps
    at least one nonzero entry (a row drawn uniformly), and the noise is Poisson, so its
    variance grows with the signal, many entries of ``Z`` are exactly 0 and none is
    negative. ``c`` scales ``X Y`` to ``mean_count`` counts per entry on average
    (``E[Z] = X Y``; the relative noise of an average entry is about ``1/sqrt(mean_count)``).

    All draws are made on the CPU in float64 from one ``torch.Generator`` seeded with
    ``derive_seed(seed, "sparse_poisson")``, in the order: ``X``'s masks, values and kept
    rows, then ``Y``'s, then the counts.

    Parameters
    ----------
    L, M, K : int, default 64, 400, 8
    density : float in (0, 1], default 0.25
    mean_count : float > 0, default 30
    seed : int, default 0
    dtype : torch.dtype or str, default torch.float64
    device : torch.device or str, optional

    Returns
    -------
    SyntheticData
        ``Z (L, M)``, ``X (L, K)``, ``Y (K, M)`` with ``E[Z] = X Y``.

    Raises
    ------
    ConfigError
        If a size is not a positive integer, ``density`` is not in ``(0, 1]`` or
        ``mean_count`` is not positive.
    """
    L, M, K = (_as_int(v, name) for v, name in ((L, "L"), (M, "M"), (K, "K")))
    for name, v in (("L", L), ("M", M), ("K", K)):
        if v < 1:
            raise ConfigError(f"{name}: must be >= 1, got {v}")
    if not (isinstance(density, (int, float)) and math.isfinite(density) and 0 < density <= 1):
        raise ConfigError(f"density: must be a number in (0, 1], got {density!r}")
    if not (isinstance(mean_count, (int, float)) and math.isfinite(mean_count) and mean_count > 0):
        raise ConfigError(f"mean_count: must be a finite number > 0, got {mean_count!r}")
    dtype = resolve_dtype(dtype)
    device = _device(device)
    _check_fits(L, M, K)
    gen = torch.Generator(device="cpu").manual_seed(derive_seed(_as_int(seed, "seed"), "sparse_poisson"))
    f64 = torch.float64

    def sparse(rows, cols):
        mask = torch.rand(rows, cols, dtype=f64, generator=gen) < density
        values = torch.empty(rows, cols, dtype=f64).exponential_(1.0, generator=gen)
        keep = torch.randint(rows, (cols,), generator=gen)  # one nonzero per column at least
        mask[keep, torch.arange(cols)] = True
        return values * mask

    X = sparse(L, K)
    Y = sparse(K, M)
    rates = X @ Y
    c = float(mean_count) / float(rates.mean())
    Z = torch.poisson(rates * c, generator=gen) / c
    return SyntheticData(
        Z=Z.to(device=device, dtype=dtype),
        X=X.to(device=device, dtype=dtype),
        Y=Y.to(device=device, dtype=dtype),
    )


def _check_fits(L: int, M: int, K: int) -> None:
    """Refuse a matrix whose draws cannot fit in memory, before the first: ``Z``, the noise
    (or the rates) and the cast copies ``(L, M)``, the factors ``(L, K)`` and ``(K, M)``, in
    float64."""
    budget.check_bytes(8.0 * (4 * L * M + 2 * (L + M) * K), "M" if M >= L else "L", f"a {L} x {M} matrix",
                       model="synthetic data", sizes=f"L = {L}, M = {M}, K = {K}", verb="needs",
                       hint="use a smaller matrix")
