"""An aggregation rule: clip every update to a multiple of its group's median norm, then take the weighted mean, so
that a few boosted updates cannot dominate while honest ones pass unchanged."""
from __future__ import annotations

from torch import Tensor

from fedrec.errors import check_float
from fedrec.recsys import RobustAggregator


class MedianNormClip(RobustAggregator):
    """The weighted mean after scaling each update down to at most ``multiple`` times the median L2 norm of the
    updates it is combined with (ω over the round's clients, an item's row over its uploaders)."""

    def __init__(self, multiple: float = 1.0, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting)
        self.multiple = check_float("aggregator.multiple", multiple, low=0.0, low_open=True)

    def rule(self, updates: Tensor, weights: Tensor, clients: int) -> Tensor:
        norms = updates.norm(dim=-1, keepdim=True)  # (..., n, 1)
        bound = self.multiple * norms.median(dim=-2, keepdim=True).values
        clipped = updates * (bound / norms.clamp_min(1e-12)).clamp(max=1.0)
        w = weights.unsqueeze(-1)
        return (w * clipped).sum(-2) / w.sum(-2)
