"""A plain per-object reference for the three non-federated baselines of the FCLUB comparison: per-user LinUCB,
CLUB per local server and SCLUB per local server (Liu et al., UAI 2022, §5; spec /work/shared/specs/fclub.md
§2.8 and §4.2), written from the contract /work/notes/club_semantics.md.

It is the oracle the compiled baselines are tested against arm for arm, and the slow baseline of their benchmark,
so it is organised the way a straightforward implementation would be and keeps that style's costs on purpose: one
:class:`User` object per user holding its own d × d statistics, a matrix inverse recomputed with numpy at every
decision and every estimate, an explicit adjacency set per user (CLUB) searched by breadth-first search every
round, and a Python list of :class:`Cluster` objects per server (SCLUB) scanned every round.

Readings (club_semantics.md; each is the contract's unless said otherwise):

* rounds t = 1, 2, … (1-indexed); the t given to β(count, t) and used by the frequencies is the current round;
* no communication: every local server runs its own copy on its own users (``servers`` gives the server of each
  user; blocks need not be contiguous here);
* user statistics V_i, b_i, T_i start at 0; θ̂_i = (λI + V_i)⁻¹ b_i; a set C of users is scored on
  M_C = λI + Σ_{j∈C} V_j (λ counted once), w_C = Σ b_j, T_C = Σ T_j, θ̂_C = M_C⁻¹ w_C;
* score_a = x_aᵀθ̂_C + β(T_C, t)·g(max(0, x_aᵀM_C⁻¹x_a)), g = sqrt (``bonus="sqrt"``) or the identity
  (``bonus="squared"``); the chosen arm is the first index whose score is ≥ max − 1e-9; only that arm's reward
  is observed and only user i_t is updated;
* LinUCB: C = {i_t};
* CLUB: the graph of each server starts complete; C = the connected component of i_t read before this round's
  update; after the update every current neighbour j of i_t is tested on the updated θ̂'s and the edge is deleted
  when ‖θ̂_{i_t} − θ̂_j‖ > α (F(T_{i_t}) + F(T_j)) (strict; edges are never added back);
* SCLUB, per round t:
  1. t a power of two: every user (all servers) unchecked, every cluster's snapshot (T̃, θ̃) := its current
     (T_c, θ̂_c), before this round's play;
  2. C = the cluster c of i_t; recommend; update i_t;
  3. split when |c| > 1 and (‖θ̂_i − θ̃_c‖ > α (F(T_i) + F(T̃_c)) or max_{j∈c} |p_i − p_j| > 2 α_p F(t)), with
     p_j = T_j / t after the update and c still holding i; i forms {i} with snapshot (T_i, θ̂_i), c ∖ {i} keeps
     c's snapshot;
  4. i is marked checked (whether it split or not);
  5. one merge pass over the clusters of server ℓ(i_t) only, in the order of the contract's pseudo-code (slots
     sorted by smallest user; a merged cluster stays in a's slot and is compared with the later slots on its new
     aggregates; visited pairs are not revisited): b merges into a when both are checked (all their users
     checked), ‖θ̂_a − θ̂_b‖ < (α/2)(F(T_a) + F(T_b)) and |p_a − p_b| < α_p F(t), p_c = T_c / (|c| t). The merged
     cluster's aggregates are the sums of its users' statistics (so λI once, as for any set of users), and its
     snapshot becomes its current (T, θ̂).
* :meth:`RefBaseline.partition` labels each user by the smallest user of its cluster (LinUCB: itself; CLUB: its
  connected component; SCLUB: its cluster object).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tests.reference.fclub import TIE_TOLERANCE, F

METHODS = ("linucb", "club", "sclub")


def paper_beta(sigma0: float, alpha: float, clusters: int, servers: int, dim: int,
               lam: float) -> Callable[[float, int], float]:
    """σ0·sqrt(2 ln(mL/α) + d ln(1 + count/(dλ))) + √λ (ignores t)."""

    def beta(count: float, t: int) -> float:
        return sigma0 * math.sqrt(2.0 * math.log(clusters * servers / alpha)
                                  + dim * math.log(1.0 + count / (dim * lam))) + math.sqrt(lam)

    return beta


def is_power_of_two(t: int) -> bool:
    return t >= 1 and (t & (t - 1)) == 0


@dataclass
class User:
    """One user's ridge statistics: V = Σ x xᵀ, b = Σ y x, T = number of plays (λ is added when estimating)."""

    uid: int
    server: int
    V: np.ndarray
    b: np.ndarray
    T: int = 0
    checked: bool = False  # SCLUB only

    def update(self, x: np.ndarray, y: float) -> None:
        self.V += np.outer(x, x)
        self.b += y * x
        self.T += 1

    def theta(self, lam: float) -> np.ndarray:
        """θ̂_i = (λI + V_i)⁻¹ b_i."""
        return np.linalg.inv(lam * np.eye(len(self.b)) + self.V) @ self.b


@dataclass
class Cluster:
    """An SCLUB cluster: its users and its phase snapshot (T̃, θ̃)."""

    users: set[int]
    snap_T: int
    snap_theta: np.ndarray  # the aggregates are not stored: they are summed from the users when needed

    @property
    def smallest(self) -> int:
        return min(self.users)


class RefBaseline:
    """One stream of per-user LinUCB, CLUB per server or SCLUB per server.

    Args:
        method: ``linucb``, ``club`` or ``sclub``.
        servers: (n,) local server of each user.
        dim: d.
        lam: ridge λ.
        beta: β(count of the recommending set, t).
        bonus: ``sqrt`` (β·sqrt(xᵀM⁻¹x)) or ``squared`` (β·xᵀM⁻¹x).
        alpha: CLUB's deletion constant (authors 0.25) / SCLUB's α (authors 1.5).
        alpha_p: SCLUB's frequency constant α_p (authors 1).
    """

    def __init__(self, method: str, servers: np.ndarray, dim: int, lam: float, beta: Callable[[float, int], float],
                 bonus: str = "sqrt", alpha: float = 0.25, alpha_p: float = 1.0) -> None:
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if bonus not in ("sqrt", "squared"):
            raise ValueError(f"bonus must be 'sqrt' or 'squared', got {bonus!r}")
        self.method, self.d, self.lam, self.beta, self.bonus = method, dim, lam, beta, bonus
        self.alpha, self.alpha_p = alpha, alpha_p
        self.servers = np.asarray(servers, dtype=np.int64)
        self.n = len(self.servers)
        self.users = [User(i, int(self.servers[i]), np.zeros((dim, dim)), np.zeros(dim)) for i in range(self.n)]
        self.members: dict[int, list[int]] = {}  # server -> its users, ascending
        for i in range(self.n):
            self.members.setdefault(int(self.servers[i]), []).append(i)
        self.t = 0  # rounds played
        # CLUB: each server's graph starts complete
        self.adj: dict[int, set[int]] = {}
        if method == "club":
            self.adj = {i: {j for j in self.members[int(self.servers[i])] if j != i} for i in range(self.n)}
        # SCLUB: each server starts as one cluster of all its users
        self.clusters: dict[int, list[Cluster]] = {}
        if method == "sclub":
            self.clusters = {s: [Cluster(set(us), 0, np.zeros(dim))] for s, us in self.members.items()}

    # ------------------------------------------------------------------------------------------ aggregates
    def aggregate(self, users) -> tuple[np.ndarray, np.ndarray, int]:
        """(M_C, w_C, T_C) = (λI + Σ V_j, Σ b_j, Σ T_j) over the users C."""
        M = self.lam * np.eye(self.d)
        w = np.zeros(self.d)
        T = 0
        for j in sorted(users):
            M = M + self.users[j].V
            w = w + self.users[j].b
            T += self.users[j].T
        return M, w, T

    def estimate(self, users) -> tuple[np.ndarray, int]:
        """(θ̂_C, T_C) of a set of users, with a fresh numpy inverse."""
        M, w, T = self.aggregate(users)
        return np.linalg.inv(M) @ w, T

    # ------------------------------------------------------------------------------------------ a round
    def step(self, user: int, contexts: np.ndarray, rewards: np.ndarray) -> int:
        """Round t = self.t + 1 for ``user`` on ``contexts`` (K, d) with rewards (K,): the arm played."""
        self.t += 1
        user = int(user)
        if self.method == "sclub" and is_power_of_two(self.t):
            self.start_phase()
        if self.method == "linucb":
            C = {user}
        elif self.method == "club":
            C = self.component(user)
        else:
            cluster = self.cluster_of(user)
            C = set(cluster.users)
        arm = self.choose(C, np.asarray(contexts, dtype=np.float64))
        x = np.asarray(contexts[arm], dtype=np.float64)
        self.users[user].update(x, float(rewards[arm]))
        if self.method == "club":
            self.delete_edges(user)
        elif self.method == "sclub":
            self.split(user, cluster)
            self.users[user].checked = True
            self.merge(self.users[user].server)
        return arm

    def choose(self, C: set[int], contexts: np.ndarray) -> int:
        """UCB on the aggregate of C: the first arm whose score is within 1e-9 of the best."""
        M, w, T = self.aggregate(C)
        Minv = np.linalg.inv(M)
        theta = Minv @ w
        beta = self.beta(float(T), self.t)
        scores = np.empty(len(contexts))
        for a, x in enumerate(contexts):
            width = max(0.0, float(x @ Minv @ x))
            bonus = math.sqrt(width) if self.bonus == "sqrt" else width
            scores[a] = float(x @ theta) + beta * bonus
        return int(np.flatnonzero(scores >= scores.max() - TIE_TOLERANCE)[0])

    def run(self, users: np.ndarray, items: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Rounds t = 1..len(users): arms (T,) for users (T,), items (T, K, d) and rewards (T, K)."""
        return np.array([self.step(int(i), x, r) for i, x, r in zip(users, items, rewards)], dtype=np.int64)

    # ------------------------------------------------------------------------------------------ CLUB
    def component(self, user: int) -> set[int]:
        """The connected component of ``user`` in its server's graph, by breadth-first search."""
        seen = {user}
        queue = deque([user])
        while queue:
            v = queue.popleft()
            for j in self.adj[v]:
                if j not in seen:
                    seen.add(j)
                    queue.append(j)
        return seen

    def delete_edges(self, i: int) -> None:
        """Delete (i, j) for every current neighbour j with ‖θ̂_i − θ̂_j‖ > α (F(T_i) + F(T_j)) (updated θ̂)."""
        ui = self.users[i]
        theta_i = ui.theta(self.lam)
        for j in sorted(self.adj[i]):
            uj = self.users[j]
            if np.linalg.norm(theta_i - uj.theta(self.lam)) > self.alpha * (F(ui.T) + F(uj.T)):
                self.adj[i].discard(j)
                self.adj[j].discard(i)

    def edges(self) -> set[tuple[int, int]]:
        """The current edges (i, j), i < j, of all servers' graphs (CLUB)."""
        return {(i, j) for i in self.adj for j in self.adj[i] if i < j}

    # ------------------------------------------------------------------------------------------ SCLUB
    def cluster_of(self, user: int) -> Cluster:
        for c in self.clusters[int(self.servers[user])]:
            if user in c.users:
                return c
        raise AssertionError(f"user {user} in no cluster")

    def start_phase(self) -> None:
        """t a power of two: every user unchecked, every cluster's snapshot := its current (T, θ̂)."""
        for u in self.users:
            u.checked = False
        for server_clusters in self.clusters.values():
            for c in server_clusters:
                c.snap_theta, c.snap_T = self.estimate(c.users)

    def frequency(self, user: int) -> float:
        return self.users[user].T / self.t

    def cluster_frequency(self, c: Cluster) -> float:
        return sum(self.users[j].T for j in c.users) / (len(c.users) * self.t)

    def split(self, i: int, c: Cluster) -> None:
        """Step 3: i leaves c on the snapshot test or the frequency test."""
        if len(c.users) <= 1:
            return
        ui = self.users[i]
        theta_i = ui.theta(self.lam)
        far = np.linalg.norm(theta_i - c.snap_theta) > self.alpha * (F(ui.T) + F(c.snap_T))
        p_i = self.frequency(i)
        gap = max(abs(p_i - self.frequency(j)) for j in c.users)
        if far or gap > 2.0 * self.alpha_p * F(self.t):
            c.users.discard(i)
            self.clusters[ui.server].append(Cluster({i}, ui.T, theta_i))

    def is_checked(self, c: Cluster) -> bool:
        return all(self.users[j].checked for j in c.users)

    def mergeable(self, a: Cluster, b: Cluster) -> bool:
        if not (self.is_checked(a) and self.is_checked(b)):
            return False
        theta_a, T_a = self.estimate(a.users)
        theta_b, T_b = self.estimate(b.users)
        close = np.linalg.norm(theta_a - theta_b) < (self.alpha / 2.0) * (F(T_a) + F(T_b))
        freq_close = abs(self.cluster_frequency(a) - self.cluster_frequency(b)) < self.alpha_p * F(self.t)
        return bool(close and freq_close)

    def merge(self, server: int) -> None:
        """Step 5: one pass over the server's clusters in the order of the contract's pseudo-code."""
        slots = sorted(self.clusters[server], key=lambda c: c.smallest)
        ia = 0
        while ia < len(slots):
            a = slots[ia]
            ib = ia + 1
            while ib < len(slots):
                b = slots[ib]
                if self.mergeable(a, b):
                    a.users |= b.users
                    a.snap_theta, a.snap_T = self.estimate(a.users)
                    slots.pop(ib)  # ib not advanced
                else:
                    ib += 1
            ia += 1
        self.clusters[server] = slots

    # ------------------------------------------------------------------------------------------ partition
    def partition(self) -> np.ndarray:
        """(n,) label of each user's cluster: the smallest user in it."""
        labels = np.empty(self.n, dtype=np.int64)
        if self.method == "linucb":
            labels[:] = np.arange(self.n)
        elif self.method == "club":
            for i in range(self.n):
                labels[i] = min(self.component(i))
        else:
            for server_clusters in self.clusters.values():
                for c in server_clusters:
                    labels[sorted(c.users)] = c.smallest
        return labels
