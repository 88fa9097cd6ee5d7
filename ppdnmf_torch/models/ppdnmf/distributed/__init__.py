"""PPDNMF with its agents over ``torch.distributed`` ranks, with the bits of the single-process
eager run, on the engine's transport, partition and Paillier parties (:mod:`ppdnmf_torch.distributed`).

* :mod:`.layout`: a rank's local :class:`~ppdnmf_torch.models.ppdnmf.problem.Problem` on the
  engine's layout (:mod:`ppdnmf_torch.distributed.layout`: slots, edges, halo lists; the halo
  exchange and the rank's penalty draws are the engine's too, :mod:`ppdnmf_torch.distributed.halo`);
* :mod:`.topology`: the rank's graph as the solver sees it (every edge out of its agents),
  the stopping rule's flags across ranks and its decisions over every rank's agents;
* :mod:`.reduce`: the metrics across ranks, in the single-process order (or, ``share="sums"``,
  from per-rank sums and maxima of scalars);
* :mod:`.engine`: :func:`fit_rank` (the API on a rank);
* :mod:`.site`: :func:`fit_site`, a site's run that holds only its own columns (docs/DEPLOYMENT.md;
  :mod:`.public`: its blocks checked and the public description the sites compare).

The CLI's run over ranks is :func:`ppdnmf_torch.app.distributed.run_rank`.
"""
from .engine import SHARE_MODES, RankResult, fit_rank
from .site import fit_site

__all__ = ["fit_rank", "fit_site", "RankResult", "SHARE_MODES"]
