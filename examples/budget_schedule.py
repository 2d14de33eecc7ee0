"""A custom privacy budget schedule: a planner that spends the total ε along a geometric schedule.

Under client-level DP every round costs each participating client part of its total budget. By default the
task splits it uniformly over the rounds; a budget planner (``fedrec/planners/base.py``, a trainer callback)
chooses each round's budget instead. ``SchedulePlanner`` is the planner for fixed schedules: its subclass only
says the relative size of every round's budget (``shape``), and the planner scales the schedule to spend the
whole budget (in the mechanism's unit: an RDP budget for Gaussian noise). ``GeometricPlanner`` gives round t a
share proportional to ``ratio ** t``: with ratio < 1 the early rounds, where the model moves most, get more budget
and so less noise.

It runs the DP recommender (FedGNN on MovieLens-100K, FedSGD, client-level Gaussian DP) and reads the ε spent
from the privacy accountant, which never lets a client exceed its total.
Needs ML-100K in ``$FEDREC_DATA_DIR``; ratings are normalised (r / 5), so the RMSE is on that scale.

    python examples/budget_schedule.py --rounds 20 --epsilon 10 --ratio 0.9

The last line reads ``epsilon_spent=… epsilon_total=… final_test_rmse=… first_budget=… last_budget=…``.
"""
from __future__ import annotations

import argparse
import os

import torch
from torch import Tensor

from fedrec.data import load_ratings
from fedrec.errors import run_script
from fedrec.models import FedGNN
from fedrec.planners import SchedulePlanner
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer


class GeometricPlanner(SchedulePlanner):
    """Round t gets a budget proportional to ``ratio ** t`` (ratio < 1: front-loaded, > 1: back-loaded)."""

    name = "geometric"

    def __init__(self, ratio: float = 0.9, reward_split: str = "val") -> None:
        super().__init__(reward_split)
        self.ratio = ratio

    def shape(self, rounds: int) -> Tensor:
        return self.ratio ** torch.arange(rounds, dtype=torch.float64)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--epsilon", type=float, default=10.0, help="every client's total ε")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--ratio", type=float, default=0.9, help="budget of round t+1 / budget of round t")
    parser.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR") or "data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # planners observe the validation RMSE after every round (their reward), so hold out 10% for it
    data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds, val_fraction=0.1)
    dp = ClientDP(data.num_clients, "gaussian", epsilon=args.epsilon, delta=args.delta, clip=0.1)
    torch.manual_seed(args.seed)  # the model's initial weights come from torch's global generator
    model = FedGNN(data.num_users, data.num_items, embed_dim=8)
    task = FedRecTask(data, model, FedSGD(), dp, rounds=args.rounds, seed=args.seed)
    planner = GeometricPlanner(args.ratio)
    FederatedTrainer(callbacks=[planner], enable_progress_bar=False).fit(task)

    budgets = planner.budgets  # what the planner set, round by round, in dp.budget_unit
    print(f"{len(budgets)} rounds; budgets in {dp.budget_unit}: {budgets[0]:.4g} in the first, "
          f"{budgets[-1]:.4g} in the last (uniform would be {dp.uniform_budget(args.rounds):.4g} each)")
    result = {
        "epsilon_spent": float(dp.spent().max()),  # the accountant's ε of the client that spent most
        "epsilon_total": dp.epsilon_total,
        "final_test_rmse": task.summary()["final_test_rmse"],
        "first_budget": budgets[0],
        "last_budget": budgets[-1],
    }
    print(" ".join(f"{k}={v:.10g}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    run_script(main)  # a missing dataset or bad value: one error message, exit code 2
