"""A private federated-recommendation run audited in one run (Steinke, Nasr & Jagielski, NeurIPS 2023): canary
clients inside one DP-FedAvg run (server-placed noise, Poisson sampling), the ε lower bound printed beside the
accountant's ε (:func:`fedrec.recsys.canaries.audit_one_run`).

    .venv/bin/python scripts/audit_one_run.py [--data synthetic|ml-100k] [--model fedgnn|mf] [--bug 10]

``--data ml-100k`` reads ``$FEDREC_DATA_DIR/ml-100k`` (943 clients of one user); the default is synthetic ratings
(500 users, 200 items, 10,000 ratings, one user per client). ``--bug F`` plants a bug after the task is built: the
server's noise multiplier divided by F, which the accountant does not see, so the bound should exceed its ε.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from fedrec.data import load_ratings, synthetic_ratings
from fedrec.data.ratings import RatingData
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD, Strategy
from fedrec.recsys.attack import Attack
from fedrec.recsys.canaries import audit_one_run
from fedrec.tasks import FedRecTask


def ratings(name: str, rounds: int) -> RatingData:
    """The run's data: synthetic (500 clients) or ML-100K from ``$FEDREC_DATA_DIR`` (943 clients)."""
    if name == "synthetic":
        return synthetic_ratings(500, 200, 10_000, num_clients=500, seed=0, rounds=rounds)
    return load_ratings("ml-100k", os.environ.get("FEDREC_DATA_DIR", "data"), seed=0, rounds=rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", choices=("synthetic", "ml-100k"), default="synthetic")
    parser.add_argument("--model", choices=("fedgnn", "mf"), default="fedgnn")
    parser.add_argument("--canaries", type=int, default=400, help="canary clients (m)")
    parser.add_argument("--guesses", type=int, default=300, help="guesses (r, even, at most m)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--sample-rate", type=float, default=0.5, help="Poisson sampling rate q")
    parser.add_argument("--epsilon", type=float, default=2.0, help="the run's ε budget")
    parser.add_argument("--bug", type=float, default=None, help="divide the server's noise multiplier by this")
    parser.add_argument("--seed", type=int, default=0, help="the audit's key")
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = ratings(args.data, args.rounds)
    model_cls = {"fedgnn": FedGNN, "mf": MatrixFactorization}[args.model]

    def build(attack: Attack) -> FedRecTask:
        torch.manual_seed(0)
        dp = ClientDP(data.num_clients, "gaussian", epsilon=args.epsilon, placement="server",
                      adjacency="add_remove", sensitivity_factor=1.0)
        task = FedRecTask(data, model_cls(data.num_users, data.num_items, 8), FedSGD(weighting="uniform"), dp,
                          rounds=args.rounds, pseudo_items=5, seed=1, attack=attack,
                          strategy=Strategy(participation="poisson", sample_rate=args.sample_rate))
        if args.bug is not None:
            task.privacy.server.update_multiplier /= args.bug
        return task

    start = time.perf_counter()
    result = audit_one_run(build, args.canaries, guesses=args.guesses, seed=args.seed, confidence=args.confidence)
    verdict = "EXCEEDS the accountant's ε" if result.exceeds else "consistent"
    bug = "" if args.bug is None else f", noise multiplier / {args.bug:g} (planted bug)"
    print(f"{args.model} on {args.data}{bug}: ε ≥ {result.epsilon_lower:.3f} at {result.confidence:.0%} confidence "
          f"(δ = {result.delta:g}; {result.correct} of {result.guesses} guesses right on {result.canaries} canaries, "
          f"{result.rounds} rounds) vs accountant ε = {result.epsilon_reported:.3f}: {verdict} "
          f"[{time.perf_counter() - start:.0f} s]")


if __name__ == "__main__":
    main()
