"""Callback base with federated hooks (Lightning-style), and the built-in progress-bar and early-stopping
callbacks."""
from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any, Generic, Protocol, TypeVar

from fedrec.errors import ConfigError

log = logging.getLogger(__name__)


class RunningTrainer(Protocol):
    """What a hook may read and set of the trainer running the fit (:class:`~fedrec.trainer.FederatedTrainer`
    has it; a protocol, so that this module need not import the trainer, which imports it)."""

    should_stop: bool  #: set True to stop after this round (in ``on_round_start``: before it)
    round: int  #: rounds completed
    history: list[dict[str, float]]  #: every logged round's metrics
    wall_seconds: float  #: the run's time so far, across resumes
    loggers: list[Any]  #: the run's loggers (empty outside the process of rank 0)

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process of rank 0 (the one that writes)."""
        ...


class RunningTask(Protocol):
    """What a hook may read of any task (:class:`~fedrec.tasks.FederatedTask` has it): the bound of the task type
    ``TaskT`` a :class:`Callback` is generic in."""

    num_rounds: int

    def summary(self) -> dict[str, Any]:
        """Final results for ``summary.json``."""
        ...


#: the kind of task a callback's hooks receive: any task (:class:`RunningTask`) unless the callback is made for one
TaskT = TypeVar("TaskT", bound=RunningTask)


class Callback(Generic[TaskT]):
    """Observes and steers a run through hooks; carries its own ``state_dict`` into checkpoints.

    Every hook gets the trainer running the fit and its task, typed by what a hook may use of them
    (:class:`RunningTrainer`, and the task type ``TaskT``: :class:`RunningTask` for a callback of any task, e.g.
    ``Callback[RunningTask]``, or the one task class a callback is made for, as the budget planners'
    ``Callback[FedRecTask]``), so that this module imports neither (the trainer imports it, and budget planners
    subclass it without importing the trainer). A callback may stop the run by setting
    ``trainer.should_stop = True`` (e.g. a budget planner whose budget is exhausted); set in ``on_round_start``, it
    also cancels the round about to start.
    """

    #: where the run's config declares this callback (``callbacks[2]``), for its errors to name; set by the CLI
    config_key: str | None = None

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint."""
        return type(self).__qualname__

    def on_fit_start(self, trainer: RunningTrainer, task: TaskT) -> None:
        """Before the first round (after a checkpoint, if any, has been loaded)."""

    def on_round_start(self, trainer: RunningTrainer, task: TaskT, round_idx: int) -> None:
        """Before round ``round_idx`` runs (e.g. set this round's privacy budget)."""

    def on_round_end(self, trainer: RunningTrainer, task: TaskT, round_idx: int,
                     metrics: dict[str, float]) -> None:
        """After round ``round_idx`` with the metrics it produced."""

    def on_save_checkpoint(self, trainer: RunningTrainer, task: TaskT, checkpoint: dict[str, Any]) -> None:
        """Just before ``checkpoint`` is written."""

    def on_fit_end(self, trainer: RunningTrainer, task: TaskT) -> None:
        """After the last round."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""


def progress_enabled() -> bool:
    """A progress bar is shown only on an interactive terminal outside CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressBar(Callback[RunningTask]):
    """A tqdm bar over rounds showing the latest metrics."""

    def __init__(self, show: tuple[str, ...] = ("cumulative_regret", "comm_messages")) -> None:
        self.show = show
        self._bar = None

    def on_fit_start(self, trainer: RunningTrainer, task: RunningTask) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=task.num_rounds, initial=trainer.round, unit="round", dynamic_ncols=True)

    def on_round_end(self, trainer: RunningTrainer, task: RunningTask, round_idx: int,
                     metrics: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.set_postfix({k: f"{metrics[k]:.4g}" for k in self.show if k in metrics}, refresh=False)
            self._bar.update(1)

    def on_fit_end(self, trainer: RunningTrainer, task: RunningTask) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class EarlyStopping(Callback[RunningTask]):
    """Stops the run once metric ``monitor`` has not improved for ``patience`` rounds in a row.

    Its state (the best value and the rounds since) goes into checkpoints, so that a resumed run stops after the
    same round as the uninterrupted one.

    Args:
        monitor: the per-round metric watched (a column of ``metrics.csv``, e.g. ``test_rmse``); a run that does not
            log it stops with an error after its first round.
        mode: ``min`` (lower is better, e.g. an RMSE) or ``max`` (e.g. an F1 or NDCG).
        patience: rounds without improvement after which the run stops (at least 1).
        min_delta: how much better than the best so far a value must be to count as an improvement (>= 0); a NaN
            never improves.
    """

    def __init__(self, monitor: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ConfigError(f"monitor: must be the name of a logged metric, got {monitor!r}")
        if mode not in ("min", "max"):
            raise ConfigError(f"mode: must be 'min' or 'max', got {mode!r}")
        if not isinstance(patience, int) or isinstance(patience, bool) or patience < 1:
            raise ConfigError(f"patience: must be an integer >= 1, got {patience!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
            raise ConfigError(f"min_delta: must be a number >= 0, got {min_delta!r}")
        self.monitor, self.mode, self.patience, self.min_delta = monitor, mode, patience, float(min_delta)
        self.best: float | None = None
        self.wait = 0

    @property
    def state_key(self) -> str:
        """One state per monitored metric, so that two early stoppings (on different metrics) can coexist."""
        return f"{type(self).__qualname__}[{self.monitor}]"

    def improves(self, value: float) -> bool:
        """Whether ``value`` beats the best so far by more than ``min_delta`` (the first finite value does)."""
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        return value < self.best - self.min_delta if self.mode == "min" else value > self.best + self.min_delta

    def on_round_end(self, trainer: RunningTrainer, task: RunningTask, round_idx: int,
                     metrics: dict[str, float]) -> None:
        if self.monitor not in metrics:
            where = f"{self.config_key or type(self).__name__}.monitor"
            logged = ", ".join(sorted(k for k in metrics if k != "round"))
            raise ConfigError(f"{where}: the run logs no metric {self.monitor!r} (round {round_idx} logged: {logged})")
        value = float(metrics[self.monitor])
        if self.improves(value):
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            trainer.should_stop = True
            log.info("early stopping after round %d: %s has not improved on %s for %d rounds", round_idx,
                     self.monitor, self.best, self.wait)

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait = state["best"], int(state["wait"])
