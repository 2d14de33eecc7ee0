"""FCLUB's clustered environment (fclub spec §4.2, §4.3, §8.1–8.2): layout, items, Bernoulli rewards, common
random numbers, the θ sources and the errors that name a bad input."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.errors import ConfigError, DatasetNotFoundError

AUTHORS = "fclub-authors/10_theta.npy"
ML_FILE = "fclub-authors/ml_1000user_d10.npy"
YELP_FILE = "fclub-authors/yelp_1000user_d10.npy"
ROOT2 = np.sqrt(2.0)


@pytest.fixture(scope="module")
def authors(data_dir: Path) -> ClusteredLinearEnv:
    return ClusteredLinearEnv(data_dir=data_dir, replicates=2, chunk_size=1000)


def test_layout_and_the_eight_local_clusters() -> None:
    """n = 40, L = 5, m = 4: servers of 8, clusters of 10, and exactly the 8 local clusters of §8.2."""
    env = ClusteredLinearEnv(40, 4, 5, theta="ortho_cap")
    np.testing.assert_array_equal(env.servers, np.repeat(np.arange(5), 8))
    np.testing.assert_array_equal(env.clusters, np.repeat(np.arange(4), 10))
    assert env.theta.shape == (40, 10)
    spans = [(0, 7), (8, 9), (10, 15), (16, 19), (20, 23), (24, 29), (30, 31), (32, 39)]
    assert [c.tolist() for c in env.local_clusters] == [list(range(a, b + 1)) for a, b in spans]
    for users in env.local_clusters:  # each is one server and one cluster, and no two share both
        assert len(set(env.servers[users])) == 1 and len(set(env.clusters[users])) == 1


def test_items_are_unit_with_last_coordinate_and_linear_means(authors: ClusteredLinearEnv) -> None:
    """x = [z/‖z‖/√2, 1/√2] (§4.2), expected = θ_iᵀx within [0, 1]."""
    ch = authors.chunk(0, 0)
    assert ch.contexts.shape == (1000, 10, 10) and ch.expected.shape == ch.noise.shape == (1000, 10)
    np.testing.assert_allclose(np.linalg.norm(ch.contexts, axis=-1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(ch.contexts[..., -1], 1.0 / ROOT2)
    np.testing.assert_allclose(ch.expected, np.einsum("skd,sd->sk", ch.contexts, authors.theta[ch.clients]),
                               atol=1e-14)
    assert ch.expected.min() >= -1e-12 and ch.expected.max() <= 1 + 1e-12
    assert len(np.unique(ch.contexts[:, :, 0])) == ch.contexts[:, :, 0].size  # fresh items every step


def test_bernoulli_rewards_match_their_means(authors: ClusteredLinearEnv) -> None:
    """Rewards are 0/1 per arm, and in each fifth of the means the click rate matches the mean (±4σ)."""
    batch = authors.interactions(0, 20000)
    rewards, expected = batch.rewards.numpy(), batch.expected.numpy()
    assert batch.noise.shape == batch.expected.shape == (2, 20000, 10)
    assert set(np.unique(rewards)) == {0.0, 1.0}
    y, e = rewards.ravel(), expected.ravel()
    edges = np.quantile(e, np.linspace(0, 1, 6))
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (e >= lo) & (e <= hi)
        sigma = np.sqrt((e[inside] * (1 - e[inside])).sum()) / inside.sum()
        assert abs(y[inside].mean() - e[inside].mean()) <= 4 * sigma, (lo, hi)


def test_chunks_regenerate_and_share_one_stream(data_dir: Path, authors: ClusteredLinearEnv) -> None:
    """Same (seed, replicate, chunk) → same arrays; replicates and seeds differ; the stream ignores θ (§8.13)."""
    again = ClusteredLinearEnv(data_dir=data_dir, replicates=2, chunk_size=1000)
    for r, c in [(0, 0), (1, 3)]:
        a, b = authors.chunk(r, c), again.chunk(r, c)
        for field in ("clients", "contexts", "expected", "noise"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    window = authors.interactions(700, 2300)  # straddles chunks 0, 1 and 2
    np.testing.assert_array_equal(window.clients[1].numpy(), np.concatenate(
        [authors.chunk(1, 0).clients[700:], authors.chunk(1, 1).clients, authors.chunk(1, 2).clients[:300]]))
    np.testing.assert_array_equal(window.noise[1, 300:1300].numpy(), authors.chunk(1, 1).noise)
    r0, r1 = authors.chunk(0, 1), authors.chunk(1, 1)
    assert not np.array_equal(r0.clients, r1.clients) and not np.array_equal(r0.contexts, r1.contexts)
    other_seed = ClusteredLinearEnv(data_dir=data_dir, seed=1).chunk(0, 1)
    assert not np.array_equal(r0.contexts, other_seed.contexts)
    ortho = ClusteredLinearEnv(theta="ortho_cap", replicates=2).chunk(1, 1)
    np.testing.assert_array_equal(ortho.clients, r1.clients)
    np.testing.assert_array_equal(ortho.contexts, r1.contexts)


def test_arrivals_are_uniform(authors: ClusteredLinearEnv) -> None:
    """Chi-square goodness of fit of 40000 arrivals to the uniform law on the 40 users."""
    counts = np.bincount(authors.interactions(0, 20000).clients.numpy().ravel(), minlength=40)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_authors_theta_file(data_dir: Path, authors: ClusteredLinearEnv) -> None:
    """10_theta.npy: 40 unit θ, 4 distinct in blocks of 10, last coordinate 1/√2, gaps 0.81–1.14 (§8.1a)."""
    theta = np.load(data_dir / AUTHORS)
    assert theta.shape == (40, 10)
    np.testing.assert_array_equal(authors.theta, theta)
    blocks = theta[::10]
    np.testing.assert_array_equal(theta, np.repeat(blocks, 10, axis=0))
    np.testing.assert_allclose(np.linalg.norm(blocks, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(blocks[:, -1], 1.0 / ROOT2, atol=1e-12)
    gaps = np.linalg.norm(blocks[:, None] - blocks[None], axis=-1)[np.triu_indices(4, 1)]
    assert 0.80 < gaps.min() and gaps.max() < 1.15
    np.testing.assert_array_equal(authors.source_users, np.arange(40))


def test_ortho_cap_has_gap_one_and_means_in_range() -> None:
    """θ_j = [q_j/√2, 1/√2], q orthonormal: unit norm, every gap exactly 1, means in [0, 1] (§8.1b)."""
    env = ClusteredLinearEnv(60, 6, 3, dim=7, theta="ortho_cap", seed=5)
    blocks = env.theta[::10]
    np.testing.assert_array_equal(env.theta, np.repeat(blocks, 10, axis=0))
    np.testing.assert_allclose(np.linalg.norm(blocks, axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(blocks[:, -1], 1.0 / ROOT2, atol=1e-15)
    gaps = np.linalg.norm(blocks[:, None] - blocks[None], axis=-1)[np.triu_indices(6, 1)]
    np.testing.assert_allclose(gaps, 1.0, atol=1e-12)
    ch = env.chunk(0, 0)
    assert ch.expected.min() >= -1e-12 and ch.expected.max() <= 1 + 1e-12
    assert not np.array_equal(blocks, ClusteredLinearEnv(60, 6, 3, dim=7, theta="ortho_cap", seed=6).theta[::10])


@pytest.mark.parametrize("theta, theta_file", [("file", ML_FILE), ("file", YELP_FILE), ("ml100k", None)])
def test_real_data_sources_give_a_kmeans_truth(data_dir: Path, theta: str, theta_file: str | None) -> None:
    """m distinct θ in blocks of n/m, each the centre of its k-means cluster of all the source's users, and each
    picked user belongs to its block's cluster (§4.3 with the balanced pick)."""
    env = ClusteredLinearEnv(data_dir=data_dir, theta=theta, theta_file=theta_file)
    blocks = env.theta[::10]
    assert len(np.unique(blocks, axis=0)) == 4
    np.testing.assert_array_equal(env.theta, np.repeat(blocks, 10, axis=0))
    vectors = env.user_vectors
    nearest = np.linalg.norm(vectors[:, None] - blocks[None], axis=-1).argmin(axis=1)
    for k in range(4):  # Lloyd fixed point: each centre is the mean of the vectors nearest to it
        np.testing.assert_allclose(blocks[k], vectors[nearest == k].mean(axis=0), atol=1e-9)
    np.testing.assert_array_equal(nearest[env.source_users], env.clusters)
    assert len(set(env.source_users.tolist())) == 40
    if theta == "ml100k":  # 156 users, unit rows ending in 1/√2, drawn from the 468 most active raters
        assert vectors.shape == (156, 10)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-12)
        np.testing.assert_allclose(vectors[:, -1], 1.0 / ROOT2, atol=1e-15)
        users = np.loadtxt(data_dir / "ml-100k" / "u.data", usecols=0, dtype=np.int64)
        ids, counts = np.unique(users, return_counts=True)
        assert np.isin(env.ml100k_ids, ids[np.argsort(-counts, kind="stable")[:468]]).all()


def _write(folder: Path, name: str, array: np.ndarray) -> str:
    np.save(folder / name, array)
    return name


def _groups(sizes: list[int], dim: int = 4) -> np.ndarray:
    """Rows [e_j/√2, 1/√2] in groups of the given sizes: valid θ, one distinct vector per group."""
    rows = [np.r_[np.eye(dim - 1)[j], 1.0] / ROOT2 for j, size in enumerate(sizes) for _ in range(size)]
    return np.array(rows)


def test_bad_inputs_are_named(data_dir: Path, tmp_path: Path) -> None:
    """Every bad layout, source or θ file raises a ConfigError naming the field or the file."""
    good = np.load(data_dir / AUTHORS)
    nan = good.copy()
    nan[3, 2] = np.nan
    files = {
        "flat": _write(tmp_path, "flat.npy", good[0]),
        "narrow": _write(tmp_path, "narrow.npy", good[:, :8]),
        "short": _write(tmp_path, "short.npy", good[:20]),
        "nan": _write(tmp_path, "nan.npy", nan),
        "outside": _write(tmp_path, "outside.npy", np.repeat(np.eye(10)[:4], 10, axis=0)),
        "groups": _write(tmp_path, "groups.npy", _groups([2, 2, 8])),
    }
    cases = [
        (dict(num_clients=44, theta="ortho_cap"), "num_servers"),
        (dict(num_clients=45, num_servers=5, theta="ortho_cap"), "num_clusters"),
        (dict(num_clients=40, num_clusters=41, theta="ortho_cap"), "num_clusters (41) must be <= num_clients"),
        (dict(num_clients=4, num_clusters=2, num_servers=5, theta="ortho_cap"), "num_servers (5) must be <="),
        (dict(theta="orthogonal"), "theta must be one of"),
        (dict(num_clusters=4, dim=4, theta="ortho_cap"), "dim - 1"),
        (dict(theta="ortho_cap", theta_file="x.npy"), "theta_file is read by"),
        (dict(theta="authors"), "data_dir must be set"),
        (dict(theta="file", data_dir=tmp_path), "theta_file must name"),
        (dict(theta_file=files["flat"], data_dir=tmp_path), "flat.npy"),
        (dict(theta_file=files["narrow"], data_dir=tmp_path), "narrow.npy"),
        (dict(theta_file=files["short"], data_dir=tmp_path), "short.npy: has 20 rows"),
        (dict(theta="file", theta_file=files["short"], data_dir=tmp_path), "short.npy: has 20 user vectors"),
        (dict(theta_file=files["nan"], data_dir=tmp_path), "nan.npy: holds non-finite"),
        (dict(theta_file=files["outside"], data_dir=tmp_path), "outside.npy: θ of user 0 gives mean rewards"),
        (dict(theta_file=ML_FILE, data_dir=data_dir), "contiguous blocks of 10"),
        (dict(num_clients=12, num_clusters=4, num_servers=1, dim=4, theta="file", theta_file=files["groups"],
              data_dir=tmp_path), "has 3 distinct user vectors"),
        (dict(num_clients=10, num_clusters=2, num_servers=2, dim=4, theta="file", theta_file=files["groups"],
              data_dir=tmp_path), "a k-means cluster has 4 users"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=re.escape(message)):
            ClusteredLinearEnv(**kwargs)
    # a user's own file is named with the field and what it must hold; the authors' files say where they come from
    with pytest.raises(ConfigError, match=r"^env\.theta_file: .*missing\.npy does not exist; theta=file reads a \.npy "
                                          r"of your own user vectors, shape \(users, \d+\)"):
        ClusteredLinearEnv(theta="file", theta_file="missing.npy", data_dir=tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"10_theta\.npy(.|\n)*raw_data/ of github\.com"):
        ClusteredLinearEnv(theta="authors", data_dir=tmp_path)
    with pytest.raises(DatasetNotFoundError, match="u.data"):
        ClusteredLinearEnv(theta="ml100k", data_dir=tmp_path)
