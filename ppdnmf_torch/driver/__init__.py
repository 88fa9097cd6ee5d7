"""The run driver, shared by every model: one iteration loop with its stopping, callback,
history, checkpoints and resume, cost ledgers, privacy warnings, the lifetime of the exchange
and aggregation, Ctrl-C and seeds (:func:`drive`; a model plugs in a :class:`LoopModel`).

The run over ``torch.distributed`` ranks is the same loop with a :class:`RankCoordinator`
(the stop decision and the checkpoints agreed across the ranks); the model's step reduces its
metrics across the ranks.
"""
from .checkpoints import Checkpoints, Start, check_checkpoint_args, lock_checkpoint_dir
from .history import History
from .ledgers import Ledgers
from .loop import Clock, GoodPoint, Outcome, RunInterrupted, drive
from .model import LoopModel, tensor_spec
from .privacy import is_secure, warn_degree_one, warn_sum_leak
from .ranks import PARTITION_FILE, RankCoordinator
from .resources import Resources
from .seeds import seed_of, trial_seeds

__all__ = ["drive", "LoopModel", "tensor_spec", "Outcome", "RunInterrupted", "Clock", "GoodPoint", "Checkpoints",
           "Start", "check_checkpoint_args", "lock_checkpoint_dir", "History", "Ledgers", "RankCoordinator",
           "PARTITION_FILE", "Resources", "warn_degree_one", "warn_sum_leak", "is_secure", "seed_of", "trial_seeds"]
