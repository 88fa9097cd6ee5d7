"""PPDNMF with its agents over ``torch.distributed`` ranks, with the bits of the single-process
eager run, on the engine's transport, partition and Paillier parties (:mod:`ppdnmf_torch.distributed`).

* :mod:`.layout`: a rank's slots (alignment-preserving), edges and halo lists, and its
  local :class:`~ppdnmf_torch.models.ppdnmf.problem.Problem`;
* :mod:`.halo`: the halo exchange around the run's exchange kind, and the rank's penalty draws;
* :mod:`.topology`: the rank's graph as the solver sees it (every edge out of its agents),
  the stopping rule's flags across ranks and its decisions over every rank's agents;
* :mod:`.reduce`: the metrics across ranks, in the single-process order (or, ``share="sums"``,
  from per-rank sums and maxima of scalars);
* :mod:`.engine`: :func:`fit_rank` (the API on a rank).

The CLI's run over ranks is :func:`ppdnmf_torch.app.distributed.run_rank`.
"""
from .engine import SHARE_MODES, RankResult, fit_rank
from .halo import HALO_KINDS, HaloExchange, RankSampler
from .layout import RankLayout, alignment_period

__all__ = ["fit_rank", "RankResult", "SHARE_MODES", "HaloExchange", "RankSampler", "HALO_KINDS", "RankLayout",
           "alignment_period"]
