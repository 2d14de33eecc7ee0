"""Local training (step ③ of the round): every participating client's update, computed for all clients together.

:func:`local_updates` differentiates every client's loss (:func:`client_losses`) with respect to its own copy of
the shared parameters ω, its users' rows and its item rows in one backward pass: the copies are separate leaves,
so the gradient of the *sum* of client losses with respect to a client's copy is that client's gradient. With
``local_steps > 1`` (FedAvg) it repeats this for the local SGD steps and returns the pseudo-gradients; FedProx
(Li et al. 2020) adds the proximal term ``μ/2 ‖w − w_global‖²`` to each client's loss in those steps, for the
global parameters w (ω and the item rows; user rows have no global copy). The term is zero at the start, so it
changes nothing with one local step, and ``μ = 0`` is FedAvg exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData


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


def client_losses(
    model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor, rows: Tensor
) -> Tensor:
    """Each client's RMSE over its ratings, ``sqrt(mean (ŷ − y)²)`` (the authors' loss), given per-client ω
    copies (leading C, or shared), user rows ``(S, k)`` and item rows ``(R, k)``."""
    base = model.shared_parameters()
    per_user = {n: (v[data.user_client] if v.dim() > base[n].dim() else v) for n, v in shared.items()}
    item_vecs = rows[data.entry_row]
    h = model.represent(per_user, users, item_vecs, data.entry_user)
    pred = torch.sigmoid(model.score(per_user, h, item_vecs, data.entry_user))
    sq = (pred - data.entry_rating.to(pred.dtype)) ** 2
    entry_client = data.entry_client
    sse = torch.zeros(data.num_clients, dtype=sq.dtype, device=sq.device).index_add(0, entry_client, sq)
    count = torch.bincount(entry_client, minlength=data.num_clients).to(sq.dtype)
    mse = sse / count
    # sqrt has an infinite slope at 0: a client predicted perfectly (sigmoid saturated at a rating of exactly
    # 1) would send inf/NaN gradients; its loss is at its minimum, so its gradient is 0
    positive = mse > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, mse, torch.ones_like(mse))), torch.zeros_like(mse))


def local_updates(
    model: FederatedRecommender, data: RoundData, local_steps: int = 1, local_lr: float = 0.05, prox_mu: float = 0.0
) -> LocalUpdates:
    """The updates of all participating clients, computed together (see the module docstring); ``prox_mu`` is
    FedProx's μ."""
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
        loss = client_losses(model, data, shared, users, rows)
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


