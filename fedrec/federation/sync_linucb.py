"""Sync-LinUCB (the paper's Algorithm 4, DisLinUCB of Wang et al. 2019 adapted): global sync rounds."""
from __future__ import annotations

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import check_float
from fedrec.federation.protocol import ClientServerLinUCB


class SyncLinUCB(ClientServerLinUCB):
    """Every client uploads and downloads whenever the active client's Δt_i·log(det V_i(λ)/det S_i(λ)) > D.

    A sync round costs 2 messages per registered client (idle clients upload empty buffers too), after which
    every registered client holds the server aggregate (V_g, b_g).
    """

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        threshold: float = 10.0,
        lam: float = 0.1,
        alpha: float | None = None,
        sigma: float = 0.1,
        delta: float = 0.1,
        radius_bound: str = "determinant",
        preregister: bool = False,
        refactor_every: int = 1000,
    ) -> None:
        super().__init__(
            num_clients, dim, replicates, lam, alpha, sigma, delta, radius_bound, preregister, refactor_every
        )
        self.threshold = check_float("threshold", threshold, low=0.0, allow_inf=True)
        self.register_buffer("steps_since_sync", torch.zeros(self.replicates * self.num_clients, dtype=torch.long))
        self.register_buffer("sync_rounds", torch.zeros(self.replicates, dtype=torch.long))

    def _row_buffers(self) -> dict[str, Tensor]:
        return {**super()._row_buffers(), "steps_since_sync": self.steps_since_sync}

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        new["steps_since_sync"] = state["steps_since_sync"] + 1
        gain = new["policy.logdet"] - self.synced_logdet[rows]
        due = new["steps_since_sync"].to(torch.float64) * gain > self.threshold
        return arms, due, new, z

    def _communicate(self, rows: Tensor) -> Tensor:
        return torch.cat([self._sync(rep) for rep in (rows // self.num_clients).tolist()])

    def _sync(self, rep: int) -> Tensor:
        """One global synchronisation of replicate ``rep``: all registered clients upload, then download.

        Returns the rows of the synchronised clients."""
        N = self.num_clients
        members = self.registered[rep * N : (rep + 1) * N].nonzero().view(-1) + rep * N
        n = members.numel()
        owners = torch.full((n,), rep, dtype=torch.long)
        uploads = self.channel.send("upload", owners, self.buffer[members], self.message_scalars)
        self.server[rep] += uploads.sum(0)
        self.server_count[rep] += self.buffer_count[members].sum()
        self.channel.send("download", owners, self.server[rep].expand(n, -1, -1), self.message_scalars)
        self.policy.broadcast_statistics(members, self.server[rep], self.server_count[rep])
        self.synced_logdet[members] = self.policy.logdet[members]
        self.buffer[members] = 0
        self.buffer_count[members] = 0
        self.steps_since_sync[members] = 0
        self.sync_rounds[rep] += 1
        return members
