"""Rating-prediction metrics on [0, 1]-scaled ratings (BGTplanner paper §VII-A2)."""
from __future__ import annotations

from torch import Tensor

__all__ = ["F1_THRESHOLD", "rating_metrics"]

#: ratings and predictions at or above this are positive for F1 (paper §VII-A2)
F1_THRESHOLD = 0.5


def rating_metrics(pred: Tensor, target: Tensor, threshold: float = F1_THRESHOLD) -> dict[str, float]:
    """RMSE, MAE and F1, the last with ratings and predictions binarised at ``threshold`` and micro-averaged
    over all pairs (the authors' code); F1 is 0 when there are no true or predicted positives."""
    err = pred.double() - target.double()
    pos_pred, pos_true = pred >= threshold, target >= threshold
    tp = int((pos_pred & pos_true).sum())
    fp = int((pos_pred & ~pos_true).sum())
    fn = int((~pos_pred & pos_true).sum())
    return {
        "rmse": float(err.pow(2).mean().sqrt()),
        "mae": float(err.abs().mean()),
        "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0,
    }
