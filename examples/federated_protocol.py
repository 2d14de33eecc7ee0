"""A federated bandit protocol run from Python, without Hydra: Async-LinUCB through the trainer.

The pieces are the ones ``train.py +experiment=quickstart`` builds from its config: a synthetic linear world
(``LinearEnv``: homogeneous clients sharing one θ), the protocol (``AsyncLinUCB``: clients upload when their
new data has grown their Gram matrix's determinant by γ_U, the server downloads to clients that are γ_D behind),
a ``BanditTask`` that feeds the protocol ``--steps-per-round`` interactions per round, and a
``FederatedTrainer`` that runs the rounds. Communication is read from the protocol's ledger, which counts every
message per endpoint. The same world is also played without communication (γ = ∞) and by a uniformly random
policy, for comparison.

    python examples/federated_protocol.py --clients 50 --steps 5000 --gamma 5

The last line reads ``cumulative_regret=… comm_messages=… uploads=… downloads=… isolated_regret=…
random_regret=…`` (means over the replicates).
"""
from __future__ import annotations

import argparse

from fedrec.envs.synthetic import LinearEnv
from fedrec.protocols import AsyncLinUCB, paper_linucb
from fedrec.tasks import BanditTask
from fedrec.trainer import FederatedTrainer


def run(env: LinearEnv, protocol: AsyncLinUCB, args: argparse.Namespace) -> BanditTask:
    """Play ``protocol`` on ``env``'s stream through the trainer and return the finished task."""
    task = BanditTask(env, protocol, steps=args.steps, steps_per_round=args.steps_per_round)
    FederatedTrainer(enable_progress_bar=False).fit(task)
    return task


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--arms", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--steps-per-round", type=int, default=500)
    parser.add_argument("--replicates", type=int, default=2)
    parser.add_argument("--gamma", type=float, default=5.0, help="upload and download threshold γ_U = γ_D")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = LinearEnv(num_clients=args.clients, dim=args.dim, num_arms=args.arms, replicates=args.replicates,
                    seed=args.seed)  # the stream is a function of the seed: every run below sees the same one

    def async_linucb(gamma: float) -> AsyncLinUCB:
        return AsyncLinUCB(num_clients=args.clients, dim=args.dim, replicates=args.replicates, gamma_u=gamma,
                           gamma_d=gamma, policy=paper_linucb(alpha=0.3), seed=args.seed)

    task = run(env, async_linucb(args.gamma), args)
    ledger = task.protocol.ledger
    totals = ledger.totals()  # per replicate: messages, scalars and bytes, in total and per kind
    uploads = ledger.per_endpoint("client", kind="upload")  # (replicates, clients): what each client sent
    print(f"rounds run: {task.num_rounds}; the busiest client uploaded {int(uploads.max())} times")

    isolated = run(env, async_linucb(float("inf")), args)  # every client learns alone: no messages at all

    stream = env.interactions(0, args.steps)  # the same stream again, for a uniformly random policy
    random_regret = (stream.expected.max(-1).values - stream.expected.mean(-1)).sum(1)

    result = {
        "cumulative_regret": float(task.cum_regret.mean()),
        "comm_messages": float(totals["comm_messages"].double().mean()),
        "uploads": float(totals["comm_upload_messages"].double().mean()),
        "downloads": float(totals["comm_download_messages"].double().mean()),
        "isolated_regret": float(isolated.cum_regret.mean()),
        "random_regret": float(random_regret.mean()),
    }
    print(" ".join(f"{k}={v:.10g}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
