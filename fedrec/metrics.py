"""Rating-prediction metrics on [0, 1]-scaled ratings (BGTplanner paper §VII-A2), and the RMSE on the dataset's
original rating scale (``rmse_raw``, what GC-MC and FedGNN report)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["F1_THRESHOLD", "metrics_from_sums", "rating_metrics", "rating_sums"]

#: ratings and predictions at or above this are positive for F1 (paper §VII-A2)
F1_THRESHOLD = 0.5


def rating_sums(pred: Tensor, target: Tensor, threshold: float = F1_THRESHOLD) -> Tensor:
    """The sums the rating metrics are made of, float64 ``[pairs, Σ err², Σ |err|, tp, fp, fn]``: they add up over
    disjoint sets of pairs (a sharded run adds its processes' with an all-reduce)."""
    target = target.to(pred.device)
    err = pred.double() - target.double()
    pos_pred, pos_true = pred >= threshold, target >= threshold
    return torch.stack([
        torch.tensor(float(err.numel()), dtype=torch.float64, device=err.device), err.pow(2).sum(), err.abs().sum(),
        (pos_pred & pos_true).sum().double(), (pos_pred & ~pos_true).sum().double(),
        (~pos_pred & pos_true).sum().double(),
    ])


def metrics_from_sums(sums: Tensor, unit: float | None = None) -> dict[str, float]:
    """RMSE, MAE and F1 from :func:`rating_sums` (F1 micro-averaged over all pairs, 0 without true positives); with
    ``unit``, the original rating units per normalised unit (:attr:`fedrec.data.RatingData.rating_unit`), also
    ``rmse_raw``, the RMSE on the original scale (normalisation is affine, so it is ``unit`` × RMSE)."""
    n, sse, sae, tp, fp, fn = (float(v) for v in sums)
    metrics = {"rmse": math.sqrt(sse / n), "mae": sae / n, "f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}
    if unit is not None:
        metrics["rmse_raw"] = unit * metrics["rmse"]
    return metrics


def rating_metrics(pred: Tensor, target: Tensor, threshold: float = F1_THRESHOLD) -> dict[str, float]:
    """RMSE, MAE and F1, the last with ratings and predictions binarised at ``threshold`` and micro-averaged
    over all pairs (the authors' code); F1 is 0 when there are no true or predicted positives."""
    return metrics_from_sums(rating_sums(pred, target, threshold))
