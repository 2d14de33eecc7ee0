"""Plugging a new bandit protocol into the trainer: LinUCB with periodic synchronisation.

A protocol is a ``StepProtocol`` (``fedrec/protocols/base.py``): an ``nn.Module`` over ``replicates`` independent
runs of ``num_clients`` clients whose whole state lives in buffers (so checkpoints resume it), that implements
``_run(clients, contexts, rewards) -> arms`` for a block of steps (``run`` checks the inputs first). Messages go
through ``self.channel``, whose ledger the task reports.

The protocol written here: every client keeps a LinUCB model (one row of a batched ``LinUCB``) and acts on it;
every ``period`` steps each client that saw new data uploads what it learnt since its last upload (the increment
of its augmented Gram matrix [x; y][x; y]ᵀ), the server adds the increments to the global statistics and sends
them back to every client. No determinant triggers, unlike Async- and Sync-LinUCB: a fixed schedule.

It runs through ``BanditTask`` and ``FederatedTrainer`` exactly like the built-in protocols, next to a run with no
synchronisation (``--period`` larger than the horizon) for comparison.

    python examples/new_protocol.py --clients 20 --steps 2000 --period 100

The last line reads ``cumulative_regret=… comm_messages=… isolated_regret=…`` (means over the replicates).
"""
from __future__ import annotations

import argparse

import torch
from torch import Tensor

from fedrec.bandits import LinUCB
from fedrec.envs.synthetic import LinearEnv
from fedrec.protocols import StepProtocol
from fedrec.tasks import BanditTask
from fedrec.trainer import FederatedTrainer


class PeriodicSyncLinUCB(StepProtocol):
    """Per-client LinUCB whose statistics the server pools every ``period`` steps (the torch path only).

    Args:
        num_clients, dim, replicates, seed: see :class:`~fedrec.protocols.StepProtocol`.
        period: steps between two synchronisations.
        alpha, lam: the clients' LinUCB exploration weight and regularisation.
    """

    def __init__(self, num_clients: int, dim: int, replicates: int = 1, period: int = 100, alpha: float = 0.3,
                 lam: float = 1.0, seed: int = 0) -> None:
        super().__init__(num_clients, dim, replicates, seed=seed, backend="torch")
        self.period = period
        R, N, d = self.replicates, self.num_clients, self.dim
        self.policy = LinUCB(dim, alpha=alpha, lam=lam, batch_shape=(R * N,))  # row r·N + c: client c of run r
        # what every client learnt since it last uploaded, and the server's pooled statistics per replicate
        self.register_buffer("new_G", torch.zeros(R * N, d + 1, d + 1, dtype=torch.float64))
        self.register_buffer("new_count", torch.zeros(R * N, dtype=torch.long))
        self.register_buffer("server_G", torch.zeros(R, d + 1, d + 1, dtype=torch.float64))
        self.register_buffer("server_count", torch.zeros(R, dtype=torch.long))
        self.register_buffer("steps_played", torch.zeros((), dtype=torch.long))

    def _run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """Steps (R, S) in order; every replicate's client of step s acts at once."""
        R, S = clients.shape
        replicate = torch.arange(R)
        arms = torch.empty(R, S, dtype=torch.long)
        for s in range(S):
            rows = self.rows(clients[:, s])  # (R,) the acting clients' state rows
            arm = self.policy.select(contexts[:, s], rows)
            x, y = contexts[replicate, s, arm], rewards[replicate, s, arm]
            self.policy.update(x, y, rows)
            z = torch.cat([x, y.unsqueeze(1)], 1)  # [x; y]
            self.new_G.index_add_(0, rows, z.unsqueeze(2) * z.unsqueeze(1))
            self.new_count.index_add_(0, rows, torch.ones_like(rows))
            arms[:, s] = arm
            self.steps_played += 1
            if int(self.steps_played) % self.period == 0:
                self.synchronise()
        return arms

    def synchronise(self) -> None:
        """Uploads of the new statistics, pooling on the server, a download of the pool to every client."""
        N, d = self.num_clients, self.dim
        scalars = (d + 1) * (d + 2) // 2  # a symmetric (d+1) × (d+1) matrix
        rows = (self.new_count > 0).nonzero().squeeze(1)
        replicate, client = rows // N, rows % N
        increments = self.channel.send("upload", ("client", client), ("server", 0), self.new_G[rows], scalars,
                                       replicates=replicate)
        self.server_G.index_add_(0, replicate, increments)
        self.server_count.index_add_(0, replicate, self.new_count[rows])
        self.new_G.zero_()
        self.new_count.zero_()
        everyone = torch.arange(self.replicates * N)
        self.channel.send("download", ("server", 0), ("client", everyone % N), None, scalars,
                          replicates=everyone // N)
        for r in range(self.replicates):  # each client's model becomes the pooled one (factorised once)
            self.policy.broadcast_statistics(torch.arange(r * N, (r + 1) * N), self.server_G[r], self.server_count[r])


def run(env: LinearEnv, protocol: StepProtocol, args: argparse.Namespace) -> dict[str, float]:
    """Play ``protocol`` on ``env``'s stream through the trainer; the task's summary (what ``train.py`` writes to
    summary.json: regret and the ledger's totals)."""
    task = BanditTask(env, protocol, steps=args.steps, steps_per_round=args.steps_per_round)
    FederatedTrainer(enable_progress_bar=False).fit(task)
    return task.summary()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--arms", type=int, default=10)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--steps-per-round", type=int, default=200)
    parser.add_argument("--replicates", type=int, default=2)
    parser.add_argument("--period", type=int, default=100, help="steps between synchronisations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = LinearEnv(num_clients=args.clients, dim=args.dim, num_arms=args.arms, replicates=args.replicates,
                    seed=args.seed)
    world = (args.clients, args.dim, args.replicates)
    summary = run(env, PeriodicSyncLinUCB(*world, period=args.period, seed=args.seed), args)
    # the same protocol never synchronising (every client learns alone), on the same stream
    isolated = run(env, PeriodicSyncLinUCB(*world, period=args.steps + 1, seed=args.seed), args)
    result = {
        "cumulative_regret": summary["cumulative_regret"],
        "comm_messages": summary["comm_messages"],
        "isolated_regret": isolated["cumulative_regret"],
    }
    print(f"{args.steps // args.period} synchronisations: "
          f"{summary['comm_upload_messages']:.0f} uploads and {summary['comm_download_messages']:.0f} downloads")
    print(" ".join(f"{k}={v:.10g}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    main()
