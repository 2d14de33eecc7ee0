"""Budget planners: BGTplanner's parts against closed forms (spec bgtplanner.md §7), budgets never overspent,
clean stops, the initial stage, exact resume, bad settings."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedrec.data import load_ratings
from fedrec.errors import ConfigError
from fedrec.models import MatrixFactorization
from fedrec.planners import ADAPPlanner, ADPMLPlanner, UniformPlanner
from fedrec.planners.bgtplanner import (
    BGTPlanner,
    RewardGP,
    action_levels,
    igw_gamma,
    igw_probabilities,
    solve_opt,
    upload_context,
)
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from tests.helpers import planner_task as make_task
from tests.helpers import tiny_fixture, write_ml1m

ROUNDS = 14


tiny = tiny_fixture(users=24, items=30, seed=2, rounds=ROUNDS, num_clients=6, val_fraction=0.2)


def small_bgt(**kw) -> BGTPlanner:
    return BGTPlanner(**{"num_actions": 3, "initial_rounds": 2, "min_rounds": 8, **kw})


# ------------------------------------------------------------------------------------------------ GP
def eq4(z1, t1, z2, t2, s, alpha):
    d2 = ((z1[:, None, :] - z2[None, :, :]) ** 2).sum(-1)
    return (1 - alpha) ** (np.abs(t1[:, None] - t2[None, :]) / 2) * np.exp(-d2 / (2 * s**2))


@pytest.mark.parametrize("alpha", [0.0, 0.001, 0.3])
def test_gp_posterior_equals_the_closed_form(alpha: float) -> None:
    rng = np.random.default_rng(0)
    z, t, r = rng.normal(size=(30, 4)) * 0.3, rng.permutation(40)[:30].astype(float), rng.normal(size=30)
    zq, tq = rng.normal(size=(7, 4)) * 0.3, rng.integers(0, 50, 7).astype(float)
    gp = RewardGP(lengthscale=0.2, temporal=alpha, noise=0.1)
    K = eq4(z, t, z, t, 0.2, alpha)
    assert np.allclose(gp.kernel(z, t, z, t), K, atol=1e-12, rtol=0)  # Eq. 4 entry by entry
    assert np.allclose(np.diag(K), 1.0) and np.allclose(K, K.T) and np.linalg.eigvalsh(K).min() > -1e-10
    ks = eq4(zq, tq, z, t, 0.2, alpha)
    A = K + 0.01 * np.eye(30)
    mean, var = gp.posterior(z, t, r, zq, tq)
    assert np.allclose(mean, ks @ np.linalg.solve(A, r), atol=1e-8)  # Eq. 5
    assert np.allclose(var, 1 - np.einsum("ij,ji->i", ks, np.linalg.solve(A, ks.T)), atol=1e-8)


def test_gp_without_temporal_term_is_sklearns_rbf_gp() -> None:
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF

    rng = np.random.default_rng(1)
    z, r, zq = rng.normal(size=(20, 3)) * 0.2, rng.normal(size=20), rng.normal(size=(5, 3)) * 0.2
    ref = GaussianProcessRegressor(RBF(0.2), alpha=0.01, optimizer=None, normalize_y=False).fit(z, r)
    mu, std = ref.predict(zq, return_std=True)
    mean, var = RewardGP(0.2, 0.0, 0.1).posterior(z, np.arange(20.0), r, zq, np.full(5, 3.0))
    assert np.allclose(mean, mu, atol=1e-8) and np.allclose(var, std**2, atol=1e-8)


# ------------------------------------------------------------------------------------------------ LP, IGW, constants
def test_lp_hand_solvable_instance() -> None:
    # two arms, two contexts; arm 1 is better everywhere but costs 2 against 1; budget allows mean cost 1.5
    rhat = np.array([[0.0, 0.0], [1.0, 3.0]])
    assert solve_opt(rhat, np.array([1.0, 2.0]), bound=1.5) == pytest.approx((3.0 + 0.0) / 2 + 0.0)
    # slack budget: the best arm everywhere
    assert solve_opt(rhat, np.array([1.0, 2.0]), bound=10.0) == pytest.approx(2.0)
    # only the cheap arm affordable
    assert solve_opt(rhat, np.array([1.0, 2.0]), bound=1.0) == pytest.approx(0.0)


@settings(max_examples=50, deadline=None)
@given(scores=st.lists(st.floats(-5, 5), min_size=2, max_size=8), gamma=st.floats(0, 1e3))
def test_igw_is_a_distribution_with_the_rest_on_the_argmax(scores, gamma) -> None:
    s = torch.tensor(scores, dtype=torch.float64)
    p = igw_probabilities(s, gamma)
    best = int(torch.argmax(s))
    assert bool((p >= 0).all()) and float(p.sum()) == pytest.approx(1.0)
    assert float(p[best]) >= 1 / len(scores) - 1e-12
    others = [a for a in range(len(scores)) if a != best]
    assert torch.allclose(p[others], 1 / (len(scores) + gamma * (s[best] - s[others])))


def test_igw_limits_and_empirical_frequencies() -> None:
    s = torch.tensor([0.1, 0.5, 0.2])
    assert torch.allclose(igw_probabilities(s, 0.0), torch.full((3,), 1 / 3))
    assert torch.allclose(igw_probabilities(torch.zeros(4), 50.0), torch.full((4,), 0.25))
    assert float(igw_probabilities(s, 1e9)[1]) > 1 - 1e-6
    p = igw_probabilities(s, 5.0).numpy()
    draws = np.random.default_rng(0).choice(3, size=100_000, p=p / p.sum())
    assert np.allclose(np.bincount(draws) / 1e5, p, atol=0.005)


def test_paper_constants() -> None:
    assert igw_gamma(5, 100, 874) == pytest.approx(0.7041, abs=1e-4)
    assert igw_gamma(5, 100, 943) == pytest.approx(0.6779, abs=1e-4)
    assert igw_gamma(5, 100, 605) == pytest.approx(0.8459, abs=1e-4)
    levels = action_levels(10.0, 100, 70, 5)
    assert torch.allclose(levels, torch.tensor([0.1, 0.1107143, 0.1214286, 0.1321429, 0.1428571], dtype=torch.float64))
    code = action_levels(10.0, 100, 70, 5, grid="code")
    assert torch.allclose(code, torch.tensor([0.1, 0.1085714, 0.1171429, 0.1257143, 0.1342857], dtype=torch.float64))


def test_context_is_descending_and_permutation_invariant() -> None:
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.random((60, 80)) < 0.1).astype(float))
    x = upload_context(X, 5)
    assert len(x) == 5 and np.all(np.diff(x) <= 0)
    assert np.allclose(x, np.linalg.svd(X.toarray(), compute_uv=False)[:5], rtol=1e-5)
    perm = X[rng.permutation(60)][:, rng.permutation(80)]
    assert np.allclose(upload_context(perm, 5), x, rtol=1e-5)
    assert np.allclose(upload_context(sp.csr_matrix(np.eye(3)), 5), [1, 1, 1, 0, 0])  # padded past the rank


# ------------------------------------------------------------------------------------------------ runs
PLANNERS = {
    "uniform": lambda seed: UniformPlanner(),
    "adpml": lambda seed: ADPMLPlanner(),
    "adap": lambda seed: ADAPPlanner(initial_scale=1.5, growth=1.5, max_scale=4.0),
    "bgtplanner": lambda seed: small_bgt(seed=seed),
    "bgtplanner_scaled": lambda seed: small_bgt(seed=seed, scale_features=True, rho="remaining"),
}


class Audit(FederatedTrainer):
    """A trainer that checks the accountant after every round."""

    def __init__(self, **kw):
        super().__init__(enable_progress_bar=False, **kw)
        self.max_spent: list[float] = []

    def _hook(self, name, task, *args):
        super()._hook(name, task, *args)
        if name == "on_round_end":
            self.max_spent.append(float(task.privacy.spent().max()))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(planner=st.sampled_from(sorted(PLANNERS)), mechanism=st.sampled_from(["gaussian", "laplace"]),
       epsilon=st.sampled_from([0.5, 2.0, 8.0]), seed=st.integers(0, 100))
def test_no_planner_ever_overspends_and_each_stops_cleanly(tiny, planner, mechanism, epsilon, seed) -> None:
    task = make_task(tiny, mechanism, epsilon)
    p = PLANNERS[planner](seed)
    trainer = Audit(callbacks=[p])
    hist = trainer.fit(task)
    assert all(s <= epsilon for s in trainer.max_spent)
    assert float(task.privacy.spent().max()) <= epsilon
    assert len(hist) == len(p.budgets) == len(p.rewards)
    assert len(hist) == ROUNDS or (trainer.should_stop and p.stopped_for_budget)
    assert all(h["clients"] == tiny.num_clients for h in hist)  # the planner only sets affordable budgets


def test_bgtplanner_initial_stage_then_random_levels(tiny) -> None:
    p = small_bgt(seed=3, min_rounds=14)
    task = make_task(tiny, epsilon=50.0)  # ample: the run must not end early
    FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(task)
    A, T0 = 3, 2
    assert p.actions[: A * T0] == [0, 0, 1, 1, 2, 2]
    assert len(p.stage2_errors) == T0 and len(p.z) == len(p.actions) == ROUNDS
    assert p.big_lambda is not None and p.big_lambda > 0 and p.M > 0
    assert np.allclose(p.budgets, p.levels[p.actions].numpy())
    assert float(p.dual.sum()) == pytest.approx(1.0) and bool((p.dual > 0).all())
    assert len(set(p.dual[:-1].tolist())) == 1  # identical clients keep identical duals


def test_dual_penalises_overspending_under_the_source_sign_and_not_the_printed_one(tiny) -> None:
    for paper_sign, grows in ((False, True), (True, False)):
        p = small_bgt(paper_sign=paper_sign)  # levels B/14 .. B/8
        task = make_task(tiny, epsilon=50.0)
        p.on_fit_start(None, task)
        p.rho, p.big_lambda = float(p.levels[0]), 1.0
        before = float(p.dual[:-1].sum())
        p._pending = {"action": 2, "context": [1.0] * 5, "round": 10}
        p.observe(task, 10, float(p.levels[2]), 0.0)  # the most expensive level, in the main stage
        after = float(p.dual[:-1].sum())
        assert (after > before) == grows
        assert float(p.dual.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("planner", ["adap", "bgtplanner"])
def test_planner_resumes_with_the_same_choices(tiny, tmp_path: Path, planner: str) -> None:
    def fit(root, max_rounds=None, ckpt=None):
        p = PLANNERS[planner](7)
        task = make_task(tiny, epsilon=50.0)
        FederatedTrainer(default_root_dir=root, max_rounds=max_rounds, enable_progress_bar=False,
                         callbacks=[p]).fit(task, ckpt_path=ckpt)
        return p, task

    full, full_task = fit(tmp_path / "full")
    fit(tmp_path / "part", max_rounds=8)  # stops inside BGTplanner's main stage (initial stage: 8 rounds)
    resumed, resumed_task = fit(tmp_path / "resumed", ckpt=tmp_path / "part" / "checkpoints" / "last.ckpt")
    assert resumed.budgets == full.budgets and resumed.rewards == full.rewards
    assert torch.equal(resumed_task.privacy.spent(), full_task.privacy.spent())
    if planner == "bgtplanner":
        assert resumed.actions == full.actions and torch.equal(resumed.dual, full.dual)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_actions": 1}, "planner.num_actions"),
    ({"initial_rounds": 0}, "planner.initial_rounds"),
    ({"min_rounds": ROUNDS + 1}, "planner.min_rounds"),
    ({"rho": "half"}, "planner.rho"),
    ({"lengthscale": 0.0}, "planner.lengthscale"),
])
def test_bgtplanner_rejects_bad_settings_by_name(tiny, kwargs, field) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        FederatedTrainer(callbacks=[small_bgt(**kwargs)], enable_progress_bar=False).fit(make_task(tiny))


def test_planners_need_privacy_and_a_validation_split(tiny, tmp_path_factory) -> None:
    torch.manual_seed(0)
    plain = FedRecTask(tiny, MatrixFactorization(tiny.num_users, tiny.num_items, 4), FedSGD(), rounds=ROUNDS)
    with pytest.raises(ConfigError, match="privacy"):
        FederatedTrainer(callbacks=[UniformPlanner()], enable_progress_bar=False).fit(plain)
    folder = write_ml1m(tmp_path_factory.mktemp("noval"), users=24, items=30, seed=2)
    no_val = load_ratings("ml-1m", folder, seed=0, rounds=ROUNDS, num_clients=6)
    with pytest.raises(ConfigError, match="data.val_fraction"):  # ADAP reads the reward (schedules do not)
        FederatedTrainer(callbacks=[ADAPPlanner()], enable_progress_bar=False).fit(make_task(no_val))
    FederatedTrainer(callbacks=[ADAPPlanner(reward_split="test")], enable_progress_bar=False).fit(make_task(no_val))
    with pytest.raises(ConfigError, match="privacy.epsilon"):
        ClientDP(6, "gaussian", epsilon=0.0)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_paper_defaults_end_the_run_between_73_and_94_rounds(tmp_path_factory, mechanism: str) -> None:
    """Spec §7.3: with A = 5, T0 = 5, T = 100, T_min = 70 the 30-round initial stage spends 35.4–37.5% of the
    budget and the rest lasts 43–64 rounds, whatever the planner picks."""
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m100"), users=24, items=30, seed=3)
    data = load_ratings("ml-1m", folder, seed=0, rounds=100, num_clients=6, val_fraction=0.2)
    p = BGTPlanner(seed=5)
    task = make_task(data, mechanism, epsilon=10.0)
    hist = FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(task)
    assert p.actions[:25] == [a for a in range(5) for _ in range(5)]
    assert len(p.stage2_errors) == 5 and p.big_lambda is not None
    assert 73 <= len(hist) <= 94 and p.stopped_for_budget
    assert float(task.privacy.spent().max()) <= 10.0


def test_initial_stage_plays_the_top_affordable_level_instead_of_stopping(tiny) -> None:
    """Review finding: a stage-① block level that is no longer affordable must not end the run while a cheaper
    level is (here T_min = 2 makes the top level half the budget)."""
    p = small_bgt(min_rounds=2, seed=1)
    task = make_task(tiny, "laplace", epsilon=3.0)
    hist = FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(task)
    lowest = float(p.levels[0])
    assert float(task.privacy.spent().max()) > 3.0 - lowest  # it stopped only when even the lowest level failed
    assert p.actions[4] < 2 and len(hist) > 4


def test_a_hand_set_rdp_order_off_opacus_grid_completes_the_uniform_split(tiny) -> None:
    """Review finding: budgets split at α = 3.402 were refused in the last round when only Opacus's default
    orders were evaluated."""
    dp = ClientDP(tiny.num_clients, "gaussian", epsilon=10.0, delta=1e-5, rdp_alpha=3.402)
    torch.manual_seed(0)
    task = FedRecTask(tiny, MatrixFactorization(tiny.num_users, tiny.num_items, 4), FedSGD(), dp, rounds=ROUNDS,
                      pseudo_items=3)
    hist = FederatedTrainer(callbacks=[UniformPlanner()], enable_progress_bar=False).fit(task)
    assert len(hist) == ROUNDS and 9.99 < float(dp.spent().max()) <= 10.0


def test_adap_runs_every_round_and_spends_its_budget(tiny) -> None:
    p = ADAPPlanner(initial_scale=1.5, growth=1.5, max_scale=4.0)
    task = make_task(tiny, "laplace", epsilon=2.0)
    hist = FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(task)
    assert len(hist) == ROUNDS and not p.stopped_for_budget
    assert float(task.privacy.spent().max()) == pytest.approx(2.0, rel=1e-6)
    assert task.privacy.summary()["clip"] == 0.1 and p.summary()["planner_final_clip"] < 0.1


def test_context_of_a_rank_one_upload_matrix() -> None:
    """When every client uploads every item (400 pseudo items on a small catalogue) X^t is all ones: one singular
    value, then exact zeros (PROPACK returned a spurious second value here)."""
    X = sp.csr_matrix(np.ones((605, 120), dtype=np.float32))
    assert np.allclose(upload_context(X, 5), [math.sqrt(605 * 120), 0, 0, 0, 0], atol=1e-6)
