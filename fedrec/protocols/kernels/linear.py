"""The local step of a linear bandit row (LinUCB Eq. 5 of the Async-LinUCB paper, or LinTS), written once.

A policy reaches the kernels as two named structures: :class:`LinearParams` (its settings, from
:meth:`fedrec.bandits.LinearBandit.kernel_params`) and :class:`PolicyRows` (its row state, the policy's buffers of
the same names). The arm is the first whose score is within ``TIE_TOLERANCE`` of the maximum, as
:meth:`fedrec.bandits.LinearBandit.pick` picks it on the torch path.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.bandits.linear import LINUCB, TIE_TOLERANCE
from fedrec.protocols.kernels.linalg import cholesky_logdet, inverse_from_cholesky
from fedrec.utils.jit import BOOL, F64, I64, jit
from fedrec.utils.rng import fill_normals


class LinearParams(NamedTuple):
    """A linear policy's settings (:meth:`fedrec.bandits.LinearBandit.kernel_params`)."""

    kind: int  #: ``fedrec.bandits.linear.LINUCB`` or ``LINTS``
    lam: float  #: the ridge λ
    alpha: float  #: LinUCB's fixed exploration weight; NaN: the radius of Eq. (5)
    sigma: float  #: σ of Eq. (5)
    delta: float  #: δ of Eq. (5)
    count_bound: bool  #: Eq. (5) with the count bound d·log(1 + n/(dλ)) instead of the log-determinant
    v: float  #: LinTS's posterior scale
    refactor_every: int  #: Sherman–Morrison updates between two Cholesky refactorisations of a row
    seed: int  #: keys LinTS's draws (:func:`fedrec.utils.rng.fill_normals`)


class PolicyRows(NamedTuple):
    """A linear policy's row state: its buffers of the same names (:class:`fedrec.bandits.LinearBandit`)."""

    G: F64[3]  #: augmented Gram matrices Σ z zᵀ, z = [x; y]: (rows, d+1, d+1)
    inv: F64[3]  #: (V + λI)^{-1}: (rows, d, d)
    logdet: F64[1]  #: log det(V + λI)
    count: I64[1]  #: observations
    since_refactor: I64[1]  #: updates since the row's last refactorisation
    stale: BOOL[1]  #: G changed wholesale (a download): refactorise before the row is next used
    draws: I64[1]  #: LinTS's draw counters (one unused entry for LinUCB)
    stream: I64[1]  #: LinTS's stream of each row (one unused entry for LinUCB)


@jit
def radius(p: LinearParams, logdet: float, count: int, d: int) -> float:
    """LinUCB's exploration weight: fixed α, or the OFUL radius of Eq. (5) (``fedrec.bandits.confidence_radius``)."""
    if not np.isnan(p.alpha):
        return p.alpha
    if p.count_bound:
        info = d * np.log1p(count / (d * p.lam))
    else:
        info = logdet - d * np.log(p.lam)
    return p.sigma * np.sqrt(max(info, 0.0) + 2.0 * np.log(1.0 / p.delta)) + np.sqrt(p.lam)


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
def choose(p: LinearParams, pol: PolicyRows, row: int, ctx: np.ndarray, Ax: np.ndarray) -> int:
    """The arm row ``row`` picks among ``ctx`` (K, d); leaves (V + λI)^{-1} x of the picked arm in ``Ax``."""
    d = pol.inv.shape[1]
    K = ctx.shape[0]
    A = pol.inv[row]
    G = pol.G
    theta = np.zeros(d)
    for i in range(d):
        t = 0.0
        for j in range(d):
            t += A[i, j] * G[row, j, d]
        theta[i] = t
    scores = np.empty(K)
    if p.kind == LINUCB:
        alpha = radius(p, pol.logdet[row], pol.count[row], d)
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
        fill_normals(p.seed, pol.stream[row], pol.draws[row], z)
        pol.draws[row] += 1
        L = np.empty((d, d))
        cholesky_logdet(A, 0.0, L)
        v = p.v
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
def update(p: LinearParams, pol: PolicyRows, row: int, x: np.ndarray, y: float, Ax: np.ndarray) -> bool:
    """Add (x, y) to row ``row``: G += z zᵀ (z = [x; y]), Sherman–Morrison inverse, determinant-lemma log-det.

    Refactorises the row by Cholesky once it has had ``refactor_every`` updates since the last time (the one
    refactorisation rule of both backends). ``Ax`` is (V + λI)^{-1} x. Returns False if refactorisation failed.
    """
    d = x.shape[0]
    denom = 1.0
    for i in range(d):
        denom += x[i] * Ax[i]
    A = pol.inv[row]
    for i in range(d):
        for j in range(d):
            A[i, j] -= Ax[i] * Ax[j] / denom
    pol.logdet[row] += np.log(denom)
    add_outer(pol.G[row], x, y)
    pol.count[row] += 1
    pol.since_refactor[row] += 1
    if pol.since_refactor[row] >= p.refactor_every:
        return refactor(pol, row, p.lam)
    return True


@jit
def refactor(pol: PolicyRows, row: int, lam: float) -> bool:
    """Recompute row ``row``'s inverse (V + λI)^{-1} and log det from its Gram matrix G[row, :d, :d].

    Resets its update counter and stale flag; returns False (state untouched) if V + λI is not positive definite.
    """
    d = pol.inv.shape[1]
    L = np.empty((d, d))
    ld = cholesky_logdet(pol.G[row, :d, :d], lam, L)
    if np.isnan(ld):
        return False
    inverse_from_cholesky(L, pol.inv[row])
    pol.logdet[row] = ld
    pol.since_refactor[row] = 0
    pol.stale[row] = False
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
