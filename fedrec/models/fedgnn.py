"""FedGNN as BGTplanner's authors run it (spec bgtplanner.md §1.2): one single-head graph-attention layer over
each user's local star graph, and rating prediction ``sigmoid(h_u · e_i)``.

A user's local graph has the user as the centre and its rated items as neighbours, with edges item → user and a
self-loop; ``h_u`` is the GAT output at the centre. The layer is evaluated for all users at once over flat
entries with segment softmax, and it computes exactly what ``torch_geometric.nn.GATConv(k, k, heads=1)``
computes at the centre (tested). Its parameters may carry a leading per-user dimension, which is how every
client differentiates its own copy of ω in a single backward pass (see :mod:`fedrec.recsys.local`). The segment
softmax is written out rather than taken from ``torch_geometric.utils.softmax``, which does the same scatters (max,
sum of exponentials), was no faster on ML-100K rounds, and would make every FedGNN run import torch_geometric
(3.5-4 s of CPU).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrec.errors import check_float
from fedrec.models.recommender import FederatedRecommender


def _rows(p: Tensor, base_dim: int, index: Tensor | None = None) -> Tensor:
    """A parameter shared by all rows (``base_dim`` dims) as is, or its per-row copies (``index``-gathered)."""
    if p.dim() == base_dim:
        return p
    return p if index is None else p[index]


class StarGAT(nn.Module):
    """Single-head GAT (Veličković et al.) evaluated at the centres of star graphs given as flat entries."""

    def __init__(self, embed_dim: int, negative_slope: float = 0.2) -> None:
        super().__init__()
        k = int(embed_dim)
        self.negative_slope = check_float("model.negative_slope", negative_slope, low=0.0)
        self.lin_weight = nn.Parameter(torch.empty(k, k))
        self.att_src = nn.Parameter(torch.empty(k))
        self.att_dst = nn.Parameter(torch.empty(k))
        self.bias = nn.Parameter(torch.zeros(k))
        nn.init.xavier_uniform_(self.lin_weight)
        nn.init.xavier_uniform_(self.att_src.view(1, k))
        nn.init.xavier_uniform_(self.att_dst.view(1, k))

    def attend(self, params: dict[str, Tensor], centre: Tensor, neighbours: Tensor, owner: Tensor) -> Tensor:
        """Centre outputs ``(S, k)`` of ``S`` stars: ``centre`` ``(S, k)``, ``neighbours`` ``(E, k)`` belonging
        to star ``owner`` ``(E,)``. ``params`` are this layer's parameters, optionally with a leading ``S``."""
        W, a_src, a_dst = params["lin_weight"], params["att_src"], params["att_dst"]
        xc = (_rows(W, 2) @ centre.unsqueeze(-1)).squeeze(-1)  # (S, k)
        xn = (_rows(W, 2, owner) @ neighbours.unsqueeze(-1)).squeeze(-1)  # (E, k)
        dst = (xc * a_dst).sum(-1)  # (S,)
        self_logit = F.leaky_relu((xc * a_src).sum(-1) + dst, self.negative_slope)
        logit = F.leaky_relu((xn * _rows(a_src, 1, owner)).sum(-1) + dst[owner], self.negative_slope)
        # softmax over {centre} ∪ neighbours of each star; the shift only guards exp() and carries no gradient
        shift = self_logit.detach().scatter_reduce(0, owner, logit.detach(), "amax")
        w_self = torch.exp(self_logit - shift)
        w = torch.exp(logit - shift[owner])
        norm = w_self.index_add(0, owner, w)
        out = (w_self / norm).unsqueeze(-1) * xc
        out = out.index_add(0, owner, (w / norm[owner]).unsqueeze(-1) * xn)
        return out + params["bias"]


class FedGNN(FederatedRecommender):
    """FedGNN without graph expansion (the authors' ``wo_neighbour`` setting): ``h_u = GAT(star of u)[u]``."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, negative_slope: float = 0.2,
                 **parts: Any) -> None:
        super().__init__(num_users, num_items, embed_dim, **parts)
        self.gat = StarGAT(self.embed_dim, negative_slope)

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        params = {name.removeprefix("gat."): p for name, p in shared.items()}
        return self.gat.attend(params, user_vecs, item_vecs, entry_user)
