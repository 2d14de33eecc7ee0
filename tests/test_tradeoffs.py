"""Qualitative claims of the Async-LinUCB paper on small worlds, `slow` ones at paper size: communication falls and
regret rises as γ grows (from centralised to independent learning); Async-LinUCB-AM's regret falls and its
communication rises with the global dimension (Fig. 3); Async beats Sync on communication at matched regret under
skewed arrivals (Fig. 2b)."""
from __future__ import annotations

import math

import pytest
import torch

from fedrec.envs.synthetic import LinearEnv
from fedrec.protocols import AsyncLinUCB, AsyncLinUCBAM, SyncLinUCB


def _regret(arms: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    return (expected.max(-1).values - expected.gather(2, arms.unsqueeze(-1)).squeeze(-1)).sum(1)


def _sweep(make, values, env, T):
    it = env.interactions(0, T)
    out = []
    for v in values:
        p = make(v)
        arms = p.run(it.clients, it.contexts, it.rewards)
        out.append((_regret(arms, it.expected).mean().item(),
                    p.ledger.totals()["comm_messages"].double().mean().item()))
    return out


def _monotone_tradeoff(N: int, T: int, replicates: int) -> None:
    env = LinearEnv(num_clients=N, replicates=replicates, seed=1)
    gammas = [1.2, 2.0, 5.0, 50.0, math.inf]
    res = _sweep(lambda g: AsyncLinUCB(N, 25, replicates=replicates, gamma_u=g, gamma_d=g), gammas, env, T)
    regrets, comms = zip(*res)
    assert all(a > b for a, b in zip(comms, comms[1:])), comms  # C_T falls as γ grows ...
    assert comms[-1] == 0
    assert regrets[0] < regrets[2] < regrets[-1], regrets  # ... and R_T rises, from centralised to independent


def test_async_tradeoff_is_monotone_in_gamma():
    _monotone_tradeoff(N=40, T=2000, replicates=2)


@pytest.mark.slow
def test_async_tradeoff_is_monotone_in_gamma_at_paper_size():
    _monotone_tradeoff(N=1000, T=30000, replicates=3)


def _am_sweep(N: int, T: int, replicates: int, dgs: list[int]) -> None:
    res = []
    for dg in dgs:
        env = LinearEnv(num_clients=N, replicates=replicates, seed=2, global_dim=dg)
        it = env.interactions(0, T)
        p = AsyncLinUCBAM(N, 25, replicates=replicates, global_dim=dg, gamma_u=5.0, gamma_d=5.0)
        arms = p.run(it.clients, it.contexts, it.rewards)
        res.append((_regret(arms, it.expected).mean().item(),
                    p.ledger.totals()["comm_messages"].double().mean().item()))
    regrets, comms = zip(*res)
    assert all(a > b for a, b in zip(regrets, regrets[1:])), regrets  # R_T falls as d_g grows (Fig. 3) ...
    assert all(a < b for a, b in zip(comms, comms[1:])), comms  # ... and C_T rises


def test_am_regret_falls_and_communication_rises_with_global_dim():
    _am_sweep(N=30, T=2000, replicates=2, dgs=[5, 15, 24])


@pytest.mark.slow
def test_am_global_dim_sweep_at_paper_size():
    _am_sweep(N=1000, T=30000, replicates=3, dgs=[4, 8, 12, 16, 20, 24])


@pytest.mark.slow
def test_async_beats_sync_on_communication_under_skewed_arrivals():
    """Fig. 2b: at matched regret Async needs fewer messages than Sync when arrivals are skewed (Zipf)."""
    N, T, R = 1000, 30000, 3
    env = LinearEnv(num_clients=N, replicates=R, seed=3, arrival="zipf")
    async_res = _sweep(lambda g: AsyncLinUCB(N, 25, replicates=R, gamma_u=g, gamma_d=g), [2.0, 5.0, 20.0], env, T)
    sync_res = _sweep(lambda D: SyncLinUCB(N, 25, replicates=R, threshold=D), [3.0, 30.0, 300.0], env, T)

    def comm_at(res, regret):  # communication needed to reach ``regret``, interpolated on the sweep
        pts = sorted(res)
        for (r0, c0), (r1, c1) in zip(pts, pts[1:]):
            if r0 <= regret <= r1:
                return c0 + (c1 - c0) * (regret - r0) / (r1 - r0)
        return None

    matched = [(comm_at(async_res, r), c) for r, c in sync_res if comm_at(async_res, r) is not None]
    assert matched, (async_res, sync_res)
    assert all(a < s for a, s in matched), matched
