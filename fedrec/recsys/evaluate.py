"""Evaluation (step ⑤ of the round): the current model's test (and validation) RMSE, MAE and F1.

Every user is represented from its current local graph (the round's training ratings). In a sharded run each
process scores the held-out ratings of its shard's users (rank 0 also those of clients without training ratings)
and the metrics' sums (:func:`fedrec.metrics.rating_sums`) are added up over the processes.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fedrec.data.ratings import RatingData
from fedrec.federation.collective import Collective
from fedrec.metrics import metrics_from_sums, rating_sums
from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData, shard


@torch.no_grad()
def predict(model: FederatedRecommender, data: RoundData, user: np.ndarray, item: np.ndarray) -> Tensor:
    """Predicted ratings of (user, item) pairs, each user represented from its local graph in ``data`` (a round's,
    or a shard of it: enough for its clients' users and those without ratings)."""
    m = model
    d = data.to(m.user_emb.device)
    h = m.represent(m.shared_parameters(), m.user_emb, m.item_emb[d.row_item][d.entry_row], d.users[d.entry_user])
    u, i = torch.from_numpy(np.asarray(user)), torch.from_numpy(np.asarray(item))
    return torch.sigmoid((h[u] * m.item_emb[i]).sum(-1))


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
