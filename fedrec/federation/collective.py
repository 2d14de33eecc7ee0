"""The processes of one run as a task sees them (:class:`Collective`): its rank and size, an in-place sum over the
processes and a broadcast from rank 0. This one is a single process; :mod:`fedrec.trainer.distributed` gives tasks
the Lightning Fabric one of a run on several devices."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


class Collective:
    """The processes of a run as a task sees them: a single process here (every operation is the identity)."""

    global_rank = 0
    world_size = 1

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)

    @property
    def is_global_zero(self) -> bool:
        """Whether this process writes the run's files (logs, summaries, checkpoints)."""
        return self.global_rank == 0

    def all_reduce(self, tensors: list[Tensor]) -> None:
        """Replace each tensor by its sum over the processes, in place."""

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every process."""
        return obj

    def close(self) -> None:
        """Release the processes' connection once the run is over (nothing to release in one process)."""
