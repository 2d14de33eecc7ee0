"""Explicit-rating datasets for federated recommendation (BGTplanner paper §VII-A).

Datasets (files under ``data_dir``):

* ``ml-100k``: MovieLens 100K, ``ml-100k/u.data``, tab-separated ``user item rating timestamp``, ratings 1..5.
  943 users, 1,682 items, 100,000 ratings.
* ``filmtrust``: FilmTrust (Guo et al. 2013), ``filmtrust/ratings.txt``, space-separated ``user item rating``,
  ratings 0.5..4 in steps of 0.5. The file holds 35,497 lines: 1,508 users, 2,071 items. Three (user, item)
  pairs occur twice (lines 7411/7437, 7412/7468, 7414/7489; two of them with different ratings); the later
  line is kept (see "Validation"), which leaves 35,494 ratings. The paper reports 18,662 ratings from 874
  users (and the authors' pickle 1,957 items): that is another version of the dataset, and no filter is
  applied here to imitate it.
* ``ml-1m``: MovieLens 1M, ``ml-1m/ratings.dat``, ``user::item::rating::timestamp``, ratings 1..5 (whole
  stars). 6,040 users, 3,706 rated items, 1,000,209 ratings (per its README). Users are grouped at random into
  605 clients (paper §VII-A); the other datasets have one client per user.
* ``douban``, ``flixster``, ``yahoo_music``: the Monti et al. rating matrices (:mod:`fedrec.data.monti`: sizes,
  scales, side graphs, validation), 3,000 users × 3,000 items each, with a fixed train/test split in the file.
  Their test split is that one (step 1 below); their training ratings follow steps 2 and 3.

Validation, on the raw file before anything is dropped or normalised (:func:`read_raw_ratings`, the one reader of
these files, which the environments that read ML-100K share):

* Every line must hold integer ids >= 0 and a rating on the dataset's scale: the integers 1..5 on MovieLens
  (their READMEs), 0.5, 1, ..., 4 on FilmTrust (its readme states no scale; these are the eight values its
  file holds). Anything else raises a :class:`~fedrec.errors.ConfigError` naming the file, the first
  offending line, the field and the scale: a stray 500 among 1..5 ratings would otherwise become the
  ``"max"`` divisor and push every rating under the 0.5 threshold of the metrics.
* A (user, item) pair on several lines keeps its last line, as a dict or matrix filled line by line would,
  and the earlier lines are dropped with a ``UserWarning`` that counts them (FilmTrust's 3 lines above).

Users and items are re-indexed to ``0..n-1`` in increasing order of their dataset ids.

Normalisation (the paper only says "all rating scores are normalized to the range [0,1]"):

* ``"max"`` (default): ``r / r_max`` with ``r_max`` the largest rating in the file. ML 1..5 -> 0.2..1,
  FilmTrust 0.5..4 -> 0.125..1. It is the default because the metrics binarise ratings and predictions at 0.5
  (paper §VII-A2): with ``"max"`` an ML rating is positive iff it is >= 3 (0.6; a 2 is 0.4), so no rating sits on the
  threshold, and FilmTrust ratings >= 2 are positive. It also matches the paper's RMSE scale: ML-100K's 0.2017
  is a raw-scale RMSE of about 1.0 under ``r / 5`` (plausible for a private FedGNN) but 0.81 under min-max.
* ``"minmax"``: ``(r - r_min) / (r_max - r_min)``, exactly [0, 1]. ML rating 3 then maps to exactly 0.5.

Splits (all random numbers come from :func:`fedrec.utils.seeding.numpy_generator`, so a seed fixes everything):

1. ``test``: a uniformly random ``test_fraction`` (default 1/5, the paper's 4:1) of all ratings, or the dataset's
   own fixed test set where it has one (the Monti et al. matrices), or where one is chosen: ``split=u1`` (..
   ``u5``, ``ua``, ``ub``) tests ML-100K on its ``u1.test`` (the split GC-MC and FedPerGNN report: 80,000 training
   and 20,000 test ratings), every pair of which must be a rating of ``u.data``.
2. ``val``: a random ``val_fraction`` of the remaining (training) ratings, held out of training; empty by
   default. A planner can take its reward from it instead of from the test set.
3. The rest is split at random into two halves: ``initial`` (available from round 0; it gets the odd rating)
   and ``stream`` (paper §VII-A: "randomly and evenly sampled and added" as training proceeds).

Streaming rule (from the authors' code; the paper gives none): for each client, its ``n`` streamed ratings arrive in a
random order over the ``T = rounds`` rounds 0..T-1: if ``n >= T``, ``floor(n/T)`` per round plus one more in
each of the first ``n mod T`` rounds; if ``n < T``, one every ``floor(T/n)`` rounds starting at round 0.
Clients are users on ML-100K and FilmTrust, so there the rule is per user; on ML-1M it is per client (the
authors ran ML-1M as a dataset of 605 merged "users", so their per-user rule is this per-client rule).

Every split is sorted by (user, item); ``stream`` is sorted by (arrival round, user, item), so the ratings
available at a round are ``initial`` plus a prefix of ``stream``.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from fedrec.data.download import dataset_file
from fedrec.data.monti import MONTI_DATASETS, read_monti
from fedrec.data.scales import RatingScale
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.utils.seeding import numpy_generator
from fedrec.utils.tables import read_table

#: Rating files of one (user, item, rating) line each, read by :func:`read_ratings`.
TEXT_DATASETS = ("ml-100k", "filmtrust", "ml-1m")
#: Names accepted by :func:`load_ratings`: the rating files and the Monti et al. matrices.
DATASETS = (*TEXT_DATASETS, *MONTI_DATASETS)
#: Share of the ratings in a random test split unless given (the paper's 4:1 split).
TEST_FRACTION = 0.2
#: Normalisation rules accepted by the loaders.
NORMALIZATIONS = ("max", "minmax")
#: MovieLens-100K's own train/test splits (``split=``; its README: u1..u5 are five disjoint 20% test sets, ua/ub
#: hold out 10 ratings per user)
ML100K_SPLITS = ("u1", "u2", "u3", "u4", "u5", "ua", "ub")
#: ``split``: a random test set, or one of the dataset's own
SPLITS = ("random", *ML100K_SPLITS)
#: Clients of ML-1M when ``num_clients`` is not given (paper §VII-A: 6,040 users in 605 clients).
ML1M_CLIENTS = 605


@dataclass(frozen=True, eq=False)
class Ratings:
    """Parallel arrays of (user, item, rating): int64 user and item indices, float32 normalised ratings."""

    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "user", np.asarray(self.user, dtype=np.int64))
        object.__setattr__(self, "item", np.asarray(self.item, dtype=np.int64))
        object.__setattr__(self, "rating", np.asarray(self.rating, dtype=np.float32))
        if not len(self.user) == len(self.item) == len(self.rating):
            raise ValueError(
                f"Ratings arrays differ in length: user {len(self.user)}, item {len(self.item)}, "
                f"rating {len(self.rating)}"
            )

    def __len__(self) -> int:
        return len(self.user)

    def take(self, index: np.ndarray | slice) -> Ratings:
        """The ratings at ``index`` (an index array, boolean mask or slice)."""
        return Ratings(self.user[index], self.item[index], self.rating[index])

    @staticmethod
    def concat(*parts: Ratings) -> Ratings:
        """The ratings of all ``parts``, in order."""
        if not parts:
            return Ratings(np.zeros(0), np.zeros(0), np.zeros(0))
        return Ratings(
            np.concatenate([p.user for p in parts]),
            np.concatenate([p.item for p in parts]),
            np.concatenate([p.rating for p in parts]),
        )


@dataclass(eq=False)
class RatingData:
    """A rating dataset split for federated training (see the module docstring for every rule).

    ``test``, ``val``, ``initial`` and ``stream`` partition the ratings: each rating is in exactly one.
    ``stream_round[k]`` is the round (0-based) at which ``stream``'s k-th rating joins the training data.
    """

    name: str
    num_users: int
    num_items: int
    num_clients: int
    client_of_user: np.ndarray  # (num_users,) int64 client id of each user
    test: Ratings
    val: Ratings
    initial: Ratings
    stream: Ratings
    stream_round: np.ndarray  # (len(stream),) int64, non-decreasing
    rounds: int
    normalize: str
    rating_range: tuple[float, float]  # (min, max) raw rating in the file, which fixes the normalisation
    user_ids: np.ndarray = field(repr=False)  # (num_users,) dataset id of each user index
    item_ids: np.ndarray = field(repr=False)  # (num_items,) dataset id of each item index
    duplicates_dropped: int = 0  # repeated (user, item) lines in the file (the last one is kept)
    # side graphs over the user and item indices (0/1 adjacency, scipy CSR) where the dataset has them (Monti et al.)
    user_graph: sp.csr_matrix | None = field(default=None, repr=False)
    item_graph: sp.csr_matrix | None = field(default=None, repr=False)

    @property
    def num_ratings(self) -> int:
        return len(self.test) + len(self.val) + len(self.initial) + len(self.stream)

    @property
    def training(self) -> Ratings:
        """All training ratings: ``initial`` plus every streamed rating (the data at the last round)."""
        return Ratings.concat(self.initial, self.stream)

    def training_until(self, round: int) -> Ratings:
        """Training ratings available at ``round``: ``initial`` plus the streamed ones with
        ``stream_round <= round`` (``round = -1`` gives ``initial`` alone)."""
        round = check_int("round", round, minimum=-1)
        end = int(np.searchsorted(self.stream_round, round, side="right"))
        return Ratings.concat(self.initial, self.stream.take(slice(0, end)))

    def arrivals(self, round: int) -> int:
        """How many streamed training ratings arrive in ``round`` (0 in every round without streaming)."""
        return int(np.searchsorted(self.stream_round, round, side="right")
                   - np.searchsorted(self.stream_round, round, side="left"))

    def denormalize(self, rating: np.ndarray) -> np.ndarray:
        """Map normalised ratings (or predictions) back to the dataset's rating scale."""
        lo, hi = self.rating_range
        rating = np.asarray(rating, dtype=np.float64)
        return rating * hi if self.normalize == "max" else lo + rating * (hi - lo)

    @property
    def rating_unit(self) -> float:
        """Original rating units per normalised unit, the slope of :meth:`denormalize` (``r_max`` under ``"max"``,
        ``r_max − r_min`` under ``"minmax"``): an RMSE on the normalised scale times it is the original-scale RMSE."""
        return float(self.denormalize(1.0) - self.denormalize(0.0))

    @property
    def scale(self) -> str:
        """The scale the metrics see, e.g. ``"ratings 1–5 as r / 5"``: how the file's ratings were normalised."""
        lo, hi = self.rating_range
        rule = f"r / {hi:g}" if self.normalize == "max" else f"(r − {lo:g}) / {hi - lo:g}"
        return f"ratings {lo:g}–{hi:g} as {rule}"

    def summary(self) -> dict[str, object]:
        """Counts for logs and READMEs."""
        return {
            "dataset": self.name,
            "users": self.num_users,
            "items": self.num_items,
            "ratings": self.num_ratings,
            "clients": self.num_clients,
            "test": len(self.test),
            "val": len(self.val),
            "initial": len(self.initial),
            "stream": len(self.stream),
            "rounds": self.rounds,
            "normalize": self.normalize,
            "rating_range": list(self.rating_range),
            "duplicates_dropped": self.duplicates_dropped,
        }


# ---------------------------------------------------------------------------------------------- loaders


_MOVIELENS_SCALE = RatingScale(1.0, 5.0, 1.0, "an integer from 1 to 5 (MovieLens' scale)")
_FILMTRUST_SCALE = RatingScale(0.5, 4.0, 0.5, "one of 0.5, 1, 1.5, ..., 4 (FilmTrust's scale, steps of 0.5)")


@dataclass(frozen=True)
class _Format:
    """A rating file: its name in the dataset's folder (:data:`fedrec.data.download.REGISTRY`), layout and scale."""

    file: str
    sep: str
    columns: tuple[str, ...]
    scale: RatingScale


_FORMATS = {
    "ml-100k": _Format("u.data", "\t", ("user", "item", "rating", "timestamp"), _MOVIELENS_SCALE),
    "filmtrust": _Format("ratings.txt", " ", ("user", "item", "rating"), _FILMTRUST_SCALE),
    "ml-1m": _Format("ratings.dat", "::", ("user", "item", "rating", "timestamp"), _MOVIELENS_SCALE),
}


def read_raw_ratings(name: str, data_dir: str | Path) -> pd.DataFrame:
    """The rating file of dataset ``name`` (one of :data:`TEXT_DATASETS`) under ``data_dir``, as it is: one row per line
    in file order, columns ``user`` and ``item`` (the dataset's ids, int64), ``rating`` (raw, float64) and, where
    the file has one, ``timestamp`` (int64); ``frame.attrs["path"]`` is the file.

    The one reader of these files: :func:`read_ratings` and the environments that read ML-100K build on it.
    Raises DatasetNotFoundError (the file, how to install the dataset, ``FEDREC_DATA_DIR``) if the file is
    missing, and ConfigError naming the file, 1-based line and field of the first malformed line, negative id or
    rating off the dataset's scale.
    """
    fmt = _FORMATS[_check_name(name)]
    path = dataset_file(name, data_dir, fmt.file)
    raw = read_table(path, fmt.columns, sep=fmt.sep, numbers=("rating",))
    _check_values(raw, fmt.scale, path)
    raw.attrs["path"] = path
    return raw


def read_ratings(name: str, data_dir: str | Path, normalize: str = "max", *, timestamps: bool = False) -> pd.DataFrame:
    """Read dataset ``name`` (one of :data:`TEXT_DATASETS`) from ``data_dir``.

    Returns one row per (user, item) pair, in file order, with columns ``user`` and ``item`` (indices
    ``0..n-1`` in increasing order of the dataset ids), ``rating`` (normalised by ``normalize``, float64),
    ``raw_rating``, ``user_id`` and ``item_id`` (the dataset's own ids), and with ``timestamps`` the file's
    ``timestamp`` column where it has one (the implicit-feedback split orders by it). ``frame.attrs`` holds
    ``rating_range`` (raw min, max) and ``duplicates_dropped``.

    Errors as :func:`read_raw_ratings`. Warns (UserWarning) with the count of duplicated (user, item) lines
    dropped.
    """
    name = _check_name(name)
    normalize = _check_normalize(normalize)
    raw = read_raw_ratings(name, data_dir)
    path = raw.attrs["path"]
    before = len(raw)
    raw = _drop_duplicates(raw, path)
    user_ids, user = np.unique(raw["user"].to_numpy(), return_inverse=True)
    item_ids, item = np.unique(raw["item"].to_numpy(), return_inverse=True)
    raw_rating = raw["rating"].to_numpy(np.float64)
    lo, hi = float(raw_rating.min()), float(raw_rating.max())
    frame = pd.DataFrame(
        {
            "user": user.astype(np.int64),
            "item": item.astype(np.int64),
            "rating": normalize_ratings(raw_rating, normalize, lo, hi, path),
            "raw_rating": raw_rating,
            "user_id": raw["user"].to_numpy(),
            "item_id": raw["item"].to_numpy(),
        }
    )
    if timestamps and "timestamp" in raw:
        frame["timestamp"] = raw["timestamp"].to_numpy()
    frame.attrs["rating_range"] = (lo, hi)
    frame.attrs["duplicates_dropped"] = before - len(raw)
    return frame


def load_ml100k(data_dir: str | Path, normalize: str = "max") -> pd.DataFrame:
    """MovieLens 100K ratings (``<data_dir>/ml-100k/u.data``); see :func:`read_ratings`."""
    return read_ratings("ml-100k", data_dir, normalize)


def load_filmtrust(data_dir: str | Path, normalize: str = "max") -> pd.DataFrame:
    """FilmTrust ratings (``<data_dir>/filmtrust/ratings.txt``); see :func:`read_ratings`."""
    return read_ratings("filmtrust", data_dir, normalize)


def load_ml1m(data_dir: str | Path, normalize: str = "max") -> pd.DataFrame:
    """MovieLens 1M ratings (``<data_dir>/ml-1m/ratings.dat``); see :func:`read_ratings`."""
    return read_ratings("ml-1m", data_dir, normalize)


def _check_values(raw: pd.DataFrame, scale: RatingScale, path: Path) -> None:
    """Raise ConfigError at the first line with a negative id or a rating off ``scale`` (rows are file lines)."""
    checks = [
        ("user", raw["user"].to_numpy() < 0, "an integer id >= 0"),
        ("item", raw["item"].to_numpy() < 0, "an integer id >= 0"),
        ("rating", scale.off_scale(raw["rating"].to_numpy()), scale.text),
    ]
    failing = [(int(np.argmax(bad)), column, bad, expected) for column, bad, expected in checks if bad.any()]
    if failing:
        row, column, bad, expected = min(failing, key=lambda f: f[0])
        value = raw[column].iloc[row]
        raise ConfigError(
            f"{path}, line {row + 1}: field {column!r} must be {expected}, got {value:g} "
            f"({int(bad.sum())} such line(s) in the file)"
        )


def _drop_duplicates(raw: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Keep the last line of each (user, item) pair, warning with counts if any earlier line is dropped."""
    earlier = raw.duplicated(subset=["user", "item"], keep="last").to_numpy()
    if not earlier.any():
        return raw
    repeated = raw[raw.duplicated(subset=["user", "item"], keep=False)]
    ratings_per_pair = repeated.groupby(["user", "item"])["rating"].nunique()
    warnings.warn(
        f"{path}: dropped {int(earlier.sum())} duplicated (user, item) line(s), keeping the last line of each of "
        f"{len(ratings_per_pair)} repeated pair(s) ({int((ratings_per_pair > 1).sum())} with differing ratings); "
        f"first dropped: line {int(np.argmax(earlier)) + 1}",
        UserWarning,
        stacklevel=3,
    )
    return raw[~earlier]


def normalize_ratings(rating: np.ndarray, normalize: str, lo: float, hi: float, source: str | Path) -> np.ndarray:
    """Ratings on the scale [lo, hi] of ``source`` (a file, or a generator) mapped by ``normalize`` (module
    docstring): ``r / hi`` or ``(r − lo) / (hi − lo)``; a scale the rule cannot use is a ConfigError naming it."""
    if normalize == "max":
        if hi <= 0:
            raise ConfigError(f"{source}: normalize='max' needs a positive rating, but the largest is {hi}")
        return rating / hi
    if hi <= lo:
        raise ConfigError(f"{source}: normalize='minmax' needs two distinct ratings, but every rating is {lo}")
    return (rating - lo) / (hi - lo)


# ---------------------------------------------------------------------------------------------- splits


def load_ratings(
    name: str,
    data_dir: str | Path,
    seed: int = 0,
    rounds: int = 100,
    test_fraction: float | None = None,
    val_fraction: float = 0.0,
    num_clients: int | None = None,
    normalize: str = "max",
    split: str = "random",
    stream: bool = True,
) -> RatingData:
    """Load dataset ``name`` from ``data_dir`` and split it for federated training with streaming.

    Args:
        name: one of :data:`DATASETS`.
        data_dir: folder that holds the dataset folders (``ml-100k/``, ``filmtrust/``, ``ml-1m/``, ``douban/``, ...).
        seed: fixes the test/val/initial/stream split, the arrival order and the ML-1M client grouping.
        rounds: T, the rounds over which ``stream`` arrives.
        test_fraction: share of all ratings in a random ``test`` split; None = 0.2 (the paper's 4:1 split). The
            Monti et al. datasets (:data:`~fedrec.data.monti.MONTI_DATASETS`) test on their file's fixed split and
            refuse a number.
        val_fraction: share of the training ratings held out in ``val`` (0 = no validation set).
        num_clients: clients; None = one per user (ML-100K, FilmTrust, the Monti et al. datasets) or 605 (ML-1M).
            Fewer clients than users groups the users at random into clients of near-equal size (sizes differ by
            at most one).
        normalize: ``"max"`` or ``"minmax"`` (module docstring).
        split: ``"random"``, or one of ML-100K's own test sets (:data:`ML100K_SPLITS`; ``test_fraction`` null).
        stream: False puts every training rating in ``initial`` (there from round 0, as FedPerGNN and GC-MC train).

    The test split has ``round(N * test_fraction)`` ratings (at least 1, at most N - 1), ``val`` has
    ``round(n_train * val_fraction)``, ``initial`` gets ``ceil(rest / 2)`` and ``stream`` the other half.
    """
    name = _check_name(name, DATASETS)
    split = check_choice("split", split, SPLITS)
    if split != "random" and name != "ml-100k":
        raise ConfigError(f"split={split} is one of MovieLens-100K's own test sets; {name} has none (split=random)")
    fixed = name in MONTI_DATASETS
    if fixed and test_fraction is not None:
        raise ConfigError(f"test_fraction must be null for {name}: its test set is the file's fixed one (Otest), "
                          f"got {test_fraction!r}")
    if split != "random" and test_fraction is not None:
        raise ConfigError(f"test_fraction must be null with split={split}: the test set is {split}.test, got "
                          f"{test_fraction!r}")
    seed, rounds, test_fraction, val_fraction, normalize, stream = check_split(
        seed, rounds, TEST_FRACTION if test_fraction is None else test_fraction, val_fraction, normalize, stream
    )
    if fixed:
        matrix = read_monti(name, data_dir)
        rating_range, duplicates_dropped, fixed_test = matrix.rating_range, 0, matrix.test
        everything = Ratings(matrix.user, matrix.item,
                             normalize_ratings(matrix.rating, normalize, *rating_range, matrix.path))
        user_ids, item_ids = np.arange(matrix.num_users), np.arange(matrix.num_items)
    else:
        frame = read_ratings(name, data_dir, normalize)
        rating_range, duplicates_dropped, fixed_test = (
            frame.attrs["rating_range"], frame.attrs["duplicates_dropped"], None)
        everything = Ratings(frame["user"].to_numpy(), frame["item"].to_numpy(), frame["rating"].to_numpy())
        user_ids = np.unique(frame["user_id"].to_numpy())
        item_ids = np.unique(frame["item_id"].to_numpy())
        if split != "random":
            fixed_test = canonical_test(frame, split, data_dir)
    num_users, n = len(user_ids), len(everything)

    if num_clients is None:
        num_clients = ML1M_CLIENTS if name == "ml-1m" else num_users
        what = f"the {name} default"
    else:
        what = "given"
    num_clients = check_int("num_clients", num_clients)
    if num_clients > num_users:
        raise ConfigError(
            f"num_clients must lie in [1, {num_users}] (the users of {name}), got {num_clients} ({what})"
        )
    if n < 2:
        raise ConfigError(f"{name}: a train/test split needs at least 2 ratings, the file has {n}")
    data = split_ratings(
        everything,
        name=name,
        user_ids=user_ids,
        item_ids=item_ids,
        num_clients=num_clients,
        seed=seed,
        rounds=rounds,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        normalize=normalize,
        rating_range=rating_range,
        duplicates_dropped=int(duplicates_dropped),
        fixed_test=fixed_test,
        streaming=stream,
    )
    if fixed:
        data.user_graph, data.item_graph = matrix.user_graph, matrix.item_graph
    return data


def canonical_test(frame: pd.DataFrame, split: str, data_dir: str | Path) -> np.ndarray:
    """Which rows of ML-100K's ``frame`` (:func:`read_ratings`) are in its test file ``<split>.test`` (bool per
    row); a test line that is no rating of ``u.data`` is a ConfigError naming the file and the line."""
    path = dataset_file("ml-100k", data_dir, f"{split}.test")
    test = read_table(path, _FORMATS["ml-100k"].columns, sep="\t", numbers=("rating",))
    width = int(max(frame["item_id"].max(), test["item"].max())) + 1
    rows = frame["user_id"].to_numpy() * width + frame["item_id"].to_numpy()
    wanted = test["user"].to_numpy() * width + test["item"].to_numpy()
    absent = np.flatnonzero(~np.isin(wanted, rows))
    if absent.size:
        line = int(absent[0]) + 1
        raise ConfigError(f"{path}: line {line} (user {test['user'].iloc[line - 1]}, item "
                          f"{test['item'].iloc[line - 1]}) is no rating of u.data: the files are of different versions")
    return np.isin(rows, wanted)


def check_split(
    seed: object, rounds: object, test_fraction: object, val_fraction: object, normalize: object, stream: object
) -> tuple[int, int, float, float, str, bool]:
    """The split settings of :func:`load_ratings`, checked (ConfigError naming the field) and converted."""
    if not isinstance(stream, bool):
        raise ConfigError(f"data.stream must be true or false, got {stream!r}")
    return (
        check_int("seed", seed, minimum=0),
        check_int("rounds", rounds, minimum=1),
        check_float("test_fraction", test_fraction, low=0.0, high=1.0, low_open=True, high_open=True),
        check_float("val_fraction", val_fraction, low=0.0, high=1.0, high_open=True),
        _check_normalize(normalize),
        stream,
    )


def split_ratings(
    everything: Ratings,
    *,
    name: str,
    user_ids: np.ndarray,
    item_ids: np.ndarray,
    num_clients: int,
    seed: int,
    rounds: int,
    test_fraction: float,
    val_fraction: float,
    normalize: str,
    rating_range: tuple[float, float],
    duplicates_dropped: int = 0,
    fixed_test: np.ndarray | None = None,
    streaming: bool = True,
) -> RatingData:
    """Split ``everything`` (normalised ratings with user and item indices into ``user_ids`` and ``item_ids``, one
    per (user, item) pair, at least 2) for federated training by the rules of the module docstring: the step of
    :func:`load_ratings` after reading a file, shared by the generated datasets (:mod:`fedrec.data.synthetic`).
    The arguments are those of :func:`load_ratings`, checked by the caller (:func:`check_split`); ``fixed_test``
    (bool per rating) is a dataset's own test set, which replaces the random one (``test_fraction`` is unused);
    ``streaming=False`` streams nothing."""
    n, num_users = len(everything), len(user_ids)
    client_of_user = group_users(num_users, num_clients, seed)
    shuffle = numpy_generator(seed, "ratings-split")
    if fixed_test is None:
        order = shuffle.permutation(n)
        n_test = min(max(_round(n * test_fraction), 1), n - 1)
        held_out, training = order[:n_test], order[n_test:]
    else:
        held_out, training = np.flatnonzero(fixed_test), np.flatnonzero(~np.asarray(fixed_test, dtype=bool))
        training = training[shuffle.permutation(len(training))]
    n_val = _round(len(training) * val_fraction)
    n_rest = len(training) - n_val
    n_initial = n_rest - n_rest // 2 if streaming else n_rest
    val, initial, stream = np.split(training, np.cumsum([n_val, n_initial]))
    test, val, initial, stream = (everything.take(_by_user(everything, part)) for part in (held_out, val, initial,
                                                                                           stream))

    stream_round = arrival_rounds_by_group(client_of_user[stream.user], rounds, seed)
    by_round = np.lexsort((stream.item, stream.user, stream_round))
    return RatingData(
        name=name,
        num_users=num_users,
        num_items=len(item_ids),
        num_clients=num_clients,
        client_of_user=client_of_user,
        test=test,
        val=val,
        initial=initial,
        stream=stream.take(by_round),
        stream_round=stream_round[by_round],
        rounds=rounds,
        normalize=normalize,
        rating_range=rating_range,
        user_ids=user_ids,
        item_ids=item_ids,
        duplicates_dropped=duplicates_dropped,
    )


def group_users(num_users: int, num_clients: int, seed: int) -> np.ndarray:
    """Client id of each user: the identity if ``num_clients == num_users``, else users in a random order
    dealt round-robin into ``num_clients`` clients (every client gets ``floor`` or ``ceil`` of U / C users)."""
    num_users = check_int("num_users", num_users)
    num_clients = check_int("num_clients", num_clients)
    if num_clients > num_users:
        raise ConfigError(f"num_clients must lie in [1, {num_users}] (the users), got {num_clients}")
    if num_clients == num_users:
        return np.arange(num_users, dtype=np.int64)
    client_of_user = np.empty(num_users, dtype=np.int64)
    client_of_user[numpy_generator(seed, "ratings-clients").permutation(num_users)] = (
        np.arange(num_users) % num_clients
    )
    return client_of_user


def arrival_rounds(n: int, rounds: int) -> np.ndarray:
    """Rounds at which one client's ``n`` streamed ratings arrive, in arrival order (module docstring):
    ``floor(n/T)`` per round plus one in the first ``n mod T`` rounds if ``n >= T``, else one every
    ``floor(T/n)`` rounds from round 0."""
    n = check_int("n", n, minimum=0)
    rounds = check_int("rounds", rounds, minimum=1)
    return _arrival(np.arange(n, dtype=np.int64), np.full(n, n, dtype=np.int64), rounds)


def arrival_rounds_by_group(group: np.ndarray, rounds: int, seed: int) -> np.ndarray:
    """Arrival round of each streamed rating, the rule applied per ``group`` (client) with each group's
    ratings taken in a seeded random order."""
    group = np.asarray(group, dtype=np.int64)
    key = numpy_generator(seed, "ratings-stream").random(len(group))
    order = np.lexsort((key, group))
    sorted_group = group[order]
    starts = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]]) if len(group) else np.zeros(0, int)
    sizes = np.diff(np.r_[starts, len(group)])
    position = np.arange(len(group)) - np.repeat(starts, sizes)
    result = np.empty(len(group), dtype=np.int64)
    result[order] = _arrival(position, np.repeat(sizes, sizes), rounds)
    return result


def _arrival(position: np.ndarray, count: np.ndarray, rounds: int) -> np.ndarray:
    """Vectorised streaming rule: round of the ``position``-th of ``count`` ratings of a client."""
    per = count // rounds  # >= 1 where count >= rounds
    extra = count % rounds
    head = extra * (per + 1)  # ratings delivered in the first ``extra`` rounds
    many = np.where(
        position < head,
        position // np.maximum(per + 1, 1),
        extra + (position - head) // np.maximum(per, 1),
    )
    few = position * (rounds // np.maximum(count, 1))
    return np.where(count >= rounds, many, few).astype(np.int64)


def _by_user(ratings: Ratings, index: np.ndarray) -> np.ndarray:
    """``index`` reordered by (user, item)."""
    return index[np.lexsort((ratings.item[index], ratings.user[index]))]


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def _check_name(name: object, names: tuple[str, ...] = TEXT_DATASETS) -> str:
    return check_choice("name", name, names)


def _check_normalize(normalize: object) -> str:
    return check_choice("normalize", normalize, NORMALIZATIONS)
