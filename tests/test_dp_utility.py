"""scripts/dp_utility.py: its bias baseline against a least-squares solver, and its runs in MF's summed setting (a
few rounds on small synthetic ratings: what they spend and report)."""
from __future__ import annotations

import argparse
import math

import numpy as np
import pytest
from scipy.sparse import csr_matrix, hstack
from scipy.sparse.linalg import lsqr

from fedrec.data.synthetic import synthetic_ratings
from fedrec.privacy.accountant import sampled_noise_multiplier
from scripts.dp_utility import DELTA, bias_baseline, run


@pytest.fixture(scope="module")
def small() -> object:
    return synthetic_ratings(users=300, items=80, ratings=6_000, rounds=4, seed=1, val_fraction=0.1)


def test_the_bias_baseline_is_the_ridge_least_squares_fit(small: object) -> None:
    """Its alternating sweeps converge to the ridge solution of μ + b_u + b_i (μ the mean, unpenalised), which lsqr
    finds on the one-hot design; the ridge is the grid's best by validation RMSE."""
    data = small
    tr = data.training_until(data.rounds - 1)
    u, i, r = np.asarray(tr.user), np.asarray(tr.item), np.asarray(tr.rating, dtype=np.float64)
    reg, n = 5.0, len(r)
    design = hstack([csr_matrix((np.ones(n), (np.arange(n), u)), shape=(n, data.num_users)),
                     csr_matrix((np.ones(n), (np.arange(n), i)), shape=(n, data.num_items))]).tocsr()
    b = lsqr(design, r - r.mean(), damp=math.sqrt(reg), atol=1e-12, btol=1e-12, iter_lim=10_000)[0]
    bu, bi = b[:data.num_users], b[data.num_users:]
    pred = np.clip(r.mean() + bu[np.asarray(data.test.user)] + bi[np.asarray(data.test.item)], 0.0, 1.0)
    want = float(np.sqrt(np.mean((pred - np.asarray(data.test.rating, dtype=np.float64)) ** 2)))
    assert bias_baseline(data, regs=(reg,), sweeps=200)["test_rmse"] == pytest.approx(want, abs=1e-6)
    grid = (0.5, 5.0, 50.0)
    best = bias_baseline(data, regs=grid)
    assert best["val_rmse"] == min(bias_baseline(data, regs=(g,))["val_rmse"] for g in grid)
    assert best["reg"] in grid


def _args(**given: object) -> argparse.Namespace:
    settings = dict(pseudo_items=0, client_clip=0.1, server_clip=1.0, sample_rate=0.5, adaptive_clip=True,
                    target_quantile=0.5, server_momentum_lr=None, dim=4, lr=0.05, weight_decay=2.0, summed=True,
                    init_std=0.05, init_bias=0.6, user_solve=True, device="cpu", item_solve=False,
                    item_ridge=30.0, reference_ridge=None, factor_scale=25.0, average_from=4, count_power=0.0,
                    ridge_per_noise=None, noise_ridge=0.0, count_average=False, noise_schedule=None,
                    accountant="rdp")
    return argparse.Namespace(**{**settings, **given})


@pytest.mark.parametrize("placement", ["server", "client"])
def test_a_private_summed_run_spends_its_budget_and_reports_it(small: object, placement: str) -> None:
    row = run(small, "mf", placement, 8.0, _args())
    assert row["placement"] == placement and 0 < row["epsilon_spent"] <= 8.0 and row["noise_multiplier"] > 0
    assert math.isfinite(row["test_rmse"]) and 0 <= row["round"] < small.rounds
    assert row["sample_rate"] == (0.5 if placement == "server" else 1.0)


def test_the_prv_accountant_calibrates_server_placement_with_less_noise(small: object) -> None:
    """--accountant prv: the run's noise is PRV's calibration for the same ε (below RDP's), and it spends at most ε."""
    rows = {a: run(small, "mf", "server", 8.0, _args(accountant=a, adaptive_clip=False)) for a in ("rdp", "prv")}
    assert rows["prv"]["noise_multiplier"] == sampled_noise_multiplier(8.0, DELTA, 0.5, small.rounds, "prv")
    assert rows["prv"]["noise_multiplier"] < rows["rdp"]["noise_multiplier"]
    assert 7.9 <= rows["prv"]["epsilon_spent"] <= 8.0


def test_a_non_private_summed_run_learns_from_the_middle_of_the_scale(small: object) -> None:
    """μ starts at 0.6 and the run moves: its best round's validation RMSE is below that of predicting 0.6."""
    row = run(small, "mf", "server", math.inf, _args())
    start = float(np.sqrt(np.mean((0.6 - np.asarray(small.val.rating, dtype=np.float64)) ** 2)))
    assert row["placement"] == "none" and row["val_rmse"] < start


@pytest.mark.parametrize("epsilon", [8.0, math.inf])
def test_an_item_solve_run_is_private_only_with_noise(small: object, epsilon: float) -> None:
    """--item-solve: the private run spends its budget at server placement, the non-private one runs without
    noise."""
    args = _args(item_solve=True, reference_ridge=3.5, adaptive_clip=False, sample_rate=1.0, count_power=0.5,
                 ridge_per_noise=14.0)
    row = run(small, "mf", "server", epsilon, args)
    assert math.isfinite(row["test_rmse"])
    if math.isfinite(epsilon):
        assert 0 < row["epsilon_spent"] <= epsilon and row["noise_multiplier"] > 0
    else:
        assert row["placement"] == "none" and row["epsilon_spent"] is None
