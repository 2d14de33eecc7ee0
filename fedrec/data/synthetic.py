"""Synthetic explicit ratings with power-law popularity at any size, to measure scale without downloads.

:func:`synthetic_ratings` draws ``ratings`` distinct (user, item) pairs among ``users`` users and ``items`` items,
gives each a rating 1..5 and splits them exactly as the real datasets are split (:mod:`fedrec.data.ratings`:
4:1 train/test, ``val_fraction``, half the training ratings streamed over the rounds, users grouped at random
into ``num_clients`` clients). Every random number comes from :func:`fedrec.utils.seeding.numpy_generator`, so
``seed`` fixes the dataset; ``rounds`` only changes when streamed ratings arrive.

Popularity (Zipf-like; "degree" = number of ratings):

* Users: the user of popularity rank ``r = 1..users`` rates ``d_r ≈ c · r^(-user_exponent)`` items, with ``c``
  set so the degrees add up to ``ratings``, each degree clipped to ``[1, items]`` (nobody rates an item twice)
  and rounded to integers by largest remainder (:func:`power_law_degrees`). These degrees are exact.
* Items: the target degree of the item of rank ``r`` follows the same law with ``item_exponent``, clipped to
  ``[1, users]``. Each user picks its ``d_u`` distinct items by successive sampling without replacement, item
  ``i`` drawn with probability proportional to a weight ``w_i``. Weights proportional to the targets would
  flatten the popular head (a user takes a popular item once however often it is drawn, so 1.0 would come out
  near 0.75), so the weights are fitted first: Rosén's approximation of the inclusion probabilities of
  successive sampling, ``P(u rates i) ≈ 1 - exp(-t_u w_i)`` with ``t_u`` solving ``Σ_i P(u rates i) = d_u``,
  gives the expected item degrees, and ``w`` is rescaled by target / expected until they match (within a few
  percent). Item degrees are then random, close to the targets.
* Items drawn by nobody are given one rating each, moved from a random rating of an item with several (a
  user's degree does not change), so every user and every item has at least one rating: this needs
  ``ratings >= max(users, items)``.
* Ranks are assigned to user and item indices by random permutations (index 0 is not the most popular).

Where a power law asks for more than the other side holds (at ML-1M size with the defaults, the 24 most active
users would rate more than the 3,706 items), degrees sit at the cap, so a log-degree vs log-rank fit recovers the
exponent over the ranks below the cap (the tests fit from the 1st to the 100th percentile of rank and find it
within 0.05).

Rating values come from a low-rank model, so a recommender has something to learn: a standardised score
``z = sqrt(s/4)·b_u + sqrt(s/4)·b_i + sqrt(s/2)·(p_u·q_i)/sqrt(rank) + sqrt(noise)·ε`` with ``s = 1 - noise``,
user and item biases ``b``, factors ``p_u, q_i`` in R^rank and noise ``ε``, all standard normal (so ``z`` has
unit variance), cut into 1..5 at the normal quantiles of MovieLens-100K's shares of 1..5 stars
(:data:`STAR_SHARES`). ``noise`` is the share of the score's variance no model can explain.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from statistics import NormalDist
from typing import Any

import numpy as np

from fedrec.data.ratings import RatingData, Ratings, check_split, normalize_ratings, split_ratings
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.utils.seeding import numpy_generator

#: Shares of the ratings 1, 2, 3, 4, 5 stars in MovieLens-100K (``ml-100k/u.data``), which the values imitate.
STAR_SHARES = (0.0611, 0.1137, 0.27145, 0.34174, 0.21201)
#: The rating scale of the generated data (its ``rating_range``, which fixes the normalisation).
RATING_SCALE = (1.0, 5.0)

_CHUNK = 1 << 20  # pairs per block when computing rating values
_RACE_BLOCK = 1 << 22  # user × item keys per block of the exponential race


def synthetic_ratings(
    users: int = 6040,
    items: int = 3706,
    ratings: int = 1_000_209,
    *,
    user_exponent: float = 0.8,
    item_exponent: float = 1.0,
    rank: int = 8,
    noise: float = 0.25,
    num_clients: int | None = None,
    seed: int = 0,
    rounds: int = 100,
    test_fraction: float = 0.2,
    val_fraction: float = 0.0,
    normalize: str = "max",
    stream: bool = True,
) -> RatingData:
    """A synthetic rating dataset of exactly ``users`` users, ``items`` items and ``ratings`` distinct (user, item)
    ratings, with power-law popularity (module docstring), split like :func:`fedrec.data.load_ratings`.

    Args:
        users, items, ratings: the sizes (defaults: MovieLens-1M's 6,040, 3,706 and 1,000,209).
        user_exponent, item_exponent: exponents ``a >= 0`` of the degree of the popularity rank ``r``, ``∝ r^-a``
            (0 = every user, or item, equally active).
        rank: dimension of the latent factors behind the rating values.
        noise: share of the rating score's variance that is noise, in [0, 1].
        num_clients: clients; None = one per user. Fewer groups the users at random into clients of near-equal
            size (MovieLens-1M's experiments use 605).
        seed, rounds, test_fraction, val_fraction, normalize, stream: as for :func:`fedrec.data.load_ratings`
            (``normalize="max"`` maps 1..5 to 0.2..1, ``"minmax"`` to 0..1; ``stream=False``: every training rating
            from round 0).

    Raises ConfigError naming the field for a size < 1, ``ratings`` outside ``[max(users, items, 2), users ·
    items]``, an exponent < 0, ``num_clients`` outside ``[1, users]``, or a bad split setting.
    """
    users = check_int("users", users)
    items = check_int("items", items)
    ratings = check_int("ratings", ratings)
    least, most = max(users, items, 2), users * items
    if ratings < least:
        raise ConfigError(f"ratings must be at least max(users, items, 2) = {least} (every user and item rates or "
                          f"is rated once, and the train/test split needs 2), got {ratings}")
    if ratings > most:
        raise ConfigError(f"ratings must be at most users × items = {users} × {items} = {most} (each (user, item) "
                          f"pair is rated once), got {ratings}")
    user_exponent = check_float("user_exponent", user_exponent, low=0.0)
    item_exponent = check_float("item_exponent", item_exponent, low=0.0)
    rank = check_int("rank", rank)
    noise = check_float("noise", noise, low=0.0, high=1.0)
    num_clients = users if num_clients is None else check_int("num_clients", num_clients)
    if num_clients > users:
        raise ConfigError(f"num_clients must lie in [1, {users}] (the users), got {num_clients}")
    seed, rounds, test_fraction, val_fraction, normalize, stream = check_split(
        seed, rounds, test_fraction, val_fraction, normalize, stream
    )

    user, item = rated_pairs(users, items, ratings, user_exponent, item_exponent, seed)
    stars = _stars(user, item, users, items, rank, noise, seed)
    return split_ratings(
        Ratings(user, item, normalize_ratings(stars, normalize, *RATING_SCALE, "synthetic_ratings")),
        name="synthetic",
        user_ids=np.arange(users, dtype=np.int64),
        item_ids=np.arange(items, dtype=np.int64),
        num_clients=num_clients,
        seed=seed,
        rounds=rounds,
        test_fraction=test_fraction,
        val_fraction=val_fraction,
        normalize=normalize,
        rating_range=RATING_SCALE,
        streaming=stream,
    )


def _generation_bytes(sizes: Mapping[str, Any]) -> int:
    """The peak bytes of generating ``sizes`` (``users``, ``items``, ``ratings``), stated before it starts (the
    ``memory_estimate`` of :func:`synthetic_ratings`): about 95 per rating (the pairs, their draws and the split's
    copies), 200 per user and item (degrees, factors, biases) and 24 per key of the race's blocks (at most
    users × items keys). Measured, the growth of the peak: 0.18 GiB for 1 million ratings of 20,000 users and 5,000
    items (this says 0.19), 0.92 GiB at MovieLens-10M's size (0.99) and 8.9 GiB at Netflix's (9.1; 70 per rating,
    as this said before, was 25 % short there)."""
    keys = min(_RACE_BLOCK, sizes["users"] * sizes["items"])
    return 95 * sizes["ratings"] + 200 * (sizes["users"] + sizes["items"]) + 24 * keys


synthetic_ratings.memory_estimate = _generation_bytes  # type: ignore[attr-defined]


def power_law_degrees(n: int, total: int, exponent: float, cap: int) -> np.ndarray:
    """Integer degrees of popularity ranks ``1..n`` (in rank order): ``clip(c · r^-exponent, 1, cap)`` with ``c``
    such that they sum to ``total``, rounded by largest remainder so the sum is exact (needs
    ``n <= total <= n · cap``)."""
    if not n <= total <= n * cap:
        raise ConfigError(f"{total} ratings cannot be spread over {n} ranks of 1 to {cap} each")
    log_rank = exponent * np.log(np.arange(1, n + 1, dtype=np.float64))
    log_cap = math.log(cap)

    def degrees(log_c: float) -> np.ndarray:
        return np.clip(np.exp(np.minimum(log_c - log_rank, log_cap + 1.0)), 1.0, cap)

    low, high = 0.0, log_cap + float(log_rank[-1])  # every degree at 1, every degree at the cap
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if degrees(middle).sum() < total else (low, middle)
    real = degrees(high)
    result = np.minimum(np.floor(real), cap).astype(np.int64)
    missing = total - int(result.sum())
    if missing < 0 or missing > np.count_nonzero(result < cap):  # pragma: no cover (the bisection is exact)
        raise RuntimeError(f"power_law_degrees: cannot round {real.sum()} to {total}")
    fraction = np.where(result < cap, real - result, -1.0)
    result[np.argsort(-fraction, kind="stable")[:missing]] += 1
    return result


def rated_pairs(
    users: int, items: int, ratings: int, user_exponent: float, item_exponent: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The (user, item) index arrays of ``ratings`` distinct pairs with power-law popularity (module docstring),
    sorted by (user, item); every user and item occurs. The arguments are :func:`synthetic_ratings`'s, checked."""
    user_degree = power_law_degrees(users, ratings, user_exponent, cap=items)
    item_target = power_law_degrees(items, ratings, item_exponent, cap=users)
    weight, draws, fresh = _item_weights(user_degree, item_target)
    keys = _sample(numpy_generator(seed, "synthetic-pairs"), user_degree, weight, draws, fresh)
    user, item = np.divmod(keys, items)
    item = _cover_items(numpy_generator(seed, "synthetic-cover"), user, item, items)
    ranks = numpy_generator(seed, "synthetic-ranks")  # popularity rank -> index
    return np.divmod(np.sort(ranks.permutation(users)[user] * items + ranks.permutation(items)[item]), items)


def _item_weights(
    user_degree: np.ndarray, item_target: np.ndarray, iterations: int = 20, newton_steps: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Item weights (sum 1) whose successive sampling gives expected item degrees near ``item_target``, and for
    each user the expected draws ``t_u`` to get its degree and the chance ``q_u`` that its last draw is new.

    Rosén's approximation over users grouped by degree (bins ~8% wide; users rating every item take all of
    them): ``t`` solves ``Σ_i (1 - exp(-t w_i)) = d`` by Newton steps on ``log t``; ``w`` is rescaled by
    target / expected degree ``iterations`` times."""
    num_items = len(item_target)
    everything = int(np.count_nonzero(user_degree >= num_items))
    partial = user_degree[user_degree < num_items].astype(np.float64)
    _, group, count = np.unique(np.round(np.log(partial) * 12), return_inverse=True, return_counts=True)
    degree = np.bincount(group, weights=partial) / np.maximum(count, 1)
    target = item_target.astype(np.float64)
    weight = target / target.sum()
    log_t = np.log(np.maximum(degree, 1.0))
    for step in range(iterations + 1):
        for _ in range(newton_steps):
            t = np.exp(log_t)[:, None]
            missed = np.exp(-t * weight)
            excess = (1.0 - missed).sum(axis=1) - degree
            slope = (t * weight * missed).sum(axis=1)
            log_t -= np.clip(excess / np.maximum(slope, 1e-300), -2.0, 2.0)
        inclusion = 1.0 - np.exp(-np.exp(log_t)[:, None] * weight)
        if step < iterations:
            weight *= target / (everything + count @ inclusion)
            weight /= weight.sum()
    fresh = (weight * (1.0 - inclusion)).sum(axis=1)  # chance a draw is an item not yet taken, at t
    draws = np.full(len(user_degree), np.inf)
    draws[user_degree < num_items] = np.exp(log_t)[group]
    new = np.ones(len(user_degree))
    new[user_degree < num_items] = fresh[group]
    return weight, draws, new


def _sample(
    rng: np.random.Generator, degree: np.ndarray, weight: np.ndarray, draws: np.ndarray, fresh: np.ndarray
) -> np.ndarray:
    """Sorted keys ``user · items + item``: for each user its first ``degree[u]`` distinct items in a stream of
    draws ∝ ``weight`` (successive sampling without replacement). Users expected to need more than items / 4
    draws run an exponential race over all items (the smallest ``Exp(1) / w_i`` win; the same distribution),
    the others draw, drop repeats by key and draw again for what is missing."""
    num_items = len(weight)
    race = np.flatnonzero(draws > num_items / 4)
    parts = []
    per_block = max(1, _RACE_BLOCK // num_items)
    for start in range(0, len(race), per_block):
        block = race[start:start + per_block]
        order = np.argsort(rng.standard_exponential((len(block), num_items)) / weight, axis=1)
        taken = np.arange(num_items) < degree[block][:, None]
        parts.append((block[:, None] * num_items + order)[taken])
    cdf = np.cumsum(weight)
    cdf /= cdf[-1]
    user = np.flatnonzero(draws <= num_items / 4)
    need = degree[user]
    count = np.ceil(draws[user] * 1.05).astype(np.int64) + 2
    accepted = np.zeros(0, dtype=np.int64)
    while len(user):
        keys = np.repeat(user * num_items, count)
        keys += np.searchsorted(cdf, rng.random(len(keys)), side="right").clip(max=num_items - 1)
        keys, first = np.unique(keys, return_index=True)
        if len(accepted):
            at = np.searchsorted(accepted, keys).clip(max=len(accepted) - 1)
            new = accepted[at] != keys
            keys, first = keys[new], first[new]
        keys = keys[np.argsort(first)]  # draw order, which keeps each user's draws together
        start = np.searchsorted(keys // num_items, user)
        size = np.diff(np.r_[start, len(keys)])
        keys = keys[np.arange(len(keys)) - np.repeat(start, size) < np.repeat(need, size)]
        accepted = np.sort(np.concatenate([accepted, keys]))  # disjoint: repeats were dropped above
        need = need - np.minimum(size, need)
        left = need > 0
        user, need = user[left], need[left]
        count = np.ceil(need / fresh[user] * 1.5).astype(np.int64) + 2
    return np.sort(np.concatenate([*parts, accepted]))


def _cover_items(rng: np.random.Generator, user: np.ndarray, item: np.ndarray, num_items: int) -> np.ndarray:
    """``item`` with one rating given to each item nobody rated, taken from a random rating of an item with more
    than one (at most all but one of each); ``user`` and the pairs' distinctness are unchanged."""
    unrated = np.flatnonzero(np.bincount(item, minlength=num_items) == 0)
    if not len(unrated):
        return item
    by_item = np.argsort(item, kind="stable")
    sorted_item = item[by_item]
    spare = by_item[np.r_[False, sorted_item[1:] == sorted_item[:-1]]]  # every rating but each item's first
    item = item.copy()
    item[rng.choice(spare, size=len(unrated), replace=False)] = unrated
    return item


def _stars(user: np.ndarray, item: np.ndarray, users: int, items: int, rank: int, noise: float,
           seed: int) -> np.ndarray:
    """Rating values 1..5 (float32) of the pairs from the low-rank model of the module docstring."""
    rng = numpy_generator(seed, "synthetic-ratings")
    signal = 1.0 - noise
    user_part = math.sqrt(signal / 4) * rng.standard_normal(users)
    item_part = math.sqrt(signal / 4) * rng.standard_normal(items)
    scale = math.sqrt(signal / 2 / rank)
    user_factor = rng.standard_normal((users, rank))
    item_factor = rng.standard_normal((items, rank))
    cuts = np.array([NormalDist().inv_cdf(float(c)) for c in np.cumsum(STAR_SHARES)[:-1]])
    stars = np.empty(len(user), dtype=np.float32)
    for start in range(0, len(user), _CHUNK):
        u, i = user[start:start + _CHUNK], item[start:start + _CHUNK]
        score = user_part[u] + item_part[i] + scale * np.einsum("nk,nk->n", user_factor[u], item_factor[i])
        score += math.sqrt(noise) * rng.standard_normal(len(u))
        stars[start:start + _CHUNK] = 1 + np.searchsorted(cuts, score)
    return stars
