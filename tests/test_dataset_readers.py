"""One reader per dataset file: ML-100K's ``u.data`` (read by the FedGNN loaders and three bandit environments) and
``u.item`` (two environments) are parsed, checked and reported missing in one place, so every user gives the same
error for the same file; and each environment declares the downloadable dataset it reads."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedrec.data import load_ratings
from fedrec.data.download import REGISTRY
from fedrec.data.integrity import write_sums
from fedrec.data.movielens import ML_GENRES, read_ml100k_movies
from fedrec.data.ratings import read_raw_ratings
from fedrec.envs import (
    ClusteredLinearEnv,
    DiabetesMAB,
    LastFMEnv,
    MovieLensEnv,
    MovieLensReplayEnv,
)
from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.utils.commands import python_command

#: every reader of ``ml-100k/u.data``, called on a data directory
RATING_USERS: dict[str, Callable[[Path], Any]] = {
    "load_ratings": lambda d: load_ratings("ml-100k", d),
    "ClusteredLinearEnv(theta=ml100k)": lambda d: ClusteredLinearEnv(theta="ml100k", data_dir=d),
    "MovieLensReplayEnv": MovieLensReplayEnv,
    "MovieLensEnv": MovieLensEnv,
}
#: every reader of ``ml-100k/u.item``
MOVIE_USERS = {name: RATING_USERS[name] for name in ("MovieLensReplayEnv", "MovieLensEnv")}

U_DATA = "196\t242\t3\t881250949\n186\t302\t5\t891717742\n22\t242\t1\t878887116\n"
U_USER = "22|25|M|writer|40206\n186|39|F|executive|00000\n196|49|M|writer|55105\n"
U_ITEM = "".join(
    f"{item}|{title}|01-Jan-1995||http://example.org/{item}|{'|'.join(flags)}\n"
    for item, title, flags in (
        (242, "Kolya (1996)", ["0"] * 5 + ["1"] + ["0"] * 13),
        (302, "L.A. Confidential (1997)", ["0"] * 6 + ["1"] + ["0"] * 9 + ["1"] + ["0"] * 2),
    )
)


def install(data_dir: Path, **files: str) -> Path:
    """Write ``data_dir/ml-100k/<name>`` for each ``name=text`` (``u_data`` -> ``u.data``)."""
    folder = data_dir / "ml-100k"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".")).write_text(text)
    write_sums(folder)  # files of its own, not the published ones: listed, so their line counts are not checked
    return data_dir


def error_of(build: Callable[[Path], Any], data_dir: Path, kind: type[Exception]) -> str:
    with pytest.raises(kind) as info:
        build(data_dir)
    return str(info.value)


def test_the_raw_table_is_the_file_line_by_line(tmp_path: Path) -> None:
    install(tmp_path, u_data=U_DATA)
    raw = read_raw_ratings("ml-100k", tmp_path)
    lines = [[int(v) for v in line.split("\t")] for line in U_DATA.splitlines()]
    assert list(raw.columns) == ["user", "item", "rating", "timestamp"]
    np.testing.assert_array_equal(raw.to_numpy(), np.array(lines, dtype=np.float64))
    assert [raw[c].dtype for c in raw.columns] == [np.int64, np.int64, np.float64, np.int64]
    assert raw.attrs["path"] == tmp_path / "ml-100k" / "u.data"


def test_the_movie_table_is_sorted_by_id_with_its_genre_flags(tmp_path: Path) -> None:
    reversed_lines = "".join(reversed(U_ITEM.splitlines(keepends=True)))
    install(tmp_path, u_item=reversed_lines)
    movies = read_ml100k_movies(tmp_path)
    assert movies["item"].tolist() == [242, 302]
    assert movies["title"].tolist() == ["Kolya (1996)", "L.A. Confidential (1997)"]
    flagged = [[g for g in ML_GENRES if row[g]] for _, row in movies.iterrows()]
    assert flagged == [["comedy"], ["crime", "thriller"]]


def test_a_missing_rating_file_is_one_message_from_every_reader(tmp_path: Path) -> None:
    messages = {name: error_of(build, tmp_path, DatasetNotFoundError) for name, build in RATING_USERS.items()}
    assert len(set(messages.values())) == 1, messages
    message = messages["load_ratings"]
    assert message.startswith(f"dataset file not found: {tmp_path / 'ml-100k' / 'u.data'}\n")
    assert f"`{python_command('-m', 'fedrec.data', 'download', 'ml-100k', '--data-dir', str(tmp_path))}`" in message
    assert "FEDREC_DATA_DIR" in message and REGISTRY["ml-100k"].page in message


def test_a_missing_movie_file_is_one_message_from_every_reader(tmp_path: Path) -> None:
    install(tmp_path, u_data=U_DATA, u_user=U_USER)
    messages = {error_of(build, tmp_path, DatasetNotFoundError) for build in MOVIE_USERS.values()}
    assert len(messages) == 1
    assert messages.pop().startswith(f"dataset file not found: {tmp_path / 'ml-100k' / 'u.item'}\n")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("1\t10\t3", "line 2: expected 4 fields"),
        ("1\tx\t3\t881250949", "line 2: field 'item' must be an integer, got 'x'"),
        ("-1\t10\t3\t881250949", "line 2: field 'user' must be an integer id >= 0, got -1"),
        ("1\t10\t7\t881250949", "line 2: field 'rating' must be an integer from 1 to 5 (MovieLens' scale), got 7"),
    ],
)
def test_a_malformed_rating_file_is_one_line_naming_it_from_every_reader(
    tmp_path: Path, line: str, expected: str
) -> None:
    lines = U_DATA.splitlines()
    install(tmp_path, u_data="\n".join([lines[0], line, *lines[1:]]) + "\n", u_user=U_USER, u_item=U_ITEM)
    messages = {name: error_of(build, tmp_path, ConfigError) for name, build in RATING_USERS.items()}
    assert len(set(messages.values())) == 1, messages
    message = messages["load_ratings"]
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'ml-100k' / 'u.data'}, {expected}")


def test_a_malformed_movie_file_is_one_line_naming_it_from_every_reader(tmp_path: Path) -> None:
    install(tmp_path, u_data=U_DATA, u_user=U_USER, u_item=U_ITEM.replace("|0|0|0|0|0|1|", "|0|0|0|0|0|yes|", 1))
    messages = {error_of(build, tmp_path, ConfigError) for build in MOVIE_USERS.values()}
    assert len(messages) == 1
    message = messages.pop()
    assert "\n" not in message
    assert re.match(rf"{re.escape(str(tmp_path / 'ml-100k' / 'u.item'))}, line 1: field 'comedy' must be an integer",
                    message)


@pytest.mark.parametrize(
    ("env", "dataset"),
    [(LastFMEnv, "lastfm"), (MovieLensEnv, "ml-100k"), (MovieLensReplayEnv, "ml-100k"), (DiabetesMAB, "diabetes")],
)
def test_an_environment_reads_the_dataset_it_declares(tmp_path: Path, env: type, dataset: str) -> None:
    assert env.dataset == dataset
    message = error_of(env, tmp_path, DatasetNotFoundError)
    folder = tmp_path / REGISTRY[dataset].folder
    assert re.search(rf"{re.escape(str(folder))}/({'|'.join(map(re.escape, REGISTRY[dataset].files))})", message)


def test_environments_without_a_fixed_dataset_declare_none() -> None:
    from fedrec.envs import CriteoReplayEnv, LinearEnv, MultiAgentMAB

    # Criteo is not downloadable; the clustered worlds read ml-100k or the authors' files, by their theta argument
    assert [e.dataset for e in (LinearEnv, MultiAgentMAB, CriteoReplayEnv, ClusteredLinearEnv)] == [None] * 4
