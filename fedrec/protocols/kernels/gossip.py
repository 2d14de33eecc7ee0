"""Step loop of the decentralised bandits Gossip_UCB (Zhu et al. 2021, Algorithm 1) and Fed_UCB (Algorithm 4 with
the partial sums of Algorithm 2 and the Laplace noise of Algorithm 3), and our two UCB1 baselines.

One call plays rounds ``t0 + 1 … t0 + steps`` of every replicate (``prange``: replicates are independent) in place
on the protocol's buffers, which it receives as named structures (:class:`Rounds`, :class:`Graph`,
:class:`GossipSettings`, :class:`GossipState`, the environment's :class:`~fedrec.envs.rewards.RewardSource`,
:class:`PeerTraffic`) (gossip spec §2.3 and §2.7, readings AMBIG-1…8):

1. count propagation over all neighbours, ñ(t+1) = max(n(t), max_{j∈N_i} ñ_j(t)) (eq. 1, lines 3–5);
2. the consistency rule: a uniformly random arm among {k : n_{i,k} < ñ_{i,k}(t) − N} (line 6), else the argmax of
   ϑ + C (eq. 11) or ϑ̃ + C̃ (eq. 12), ties uniformly at random;
3. the reward, n += 1, and the sample mean over all n observations including X(0) (eq. 2, AMBIG-1/4); Fed_UCB
   adds the cached Laplace noise of the non-empty dyadic nodes covering 1..t (Alg. 3, AMBIG-6/7);
4. one uniformly random edge (u, v): ϑ(t) = W(t) ϑ(t−1) + X̃(t) − X̃(t−1) (eq. 9/13), counted as two peer
   messages of M scalars in the ledger.

The same loop plays our two baselines (spec §4.1 [PROP], not the paper's), chosen by ``mode``:

* ``LOCAL``: UCB1 per agent, no communication: no count propagation, no consistency rule, no gossip, so ϑ stays
  X̃ (the §6.4 no-communication limit); the index is X̃_{i,k} + sqrt(2 ln t / n_{i,k});
* ``CENTRAL``: one learner per replicate picks one arm for all N agents (agent 0's choice draw breaks its ties) and
  sees their N rewards; ϑ_{i,k} holds, for every i, the mean of all Σ_j n_{j,k} observations of arm k and the
  index is that mean + sqrt(2 ln t / Σ_j n_{j,k}).

The width arithmetic is shared: the baselines pass α₁ = 0, P = 0 and the factor 2 instead of 2N.

Randomness is counter based (:mod:`fedrec.rng`): draw c of a stream is a pure function of its key, its row and c,
so a resumed run redraws exactly what an uninterrupted one would, whatever the batching:

* choice: ``uniform(substream(key_choice, r·N + i), t)``, one uniform per agent and round, for the consistency
  pick or the tie break;
* edge: ``uniform(substream(key_edge, r), t)``, the gossip edge ⌊u·|E|⌋ of the sorted edge list;
* rewards: :func:`~fedrec.envs.rewards.draw_reward` of stream (r·N + i)·M + k under the environment's key, draw t;
* noise: the binary mechanism of :mod:`fedrec.privacy.tree_noise` with Laplace nodes on stream (r·N + i)·M + k
  under ``key_noise`` — its own key, so that ε = ∞ (no noise drawn) reproduces Gossip_UCB draw for draw.

Noise memory is O(log T) per (replicate, agent, arm) (spec §2.6): per level l, the level-l node indices of the
two latest distinct nodes holding a pull of the arm (``last``, ``prev``) decide whether a node of t's cover is
empty, and the noise of the level's latest drawn node is cached with its index (``node``, ``value``):
:func:`~fedrec.privacy.tree_noise.mark_record` and :func:`~fedrec.privacy.tree_noise.cached_prefix_noise`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.envs.rewards import RewardSource, draw_reward
from fedrec.federation.ledger import KINDS
from fedrec.jit import F64, I64, jit, parallel_variant, prange
from fedrec.privacy.tree_noise import LAPLACE, cached_prefix_noise, mark_record
from fedrec.protocols.kernels.client_server import record
from fedrec.rng import substream, uniform

#: ``mode`` of :data:`GOSSIP_RUN`: Gossip_UCB / Fed_UCB, local-only UCB1, centralised UCB (module docstring)
GOSSIP, LOCAL, CENTRAL = 0, 1, 2
#: the ledger's message kind of a gossip exchange
PEER = KINDS.index("peer")


class Rounds(NamedTuple):
    """The block of rounds one call plays."""

    t0: int  #: rounds played before this call
    steps: int
    initialise: bool  #: play time 0 first (every agent pulls every arm once)
    arms: I64[3]  #: (R, steps, N) receives the arms when its second dimension is ``steps`` (else (R, 0, N))


class Graph(NamedTuple):
    """The communication graph (:class:`~fedrec.federation.topology.Topology`'s arrays of the same names)."""

    indptr: I64[1]  #: CSR: the neighbours of agent i are ``indices[indptr[i]:indptr[i + 1]]``
    indices: I64[1]
    edges: I64[2]  #: (E, 2) the sorted edge list the gossip edge is drawn from


class GossipState(NamedTuple):
    """The protocol's state (:class:`fedrec.protocols.GossipBandit`'s buffers of the same names), (R, N, M) unless
    noted."""

    n: I64[3]  #: pulls, the time-0 pull included
    ntil: I64[3]  #: ñ
    x0: F64[3]  #: X(0)
    sums: F64[3]  #: Σ_{τ>=1} of the rewards
    xbar: F64[3]  #: X̃ (noisy for finite ε)
    theta: F64[3]  #: ϑ
    noise_last: I64[2]  #: the tree's noise caches, (R·N·M, L): one row per stream (r·N + i)·M + k
    noise_prev: I64[2]
    noise_node: I64[2]
    noise_value: F64[3]  #: (R·N·M, L, 1)
    regret: F64[2]  #: (R, N)


class GossipSettings(NamedTuple):
    """The protocol's settings (:class:`fedrec.protocols.GossipBandit`'s attributes of the same names)."""

    mode: int  #: ``GOSSIP``, ``LOCAL`` or ``CENTRAL``
    key_choice: np.uint64
    key_edge: np.uint64
    key_noise: np.uint64
    alpha1: float  #: α₁ of eq. 11/12 (0 for the baselines)
    width_factor: float  #: the factor of ln t / n under the root: 2N (eq. 11/12) or 2 (the baselines)
    privacy_factor: float  #: P of eq. 12 (0 for ε = ∞)
    privacy_log2: bool  #: log₂ t in P log t
    scale: float  #: the Laplace scale of a tree node (0: no noise, ε = ∞)
    noise_empty_intervals: bool
    consistency_fresh: bool  #: test the consistency rule against ñ(t+1)
    bytes_per_scalar: int


class PeerTraffic(NamedTuple):
    """The ledger's traffic array of the agents: (R, N, kinds, 2, 3)."""

    client: I64[5]


@jit
def count_terms(terms: np.ndarray, n: int, private: bool) -> None:
    """Cache what :func:`ucb_width` needs of count ``n`` in ``terms`` (3,): 1/n, log n / n² (only when
    ``private``: P > 0) and sqrt(1/n), so a round evaluates every arm's width without a division or a logarithm
    (and without a root at P = 0)."""
    inv = 1.0 / n
    terms[0] = inv
    terms[1] = np.log(n) * inv * inv if private else 0.0
    terms[2] = np.sqrt(inv)


@jit
def ucb_width(terms: np.ndarray, alpha1: float, privacy_t: float, factor_t: float, root_t: float) -> float:
    """C̃ of eq. 12, α₁ + sqrt(2N (P log t log n / n² + 1/n) log t) with P = 128 N log²T / ε², for the
    :func:`count_terms` of the pre-pull count n. Per round: ``privacy_t`` = P log t (log₂ t with ``privacy_log2``),
    ``factor_t`` = 2N log t and ``root_t`` = its root; P = 0 (Gossip_UCB, or ε = ∞) gives C of eq. 11,
    α₁ + sqrt(2N log t / n). The baselines pass 2 for 2N, α₁ = 0 and P = 0."""
    if privacy_t == 0.0:
        return alpha1 + root_t * terms[2]
    return alpha1 + np.sqrt((privacy_t * terms[1] + terms[0]) * factor_t)


@jit
def _gossip_replicate(r, io, graph, cfg, st, env, traffic):
    """Rounds t0 + 1 … t0 + steps of Gossip_UCB / Fed_UCB or a baseline (``cfg.mode``, module docstring) in
    replicate ``r``; ``io.initialise`` first plays time 0 (every agent pulls every arm once: n = ñ = 1,
    X̃ = ϑ = X(0); ``CENTRAL``: ϑ = mean_i X(0))."""
    n, ntil, x0, sums, xbar, theta, regret = st.n, st.ntil, st.x0, st.sums, st.xbar, st.theta, st.regret
    last, prev, node, value = st.noise_last, st.noise_prev, st.noise_node, st.noise_value
    indptr, indices, edges = graph.indptr, graph.indices, graph.edges
    mode, alpha1, privacy, scale = cfg.mode, cfg.alpha1, cfg.privacy_factor, cfg.scale
    t0, steps, arms_out = io.t0, io.steps, io.arms
    N, M = n.shape[1], n.shape[2]
    E = edges.shape[0]
    keep = arms_out.shape[1] == steps
    nxt = np.empty((N, M), dtype=np.int64)
    q = np.empty(M)
    chosen = np.empty(N, dtype=np.int64)
    delta = np.empty(N)
    terms = np.empty((N, M, 3))  # count_terms of n (CENTRAL: of the pooled count, in row 0)
    noise = np.empty(1)  # the tree noise of one pull
    best = env.global_means[r].max()
    if io.initialise:
        for i in range(N):
            for k in range(M):
                x = draw_reward(env, r, i, k, 0)
                x0[r, i, k] = x
                xbar[r, i, k] = x
                theta[r, i, k] = x
                n[r, i, k] = 1
                ntil[r, i, k] = 1
        if mode == CENTRAL:
            for k in range(M):
                pooled = 0.0
                for i in range(N):
                    pooled += x0[r, i, k]
                for i in range(N):
                    theta[r, i, k] = pooled / N
    for i in range(N):
        for k in range(M):
            count = n[r, i, k]
            if mode == CENTRAL:
                count = 0
                for j in range(N):
                    count += n[r, j, k]
            count_terms(terms[i, k], count, privacy > 0.0)
    for s in range(steps):
        t = t0 + s + 1
        log_t = np.log(t)
        privacy_t = privacy * (log_t / np.log(2.0) if cfg.privacy_log2 else log_t)
        factor_t = cfg.width_factor * log_t
        root_t = np.sqrt(factor_t)
        if mode == GOSSIP:
            for i in range(N):  # ñ(t+1), eq. 1 (lines 3–5), arms innermost (contiguous)
                for k in range(M):
                    nxt[i, k] = n[r, i, k]
                for p in range(indptr[i], indptr[i + 1]):
                    j = indices[p]
                    for k in range(M):
                        nxt[i, k] = max(nxt[i, k], ntil[r, j, k])
        for i in range(N):  # lines 6–13
            if mode == CENTRAL and i > 0:
                chosen[i] = chosen[0]
                continue
            u = uniform(substream(cfg.key_choice, r * N + i), t)
            lagging = 0
            if mode == GOSSIP:
                for k in range(M):
                    target = nxt[i, k] if cfg.consistency_fresh else ntil[r, i, k]
                    if n[r, i, k] < target - N:
                        lagging += 1
            a = -1
            if lagging > 0:
                pick = min(int(u * lagging), lagging - 1)
                for k in range(M):
                    target = nxt[i, k] if cfg.consistency_fresh else ntil[r, i, k]
                    if n[r, i, k] < target - N:
                        if pick == 0:
                            a = k
                            break
                        pick -= 1
            else:
                top = -np.inf
                ties = 0
                for k in range(M):
                    q[k] = theta[r, i, k] + ucb_width(terms[i, k], alpha1, privacy_t, factor_t, root_t)
                    if q[k] > top:
                        top = q[k]
                        ties = 1
                    elif q[k] == top:
                        ties += 1
                pick = min(int(u * ties), ties - 1)
                for k in range(M):
                    if q[k] == top:
                        if pick == 0:
                            a = k
                            break
                        pick -= 1
            chosen[i] = a
        for i in range(N):  # lines 14–15: observe, n += 1, (noisy) sample mean
            a = chosen[i]
            x = draw_reward(env, r, i, a, t)
            n[r, i, a] += 1
            if mode != CENTRAL:
                count_terms(terms[i, a], n[r, i, a], privacy > 0.0)
            sums[r, i, a] += x
            total = x0[r, i, a] + sums[r, i, a]
            if scale > 0.0:  # Alg. 2–3: mark the pull, add the noise of t's (non-empty) cover nodes
                stream = (r * N + i) * M + a
                mark_record(stream, t, last, prev)
                cached_prefix_noise(cfg.key_noise, stream, t, LAPLACE, scale, cfg.noise_empty_intervals, last, prev,
                                    node, value, noise)
                total += noise[0]
            mean = total / n[r, i, a]
            delta[i] = mean - xbar[r, i, a]
            xbar[r, i, a] = mean
            regret[r, i] += best - env.global_means[r, a]
            if keep:
                arms_out[r, s, i] = a
        if mode == CENTRAL:  # the pooled mean of every observation of the one pulled arm
            a = chosen[0]
            pooled = 0.0
            count = 0
            for i in range(N):
                pooled += x0[r, i, a] + sums[r, i, a]
                count += n[r, i, a]
            for i in range(N):
                theta[r, i, a] = pooled / count
            count_terms(terms[0, a], count, privacy > 0.0)
            continue
        if mode == GOSSIP:
            e = min(int(uniform(substream(cfg.key_edge, r), t) * E), E - 1)  # lines 16–22
            eu = edges[e, 0]
            ev = edges[e, 1]
            for k in range(M):
                avg = (theta[r, eu, k] + theta[r, ev, k]) * 0.5
                theta[r, eu, k] = avg
                theta[r, ev, k] = avg
            record(traffic.client, eu, traffic.client, ev, r, PEER, M, cfg.bytes_per_scalar)
            record(traffic.client, ev, traffic.client, eu, r, PEER, M, cfg.bytes_per_scalar)
            for i in range(N):
                for k in range(M):
                    ntil[r, i, k] = nxt[i, k]
        for i in range(N):
            theta[r, i, chosen[i]] += delta[i]


def _gossip_run(io: Rounds, graph: Graph, cfg: GossipSettings, st: GossipState, env: RewardSource,
                traffic: PeerTraffic) -> None:
    """:func:`_gossip_replicate` of every replicate (the body is a function of its own: numba's parallel loops
    lose writes made through a ``NamedTuple`` directly in their body, numba issue 7135). The index is passed as an
    int64: a parallel loop's index is unsigned, and the body would be compiled once more for it."""
    for r in prange(st.n.shape[0]):
        _gossip_replicate(np.int64(r), io, graph, cfg, st, env, traffic)


#: (serial, parallel over replicates)
GOSSIP_RUN = (jit(_gossip_run), jit(parallel_variant(_gossip_run), parallel=True))
