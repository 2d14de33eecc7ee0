"""The clients' training objectives (step ③ of the round): each client's loss over its own data, all clients at once.

Every objective maps ``(model, data, shared, users, rows)`` to a ``(C,)`` tensor, one loss per client, given
per-client ω copies (leading C, or shared), the clients' user rows ``(S, k)`` and item rows ``(R, k)``
(:func:`fedrec.recsys.local.local_updates` differentiates their sum). A user is represented from its local graph
(the items of its training entries) and a pair (u, i) is scored by the model's logit ``s_ui`` (:meth:`score`).

* ``rmse`` (explicit ratings): ``sqrt(mean (σ(s_ui) − y_ui)²)`` over the client's ratings (BGTplanner's authors');
* ``mse`` (explicit ratings): ``mean (σ(s_ui) − y_ui)²``, the loss of FedPerGNN's code and of matrix factorisation;
  its gradient is ``2·rmse`` times ``rmse``'s, so clients that are already fitted well are not weighted up;
* ``sse`` (explicit ratings): ``Σ (σ(s_ui) − y_ui)²``, the client's share of matrix factorisation's summed loss:
  with ``aggregator.reduce=sum aggregator.weighting=uniform`` the clients' updates add up to the gradient of
  the loss over all ratings, and the server's and clients' ``task.weight_decay`` is then MF's L2 on every row;
* ``bpr`` (implicit feedback, Rendle et al. 2009, eq. 4 without its prior, which ``task.weight_decay`` plays):
  ``mean −log σ(s_ui − s_uj)`` over the client's (positive i, sampled negative j) pairs;
* ``bce`` (implicit feedback, NCF's pointwise log loss, He et al. 2017 eq. 7): the mean binary cross-entropy of
  ``σ(s)`` over the client's positives (label 1) and sampled negatives (label 0).

The negatives of ``bpr`` and ``bce`` are :class:`~fedrec.recsys.data.RoundData`'s pairs (``pair_entry``,
``pair_row``): rows of the client's upload like its positives', so the server aggregates their item updates too.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData

#: one loss per client: ``objective(model, data, shared, users, rows) -> (C,)``
Objective = Callable[[FederatedRecommender, RoundData, dict[str, Tensor], Tensor, Tensor], Tensor]


def _positive_logits(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
                     rows: Tensor) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """``(per-user ω, h, s)``: ω copies per user, the users' representations from their local graphs and the
    logits of their training entries."""
    base = model.shared_parameters()
    per_user = {n: (v[data.user_client] if v.dim() > base[n].dim() else v) for n, v in shared.items()}
    item_vecs = rows[data.entry_row]
    h = model.user_states(per_user, users, item_vecs, data.entry_user, data.neighbours)
    return per_user, h, model.pair_logits(per_user, h, item_vecs, data.entry_user)


def _negative_logits(model: FederatedRecommender, data: RoundData, per_user: dict[str, Tensor], h: Tensor,
                     rows: Tensor) -> Tensor:
    """The logits of the sampled negative pairs, each for the user of the entry it pairs with."""
    return model.pair_logits(per_user, h, rows[data.pair_row], data.entry_user[data.pair_entry])


def client_sums(values: Tensor, client: Tensor, num_clients: int) -> Tensor:
    """``(C,)``: the sum of ``values`` over each client's entries (``client`` gives each one's)."""
    return torch.zeros(num_clients, dtype=values.dtype, device=values.device).index_add(0, client, values)


def _client_mean(values: Tensor, client: Tensor, num_clients: int) -> Tensor:
    """``(C,)``: the mean of ``values`` over each client's entries (``client`` gives each one's)."""
    total = client_sums(values, client, num_clients)
    count = torch.bincount(client, minlength=num_clients).to(values.dtype)
    return total / count.clamp(min=1)


def mse_losses(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
               rows: Tensor) -> Tensor:
    """Each client's mean squared error over its ratings, ``mean (ŷ − y)²``."""
    _, _, logits = _positive_logits(model, data, shared, users, rows)
    sq = (model.link(logits) - data.entry_rating.to(logits.dtype)) ** 2
    return _client_mean(sq, data.entry_client, data.num_clients)


def sse_losses(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
               rows: Tensor) -> Tensor:
    """Each client's sum of squared errors over its ratings, ``Σ (ŷ − y)²``."""
    _, _, logits = _positive_logits(model, data, shared, users, rows)
    sq = (model.link(logits) - data.entry_rating.to(logits.dtype)) ** 2
    return client_sums(sq, data.entry_client, data.num_clients)


def rmse_losses(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
                rows: Tensor) -> Tensor:
    """Each client's RMSE over its ratings, ``sqrt(mean (ŷ − y)²)`` (BGTplanner's authors' loss)."""
    mse = mse_losses(model, data, shared, users, rows)
    # sqrt has an infinite slope at 0: a client predicted perfectly (sigmoid saturated at a rating of exactly
    # 1) would send inf/NaN gradients; its loss is at its minimum, so its gradient is 0
    positive = mse > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, mse, torch.ones_like(mse))), torch.zeros_like(mse))


def bpr_losses(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
               rows: Tensor) -> Tensor:
    """Each client's BPR loss, ``mean −log σ(s_ui − s_uj)`` over its (positive, negative) pairs."""
    per_user, h, pos = _positive_logits(model, data, shared, users, rows)
    neg = _negative_logits(model, data, per_user, h, rows)
    loss = -F.logsigmoid(pos[data.pair_entry] - neg)
    return _client_mean(loss, data.entry_client[data.pair_entry], data.num_clients)


def bce_losses(model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor,
               rows: Tensor) -> Tensor:
    """Each client's mean binary cross-entropy over its positives (label 1) and negatives (label 0)."""
    per_user, h, pos = _positive_logits(model, data, shared, users, rows)
    neg = _negative_logits(model, data, per_user, h, rows)
    loss = torch.cat([F.softplus(-pos), F.softplus(neg)])  # −log σ(s) and −log(1 − σ(s))
    client = torch.cat([data.entry_client, data.entry_client[data.pair_entry]])
    return _client_mean(loss, client, data.num_clients)


#: the objectives by their ``task.objective`` name
OBJECTIVES: dict[str, Objective] = {"rmse": rmse_losses, "mse": mse_losses, "sse": sse_losses, "bpr": bpr_losses,
                                    "bce": bce_losses}
#: the objectives that train on sampled negatives (implicit feedback)
WITH_NEGATIVES = ("bpr", "bce")
