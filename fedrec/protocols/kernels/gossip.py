"""Step loop of the decentralised bandits Gossip_UCB (Zhu et al. 2021, Algorithm 1) and Fed_UCB (Algorithm 4 with
the partial sums of Algorithm 2 and the Laplace noise of Algorithm 3), and our two UCB1 baselines.

One call plays rounds ``t0 + 1 … t0 + steps`` of every replicate (``prange``: replicates are independent) in place
on the protocol's buffers, which it receives as named structures (:class:`Rounds`, :class:`Graph`,
:class:`GossipSettings`, :class:`GossipState`, the environment's :class:`~fedrec.envs.rewards.RewardSource`,
:class:`PeerTraffic`) (Algorithms 1 and 4; where the paper's listings are ambiguous, the reading taken is said):

1. count propagation over all neighbours, ñ(t+1) = max(n(t), max_{j∈N_i} ñ_j(t)) (eq. 1, lines 3–5);
2. the consistency rule: a uniformly random arm among {k : n_{i,k} < ñ_{i,k}(t) − N} (line 6), else the argmax of
   ϑ + C (eq. 11) or ϑ̃ + C̃ (eq. 12), ties uniformly at random;
3. the reward, n += 1, and the sample mean over all n observations including X(0) (eq. 2, which sums
   τ = 1..t only while n counts the time-0 pull; n is incremented before averaging, although the listing updates
   the mean first); Fed_UCB adds the cached Laplace noise of the dyadic nodes covering 1..t (Alg. 3), X(0) itself
   un-noised, and by default only nodes holding a pull of the arm (the paper's prose; its Algorithm 3 noises all);
4. one uniformly random edge (u, v): ϑ(t) = W(t) ϑ(t−1) + X̃(t) − X̃(t−1) (eq. 9/13), counted as two peer
   messages of M scalars in the ledger.

The same loop plays our two baselines (our choice, not in the paper), chosen by ``mode``:

* ``LOCAL``: UCB1 per agent, no communication: no count propagation, no consistency rule, no gossip, so ϑ stays
  X̃ (the no-communication limit); the index is X̃_{i,k} + sqrt(2 ln t / n_{i,k});
* ``CENTRAL``: one learner per replicate picks one arm for all N agents (agent 0's choice draw breaks its ties) and
  sees their N rewards; ϑ_{i,k} holds, for every i, the mean of all Σ_j n_{j,k} observations of arm k and the
  index is that mean + sqrt(2 ln t / Σ_j n_{j,k}).

The width arithmetic is shared: the baselines pass α₁ = 0, P = 0 and the factor 2 instead of 2N.

Randomness is counter based (:mod:`fedrec.utils.rng`): draw c of a stream is a pure function of its key, its row and c,
so a resumed run redraws exactly what an uninterrupted one would, whatever the batching:

* choice: ``uniform(substream(key_choice, r·N + i), t)``, the uniform of agent i in round t, read only for the
  consistency pick or a tie break;
* edge: ``uniform(substream(key_edge, r), t)``, the gossip edge ⌊u·|E|⌋ of the sorted edge list;
* rewards: :func:`~fedrec.envs.rewards.draw_reward` of stream (r·N + i)·M + k under the environment's key, draw t;
* noise: the binary mechanism of :mod:`fedrec.privacy.tree_noise` with Laplace nodes on stream (r·N + i)·M + k
  under ``key_noise`` — its own key, so that ε = ∞ (no noise drawn) reproduces Gossip_UCB draw for draw.

Noise memory is O(log T) per (replicate, agent, arm), not a node dictionary: per level l, the level-l node indices
of the two latest distinct nodes holding a pull of the arm (``last``, ``prev``) decide whether a node of t's cover
is empty, and the noise of the level's latest drawn node is cached with its index (``node``, ``value``):
:func:`~fedrec.privacy.tree_noise.mark_record` and :func:`cover_noise` (the scalar form of
:func:`~fedrec.privacy.tree_noise.cached_prefix_noise`).

Speed without changing a draw or a decision (docs/benchmarks.md, "Gossip_UCB / Fed_UCB: the work of an
agent-step"): every stream's state is computed once per call, t's cover once per round, and at finite ε the index
of an arm is computed exactly (one root) only when an upper bound of it, sqrt(x) <= (x + w²)/(2w) with w the arm's
root at its latest exact evaluation, reaches the best exact index so far; the argmax and its ties are the exact
ones, since a skipped arm lies strictly below the maximum.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.envs.rewards import draw_reward_from, reward_stream
from fedrec.federation.ledger import PEER
from fedrec.privacy.tree_noise import mark_record, node_code
from fedrec.protocols.kernels.ledger import record
from fedrec.utils.jit import F64, I64, jit, over_replicates
from fedrec.utils.rng import laplace, substream, uniform

#: ``mode`` of :data:`GOSSIP_RUN`: Gossip_UCB / Fed_UCB, local-only UCB1, centralised UCB (module docstring)
GOSSIP, LOCAL, CENTRAL = 0, 1, 2


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
def count_terms(inv: np.ndarray, log_sq: np.ndarray, root: np.ndarray, i: int, k: int, n: int,
                private: bool) -> None:
    """Cache what the UCB width needs of arm k's count ``n`` at [i, k] of ``inv``, ``log_sq``, ``root``: 1/n,
    log n / n² (only when ``private``: P > 0) and sqrt(1/n), so a round evaluates every arm's width without a
    division or a logarithm (and without a root at P = 0)."""
    v = 1.0 / n
    inv[i, k] = v
    log_sq[i, k] = np.log(n) * v * v if private else 0.0
    root[i, k] = np.sqrt(v)


@jit
def cover_levels(t: int, levels: np.ndarray) -> int:
    """Write the levels of t's dyadic cover (its set bits, lowest first) into ``levels``; returns their number. A
    round computes them once for all its agents."""
    count = 0
    level = 0
    while t >> level:
        if (t >> level) & 1:
            levels[count] = level
            count += 1
        level += 1
    return count


@jit
def cover_noise(row_state: np.uint64, row: int, t: int, levels: np.ndarray, count: int, scale: float,
                noise_empty: bool, last: np.ndarray, prev: np.ndarray, node: np.ndarray, value: np.ndarray) -> float:
    """:func:`~fedrec.privacy.tree_noise.cached_prefix_noise` of one Laplace stream, scalar: the sum, lowest level
    first, of the cached noises of t's cover nodes (those holding a marked record unless ``noise_empty``), drawing
    a node's b·Laplace the first time it is needed, from the row's stream state ``row_state`` = substream(key, row)
    (computed once per call) and the cover ``levels`` of :func:`cover_levels`."""
    total = 0.0
    for c in range(count):
        level = levels[c]
        m = t >> level
        if noise_empty or last[row, level] == m or prev[row, level] == m:
            if node[row, level] != m:
                value[row, level, 0] = laplace(substream(row_state, node_code(level, m)), 0) * scale
                node[row, level] = m
            total += value[row, level, 0]
    return total


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
    private = privacy > 0.0
    nxt = np.empty((N, M), dtype=np.int64)
    q = np.empty(M)
    work = np.empty(M)  # finite ε: the radicand of each arm's width
    bound = np.empty(M)  # finite ε: an upper bound of each arm's index
    chosen = np.empty(N, dtype=np.int64)
    delta = np.empty(N)
    # count_terms of n (CENTRAL: of the pooled count, in row 0)
    inv, log_sq, root = np.empty((N, M)), np.empty((N, M)), np.empty((N, M))
    # finite ε: the root w of each arm's width at its latest exact evaluation and 1/(2w) (0: none yet), which
    # bound its root at any later round by sqrt(x) <= (x + w²)/(2w)
    anchor, half_inv = np.zeros((N, M)), np.zeros((N, M))
    levels = np.empty(64, dtype=np.int64)
    # the keyed streams' states, computed once per call
    choice_state = np.empty(N, dtype=np.uint64)
    reward_state = np.empty((N, M), dtype=np.uint64)
    noise_state = np.empty((N, M), dtype=np.uint64)
    for i in range(N):
        choice_state[i] = substream(cfg.key_choice, r * N + i)
        for k in range(M):
            reward_state[i, k] = reward_stream(env, r, i, k)
            noise_state[i, k] = substream(cfg.key_noise, (r * N + i) * M + k)
    edge_state = substream(cfg.key_edge, r)
    best = env.global_means[r].max()
    if io.initialise:
        for i in range(N):
            for k in range(M):
                x = draw_reward_from(env, reward_state[i, k], r, i, k, 0)
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
            count_terms(inv, log_sq, root, i, k, count, private)
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
            target = nxt[i] if cfg.consistency_fresh else ntil[r, i]
            a = -1
            lagging = 0
            if mode == GOSSIP:
                for k in range(M):
                    lagging += n[r, i, k] < target[k] - N
            if lagging > 0:  # the ⌊u·c⌋-th lagging arm
                pick = min(int(uniform(choice_state[i], t) * lagging), lagging - 1)
                for k in range(M):
                    if n[r, i, k] < target[k] - N:
                        if pick == 0:
                            a = k
                            break
                        pick -= 1
                chosen[i] = a
                continue
            if private:  # eq. 12: exact indices only for arms whose bound reaches the best exact index
                top_bound = -np.inf
                first = 0
                for k in range(M):
                    x = (privacy_t * log_sq[i, k] + inv[i, k]) * factor_t
                    work[k] = x
                    w = anchor[i, k]
                    b = theta[r, i, k] + alpha1 + (x + w * w) * half_inv[i, k] if w > 0.0 else np.inf
                    bound[k] = b
                    if b > top_bound:
                        top_bound = b
                        first = k
                top = -np.inf
                for c in range(M):
                    k = (first + c) % M
                    if c > 0 and bound[k] < top - 1e-9 * (1.0 + abs(top)):
                        q[k] = -np.inf
                        continue
                    w = np.sqrt(work[k])
                    anchor[i, k] = w
                    half_inv[i, k] = 0.5 / w if w > 0.0 else 0.0
                    q[k] = theta[r, i, k] + (alpha1 + w)
                    top = max(top, q[k])
            else:  # eq. 11 (and the baselines' UCB1)
                top = -np.inf
                for k in range(M):
                    q[k] = theta[r, i, k] + (alpha1 + root_t * root[i, k])
                    top = max(top, q[k])
            ties = 0
            for k in range(M):
                ties += q[k] == top
            pick = 0 if ties == 1 else min(int(uniform(choice_state[i], t) * ties), ties - 1)
            for k in range(M):
                if q[k] == top:
                    if pick == 0:
                        a = k
                        break
                    pick -= 1
            chosen[i] = a
        cover = cover_levels(t, levels) if scale > 0.0 else 0
        for i in range(N):  # lines 14–15: observe, n += 1, (noisy) sample mean
            a = chosen[i]
            x = draw_reward_from(env, reward_state[i, a], r, i, a, t)
            n[r, i, a] += 1
            if mode != CENTRAL:
                count_terms(inv, log_sq, root, i, a, n[r, i, a], private)
            sums[r, i, a] += x
            total = x0[r, i, a] + sums[r, i, a]
            if scale > 0.0:  # Alg. 2–3: mark the pull, add the noise of t's (non-empty) cover nodes
                stream = (r * N + i) * M + a
                mark_record(stream, t, last, prev)
                total += cover_noise(noise_state[i, a], stream, t, levels, cover, scale, cfg.noise_empty_intervals,
                                     last, prev, node, value)
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
            count_terms(inv, log_sq, root, 0, a, count, private)
            continue
        if mode == GOSSIP:
            e = min(int(uniform(edge_state, t) * E), E - 1)  # lines 16–22
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


#: (serial, parallel over replicates), each called as ``kernel(replicates, io, graph, cfg, st, env, traffic)``
GOSSIP_RUN = over_replicates(_gossip_replicate)
