"""A plain per-agent Python reference for Gossip_UCB (Algorithm 1) and Fed_UCB (Algorithms 2–4) of Zhu et al.,
*Federated Bandit: A Gossiping Approach* (SIGMETRICS 2021), written from /work/shared/specs/gossip.md §2.3–2.7.

It is the baseline of scripts/bench_gossip.py, so it is organised the way a straightforward per-agent
implementation would be, and keeps that style's costs on purpose:

* one :class:`RefAgent` object per agent holding per-arm Python lists (own count n, max-count estimate ñ, running
  sum S, sample mean X̃, gossiped estimate ϑ) and, for Fed_UCB, the pull times and prefix sums of each arm's
  stream X̂ and a dict of cached Laplace noises keyed by (arm, dyadic interval (q, e]);
* each round is a Python loop over agents and arms: count propagation by looping over the neighbours, the
  consistency rule, the UCB index of eq. 11 / eq. 12 arm by arm, the pull, the (noisy) sample mean, and the
  pairwise gossip on one uniformly random edge.

Only the defaults of the spec are implemented (readings AMBIG-1…8): the sample mean includes the un-noised time-0
pull, ñ(t) (not ñ(t+1)) is tested by the consistency rule, ε' = ε/⌈log₂ T⌉, natural logs in C̃, and only dyadic
intervals holding a pull of the arm are noised.

Randomness is not the reference's own: every draw calls the same keyed scalar functions that fedrec's compiled
loop uses, so that on the same seed both make the same decisions and reach the same regret:

* rewards: ``env.reward(r, i, k, t)`` (t = 0: the initialisation pull);
* the choice uniform of agent i in round t: ``uniform(substream(key_choice, r·N + i), t)``; it picks the
  ⌊u·c⌋-th (0-based, in arm order) of the c candidates, the lagging arms or the maximisers of the index;
* the gossip edge of round t: the ⌊u·|E|⌋-th edge of the topology's sorted edge list, u =
  ``uniform(substream(key_edge, r), t)``;
* the Laplace noise of the dyadic interval (q, e] = level-l node of index e / 2^l, 2^l = e − q, of stream (i, k):
  ``node_noise(key_noise, (r·N + i)·M + k, l, e / 2^l, LAPLACE, b, out)`` (fedrec.privacy.tree_noise).

The stream keys derive from the seed exactly as :class:`fedrec.protocols.gossip.GossipBandit` derives them
(:func:`stream_key`).
"""
from __future__ import annotations

import math
from bisect import bisect_right

import numpy as np

from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import Topology
from fedrec.privacy.tree_noise import LAPLACE, node_noise
from fedrec.utils.rng import substream, uniform
from fedrec.utils.seeding import numpy_generator


def stream_key(seed: int, name: str) -> np.uint64:
    """The uint64 key of the counter-based stream ``name`` (``gossip.choice``, ``gossip.edge``, ``gossip.noise``)."""
    return np.uint64(numpy_generator(seed, name).bit_generator.random_raw())


def dyadic_intervals(t: int) -> list[tuple[int, int]]:
    """The dyadic intervals (q, e] covering 1..t (Algorithm 2): clear the lowest set bit of e until 0."""
    out = []
    e = t
    while e != 0:
        q = e & (e - 1)
        out.append((q, e))
        e = q
    return out


def keyed_uniform(key: np.uint64, row: int, counter: int) -> float:
    """Uniform draw ``counter`` of stream ``row`` under ``key``, drawn by fedrec's scalar helpers (``substream``
    returns the uint64 state as a Python int, handed back as ``np.uint64``)."""
    return float(uniform(np.uint64(substream(key, row)), counter))


def pick_uniform(candidates: list[int], u: float) -> int:
    """The ⌊u·c⌋-th of the c ``candidates`` (in the order given), u uniform in (0, 1)."""
    c = len(candidates)
    return candidates[min(int(u * c), c - 1)]


class RefAgent:
    """One agent's state, arm by arm (spec §2.1), and its Fed_UCB noise cache."""

    def __init__(self, index: int, num_arms: int, neighbours: list[int]) -> None:
        self.index = index
        self.num_arms = num_arms
        self.neighbours = neighbours
        self.x0 = [0.0] * num_arms  # X_{i,k}(0)
        self.n = [1] * num_arms  # own pulls, the time-0 pull included
        self.ntil = [1] * num_arms  # ñ: estimate of the largest count of the arm in the network
        self.S = [0.0] * num_arms  # running raw sum, X(0) included (Gossip_UCB's sample mean)
        self.Xbar = [0.0] * num_arms  # X̃ (noisy for Fed_UCB)
        self.theta = [0.0] * num_arms  # ϑ, the gossiped estimate of the global mean
        # Fed_UCB: per arm the rounds τ >= 1 it was pulled and the prefix sums of the rewards at those rounds
        self.pull_times: list[list[int]] = [[] for _ in range(num_arms)]
        self.prefix: list[list[float]] = [[0.0] for _ in range(num_arms)]
        self.noise: dict[tuple[int, tuple[int, int]], float] = {}  # (arm, (q, e)) -> Laplace draw used

    def initialise(self, rewards: list[float]) -> None:
        """Time 0: one pull of every arm; ϑ(0) = X̃(0) = X(0)."""
        for k in range(self.num_arms):
            self.x0[k] = rewards[k]
            self.S[k] = rewards[k]
            self.Xbar[k] = rewards[k]
            self.theta[k] = rewards[k]

    def partial_sum(self, k: int, q: int, e: int) -> tuple[float, int]:
        """Σ_{τ=q+1}^{e} X̂_{i,k}(τ) and the number of pulls of arm k in (q, e]."""
        times = self.pull_times[k]
        lo, hi = bisect_right(times, q), bisect_right(times, e)
        return self.prefix[k][hi] - self.prefix[k][lo], hi - lo


class RefGossipUCB:
    """Fed_UCB on a graph with one :class:`RefAgent` per agent; ``epsilon=math.inf`` is Gossip_UCB.

    Args:
        topology: the connected graph (its sorted ``edges`` and the neighbour lists are read once).
        num_arms: M.
        horizon: T (enters ε' and C̃).
        epsilon: total privacy level ε (``inf``: no noise, eq. 11).
        seed: keys the choice, edge and noise streams, as fedrec's ``GossipBandit(seed=...)``.
        replicate: which replicate's streams (and environment replicate) to play.
    """

    def __init__(self, topology: Topology, num_arms: int, horizon: int, epsilon: float = math.inf, seed: int = 0,
                 replicate: int = 0) -> None:
        self.N = topology.num_agents
        self.M = num_arms
        self.T = horizon
        self.epsilon = epsilon
        self.replicate = replicate
        self.edges = [(int(u), int(v)) for u, v in topology.edges]
        neighbours: list[list[int]] = [[] for _ in range(self.N)]
        for u, v in self.edges:
            neighbours[u].append(v)
            neighbours[v].append(u)
        self.agents = [RefAgent(i, num_arms, sorted(neighbours[i])) for i in range(self.N)]
        self.alpha1 = 64.0 / self.N ** 17  # α₁ of eq. 11 / 12
        self.private = not math.isinf(epsilon)
        if self.private:
            ceil_log2_T = max(1, (horizon - 1).bit_length())  # ⌈log₂ T⌉ in integer arithmetic (AMBIG-5)
            self.b = ceil_log2_T / epsilon  # Laplace scale 1/ε', ε' = ε/⌈log₂ T⌉, sensitivity 1
            self.log_T = math.log(horizon)
        self.key_choice = stream_key(seed, "gossip.choice")
        self.key_edge = stream_key(seed, "gossip.edge")
        self.key_noise = stream_key(seed, "gossip.noise")
        self.t = 0
        self.regret = [0.0] * self.N

    # --------------------------------------------------------------------------------------------- pieces
    def width(self, n: int, t: int) -> float:
        """C_{i,k}(t) of eq. 11, or C̃_{i,k}(t) of eq. 12 when private, for the pre-pull count n."""
        log_t = math.log(t)
        if not self.private:
            return math.sqrt(2 * self.N * log_t / n) + self.alpha1
        privacy = 128 * self.N * self.log_T ** 2 * log_t * math.log(n) / (n ** 2 * self.epsilon ** 2)
        return self.alpha1 + math.sqrt(2 * self.N * (privacy + 1.0 / n) * log_t)

    def noisy_mean(self, agent: RefAgent, k: int, t: int) -> float:
        """Algorithm 3 for arm k of ``agent`` after its pull at round t: X(0) + Σ over t's dyadic intervals of the
        partial sum plus its cached (or freshly drawn) Laplace noise, divided by n; empty intervals get no noise."""
        total = agent.x0[k]
        for q, e in dyadic_intervals(t):
            ps, pulls = agent.partial_sum(k, q, e)
            key = (k, (q, e))
            if key in agent.noise:
                z = agent.noise[key]
            elif pulls > 0:
                level = (e - q).bit_length() - 1
                out = np.empty(1)
                node_noise(self.key_noise, (self.replicate * self.N + agent.index) * self.M + k, level, e >> level,
                           LAPLACE, self.b, out)
                z = float(out[0])
                agent.noise[key] = z
            else:
                z = 0.0
            total += ps + z
        return total / agent.n[k]

    # ---------------------------------------------------------------------------------------------- rounds
    def initialise(self, env: MultiAgentMAB) -> None:
        for agent in self.agents:
            agent.initialise([env.reward(self.replicate, agent.index, k, 0) for k in range(self.M)])

    def step(self, env: MultiAgentMAB) -> list[int]:
        """One round t: count propagation, arm choice, pulls and sample means, gossip on one edge. Returns the arms."""
        if self.t == 0:
            self.initialise(env)
        t = self.t + 1
        N, M, r = self.N, self.M, self.replicate
        # lines 3–5: ñ(t+1) = max(n(t), max over the neighbours j of ñ_j(t)), all agents from time-t values
        ntil_next = []
        for agent in self.agents:
            row = []
            for k in range(M):
                v = agent.n[k]
                for j in agent.neighbours:
                    v = max(v, self.agents[j].ntil[k])
                row.append(v)
            ntil_next.append(row)
        # lines 6–13: a lagging arm (consistency rule against ñ(t)), else the argmax of ϑ + C (or ϑ̃ + C̃)
        arms = []
        for agent in self.agents:
            u = keyed_uniform(self.key_choice, r * N + agent.index, t)
            lagging = [k for k in range(M) if agent.n[k] < agent.ntil[k] - N]
            if lagging:
                arms.append(pick_uniform(lagging, u))
                continue
            index = [agent.theta[k] + self.width(agent.n[k], t) for k in range(M)]
            top = max(index)
            arms.append(pick_uniform([k for k in range(M) if index[k] == top], u))
        # lines 14–15: observe, n += 1, then the sample mean over all n observations (noisy for Fed_UCB)
        best = float(env.global_means[r].max())
        d = [[0.0] * M for _ in range(N)]  # X̃(t) − X̃(t−1)
        for agent, a in zip(self.agents, arms):
            x = env.reward(r, agent.index, a, t)
            agent.n[a] += 1
            agent.S[a] += x
            if self.private:
                agent.pull_times[a].append(t)
                agent.prefix[a].append(agent.prefix[a][-1] + x)
                mean = self.noisy_mean(agent, a, t)
            else:
                mean = agent.S[a] / agent.n[a]
            d[agent.index][a] = mean - agent.Xbar[a]
            agent.Xbar[a] = mean
            self.regret[agent.index] += best - float(env.global_means[r, a])
        # lines 16–22: one uniformly random edge (u, v) averages ϑ(t−1); every agent adds its X̃ change
        e = self.edges[min(int(keyed_uniform(self.key_edge, r, t) * len(self.edges)), len(self.edges) - 1)]
        u_agent, v_agent = self.agents[e[0]], self.agents[e[1]]
        averages = [(u_agent.theta[k] + v_agent.theta[k]) / 2 for k in range(M)]
        for agent in self.agents:
            for k in range(M):
                if agent is u_agent or agent is v_agent:
                    agent.theta[k] = averages[k] + d[agent.index][k]
                else:
                    agent.theta[k] += d[agent.index][k]
        for agent, row in zip(self.agents, ntil_next):
            agent.ntil = row
        self.t = t
        return arms

    def play(self, env: MultiAgentMAB, steps: int) -> list[list[int]]:
        """Play ``steps`` rounds; the arms of every round, (steps, N) as nested lists."""
        return [self.step(env) for _ in range(steps)]


if __name__ == "__main__":  # a tiny smoke run: Fig. 2(a)'s setting, a few hundred rounds
    from fedrec.federation.topology import complete

    env = MultiAgentMAB(3, 5, seed=0)
    for eps in (1.0, math.inf):
        ref = RefGossipUCB(complete(3), 5, horizon=1000, epsilon=eps, seed=0)
        ref.play(env, 1000)
        print(f"epsilon={eps} T=1000 regret per agent={[round(x, 2) for x in ref.regret]}")
