"""FederatedTrainer: owns the round loop, hooks, logging, checkpointing, resume and stopping."""
from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedrec.errors import ConfigError, check_int
from fedrec.tasks.base import FederatedTask
from fedrec.trainer.callbacks import Callback, ProgressBar, progress_enabled
from fedrec.trainer.checkpoint import load_checkpoint, save_checkpoint


class FederatedTrainer:
    """Runs a :class:`FederatedTask` round by round (one loop for step-wise bandits and round-wise FL).

    Args:
        default_root_dir: run directory (checkpoints go to ``<dir>/checkpoints``).
        max_rounds: stop after this many rounds (default: the task's ``num_rounds``).
        callbacks: :class:`Callback` objects, called in order.
        loggers: Lightning loggers (``lightning.fabric.loggers``) receiving every logged round.
        log_every: log metrics every this many rounds (the last round is always logged).
        checkpoint_every: write ``last.ckpt`` every this many rounds (0: only at the end).
        enable_progress_bar: None shows a bar only on an interactive terminal outside CI.
    """

    def __init__(
        self,
        default_root_dir: str | Path = ".",
        max_rounds: int | None = None,
        callbacks: Sequence[Callback] = (),
        loggers: Iterable[Any] = (),
        log_every: int = 1,
        checkpoint_every: int = 0,
        enable_progress_bar: bool | None = None,
    ) -> None:
        self.root = Path(default_root_dir)
        self.max_rounds = None if max_rounds is None else check_int("trainer.max_rounds", max_rounds)
        self.log_every = check_int("trainer.log_every", log_every)
        self.checkpoint_every = check_int("trainer.checkpoint_every", checkpoint_every, minimum=0)
        show_bar = progress_enabled() if enable_progress_bar is None else enable_progress_bar
        self.callbacks: list[Callback] = list(callbacks) + ([ProgressBar()] if show_bar else [])
        keys = [cb.state_key for cb in self.callbacks]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"callbacks: state keys must be unique, got {keys}")
        self.loggers = list(loggers)
        self.round = 0
        self.history: list[dict[str, float]] = []
        self.should_stop = False
        self.wall_seconds = 0.0

    @property
    def checkpoint_path(self) -> Path:
        return self.root / "checkpoints" / "last.ckpt"

    # ---------------------------------------------------------------------------------------------- loop
    def fit(self, task: FederatedTask, ckpt_path: str | Path | None = None) -> list[dict[str, float]]:
        """Run the task to completion (or until stopped), resuming from ``ckpt_path`` if given.

        Returns the per-round metric history (the resumed part included).
        """
        if ckpt_path is not None:
            self._restore(task, load_checkpoint(ckpt_path))
        total = task.num_rounds if self.max_rounds is None else min(self.max_rounds, task.num_rounds)
        if ckpt_path is not None:  # the history is authoritative: loggers get the rounds logged before again
            for metrics in self.history:
                r = int(metrics["round"]) + 1
                if r % self.log_every == 0 or r == total or (r == self.round and self.should_stop):
                    self._log(metrics)
        task.setup(self)
        self._hook("on_fit_start", task)
        started = time.perf_counter()
        elapsed_before = self.wall_seconds
        while self.round < total and not self.should_stop:
            r = self.round
            self._hook("on_round_start", task, r)
            if self.should_stop:  # a callback found the round cannot run (e.g. no privacy budget left)
                if self.history and not (r % self.log_every == 0 or r == total):
                    self._log(self.history[-1])  # the run's last round is always logged (as a resume replays it)
                break
            metrics = {"round": r, **task.run_round(r)}
            self.round = r + 1
            self.wall_seconds = elapsed_before + time.perf_counter() - started
            self.history.append(metrics)
            self._hook("on_round_end", task, r, metrics)
            if self.round % self.log_every == 0 or self.round == total or self.should_stop:
                self._log(metrics)
            if self.checkpoint_every and self.round % self.checkpoint_every == 0:
                self.save(task)
        self._hook("on_fit_end", task)
        self.save(task)
        for lg in self.loggers:
            lg.finalize("success")
        return self.history

    # ---------------------------------------------------------------------------------------- internals
    def _hook(self, name: str, task: FederatedTask, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(self, task, *args)

    def _log(self, metrics: dict[str, float]) -> None:
        for lg in self.loggers:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Experiment logs directory")
                lg.log_metrics({k: v for k, v in metrics.items() if k != "round"}, step=int(metrics["round"]))
            lg.save()

    def save(self, task: FederatedTask) -> Path:
        """Write the full run state to ``checkpoints/last.ckpt`` atomically."""
        ckpt: dict[str, Any] = {
            "round": self.round,
            "task": task.state_dict(),
            "callbacks": {cb.state_key: cb.state_dict() for cb in self.callbacks},
            "history": list(self.history),
            "wall_seconds": self.wall_seconds,
            "should_stop": self.should_stop,
        }
        for cb in self.callbacks:
            cb.on_save_checkpoint(self, task, ckpt)
        return save_checkpoint(self.checkpoint_path, ckpt)

    def _restore(self, task: FederatedTask, ckpt: dict[str, Any]) -> None:
        task.load_state_dict(ckpt["task"])
        states = ckpt["callbacks"]
        for cb in self.callbacks:
            if cb.state_key in states:
                cb.load_state_dict(states[cb.state_key])
        self.round = int(ckpt["round"])
        self.history = list(ckpt["history"])
        self.wall_seconds = float(ckpt["wall_seconds"])
        self.should_stop = bool(ckpt["should_stop"])
