"""The centralised baseline: every client's data goes to one model per replicate, with no communication."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import Tensor

from fedrec.protocols.base import PolicyFactory, StepProtocol, build_policy, kernel_call, policy_views
from fedrec.protocols.kernels.centralized import ROWS_RUN, RowSteps


class CentralizedLinUCB(StepProtocol):
    """One policy row per replicate fed by all clients at no communication cost: the γ = 1 ideal of the papers.

    All clients map to their replicate's row through ``row_of``. Several agents may act in one step
    (``clients`` (R, S, A)): they act in agent order, each after the previous one's update.
    """

    takes_policy = True

    max_agents_per_step = None
    supports_replay = True

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, policy: PolicyFactory | None = None, seed: int = 0,
        backend: str = "auto", endpoints: Mapping[str, int] | None = None,
    ) -> None:
        super().__init__(num_clients, dim, replicates, seed, backend, endpoints)
        self.policy = build_policy(policy, dim, (self.replicates,), self.seed)
        self.row_of.copy_(torch.arange(self.replicates).repeat_interleave(self.num_clients))

    def _kernel_views(self) -> dict[str, tuple]:
        return policy_views(self.policy)

    def _run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        return self._play(clients, contexts, rewards, None)

    def _replay(self, clients: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor) -> Tensor:
        return self._play(clients, contexts, rewards, logged)

    def _play(self, clients: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor | None) -> Tensor:
        """Steps in order; with ``logged`` (replay) a step updates its row only if it picked the logged arm."""
        R = self.replicates
        shape = clients.shape
        clients = clients.reshape(R, -1)  # agents of a step act one after another
        contexts = contexts.reshape(R, clients.shape[1], *contexts.shape[-2:])
        rewards = rewards.reshape(R, clients.shape[1], -1)
        rows = self.row_of[self._offsets.view(-1, 1) + clients]
        if self.use_compiled():
            arms = self._run_compiled(rows, contexts, rewards, logged)
        elif logged is None:
            arms = torch.stack([self.policy.play(contexts[:, s], rewards[:, s], rows[:, s])
                                for s in range(rows.shape[1])], 1)
        else:
            arms = torch.stack([self._replay_step(contexts[:, s], rewards[:, s], rows[:, s], logged[:, s])
                                for s in range(rows.shape[1])], 1)
        return arms.reshape(shape)

    def _replay_step(self, contexts: Tensor, rewards: Tensor, rows: Tensor, logged: Tensor) -> Tensor:
        """One replay step on the torch path: every row decides, the rows that picked the logged arm update."""
        arms = self.policy.select(contexts, rows)
        hit = (arms == logged).nonzero().squeeze(1)
        if len(hit):
            self.policy.update(contexts[hit, arms[hit]], rewards[hit, arms[hit]], rows[hit])
        return arms

    def _run_compiled(self, rows: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor | None) -> Tensor:
        arms = torch.empty(rows.shape, dtype=torch.long)
        event = np.zeros(self.replicates, dtype=np.int64)
        replay = np.zeros((self.replicates, 0), dtype=np.int64) if logged is None else logged.contiguous().numpy()
        # C-contiguous blocks (a replay's rewards arrive as a strided view), so the kernel compiles once
        io = RowSteps(rows=rows.contiguous().numpy(), contexts=contexts.numpy(), rewards=rewards.contiguous().numpy(),
                      logged=replay, arms=arms.numpy(), event=event)
        v = self.kernel_views()
        kernel_call(ROWS_RUN[self.replicates > 1], rows.shape[0], io, v["params"], v["rows"])
        if (event < 0).any():
            raise FloatingPointError("CentralizedLinUCB: a Gram matrix V + λI is no longer positive definite")
        return arms
