"""Local training (step ③ of the round): every participating client's update, computed for all clients together.

:func:`local_updates` differentiates every client's loss (an objective of :mod:`fedrec.recsys.objectives`, by
default the RMSE of its ratings) with respect to its own copy of
the shared parameters ω, its users' rows and its item rows in one backward pass: the copies are separate leaves,
so the gradient of the *sum* of client losses with respect to a client's copy is that client's gradient. With
``local_steps > 1`` (FedAvg) it repeats this for the local SGD steps and returns the pseudo-gradients; FedProx
(Li et al. 2020) adds the proximal term ``μ/2 ‖w − w_global‖²`` to each client's loss in those steps, for the
global parameters w (ω and the item rows; user rows have no global copy). The term is zero at the start, so it
changes nothing with one local step, and ``μ = 0`` is FedAvg exactly. ``row_l2 = λ`` adds ``λ/2 (Σ_u ‖p_u‖² +
Σ_i ‖q_i‖²)`` over the client's user rows and the item rows it trains (its rated items, not its pseudo items) to
each client's loss, the usual L2 of matrix factorisation on the rows a client touches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData
from fedrec.recsys.objectives import Objective, client_sums, rmse_losses


@dataclass
class LocalUpdates:
    """Every client's update: a gradient (one local step) or the pseudo-gradient ``(start − end) / lr`` of
    ``local_steps`` SGD steps, which is the gradient itself when ``local_steps == 1``."""

    shared: dict[str, Tensor]  # ω, each with a leading C
    rows: Tensor  # (R, k) item rows
    users: Tensor  # (S, k) user rows (stay on the client)
    loss: Tensor  # (C,) each client's loss before its local steps

    def flat_shared(self) -> Tensor:
        """The ω updates flattened, one row per client: ``(C, P)``, the tensors in the model's order (P = 0 for
        models without ω). This is what a client uploads for ω."""
        num_clients = self.loss.shape[0]
        if not self.shared:
            return torch.zeros(num_clients, 0, device=self.rows.device)
        return torch.cat([v.reshape(num_clients, -1) for v in self.shared.values()], 1)


def local_updates(
    model: FederatedRecommender, data: RoundData, local_steps: int = 1, local_lr: float = 0.05, prox_mu: float = 0.0,
    objective: Objective = rmse_losses, row_l2: float = 0.0,
) -> LocalUpdates:
    """The updates of all participating clients, computed together (see the module docstring); ``prox_mu`` is
    FedProx's μ, ``objective`` the clients' loss, ``row_l2`` the weight of the L2 term on their rows."""
    C = data.num_clients
    start_shared = {n: p.detach().expand(C, *p.shape).clone() for n, p in model.shared_parameters().items()}
    start_users = model.user_emb.detach()[data.users]
    start_rows = model.item_emb.detach()[data.row_item]
    shared = {n: v.clone() for n, v in start_shared.items()}
    users, rows = start_users.clone(), start_rows.clone()
    first_loss = None
    for _ in range(local_steps):
        leaves = [*shared.values(), users, rows]
        for leaf in leaves:
            leaf.requires_grad_(True)
        loss = objective(model, data, shared, users, rows)
        if row_l2:
            loss = loss + row_l2 / 2 * (client_sums(users.pow(2).sum(1), data.user_client, C)
                                        + client_sums(rows.pow(2).sum(1), data.row_client, C))
        grads = torch.autograd.grad(loss.sum(), leaves)
        if first_loss is None:
            first_loss = loss.detach()
        if local_steps == 1:
            return LocalUpdates(dict(zip(shared, grads[:-2])), grads[-1], grads[-2], first_loss)
        with torch.no_grad():
            if prox_mu:  # the gradient of μ/2 ‖w − w_global‖²
                grads = [*(g + prox_mu * (v - start_shared[n]) for (n, v), g in zip(shared.items(), grads)),
                         grads[-2], grads[-1] + prox_mu * (rows - start_rows)]
            shared = {n: v - local_lr * g for (n, v), g in zip(shared.items(), grads)}
            users = users - local_lr * grads[-2]
            rows = rows - local_lr * grads[-1]
    with torch.no_grad():
        return LocalUpdates(
            {n: (start_shared[n] - v) / local_lr for n, v in shared.items()},
            (start_rows - rows) / local_lr,
            (start_users - users) / local_lr,
            first_loss,
        )
