"""Evaluation (step ⑤ of the round): the current model's test (and validation) RMSE, MAE and F1, the RMSE on the
dataset's original rating scale (``test_rmse_raw``), and its top-K ranking metrics (HR@K, NDCG@K, Recall@K, MRR:
:mod:`fedrec.recsys.ranking`).

Every user is represented from its current local graph (the round's training ratings). In a sharded run each
process scores the held-out ratings of its shard's users (rank 0 also those of clients without training ratings)
and the metrics' sums (:func:`fedrec.metrics.rating_sums`, :func:`~fedrec.recsys.ranking.ranking_sums`) are added
up over the processes. Ranking scores every item for a batch of users at once (:meth:`score_all`). Under an attack
(:mod:`fedrec.recsys.attack`, one process) the round also reports the test RMSE of the benign users alone and the
exposure of the attack's target item among them.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError, check_choice, check_int
from fedrec.federation.collective import Collective
from fedrec.metrics import metrics_from_sums, rating_sums
from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.data import RoundData, shard
from fedrec.recsys.ranking import (
    BATCH_USERS,
    NEGATIVES,
    TopK,
    UserItems,
    check_ks,
    metrics_from_ranking_sums,
    ranking_metric_names,
    ranking_sums,
    top_k,
)

#: ``task.eval.ranking``: rank every item a user has not trained on, or its held-out items against sampled ones
RANKINGS = ("full", "sampled", "none")


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode while inside (dropout off), then back in the mode it was in."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


@torch.no_grad()
def represent_users(model: FederatedRecommender, data: RoundData) -> Tensor:
    """``(num_users, k)``: every user's representation h_u under the current model, from its local graph in
    ``data`` (a round's, or a shard of it); a user without ratings there is represented from its own row alone."""
    m = model
    d = data.to(m.user_emb.device)
    return m.user_states(m.shared_parameters(), m.user_emb, m.item_emb[d.row_item][d.entry_row], d.users[d.entry_user],
                         d.neighbours)


@torch.no_grad()
def predict(model: FederatedRecommender, data: RoundData, user: np.ndarray, item: np.ndarray) -> Tensor:
    """Predicted ratings of (user, item) pairs, each user represented from its local graph in ``data`` (a round's,
    or a shard of it: enough for its clients' users and those without ratings)."""
    h = represent_users(model, data)
    u, i = torch.from_numpy(np.asarray(user)), torch.from_numpy(np.asarray(item))
    return model.link(model.pair_logits(model.shared_parameters(), h, model.item_emb[i], u))


def _mine(client_of_user: np.ndarray, num_clients: int, data: RoundData, bounds: list[tuple[int, int]],
          collective: Collective) -> np.ndarray:
    """``(num_users,)`` bool: the users this process scores, those of its shard's clients (rank 0 also those of
    clients without training data this round)."""
    owner = np.zeros(num_clients, dtype=np.int64)  # the rank scoring each client's users
    for rank, (a, b) in enumerate(bounds):
        owner[data.clients[a:b].numpy()] = rank
    return owner[client_of_user] == collective.global_rank


def evaluate(model: FederatedRecommender, ratings: RatingData, data: RoundData, bounds: list[tuple[int, int]],
             collective: Collective) -> dict[str, float]:
    """Test (and validation) metrics of ``model`` on ``ratings``' held-out splits, users represented from the
    round's ``data``, sharded over the processes by ``bounds`` (:func:`fedrec.recsys.data.shard_bounds`)."""
    splits = [(name, r) for name, r in (("test", ratings.test), ("val", ratings.val)) if len(r)]
    mine_data = shard(data, bounds, collective.global_rank)[0]
    mine_user = _mine(ratings.client_of_user, ratings.num_clients, data, bounds, collective)
    sums = []
    for _, r in splits:
        mine = mine_user[r.user]
        pred = predict(model, mine_data, r.user[mine], r.item[mine])
        sums.append(rating_sums(pred, torch.from_numpy(r.rating[mine])))
    collective.all_reduce(sums)
    return {f"{name}_{metric}": v for (name, _), total in zip(splits, sums)
            for metric, v in metrics_from_sums(total, ratings.rating_unit).items()}


@dataclass(frozen=True)
class RankingEval:
    """The ranking evaluation of a run (``task.eval``): ``ranking`` (one of :data:`RANKINGS`), the list lengths
    ``ks``, ``negatives`` sampled per user when ``ranking="sampled"``, and ``save_topk`` (write ``topk.npz`` at the
    end)."""

    ranking: str = "none"
    ks: tuple[int, ...] = (10, 20)
    negatives: int = NEGATIVES
    save_topk: bool = False

    @classmethod
    def from_config(cls, node: Mapping[str, Any] | None, implicit: bool, num_items: int) -> RankingEval:
        """``task.eval`` checked against a catalogue of ``num_items``, errors naming its fields; ``ranking: null`` is
        ``full`` on implicit feedback and ``none`` on ratings (whose headline is RMSE). A list longer than the
        catalogue, or sampled negatives that leave no item out (which is full ranking), are refused."""
        node = dict(node or {})
        unknown = sorted(set(node) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"task.eval.{unknown[0]}: not a field of task.eval "
                              f"({', '.join(cls.__dataclass_fields__)})")
        ranking = check_choice("task.eval.ranking", node.get("ranking") or ("full" if implicit else "none"), RANKINGS)
        save = node.get("save_topk", False)
        if not isinstance(save, bool):
            raise ConfigError(f"task.eval.save_topk must be true or false, got {save!r}")
        if save and ranking == "none":
            raise ConfigError("task.eval.save_topk=true needs a ranking (task.eval.ranking=full or sampled)")
        ks = tuple(check_ks(node.get("ks", cls.ks), "task.eval.ks"))
        negatives = check_int("task.eval.negatives", node.get("negatives", NEGATIVES))
        if ranking != "none" and ks[-1] > num_items:
            raise ConfigError(f"task.eval.ks must be at most the data's {num_items} items (a top-K list of that "
                              f"catalogue), got {ks[-1]}")
        # a user holds out at least one item, so at most num_items - 1 others can be drawn: as many is full ranking
        if ranking == "sampled" and negatives >= num_items - 1:
            raise ConfigError(f"task.eval.negatives must be below {num_items - 1} for sampled ranking on the data's "
                              f"{num_items} items (as many ranks against every item: task.eval.ranking=full), "
                              f"got {negatives}")
        return cls(ranking, ks, negatives, save)

    @property
    def negatives_per_user(self) -> int | None:
        """The negatives :func:`~fedrec.recsys.ranking.ranking_sums` samples (None: full ranking)."""
        return self.negatives if self.ranking == "sampled" else None

    def metric_names(self) -> list[str]:
        """The names it logs per split, e.g. ``hr@10`` (the task prefixes ``test_`` / ``val_``)."""
        return [] if self.ranking == "none" else ranking_metric_names(self.ks)


@dataclass(frozen=True)
class RankingSplit:
    """A held-out split to rank: each user's ``heldout`` items among every item but its ``excluded`` ones (its
    training items, and for the test split also its validation items)."""

    name: str
    excluded: UserItems
    heldout: UserItems


@torch.no_grad()
def _user_scores(model: FederatedRecommender, h: Tensor, users: np.ndarray) -> Tensor:
    """``(len(users), I)``: the logits of every item for ``users`` (rows of ``h``)."""
    index = torch.from_numpy(users).to(h.device)
    return model.all_logits(model.shared_parameters(), h[index], model.item_emb)


def evaluate_ranking(model: FederatedRecommender, client_of_user: np.ndarray, num_clients: int, data: RoundData,
                     bounds: list[tuple[int, int]], collective: Collective, splits: list[RankingSplit],
                     spec: RankingEval, key: int) -> dict[str, float]:
    """Ranking metrics of ``model`` on each split (``test_hr@10``, ..., ``val_mrr``), users represented from the
    round's ``data``; each process ranks its shard's users in batches and the sums are added up over processes.
    ``key``: the sampled negatives' (:func:`~fedrec.recsys.ranking.negatives_key`)."""
    if spec.ranking == "none":
        return {}
    h = represent_users(model, shard(data, bounds, collective.global_rank)[0])
    mine = _mine(client_of_user, num_clients, data, bounds, collective)
    sums = []
    for split in splits:
        users = split.heldout.users_with_items()
        users = users[mine[users]]
        total = torch.zeros(1 + len(spec.metric_names()), dtype=torch.float64)
        for a in range(0, len(users), BATCH_USERS):
            u = users[a:a + BATCH_USERS]
            total += ranking_sums(_user_scores(model, h, u), u, split.excluded, split.heldout, spec.ks,
                                  negatives=spec.negatives_per_user, key=key).cpu()
        sums.append(total)
    collective.all_reduce(sums)
    return {f"{split.name}_{name}": v for split, total in zip(splits, sums)
            for name, v in metrics_from_ranking_sums(total, spec.ks).items()}


def topk_lists(model: FederatedRecommender, data: RoundData, split: RankingSplit, spec: RankingEval,
               key: int) -> TopK:
    """Every ranked user's first ``max(ks)`` items of ``split`` (one process, the round's whole ``data``): the
    lists :func:`evaluate_ranking` scored, for ``topk.npz``."""
    h = represent_users(model, data)
    users = split.heldout.users_with_items()
    parts = [top_k(_user_scores(model, h, u), u, split.excluded, split.heldout, spec.ks[-1],
                   negatives=spec.negatives_per_user, key=key)
             for u in (users[a:a + BATCH_USERS] for a in range(0, len(users), BATCH_USERS))]
    lists = np.concatenate([p.topk for p in parts]) if parts else np.zeros((0, spec.ks[-1]), dtype=np.int64)
    return TopK(users, lists, split.heldout.padded(users))


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
    scores = model.all_logits(model.shared_parameters(), h, model.item_emb)
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
