"""Callback base with federated hooks (Lightning-style), and the built-in progress-bar callback."""
from __future__ import annotations

import os
import sys
from typing import Any


class Callback:
    """Observes and steers a run through hooks; carries its own ``state_dict`` into checkpoints.

    Every hook gets the :class:`~fedrec.trainer.FederatedTrainer` running the fit and its
    :class:`~fedrec.tasks.FederatedTask`, typed ``Any`` so that this module imports neither (the trainer imports
    it, and budget planners subclass it without importing the trainer). A callback may stop the run by setting
    ``trainer.should_stop = True`` (e.g. a budget planner whose budget is exhausted); set in ``on_round_start``, it
    also cancels the round about to start.
    """

    @property
    def state_key(self) -> str:
        """Key of this callback's state in a checkpoint."""
        return type(self).__qualname__

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        """Before the first round (after a checkpoint, if any, has been loaded)."""

    def on_round_start(self, trainer: Any, task: Any, round_idx: int) -> None:
        """Before round ``round_idx`` runs (e.g. set this round's privacy budget)."""

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        """After round ``round_idx`` with the metrics it produced."""

    def on_save_checkpoint(self, trainer: Any, task: Any, checkpoint: dict[str, Any]) -> None:
        """Just before ``checkpoint`` is written."""

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        """After the last round."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""


def progress_enabled() -> bool:
    """A progress bar is shown only on an interactive terminal outside CI."""
    return sys.stderr.isatty() and not os.environ.get("CI")


class ProgressBar(Callback):
    """A tqdm bar over rounds showing the latest metrics."""

    def __init__(self, show: tuple[str, ...] = ("cumulative_regret", "comm_messages")) -> None:
        self.show = show
        self._bar = None

    def on_fit_start(self, trainer: Any, task: Any) -> None:
        from tqdm.auto import tqdm

        self._bar = tqdm(total=task.num_rounds, initial=trainer.round, unit="round", dynamic_ncols=True)

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        if self._bar is not None:
            self._bar.set_postfix({k: f"{metrics[k]:.4g}" for k in self.show if k in metrics}, refresh=False)
            self._bar.update(1)

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
