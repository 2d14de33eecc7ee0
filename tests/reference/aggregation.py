"""The robust rules and server optimisers written out on numpy arrays, client by client and item by item: the
oracles of the aggregation tests."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from fedrec.recsys import Uploads


def ref_krum(u: np.ndarray, w: np.ndarray, f: int, m: int) -> np.ndarray:
    """Blanchard et al.'s Krum / Multi-Krum written out: scores from the C − f − 2 nearest others, least first."""
    C = len(u)
    scores = []
    for i in range(C):
        d = sorted(float(np.sum((u[i] - u[j]) ** 2)) for j in range(C) if j != i)
        scores.append(sum(d[:C - f - 2]))
    best = sorted(range(C), key=lambda i: (scores[i], i))[:m]
    return u[best[0]] if m == 1 else np.average(u[best], axis=0, weights=w[best])


def ref_norm_bounded(u: np.ndarray, w: np.ndarray, bound: float) -> np.ndarray:
    """The weighted mean of the updates, each first scaled down to norm at most ``bound``."""
    scaled = [x * min(1.0, bound / np.linalg.norm(x)) if np.linalg.norm(x) > 0 else x for x in u]
    return np.average(np.array(scaled), axis=0, weights=w)


def algorithm_2(kind: str, x0: np.ndarray, deltas: list[np.ndarray], lr: float, b1: float, b2: float, tau: float,
                bias_correction: bool = False) -> list[np.ndarray]:
    """Reddi et al. (ICLR 2021) Algorithm 2 (and FedAvgM, Hsu et al. 2019), written out on numpy arrays: the
    models after each round, from x0 and the rounds' pseudo-gradients Δ_t."""
    x, m, v = x0.copy(), np.zeros_like(x0), np.full_like(x0, tau**2)
    out = []
    for step, d in enumerate(deltas, start=1):
        if kind == "fedavgm":
            m = b1 * m + d
            x = x + lr * m
        else:
            m = b1 * m + (1 - b1) * d
            if kind == "fedadagrad":
                v = v + d**2
            elif kind == "fedadam":
                v = b2 * v + (1 - b2) * d**2
            else:  # fedyogi
                v = v - (1 - b2) * d**2 * np.sign(v - d**2)
            eta = lr * np.sqrt(1 - b2**step) / (1 - b1**step) if bias_correction else lr
            x = x + eta * m / (np.sqrt(v) + tau)
        out.append(x.copy())
    return out


def item_by_item(up: Uploads, group_rule: Callable[[np.ndarray, np.ndarray, int], np.ndarray]
                 ) -> tuple[np.ndarray, list[int], np.ndarray]:
    """ω by ``group_rule(updates, weights, C)`` over the clients, and each item's row over its uploaders (rows in
    upload order), written out item by item; weights = uploaded items per client."""
    C = up.clients.numel()
    w = np.bincount(up.row_client.numpy(), minlength=C).astype(float)
    rows, row_item, row_client = up.rows.numpy(), up.row_item.numpy(), up.row_client.numpy()
    items = sorted(set(row_item.tolist()))
    out = np.array([group_rule(rows[row_item == i], w[row_client[row_item == i]], C) for i in items])
    return group_rule(up.shared.numpy(), w, C), items, out
