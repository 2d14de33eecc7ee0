"""Model selection on validation: a run's results at the round its validation metric was best, so that no reported
number is chosen on the test set (the ``best_test_*`` summaries are the best test value over the rounds, an
optimistic figure; ``selected_test_*`` are the test values at the best validation round)."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fedrec.errors import ConfigError


class ValidationSelection:
    """Tracks the round whose ``metric`` (a ``val_*`` metric) was best and that round's ``test_*`` metrics.

    Args:
        metric: the validation metric, e.g. ``val_rmse`` or ``val_ndcg@10``.
        higher_is_better: whether a larger value of a metric is the better one.
    """

    def __init__(self, metric: str, higher_is_better: Callable[[str], bool]) -> None:
        if not isinstance(metric, str) or not metric.startswith("val_"):
            raise ConfigError(f"task.select_on must name a validation metric (val_rmse, val_ndcg@10, ...), got "
                              f"{metric!r}")
        self.metric, self.higher = metric, higher_is_better(metric)
        self.round: int | None = None
        self.value = math.nan
        self.test: dict[str, float] = {}

    def update(self, round_idx: int, metrics: dict[str, float]) -> None:
        """Keep round ``round_idx``'s test metrics if its validation metric is the best so far (the earlier round on
        a tie)."""
        v = metrics.get(self.metric, math.nan)
        if math.isnan(v) or (self.round is not None and not (v > self.value if self.higher else v < self.value)):
            return
        self.round, self.value = round_idx, v
        self.test = {k: x for k, x in metrics.items() if k.startswith("test_")}

    def summary(self) -> dict[str, Any]:
        """``selected_on``, ``selected_round``, ``selected_<val metric>`` and ``selected_test_*`` (none before a
        validation metric was seen)."""
        if self.round is None:
            return {}
        return {"selected_on": self.metric, "selected_round": self.round, f"selected_{self.metric}": self.value,
                **{f"selected_{k}": v for k, v in sorted(self.test.items())}}

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "value": self.value, "test": dict(self.test)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round, self.value, self.test = state["round"], state["value"], dict(state["test"])
