"""A plain per-object reference for FCLUB-DC, CDP-FCLUB-DC, FCLUB and Homo/Homo-DC (Liu et al., *Federated Online
Clustering of Bandits*, UAI 2022), written from /work/shared/specs/fclub.md §2 with the corrections of §8.

It is the oracle of fedrec's FCLUB protocols and the baseline of their benchmark, so it is organised the way a
straightforward implementation would be and keeps that style's costs on purpose: one :class:`LocalCluster` and one
:class:`GlobalCluster` object each holding its own d × d arrays, a matrix inverse and log-determinants recomputed
with numpy at every decision and trigger, and Python loops over users, edges and clusters at every phase start.

Readings (spec references; each is the spec's proposal unless said otherwise):

* phases: phase s = 1, 2, … starts at round t_s = 2^s − 1 and lasts 2^s rounds (§2.2); detection and merging run at
  every phase start, renewal at s = 1 and whenever the partition changed (§2.3 "s = 0" read as the first phase);
  local clusters are identified by (server, frozenset of users), so a local split always renews (§2.3);
* deletion (eq. 3) on user estimates (λI + V_i)^{-1} b_i, merging (eq. 4) across servers on Ṽ^{-1} b̃ with the
  transitive closure as the partition (§2.3); renewal copies, never aliases (§8.6);
* triggers (eqs. 5–6) on log-determinants; a threshold of 1 always fires (FCLUB and Homo communicate every round,
  §2.7, §8.8), and nothing fires while a matrix is singular (§8.14);
* non-private (§2.7): Ṽ = λI + Σ V_i, buffers start at 0; private (Alg. 5): Ṽ = 2ρI + H₀ + Σ V_i and every buffer
  restarts at 3ρI + H − H̄, the tree noise reaching the statistics used to recommend and merge (§8.5); with
  ``noise_placement="trigger"`` (the authors' code, §8.5) Ṽ and the buffers are the non-private ones and only the
  upload trigger reads the noise, as det(S + ΔS + H − H̄) / det(S);
* recommendation on the local synchronised statistics (S, u) only (§2.2), with β of Lemma 1 and a square-root
  bonus (``bonus="sqrt"``) or β·xᵀS⁻¹x (``bonus="squared"``, the authors' code, §8.3);
* communication (§4.5): +1 per phase-start upload of a local cluster, per renewal download, per Alg. 3 upload and
  per Alg. 4 download; counted per local server in each direction.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from fedrec.privacy.tree_noise import SYMMETRIC, node_noise
from fedrec.utils.rng import stream_key

TIE_TOLERANCE = 1e-9


def F(x: float) -> float:
    """The CLUB confidence shape sqrt((1 + ln(1 + x)) / (1 + x)) of the deletion and merge tests (§2.0)."""
    return math.sqrt((1.0 + math.log1p(x)) / (1.0 + x))


def logdet(A: np.ndarray) -> float:
    """log det A, or −inf when det A ≤ 0 (no trigger fires on a singular matrix, §8.14; a noisy indefinite matrix
    with a positive determinant does, as the authors' determinant ratio does, §8.5)."""
    sign, value = np.linalg.slogdet(A)
    return value if sign > 0 else -math.inf


def dyadic_cover(i: int) -> list[tuple[int, int]]:
    """The dyadic nodes (level, index) whose sum is release i of the binary mechanism (Alg. 5, §2.6)."""
    nodes, r, level = [], i, 0
    while r:
        if r & 1:
            nodes.append((level, (i >> level)))
        r >>= 1
        level += 1
    return nodes


class Privatiser:
    """Alg. 5: release i is the sum of the cached symmetric node noises of dyadic_cover(i), split into (H, h)."""

    def __init__(self, d: int, sigma: float, seed: int, uid: int) -> None:
        self.d, self.sigma, self.seed, self.uid = d, sigma, seed, uid
        self.key = stream_key(seed, "fclub.privatiser")  # fedrec's privatisers' tree key
        self.cache: dict[tuple[int, int], np.ndarray] = {}
        self.calls = 0

    def node(self, key: tuple[int, int]) -> np.ndarray:
        """The symmetric noise (Z + Zᵀ)/√2 of dyadic node ``key``, Z i.i.d. N(0, σ²) drawn by fedrec's tree node
        noise at (the seed's privatiser key, privatiser, node), so that fedrec's kernel draws the same numbers."""
        if key not in self.cache:
            z = np.empty((self.d + 1) ** 2)
            node_noise(self.key, self.uid, key[0], key[1], SYMMETRIC, self.sigma, z)
            self.cache[key] = z.reshape(self.d + 1, self.d + 1)
        return self.cache[key]

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        N = sum((self.node(k) for k in dyadic_cover(self.calls)), np.zeros((self.d + 1, self.d + 1)))
        return N[: self.d, : self.d].copy(), N[: self.d, self.d].copy()


@dataclass
class LocalCluster:
    """A local cluster (ℓ, j): its users, synchronised statistics, upload and download buffers and noise."""

    server: int
    users: frozenset
    S: np.ndarray
    u: np.ndarray
    T: float = 0.0
    dS: np.ndarray | None = None
    du: np.ndarray | None = None
    dT: float = 0.0
    dSm: np.ndarray | None = None
    dum: np.ndarray | None = None
    dTm: float = 0.0
    H: np.ndarray | None = None
    h: np.ndarray | None = None
    Hbar: np.ndarray | None = None
    hbar: np.ndarray | None = None
    pvt: Privatiser | None = None
    upload: tuple[np.ndarray, np.ndarray, float] | None = None  # this phase's (Ṽ, b̃, T̃)
    candidate: tuple[Privatiser, np.ndarray, np.ndarray] | None = None  # this phase's fresh PVT and (H₀, h₀)

    @property
    def key(self) -> tuple[int, frozenset]:
        return self.server, self.users


@dataclass
class GlobalCluster:
    """A global cluster: its local clusters (in order) and the global statistics (S^g, u^g, T^g)."""

    members: list[LocalCluster]
    S: np.ndarray
    u: np.ndarray
    T: float = 0.0
    keys: frozenset = field(default_factory=frozenset)


class RefFCLUB:
    """One stream of FCLUB-DC / CDP-FCLUB-DC / FCLUB / Homo(-DC) on users ``servers`` (server of each user).

    Args:
        servers: (n,) local server of each user.
        dim: d.
        U, D: upload / download thresholds on the determinant ratios (1: every round, FCLUB / Homo).
        lam: ridge λ (user estimates, and the non-private Ṽ).
        delete, merge: α₁ and α₂ of eqs. 3–4.
        pooled: Homo(-DC): one global cluster of one local cluster per server, no deletion or merge.
        bonus: ``sqrt`` (the paper) or ``squared`` (the authors' code).
        beta: a fixed β, or None for Lemma 1's (σ₀, α, m as the algorithm's bound on the clusters, T).
        epsilon, delta, horizon: CDP-FCLUB-DC when epsilon is not None (ν from ``horizon`` uploads).
        noise_placement: ``statistics`` (the noise in Ṽ and the buffers) or ``trigger`` (only in eq. 5's reading).
        seed, replicate: the keys of the privatisers' counter-based noise.
    """

    def __init__(
        self, servers: np.ndarray, dim: int, U: float = 1.01, D: float = 1.01, lam: float = 1.0,
        delete: float = 1.5, merge: float = 2.0, pooled: bool = False, bonus: str = "sqrt",
        beta: float | None = None, sigma0: float = 0.5, alpha: float = 0.1, clusters_bound: int = 4,
        epsilon: float | None = None, delta: float = 0.1, horizon: int = 100_000, seed: int = 0, replicate: int = 0,
        authors: bool = False, noise_placement: str = "statistics",
    ) -> None:
        self.servers = np.asarray(servers)
        self.n, self.d = len(self.servers), dim
        self.L = int(self.servers.max()) + 1
        self.U, self.D, self.lam, self.a1, self.a2 = U, D, lam, delete, merge
        self.pooled, self.bonus, self.beta_fixed = pooled, bonus, beta
        self.sigma0, self.alpha, self.m = sigma0, alpha, clusters_bound
        self.private, self.seed = epsilon is not None, seed
        self.trigger = self.private and noise_placement == "trigger"
        self.authors, self.epsilon, self.delta, self.horizon = authors, epsilon, delta, horizon
        d = dim
        if self.private:
            nu = math.ceil(math.log2(horizon + 1)) + 1
            self.sigma_node = math.sqrt(64 * nu * math.log(2 / delta) ** 2 / epsilon ** 2)
            self.rho = 8 * math.sqrt(2) * nu * math.log(4 / delta) * (4 * math.sqrt(d) + 2 * math.log(
                2 * self.m * self.L / alpha)) / epsilon
            self.rho_max = 3 * self.rho + 3 * self.rho * d * math.log(horizon) / math.log(min(U, D)) \
                if min(U, D) > 1 else math.inf
            self.kappa = math.sqrt(2 * nu) * (math.sqrt(d) + 2 * math.log(2 * self.m * self.L / alpha)) \
                / math.sqrt(2 * epsilon)
        self.V = np.zeros((self.n, d, d))
        self.b = np.zeros((self.n, d))
        self.Tu = np.zeros(self.n)
        self.edges = [{j for j in range(self.n) if j != i and self.servers[j] == self.servers[i]}
                      for i in range(self.n)]
        self.locals: list[LocalCluster] = []
        self.globals: list[GlobalCluster] = []
        self.partition: frozenset | None = None
        self.uploads = np.zeros(self.L, dtype=np.int64)
        self.downloads = np.zeros(self.L, dtype=np.int64)
        self.t = 0  # rounds played
        self.phase = 0
        self._uid = replicate << 32  # privatiser keys: the replicate in the high bits, as fedrec numbers them

    # ---------------------------------------------------------------------------------------------- helpers
    def cluster_of(self, user: int) -> tuple[LocalCluster, GlobalCluster]:
        for g in self.globals:
            for c in g.members:
                if user in c.users:
                    return c, g
        raise AssertionError(f"user {user} in no cluster")

    def beta(self, c: LocalCluster, Lp: int) -> float:
        """Lemma 1's radius (non-private: the λ form of §2.7), the authors' (§4.2, §8.4), or the fixed ``beta``."""
        if self.beta_fixed is not None:
            return self.beta_fixed
        d = self.d
        if self.authors and not self.private:  # 0.5 sqrt(2 ln(2/α) + d ln(3 + t L_arg²/d)), α = 1.5, L_arg = L if U=D=1
            l_arg = self.L if self.U == self.D == 1.0 else 1
            return 0.5 * math.sqrt(2 * math.log(2 / 1.5) + d * math.log(3 + self.t * l_arg ** 2 / d))
        if self.authors:  # the code's CDP recipe × 0.005: ν = ln T_c + 1, ln(2T/α₁), α₁ = 1, σ₀ = 1, L, λ = 1
            nu = math.log(max(c.T, 1.0)) + 1
            log_term = math.log(2 * self.horizon / 1.0)
            rho = 8 * math.sqrt(2) * nu * math.log(4 / self.delta) * (4 * math.sqrt(d) + 2 * log_term) / self.epsilon
            kappa = math.sqrt(2 * nu * (math.sqrt(d) + 2 * log_term) / math.sqrt(2 * self.epsilon))
            return 0.005 * (math.sqrt(2 * log_term + d * math.log(1 + c.T / (d * self.L * 1.0)))
                            + math.sqrt(self.L * rho) + math.sqrt(self.L) * kappa)
        if not self.private:
            return self.sigma0 * math.sqrt(2 * math.log(self.m * self.L / self.alpha)
                                           + d * math.log(1 + c.T / (d * Lp * self.lam))) + math.sqrt(Lp * self.lam)
        return self.sigma0 * math.sqrt(2 * math.log(self.m * self.L / self.alpha) + d * math.log(
            self.rho_max / self.rho + c.T / (d * Lp * self.rho))) + math.sqrt(Lp * self.rho_max) \
            + math.sqrt(Lp) * self.kappa

    def _fresh_privatiser(self) -> Privatiser:
        self._uid += 1
        return Privatiser(self.d, self.sigma_node, self.seed, self._uid)

    # ---------------------------------------------------------------------------------------------- Alg. 2
    def detect_and_adjust(self) -> None:
        """Phase start: delete edges, find local clusters, upload their aggregates, merge, renew (Alg. 2)."""
        d = self.d
        if not self.pooled:
            theta = [np.linalg.solve(self.lam * np.eye(d) + self.V[i], self.b[i]) for i in range(self.n)]
            for i in range(self.n):
                for j in sorted(self.edges[i]):
                    if j > i and np.linalg.norm(theta[i] - theta[j]) > self.a1 * (F(self.Tu[i]) + F(self.Tu[j])):
                        self.edges[i].discard(j)
                        self.edges[j].discard(i)
        components = self._components()
        old = {c.key: c for c in self.locals}
        fresh: list[LocalCluster] = []
        for server, users in components:
            c = old.get((server, users))
            if c is None:
                c = LocalCluster(server, users, np.zeros((d, d)), np.zeros(d))
            idx = sorted(users)
            Vt, bt = self.V[idx].sum(0), self.b[idx].sum(0)
            if self.private:
                pvt = self._fresh_privatiser()
                H0, h0 = pvt.next()
                c.candidate = (pvt, H0, h0)
                c.upload = (self.lam * np.eye(d) + Vt, bt, self.Tu[idx].sum()) if self.trigger else (
                    2 * self.rho * np.eye(d) + H0 + Vt, h0 + bt, self.Tu[idx].sum())
            else:
                c.upload = (self.lam * np.eye(d) + Vt, bt, self.Tu[idx].sum())
            self.uploads[server] += 1
            fresh.append(c)
        groups = self._merge(fresh)
        partition = frozenset(frozenset(c.key for c in g) for g in groups)
        if self.phase == 1 or partition != self.partition:
            self.globals = []
            for group in groups:
                S = sum((c.upload[0] for c in group), np.zeros((d, d)))
                u = sum((c.upload[1] for c in group), np.zeros(d))
                T = sum(c.upload[2] for c in group)
                for c in group:
                    c.S, c.u, c.T = S.copy(), u.copy(), T
                    self.downloads[c.server] += 1
                    c.dSm, c.dum, c.dTm = np.zeros((d, d)), np.zeros(d), 0.0
                    if self.private:
                        c.pvt, c.Hbar, c.hbar = c.candidate
                        c.H, c.h = c.pvt.next()
                    if self.private and not self.trigger:
                        c.dS, c.du = 3 * self.rho * np.eye(d) + c.H - c.Hbar, c.h - c.hbar
                    else:
                        c.dS, c.du = np.zeros((d, d)), np.zeros(d)
                    c.dT = 0.0
                self.globals.append(GlobalCluster(list(group), S, u, T, frozenset(c.key for c in group)))
            self.locals, self.partition = fresh, partition
        for c in self.locals:
            c.upload = c.candidate = None

    def _components(self) -> list[tuple[int, frozenset]]:
        """Connected components of every server's user graph (Homo: the whole server), by smallest user."""
        seen, out = set(), []
        for i in range(self.n):
            if i in seen:
                continue
            stack, comp = [i], set()
            while stack:
                v = stack.pop()
                if v in comp:
                    continue
                comp.add(v)
                nbrs = (j for j in range(self.n) if self.servers[j] == self.servers[i]) if self.pooled \
                    else self.edges[v]
                stack.extend(j for j in nbrs if j not in comp)
            seen |= comp
            out.append((int(self.servers[i]), frozenset(comp)))
        return out

    def _merge(self, fresh: list[LocalCluster]) -> list[list[LocalCluster]]:
        """Global clusters: connected components of the cross-server merge graph of eq. 4 (Homo: all in one)."""
        if self.pooled:
            return [fresh]
        theta = [np.linalg.solve(c.upload[0], c.upload[1]) for c in fresh]
        parent = list(range(len(fresh)))

        def root(a: int) -> int:
            while parent[a] != a:
                a = parent[a]
            return a

        for a in range(len(fresh)):
            for b in range(a + 1, len(fresh)):
                if fresh[a].server == fresh[b].server:
                    continue
                gap = self.a2 * (F(fresh[a].upload[2]) + F(fresh[b].upload[2]))
                if np.linalg.norm(theta[a] - theta[b]) < gap:
                    parent[root(b)] = root(a)
        groups: dict[int, list[LocalCluster]] = {}
        for a, c in enumerate(fresh):
            groups.setdefault(root(a), []).append(c)
        return list(groups.values())

    # ---------------------------------------------------------------------------------------------- a round
    def step(self, user: int, items: np.ndarray, rewards: np.ndarray) -> int:
        """One round (Alg. 1 l.9–15) for ``user`` on ``items`` (K, d) with rewards (K,): the arm played."""
        self.t += 1
        if self.t == 2 ** (self.phase + 1) - 1:  # the first round of the next phase
            self.phase += 1
            self.detect_and_adjust()
        c, g = self.cluster_of(user)
        Sinv = np.linalg.inv(c.S)
        theta = Sinv @ c.u
        width = np.einsum("kd,de,ke->k", items, Sinv, items)
        beta = self.beta(c, len(g.members))
        scores = items @ theta + beta * (np.sqrt(width) if self.bonus == "sqrt" else width)
        arm = int(np.flatnonzero(scores >= scores.max() - TIE_TOLERANCE)[0])
        x, y = items[arm], float(rewards[arm])
        self.V[user] += np.outer(x, x)
        self.b[user] += y * x
        self.Tu[user] += 1
        self.check_upload(c, g, x, y)
        self.check_download(g)
        return arm

    def fires(self, new: np.ndarray, old: np.ndarray, threshold: float) -> bool:
        """det(new) / det(old) ≥ threshold on log-determinants (always with threshold 1; never when singular)."""
        if threshold <= 1.0:
            return True
        a, b = logdet(new), logdet(old)
        return math.isfinite(a) and math.isfinite(b) and a - b >= math.log(threshold)

    def check_upload(self, c: LocalCluster, g: GlobalCluster, x: np.ndarray, y: float) -> None:
        """Alg. 3: buffer (x, y); on eq. 5 send the buffer to the global cluster and the other members' queues."""
        c.dS, c.du, c.dT = c.dS + np.outer(x, x), c.du + y * x, c.dT + 1
        noise = c.H - c.Hbar if self.trigger else 0.0
        if not self.fires(c.S + c.dS + noise, c.S, self.U):
            return
        self.uploads[c.server] += 1
        g.S, g.u, g.T = g.S + c.dS, g.u + c.du, g.T + c.dT
        for o in g.members:
            if o is not c:
                o.dSm, o.dum, o.dTm = o.dSm + c.dS, o.dum + c.du, o.dTm + c.dT
        c.S, c.u, c.T = c.S + c.dS, c.u + c.du, c.T + c.dT
        if self.private:
            c.Hbar, c.hbar = c.H, c.h
            c.H, c.h = c.pvt.next()
        if self.private and not self.trigger:
            c.dS, c.du = 3 * self.rho * np.eye(self.d) + c.H - c.Hbar, c.h - c.hbar
        else:
            c.dS, c.du = np.zeros((self.d, self.d)), np.zeros(self.d)
        c.dT = 0.0

    def check_download(self, g: GlobalCluster) -> None:
        """Alg. 4: every member whose S lags S^g by eq. 6 takes its queued increments."""
        for c in g.members:
            if self.fires(g.S, c.S, self.D):
                self.downloads[c.server] += 1
                c.S, c.u, c.T = c.S + c.dSm, c.u + c.dum, c.T + c.dTm
                c.dSm, c.dum, c.dTm = np.zeros((self.d, self.d)), np.zeros(self.d), 0.0

    def run(self, users: np.ndarray, items: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Rounds t = 1..len(users): arms (S,) for users (S,), items (S, K, d) and rewards (S, K)."""
        return np.array([self.step(int(i), x, r) for i, x, r in zip(users, items, rewards)])
