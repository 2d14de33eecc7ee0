"""Documented rating scales, against which the dataset readers check every rating before it is normalised."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatingScale:
    """A documented rating scale: ``low`` to ``high`` in steps of ``step``; ``text`` says so in error messages."""

    low: float
    high: float
    step: float
    text: str

    def off_scale(self, rating: np.ndarray) -> np.ndarray:
        """Mask of the ratings outside ``[low, high]`` or between two steps of the scale."""
        steps = (rating - self.low) / self.step
        return (rating < self.low) | (rating > self.high) | (np.abs(steps - np.round(steps)) > 1e-9)
