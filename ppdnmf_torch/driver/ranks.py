"""What the driver does differently on a rank of a run over ``torch.distributed``:
:class:`RankCoordinator`.

Every rank runs the same loop on its own agents (or workers); the model's step reduces its
metrics across the ranks, so every rank holds the same history. What the loop itself must
agree on crosses the ranks here: the decision to stop after each iteration (one
all-reduce of two flags: a rank's callback may stop the run, a converged test is the same
everywhere by construction), and the checkpoints: each rank writes its own into
``<checkpoint_dir>/rank<r>/``, rank 0 records the partition (world size and owners) in
``partition.json`` beside them, and a resume continues from the newest iteration every rank
has a checkpoint of, after every rank's checks, any failure stopping every rank with that
rank's reason.
"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

from ..checkpoint import CheckpointError, write_atomically

__all__ = ["RankCoordinator", "PARTITION_FILE"]

#: the file beside the ranks' folders that records which rank held which agent
PARTITION_FILE = "partition.json"


class RankCoordinator:
    """A rank's side of the driver.

    Parameters
    ----------
    comm : ppdnmf_torch.distributed.Comm
    partition : dict
        The partition's summary (``world_size``, ``owner``: the rank of each agent; written
        to :data:`PARTITION_FILE` and checked on resume).
    """

    def __init__(self, comm, partition: dict):
        self.comm = comm
        self.partition = dict(partition)

    @property
    def rank(self) -> int:
        return self.comm.rank

    def folder(self, root) -> str:
        """This rank's checkpoint folder under ``root``."""
        return os.path.join(os.fspath(root), f"rank{self.rank:03d}")

    def decide(self, stop: bool, converged: bool, k: int, step_name: str) -> tuple:
        """``(stop, converged)`` of every rank after iteration ``k``: each true where any rank's is."""
        flags = self.comm.all_reduce(torch.tensor([int(stop), int(converged)], dtype=torch.int64),
                                     category="metrics", op=dist.ReduceOp.MAX,
                                     what=f"the stop decision of {step_name} {k}")
        return bool(int(flags[0])), bool(int(flags[1]))

    def gather(self, obj, what: str) -> list:
        """Every rank's ``obj`` (plain data)."""
        return self.comm.all_gather_object(obj, category="setup", what=what)

    def agree(self, why: str | None, error=CheckpointError) -> None:
        """Every rank's check: the first failing rank's reason (its message, the rank named at its
        end) raised on every rank, or nothing."""
        whys = self.gather(why, "the checkpoints' checks")
        bad = [(q, w) for q, w in enumerate(whys) if w is not None]
        if bad:
            raise error(f"{bad[0][1]} (on rank {bad[0][0]})")

    def check_partition(self, root, key: str) -> None:
        """Refuse (on every rank) checkpoints written by another world size or partition."""
        meta = os.path.join(os.fspath(root), PARTITION_FILE)
        why = None
        if os.path.isfile(meta):
            try:
                with open(meta, encoding="utf-8") as fh:
                    saved = json.load(fh)
            except (OSError, ValueError):
                saved = {}
            mine = self.partition
            if saved.get("world_size") != mine.get("world_size") or list(saved.get("owner", [])) != list(
                    mine.get("owner", [])):
                why = (f"{key}: the checkpoints in {os.fspath(root)!r} were written by {saved.get('world_size')} "
                       f"ranks with the owners {saved.get('owner')}; this run has {mine.get('world_size')} ranks with "
                       f"the owners {list(mine.get('owner', []))}. Resume with the same world size and partition "
                       "(each rank holds its own agents' state)")
        self.agree(why)

    def write_partition(self, root) -> None:
        """Rank 0 records the partition beside the ranks' folders."""
        if self.rank == 0:
            write_atomically(os.path.join(os.fspath(root), PARTITION_FILE),
                             lambda fh: json.dump(self.partition, fh), binary=False)
