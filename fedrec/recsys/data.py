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
from fedrec.utils.jit import jit, keeping_torch_threads, parallel_variant, prange


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
    blocks: int | None = None,
) -> RoundData:
    """Group ratings by client (sorted by client, user, item). ``keep_client`` (bool per global client) drops the
    ratings of clients that do not take part. ``negatives``: sampled negatives of training positives (each triple's
    (user, positive) one of the ratings, :func:`fedrec.data.implicit.sample_negatives`), kept as pairs. ``order``:
    the ratings' :func:`entry_order` where it is known (without ``keep_client``), else it is sorted here. The arrays
    come from one compiled pass over the sorted ratings (:func:`_group_blocks`) in ``blocks`` runs of whole clients
    at once (default: torch's thread count from :data:`PARALLEL_ENTRIES` ratings on, else one); the arrays are the
    same for any ``blocks``."""
    user, item = np.asarray(user, dtype=np.int64), np.asarray(item, dtype=np.int64)
    client_of_user = np.asarray(client_of_user, dtype=np.int64)
    if keep_client is not None:
        if order is not None:
            raise ValueError("round_data: an order is of all the ratings, not of the kept clients' alone")
        keep_client = np.asarray(keep_client, dtype=bool)
        keep = keep_client[client_of_user[user]]
        user, item, rating = user[keep], item[keep], np.asarray(rating)[keep]
        if negatives is not None:
            kept = keep_client[client_of_user[negatives.user]]
            negatives = Triples(negatives.user[kept], negatives.positive[kept], negatives.negative[kept])
    num_users = len(client_of_user)
    # the (client, user, item) keys: to sort by, or to find the negatives' entries by (a given order needs neither)
    keys = None if order is not None and negatives is None else \
        _group_keys(user, item, client_of_user[user], num_users, num_items)
    if order is None:
        order = _stable_order(keys)
    pair_entry, pair_item = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if negatives is not None:  # each triple's entry, found by its (client, user, item) key among the sorted ones
        per = negatives.negative.shape[1]
        triple = _group_keys(negatives.user, negatives.positive, client_of_user[negatives.user], num_users, num_items)
        pair_entry = np.repeat(np.searchsorted(keys[order], triple), per)
        by_entry = np.argsort(pair_entry, kind="stable")
        pair_entry = pair_entry[by_entry]
        pair_item = np.asarray(negatives.negative, dtype=np.int64).reshape(-1)[by_entry]
    if blocks is None:
        blocks = torch.get_num_threads() if len(user) >= PARALLEL_ENTRIES else 1
    blocks = max(int(blocks), 1)
    args = (np.asarray(order, dtype=np.int64), user, item, np.asarray(rating, dtype=np.float32), client_of_user,
            num_items, pair_entry, pair_item, blocks)
    with keeping_torch_threads():  # the parallel variant may start numba's pool
        grouped = _group_parallel(*args) if blocks > 1 else _group(*args)
    clients, users, entry_user, entry_row, entry_rating, row_client, row_item, pair_row = grouped
    t = torch.from_numpy
    return RoundData(
        clients=t(clients),
        users=t(users),
        user_client=t(np.searchsorted(clients, client_of_user[users])),
        entry_user=t(entry_user),
        entry_row=t(entry_row),
        entry_rating=t(entry_rating),
        row_client=t(row_client),
        row_item=t(row_item),
        pair_entry=t(pair_entry),
        pair_row=t(pair_row),
    )


def _group_blocks(order: np.ndarray, user: np.ndarray, item: np.ndarray, rating: np.ndarray,
                  client_of_user: np.ndarray, num_items: int, pair_entry: np.ndarray, pair_item: np.ndarray,
                  blocks: int) -> tuple[np.ndarray, ...]:  # pragma: no cover - compiled
    """:func:`round_data`'s arrays from the ratings' ``order`` (by client, user, item), in one pass over the sorted
    entries cut into ``blocks`` runs of whole clients (each its own thread in the parallel variant; the arrays do not
    depend on ``blocks``): ``(clients, users, entry_user, entry_row, entry_rating, row_client, row_item, pair_row)``.
    A client's rows are the distinct items of its entries and of its pairs (``pair_entry`` non-decreasing, so a
    client's pairs are a run too), in increasing item order, so the rows are sorted by (client, item); the clients
    and users are those present, by id. A block writes its rows from its first entry's and pair's position on (it
    has no more rows than entries and pairs), and a second pass moves them into place."""
    n, m = len(order), len(pair_entry)
    num_clients = client_of_user.max() + 1 if len(client_of_user) else 0
    present = np.zeros(len(client_of_user), dtype=np.bool_)
    for e in prange(n):  # every write stores True: the order of the writes does not matter
        present[user[e]] = True
    users = np.flatnonzero(present)
    position = np.zeros(len(client_of_user), dtype=np.int64)
    for s in range(len(users)):
        position[users[s]] = s
    start = np.empty(blocks + 1, dtype=np.int64)  # block b holds entries start[b]:start[b + 1], whole clients
    start[0], start[blocks] = 0, n
    for b in range(1, blocks):
        k = max(b * n // blocks, start[b - 1])
        while 0 < k < n and client_of_user[user[order[k]]] == client_of_user[user[order[k - 1]]]:
            k += 1
        start[b] = k
    pair_start = np.searchsorted(pair_entry, start)  # its pairs: those of its entries
    entry_user, entry_row = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    entry_rating, entry_item = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.int64)
    pair_row = np.empty(m, dtype=np.int64)
    held_client, held_item = np.empty(n + m, dtype=np.int64), np.empty(n + m, dtype=np.int64)
    has = np.zeros(num_clients, dtype=np.bool_)
    block_rows = np.zeros(blocks, dtype=np.int64)
    for b in prange(blocks):
        stamp = np.full(num_items, -1, dtype=np.int64)  # the last client that has item i among its rows
        row_of = np.empty(num_items, dtype=np.int64)  # item i's row in that client, counted from the block's first
        distinct = np.empty(num_items, dtype=np.int64)
        k, p, rows, base = start[b], pair_start[b], 0, start[b] + pair_start[b]
        while k < start[b + 1]:
            client = client_of_user[user[order[k]]]
            end = k
            while end < start[b + 1]:
                e = order[end]
                u = user[e]
                if client_of_user[u] != client:
                    break
                entry_user[end], entry_rating[end], entry_item[end] = position[u], rating[e], item[e]
                end += 1
            pair_end = p
            while pair_end < m and pair_entry[pair_end] < end:
                pair_end += 1
            d, ordered = 0, True  # the client's distinct items, its entries' then its pairs', each once
            for t in range(k, end + pair_end - p):
                i = entry_item[t] if t < end else pair_item[t - end + p]
                if stamp[i] != client:
                    stamp[i] = client
                    ordered = ordered and (d == 0 or distinct[d - 1] < i)
                    distinct[d] = i
                    d += 1
            if not ordered:  # several users' items interleave (one user's are increasing): sort them, or where they
                if 64 * d > num_items:  # are many, read them off the stamps in item order (a pass over the items)
                    d = 0
                    for i in range(num_items):
                        if stamp[i] == client:
                            distinct[d] = i
                            d += 1
                else:
                    distinct[:d].sort()
            for j in range(d):
                row_of[distinct[j]] = rows + j
                held_client[base + rows + j], held_item[base + rows + j] = client, distinct[j]
            for j in range(k, end):
                entry_row[j] = row_of[entry_item[j]]
            for j in range(p, pair_end):
                pair_row[j] = row_of[pair_item[j]]
            has[client] = True
            rows, k, p = rows + d, end, pair_end
        block_rows[b] = rows
    clients = np.flatnonzero(has)
    local = np.empty(num_clients, dtype=np.int64)
    for c in range(len(clients)):
        local[clients[c]] = c
    row_start = np.zeros(blocks + 1, dtype=np.int64)
    row_start[1:] = np.cumsum(block_rows)
    row_client, row_item = np.empty(row_start[blocks], dtype=np.int64), np.empty(row_start[blocks], dtype=np.int64)
    for b in prange(blocks):  # the blocks' rows into place, and their row indices counted from the first row
        base, first = start[b] + pair_start[b], row_start[b]
        for j in range(block_rows[b]):
            row_client[first + j], row_item[first + j] = local[held_client[base + j]], held_item[base + j]
        for j in range(start[b], start[b + 1]):
            entry_row[j] += first
        for j in range(pair_start[b], pair_start[b + 1]):
            pair_row[j] += first
    return clients, users, entry_user, entry_row, entry_rating, row_client, row_item, pair_row


#: one block, and blocks of whole clients over torch's threads for a round of at least :data:`PARALLEL_ENTRIES`
#: ratings (the same arrays; the parallel one is compiled only when a round that large is grouped)
_group, _group_parallel = jit(_group_blocks), jit(parallel_variant(_group_blocks), parallel=True)
PARALLEL_ENTRIES = 1 << 18


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
