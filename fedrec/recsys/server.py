"""The optimiser steps that close a round (step ④): the server's on ω and the item table, and every participating
client's on its own user rows, with one rule (``task.optimizer``: Adam with L2 weight decay, the authors', or SGD).

The server applies its optimiser to the aggregate, which it treats as a gradient (:class:`ServerStep`); clients
update their user rows from their own gradients, which never leave them (:class:`UserStep`). Under
``optimizer_state="reset"`` each step builds its optimiser afresh every round, as the authors' code does (Adam's
first step is then a sign-like step of size ``lr``); under ``"persistent"`` the optimiser and its moments are kept
across rounds and in checkpoints.

With a server optimiser of Reddi et al.'s Algorithm 2 (``server=fedavgm|fedadagrad|fedadam|fedyogi``,
:class:`AdaptiveServerStep`) the server instead moves ω and the uploaded item rows by the clients' mean model change
Δ, with moments kept per coordinate (per item row: an item no client uploaded keeps its row, its moments and its
step count); the clients' user rows keep ``task.optimizer``.
"""
from __future__ import annotations

import copy
from abc import ABCMeta, abstractmethod
from typing import Any

import torch
from torch import Tensor

from fedrec.aggregation import ServerOptimizer
from fedrec.errors import ConfigError, check_choice, check_float
from fedrec.models.recommender import FederatedRecommender

OPTIMIZERS = ("adam", "sgd")
OPTIMIZER_STATES = ("reset", "persistent")


class OptimizerStep(metaclass=ABCMeta):
    """One optimiser rule on some of a model's parameters, and its state across rounds.

    Args:
        optimizer: ``"adam"`` or ``"sgd"``.
        lr, weight_decay: its step size and (L2) weight decay.
        state: ``"reset"`` (a fresh optimiser every round) or ``"persistent"`` (kept across rounds).
    """

    def __init__(self, optimizer: str = "adam", lr: float = 0.05, weight_decay: float = 1e-4,
                 state: str = "persistent") -> None:
        check_choice("task.optimizer", optimizer, OPTIMIZERS)
        check_choice("task.optimizer_state", state, OPTIMIZER_STATES)
        self.optimizer_name, self.state = optimizer, state
        self.lr = check_float("task.lr", lr, low=0.0, low_open=True)
        self.weight_decay = check_float("task.weight_decay", weight_decay, low=0.0)
        self._optimizer: torch.optim.Optimizer | None = None

    @abstractmethod
    def parameters(self, model: FederatedRecommender) -> list[Tensor]:
        """The parameters this step updates."""

    def optimizer(self, model: FederatedRecommender) -> torch.optim.Optimizer:
        """This round's optimiser: the one kept from earlier rounds (``"persistent"``) or a fresh one."""
        if self._optimizer is None or self.state == "reset":
            cls = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.SGD
            self._optimizer = cls(self.parameters(model), lr=self.lr, weight_decay=self.weight_decay)
        return self._optimizer

    def state_dict(self) -> dict[str, Any] | None:
        """The optimiser's state (None before the first step)."""
        return None if self._optimizer is None else self._optimizer.state_dict()

    def load_state_dict(self, model: FederatedRecommender, state: dict[str, Any] | None) -> None:
        """Restore a persistent optimiser's state (a reset one starts afresh every round anyway)."""
        if self.state == "persistent" and state is not None:
            self._optimizer = None
            self.optimizer(model).load_state_dict(state)


class ServerStep(OptimizerStep):
    """The server optimiser on ω and the item table, given the aggregate ``(ω update, item ids, item-row updates)``
    as their gradient. It steps every row of the table: rows not in X^t get a zero gradient and only weight decay,
    as in the authors' code."""

    def parameters(self, model: FederatedRecommender) -> list[Tensor]:
        return [*model.shared_parameters().values(), model.item_emb]

    def __call__(self, model: FederatedRecommender, g_shared: Tensor, items: Tensor, g_items: Tensor) -> None:
        offset = 0
        for p in model.shared_parameters().values():
            p.grad = g_shared[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        table = model.item_emb
        table.grad = torch.zeros_like(table).index_put_((items,), g_items)
        opt = self.optimizer(model)
        opt.step()
        opt.zero_grad(set_to_none=True)


class AdaptiveServerStep:
    """A server optimiser of Reddi et al.'s Algorithm 2 on ω and the item table. The aggregate is in gradient units
    (clients upload ``(start − end) / local_lr``, or their gradient), so the clients' mean model change is
    ``Δ = −local_lr · aggregate``; ω steps as one vector, and the item table row by row, only the rows of the items
    in X^t (the others, their moments and step counts stay as they are: lazy moments). Each part keeps its own copy
    of the optimiser's state, in checkpoints too.

    Args:
        optimizer: the rule (:class:`fedrec.aggregation.FedAdam`, ...), before its first step.
        local_lr: the clients' step size η_l (``aggregator.local_lr``).
    """

    def __init__(self, optimizer: ServerOptimizer, local_lr: float) -> None:
        if optimizer.state:
            raise ConfigError("server: the optimiser has taken steps already; give a fresh one")
        self.shared, self.items = optimizer, copy.deepcopy(optimizer)
        self.local_lr = local_lr

    def __call__(self, model: FederatedRecommender, g_shared: Tensor, items: Tensor, g_items: Tensor) -> None:
        params = list(model.shared_parameters().values())
        with torch.no_grad():
            if params:
                flat = torch.cat([p.reshape(-1) for p in params])
                new = self.shared.step(flat, -self.local_lr * g_shared)
                offset = 0
                for p in params:
                    p.copy_(new[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
            if items.numel():
                table = model.item_emb
                table.copy_(self.items.step(table.detach(), -self.local_lr * g_items, rows=items))

    def state_dict(self) -> dict[str, Any]:
        """Both parts' moments and step counts."""
        return {"shared": self.shared.state_dict(), "items": self.items.state_dict()}

    def load_state_dict(self, model: FederatedRecommender, state: dict[str, Any] | None) -> None:
        """Restore :meth:`state_dict` (``model`` is unused: the state does not refer to parameters)."""
        if state is not None:
            self.shared.load_state_dict(state["shared"])
            self.items.load_state_dict(state["items"])


class UserStep(OptimizerStep):
    """Each participating client updates its own user rows with the server's rule, from its own gradients (the step
    is elementwise, so one optimiser over the table computes every client's step at once); rows of other users and
    their optimiser state are left untouched."""

    def parameters(self, model: FederatedRecommender) -> list[Tensor]:
        return [model.user_emb]

    def __call__(self, model: FederatedRecommender, users: Tensor, grads: Tensor) -> None:
        if not users.numel():  # no client steps (``task.user_solve`` sets the rows instead): the optimiser waits
            return
        table = model.user_emb
        keep = torch.ones(table.shape[0], dtype=torch.bool)
        keep[users] = False
        before = table.detach()[keep].clone()
        table.grad = torch.zeros_like(table).index_put_((users,), grads)
        opt = self.optimizer(model)
        saved = {k: v[keep].clone() for k, v in opt.state.get(table, {}).items() if v.dim() == 2}
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            table[keep] = before
            for k, v in saved.items():
                opt.state[table][k][keep] = v
