"""FedLinUCB with a fixed synchronisation period: every client keeps a local LinUCB, and every ``period`` steps all
registered clients upload their new statistics and download the aggregate — the clock-driven baseline that the
event-triggered protocols (Sync- and Async-LinUCB) improve on.

It is Sync-LinUCB's loop and synchronisation (Algorithm 4 of Li & Wang 2022) with a clock as the trigger, and the
worked example of adding a protocol on the public loop (:class:`~fedrec.protocols.TriggeredLinUCB`; the
documentation's concepts page, "Add a protocol"): a trigger function, a class and a config.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import check_int
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.kernels.linear import PolicyRows
from fedrec.protocols.kernels.triggered import SyncState
from fedrec.protocols.triggered import TriggeredLinUCB
from fedrec.utils.jit import I64


class Clock(NamedTuple):
    """The trigger's own fields: FedLinUCB's attribute ``period`` and its buffer ``steps``."""

    period: int  #: steps between two synchronisations
    steps: I64[1]  #: (R,) the steps each replicate has played


def every_period(r: int, row: int, pol: PolicyRows, st: SyncState, own: Clock) -> bool:
    """One more step of replicate ``r``; a sync after every ``period``-th."""
    own.steps[r] += 1
    return own.steps[r] % own.period == 0


class FedLinUCB(TriggeredLinUCB):
    """Local LinUCB clients synchronised every ``period`` steps of a replicate (a sync costs 2 messages per
    registered client).

    Args:
        period: steps between two synchronisations (1: every step).
        Remaining arguments as in :class:`~fedrec.protocols.TriggeredLinUCB`.
    """

    trigger = staticmethod(every_period)
    trigger_fields = Clock

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, period: int = 100, policy: PolicyFactory | None = None,
        preregister: bool = False, seed: int = 0, backend: str = "auto",
    ) -> None:
        super().__init__(num_clients, dim, replicates, policy, preregister, seed, backend)
        self.period = check_int("period", period)
        self.register_buffer("steps", torch.zeros(self.replicates, dtype=torch.long))

    def _due(self, rows: Tensor, new: RowState) -> Tensor:
        self.steps += 1  # one step of every replicate
        return self.steps % self.period == 0
