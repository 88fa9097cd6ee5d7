"""The synthetic model of the paper's Sec. IV and the random start, batched over trials.

``U* = |G|`` with ``G`` (n x r) i.i.d. standard normal; ``X = U* U*^T + sigma |N|``; ``U_0``
i.i.d. uniform on ``[0, 1]`` and ``V_0 = U_0``.
"""
from __future__ import annotations

import torch

from ..._utils import derive_seed, resolve_device, resolve_dtype
from ...errors import ConfigError

__all__ = ["synthetic_similarity", "initial_factor", "NOISE_KINDS"]

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
    out = torch.empty((trials, n, r), dtype=torch.float64)
    for t in range(trials):  # one stream per trial (see synthetic_similarity)
        gen = torch.Generator().manual_seed(derive_seed(seed, "symnmf-init", t))
        out[t] = torch.rand((n, r), generator=gen, dtype=torch.float64)
    return (scale * out).to(dev, dt)
