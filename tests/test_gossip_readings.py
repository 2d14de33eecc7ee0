"""The spec's alternative readings that bear on Fed_UCB's ε ratio (issue 29 item 2), each a flag, and what each one
changes: rewards kept in [0, 1] (``env.noise=clipped|bernoulli``), log₂ in eq. 12 (``privacy_log2``), ⌊log₂ T⌋ + 1
levels in ε' (``laplace_split=levels``) and the consistency rule against ñ(t+1) (``consistency_fresh``); the noise
on empty intervals (``noise_empty_intervals``) is tested in tests/test_gossip.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrec.envs.mab import MultiAgentMAB
from fedrec.errors import ConfigError
from fedrec.federation.topology import complete, ring
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import FedUCB
from fedrec.utils.rng import substream, uniform


def test_clipped_rewards_are_the_gaussian_ones_clipped() -> None:
    plain, clipped = (MultiAgentMAB(3, 4, 2, seed=7, noise=noise) for noise in ("gaussian", "clipped"))
    for t in range(300):
        arms = np.array([[t % 4, 1, 2], [3, 0, t % 4]])
        np.testing.assert_array_equal(clipped.rewards(arms, t), np.clip(plain.rewards(arms, t), 0.0, 1.0))


def test_clipped_reward_means_integrate_the_clipped_normal() -> None:
    env = MultiAgentMAB(3, 4, seed=2, noise="clipped", noise_std=0.8)
    z = np.linspace(-12, 12, 200001)
    density = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    expect = [[np.trapezoid(np.clip(m + 0.8 * z, 0, 1) * density, z) for m in row] for row in env.means[0]]
    np.testing.assert_allclose(env.reward_means[0], expect, rtol=0, atol=1e-9)
    np.testing.assert_allclose(env.global_means[0], np.mean(expect, axis=0), rtol=0, atol=1e-9)
    assert not np.allclose(env.global_means, env.means.mean(1))  # the regret's reference moved with the clip


def test_bernoulli_rewards_follow_their_uniforms() -> None:
    env = MultiAgentMAB(2, 3, seed=4, noise="bernoulli")
    state = substream(env.key, (0 * 2 + 1) * 3 + 2)  # stream (r·N + i)·M + k of replicate 0, agent 1, arm 2
    draws = np.array([env.reward(0, 1, 2, t) for t in range(20000)])
    expect = np.array([1.0 if uniform(np.uint64(state), t) < env.means[0, 1, 2] else 0.0 for t in range(20000)])
    np.testing.assert_array_equal(draws, expect)
    assert set(np.unique(draws)) == {0.0, 1.0}
    np.testing.assert_array_equal(env.global_means, env.means.mean(1))
    with pytest.raises(ConfigError, match="env.means"):
        MultiAgentMAB(2, 2, means=[[0.5, 1.5], [0.1, 0.2]], noise="bernoulli")


@pytest.mark.parametrize("noise", ["clipped", "bernoulli"])
def test_bounded_rewards_stay_in_the_unit_interval_through_fed_ucb(noise: str) -> None:
    env = MultiAgentMAB(3, 4, 2, seed=1, noise=noise)
    ps = [FedUCB(complete(3), 4, 400, 2, 3, TreeLaplace(2.0), backend=b) for b in ("compiled", "torch")]
    arms = [p.play(env, 400, return_arms=True) for p in ps]
    assert torch.equal(*arms)
    for p in ps:
        raw = (p.x0 + p.sums) / p.n
        assert raw.min() >= 0.0 and raw.max() <= 1.0


def test_privacy_log2_changes_the_log_factors_of_eq_12() -> None:
    N, T, eps, t = 3, 1000, 2.0, 77
    n = torch.arange(1, 400)
    nd = n.double()
    for log2 in (False, True):
        p = FedUCB(complete(N), 4, T, privacy=TreeLaplace(eps), privacy_log2=log2)
        lg = math.log2 if log2 else math.log
        expect = 64.0 / N**17 + torch.sqrt(2 * N * (128 * N * lg(T) ** 2 * lg(t) * torch.log(nd) / (nd**2 * eps**2)
                                                    + 1 / nd) * math.log(t))
        torch.testing.assert_close(p.width(n, t), expect, rtol=1e-12, atol=0)
    assert (FedUCB(complete(N), 4, T, privacy=TreeLaplace(eps), privacy_log2=True).width(n[1:], t)
            > FedUCB(complete(N), 4, T, privacy=TreeLaplace(eps)).width(n[1:], t)).all()


def test_levels_split_uses_one_more_level_at_a_power_of_two() -> None:
    for T, paper, levels in ((1024, 10, 11), (1000, 10, 10)):
        assert FedUCB(complete(3), 2, T, privacy=TreeLaplace(2.0)).scale == pytest.approx(paper / 2.0, rel=1e-12)
        assert FedUCB(complete(3), 2, T, privacy=TreeLaplace(2.0, laplace_split="levels")).scale == pytest.approx(
            levels / 2.0, rel=1e-12)


def test_consistency_fresh_tests_the_rule_against_the_new_estimate() -> None:
    """Round by round: with the flag, a lagging arm against ñ(t+1) = max(n(t), max_{j∈N_i} ñ_j(t)) is pulled
    whenever one exists; without it, against ñ(t). The two readings must part somewhere."""
    N, M, T = 6, 5, 600
    topo = ring(N)
    env = MultiAgentMAB(N, M, 2, seed=5)
    neighbours = [topo.indices[topo.indptr[i]:topo.indptr[i + 1]] for i in range(N)]
    runs = {}
    for fresh in (False, True):
        p = FedUCB(topo, M, T, 2, 9, TreeLaplace(1.0), consistency_fresh=fresh, backend="compiled")
        picks = []
        for _ in range(T):
            n, ntil = p.n.clone(), p.ntil.clone()
            a = p.play(env, 1, return_arms=True)[:, 0]
            if int(p.t) > 1:
                new = torch.stack([torch.maximum(n[:, i], ntil[:, nb].amax(1)) for i, nb in enumerate(neighbours)], 1)
                lagging = n < (new if fresh else ntil) - N
                chosen = lagging.gather(2, a.unsqueeze(-1)).squeeze(-1)
                assert (chosen | ~lagging.any(-1)).all()
            picks.append(a)
        runs[fresh] = torch.stack(picks)
    assert not torch.equal(runs[False], runs[True])
