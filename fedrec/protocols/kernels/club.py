"""Step loops of the per-server baselines of the FCLUB comparison (Liu et al., UAI 2022): per-user LinUCB, CLUB
(Gentile et al. 2014) and SCLUB (Li et al. 2019), each local server on its own, no communication.

Users of one server are the contiguous block [lo[i], hi[i]) of user i. A cluster recommends from its aggregate
M = λI + Σ V_j, w = Σ b_j with the family's radius and UCB pick (:mod:`.clustering`). The loops take the
protocol's buffers as :class:`LocalState`, its settings as :class:`LocalSettings` and the radius as
:class:`~fedrec.protocols.kernels.clustering.ClusterParams`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.jit import BOOL, F64, I64, jit, parallel_variant, prange
from fedrec.protocols.kernels.clustering import ClusterParams, beta, confidence_shape, ucb_pick
from fedrec.protocols.kernels.linalg import cholesky_logdet, cholesky_solve, inverse_from_cholesky

#: ``LocalSettings.method``
LINUCB, CLUB, SCLUB = 0, 1, 2


class LocalState(NamedTuple):
    """The baselines' state (:class:`fedrec.protocols.LocalClustering`'s buffers and attributes of the same names),
    replicate first; each method reads the users' statistics and its own fields."""

    lo: I64[1]  #: (n,) the first user of each user's server block (fixed)
    hi: I64[1]  #: (n,) one past its last user
    V: F64[4]  #: each user's V_i, b_i, T_i and estimate θ̂_i
    b: F64[3]
    T: F64[2]
    theta: F64[3]
    adj: BOOL[3]  #: CLUB's user graph
    cl: I64[2]  #: SCLUB's cluster slot of each user
    snapT: F64[2]  #: SCLUB's per-slot snapshot of the count and estimate at the phase start
    snapTheta: F64[3]
    checked: BOOL[2]  #: SCLUB's users checked in the current phase


class LocalSettings(NamedTuple):
    """The baseline and its constants (:class:`fedrec.protocols.LocalClustering`'s attributes of the same names)."""

    method: int  #: :data:`LINUCB`, :data:`CLUB` or :data:`SCLUB`
    alpha: float  #: CLUB's deletion constant, SCLUB's α
    alpha_p: float  #: SCLUB's frequency constant α_p


@jit
def aggregate(V: np.ndarray, b: np.ndarray, T: np.ndarray, members: np.ndarray, size: int, lam: float,
              M: np.ndarray, w: np.ndarray) -> float:
    """M = λI + Σ V_j and w = Σ b_j over ``members[:size]``; returns Σ T_j."""
    d = w.shape[0]
    M[:] = 0.0
    w[:] = 0.0
    count = 0.0
    for m in range(size):
        j = members[m]
        count += T[j]
        for p in range(d):
            w[p] += b[j, p]
            for q in range(d):
                M[p, q] += V[j, p, q]
    for p in range(d):
        M[p, p] += lam
    return count


@jit
def estimate(M: np.ndarray, w: np.ndarray, L: np.ndarray, theta: np.ndarray) -> None:
    """theta = M⁻¹w for a positive definite M by Cholesky solves (the estimate alone needs no inverse)."""
    cholesky_logdet(M, 0.0, L)
    cholesky_solve(L, w, theta)


@jit
def observe(V: np.ndarray, b: np.ndarray, T: np.ndarray, i: int, x: np.ndarray, y: float) -> None:
    """User i's statistics take (x, y)."""
    d = x.shape[0]
    for p in range(d):
        b[i, p] += y * x[p]
        for q in range(d):
            V[i, p, q] += x[p] * x[q]
    T[i] += 1.0


@jit
def scratch(d: int, K: int, n: int) -> tuple:
    """One replicate's work arrays: Cholesky factor, aggregate and inverse, moment, estimate, scores, members."""
    return (np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros(d), np.zeros(d), np.zeros(K),
            np.zeros(n, dtype=np.int64))


@jit
def play(V, b, T, theta, i, members, size, ctx, rew, p: ClusterParams, t, M, w, L, Minv, th, scores) -> int:
    """Recommend to user i from the aggregate of ``members[:size]``, observe the arm's reward, refresh θ̂_i."""
    d = w.shape[0]
    count = aggregate(V, b, T, members, size, p.base, M, w)
    cholesky_logdet(M, 0.0, L)
    inverse_from_cholesky(L, Minv)
    a = ucb_pick(ctx, Minv, w, beta(p, count, 1, d, t), p.squared, th, scores)
    observe(V, b, T, i, ctx[a], rew[a])
    members[0] = i
    aggregate(V, b, T, members, 1, p.base, M, w)
    estimate(M, w, L, theta[i])
    return a


@jit
def distance(a: np.ndarray, c: np.ndarray) -> float:
    """‖a − c‖."""
    acc = 0.0
    for p in range(a.shape[0]):
        acc += (a[p] - c[p]) ** 2
    return np.sqrt(acc)


@jit
def _club_replicate(r, io, p, cfg, st):
    """Per-user LinUCB (``method`` LINUCB) or CLUB per server (CLUB) in replicate ``r``: recommend from the arriving
    user's connected component, update the user, delete its edges to users whose estimates are far apart (α:
    deletion constant)."""
    St = io.users.shape[1]
    K, d = io.contexts.shape[2], io.contexts.shape[3]
    n = st.V.shape[1]
    lo, hi, adj, alpha = st.lo, st.hi, st.adj, cfg.alpha
    V, b, T, theta = st.V[r], st.b[r], st.T[r], st.theta[r]
    L, M, Minv, w, th, scores, members = scratch(d, K, n)
    seen = np.zeros(n, dtype=np.bool_)
    for s in range(St):
        i = io.users[r, s]
        t = io.t0 + s + 1
        members[0] = i
        size = 1
        if cfg.method == CLUB:  # the component of i (breadth first within its server)
            for j in range(lo[i], hi[i]):
                seen[j] = False
            seen[i] = True
            head = 0
            while head < size:
                v = members[head]
                head += 1
                for j in range(lo[i], hi[i]):
                    if adj[r, v, j] and not seen[j]:
                        seen[j] = True
                        members[size] = j
                        size += 1
        io.arms[r, s] = play(V, b, T, theta, i, members, size, io.contexts[r, s], io.rewards[r, s], p, t, M, w,
                             L, Minv, th, scores)
        if cfg.method == CLUB:
            fi = confidence_shape(T[i])
            for j in range(lo[i], hi[i]):
                if adj[r, i, j] and distance(theta[i], theta[j]) > alpha * (fi + confidence_shape(T[j])):
                    adj[r, i, j] = False
                    adj[r, j, i] = False


def _club_run(io, p, cfg, st):
    """:func:`_club_replicate` of every replicate (the body is a function of its own: numba's parallel loops lose
    writes made through a ``NamedTuple`` directly in their body, numba issue 7135). The index is passed as an int64:
    a parallel loop's index is unsigned, and the body would be compiled once more for it."""
    for r in prange(io.users.shape[0]):
        _club_replicate(np.int64(r), io, p, cfg, st)


@jit
def _sclub_replicate(r, io, p, cfg, st):
    """SCLUB per server in replicate ``r``: phases at rounds t = 2^s (unchecked users, cluster snapshots), recommend
    from the user's cluster, split the user off on its estimate or frequency, mark it checked, merge checked
    clusters (one pass)."""
    St = io.users.shape[1]
    K, d = io.contexts.shape[2], io.contexts.shape[3]
    n = st.V.shape[1]
    lam, alpha, alpha_p = p.base, cfg.alpha, cfg.alpha_p
    lo, hi, V, b, T, theta = st.lo, st.hi, st.V, st.b, st.T, st.theta
    cl, snapT, snapTheta, checked = st.cl, st.snapT, st.snapTheta, st.checked
    L, M, Minv, w, th, scores, members = scratch(d, K, n)
    cT = np.zeros(n)  # per cluster slot: count, estimate, size, all members checked
    cTheta = np.zeros((n, d))
    csize = np.zeros(n, dtype=np.int64)
    cchecked = np.zeros(n, dtype=np.bool_)
    slots = np.zeros(n, dtype=np.int64)
    for s in range(St):
        i = io.users[r, s]
        t = io.t0 + s + 1
        lo_i, hi_i = lo[i], hi[i]
        if t & (t - 1) == 0:  # a phase starts: everyone unchecked, every cluster's snapshot taken
            for j in range(n):
                checked[r, j] = False
                if cl[r, j] == j:
                    size = _members(cl[r], j, lo[j], hi[j], members)
                    snapT[r, j] = aggregate(V[r], b[r], T[r], members, size, lam, M, w)
                    estimate(M, w, L, snapTheta[r, j])
        c = cl[r, i]
        size = _members(cl[r], c, lo_i, hi_i, members)
        io.arms[r, s] = play(V[r], b[r], T[r], theta[r], i, members, size, io.contexts[r, s], io.rewards[r, s], p,
                             t, M, w, L, Minv, th, scores)
        # split i off its cluster c on its estimate or its arrival frequency
        size = _members(cl[r], c, lo_i, hi_i, members)
        if size > 1:
            far = distance(theta[r, i], snapTheta[r, c]) > alpha * (
                confidence_shape(T[r, i]) + confidence_shape(snapT[r, c]))
            gap = 2.0 * alpha_p * confidence_shape(float(t))
            for m in range(size):
                if abs(T[r, i] - T[r, members[m]]) / t > gap:
                    far = True
            if far:
                if c == i:  # the rest keep the snapshot under their new smallest user
                    rest = members[1] if members[0] == i else members[0]
                    for m in range(size):
                        cl[r, members[m]] = rest
                    snapT[r, rest] = snapT[r, c]
                    snapTheta[r, rest] = snapTheta[r, c]
                cl[r, i] = i
                snapT[r, i] = T[r, i]
                snapTheta[r, i] = theta[r, i]
        checked[r, i] = True
        # merge checked clusters of i's server: one pass over the pairs in slot order
        ns = 0
        for j in range(lo_i, hi_i):
            if cl[r, j] == j:
                slots[ns] = j
                ns += 1
        for m in range(ns):
            _cluster_state(V[r], b[r], T[r], cl[r], checked[r], slots[m], lo_i, hi_i, lam, members, M, w, L,
                           cT, cTheta, csize, cchecked)
        fp = alpha_p * confidence_shape(float(t))
        ia = 0
        while ia < ns:
            ca = slots[ia]
            ib = ia + 1
            while ib < ns:
                cb = slots[ib]
                if cchecked[ca] and cchecked[cb] and distance(cTheta[ca], cTheta[cb]) < 0.5 * alpha * (
                        confidence_shape(cT[ca]) + confidence_shape(cT[cb])) and abs(
                        cT[ca] / (csize[ca] * t) - cT[cb] / (csize[cb] * t)) < fp:
                    for j in range(lo_i, hi_i):
                        if cl[r, j] == cb:
                            cl[r, j] = ca
                    _cluster_state(V[r], b[r], T[r], cl[r], checked[r], ca, lo_i, hi_i, lam, members, M, w,
                                   L, cT, cTheta, csize, cchecked)
                    snapT[r, ca] = cT[ca]
                    snapTheta[r, ca] = cTheta[ca]
                    for m in range(ib, ns - 1):
                        slots[m] = slots[m + 1]
                    ns -= 1
                else:
                    ib += 1
            ia += 1


def _sclub_run(io, p, cfg, st):
    """:func:`_sclub_replicate` of every replicate (see :func:`_club_run`)."""
    for r in prange(io.users.shape[0]):
        _sclub_replicate(np.int64(r), io, p, cfg, st)


@jit
def _members(cl: np.ndarray, c: int, lo: int, hi: int, members: np.ndarray) -> int:
    """The users of cluster slot c (within its server's block) into ``members``; returns their number."""
    size = 0
    for j in range(lo, hi):
        if cl[j] == c:
            members[size] = j
            size += 1
    return size


@jit
def _cluster_state(V, b, T, cl, checked, c, lo, hi, lam, members, M, w, L, cT, cTheta, csize, cchecked):
    """Cluster slot c's count, estimate, size and whether all its users are checked."""
    size = _members(cl, c, lo, hi, members)
    cT[c] = aggregate(V, b, T, members, size, lam, M, w)
    estimate(M, w, L, cTheta[c])
    csize[c] = size
    cchecked[c] = True
    for m in range(size):
        if not checked[members[m]]:
            cchecked[c] = False


#: (serial, parallel over replicates)
CLUB_RUN = (jit(_club_run), jit(parallel_variant(_club_run), parallel=True))
SCLUB_RUN = (jit(_sclub_run), jit(parallel_variant(_sclub_run), parallel=True))
