"""FedLinUCB with a fixed synchronisation period: every client keeps a local LinUCB, and every ``period`` steps all
registered clients upload their new statistics and download the aggregate — the clock-driven baseline that the
event-triggered protocols (Sync- and Async-LinUCB) improve on. It is also the worked example of adding a compiled
protocol (the documentation's concepts page, "Add a protocol").

It reuses Sync-LinUCB's state and synchronisation (Algorithm 4 of Li & Wang 2022) with a clock as the trigger,
so its torch path is Sync-LinUCB's with another :meth:`_advance`, and its kernel
(:mod:`fedrec.protocols.kernels.fed_linucb`) Sync-LinUCB's step and sync with another condition.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import check_int
from fedrec.jit import build
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.kernels.client_server import SyncState
from fedrec.protocols.kernels.fed_linucb import PERIODIC_RUN, Clock, PeriodicSettings
from fedrec.protocols.sync_linucb import SyncLinUCB


class FedLinUCB(SyncLinUCB):
    """Sync-LinUCB's clients and synchronisation, triggered every ``period`` steps of a replicate instead of by
    Δt_i · log det ratio > D (a sync costs 2 messages per registered client).

    Args:
        period: steps between two synchronisations (1: every step).
        Remaining arguments as in :class:`~fedrec.protocols.SyncLinUCB` (its ``threshold`` is not used).
    """

    kernel_state, kernel_settings = SyncState, PeriodicSettings

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, period: int = 100, policy: PolicyFactory | None = None,
        preregister: bool = False, seed: int = 0, backend: str = "auto",
    ) -> None:
        super().__init__(num_clients, dim, replicates, math.inf, policy, preregister, seed, backend)
        self.period = check_int("period", period)
        self.register_buffer("steps", torch.zeros(self.replicates, dtype=torch.long))

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        new["steps_since_sync"] = state["steps_since_sync"] + 1
        self.steps += 1  # one step of every replicate
        return arms, self.steps % self.period == 0, new, z

    @property
    def kernels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return PERIODIC_RUN

    def _kernel_views(self) -> dict[str, tuple]:
        return {**super()._kernel_views(), "clock": build(Clock, self)}
