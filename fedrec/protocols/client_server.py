"""State and step loop shared by the star-network protocols (Async-LinUCB, Async-LinUCB-AM, Sync-LinUCB).

Each client holds a local policy row (``policy``), an upload buffer (ΔV_i, Δb_i) as an augmented matrix and the
cached log det S_i(λ) of its last synchronised copy S_i = V_i − ΔV_i; each replicate's server holds the aggregate
(V_g, b_g). State rows are slots: replicate r owns rows r·cap … r·cap + cap − 1, ``row_of`` maps a client to its
slot and ``client_of`` a slot to its client. The ``dense`` layout gives every client its slot up front (slot =
client); the ``sparse`` layout gives a client its slot when it first arrives, in order of arrival, and grows ``cap``
by doubling, so that memory follows the clients that arrived rather than ``num_clients``. Both hold the same
statistics and make the same decisions: loops over clients (downloads, syncs) visit them in client order either
way. The torch path below is the readable reference: one step of every replicate at a time, communication through
the channel. The compiled path runs a kernel of
:mod:`fedrec.protocols.kernels.client_server` and returns to Python only for messages the channel transforms.
"""
from __future__ import annotations

import inspect
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedrec.bandits.linear import LinearBandit, LinTS, RowState, outer
from fedrec.errors import ConfigError, check_choice
from fedrec.protocols.base import PolicyFactory, StepProtocol, build_policy, kernel_call, policy_views
from fedrec.protocols.kernels.client_server import Steps, Traffic
from fedrec.utils.jit import build


class ClientServerLinUCB(StepProtocol):
    """Clients with local linear-bandit rows, upload buffers and one server per replicate.

    Subclasses declare the per-client state a step reads or changes (:meth:`_bandits`, :meth:`_row_buffers`,
    :meth:`_additive`), implement the local step :meth:`_advance` and the communication :meth:`_communicate`,
    and give their compiled step loop (:attr:`kernels`) with the structures it takes (:attr:`kernel_state`,
    :attr:`kernel_settings`).
    """

    takes_policy = True
    shards_replicates = True
    LAYOUTS = ("dense", "sparse")

    def __new__(cls, *args: Any, **kwargs: Any) -> ClientServerLinUCB:
        self = super().__new__(cls)
        # the constructor's arguments: :meth:`replicates_part` builds the same protocol over fewer replicates
        bound = inspect.signature(cls.__init__).bind_partial(self, *args, **kwargs).arguments
        self.__dict__["_arguments"] = {k: v for k, v in bound.items() if k != "self"}
        return self

    def __init__(
        self, num_clients: int, dim: int, replicates: int, policy: PolicyFactory | None, seed: int, backend: str,
        preregister: bool, layout: str = "dense",
    ) -> None:
        super().__init__(num_clients, dim, replicates, seed, backend)
        check_choice("protocol.layout", layout, self.LAYOUTS)
        if layout == "sparse" and preregister:
            raise ConfigError("protocol.layout=sparse: preregistered clients all hold state from the start; "
                              "use layout=dense with preregister=true")
        self.layout = layout
        R, N, d = self.replicates, self.num_clients, self.dim
        cap = N if layout == "dense" else 1  # the sparse layout starts with one (fresh) slot per replicate
        self.policy = build_policy(policy, d, (R, cap), self.seed)
        self.lam = self.policy.lam
        kw: dict[str, Any] = dict(dtype=torch.float64)
        self.register_buffer("buffer", torch.zeros(R * cap, d + 1, d + 1, **kw))
        self.register_buffer("buffer_count", torch.zeros(R * cap, dtype=torch.long))
        self.register_buffer("synced_logdet", torch.full((R * cap,), d * math.log(self.lam), **kw))
        self.register_buffer("registered", torch.full((R * cap,), bool(preregister)))
        self.register_buffer("server", torch.zeros(R, d + 1, d + 1, **kw))
        self.register_buffer("server_count", torch.zeros(R, dtype=torch.long))
        if layout == "dense":
            self.register_buffer("client_of", torch.arange(N).repeat(R))
            self.register_buffer("allocated", torch.full((R,), N))
        else:
            self.row_of.fill_(-1)
            self.register_buffer("client_of", torch.full((R,), -1))
            self.register_buffer("allocated", torch.zeros(R, dtype=torch.long))
        self._fresh: dict[str, Tensor] | None = None  # a fresh slot of every row buffer (see :meth:`_fresh_rows`)
        self.first_replicate = 0  # the run's replicate that this protocol's replicate 0 is (:meth:`replicates_part`)
        self.replicate_keys: tuple[str, ...] = ()  # a part's state-dict entries that run over the replicates (ditto)

    @property
    def capacity(self) -> int:
        """Slots per replicate (``num_clients`` in the dense layout)."""
        return self.client_of.shape[0] // self.replicates

    @property
    def slots_used(self) -> int:
        """Slots per replicate that :meth:`state_dict` keeps: the most any replicate has allocated (one at least)."""
        return max(int(self.allocated.max()), 1)

    @property
    def message_scalars(self) -> int:
        """Scalars in one {ΔV, Δb} message."""
        return self.dim * self.dim + self.dim

    def _row(self, replicate: int, client: Tensor) -> Tensor:
        """The state row (a 1-element tensor) of ``client`` in ``replicate``."""
        return self.row_of[replicate * self.num_clients + client].view(1)

    def _client_ids(self, rows: Tensor) -> tuple[Tensor, Tensor]:
        """(replicate, client) of state rows."""
        return rows // self.capacity, self.client_of.index_select(0, rows)

    def _in_client_order(self, rows: Tensor) -> Tensor:
        """``rows`` sorted by (replicate, client): the order in which the dense layout visits them."""
        key = rows // self.capacity * self.num_clients + self.client_of.index_select(0, rows)
        return rows.index_select(0, key.argsort())

    # ---------------------------------------------------------------------------------- state rows
    def _row_state(self) -> dict[str, tuple[nn.Module, str]]:
        """Every buffer with one entry per state row, by its state-dict key: (module, attribute)."""
        out = {f"{name}.{k}": (bandit, k) for name, bandit in self._bandits().items()
               for k in bandit._buffers if k not in bandit._non_persistent_buffers_set}
        out.update({k: (self, k) for k in ("buffer", "buffer_count", "synced_logdet", "registered", "client_of")})
        return out

    def _fresh_rows(self) -> dict[str, Tensor]:
        """One fresh slot of every row buffer, copied before the first arrival or load changes any slot."""
        if self._fresh is None:
            self._fresh = {k: getattr(m, a)[0].clone() for k, (m, a) in self._row_state().items()}
        return self._fresh

    def _resize(self, cap: int) -> None:
        """Give every replicate ``cap`` slots, keeping the first ``min(cap, capacity)`` (one buffer at a time, so
        that the peak is the new state plus one old buffer) and filling the rest with fresh slots."""
        self.__dict__["_views_cache"] = None  # the kernels' views would keep the old buffers alive
        R, old = self.replicates, self.capacity
        keep = min(cap, old)
        for k, (module, attr) in self._row_state().items():
            buf = getattr(module, attr)
            fresh = self._fresh_rows()[k].to(buf)
            new = buf.new_empty((R, cap, *fresh.shape))
            new[:, :keep] = buf.view(R, old, *fresh.shape)[:, :keep]
            new[:, keep:] = fresh
            module._buffers[attr] = new.view(R * cap, *fresh.shape)
        mapped = self.row_of >= 0
        self.row_of.copy_(torch.where(mapped, self.row_of // old * cap + self.row_of % old, -1))
        self._set_streams()

    def _set_streams(self, rows: Tensor | None = None) -> None:
        """A LinTS policy's ``rows`` (all if None) draw from their client's stream r·N + c, the dense layout's row,
        with r the replicate in the whole run (a process of a sharded run holds replicates from ``first_replicate``)."""
        if not isinstance(self.policy, LinTS):
            return
        if rows is None:
            rows = torch.arange(self.client_of.shape[0])
            self.policy._buffers["stream"] = torch.empty_like(rows)
        replicate = self.first_replicate + rows // self.capacity
        self.policy.stream[rows] = replicate * self.num_clients + self.client_of.index_select(0, rows)

    def _arrive(self, clients: Tensor) -> None:
        """Slots for the clients of ``clients`` (R, S) that have none yet (sparse layout), in order of arrival."""
        if self.layout == "dense":
            return
        self._fresh_rows()
        R, N = self.replicates, self.num_clients
        arrivals = []
        for r in range(R):
            ids, first = np.unique(clients[r].numpy(), return_index=True)
            ids = torch.from_numpy(ids[first.argsort()])
            arrivals.append(ids[self.row_of[r * N + ids] < 0])
        need = max(int(self.allocated[r]) + len(new) for r, new in enumerate(arrivals))
        if need > self.capacity:
            self._resize(min(max(need, 2 * self.capacity), N))
        cap = self.capacity
        for r, new in enumerate(arrivals):
            rows = r * cap + int(self.allocated[r]) + torch.arange(len(new))
            self.row_of[r * N + new] = rows
            self.client_of[rows] = new
            self.allocated[r] += len(new)
            self._set_streams(rows)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """``nn.Module.state_dict`` with the row buffers cut to the slots in use (compact checkpoints)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        R, cap, used = self.replicates, self.capacity, self.slots_used
        if used < cap:
            for k in self._row_state():
                t = state[prefix + k]
                state[prefix + k] = t.view(R, cap, *t.shape[1:])[:, :used].reshape(R * used, *t.shape[1:])
            row_of = state[prefix + "row_of"]
            state[prefix + "row_of"] = torch.where(row_of >= 0, row_of // cap * used + row_of % cap, -1)
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict`` into row buffers sized as the checkpoint's (see :meth:`state_dict`)."""
        rows = state_dict.get("client_of")
        self._fresh_rows()
        if rows is not None and rows.shape[0] != self.client_of.shape[0]:
            self._resize(rows.shape[0] // self.replicates)
        out = super().load_state_dict(state_dict, strict, assign)
        self._set_streams()
        return out

    # ----------------------------------------------------------------------- sharding by replicates
    def replicates_part(self, lo: int, hi: int) -> ClientServerLinUCB:
        """The same protocol over replicates [lo, hi) of this one, holding their state: one process's share of a run
        sharded by replicates. Its decisions are theirs here (LinTS rows keep their replicate's streams)."""
        part = type(self)(**{**self.__dict__["_arguments"], "replicates": hi - lo})
        part.first_replicate = self.first_replicate + lo
        state, R, used = self.state_dict(), self.replicates, self.slots_used
        fresh = part.state_dict()  # an entry runs over the replicates where its leading size differs from this one's
        part.replicate_keys = tuple(k for k, v in state.items() if isinstance(v, Tensor) and v.dim()
                                    and v.shape[0] != fresh[k].shape[0])
        for k in part.replicate_keys:
            block = state[k].shape[0] // R
            state[k] = state[k][lo * block:hi * block]
        state["row_of"] = torch.where(state["row_of"] >= 0, state["row_of"] - lo * used, -1)
        part.load_state_dict(state)
        return part

    def placed_entry(self, key: str, value: Tensor, lo: int, used: int) -> Tensor:
        """Entry ``key`` of this part's state dict (``value``, one of its ``replicate_keys``) as the rows it fills of
        the whole run's, where the part starts at replicate ``lo`` and every replicate has ``used`` slots (fresh ones
        after the part's own; ``row_of`` counts the whole's rows). A part of :meth:`replicates_part`."""
        R, own = self.replicates, self.slots_used
        if key in self._row_state():
            fresh = self._fresh_rows()[key].to(value)
            slots = torch.cat([value.view(R, own, *fresh.shape), fresh.expand(R, used - own, *fresh.shape)], 1)
            return slots.reshape(R * used, *fresh.shape)
        if key == "row_of":
            return torch.where(value >= 0, (lo + value // own) * used + value % own, -1)
        return value

    # ------------------------------------------------------------------------------- subclass hooks
    def _bandits(self) -> dict[str, LinearBandit]:
        """The per-client bandit modules whose row state a step changes, by name."""
        return {"policy": self.policy}

    def _row_buffers(self) -> dict[str, Tensor]:
        """Other per-client buffers (one entry per state row) that a step reads or changes, by name."""
        return {"buffer_count": self.buffer_count}

    def _additive(self) -> list[Tensor]:
        """Per-client buffers (rows, n, n) that grow by the z zᵀ of every step (not carried as state)."""
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
        self._arrive(clients)
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
                   event=event, row_of=self.row_of.numpy(), client_of=self.client_of.numpy(),
                   allocated=self.allocated.numpy())
        v = self.kernel_views()
        while True:
            kernel_call(kernel, R, io, *v.values())
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
