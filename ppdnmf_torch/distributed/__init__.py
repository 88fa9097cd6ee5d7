"""The multi-process engine's model-free parts: agents sharded over ``torch.distributed`` ranks
(``gloo`` on CPU, ``nccl`` between GPUs).

* :mod:`.partition`: which rank owns which agent (reverse Cuthill-McKee, blocks, or yours),
  and the cut;
* :mod:`.comm`: the transport (timeouts, clear errors, byte counts, a watchdog);
* :mod:`.parties`: a rank's parties of the Paillier protocol (its agents' keys and seeds,
  which stay on it; its ghosts' public keys), the links across the cut, the seed agreement;
* :mod:`.secure`: ``exchange=paillier`` across ranks, the protocol's rounds in phases;
* :mod:`.costs`: cost counters per rank, summed; the halo's byte model;
* :mod:`.layout`: a rank's share of the agents (:class:`~.layout.RankLayout`: slots that keep
  the single-process alignment, edges, halo lists) and the gather of its agents' tensors;
* :mod:`.halo`: the halo exchange (``plain``, ``quantized``) around the run's exchange kind,
  and the rank's penalty draws (:class:`~.halo.RankSampler`);
* :mod:`.launch`: local ranks on this machine, or the ranks torchrun or SLURM started;
* :mod:`.site`: site mode (a party that holds only its own data): the public description
  compared at rendezvous, the site of every agent, a site's columns cut into blocks.

A model runs over ranks in its own package (PPDNMF: :mod:`ppdnmf_torch.models.ppdnmf.distributed`,
the rank's local problem, graph, reductions and :func:`~ppdnmf_torch.models.ppdnmf.distributed.fit_rank`;
symmetric NMF: :mod:`ppdnmf_torch.models.symnmf.distributed`);
the app over ranks is :mod:`ppdnmf_torch.app.distributed` (``python -m ppdnmf_torch.distributed``).
docs/DISTRIBUTED.md is the user's guide.
"""
from .comm import BACKENDS, EXIT_PEER_FAILED, Comm, DistributedError
from .launch import RankOutcome, free_port, launch_local
from .partition import PARTITION_METHODS, Partition, partition_agents
from .halo import HALO_KINDS, HaloExchange, RankSampler
from .layout import RankLayout, block_period, gather_agents
from .secure import SecureHalo

__all__ = ["Comm", "DistributedError", "EXIT_PEER_FAILED", "BACKENDS", "SecureHalo", "launch_local", "free_port",
           "RankOutcome", "Partition", "partition_agents", "PARTITION_METHODS", "HaloExchange", "RankSampler",
           "HALO_KINDS", "RankLayout", "block_period", "gather_agents"]
