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

from fedrec.protocols.kernels.clustering import ClusterParams, beta, confidence_shape, ucb_pick
from fedrec.protocols.kernels.linalg import cholesky_logdet, cholesky_solve, inverse_from_cholesky
from fedrec.utils.jit import BOOL, F64, I64, jit, over_replicates

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


class UserStats(NamedTuple):
    """One replicate's user statistics (views of :class:`LocalState`'s fields of the same names at the replicate)."""

    V: np.ndarray  #: (n, d, d)
    b: np.ndarray  #: (n, d)
    T: np.ndarray  #: (n,)
    theta: np.ndarray  #: (n, d)


class Work(NamedTuple):
    """One replicate's scratch: a Cholesky factor, an aggregate M and its inverse (d × d), a moment w and an estimate
    (d), the arms' scores (K) and a list of members (n)."""

    L: np.ndarray
    M: np.ndarray
    Minv: np.ndarray
    w: np.ndarray
    th: np.ndarray
    scores: np.ndarray
    members: np.ndarray


class SlotStats(NamedTuple):
    """SCLUB's per cluster slot state of one replicate: the slot of each user and which users are checked (views of
    :class:`LocalState`'s ``cl`` and ``checked``), and each slot's count, estimate, size and whether all its users
    are checked (scratch)."""

    cl: np.ndarray
    checked: np.ndarray
    cT: np.ndarray
    cTheta: np.ndarray
    csize: np.ndarray
    cchecked: np.ndarray


@jit
def aggregate(users: UserStats, members: np.ndarray, size: int, lam: float, M: np.ndarray, w: np.ndarray) -> float:
    """M = λI + Σ V_j and w = Σ b_j over ``members[:size]``; returns Σ T_j."""
    d = w.shape[0]
    V, b, T = users.V, users.b, users.T
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
def observe(users: UserStats, i: int, x: np.ndarray, y: float) -> None:
    """User i's statistics take (x, y)."""
    d = x.shape[0]
    for p in range(d):
        users.b[i, p] += y * x[p]
        for q in range(d):
            users.V[i, p, q] += x[p] * x[q]
    users.T[i] += 1.0


@jit
def scratch(d: int, K: int, n: int) -> Work:
    """Fresh scratch for a replicate of dimension ``d`` with ``K`` arms and ``n`` users."""
    return Work(np.zeros((d, d)), np.zeros((d, d)), np.zeros((d, d)), np.zeros(d), np.zeros(d), np.zeros(K),
                np.zeros(n, dtype=np.int64))


@jit
def play(users: UserStats, i: int, size: int, ctx: np.ndarray, rew: np.ndarray, p: ClusterParams, t: int,
         work: Work) -> int:
    """Recommend to user i from the aggregate of ``work.members[:size]``, observe the arm's reward, refresh θ̂_i."""
    M, w, L, members = work.M, work.w, work.L, work.members
    d = w.shape[0]
    count = aggregate(users, members, size, p.base, M, w)
    cholesky_logdet(M, 0.0, L)
    inverse_from_cholesky(L, work.Minv)
    a = ucb_pick(ctx, work.Minv, w, beta(p, count, 1, d, t), p.squared, work.th, work.scores)
    observe(users, i, ctx[a], rew[a])
    members[0] = i
    aggregate(users, members, 1, p.base, M, w)
    estimate(M, w, L, users.theta[i])
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
    users = UserStats(st.V[r], st.b[r], st.T[r], st.theta[r])
    T, theta = users.T, users.theta
    work = scratch(d, K, n)
    members = work.members
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
        io.arms[r, s] = play(users, i, size, io.contexts[r, s], io.rewards[r, s], p, t, work)
        if cfg.method == CLUB:
            fi = confidence_shape(T[i])
            for j in range(lo[i], hi[i]):
                if adj[r, i, j] and distance(theta[i], theta[j]) > alpha * (fi + confidence_shape(T[j])):
                    adj[r, i, j] = False
                    adj[r, j, i] = False


@jit
def _sclub_replicate(r, io, p, cfg, st):
    """SCLUB per server in replicate ``r``: phases at rounds t = 2^s (unchecked users, cluster snapshots), recommend
    from the user's cluster, split the user off on its estimate or frequency, mark it checked, merge checked
    clusters (one pass)."""
    St = io.users.shape[1]
    K, d = io.contexts.shape[2], io.contexts.shape[3]
    n = st.V.shape[1]
    lam, alpha, alpha_p = p.base, cfg.alpha, cfg.alpha_p
    lo, hi = st.lo, st.hi
    users = UserStats(st.V[r], st.b[r], st.T[r], st.theta[r])
    T, theta = users.T, users.theta
    snapT, snapTheta = st.snapT[r], st.snapTheta[r]
    work = scratch(d, K, n)
    L, M, w, members = work.L, work.M, work.w, work.members
    cs = SlotStats(st.cl[r], st.checked[r], np.zeros(n), np.zeros((n, d)), np.zeros(n, dtype=np.int64),
                   np.zeros(n, dtype=np.bool_))
    cl, checked, cT, cTheta, csize, cchecked = cs
    slots = np.zeros(n, dtype=np.int64)
    for s in range(St):
        i = io.users[r, s]
        t = io.t0 + s + 1
        lo_i, hi_i = lo[i], hi[i]
        if t & (t - 1) == 0:  # a phase starts: everyone unchecked, every cluster's snapshot taken
            for j in range(n):
                checked[j] = False
                if cl[j] == j:
                    size = _members(cl, j, lo[j], hi[j], members)
                    snapT[j] = aggregate(users, members, size, lam, M, w)
                    estimate(M, w, L, snapTheta[j])
        c = cl[i]
        size = _members(cl, c, lo_i, hi_i, members)
        io.arms[r, s] = play(users, i, size, io.contexts[r, s], io.rewards[r, s], p, t, work)
        # split i off its cluster c on its estimate or its arrival frequency
        size = _members(cl, c, lo_i, hi_i, members)
        if size > 1:
            far = distance(theta[i], snapTheta[c]) > alpha * (
                confidence_shape(T[i]) + confidence_shape(snapT[c]))
            gap = 2.0 * alpha_p * confidence_shape(float(t))
            for m in range(size):
                if abs(T[i] - T[members[m]]) / t > gap:
                    far = True
            if far:
                if c == i:  # the rest keep the snapshot under their new smallest user
                    rest = members[1] if members[0] == i else members[0]
                    for m in range(size):
                        cl[members[m]] = rest
                    snapT[rest] = snapT[c]
                    snapTheta[rest] = snapTheta[c]
                cl[i] = i
                snapT[i] = T[i]
                snapTheta[i] = theta[i]
        checked[i] = True
        # merge checked clusters of i's server: one pass over the pairs in slot order
        ns = 0
        for j in range(lo_i, hi_i):
            if cl[j] == j:
                slots[ns] = j
                ns += 1
        for m in range(ns):
            _cluster_state(users, cs, slots[m], lo_i, hi_i, lam, work)
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
                        if cl[j] == cb:
                            cl[j] = ca
                    _cluster_state(users, cs, ca, lo_i, hi_i, lam, work)
                    snapT[ca] = cT[ca]
                    snapTheta[ca] = cTheta[ca]
                    for m in range(ib, ns - 1):
                        slots[m] = slots[m + 1]
                    ns -= 1
                else:
                    ib += 1
            ia += 1


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
def _cluster_state(users: UserStats, cs: SlotStats, c: int, lo: int, hi: int, lam: float, work: Work) -> None:
    """Cluster slot c's count, estimate, size and whether all its users are checked, into ``cs``."""
    members = work.members
    size = _members(cs.cl, c, lo, hi, members)
    cs.cT[c] = aggregate(users, members, size, lam, work.M, work.w)
    estimate(work.M, work.w, work.L, cs.cTheta[c])
    cs.csize[c] = size
    cs.cchecked[c] = True
    for m in range(size):
        if not cs.checked[members[m]]:
            cs.cchecked[c] = False


#: (serial, parallel over replicates), called as ``kernel(replicates, io, p, cfg, st)``
CLUB_RUN = over_replicates(_club_replicate)
SCLUB_RUN = over_replicates(_sclub_replicate)
