"""FedGNN as BGTplanner's authors run it (spec bgtplanner.md §1.2): one graph-attention layer over each user's
local star graph, rating prediction sigmoid(h_u · e_i), and per-client gradients computed for all clients at once.

Each client's local graph has the user as node 0 and its rated items as the other nodes, with edges item → user
and self-loops; the user representation is the GAT output at node 0. The layer is written densely over padded
item lists so that ``torch.func.vmap`` can differentiate every client in one call; it computes exactly what
``torch_geometric.nn.GATConv(k, k, heads=1)`` computes at node 0 (tested).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap

from fedrec.errors import check_float, check_int


class StarGAT(nn.Module):
    """Single-head GAT layer evaluated at the centre of star graphs (centre + neighbours, with a self-loop)."""

    def __init__(self, embed_dim: int, negative_slope: float = 0.2) -> None:
        super().__init__()
        k = check_int("embed_dim", embed_dim)
        self.negative_slope = check_float("negative_slope", negative_slope, low=0.0)
        self.lin_weight = nn.Parameter(torch.empty(k, k))
        self.att_src = nn.Parameter(torch.empty(k))
        self.att_dst = nn.Parameter(torch.empty(k))
        self.bias = nn.Parameter(torch.zeros(k))
        nn.init.xavier_uniform_(self.lin_weight)
        nn.init.xavier_uniform_(self.att_src.view(1, k))
        nn.init.xavier_uniform_(self.att_dst.view(1, k))

    def forward(self, centre: Tensor, neighbours: Tensor, mask: Tensor) -> Tensor:
        """``centre`` (..., k), ``neighbours`` (..., M, k), ``mask`` (..., M) -> centre output (..., k)."""
        xc = centre @ self.lin_weight.T
        xn = neighbours @ self.lin_weight.T
        dst = (xc * self.att_dst).sum(-1, keepdim=True)  # (..., 1)
        logits = torch.cat([(xc * self.att_src).sum(-1, keepdim=True), (xn * self.att_src).sum(-1)], -1) + dst
        logits = F.leaky_relu(logits, self.negative_slope)
        keep = torch.cat([torch.ones_like(mask[..., :1]), mask], -1)
        logits = logits.masked_fill(~keep, float("-inf"))
        alpha = torch.softmax(logits, -1)
        values = torch.cat([xc.unsqueeze(-2), xn], -2)
        return (alpha.unsqueeze(-1) * values).sum(-2) + self.bias


class FedGNN(nn.Module):
    """User and item embedding tables (N(0, 1) init) and a :class:`StarGAT`; ŷ_ui = sigmoid(h_u · e_i)."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__()
        self.embed_dim = check_int("embed_dim", embed_dim)
        self.user_emb = nn.Parameter(torch.randn(check_int("num_users", num_users), self.embed_dim))
        self.item_emb = nn.Parameter(torch.randn(check_int("num_items", num_items), self.embed_dim))
        self.gat = StarGAT(self.embed_dim)

    def predict(self, users: Tensor, graph_items: Tensor, graph_mask: Tensor, query_items: Tensor) -> Tensor:
        """Predicted ratings (C, Q) of ``query_items`` for each user, from its local graph of ``graph_items``."""
        h = self.gat(self.user_emb[users], self.item_emb[graph_items], graph_mask)
        return torch.sigmoid((h.unsqueeze(-2) * self.item_emb[query_items]).sum(-1))


def client_loss(gat: dict[str, Tensor], gat_module: StarGAT, user: Tensor, items: Tensor, ratings: Tensor, mask: Tensor) -> Tensor:
    """One client's RMSE over its rated items; ``items`` (M, k) are its item embedding rows (padded by ``mask``)."""
    h = functional_call(gat_module, gat, (user, items, mask))
    pred = torch.sigmoid(items @ h)
    err = torch.where(mask, pred - ratings, torch.zeros_like(pred))
    return torch.sqrt((err * err).sum() / mask.sum().clamp_min(1))


def per_client_gradients(
    model: FedGNN, users: Tensor, items: Tensor, ratings: Tensor, mask: Tensor
) -> tuple[dict[str, Tensor], Tensor, Tensor, Tensor]:
    """Gradients of every client's loss, all clients at once (``torch.func`` vmap over grad).

    ``users`` (C,), ``items`` (C, M) padded item ids, ``ratings`` (C, M), ``mask`` (C, M). Returns the GAT
    parameter gradients (each with a leading C), the item-row gradients (C, M, k) (zero on padding), the user-row
    gradients (C, k), and the losses (C,).
    """
    gat = {name: p.detach() for name, p in model.gat.named_parameters()}

    def loss_fn(gat_params, user_vec, item_vecs, r, m):
        return client_loss(gat_params, model.gat, user_vec, item_vecs, r, m)

    batched = vmap(grad_and_value(loss_fn, argnums=(0, 1, 2)), in_dims=(None, 0, 0, 0, 0))
    (g_gat, g_user, g_items), losses = batched(
        gat, model.user_emb.detach()[users], model.item_emb.detach()[items], ratings, mask
    )
    return g_gat, g_items * mask.unsqueeze(-1), g_user, losses
