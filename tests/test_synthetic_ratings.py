"""The synthetic rating generator (fedrec.data.synthetic): exact sizes, power-law popularity recovered by a log-log
fit, determinism by seed, rating values and the splits of fedrec.data.ratings, bad input named, the Hydra group;
MovieLens-1M size here, MovieLens-10M size under ``-m slow``."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.data import RatingData, Ratings, arrival_rounds, synthetic_ratings
from fedrec.data.synthetic import STAR_SHARES, power_law_degrees
from fedrec.errors import ConfigError

#: a log-log fit of degree on popularity rank recovers the exponent within this, at 100k ratings and above
EXPONENT_TOLERANCE = 0.05


def every_rating(data: RatingData) -> Ratings:
    return Ratings.concat(data.test, data.val, data.initial, data.stream)


def degrees(data: RatingData) -> tuple[np.ndarray, np.ndarray]:
    """Ratings per user and per item."""
    everything = every_rating(data)
    per_user = np.bincount(everything.user, minlength=data.num_users)
    return per_user, np.bincount(everything.item, minlength=data.num_items)


def fitted_exponent(degree: np.ndarray, cap: int) -> float:
    """Minus the slope of log degree on log popularity rank, over the ranks from the 1st percentile on whose degree
    is below ``cap`` (degrees at the cap, the number of partners, are clipped, not power-law)."""
    degree = np.sort(degree)[::-1]
    rank = np.arange(1, len(degree) + 1)
    kept = (rank >= len(degree) / 100) & (degree < cap)
    return float(-np.polyfit(np.log(rank[kept]), np.log(degree[kept]), 1)[0])


def check_sizes(data: RatingData, users: int, items: int, ratings: int, clients: int) -> None:
    assert (data.num_users, data.num_items, data.num_ratings, data.num_clients) == (users, items, ratings, clients)
    everything = every_rating(data)
    assert len(np.unique(everything.user * items + everything.item)) == ratings  # distinct pairs
    per_user, per_item = degrees(data)
    assert per_user.min() >= 1 and per_item.min() >= 1 and per_user.max() <= items and per_item.max() <= users
    assert np.array_equal(data.user_ids, np.arange(users)) and np.array_equal(data.item_ids, np.arange(items))
    per_client = np.bincount(data.client_of_user, minlength=clients)
    assert len(per_client) == clients and per_client.max() - per_client.min() <= 1


@pytest.fixture(scope="module")
def moderate() -> RatingData:
    return synthetic_ratings(2000, 1000, 100_000, num_clients=200, seed=3, rounds=10, val_fraction=0.1)


# ------------------------------------------------------------------------------------ sizes and popularity


@pytest.mark.parametrize(
    ("users", "items", "ratings", "num_clients"),
    [
        (600, 300, 20_000, 60),  # the CLI example of docs/running.md
        (50, 80, 80, None),  # fewest ratings that cover every item: one each
        (30, 20, 600, 7),  # every (user, item) pair rated
        (1, 5, 5, None),  # one user
        (3000, 40, 50_000, 1000),  # far more users than items
    ],
)
def test_sizes_are_exact(users: int, items: int, ratings: int, num_clients: int | None) -> None:
    data = synthetic_ratings(users, items, ratings, num_clients=num_clients, seed=1, rounds=5)
    check_sizes(data, users, items, ratings, users if num_clients is None else num_clients)
    assert data.name == "synthetic" and data.rating_range == (1.0, 5.0) and data.duplicates_dropped == 0


def test_user_degrees_are_exactly_the_power_law(moderate: RatingData) -> None:
    per_user, _ = degrees(moderate)
    target = power_law_degrees(2000, 100_000, 0.8, cap=1000)
    assert target.sum() == 100_000 and (np.diff(target) <= 0).all() and target.min() >= 1
    assert np.array_equal(np.sort(per_user)[::-1], target)


@pytest.mark.parametrize(("user_exponent", "item_exponent"), [(0.8, 1.0), (0.5, 1.5)])
def test_popularity_exponents_are_recovered(user_exponent: float, item_exponent: float) -> None:
    data = synthetic_ratings(2000, 1000, 100_000, user_exponent=user_exponent, item_exponent=item_exponent,
                             seed=5)
    per_user, per_item = degrees(data)
    fitted = fitted_exponent(per_user, cap=1000), fitted_exponent(per_item, cap=2000)
    # measured: (0.800, 1.013) and (0.500, 1.521)
    assert fitted == pytest.approx((user_exponent, item_exponent), abs=EXPONENT_TOLERANCE)


def test_exponent_zero_spreads_evenly() -> None:
    data = synthetic_ratings(400, 200, 10_000, user_exponent=0.0, item_exponent=0.0, seed=2)
    per_user, per_item = degrees(data)
    assert set(per_user.tolist()) == {25}  # 10,000 / 400 exactly
    assert abs(per_item.mean() - 50) < 1e-9 and per_item.std() < 0.25 * 50  # about binomial around 50


def test_power_law_degrees_clip_at_one_and_the_cap() -> None:
    assert power_law_degrees(4, 4, 3.0, cap=10).tolist() == [1, 1, 1, 1]
    assert power_law_degrees(4, 40, 3.0, cap=10).tolist() == [10, 10, 10, 10]
    steep = power_law_degrees(100, 500, 2.0, cap=50)
    assert steep.sum() == 500 and steep[0] == 50 and steep[-1] == 1 and (np.diff(steep) <= 0).all()


def test_popularity_ranks_are_shuffled_over_indices(moderate: RatingData) -> None:
    per_user, per_item = degrees(moderate)
    assert not (np.diff(per_user) <= 0).all() and not (np.diff(per_item) <= 0).all()


# ------------------------------------------------------------------------------------ determinism


def test_deterministic_by_seed() -> None:
    a, b, c = (synthetic_ratings(500, 300, 15_000, seed=s, rounds=4) for s in (7, 7, 8))
    for part in ("test", "val", "initial", "stream"):
        x, y = getattr(a, part), getattr(b, part)
        assert np.array_equal(x.user, y.user) and np.array_equal(x.item, y.item) and np.array_equal(x.rating, y.rating)
    assert np.array_equal(a.stream_round, b.stream_round) and np.array_equal(a.client_of_user, b.client_of_user)
    assert not np.array_equal(a.test.user * 300 + a.test.item, c.test.user * 300 + c.test.item)


def test_rounds_change_only_the_arrivals() -> None:
    few, many = (synthetic_ratings(300, 200, 8_000, seed=4, rounds=r) for r in (3, 30))
    assert np.array_equal(few.test.item, many.test.item) and np.array_equal(few.test.rating, many.test.rating)
    assert few.stream_round.max() == 2 and many.stream_round.max() == 29


def test_without_streaming_every_training_rating_is_there_from_round_0() -> None:
    streamed, whole = (synthetic_ratings(300, 200, 8_000, seed=4, rounds=5, stream=s) for s in (True, False))
    assert len(streamed.stream) > 0 and len(whole.stream) == 0
    assert np.array_equal(whole.test.item, streamed.test.item) and np.array_equal(whole.val.item, streamed.val.item)
    first, last = whole.training_until(0), streamed.training_until(4)
    assert sorted(zip(first.user, first.item)) == sorted(zip(last.user, last.item))
    assert all(whole.arrivals(r) == 0 for r in range(5))
    for r in range(5):  # a round's arrivals are what training_until adds in it
        assert streamed.arrivals(r) == len(streamed.training_until(r)) - len(streamed.training_until(r - 1))


# ------------------------------------------------------------------------------------ values and splits


def test_rating_values_on_the_scale_with_movielens_shares(moderate: RatingData) -> None:
    rating = every_rating(moderate).rating
    stars = moderate.denormalize(rating)
    assert rating.dtype == np.float32 and set(np.unique(stars).round(6)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    shares = np.bincount(np.rint(stars).astype(int), minlength=6)[1:] / len(stars)
    assert shares == pytest.approx(STAR_SHARES, abs=0.02)
    assert moderate.scale == "ratings 1–5 as r / 5"
    minmax = synthetic_ratings(300, 200, 8_000, seed=4, normalize="minmax")
    assert set(np.unique(every_rating(minmax).rating).round(6)) == {0.0, 0.25, 0.5, 0.75, 1.0}


def test_rating_values_hold_user_and_item_signal(moderate: RatingData) -> None:
    """Per-user and per-item mean offsets learnt on the training ratings predict the test ratings better than the
    global mean: the values are not noise."""
    train, test = moderate.training, moderate.test
    mean = train.rating.mean()

    def offsets(index: np.ndarray, residual: np.ndarray, size: int) -> np.ndarray:
        return np.bincount(index, residual, minlength=size) / np.maximum(np.bincount(index, minlength=size), 1)

    user = offsets(train.user, train.rating - mean, moderate.num_users)
    item = offsets(train.item, train.rating - mean - user[train.user], moderate.num_items)
    baseline = np.sqrt(np.mean((test.rating - mean) ** 2))
    biased = np.sqrt(np.mean((test.rating - mean - user[test.user] - item[test.item]) ** 2))
    assert biased < 0.9 * baseline


def test_splits_follow_the_rules_of_ratings_py(moderate: RatingData) -> None:
    n = 100_000
    n_test = round(0.2 * n)
    n_val = round((n - n_test) * 0.1)
    rest = n - n_test - n_val
    sizes = len(moderate.test), len(moderate.val), len(moderate.initial), len(moderate.stream)
    assert sizes == (n_test, n_val, rest - rest // 2, rest // 2)
    assert (np.diff(moderate.stream_round) >= 0).all() and moderate.stream_round.max() == moderate.rounds - 1
    clients = moderate.client_of_user[moderate.stream.user]
    for client in range(0, moderate.num_clients, 20):  # the streaming rule runs per client
        got = moderate.stream_round[clients == client]
        assert np.array_equal(np.sort(got), arrival_rounds(len(got), moderate.rounds))


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"users": 0}, "users"),
        ({"items": -3}, "items"),
        ({"ratings": 0}, "ratings"),
        ({"users": 2.5}, "users"),
        ({"ratings": 10 * 20 + 1}, r"ratings must be at most users × items = 10 × 20 = 200"),
        ({"ratings": 19}, r"ratings must be at least max\(users, items, 2\) = 20"),
        ({"user_exponent": -0.1}, "user_exponent"),
        ({"item_exponent": -1}, "item_exponent"),
        ({"num_clients": 11}, r"num_clients must lie in \[1, 10\]"),
        ({"num_clients": 0}, "num_clients"),
        ({"rank": 0}, "rank"),
        ({"noise": 1.5}, "noise"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"rounds": 0}, "rounds"),
        ({"normalize": "zscore"}, "normalize"),
        ({"stream": "no"}, "data.stream must be true or false"),
    ],
)
def test_bad_input_names_the_field(kwargs: dict, field: str) -> None:
    arguments = {"users": 10, "items": 20, "ratings": 100, **kwargs}
    with pytest.raises(ConfigError, match=field):
        synthetic_ratings(**arguments)


# ------------------------------------------------------------------------------------ the Hydra group


def test_hydra_group_builds_the_requested_size_and_names_bad_fields(compose_cfg: Callable[..., DictConfig]) -> None:
    sizes = ("data.users=600", "data.items=300", "data.ratings=20000", "data.num_clients=60")
    cfg = compose_cfg("+experiment=fedgnn_synthetic", "task.rounds=2", *sizes)
    bad = compose_cfg("+experiment=fedgnn_synthetic", *sizes, "data.ratings=200000")
    assert cfg.data.users == 600 and cfg.name == "fedgnn_synthetic"
    task = build_task(cfg)
    check_sizes(task.data, 600, 300, 20_000, 60)
    with pytest.raises(ConfigError, match=r"^data: ratings must be at most users × items"):
        build_task(bad)


def test_default_config_is_movielens_1m_size(compose_cfg: Callable[..., DictConfig]) -> None:
    node = compose_cfg("data=synthetic_ratings").data
    assert (node.users, node["items"], node.ratings, node.num_clients) == (6040, 3706, 1_000_209, 605)


# ------------------------------------------------------------------------------------ scale


def check_at_size(users: int, items: int, ratings: int, clients: int) -> None:
    """Generate at a MovieLens size with the default exponents (0.8, 1.0): sizes and fitted exponents (the time it
    takes is measured by ``python -m scripts.bench_ratings --synthetic ...``, not asserted here)."""
    data = synthetic_ratings(users, items, ratings, num_clients=clients)
    check_sizes(data, users, items, ratings, clients)
    per_user, per_item = degrees(data)
    assert fitted_exponent(per_user, cap=items) == pytest.approx(0.8, abs=EXPONENT_TOLERANCE)
    assert fitted_exponent(per_item, cap=users) == pytest.approx(1.0, abs=EXPONENT_TOLERANCE)


def test_movielens_1m_size() -> None:
    check_at_size(6040, 3706, 1_000_209, 605)  # fits 0.800 and 1.002


@pytest.mark.slow
def test_movielens_10m_size() -> None:
    check_at_size(69_878, 10_677, 10_000_054, 6988)  # fits 0.800 and 1.001; slow: 35-50 s and 1.3 GB
