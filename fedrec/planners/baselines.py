"""Baseline budget planners (BGTplanner paper §VII-A3): the uniform split, ADPML's rising schedule and ADAP.

Settings the paper leaves open are documented per class.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedrec.errors import check_float, check_int
from fedrec.planners.base import BudgetPlanner, SchedulePlanner
from fedrec.privacy.client_dp import BUDGET_MARGIN

if TYPE_CHECKING:
    from fedrec.tasks.recommendation import FedRecTask


class UniformPlanner(SchedulePlanner):
    """The equal split ε_total / T in every round: DPSGD's uniform noise (Gaussian, RDP accounting) and the naive
    uniform allocation (Laplace). The same budgets as running without a planner."""

    name = "uniform"

    def shape(self, rounds: int) -> Tensor:
        return torch.ones(rounds)


class ADPMLPlanner(SchedulePlanner):
    """ADPML (Pan & Feng 2023) as BGTplanner runs it: budgets rising from ``epsilon_min`` towards ``epsilon_max`` at
    ``rate`` (defaults 1, 10, 0.9, paper §VII-A3).

    Assumption (ours; the paper does not say how ε_min = 1 and ε_max = 10 fit ε_total = 10): the schedule
    ``s_t = ε_max − (ε_max − ε_min) · rate^t`` is normalised to spend the total, ``b_t = B · s_t / Σ s``.
    """

    name = "adpml"

    def __init__(self, epsilon_min: float = 1.0, epsilon_max: float = 10.0, rate: float = 0.9,
                 reward_split: str = "val") -> None:
        super().__init__(reward_split)
        self.epsilon_min = check_float("planner.epsilon_min", epsilon_min, low=0.0, low_open=True)
        self.epsilon_max = check_float("planner.epsilon_max", epsilon_max, low=self.epsilon_min)
        self.rate = check_float("planner.rate", rate, low=0.0, high=1.0, low_open=True)

    def shape(self, rounds: int) -> Tensor:
        t = torch.arange(rounds, dtype=torch.float64)
        return self.epsilon_max - (self.epsilon_max - self.epsilon_min) * self.rate**t


class ADAPPlanner(BudgetPlanner):
    """Adap DP-FL (Fu et al. 2022) as described by BGTplanner (§VII-A3): the budget grows when the loss trend
    stalls, and the clip threshold shrinks over training.

    Assumptions (ours; the paper gives no numbers): each round spends ``scale · remaining / rounds left``;
    ``scale`` starts at ``initial_scale`` and is multiplied by ``growth`` (capped at ``max_scale``) whenever the
    reward RMSE has not fallen by at least ``tolerance`` over the last ``patience`` rounds; no round but the last
    spends more than (rounds left − 1)/(rounds left) of the remainder, and the last spends what is left. The clip of
    round t is ``clip_0 · clip_decay^t`` (data independent, so it costs no privacy).
    """

    name = "adap"

    def __init__(self, initial_scale: float = 0.5, growth: float = 1.25, max_scale: float = 2.0,
                 patience: int = 2, tolerance: float = 1e-3, clip_decay: float = 0.99,
                 reward_split: str = "val") -> None:
        super().__init__(reward_split)
        self.initial_scale = check_float("planner.initial_scale", initial_scale, low=0.0, low_open=True)
        self.growth = check_float("planner.growth", growth, low=1.0)
        self.max_scale = check_float("planner.max_scale", max_scale, low=self.initial_scale)
        self.patience = check_int("planner.patience", patience)
        self.tolerance = check_float("planner.tolerance", tolerance, low=0.0)
        self.clip_decay = check_float("planner.clip_decay", clip_decay, low=0.0, high=1.0, low_open=True)
        self.scale = self.initial_scale
        self.history: list[float] = []  # reward-split RMSE after each round
        self.clip0: float | None = None  # the configured clip (privacy.clip), restored from checkpoints

    def setup(self, task: FedRecTask) -> None:
        if self.clip0 is None:
            self.clip0 = task.privacy.mechanism.clip

    def choose(self, task: FedRecTask, round_idx: int, holding: Tensor) -> float | None:
        task.privacy.mechanism.clip = self.clip0 * self.clip_decay**round_idx
        left = self.rounds - round_idx
        remaining = (self.total_budget * (1 - BUDGET_MARGIN) - sum(self.budgets))
        if remaining <= 0:
            return None
        # at most (left − 1)/left of what remains, so the last round still gets a share
        return remaining if left == 1 else min(self.scale, left - 1) * remaining / left

    def observe(self, task: FedRecTask, round_idx: int, budget: float, reward: float) -> None:
        self.history.append(self.prev_rmse)
        if len(self.history) > self.patience:
            if self.history[-1 - self.patience] - self.history[-1] < self.tolerance:
                self.scale = min(self.scale * self.growth, self.max_scale)

    def summary(self) -> dict[str, Any]:
        last = self.clip0 * self.clip_decay ** max(len(self.budgets) - 1, 0) if self.clip0 is not None else None
        return {**super().summary(), "planner_final_scale": self.scale, "planner_final_clip": last}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "scale": self.scale, "history": list(self.history), "clip0": self.clip0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scale = float(state["scale"])
        self.history = list(state["history"])
        self.clip0 = float(state["clip0"])
