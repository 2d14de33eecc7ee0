"""State and step loop shared by the star-network protocols (Async-LinUCB, Async-LinUCB-AM, Sync-LinUCB).

Each client holds a local policy row (``policy``, rows = replicate × client), an upload buffer (ΔV_i, Δb_i) as an
augmented matrix and the cached log det S_i(λ) of its last synchronised copy S_i = V_i − ΔV_i; each replicate's
server holds the aggregate (V_g, b_g). The torch path below is the readable reference: one step of every
replicate at a time, communication through the channel. The compiled path runs a kernel of
:mod:`fedrec.protocols.kernels.client_server` and returns to Python only for messages the channel transforms.
"""
from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.bandits.linear import LinearBandit, RowState, outer
from fedrec.jit import build
from fedrec.protocols.base import PolicyFactory, StepProtocol, build_policy, kernel_call, policy_views
from fedrec.protocols.kernels.client_server import Steps, Traffic


class ClientServerLinUCB(StepProtocol):
    """Clients with local linear-bandit rows, upload buffers and one server per replicate.

    Subclasses declare the per-client state a step reads or changes (:meth:`_bandits`, :meth:`_row_buffers`,
    :meth:`_additive`), implement the local step :meth:`_advance` and the communication :meth:`_communicate`,
    and give their compiled step loop (:attr:`kernels`) with the structures it takes (:attr:`kernel_state`,
    :attr:`kernel_settings`).
    """

    takes_policy = True

    def __init__(
        self, num_clients: int, dim: int, replicates: int, policy: PolicyFactory | None, seed: int, backend: str,
        preregister: bool,
    ) -> None:
        super().__init__(num_clients, dim, replicates, seed, backend)
        R, N, d = self.replicates, self.num_clients, self.dim
        self.policy = build_policy(policy, d, (R, N), self.seed)
        self.lam = self.policy.lam
        kw: dict[str, Any] = dict(dtype=torch.float64)
        self.register_buffer("buffer", torch.zeros(R * N, d + 1, d + 1, **kw))
        self.register_buffer("buffer_count", torch.zeros(R * N, dtype=torch.long))
        self.register_buffer("synced_logdet", torch.full((R * N,), d * math.log(self.lam), **kw))
        self.register_buffer("registered", torch.full((R * N,), bool(preregister)))
        self.register_buffer("server", torch.zeros(R, d + 1, d + 1, **kw))
        self.register_buffer("server_count", torch.zeros(R, dtype=torch.long))

    @property
    def message_scalars(self) -> int:
        """Scalars in one {ΔV, Δb} message."""
        return self.dim * self.dim + self.dim

    def _row(self, replicate: int, client: Tensor) -> Tensor:
        """The state row (a 1-element tensor) of ``client`` in ``replicate``."""
        return self.row_of[replicate * self.num_clients + client].view(1)

    def _client_ids(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """(replicate, client) of state rows (the client-server protocols keep ``row_of`` the identity)."""
        return rows // self.num_clients, rows % self.num_clients

    # ------------------------------------------------------------------------------- subclass hooks
    def _bandits(self) -> dict[str, LinearBandit]:
        """The per-client bandit modules whose row state a step changes, by name."""
        return {"policy": self.policy}

    def _row_buffers(self) -> dict[str, Tensor]:
        """Other per-client buffers (leading dim R·N) that a step reads or changes, by name."""
        return {"buffer_count": self.buffer_count}

    def _additive(self) -> list[Tensor]:
        """Per-client buffers (R·N, n, n) that grow by the z zᵀ of every step (not carried as state)."""
        return [self.policy.G, self.buffer]

    @abstractmethod
    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState
                 ) -> tuple[Tensor, Tensor, RowState, Tensor]:
        """One step of distinct ``rows`` from ``state``: (arms, communication due, new state, z)."""

    def _upload_due(self, rows: Tensor, due: Tensor) -> Tensor:
        """Whether each replicate communicates after its step, given what :meth:`_advance` said (``due``)."""
        return due

    @abstractmethod
    def _communicate(self, reps: Tensor, rows: Tensor) -> None:
        """The communication that the steps of ``rows`` (one per replicate in ``reps``) triggered."""

    @property
    @abstractmethod
    def kernels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """The compiled step loop: (serial, parallel over replicates)."""

    #: the kernel's structures of the protocol's own buffers and of its settings (attributes of the same names)
    kernel_state: type[tuple]
    kernel_settings: type[tuple]

    def _kernel_views(self) -> dict[str, tuple]:
        """The kernel's structures after :class:`Steps`, in the order it takes them: the policy's parameters and rows,
        the protocol's state and settings, the ledger's traffic (a subclass may append its own)."""
        ledger = self.channel.ledger
        traffic = {role: ledger.traffic(role) for role in ("client", "server")}
        settings = build(self.kernel_settings, self, bytes_per_scalar=self.channel.bytes_per_scalar,
                         stop_at_comm=not self.channel.transparent)
        return {**policy_views(self.policy), "state": build(self.kernel_state, self), "settings": settings,
                "traffic": build(Traffic, traffic)}

    def _register(self, rows: Tensor) -> None:
        """Clients acting for the first time (one row per replicate) become registered (a newcomer has S_j = 0)."""
        self.registered[rows] = True

    # --------------------------------------------------------------------------------- state access
    def _gather(self, rows: Tensor) -> RowState:
        state = {f"{name}.{k}": v for name, bandit in self._bandits().items() for k, v in bandit.gather(rows).items()}
        state.update({k: buf.index_select(0, rows) for k, buf in self._row_buffers().items()})
        return state

    def _scatter(self, rows: Tensor, state: RowState, z: Tensor) -> None:
        zz = outer(z)
        for buf in self._additive():
            buf.index_add_(0, rows, zz)
        for k, buf in self._row_buffers().items():  # before the bandits: their refactorisation reads G
            buf.index_copy_(0, rows, state[k])
        for name, bandit in self._bandits().items():
            bandit.scatter(rows, {k: state[f"{name}.{k}"] for k in bandit.step_keys})

    def _local_step(self, contexts: Tensor, rewards: Tensor, state: RowState) -> tuple[Tensor, RowState, Tensor]:
        """A client's decision and update with its local policy (Eq. 5 for LinUCB): (arms, new state, z)."""
        pol = self.policy
        local = {k: state[f"policy.{k}"] for k in (*pol.state_keys, "row")}
        arms, x, r = pol.pick(contexts, rewards, pol.scores(contexts, local))
        local, z = pol.advance(local, x, r)
        new = {f"policy.{k}": v for k, v in local.items()}
        new["buffer_count"] = state["buffer_count"] + 1
        return arms, new, z

    # -------------------------------------------------------------------------------------- backends
    def _run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        if self.use_compiled():
            return self._run_compiled(clients, contexts, rewards)
        return self._run_torch(clients, contexts, rewards)

    @torch.no_grad()
    def _run_torch(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        R, S = clients.shape
        arms = torch.empty(R, S, dtype=torch.long, device=clients.device)
        for s in range(S):
            rows = self.rows(clients[:, s])
            self._register(rows)
            state = self._gather(rows)
            a, due, new, z = self._advance(rows, contexts[:, s], rewards[:, s], state)
            self._scatter(rows, new, z)
            arms[:, s] = a
            due = self._upload_due(rows, due)
            if bool(due.any()):
                self._communicate(self._replicate_ids[due], rows[due])
        return arms

    def _run_compiled(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        R, S = clients.shape
        arms = np.empty((R, S), dtype=np.int64)
        pos = np.zeros(R, dtype=np.int64)
        event = np.zeros(R, dtype=np.int64)
        kernel = self.kernels[R > 1]
        io = Steps(clients=clients.numpy(), contexts=contexts.numpy(), rewards=rewards.numpy(), arms=arms, pos=pos,
                   event=event, row_of=self.row_of.numpy())
        v = self.kernel_views()
        while True:
            kernel_call(kernel, io, *v.values())
            if not event.any():
                break
            if (event < 0).any():
                raise FloatingPointError(
                    f"{type(self).__name__}: a client's Gram matrix V + λI is no longer positive definite "
                    "(did the channel deliver corrupted statistics?)")
            for r in np.flatnonzero(event > 0).tolist():  # a message the channel may transform: carried out in Python
                if event[r] == 1:
                    self._communicate(torch.tensor([r]), self._row(r, clients[r, pos[r] - 1]))
                else:  # a newcomer due a registration-time download
                    self._register(self._row(r, clients[r, pos[r]]))
        return torch.from_numpy(arms)
