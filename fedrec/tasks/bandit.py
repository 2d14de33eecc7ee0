"""Step-wise federated bandit task: drives a protocol through an environment's interaction stream."""
from __future__ import annotations

import math
from typing import Any

import torch

from fedrec.envs.base import BanditEnv
from fedrec.errors import ConfigError, check_int
from fedrec.federation.collective import Collective
from fedrec.protocols.base import StepProtocol
from fedrec.tasks.base import FederatedTask

#: the main per-round metrics whose spread over replicates each round also logs, as ``{name}_std`` (the plots' band)
SPREAD_METRICS = ("cumulative_regret", "normalized_reward", "relative_ctr")
#: the scalars of one all-reduce that gathers a sharded run's protocol state (32 MiB of float64)
GATHER_SCALARS = 2 ** 22


class BanditTask(FederatedTask):
    """Plays ``steps`` interactions (None: the whole stream), ``steps_per_round`` per trainer round.

    All replicates run at once. A run of several processes (``trainer.devices``, a protocol that
    ``shards_replicates``: the client–server LinUCB protocols) shards them: each process plays a contiguous share of
    the replicates, whose streams are keyed by replicate, and the per-replicate results are summed over the processes,
    so that metrics, summary and checkpoints are a one-process run's (``task.protocol`` is then the process's share).

    Tracks per replicate the cumulative pseudo-regret, reward, and the expected reward of a uniformly random
    policy on the same stream (the paper's normaliser on real data).

    On a replay stream (``env.replay``: Li et al. 2010's evaluator, :mod:`fedrec.envs.replay`) it tracks instead
    the steps that counted (the policy picked the logged arm), their clicks, the CTR and the CTR relative to a
    uniformly random policy, whose replay CTR converges to the mean click of the replayed events.
    """

    kind = "bandit"

    def __init__(
        self, env: BanditEnv, protocol: StepProtocol, steps: int | None, steps_per_round: int = 100
    ) -> None:
        self.env = env
        self.protocol = protocol
        if steps is None and env.horizon is None:
            raise ConfigError(f"steps: the {env.name} stream is unbounded, give a number of steps")
        self.steps = check_int("steps", env.horizon if steps is None else steps)
        self.steps_per_round = check_int("steps_per_round", steps_per_round)
        if env.horizon is not None and self.steps > env.horizon:
            raise ConfigError(f"steps ({self.steps}) exceeds the {env.name} stream length ({env.horizon})")
        if protocol.num_clients != env.num_clients or protocol.replicates != env.replicates:
            raise ConfigError("protocol and environment disagree on num_clients or replicates")
        if env.replay and not protocol.supports_replay:
            raise ConfigError(f"protocol: {type(protocol).__name__} cannot be evaluated on the replay stream "
                              f"{env.name} (replay takes protocols with one model per replicate, e.g. "
                              "protocol=vfucb|central_linucb|partial_linucb)")
        self.num_rounds = math.ceil(self.steps / self.steps_per_round)
        R = env.replicates
        self.t = 0
        self.cum_regret = torch.zeros(R, dtype=torch.float64)
        self.cum_reward = torch.zeros(R, dtype=torch.float64)
        self.cum_random = torch.zeros(R, dtype=torch.float64)
        self.matched = torch.zeros(R, dtype=torch.float64)  # replay: steps that counted
        self.collective = Collective()  # the trainer's, once set up
        self.mine = range(R)  # the replicates this process plays

    @property
    def supports_sharding(self) -> bool:
        """Whether a run of several processes may shard the replicates (the protocol's ``shards_replicates``)."""
        return self.protocol.shards_replicates

    def check_processes(self, processes: int) -> None:
        """Every process of a sharded run plays one replicate at least."""
        if processes > self.env.replicates:
            raise ConfigError(f"{processes} processes (trainer.num_nodes × trainer.devices): a bandit run shards its "
                              f"replicates over the processes, so it needs as many replicates at least (got "
                              f"replicates={self.env.replicates})")

    def setup(self, trainer: Any) -> None:
        """Take this process's share of the replicates (several processes), then put the protocol on the trainer's
        device (``trainer.accelerator``): off the CPU it plays its torch path; the environment and the task's
        bookkeeping stay on the CPU."""
        self.collective = getattr(trainer, "collective", None) or Collective()
        world = self.collective.world_size
        if world > 1 and len(self.mine) == self.env.replicates:  # a task set up twice keeps its share
            self.check_processes(world)
            self.mine = _share(self.env.replicates, world, self.collective.global_rank)
            self.protocol = self.protocol.replicates_part(self.mine.start, self.mine.stop)
        if self.collective.device.type != "cpu":
            self.protocol.to(self.collective.device)

    @property
    def sharded(self) -> bool:
        """Whether this process plays a share of the replicates (a sharded run)."""
        return len(self.mine) < self.env.replicates

    def _whole(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-replicate values of this process's replicates (one-process run: all) as the whole run's, summed over
        the processes (each contributes its replicates, zeros elsewhere)."""
        if not self.sharded:
            return parts
        whole = {k: v.new_zeros(self.env.replicates) for k, v in parts.items()}
        for k, v in parts.items():
            whole[k][self.mine.start:self.mine.stop] = v
        self.collective.all_reduce(list(whole.values()))
        return whole

    def run_round(self, round_idx: int) -> dict[str, float]:
        """Play the round's steps; log each metric's mean over replicates (and the spread of the main ones)."""
        start, stop = self.t, min(self.t + self.steps_per_round, self.steps)
        batch = self.env.interactions(start, stop, self.mine)
        rewards, expected = batch.rewards, batch.expected
        gained: dict[str, torch.Tensor] = {}
        if batch.logged is not None:
            arms = self.protocol.replay(batch.clients, batch.contexts, rewards, batch.logged).cpu()
            clicks = rewards.gather(2, batch.logged.unsqueeze(-1)).squeeze(-1)
            hit = arms == batch.logged
            gained.update(matched=hit.sum(1).double(), cum_reward=(clicks * hit).sum(1), cum_random=clicks.sum(1))
        else:
            arms = self.protocol.run(batch.clients, batch.contexts, rewards).cpu()
            chosen = expected.gather(2, arms.unsqueeze(-1)).squeeze(-1)
            gained.update(cum_regret=(expected.max(-1).values - chosen).sum(1),
                          cum_reward=rewards.gather(2, arms.unsqueeze(-1)).squeeze(-1).sum(1),
                          cum_random=expected.mean(-1).sum(1))
        for name, gain in self._whole(gained).items():
            getattr(self, name).add_(gain)
        self.t = stop
        per = self.per_replicate()
        metrics = {k: float(v.double().mean()) for k, v in per.items()}
        if self.env.replicates > 1:
            metrics.update({f"{k}_std": float(per[k].double().std()) for k in SPREAD_METRICS if k in per})
        return metrics

    def per_replicate(self) -> dict[str, torch.Tensor]:
        """Current per-replicate metrics."""
        out = {"steps": torch.full((self.env.replicates,), self.t, dtype=torch.long)}
        if self.env.replay:
            # no counted step yet: the CTR is undefined (NaN), not 0
            ctr = torch.where(self.matched > 0, self.cum_reward / self.matched.clamp_min(1), torch.nan)
            random_ctr = self.cum_random / max(self.t, 1)
            # a log without clicks gives the random policy a CTR of 0: the ratio is undefined (NaN), not 0
            out.update(matched_steps=self.matched.clone(), clicks=self.cum_reward.clone(), ctr=ctr,
                       random_ctr=random_ctr, relative_ctr=_ratio(ctr, random_ctr))
        else:
            out.update(cumulative_regret=self.cum_regret.clone(), cumulative_reward=self.cum_reward.clone())
        if self.env.binary_rewards and not self.env.replay:  # real-data metric: reward relative to a random policy
            out["random_policy_reward"] = self.cum_random.clone()
            out["normalized_reward"] = _ratio(self.cum_reward, self.cum_random)
        out.update(self._whole({**self.protocol.ledger.totals(), **self.protocol.metrics()}))
        if hasattr(self.protocol, "partition") and hasattr(self.env, "clusters"):
            out["ari"] = self.adjusted_rand_index()
        return out

    def adjusted_rand_index(self) -> torch.Tensor:
        """Per replicate: the adjusted Rand index of the protocol's global partition against the true clusters."""
        from sklearn.metrics import adjusted_rand_score

        return torch.tensor([adjusted_rand_score(self.env.clusters, self.protocol.partition(r))
                             for r in range(self.env.replicates)], dtype=torch.float64)

    def state_dict(self) -> dict[str, Any]:
        """The run's state. In a sharded run it is called on every process and gathers the protocol's state on rank 0
        as one process holds it; the other processes give None for it."""
        return {
            "t": self.t,
            "cum_regret": self.cum_regret.clone(),
            "cum_reward": self.cum_reward.clone(),
            "cum_random": self.cum_random.clone(),
            "matched": self.matched.clone(),
            "protocol": self._gathered_protocol_state() if self.sharded else self.protocol.state_dict(),
        }

    def _gathered_protocol_state(self) -> dict[str, Any] | None:
        """The whole run's protocol state dict on rank 0 (None elsewhere): every entry that runs over the replicates
        assembled from the shares' rows (:meth:`~fedrec.protocols.client_server.ClientServerLinUCB.placed_entry`), in
        pieces of :data:`GATHER_SCALARS` sent by all-reduce (the owner's rows, zeros from the others), so that no
        process holds more than its share and a piece beside what it writes."""
        part, world, R = self.protocol, self.collective.world_size, self.env.replicates
        slots = torch.zeros(world, dtype=torch.long)
        slots[self.collective.global_rank] = part.slots_used
        self.collective.all_reduce([slots])
        state, used, zero = part.state_dict(), int(slots.max()), self.collective.is_global_zero
        shares = [_share(R, world, rank) for rank in range(world)]
        for key in part.replicate_keys:
            mine = part.placed_entry(key, state[key], self.mine.start, used)
            block, rest = mine.shape[0] // len(self.mine), mine.shape[1:]
            whole = mine.new_empty(R * block, *rest) if zero else None
            step = max(1, GATHER_SCALARS // max(1, rest.numel()))
            for share in shares:
                for a in range(share.start * block, share.stop * block, step):
                    b = min(a + step, share.stop * block)
                    if share == self.mine:
                        piece = mine[a - share.start * block:b - share.start * block].clone()
                    else:
                        piece = mine.new_zeros(b - a, *rest)
                    self.collective.all_reduce([piece])
                    if whole is not None:
                        whole[a:b] = piece
            state[key] = whole
        return state if zero else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's state, before :meth:`setup` takes this process's share of it."""
        self.t = int(state["t"])
        self.cum_regret = state["cum_regret"].clone()
        self.cum_reward = state["cum_reward"].clone()
        self.cum_random = state["cum_random"].clone()
        self.matched = state.get("matched", torch.zeros_like(self.matched)).clone()  # absent before replay
        self.protocol.load_state_dict(state["protocol"])

    def summary(self) -> dict[str, Any]:
        per = self.per_replicate()
        out: dict[str, Any] = {"steps": self.t, "replicates": self.env.replicates}
        for k, v in per.items():
            if k == "steps":
                continue
            vals = v.double()
            out[k] = float(vals.mean())
            if self.env.replicates > 1:
                out[f"{k}_std"] = float(vals.std())
                out[f"{k}_per_replicate"] = vals.tolist()
        out.update(self.protocol.summary())
        return out


def _share(replicates: int, processes: int, rank: int) -> range:
    """The replicates process ``rank`` of a sharded run plays: a contiguous share, as equal as can be."""
    return range(replicates * rank // processes, replicates * (rank + 1) // processes)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, NaN (undefined) where ``den`` is 0."""
    return torch.where(den > 0, num / den.clamp_min(torch.finfo(den.dtype).tiny), torch.nan)
