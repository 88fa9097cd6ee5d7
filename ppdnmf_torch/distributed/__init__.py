"""Agents sharded over ``torch.distributed`` ranks (``gloo`` on CPU, ``nccl`` between GPUs),
with the bits of the single-process eager run.

* :mod:`.partition`: which rank owns which agent (reverse Cuthill-McKee, blocks, or yours),
  and the cut;
* :mod:`.layout`: a rank's slots (alignment-preserving), edges and halo lists, and its
  local :class:`~ppdnmf_torch.problem.Problem`;
* :mod:`.comm`: the transport (timeouts, clear errors, byte counts, a watchdog);
* :mod:`.halo`: the halo exchange around the run's exchange kind, and the rank's penalty draws;
* :mod:`.parties`: a rank's parties of the Paillier protocol (its agents' keys and seeds,
  which stay on it; its ghosts' public keys), the links across the cut, the seed agreement;
* :mod:`.secure`: ``exchange=paillier`` across ranks, the protocol's rounds in phases;
* :mod:`.topology`: the rank's graph as the solver sees it (every edge out of its agents),
  the stopping rule's flags across ranks and its decisions over every rank's agents;
* :mod:`.reduce`: the metrics across ranks, in the single-process order (or, `share="sums"`, from
  per-rank sums and maxima of scalars);
* :mod:`.costs`: cost counters per rank, summed; the halo's byte model;
* :mod:`.engine`: :func:`fit_rank` (the API on a rank) and :func:`run_rank` (a CLI run);
* :mod:`.launch`: local ranks on this machine, or the ranks torchrun or SLURM started;
* :mod:`.app`: ``python -m ppdnmf_torch.distributed`` and ``torchrun -m ppdnmf_torch.distributed``.

docs/DISTRIBUTED.md is the user's guide.
"""
from .comm import BACKENDS, EXIT_PEER_FAILED, Comm, DistributedError
from .engine import RankResult, fit_rank, run_rank
from .halo import HALO_KINDS, HaloExchange, RankSampler
from .launch import RankOutcome, free_port, launch_local
from .layout import RankLayout, alignment_period
from .partition import PARTITION_METHODS, Partition, partition_agents
from .secure import SecureHalo

__all__ = ["Comm", "DistributedError", "EXIT_PEER_FAILED", "BACKENDS", "fit_rank", "run_rank", "RankResult",
           "HaloExchange", "SecureHalo", "RankSampler", "HALO_KINDS", "launch_local", "free_port", "RankOutcome",
           "RankLayout", "alignment_period", "Partition", "partition_agents", "PARTITION_METHODS"]
