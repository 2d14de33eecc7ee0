"""The task interface (the LightningModule analogue): what one round of a federated task does."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class FederatedTask(ABC):
    """A task runs ``num_rounds`` rounds; the trainer owns the loop, hooks, logging and checkpoints.

    Subclasses implement :meth:`run_round`, :meth:`state_dict`, :meth:`load_state_dict` and :meth:`summary`.
    """

    #: rounds in a full run
    num_rounds: int = 0
    #: how a config builds this task (a kind registered with :func:`fedrec.app.build.register_kind`); None: built in
    #: Python only
    kind: str | None = None

    def setup(self, trainer: Any) -> None:  # noqa: B027 - an optional hook: most tasks need no set-up
        """Called once before the first round (also after a resume)."""

    @abstractmethod
    def run_round(self, round_idx: int) -> dict[str, float]:
        """Run round ``round_idx`` and return scalar metrics to log."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...

    @abstractmethod
    def summary(self) -> dict[str, Any]:
        """Final results for ``summary.json``."""
