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

* choice: ``uniform(substream(key_choice, r·N + i), t)``, the uniform of agent i in round t, used only for the
  consistency pick or a tie break;
* edge: ``uniform(substream(key_edge, r), t)``, the gossip edge ⌊u·|E|⌋ of the sorted edge list;
* rewards: :func:`~fedrec.envs.rewards.draw_reward` of stream (r·N + i)·M + k under the environment's key, draw t;
* noise: the binary mechanism of :mod:`fedrec.privacy.tree_noise` with Laplace nodes on stream (r·N + i)·M + k
  under ``key_noise`` — its own key, so that ε = ∞ (no noise drawn) reproduces Gossip_UCB draw for draw.

Noise memory is O(log T) per (replicate, agent, arm), not a node dictionary: per level l, the level-l node indices
of the two latest distinct nodes holding a pull of the arm (``last``, ``prev``) decide whether a node of t's cover
is empty, and the noise of the level's latest drawn node is cached with its index (``node``, ``value``):
:func:`~fedrec.privacy.tree_noise.mark_record` and :func:`~fedrec.privacy.tree_noise.cached_prefix_noise` on the
cover :func:`~fedrec.privacy.tree_noise.cover_of` walks once per round.

Speed without changing a draw or a decision (docs/benchmarks.md, "Gossip_UCB / Fed_UCB: the work of an
agent-step"): the choice, reward and edge streams' states are computed once per call, t's cover once per round,
the per-round phases are compiled into the one loop (``inline``, with their arrays passed on unconditionally: see
:func:`_choose_arms`), and at finite ε an arm's index is computed exactly only when it may reach the maximum
(:func:`pruned_private_indices`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.envs.rewards import RewardSource, draw_reward_from, reward_stream
from fedrec.federation.ledger import PEER, RECEIVED, SENT
from fedrec.privacy.tree_noise import (
    LAPLACE,
    MAX_LEVELS,
    Cover,
    NoiseSettings,
    cached_prefix_noise,
    cover_of,
    mark_record,
)
from fedrec.protocols.kernels.ledger import tally
from fedrec.utils.jit import F64, I64, jit, over_replicates
from fedrec.utils.rng import substream, uniform

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


#: the rows of a call's arm terms, (5, N, M): what an arm's index needs, cached per (agent, arm) (``CENTRAL``: of
#: the pooled counts, in every row at a call's start, then only row 0 read and updated): :func:`count_terms` of
#: its count and, at finite ε, the root w of its width at its latest exact evaluation with 1/(2w) (0: none yet;
#: :func:`pruned_private_indices`)
INV, LOG_SQ, ROOT, ANCHOR, HALF_INV = 0, 1, 2, 3, 4
#: the rows of the choosing agent's evaluation, (3, M): each arm's index q and, at finite ε, the radicand x of its
#: width and an upper bound of q
Q, RADICAND, BOUND = 0, 1, 2


class Round(NamedTuple):
    """Round t's share of every agent's choice, computed once per round (scalars only: a helper called per agent
    takes it at no cost, where a structure of arrays would cost a reference count per array and call)."""

    t: int
    mode: int  #: ``GOSSIP``, ``LOCAL`` or ``CENTRAL``
    private: bool  #: P > 0: eq. 12's width (:func:`pruned_private_indices`), else eq. 11's
    alpha1: float  #: α₁ of eq. 11/12
    factor: float  #: the width factor times ln t
    root: float  #: sqrt(factor)
    privacy: float  #: P log t (log₂ t with ``privacy_log2``)


@jit(inline=True)
def _round(t: int, cfg: GossipSettings) -> Round:
    """Round ``t``'s :class:`Round`."""
    log_t = np.log(t)
    privacy_t = cfg.privacy_factor * (log_t / np.log(2.0) if cfg.privacy_log2 else log_t)
    factor_t = cfg.width_factor * log_t
    return Round(t, cfg.mode, cfg.privacy_factor > 0.0, cfg.alpha1, factor_t, np.sqrt(factor_t), privacy_t)


@jit(inline=True)
def count_terms(terms: np.ndarray, i: int, k: int, n: int, private: bool) -> None:
    """Cache what the UCB width needs of arm k's count ``n`` at [:, i, k] of ``terms``: 1/n, log n / n² (only when
    ``private``: P > 0) and sqrt(1/n), so a round evaluates every arm's width without a division or a logarithm
    (and without a root at P = 0)."""
    v = 1.0 / n
    terms[INV, i, k] = v
    terms[LOG_SQ, i, k] = np.log(n) * v * v if private else 0.0
    terms[ROOT, i, k] = np.sqrt(v)


@jit(inline=True)
def _streams(r: int, cfg: GossipSettings, env: RewardSource, N: int, M: int) -> tuple:
    """Replicate ``r``'s keyed stream states (module docstring), computed once per call: the choice streams (N,),
    the reward streams (N, M) and the edge stream."""
    choice = np.empty(N, dtype=np.uint64)
    reward = np.empty((N, M), dtype=np.uint64)
    for i in range(N):
        choice[i] = substream(cfg.key_choice, r * N + i)
        for k in range(M):
            reward[i, k] = reward_stream(env, r, i, k)
    return choice, reward, substream(cfg.key_edge, r)


@jit(inline=True)
def _initialise(r: int, st: GossipState, env: RewardSource, reward: np.ndarray, central: bool) -> None:
    """Time 0 of replicate ``r``: every agent pulls every arm once (from its ``reward`` stream state), n = ñ = 1 and
    X̃ = ϑ = X(0) (``central``: ϑ = mean_i X(0))."""
    N, M = st.n.shape[1], st.n.shape[2]
    for i in range(N):
        for k in range(M):
            x = draw_reward_from(env, reward[i, k], r, i, k, 0)
            st.x0[r, i, k] = x
            st.xbar[r, i, k] = x
            st.theta[r, i, k] = x
            st.n[r, i, k] = 1
            st.ntil[r, i, k] = 1
    if central:
        for k in range(M):
            pooled = 0.0
            for i in range(N):
                pooled += st.x0[r, i, k]
            for i in range(N):
                st.theta[r, i, k] = pooled / N


@jit(inline=True)
def _arm_terms(n: np.ndarray, central: bool, private: bool) -> np.ndarray:
    """The call's arm terms (:data:`INV` …) of the counts ``n`` (N, M) (``central``: of the pooled counts
    Σ_j n_{j,k}), no arm evaluated exactly yet."""
    N, M = n.shape
    terms = np.zeros((5, N, M))
    for i in range(N):
        for k in range(M):
            count = n[i, k]
            if central:
                count = 0
                for j in range(N):
                    count += n[j, k]
            count_terms(terms, i, k, count, private)
    return terms


@jit(inline=True)
def _propagate_counts(n: np.ndarray, ntil: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                      nxt: np.ndarray) -> None:
    """ñ(t+1) = max(n(t), max_{j∈N_i} ñ_j(t)) of every agent into ``nxt`` (eq. 1, lines 3–5), over all neighbours
    (:class:`Graph`'s CSR arrays), arms innermost (contiguous); ``n``, ``ntil``, ``nxt`` (N, M)."""
    N, M = n.shape
    for i in range(N):
        for k in range(M):
            nxt[i, k] = n[i, k]
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            for k in range(M):
                nxt[i, k] = max(nxt[i, k], ntil[j, k])


@jit(inline=True)
def _lagging_arm(n: np.ndarray, target: np.ndarray, i: int, slack: int, state: np.uint64, t: int) -> int:
    """The consistency rule (line 6): the ⌊u·c⌋-th of the c arms with n_{i,k} < target_{i,k} − ``slack`` (u agent
    i's choice uniform of round t, ``state`` its stream's); −1 when no arm lags."""
    M = n.shape[1]
    lagging = 0
    for k in range(M):
        lagging += n[i, k] < target[i, k] - slack
    if lagging == 0:
        return -1
    pick = min(int(uniform(state, t) * lagging), lagging - 1)
    for k in range(M):
        if n[i, k] < target[i, k] - slack:
            if pick == 0:
                return k
            pick -= 1
    return -1


@jit(inline=True)
def _exact_indices(theta: np.ndarray, i: int, rnd: Round, terms: np.ndarray, ev: np.ndarray) -> float:
    """Eq. 11's indices ϑ_{i,k} + α₁ + sqrt(factor · ln t / n_{i,k}) of agent i's arms into ``ev[Q]`` (the
    baselines' UCB1 with α₁ = 0); returns their maximum."""
    top = -np.inf
    for k in range(ev.shape[1]):
        ev[Q, k] = theta[i, k] + (rnd.alpha1 + rnd.root * terms[ROOT, i, k])
        top = max(top, ev[Q, k])
    return top


@jit(inline=True)
def pruned_private_indices(theta: np.ndarray, i: int, rnd: Round, terms: np.ndarray, ev: np.ndarray) -> float:
    """Eq. 12's indices ϑ_{i,k} + α₁ + sqrt(x_k) of agent i's arms into ``ev[Q]`` (x_k the width's radicand) and
    their maximum, taking the root only of arms that may reach that maximum; the other arms get −∞.

    Why: the root is the dearest part of an index. Why it is exact: sqrt(x) <= (x + w²)/(2w) for any w > 0 (as
    (sqrt x − w)² >= 0), so with w_k the arm's root at its latest exact evaluation (``terms[ANCHOR]``, kept across
    the call's rounds) b_k = ϑ_k + α₁ + (x_k + w_k²)/(2w_k) bounds its index from above (∞ before any evaluation).
    Arms are evaluated cyclically from the one of the largest bound, and one is skipped only if its bound lies
    below the best exact index so far by more than 1e-9·(1 + |best|), far beyond the rounding of the bound: a
    skipped arm lies strictly below the maximum, so the maximum and the arms attaining it (the ties
    :func:`_tie_break` draws among) are those of evaluating every arm exactly."""
    M = ev.shape[1]
    top_bound = -np.inf
    first = 0
    for k in range(M):
        x = (rnd.privacy * terms[LOG_SQ, i, k] + terms[INV, i, k]) * rnd.factor
        ev[RADICAND, k] = x
        w = terms[ANCHOR, i, k]
        b = theta[i, k] + rnd.alpha1 + (x + w * w) * terms[HALF_INV, i, k] if w > 0.0 else np.inf
        ev[BOUND, k] = b
        if b > top_bound:
            top_bound = b
            first = k
    top = -np.inf
    for c in range(M):
        k = (first + c) % M
        if c > 0 and ev[BOUND, k] < top - 1e-9 * (1.0 + abs(top)):
            ev[Q, k] = -np.inf
            continue
        w = np.sqrt(ev[RADICAND, k])
        terms[ANCHOR, i, k] = w
        terms[HALF_INV, i, k] = 0.5 / w if w > 0.0 else 0.0
        ev[Q, k] = theta[i, k] + (rnd.alpha1 + w)
        top = max(top, ev[Q, k])
    return top


@jit(inline=True)
def _tie_break(ev: np.ndarray, top: float, state: np.uint64, t: int) -> int:
    """The ⌊u·c⌋-th of the c arms whose index ``ev[Q]`` equals ``top`` (u the agent's choice uniform of round t,
    drawn only when c > 1)."""
    M = ev.shape[1]
    ties = 0
    for k in range(M):
        ties += ev[Q, k] == top
    pick = 0 if ties == 1 else min(int(uniform(state, t) * ties), ties - 1)
    for k in range(M):
        if ev[Q, k] == top:
            if pick == 0:
                return k
            pick -= 1
    return -1


@jit(inline=True)
def _ucb_arm(theta: np.ndarray, i: int, rnd: Round, terms: np.ndarray, ev: np.ndarray, state: np.uint64) -> int:
    """Agent i's argmax of ϑ + C (eq. 11) or ϑ̃ + C̃ (eq. 12, P > 0), ties uniformly at random (lines 7–13)."""
    if rnd.private:
        top = pruned_private_indices(theta, i, rnd, terms, ev)
    else:
        top = _exact_indices(theta, i, rnd, terms, ev)
    return _tie_break(ev, top, state, rnd.t)


@jit(inline=True)
def _choose_arms(rnd: Round, n: np.ndarray, target: np.ndarray, theta: np.ndarray, terms: np.ndarray,
                 ev: np.ndarray, choice: np.ndarray, chosen: np.ndarray) -> None:
    """Lines 6–13: every agent's arm into ``chosen``: a lagging arm (``GOSSIP``: the consistency rule against
    ``target``, ñ(t+1) or ñ(t)), else the index's argmax; ``CENTRAL``: agent 0's choice for all.

    The argmax is taken even where a lagging arm overrides it: it changes nothing that is read (its choice draw is
    a pure function of the stream, and the anchors of :func:`pruned_private_indices` never change a decision), while
    skipping it on a data-dependent branch leaves numba's reference counts of the inlined helpers' arrays unpruned
    (measured on Fig. 2(a): 16 atomic increment/decrement pairs per round, 10–30 % of the agent-step's time)."""
    N = n.shape[0]
    for i in range(N):
        if rnd.mode == CENTRAL and i > 0:
            chosen[i] = chosen[0]
            continue
        best = _ucb_arm(theta, i, rnd, terms, ev, choice[i])
        lagging = _lagging_arm(n, target, i, N, choice[i], rnd.t) if rnd.mode == GOSSIP else -1
        chosen[i] = lagging if lagging >= 0 else best


@jit(inline=True)
def _tree_noise(noise: NoiseSettings, stream: int, cover: Cover, last: np.ndarray, prev: np.ndarray,
                node: np.ndarray, value: np.ndarray, out: np.ndarray) -> float:
    """Alg. 2–3: mark the pull of round t = ``cover.t`` in ``stream`` and return the noise of t's (non-empty) cover
    nodes, each node drawn once into the caches (:class:`GossipState`'s ``noise_*``); ``out``: one float of
    scratch."""
    mark_record(stream, cover.t, last, prev)
    cached_prefix_noise(stream, cover, noise, last, prev, node, value, out)
    return out[0]


@jit(inline=True)
def _observe(n: np.ndarray, x0: np.ndarray, sums: np.ndarray, xbar: np.ndarray, i: int, a: int, x: float,
             noise: float) -> float:
    """Lines 14–15 for agent i's reward ``x`` of arm a: n += 1 and X̃ becomes the mean of all n observations
    including X(0), plus the pull's tree ``noise`` (0.0 at ε = ∞, which changes no bit: X(0) + Σ is never −0, as Σ
    starts at +0); returns X̃(t) − X̃(t−1)."""
    n[i, a] += 1
    sums[i, a] += x
    total = x0[i, a] + sums[i, a]
    total += noise
    mean = total / n[i, a]
    delta = mean - xbar[i, a]
    xbar[i, a] = mean
    return delta


@jit(inline=True)
def _pool_arm(n: np.ndarray, x0: np.ndarray, sums: np.ndarray, theta: np.ndarray, a: int, terms: np.ndarray,
              private: bool) -> None:
    """``CENTRAL``'s update: ϑ_{i,a} of every agent becomes the mean of all Σ_j n_{j,a} observations of the pulled
    arm a, whose pooled count's terms go to agent row 0 of ``terms``."""
    pooled = 0.0
    count = 0
    for i in range(n.shape[0]):
        pooled += x0[i, a] + sums[i, a]
        count += n[i, a]
    for i in range(n.shape[0]):
        theta[i, a] = pooled / count
    count_terms(terms, 0, a, count, private)


@jit(inline=True)
def _exchange(client: np.ndarray, r: int, u: int, v: int, scalars: int, itemsize: int) -> None:
    """Two peer messages of ``scalars`` scalars, u → v and v → u, in the agents' traffic array ``client``: each end
    sends one and receives one (:func:`~fedrec.protocols.kernels.ledger.tally`)."""
    tally(client, r, u, PEER, SENT, scalars, itemsize)
    tally(client, r, v, PEER, RECEIVED, scalars, itemsize)
    tally(client, r, v, PEER, SENT, scalars, itemsize)
    tally(client, r, u, PEER, RECEIVED, scalars, itemsize)


@jit(inline=True)
def _gossip_edge(theta: np.ndarray, edges: np.ndarray, client: np.ndarray, r: int, state: np.uint64, t: int,
                 bytes_per_scalar: int) -> None:
    """Lines 16–22: the ends of round t's uniformly random edge (u, v) of ``edges`` (``state``: the edge stream's)
    average their ϑ (W(t) of eq. 9/13) and exchange them, two peer messages of M scalars."""
    E, M = edges.shape[0], theta.shape[1]
    e = min(int(uniform(state, t) * E), E - 1)
    u = edges[e, 0]
    v = edges[e, 1]
    for k in range(M):
        avg = (theta[u, k] + theta[v, k]) * 0.5
        theta[u, k] = avg
        theta[v, k] = avg
    _exchange(client, r, u, v, M, bytes_per_scalar)


@jit
def _gossip_replicate(r: int, io: Rounds, graph: Graph, cfg: GossipSettings, st: GossipState, env: RewardSource,
                      traffic: PeerTraffic) -> None:
    """Rounds t0 + 1 … t0 + steps of Gossip_UCB / Fed_UCB or a baseline (``cfg.mode``, module docstring) in
    replicate ``r``; ``io.initialise`` first plays time 0. A round: ``GOSSIP`` propagates the counts, every agent
    chooses and observes, then ``CENTRAL`` pools the pulled arm's observations, ``GOSSIP`` averages over one edge,
    and ``GOSSIP`` and ``LOCAL`` add each agent's change of X̃ to its ϑ (eq. 9/13)."""
    mode, noisy = cfg.mode, cfg.scale > 0.0
    N, M = st.n.shape[1], st.n.shape[2]
    choice, reward, edge = _streams(r, cfg, env, N, M)
    if io.initialise:
        _initialise(r, st, env, reward, mode == CENTRAL)
    n, ntil, x0, sums, xbar, theta = st.n[r], st.ntil[r], st.x0[r], st.sums[r], st.xbar[r], st.theta[r]
    regret, means, best = st.regret[r], env.global_means[r], env.global_means[r].max()
    arms, keep = io.arms[r], io.arms.shape[1] == io.steps
    indptr, indices, edges, client = graph.indptr, graph.indices, graph.edges, traffic.client
    terms = _arm_terms(n, mode == CENTRAL, cfg.privacy_factor > 0.0)
    ev = np.empty((3, M))
    nxt = np.empty((N, M), dtype=np.int64)  # ñ(t+1)
    target = nxt if cfg.consistency_fresh else ntil  # what the consistency rule holds n against
    chosen = np.empty(N, dtype=np.int64)
    delta = np.empty(N)  # X̃(t) − X̃(t−1) of each agent's pulled arm
    noise = NoiseSettings(cfg.key_noise, LAPLACE, cfg.scale, cfg.noise_empty_intervals)
    last, prev, node, value = st.noise_last, st.noise_prev, st.noise_node, st.noise_value
    levels, out = np.empty(MAX_LEVELS, dtype=np.int64), np.empty(1)
    for s in range(io.steps):
        rnd = _round(io.t0 + s + 1, cfg)
        t = rnd.t
        if mode == GOSSIP:
            _propagate_counts(n, ntil, indptr, indices, nxt)
        _choose_arms(rnd, n, target, theta, terms, ev, choice, chosen)
        cover = cover_of(t, levels) if noisy else Cover(t, levels, 0)
        for i in range(N):
            a = chosen[i]
            x = draw_reward_from(env, reward[i, a], r, i, a, t)
            z = _tree_noise(noise, (r * N + i) * M + a, cover, last, prev, node, value, out) if noisy else 0.0
            delta[i] = _observe(n, x0, sums, xbar, i, a, x, z)
            if mode != CENTRAL:
                count_terms(terms, i, a, n[i, a], rnd.private)
            regret[i] += best - means[a]
            if keep:
                arms[s, i] = a
        if mode == CENTRAL:
            _pool_arm(n, x0, sums, theta, chosen[0], terms, rnd.private)
            continue
        if mode == GOSSIP:
            _gossip_edge(theta, edges, client, r, edge, t, cfg.bytes_per_scalar)
            for i in range(N):
                for k in range(M):
                    ntil[i, k] = nxt[i, k]
        for i in range(N):
            theta[i, chosen[i]] += delta[i]


#: (serial, parallel over replicates), each called as ``kernel(replicates, io, graph, cfg, st, env, traffic)``
GOSSIP_RUN = over_replicates(_gossip_replicate)
