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

:func:`solve_user_rows` is the other way to move user rows (``task.user_solve``, matrix factorisation on the summed
squared error): each user's row is set to the ridge solution of its own ratings given the item rows it downloaded,
the local step of federated collaborative filtering (Ammad-ud-din et al. 2019), exact where a gradient step is not.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable
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


def solve_user_rows(model: FederatedRecommender, data: RoundData, weight_decay: float) -> Tensor:
    """``(S, row_dim)``: every user's row ``x`` minimising ``Σ (y − a·x)² + (weight_decay / 2) ‖x‖²`` over its ratings,
    i.e. ``(AᵀA + weight_decay / 2 · I) x = Aᵀy`` (the fixed point of the user step's L2-decayed gradient), for the
    linear-head dot-product score: ``a = q_i`` and ``y = r`` without biases, ``a = (q_i, 1)`` and
    ``y = r − μ − b_i`` with them (``x = (p_u, b_u)``). In float64; each user's ``AᵀA`` is one sparse product of
    its ratings with the items' outer products ``a aᵀ`` (no matrix per rating)."""
    k, device = model.embed_dim, model.user_emb.device
    table = model.item_emb.detach().double()
    items = data.row_item[data.entry_row].to(device)
    y = data.entry_rating.to(device).double()
    if model.bias:
        y = y - model.global_bias.detach().double()[0] - table[items, k]
        table = torch.cat([table[:, :k], torch.ones(len(table), 1, dtype=torch.float64, device=device)], 1)
    width, num_users = table.shape[1], data.users.numel()
    user, order = torch.sort(data.entry_user.to(device), stable=True)  # CSR: each user's ratings together
    crow = torch.zeros(num_users + 1, dtype=torch.int64, device=device)
    crow[1:] = torch.cumsum(torch.bincount(user, minlength=num_users), 0)

    def by_user(values: Tensor) -> Tensor:
        with warnings.catch_warnings():  # torch calls its CSR tensors beta: the product used here is plain
            warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta", UserWarning)
            return torch.sparse_csr_tensor(crow, items[order], values[order], (num_users, len(table)),
                                           check_invariants=False)
    gram = by_user(torch.ones_like(y)) @ (table.unsqueeze(2) * table.unsqueeze(1)).reshape(len(table), -1)
    rhs = by_user(y) @ table
    gram = gram.reshape(num_users, width, width) + weight_decay / 2 * torch.eye(width, dtype=torch.float64,
                                                                                device=device)
    return torch.linalg.solve(gram, rhs).to(model.user_emb.dtype)


def local_updates(
    model: FederatedRecommender, data: RoundData, local_steps: int = 1, local_lr: float = 0.05, prox_mu: float = 0.0,
    objective: Objective = rmse_losses, row_l2: float = 0.0, chunk: int | None = None,
) -> LocalUpdates:
    """The updates of all participating clients, computed together (see the module docstring); ``prox_mu`` is
    FedProx's μ, ``objective`` the clients' loss, ``row_l2`` the weight of the L2 term on their rows. ``chunk``:
    at most this many clients at once (the batched graph of local training, and FedGNN's per-edge copies of its
    layer, then follow the chunk instead of the round), their updates put together in the round's order; None:
    all at once. Each client's update depends on its own data alone, so chunks change only memory and float32
    rounding (torch's reductions may sum a batch of another shape in another order)."""
    C = data.num_clients
    if chunk is not None and C > chunk:
        return _in_chunks(data, chunk, lambda part: local_updates(model, part, local_steps, local_lr, prox_mu,
                                                                  objective, row_l2))
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


def _in_chunks(data: RoundData, chunk: int, update: Callable[[RoundData], LocalUpdates]) -> LocalUpdates:
    """``update`` of ``data``'s clients ``chunk`` at a time, put together as one round's: clients, rows and losses
    in order (each chunk's rows are a slice, :meth:`RoundData.select`), user rows back at their places."""
    parts, users = [], torch.zeros(0)
    for lo in range(0, data.num_clients, chunk):
        hi = min(lo + chunk, data.num_clients)
        part = update(data.select(lo, hi))
        if not parts:
            users = part.users.new_empty(data.users.numel(), *part.users.shape[1:])
        own = (data.user_client >= lo) & (data.user_client < hi)  # the users select() keeps, in their order
        users[own.to(users.device)] = part.users
        parts.append(part)
    return LocalUpdates({n: torch.cat([p.shared[n] for p in parts]) for n in parts[0].shared},
                        torch.cat([p.rows for p in parts]), users, torch.cat([p.loss for p in parts]))
