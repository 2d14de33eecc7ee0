"""The task interface (the LightningModule analogue): what one round of a federated task does."""
from __future__ import annotations

from typing import Any


class FederatedTask:
    """A task runs ``num_rounds`` rounds; the trainer owns the loop, hooks, logging and checkpoints.

    Subclasses implement :meth:`run_round`, :meth:`state_dict`, :meth:`load_state_dict` and :meth:`summary`.
    """

    #: rounds in a full run
    num_rounds: int = 0

    def setup(self, trainer: Any) -> None:
        """Called once before the first round (also after a resume)."""

    def run_round(self, round_idx: int) -> dict[str, float]:  # pragma: no cover - abstract
        """Run round ``round_idx`` and return scalar metrics to log."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:  # pragma: no cover - abstract
        """Final results for ``summary.json``."""
        raise NotImplementedError
