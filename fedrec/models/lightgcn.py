"""LightGCN (He et al. 2020, "LightGCN: Simplifying and Powering Graph Convolution Network for Recommendation"):
over one party's whole user–item graph (:class:`CentralLightGCN`), and federated over each user's local star graph
(:class:`LightGCN`), both on PyG's light graph convolution.

Both propagate ``e^(k+1) = Â e^(k)`` with ``Â = D^-1/2 A D^-1/2`` (eq. 3, matrix form eq. 7) and combine the layers
with ``α_k = 1/(L+1)``: ``e = Σ_k α_k e^(k)`` (eq. 4, 8); the only parameters are the embeddings at layer 0.

**What the star computes.** A user's local graph (as FedGNN's) is the user ``u`` joined to the ``d ≥ 1`` items
it rated, every item a leaf: the client cannot see the items' other raters, so each item has degree 1 there and
every edge has weight ``1/√d``. From ``e_u^(0) = p_u``, ``e_i^(0) = q_i``, with ``q̄_u`` the mean of the items' rows:

* ``e_u^(1) = Σ_i q_i/√d = √d q̄_u``, ``e_u^(2) = p_u``, and from then on the user alternates
  (``e_u^(k+2) = e_u^(k)``);
* ``e_i^(1) = p_u/√d``, ``e_i^(2) = q̄_u``, then alternating likewise;

so ``h_u = [(⌊L/2⌋ + 1) p_u + ⌈L/2⌉ √d q̄_u] / (L+1)``: with ``L = 1``, ``(p_u + Σ_i q_i/√d)/2``, the user's own row
averaged with its items' rows summed and scaled by ``1/√d``; ``L = 3`` (the paper's) gives the same, ``L = 2``
gives ``(2 p_u + √d q̄_u)/3``. An item's representation on the star is ``ẽ_i = q_i/(L+1) + c_u``, where
``c_u = [⌈L/2⌉ p_u/√d + ⌊L/2⌋ q̄_u]/(L+1)`` is the same for all the user's items: it sees the one user only.

**How the central graph differs.** There ``e_u^(1) = Σ_i q_i/√(d_u d_i)`` weighs each item by its global
degree ``d_i`` (popular items count less), and from layer 2 on other users' rows arrive through shared items
(``u → i → v``): ``e_u^(2) = Σ_i Σ_{v ∈ N(i)} p_v/(d_i √(d_u d_v))``, so deeper layers keep adding information,
where on the star they repeat. A user without ratings has ``h_u = p_u/(L+1)`` in both.

**Scoring.** The federated model predicts ``σ(h_u · q_i)`` with the item's own row, as FedGNN does (the items a
user is tested on lie outside its star). Since ``h_u · ẽ_i = h_u · q_i/(L+1) + h_u · c_u``, a user's ranking of its
items is the one by its star's item representations; the logit drops the factor and the per-user offset. It has
no ω: clients upload item rows only (as MF).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import LGConv
from torch_geometric.nn.models import LightGCN as PygLightGCN
from torch_geometric.utils import to_undirected

from fedrec.errors import check_int
from fedrec.models.recommender import FederatedRecommender


class LightGCN(FederatedRecommender):
    """Federated LightGCN: ``h_u`` is LightGCN's user representation on the user's star graph (see the module
    docstring), all users' stars evaluated as one graph of disjoint stars; no ω."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, num_layers: int = 3,
                 **parts: Any) -> None:
        super().__init__(num_users, num_items, embed_dim, **parts)
        self.num_layers = check_int("model.num_layers", num_layers)
        self.convs = nn.ModuleList(LGConv() for _ in range(self.num_layers))

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        """Nodes ``0..S-1`` are the users, ``S + e`` entry ``e``'s item as a leaf of its user's star."""
        S = user_vecs.shape[0]
        leaf = torch.arange(S, S + item_vecs.shape[0], device=entry_user.device)
        edge_index = torch.stack([torch.cat([leaf, entry_user]), torch.cat([entry_user, leaf])])
        x = torch.cat([user_vecs, item_vecs])
        out = x / (self.num_layers + 1)
        for conv in self.convs:
            x = conv(x, edge_index)
            out = out + x / (self.num_layers + 1)
        return out[:S]


class CentralLightGCN(nn.Module):
    """LightGCN over the whole user–item graph of the interactions ``(user, item)`` one party holds (PyG's
    ``LightGCN``; users are nodes ``0..U-1``, items ``U..U+I-1``), predicting ``ŷ_ui = e_u · e_i`` (eq. 5)."""

    def __init__(self, num_users: int, num_items: int, user: Tensor, item: Tensor, embed_dim: int = 64,
                 num_layers: int = 3) -> None:
        super().__init__()
        self.num_users = check_int("num_users", num_users)
        self.num_items = check_int("num_items", num_items)
        self.gcn = PygLightGCN(self.num_users + self.num_items, check_int("model.embed_dim", embed_dim),
                               check_int("model.num_layers", num_layers))
        user, item = torch.as_tensor(user, dtype=torch.long), torch.as_tensor(item, dtype=torch.long)
        edges = torch.stack([user, item + self.num_users])
        self.register_buffer("edge_index", to_undirected(edges, num_nodes=self.num_users + self.num_items))

    def embeddings(self) -> tuple[Tensor, Tensor]:
        """The final user ``(U, k)`` and item ``(I, k)`` representations (eq. 4)."""
        out = self.gcn.get_embedding(self.edge_index)
        return out[:self.num_users], out[self.num_users:]

    def forward(self, user: Tensor, item: Tensor) -> Tensor:
        """Logits ``e_u · e_i`` of ``(user, item)`` id pairs."""
        return self.gcn(self.edge_index, torch.stack([user, item + self.num_users]))
