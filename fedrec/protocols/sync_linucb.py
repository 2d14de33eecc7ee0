"""Sync-LinUCB (the paper's Algorithm 4, DisLinUCB of Wang et al. 2019 adapted): global sync rounds."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import check_float
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.client_server import ClientServerLinUCB
from fedrec.protocols.kernels.client_server import SYNC_RUN, SyncSettings, SyncState


class SyncLinUCB(ClientServerLinUCB):
    """Every client uploads and downloads whenever the active client's Δt_i·log(det V_i(λ)/det S_i(λ)) > D.

    A sync round costs 2 messages per registered client (idle clients upload empty buffers too), after which
    every registered client holds the server aggregate (V_g, b_g). ``layout``: as in
    :class:`~fedrec.protocols.AsyncLinUCB`.
    """

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        threshold: float = 10.0,
        policy: PolicyFactory | None = None,
        preregister: bool = False,
        seed: int = 0,
        backend: str = "auto",
        layout: str = "dense",
    ) -> None:
        super().__init__(num_clients, dim, replicates, policy, seed, backend, preregister, layout)
        self.threshold = check_float("threshold", threshold, low=0.0, allow_inf=True)
        self.register_buffer("steps_since_sync", torch.zeros(self.client_of.shape[0], dtype=torch.long))
        self.register_buffer("sync_rounds", torch.zeros(self.replicates, dtype=torch.long))

    def _row_state(self) -> dict[str, tuple[torch.nn.Module, str]]:
        return {**super()._row_state(), "steps_since_sync": (self, "steps_since_sync")}

    def _row_buffers(self) -> dict[str, Tensor]:
        return {**super()._row_buffers(), "steps_since_sync": self.steps_since_sync}

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        new["steps_since_sync"] = state["steps_since_sync"] + 1
        gain = new["policy.logdet"] - self.synced_logdet[rows]
        due = new["steps_since_sync"].to(torch.float64) * gain > self.threshold
        return arms, due, new, z

    def _communicate(self, reps: Tensor, rows: Tensor) -> None:
        for rep in reps.tolist():
            self._sync(rep)

    def _sync(self, rep: int) -> None:
        """One global synchronisation of replicate ``rep``: all registered clients upload, then download."""
        cap = self.capacity
        members = self._in_client_order(self.registered[rep * cap : (rep + 1) * cap].nonzero().view(-1) + rep * cap)
        _, clients = self._client_ids(members)
        n = members.numel()
        uploads = self.channel.send("upload", ("client", clients), ("server", 0), self.buffer[members],
                                    self.message_scalars, rep)
        self.server[rep] += uploads.sum(0)
        self.server_count[rep] += self.buffer_count[members].sum()
        delivered = self.channel.send("download", ("server", 0), ("client", clients),
                                      self.server[rep].expand(n, -1, -1), self.message_scalars, rep)
        pol = self.policy
        pol.G[members] = delivered
        pol.count[members] = self.server_count[rep]
        pol.refactor(members)
        self.synced_logdet[members] = pol.logdet[members]
        self.buffer[members] = 0
        self.buffer_count[members] = 0
        self.steps_since_sync[members] = 0
        self.sync_rounds[rep] += 1

    kernel_state, kernel_settings = SyncState, SyncSettings

    @property
    def kernels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return SYNC_RUN
