"""Clustered linear bandits of FCLUB (Liu et al., UAI 2022, §5 and App. E, and the authors' code).

n users sit on L local servers in contiguous blocks of n/L and belong to m true clusters in contiguous blocks of n/m
(as in the authors' code); the users of a cluster share one θ. Every step one user arrives uniformly at random, K
fresh items x = [z/‖z‖/√2, 1/√2] with z ~ N(0, I_{d−1}) are drawn (‖x‖ = 1, the authors' code), and every arm gets a
reward y ~ Bernoulli(θ_iᵀx); the regret uses the expected rewards θ_iᵀx. The arrivals, the items and the uniforms
behind the Bernoulli draws come from three generators keyed by (seed, replicate, chunk) only, so every method of a
seed sees the same stream (common random numbers), whatever θ it is run on.

θ sources (``theta=``):

- ``authors``: the authors' ``fclub-authors/10_theta.npy``, 40 users with 4 distinct unit-norm θ in
  blocks of 10, last coordinate 1/√2, pairwise gaps 0.81–1.14. The paper's "orthogonal θ, gap √2" is not what
  the authors ran: with these items orthogonal θ give negative means for about half the items.
- ``ortho_cap``: θ_j = [q_j/√2, 1/√2] with q_1..q_m orthonormal in R^{d−1} (our choice): unit norm, gap
  exactly 1, means in [0, 1]. Needs m ≤ d − 1.
- ``file``: a user-vector ``.npy`` (e.g. the authors' ``ml_1000user_d10.npy`` or ``yelp_1000user_d10.npy``).
- ``ml100k``: user vectors derived here from MovieLens-100K as the authors derived theirs from MovieLens-1M (paper §5):
  binary user×item "rated" matrix; keep the 3N most active users, then the M most rated items among them, then
  the N most active users on those items; SVD; first d − 1 left singular vectors; rows to unit ℓ2 norm; append 1;
  divide by √2. The authors used N = M = 1000 of ML-1M's 6040 users and 3706 items; scaled to ML-100K's 943 users
  and 1682 items this gives N = 156 (3N = 468) and M = 454, the defaults.

For ``file`` and ``ml100k`` the m clusters come from k-means (scikit-learn, seeded) over all the user vectors,
and θ_i is the centre of user i's cluster, so the truth has exactly m distinct θ. The n users are n/m users drawn
at random from each k-means cluster, placed cluster after cluster so the contiguous layout holds. A balanced pick
is needed because the source's own order is not balanced: the first 40 rows of ``ml_1000user_d10.npy`` hold 6
distinct θ with sizes 31/3/2/2/1/1. The θ, the k-means fit and the user pick depend on the seed only, so
replicates share one world and differ in their streams.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from fedrec.data.integrity import checked_file
from fedrec.data.ratings import read_raw_ratings
from fedrec.envs.base import BanditEnv, Chunk
from fedrec.errors import ConfigError, check_choice, check_int
from fedrec.utils.seeding import numpy_generator

THETA_SOURCES = ("authors", "ortho_cap", "file", "ml100k")

#: the folder of data_dir that holds the authors' files (copied from their repository)
AUTHORS_FOLDER = "fclub-authors/"
#: the authors' synthetic θ file, relative to data_dir
AUTHORS_THETA = f"{AUTHORS_FOLDER}10_theta.npy"

#: slack on the [0, 1] mean-reward check: the authors' θ reach 0 and 1 exactly, up to rounding (≈ 6e-17)
MEAN_TOLERANCE = 1e-9


class ClusteredLinearEnv(BanditEnv):
    """FCLUB's clustered users, per-server layout and Bernoulli rewards on unit items (paper §5, authors' code).

    Args:
        num_clients, num_clusters, num_servers: n users, m true clusters, L local servers; m and L must divide n.
        dim, num_arms: d and K.
        theta: the θ source, one of :data:`THETA_SOURCES` (see the module docstring).
        theta_file: the ``.npy`` of ``theta=authors`` (default :data:`AUTHORS_THETA`) or ``theta=file``
            (required), relative to ``data_dir``.
        data_dir: the folder that holds the datasets (every source but ``ortho_cap`` reads from it).
        ml100k_users, ml100k_items: N and M of the ``ml100k`` derivation.
    """

    name = "clustered"
    # no ``dataset``: theta=ml100k reads ml-100k, theta=authors|file the authors' files (not downloadable)

    def __init__(
        self,
        num_clients: int = 40,
        num_clusters: int = 4,
        num_servers: int = 5,
        dim: int = 10,
        num_arms: int = 10,
        replicates: int = 1,
        seed: int = 0,
        theta: str = "authors",
        theta_file: str | None = None,
        data_dir: str | Path | None = None,
        ml100k_users: int = 156,
        ml100k_items: int = 454,
        chunk_size: int = 1000,
    ) -> None:
        super().__init__(num_clients, check_int("dim", dim, minimum=2), num_arms, replicates, seed, chunk_size)
        n = self.num_clients
        self.num_clusters = check_int("num_clusters", num_clusters)
        self.num_servers = check_int("num_servers", num_servers)
        for field, value in (("num_clusters", self.num_clusters), ("num_servers", self.num_servers)):
            if value > n:
                raise ConfigError(f"{field} ({value}) must be <= num_clients ({n})")
            if n % value:
                raise ConfigError(f"{field} ({value}) must divide num_clients ({n}): users form blocks of equal size")
        check_choice("theta", theta, THETA_SOURCES)
        if theta_file is not None and theta not in ("authors", "file"):
            raise ConfigError(f"theta_file is read by theta=authors or theta=file only, got theta={theta!r}")
        self.ml100k_users = check_int("ml100k_users", ml100k_users)
        self.ml100k_items = check_int("ml100k_items", ml100k_items)
        #: server of each user (n,): contiguous blocks of n/L
        self.servers = np.arange(n) // (n // self.num_servers)
        #: true cluster of each user (n,): contiguous blocks of n/m (the labels an ARI is computed against)
        self.clusters = np.arange(n) // (n // self.num_clusters)
        #: every user vector of the source (rows of the file, or the ml100k derivation); None for ortho_cap
        self.user_vectors: np.ndarray | None = None
        #: row of ``user_vectors`` each of the n users was taken from (n,); None for ortho_cap
        self.source_users: np.ndarray | None = None
        #: θ_i of every user (n, d): m distinct rows, one per true cluster
        self.theta: np.ndarray
        root = None if data_dir is None else Path(data_dir)
        if theta == "ortho_cap":
            self.theta, where = self._ortho_cap(), "theta=ortho_cap"
        else:
            if root is None:
                raise ConfigError(f"data_dir must be set for theta={theta!r}")
            if theta == "ml100k":
                vectors, where = self._ml100k(root)
            else:
                if theta == "file" and theta_file is None:
                    raise ConfigError("theta_file must name a user-vector .npy for theta=file")
                path = root / (theta_file or AUTHORS_THETA)
                if not path.exists() and not str(theta_file or AUTHORS_THETA).startswith(AUTHORS_FOLDER):
                    raise ConfigError(f"env.theta_file: {path} does not exist; theta=file reads a .npy of your own "
                                      f"user vectors, shape (users, {self.dim}), at a path relative to data_dir "
                                      f"({root})")
                vectors, where = _load_vectors(path, self.dim), f"theta_file {path}"
            pick = self._authors if theta == "authors" else self._kmeans_users
            self.theta, self.source_users = pick(vectors, where)
            self.user_vectors = vectors
        _check_means(self.theta, where)

    @property
    def local_clusters(self) -> list[np.ndarray]:
        """The true local clusters (users of one server and one true cluster), by server then cluster."""
        key = self.servers * self.num_clusters + self.clusters
        return [np.flatnonzero(key == k) for k in np.unique(key)]

    def _ortho_cap(self) -> np.ndarray:
        """θ_j = [q_j/√2, 1/√2] with q_j orthonormal in R^{d−1}, drawn from the seed."""
        m, d = self.num_clusters, self.dim
        if m > d - 1:
            raise ConfigError(f"num_clusters ({m}) must be <= dim - 1 ({d - 1}) for theta=ortho_cap")
        q, _ = np.linalg.qr(numpy_generator(self.seed, "clustered-ortho").standard_normal((d - 1, m)))
        centres = np.concatenate([q.T, np.ones((m, 1))], axis=1) / np.sqrt(2.0)
        return centres[self.clusters]

    def _authors(self, rows: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
        """(θ, rows used): the first n rows, checked to hold m distinct θ in blocks of n/m."""
        n, m = self.num_clients, self.num_clusters
        if len(rows) < n:
            raise ConfigError(f"{where}: has {len(rows)} rows, num_clients needs {n}")
        blocks = rows[: n : n // m]
        if not np.array_equal(rows[:n], blocks[self.clusters]) or len(np.unique(blocks, axis=0)) < m:
            raise ConfigError(
                f"{where}: the first {n} rows do not hold {m} distinct θ in contiguous blocks of {n // m} users"
                " (num_clusters); theta=file clusters a file's rows by k-means instead"
            )
        return rows[:n], np.arange(n)

    def _kmeans_users(self, vectors: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
        """(θ, rows picked): n/m rows per k-means cluster of ``vectors``, cluster after cluster, each θ its
        cluster's centre (paper §5)."""
        n, m = self.num_clients, self.num_clusters
        if len(vectors) < n:
            raise ConfigError(f"{where}: has {len(vectors)} user vectors, num_clients needs {n}")
        distinct = len(np.unique(vectors, axis=0))
        if distinct < m:
            raise ConfigError(f"{where}: has {distinct} distinct user vectors, fewer than num_clusters ({m})")
        state = int(numpy_generator(self.seed, "clustered-kmeans").integers(2**31 - 1))
        with threadpool_limits(limits=1):  # tiny fits: threads only add overhead on a shared machine
            fit = KMeans(n_clusters=m, n_init=10, random_state=state).fit(vectors)
        sizes = np.bincount(fit.labels_, minlength=m)
        if sizes.min() < n // m:
            raise ConfigError(
                f"{where}: a k-means cluster has {sizes.min()} users, fewer than num_clients / num_clusters"
                f" ({n // m}); lower num_clients or num_clusters"
            )
        rng = numpy_generator(self.seed, "clustered-users")
        picks = [np.sort(rng.choice(np.flatnonzero(fit.labels_ == k), n // m, replace=False)) for k in range(m)]
        return fit.cluster_centers_[self.clusters], np.concatenate(picks)

    def _ml100k(self, root: Path) -> tuple[np.ndarray, str]:
        """(vectors, description): user vectors from ML-100K by the authors' recipe (paper §5); sets ``ml100k_ids``."""
        ratings = read_raw_ratings("ml-100k", root)
        where = f"ml100k vectors from {ratings.attrs['path']}"
        users, u = np.unique(ratings["user"].to_numpy(), return_inverse=True)
        _, i = np.unique(ratings["item"].to_numpy(), return_inverse=True)
        rated = np.zeros((len(users), i.max() + 1))
        rated[u, i] = 1.0
        rows = _most_active(rated, 3 * self.ml100k_users)
        cols = _most_active(rated[rows].T, self.ml100k_items)
        rows = rows[_most_active(rated[np.ix_(rows, cols)], self.ml100k_users)]
        with threadpool_limits(limits=1):  # a small matrix: BLAS threads only contend on a shared machine
            left = np.linalg.svd(rated[np.ix_(rows, cols)], full_matrices=False)[0][:, : self.dim - 1]
        left = left / np.linalg.norm(left, axis=1, keepdims=True)
        vectors = np.concatenate([left, np.ones((len(rows), 1))], axis=1) / np.sqrt(2.0)
        #: MovieLens user id of each row of ``user_vectors`` (theta=ml100k only)
        self.ml100k_ids = users[rows]
        return _check_vectors(vectors, self.dim, where), where  # names a dim beyond the matrix's rank bound

    def chunk(self, replicate: int, index: int) -> Chunk:
        """Steps of chunk ``index``: uniform arrivals, unit items, a Bernoulli reward per arm."""
        S, K, d = self.chunk_size, self.num_arms, self.dim
        clients = numpy_generator(self.seed, "clustered-arrivals", replicate, index).integers(0, self.num_clients, S)
        z = numpy_generator(self.seed, "clustered-items", replicate, index).standard_normal((S, K, d - 1))
        z /= np.linalg.norm(z, axis=-1, keepdims=True) * np.sqrt(2.0)
        contexts = np.concatenate([z, np.full((S, K, 1), 1.0 / np.sqrt(2.0))], axis=-1)
        expected = np.einsum("skd,sd->sk", contexts, self.theta[clients])
        uniforms = numpy_generator(self.seed, "clustered-bernoulli", replicate, index).random((S, K))
        return Chunk(clients, contexts, expected, (uniforms < expected) - expected)


def _most_active(matrix: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` rows of a 0/1 matrix with the most ones, most first, ties by index (authors' order)."""
    return np.argsort(-matrix.sum(axis=1), kind="stable")[:k]


def _check_vectors(vectors: np.ndarray, dim: int, where: str) -> np.ndarray:
    """``vectors`` if it is a finite (rows, dim) array, else a ConfigError naming ``where``."""
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ConfigError(f"{where}: expected a 2-D array of user vectors with dim = {dim} columns, got shape "
                          f"{vectors.shape}")
    if not np.isfinite(vectors).all():
        raise ConfigError(f"{where}: holds non-finite values (NaN or inf)")
    return vectors


def _load_vectors(path: Path, dim: int) -> np.ndarray:
    """The user vectors of a ``.npy`` file, checked by :func:`_check_vectors` (the file is named on error)."""
    how = ("The authors' files are in raw_data/ of github.com/ZhaoHaoRu/Federated-Clustering-of-Bandits"
           " (commit 7119720); copy them into that folder.")
    where = f"theta_file {checked_file(path, how)}"
    try:
        vectors = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: not a numeric .npy array ({exc})") from None
    return _check_vectors(np.asarray(vectors, dtype=np.float64), dim, where)


def _check_means(theta: np.ndarray, where: str) -> None:
    """ConfigError naming ``where`` unless θᵀx ∈ [0, 1] for every item x = [z/‖z‖/√2, 1/√2].

    Over such items θᵀx ranges exactly over θ_d/√2 ± ‖θ_{1:d−1}‖/√2, so both ends are checked.
    """
    centre = theta[:, -1] / np.sqrt(2.0)
    radius = np.linalg.norm(theta[:, :-1], axis=1) / np.sqrt(2.0)
    low, high = centre - radius, centre + radius
    bad = np.flatnonzero((low < -MEAN_TOLERANCE) | (high > 1.0 + MEAN_TOLERANCE))
    if len(bad):
        i = bad[0]
        raise ConfigError(
            f"{where}: θ of user {i} gives mean rewards in [{low[i]:.3g}, {high[i]:.3g}] over the unit items"
            " [z/‖z‖/√2, 1/√2], outside the Bernoulli range [0, 1]"
        )
