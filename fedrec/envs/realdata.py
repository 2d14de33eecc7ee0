"""Real-data bandit streams of the Async-LinUCB paper (App. H; preprocessing after Cesa-Bianchi et al. 2013).

Each client is a user. At every step a user is drawn uniformly among the users with remaining events, and the
user's next logged positive event is replayed. The arm pool is that positive item plus K − 1 random items the
user never interacted with; the reward is 1 for the positive arm and 0 otherwise, with no noise (App. H.1 and the
authors' code). Item features are TF-IDF vectors reduced by TruncatedSVD to ``dim`` and scaled to unit ℓ2 norm,
so ‖x‖ ≤ 1 as LinUCB's analysis assumes.
"""
from __future__ import annotations

import re
from abc import abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfTransformer, TfidfVectorizer
from threadpoolctl import threadpool_limits

from fedrec.data.download import dataset_file
from fedrec.data.movielens import ML_GENRES, read_ml100k_movies
from fedrec.data.ratings import read_raw_ratings
from fedrec.envs.base import BanditEnv, Chunk
from fedrec.errors import ConfigError, check_int
from fedrec.utils.seeding import numpy_generator
from fedrec.utils.tables import read_table

#: SVD rows shorter than this are numerical zeros: the item's TF-IDF vector is orthogonal to the kept
#: components (on LastFM the zeros are at most ~2e-9 and the smallest genuine norm is ~2e-5).
ZERO_FEATURE_NORM = 1e-6


@dataclass
class EventLog:
    """A dataset reduced to what the stream needs: unit-norm item features and each user's positive events."""

    features: np.ndarray  # (I, d) float64, unit rows: the items that can be arms
    item_ids: np.ndarray  # (I,) dataset id of each feature row, increasing
    users: np.ndarray  # (E,) dataset user id of each positive event
    items: np.ndarray  # (E,) feature row of each event's item
    times: np.ndarray  # (E,) float64 order key within a user; inf = unknown (such events go last, in random order)
    seen_users: np.ndarray  # (M,) with seen_items: further (user id, feature row) interactions, never negatives
    seen_items: np.ndarray  # (M,)


class LoggedEventsEnv(BanditEnv):
    """Replays logged positive events as a bandit stream; subclasses only load their dataset (:meth:`_load`).

    Args:
        data_dir: folder that holds the dataset's folder.
        replicates: independent streams (step order and arm pools differ; features are shared).
        seed: run seed; every random number derives from it (see :mod:`fedrec.utils.seeding`).
        dim, num_arms: d (SVD components) and K (arms per step).
        chunk_size: steps per generated chunk.
        max_users: keep only the first users by dataset id (quick tests); None keeps all.
    """

    name = "logged"
    binary_rewards = True

    def __init__(
        self,
        data_dir: str | Path,
        replicates: int = 1,
        seed: int = 0,
        dim: int = 25,
        num_arms: int = 25,
        chunk_size: int = 1000,
        max_users: int | None = None,
    ) -> None:
        dim = check_int("dim", dim)
        num_arms = check_int("num_arms", num_arms, minimum=2)
        max_users = None if max_users is None else check_int("max_users", max_users)
        log = self._load(Path(data_dir), dim, int(seed))
        if len(log.users) == 0:
            raise ConfigError(f"{self.name}: no positive event has an item with features")
        self.features = log.features
        self.item_ids = log.item_ids
        self.num_items = len(log.features)
        if num_arms > self.num_items:
            raise ConfigError(f"num_arms must be <= {self.num_items} (items with features), got {num_arms}")
        #: dataset id of each client
        self.user_ids = np.unique(log.users)[:max_users]
        kept = np.isin(log.users, self.user_ids)
        super().__init__(len(self.user_ids), dim, num_arms, replicates, seed, chunk_size)
        self._clients = np.searchsorted(self.user_ids, log.users[kept])
        self._items = log.items[kept]
        self._times = log.times[kept]
        self.horizon = len(self._items)
        seen_kept = np.isin(log.seen_users, self.user_ids)
        seen_clients = np.concatenate([self._clients, np.searchsorted(self.user_ids, log.seen_users[seen_kept])])
        seen_items = np.concatenate([self._items, log.seen_items[seen_kept]])
        # bit (c, i) is set iff client c interacted with item i: a packed membership table for rejection sampling
        self._seen = np.zeros((self.num_clients, (self.num_items + 7) // 8), dtype=np.uint8)
        np.bitwise_or.at(self._seen, (seen_clients, seen_items >> 3), (1 << (seen_items & 7)).astype(np.uint8))
        pairs = np.unique(seen_clients * self.num_items + seen_items)
        free = self.num_items - np.bincount(pairs // self.num_items, minlength=self.num_clients)
        if free.min() < num_arms - 1:
            user = self.user_ids[free.argmin()]
            raise ConfigError(
                f"num_arms must be <= {free.min() + 1}: user {user} leaves only {free.min()} negative items"
            )
        self._streams: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @abstractmethod
    def _load(self, data_dir: Path, dim: int, seed: int) -> EventLog:
        ...

    def stream(self, replicate: int) -> tuple[np.ndarray, np.ndarray]:
        """(client, item row) of every step of a replicate, each user's events in their documented order.

        Drawing a uniform user among those with remaining events at each step is the same law as merging
        independent rate-1 Poisson clocks, one per user with one tick per event (the next tick of the active
        users is uniform among them by memorylessness), which lets numpy build the whole order at once.
        """
        if not 0 <= replicate < self.replicates:
            raise ValueError(f"{self.name}: replicate must lie in [0, {self.replicates}), got {replicate}")
        if replicate not in self._streams:
            rng = numpy_generator(self.seed, f"{self.name}-order", replicate)
            by_user = np.lexsort((rng.random(self.horizon), self._times, self._clients))
            gaps = rng.exponential(size=self.horizon)
            clock = np.cumsum(gaps)
            users = self._clients[by_user]
            first = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
            clock -= np.repeat(clock[first] - gaps[first], np.diff(np.r_[first, self.horizon]))
            steps = by_user[np.argsort(clock, kind="stable")]
            self._streams[replicate] = (self._clients[steps], self._items[steps])
        return self._streams[replicate]

    def pool(self, replicate: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(clients (S,), arm item rows (S, K)) of chunk ``index``: the positive item at a random position
        plus K − 1 distinct items the user never interacted with (vectorised rejection sampling)."""
        clients, items = self.stream(replicate)
        start = index * self.chunk_size
        if not 0 <= start < self.horizon:
            raise ValueError(f"{self.name}: chunk {index} starts after the last step ({self.horizon} steps)")
        clients, positives = clients[start : start + self.chunk_size], items[start : start + self.chunk_size]
        rng = numpy_generator(self.seed, f"{self.name}-pool", replicate, index)
        S, K = len(clients), self.num_arms
        negatives = rng.integers(0, self.num_items, size=(S, K - 1))
        pending = np.arange(S)
        while len(pending):
            redraw = self._invalid_negatives(clients[pending], negatives[pending])
            again = redraw.any(axis=1)
            pending, redraw = pending[again], redraw[again]
            block = negatives[pending]
            block[redraw] = rng.integers(0, self.num_items, size=int(redraw.sum()))
            negatives[pending] = block
        arms = np.concatenate([negatives, positives[:, None]], axis=1)
        rows, slot = np.arange(S), rng.integers(0, K, size=S)
        arms[rows, K - 1] = arms[rows, slot]
        arms[rows, slot] = positives
        return clients, arms

    def _invalid_negatives(self, clients: np.ndarray, arms: np.ndarray) -> np.ndarray:
        """Mask of candidate arms that the user interacted with or that repeat an earlier arm of the row."""
        bad = ((self._seen[clients[:, None], arms >> 3] >> (arms & 7).astype(np.uint8)) & 1).astype(bool)
        order = np.argsort(arms, axis=1, kind="stable")
        ranked = np.take_along_axis(arms, order, axis=1)
        repeat = np.zeros_like(bad)
        np.put_along_axis(repeat, order[:, 1:], ranked[:, 1:] == ranked[:, :-1], axis=1)
        return bad | repeat

    def chunk(self, replicate: int, index: int) -> Chunk:
        """Steps of chunk ``index``: contexts are the arms' features, reward 1 for the positive arm, no noise."""
        clients, arms = self.pool(replicate, index)
        start = index * self.chunk_size
        positives = self.stream(replicate)[1][start : start + len(clients)]
        expected = (arms == positives[:, None]).astype(np.float64)
        return Chunk(clients.astype(np.int64), self.features[arms], expected, np.zeros(len(clients)))


class LastFMEnv(LoggedEventsEnv):
    """HetRec 2011 Last.fm 2K: a positive event is a (user, listened artist) pair of ``user_artists.dat``.

    Features: TF-IDF over each artist's bag of tags (all users' assignments in ``user_taggedartists.dat``),
    TruncatedSVD, unit norm. Untagged artists have no features, so their events are dropped. A user's events
    are ordered by the first day the user tagged the artist; events the user never tagged go last, in random
    order (ties are broken at random too). Artists the user tagged but never listened to are not negatives.

    Full dataset, dim = 25 (any seed): 12342 artists with features (12523 tagged, 181 of them with an all-zero
    SVD row); 86367 of the 92834 listening events kept, 20540 of them with a tag date; 1891 of the 1892 users.
    The paper reports N = 1892 and T = 96733.
    """

    name = "lastfm"
    dataset = "lastfm"

    def _load(self, data_dir: Path, dim: int, seed: int) -> EventLog:
        listened_path = dataset_file("lastfm", data_dir, "user_artists.dat")
        tagged_path = dataset_file("lastfm", data_dir, "user_taggedartists.dat")
        listened = read_table(listened_path, ["user", "artist", "weight"], sep="\t", header=True)
        tagged = read_table(tagged_path, ["user", "artist", "tag", "day", "month", "year"], sep="\t", header=True)

        artists, artist_row = np.unique(tagged["artist"].to_numpy(), return_inverse=True)
        tags, tag_col = np.unique(tagged["tag"].to_numpy(), return_inverse=True)
        counts = sp.csr_matrix((np.ones(len(tagged)), (artist_row, tag_col)), shape=(len(artists), len(tags)))
        features, has_features = _svd_features(TfidfTransformer().fit_transform(counts), dim, seed, self.name)
        item_ids = artists[has_features]

        tagged["date"] = tagged["year"] * 10000 + tagged["month"] * 100 + tagged["day"]
        first_tag = tagged.groupby(["user", "artist"], as_index=False)["date"].min()
        events = listened.merge(first_tag, on=["user", "artist"], how="left")
        rows = _rows(item_ids, events["artist"].to_numpy())
        kept = rows >= 0
        tag_rows = _rows(item_ids, first_tag["artist"].to_numpy())
        return EventLog(
            features=features,
            item_ids=item_ids,
            users=events["user"].to_numpy()[kept],
            items=rows[kept],
            times=events["date"].fillna(np.inf).to_numpy(np.float64)[kept],
            seen_users=first_tag["user"].to_numpy()[tag_rows >= 0],
            seen_items=tag_rows[tag_rows >= 0],
        )


class MovieLensEnv(LoggedEventsEnv):
    """MovieLens 100K: any rating in ``u.data`` is a positive event; a user's events are in timestamp order
    (ties broken at random).

    Departs from the paper, which used MovieLens-20M users with > 3000 ratings (N = 54, T = 214729) and
    tag-genome features: ML-20M is not available here and ML-100K has no tags, so the features are TF-IDF over
    each movie's genre tokens and title words (English stop words and the trailing "(year)" removed).

    Full dataset, dim = 25: 943 users, 100000 events, 1682 movies with features.
    """

    name = "movielens"
    dataset = "ml-100k"

    def _load(self, data_dir: Path, dim: int, seed: int) -> EventLog:
        ratings = read_raw_ratings("ml-100k", data_dir)
        movies = read_ml100k_movies(data_dir)
        flags = movies[list(ML_GENRES)].to_numpy() > 0
        genre_tokens = np.array([f"genre_{g}" for g in ML_GENRES])
        docs = [
            " ".join([re.sub(r"\(\d{4}\)\s*$", "", title), *genre_tokens[row]])
            for title, row in zip(movies["title"], flags)
        ]
        tfidf = TfidfVectorizer(stop_words="english").fit_transform(docs)
        features, has_features = _svd_features(tfidf, dim, seed, self.name)
        item_ids = movies["item"].to_numpy()[has_features]

        rows = _rows(item_ids, ratings["item"].to_numpy())
        kept = rows >= 0
        return EventLog(
            features=features,
            item_ids=item_ids,
            users=ratings["user"].to_numpy()[kept],
            items=rows[kept],
            times=ratings["timestamp"].to_numpy(np.float64)[kept],
            seen_users=np.zeros(0, dtype=np.int64),
            seen_items=np.zeros(0, dtype=np.int64),
        )


def _svd_features(tfidf: sp.spmatrix, dim: int, seed: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    """TruncatedSVD of the TF-IDF rows to ``dim`` unit-norm features; returns them and the mask of rows kept
    (rows that project to zero have no usable direction)."""
    if dim > min(tfidf.shape):
        raise ConfigError(f"dim must be <= {min(tfidf.shape)} (min of items and vocabulary of {name}), got {dim}")
    state = int(numpy_generator(seed, f"{name}-svd").integers(2**31 - 1))
    # one BLAS thread: these skinny products gain nothing from threads, which slow them ~5x on a busy machine
    with threadpool_limits(limits=1):
        z = TruncatedSVD(n_components=dim, random_state=state).fit_transform(tfidf)
    norms = np.linalg.norm(z, axis=1)
    keep = norms > ZERO_FEATURE_NORM
    return z[keep] / norms[keep, None], keep


def _rows(item_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Feature row of each dataset id in ``ids`` (``item_ids`` is increasing); -1 where the item has none."""
    found = np.searchsorted(item_ids, ids).clip(max=len(item_ids) - 1)
    return np.where(item_ids[found] == ids, found, -1)
