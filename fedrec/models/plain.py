"""Models written with ordinary layers, federated by the framework; and the check that a run's model is one fedrec
can federate, made when the run is built.

The round gives every user its own copy of the shared weights ω (a leading ``S`` dimension; see
:mod:`fedrec.recsys.local`), which a hand-written :class:`~fedrec.models.FederatedRecommender` must index itself.
A :class:`PlainRecommender` instead defines ``forward(user_vecs, item_vecs)`` with its layers as any PyTorch module
does; its score evaluates that forward with each user's copy of ω by ``torch.func.vmap`` over blocks of one user's
pairs (:class:`~fedrec.models.user_blocks.UserBlocks`) of ``torch.func.functional_call``, so the layers never see
the per-user dimension and each client still differentiates its own copy in one backward pass.
"""
from __future__ import annotations

import inspect
from abc import abstractmethod

import torch
from torch import Tensor

from fedrec.errors import ConfigError
from fedrec.models.recommender import FederatedRecommender
from fedrec.models.user_blocks import UserBlocks


class PlainRecommender(FederatedRecommender):
    """A recommender whose head is ordinary layers: ``forward(user_vecs, item_vecs)`` maps ``Q`` user rows and ``Q``
    item rows (both ``(Q, embed_dim)``) to ``Q`` logits; ``ŷ_ui = sigmoid(logit)`` as for every model.

    Subclasses call ``super().__init__(num_users, num_items, embed_dim)`` (the user and item tables) and create
    their layers; every parameter besides the tables is ω, uploaded and aggregated. The layers must treat the rows
    of a batch independently (no batch normalisation): a batch is one user's pairs, padded to a block. The user's
    representation is its row (no graph over its items).
    """

    @abstractmethod
    def forward(self, user_vecs: Tensor, item_vecs: Tensor) -> Tensor:
        """Logits ``(Q,)`` of ``Q`` (user row, item row) pairs, computed with this module's layers."""

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor) -> Tensor:
        return user_vecs

    def score(self, shared: dict[str, Tensor], h: Tensor, item_vecs: Tensor, pair_user: Tensor) -> Tensor:
        """:meth:`forward` of each pair with ω from ``shared``: one call for all pairs when ω has the module's
        shapes, else a ``vmap`` over blocks of one user's pairs, each block with its user's copy."""
        from torch.func import functional_call, vmap

        users = h[pair_user]
        if not self.per_user(shared):
            return functional_call(self, shared, (users, item_vecs))
        blocks = UserBlocks.of(pair_user, h.shape[0])
        copies = {name: value[blocks.owner] for name, value in shared.items()}
        logits = vmap(lambda w, u, i: functional_call(self, w, (u, i)), randomness="different")(
            copies, blocks.gather(users), blocks.gather(item_vecs))
        return blocks.scatter(logits.unsqueeze(-1)).squeeze(-1)

    def per_user(self, shared: dict[str, Tensor]) -> bool:
        """Whether ``shared`` carries a leading per-user dimension over ω's own shapes."""
        own = self.shared_parameters()
        return any(value.dim() > own[name].dim() for name, value in shared.items())


def check_federated(model: object) -> None:
    """Refuse a model the round cannot federate, before any round runs: not a
    :class:`~fedrec.models.FederatedRecommender`, or one whose representation and score fail, or give other than
    one finite logit per pair, on two users' three pairs with per-user copies of ω (e.g. a ``forward(user,
    item)`` that expects ids). The trial runs on copies, with torch's random state restored after it."""
    if not isinstance(model, FederatedRecommender):
        forward = getattr(type(model), "forward", None)
        takes = f" (its forward{inspect.signature(forward)})" if callable(forward) else ""
        raise ConfigError(
            f"builds a {type(model).__module__}.{type(model).__qualname__}{takes}, not a fedrec model: a model "
            "written with ordinary layers subclasses fedrec.models.PlainRecommender and defines "
            "forward(user_vecs, item_vecs) -> logits; one that needs per-user weights by hand subclasses "
            "fedrec.models.FederatedRecommender")
    name = type(model).__qualname__
    with torch.random.fork_rng(devices=[]):
        try:
            logits = _trial_logits(model)
        except Exception as e:  # noqa: BLE001 - any failure of the user's code is reported as the model's
            raise ConfigError(f"{name} fails on two users' three pairs with per-user copies of its shared weights "
                              f"({type(e).__name__}: {' '.join(str(e).split())})") from e
    if logits.shape != (3,) or not torch.isfinite(logits).all():
        raise ConfigError(f"{name} must give one finite logit per pair: three pairs gave shape "
                          f"{tuple(logits.shape)}{'' if torch.isfinite(logits).all() else ' with non-finite values'}")


def _trial_logits(model: FederatedRecommender) -> Tensor:
    """The logits of pairs (user 0, items 0 and 1) and (user 1, item 0 or 2), differentiated with respect to two
    per-user copies of ω as a round does."""
    users = model.user_emb.detach()[:2].clone().requires_grad_(True)
    items = model.item_emb.detach()[torch.tensor([0, 1, 2]) % model.num_items].clone().requires_grad_(True)
    shared = {n: p.detach().expand(2, *p.shape).clone().requires_grad_(True)
              for n, p in model.shared_parameters().items()}
    owner = torch.tensor([0, 0, 1]) % users.shape[0]
    h = model.user_states(shared, users, items, owner)
    logits = model.pair_logits(shared, h, items, owner)
    if logits.requires_grad:
        torch.autograd.grad(logits.sum(), [*shared.values(), users, items], allow_unused=True)
    return logits.detach()
