"""Multi-agent bandit task: every agent pulls an arm every round (a :class:`~fedrec.protocols.MultiAgentProtocol`,
e.g. Gossip_UCB / Fed_UCB and their baselines)."""
from __future__ import annotations

import math
from typing import Any

import torch

from fedrec.envs.mab import MultiAgentMAB
from fedrec.errors import ConfigError, check_int
from fedrec.protocols.base import MultiAgentProtocol
from fedrec.tasks.base import FederatedTask


class MultiAgentTask(FederatedTask):
    """Plays ``steps`` rounds of a :class:`~fedrec.protocols.MultiAgentProtocol` against its environment,
    ``steps_per_round`` per trainer round, all trials (replicates) at once.

    Metrics are the paper's (Zhu et al. 2021, §5): the pseudo-regret with global means, averaged over the agents of a
    trial; the summary reports its mean, min and max over trials, the ε each agent spent (tree accountant) and the
    communication.
    """

    kind = "multi_agent"

    def __init__(self, env: MultiAgentMAB, protocol: MultiAgentProtocol, steps: int | None = None,
                 steps_per_round: int = 10_000) -> None:
        self.env, self.protocol = env, protocol
        self.steps = protocol.horizon if steps is None else check_int("task.steps", steps)
        if self.steps > protocol.horizon:
            raise ConfigError(f"task.steps ({self.steps}) exceeds the protocol's horizon ({protocol.horizon})")
        self.steps_per_round = check_int("task.steps_per_round", steps_per_round)
        protocol.check_env(env)
        self.num_rounds = math.ceil(self.steps / self.steps_per_round)

    @property
    def t(self) -> int:
        return int(self.protocol.t)

    def run_round(self, round_idx: int) -> dict[str, float]:
        """Play the round's steps; log the means over trials and the regret's min and max (the paper's band)."""
        self.protocol.play(self.env, min(self.steps_per_round, self.steps - self.t))
        per = self.per_replicate()
        out = {k: float(v.double().mean()) for k, v in per.items()}
        out["cumulative_regret_min"] = float(per["cumulative_regret"].min())
        out["cumulative_regret_max"] = float(per["cumulative_regret"].max())
        return out

    def per_replicate(self) -> dict[str, torch.Tensor]:
        """Per-trial metrics: regret averaged over agents, ε spent (max over agents) and communication."""
        out = {
            "steps": torch.full((self.protocol.replicates,), self.t, dtype=torch.long),
            "cumulative_regret": self.protocol.cumulative_regret().mean(1),
            "epsilon_spent": self.protocol.epsilon_spent().max(1).values,
        }
        out.update(self.protocol.ledger.totals())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"protocol": self.protocol.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.protocol.load_state_dict(state["protocol"])

    def summary(self) -> dict[str, Any]:
        per = self.per_replicate()
        regret = per.pop("cumulative_regret").double()
        out: dict[str, Any] = {
            "steps": self.t, "replicates": self.protocol.replicates, **self.protocol.summary(),
            "cumulative_regret": float(regret.mean()), "cumulative_regret_min": float(regret.min()),
            "cumulative_regret_max": float(regret.max()), "cumulative_regret_per_replicate": regret.tolist(),
            "epsilon_spent": float(per.pop("epsilon_spent").max()),
        }
        per.pop("steps")
        out.update({k: float(v.double().mean()) for k, v in per.items()})
        return out
