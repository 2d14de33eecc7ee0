"""Rating datasets: statistics, exact partition into test/val/initial/stream, determinism, normalisation,
the streaming rule, ML-1M client grouping, errors that name the file, line or field (malformed lines, ids
and ratings off the scale) and the warning for duplicated (user, item) lines."""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedrec.data import (
    RatingData,
    Ratings,
    arrival_rounds,
    group_users,
    load_ratings,
    read_ratings,
)
from fedrec.data.integrity import write_sums
from fedrec.errors import ConfigError, DatasetNotFoundError
from tests.helpers import write_ratings_dat

#: The warning loading the shipped FilmTrust file gives: lines 7411, 7412 and 7414 repeat later pairs.
FILMTRUST_WARNING = (
    r"ratings\.txt: dropped 3 duplicated \(user, item\) line\(s\), keeping the last line of each of 3 "
    r"repeated pair\(s\) \(2 with differing ratings\); first dropped: line 7411"
)


@contextmanager
def duplicate_warning_iff_filmtrust(name: str) -> Iterator[None]:
    """Expect FilmTrust's duplicate warning when the shipped ``name`` is loaded, and no UserWarning otherwise."""
    if name == "filmtrust":
        with pytest.warns(UserWarning, match=FILMTRUST_WARNING):
            yield
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            yield


@pytest.fixture(scope="module")
def ml100k(data_dir: Path) -> RatingData:
    with duplicate_warning_iff_filmtrust("ml-100k"):
        return load_ratings("ml-100k", data_dir, seed=3, val_fraction=0.1)


@pytest.fixture(scope="module")
def filmtrust(data_dir: Path) -> RatingData:
    with duplicate_warning_iff_filmtrust("filmtrust"):
        return load_ratings("filmtrust", data_dir, seed=3)


def keys(r: Ratings) -> np.ndarray:
    """One int per (user, item) pair (unique within a dataset after de-duplication)."""
    return r.user * 1_000_000 + r.item


def tiny_ml1m(root: Path, users: int = 30, per_user: int = 7) -> Path:
    """A valid ratings.dat: user ids 1..users (shuffled lines), item ids spread out, ratings 1..5."""
    rng = np.random.default_rng(0)
    lines = [
        f"{u}::{10 * ((u * 7 + k * 13) % 40) + 5}::{1 + (u + k) % 5}::{978300760 + u + k}"
        for u in range(1, users + 1)
        for k in range(per_user)
    ]
    return write_ratings_dat(root, [lines[i] for i in rng.permutation(len(lines))])


#: Each dataset's file under the data folder and its separator.
LAYOUT = {
    "ml-100k": ("ml-100k/u.data", "\t"),
    "filmtrust": ("filmtrust/ratings.txt", " "),
    "ml-1m": ("ml-1m/ratings.dat", "::"),
}
#: Three valid lines (user, item, rating) per dataset, on its scale.
VALID = {
    "ml-100k": [(1, 1, 5), (1, 2, 3), (2, 1, 1)],
    "filmtrust": [(1, 1, 4), (1, 2, 0.5), (2, 1, 2.5)],
    "ml-1m": [(1, 1, 5), (1, 2, 3), (2, 1, 1)],
}


def write_rows(root: Path, name: str, rows: list[tuple[object, object, object]]) -> Path:
    """Write (user, item, rating) ``rows`` as ``name``'s file under ``root`` (MovieLens lines get a timestamp)."""
    file, sep = LAYOUT[name]
    path = root / file
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = (978300760,) if name != "filmtrust" else ()
    path.write_text("".join(sep.join(str(v) for v in (*row, *stamp)) + "\n" for row in rows))
    write_sums(path.parent)  # a file of its own, not the published one: listed, so its line count is not checked
    return path


# ------------------------------------------------------------------------------------ real data statistics


def test_ml100k_statistics(ml100k: RatingData) -> None:
    assert (ml100k.num_users, ml100k.num_items, ml100k.num_ratings) == (943, 1682, 100_000)
    assert ml100k.num_clients == 943 and np.array_equal(ml100k.client_of_user, np.arange(943))
    assert ml100k.rating_range == (1.0, 5.0) and ml100k.duplicates_dropped == 0
    assert ml100k.user_ids[0] == 1 and ml100k.user_ids[-1] == 943


def test_filmtrust_statistics(data_dir: Path, filmtrust: RatingData) -> None:
    with duplicate_warning_iff_filmtrust("filmtrust"):
        raw = read_ratings("filmtrust", data_dir)
    # 35,497 lines; 3 (user, item) pairs repeat, the later line wins (the paper's version: 18,662 / 874)
    assert raw.attrs["duplicates_dropped"] == 3 and len(raw) == 35_494
    assert (filmtrust.num_users, filmtrust.num_items, filmtrust.num_ratings) == (1508, 2071, 35_494)
    assert filmtrust.rating_range == (0.5, 4.0)
    row = raw[(raw.user_id == 308) & (raw.item_id == 235)]
    assert row.raw_rating.tolist() == [1.5]  # line 7468 overrides line 7412 (4)


def test_loader_frame_reindexes(data_dir: Path) -> None:
    frame = read_ratings("ml-100k", data_dir)
    assert list(frame.columns) == ["user", "item", "rating", "raw_rating", "user_id", "item_id"]
    assert frame.user.min() == 0 and frame.user.max() == 942 and frame.item.max() == 1681
    assert (frame.user_id.to_numpy() == frame.user.to_numpy() + 1).all()  # ML ids are 1..n, all present
    first = pd.read_csv(data_dir / "ml-100k" / "u.data", sep="\t", header=None, nrows=1).iloc[0]
    assert (frame.user_id[0], frame.item_id[0], frame.raw_rating[0]) == (first[0], first[1], first[2])


# ------------------------------------------------------------------------------------ splits


@pytest.mark.parametrize("which", ["ml100k", "filmtrust"])
def test_splits_partition_all_ratings(which: str, data_dir: Path, request: pytest.FixtureRequest) -> None:
    data: RatingData = request.getfixturevalue(which)
    with duplicate_warning_iff_filmtrust(data.name):
        frame = read_ratings(data.name, data_dir)
    parts = [data.test, data.val, data.initial, data.stream]
    joined = np.concatenate([keys(p) for p in parts])
    assert len(joined) == len(frame) and len(np.unique(joined)) == len(joined)
    assert np.array_equal(np.sort(joined), np.sort(frame.user.to_numpy() * 1_000_000 + frame.item.to_numpy()))
    # ratings travel with their pairs
    lookup = pd.Series(frame.rating.to_numpy(np.float32), index=frame.user * 1_000_000 + frame.item)
    for p in parts:
        assert np.array_equal(lookup.loc[keys(p)].to_numpy(), p.rating)
        assert p.user.dtype == np.int64 and p.item.dtype == np.int64 and p.rating.dtype == np.float32
    n = len(frame)
    n_test = round(0.2 * n)
    assert len(data.test) == n_test
    n_val = round((n - n_test) * (0.1 if which == "ml100k" else 0.0))
    assert len(data.val) == n_val
    rest = n - n_test - n_val
    assert len(data.initial) == rest - rest // 2 and len(data.stream) == rest // 2
    assert data.stream_round.dtype == np.int64 and len(data.stream_round) == len(data.stream)


def test_split_sizes_ml100k(ml100k: RatingData) -> None:
    assert (len(ml100k.test), len(ml100k.val), len(ml100k.initial), len(ml100k.stream)) == (
        20_000, 8_000, 36_000, 36_000,
    )  # fmt: skip


def test_split_is_random_not_per_user(ml100k: RatingData) -> None:
    share = np.bincount(ml100k.test.user, minlength=943) / np.bincount(
        np.concatenate([ml100k.test.user, ml100k.training.user, ml100k.val.user]), minlength=943
    )
    assert 0.15 < share.mean() < 0.25 and share.std() > 0.01


def test_deterministic_by_seed_and_different_across_seeds(data_dir: Path, ml100k: RatingData) -> None:
    again = load_ratings("ml-100k", data_dir, seed=3, val_fraction=0.1)
    for a, b in [(again.test, ml100k.test), (again.val, ml100k.val), (again.stream, ml100k.stream)]:
        assert np.array_equal(keys(a), keys(b)) and np.array_equal(a.rating, b.rating)
    assert np.array_equal(again.stream_round, ml100k.stream_round)
    other = load_ratings("ml-100k", data_dir, seed=4, val_fraction=0.1)
    assert not np.array_equal(keys(other.test), keys(ml100k.test))
    assert not np.array_equal(keys(other.initial), keys(ml100k.initial))


def test_test_split_does_not_depend_on_val_or_rounds(data_dir: Path, ml100k: RatingData) -> None:
    plain = load_ratings("ml-100k", data_dir, seed=3, rounds=7)
    assert np.array_equal(keys(plain.test), keys(ml100k.test)) and len(plain.val) == 0
    assert plain.stream_round.max() == 6


@pytest.mark.parametrize("normalize", ["max", "minmax"])
def test_normalisation(data_dir: Path, normalize: str) -> None:
    for name, raw_values in [("ml-100k", [1, 2, 3, 4, 5]), ("filmtrust", np.arange(1, 9) / 2)]:
        with duplicate_warning_iff_filmtrust(name):
            frame = read_ratings(name, data_dir, normalize=normalize)
        raw_values = np.asarray(raw_values, dtype=float)
        assert np.array_equal(np.unique(frame.raw_rating), raw_values)
        lo, hi = raw_values.min(), raw_values.max()
        expected = raw_values / hi if normalize == "max" else (raw_values - lo) / (hi - lo)
        assert np.allclose(np.unique(frame.rating), expected)
        assert frame.rating.min() >= 0 and frame.rating.max() == 1
        if normalize == "max" and name == "ml-100k":
            # the F1 threshold: ML ratings >= 3 are positive, and none sits on 0.5
            assert ((frame.rating >= 0.5) == (frame.raw_rating >= 3)).all() and not (frame.rating == 0.5).any()
    with duplicate_warning_iff_filmtrust("filmtrust"):
        data = load_ratings("filmtrust", data_dir, normalize=normalize)
    assert data.test.rating.min() >= 0 and data.test.rating.max() <= 1
    assert set(np.unique(data.denormalize(data.test.rating)).round(6)) == set(np.arange(1, 9) / 2)


# ------------------------------------------------------------------------------------ streaming rule


def test_arrival_rule_more_ratings_than_rounds() -> None:
    rounds = arrival_rounds(250, 100)
    counts = np.bincount(rounds, minlength=100)
    assert len(counts) == 100 and (counts[:50] == 3).all() and (counts[50:] == 2).all()
    assert (np.diff(rounds) >= 0).all()
    assert np.array_equal(np.bincount(arrival_rounds(200, 100)), np.full(100, 2))


def test_arrival_rule_fewer_ratings_than_rounds() -> None:
    assert np.array_equal(arrival_rounds(30, 100), np.arange(0, 90, 3))
    assert np.array_equal(arrival_rounds(1, 100), [0])
    assert np.array_equal(arrival_rounds(99, 100), np.arange(99))
    assert np.array_equal(arrival_rounds(3, 1), [0, 0, 0])
    assert len(arrival_rounds(0, 10)) == 0


def test_stream_follows_rule_per_client(ml100k: RatingData) -> None:
    T = ml100k.rounds
    assert (np.diff(ml100k.stream_round) >= 0).all() and ml100k.stream_round.min() >= 0
    assert ml100k.stream_round.max() < T
    clients = ml100k.client_of_user[ml100k.stream.user]
    for c in np.unique(clients)[:50]:
        got = ml100k.stream_round[clients == c]
        assert np.array_equal(np.sort(got), arrival_rounds(len(got), T))


def test_training_until(ml100k: RatingData) -> None:
    T = ml100k.rounds
    assert np.array_equal(keys(ml100k.training_until(-1)), keys(ml100k.initial))
    at0 = ml100k.training_until(0)
    assert len(at0) == len(ml100k.initial) + int((ml100k.stream_round == 0).sum())
    sizes = [len(ml100k.training_until(t)) for t in range(T)]
    assert sizes == sorted(sizes)
    full = ml100k.training_until(T - 1)
    assert len(full) == len(ml100k.initial) + len(ml100k.stream)
    assert np.array_equal(np.sort(keys(full)), np.sort(keys(ml100k.training)))
    assert len(ml100k.training_until(T + 5)) == len(full)
    with pytest.raises(ConfigError, match="round"):
        ml100k.training_until(-2)


# ------------------------------------------------------------------------------------ ML-1M format


def test_ml1m_tiny_file_and_client_grouping(tmp_path: Path) -> None:
    tiny_ml1m(tmp_path, users=30, per_user=7)
    data = load_ratings("ml-1m", tmp_path, num_clients=4, rounds=5, seed=1)
    assert (data.num_users, data.num_ratings, data.num_clients) == (30, 210, 4)
    assert data.rating_range == (1.0, 5.0) and data.user_ids.tolist() == list(range(1, 31))
    sizes = np.bincount(data.client_of_user, minlength=4)
    assert len(data.client_of_user) == 30 and sizes.min() >= 7 and sizes.max() <= 8  # 30 users -> 8,8,7,7
    assert set(data.client_of_user.tolist()) == set(range(4))
    assert not np.array_equal(data.client_of_user, np.sort(data.client_of_user))  # random, not by id
    # the streaming rule runs per client
    clients = data.client_of_user[data.stream.user]
    for c in range(4):
        got = data.stream_round[clients == c]
        assert np.array_equal(np.sort(got), arrival_rounds(len(got), 5))
    frame = read_ratings("ml-1m", tmp_path)
    assert frame.user_id.tolist()[:1] and set(frame.raw_rating) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    other = load_ratings("ml-1m", tmp_path, num_clients=4, rounds=5, seed=2)
    assert not np.array_equal(other.client_of_user, data.client_of_user)


def test_ml1m_default_605_clients_needs_enough_users(tmp_path: Path) -> None:
    tiny_ml1m(tmp_path, users=30)
    with pytest.raises(ConfigError, match=r"num_clients.*\[1, 30\].*605"):
        load_ratings("ml-1m", tmp_path)


def test_group_users() -> None:
    assert np.array_equal(group_users(10, 10, seed=0), np.arange(10))
    groups = group_users(6040, 605, seed=0)
    sizes = np.bincount(groups)
    assert len(sizes) == 605 and sizes.min() == 9 and sizes.max() == 10 and sizes.sum() == 6040
    assert np.array_equal(groups, group_users(6040, 605, seed=0))


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("name", "path", "url"),
    [
        ("ml-100k", "ml-100k/u.data", "grouplens.org/datasets/movielens"),
        ("filmtrust", "filmtrust/ratings.txt", "guoguibing.github.io/librec/datasets.html"),
        ("ml-1m", "ml-1m/ratings.dat", "grouplens.org/datasets/movielens"),
    ],
)
def test_missing_file_names_path_and_source(tmp_path: Path, name: str, path: str, url: str) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_ratings(name, tmp_path)
    message = str(info.value)
    assert str(tmp_path / path) in message and url in message and "unzip" in message


@pytest.mark.parametrize(
    ("lines", "line", "what"),
    [
        (["1::2::3::4", "1::3::4", "2::2::5::9"], 2, "expected 4 fields"),
        (["1::2::3::4", "2::3::4::5", "2::4::5::9::1"], 3, "expected 4 fields"),
        (["1::2::3::4", "1::3::good::4"], 2, "'rating' must be a number"),
        (["1::2::3::4", "1::x::3::4"], 2, "'item' must be an integer"),
        (["1::2::3::4", "", "1::4::3::4"], 2, "expected 4 fields"),
        (["1::2::3::4", "1::3::nan::4"], 2, "'rating' must be a finite number"),
        (["1::2::-1::4", "1::3::2::4"], 1, "'rating' must be an integer from 1 to 5"),
    ],
)
def test_malformed_ml1m_names_file_and_line(tmp_path: Path, lines: list[str], line: int, what: str) -> None:
    path = write_ratings_dat(tmp_path, lines)
    with pytest.raises(ConfigError) as info:
        read_ratings("ml-1m", tmp_path)
    message = str(info.value)
    assert f"{path}, line {line}:" in message and what in message


@pytest.mark.parametrize(
    ("folder", "file", "text", "line", "what"),
    [
        ("filmtrust", "ratings.txt", "1 1 2\n1 2\n", 2, "expected 3 fields"),
        ("filmtrust", "ratings.txt", "1 1 2\n1 2 3.5\n2 2 four\n", 3, "'rating' must be a number"),
        ("filmtrust", "ratings.txt", "1 1 2\n1 2 3 \n", 2, "expected 3 fields"),
        ("ml-100k", "u.data", "1\t2\t3\t4\n1\t2\t3\n", 2, "expected 4 fields"),
        ("ml-100k", "u.data", "1\t2\t3\t4\n1\t2\tx\t5\n", 2, "'rating' must be a number"),
        ("ml-100k", "u.data", "", 1, "empty"),
        ("filmtrust", "ratings.txt", "", 1, "empty"),
    ],
)
def test_malformed_names_file_and_line(
    tmp_path: Path, folder: str, file: str, text: str, line: int, what: str
) -> None:
    (tmp_path / folder).mkdir()
    path = tmp_path / folder / file
    path.write_text(text)
    write_sums(path.parent)
    with pytest.raises(ConfigError) as info:
        load_ratings("ml-100k" if folder == "ml-100k" else "filmtrust", tmp_path)
    message = str(info.value)
    assert f"{path}, line {line}:" in message and what in message


def test_empty_ml1m_file(tmp_path: Path) -> None:
    path = write_ratings_dat(tmp_path, [])
    with pytest.raises(ConfigError, match=rf"{path}, line 1: the file is empty"):
        load_ratings("ml-1m", tmp_path, num_clients=1)


def test_constant_ratings_cannot_be_minmax_normalised(tmp_path: Path) -> None:
    write_ratings_dat(tmp_path, ["1::1::4::0", "2::1::4::0"])
    with pytest.raises(ConfigError, match="minmax"):
        read_ratings("ml-1m", tmp_path, normalize="minmax")
    assert read_ratings("ml-1m", tmp_path).rating.tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "ml-10m"}, "name"),
        ({"rounds": 0}, "rounds"),
        ({"rounds": 2.5}, "rounds"),
        ({"test_fraction": 0.0}, "test_fraction"),
        ({"test_fraction": 1.0}, "test_fraction"),
        ({"val_fraction": -0.1}, "val_fraction"),
        ({"val_fraction": 1.0}, "val_fraction"),
        ({"num_clients": 0}, "num_clients"),
        ({"num_clients": 31}, "num_clients"),
        ({"normalize": "zscore"}, "normalize"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, kwargs: dict, field: str) -> None:
    tiny_ml1m(tmp_path, users=30)
    args = {"name": "ml-1m", "data_dir": tmp_path, "num_clients": 3, **kwargs}
    with pytest.raises(ConfigError, match=field) as info:
        load_ratings(**args)
    if field == "name":
        assert all(valid in str(info.value) for valid in ("ml-100k", "filmtrust", "ml-1m"))


# ------------------------------------------------------------------------------------ value validation


def assert_names_line(
    tmp_path: Path, name: str, rows: list[tuple[object, object, object]], line: int, what: str
) -> None:
    """Loading ``rows`` as ``name`` raises one ConfigError line naming the file, ``line`` and ``what``."""
    path = write_rows(tmp_path, name, rows)
    with pytest.raises(ConfigError) as info:
        load_ratings(name, tmp_path, num_clients=1)
    message = str(info.value)
    assert message.startswith(f"{path}, line {line}: ") and what in message and "\n" not in message


@pytest.mark.parametrize(
    ("name", "rating", "scale"),
    [
        ("ml-100k", 500, "'rating' must be an integer from 1 to 5 (MovieLens' scale), got 500 (1 such line(s)"),
        ("ml-100k", 0, "'rating' must be an integer from 1 to 5 (MovieLens' scale), got 0"),
        ("ml-100k", 3.5, "'rating' must be an integer from 1 to 5 (MovieLens' scale), got 3.5"),
        ("ml-1m", 6, "'rating' must be an integer from 1 to 5 (MovieLens' scale), got 6"),
        ("filmtrust", 5, "'rating' must be one of 0.5, 1, 1.5, ..., 4 (FilmTrust's scale, steps of 0.5), got 5"),
        ("filmtrust", 0, "'rating' must be one of 0.5, 1, 1.5, ..., 4 (FilmTrust's scale, steps of 0.5), got 0"),
    ],
)
def test_rating_off_the_scale_names_file_line_field_and_scale(
    tmp_path: Path, name: str, rating: float, scale: str
) -> None:
    rows = VALID[name]
    assert_names_line(tmp_path, name, [*rows[:2], (3, 3, rating), rows[2]], 3, scale)


@pytest.mark.parametrize("rating", [2.3, 0.25, 3.75])
def test_filmtrust_rating_between_half_steps_is_rejected(tmp_path: Path, rating: float) -> None:
    scale = f"'rating' must be one of 0.5, 1, 1.5, ..., 4 (FilmTrust's scale, steps of 0.5), got {rating}"
    assert_names_line(tmp_path, "filmtrust", [*VALID["filmtrust"], (3, 3, rating)], 4, scale)


@pytest.mark.parametrize("name", ["ml-100k", "filmtrust", "ml-1m"])
@pytest.mark.parametrize("field", ["user", "item"])
def test_negative_id_names_file_line_and_field(tmp_path: Path, name: str, field: str) -> None:
    bad = (-7, 3, VALID[name][0][2]) if field == "user" else (3, -7, VALID[name][0][2])
    off_scale = (4, 4, 100)  # a later bad rating: the first offending line is the one reported
    rows = [VALID[name][0], bad, (-1, -1, 100), off_scale, *VALID[name][1:]]
    assert_names_line(tmp_path, name, rows, 2, f"field '{field}' must be an integer id >= 0, got -7 (2 such line(s)")


@pytest.mark.parametrize("name", ["ml-100k", "filmtrust", "ml-1m"])
@pytest.mark.parametrize(("field", "value"), [("user", "1.5"), ("item", "2.5"), ("item", "-0.5")])
def test_non_integer_id_names_file_line_and_field(tmp_path: Path, name: str, field: str, value: str) -> None:
    rating = VALID[name][0][2]
    bad = (value, 3, rating) if field == "user" else (3, value, rating)
    assert_names_line(tmp_path, name, [*VALID[name], bad], 4, f"field '{field}' must be an integer, got '{value}'")


@pytest.mark.parametrize("name", ["ml-100k", "filmtrust", "ml-1m"])
def test_duplicated_pairs_keep_the_last_line_and_warn_with_counts(tmp_path: Path, name: str) -> None:
    low, mid, high = sorted({r for _, _, r in VALID[name]})
    rows = [(1, 1, low), (2, 1, mid), (1, 1, high), (3, 2, low), (1, 1, mid), (2, 1, mid)]
    write_rows(tmp_path, name, rows)
    expected = (
        r"dropped 3 duplicated \(user, item\) line\(s\), keeping the last line of each of 2 repeated pair\(s\) "
        r"\(1 with differing ratings\); first dropped: line 1$"
    )
    with pytest.warns(UserWarning, match=expected) as record:
        frame = read_ratings(name, tmp_path)
    assert len(record) == 1 and record[0].filename == __file__  # points at the caller, not at fedrec
    assert frame.attrs["duplicates_dropped"] == 3
    kept = {(u, i): r for u, i, r in zip(frame.user_id, frame.item_id, frame.raw_rating)}
    assert kept == {(1, 1): mid, (3, 2): low, (2, 1): mid}  # (1, 1) has low, high, mid in file order
    assert frame.user_id.tolist() == [3, 1, 2]  # the kept lines (4, 5, 6) in file order


@pytest.mark.parametrize("name", ["ml-100k", "filmtrust", "ml-1m"])
def test_valid_file_without_duplicates_loads_silently(tmp_path: Path, name: str) -> None:
    write_rows(tmp_path, name, VALID[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frame = read_ratings(name, tmp_path)
    assert frame.raw_rating.tolist() == [r for _, _, r in VALID[name]] and frame.attrs["duplicates_dropped"] == 0


@pytest.mark.parametrize("name", ["ml-100k", "filmtrust"])
def test_shipped_data_passes_validation_and_warns_iff_duplicated(data_dir: Path, name: str) -> None:
    with duplicate_warning_iff_filmtrust(name):
        frame = read_ratings(name, data_dir)
    assert frame.attrs["duplicates_dropped"] == (3 if name == "filmtrust" else 0)
