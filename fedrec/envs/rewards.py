"""The reward draws of the multi-agent environments (:class:`~fedrec.envs.mab.MultiAgentMAB` and its subclasses),
compiled so that a protocol's step loop draws them itself (the gossip kernel,
:mod:`fedrec.protocols.kernels.gossip`).

A reward is a pure function of (key, replicate, agent, arm, t): draw t of the counter-based stream
(r·N + i)·M + k under the environment's key (:mod:`fedrec.utils.rng`), so no (T × N × M) tensor is ever built and any
round can be redrawn after a resume. An environment describes its rewards by a :class:`RewardSource`.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.utils.jit import F64, I64, jit
from fedrec.utils.rng import normal, substream, uniform

#: reward kinds: μ_{i,k} + σ·N(0, 1), a record drawn with replacement from the (i, k) pool, μ_{i,k} + σ·N(0, 1)
#: clipped to [0, 1], or Bernoulli(μ_{i,k})
GAUSSIAN, RECORDS, CLIPPED, BERNOULLI = 0, 1, 2, 3


class RewardSource(NamedTuple):
    """What a multi-agent environment's rewards are drawn from (its attributes of the same names)."""

    reward_kind: int  #: :data:`GAUSSIAN` or :data:`RECORDS`
    key: np.uint64  #: the key of the reward streams
    means: F64[3]  #: (R, N, M) μ_{i,k} (``GAUSSIAN``: the draws' means)
    noise_std: float  #: σ of ``GAUSSIAN``
    pool_ptr: I64[1]  #: (N·M + 1,) ``RECORDS``: pool (i, k) is pool_values[pool_ptr[i·M + k]:pool_ptr[i·M + k + 1]]
    pool_values: F64[1]  #: the pools' records, (agent, arm) major
    global_means: F64[2]  #: (R, M) μ_k = (1/N) Σ_i μ_{i,k}, the pseudo-regret's reference


@jit
def reward_stream(src: RewardSource, r: int, i: int, k: int) -> np.uint64:
    """The state of the reward stream of (replicate r, agent i, arm k): stream (r·N + i)·M + k under ``key`` (a step
    loop computes it once and draws from it with :func:`draw_reward_from`)."""
    return substream(src.key, (r * src.means.shape[1] + i) * src.means.shape[2] + k)


@jit
def draw_reward(src: RewardSource, r: int, i: int, k: int, t: int) -> float:
    """X_{i,k}(t) of replicate r (t = 0: the initialisation pull): draw t of stream (r·N + i)·M + k under ``key``
    (:func:`draw_reward_from` of :func:`reward_stream`)."""
    return draw_reward_from(src, reward_stream(src, r, i, k), r, i, k, t)


@jit
def draw_reward_from(src: RewardSource, state: np.uint64, r: int, i: int, k: int, t: int) -> float:
    """X_{i,k}(t) of replicate r drawn from its stream's ``state``.

    ``GAUSSIAN``: μ_{i,k} + σ·:func:`~fedrec.utils.rng.normal`; ``CLIPPED``: the same clipped to [0, 1].
    ``RECORDS``: the value ⌊u·size⌋ (u :func:`~fedrec.utils.rng.uniform`) of pool (i, k), a draw with replacement.
    ``BERNOULLI``: 1 if u < μ_{i,k}, else 0.
    """
    M = src.means.shape[2]
    if src.reward_kind == RECORDS:
        lo = src.pool_ptr[i * M + k]
        size = src.pool_ptr[i * M + k + 1] - lo
        return src.pool_values[lo + min(int(uniform(state, t) * size), size - 1)]
    if src.reward_kind == BERNOULLI:
        return 1.0 if uniform(state, t) < src.means[r, i, k] else 0.0
    x = src.means[r, i, k] + src.noise_std * normal(state, t)
    return min(max(x, 0.0), 1.0) if src.reward_kind == CLIPPED else x


@jit
def rewards_many(src: RewardSource, arms: np.ndarray, t: int) -> np.ndarray:
    """:func:`draw_reward` of every (replicate, agent) for ``arms`` (R, N) at round t: (R, N)."""
    R, N = arms.shape
    out = np.empty((R, N))
    for r in range(R):
        for i in range(N):
            out[r, i] = draw_reward(src, r, i, arms[r, i], t)
    return out


__all__ = ["BERNOULLI", "CLIPPED", "GAUSSIAN", "RECORDS", "RewardSource", "draw_reward", "draw_reward_from",
           "reward_stream", "rewards_many"]
