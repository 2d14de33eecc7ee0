"""BGTplanner's context (paper §V-A): the top singular values of the round's client × item upload matrix X^t.

They are the square roots of the top eigenvalues of the Gram matrix on X's smaller side (X Xᵀ or Xᵀ X, float64):
a dense symmetric eigensolver when that side is small, else Lanczos with full reorthogonalisation on the Gram
operator of the sparse X (the Gram matrix is never formed). The operator of a 0/1 X is a compiled kernel that
reads X's pattern with 16-bit item ids (the products are bound by streaming X's ids: a sixth of the bytes of
scipy's int32 ids and float64 values; 0.13 against 0.22 ms a product on ML-100K).

Lanczos may start from the previous round's Ritz vectors (:class:`Context`'s ``start``): consecutive X^t share
part of their top eigenvectors, which saves ~14% of the Gram products on ML-100K (25.6 → 22.1 a round: pseudo
items are re-drawn every round, so no more). The values then depend on the start to within the tolerance, so a
planner keeps the start in its state; a start of the wrong length is ignored.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from fedrec.jit import HAVE_NUMBA, jit

#: upload matrices whose smaller side is at most this many rows/columns take the dense Gram route
DENSE_SIDE = 128
#: Lanczos's relative tolerance on the residual ‖G y − θ y‖ ≤ tol·θ of each wanted Ritz pair (θ an eigenvalue of
#: the Gram matrix G, the squared singular value): each θ is then within tol·θ of an eigenvalue of G, a bound of
#: 5e-7 on the singular values' relative error; measured ≤ 1.2e-12 on ML-100K's X^t (Ritz values converge
#: quadratically), in 19–31 Gram products warm-started (23–33 cold)
GRAM_TOL = 1e-6
#: weight of the fixed random vector added to a warm start of unit norm, so that no direction is missing from it
START_NOISE = 0.1


class Context(NamedTuple):
    """The top singular values of X^t (descending, zero-padded past its rank) and the Lanczos start of the next
    round (the sum of this round's top Ritz vectors; None on the dense route)."""

    values: np.ndarray
    start: np.ndarray | None


def upload_context(X: Any, dim: int, start: np.ndarray | None = None) -> Context:
    """The top ``dim`` singular values of the sparse 0/1 matrix X^t, and the start for the next round's call.

    By a dense symmetric eigensolver on the Gram matrix when X's smaller side has at most :data:`DENSE_SIDE`
    rows, else by :func:`gram_top_eigenvalues` from ``start`` (None: a fixed random vector, so the values are a
    function of X alone). Eigenvalues within rounding of zero (below ``max(X.shape)·eps·λ_max``) are exact
    zeros, so a rank-deficient X gets zeros past its rank (PROPACK returned a spurious value there). Tests: equal
    to a dense SVD to 1e-6 relative, from any start.
    """
    k = int(dim)
    if k <= 0:
        return Context(np.zeros(0), None)
    X = X.tocsr()
    small, nxt = min(X.shape), None
    if X.nnz == 0 or small == 0:
        lam = np.zeros(0)
    elif small <= max(DENSE_SIDE, k + 1):
        X = X.astype(np.float64, copy=False)  # 0/1 entries are exact
        G = (X @ X.T if X.shape[0] <= X.shape[1] else X.T @ X).toarray()
        lam = np.linalg.eigvalsh(G)[::-1][:k]
    else:
        lam, nxt = gram_top_eigenvalues(X, k, start)
    if len(lam):
        lam = np.where(lam > max(X.shape) * np.finfo(np.float64).eps * lam[0], lam, 0.0)
    s = np.sqrt(lam)
    return Context(np.pad(s, (0, k - len(s))), nxt)


def gram_top_eigenvalues(X: Any, k: int, start: np.ndarray | None = None,
                         tol: float = GRAM_TOL) -> tuple[np.ndarray, np.ndarray]:
    """The top ``k`` eigenvalues (descending, ≥ 0) of the Gram matrix G on the smaller side of the sparse ``X``
    (CSR), and the sum of their Ritz vectors (the next call's ``start``).

    Lanczos with full reorthogonalisation (two Gram–Schmidt passes) on :func:`gram_operator`, from ``start``
    plus :data:`START_NOISE` of a fixed random vector (``start`` None or of another length: that vector alone),
    until the top ``k`` Ritz pairs have residuals ``β_m·|s_m| ≤ tol·θ`` (or within rounding of zero; checked
    every other step, at most one product more, as a check costs a third of one). An
    invariant subspace (β = 0: a rank-deficient X, a repeated eigenvalue whose eigenspace is invariant, a start
    inside a few eigenvectors) holds exact eigenvalues, but not every copy of them: Lanczos goes on from a fresh
    random vector orthogonal to it, and stops at an invariant subspace only once its largest value is not above
    the k-th (the eigenvalues left are copies of those it holds). Like every single-vector Krylov method it finds
    a second copy of a repeated eigenvalue otherwise only through rounding (upload matrices with random pseudo
    items have no exact symmetry)."""
    product = gram_operator(X)
    n = min(X.shape)
    v = _fixed_unit_vector(n)
    start = None if start is None else np.asarray(start, dtype=np.float64)
    if start is not None and start.shape == (n,) and np.isfinite(start).all() and np.any(start):
        v = start / np.linalg.norm(start) + START_NOISE * v
    basis = np.empty((min(n + 1, 4 * k + 32), n))  # the Lanczos vectors, and the next one's room
    alpha, beta = np.empty(n), np.empty(n)
    basis[0] = v / np.linalg.norm(v)
    tiny_scale = max(X.shape) * np.finfo(np.float64).eps
    m = first = 0  # first: where the Krylov space of the current start vector begins
    scale = 0.0  # the largest ‖G q‖ so far, a lower bound on ‖G‖ that sets rounding's scale
    while True:
        if m + 2 > len(basis):
            basis = np.concatenate([basis, np.empty((min(n + 1, 2 * len(basis)) - len(basis), n))])
        product(basis[m], basis[m + 1])
        alpha[m], b, size = _orthogonalise(basis, m)
        m += 1
        scale = max(scale, size)
        if b <= tiny_scale * scale:
            b = 0.0  # an invariant subspace
        if m >= k and ((m - k) % 2 == 0 or b == 0.0 or m == n):  # every other step: a check costs ~1/3 product
            theta, S = _top_ritz(alpha[:m], beta[: m - 1], k)
            bound = np.maximum(tol * theta, tiny_scale * theta[0])
            done = m == n or bool(np.all(b * np.abs(S[-1]) <= bound))
            if done and b == 0.0 and m < n:  # T_m is block diagonal: the current block's top value against θ_k
                done = _top_ritz(alpha[first:m], beta[first: m - 1], 1)[0][0] <= theta[-1] + bound[-1]
            if done:
                return np.maximum(theta, 0.0), S.sum(1) @ basis[:m]
        if b == 0.0:  # go on from a fresh random vector orthogonal to the basis
            basis[m] = np.random.default_rng(m).standard_normal(n)
            b_fresh = _orthogonalise(basis, m - 1)[1]
            basis[m] /= b_fresh
            first = m
        else:
            basis[m] /= b
        beta[m - 1] = b


@functools.lru_cache(maxsize=8)
def _fixed_unit_vector(n: int) -> np.ndarray:
    """The fixed random start of length ``n`` (unit norm, read-only; drawing it costs ~30 µs, so it is kept)."""
    v = np.random.default_rng(0).standard_normal(n)
    v /= np.linalg.norm(v)
    v.flags.writeable = False
    return v


@jit
def _orthogonalise(basis: np.ndarray, m: int) -> tuple[float, float, float]:
    """Orthogonalise row m+1 of ``basis`` against rows 0..m in place (classical Gram–Schmidt twice, "twice is
    enough"), one compiled call per Lanczos step; returns its first coefficient on row m (α_m when row m+1 was
    G·row m) and its norms after and before."""
    B, w = basis[: m + 1], basis[m + 1]
    size = np.sqrt(np.dot(w, w))
    c = np.dot(B, w)
    w -= np.dot(c, B)
    w -= np.dot(np.dot(B, w), B)
    return c[m], np.sqrt(np.dot(w, w)), size


def _top_ritz(alpha: np.ndarray, beta: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The top ``count`` eigenpairs (descending) of the symmetric tridiagonal matrix with diagonal ``alpha`` and
    off-diagonal ``beta``, by LAPACK's MRRR (``dstemr``: ~10 µs here, a fifth of ``eigh_tridiagonal``'s checks)."""
    from scipy.linalg.lapack import dstemr

    m = len(alpha)
    _, theta, S, info = dstemr(alpha, np.append(beta, 0.0), 2, 0.0, 0.0, m - count + 1, m)
    if info != 0:
        raise np.linalg.LinAlgError(f"Lanczos: LAPACK's dstemr failed (info {info})")
    return theta[count - 1::-1], S[:, count - 1::-1]


def gram_operator(X: Any) -> Callable[[np.ndarray, np.ndarray], None]:
    """``(v, out) ↦ out = G v`` for the Gram matrix G on the smaller side of the sparse CSR ``X`` (X Xᵀ or Xᵀ X),
    as two passes over X: the compiled 0/1 kernel (:func:`_pattern_gram`, X's ids as 16-bit integers when they
    fit) when numba imports and every stored entry is 1, else scipy's sparse products in float64 (the same sums
    but for their order: equal to ~1e-15 relative)."""
    rows_side = X.shape[0] <= X.shape[1]
    if HAVE_NUMBA and bool(np.all(X.data == 1)):
        ids = X.indices.astype(np.uint16) if X.shape[1] <= 1 << 16 else X.indices
        indptr = X.indptr
        work = np.empty(X.shape[1] if rows_side else 0)  # the item-side vector of X Xᵀ v
        return lambda v, out: _pattern_gram(indptr, ids, v, work, out, rows_side)
    X = X.astype(np.float64, copy=False)
    XT = X.T  # a CSC view, as fast, no copy

    def scipy_product(v: np.ndarray, out: np.ndarray) -> None:
        out[:] = X @ (XT @ v) if rows_side else XT @ (X @ v)
    return scipy_product


def load_kernels() -> None:
    """Compile the Lanczos kernels for X^t's usual index types (or load them from numba's cache): ~0.1–2 s once
    per process, which a planner spends at fit start rather than in its first round."""
    if HAVE_NUMBA:
        _pattern_gram(np.zeros(2, dtype=np.int32), np.zeros(0, dtype=np.uint16), np.zeros(1), np.zeros(1),
                      np.zeros(1), True)
        _orthogonalise(np.eye(2), 0)


@jit
def _pattern_gram(indptr: np.ndarray, ids: np.ndarray, v: np.ndarray, work: np.ndarray, out: np.ndarray,
                  rows_side: bool) -> None:  # pragma: no cover - compiled (the scipy route is its reference)
    """``out`` = P Pᵀ v (``rows_side``, through ``work``) or Pᵀ P v for the 0/1 pattern P of a CSR matrix
    (``indptr``, ``ids``): a scatter of one side's vector over the rows' ids and a gather back, or the gather
    then the scatter, counting every stored entry as scipy's products do (:func:`_row_sum` orders the sums)."""
    rows = len(indptr) - 1
    if rows_side:
        work[:] = 0.0
        for i in range(rows):
            vi = v[i]
            for p in range(indptr[i], indptr[i + 1]):
                work[ids[p]] += vi
        for i in range(rows):
            out[i] = _row_sum(ids, indptr[i], indptr[i + 1], work)
        return
    out[:] = 0.0
    for i in range(rows):
        acc = _row_sum(ids, indptr[i], indptr[i + 1], v)
        for p in range(indptr[i], indptr[i + 1]):
            out[ids[p]] += acc


@jit
def _row_sum(ids: np.ndarray, lo: int, hi: int, x: np.ndarray) -> float:  # pragma: no cover - compiled
    """Σ x[ids[p]] for p in [lo, hi), in four running sums: one sum waits on the previous addition (~4 cycles per
    entry); four keep the adder busy (measured: the Gram product 0.17 → 0.13 ms on ML-100K's X^t)."""
    a0 = a1 = a2 = a3 = 0.0
    p = lo
    while p + 4 <= hi:
        a0 += x[ids[p]]
        a1 += x[ids[p + 1]]
        a2 += x[ids[p + 2]]
        a3 += x[ids[p + 3]]
        p += 4
    while p < hi:
        a0 += x[ids[p]]
        p += 1
    return (a0 + a1) + (a2 + a3)
