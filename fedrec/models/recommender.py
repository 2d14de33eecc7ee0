"""Federated rating-prediction models over flat local graphs: the shared interface and the MF baseline.

A round's training data is held *flat*: ``E`` entries (one per rating), each naming its user's row in a batch of
``S`` users (``entry_user``). A user's local graph is the star of its rated items, so a model computes one user
representation ``h_u`` per batch row from the user's embedding and its items' embeddings, and predicts
``ŷ_ui = sigmoid(h_u · e_i)`` (BGTplanner spec §1.2). Shared parameters (ω, e.g. the GAT weights) may come with a
leading per-user dimension, so every client can differentiate its own copy in one backward pass.
"""
from __future__ import annotations

from abc import ABCMeta, abstractmethod

import torch
from torch import Tensor, nn

from fedrec.errors import check_int


class FederatedRecommender(nn.Module, metaclass=ABCMeta):
    """User and item embedding tables (N(0, 1) init, as FedGNN's code) plus optional shared parameters ω.

    Subclasses implement :meth:`represent`. ``shared_parameters()`` are the parameters clients upload gradients
    of besides item rows (empty for matrix factorisation).
    """

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8) -> None:
        super().__init__()
        self.embed_dim = check_int("model.embed_dim", embed_dim)
        self.num_users = check_int("num_users", num_users)
        self.num_items = check_int("num_items", num_items)
        self.user_emb = nn.Parameter(torch.randn(self.num_users, self.embed_dim))
        self.item_emb = nn.Parameter(torch.randn(self.num_items, self.embed_dim))

    def shared_parameters(self) -> dict[str, Tensor]:
        """ω: every parameter except the two embedding tables, by name."""
        return {n: p for n, p in self.named_parameters() if n not in ("user_emb", "item_emb")}

    @abstractmethod
    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        """User representations ``(S, k)`` from user rows ``(S, k)`` and their rated items' rows ``(E, k)``.

        ``shared`` values have the shapes of :meth:`shared_parameters` or a leading ``S`` (one copy per user).
        """

    def predict(
        self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor,
        query_user: Tensor, query_vecs: Tensor,
    ) -> Tensor:
        """``sigmoid(h_u · e_i)`` for query pairs given as batch-row indices ``query_user`` and item rows."""
        h = self.represent(shared, user_vecs, item_vecs, entry_user)
        return torch.sigmoid((h[query_user] * query_vecs).sum(-1))


class MatrixFactorization(FederatedRecommender):
    """Federated MF baseline: ``h_u`` is the user embedding itself, so ``ŷ_ui = sigmoid(p_u · q_i)``; no ω."""

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs
