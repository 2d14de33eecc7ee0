"""Multi-agent multi-armed bandit environments whose rewards are drawn inside the compiled step loop (Zhu et al.,
SIGMETRICS 2021: its model and the synthetic experiments of §5).

Agent i observes a locally biased reward X_{i,k}(t) of mean μ_{i,k}; the global reward of arm k has the mean
μ_k = (1/N) Σ_i μ_{i,k} (Zhu et al. §2). A reward is a pure function of (key, replicate, agent, arm, t) through
:func:`fedrec.envs.rewards.draw_reward`, so no (T × N × M) tensor is ever built and any round can be redrawn after
a resume. An environment hands the kernel its :meth:`MultiAgentMAB.reward_source`: a reward kind and the arrays
that kind reads. ``GAUSSIAN`` (this class) reads ``means``; ``RECORDS`` reads per-(agent, arm) pools of observed
rewards (``pool_ptr``, ``pool_values``) to sample from with replacement, for real-data environments that set them
and their empirical ``means``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedrec.envs.rewards import BERNOULLI, CLIPPED, GAUSSIAN, RewardSource, draw_reward, rewards_many
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.utils.jit import build
from fedrec.utils.rng import stream_key
from fedrec.utils.seeding import numpy_generator

#: ``noise`` → the reward kind: the paper's μ + N(0, σ²) (unbounded), the same clipped to [0, 1], or Bernoulli(μ)
#: (both in [0, 1], as Fed_UCB's sensitivity-1 Laplace noise assumes;
#: the paper's Gaussian rewards break that assumption)
NOISES = {"gaussian": GAUSSIAN, "clipped": CLIPPED, "bernoulli": BERNOULLI}


class MultiAgentMAB:
    """N agents × M arms × R replicates with rewards μ_{i,k} + N(0, σ²) (the paper's synthetic setting, §5).

    Args:
        num_agents, num_arms, replicates: N, M, R.
        seed: the run seed; it keys the means and the reward stream.
        means: μ as (N, M) (the same for every replicate) or (R, N, M); None draws μ_{i,k} ~ U(0, 1) once per seed
            (fixed across trials, only the noise varies: the paper's "i.i.d. noise"), or once per (seed, replicate) with
            ``vary_means``.
        noise: ``"gaussian"`` (the paper), ``"clipped"`` (μ_{i,k} + N(0, σ²) clipped to [0, 1]) or ``"bernoulli"``
            (1 with probability μ_{i,k}, which must lie in [0, 1]; σ unused).
        noise_std: σ >= 0 (the paper: 1, which violates its [0, 1] support assumption; not clipped, as
            printed).
        vary_means: draw new means for every replicate.

    Attributes: ``means`` (R, N, M) the draws' parameters μ_{i,k}, ``reward_means`` (R, N, M) the rewards' means
    (μ_{i,k}, except under ``"clipped"``), ``global_means`` (R, M), ``best_arm`` (R,) (argmax of the global means),
    ``local_best`` (R, N), ``reward_kind``, ``key`` (uint64 of the reward stream).
    """

    #: the task kind it serves (:attr:`fedrec.tasks.FederatedTask.kind`); the builder refuses another
    kind = "multi_agent"

    name = "mab"
    #: the downloadable dataset the environment reads (see :attr:`fedrec.envs.base.BanditEnv.dataset`)
    dataset: str | None = None

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes its means take for ``sizes`` (``replicates``, ``num_agents``, ``num_arms``): one float64 per
        replicate, agent and arm, and at their peak the two more copies their draw makes (the replicates' arrays and
        their stack). Measured with the gossip protocols' state: 261 bytes per replicate, agent and arm against
        208 + 24 said (100 replicates, 10 to 150 agents, 50 arms, 20 rounds)."""
        return 3 * 8 * sizes["replicates"] * sizes["num_agents"] * sizes["num_arms"]

    def __init__(self, num_agents: int, num_arms: int, replicates: int = 1, seed: int = 0,
                 means: Any = None, noise: str = "gaussian", noise_std: float = 1.0, vary_means: bool = False) -> None:
        self.num_agents = check_int("env.num_agents", num_agents, minimum=1)
        self.num_arms = check_int("env.num_arms", num_arms, minimum=1)
        self.replicates = check_int("env.replicates", replicates, minimum=1)
        self.seed = check_int("env.seed", seed, minimum=0)
        self.noise = check_choice("env.noise", noise, NOISES)
        self.noise_std = check_float("env.noise_std", noise_std, low=0.0)
        R, N, M = self.replicates, self.num_agents, self.num_arms
        if means is None:
            if vary_means:
                mu = np.stack([numpy_generator(self.seed, "envs.mab.means", r).random((N, M)) for r in range(R)])
            else:
                mu = np.broadcast_to(numpy_generator(self.seed, "envs.mab.means").random((N, M)), (R, N, M))
        else:
            mu = np.asarray(means, dtype=np.float64)
            if mu.shape == (N, M):
                mu = np.broadcast_to(mu, (R, N, M))
            if mu.shape != (R, N, M):
                raise ConfigError(f"env.means must have shape ({N}, {M}) or ({R}, {N}, {M}), got {mu.shape}")
            if not np.isfinite(mu).all():
                raise ConfigError("env.means must be finite")
        if noise == "bernoulli" and not ((mu >= 0.0) & (mu <= 1.0)).all():
            raise ConfigError("env.means must lie in [0, 1] for env.noise=bernoulli")
        self.means = np.array(mu, order="C")  # a writable copy: a broadcast view is read-only, another kernel type
        self.key = stream_key(self.seed, "envs.mab.rewards")
        self.pool_ptr = np.zeros(N * M + 1, dtype=np.int64)
        self.pool_values = np.zeros(0)

    @property
    def reward_kind(self) -> int:
        """The :mod:`fedrec.envs.rewards` kind of ``noise`` (a real-data subclass sets its own)."""
        return NOISES[self.noise]

    @property
    def reward_means(self) -> np.ndarray:
        """The mean reward of every (replicate, agent, arm): μ_{i,k}, or under ``"clipped"`` E[min(max(μ + σZ, 0), 1)]
        = 1 − σ[g((1 − μ)/σ) − g(−μ/σ)] with g(z) = zΦ(z) + φ(z) (σ = 0: μ clipped)."""
        if self.reward_kind != CLIPPED:
            return self.means
        if self.noise_std == 0.0:
            return np.clip(self.means, 0.0, 1.0)
        sd = self.noise_std

        def g(z: float) -> float:
            return z * 0.5 * (1.0 + math.erf(z / math.sqrt(2.0))) + math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)

        return np.vectorize(lambda m: 1.0 - sd * (g((1.0 - m) / sd) - g(-m / sd)))(self.means)

    @property
    def global_means(self) -> np.ndarray:
        """μ_k = (1/N) Σ_i μ_{i,k} (of the rewards' means) per replicate: (R, M)."""
        return self.reward_means.mean(axis=1)

    @property
    def best_arm(self) -> np.ndarray:
        """argmax_k μ_k per replicate (R,)."""
        return self.global_means.argmax(axis=1)

    @property
    def local_best(self) -> np.ndarray:
        """argmax_k μ_{i,k} per replicate and agent (R, N)."""
        return self.reward_means.argmax(axis=2)

    def reward_source(self) -> RewardSource:
        """What :func:`~fedrec.envs.rewards.draw_reward` (and a step loop drawing rewards itself) reads, built by
        field name from this environment's attributes at the first draw and kept (the reward arrays are fixed once
        the environment is constructed; building and checking them costs several draws)."""
        if self.__dict__.get("_reward_source") is None:
            self._reward_source = build(RewardSource, self, global_means=np.ascontiguousarray(self.global_means))
        return self._reward_source

    def reward(self, replicate: int, agent: int, arm: int, t: int) -> float:
        """X_{agent,arm}(t) of ``replicate`` (t = 0: the initialisation pull), exactly as the kernel draws it."""
        return float(draw_reward(self.reward_source(), int(replicate), int(agent), int(arm), int(t)))

    def rewards(self, arms: np.ndarray, t: int) -> np.ndarray:
        """The rewards of ``arms`` (R, N) at round t: (R, N)."""
        return rewards_many(self.reward_source(), np.ascontiguousarray(arms, dtype=np.int64), int(t))


__all__ = ["MultiAgentMAB"]
