"""BGTplanner's fast parts against their references (issue 14, item 4): the context (ARPACK on the Gram operator
or dense Gram eigenvalues) against a dense SVD, the incremental GP against scikit-learn's refit posterior, the
affordability prefix against the accountant level by level, and whole runs against a planner that uses the
references, with the defaults unchanged."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from threadpoolctl import threadpool_info

import fedrec.planners.bgtplanner as bgt
from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.planners.bgtplanner import (
    DENSE_SIDE,
    BGTPlanner,
    IncrementalGP,
    RewardGP,
    gram_top_eigenvalues,
    single_thread,
    top_affordable_level,
    upload_context,
)
from fedrec.privacy import ClientDP
from fedrec.trainer import FederatedTrainer
from tests.helpers import planner_task, tiny_fixture, write_ml1m


def dense_context(X, dim: int = 5) -> np.ndarray:
    s = np.linalg.svd(X.toarray().astype(np.float64), compute_uv=False)[:dim]
    return np.pad(s, (0, dim - len(s)))


def assert_matches_svd(X, dim: int = 5) -> None:
    """Equal to a dense SVD to 1e-6 relative: each value to 1e-6 of itself, and zeros to 1e-6 of σ_max."""
    ref, got = dense_context(X, dim), upload_context(X, dim)
    assert got.shape == (dim,) and np.all(np.diff(got) <= 0) and np.all(got >= 0)
    assert np.allclose(got, ref, rtol=1e-6, atol=1e-6 * max(ref[0], 1e-300)), (got, ref)


def binary(rng: np.random.Generator, n: int, m: int, density: float) -> sp.csr_matrix:
    return sp.csr_matrix((rng.random((n, m)) < density).astype(np.float32))


# ------------------------------------------------------------------------------------------------ context
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 420), m=st.integers(1, 420), density=st.floats(0.0, 0.5), seed=st.integers(0, 10**6))
def test_context_equals_a_dense_svd_on_random_sparse_matrices(n, m, density, seed) -> None:
    assert_matches_svd(binary(np.random.default_rng(seed), n, m, density))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 400), m=st.integers(2, 400), rank=st.integers(1, 7), seed=st.integers(0, 10**6))
def test_context_of_rank_deficient_matrices_has_exact_zeros_past_the_rank(n, m, rank, seed) -> None:
    """0/1 matrices of rank ≤ ``rank`` (each row one of ``rank`` patterns): past the rank the values are 0.0."""
    rng = np.random.default_rng(seed)
    patterns = (rng.random((rank, m)) < 0.3).astype(np.float32)
    X = sp.csr_matrix(patterns[rng.integers(0, rank, n)])
    assert_matches_svd(X)
    r = np.linalg.matrix_rank(X.toarray())
    assert np.all(upload_context(X, 5)[r:] == 0.0)


@pytest.mark.parametrize(("n", "m"), [(605, 120), (300, 400), (943, 1682), (1, 50), (200, 1), (130, 129)])
def test_context_of_rank_one_matrices(n: int, m: int) -> None:
    """Every client uploads every item: one singular value √(n·m), then exact zeros (the case where PROPACK
    returned a spurious second value), on both the dense and the ARPACK route."""
    X = sp.csr_matrix(np.ones((n, m), dtype=np.float32))
    assert np.allclose(upload_context(X, 5), [math.sqrt(n * m), 0, 0, 0, 0], rtol=1e-12, atol=0)
    one_col = sp.csr_matrix((np.ones(n), (np.arange(n), np.zeros(n, dtype=int))), shape=(n, m))
    assert np.allclose(upload_context(one_col, 5), [math.sqrt(n), 0, 0, 0, 0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("shape", [(200, 300), (3, 3), (400, 150)])
def test_context_of_an_empty_upload_matrix_is_zero(shape) -> None:
    assert np.array_equal(upload_context(sp.csr_matrix(shape, dtype=np.float32), 5), np.zeros(5))


def test_context_of_repeated_singular_values_in_invariant_subspaces() -> None:
    """Repeated values where a single Krylov space closes early (identity, equal rank-one blocks, equal
    disjoint patterns): every copy is found. (A second copy in equal full-rank blocks, block_diag(B, B), is found
    only through rounding, as by any single-vector Krylov method: see gram_top_eigenvalues.)"""
    rng = np.random.default_rng(3)
    pattern = (rng.random(300) < 0.2).astype(np.float32)
    halves = np.zeros((2, 300), dtype=np.float32)
    halves[0, :150], halves[1, 150:] = pattern[:150], pattern[:150]  # two disjoint copies of one pattern
    for X in (sp.eye(300, 400), sp.csr_matrix(np.kron(np.eye(3), np.ones((60, 90)))),
              sp.csr_matrix(halves[np.arange(400) % 2]), sp.block_diag([np.ones((70, 80))] * 6)):
        assert_matches_svd(sp.csr_matrix(X))


def test_context_at_ml100k_size_with_skewed_popularity() -> None:
    """943 clients × 1682 items, popular items plus 50 random pseudo items each (the shape of X^t on ML-100K)."""
    rng = np.random.default_rng(0)
    popularity = rng.random(1682) ** 4
    X = (rng.random((943, 1682)) < 0.25 * popularity[None, :]) | (rng.random((943, 1682)) < 50 / 1682)
    X = sp.csr_matrix(X.astype(np.float32))
    ref, got = dense_context(X), upload_context(X, 5)
    assert np.allclose(got, ref, rtol=1e-7, atol=0)  # spec: 1e-6; measured ≤ 2e-9 (σ2..σ5 within 1%)


def test_context_is_a_function_of_the_matrix_alone() -> None:
    """Same X (any dtype or index order) → bit-identical context: the start vector is fixed."""
    rng = np.random.default_rng(1)
    X = binary(rng, 300, 500, 0.05)
    x = upload_context(X, 5)
    assert np.array_equal(upload_context(X.astype(np.float64), 5), x)
    assert np.array_equal(upload_context(X.tocoo(), 5), x)
    assert np.array_equal(upload_context(X, 5), x)
    assert len(upload_context(X, 8)) == 8 and np.allclose(upload_context(X, 8)[:5], x, rtol=1e-9)


def test_both_routes_agree_at_the_threshold() -> None:
    rng = np.random.default_rng(2)
    X = binary(rng, DENSE_SIDE + 1, 300, 0.1)
    arpack = np.sqrt(gram_top_eigenvalues(X.astype(np.float64), 5))
    dense = np.sqrt(np.linalg.eigvalsh((X @ X.T).toarray().astype(np.float64))[::-1][:5])
    assert np.allclose(arpack, dense, rtol=1e-9, atol=0)


# ------------------------------------------------------------------------------------------------ GP
def sklearn_posterior(gp: RewardGP, z, t, r, zq, tq):
    from sklearn.gaussian_process import GaussianProcessRegressor

    inputs = lambda a, b: np.column_stack([a, b])  # noqa: E731
    reg = GaussianProcessRegressor(gp.kernel_object(z.shape[1]), alpha=gp.noise**2, optimizer=None,
                                   normalize_y=False).fit(inputs(z, t), r)
    mean, std = reg.predict(inputs(zq, tq), return_std=True)
    return mean, std**2


@pytest.mark.parametrize("alpha", [0.0, 0.001, 0.3])
@pytest.mark.parametrize(("scale", "noise"), [(0.3, 0.1), (30.0, 0.1), (0.3, 0.01)])
def test_incremental_gp_equals_sklearns_posterior_after_every_observation(alpha, scale, noise) -> None:
    """One Cholesky row per observation gives scikit-learn's posterior (refit on the whole history) to 1e-8,
    mean and variance, at every history length; scale 30 is the raw singular values' magnitude."""
    rng = np.random.default_rng(int(alpha * 1000) + int(scale))
    gp = RewardGP(lengthscale=0.2, temporal=alpha, noise=noise)
    z = rng.normal(size=(70, 6)) * scale
    z[:, 0] = rng.integers(0, 5, 70)  # the action index
    z[35:, 1:] = z[:35, 1:] + rng.normal(size=(35, 5)) * 0.05  # near-repeated contexts: correlated inputs
    t, r = rng.permutation(100)[:70].astype(float), rng.normal(size=70) * 0.01
    zq = np.vstack([z[[3, 40]] + 0.01, rng.normal(size=(3, 6)) * scale])
    tq = rng.integers(0, 120, 5).astype(float)
    inc = IncrementalGP(gp, 6)
    mean, var = inc.posterior(zq, tq)
    assert np.array_equal(mean, np.zeros(5)) and np.array_equal(var, np.ones(5))  # the prior
    for i in range(70):
        inc.add(z[i], t[i], r[i])
        mean, var = inc.posterior(zq, tq)
        ref_mean, ref_var = sklearn_posterior(gp, z[: i + 1], t[: i + 1], r[: i + 1], zq, tq)
        assert np.allclose(mean, ref_mean, rtol=0, atol=1e-8) and np.allclose(var, ref_var, rtol=0, atol=1e-8)
        assert np.allclose(mean, gp.posterior(z[: i + 1], t[: i + 1], r[: i + 1], zq, tq)[0], rtol=0, atol=1e-8)


@pytest.mark.parametrize("alpha", [0.0, 0.001, 0.3])
def test_closed_form_kernel_equals_the_sklearn_kernel(alpha) -> None:
    rng = np.random.default_rng(4)
    gp = RewardGP(0.2, alpha, 0.1)
    z1, z2 = rng.normal(size=(9, 6)) * 0.3, rng.normal(size=(7, 6)) * 0.3
    t1, t2 = rng.integers(0, 100, 9).astype(float), rng.integers(0, 100, 7).astype(float)
    ref = gp.kernel_object(6)(np.column_stack([z1, t1]), np.column_stack([z2, t2]))
    assert np.allclose(gp.kernel(z1, t1, z2, t2), ref, rtol=0, atol=1e-12)


def test_incremental_gp_grows_past_its_initial_capacity() -> None:
    rng = np.random.default_rng(5)
    gp, inc = RewardGP(), IncrementalGP(RewardGP(), 3)
    z, t, r = rng.normal(size=(100, 3)) * 0.1, np.arange(100.0), rng.normal(size=100)
    for i in range(100):
        inc.add(z[i], t[i], r[i])
    zq, tq = rng.normal(size=(4, 3)) * 0.1, np.full(4, 100.0)
    assert np.allclose(inc.posterior(zq, tq)[0], gp.posterior(z, t, r, zq, tq)[0], rtol=0, atol=1e-8)


# ------------------------------------------------------------------------------------------------ accountant
@settings(max_examples=25, deadline=None)
@given(mechanism=st.sampled_from(["gaussian", "laplace"]), history=st.lists(st.integers(0, 4), max_size=12),
       part=st.lists(st.booleans(), min_size=6, max_size=6), epsilon=st.sampled_from([1.0, 3.0, 10.0]))
def test_affordable_levels_are_the_prefix_the_accountant_allows(mechanism, history, part, epsilon) -> None:
    """The top affordable level and the prefix below it agree with asking the accountant about every level,
    after any history of levels (clients taking part at random)."""
    dp = ClientDP(6, mechanism, epsilon=epsilon, delta=1e-5)
    levels = bgt.action_levels(dp.total_budget * (1 - 1e-6), 14, 8, 5)
    rng = np.random.default_rng(len(history))
    for a in history:
        who = torch.from_numpy(rng.random(6) < 0.7)
        if dp.affordable(float(levels[a]), who):
            dp.accountant.step(dp.levels(torch.full((6,), float(levels[a]), dtype=torch.float64)), who)
    holding = torch.tensor(part)
    each = [dp.affordable(float(x), holding) for x in levels]
    top = top_affordable_level(dp, levels, holding)
    assert each == [top is not None and a <= top for a in range(5)]


def test_the_base_check_reuses_the_settled_prefix_only_for_the_same_clients(tiny) -> None:
    p = BGTPlanner(num_actions=3, initial_rounds=2, min_rounds=8, seed=0)
    task = planner_task(tiny)
    p.on_fit_start(None, task)
    holding = task.clients_holding_data(0)
    calls: list[float] = []
    real = task.privacy.affordable
    task.privacy.affordable = lambda b, h: calls.append(b) or real(b, h)
    budget = p.choose(task, 0, holding)
    assert len(calls) == 1  # the top level, affordable
    assert p.affordable(task, budget, holding) and len(calls) == 1  # settled in choose: not asked again
    assert p.affordable(task, budget, holding) and len(calls) == 2  # settled once only
    p.choose(task, 0, holding)
    assert p.affordable(task, budget, holding.clone()) and len(calls) == 4  # other clients: asked


# ------------------------------------------------------------------------------------------------ whole runs
ROUNDS = 14
tiny = tiny_fixture(users=24, items=30, seed=2, rounds=ROUNDS, num_clients=6, val_fraction=0.2)




@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
    """150 clients × 400 items: X^t takes the ARPACK route."""
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m_wide"), users=300, items=400, seed=4)
    return load_ratings("ml-1m", folder, seed=0, rounds=ROUNDS, num_clients=150, val_fraction=0.2)


class ReferencePlanner(BGTPlanner):
    """BGTplanner with the reference parts: scikit-learn's GP refit on the whole history every call, the context
    from a dense SVD, and the accountant asked about every level every round (the base class's check too)."""

    means: list[np.ndarray]

    def predict(self, context, round_idx, actions=None):
        acts = list(range(self.num_actions)) if actions is None else actions
        zq = np.array([self.features(a, context) for a in acts])
        z = np.array(self.z, dtype=np.float64).reshape(len(self.z), zq.shape[1])
        mean, _ = self.gp.posterior(z, np.array(self.t), np.array(self.r), zq, np.full(len(acts), round_idx))
        self.means.append(mean)
        return torch.from_numpy(mean)

    def affordable(self, task, budget, holding):
        return task.privacy.affordable(budget, holding)


class RecordingPlanner(BGTPlanner):
    means: list[np.ndarray]

    def predict(self, context, round_idx, actions=None):
        mean = super().predict(context, round_idx, actions)
        self.means.append(mean.numpy())
        return mean


@pytest.mark.parametrize("data_name", ["tiny", "wide"])
@pytest.mark.parametrize("kwargs", [{}, {"scale_features": True, "rho": "remaining"}])
def test_runs_choose_as_the_reference_planner(request, monkeypatch, data_name, kwargs) -> None:
    """Same levels, budgets, rewards and dual as a planner built from the references; posterior means to 1e-8,
    contexts to 1e-9. The scaled features make the GP's predictions matter to the choices."""
    data = request.getfixturevalue(data_name)
    args = {"num_actions": 3, "initial_rounds": 2, "min_rounds": 8, "seed": 11, **kwargs}
    fast, ref = RecordingPlanner(**args), ReferencePlanner(**args)
    fast.means, ref.means = [], []
    fast_task, ref_task = planner_task(data, epsilon=50.0), planner_task(data, epsilon=50.0)
    FederatedTrainer(callbacks=[fast], enable_progress_bar=False).fit(fast_task)
    with monkeypatch.context() as m:
        m.setattr(bgt, "upload_context", dense_context)
        FederatedTrainer(callbacks=[ref], enable_progress_bar=False).fit(ref_task)
    if data_name == "wide":
        assert min(fast_task.upload_items(0).shape) > DENSE_SIDE  # the ARPACK route was taken
    assert fast.actions == ref.actions and fast.budgets == ref.budgets and fast.rewards == ref.rewards
    assert torch.equal(fast.dual, ref.dual)
    assert fast.big_lambda == pytest.approx(ref.big_lambda, rel=1e-9) and fast.M == pytest.approx(ref.M, rel=1e-9)
    assert np.allclose(np.array(fast.z), np.array(ref.z), rtol=1e-9, atol=0)
    assert len(fast.means) == len(ref.means) > 0
    for a, b in zip(fast.means, ref.means):
        assert np.allclose(a, b, rtol=0, atol=1e-8)
    assert torch.equal(fast_task.privacy.spent(), ref_task.privacy.spent())


def test_defaults_are_the_papers() -> None:
    p = BGTPlanner()
    assert (p.num_actions, p.initial_rounds, p.min_rounds, p.context_dim) == (5, 5, 70, 5)
    assert (p.gp.lengthscale, p.gp.temporal, p.gp.noise) == (0.2, 0.001, 0.1)
    assert (p.scale_features, p.sign, p.rho_rule, p.action_grid) == (False, 1.0, "paper", "linspace")


def test_the_planner_leaves_thread_counts_as_it_found_them(tiny) -> None:
    def blas() -> list[int]:
        return [d["num_threads"] for d in threadpool_info() if d["user_api"] == "blas"]

    before_torch, before_blas = torch.get_num_threads(), blas()
    with single_thread():
        assert torch.get_num_threads() == 1 and set(blas()) == {1}
    assert torch.get_num_threads() == before_torch and blas() == before_blas
    torch.set_num_threads(2)
    try:
        p = BGTPlanner(num_actions=3, initial_rounds=2, min_rounds=8)
        FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(planner_task(tiny))
        assert torch.get_num_threads() == 2 and blas() == before_blas
    finally:
        torch.set_num_threads(before_torch)


# ------------------------------------------------------------------------------------------------ study knobs
class FixedMeanPlanner(BGTPlanner):
    """BGTplanner whose GP mean is replaced by a fixed vector (to see the diagnostics respond)."""

    mean: np.ndarray

    def predict(self, context, round_idx, actions=None):
        acts = list(range(self.num_actions)) if actions is None else actions
        return torch.from_numpy(self.mean[acts].astype(np.float64))


@pytest.mark.parametrize(("mean", "changed"), [(np.zeros(3), False), (np.array([0.0, 0.0, 1e6]), True)])
def test_gp_effect_diagnostics(tiny, mean, changed) -> None:
    """A zero GP mean never changes the decision (TV 0); a huge mean on the dearest level, which the dual
    penalty ranks last, changes it in every planned round."""
    p = FixedMeanPlanner(num_actions=3, initial_rounds=2, min_rounds=8, seed=0)
    p.mean = mean
    FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(planner_task(tiny, epsilon=50.0))
    s = p.summary()
    assert s["planner_planned_rounds"] == len(p.gp_effect) == len(p.actions) - p.stage_rounds > 0
    if not changed:
        assert s["planner_gp_argmax_changes"] == 0 and s["planner_gp_tv_mean"] == 0.0
    else:
        assert s["planner_gp_argmax_changes"] == s["planner_planned_rounds"] and s["planner_gp_tv_mean"] > 0.5


def test_reward_scale_scales_what_the_gp_sees(tiny) -> None:
    plain, scaled = BGTPlanner(num_actions=3, initial_rounds=2, min_rounds=8, seed=3), \
        BGTPlanner(num_actions=3, initial_rounds=2, min_rounds=8, seed=3, reward_scale=1000.0)
    for p in (plain, scaled):
        FederatedTrainer(callbacks=[p], enable_progress_bar=False).fit(planner_task(tiny, epsilon=50.0))
    n = min(len(plain.r), len(scaled.r))
    assert plain.rewards[: plain.stage_rounds] == scaled.rewards[: scaled.stage_rounds]  # same initial stage
    assert np.allclose(np.array(scaled.r[:n]), 1000.0 * np.array(scaled.rewards[:n]), rtol=1e-12)
    assert np.allclose(np.array(plain.r), np.array(plain.rewards), rtol=0)
    with pytest.raises(ConfigError, match="planner.reward_scale"):
        BGTPlanner(reward_scale=0.0)


def test_a_schedule_runs_without_a_validation_split_and_a_reward_planner_does_not(tmp_path) -> None:
    """Uniform and ADPML never read the reward: no validation split needed (rewards NaN); ADAP and BGTplanner do."""
    from fedrec.planners import ADAPPlanner, ADPMLPlanner, UniformPlanner

    folder = write_ml1m(tmp_path, users=24, items=30, seed=2)
    data = load_ratings("ml-1m", folder, seed=0, rounds=ROUNDS, num_clients=6)
    for planner in (UniformPlanner(), ADPMLPlanner()):
        FederatedTrainer(callbacks=[planner], enable_progress_bar=False).fit(planner_task(data))
        assert len(planner.rewards) == ROUNDS and all(math.isnan(r) for r in planner.rewards)
    for planner in (ADAPPlanner(), BGTPlanner(num_actions=3, initial_rounds=2, min_rounds=8)):
        with pytest.raises(ConfigError, match="data.val_fraction"):
            FederatedTrainer(callbacks=[planner], enable_progress_bar=False).fit(planner_task(data))


# ------------------------------------------------------------------------------------------------ Gram operator
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 80), m=st.integers(1, 80), density=st.floats(0.0, 0.6), seed=st.integers(0, 10**6),
       weighted=st.booleans())
def test_gram_operator_equals_scipys_products(n, m, density, seed, weighted) -> None:
    """The compiled 0/1 kernel (both orientations) and the scipy route for other entries equal X(Xᵀv) or Xᵀ(Xv)."""
    from fedrec.planners.gram import gram_operator

    rng = np.random.default_rng(seed)
    X = binary(rng, n, m, density).astype(np.float64)
    if weighted and X.nnz:
        X.data = rng.random(X.nnz) + 0.5  # not 0/1: the scipy route
    v = rng.standard_normal(min(n, m))
    want = X @ (X.T @ v) if n <= m else X.T @ (X @ v)
    out = np.empty(min(n, m))
    gram_operator(X.tocsr())(v, out)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(want).max(initial=0))))
