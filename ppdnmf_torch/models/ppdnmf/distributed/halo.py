"""PPDNMF's halo exchange and penalty draws over ranks: the engine's
:class:`~ppdnmf_torch.distributed.halo.HaloExchange` and :class:`~ppdnmf_torch.distributed.halo.RankSampler`
(model-free, shared with the other models' runs over ranks), re-exported here."""
from ....distributed.halo import HALO_KINDS, TAG_G, TAG_U, HaloExchange, RankSampler

__all__ = ["HaloExchange", "RankSampler", "HALO_KINDS", "TAG_U", "TAG_G"]
