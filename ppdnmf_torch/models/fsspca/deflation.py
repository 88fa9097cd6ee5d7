"""Deflation (Algorithm 4, after Mackey): ``r_2`` more loadings given ``r_1`` earlier ones,
without recomputing them (docs/SPARSE_PCA.md, "Deflation").

With ``Z_1 (d, r_1)`` the earlier loadings, orthonormalized (``qf``),
``G = prod_i (I - z_i z_i^T) = I - Z_1 Z_1^T``. The workers solve problem (6) on their data
``A_i G`` (Gram ``G C_i G``, computed locally), with their points kept in the range of ``G``
(the projected gradient, and the QR retraction, keep ``w_i`` there: the generalized Stiefel
manifold ``St_G``). The returned orthonormal loadings ``qf(G z)`` are orthogonal to
``Z_1`` to rounding; the sparse ``z`` is soft-thresholded and only close to that range.
"""
from __future__ import annotations

import numpy as np
import torch

from ...errors import ConfigError
from ...specs import check_value
from .fit import as_blocks, fit_fsspca
from .manifold import qf

__all__ = ["deflation_projector", "fit_deflated", "fit_sequential"]


def deflation_projector(previous: torch.Tensor) -> torch.Tensor:
    """``G = I - Q Q^T`` for ``Q = qf(previous)``; ``previous (..., d, r_1) -> (..., d, d)``."""
    Q = qf(previous)
    eye = torch.eye(Q.shape[-2], dtype=Q.dtype, device=Q.device)
    return eye - Q @ Q.transpose(-2, -1)


def fit_deflated(data, previous, n_components, **kwargs):
    """``n_components`` loadings in the orthogonal complement of ``previous`` (Algorithm 4).

    Parameters
    ----------
    data : as :func:`.fit.fit_fsspca`
    previous : Tensor (d, r_1) or (T, d, r_1)
        The loadings found before (sparse ``z`` or orthonormal).
    kwargs : passed to :func:`.fit.fit_fsspca` (``groups``, ``alpha``, ``trials``, ...)

    Returns
    -------
    FSSPCAResult for the new loadings only.
    """
    check_value("previous", previous, torch.Tensor | np.ndarray | list | tuple)
    blocks = as_blocks(data, kwargs.pop("groups", None), device=kwargs.pop("device", None),
                       dtype=kwargs.pop("dtype", None))
    try:
        prev = torch.as_tensor(previous, dtype=blocks[0].dtype, device=blocks[0].device)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"previous: must be a (d, r_1) or (T, d, r_1) array of numbers ({exc})") from None
    return fit_fsspca(blocks, n_components, projector=deflation_projector(prev), **kwargs)


def fit_sequential(data, sizes, **kwargs):
    """Loadings in groups of ``sizes`` (``[r_1, r_2, ...]``), each group by deflation against
    every earlier one (``kwargs`` as :func:`.fit.fit_fsspca`; ``seed`` shifts by one per group).

    Returns
    -------
    results : list of FSSPCAResult (one per group)
    z : Tensor (T, d, sum(sizes)), the sparse loadings side by side
    components : Tensor (T, d, sum(sizes)), the orthonormal loadings side by side
    """
    check_value("sizes", sizes, list[int], {"ge": 1})
    blocks = as_blocks(data, kwargs.pop("groups", None), device=kwargs.pop("device", None),
                       dtype=kwargs.pop("dtype", None))
    seed = kwargs.pop("seed", 0)
    results, comps, zs = [], [], []
    for g, r in enumerate(sizes):
        if comps:
            res = fit_fsspca(blocks, r, projector=deflation_projector(torch.cat(comps, dim=-1)), seed=seed + g,
                             **kwargs)
        else:
            res = fit_fsspca(blocks, r, seed=seed, **kwargs)
        results.append(res)
        comps.append(res.components)
        zs.append(res.z)
    return results, torch.cat(zs, dim=-1), torch.cat(comps, dim=-1)
