"""The public extension point for compiled client–server protocols: LinUCB clients, a server, and a global
synchronisation (Algorithm 4 of Li & Wang 2022) whenever a pluggable trigger fires.

A new periodic or event-triggered protocol is a trigger function, a subclass of :class:`TriggeredLinUCB` and a
config. The trigger is a plain Python function ``trigger(r, row, pol, st, own) -> bool`` that numba compiles into
the loop (:mod:`fedrec.protocols.kernels.triggered`); it runs after every client step and says whether replicate
``r`` synchronises now. It may read and write:

* ``row``: the acting client's state row; ``r``: its replicate (an int64),
* ``pol``: the local policy's rows (``G``, ``inv``, ``logdet``, ``count``, ... of
  :class:`~fedrec.protocols.kernels.linear.PolicyRows`), after the step,
* ``st``: the sync state (:class:`~fedrec.protocols.kernels.triggered.SyncState`: the upload buffers and their
  ``buffer_count``, ``synced_logdet``, ``steps_since_sync``, ``sync_rounds``, the server aggregate, ...),
* ``own``: the protocol's own structure, a ``NamedTuple`` (:attr:`TriggeredLinUCB.trigger_fields`) filled by field
  name from the protocol's attributes (settings) and buffers (state it keeps across calls and checkpoints).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import ConfigError
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.client_server import ClientServerLinUCB
from fedrec.protocols.kernels.triggered import LoopSettings, SyncState, compiled_loop
from fedrec.utils.jit import build


class NoFields(NamedTuple):
    """The ``own`` structure of a trigger that needs nothing beyond the policy's rows and the sync state."""


class TriggeredLinUCB(ClientServerLinUCB):
    """Clients with local LinUCB (or LinTS) rows; whenever :attr:`trigger` fires after a step, every registered client
    uploads its new statistics and downloads the aggregate (a sync costs 2 messages per registered client).

    Subclasses give :attr:`trigger` (as ``trigger = staticmethod(fn)``), the structure it takes as ``own``
    (:attr:`trigger_fields`) and, optionally, a torch twin of the trigger (:meth:`_due`), which the torch path
    needs on devices other than the CPU.

    Args:
        num_clients, dim, replicates, seed, backend: as in :class:`~fedrec.protocols.StepProtocol`.
        policy: the clients' local policy (default :func:`~fedrec.protocols.paper_linucb`).
        preregister: register every client at t = 0 (else when it first acts; only registered clients sync).
        layout: ``dense`` | ``sparse``, as in :class:`~fedrec.protocols.AsyncLinUCB`.
    """

    #: ``trigger(r, row, pol, st, own) -> bool``, a plain Python function (the module docstring)
    trigger: ClassVar[Callable[..., bool]]
    #: the trigger's own structure, filled by field name from the protocol's attributes and buffers
    trigger_fields: ClassVar[type[tuple]] = NoFields
    kernel_state, kernel_settings = SyncState, LoopSettings

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, policy: PolicyFactory | None = None,
        preregister: bool = False, seed: int = 0, backend: str = "auto", layout: str = "dense",
    ) -> None:
        super().__init__(num_clients, dim, replicates, policy, seed, backend, preregister, layout)
        self.register_buffer("steps_since_sync", torch.zeros(self.client_of.shape[0], dtype=torch.long))
        self.register_buffer("sync_rounds", torch.zeros(self.replicates, dtype=torch.long))

    def _row_state(self) -> dict[str, tuple[torch.nn.Module, str]]:
        return {**super()._row_state(), "steps_since_sync": (self, "steps_since_sync")}

    def _row_buffers(self) -> dict[str, Tensor]:
        return {**super()._row_buffers(), "steps_since_sync": self.steps_since_sync}

    def _advance(self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState):
        arms, new, z = self._local_step(contexts, rewards, state)
        new["steps_since_sync"] = state["steps_since_sync"] + 1
        return arms, self._due(rows, new), new, z

    def _due(self, rows: Tensor, new: RowState) -> Tensor | None:
        """The torch twin of :attr:`trigger`: whether each replicate syncs after the step of ``rows`` whose new state
        is ``new``. None (this default): :attr:`trigger` itself decides after the step, on the buffers' numpy
        views (CPU only)."""
        return None

    def _upload_due(self, rows: Tensor, due: Tensor | None) -> Tensor:
        if due is not None:
            return due
        if self.steps_since_sync.device.type != "cpu":
            raise ConfigError(f"protocol.backend=torch: {type(self).__name__}'s trigger reads numpy views of the "
                              f"buffers, which are on {self.steps_since_sync.device}; give it a torch twin (_due)")
        v = self.kernel_views()
        return torch.tensor([self.trigger(r, row, v["rows"], v["state"], v["own"])
                             for r, row in enumerate(rows.tolist())])

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

    @property
    def kernels(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return compiled_loop(self.trigger)

    def _kernel_views(self) -> dict[str, tuple]:
        return {**super()._kernel_views(), "own": build(self.trigger_fields, self)}

