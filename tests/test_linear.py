"""LinUCB / LinTS modules: numerics, API, batching, validation."""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.bandits import LinTS, LinUCB, confidence_radius
from fedrec.errors import ConfigError


def _unit(n: int, d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


def test_sherman_morrison_and_cached_logdet_match_linalg_after_1e4_updates():
    d, lam = 25, 0.1
    policy = LinUCB(dim=d, alpha=1.0, lam=lam, refactor_every=10**6)  # no refactorisation: pure rank-one updates
    xs = _unit(10_000, d, 0)
    for x in xs:
        policy.update(x, 0.5)
    A = xs.T @ xs + lam * torch.eye(d, dtype=torch.float64)
    inv = torch.linalg.inv(A)
    assert torch.allclose(policy.inv[0], inv, rtol=1e-8, atol=0)
    assert (abs(policy.logdet[0].item() - torch.linalg.slogdet(A).logabsdet.item())
            <= 1e-8 * abs(policy.logdet[0].item()))
    assert torch.allclose(policy.V[0], xs.T @ xs, rtol=1e-12)
    assert torch.allclose(policy.b[0], 0.5 * xs.sum(0), rtol=1e-12)


def test_refactorisation_resets_drift_counter_and_agrees():
    policy = LinUCB(dim=5, lam=1.0, refactor_every=7)
    xs = _unit(20, 5, 1)
    for x in xs:
        policy.update(x, 1.0)
    assert policy.since_refactor[0].item() == 20 % 7
    A = xs.T @ xs + torch.eye(5, dtype=torch.float64)
    assert torch.allclose(policy.inv[0], torch.linalg.inv(A), rtol=1e-10)


def test_single_stream_api_returns_lowest_index_on_ties():
    policy = LinUCB(dim=3, alpha=0.5, lam=1.0)
    contexts = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    arm = policy.select(contexts)
    assert arm.shape == () and int(arm) == 0  # all three arms have the same score at the start
    policy.update(contexts[1], 1.0)
    assert int(policy.select(contexts)) == 1  # arms 1 and 2 are identical and better now: lowest index wins


def test_play_equals_select_then_update():
    a, b = LinUCB(dim=4, alpha=None, lam=0.5), LinUCB(dim=4, alpha=None, lam=0.5)
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        ctx = torch.randn(6, 4, generator=g, dtype=torch.float64)
        rewards = torch.randn(6, generator=g, dtype=torch.float64)
        arm = a.select(ctx)
        a.update(ctx[arm], rewards[arm])
        assert int(b.play(ctx, rewards)) == int(arm)
    assert torch.equal(a.inv, b.inv) and torch.equal(a.G, b.G)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 4), d=st.integers(1, 6), k=st.integers(1, 5), seed=st.integers(0, 10**6))
def test_batched_rows_equal_independent_policies(rows, d, k, seed):
    g = torch.Generator().manual_seed(seed)
    batched = LinUCB(dim=d, alpha=None, lam=0.3, batch_shape=(rows,))
    singles = [LinUCB(dim=d, alpha=None, lam=0.3) for _ in range(rows)]
    for _ in range(15):
        ctx = torch.randn(rows, k, d, generator=g, dtype=torch.float64)
        rew = torch.randn(rows, k, generator=g, dtype=torch.float64)
        arms = batched.play(ctx, rew)
        for i, p in enumerate(singles):
            assert int(p.play(ctx[i], rew[i])) == int(arms[i])
    for i, p in enumerate(singles):
        assert torch.allclose(batched.inv[i], p.inv[0], rtol=1e-12, atol=1e-14)


def test_theoretical_radius_matches_formula():
    policy = LinUCB(dim=3, alpha=None, lam=0.1, sigma=0.2, delta=0.05)
    for x in _unit(10, 3, 2):
        policy.update(x, 0.0)
    A = policy.V[0] + 0.1 * torch.eye(3, dtype=torch.float64)
    expected = 0.2 * math.sqrt(torch.logdet(A).item() - 3 * math.log(0.1) + 2 * math.log(1 / 0.05)) + math.sqrt(0.1)
    got = confidence_radius(policy.logdet, policy.count, 3, 0.1, 0.2, 0.05)
    assert got.item() == pytest.approx(expected, rel=1e-12)
    count_bound = confidence_radius(policy.logdet, policy.count, 3, 0.1, 0.2, 0.05, bound="count")
    assert count_bound.item() >= got.item()  # d log(1 + n/(dλ)) upper-bounds the log-det ratio


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_rewards_are_rejected(bad):
    policy = LinUCB(dim=2)
    with pytest.raises(ValueError, match="finite"):
        policy.update(torch.tensor([1.0, 0.0]), bad)
    assert policy.count.sum() == 0  # nothing was written


@pytest.mark.parametrize(
    "kwargs, field",
    [({"dim": 0}, "dim"), ({"dim": 2, "lam": 0.0}, "lam"), ({"dim": 2, "lam": -1.0}, "lam"),
     ({"dim": 2, "alpha": -1.0}, "alpha"), ({"dim": 2, "delta": 1.0}, "delta"),
     ({"dim": 2, "radius_bound": "x"}, "radius_bound")],
)
def test_invalid_arguments_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        LinUCB(**kwargs)


def test_contexts_shape_is_checked():
    with pytest.raises(ValueError, match="contexts"):
        LinUCB(dim=3).select(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="K >= 1"):
        LinUCB(dim=3).select(torch.zeros(0, 3))


def test_lints_is_reproducible_and_resumes_from_state_dict():
    ctx = _unit(8, 4, 5)
    a = LinTS(dim=4, v=0.5, seed=11)
    b = LinTS(dim=4, v=0.5, seed=11)
    first = [int(a.play(ctx, torch.ones(8))) for _ in range(5)]
    assert first == [int(b.play(ctx, torch.ones(8))) for _ in range(5)]
    c = LinTS(dim=4, v=0.5, seed=99)
    c.load_state_dict(a.state_dict())
    assert [int(a.play(ctx, torch.ones(8))) for _ in range(5)] == [int(c.play(ctx, torch.ones(8))) for _ in range(5)]


def test_lints_samples_around_the_ridge_estimate():
    policy = LinTS(dim=2, v=0.0, lam=1.0)  # v = 0: the sample is θ̂ itself
    policy.update(torch.tensor([1.0, 0.0]), 1.0)
    ctx = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert int(policy.select(ctx)) == 1


def test_bandits_import_does_not_pull_heavy_libraries():
    import subprocess
    import sys

    heavy = ("lightning", "lightning_fabric", "torch_geometric", "opacus", "hydra", "pandas", "scipy",
             "fedrec.tasks.recommendation")
    for modules in ("fedrec.bandits, fedrec.federation", "fedrec.trainer"):
        code = f"import sys, {modules}; print([m for m in {heavy!r} if m in sys.modules])"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        assert out == "[]", modules


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("policy", [lambda: LinUCB(dim=3, alpha=0.5), lambda: LinTS(dim=3, v=0.5)],
                         ids=["linucb", "lints"])
def test_select_rejects_a_non_finite_context_instead_of_picking_around_it(policy, bad):
    p = policy()
    p.update(torch.tensor([1.0, 0.0, 0.0]), 1.0)
    ctx = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    ctx[1, 2] = bad  # NaN compares false with everything: an argmax would silently skip (or pick) this arm
    state = copy.deepcopy(p.state_dict())
    with pytest.raises(ValueError, match="contexts"):
        p.select(ctx)
    with pytest.raises(ValueError, match="contexts"):
        p.play(ctx, torch.zeros(3))
    now = p.state_dict()
    assert all(torch.equal(v, now[k]) if isinstance(v, torch.Tensor) else v == now[k] for k, v in state.items())


def test_batched_update_with_a_repeated_row_applies_both_updates():
    xs = _unit(3, 4, 7)
    rewards = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64)
    batched = LinUCB(dim=4, lam=0.5, batch_shape=(3,))
    sequential = LinUCB(dim=4, lam=0.5, batch_shape=(3,))
    batched.update(xs, rewards, index=torch.tensor([1, 2, 1]))
    for x, r, row in zip(xs, rewards, (1, 2, 1)):
        sequential.update(x, r, index=torch.tensor([row]))
    for name in ("G", "inv", "logdet", "count"):
        assert torch.equal(getattr(batched, name), getattr(sequential, name)), name
    assert batched.count.tolist() == [0, 2, 1]
    A = xs[[0, 2]].T @ xs[[0, 2]] + 0.5 * torch.eye(4, dtype=torch.float64)  # both of row 1's observations
    assert torch.allclose(batched.inv[1], torch.linalg.inv(A), rtol=1e-12, atol=1e-14)
    assert batched.logdet[1].item() == pytest.approx(torch.logdet(A).item(), rel=1e-12)
    assert torch.allclose(batched.b[1], xs[0] * 0.3 + xs[2] * 1.1, rtol=1e-12, atol=1e-15)


def test_lints_rows_with_identical_state_draw_different_samples():
    d = 4
    p = LinTS(dim=d, v=1.0, lam=1.0, batch_shape=(2,), seed=3)
    x = _unit(6, d, 8)
    for row in (0, 1):  # identical data in both rows
        for xi in x:
            p.update(xi, 0.5, index=torch.tensor([row]))
    assert torch.equal(p.G[0], p.G[1]) and torch.equal(p.inv[0], p.inv[1])
    eye = torch.eye(d, dtype=torch.float64).expand(2, d, d)  # arm k scores θ̃_k: the scores are the samples
    samples = p.scores(eye, p.gather(torch.arange(2)))
    assert not torch.allclose(samples[0], samples[1])
    assert p.draws.tolist() == [1, 1]
    again = p.scores(eye, p.gather(torch.arange(2)))  # the next draw of each row is a new sample
    assert not torch.allclose(again[0], samples[0]) and not torch.allclose(again[1], samples[1])


@pytest.mark.parametrize("gap, expected", [(0.0, 0), (5e-10, 0), (-5e-10, 0), (2e-9, 1)])
def test_scores_within_1e_9_of_the_best_tie_to_the_lowest_index(gap, expected):
    policy = LinUCB(dim=2, alpha=0.0, lam=1.0)  # α = 0: the score is xᵀθ̂, with θ̂ = e1/2 after this update
    policy.update(torch.tensor([1.0, 0.0]), 1.0)
    ctx = torch.tensor([[1.0, 0.3], [1.0 + 2 * gap, 0.3], [0.2, 0.0]], dtype=torch.float64)
    assert int(policy.select(ctx)) == expected
    batched = LinUCB(dim=2, alpha=0.0, lam=1.0, batch_shape=(2,))
    batched.update(torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.ones(2))
    assert batched.select(torch.stack([ctx, ctx.flip(0)])).tolist() == [expected, 1]  # reversed: the tie is arms 1, 2
