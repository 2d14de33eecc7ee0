"""Step-wise federated bandit protocols: the base class, the batched window executor, the centralised baseline."""
from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod

import torch
from torch import Tensor, nn

from fedrec.bandits.linear import LinearBandit, LinUCB, RowState, outer
from fedrec.errors import check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger


class BanditProtocol(nn.Module, metaclass=ABCMeta):
    """Interaction steps of ``replicates`` independent runs × ``num_clients`` clients, batched.

    State rows are flat: ``replicate * num_clients + client``. :meth:`run` plays a block of steps.
    """

    def __init__(self, num_clients: int, dim: int, replicates: int = 1) -> None:
        super().__init__()
        self.num_clients = check_int("num_clients", num_clients)
        self.dim = check_int("dim", dim)
        self.replicates = check_int("replicates", replicates)
        self.channel = Channel(self.replicates)
        self.register_buffer("_offsets", torch.arange(self.replicates) * self.num_clients, persistent=False)
        self.register_buffer("_replicate_ids", torch.arange(self.replicates), persistent=False)

    @property
    def ledger(self) -> CommLedger:
        return self.channel.ledger

    def rows(self, clients: Tensor) -> Tensor:
        """Flat state rows of the active client of every replicate."""
        return self._offsets + clients

    @abstractmethod
    def run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """Play steps in order: ``clients`` (R, S), ``contexts`` (R, S, K, d), ``rewards`` (R, S, K) -> arms (R, S)."""

    def step(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """Play one step: ``clients`` (R,), ``contexts`` (R, K, d), ``rewards`` (R, K) -> arms (R,)."""
        return self.run(clients.unsqueeze(1), contexts.unsqueeze(1), rewards.unsqueeze(1))[:, 0]


def make_linucb(
    dim: int, batch_shape: tuple[int, ...], lam: float, alpha: float | None, sigma: float, delta: float,
    radius_bound: str, refactor_every: int,
) -> LinUCB:
    """The LinUCB module every protocol uses for its clients' local models."""
    return LinUCB(
        dim=dim, alpha=alpha, lam=lam, batch_shape=batch_shape, sigma=sigma, delta=delta,
        radius_bound=radius_bound, refactor_every=refactor_every,
    )


#: a trigger fires when a log-determinant ratio exceeds log γ by more than this: cached log-determinants
#: come from different factorisations, so an exactly unchanged matrix may show a ratio of 1 ± 1e-15
TRIGGER_TOLERANCE = 1e-10


def log_threshold(name: str, gamma: float) -> float:
    """log γ + :data:`TRIGGER_TOLERANCE` for an event trigger; γ >= 1 and may be +inf (never communicate)."""
    return math.log(check_float(name, gamma, low=1.0, allow_inf=True)) + TRIGGER_TOLERANCE


class CentralizedLinUCB(BanditProtocol):
    """All clients' data goes to one LinUCB at no communication cost: the γ = 1 ideal of the papers."""

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, lam: float = 0.1, alpha: float | None = None,
        sigma: float = 0.1, delta: float = 0.1, radius_bound: str = "determinant", refactor_every: int = 1000,
    ) -> None:
        super().__init__(num_clients, dim, replicates)
        self.policy = make_linucb(dim, (self.replicates,), lam, alpha, sigma, delta, radius_bound, refactor_every)

    @torch.no_grad()
    def run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        arms = torch.empty(clients.shape, dtype=torch.long)
        for s in range(clients.shape[1]):
            arms[:, s] = self.policy.play(contexts[:, s], rewards[:, s], self._replicate_ids)
        return arms


class EventTriggeredProtocol(BanditProtocol):
    """Protocols whose clients change state only by their own steps or by communication events.

    A client's step is a pure function of its own row state (:meth:`_advance`), and between two
    communication events no client's step affects another's. :meth:`run` therefore plays a window of
    upcoming steps in batched waves: wave k holds the k-th occurrence of each client in the window and starts
    from the states wave k−1 produced. The window is committed up to the first step whose communication
    trigger fires; that step's communication runs, and the next window starts after it. The decisions equal
    those of playing the steps one at a time.

    Subclasses declare their per-client state (:meth:`_bandits`, :meth:`_row_buffers`, :meth:`_additive`) and
    implement :meth:`_advance` and :meth:`_communicate`.
    """

    max_window = 1024

    #: steps in the first window of every :meth:`run` call; later windows adapt to the committed lengths
    first_window = 16

    # ------------------------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _bandits(self) -> dict[str, LinearBandit]:
        """The per-client bandit modules whose row state a step changes, by name."""

    @abstractmethod
    def _row_buffers(self) -> dict[str, Tensor]:
        """Other per-client buffers (leading dim R·N) that a step reads or changes, by name."""

    def _additive(self) -> list[Tensor]:
        """Per-client buffers (R·N, n, n) that grow by the z zᵀ of every step (not carried as state)."""
        return []

    @abstractmethod
    def _advance(
        self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState
    ) -> tuple[Tensor, Tensor, RowState, Tensor]:
        """One step of distinct ``rows`` from ``state``: (arms, trigger fired, new state, z)."""

    def _plan(self, block: _Window, start: Tensor, limit: Tensor) -> tuple[Tensor, object | None]:
        """Per replicate, where the steps to commit before the next communication end, and what to send then.

        The default ends each replicate's range just after its first fired trigger in [start, limit) and
        plans that step's communication (:meth:`_communicate` gets its rows); ``None`` when nothing fired.
        """
        R, w = block.rows.shape
        steps = torch.arange(w)
        due = block.due.view(R, w) & (steps >= start.view(-1, 1)) & (steps < limit.view(-1, 1))
        first_due = torch.where(due, steps, w).min(-1).values
        fired = first_due < limit
        if not bool(fired.any()):
            return limit, None
        return torch.minimum(limit, first_due + 1), block.rows[fired, first_due[fired]]

    @abstractmethod
    def _communicate(self, plan: object) -> Tensor:
        """Carry out a communication planned by :meth:`_plan`, after the steps before it were committed.

        Returns the rows whose state the communication changed (their pending steps are recomputed).
        """

    def _window_limit(self, rows: Tensor) -> Tensor:
        """Per replicate, how many leading steps of the window ``rows`` (R, w) may be committed together."""
        return torch.full((rows.shape[0],), rows.shape[1], dtype=torch.long)

    # --------------------------------------------------------------------------------- state access
    def _gather(self, rows: Tensor) -> RowState:
        state = {f"{name}.{k}": v for name, bandit in self._bandits().items() for k, v in bandit.gather(rows).items()}
        state.update({k: buf.index_select(0, rows) for k, buf in self._row_buffers().items()})
        return state

    def _scatter(self, rows: Tensor, state: RowState) -> None:
        for name, bandit in self._bandits().items():
            bandit.scatter(rows, {k: state[f"{name}.{k}"] for k in bandit.state_keys})
        for k, buf in self._row_buffers().items():
            buf.index_copy_(0, rows, state[k])

    # -------------------------------------------------------------------------------------- executor
    @torch.no_grad()
    def run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        R, S = clients.shape
        arms = torch.empty(R, S, dtype=torch.long)
        pos = torch.zeros(R, dtype=torch.long)
        reps = self._replicate_ids.view(-1, 1)
        window = self.first_window  # a function of this call alone, so a resumed run computes identically
        while True:
            w = min(window, int((S - pos).max()))
            if w <= 0:
                for bandit in self._bandits().values():  # leave every inverse current between calls
                    bandit.refresh()
                return arms
            steps = torch.arange(w)
            idx = pos.view(-1, 1) + steps
            in_range = idx < S
            idx = idx.clamp_max(S - 1)
            rows = self._offsets.view(-1, 1) + clients.gather(1, idx)
            limit = torch.minimum(torch.where(in_range, w, steps).min(-1).values, self._window_limit(rows))
            block = _Window(self, rows, contexts[reps, idx].flatten(0, 1), rewards[reps, idx].flatten(0, 1), limit)
            start = torch.zeros(R, dtype=torch.long)
            while True:  # commit up to the next communication, communicate, carry on with the unaffected steps
                end, plan = self._plan(block, start, limit)
                keep = (steps >= start.view(-1, 1)) & (steps < end.view(-1, 1))
                block.commit(keep)
                arms[reps.expand(R, w)[keep], idx[keep]] = block.arms.view(R, w)[keep]
                if plan is None:
                    break
                changed = self._communicate(plan)
                stale = torch.isin(rows, changed) & (steps >= end.view(-1, 1))
                limit = torch.minimum(limit, torch.where(stale, steps, w).min(-1).values)
                start = end
            pos += limit
            window = max(8, min(self.max_window, 2 * int(limit.max())))


class _Window:
    """Speculative steps of one window: decisions and new row states of every step, in batched waves.

    Wave k holds the k-th visit of each client in the window and starts from the states of wave k−1.
    """

    def __init__(self, protocol: EventTriggeredProtocol, rows: Tensor, ctx: Tensor, rew: Tensor, limit: Tensor):
        R, w = rows.shape
        self.protocol, self.rows = protocol, rows
        self.flat_rows = rows.view(-1)
        rank, prev, self.succ = _visits(rows)
        self.first_visit = rank == 0
        self.arms = torch.zeros(R * w, dtype=torch.long)
        self.due = torch.zeros(R * w, dtype=torch.bool)
        self.carry: RowState = {}
        self.waves: list[tuple[Tensor, Tensor]] = []  # (positions, z) of every wave
        active = torch.arange(w) < limit.view(-1, 1)
        for k in range(int(rank.max()) + 1):
            sel = ((rank == k) & active).view(-1).nonzero().view(-1)
            if sel.numel() == 0:
                break
            if k == 0:
                state = protocol._gather(self.flat_rows[sel])
            else:
                src = prev.view(-1)[sel] + (sel // w) * w
                state = {name: v[src] for name, v in self.carry.items()}
            a, due, new, z = protocol._advance(self.flat_rows[sel], ctx[sel], rew[sel], state)
            if not self.carry:
                self.carry = {name: v.new_empty((R * w,) + v.shape[1:]) for name, v in new.items()}
            for name, v in new.items():
                self.carry[name][sel] = v
            self.waves.append((sel, z))
            self.arms[sel] = a
            self.due[sel] = due

    def commit(self, keep: Tensor) -> None:
        """Write the steps where ``keep`` (R, w) is true into the protocol's state."""
        protocol, flat_keep = self.protocol, keep.view(-1)
        targets = protocol._additive()
        for sel, z in self.waves:  # wave order is time order for every client
            kept = flat_keep[sel]
            if targets and bool(kept.any()):
                rows_k, zz = self.flat_rows[sel[kept]], outer(z[kept])
                for buf in targets:
                    buf.index_add_(0, rows_k, zz)
        later = keep.gather(1, self.succ.clamp_min(0)) & (self.succ >= 0)  # the client's next visit is kept too
        last = (keep & ~later).view(-1).nonzero().view(-1)
        if last.numel():
            protocol._scatter(self.flat_rows[last], {name: v[last] for name, v in self.carry.items()})


def _visits(rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """For every step of ``rows`` (R, w): how many earlier steps visit the same client (its wave), and the
    positions of the client's previous and next visits in the window (-1 if none)."""
    R, w = rows.shape
    order = torch.sort(rows, dim=1, stable=True).indices  # groups of equal rows, in time order
    srt = rows.gather(1, order)
    first = torch.ones(R, w, dtype=torch.bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    pos = torch.arange(w).expand(R, w)
    start = torch.where(first, pos, 0).cummax(1).values
    none = torch.full((R, 1), -1, dtype=torch.long)
    prev_sorted = torch.where(first, -1, torch.cat([none, order[:, :-1]], 1))
    last = torch.ones(R, w, dtype=torch.bool)
    last[:, :-1] = first[:, 1:]
    succ_sorted = torch.where(last, -1, torch.cat([order[:, 1:], none], 1))
    rank, prev, succ = (torch.empty_like(rows) for _ in range(3))
    rank.scatter_(1, order, pos - start)
    prev.scatter_(1, order, prev_sorted)
    succ.scatter_(1, order, succ_sorted)
    return rank, prev, succ


class ClientServerLinUCB(EventTriggeredProtocol):
    """Star-network LinUCB state shared by Async- and Sync-LinUCB.

    Each client holds a LinUCB (``policy``, rows = replicate × client), an upload buffer (ΔV_i, Δb_i) as an
    augmented matrix, and the cached log det S_i(λ) of its last synchronised copy S_i = V_i − ΔV_i; each
    replicate's server holds the aggregate (V_g, b_g). Every step adds its z zᵀ to V_i and ΔV_i.
    """

    def __init__(
        self, num_clients: int, dim: int, replicates: int, lam: float, alpha: float | None, sigma: float,
        delta: float, radius_bound: str, preregister: bool, refactor_every: int,
    ) -> None:
        super().__init__(num_clients, dim, replicates)
        R, N, d = self.replicates, self.num_clients, self.dim
        self.policy = make_linucb(d, (R, N), lam, alpha, sigma, delta, radius_bound, refactor_every)
        self.lam = self.policy.lam
        kw = dict(dtype=torch.float64)
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

    def _bandits(self) -> dict[str, LinearBandit]:
        return {"policy": self.policy}

    def _row_buffers(self) -> dict[str, Tensor]:
        return {"buffer_count": self.buffer_count, "registered": self.registered}

    def _additive(self) -> list[Tensor]:
        return [self.policy.G, self.buffer]

    def _local_step(self, contexts: Tensor, rewards: Tensor, state: RowState) -> tuple[Tensor, RowState, Tensor]:
        """A client's LinUCB decision and update (Eq. 5): (arms, new state, z)."""
        pol = self.policy
        local = {k: state[f"policy.{k}"] for k in pol.state_keys}
        arms, x, r = pol.pick(contexts, rewards, pol.scores(contexts, local))
        local, z = pol.advance(local, x, r)
        new = {f"policy.{k}": v for k, v in local.items()}
        new["buffer_count"] = state["buffer_count"] + 1
        new["registered"] = torch.ones_like(state["registered"])  # a newcomer has S_j = 0 (ΔV_{−j} = V_g)
        return arms, new, z
