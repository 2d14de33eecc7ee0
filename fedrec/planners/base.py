"""Privacy-budget planners: trainer callbacks that choose every client's budget before each round.

A planner sets the round's budget through :meth:`FedRecTask.set_round_budget` in ``on_round_start`` (units:
:attr:`ClientDP.budget_unit`, ε_t for Laplace and an RDP budget for Gaussian), then observes the round's reward
``r_t = RMSE_{t−1} − RMSE_t`` (BGTplanner paper §VII-A2) in ``on_round_end``. A budget that some client taking
part could not afford (the accountant decides) is never set: the planner ends the run instead, before the round.
The RMSE is measured on the validation split by default (``reward_split="val"``, which needs
``data.val_fraction > 0``); ``reward_split="test"`` is the authors' use of the test set.

The baselines are in :mod:`fedrec.planners.baselines`, BGTplanner in :mod:`fedrec.planners.bgtplanner`.
"""
from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedrec.errors import ConfigError, check_choice
from fedrec.privacy.client_dp import BUDGET_MARGIN
from fedrec.trainer.callbacks import Callback

if TYPE_CHECKING:
    from fedrec.tasks.recommendation import FedRecTask
    from fedrec.trainer.callbacks import RunningTrainer

REWARD_SPLITS = ("val", "test")


class BudgetPlanner(Callback["FedRecTask"], ABC):
    """Base class: subclasses implement :meth:`choose` (and may extend :meth:`observe` and the state)."""

    name = "planner"
    #: whether :meth:`choose` depends on the rewards; a planner that does not runs without a validation split
    #: (its rewards are then NaN: not measured)
    uses_reward = True

    def __init__(self, reward_split: str = "val") -> None:
        self.reward_split = check_choice("planner.reward_split", reward_split, REWARD_SPLITS)
        self.prev_rmse: float | None = None
        self._measured = True  # whether rewards are measured (see uses_reward); set at fit start
        self.budgets: list[float] = []
        self.rewards: list[float] = []
        self.overhead_seconds = 0.0
        self.stopped_for_budget = False
        self.total_budget = math.nan
        self.rounds = 0

    @property
    def state_key(self) -> str:
        return "budget_planner"

    # ---- to implement ----------------------------------------------------------------------------------------
    @abstractmethod
    def choose(self, task: FedRecTask, round_idx: int, holding: Tensor) -> float | None:
        """The budget of round ``round_idx`` for every client (None: stop)."""

    def observe(self, task: FedRecTask, round_idx: int, budget: float, reward: float) -> None:
        """The round ran at ``budget`` and earned ``reward``."""

    def affordable(self, task: FedRecTask, budget: float, holding: Tensor) -> bool:
        """Whether every client in ``holding`` can afford ``budget`` now (the accountant decides). A planner that
        has just asked the accountant about this budget in :meth:`choose` may answer from that."""
        return task.privacy.affordable(budget, holding)

    # ---- hooks -----------------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: RunningTrainer, task: FedRecTask) -> None:
        if getattr(task, "privacy", None) is None:
            raise ConfigError("planner: a budget planner needs privacy=gaussian or privacy=laplace")
        if task.privacy.placement == "server":
            raise ConfigError("planner: a budget planner sets each client's per-round budget of client-placed noise; "
                              "privacy.placement=server calibrates one noise multiplier for the run (use "
                              "privacy.placement=client, or no planner)")
        self._measured = self.reward_split != "val" or len(task.data.val) > 0
        if not self._measured and self.uses_reward:
            raise ConfigError("planner.reward_split=val needs a validation split: set data.val_fraction > 0 "
                              "(or planner.reward_split=test for the authors' test-set reward)")
        self.total_budget = task.privacy.total_budget
        self.rounds = task.num_rounds
        self.setup(task)
        if self.prev_rmse is None and self._measured:
            self.prev_rmse = task.evaluate_round(0)[f"{self.reward_split}_rmse"]

    def setup(self, task: FedRecTask) -> None:
        """Called at fit start, after :attr:`total_budget` and :attr:`rounds` are known (also on resume)."""

    def on_round_start(self, trainer: RunningTrainer, task: FedRecTask, round_idx: int) -> None:
        holding = task.clients_holding_data(round_idx)  # prepares the round's data: the round's work, not timed
        started = time.perf_counter()
        budget = self.choose(task, round_idx, holding)
        if budget is None or not self.affordable(task, budget, holding):
            self.stopped_for_budget = True
            trainer.should_stop = True
        else:
            task.set_round_budget(budget)
            self.budgets.append(float(budget))
        self.overhead_seconds += time.perf_counter() - started

    def on_round_end(self, trainer: RunningTrainer, task: FedRecTask, round_idx: int,
                     metrics: dict[str, float]) -> None:
        started = time.perf_counter()
        rmse = metrics[f"{self.reward_split}_rmse"] if self._measured else math.nan
        if not self._measured:
            reward = math.nan  # nothing to measure it on, and nothing uses it
        else:  # a NaN RMSE counts as no change (authors)
            reward = 0.0 if math.isnan(rmse) else self.prev_rmse - rmse
        if not math.isnan(rmse):
            self.prev_rmse = rmse
        self.rewards.append(reward)
        self.observe(task, round_idx, self.budgets[-1], reward)
        self.overhead_seconds += time.perf_counter() - started

    # ---- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"prev_rmse": self.prev_rmse, "budgets": list(self.budgets), "rewards": list(self.rewards),
                "overhead_seconds": self.overhead_seconds, "stopped_for_budget": self.stopped_for_budget}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.prev_rmse = state["prev_rmse"]
        self.budgets = list(state["budgets"])
        self.rewards = list(state["rewards"])
        self.overhead_seconds = float(state["overhead_seconds"])
        self.stopped_for_budget = bool(state["stopped_for_budget"])

    def summary(self) -> dict[str, Any]:
        n = max(len(self.budgets), 1)
        return {"planner": self.name, "planner_rounds": len(self.budgets),
                "planner_budget_used": float(sum(self.budgets)),
                "planner_mean_budget": float(sum(self.budgets)) / n,
                "planner_stopped_for_budget": self.stopped_for_budget,
                "planner_seconds_per_round": self.overhead_seconds / n}


class SchedulePlanner(BudgetPlanner):
    """A planner whose budgets are a fixed schedule over the T rounds, scaled to spend the whole budget."""

    uses_reward = False

    @abstractmethod
    def shape(self, rounds: int) -> Tensor:
        """Relative per-round budgets (positive); they are normalised to sum to the total budget."""

    def setup(self, task: FedRecTask) -> None:
        s = self.shape(self.rounds).double()
        self.schedule = (s / s.sum() * self.total_budget * (1 - BUDGET_MARGIN)).tolist()

    def choose(self, task: FedRecTask, round_idx: int, holding: Tensor) -> float | None:
        return self.schedule[round_idx]
