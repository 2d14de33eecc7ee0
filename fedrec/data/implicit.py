"""Implicit-feedback datasets for top-K recommendation: which interactions count as positives,
how each user's positives are held out for validation and test, and the negatives BPR trains against.

Datasets are those of :mod:`fedrec.data.ratings` (``ml-100k``, ``ml-1m``, ``filmtrust``), read by its one reader
(:func:`~fedrec.data.ratings.read_ratings`: same validation, same last-line-wins rule for repeated pairs, same
user and item indices). Every user and item of the file keeps its index, also those with no positive: an item
never rated high enough is still in the catalogue a ranking runs over.

Positives:

* ``threshold=None``: every interaction is a positive (the NCF and LightGCN convention);
* ``threshold=t``: the ratings ``r >= t`` on the file's raw scale (``4`` on MovieLens keeps 4 and 5 stars). A
  threshold no rating reaches, or one every rating passes, is refused (ConfigError naming ``threshold``).

Splits of each user's positives into training, validation and test:

* ``"leave_one_out"``: the user's latest positive (largest timestamp) is the test item and, with ``val``, the one
  before it the validation item. Equal timestamps (a user rating several films within one second is common in
  MovieLens) are ordered by item index, the larger index counting as later. This rule involves no random numbers,
  so the held-out items are a property of the dataset and stay the same across seeds, as in the leave-one-out
  literature. FilmTrust's file has no timestamps, so leave-one-out is refused there (ConfigError naming
  ``split``): its file order is not documented as chronological, and a split that pretends otherwise would not
  be leave-one-out.
* ``"random"``: a uniformly random ``test_fraction`` of the user's positives is the test set and, with ``val``,
  a random ``val_fraction`` of them the validation set: ``max(1, round(n · fraction))`` items each, capped so
  that at least one positive stays in training. The order comes from the user's own keyed stream
  (:func:`fedrec.utils.rng.keyed_group_shuffle` under ``stream_key(seed, "implicit.split")``).

A user needs 3 positives (2 without ``val``) to be split: one for each held-out part and one to train on. Users
with fewer keep all their positives for training and are not evaluated; :meth:`ImplicitData.summary` counts them.

Clients: one per user by default on every dataset (the per-user clients of federated implicit-feedback work);
``num_clients`` groups users at random as :func:`~fedrec.data.ratings.group_users` does for the rating task.

Negatives (:func:`sample_negatives`): for BPR, each training positive (u, i) of a participating client gets
``n_per_positive`` items j drawn uniformly, with replacement, from the items u has no training positive of. The
user's validation and test items are not excluded: they are hidden from training, so a client cannot avoid them
(this is also how NCF and LightGCN sample). Draw ``k`` of the ``p``-th training positive of user u in round t is
uniform ``p · n_per_positive + k`` of u's stream under ``stream_key(seed, "implicit.negatives", t)``
(:class:`fedrec.utils.rng.KeyedRows`), mapped to the ``⌊u · free⌋``-th item u has no training positive of. A client's
negatives are therefore its users' draws alone: the same in a resumed run, whichever other clients take part in
the round, and whichever way users are grouped into clients (one client holding every user draws what the
per-user clients draw, so a central run and a federated one train on the same triples).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedrec.data.ratings import TEXT_DATASETS, group_users, read_ratings
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.utils.rng import KeyedRows, keyed_group_shuffle, stream_key

#: Split rules accepted by :func:`load_implicit`.
SPLITS = ("leave_one_out", "random")


@dataclass(frozen=True, eq=False)
class ItemSets:
    """One item set per user as CSR: user u's items are ``indices[indptr[u]:indptr[u + 1]]``, ascending."""

    indptr: np.ndarray  # (num_users + 1,) int64
    indices: np.ndarray  # (nnz,) int64

    @staticmethod
    def from_pairs(user: np.ndarray, item: np.ndarray, num_users: int) -> ItemSets:
        """The sets of the (user, item) pairs (each pair at most once)."""
        order = np.lexsort((item, user))
        indptr = np.zeros(num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(user, minlength=num_users), out=indptr[1:])
        return ItemSets(indptr, np.asarray(item, dtype=np.int64)[order])

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def num_users(self) -> int:
        return len(self.indptr) - 1

    def row(self, user: int) -> np.ndarray:
        """User ``user``'s items, ascending."""
        return self.indices[self.indptr[user]:self.indptr[user + 1]]

    def counts(self) -> np.ndarray:
        """``(num_users,)``: the size of each user's set."""
        return np.diff(self.indptr)

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """``(user, item)`` arrays of every member, sorted by (user, item)."""
        return np.repeat(np.arange(self.num_users), self.counts()), self.indices


@dataclass(eq=False)
class ImplicitData:
    """An implicit-feedback dataset split per user (module docstring): ``train``, ``val`` and ``test`` partition
    each user's positives."""

    name: str
    num_users: int
    num_items: int
    num_clients: int
    client_of_user: np.ndarray  # (num_users,) int64 client id of each user
    train: ItemSets
    val: ItemSets  # empty without validation
    test: ItemSets
    threshold: float | None  # positives are ratings >= threshold; None: every interaction
    split: str  # one of SPLITS
    rating_range: tuple[float, float]  # (min, max) raw rating in the file
    user_ids: np.ndarray = field(repr=False)  # (num_users,) dataset id of each user index
    item_ids: np.ndarray = field(repr=False)  # (num_items,) dataset id of each item index
    duplicates_dropped: int = 0  # repeated (user, item) lines in the file (the last one is kept)

    @property
    def positives(self) -> str:
        """The positive rule in words, e.g. ``"rating >= 4"``."""
        return "every interaction" if self.threshold is None else f"rating >= {self.threshold:g}"

    @property
    def num_positives(self) -> int:
        return len(self.train) + len(self.val) + len(self.test)

    def evaluated_users(self) -> np.ndarray:
        """Indices of the users with a test item, ascending (the others train only)."""
        return np.flatnonzero(self.test.counts() > 0)

    def summary(self) -> dict[str, object]:
        """Counts for logs and READMEs."""
        positives = self.train.counts() + self.val.counts() + self.test.counts()
        evaluated = self.test.counts() > 0
        return {
            "dataset": self.name,
            "users": self.num_users,
            "items": self.num_items,
            "clients": self.num_clients,
            "positives": self.num_positives,
            "positive_rule": self.positives,
            "split": self.split,
            "train": len(self.train),
            "val": len(self.val),
            "test": len(self.test),
            "users_evaluated": int(evaluated.sum()),
            "users_training_only": int(((positives > 0) & ~evaluated).sum()),
            "users_without_positives": int((positives == 0).sum()),
            "rating_range": list(self.rating_range),
            "duplicates_dropped": self.duplicates_dropped,
        }


@dataclass(frozen=True, eq=False)
class Triples:
    """BPR's training triples: training positive (``user[r]``, ``positive[r]``) against each of ``negative[r]``."""

    user: np.ndarray  # (P,) int64
    positive: np.ndarray  # (P,) int64
    negative: np.ndarray  # (P, n_per_positive) int64

    def __len__(self) -> int:
        return len(self.user)


def load_implicit(
    name: str,
    data_dir: str | Path,
    seed: int = 0,
    *,
    threshold: float | None = None,
    split: str = "leave_one_out",
    test_fraction: float = 0.2,
    val_fraction: float = 0.1,
    val: bool = True,
    num_clients: int | None = None,
) -> ImplicitData:
    """Load dataset ``name`` from ``data_dir`` as implicit feedback, split per user (rules: module docstring).

    Args:
        name: one of :data:`~fedrec.data.ratings.TEXT_DATASETS`.
        data_dir: folder that holds the dataset folders.
        seed: fixes the random split and the grouping of users into clients (leave-one-out uses no randomness).
        threshold: positives are the ratings ``>= threshold`` (raw scale); None: every interaction.
        split: ``"leave_one_out"`` or ``"random"``.
        test_fraction, val_fraction: shares of each user's positives held out by the random split (ignored by
            leave-one-out, which holds out one item each).
        val: hold out validation items (else only test items).
        num_clients: clients; None = one per user.
    """
    check_choice("name", name, TEXT_DATASETS)
    check_choice("split", split, SPLITS)
    if not isinstance(val, bool):
        raise ConfigError(f"val must be true or false, got {val!r}")
    seed = check_int("seed", seed, minimum=0)
    test_fraction = check_float("test_fraction", test_fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    val_fraction = check_float("val_fraction", val_fraction, low=0.0, high=1.0, low_open=True, high_open=True)
    if split == "random" and val and test_fraction + val_fraction >= 1:
        raise ConfigError(
            f"test_fraction + val_fraction must be below 1 (some positives must train), got "
            f"{test_fraction} + {val_fraction}"
        )
    frame = read_ratings(name, data_dir, timestamps=True)
    if split == "leave_one_out" and "timestamp" not in frame:
        raise ConfigError(
            f"split='leave_one_out' orders each user's interactions by time, but {name}'s file has no "
            f"timestamps; use split='random'"
        )
    user_ids = np.unique(frame["user_id"].to_numpy())
    item_ids = np.unique(frame["item_id"].to_numpy())
    num_users = len(user_ids)
    rating_range, duplicates = frame.attrs["rating_range"], int(frame.attrs["duplicates_dropped"])
    if threshold is not None:
        threshold = _check_threshold(threshold, rating_range, name)
        frame = frame[frame["raw_rating"].to_numpy() >= threshold]
    if num_clients is None:
        num_clients = num_users
    num_clients = check_int("num_clients", num_clients)
    if num_clients > num_users:
        raise ConfigError(f"num_clients must lie in [1, {num_users}] (the users of {name}), got {num_clients}")

    user, item = frame["user"].to_numpy(), frame["item"].to_numpy()
    if split == "leave_one_out":  # latest last: by timestamp, then by item index
        order = np.lexsort((item, frame["timestamp"].to_numpy(), user))
    else:  # a uniformly random order per user from its keyed stream
        order = np.lexsort((item, user))
        indptr = np.zeros(num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(user, minlength=num_users), out=indptr[1:])
        keyed_group_shuffle(stream_key(seed, "implicit.split"), np.arange(num_users, dtype=np.int64), indptr, order)
    user, item = user[order], item[order]
    n = np.bincount(user, minlength=num_users)
    position = np.arange(len(user)) - np.repeat(np.cumsum(n) - n, n)  # within the user's ordered positives
    n_test, n_val = _held_out_counts(n, split, test_fraction, val_fraction if val else None)
    if split == "leave_one_out":  # count from the end: the latest is the test item, the one before it validation
        position = np.repeat(n, n) - 1 - position
    part = np.where(position < np.repeat(n_test, n), 2, np.where(position < np.repeat(n_test + n_val, n), 1, 0))
    train, val_set, test = (ItemSets.from_pairs(user[part == p], item[part == p], num_users) for p in range(3))
    return ImplicitData(
        name=name,
        num_users=num_users,
        num_items=len(item_ids),
        num_clients=num_clients,
        client_of_user=group_users(num_users, num_clients, seed),
        train=train,
        val=val_set,
        test=test,
        threshold=threshold,
        split=split,
        rating_range=rating_range,
        user_ids=user_ids,
        item_ids=item_ids,
        duplicates_dropped=duplicates,
    )


def _check_threshold(threshold: object, rating_range: tuple[float, float], name: str) -> float:
    """``threshold`` as a float some but not all of ``name``'s ratings (range ``rating_range``) reach."""
    threshold = check_float("threshold", threshold)
    lo, hi = rating_range
    if threshold > hi:
        raise ConfigError(
            f"threshold must be at most {hi:g}, the largest rating of {name} (no rating would be positive), "
            f"got {threshold:g}"
        )
    if threshold <= lo:
        raise ConfigError(
            f"threshold must exceed {lo:g}, the smallest rating of {name} (every rating would be positive: "
            f"use threshold=None for that), got {threshold:g}"
        )
    return threshold


def _held_out_counts(n: np.ndarray, split: str, test_fraction: float,
                     val_fraction: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``(n_test, n_val)`` per user of ``n`` positives (module docstring): 0 for users with too few to split."""
    with_val = val_fraction is not None
    enough = n >= (3 if with_val else 2)
    if split == "leave_one_out":
        n_test = enough.astype(np.int64)
    else:
        wanted = np.maximum(1, np.floor(n * test_fraction + 0.5)).astype(np.int64)
        n_test = np.where(enough, np.minimum(wanted, n - 1 - with_val), 0)
    if not with_val:
        return n_test, np.zeros_like(n_test)
    if split == "leave_one_out":
        return n_test, n_test.copy()
    wanted = np.maximum(1, np.floor(n * val_fraction + 0.5)).astype(np.int64)
    return n_test, np.where(enough, np.minimum(wanted, n - 1 - n_test), 0)


def sample_negatives(data: ImplicitData, clients: np.ndarray | list[int], round: int, seed: int,
                     n_per_positive: int = 1) -> Triples:
    """BPR's triples for the users of ``clients`` (global client ids, distinct) in round ``round`` of a run seeded
    ``seed``: every training positive (u, i) of those users, sorted by (u, i), with ``n_per_positive`` negatives j
    drawn uniformly with replacement from the items u has no training positive of (the module docstring gives
    the stream each draw comes from). A user with every item among its training positives is a ConfigError."""
    clients = _check_clients(clients, data.num_clients)
    round = check_int("round", round, minimum=0)
    seed = check_int("seed", seed, minimum=0)
    n_per_positive = check_int("n_per_positive", n_per_positive)
    train, num_items = data.train, data.num_items
    users = np.flatnonzero(np.isin(data.client_of_user, clients))
    count = train.counts()[users]
    full = users[count >= num_items]
    if len(full):
        raise ConfigError(f"user {int(full[0])} has every item among its training positives: no negative to sample")
    user = np.repeat(users, count)
    rank = np.arange(len(user)) - np.repeat(np.cumsum(count) - count, count)  # the positive's place in its row
    entry = train.indptr[user] + rank
    free = np.repeat(num_items - count, count)
    key = stream_key(seed, "implicit.negatives", round)
    u = KeyedRows(key, user, rank * n_per_positive).draw("uniform", n_per_positive)
    r = np.minimum((u * free[:, None]).astype(np.int64), free[:, None] - 1)  # the r-th item outside the row
    # The r-th free item is r + k, k the row's positives p_t with p_t - t <= r (free items below p_t, t its place):
    # one sorted search over every row at once, each row's keys offset by user · (num_items + 1).
    all_user, all_item = train.pairs()
    offset = np.int64(num_items + 1)
    shifted = all_item - (np.arange(len(all_item)) - train.indptr[all_user]) + all_user * offset
    k = np.searchsorted(shifted, user[:, None] * offset + r, side="right") - train.indptr[user][:, None]
    return Triples(user=user, positive=train.indices[entry], negative=r + k)


def _check_clients(clients: object, num_clients: int) -> np.ndarray:
    """``clients`` as distinct int64 client ids in ``[0, num_clients)``, or a ConfigError naming ``clients``."""
    array = np.asarray(clients)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ConfigError(f"clients must be a 1-D list of integer client ids, got {clients!r}")
    array = array.astype(np.int64)
    if array.size and (array.min() < 0 or array.max() >= num_clients):
        raise ConfigError(f"clients must be client ids in [0, {num_clients}), got {clients!r}")
    if len(np.unique(array)) != len(array):
        raise ConfigError(f"clients must be distinct, got {clients!r}")
    return array
