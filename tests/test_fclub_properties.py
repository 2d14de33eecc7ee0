"""Structural properties of fedrec's FCLUB family from spec fclub.md §6 and §8, on fedrec's own buffers: the ε = ∞
limit, the degenerate L = 1 / one-cluster case, the trigger invariants and Lemma 4's staleness bound, no trigger on
a singular matrix, cluster recovery, and the accountant's ε against the budget and the exact Gaussian-DP ε."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.privacy.tree import TreeGaussian, fclub_accounted_sigma, fclub_epsilon, fclub_node_sigma, fclub_phases
from fedrec.protocols.fclub import FederatedClustering
from fedrec.tasks.bandit import BanditTask


@pytest.fixture(scope="module")
def env(data_dir: Path) -> ClusteredLinearEnv:
    return ClusteredLinearEnv(data_dir=data_dir, replicates=2, seed=5, chunk_size=500)


def play(p: FederatedClustering, env: ClusteredLinearEnv, steps: int) -> torch.Tensor:
    batch = env.interactions(0, steps)
    return p.run(batch.clients, batch.contexts, batch.rewards)


def test_infinite_epsilon_is_fclub_dc_decision_for_decision(env: ClusteredLinearEnv) -> None:
    """§6 test 5: the private code path with zero noise, ρ = κ = 0 and the λ ridge reproduces FCLUB-DC."""
    private = FederatedClustering(env.num_clients, env.dim, env.replicates,
                                  privacy=TreeGaussian(epsilon=math.inf, horizon=2000))
    plain = FederatedClustering(env.num_clients, env.dim, env.replicates)
    assert torch.equal(play(private, env, 2000), play(plain, env, 2000))
    assert torch.equal(private.ledger.traffic("server"), plain.ledger.traffic("server"))
    assert int(private.pcalls.max()) > 2  # the privatisers really released along the way


def test_one_server_and_one_cluster_is_homo_dc_until_a_deletion(data_dir: Path) -> None:
    """§6 test 9: with L = 1 and one true cluster FCLUB-DC is the pooled delayed LinUCB (Homo-DC) for as long as
    it keeps its users together: every arm is the same up to the phase start whose deletion test first splits the
    server (α₁ = 1.5 with the width F does split a single true cluster, §8.10), and with a deletion constant that
    never splits, over the whole run."""
    world = ClusteredLinearEnv(data_dir=data_dir, num_clients=8, num_clusters=1, num_servers=1, theta="ortho_cap",
                               replicates=2, seed=2, chunk_size=1000)
    batch = world.interactions(0, 4000)
    homo = FederatedClustering(8, world.dim, 2, num_servers=1, pooled=True)
    want = homo.run(batch.clients, batch.contexts, batch.rewards)
    whole = FederatedClustering(8, world.dim, 2, num_servers=1, delete_alpha=100.0)
    assert torch.equal(whole.run(batch.clients, batch.contexts, batch.rewards), want)
    for r in range(2):
        dc = FederatedClustering(8, world.dim, 1, num_servers=1)
        start = 0
        for s in range(1, 13):  # phase s starts at round 2^s − 1, i.e. before step index 2^s − 2
            stop = min(2 ** (s + 1) - 2, 4000)
            arms = dc.run(batch.clients[r:r + 1, start:stop], batch.contexts[r:r + 1, start:stop],
                          batch.rewards[r:r + 1, start:stop])
            if len(np.unique(dc.partition(0))) > 1:  # split at the start of phase s: equal before it
                assert start >= 500
                break
            assert torch.equal(arms[0], want[r, start:stop])
            start = stop


def lemma4_gamma2(U: float, D: float, members: int) -> float:
    """Γ² = D (1 + (L′ − 1)(U − 1)) + U − 1 (Lemma 4)."""
    return D * (1 + (members - 1) * (U - 1)) + U - 1


@pytest.mark.parametrize(("U", "D"), [(1.01, 1.01), (1.3, 1.1), (1.05, 2.0)])
def test_triggers_leave_every_cluster_within_lemma_4(env: ClusteredLinearEnv, U: float, D: float) -> None:
    """§6 test 4 after every round: det(S + ΔS)/det(S) < U, det(S^g)/det(S) < D, and the fully synchronised
    V_k = S^g + Σ ΔS satisfies λ_max(S^{-1/2} V_k S^{-1/2}) ≤ Γ² for every local cluster of global cluster k."""
    p = FederatedClustering(env.num_clients, env.dim, env.replicates, upload_threshold=U, download_threshold=D)
    batch = env.interactions(0, 400)
    worst = 0.0
    for s in range(400):
        p.run(batch.clients[:, s:s + 1], batch.contexts[:, s:s + 1], batch.rewards[:, s:s + 1])
        for r in range(env.replicates):
            for k in np.flatnonzero(p.nmem[r].numpy()):
                members = p.mem[r, k, : int(p.nmem[r, k])].numpy()
                Vk = p.Sg[r, k].numpy() + sum(p.dS[r, c].numpy() for c in members)
                for c in members:
                    S = p.S[r, c].numpy()
                    ld = np.linalg.slogdet(S)[1]
                    assert np.linalg.slogdet(S + p.dS[r, c].numpy())[1] - ld < math.log(U)
                    assert np.linalg.slogdet(p.Sg[r, k].numpy())[1] - ld < math.log(D)
                    w, Q = np.linalg.eigh(S)
                    root = Q @ np.diag(w ** -0.5) @ Q.T
                    top = np.linalg.eigvalsh(root @ Vk @ root).max()
                    assert top <= lemma4_gamma2(U, D, len(members)) + 1e-9
                    worst = max(worst, top)
    assert worst > 1.0  # the bound was exercised: clusters did lag


def test_no_trigger_fires_while_the_matrix_is_singular(env: ClusteredLinearEnv) -> None:
    """§8.14: a local cluster whose S is singular (NaN cached log-det) neither uploads nor downloads."""
    p = FederatedClustering(env.num_clients, env.dim, 1, upload_threshold=1.01, download_threshold=1.01)
    batch = env.interactions(0, 300)
    p.run(batch.clients[:1, :100], batch.contexts[:1, :100], batch.rewards[:1, :100])  # phase 6 runs to t = 126
    users = batch.clients[0, 100:120]
    c = int(p.lc[0, int(users[0])])
    p.S[0, c].zero_()
    p.Sinv[0, c].zero_()
    p.Slogdet[0, c] = math.nan
    server = int(p.server[c])
    before = p.ledger.traffic("server")[0, server].clone()
    for s in range(100, 120):
        if int(p.lc[0, int(batch.clients[0, s])]) != c:
            continue
        p.run(batch.clients[:1, s:s + 1], batch.contexts[:1, s:s + 1], batch.rewards[:1, s:s + 1])
        assert math.isnan(float(p.Slogdet[0, c]))
    assert float(p.dT[0, c]) > 0  # the cluster played and kept its observations in the buffer
    after = p.ledger.traffic("server")[0, server]
    assert torch.equal(after[0], before[0])  # no upload from the singular cluster's server


def test_clusters_are_recovered_on_a_well_separated_long_run(data_dir: Path) -> None:
    """§8.10: n = 12 users in m = 2 clusters with gap 1 on L = 3 servers (the middle server holds both clusters, the
    others one each), d = 5, 2^15 − 2 rounds: the final global partition is the truth (adjusted Rand index 1 through
    the bandit task) in every replicate, which takes local splitting and cross-server merging. Locally α₁ = 1.5
    still over-splits at this horizon (6, 6 and 4 local clusters for the 4 true ones); merging makes up for it."""
    world = ClusteredLinearEnv(data_dir=data_dir, num_clients=12, num_clusters=2, num_servers=3, dim=5,
                               theta="ortho_cap", replicates=3, seed=0, chunk_size=4096)
    p = FederatedClustering(12, 5, 3, num_servers=3, clusters_bound=2)
    task = BanditTask(world, p, steps=2 ** 15 - 2, steps_per_round=8192)
    for i in range(task.num_rounds):
        task.run_round(i)
    assert torch.equal(task.adjusted_rand_index(), torch.ones(3, dtype=torch.float64))
    assert torch.equal(p.metrics()["global_clusters"], torch.full((3,), 2.0, dtype=torch.float64))
    for r in range(3):  # local clusters refine (server ∩ true cluster): α₁ = 1.5 may over-split, never mix
        lc = p.lc[r].numpy()
        assert np.array_equal(world.clusters[lc], world.clusters) and np.array_equal(world.servers[lc], world.servers)


def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε of μ-GDP at δ: δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth & Su 2019), solved for ε."""
    gap = lambda eps: stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta  # noqa: E731
    if gap(0.0) <= 0:
        return 0.0
    hi = 1.0
    while gap(hi) > 0:
        hi *= 2
    return optimize.brentq(gap, 0.0, hi)


@pytest.mark.parametrize(("epsilon", "horizon"), [(1.0, 100_000), (0.25, 10_000), (4.0, 1000), (64.0, 100_000)])
@pytest.mark.parametrize("calibration", ["paper", "accountant"])
def test_accountant_epsilon_against_the_budget_and_the_exact_value(epsilon: float, horizon: int,
                                                                   calibration: str) -> None:
    """After every phase of a run of ``horizon`` rounds the accountant's ε bounds the exact ε of the same composition
    from above (k symmetric Gaussian nodes of multiplier z: μ = √k / z) and grows with the phases. With the
    accountant's calibration the whole run spends at most ε, and all of it; the paper's σ_N spends less than ε at
    small ε and more at ε = 64 (phases compose)."""
    delta = 0.1
    if calibration == "paper":
        sigma = fclub_node_sigma(epsilon, delta, horizon)
    else:
        sigma = fclub_accounted_sigma(epsilon, delta, horizon, horizon)
    z = sigma * math.sqrt(2) / 2.0  # symmetric noise, Δ = 2
    levels = (horizon + 1).bit_length()
    previous = 0.0
    for s in range(1, fclub_phases(horizon) + 1):
        spent = fclub_epsilon(sigma, delta, horizon, s)
        assert exact_gaussian_epsilon(math.sqrt(s * (levels + 1)) / z, delta) - 1e-9 <= spent
        assert spent >= previous
        previous = spent
    if calibration == "accountant":
        assert epsilon * (1 - 1e-9) <= previous <= epsilon
        assert fclub_epsilon(math.nextafter(sigma, 0.0), delta, horizon, fclub_phases(horizon)) > epsilon * (1 - 1e-6)
    elif epsilon <= 4:
        assert previous < epsilon
    else:
        assert previous > epsilon


def test_a_cdp_run_reports_the_accountant_epsilon(env: ClusteredLinearEnv) -> None:
    for calibration in ("paper", "accountant"):
        p = FederatedClustering(env.num_clients, env.dim, env.replicates,
                                privacy=TreeGaussian(epsilon=8.0, horizon=1000, calibration=calibration))
        play(p, env, 1000)
        sigma = p.kernel_views()["settings"].sigma_node
        want = fclub_epsilon(sigma, 0.1, 1000, int(p.phase))
        assert torch.equal(p.metrics()["epsilon_spent"], torch.full((2,), want, dtype=torch.float64))
        assert int(p.phase) == fclub_phases(1000)
        assert (want <= 8.0) if calibration == "accountant" else (want < 8.0)
    assert "epsilon_spent" not in FederatedClustering(env.num_clients, env.dim, 1).metrics()
