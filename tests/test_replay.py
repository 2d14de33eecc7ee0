"""Replay evaluation (Li et al. 2010) on logged streams, and the MovieLens-100K replay of the vertical bandits.

References are written plainly here: a numpy LinUCB replay loop (Sherman–Morrison-free: it solves with the
Gram matrix), the outer sum / product of the spec's §4.2 step 8, and a simulated uniformly random policy.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.bandits.linear import TIE_TOLERANCE, LinUCB
from fedrec.data.integrity import write_sums
from fedrec.envs.replay import MovieLensReplayEnv, ReplayEnv, ReplayLog
from fedrec.errors import ConfigError
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.protocols.sync_linucb import SyncLinUCB
from fedrec.protocols.vertical import VerticalLinearBandit
from fedrec.tasks.bandit import BanditTask

ALPHA, LAM = 0.6, 1.0
UCB = functools.partial(LinUCB, alpha=ALPHA, lam=LAM)


@pytest.fixture(scope="module")
def env(data_dir: Path) -> MovieLensReplayEnv:
    return MovieLensReplayEnv(data_dir, replicates=2, seed=3, num_arms=10, max_events=1500, chunk_size=400)


def reference_replay(contexts: np.ndarray, rewards: np.ndarray, logged: np.ndarray) -> tuple[np.ndarray, int, float]:
    """One replicate of replay LinUCB written from the paper: score θᵀx + α‖x‖_{V⁻¹}, first arm within the tie
    tolerance of the best, update (V, b) only when the arm is the logged one. Returns arms, counted steps, clicks."""
    S, K, d = contexts.shape
    V, b = LAM * np.eye(d), np.zeros(d)
    arms, counted, clicks = np.zeros(S, dtype=np.int64), 0, 0.0
    for s in range(S):
        x = contexts[s]
        theta = np.linalg.solve(V, b)
        widths = np.sqrt(np.einsum("kd,kd->k", x, np.linalg.solve(V, x.T).T))
        scores = x @ theta + ALPHA * widths
        a = int(np.flatnonzero(scores >= scores.max() - TIE_TOLERANCE)[0])
        arms[s] = a
        if a == logged[s]:
            counted += 1
            clicks += rewards[s, a]
            V += np.outer(x[a], x[a])
            b += rewards[s, a] * x[a]
    return arms, counted, clicks


# ------------------------------------------------------------------------------------------------ the stream
def test_candidates_hold_the_logged_item_once_among_distinct_items(env: MovieLensReplayEnv) -> None:
    for r in range(env.replicates):
        for c in range(3):
            items, position = env.candidates(r, c)
            lo = c * env.chunk_size
            logged = env._items[lo:lo + len(items)]
            assert items.shape == (len(logged), env.num_arms)
            assert np.array_equal(items[np.arange(len(items)), position], logged)
            assert all(len(set(row)) == env.num_arms for row in items.tolist())
            assert ((items == logged[:, None]).sum(1) == 1).all()
            assert items.min() >= 0 and items.max() < env.num_items


def test_logged_position_and_other_candidates_are_uniform(data_dir: Path) -> None:
    """The logged item's position is uniform over K (a random policy then matches 1/K of the events) and the other
    candidates are uniform over the other items (chi-square, 5000 events)."""
    from scipy import stats

    e = MovieLensReplayEnv(data_dir, num_arms=10, max_events=5000, chunk_size=5000, seed=11)
    items, position = e.candidates(0, 0)
    assert stats.chisquare(np.bincount(position, minlength=10)).pvalue > 1e-3
    others = items[np.arange(10)[None, :] != position[:, None]]
    genre_drama = e.item_features[others, 8].mean()  # 'drama' over uniform draws ≈ its share among all items
    share = e.item_features[:, 8].mean()
    assert abs(genre_drama - share) < 4 * np.sqrt(share * (1 - share) / len(others))


def test_contexts_are_the_outer_sum_and_product_of_user_and_item_features(env: MovieLensReplayEnv,
                                                                           data_dir: Path) -> None:
    batch = env.interactions(0, 50)
    items, _ = env.candidates(1, 0)
    for s in (0, 17, 49):
        u = np.concatenate([[0.0], env.user_features[env._users[s], 1:]])
        for k in (0, 9):
            g = env.item_features[items[s, k]]
            want = np.array([[up + gq for gq in g] for up in u]).ravel()
            assert np.allclose(batch.contexts[1, s, k].numpy(), want)
    assert env.dim == 6 * 19 and env.partition == [19, 38, 57] and sum(env.partition) == env.dim
    prod = MovieLensReplayEnv(data_dir, num_arms=10, max_events=50, combine="outer_product", seed=3)
    x = prod.interactions(0, 5).contexts[0, 2, 4].numpy().reshape(6, 19)
    items, _ = prod.candidates(0, 0)
    g = prod.item_features[items[2, 4]]
    assert np.allclose(x[0], g)  # the AP's block is the item's genres under both constructions
    assert np.allclose(x[1:], np.outer(prod.user_features[prod._users[2], 1:], g))


def test_rewards_are_clicks_at_the_logged_position(env: MovieLensReplayEnv, data_dir: Path) -> None:
    ratings = np.loadtxt(data_dir / "ml-100k" / "u.data", dtype=np.int64)
    order = np.argsort(ratings[:, 3], kind="stable")
    batch = env.interactions(0, 1500)
    clicks = batch.rewards[0].gather(1, batch.logged[0].unsqueeze(1)).squeeze(1).numpy()
    assert np.array_equal(clicks, (ratings[order[:1500], 2] >= 4).astype(float))
    assert float(batch.rewards[0].sum()) == clicks.sum()  # nothing at the other candidates
    assert env.click_rate == pytest.approx(clicks.mean())


def test_uniform_random_policy_replay_ctr_converges_to_the_click_rate(env: MovieLensReplayEnv) -> None:
    """The normaliser: 200 simulated uniformly random policies' replay CTRs centre on env.click_rate."""
    batch = env.interactions(0, 1500)
    clicks = batch.rewards[0].gather(1, batch.logged[0].unsqueeze(1)).squeeze(1).numpy()
    rng = np.random.default_rng(0)
    ctrs = []
    for _ in range(200):
        hit = rng.integers(env.num_arms, size=len(clicks)) == batch.logged[0].numpy()
        ctrs.append(clicks[hit].mean())
    assert abs(np.mean(ctrs) - env.click_rate) < 4 * np.std(ctrs) / np.sqrt(len(ctrs)) + 2e-3


# ------------------------------------------------------------------------------------------------ the evaluator
@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_replay_matches_a_plain_reference_loop(env: MovieLensReplayEnv, backend: str) -> None:
    batch = env.interactions(0, 600)
    p = CentralizedLinUCB(env.num_clients, env.dim, env.replicates, UCB, 0, backend=backend)
    arms = p.replay(batch.clients, batch.contexts, batch.rewards, batch.logged)
    for r in range(env.replicates):
        ref, counted, clicks = reference_replay(batch.contexts[r].numpy(), batch.rewards[r].numpy(),
                                                batch.logged[r].numpy())
        assert np.array_equal(arms[r].numpy(), ref)
        hit = arms[r] == batch.logged[r]
        assert int(hit.sum()) == counted and counted > 0
        assert float(p.policy.count[r]) == counted  # only counted steps update


def test_vfucb_replays_exactly_like_linucb_and_partial_uses_its_columns(env: MovieLensReplayEnv) -> None:
    """Spec §6 test 10's exact part: the replay path of VFUCB is LinUCB's (Theorem 4.1), so arms and CTR agree."""
    batch = env.interactions(0, 1000)
    run = lambda mode, **kw: VerticalLinearBandit(  # noqa: E731
        env.num_clients, env.dim, env.replicates, UCB, 0, mode=mode, partition=env.partition, **kw,
    ).replay(batch.clients, batch.contexts, batch.rewards, batch.logged)
    central, vertical = run("central"), run("vertical")
    assert torch.equal(central, vertical)
    p = VerticalLinearBandit(env.num_clients, env.dim, env.replicates, UCB, 0, mode="partial",
                             partition=env.partition, partial_ratio=0.2, track_central=False)
    arms = p.replay(batch.clients, batch.contexts, batch.rewards, batch.logged)
    for r in range(env.replicates):
        cols = p.columns[r].numpy()
        ref, _, _ = reference_replay(batch.contexts[r].numpy()[..., cols], batch.rewards[r].numpy(),
                                     batch.logged[r].numpy())
        assert np.array_equal(arms[r].numpy(), ref)


def test_task_reports_ctr_relative_to_random_and_resumes_exactly(env: MovieLensReplayEnv) -> None:
    def task() -> BanditTask:
        p = VerticalLinearBandit(env.num_clients, env.dim, env.replicates, UCB, 0, partition=env.partition)
        return BanditTask(env, p, steps=1500, steps_per_round=500)

    whole = task()
    for i in range(whole.num_rounds):
        whole.run_round(i)
    per = whole.per_replicate()
    batch = env.interactions(0, 1500)
    for r in range(env.replicates):
        _, counted, clicks = reference_replay(batch.contexts[r].numpy(), batch.rewards[r].numpy(),
                                              batch.logged[r].numpy())
        assert float(per["matched_steps"][r]) == counted and float(per["clicks"][r]) == clicks
        assert float(per["relative_ctr"][r]) == pytest.approx(clicks / counted / env.click_rate, rel=1e-12)
    assert "cumulative_regret" not in per and (per["comm_party1_sent_scalars"] > 0).all()
    first = task()
    first.run_round(0)
    resumed = task()
    resumed.load_state_dict(first.state_dict())
    for i in (1, 2):
        resumed.run_round(i)
    assert all(torch.equal(a, b) for a, b in zip(resumed.per_replicate().values(), per.values()))


def test_replay_refuses_protocols_without_it_and_bad_logged_arms(env: MovieLensReplayEnv) -> None:
    sync = SyncLinUCB(env.num_clients, env.dim, env.replicates, policy=UCB)
    with pytest.raises(ConfigError, match=r"^protocol: SyncLinUCB .*replay"):
        BanditTask(env, sync, steps=10)
    batch = env.interactions(0, 5)
    p = CentralizedLinUCB(env.num_clients, env.dim, env.replicates, UCB, 0)
    with pytest.raises(ValueError, match="logged arms must be in"):
        p.replay(batch.clients, batch.contexts, batch.rewards, batch.logged + env.num_arms)
    with pytest.raises(ValueError, match="same shape"):
        p.replay(batch.clients, batch.contexts, batch.rewards, batch.logged[:, :3])
    assert int(p.policy.count.sum()) == 0  # refused before any state changed


def test_bad_data_is_named(tmp_path: Path, data_dir: Path) -> None:
    with pytest.raises(Exception, match=r"u\.data"):
        MovieLensReplayEnv(tmp_path)
    root = tmp_path / "ml-100k"
    root.mkdir()
    for name in ("u.user", "u.item"):
        (root / name).write_bytes((data_dir / "ml-100k" / name).read_bytes())
    (root / "u.data").write_text("1\t1\t5\t10\n99999\t1\t4\t11\n")
    write_sums(root)  # files of its own, not the published ones: listed, so their line counts are not checked
    with pytest.raises(ConfigError, match=r"u\.data: user id 99999 is not in .*u\.user"):
        MovieLensReplayEnv(tmp_path)
    with pytest.raises(ConfigError, match="combine must be one of"):
        MovieLensReplayEnv(data_dir, combine="outer")
    with pytest.raises(ConfigError, match="num_arms must be <= 1682"):
        MovieLensReplayEnv(data_dir, num_arms=5000)


class HandMadeLog(ReplayEnv):
    """Twelve events of four users on three items, written out by hand."""

    name = "hand_made"

    def _load(self, data_dir: Path) -> ReplayLog:
        return ReplayLog(
            user_features=np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [0.2, 0.9]]),
            item_features=np.array([[1.0, 0.0], [0.0, 1.0], [0.6, 0.6]]),
            groups=[1, 1],
            users=np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 0, 1, 2]),
            items=np.array([0, 1, 2, 0, 0, 1, 1, 2, 0, 2, 1, 0]),
            clicks=np.array([1.0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0]),
        )


def test_replay_evaluator_on_a_hand_made_log() -> None:
    """A log small enough to check by hand: the random policy's CTR is 6/12, the parties' blocks are [2, 2, 2], and
    the task counts exactly the events where the reference loop's arm is the logged one."""
    env = HandMadeLog("unused", replicates=3, seed=5, num_arms=3, chunk_size=5)
    assert env.dim == 6 and env.partition == [2, 2, 2] and env.click_rate == 0.5
    batch = env.interactions(0, 12)
    assert torch.equal(batch.contexts[0, 0, batch.logged[0, 0]], torch.tensor([1.0, 0, 2, 1, 1, 0],
                                                                              dtype=torch.float64))
    for r in range(3):  # K = I = 3: every event offers all three items, the logged one at its position
        items, _ = env.candidates(r, 0)
        assert (np.sort(items, axis=1) == np.arange(3)).all()
    p = VerticalLinearBandit(env.num_clients, env.dim, 3, UCB, 0, partition=env.partition)
    task = BanditTask(env, p, steps=None, steps_per_round=5)
    for i in range(task.num_rounds):
        task.run_round(i)
    per = task.per_replicate()
    for r in range(3):
        arms, counted, clicks = reference_replay(batch.contexts[r].numpy(), batch.rewards[r].numpy(),
                                                 batch.logged[r].numpy())
        assert float(per["matched_steps"][r]) == counted == int((arms == batch.logged[r].numpy()).sum())
        assert float(per["clicks"][r]) == clicks
        assert float(per["random_ctr"][r]) == 0.5


class ClicklessLog(HandMadeLog):
    """The hand-made log with every click removed: no policy, the random one included, ever clicks."""

    def _load(self, data_dir: Path) -> ReplayLog:
        log = super()._load(data_dir)
        return ReplayLog(log.user_features, log.item_features, log.groups, log.users, log.items,
                         np.zeros_like(log.clicks))


def test_a_log_without_clicks_reports_the_relative_ctr_as_undefined_not_zero() -> None:
    env = ClicklessLog("unused", replicates=2, seed=5, num_arms=3, chunk_size=5)
    p = VerticalLinearBandit(env.num_clients, env.dim, 2, UCB, 0, partition=env.partition)
    task = BanditTask(env, p, steps=None, steps_per_round=5)
    for i in range(task.num_rounds):
        task.run_round(i)
    per = task.per_replicate()
    assert (per["random_ctr"] == 0).all() and (per["ctr"] == 0).all()  # counted events, none clicked
    assert torch.isnan(per["relative_ctr"]).all()  # 0 / 0


@pytest.mark.parametrize("threshold", [1, 6, 7])
def test_a_click_threshold_outside_the_ratings_is_refused(data_dir: Path, threshold: int) -> None:
    """MovieLens ratings are 1..5: a threshold of 1 makes every rating a click, one above 5 none."""
    with pytest.raises(ConfigError, match=rf"^click_threshold: must lie in \(1, 5\], .* got {threshold}$"):
        MovieLensReplayEnv(data_dir, click_threshold=threshold)
