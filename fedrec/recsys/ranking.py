"""Top-K ranking metrics of a score matrix: HR@K, NDCG@K, Recall@K and MRR, over every item a user has not
interacted with in training (full ranking) or, as a flag, over its held-out items and ``negatives`` items sampled
for it (the NCF protocol: one held-out item against 99 sampled ones, He et al. 2017 §4.1).

Definitions, per user u with held-out set T_u (H_u = |T_u| >= 1) and rank r_i >= 1 of item i in u's list:

* candidates: full ranking, every item of the catalogue but u's training items (held-out ones included); sampled,
  T_u and ``negatives`` items drawn uniformly without replacement from the items u has neither trained on nor holds
  out (:func:`sample_negatives`), all of them if fewer remain.
* order: by score, highest first. Ties follow the pessimistic rule: a held-out item comes after every candidate
  that is not held out and scores the same, and among tied items of one kind the lower id comes first. A model
  that scores every item equal therefore ranks the held-out items after all others (HR@K = 0 for a user with at
  least K other candidates) instead of getting credit for them: a tie is never counted as a success, so the values
  are the worst case of random tie-breaking. A NaN score counts as -inf.
* ``hr@K``: 1 if some held-out item is among the first K, else 0 (NCF's hit ratio).
* ``recall@K``: hits@K / H_u, the held-out items among the first K over all of them. This is the denominator of
  RecBole's Recall and of LightGCN's evaluation code (and of PyG's ``LinkPredRecall``); some papers divide by
  min(K, H_u) instead, which gives larger values when H_u > K. Under leave-one-out (H_u = 1) recall@K = hr@K.
* ``ndcg@K``: DCG@K / IDCG@K with binary relevance, DCG@K = Σ_{i in T_u, r_i <= K} 1 / log2(r_i + 1) and the
  ideal IDCG@K = Σ_{r=1}^{min(K, H_u)} 1 / log2(r + 1) (every held-out item ranked first).
* ``mrr``: 1 / min_{i in T_u} r_i, the reciprocal rank of the best-ranked held-out item in the whole list: not
  truncated at any K (so a held-out item at rank 500 still counts 1/500; :file:`topk.npz` recomputes it only for
  the users whose best rank is within its lists).
* A user with fewer than K candidates: its list holds all of them (:func:`top_k` pads it with -1) and the metrics
  are those of that list, held-out items included, so HR@K = recall@K = 1 whatever the scores.

Every metric is averaged over users, each user weighing 1. :func:`ranking_sums` returns sums that add up over
disjoint sets of users (a sharded run all-reduces them) and :func:`metrics_from_ranking_sums` turns them into
``{"hr@10": ..., "ndcg@10": ..., "recall@10": ..., "mrr": ...}``, the names a task prefixes with ``test_`` (and
the run's summary with ``final_``).

Users' items come as :class:`UserItems` (CSR over all users). Users are ranked in batches of ``batch_size`` with
dense ``(batch, items)`` masks, without a loop over users: a held-out item's rank is one plus the candidates that
precede it in the order, counted by comparing it with its user's whole row (I per held-out item) or, when the users
hold out more than log2(I) items each, by searching their sorted rows (about I·log2(I) per user); :func:`top_k`'s
lists come from one stable sort per row. At ML-1M's size (6,040 users, 3,706 items) a batch of 256 users holds about
a million entries per mask, and full ranking of every user on one thread of a busy 2-core machine took 1.2 s with
one held-out item each, 7.4 s with a 20 % random split (200,000 held-out items), and :func:`top_k` 9 s. It
gives each user's first K items and held-out items, and :func:`save_topk` writes them to ``topk.npz`` so that any
other library can recompute HR, NDCG and recall.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_int
from fedrec.utils.io import atomic_write
from fedrec.utils.rng import keyed_sample_excluding, stream_key

if TYPE_CHECKING:
    from fedrec.data.implicit import ImplicitData

__all__ = ["BATCH_USERS", "NEGATIVES", "TopK", "UserItems", "check_ks", "load_topk", "metrics_from_ranking_sums",
           "negatives_key", "popularity_metrics", "ranking_metric_names", "ranking_metrics", "ranking_sums",
           "sample_negatives", "save_topk", "split_popularity", "top_k"]

#: users ranked together by default: bounds the (batch, items) masks and sort indices held at once
BATCH_USERS = 256
#: sampled negatives per user in the NCF protocol (1 held-out item + 99 sampled)
NEGATIVES = 99
#: the metrics computed at each K, in the order of :func:`ranking_metric_names`
AT_K = ("hr", "ndcg", "recall")


@dataclass(frozen=True, eq=False)
class UserItems:
    """Each user's set of items (its training items, or its held-out ones) as CSR over users ``0..num_users-1``:
    user u's items are ``items[indptr[u]:indptr[u + 1]]``, ascending and distinct. :meth:`from_pairs` builds it."""

    indptr: np.ndarray
    items: np.ndarray

    def __post_init__(self) -> None:
        indptr = np.ascontiguousarray(self.indptr, dtype=np.int64)
        items = np.ascontiguousarray(self.items, dtype=np.int64)
        if indptr.ndim != 1 or items.ndim != 1 or len(indptr) == 0 or indptr[0] != 0 or indptr[-1] != len(items) \
                or bool((np.diff(indptr) < 0).any()):
            raise ConfigError(f"indptr must be 1-D, rise from 0 to len(items) = {len(items)} and never fall, got "
                              f"{len(indptr)} entries")
        starts = np.zeros(len(items), dtype=bool)
        starts[indptr[:-1][indptr[:-1] < len(items)]] = True
        bad = np.flatnonzero((np.diff(items) <= 0) & ~starts[1:])
        if len(bad):
            p = int(bad[0])
            user = int(np.searchsorted(indptr, p, side="right")) - 1
            raise ConfigError(f"items of user {user} must be ascending and distinct, got {items[p]} then "
                              f"{items[p + 1]}")
        object.__setattr__(self, "indptr", indptr)
        object.__setattr__(self, "items", items)

    @classmethod
    def from_pairs(cls, user: np.ndarray | Sequence[int], item: np.ndarray | Sequence[int],
                   num_users: int) -> UserItems:
        """The sets of (user, item) pairs, e.g. a split's interactions; a pair listed twice counts once."""
        num_users = check_int("num_users", num_users, minimum=0)
        user = np.asarray(user, dtype=np.int64).reshape(-1)
        item = np.asarray(item, dtype=np.int64).reshape(-1)
        if len(user) != len(item):
            raise ConfigError(f"user and item must pair up, got {len(user)} users and {len(item)} items")
        outside = np.flatnonzero((user < 0) | (user >= num_users))
        if len(outside):
            raise ConfigError(f"user {user[outside[0]]} is outside 0..{num_users - 1}")
        order = np.lexsort((item, user))
        user, item = user[order], item[order]
        keep = np.ones(len(user), dtype=bool)
        keep[1:] = (user[1:] != user[:-1]) | (item[1:] != item[:-1])
        indptr = np.zeros(num_users + 1, dtype=np.int64)
        np.cumsum(np.bincount(user[keep], minlength=num_users), out=indptr[1:])
        return cls(indptr, item[keep])

    @property
    def num_users(self) -> int:
        return len(self.indptr) - 1

    def counts(self, users: np.ndarray) -> np.ndarray:
        """How many items each of ``users`` has."""
        return self.indptr[users + 1] - self.indptr[users]

    def users_with_items(self) -> np.ndarray:
        """The users with at least one item, ascending (for held-out sets: the users to rank)."""
        return np.flatnonzero(np.diff(self.indptr))

    def entries(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, item)``: every item of ``users[row]``, row by row, for all rows of ``users``."""
        counts = self.counts(users)
        row = np.repeat(np.arange(len(users)), counts)
        first = np.repeat(self.indptr[users] - (np.cumsum(counts) - counts), counts)
        return row, self.items[first + np.arange(len(row))]

    def padded(self, users: np.ndarray) -> np.ndarray:
        """``(len(users), max count)``: each user's items, ascending, then -1."""
        counts = self.counts(users)
        out = np.full((len(users), int(counts.max(initial=0))), -1, dtype=np.int64)
        row, item = self.entries(users)
        out[row, np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)] = item
        return out


class TopK(NamedTuple):
    """What :file:`topk.npz` holds: ``users`` (U,), ``topk`` (U, K: item ids, best first, -1 past a user's last
    candidate) and ``heldout`` (U, H: each user's held-out items, ascending, padded with -1)."""

    users: np.ndarray
    topk: np.ndarray
    heldout: np.ndarray


def check_ks(ks: Iterable[int] | int, name: str = "ks") -> list[int]:
    """The list lengths K, ascending and distinct, or a ConfigError naming ``name``."""
    values = [ks] if isinstance(ks, int) else list(ks) if isinstance(ks, Iterable) and not isinstance(ks, str) else []
    if not values:
        raise ConfigError(f"{name} must be a non-empty list of integers >= 1, got {ks!r}")
    return sorted({check_int(name, k) for k in values})


def ranking_metric_names(ks: Iterable[int] | int) -> list[str]:
    """The metrics' names for list lengths ``ks``: ``hr@K`` for each K, then ``ndcg@K``, ``recall@K``, and ``mrr``."""
    ks = check_ks(ks)
    return [f"{m}@{k}" for m in AT_K for k in ks] + ["mrr"]


def negatives_key(seed: int, round_idx: int) -> int:
    """The key of the sampled negatives of evaluation round ``round_idx`` of a run seeded ``seed``: a resumed run
    draws the same ones. NCF fixes its negatives once; passing one round index every time does that."""
    return int(stream_key(check_int("seed", seed, minimum=0), "ranking.negatives",
                          check_int("round_idx", round_idx, minimum=0)))


def _checked_entries(items: UserItems, what: str, users: np.ndarray, num_items: int) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`UserItems.entries`, refusing an item outside the catalogue ``0..num_items-1`` by name."""
    row, item = items.entries(users)
    outside = np.flatnonzero((item < 0) | (item >= num_items))
    if len(outside):
        p = int(outside[0])
        raise ConfigError(f"{what} item {item[p]} of user {users[row[p]]} is outside the catalogue "
                          f"0..{num_items - 1}")
    return row, item


def _users(users: np.ndarray | Sequence[int] | Tensor, train: UserItems, heldout: UserItems) -> np.ndarray:
    """``users`` as int64, each within both sets' users and with at least one held-out item, or a ConfigError."""
    users = np.asarray(users.cpu() if isinstance(users, Tensor) else users, dtype=np.int64).reshape(-1)
    for what, items in (("training", train), ("held-out", heldout)):
        outside = np.flatnonzero((users < 0) | (users >= items.num_users))
        if len(outside):
            raise ConfigError(f"user {users[outside[0]]} is outside the {what} sets' users 0..{items.num_users - 1}")
    empty = np.flatnonzero(heldout.counts(users) == 0)
    if len(empty):
        raise ConfigError(f"user {users[empty[0]]} has no held-out item: a ranked user needs at least one")
    return users


def _masks(users: np.ndarray, train: UserItems, heldout: UserItems, num_items: int,
           device: torch.device | str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(trained, held, row, item)``: (U, I) masks of the training and held-out items of ``users`` and the held-out
    ones as (row, item) pairs by row, then id; an item outside the catalogue or a held-out item that is also a
    training item is refused by name."""
    row, item = (torch.from_numpy(v).to(device) for v in _checked_entries(train, "training", users, num_items))
    trained = torch.zeros(len(users), num_items, dtype=torch.bool, device=device)
    trained[row, item] = True
    row, item = (torch.from_numpy(v).to(device) for v in _checked_entries(heldout, "held-out", users, num_items))
    both = trained[row, item]
    if bool(both.any()):
        p = int(both.nonzero()[0, 0])
        raise ConfigError(f"held-out item {int(item[p])} of user {users[int(row[p])]} is also one of its training "
                          "items")
    held = torch.zeros_like(trained)
    held[row, item] = True
    return trained, held, row, item


def _draw(users: np.ndarray, taken: Tensor, count: int, key: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fedrec.utils.rng.keyed_sample_excluding` of ``count`` items per user, excluding its ``taken`` (U, I)."""
    row, item = taken.cpu().nonzero(as_tuple=True)  # row by row, items ascending
    indptr = np.zeros(len(users) + 1, dtype=np.int64)
    np.cumsum(np.bincount(row.numpy(), minlength=len(users)), out=indptr[1:])
    num_items = taken.shape[1]
    return keyed_sample_excluding(np.uint64(key), np.ascontiguousarray(users), indptr, item.contiguous().numpy(),
                                  num_items, min(count, num_items))  # C-contiguous: one compiled type


def sample_negatives(users: np.ndarray | Sequence[int] | Tensor, train: UserItems, heldout: UserItems,
                     num_items: int, key: int, count: int = NEGATIVES) -> tuple[np.ndarray, np.ndarray]:
    """Per user, ``count`` items drawn uniformly without replacement from the catalogue ``0..num_items-1`` less its
    training and held-out items, from the user's own stream under ``key`` (:func:`negatives_key`,
    :func:`fedrec.utils.rng.keyed_sample_excluding`): a user draws the same items in any batch or shard. Returns
    ``(items (U, count), valid (U, count))``; ``valid`` is False where a user has fewer than ``count`` such items.
    Holds (U, I) masks: the ranking functions call it batch by batch."""
    users = _users(users, train, heldout)
    trained, held, _, _ = _masks(users, train, heldout, check_int("num_items", num_items), "cpu")
    return _draw(users, trained | held, check_int("negatives", count), key)


#: compared (held-out item, item) pairs held at once when counting ranks: bounds the (entries, items) temporaries
_PAIRS = 1 << 22


class _Batch(NamedTuple):
    """One batch of ranked users: their rows of ``scores`` (NaN made -inf), which items are their candidates and
    which are held out, all (B, I), and the held-out items as (row, item) pairs by row, then id."""

    rows: slice
    scores: Tensor
    candidate: Tensor
    held: Tensor
    held_row: Tensor
    held_item: Tensor


def _batches(scores: Tensor, users: np.ndarray, train: UserItems, heldout: UserItems, negatives: int | None,
             key: int | None, batch_size: int) -> Iterator[_Batch]:
    """``users`` (rows of ``scores``) batch by batch, after checking every input."""
    if scores.ndim != 2 or scores.shape[0] != len(users):
        raise ConfigError(f"scores must be a (users, items) matrix with one row per ranked user ({len(users)}), "
                          f"got shape {tuple(scores.shape)}")
    if negatives is not None:
        negatives = check_int("negatives", negatives)
        if key is None:
            raise ConfigError("sampled negatives need a key (negatives_key(seed, round_idx))")
    batch_size = check_int("batch_size", batch_size)
    num_items, device = scores.shape[1], scores.device
    for a in range(0, len(users), batch_size):
        rows = slice(a, min(a + batch_size, len(users)))
        u = users[rows]
        trained, held, held_row, held_item = _masks(u, train, heldout, num_items, device)
        if negatives is None:
            candidate = ~trained
        else:
            sampled, valid = (torch.from_numpy(v).to(device) for v in _draw(u, trained | held, negatives, key))
            candidate = held.clone()
            candidate[torch.arange(len(u), device=device)[:, None].expand_as(sampled)[valid], sampled[valid]] = True
        s = scores[rows] if scores.is_floating_point() else scores[rows].double()
        s = torch.nan_to_num(s, nan=-math.inf, posinf=math.inf, neginf=-math.inf)
        yield _Batch(rows, s, candidate, held, held_row, held_item)


def _heldout_ranks(b: _Batch) -> tuple[Tensor, Tensor]:
    """``(row, rank)``: every held-out item of the batch, by its user's row, and its rank (1 = first) in the
    module's order: one plus the user's other candidates that score at least as high plus its held-out items
    before it (a higher score, or the same and a lower id)."""
    row = b.held_row
    own = b.scores[row, b.held_item]
    count = torch.bincount(row, minlength=len(b.held))
    slot = torch.arange(len(row), device=row.device) - (count.cumsum(0) - count)[row]  # position within its row
    by_score = torch.sort(own, descending=True, stable=True).indices
    order = by_score[torch.sort(row[by_score], stable=True).indices]  # by row, then score descending, then id
    held_before = torch.empty_like(row)
    held_before[order] = slot
    other = b.candidate & ~b.held
    others = torch.where(other, b.scores, -math.inf)  # the rest sink below every score (see the minimum below)
    num_items = others.shape[1]
    if len(row) > len(count) * math.log2(max(num_items, 2)):
        # many held-out items per user: sort each row (about I·log2(I) per user) and search it
        values = torch.full((len(count), int(count.max())), math.inf, dtype=own.dtype, device=own.device)
        values[row, slot] = own
        ahead = num_items - torch.searchsorted(torch.sort(others, dim=1).values, values)[row, slot]
    else:  # few: compare each with its user's whole row (I per held-out item), in chunks bounding the temporaries
        ahead = torch.empty_like(row)
        step = max(1, _PAIRS // max(1, num_items))
        for a in range(0, len(row), step):
            ahead[a:a + step] = torch.count_nonzero(others[row[a:a + step]] >= own[a:a + step, None], dim=1)
    # a held-out item scored -inf finds every -inf before it, the rest included: count the user's others only
    return row, 1 + torch.minimum(ahead, other.sum(1)[row]) + held_before


def _lists(b: _Batch, k: int) -> Tensor:
    """(B, k): each user's first ``k`` candidates in the module's order, -1 past its last. The items are laid out
    in the tie order (the others by id, then the held-out ones by id) and stably sorted by negated score, NaN for
    non-candidates (which torch sorts last)."""
    held = b.held
    others = (~held).cumsum(1)
    slot = torch.where(held, others[:, -1:] + held.cumsum(1), others) - 1
    ids = torch.arange(held.shape[1], device=held.device).expand_as(slot)
    order = torch.empty_like(slot).scatter_(1, slot, ids)
    key = torch.where(b.candidate, -b.scores, math.nan).gather(1, order)
    head = order.gather(1, torch.sort(key, dim=1, stable=True).indices[:, :k])
    listed = torch.arange(head.shape[1], device=head.device) < b.candidate.sum(1, keepdim=True)
    return torch.nn.functional.pad(torch.where(listed, head, -1), (0, k - head.shape[1]), value=-1)


@torch.no_grad()
def ranking_sums(scores: Tensor, users: np.ndarray | Sequence[int] | Tensor, train: UserItems, heldout: UserItems,
                 ks: Iterable[int] | int, *, negatives: int | None = None, key: int | None = None,
                 batch_size: int = BATCH_USERS) -> Tensor:
    """The sums the ranking metrics are made of, float64 ``[users, Σ per-user metric for each name of
    ranking_metric_names(ks)]``: they add up over disjoint sets of users.

    ``scores`` (U, I): row r scores every item of the catalogue for user ``users[r]``; ``train`` and ``heldout``:
    every user's training and held-out items. Full ranking by default; ``negatives=n`` ranks each user's held-out
    items against n sampled ones drawn under ``key`` (:func:`negatives_key`). A held-out item outside the catalogue
    or among the user's training items, or a user without held-out items, is refused by name."""
    ks = check_ks(ks)
    users = _users(users, train, heldout)
    device = scores.device
    ideal = (1.0 / torch.log2(torch.arange(2, ks[-1] + 2, dtype=torch.float64, device=device))).cumsum(0)
    sums = torch.zeros(1 + len(AT_K) * len(ks) + 1, dtype=torch.float64, device=device)
    for b in _batches(scores, users, train, heldout, negatives, key, batch_size):
        row, rank = _heldout_ranks(b)
        held = torch.bincount(row, minlength=len(b.held))
        zeros = torch.zeros(len(held), dtype=torch.float64, device=device)
        gain = 1.0 / torch.log2(rank.double() + 1)
        hits = [zeros.index_add(0, row, (rank <= k).double()) for k in ks]
        dcg = [zeros.index_add(0, row, gain * (rank <= k)) for k in ks]
        best = torch.full_like(held, b.scores.shape[1] + 1).scatter_reduce(0, row, rank, "amin")
        per_user = ([(h > 0).double() for h in hits] + [d / ideal[held.clamp(max=k) - 1] for d, k in zip(dcg, ks)]
                    + [h / held for h in hits] + [1.0 / best.double()])
        sums[0] += len(held)
        sums[1:] += torch.stack([v.sum() for v in per_user])
    return sums


def metrics_from_ranking_sums(sums: Tensor, ks: Iterable[int] | int) -> dict[str, float]:
    """``{name: mean over users}`` from :func:`ranking_sums` (``hr@10``, ``ndcg@10``, ``recall@10``, ..., ``mrr``);
    NaN without users."""
    n, *totals = (float(v) for v in sums)
    return {name: total / n if n else math.nan for name, total in zip(ranking_metric_names(ks), totals, strict=True)}


def ranking_metrics(scores: Tensor, users: np.ndarray | Sequence[int] | Tensor, train: UserItems, heldout: UserItems,
                    ks: Iterable[int] | int, *, negatives: int | None = None, key: int | None = None,
                    batch_size: int = BATCH_USERS) -> dict[str, float]:
    """HR@K, NDCG@K, Recall@K for each K of ``ks`` and MRR, averaged over ``users`` (:func:`ranking_sums`)."""
    return metrics_from_ranking_sums(ranking_sums(scores, users, train, heldout, ks, negatives=negatives, key=key,
                                                  batch_size=batch_size), ks)


def popularity_metrics(train: UserItems, seen: UserItems, heldout: UserItems, num_items: int,
                       ks: Iterable[int] | int, *, negatives: int | None = None,
                       key: int | None = None) -> dict[str, float]:
    """The metrics of the non-personalised baseline every model should beat: each user's candidates ranked by how
    many ``train`` interactions each item has (ties by the module's rule). ``seen`` are the items each user may not
    be recommended (for a test split: training and validation items), ``heldout`` its held-out items; ``negatives``
    and ``key`` as in :func:`ranking_metrics` (the same key, the same sampled candidates as a run's)."""
    users = heldout.users_with_items()
    counts = torch.from_numpy(np.bincount(train.items, minlength=check_int("num_items", num_items)).astype(np.float64))
    return ranking_metrics(counts[None].expand(len(users), -1), users, seen, heldout, ks, negatives=negatives,
                           key=key)


def split_popularity(data: ImplicitData, ks: Iterable[int] | int, *, negatives: int | None = None,
                     key: int | None = None) -> dict[str, float]:
    """:func:`popularity_metrics` on an implicit dataset's test split: popularity counted on its training items,
    training and validation items excluded from the candidates, as the runs rank the test split."""
    (u, i), (vu, vi) = data.train.pairs(), data.val.pairs()
    return popularity_metrics(UserItems.from_pairs(u, i, data.num_users),
                              UserItems.from_pairs(np.r_[u, vu], np.r_[i, vi], data.num_users),
                              UserItems.from_pairs(*data.test.pairs(), data.num_users), data.num_items, ks,
                              negatives=negatives, key=key)


@torch.no_grad()
def top_k(scores: Tensor, users: np.ndarray | Sequence[int] | Tensor, train: UserItems, heldout: UserItems, k: int, *,
          negatives: int | None = None, key: int | None = None, batch_size: int = BATCH_USERS) -> TopK:
    """Each user's first ``k`` candidates in the metrics' order (ties as the module says), and its held-out items:
    the lists :func:`ranking_sums` scores, as numpy arrays (:class:`TopK`)."""
    k = check_int("k", k)
    users = _users(users, train, heldout)
    out = np.full((len(users), k), -1, dtype=np.int64)
    for b in _batches(scores, users, train, heldout, negatives, key, batch_size):
        out[b.rows] = _lists(b, k).cpu().numpy()
    return TopK(users, out, heldout.padded(users))


def save_topk(path: str | Path, lists: TopK) -> Path:
    """Write ``lists`` to ``path`` (:file:`topk.npz`: arrays ``users``, ``topk``, ``heldout``) atomically."""
    return atomic_write(path, lambda f: np.savez(f, users=lists.users, topk=lists.topk, heldout=lists.heldout))


def load_topk(path: str | Path) -> TopK:
    """The lists :func:`save_topk` wrote to ``path``."""
    with np.load(path, allow_pickle=False) as f:
        return TopK(f["users"], f["topk"], f["heldout"])
