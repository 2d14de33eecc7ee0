"""Federated rating-prediction models over flat local graphs: the shared interface and the MF baseline.

A round's training data is held *flat*: ``E`` entries (one per rating), each naming its user's row in a batch of
``S`` users (``entry_user``). A user's local graph is the star of its rated items, so a model computes one user
representation ``h_u`` per batch row from the user's embedding and its items' embeddings, and predicts
``ŷ_ui = sigmoid(score(h_u, e_i))``, the score by default the dot product ``h_u · e_i`` (BGTplanner spec §1.2); a
model with another head (NeuMF's network) overrides :meth:`FederatedRecommender.score`. Shared parameters (ω, e.g.
the GAT weights) may come with a leading per-user dimension, so every client can differentiate its own copy in one
backward pass.
"""
from __future__ import annotations

from abc import ABCMeta, abstractmethod

import torch
from torch import Tensor, nn

from fedrec.errors import check_int


class FederatedRecommender(nn.Module, metaclass=ABCMeta):
    """User and item embedding tables (N(0, 1) init, as FedGNN's code) plus optional shared parameters ω.

    ``embed_dim`` is the width of a user or item row (all a user's or item's vectors, side by side). Subclasses
    implement :meth:`represent`, and :meth:`score` if their head is not the dot product. ``shared_parameters()``
    are the parameters clients upload gradients of besides item rows (empty for matrix factorisation).
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

    def score(self, shared: dict[str, Tensor], h: Tensor, item_vecs: Tensor, pair_user: Tensor) -> Tensor:
        """Logits ``(Q,)`` of ``Q`` pairs: user representation ``h[pair_user]`` (``h`` is ``(S, ·)``) with item row
        ``item_vecs`` ``(Q, k)``; ``shared`` as in :meth:`represent`. The default is the dot product ``h_u · e_i``."""
        return (h[pair_user] * item_vecs).sum(-1)

    def score_all(self, shared: dict[str, Tensor], h: Tensor, item_vecs: Tensor, block: int = 1 << 16) -> Tensor:
        """Logits ``(S, I)`` of every user representation (rows of ``h``) against every item row of ``item_vecs``
        ``(I, k)``, as a ranking reads them; ``shared`` without a per-user dimension. The dot product is one matrix
        product; another head is :meth:`score` over blocks of about ``block`` pairs."""
        if type(self).score is FederatedRecommender.score:
            return h @ item_vecs.T
        num_users, num_items = h.shape[0], item_vecs.shape[0]
        step = max(1, block // max(num_items, 1))
        out = h.new_empty(num_users, num_items)
        for s in range(0, num_users, step):
            hs = h[s:s + step]
            pair_user = torch.arange(hs.shape[0], device=h.device).repeat_interleave(num_items)
            out[s:s + step] = self.score(shared, hs, item_vecs.repeat(hs.shape[0], 1), pair_user).view(-1, num_items)
        return out

    def predict(
        self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor,
        query_user: Tensor, query_vecs: Tensor,
    ) -> Tensor:
        """``sigmoid(score(h_u, e_i))`` for query pairs given as batch-row indices ``query_user`` and item rows."""
        h = self.represent(shared, user_vecs, item_vecs, entry_user)
        return torch.sigmoid(self.score(shared, h, query_vecs, query_user))


class MatrixFactorization(FederatedRecommender):
    """Federated MF baseline: ``h_u`` is the user embedding itself, so ``ŷ_ui = sigmoid(p_u · q_i)``; no ω."""

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs
