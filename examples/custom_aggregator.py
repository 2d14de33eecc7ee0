"""A custom server aggregator for federated recommendation: signSGD's majority vote.

An aggregator (``fedrec/recsys/aggregate.py``) is called once per round with the clients' ``Uploads``
(ω updates, one row per client; item-row updates, one row per uploaded item with its client and item id) and
returns ``(ω update, item ids, item-row updates)``; the task's server optimiser then steps on the result. The
built-in ``FedSGD`` and ``FedAvg`` take weighted means, ``CoordinateMedian``, ``TrimmedMean``, ``Krum``,
``MultiKrum`` and ``NormBound`` are robust rules. A rule that needs every upload at once subclasses
``RobustAggregator`` and writes only ``rule(updates (..., n, P), weights (..., n), clients)``: it is applied to ω
over the clients and to each item's rows over the clients that uploaded the item (all items with the same number
of uploaders in one call). ``MajorityVote`` here is signSGD with majority vote (Bernstein et al. 2019): each
coordinate becomes the sign of the sum of the uploaders' signs, so no client moves it by more than one vote.

It trains FedGNN on MovieLens-100K without privacy, next to FedSGD on the same split for comparison.
Needs ML-100K in ``$FEDREC_DATA_DIR``; ratings are normalised (r / 5), so the RMSE is on that scale.

    python examples/custom_aggregator.py --rounds 10

The last line reads ``vote_test_rmse=… fedsgd_test_rmse=…`` (the last round's test RMSE of each).
"""
from __future__ import annotations

import argparse
import os

import torch
from torch import Tensor

from fedrec.data import RatingData, load_ratings
from fedrec.errors import run_script
from fedrec.models import FedGNN
from fedrec.recsys import Aggregator, FedSGD, RobustAggregator
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer


class MajorityVote(RobustAggregator):
    """signSGD's majority vote: per coordinate, the sign of the sum of the clients' signs (unweighted). The
    server's Adam normalises its steps anyway, so the vote's scale does not matter."""

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        return torch.sign(torch.sign(updates).sum(-2))


def final_test_rmse(data: RatingData, aggregator: Aggregator, rounds: int, seed: int) -> float:
    """Train FedGNN with ``aggregator`` for ``rounds`` rounds and return the last round's test RMSE."""
    torch.manual_seed(seed)  # the model's initial weights come from torch's global generator: the same in both runs
    model = FedGNN(data.num_users, data.num_items, embed_dim=8)
    task = FedRecTask(data, model, aggregator, rounds=rounds, seed=seed)
    FederatedTrainer(enable_progress_bar=False).fit(task)
    return task.summary()["final_test_rmse"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR") or "data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds)
    vote = final_test_rmse(data, MajorityVote(), args.rounds, args.seed)
    mean = final_test_rmse(data, FedSGD(), args.rounds, args.seed)
    print(f"{data.num_clients} clients, {args.rounds} rounds")
    print(f"vote_test_rmse={vote:.6g} fedsgd_test_rmse={mean:.6g}")
    return {"vote_test_rmse": vote, "fedsgd_test_rmse": mean}


if __name__ == "__main__":
    run_script(main)  # a missing dataset or bad value: one error message, exit code 2
