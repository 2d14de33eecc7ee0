"""A scoring network over a user's and an item's rows, written with ordinary layers: fedrec gives every client its
own copy of the layers' weights, so nothing here knows about clients."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from fedrec.models import PlainRecommender


class MLPScorer(PlainRecommender):
    """``logit = MLP([p_u; q_i])``: one hidden ReLU layer of ``hidden`` units over the concatenated rows."""

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, hidden: int = 16) -> None:
        super().__init__(num_users, num_items, embed_dim)
        self.net = nn.Sequential(nn.Linear(2 * embed_dim, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        return self.net(torch.cat([user_vecs, item_vecs], -1)).squeeze(-1)
