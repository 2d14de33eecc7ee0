"""Step loop of the decentralised bandits Gossip_UCB (Zhu et al. 2021, Algorithm 1) and Fed_UCB (Algorithm 4 with
the partial sums of Algorithm 2 and the Laplace noise of Algorithm 3), and the counter-based draws they and
:class:`~fedrec.envs.mab.MultiAgentMAB` share.

One call plays rounds ``t0 + 1 … t0 + steps`` of every replicate (``prange``: replicates are independent) in place
on the protocol's buffers (gossip spec §2.3 and §2.7, readings AMBIG-1…8):

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
* rewards: :func:`draw_reward` of stream (r·N + i)·M + k under the environment's key, draw t;
* noise: the binary mechanism of :mod:`fedrec.privacy.tree_noise` with Laplace nodes on stream (r·N + i)·M + k
  under ``key_noise`` — its own key, so that ε = ∞ (no noise drawn) reproduces Gossip_UCB draw for draw.

Noise memory is O(log T) per (replicate, agent, arm) (spec §2.6): per level l, the level-l node indices of the
two latest distinct nodes holding a pull of the arm (``last``, ``prev``) decide whether a node of t's cover is
empty, and the noise of the level's latest drawn node is cached with its index (``node``, ``value``):
:func:`~fedrec.privacy.tree_noise.mark_record` and :func:`~fedrec.privacy.tree_noise.cached_prefix_noise`.
"""
from __future__ import annotations

import numpy as np

from fedrec.federation.ledger import KINDS
from fedrec.jit import jit, parallel_variant, prange
from fedrec.privacy.tree_noise import LAPLACE, cached_prefix_noise, mark_record
from fedrec.protocols.kernels.client_server import record
from fedrec.rng import normal, substream, uniform

#: reward kinds of :func:`draw_reward`: μ_{i,k} + σ·N(0, 1), or a record drawn with replacement from the (i, k) pool
GAUSSIAN, RECORDS = 0, 1
#: ``mode`` of :data:`GOSSIP_RUN`: Gossip_UCB / Fed_UCB, local-only UCB1, centralised UCB (module docstring)
GOSSIP, LOCAL, CENTRAL = 0, 1, 2
#: the ledger's message kind of a gossip exchange
PEER = KINDS.index("peer")



@jit
def draw_reward(kind: int, key: np.uint64, means: np.ndarray, noise_std: float, pool_ptr: np.ndarray,
                pool_values: np.ndarray, r: int, i: int, k: int, t: int) -> float:
    """X_{i,k}(t) of replicate r (t = 0: the initialisation pull): draw t of stream (r·N + i)·M + k under ``key``.

    ``GAUSSIAN``: μ_{i,k} + σ·:func:`~fedrec.rng.normal`, ``means`` (R, N, M). ``RECORDS``: the value
    ⌊u·size⌋ (u :func:`~fedrec.rng.uniform`) of ``pool_values[pool_ptr[i·M + k] : pool_ptr[i·M + k + 1]]``, a draw
    with replacement.
    """
    M = means.shape[2]
    state = substream(key, (r * means.shape[1] + i) * M + k)
    if kind == RECORDS:
        lo = pool_ptr[i * M + k]
        size = pool_ptr[i * M + k + 1] - lo
        return pool_values[lo + min(int(uniform(state, t) * size), size - 1)]
    return means[r, i, k] + noise_std * normal(state, t)


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
def rewards_many(kind: int, key: np.uint64, means: np.ndarray, noise_std: float, pool_ptr: np.ndarray,
                 pool_values: np.ndarray, arms: np.ndarray, t: int) -> np.ndarray:
    """:func:`draw_reward` of every (replicate, agent) for ``arms`` (R, N) at round t: (R, N)."""
    R, N = arms.shape
    out = np.empty((R, N))
    for r in range(R):
        for i in range(N):
            out[r, i] = draw_reward(kind, key, means, noise_std, pool_ptr, pool_values, r, i, arms[r, i], t)
    return out


def _gossip_run(mode, t0, steps, initialise, indptr, indices, edges, key_choice, key_edge, key_noise, alpha1,
                two_n, privacy, privacy_log2, scale, noise_empty, fresh, kind, key_reward, means, noise_std, pool_ptr,
                pool_values, global_means, n, ntil, x0, sums, xbar, theta, last, prev, node, value, regret, arms_out,
                traffic, bps):
    """Rounds t0 + 1 … t0 + steps of Gossip_UCB / Fed_UCB or a baseline (``mode``, module docstring); ``initialise``
    first plays time 0 (every agent pulls every arm once: n = ñ = 1, X̃ = ϑ = X(0); ``CENTRAL``: ϑ = mean_i X(0)).
    ``two_n`` is the factor of ln t / n under the root (2N for eq. 11/12, 2 for the baselines).
    ``arms_out`` (R, steps, N) receives the arms when
    its second dimension equals ``steps``; ``scale`` = 0 means no noise (ε = ∞). ``last``, ``prev``, ``node``
    (R·N·M, L) and ``value`` (R·N·M, L, 1) are the tree's noise caches, one row per stream (r·N + i)·M + k."""
    R, N, M = n.shape
    E = edges.shape[0]
    keep = arms_out.shape[1] == steps
    for r in prange(R):
        nxt = np.empty((N, M), dtype=np.int64)
        q = np.empty(M)
        chosen = np.empty(N, dtype=np.int64)
        delta = np.empty(N)
        terms = np.empty((N, M, 3))  # count_terms of n (CENTRAL: of the pooled count, in row 0)
        noise = np.empty(1)  # the tree noise of one pull
        best = global_means[r].max()
        if initialise:
            for i in range(N):
                for k in range(M):
                    x = draw_reward(kind, key_reward, means, noise_std, pool_ptr, pool_values, r, i, k, 0)
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
            privacy_t = privacy * (log_t / np.log(2.0) if privacy_log2 else log_t)
            factor_t = two_n * log_t
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
                u = uniform(substream(key_choice, r * N + i), t)
                lagging = 0
                if mode == GOSSIP:
                    for k in range(M):
                        target = nxt[i, k] if fresh else ntil[r, i, k]
                        if n[r, i, k] < target - N:
                            lagging += 1
                a = -1
                if lagging > 0:
                    pick = min(int(u * lagging), lagging - 1)
                    for k in range(M):
                        target = nxt[i, k] if fresh else ntil[r, i, k]
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
                x = draw_reward(kind, key_reward, means, noise_std, pool_ptr, pool_values, r, i, a, t)
                n[r, i, a] += 1
                if mode != CENTRAL:
                    count_terms(terms[i, a], n[r, i, a], privacy > 0.0)
                sums[r, i, a] += x
                total = x0[r, i, a] + sums[r, i, a]
                if scale > 0.0:  # Alg. 2–3: mark the pull, add the noise of t's (non-empty) cover nodes
                    stream = (r * N + i) * M + a
                    mark_record(stream, t, last, prev)
                    cached_prefix_noise(key_noise, stream, t, LAPLACE, scale, noise_empty, last, prev, node, value,
                                        noise)
                    total += noise[0]
                mean = total / n[r, i, a]
                delta[i] = mean - xbar[r, i, a]
                xbar[r, i, a] = mean
                regret[r, i] += best - global_means[r, a]
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
                e = min(int(uniform(substream(key_edge, r), t) * E), E - 1)  # lines 16–22
                eu = edges[e, 0]
                ev = edges[e, 1]
                for k in range(M):
                    avg = (theta[r, eu, k] + theta[r, ev, k]) * 0.5
                    theta[r, eu, k] = avg
                    theta[r, ev, k] = avg
                record(traffic, eu, traffic, ev, r, PEER, M, bps)
                record(traffic, ev, traffic, eu, r, PEER, M, bps)
                for i in range(N):
                    for k in range(M):
                        ntil[r, i, k] = nxt[i, k]
            for i in range(N):
                theta[r, i, chosen[i]] += delta[i]


#: (serial, parallel over replicates)
GOSSIP_RUN = (jit(_gossip_run), jit(parallel_variant(_gossip_run), parallel=True))
