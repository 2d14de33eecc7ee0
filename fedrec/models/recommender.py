"""Federated rating-prediction models over flat local graphs: the shared interface and the MF baseline.

A round's training data is held *flat*: ``E`` entries (one per rating), each naming its user's row in a batch of
``S`` users (``entry_user``). A user's local graph is the star of its rated items, so a model computes one user
representation ``h_u`` per batch row from the user's embedding and its items' embeddings, and predicts
``ŷ_ui = sigmoid(score(h_u, e_i))``, the score by default the dot product ``h_u · e_i`` (FedGNN as BGTplanner's
authors run it); a model with another head (NeuMF's network) overrides :meth:`FederatedRecommender.score`. Shared
parameters (ω, e.g. the GAT weights) may come with a leading per-user dimension, so every client can differentiate
its own copy in one backward pass.
"""
from __future__ import annotations

from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_choice, check_float, check_int

#: ``model.head``: how a logit becomes a predicted rating
HEADS = ("sigmoid", "linear")


class Neighbours(NamedTuple):
    """What graph expansion (:mod:`fedrec.recsys.expansion`) gave each entry's item: the vectors of up to ``K``
    other users who rated it, ``vecs`` ``(E, K, k)`` (zero where ``mask`` ``(E, K)`` is false)."""

    vecs: Tensor
    mask: Tensor

    def to(self, device: torch.device | str) -> Neighbours:
        return Neighbours(self.vecs.to(device), self.mask.to(device))

    def select(self, lo: int, hi: int) -> Neighbours:
        """Entries ``lo:hi``'s neighbours."""
        return Neighbours(self.vecs[lo:hi], self.mask[lo:hi])


class FederatedRecommender(nn.Module, metaclass=ABCMeta):
    """User and item embedding tables (N(0, 1) init, as FedGNN's code) plus optional shared parameters ω.

    ``embed_dim`` is the width of a user or item vector (all a user's or item's vectors, side by side). Subclasses
    implement :meth:`represent`, and :meth:`score` if their head is not the dot product. ``shared_parameters()``
    are the parameters clients upload gradients of besides item rows (empty for matrix factorisation). The round
    calls the model through :meth:`user_states`, :meth:`pair_logits`, :meth:`all_logits` and :meth:`link`, which
    add the optional parts below around the subclass's representation and score.

    Args:
        num_users, num_items: the tables' sizes.
        embed_dim: the vectors' width k.
        init_std: the embeddings' initial standard deviation (1: FedGNN's N(0, 1)).
        bias: add a global bias μ (a shared parameter, aggregated as ω is) and a bias per user and per item (one more
            column of each table: user-private, and uploaded and aggregated as item rows are), so that the logit
            is ``μ + b_u + b_i + score(h_u, e_i)``.
        head: ``"sigmoid"`` predicts ``σ(logit)`` (FedGNN's); ``"linear"`` predicts the logit itself, on the
            normalised rating scale (with ``bias``, the bias model μ + b_u + b_i plus the interaction term).
        init_bias: μ's initial value (with ``bias``). A public constant such as the middle of the rating scale (0.6
            for 1..5 stars divided by 5, under the linear head) starts a private run near the data at no privacy
            cost, where ``task.mean_init`` takes the mean from the clients' ratings without noise.
    """

    #: whether :meth:`represent` reads graph expansion's :class:`Neighbours` (``task.expansion`` needs it); such a
    #: model takes ``expansion=True`` in its constructor to build the parts that read them
    reads_neighbours = False

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, *, init_std: float = 1.0,
                 bias: bool = False, head: str = "sigmoid", init_bias: float = 0.0) -> None:
        super().__init__()
        self.embed_dim = check_int("model.embed_dim", embed_dim)
        self.num_users = check_int("num_users", num_users)
        self.num_items = check_int("num_items", num_items)
        self.init_std = check_float("model.init_std", init_std, low=0.0, low_open=True)
        if not isinstance(bias, bool):
            raise ConfigError(f"model.bias must be true or false, got {bias!r}")
        self.bias = bias
        self.head = check_choice("model.head", head, HEADS)
        init_bias = check_float("model.init_bias", init_bias)
        if init_bias and not bias:
            raise ConfigError("model.init_bias is the global bias's initial value: add the biases with "
                              "+model.bias=true")
        self.user_emb = nn.Parameter(self._table(self.num_users))
        self.item_emb = nn.Parameter(self._table(self.num_items))
        if bias:
            self.global_bias = nn.Parameter(torch.full((1,), init_bias))

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes of its tables for ``sizes`` (``users``, ``items``, ``embed_dim``), before they are allocated:
        four float32 copies (the parameters, their gradients and Adam's two moments)."""
        return 4 * 4 * sizes["embed_dim"] * (sizes["users"] + sizes["items"])

    def _table(self, rows: int) -> Tensor:
        """A table of ``rows`` N(0, init_std²) vectors, with a zero bias column when the model has biases."""
        table = torch.randn(rows, self.embed_dim)
        if self.init_std != 1.0:
            table = table * self.init_std
        return torch.cat([table, torch.zeros(rows, 1)], 1) if self.bias else table

    @property
    def row_dim(self) -> int:
        """The width of a table row: the vector, and its bias with ``bias``."""
        return self.embed_dim + int(self.bias)

    def shared_parameters(self) -> dict[str, Tensor]:
        """ω: every parameter except the two embedding tables, by name."""
        return {n: p for n, p in self.named_parameters() if n not in ("user_emb", "item_emb")}

    def user_states(self, shared: dict[str, Tensor], user_rows: Tensor, item_rows: Tensor,
                    entry_user: Tensor, neighbours: Neighbours | None = None) -> Tensor:
        """What the round keeps per user, ``(S, ·)``: :meth:`represent` of the rows' vectors (and of the entries'
        expansion ``neighbours``, given to a model that :attr:`reads_neighbours`), and the user's bias beside it
        with ``bias``."""
        extra = {"neighbours": neighbours} if neighbours is not None else {}
        if not self.bias:
            return self.represent(shared, user_rows, item_rows, entry_user, **extra)
        k = self.embed_dim
        h = self.represent(shared, user_rows[:, :k], item_rows[:, :k], entry_user, **extra)
        return torch.cat([h, user_rows[:, k:]], 1)

    def pair_logits(self, shared: dict[str, Tensor], states: Tensor, item_rows: Tensor, pair_user: Tensor) -> Tensor:
        """Logits ``(Q,)`` of pairs: :meth:`score`, plus ``μ + b_u + b_i`` with ``bias`` (μ the user's copy when
        ``shared`` has a per-user dimension)."""
        if not self.bias:
            return self.score(shared, states, item_rows, pair_user)
        k, mu = self.embed_dim, shared["global_bias"]
        mu = mu[pair_user, 0] if mu.dim() == 2 else mu[0]
        return self.score(shared, states[:, :k], item_rows[:, :k], pair_user) + states[pair_user, k] + \
            item_rows[:, k] + mu

    def all_logits(self, shared: dict[str, Tensor], states: Tensor, item_rows: Tensor) -> Tensor:
        """Logits ``(S, I)`` of every user state against every item row (:meth:`score_all`, plus the biases)."""
        if not self.bias:
            return self.score_all(shared, states, item_rows)
        k = self.embed_dim
        return self.score_all(shared, states[:, :k], item_rows[:, :k]) + states[:, k:] + item_rows[:, k] + \
            shared["global_bias"]

    def link(self, logits: Tensor) -> Tensor:
        """The predicted (normalised) rating of a logit: ``σ(logit)``, or the logit itself with ``head="linear"``."""
        return torch.sigmoid(logits) if self.head == "sigmoid" else logits

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
        query_user: Tensor, query_vecs: Tensor, neighbours: Neighbours | None = None,
    ) -> Tensor:
        """The predicted ratings (:meth:`link` of :meth:`pair_logits`) of query pairs given as batch-row indices
        ``query_user`` and item rows."""
        h = self.user_states(shared, user_vecs, item_vecs, entry_user, neighbours)
        return self.link(self.pair_logits(shared, h, query_vecs, query_user))


class MatrixFactorization(FederatedRecommender):
    """Federated MF baseline: ``h_u`` is the user embedding itself, so ``ŷ_ui = sigmoid(p_u · q_i)``; no ω."""

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs
