"""The local step of a linear bandit row (LinUCB Eq. 5 of the Async-LinUCB paper, or LinTS), written once.

A policy reaches the kernels as ``(kind, params, seed)``: :data:`LINUCB` or :data:`LINTS` and the float64 array
``params = [λ, α (NaN: the theoretical radius), σ, δ, radius bound (0 determinant, 1 count), v, refactor_every]``
(see :meth:`fedrec.bandits.LinearBandit.kernel_spec`). The arm is the first whose score is within
``TIE_TOLERANCE`` of the maximum, as :meth:`fedrec.bandits.LinearBandit.pick` picks it on the torch path.
"""
from __future__ import annotations

import numpy as np

from fedrec.bandits.linear import TIE_TOLERANCE
from fedrec.jit import jit
from fedrec.protocols.kernels.linalg import cholesky_logdet, refactor_row
from fedrec.rng import fill_normals

LINUCB, LINTS = 0, 1
P_LAM, P_ALPHA, P_SIGMA, P_DELTA, P_BOUND, P_V, P_REFACTOR = range(7)


@jit
def radius(params: np.ndarray, logdet: float, count: int, d: int) -> float:
    """LinUCB's exploration weight: fixed α, or the OFUL radius of Eq. (5) (``fedrec.bandits.confidence_radius``)."""
    if not np.isnan(params[P_ALPHA]):
        return params[P_ALPHA]
    lam = params[P_LAM]
    if params[P_BOUND] == 0:
        info = logdet - d * np.log(lam)
    else:
        info = d * np.log1p(count / (d * lam))
    return params[P_SIGMA] * np.sqrt(max(info, 0.0) + 2.0 * np.log(1.0 / params[P_DELTA])) + np.sqrt(lam)


@jit
def first_near_max(scores: np.ndarray) -> int:
    """The first index whose score is within ``TIE_TOLERANCE`` of the maximum."""
    best = scores.max()
    for k in range(scores.shape[0]):
        if scores[k] >= best - TIE_TOLERANCE:
            return k
    return 0


@jit
def solve_into(A: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out = A x for a d × d matrix A."""
    d = x.shape[0]
    for i in range(d):
        t = 0.0
        for j in range(d):
            t += A[i, j] * x[j]
        out[i] = t


@jit
def choose(kind: int, params: np.ndarray, seed: int, row: int, G: np.ndarray, inv: np.ndarray, logdet: np.ndarray,
           count: np.ndarray, draws: np.ndarray, ctx: np.ndarray, Ax: np.ndarray) -> int:
    """The arm row ``row`` picks among ``ctx`` (K, d); leaves (V + λI)^{-1} x of the picked arm in ``Ax``."""
    d = inv.shape[1]
    K = ctx.shape[0]
    A = inv[row]
    theta = np.zeros(d)
    for i in range(d):
        t = 0.0
        for j in range(d):
            t += A[i, j] * G[row, j, d]
        theta[i] = t
    scores = np.empty(K)
    if kind == LINUCB:
        alpha = radius(params, logdet[row], count[row], d)
        for k in range(K):
            x = ctx[k]
            solve_into(A, x, Ax)
            mean = 0.0
            width = 0.0
            for i in range(d):
                mean += x[i] * theta[i]
                width += x[i] * Ax[i]
            scores[k] = mean + alpha * np.sqrt(max(width, 0.0))
    else:  # LinTS: θ̃ = θ̂ + v · chol((V + λI)^{-1}) z with z from the row's counter-based stream
        z = np.empty(d)
        fill_normals(seed, row, draws[row], z)
        draws[row] += 1
        L = np.empty((d, d))
        cholesky_logdet(A, 0.0, L)
        v = params[P_V]
        for i in range(d):
            t = 0.0
            for j in range(i + 1):
                t += L[i, j] * z[j]
            theta[i] += v * t
        for k in range(K):
            score = 0.0
            for i in range(d):
                score += ctx[k, i] * theta[i]
            scores[k] = score
    arm = first_near_max(scores)
    solve_into(A, ctx[arm], Ax)
    return arm


@jit
def update(params: np.ndarray, row: int, x: np.ndarray, y: float, Ax: np.ndarray, G: np.ndarray, inv: np.ndarray,
           logdet: np.ndarray, count: np.ndarray, since: np.ndarray, stale: np.ndarray) -> bool:
    """Add (x, y) to row ``row``: G += z zᵀ (z = [x; y]), Sherman–Morrison inverse, determinant-lemma log-det.

    Refactorises the row by Cholesky once it has had ``refactor_every`` updates since the last time (the one
    refactorisation rule of both backends). ``Ax`` is (V + λI)^{-1} x. Returns False if refactorisation failed.
    """
    d = x.shape[0]
    denom = 1.0
    for i in range(d):
        denom += x[i] * Ax[i]
    A = inv[row]
    for i in range(d):
        for j in range(d):
            A[i, j] -= Ax[i] * Ax[j] / denom
    logdet[row] += np.log(denom)
    add_outer(G[row], x, y)
    count[row] += 1
    since[row] += 1
    if since[row] >= params[P_REFACTOR]:
        return refactor_row(G, inv, logdet, since, stale, row, params[P_LAM])
    return True


@jit
def add_outer(G: np.ndarray, x: np.ndarray, y: float) -> None:
    """G += z zᵀ for z = [x; y] (an augmented Gram matrix: V, b and Σy²)."""
    d = x.shape[0]
    for i in range(d):
        xi = x[i]
        for j in range(d):
            G[i, j] += xi * x[j]
        G[i, d] += xi * y
        G[d, i] += y * xi
    G[d, d] += y * y
