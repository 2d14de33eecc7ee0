"""Logged data evaluated by replay (Li et al. 2010), the offline evaluator of Cao et al.'s real-data runs.

Every logged event (user, item, click) offers K candidate arms: the logged item and K − 1 other items drawn
uniformly, in random order. A policy's step counts, and updates it, only when it picks the logged item
(:attr:`BanditEnv.replay`); CTR = clicks / counted steps. Since the logged arm sits at a uniformly random
position, a uniformly random policy's replay CTR converges to the events' mean click rate, which is the
normaliser of the relative CTR (Cao et al. take the mean of 5 random policies; the closed form is its limit
and has no sampling noise).

Contexts join a user's features u (the parties' blocks; Cao et al. App. D.3) with the item's features g:
``outer_sum`` (the paper's, X[p, q] = u_p + g_q, flattened row by row) or ``outer_product`` (u_p · g_q). Row 0
of the user side is the platform's own: u_0 = 0 (sum) or 1 (product) makes X[0, ·] = g, the item block that the
active party holds; each further user-feature group is one passive party's block of rows.
"""
from __future__ import annotations

import hashlib
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedrec.data.movielens import ML_GENRES, read_ml100k_movies, read_ml100k_users
from fedrec.data.ratings import read_raw_ratings
from fedrec.envs.base import BanditEnv, Chunk
from fedrec.errors import ConfigError, check_choice, check_int
from fedrec.utils.seeding import numpy_generator

COMBINE = ("outer_sum", "outer_product")


def md5_bucket(text: str, buckets: int) -> int:
    """Feature hashing of a categorical value: the MD5 of its UTF-8 text, a big-endian integer, modulo ``buckets``
    (the bucket category_encoders' HashingEncoder gives it)."""
    return int.from_bytes(hashlib.md5(text.encode()).digest(), "big") % buckets


@dataclass
class ReplayLog:
    """A log reduced to what replay needs; rows of ``user_features`` and ``item_features`` are indexed by the
    events' ``users`` and ``items``."""

    user_features: np.ndarray  # (U, d_u) float64
    item_features: np.ndarray  # (I, d_i) float64
    groups: list[int]  # sizes of the user-feature groups, one per passive party, summing to d_u
    users: np.ndarray  # (E,) user row of each event, in log order
    items: np.ndarray  # (E,) item row of each event
    clicks: np.ndarray  # (E,) 0/1 reward of the logged item


class ReplayEnv(BanditEnv):
    """A logged stream for replay; subclasses load their dataset (:meth:`_load`).

    Args:
        data_dir: folder that holds the dataset's folder.
        replicates, seed: independent candidate draws (the event order is the log's and is shared).
        num_arms: K candidates per event, the logged item among them.
        combine: ``outer_sum`` | ``outer_product`` (see the module docstring).
        chunk_size: steps per generated chunk.
        max_events: replay only the first events of the log (quick tests); None replays all.
    """

    name = "replay"
    binary_rewards = True
    replay = True

    def __init__(
        self, data_dir: str | Path, replicates: int = 1, seed: int = 0, num_arms: int = 10,
        combine: str = "outer_sum", chunk_size: int = 1000, max_events: int | None = None,
    ) -> None:
        check_choice("combine", combine, COMBINE)
        log = self._load(Path(data_dir))
        num_arms = check_int("num_arms", num_arms, minimum=2)
        if num_arms > len(log.item_features):
            raise ConfigError(f"num_arms must be <= {len(log.item_features)} (items in the log), got {num_arms}")
        events = len(log.users) if max_events is None else min(check_int("max_events", max_events), len(log.users))
        self.combine = combine
        used, users = np.unique(log.users[:events], return_inverse=True)  # clients: the replayed events' users
        lead = np.full((len(used), 1), 0.0 if combine == "outer_sum" else 1.0)
        self.user_features = np.hstack([lead, log.user_features[used]])
        self.item_features = log.item_features
        d_u, d_i = self.user_features.shape[1], self.item_features.shape[1]
        #: the parties' column blocks: the AP's item block, then one block per user-feature group
        self.partition = [d_i] + [g * d_i for g in log.groups]
        super().__init__(len(log.user_features), d_u * d_i, num_arms, replicates, seed, chunk_size)
        self.horizon = events
        self._users, self._items, self._clicks = users, log.items[:events], log.clicks[:events]
        self.num_items = len(self.item_features)

    @abstractmethod
    def _load(self, data_dir: Path) -> ReplayLog:
        ...

    @property
    def click_rate(self) -> float:
        """Mean click of the replayed events: the replay CTR a uniformly random policy converges to."""
        return float(self._clicks.mean())

    def contexts(self, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """x = vec(u ∘ g) for users (S,) and candidate items (S, K): (S, K, d_u · d_i), row-major in u."""
        u = self.user_features[users][:, None, :, None]
        g = self.item_features[items][:, :, None, :]
        x = u + g if self.combine == "outer_sum" else u * g
        return x.reshape(*items.shape, -1)

    def candidates(self, replicate: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Candidate items (S, K) of a chunk's events and the logged item's position (S,) in each row."""
        lo = index * self.chunk_size
        logged_items = self._items[lo:lo + self.chunk_size]
        S, K, n = len(logged_items), self.num_arms, self.num_items
        rng = numpy_generator(self.seed, "replay.candidates", replicate, index)
        # K − 1 distinct others: distinct draws from n − 1 values, shifted past the logged item
        others = np.argsort(rng.random((S, n - 1)), axis=1)[:, :K - 1] if K - 1 > (n - 1) // 8 else \
            _distinct(rng, S, n - 1, K - 1)
        others += others >= logged_items[:, None]
        position = rng.integers(K, size=S)
        items = np.empty((S, K), dtype=np.int64)
        mask = np.arange(K)[None, :] == position[:, None]
        items[mask] = logged_items
        items[~mask] = others.ravel()
        return items, position

    def chunk(self, replicate: int, index: int) -> Chunk:
        items, position = self.candidates(replicate, index)
        lo = index * self.chunk_size
        users = self._users[lo:lo + len(items)]
        rewards = np.zeros(items.shape)
        rewards[np.arange(len(items)), position] = self._clicks[lo:lo + len(items)]
        return Chunk(users, self.contexts(users, items), rewards, np.zeros(len(items)), position)


def _distinct(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """``k`` distinct integers in [0, n) per row, by rejection of rows with repeats (k ≪ n)."""
    out = rng.integers(n, size=(rows, k))
    while True:
        s = np.sort(out, axis=1)
        bad = (s[:, 1:] == s[:, :-1]).any(axis=1)
        if not bad.any():
            return out
        out[bad] = rng.integers(n, size=(int(bad.sum()), k))


class MovieLensReplayEnv(ReplayEnv):
    """MovieLens-100K replayed in timestamp order; a rating ≥ ``click_threshold`` is a click.

    Items are the 1682 movies with their 19 genre flags (g). Users carry two passive parties' blocks: a profile
    holder's (age min–max scaled over users, gender F = 1) and an occupation holder's (the 21 occupations hashed
    into 3 one-hot buckets by MD5, as Cao et al. hash Criteo's categorical columns into 3 values). With the
    platform's item block the parties' blocks are [19, 38, 57], d = 114.
    """

    name = "movielens_replay"
    dataset = "ml-100k"
    OCCUPATION_BUCKETS = 3

    def __init__(self, *args: object, click_threshold: int = 4, **kwargs: object) -> None:
        self.click_threshold = check_int("click_threshold", click_threshold)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _load(self, data_dir: Path) -> ReplayLog:
        ratings = read_raw_ratings("ml-100k", data_dir)
        users, movies = read_ml100k_users(data_dir), read_ml100k_movies(data_dir)
        user_ids, item_ids = users["user"].to_numpy(), movies["item"].to_numpy()
        root = data_dir / "ml-100k"
        for field, ids, known, path in (("user", ratings["user"].to_numpy(), user_ids, "u.user"),
                                        ("item", ratings["item"].to_numpy(), item_ids, "u.item")):
            unknown = np.setdiff1d(ids, known)
            if len(unknown):
                raise ConfigError(f"{ratings.attrs['path']}: {field} id {unknown[0]} is not in {root / path}")
        age = users["age"].to_numpy(np.float64)
        age = (age - age.min()) / max(age.max() - age.min(), 1.0)
        gender = (users["gender"].to_numpy() == "F").astype(np.float64)
        buckets = np.array([md5_bucket(o, self.OCCUPATION_BUCKETS) for o in users["occupation"]])
        occupation = np.eye(self.OCCUPATION_BUCKETS)[buckets]
        order = np.argsort(ratings["timestamp"].to_numpy(), kind="stable")
        low, high = ratings["rating"].min(), ratings["rating"].max()
        if not low < self.click_threshold <= high:  # else every event, or none, would be a click
            raise ConfigError(f"click_threshold: must lie in ({low:g}, {high:g}], the ratings of "
                              f"{ratings.attrs['path']} being {low:g}..{high:g} (at or below {low:g} every rating is "
                              f"a click, above {high:g} none), got {self.click_threshold}")
        return ReplayLog(
            user_features=np.column_stack([age, gender, occupation]),
            item_features=(movies[list(ML_GENRES)].to_numpy() > 0).astype(np.float64),
            groups=[2, self.OCCUPATION_BUCKETS],
            users=np.searchsorted(user_ids, ratings["user"].to_numpy()[order]),
            items=np.searchsorted(item_ids, ratings["item"].to_numpy()[order]),
            clicks=(ratings["rating"].to_numpy()[order] >= self.click_threshold).astype(np.float64),
        )
