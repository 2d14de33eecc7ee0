"""Implicit feedback: the leave-one-out split against a pandas reference on the raw file, the positive threshold and
its errors, the random split's fractions, BPR negatives (never a training positive, keyed per user so independent
of the other clients and of the round's company, different across rounds, uniform over the allowed items) and
errors that name the field."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedrec.data import (
    ImplicitData,
    ItemSets,
    group_users,
    load_implicit,
    read_ratings,
    sample_negatives,
)
from fedrec.errors import ConfigError, DatasetNotFoundError
from tests.helpers import write_ratings_dat


@pytest.fixture(scope="module")
def loo(data_dir: Path) -> ImplicitData:
    return load_implicit("ml-100k", data_dir, seed=0)


@pytest.fixture(scope="module")
def loo4(data_dir: Path) -> ImplicitData:
    return load_implicit("ml-100k", data_dir, seed=0, threshold=4)


@pytest.fixture(scope="module")
def raw(data_dir: Path) -> pd.DataFrame:
    """u.data read here, independently of the loader."""
    return pd.read_csv(data_dir / "ml-100k" / "u.data", sep="\t", names=["user", "item", "rating", "ts"])


def id_pairs(data: ImplicitData, sets: ItemSets) -> set[tuple[int, int]]:
    """``sets`` as (dataset user id, dataset item id) pairs."""
    user, item = sets.pairs()
    return set(zip(data.user_ids[user].tolist(), data.item_ids[item].tolist()))


# ------------------------------------------------------------------------------------ leave-one-out


@pytest.mark.parametrize("threshold", [None, 4])
def test_leave_one_out_holds_out_the_latest_against_pandas(threshold: float | None, loo: ImplicitData,
                                                           loo4: ImplicitData, raw: pd.DataFrame) -> None:
    data = loo if threshold is None else loo4
    positives = raw if threshold is None else raw[raw.rating >= threshold]
    # documented rule: by timestamp, equal timestamps by item id (the larger later; ML ids order like indices)
    ordered = positives.sort_values(["user", "ts", "item"])
    size = ordered.groupby("user").item.transform("size")
    step_back = ordered.groupby("user").cumcount(ascending=False)  # 0 = latest
    split = ordered[size >= 3]
    assert id_pairs(data, data.test) == set(zip(split.user[step_back == 0], split.item[step_back == 0]))
    assert id_pairs(data, data.val) == set(zip(split.user[step_back == 1], split.item[step_back == 1]))
    # rule-free check: no positive of the user is later than its test item, or than its validation item but the test
    latest = positives.groupby("user").ts.max()
    test_user, test_item = data.test.pairs()
    stamps = positives.set_index(["user", "item"]).ts
    test_ts = stamps.loc[list(zip(data.user_ids[test_user], data.item_ids[test_item]))].to_numpy()
    assert np.array_equal(test_ts, latest.loc[data.user_ids[test_user]].to_numpy())
    val_user, val_item = data.val.pairs()
    assert np.array_equal(val_user, test_user)
    val_ts = stamps.loc[list(zip(data.user_ids[val_user], data.item_ids[val_item]))].to_numpy()
    rest = positives.merge(pd.DataFrame({"user": data.user_ids[test_user], "item": data.item_ids[test_item]}),
                           how="left", indicator=True)
    rest = rest[rest["_merge"] == "left_only"].groupby("user").ts.max()
    assert np.array_equal(val_ts, rest.loc[data.user_ids[val_user]].to_numpy())
    assert np.all(data.train.counts()[test_user] >= 1)


@pytest.mark.parametrize("threshold", [None, 4])
def test_parts_are_disjoint_and_cover_every_positive(threshold: float | None, loo: ImplicitData,
                                                     loo4: ImplicitData, raw: pd.DataFrame) -> None:
    data = loo if threshold is None else loo4
    positives = raw if threshold is None else raw[raw.rating >= threshold]
    parts = [id_pairs(data, s) for s in (data.train, data.val, data.test)]
    assert sum(len(p) for p in parts) == len(positives) == data.num_positives
    assert set().union(*parts) == set(zip(positives.user, positives.item))
    for s in (data.train, data.val, data.test):  # CSR rows ascending
        user, item = s.pairs()
        assert np.all((np.diff(user) > 0) | (np.diff(item) > 0))


def test_ml100k_counts(loo: ImplicitData, loo4: ImplicitData) -> None:
    assert loo.summary() == {
        "dataset": "ml-100k", "users": 943, "items": 1682, "clients": 943, "positives": 100_000,
        "positive_rule": "every interaction", "split": "leave_one_out", "train": 98_114, "val": 943, "test": 943,
        "users_evaluated": 943, "users_training_only": 0, "users_without_positives": 0, "rating_range": [1.0, 5.0],
        "duplicates_dropped": 0,
    }  # fmt: skip
    summary = loo4.summary()
    # one user (id 685: 20 ratings, none above 3) has no positive at >= 4
    assert (summary["positives"], summary["train"], summary["val"], summary["test"]) == (55_375, 53_491, 942, 942)
    assert (summary["users_evaluated"], summary["users_without_positives"]) == (942, 1)
    assert loo4.user_ids[np.flatnonzero(loo4.train.counts() == 0)].tolist() == [685]
    assert np.array_equal(loo.evaluated_users(), np.arange(943))


def test_leave_one_out_does_not_depend_on_the_seed(data_dir: Path, loo: ImplicitData) -> None:
    other = load_implicit("ml-100k", data_dir, seed=5)
    for a, b in ((loo.train, other.train), (loo.val, other.val), (loo.test, other.test)):
        assert np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)


def test_users_with_too_few_positives_train_only(tmp_path: Path) -> None:
    # user 1: 3 positives; user 2: 2; user 3: 1 (ratings >= 4 only); user 4: none at >= 4
    lines = [(1, 10, 5, 100), (1, 11, 4, 300), (1, 12, 4, 200), (2, 10, 5, 100), (2, 11, 5, 50), (3, 12, 4, 9),
             (3, 11, 2, 10), (4, 10, 1, 1)]
    write_ratings_dat(tmp_path, lines)
    data = load_implicit("ml-1m", tmp_path, threshold=4)
    assert [data.test.row(u).tolist() for u in range(4)] == [[1], [], [], []]  # item 11 (ts 300)
    assert [data.val.row(u).tolist() for u in range(4)] == [[2], [], [], []]  # item 12 (ts 200)
    assert [data.train.row(u).tolist() for u in range(4)] == [[0], [0, 1], [2], []]
    summary = data.summary()
    assert (summary["users_evaluated"], summary["users_training_only"], summary["users_without_positives"]) == (1, 2, 1)
    no_val = load_implicit("ml-1m", tmp_path, threshold=4, val=False)
    assert [no_val.test.row(u).tolist() for u in range(4)] == [[1], [0], [], []]  # user 2's latest: item 10 (ts 100)
    assert len(no_val.val) == 0 and no_val.summary()["users_training_only"] == 1


def test_equal_timestamps_put_the_larger_item_last(tmp_path: Path) -> None:
    write_ratings_dat(tmp_path, [(7, 30, 3, 5), (7, 20, 3, 5), (7, 10, 3, 5), (7, 40, 3, 1)])
    data = load_implicit("ml-1m", tmp_path)
    assert data.test.row(0).tolist() == [2] and data.val.row(0).tolist() == [1]  # items 30, then 20
    assert data.train.row(0).tolist() == [0, 3]


def test_filmtrust_has_no_timestamps(data_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"split='leave_one_out'.*filmtrust.*no timestamps.*split='random'"):
        with pytest.warns(UserWarning, match="duplicated"):
            load_implicit("filmtrust", data_dir)
    with pytest.warns(UserWarning, match="duplicated"):
        data = load_implicit("filmtrust", data_dir, split="random", threshold=3)
    assert data.num_positives == data.summary()["positives"] and data.duplicates_dropped == 3
    assert data.positives == "rating >= 3" and data.rating_range == (0.5, 4.0)


def test_read_ratings_gives_timestamps_on_request(data_dir: Path, raw: pd.DataFrame) -> None:
    frame = read_ratings("ml-100k", data_dir, timestamps=True)
    assert np.array_equal(frame.timestamp.to_numpy(), raw.ts.to_numpy())  # ML-100K repeats no pair: file order
    assert "timestamp" not in read_ratings("ml-100k", data_dir)
    with pytest.warns(UserWarning, match="duplicated"):
        assert "timestamp" not in read_ratings("filmtrust", data_dir, timestamps=True)


def test_clients_group_users_as_the_rating_task_does(data_dir: Path) -> None:
    data = load_implicit("ml-100k", data_dir, seed=3, num_clients=40)
    assert data.num_clients == 40 and np.array_equal(data.client_of_user, group_users(943, 40, seed=3))


def test_missing_ml1m_is_the_loader_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="ml-1m"):
        load_implicit("ml-1m", tmp_path)


# ------------------------------------------------------------------------------------ threshold


def test_threshold_keeps_ratings_at_or_above_it(data_dir: Path, raw: pd.DataFrame) -> None:
    for threshold, expected in ((4, 55_375), (3.5, 55_375), (5, 21_201), (2, 93_890)):
        data = load_implicit("ml-100k", data_dir, threshold=threshold, split="random")
        assert data.num_positives == expected == int((raw.rating >= threshold).sum())
        assert data.positives == f"rating >= {threshold:g}"


@pytest.mark.parametrize(
    ("threshold", "message"),
    [
        (5.5, r"threshold must be at most 5, the largest rating of ml-100k \(no rating would be positive\), got 5.5"),
        (1, r"threshold must exceed 1, the smallest rating of ml-100k \(every rating would be positive"),
        (-3, r"threshold must exceed 1"),
        ("high", r"threshold must be a number, got 'high'"),
        (float("nan"), r"threshold must be a finite number"),
    ],
)
def test_threshold_errors(data_dir: Path, threshold: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_implicit("ml-100k", data_dir, threshold=threshold)


# ------------------------------------------------------------------------------------ random split


@pytest.mark.parametrize(("test_fraction", "val_fraction"), [(0.2, 0.1), (0.3, 0.25)])
def test_random_split_fractions(data_dir: Path, test_fraction: float, val_fraction: float) -> None:
    data = load_implicit("ml-100k", data_dir, seed=1, threshold=4, split="random", test_fraction=test_fraction,
                         val_fraction=val_fraction)
    n = data.train.counts() + data.val.counts() + data.test.counts()
    n_test, n_val = data.test.counts(), data.val.counts()
    evaluated = n >= 3
    # per user: max(1, round(n * fraction)), capped so one positive trains (never binding at these fractions here)
    half_up = lambda x: np.floor(x + 0.5).astype(int)  # noqa: E731
    assert np.array_equal(n_test[evaluated], np.maximum(1, half_up(n[evaluated] * test_fraction)))
    assert np.array_equal(n_val[evaluated], np.maximum(1, half_up(n[evaluated] * val_fraction)))
    assert np.all(n_test[~evaluated] == 0) and np.all(data.train.counts()[evaluated] >= 1)
    assert abs(len(data.test) / data.num_positives - test_fraction) < 0.01
    assert abs(len(data.val) / data.num_positives - val_fraction) < 0.01


def test_random_split_is_seeded_and_not_by_time(data_dir: Path, raw: pd.DataFrame, loo4: ImplicitData) -> None:
    a = load_implicit("ml-100k", data_dir, seed=1, threshold=4, split="random")
    again = load_implicit("ml-100k", data_dir, seed=1, threshold=4, split="random")
    other = load_implicit("ml-100k", data_dir, seed=2, threshold=4, split="random")
    assert np.array_equal(a.test.indices, again.test.indices) and np.array_equal(a.val.indices, again.val.indices)
    assert id_pairs(a, a.test) != id_pairs(other, other.test)
    assert id_pairs(a, a.test) | id_pairs(a, a.val) | id_pairs(a, a.train) == id_pairs(loo4, loo4.train) | id_pairs(
        loo4, loo4.val) | id_pairs(loo4, loo4.test)
    # a random pick: the test items sit, on average, mid-way through their user's history (0 first, 1 latest);
    # 11,079 test items, standard error of the mean about 0.003, tolerance 0.02
    positives = raw[raw.rating >= 4].copy()
    positives["when"] = positives.sort_values(["ts", "item"]).groupby("user").cumcount()
    positives["when"] /= positives.groupby("user").item.transform("size") - 1
    when = positives.set_index(["user", "item"]).when.loc[sorted(id_pairs(a, a.test))].to_numpy()
    assert abs(when.mean() - 0.5) < 0.02


def test_random_split_caps_to_leave_a_training_positive(tmp_path: Path) -> None:
    write_ratings_dat(tmp_path, [(1, i, 5, i) for i in range(1, 4)] + [(2, i, 5, i) for i in range(1, 6)])
    data = load_implicit("ml-1m", tmp_path, split="random", test_fraction=0.5, val_fraction=0.45)
    assert data.test.counts().tolist() == [1, 3] and data.val.counts().tolist() == [1, 1]  # 2 wanted, 1 left
    assert data.train.counts().tolist() == [1, 1]


# ------------------------------------------------------------------------------------ negatives


def test_negatives_never_hit_a_training_positive(loo4: ImplicitData) -> None:
    train = np.zeros((loo4.num_users, loo4.num_items), dtype=bool)  # a dense table, not the CSR the sampler reads
    train[loo4.train.pairs()] = True
    for seed in (0, 1, 2):
        for round in (0, 1, 7):
            t = sample_negatives(loo4, np.arange(loo4.num_clients), round, seed, n_per_positive=3)
            assert np.array_equal(t.user, loo4.train.pairs()[0]) and np.array_equal(t.positive, loo4.train.indices)
            assert t.negative.shape == (len(loo4.train), 3)
            assert np.all((t.negative >= 0) & (t.negative < loo4.num_items))
            assert not train[t.user[:, None], t.negative].any()


def test_negatives_may_be_held_out_items(loo4: ImplicitData) -> None:
    """The documented choice: validation and test items are not excluded (training does not know them)."""
    t = sample_negatives(loo4, np.arange(loo4.num_clients), 0, 0, n_per_positive=20)
    assert np.all(loo4.test.counts()[t.user] == 1) and np.all(loo4.val.counts()[t.user] == 1)
    for held in (loo4.test, loo4.val):  # each expected about 53,491 · 20 / 1,640 ≈ 650 times
        assert (t.negative == held.indices[held.indptr[t.user]][:, None]).sum() > 300


def test_negatives_do_not_depend_on_other_clients_or_grouping(data_dir: Path, loo4: ImplicitData) -> None:
    alone = sample_negatives(loo4, [5], 3, 0, n_per_positive=2)
    everyone = sample_negatives(loo4, np.arange(loo4.num_clients), 3, 0, n_per_positive=2)
    some = sample_negatives(loo4, [900, 5, 17], 3, 0, n_per_positive=2)
    assert np.array_equal(alone.user, np.full(len(loo4.train.row(5)), 5))
    for other in (everyone, some):
        mine = other.user == 5
        assert np.array_equal(other.positive[mine], alone.positive)
        assert np.array_equal(other.negative[mine], alone.negative)
    grouped = load_implicit("ml-100k", data_dir, seed=0, threshold=4, num_clients=40)
    c = int(grouped.client_of_user[5])
    together = sample_negatives(grouped, [c], 3, 0, n_per_positive=2)
    assert len(np.unique(together.user)) > 1
    for u in np.unique(together.user):
        mine = everyone.user == u
        assert np.array_equal(together.negative[together.user == u], everyone.negative[mine])


def test_negatives_differ_across_rounds_and_seeds(loo4: ImplicitData) -> None:
    clients = np.arange(0, loo4.num_clients, 3)
    base = sample_negatives(loo4, clients, 0, 0).negative
    assert np.array_equal(base, sample_negatives(loo4, clients, 0, 0).negative)
    for other in (sample_negatives(loo4, clients, 1, 0).negative, sample_negatives(loo4, clients, 0, 1).negative):
        assert (other != base).mean() > 0.99  # equal by chance with probability about 1 / 1,600 per draw


def test_negatives_are_uniform_over_the_allowed_items(loo: ImplicitData) -> None:
    """Chi-square goodness of fit of one user's negatives to the uniform law on the items outside its training
    positives: the heaviest user of ML-100K (id 405, 737 interactions, 735 in training), so that the mapping skips
    many positives; 30 negatives per positive (22,050 draws over 947 items, about 23 per item), seed and round
    fixed. Failing bar: p < 0.001 (a correct sampler fails it once in a thousand seeds)."""
    user = int(np.argmax(loo.train.counts()))
    assert loo.user_ids[user] == 405
    t = sample_negatives(loo, [int(loo.client_of_user[user])], 4, 11, n_per_positive=30)
    allowed = np.setdiff1d(np.arange(loo.num_items), loo.train.row(user))
    counts = np.bincount(np.searchsorted(allowed, t.negative.ravel()), minlength=len(allowed))
    assert np.array_equal(allowed[np.searchsorted(allowed, t.negative.ravel())], t.negative.ravel())
    assert counts.sum() == t.negative.size and len(counts) == len(allowed)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_negatives_on_a_nearly_full_row(tmp_path: Path) -> None:
    # user 1 rated items 1..5 (item 5 latest: test; 4: validation), user 2 rated item 6 only: catalogue of 6
    write_ratings_dat(tmp_path, [(1, i, 5, i) for i in range(1, 6)] + [(2, 6, 5, 1), (2, 1, 5, 0)])
    data = load_implicit("ml-1m", tmp_path, val=False)
    t = sample_negatives(data, [0], 0, 0, n_per_positive=50)
    assert t.positive.tolist() == [0, 1, 2, 3] and set(t.negative.ravel().tolist()) == {4, 5}
    write_ratings_dat(tmp_path, [(1, i, 5, i) for i in range(1, 7)] + [(2, 6, 5, 1)])
    full = load_implicit("ml-1m", tmp_path, split="random", test_fraction=0.01, val=False)
    full = replace(full, train=ItemSets.from_pairs(np.zeros(6, dtype=np.int64), np.arange(6), 2))
    with pytest.raises(ConfigError, match="user 0 has every item among its training positives"):
        sample_negatives(full, [0], 0, 0)


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "ml-10m"}, r"name must be one of \['ml-100k', 'filmtrust', 'ml-1m'\], got 'ml-10m'"),
        ({"split": "temporal"}, r"split must be one of \['leave_one_out', 'random'\], got 'temporal'"),
        ({"seed": -1}, r"seed must be an integer >= 0"),
        ({"test_fraction": 1.0}, r"test_fraction must lie in \(0.0, 1.0\)"),
        ({"val_fraction": 0}, r"val_fraction must lie in \(0.0, 1.0\)"),
        ({"split": "random", "test_fraction": 0.6, "val_fraction": 0.4}, r"test_fraction \+ val_fraction"),
        ({"val": "yes"}, r"val must be true or false"),
        ({"num_clients": 944}, r"num_clients must lie in \[1, 943\]"),
        ({"num_clients": 0}, r"num_clients must be an integer >= 1"),
    ],
)
def test_load_errors_name_the_field(data_dir: Path, kwargs: dict[str, object], message: str) -> None:
    args = {"name": "ml-100k", **kwargs}
    with pytest.raises(ConfigError, match=message):
        load_implicit(args.pop("name"), data_dir, **args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clients": [943]}, r"clients must be client ids in \[0, 943\)"),
        ({"clients": [-1]}, r"clients must be client ids in \[0, 943\)"),
        ({"clients": [3, 3]}, r"clients must be distinct"),
        ({"clients": [0.5]}, r"clients must be a 1-D list of integer client ids"),
        ({"clients": [[1]]}, r"clients must be a 1-D list"),
        ({"round": -1}, r"round must be an integer >= 0"),
        ({"seed": "x"}, r"seed must be an integer >= 0"),
        ({"n_per_positive": 0}, r"n_per_positive must be an integer >= 1"),
    ],
)
def test_sample_errors_name_the_field(loo: ImplicitData, kwargs: dict[str, object], message: str) -> None:
    args = {"clients": [0], "round": 0, "seed": 0, **kwargs}
    with pytest.raises(ConfigError, match=message):
        sample_negatives(loo, **args)
