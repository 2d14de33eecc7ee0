"""MovieLens 100K's movie and user files (``ml-100k/u.item``, ``ml-100k/u.user``), read for the environments that
take their features; its ratings (``u.data``) are read by :func:`fedrec.data.ratings.read_raw_ratings`."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedrec.data.download import dataset_file
from fedrec.utils.tables import read_table

#: The 19 genre flags of ``u.item``, in file order (ml-100k/u.genre).
ML_GENRES = (
    "unknown", "action", "adventure", "animation", "children", "comedy", "crime", "documentary", "drama",
    "fantasy", "film_noir", "horror", "musical", "mystery", "romance", "sci_fi", "thriller", "war", "western",
)  # fmt: skip

_MOVIE_TEXT = ("title", "release", "video_release", "url")
_USER_TEXT = ("gender", "occupation", "zip")


def read_ml100k_movies(data_dir: str | Path) -> pd.DataFrame:
    """``u.item`` sorted by movie id: columns ``item``, ``title``, ``release``, ``video_release``, ``url`` and the 0/1
    flags :data:`ML_GENRES`. A missing file is the DatasetNotFoundError of every ML-100K file, a malformed line a
    ConfigError naming the file and the line."""
    path = dataset_file("ml-100k", data_dir, "u.item")
    return read_table(path, ["item", *_MOVIE_TEXT, *ML_GENRES], sep="|", text=_MOVIE_TEXT).sort_values("item")


def read_ml100k_users(data_dir: str | Path) -> pd.DataFrame:
    """``u.user`` sorted by user id: columns ``user``, ``age``, ``gender`` (``M``/``F``), ``occupation``, ``zip``.
    Errors as :func:`read_ml100k_movies`."""
    path = dataset_file("ml-100k", data_dir, "u.user")
    return read_table(path, ["user", "age", *_USER_TEXT], sep="|", text=_USER_TEXT).sort_values("user")
