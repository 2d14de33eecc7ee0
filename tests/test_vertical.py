"""Vertical federated bandits (VFUCB / VFTS with the O3M mask; vfl spec §2–3, tests of §6).

Sections follow the spec's list of tests: mask validity, share aggregation, VFUCB ≡ LinUCB (Thm 4.1), VFTS ≡ LinTS
in law (Thm A.1), negative controls, communication accounting, documented leakage (§3.4), synthetic orderings,
partial baselines, bad input, and the six protocol configs end to end through the CLI. Everything is float64 and
seeded; statistical tolerances are derived from the sample sizes (z = 5 or a stated test level), never tuned.
"""
from __future__ import annotations

import copy
import functools
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from scipy import stats

from fedrec.app.cli import run
from fedrec.bandits.linear import TIE_TOLERANCE, LinTS, LinUCB
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.federation.vertical import Parties, check_partition, draw_mask, equal_partition, orthogonal_mask
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.protocols.vertical import VerticalLinearBandit
from fedrec.tasks.bandit import BanditTask

ROOT = Path(__file__).resolve().parents[1]

BETA, LAM, V_TS = 0.5, 1.0, 0.01  # the paper's synthetic settings (spec §4.1)
UCB = functools.partial(LinUCB, alpha=BETA, lam=LAM)
TS = functools.partial(LinTS, v=V_TS, lam=LAM)
Z = 5.0  # |estimate − truth| < Z standard errors: a two-sided 5σ band (p ≈ 6e-7 per check)


# ------------------------------------------------------------------------------------------------ helpers
def stream(d: int, K: int, T: int, R: int = 1, seed: int = 0) -> Any:
    """The paper's synthetic world (unit-norm contexts and θ, N(0, 0.05²) noise): T rounds of R replicates."""
    env = LinearEnv(num_clients=1, dim=d, num_arms=K, replicates=R, seed=seed, contexts="sphere", noise_std=0.05)
    return env.interactions(0, T)


def play(p: VerticalLinearBandit, batch: Any, start: int = 0, stop: int | None = None) -> torch.Tensor:
    sl = slice(start, stop)
    return p.run(batch.clients[:, sl], batch.contexts[:, sl], batch.rewards[:, sl])


def regret(batch: Any, arms: torch.Tensor) -> torch.Tensor:
    """Cumulative pseudo-regret per replicate of ``arms`` (R, T) on the first T rounds of ``batch``."""
    expected = batch.expected[:, : arms.shape[1]]
    chosen = expected.gather(2, arms.unsqueeze(-1)).squeeze(-1)
    return (expected.max(-1).values - chosen).sum(1)


def full_mask(p: VerticalLinearBandit) -> torch.Tensor:
    """Q = [Q^1, …, Q^M] (R, d, d) reassembled from the blocks the parties hold (only a test may do this)."""
    return torch.cat([p.parties.block(j) for j in range(p.parties.num_parties)], 2)


def rotate(Q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Q v per replicate: (R, d, d) × (R, d) -> (R, d)."""
    return torch.einsum("rij,rj->ri", Q, v)


def sandwich(Q: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Q A Qᵀ per replicate."""
    return Q @ A @ Q.transpose(1, 2)


def linf(a: torch.Tensor) -> float:
    return float(a.abs().max())


def rotated_lints(Q: torch.Tensor) -> type[LinTS]:
    """LinTS whose draw z_c = Qᵀ z_v, z_v being the draw the VFTS policy of the same seed and row makes."""

    class RotatedLinTS(LinTS):
        def standard_normals(self, rows: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
            z = super().standard_normals(rows, draws)
            return torch.einsum("mji,mj->mi", Q[rows].to(z), z)

    return RotatedLinTS


def ridge_ucb_reference(X: np.ndarray, Y: np.ndarray, D: np.ndarray, beta: float) -> tuple[np.ndarray, np.ndarray]:
    """A plain numpy LinUCB with a diagonal regulariser diag(D): arms (T,) and the final θ (d,).

    ``X`` (T, K, d) contexts, ``Y`` (T, K) rewards; Λ = diag(D) + Σ x xᵀ, solved afresh every round; ties go to the
    first arm within TIE_TOLERANCE of the best score (the spec's tie rule)."""
    T, K, d = X.shape
    A, b = np.diag(D).astype(np.float64), np.zeros(d)
    arms = np.empty(T, dtype=np.int64)
    for t in range(T):
        A_inv = np.linalg.inv(A)
        theta = A_inv @ b
        s = X[t] @ theta + beta * np.sqrt(np.einsum("kd,de,ke->k", X[t], A_inv, X[t]))
        a = int(np.flatnonzero(s >= s.max() - TIE_TOLERANCE)[0])
        arms[t] = a
        A += np.outer(X[t, a], X[t, a])
        b += X[t, a] * Y[t, a]
    return arms, np.linalg.solve(A, b)


# ============================================================================================ 1. mask validity
@pytest.mark.parametrize("partition", [(20, 20, 20, 20, 20), (1, 7, 92), (50, 50)])
def test_o3m_mask_is_square_orthogonal_and_split_into_column_blocks(partition: tuple[int, ...]) -> None:
    d, R = 100, 3
    p = VerticalLinearBandit(1, d, R, UCB, seed=4, partition=partition)
    Q = full_mask(p)
    eye = torch.eye(d, dtype=torch.float64)
    assert Q.shape == (R, d, d) and Q.dtype == torch.float64
    assert linf(Q.transpose(1, 2) @ Q - eye) < 1e-12
    assert linf(Q @ Q.transpose(1, 2) - eye) < 1e-12
    for j, dj in enumerate(partition):
        Qj = p.parties.block(j)
        assert Qj.shape == (R, d, dj)
        assert linf(Qj.transpose(1, 2) @ Qj - torch.eye(dj, dtype=torch.float64)) < 1e-12
        for i in range(len(partition)):
            if i != j:
                assert linf(p.parties.block(i).transpose(1, 2) @ Qj) < 1e-12  # Q^iᵀ Q^j = 0
    assert linf(sum(p.parties.block(j) @ p.parties.block(j).transpose(1, 2) for j in range(len(partition)))
                - eye) < 1e-12  # Σ_j Q^j Q^jᵀ = I
    # the blocks are the PMG's Q, cut into columns
    for r in range(R):
        assert torch.equal(Q[r], torch.from_numpy(draw_mask(d, 4, r)))
    # not a permutation / sign matrix: for a Haar d = 100 matrix the largest |q| is ~0.45
    assert float(Q.abs().max()) < 0.9
    # replicates and seeds get different masks
    assert linf(Q[0] - Q[1]) > 0.1 and linf(Q[1] - Q[2]) > 0.1
    other = full_mask(VerticalLinearBandit(1, d, R, UCB, seed=5, partition=partition))
    assert all(linf(other[r] - Q[r]) > 0.1 for r in range(R))


def test_mask_is_fixed_for_the_whole_run() -> None:
    d = 12
    batch = stream(d, 5, 50, R=2, seed=1)
    p = VerticalLinearBandit(1, d, 2, UCB, seed=2, partition=[4, 4, 4])
    before = full_mask(p).clone()
    play(p, batch)
    assert torch.equal(full_mask(p), before)


def test_gaussian_negative_control_mask_is_not_orthogonal() -> None:
    d = 50
    G = torch.from_numpy(draw_mask(d, 0, 0, kind="gaussian"))
    eye = torch.eye(d, dtype=torch.float64)
    assert linf(G.T @ G - eye) > 0.1 and linf(G @ G.T - eye) > 0.1
    with pytest.raises(ConfigError, match="mask"):
        draw_mask(d, 0, 0, kind="householder")


def test_o3m_mask_is_haar_distributed() -> None:
    """Haar on O(d): every entry has mean 0 and E q² = 1/d (q² ~ Beta(1/2, (d−1)/2)), and det = ±1 with probability
    1/2 each. A plain QR without the sign fix fails the first check (LAPACK makes q_11 = −|a_11|/‖a_1‖ < 0)."""
    d, n = 3, 4000
    rng = np.random.default_rng(12345)
    Qs = np.stack([orthogonal_mask(d, rng) for _ in range(n)])
    se_mean = math.sqrt(1.0 / (d * n))
    assert np.abs(Qs.mean(0)).max() < Z * se_mean
    var_sq = 2.0 * (d - 1) / (d * d * (d + 2))
    assert np.abs((Qs ** 2).mean(0) - 1.0 / d).max() < Z * math.sqrt(var_sq / n)
    dets = np.linalg.det(Qs)
    assert np.allclose(np.abs(dets), 1.0)
    assert abs((dets > 0).mean() - 0.5) < Z * math.sqrt(0.25 / n)
    # the check has power: without the sign correction the first column is not uniform on the sphere
    rng = np.random.default_rng(12345)
    plain = np.stack([np.linalg.qr(rng.standard_normal((d, d)))[0] for _ in range(n)])
    assert abs(plain[:, 0, 0].mean()) > 20 * se_mean


# ====================================================================================== 2. share aggregation
@pytest.mark.parametrize("partition", [(1, 7, 92), (20, 20, 20, 20, 20), (99, 1)])
def test_shares_sum_to_the_masked_context(partition: tuple[int, ...]) -> None:
    d, R = 100, 2
    p = VerticalLinearBandit(1, d, R, UCB, seed=6, partition=partition)
    Q = full_mask(p)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(R, 7, d, generator=g, dtype=torch.float64)  # (R, n, d) random (not unit) vectors
    total = sum(p.parties.share(j, x) for j in range(len(partition)))
    assert linf(total - torch.einsum("rij,rnj->rni", Q, x)) < 1e-12
    # the AP's assembly of a round's contexts (R, S, K, d)
    ctx = torch.randn(R, 3, 4, d, generator=g, dtype=torch.float64)
    assert linf(p.masked(ctx) - torch.einsum("rij,rskj->rski", Q, ctx)) < 1e-12


def test_each_party_share_reads_only_its_own_columns() -> None:
    d, partition = 100, (1, 7, 92)
    p = VerticalLinearBandit(1, d, 2, UCB, seed=6, partition=partition)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, d, generator=g, dtype=torch.float64)
    for j in range(len(partition)):
        own = p.parties.columns(j)
        others = torch.ones(d, dtype=torch.bool)
        others[own] = False
        y = x.clone()
        y[..., others] = torch.randn(2, 5, int(others.sum()), generator=g, dtype=torch.float64)
        assert torch.equal(p.parties.share(j, y), p.parties.share(j, x))
        z = x.clone()
        z[..., own] += 1.0
        assert linf(p.parties.share(j, z) - p.parties.share(j, x)) > 1e-3


# ================================================================================ 3. VFUCB ≡ central LinUCB
PAPER = dict(d=100, K=10, T=5000, seed=7, partition=[20] * 5)
CHECK_EVERY = 1000


@pytest.fixture(scope="module")
def paper_ucb() -> dict[str, Any]:
    """VFUCB and central LinUCB (mode=central) on the spec's synthetic setting, one seed, compared every 1000
    rounds; one extra round of contexts is kept to compare scores after the last update."""
    d, K, T, seed = PAPER["d"], PAPER["K"], PAPER["T"], PAPER["seed"]
    batch = stream(d, K, T + 1, R=1, seed=seed)
    vert = VerticalLinearBandit(1, d, 1, UCB, seed, mode="vertical", partition=PAPER["partition"])
    cent = VerticalLinearBandit(1, d, 1, UCB, seed, mode="central", partition=PAPER["partition"])
    Q = full_mask(vert)
    eye = torch.eye(d, dtype=torch.float64)
    arms_v, arms_c, errs = [], [], []
    for start in range(0, T, CHECK_EVERY):
        arms_v.append(play(vert, batch, start, start + CHECK_EVERY))
        arms_c.append(play(cent, batch, start, start + CHECK_EVERY))
        vp, cp = vert.policy, cent.policy
        vp.refresh()
        cp.refresh()
        theta_v, theta_c = vert.theta(), cent.theta()
        errs.append({
            "Lambda": linf(vp.V + LAM * eye - sandwich(Q, cp.V + LAM * eye)),
            "Lambda_inv": linf(vp.inv - sandwich(Q, cp.inv)),
            "u": linf(vp.b - rotate(Q, cp.b)),
            "theta": linf(theta_v - rotate(Q, theta_c)),
            "norm": linf(theta_v.norm(dim=-1) - theta_c.norm(dim=-1)),
            "shadow": linf(vert.central.policy.G - cp.G),  # the tracked central run is the central protocol
        })
    return dict(batch=batch, vert=vert, cent=cent, Q=Q, arms_v=torch.cat(arms_v, 1), arms_c=torch.cat(arms_c, 1),
                errs=errs)


def test_vfucb_chooses_the_central_arms_every_round(paper_ucb: dict[str, Any]) -> None:
    arms_v, arms_c = paper_ucb["arms_v"], paper_ucb["arms_c"]
    assert arms_v.shape == (1, PAPER["T"])
    assert torch.equal(arms_v, arms_c)
    assert len(torch.unique(arms_c)) == PAPER["K"]  # a non-trivial trajectory


def test_vfucb_cumulative_regret_equals_central(paper_ucb: dict[str, Any]) -> None:
    batch = paper_ucb["batch"]
    r_v, r_c = regret(batch, paper_ucb["arms_v"]), regret(batch, paper_ucb["arms_c"])
    assert torch.equal(r_v, r_c)
    assert 0 < float(r_c) < 100  # the spec's calibration: ~18 for full LinUCB at this size (§5.3)
    m = paper_ucb["vert"].metrics()
    assert abs(float(m["theta_norm_diff_central"])) < 1e-12  # Fig. 4(b): ‖θ̃‖ − ‖θ̂‖ ≡ 0


def test_masked_statistics_are_the_rotated_central_ones(paper_ucb: dict[str, Any]) -> None:
    """Λ̃ = QΛQᵀ, Λ̃^{-1} = QΛ^{-1}Qᵀ, ũ = Qu, θ̃ = Qθ̂ and ‖θ̃‖ = ‖θ̂‖ at t = 1000, 2000, …, 5000."""
    assert len(paper_ucb["errs"]) == PAPER["T"] // CHECK_EVERY
    for t, e in enumerate(paper_ucb["errs"], 1):
        assert e["Lambda"] < 1e-9 and e["Lambda_inv"] < 1e-9, (t * CHECK_EVERY, e)
        assert e["u"] < 1e-9 and e["theta"] < 1e-9 and e["norm"] < 1e-9, (t * CHECK_EVERY, e)
        assert e["shadow"] == 0.0, (t * CHECK_EVERY, e)
    vert, cent = paper_ucb["vert"], paper_ucb["cent"]
    assert float(vert.theta().norm()) > 0.5  # θ̂ has been learned (‖θ*‖ = 1), the comparison is not of zeros
    assert int(vert.policy.count[0]) == int(cent.policy.count[0]) == PAPER["T"]


def test_masked_scores_equal_clear_scores_after_the_run(paper_ucb: dict[str, Any]) -> None:
    batch, vert, cent = paper_ucb["batch"], paper_ucb["vert"], paper_ucb["cent"]
    T = PAPER["T"]
    X = batch.contexts[:, T]                          # (1, K, d): the next round's clear contexts
    Xt = vert.masked(batch.contexts[:, T:T + 1])[:, 0]  # the AP's x̃ = Σ_j Q^j x^j
    mean_v = torch.einsum("rkd,rd->rk", Xt, vert.theta())
    mean_c = torch.einsum("rkd,rd->rk", X, cent.theta())
    width_v = torch.einsum("rkd,rde,rke->rk", Xt, vert.policy.inv, Xt)
    width_c = torch.einsum("rkd,rde,rke->rk", X, cent.policy.inv, X)
    assert linf(mean_v - mean_c) < 1e-9 and linf(width_v - width_c) < 1e-9
    assert float(mean_c.abs().max()) > 0.1 and float(width_c.min()) > 0  # non-degenerate scores
    rows = torch.arange(1)
    s_v = vert.policy.scores(Xt, vert.policy.gather(rows))
    s_c = cent.policy.scores(X, cent.policy.gather(rows))
    assert linf(s_v - s_c) < 1e-9


def test_first_round_scores_tie_at_beta_and_the_first_arm_wins() -> None:
    """At t = 1, θ = 0 and Λ = I: every unit-norm arm scores exactly β in exact arithmetic (float rounding puts the
    masked scores ~1e-16 apart), so only the tolerant tie rule makes both runs pick arm 0."""
    d, K = 100, 10
    batch = stream(d, K, 1, R=3, seed=3)
    vert = VerticalLinearBandit(1, d, 3, UCB, 3, partition=[20] * 5, track_central=False)
    cent = VerticalLinearBandit(1, d, 3, UCB, 3, mode="central", partition=[20] * 5)
    rows = torch.arange(3)
    Xt = vert.masked(batch.contexts)[:, 0]
    s_v = vert.policy.scores(Xt, vert.policy.gather(rows))
    s_c = cent.policy.scores(batch.contexts[:, 0], cent.policy.gather(rows))
    assert linf(s_v - BETA) < 1e-12 and linf(s_c - BETA) < 1e-12
    arms_v, arms_c = play(vert, batch), play(cent, batch)
    assert torch.equal(arms_v[:, 0], torch.zeros(3, dtype=torch.long))
    assert torch.equal(arms_c[:, 0], torch.zeros(3, dtype=torch.long))


def test_vfucb_is_the_same_on_the_compiled_and_torch_backends() -> None:
    d = 20
    batch = stream(d, 10, 300, R=2, seed=9)
    runs = [VerticalLinearBandit(1, d, 2, UCB, 1, partition=[4] * 5, backend=b) for b in ("compiled", "torch")]
    arms = [play(p, batch) for p in runs]
    assert torch.equal(arms[0], arms[1])
    assert linf(runs[0].theta() - runs[1].theta()) < 1e-10


# ================================================================================== 4. VFTS ≡ LinTS in law
HIST = dict(d=8, K=5, n=12, v=0.3, partition=[2, 3, 3], draws=20000)


@pytest.fixture(scope="module")
def ts_history() -> dict[str, Any]:
    """A fixed history: 12 rounds of VFTS; the central statistics of the same (x_{s,a_s}, r_s) and the contexts of
    the next round, clear (X) and masked (X̃)."""
    d, K, n, v = HIST["d"], HIST["K"], HIST["n"], HIST["v"]
    batch = stream(d, K, n + 1, R=1, seed=2)
    p = VerticalLinearBandit(1, d, 1, functools.partial(LinTS, v=v, lam=LAM), 3, partition=HIST["partition"],
                             track_central=False)
    arms = play(p, batch, 0, n)[0]
    Q = full_mask(p)[0]
    steps = torch.arange(n)
    z = torch.cat([batch.contexts[0, steps, arms], batch.rewards[0, steps, arms].unsqueeze(-1)], 1)
    G = z.T @ z  # the centralized augmented Gram matrix [Σ x xᵀ, Σ x r; ·, ·]
    Lam = G[:d, :d] + LAM * torch.eye(d, dtype=torch.float64)
    X = batch.contexts[0, n]
    return dict(p=p, Q=Q, G=G, Gt=p.policy.G[0].clone(), Lam=Lam, theta=torch.linalg.solve(Lam, G[:d, d]), X=X,
                Xt=p.masked(batch.contexts[:, n:n + 1])[0, 0])


def posterior_scores(G: torch.Tensor, contexts: torch.Tensor, seed: int, sampler: str = "cholesky") -> torch.Tensor:
    """``draws`` LinTS score vectors (draws, K) for one fixed history ``G``: the library's own sampler, run on as
    many rows (each its own random stream) holding the same statistics."""
    N, d, K = HIST["draws"], HIST["d"], HIST["K"]
    pol = LinTS(d, v=HIST["v"], lam=LAM, batch_shape=(N,), seed=seed, sampler=sampler)
    rows = torch.arange(N)
    pol.broadcast_statistics(rows, G, HIST["n"])
    return pol.scores(contexts.expand(N, K, d).contiguous(), pol.gather(rows))


def test_fixed_history_masked_statistics_are_rotated(ts_history: dict[str, Any]) -> None:
    h, d = ts_history, HIST["d"]
    Q = h["Q"]
    assert linf(h["Gt"][:d, :d] - Q @ h["G"][:d, :d] @ Q.T) < 1e-12
    assert linf(h["Gt"][:d, d] - Q @ h["G"][:d, d]) < 1e-12
    assert abs(float(h["Gt"][d, d] - h["G"][d, d])) < 1e-12
    assert linf(h["Xt"] - h["X"] @ Q.T) < 1e-12


@pytest.mark.parametrize("sampler", ["cholesky", "symmetric"])
def test_vfts_score_vector_has_the_central_mean_and_covariance(ts_history: dict[str, Any], sampler: str) -> None:
    """X̃μ̃ over 20000 posterior draws: mean Xθ̂, covariance v²XΛ^{-1}Xᵀ. Each entry is checked to Z standard errors
    (Var of a sample covariance entry ≈ (Σ_ii Σ_jj + Σ_ij²)/N for Gaussian data)."""
    h, N = ts_history, HIST["draws"]
    S = posterior_scores(h["Gt"], h["Xt"], seed=11, sampler=sampler)
    mean = h["X"] @ h["theta"]
    cov = HIST["v"] ** 2 * h["X"] @ torch.linalg.inv(h["Lam"]) @ h["X"].T
    var = cov.diagonal()
    assert float((S.mean(0) - mean).abs().div((var / N).sqrt()).max()) < Z
    se_cov = ((var[:, None] * var[None, :] + cov ** 2) / N).sqrt()
    assert float((torch.cov(S.T) - cov).abs().div(se_cov).max()) < Z
    assert float(var.sqrt().min()) > 0.05  # the spread is large enough for the test to mean something


def test_vfts_chosen_arm_law_matches_central_lints(ts_history: dict[str, Any]) -> None:
    """Two-sample chi-square (level 1e-3) of the arm each posterior draw picks: VFTS on (G̃, X̃) against central
    LinTS on (G, X), independent streams. The same test rejects a wrong law (the masked posterior scoring clear
    contexts), so it has power here."""
    h, K = ts_history, HIST["K"]
    counts_v = torch.bincount(posterior_scores(h["Gt"], h["Xt"], seed=11).argmax(1), minlength=K)
    counts_c = torch.bincount(posterior_scores(h["G"], h["X"], seed=12).argmax(1), minlength=K)
    assert int((counts_c > 0.05 * HIST["draws"]).sum()) >= 2  # several arms are plausible
    table = np.stack([counts_v.numpy(), counts_c.numpy()])
    table = table[:, table.sum(0) > 0]
    assert stats.chi2_contingency(table).pvalue > 1e-3
    counts_w = torch.bincount(posterior_scores(h["Gt"], h["X"], seed=13).argmax(1), minlength=K)
    wrong = np.stack([counts_w.numpy(), counts_c.numpy()])
    assert stats.chi2_contingency(wrong[:, wrong.sum(0) > 0]).pvalue < 1e-6


def test_vfts_symmetric_sampler_matches_rotated_central_lints_path_by_path() -> None:
    """With the symmetric root S̃ = Q S Qᵀ and z_c = Qᵀz_v: X̃(θ̃ + vS̃z_v) = X(θ̂ + vSz_c), so both choose the same
    arm every round (spec §3.2 [CHECK]: 100%)."""
    d, K, T, R, v, seed = 20, 10, 300, 3, 0.1, 7
    batch = stream(d, K, T, R=R, seed=5)
    vert = VerticalLinearBandit(1, d, R, functools.partial(LinTS, v=v, lam=LAM, sampler="symmetric"), seed,
                                partition=[4] * 5, track_central=False)
    assert not vert.use_compiled()  # the symmetric root runs on the torch path
    Q = full_mask(vert)
    cent = CentralizedLinUCB(1, d, R, functools.partial(rotated_lints(Q), v=v, lam=LAM, sampler="symmetric"), seed)
    arms_v = play(vert, batch)
    arms_c = cent.run(batch.clients, batch.contexts, batch.rewards)
    assert torch.equal(arms_v, arms_c)
    assert linf(vert.theta() - rotate(Q, cent.policy.theta())) < 1e-9
    assert int(vert.policy.draws.min()) == T  # one draw per round


def test_vfts_cholesky_sampler_is_not_pathwise_identical() -> None:
    """chol(QΣQᵀ) ≠ Q chol(Σ): with the paper's Cholesky sampling, the same rotated draws do not give the same path
    (spec §3.2 [CHECK]: ~82% agreement). Here ~88–98% of the choices agree per replicate, never all of them."""
    d, K, T, R, v, seed = 20, 10, 300, 4, 0.1, 7
    batch = stream(d, K, T, R=R, seed=5)
    vert = VerticalLinearBandit(1, d, R, functools.partial(LinTS, v=v, lam=LAM), seed, partition=[4] * 5,
                                track_central=False)
    Q = full_mask(vert)
    cent = CentralizedLinUCB(1, d, R, functools.partial(rotated_lints(Q), v=v, lam=LAM), seed, backend="torch")
    agree = (play(vert, batch) == cent.run(batch.clients, batch.contexts, batch.rewards)).double().mean(1)
    assert float(agree.min()) > 0.5  # mostly the same (the law is the same) …
    assert float(agree.max()) < 1.0  # … but not sample by sample


def test_vfts_mean_regret_is_within_the_ci_of_central_lints() -> None:
    """8 seeds (replicates) of d = 20, K = 10, T = 1000, v = 0.01: the paired 99% t-interval of
    regret(VFTS) − regret(LinTS) contains 0, and a Welch test does not reject at 1%. The same interval excludes the
    partial(0.8) baseline, so the comparison has power."""
    d, K, T, R = 20, 10, 1000, 8
    batch = stream(d, K, T, R=R, seed=11)
    runs = {}
    for mode, kw in [("vertical", {}), ("central", {}), ("partial", dict(partial_ratio=0.8))]:
        p = VerticalLinearBandit(1, d, R, TS, 4, mode=mode, partition=[4] * 5, track_central=False, **kw)
        runs[mode] = regret(batch, play(p, batch)).numpy()
    t99 = stats.t.ppf(0.995, R - 1)

    def ci_contains_zero(a: np.ndarray, b: np.ndarray) -> bool:
        diff = a - b
        return abs(diff.mean()) <= t99 * diff.std(ddof=1) / math.sqrt(R)

    assert ci_contains_zero(runs["vertical"], runs["central"])
    assert stats.ttest_ind(runs["vertical"], runs["central"], equal_var=False).pvalue > 0.01
    assert not ci_contains_zero(runs["partial"], runs["central"])


# ================================================================================== 5. negative controls
NEG = dict(d=20, K=10, T=300, R=2, seed=7, partition=[4] * 5)


@pytest.fixture(scope="module")
def neg_setup() -> dict[str, Any]:
    batch = stream(NEG["d"], NEG["K"], NEG["T"], R=NEG["R"], seed=5)
    cent = VerticalLinearBandit(1, NEG["d"], NEG["R"], UCB, NEG["seed"], mode="central", partition=NEG["partition"])
    return dict(batch=batch, cent=cent, arms=play(cent, batch))


@pytest.mark.parametrize("control", [{}, {"refresh_mask": True}, {"mask": "gaussian"}],
                         ids=["o3m_fixed", "refresh_mask", "gaussian_mask"])
def test_negative_controls_break_lossless_recovery(neg_setup: dict[str, Any], control: dict[str, Any]) -> None:
    """The positive control (the O3M mask, fixed) reproduces central LinUCB in this setting; a fresh mask every
    round or a non-orthogonal mask does not (arms differ and θ̃ ≠ Qθ̂, Q being the last mask)."""
    p = VerticalLinearBandit(1, NEG["d"], NEG["R"], UCB, NEG["seed"], partition=NEG["partition"],
                             track_central=False, **control)
    arms = play(p, neg_setup["batch"])
    err = linf(p.theta() - rotate(full_mask(p), neg_setup["cent"].theta()))
    if not control:
        assert torch.equal(arms, neg_setup["arms"]) and err < 1e-9
        return
    assert not torch.equal(arms, neg_setup["arms"])
    assert err > 1e-6
    if control.get("refresh_mask"):  # the control is visible on the wire: the PMG sends d² scalars every round
        sent = p.ledger.per_endpoint("generator", "download", unit="scalars", side="sent")
        assert torch.equal(sent, torch.full((NEG["R"], 1), (NEG["T"] + 1) * NEG["d"] ** 2))


def test_non_isotropic_regulariser_breaks_equivalence_and_the_numpy_reference_matches_linucb(
        neg_setup: dict[str, Any]) -> None:
    """A plain numpy ridge LinUCB with regulariser diag(D): masked (x̃ = Qx) and clear runs agree for D = λI and
    diverge for a non-isotropic D (QDQᵀ ≠ D). At D = λI the reference is also an independent check of our LinUCB:
    the same arms as the library's central run, and the same θ̂."""
    d, r = NEG["d"], 0
    batch, cent = neg_setup["batch"], neg_setup["cent"]
    X, Y = batch.contexts[r].numpy(), batch.rewards[r].numpy()
    Q = torch.from_numpy(draw_mask(d, NEG["seed"], r)).numpy()
    Xt = X @ Q.T
    iso = np.full(d, LAM)
    arms_clear, theta_clear = ridge_ucb_reference(X, Y, iso, BETA)
    arms_masked, theta_masked = ridge_ucb_reference(Xt, Y, iso, BETA)
    assert np.array_equal(arms_clear, arms_masked)
    assert np.abs(theta_masked - Q @ theta_clear).max() < 1e-9
    assert np.array_equal(arms_clear, neg_setup["arms"][r].numpy())
    assert np.abs(theta_clear - cent.theta()[r].numpy()).max() < 1e-9
    aniso = np.linspace(0.1, 5.0, d)
    arms_clear, theta_clear = ridge_ucb_reference(X, Y, aniso, BETA)
    arms_masked, theta_masked = ridge_ucb_reference(Xt, Y, aniso, BETA)
    assert not np.array_equal(arms_clear, arms_masked)
    assert np.abs(theta_masked - Q @ theta_clear).max() > 1e-6


# ============================================================================ 6. communication accounting
def test_per_round_uploads_setup_downloads_and_bytes() -> None:
    d, K, R, partition = 12, 7, 2, (2, 3, 3, 4)
    M = len(partition)
    batch = stream(d, K, 5, R=R, seed=3)
    p = VerticalLinearBandit(1, d, R, UCB, 1, partition=partition)
    led = p.ledger

    def party(kind: str | None, unit: str, side: str) -> torch.Tensor:
        return led.per_endpoint("party", kind, unit=unit, side=side)

    # setup: the PMG sends party j its block Q^j, d·d_j scalars in one message; d² in total
    gen = led.per_endpoint("generator", "download", unit="scalars", side="sent")
    assert torch.equal(gen, torch.full((R, 1), d * d))
    assert torch.equal(party("download", "scalars", "received"), torch.tensor([[d * dj for dj in partition]] * R))
    assert torch.equal(party("download", "messages", "received"), torch.ones(R, M, dtype=torch.long))
    assert int(party("upload", "messages", "sent").sum()) == 0
    setup_received = party(None, "scalars", "received").clone()
    for t in range(1, 6):
        play(p, batch, t - 1, t)
        sent = party("upload", "messages", "sent")
        expected = torch.tensor([[0] + [K * t] * (M - 1)] * R)  # PP j sends its K shares every round; the AP none
        assert torch.equal(sent, expected)
        recv = party("upload", "messages", "received")
        assert torch.equal(recv[:, 0], torch.full((R,), K * (M - 1) * t)) and int(recv[:, 1:].sum()) == 0
        assert torch.equal(party("upload", "scalars", "sent"), d * sent)  # every share is one d-vector
        assert torch.equal(party("upload", "bytes", "sent"), 8 * d * sent)
        # passive parties receive nothing after setup; the AP only receives the shares
        assert torch.equal(party(None, "scalars", "received")[:, 1:], setup_received[:, 1:])
    assert int(led.per_endpoint("generator", None, unit="messages", side="received").sum()) == 0
    totals = led.totals()
    assert torch.equal(totals["comm_bytes"], 8 * totals["comm_scalars"])
    assert torch.equal(totals["comm_upload_scalars"], torch.full((R,), 5 * K * (M - 1) * d))
    m = p.metrics()
    assert torch.equal(m["comm_party0_received_scalars"], torch.full((R,), 5 * K * (M - 1) * d + d * partition[0]))
    assert torch.equal(m["comm_party2_sent_scalars"], torch.full((R,), 5 * K * d))


def test_the_ap_receives_masked_shares_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every upload that reaches the AP is a d-vector equal to the sender's masked share Q^j x^j, never the raw (or
    zero-padded raw) x^j; every download is a d × d_j mask block."""
    d, K, partition = 10, 4, (3, 3, 4)
    batch = stream(d, K, 3, R=1, seed=2)
    p = VerticalLinearBandit(1, d, 1, UCB, 1, partition=partition)
    seen: list[tuple[str, str, int, int, torch.Tensor]] = []
    deliver = p.channel.deliver

    def spy(kind: str, payload: Any, sender: Any, receiver: Any) -> Any:
        seen.append((kind, sender[0], int(sender[1][0]), int(receiver[1][0]), payload.clone()))
        return deliver(kind, payload, sender, receiver)

    monkeypatch.setattr(p.channel, "deliver", spy)
    play(p, batch)
    assert seen and all(kind == "upload" and role == "party" and to == 0 for kind, role, _, to, _ in seen)
    for _, _, j, _, payload in seen:
        assert payload.shape[-1] == d
        raw = batch.contexts[..., p.parties.columns(j)]
        share = torch.einsum("rij,rskj->rski", p.parties.block(j), raw)
        assert linf(payload - share) < 1e-15
        padded = torch.zeros_like(batch.contexts)
        padded[..., p.parties.columns(j)] = raw
        assert linf(payload - padded) > 1e-3


@pytest.mark.parametrize("mode", ["central", "partial"])
def test_central_and_partial_runs_send_nothing(mode: str) -> None:
    batch = stream(10, 4, 20, R=2, seed=1)
    p = VerticalLinearBandit(1, 10, 2, UCB, 1, mode=mode, partition=[5, 5], partial_ratio=0.5)
    play(p, batch)
    assert all(int(v.sum()) == 0 for v in p.ledger.totals().values())
    assert all(int(v.sum()) == 0 for k, v in p.metrics().items() if k.startswith("comm_"))


def test_paper_communication_figure() -> None:
    """Fig. 5(c): K·M·d elements of 8 bytes per step (the paper's bound counts the AP's own share, which the ledger
    does not send): the ledger's per-step bytes on small runs of several shapes are K·(M−1)·d scalars of 8 bytes,
    so at d = K = 1000, M = 5 the paper's count is 4.0e7 B = 0.04 GB, and 0.2 GB at d = 5000, not the paper's
    6.25 GB (an ambiguity of the paper's figure: its stated formula gives 0.2 GB)."""
    for d, K, partition, T in ((10, 6, (2, 2, 2, 2, 2), 3), (9, 4, (3, 3, 3), 2), (8, 5, (1, 7), 2)):
        M = len(partition)
        p = VerticalLinearBandit(1, d, 1, UCB, 1, partition=partition)
        play(p, stream(d, K, T, seed=0))
        totals = p.ledger.totals()
        assert int(totals["comm_upload_bytes"][0]) == K * (M - 1) * d * 8 * T
        assert int(totals["comm_upload_bytes"][0]) == 8 * int(totals["comm_upload_scalars"][0])


# ================================================================================ 7. documented leakage
def test_documented_leakage_and_theorem_4_2() -> None:
    """What the AP can learn (spec §3.4, recorded, not claimed away), and the non-uniqueness argument of Thm 4.2."""
    d, partition, n = 12, (3, 4, 5), 30
    p = VerticalLinearBandit(1, d, 1, UCB, 8, partition=partition)
    Q = full_mask(p)[0]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    xt = sum(p.parties.share(j, x) for j in range(3))[0]  # (n, d): what the AP assembles
    for j in range(3):
        raw = x[0, :, p.parties.columns(j)]
        share = p.parties.share(j, x)[0]
        Qj = p.parties.block(j)[0]
        # 1. norms leak
        assert linf(share.norm(dim=-1) - raw.norm(dim=-1)) < 1e-12
        # 2. inner products leak: the Gram matrix of a party's shares is its raw Gram matrix
        assert linf(share @ share.T - raw @ raw.T) < 1e-12
        # 4. every share lies in span(Q^j), a d_j-dimensional subspace
        assert linf(share - share @ Qj @ Qj.T) < 1e-12
        # 5. known plaintext: d_j independent (x^j, Q^j x^j) pairs reveal Q^j
        dj = partition[j]
        assert linf(torch.linalg.solve(raw[:dj], share[:dj]).T - Qj) < 1e-9
        # a masked share is not the zero-padded raw vector
        padded = torch.zeros(n, d, dtype=torch.float64)
        padded[:, p.parties.columns(j)] = raw
        assert linf(share - padded) > 0.1
        # Thm 4.2: (Q^j R, Rᵀ x^j) gives the same share for any orthogonal R, and Q^j R is still orthonormal
        Rj = torch.from_numpy(orthogonal_mask(dj, np.random.default_rng(j)))
        assert linf((Qj @ Rj) @ (Rj.T @ raw.T) - share.T) < 1e-12
        assert linf((Qj @ Rj).T @ (Qj @ Rj) - torch.eye(dj, dtype=torch.float64)) < 1e-12
        assert linf(Rj.T @ raw.T - raw.T) > 0.1  # … from a different raw vector
    # the aggregate x̃'s Gram matrix is the raw one; the AP recovers its own block: Q^1ᵀ x̃ = x^1
    assert linf(xt @ xt.T - x[0] @ x[0].T) < 1e-12
    assert linf(xt @ p.parties.block(0)[0] - x[0, :, p.parties.columns(0)]) < 1e-12
    # Thm 4.2 with the whole mask: (QR, Rᵀx) reproduces D = Qx
    Rf = torch.from_numpy(orthogonal_mask(d, np.random.default_rng(99)))
    assert linf((Q @ Rf) @ (Rf.T @ x[0].T) - xt.T) < 1e-12


def test_ap_recovers_its_block_of_the_central_estimate() -> None:
    """Q^1ᵀ θ̃ = θ̂^1: the AP learns its own coordinates of the centralized estimate."""
    d, partition = 12, (3, 4, 5)
    batch = stream(d, 5, 200, R=1, seed=4)
    p = VerticalLinearBandit(1, d, 1, UCB, 2, partition=partition)
    play(p, batch)
    own = p.theta()[0] @ p.parties.block(0)[0]
    assert linf(own - p.central.policy.theta()[0, p.parties.columns(0)]) < 1e-9


# ============================================================================== 8. synthetic orderings
def ordering_regrets(d: int, K: int, T: int, R: int, seed: int = 0) -> dict[tuple[str, str], np.ndarray]:
    env = LinearEnv(num_clients=1, dim=d, num_arms=K, replicates=R, seed=seed, contexts="sphere", noise_std=0.05)
    out = {}
    for name, pol in [("ucb", UCB), ("ts", TS)]:
        for method, kw in [("central", dict(mode="central")), ("vfl", dict(mode="vertical")),
                           ("p0.8", dict(mode="partial", partial_ratio=0.8)),
                           ("p0.2", dict(mode="partial", partial_ratio=0.2))]:
            p = VerticalLinearBandit(1, d, R, pol, seed, parties=5, track_central=False, **kw)
            task = BanditTask(env, p, T, steps_per_round=500)
            for i in range(task.num_rounds):
                task.run_round(i)
            out[name, method] = task.per_replicate()["cumulative_regret"].numpy()
    return out


def test_synthetic_orderings_small() -> None:
    """d = 40, K = 10, T = 1500, 3 seeds: central = VFUCB exactly; regret(p0.2) > regret(p0.8) > regret(full) in every
    seed, for UCB and TS."""
    r = ordering_regrets(40, 10, 1500, 3)
    assert np.array_equal(r["ucb", "vfl"], r["ucb", "central"])
    for name in ("ucb", "ts"):
        assert (r[name, "p0.2"] > r[name, "p0.8"]).all(), r
        assert (r[name, "p0.8"] > r[name, "vfl"]).all() and (r[name, "p0.8"] > r[name, "central"]).all(), r


@pytest.mark.slow
def test_synthetic_orderings_paper_setting() -> None:
    """Spec §6 test 9 at the paper's size (d = 100, K = 10, T = 5000, M = 5, 5 seeds): central = VFUCB ≪ p0.8 < p0.2,
    p0.2/full > 10 and p0.2 − full > 250 (Fig. 4, 6); the same ordering for TS, with VFTS ≈ LinTS."""
    r = ordering_regrets(100, 10, 5000, 5)
    assert np.array_equal(r["ucb", "vfl"], r["ucb", "central"])
    for name in ("ucb", "ts"):
        full, vfl = r[name, "central"].mean(), r[name, "vfl"].mean()
        p8, p2 = r[name, "p0.8"].mean(), r[name, "p0.2"].mean()
        assert vfl < p8 < p2 and full < p8, r
        assert p2 / full > 10 and p2 - full > 250, r
    t99 = stats.t.ppf(0.995, 4)
    diff = r["ts", "vfl"] - r["ts", "central"]
    assert abs(diff.mean()) <= t99 * diff.std(ddof=1) / math.sqrt(5)


# ==================================================================================== 9. partial mode
def test_partial_leading_columns() -> None:
    d, R = 100, 3
    p = VerticalLinearBandit(1, d, R, UCB, 1, mode="partial", partition=[20] * 5, partial_ratio=0.2,
                             partial_columns="leading")
    assert torch.equal(p.columns, torch.arange(20).expand(R, 20))  # at ratio d_1/d exactly the AP's block
    assert p.policy.dim == 20 and p.context_dim == d


@pytest.mark.parametrize(("ratio", "kept"), [(0.2, 20), (0.8, 80), (0.37, 37), (1.0, 100)])
def test_partial_random_columns(ratio: float, kept: int) -> None:
    d, R = 100, 3
    make = lambda seed: VerticalLinearBandit(1, d, R, UCB, seed, mode="partial", partition=[20] * 5,  # noqa: E731
                                             partial_ratio=ratio, partial_columns="random")
    p = make(5)
    cols = p.columns
    assert cols.shape == (R, kept) and p.policy.dim == kept
    assert all(len(torch.unique(c)) == kept and int(c.min()) >= 0 and int(c.max()) < d for c in cols)
    assert torch.equal(cols, cols.sort(1).values)
    assert torch.equal(make(5).columns, cols)  # reproducible from the seed
    if kept < d:
        assert not torch.equal(cols[0], cols[1]) and not torch.equal(cols[1], cols[2])  # differs across replicates
        assert not torch.equal(make(6).columns, cols)
        assert not torch.equal(cols[0], torch.arange(kept))


def test_partial_run_is_linucb_on_the_kept_columns() -> None:
    d, K, T, R = 20, 6, 200, 2
    batch = stream(d, K, T, R=R, seed=3)
    p = VerticalLinearBandit(1, d, R, UCB, 4, mode="partial", partition=[4] * 5, partial_ratio=0.3)
    arms = play(p, batch)
    cols = p.columns
    x = torch.stack([batch.contexts[r][..., cols[r]] for r in range(R)])
    ref = CentralizedLinUCB(1, cols.shape[1], R, UCB, 4)
    assert torch.equal(arms, ref.run(batch.clients, x, batch.rewards))
    assert linf(p.theta() - ref.policy.theta()) == 0.0


# ===================================================================================== 10. bad input (API)
def vfl(**kw: Any) -> VerticalLinearBandit:
    args = dict(num_clients=1, dim=10, replicates=1, policy=UCB, seed=0, partition=[5, 5])
    args.update(kw)
    return VerticalLinearBandit(**args)


BAD_API = [
    (dict(partition=[5, 4]), r"partition.*sum.*10"),
    (dict(partition=[10, 10]), r"partition.*sum"),
    (dict(partition=[0, 5, 5]), r"partition.*non-empty"),
    (dict(partition=[10]), r"partition.*M >= 2"),
    (dict(partition=[2.5, 7.5]), r"partition.*integer"),
    (dict(partition=None, parties=1), r"parties"),
    (dict(policy=functools.partial(LinUCB, alpha=-1.0, lam=1.0)), r"alpha"),
    (dict(policy=functools.partial(LinTS, v=0.0, lam=1.0)), r"policy\.v must be > 0"),
    (dict(policy=functools.partial(LinTS, v=-1.0, lam=1.0)), r"\bv must"),
    (dict(mode="horizontal"), r"mode"),
    (dict(mask="permutation"), r"mask"),
    (dict(partial_columns="trailing"), r"partial_columns"),
    (dict(partial_ratio=0.0), r"partial_ratio"),
    (dict(partial_ratio=-0.5), r"partial_ratio"),
    (dict(partial_ratio=1.5), r"partial_ratio"),
]


@pytest.mark.parametrize(("kw", "pattern"), BAD_API, ids=[str(k) for k, _ in BAD_API])
def test_bad_protocol_arguments_name_the_field(kw: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        vfl(**kw)


def test_bad_partition_helpers_and_env() -> None:
    assert check_partition([1, 7, 92], 100) == (1, 7, 92)
    assert equal_partition(100, 5) == (20, 20, 20, 20, 20) and equal_partition(11, 3) == (4, 4, 3)
    with pytest.raises(ConfigError, match="parties"):
        equal_partition(3, 4)
    with pytest.raises(ConfigError, match="num_arms"):  # K < 1
        LinearEnv(num_clients=1, dim=10, num_arms=0, contexts="sphere")
    assert Parties((3, 4), 2).offsets == (0, 3, 7)


# ============================================================================================ 11. the CLI
QUICK = ("+experiment=vfl_synthetic", "replicates=2", "task.steps=40", "task.steps_per_round=10", "env.dim=10",
         "env.num_arms=6", "protocol.partition=[2,2,2,2,2]", "logger.tensorboard=false", "plots=false")
PROTOCOLS = ("vfucb", "vfts", "central_linucb", "central_lints", "partial_linucb", "partial_lints")

Compose = Callable[..., DictConfig]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory, compose_cfg: Compose) -> dict[str, tuple[dict[str, Any], Path]]:
    """The six protocols, each composed with +experiment=vfl_synthetic, run 40 steps through fedrec.app.cli.run."""
    base = tmp_path_factory.mktemp("vfl_cli")
    out = {}
    for proto in PROTOCOLS:
        out[proto] = (run(compose_cfg(*QUICK, f"protocol={proto}"), output_dir=base / proto), base / proto)
    return out


def test_experiment_config_is_the_paper_setting(compose_cfg: Compose) -> None:
    cfg = compose_cfg("+experiment=vfl_synthetic")
    assert (cfg.env.dim, cfg.env.num_arms, cfg.task.steps, cfg.replicates) == (100, 10, 5000, 5)
    assert list(cfg.protocol.partition) == [20] * 5 and cfg.protocol.mode == "vertical"
    assert cfg.protocol.policy.alpha == BETA and cfg.protocol.policy.lam == LAM
    assert compose_cfg("+experiment=vfl_synthetic", "protocol=vfts").protocol.policy.v == V_TS


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_every_vfl_protocol_runs_end_to_end(cli_runs: dict[str, Any], proto: str) -> None:
    summary, out = cli_runs[proto]
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["steps"] == 40 and summary["replicates"] == 2
    assert math.isfinite(summary["cumulative_regret"])
    assert math.isfinite(summary["theta_norm_diff_central"])
    d, K, M, T = 10, 6, 5, 40
    for j in range(M):
        assert {f"comm_party{j}_sent_scalars", f"comm_party{j}_received_scalars"} <= set(summary)
    if proto.startswith("vf"):
        assert summary["comm_party0_received_scalars"] == T * K * (M - 1) * d + d * 2
        assert summary["comm_party3_sent_scalars"] == T * K * d
        assert summary["comm_download_scalars"] == d * d
        assert summary["comm_bytes"] == 8 * summary["comm_scalars"]
    else:
        assert summary["comm_messages"] == 0 and summary["comm_party0_received_scalars"] == 0
    if proto.startswith("central"):
        assert summary["theta_norm_diff_central"] == 0.0
    if proto == "vfucb":
        assert abs(summary["theta_norm_diff_central"]) < 1e-12
    if proto.startswith("partial"):
        assert summary["theta_norm_diff_central"] != 0.0


def test_cli_vfucb_regret_equals_central_linucb(cli_runs: dict[str, Any]) -> None:
    vf, central = cli_runs["vfucb"][0], cli_runs["central_linucb"][0]
    assert vf["cumulative_regret_per_replicate"] == central["cumulative_regret_per_replicate"]
    assert vf["theta_norm_per_replicate"] == pytest.approx(central["theta_norm_per_replicate"], abs=1e-12)


@pytest.mark.parametrize("extra", [("protocol=vfucb",), ("protocol=vfts",), ("protocol=partial_lints",),
                                   ("protocol=vfucb", "protocol.refresh_mask=true")],
                         ids=["vfucb", "vfts", "partial_lints", "vfucb_refresh_mask"])
def test_cli_resume_matches_uninterrupted_run(compose_cfg: Compose, tmp_path: Path, extra: tuple[str, ...]) -> None:
    ov = (*QUICK, *extra, "trainer.checkpoint_every=1")
    full = run(compose_cfg(*ov), output_dir=tmp_path / "full")
    part = run(compose_cfg(*ov, "trainer.max_rounds=2"), output_dir=tmp_path / "part")
    assert part["steps"] == 20 and full["steps"] == 40
    ckpt = tmp_path / "part" / "checkpoints" / "last.ckpt"
    resumed = run(compose_cfg(*ov, f"ckpt_path={ckpt}"), output_dir=tmp_path / "resumed")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(resumed) == strip(full)


BAD_CLI = [
    (("protocol.partition=[10,10]",), "partition"),
    (("protocol.partition=[10]",), "partition"),
    (("protocol.partition=[0,5,5]",), "partition"),
    (("protocol.partial_ratio=0",), "partial_ratio"),
    (("protocol.partial_ratio=1.5",), "partial_ratio"),
    (("protocol.mode=horizontal",), "mode"),
    (("protocol.mask=permutation",), "mask"),
    (("protocol.partial_columns=trailing",), "partial_columns"),
    (("protocol.policy.alpha=-1",), "alpha"),
    (("protocol=vfts", "protocol.policy.v=0"), "policy.v"),
    (("env.num_arms=0",), "num_arms"),
]


@pytest.mark.parametrize(("overrides", "field"), BAD_CLI, ids=[" ".join(o) for o, _ in BAD_CLI])
def test_cli_bad_input_raises_config_error_naming_the_field(compose_cfg: Compose, tmp_path: Path,
                                                            overrides: tuple[str, ...], field: str) -> None:
    ov = [o for o in QUICK if not o.startswith(("protocol.partition", "env.dim"))]
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        run(compose_cfg(*ov, *overrides), output_dir=tmp_path)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(("overrides", "field"), BAD_CLI[:3] + BAD_CLI[8:10],
                         ids=[" ".join(o) for o, _ in BAD_CLI[:3] + BAD_CLI[8:10]])
def test_train_py_bad_input_exits_2_with_one_line_error(train_py: Callable[..., Any], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture, overrides: tuple[str, ...],
                                                        field: str) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py("+experiment=vfl_synthetic", f"hydra.run.dir={run_dir}", "logger.tensorboard=false", *overrides)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and err.endswith("\n"), err
    assert field in err and "Traceback" not in err
    assert not (run_dir / "summary.json").exists()


def test_train_py_subprocess_bad_partition_exits_2(tmp_path: Path) -> None:
    """The real command line: ``python train.py +experiment=vfl_synthetic protocol.partition=[10,10]``."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "+experiment=vfl_synthetic", "protocol.partition=[10,10]",
         f"hydra.run.dir={tmp_path / 'run'}", "logger.tensorboard=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "partition" in lines[0], proc.stderr
    assert "d = 100" in lines[0] and "[10, 10]" in lines[0]


# ===================================================================== resume contract and multi-agent input
@pytest.mark.parametrize("kw", [
    dict(),
    dict(policy=functools.partial(LinTS, v=0.1, lam=LAM)),
    dict(mode="partial", partial_ratio=0.5),
    dict(refresh_mask=True),
], ids=["vfucb", "vfts", "partial_random", "refresh_mask"])
def test_state_dict_resume_into_a_protocol_built_with_another_seed(kw: dict[str, Any]) -> None:
    """The protocols' resume contract (protocols/base.py: "whole state lives in buffers"; tests/test_engine.py
    resumes into a protocol built with seed=99): the checkpoint alone determines the rest of the run."""
    d, R, T, T1 = 6, 2, 40, 17
    batch = stream(d, 4, T, R=R, seed=1)
    args = dict(policy=UCB, partition=[3, 3])
    args.update(kw)
    whole = VerticalLinearBandit(1, d, R, seed=3, **args)
    arms = play(whole, batch)
    first = VerticalLinearBandit(1, d, R, seed=3, **args)
    head = play(first, batch, 0, T1)
    resumed = VerticalLinearBandit(1, d, R, seed=99, **args)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    tail = play(resumed, batch, T1)
    assert torch.equal(torch.cat([head, tail], 1), arms)
    assert torch.equal(resumed.theta(), whole.theta())


@pytest.mark.parametrize("mode", [
    "central",
    "vertical",
    "partial",
])
def test_several_agents_per_step_are_played_in_order_or_refused(mode: str) -> None:
    """Input that check_inputs accepts must either run (agents in order, as CentralizedLinUCB does) or be refused with
    the clean 'at most 1 agent(s) per step' error, not crash inside the protocol."""
    d, K, R, S, A = 6, 4, 2, 5, 2
    g = torch.Generator().manual_seed(0)
    ctx = torch.nn.functional.normalize(torch.randn(R, S, A, K, d, generator=g, dtype=torch.float64), dim=-1)
    rewards = torch.randn(R, S, A, K, generator=g, dtype=torch.float64)
    clients = torch.zeros(R, S, A, dtype=torch.long)
    p = VerticalLinearBandit(1, d, R, UCB, 0, mode=mode, partition=[3, 3], partial_ratio=0.5)
    try:
        arms = p.run(clients, ctx, rewards)
    except ValueError as e:
        assert "agent" in str(e), e
        return
    flat = VerticalLinearBandit(1, d, R, UCB, 0, mode=mode, partition=[3, 3], partial_ratio=0.5)
    ref = flat.run(clients.reshape(R, S * A), ctx.reshape(R, S * A, K, d), rewards.reshape(R, S * A, K))
    assert torch.equal(arms.reshape(R, S * A), ref)
