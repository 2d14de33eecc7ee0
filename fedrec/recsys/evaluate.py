"""Evaluation (step ⑤ of the round): the current model's test (and validation) RMSE, MAE and F1.

Every user is represented from its current local graph (the round's training ratings). In a sharded run each
process scores the held-out ratings of its shard's users (rank 0 also those of clients without training ratings)
and the metrics' sums (:func:`fedrec.metrics.rating_sums`) are added up over the processes. Under an attack
(:mod:`fedrec.recsys.attack`, one process) the round also reports the test RMSE of the benign users alone and the
exposure of the attack's target item among them.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from fedrec.data.ratings import RatingData
from fedrec.federation.collective import Collective
from fedrec.metrics import metrics_from_sums, rating_sums
from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData, shard


@torch.no_grad()
def represent_users(model: FederatedRecommender, data: RoundData) -> Tensor:
    """``(num_users, k)``: every user's representation h_u under the current model, from its local graph in
    ``data`` (a round's, or a shard of it); a user without ratings there is represented from its own row alone."""
    m = model
    d = data.to(m.user_emb.device)
    return m.represent(m.shared_parameters(), m.user_emb, m.item_emb[d.row_item][d.entry_row], d.users[d.entry_user])


@torch.no_grad()
def predict(model: FederatedRecommender, data: RoundData, user: np.ndarray, item: np.ndarray) -> Tensor:
    """Predicted ratings of (user, item) pairs, each user represented from its local graph in ``data`` (a round's,
    or a shard of it: enough for its clients' users and those without ratings)."""
    h = represent_users(model, data)
    u, i = torch.from_numpy(np.asarray(user)), torch.from_numpy(np.asarray(item))
    return torch.sigmoid(model.score(model.shared_parameters(), h, model.item_emb[i], u))


def evaluate(model: FederatedRecommender, ratings: RatingData, data: RoundData, bounds: list[tuple[int, int]],
             collective: Collective) -> dict[str, float]:
    """Test (and validation) metrics of ``model`` on ``ratings``' held-out splits, users represented from the
    round's ``data``, sharded over the processes by ``bounds`` (:func:`fedrec.recsys.data.shard_bounds`)."""
    splits = [(name, r) for name, r in (("test", ratings.test), ("val", ratings.val)) if len(r)]
    mine_data = shard(data, bounds, collective.global_rank)[0]
    owner = np.zeros(ratings.num_clients, dtype=np.int64)  # the rank scoring each client's users
    for rank, (a, b) in enumerate(bounds):
        owner[data.clients[a:b].numpy()] = rank
    sums = []
    for _, r in splits:
        mine = owner[ratings.client_of_user[r.user]] == collective.global_rank
        pred = predict(model, mine_data, r.user[mine], r.item[mine])
        sums.append(rating_sums(pred, torch.from_numpy(r.rating[mine])))
    collective.all_reduce(sums)
    return {f"{name}_{metric}": v for (name, _), total in zip(splits, sums)
            for metric, v in metrics_from_sums(total).items()}


#: the length of the recommendation list a target item's exposure counts (top-10)
EXPOSURE_TOP = 10


def benign_test_rmse(model: FederatedRecommender, ratings: RatingData, data: RoundData, benign: np.ndarray) -> float:
    """The test RMSE over the held-out ratings of the users for whom ``benign`` (bool per user) is set, users
    represented from the round's ``data`` (one process)."""
    r = ratings.test
    mine = benign[r.user]
    pred = predict(model, data, r.user[mine], r.item[mine])
    return metrics_from_sums(rating_sums(pred, torch.from_numpy(r.rating[mine])))["rmse"]


@torch.no_grad()
def target_exposure(model: FederatedRecommender, data: RoundData, target: int, users: Tensor,
                    top: int = EXPOSURE_TOP) -> float:
    """The fraction of ``users`` (global ids) with no rating of item ``target`` in ``data`` that find it among their
    ``top`` unrated items, ranked by the model's score (``h_u · e_i`` for FedGNN and MF; ties in the target's
    favour); NaN if every one of them rated it. "Unrated" means no rating in the round's training data."""
    h = represent_users(model, data)[users.to(model.user_emb.device)]
    scores = model.score_all(model.shared_parameters(), h, model.item_emb)
    d = data.to(scores.device)
    rated = torch.zeros(model.num_users, model.num_items, dtype=torch.bool, device=scores.device)
    rated[d.users[d.entry_user], d.row_item[d.entry_row]] = True
    rated = rated[users.to(scores.device)]
    eligible = ~rated[:, target]
    if not bool(eligible.any()):
        return math.nan
    scores = scores.masked_fill(rated, -math.inf)
    above = (scores > scores[:, target:target + 1]).sum(1)
    return float((above[eligible] < top).double().mean())
