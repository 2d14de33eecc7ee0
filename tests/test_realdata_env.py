"""Real-data streams (LastFM, MovieLens-100K): valid arm pools, documented event order, determinism, errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedrec.data.integrity import write_sums
from fedrec.envs.realdata import LastFMEnv, LoggedEventsEnv, MovieLensEnv
from fedrec.errors import ConfigError, DatasetNotFoundError

CHUNK = 500


@pytest.fixture(scope="module")
def lastfm(data_dir: Path) -> LastFMEnv:
    return LastFMEnv(data_dir, replicates=2, chunk_size=CHUNK)


@pytest.fixture(scope="module")
def movielens(data_dir: Path) -> MovieLensEnv:
    return MovieLensEnv(data_dir, replicates=2, chunk_size=CHUNK)


@pytest.fixture(params=["lastfm", "movielens"])
def env(request: pytest.FixtureRequest) -> LoggedEventsEnv:
    return request.getfixturevalue(request.param)


def raw_events(env: LoggedEventsEnv, data_dir: Path) -> pd.DataFrame:
    """The kept (user, item, order key) events read straight from the files; key inf = no date (goes last)."""
    if isinstance(env, LastFMEnv):
        root = data_dir / "hetrec2011-lastfm-2k"
        events = pd.read_csv(root / "user_artists.dat", sep="\t").rename(columns={"userID": "user", "artistID": "item"})
        tags = pd.read_csv(root / "user_taggedartists.dat", sep="\t")
        tags["key"] = tags.year * 10000 + tags.month * 100 + tags.day
        first = tags.groupby(["userID", "artistID"], as_index=False).key.min()
        first = first.rename(columns={"userID": "user", "artistID": "item"})
        events = events.merge(first, on=["user", "item"], how="left").fillna({"key": np.inf})
    else:
        events = pd.read_csv(data_dir / "ml-100k" / "u.data", sep="\t", names=["user", "item", "rating", "key"])
    return events[events.item.isin(env.item_ids) & events.user.isin(env.user_ids)][["user", "item", "key"]]


def seen_pairs(env: LoggedEventsEnv, data_dir: Path) -> set[tuple[int, int]]:
    """(client, item row) pairs the user interacted with: its events, and for LastFM its tagged artists too."""
    pairs = raw_events(env, data_dir)[["user", "item"]]
    if isinstance(env, LastFMEnv):
        tags = pd.read_csv(data_dir / "hetrec2011-lastfm-2k" / "user_taggedartists.dat", sep="\t")
        tags = tags.rename(columns={"userID": "user", "artistID": "item"})[["user", "item"]]
        pairs = pd.concat([pairs, tags[tags.item.isin(env.item_ids) & tags.user.isin(env.user_ids)]])
    clients = np.searchsorted(env.user_ids, pairs.user.to_numpy())
    rows = np.searchsorted(env.item_ids, pairs.item.to_numpy())
    return set(zip(clients.tolist(), rows.tolist()))


def test_full_dataset_counts(lastfm: LastFMEnv, movielens: MovieLensEnv) -> None:
    # the numbers documented in the class docstrings
    assert (lastfm.num_clients, lastfm.horizon, lastfm.num_items) == (1891, 86367, 12342)
    assert (movielens.num_clients, movielens.horizon, movielens.num_items) == (943, 100000, 1682)


def test_pools_hold_the_positive_once_and_unseen_distinct_negatives(env: LoggedEventsEnv, data_dir: Path) -> None:
    seen = seen_pairs(env, data_dir)
    last = (env.horizon - 1) // CHUNK
    for replicate, index in [(0, 0), (1, 7), (0, last)]:
        clients, arms = env.pool(replicate, index)
        positives = env.stream(replicate)[1][index * CHUNK : (index + 1) * CHUNK]
        assert arms.shape == (len(clients), env.num_arms)
        assert ((arms == positives[:, None]).sum(axis=1) == 1).all()
        slots = np.argmax(arms == positives[:, None], axis=1)
        assert len(np.unique(slots)) == env.num_arms  # the positive's position is random
        assert (np.diff(np.sort(arms, axis=1), axis=1) > 0).all()
        for client, row, positive in zip(clients.tolist(), arms.tolist(), positives.tolist()):
            assert (client, positive) in seen
            assert not any((client, item) in seen for item in row if item != positive)


def test_chunk_contexts_are_unit_features_and_reward_marks_the_positive(env: LoggedEventsEnv) -> None:
    ch = env.chunk(1, 3)
    clients, arms = env.pool(1, 3)
    assert ch.contexts.shape == (CHUNK, env.num_arms, env.dim) == (CHUNK, 25, 25)
    np.testing.assert_allclose(np.linalg.norm(ch.contexts, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(ch.contexts, env.features[arms])
    np.testing.assert_array_equal(ch.clients, clients)
    positives = env.stream(1)[1][3 * CHUNK : 4 * CHUNK]
    np.testing.assert_array_equal(ch.expected, (arms == positives[:, None]).astype(float))
    assert set(np.unique(ch.expected)) == {0.0, 1.0} and (ch.noise == 0).all()


def test_stream_consumes_each_event_once_in_documented_order(env: LoggedEventsEnv, data_dir: Path) -> None:
    events = raw_events(env, data_dir)
    clients, items = env.stream(0)
    steps = pd.DataFrame({"user": env.user_ids[clients], "item": env.item_ids[items], "step": np.arange(env.horizon)})
    assert len(steps) == len(events) == env.horizon
    merged = steps.merge(events, on=["user", "item"], how="outer", indicator=True, validate="one_to_one")
    assert (merged._merge == "both").all()
    ordered = merged.sort_values("step")
    assert ordered.groupby("user").key.is_monotonic_increasing.all()


def test_same_seed_same_chunks_other_replicate_other_order(data_dir: Path) -> None:
    a = MovieLensEnv(data_dir, replicates=2, seed=3, chunk_size=700)
    b = MovieLensEnv(data_dir, replicates=2, seed=3, chunk_size=700)
    for r, k in [(0, 0), (1, 5)]:
        ca, cb = a.chunk(r, k), b.chunk(r, k)
        for field in ("clients", "contexts", "expected", "noise"):
            np.testing.assert_array_equal(getattr(ca, field), getattr(cb, field))
    assert (a.stream(0)[0] != a.stream(1)[0]).mean() > 0.9
    other = MovieLensEnv(data_dir, seed=4, chunk_size=700)
    assert (other.stream(0)[0] != a.stream(0)[0]).mean() > 0.9


def test_chunks_regenerated_out_of_order_equal_the_originals(lastfm: LastFMEnv, data_dir: Path) -> None:
    originals = {k: lastfm.chunk(1, k) for k in (2, 9)}
    resumed = LastFMEnv(data_dir, replicates=2, chunk_size=CHUNK)
    for k in (9, 2):
        ch = resumed.chunk(1, k)
        for field in ("clients", "contexts", "expected", "noise"):
            np.testing.assert_array_equal(getattr(ch, field), getattr(originals[k], field))


def test_interactions_across_chunk_boundaries_match_the_chunks(movielens: MovieLensEnv) -> None:
    start, stop = 450, 1620
    got = movielens.interactions(start, stop)
    for r in range(movielens.replicates):
        chunks = [movielens.chunk(r, k) for k in range(4)]
        for field in ("clients", "contexts", "expected", "noise"):
            want = np.concatenate([getattr(c, field) for c in chunks])[start:stop]
            np.testing.assert_array_equal(getattr(got, field)[r].numpy(), want)


def test_last_chunk_is_clipped_to_the_horizon(movielens: MovieLensEnv) -> None:
    last = (movielens.horizon - 1) // CHUNK
    assert len(movielens.chunk(0, last).clients) == movielens.horizon - last * CHUNK
    with pytest.raises(ValueError, match="chunk"):
        movielens.chunk(0, last + 1)
    with pytest.raises(ValueError):
        movielens.interactions(movielens.horizon - 5, movielens.horizon + 1)


# --- tiny fake datasets -------------------------------------------------------------------------------------

def write_movielens(root: Path, ratings: list[tuple[int, int, int]], num_movies: int = 6) -> Path:
    """An ml-100k folder with ``num_movies`` drama movies (each with one more genre) and (user, item, time) ratings."""
    folder = root / "ml-100k"
    folder.mkdir(parents=True)
    movies = []
    for i in range(1, num_movies + 1):
        flags = ["0"] * 19
        flags[8] = "1"  # drama, shared by all so that no movie projects to zero
        flags[1 + i % 5] = "1"
        movies.append("|".join([str(i), f"Movie Title{i} (1995)", "01-Jan-1995", "", "http://x", *flags]))
    (folder / "u.item").write_text("\n".join(movies) + "\n", encoding="latin-1")
    (folder / "u.data").write_text("".join(f"{u}\t{i}\t4\t{t}\n" for u, i, t in ratings))
    write_sums(folder)  # files of its own, not the published ones: listed, so their line counts are not checked
    return folder


def write_lastfm(root: Path, tagged_lines: list[str]) -> Path:
    folder = root / "hetrec2011-lastfm-2k"
    folder.mkdir(parents=True)
    (folder / "user_artists.dat").write_text("userID\tartistID\tweight\r\n2\t51\t100\r\n2\t52\t7\r\n")
    header = "userID\tartistID\ttagID\tday\tmonth\tyear\r\n"
    (folder / "user_taggedartists.dat").write_text(header + "".join(line + "\r\n" for line in tagged_lines))
    write_sums(folder)
    return folder


def test_arrivals_are_uniform_over_users_with_remaining_events(tmp_path: Path) -> None:
    # user 1 has one event, user 2 three: P(user 1 at step j) = 1/2, 1/4, 1/8, 1/8
    write_movielens(tmp_path, [(1, 1, 5), (2, 2, 300), (2, 3, 100), (2, 4, 200)])
    env = MovieLensEnv(tmp_path, replicates=4000, dim=2, num_arms=2)
    assert (env.num_clients, env.horizon, env.num_items) == (2, 4, 6)
    position = np.zeros(4)
    for r in range(env.replicates):
        clients, items = env.stream(r)
        position[np.flatnonzero(clients == 0)[0]] += 1
        np.testing.assert_array_equal(env.item_ids[items[clients == 1]], [3, 4, 2])
    np.testing.assert_allclose(position / env.replicates, [1 / 2, 1 / 4, 1 / 8, 1 / 8], atol=0.03)


def test_missing_dataset_names_the_expected_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as err:
        LastFMEnv(tmp_path)
    assert str(tmp_path / "hetrec2011-lastfm-2k" / "user_artists.dat") in str(err.value)
    assert "https://grouplens.org/datasets/hetrec-2011/" in str(err.value)
    with pytest.raises(DatasetNotFoundError) as err:
        MovieLensEnv(tmp_path)
    assert str(tmp_path / "ml-100k" / "u.data") in str(err.value)
    assert "https://grouplens.org/datasets/movielens/100k/" in str(err.value)


@pytest.mark.parametrize(
    "bad, why",
    [("2\t52\tx\t1\t4\t2009", "'tag' must be an integer"), ("2\t52\t13\t1\t4", "expected 6 fields"), ("", "found 1")],
)
def test_malformed_lastfm_line_names_file_and_line(tmp_path: Path, bad: str, why: str) -> None:
    folder = write_lastfm(tmp_path, ["2\t51\t13\t1\t4\t2009", bad, "2\t52\t15\t1\t4\t2009"])
    with pytest.raises(ConfigError, match=why) as err:
        LastFMEnv(tmp_path, dim=1, num_arms=2)
    assert f"{folder / 'user_taggedartists.dat'}, line 3" in str(err.value)


def test_malformed_movielens_lines_name_file_and_line(tmp_path: Path) -> None:
    folder = write_movielens(tmp_path, [(1, 1, 5), (1, 2, 6)])
    (folder / "u.data").write_text("1\t1\t4\t5\n1\t2\t4\t6\t9\n")
    write_sums(folder)
    with pytest.raises(ConfigError, match="line 2: expected 4 fields") as err:
        MovieLensEnv(tmp_path, dim=2, num_arms=2)
    assert str(folder / "u.data") in str(err.value)
    (folder / "u.data").write_text("1\t1\t4\t5\n")
    lines = (folder / "u.item").read_text(encoding="latin-1").splitlines()
    lines[3] = lines[3].replace("|0|", "|yes|", 1)
    (folder / "u.item").write_text("\n".join(lines) + "\n", encoding="latin-1")
    write_sums(folder)
    with pytest.raises(ConfigError, match="line 4: field 'unknown' must be an integer") as err:
        MovieLensEnv(tmp_path, dim=2, num_arms=2)
    assert str(folder / "u.item") in str(err.value)


def test_bad_config_is_rejected_by_name(tmp_path: Path) -> None:
    write_movielens(tmp_path, [(1, 1, 5), (2, 2, 6), (2, 3, 7)])
    with pytest.raises(ConfigError, match="num_arms"):
        MovieLensEnv(tmp_path, dim=2, num_arms=1)
    with pytest.raises(ConfigError, match=r"num_arms must be <= 6 \(items with features\)"):
        MovieLensEnv(tmp_path, dim=2, num_arms=7)
    with pytest.raises(ConfigError, match="num_arms must be <= 5: user 2"):
        MovieLensEnv(tmp_path, dim=2, num_arms=6)
    with pytest.raises(ConfigError, match="dim"):
        MovieLensEnv(tmp_path, dim=0)
    with pytest.raises(ConfigError, match="dim must be <= 6"):
        MovieLensEnv(tmp_path, dim=7, num_arms=2)
    with pytest.raises(ConfigError, match="max_users"):
        MovieLensEnv(tmp_path, dim=2, num_arms=2, max_users=0)


def test_max_users_keeps_the_first_users_by_id(tmp_path: Path) -> None:
    write_movielens(tmp_path, [(5, 1, 5), (2, 2, 6), (9, 3, 7), (2, 4, 8)])
    env = MovieLensEnv(tmp_path, dim=2, num_arms=3, max_users=2, chunk_size=2)
    np.testing.assert_array_equal(env.user_ids, [2, 5])
    assert env.horizon == 3
    assert sorted(env.item_ids[env.stream(0)[1]].tolist()) == [1, 2, 4]
