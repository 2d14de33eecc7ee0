"""A round's training data (step ① of the round): every participating client's ratings, flat and grouped by client.

:class:`RoundData` holds one entry per rating and one *row* per (client, item) pair, i.e. per item-embedding row the
client uploads; a client may hold several users (ML-1M); under an implicit-feedback objective it also holds the round's
sampled negatives, each paired with a training entry, whose items are rows of the upload too. :func:`round_data` builds
it from the ratings streamed so far, and :func:`shard_bounds` / :func:`shard` cut it into the contiguous client ranges
the processes of a sharded run compute (:meth:`RoundData.select`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrec.data.implicit import Triples
from fedrec.models.recommender import Neighbours


@dataclass(frozen=True)
class RoundData:
    """One round's training ratings of the participating clients, flat.

    ``clients`` are global client ids; every other index is local: ``user_client`` and ``row_client`` index
    ``clients``, ``entry_user`` indexes ``users``, ``entry_row`` and ``pair_row`` index the rows, ``pair_entry``
    the entries. A *row* is one (client, item) pair, i.e. one item-embedding row the client uploads; entries of two
    users of one client on the same item share a row. A *pair* is a sampled negative item of the user of entry
    ``pair_entry`` (BPR's j for the entry's positive i), sorted by entry; none under the RMSE objective.
    """

    clients: Tensor  # (C,) global client ids, increasing
    users: Tensor  # (S,) global user ids
    user_client: Tensor  # (S,)
    entry_user: Tensor  # (E,)
    entry_row: Tensor  # (E,)
    entry_rating: Tensor  # (E,) float32 in [0, 1]
    row_client: Tensor  # (R,)
    row_item: Tensor  # (R,) global item ids
    pair_entry: Tensor  # (N,) the training entry each sampled negative pairs with, non-decreasing
    pair_row: Tensor  # (N,) the negative item's row
    neighbours: Neighbours | None = None  # per entry, graph expansion's

    @property
    def num_clients(self) -> int:
        return int(self.clients.numel())

    @property
    def entry_client(self) -> Tensor:
        return self.user_client[self.entry_user]

    def ratings_per_client(self) -> Tensor:
        return torch.bincount(self.entry_client, minlength=self.num_clients)

    def rows_per_client(self) -> Tensor:
        return torch.bincount(self.row_client, minlength=self.num_clients)

    def to(self, device: torch.device | str) -> RoundData:
        """The same data on ``device`` (itself when it is there already)."""
        if self.clients.device == torch.device(device):
            return self
        return RoundData(**{f: getattr(self, f) if getattr(self, f) is None else getattr(self, f).to(device)
                            for f in self.__dataclass_fields__})

    def select(self, lo: int, hi: int) -> RoundData:
        """The data of clients ``clients[lo:hi]`` alone (a shard), with local indices renumbered: entries and rows
        are sorted by client, so theirs are slices; each client's rows keep their order."""
        bounds = torch.tensor([lo, hi], device=self.clients.device)
        e0, e1 = (int(v) for v in torch.searchsorted(self.entry_client, bounds))
        r0, r1 = (int(v) for v in torch.searchsorted(self.row_client, bounds))
        n0, n1 = (int(v) for v in torch.searchsorted(self.pair_entry, torch.tensor([e0, e1], device=bounds.device)))
        keep = (self.user_client >= lo) & (self.user_client < hi)
        new_user = torch.cumsum(keep.long(), 0) - 1
        return RoundData(
            clients=self.clients[lo:hi],
            users=self.users[keep],
            user_client=self.user_client[keep] - lo,
            entry_user=new_user[self.entry_user[e0:e1]],
            entry_row=self.entry_row[e0:e1] - r0,
            entry_rating=self.entry_rating[e0:e1],
            row_client=self.row_client[r0:r1] - lo,
            row_item=self.row_item[r0:r1],
            pair_entry=self.pair_entry[n0:n1] - e0,
            pair_row=self.pair_row[n0:n1] - r0,
            neighbours=None if self.neighbours is None else self.neighbours.select(e0, e1),
        )


def _unique_inverse(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, bound)``: by a table over the key range when it is
    small next to the keys (linear time), else by sorting (torch's, about three times numpy's speed on a round of
    MovieLens-10M's size)."""
    if bound > 8 * len(keys) + 4096:
        unique, inverse = torch.unique(torch.from_numpy(keys), return_inverse=True)
        return unique.numpy(), inverse.numpy()
    present = np.bincount(keys, minlength=bound) > 0
    unique = np.flatnonzero(present)
    position = np.cumsum(present) - 1
    return unique, position[keys]


def _group_keys(user: np.ndarray, item: np.ndarray, client: np.ndarray, num_users: int, num_items: int) -> np.ndarray:
    """Each rating's (client, user, item) as one number, which orders the ratings as a round groups them."""
    return (client * num_users + user) * num_items + np.asarray(item, dtype=np.int64)


def _stable_order(key: np.ndarray) -> np.ndarray:
    """The stable order that sorts ``key`` (torch's sort: about twice numpy's speed)."""
    return torch.sort(torch.from_numpy(key), stable=True).indices.numpy()


def entry_order(user: np.ndarray, item: np.ndarray, client_of_user: np.ndarray, num_items: int,
                previous: np.ndarray | None = None) -> np.ndarray:
    """The stable order that sorts ratings by client, user and item (:func:`round_data`'s). ``previous``: this order
    of the first ``len(previous)`` ratings (an earlier round's, whose ratings these extend): only the ratings past
    them are sorted, and merged in, which gives the same order (equal keys keep their index order)."""
    user = np.asarray(user, dtype=np.int64)
    client_of_user = np.asarray(client_of_user, dtype=np.int64)
    key = _group_keys(user, item, client_of_user[user], len(client_of_user), num_items)
    if previous is None:
        return _stable_order(key)
    done = len(previous)
    new = np.argsort(key[done:], kind="stable") + done
    # after the equal keys already placed, as a stable sort of all would put them
    return np.insert(previous, np.searchsorted(key[previous], key[new], side="right"), new)


def round_data(
    user: np.ndarray, item: np.ndarray, rating: np.ndarray, client_of_user: np.ndarray, num_items: int,
    keep_client: np.ndarray | None = None, negatives: Triples | None = None, order: np.ndarray | None = None,
) -> RoundData:
    """Group ratings by client (sorted by client, user, item). ``keep_client`` (bool per global client) drops the
    ratings of clients that do not take part. ``negatives``: sampled negatives of training positives (each triple's
    (user, positive) one of the ratings, :func:`fedrec.data.implicit.sample_negatives`), kept as pairs. ``order``:
    the ratings' :func:`entry_order` where it is known (without ``keep_client``), else it is sorted here."""
    user = np.asarray(user, dtype=np.int64)
    client = np.asarray(client_of_user, dtype=np.int64)[user]
    if keep_client is not None:
        if order is not None:
            raise ValueError("round_data: an order is of all the ratings, not of the kept clients' alone")
        keep = np.asarray(keep_client, dtype=bool)[client]
        user, item, rating, client = user[keep], np.asarray(item)[keep], np.asarray(rating)[keep], client[keep]
        if negatives is not None:
            kept = np.asarray(keep_client, dtype=bool)[np.asarray(client_of_user)[negatives.user]]
            negatives = Triples(negatives.user[kept], negatives.positive[kept], negatives.negative[kept])
    item = np.asarray(item, dtype=np.int64)
    num_users = len(client_of_user)
    if order is None:
        order = _stable_order(_group_keys(user, item, client, num_users, num_items))
    user, item, client = user[order], item[order], client[order]
    first = np.r_[True, client[1:] != client[:-1]] if len(client) else np.zeros(0, dtype=bool)
    clients, entry_client = client[first], np.cumsum(first) - 1  # clients are sorted: their runs give the ids
    users = np.flatnonzero(np.bincount(user, minlength=num_users))  # the users present, by id
    position = np.zeros(num_users, dtype=np.int64)
    position[users] = np.arange(len(users))
    entry_user = position[user]
    row_keys = entry_client * num_items + item
    pair_entry = np.zeros(0, dtype=np.int64)
    if negatives is not None:  # each triple's entry, found by its (client, user, item) key among the sorted ones
        per = negatives.negative.shape[1]
        triple = _group_keys(negatives.user, negatives.positive,
                             np.asarray(client_of_user, dtype=np.int64)[negatives.user], num_users, num_items)
        pair_entry = np.repeat(np.searchsorted(_group_keys(user, item, client, num_users, num_items), triple), per)
        by_entry = np.argsort(pair_entry, kind="stable")
        pair_entry = pair_entry[by_entry]
        row_keys = np.concatenate([row_keys, entry_client[pair_entry] * num_items
                                   + negatives.negative.reshape(-1)[by_entry]])
    rows, row_index = _unique_inverse(row_keys, len(clients) * num_items)
    entry_row, pair_row = row_index[:len(item)], row_index[len(item):]
    t = torch.from_numpy
    return RoundData(
        clients=t(clients),
        users=t(users),
        user_client=t(np.searchsorted(clients, np.asarray(client_of_user, dtype=np.int64)[users])),
        entry_user=t(entry_user.reshape(-1)),
        entry_row=t(entry_row.reshape(-1)),
        entry_rating=t(np.asarray(rating, dtype=np.float32)[order]),
        row_client=t(rows // num_items),
        row_item=t(rows % num_items),
        pair_entry=t(pair_entry),
        pair_row=t(pair_row.reshape(-1)),
    )



def shard_bounds(data: RoundData, world_size: int, pseudo_items: int) -> list[tuple[int, int]]:
    """Each process's clients of ``data``: ``world_size`` contiguous ranges of its clients with about equal work,
    counted as ratings (the local graphs) plus uploaded rows, real and (``pseudo_items`` per client) pseudo."""
    if world_size == 1:
        return [(0, data.num_clients)]
    cum = torch.cumsum(data.ratings_per_client() + data.rows_per_client() + pseudo_items, 0)
    total = int(cum[-1]) if data.num_clients else 0
    cuts = [0, *(int(torch.searchsorted(cum, total * r // world_size)) for r in range(1, world_size)),
            data.num_clients]
    cuts = [min(max(c, lo), data.num_clients) for c, lo in zip(cuts, [0] + cuts[:-1])]
    return list(zip(cuts[:-1], cuts[1:]))


def shard(data: RoundData, bounds: list[tuple[int, int]], rank: int) -> tuple[RoundData, int, int]:
    """Process ``rank``'s part of ``data`` (of ``bounds``, :func:`shard_bounds`) and its client range."""
    lo, hi = bounds[rank]
    return (data if (lo, hi) == (0, data.num_clients) else data.select(lo, hi)), lo, hi
