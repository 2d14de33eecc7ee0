"""NeuMF (He et al. 2017, "Neural Collaborative Filtering" §3.4): a GMF branch and an MLP branch, fused by one output
layer into the logit of ``ŷ_ui``, federated as FedGNN is.

Federated mapping: a user's row is ``[p_u^G | p_u^M]`` (its GMF and its MLP vector, side by side; it stays on the
client), an item's row is ``[q_i^G | q_i^M]`` (uploaded as FedGNN's item rows are), and ω is the MLP tower and the
output layer ``h`` (uploaded and aggregated; each client differentiates its own copy). ``represent`` is the user's
row itself, as for MF: the network is the scoring head (:meth:`NeuMF.score`), not a graph over the user's items.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_float, check_int
from fedrec.models.recommender import FederatedRecommender
from fedrec.models.user_blocks import UserBlocks


def _linear(weight: Tensor, bias: Tensor | None, x: Tensor, blocks: UserBlocks | None) -> Tensor:
    """``x W^T + b`` with one ``W`` for all rows, or with each block's user's copy (``W`` with a leading S)."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    y = torch.bmm(x, weight[blocks.owner].transpose(1, 2))
    return y if bias is None else y + bias[blocks.owner].unsqueeze(1)


class NeuMF(FederatedRecommender):
    """NeuMF without pre-training: ``ŷ_ui = σ(h^T [φ^GMF; φ^MLP])`` (eq. 12), ``φ^GMF = p_u^G ⊙ q_i^G`` (eq. 8-9)
    and ``φ^MLP`` the ReLU tower over ``[p_u^M; q_i^M]`` (eq. 10).

    ``dropout`` drops each tower unit's output with that probability in training (not in evaluation; 0: none, the
    paper's). ``embed_dim`` is the GMF vectors' size; ``mlp_layers`` lists the tower's widths as the paper's §4.1 states
    them: its input (the user's and item's MLP vectors concatenated, so each is half of it) and then each ReLU layer's
    output, e.g. ``(32, 16, 8)``: MLP vectors of 16, layers 32 → 16 → 8. A row is ``embed_dim + mlp_layers[0] / 2``
    wide (the model's ``embed_dim`` attribute). The tower's layers have biases, ``h`` has none (eq. 12).
    """

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8,
                 mlp_layers: Sequence[int] = (32, 16, 8), dropout: float = 0.0, **parts: Any) -> None:
        gmf = check_int("model.embed_dim", embed_dim)
        if isinstance(mlp_layers, (str, bytes)) or not isinstance(mlp_layers, Sequence):
            raise ConfigError(f"model.mlp_layers must be a list of integers, got {mlp_layers!r}")
        widths = [check_int(f"model.mlp_layers[{j}]", w) for j, w in enumerate(mlp_layers)]
        if len(widths) < 2 or widths[0] % 2:
            raise ConfigError("model.mlp_layers must list the tower's even input width (the user's and the item's "
                              f"MLP vectors, concatenated) and at least one layer's width, got {list(mlp_layers)}")
        super().__init__(num_users, num_items, gmf + widths[0] // 2, **parts)
        self.gmf_dim = gmf
        self.dropout = check_float("model.dropout", dropout, low=0.0, high=1.0, high_open=True)
        self.tower = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(widths))
        self.output = nn.Linear(gmf + widths[-1], 1, bias=False)

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs

    def score(self, shared: dict[str, Tensor], h: Tensor, item_vecs: Tensor, pair_user: Tensor) -> Tensor:
        """``h^T [φ^GMF; φ^MLP]`` of each pair (eq. 12 before the sigmoid), each pair with its user's ω copy when
        ``shared`` carries a leading per-user dimension."""
        g, user = self.gmf_dim, h[pair_user]
        gmf = user[:, :g] * item_vecs[:, :g]  # eq. 8: p_u ⊙ q_i
        x = torch.cat([user[:, g:], item_vecs[:, g:]], -1)  # eq. 10's z_1
        blocks = UserBlocks.of(pair_user, h.shape[0]) if shared["output.weight"].dim() == 3 else None
        if blocks is not None:
            gmf, x = blocks.gather(gmf), blocks.gather(x)
        for j in range(len(self.tower)):
            x = F.relu(_linear(shared[f"tower.{j}.weight"], shared[f"tower.{j}.bias"], x, blocks))
            if self.dropout and self.training:  # skipped at 0, so a run without dropout draws nothing
                x = F.dropout(x, self.dropout)
        logit = _linear(shared["output.weight"], None, torch.cat([gmf, x], -1), blocks)
        return (logit if blocks is None else blocks.scatter(logit)).squeeze(-1)

    def forward(self, user: Tensor, item: Tensor) -> Tensor:
        """Logits of ``(user, item)`` id pairs from the tables and ω (central use, outside the federated task)."""
        return self.score(self.shared_parameters(), self.user_emb[user], self.item_emb[item],
                          torch.arange(user.numel(), device=user.device))
