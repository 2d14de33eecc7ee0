"""Dense linear algebra for one state row, written for the compiled kernels (small d, no LAPACK calls)."""
from __future__ import annotations

import numpy as np

from fedrec.utils.jit import jit


@jit
def cholesky_logdet(A: np.ndarray, lam: float, L: np.ndarray) -> float:
    """Lower Cholesky factor of A + λI into ``L``; returns log det(A + λI), or NaN if it is not positive definite."""
    d = L.shape[0]
    logdet = 0.0
    for j in range(d):
        s = A[j, j] + lam
        for k in range(j):
            s -= L[j, k] * L[j, k]
        if not s > 0.0:
            return np.nan
        ljj = np.sqrt(s)
        L[j, j] = ljj
        logdet += np.log(ljj)
        for i in range(j + 1, d):
            t = A[i, j]
            for k in range(j):
                t -= L[i, k] * L[j, k]
            L[i, j] = t / ljj
        for i in range(j):
            L[i, j] = 0.0
    return 2.0 * logdet


@jit
def inverse_from_cholesky(L: np.ndarray, inv: np.ndarray) -> None:
    """(L Lᵀ)^{-1} = L^{-T} L^{-1} into ``inv`` (symmetric)."""
    d = L.shape[0]
    M = np.zeros((d, d))  # L^{-1}, lower triangular
    for j in range(d):
        M[j, j] = 1.0 / L[j, j]
        for i in range(j + 1, d):
            t = 0.0
            for k in range(j, i):
                t -= L[i, k] * M[k, j]
            M[i, j] = t / L[i, i]
    for i in range(d):
        for j in range(i, d):
            t = 0.0
            for k in range(j, d):
                t += M[k, i] * M[k, j]
            inv[i, j] = t
            inv[j, i] = t


@jit
def cholesky_solve(L: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = (L Lᵀ)^{-1} b by forward and back substitution (no inverse formed)."""
    d = b.shape[0]
    for i in range(d):
        t = b[i]
        for k in range(i):
            t -= L[i, k] * out[k]
        out[i] = t / L[i, i]
    for i in range(d - 1, -1, -1):
        t = out[i]
        for k in range(i + 1, d):
            t -= L[k, i] * out[k]
        out[i] = t / L[i, i]
