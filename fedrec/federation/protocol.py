"""Step-wise federated bandit protocols: the base class, the batched window executor, the centralised baseline."""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from fedrec.bandits.linear import LinearBandit, LinUCB, RowState
from fedrec.errors import check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger


class BanditProtocol(nn.Module):
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

    def run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:  # pragma: no cover - abstract
        """Play steps in order: ``clients`` (R, S), ``contexts`` (R, S, K, d), ``rewards`` (R, S, K) -> arms (R, S)."""
        raise NotImplementedError

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

    Subclasses declare their per-client state (:meth:`_bandits`, :meth:`_row_buffers`) and implement
    :meth:`_advance` and :meth:`_communicate`.
    """

    max_window = 1024

    def __init__(self, num_clients: int, dim: int, replicates: int = 1) -> None:
        super().__init__(num_clients, dim, replicates)
        self._window = 16

    # ------------------------------------------------------------------------------- subclass hooks
    def _bandits(self) -> dict[str, LinearBandit]:  # pragma: no cover - abstract
        """The per-client bandit modules whose row state a step changes, by name."""
        raise NotImplementedError

    def _row_buffers(self) -> dict[str, Tensor]:  # pragma: no cover - abstract
        """Other per-client buffers (leading dim R·N) that a step reads or changes, by name."""
        raise NotImplementedError

    def _advance(
        self, rows: Tensor, contexts: Tensor, rewards: Tensor, state: RowState
    ) -> tuple[Tensor, Tensor, RowState]:  # pragma: no cover - abstract
        """One step of distinct ``rows`` from ``state``: (arms, trigger fired, new state)."""
        raise NotImplementedError

    def _communicate(self, rows: Tensor) -> None:  # pragma: no cover - abstract
        """Communication after a committed step whose trigger fired (at most one row per replicate)."""
        raise NotImplementedError

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
        while True:
            w = min(self._window, int((S - pos).max()))
            if w <= 0:
                return arms
            steps = torch.arange(w)
            idx = pos.view(-1, 1) + steps
            in_range = idx < S
            idx = idx.clamp_max(S - 1)
            rows = self._offsets.view(-1, 1) + clients.gather(1, idx)
            same = (rows.unsqueeze(2) == rows.unsqueeze(1)) & _strictly_lower(w)  # [r, i, j]: j < i, same client
            rank = same.sum(-1)
            prev = torch.where(same, steps, -1).max(-1).values + (reps * w)  # flat position of the previous visit
            limit = torch.minimum(torch.where(in_range, w, steps).min(-1).values, self._window_limit(rows))
            flat_rows = rows.view(-1)
            ctx = contexts[reps, idx].flatten(0, 1)
            rew = rewards[reps, idx].flatten(0, 1)
            arms_w = torch.zeros(R * w, dtype=torch.long)
            due_w = torch.zeros(R * w, dtype=torch.bool)
            carry: RowState = {}
            for k in range(int(rank.max()) + 1):
                sel = ((rank == k) & (steps < limit.view(-1, 1))).view(-1).nonzero().view(-1)
                if sel.numel() == 0:
                    break
                if k == 0:
                    state = self._gather(flat_rows[sel])
                else:
                    src = prev.view(-1)[sel]
                    state = {name: v[src] for name, v in carry.items()}
                a, due, new = self._advance(flat_rows[sel], ctx[sel], rew[sel], state)
                if not carry:
                    carry = {name: v.new_empty((R * w,) + v.shape[1:]) for name, v in new.items()}
                for name, v in new.items():
                    carry[name][sel] = v
                arms_w[sel] = a
                due_w[sel] = due
                first_due = torch.where(due_w.view(R, w) & (steps < limit.view(-1, 1)), steps, w).min(-1).values
                limit = torch.minimum(limit, first_due + 1)
            keep = steps < limit.view(-1, 1)
            later = (same & keep.unsqueeze(2)).any(1)  # [r, j]: a kept later step visits the same client
            last = (keep & ~later).view(-1).nonzero().view(-1)
            self._scatter(flat_rows[last], {name: v[last] for name, v in carry.items()})
            arms[reps.expand(R, w)[keep], idx[keep]] = arms_w.view(R, w)[keep]
            end = (limit - 1).clamp_min(0)
            fired = (limit > 0) & due_w.view(R, w).gather(1, end.view(-1, 1)).view(-1)
            if bool(fired.any()):
                self._communicate(rows[fired, end[fired]])
            pos += limit
            self._window = max(8, min(self.max_window, 2 * int(limit.max())))


_LOWER: dict[int, Tensor] = {}


def _strictly_lower(w: int) -> Tensor:
    """Boolean (w, w) mask of j < i, cached per size."""
    if w not in _LOWER:
        _LOWER[w] = torch.ones(w, w, dtype=torch.bool).tril(-1)
    return _LOWER[w]
