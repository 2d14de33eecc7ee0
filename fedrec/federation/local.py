"""The client side of a federated recommendation round, computed for all clients together.

:class:`RoundData` holds a round's training ratings flat (one entry per rating) and grouped by client; a client
may hold several users (ML-1M). :func:`local_updates` differentiates every client's loss with respect to its own
copy of the shared parameters ω, its users' rows and its item rows in one backward pass: the copies are separate
leaves, so the gradient of the *sum* of client losses with respect to a client's copy is that client's gradient.
:func:`sample_pseudo_items` and :func:`pseudo_item_rows` add FedGNN's pseudo-interacted items (spec §1.2), and
:func:`upload_order` shuffles each client's uploaded rows so their positions do not tell real items from pseudo ones.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrec.jit import jit
from fedrec.models.recommender import FederatedRecommender
from fedrec.rng import KeyedRows, keyed_group_shuffle, keyed_sample_excluding


@dataclass(frozen=True)
class RoundData:
    """One round's training ratings of the participating clients, flat.

    ``clients`` are global client ids; every other index is local: ``user_client`` and ``row_client`` index
    ``clients``, ``entry_user`` indexes ``users``, ``entry_row`` indexes the rows. A *row* is one (client, item)
    pair, i.e. one item-embedding row the client uploads; entries of two users of one client on the same item
    share a row.
    """

    clients: Tensor  # (C,) global client ids, increasing
    users: Tensor  # (S,) global user ids
    user_client: Tensor  # (S,)
    entry_user: Tensor  # (E,)
    entry_row: Tensor  # (E,)
    entry_rating: Tensor  # (E,) float32 in [0, 1]
    row_client: Tensor  # (R,)
    row_item: Tensor  # (R,) global item ids

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
        return RoundData(**{f: getattr(self, f).to(device) for f in self.__dataclass_fields__})

    def select(self, lo: int, hi: int) -> RoundData:
        """The data of clients ``clients[lo:hi]`` alone (a shard), with local indices renumbered: entries and rows
        are sorted by client, so theirs are slices; each client's rows keep their order."""
        e0, e1 = (int(v) for v in torch.searchsorted(self.entry_client, torch.tensor([lo, hi])))
        r0, r1 = (int(v) for v in torch.searchsorted(self.row_client, torch.tensor([lo, hi])))
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
        )


def _unique_inverse(keys: np.ndarray, bound: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_inverse=True)`` for keys in ``[0, bound)``: by a table over the key range when it is
    small next to the keys (linear time), else by sorting."""
    if bound > 8 * len(keys) + 4096:
        return np.unique(keys, return_inverse=True)
    present = np.bincount(keys, minlength=bound) > 0
    unique = np.flatnonzero(present)
    position = np.cumsum(present) - 1
    return unique, position[keys]


def round_data(
    user: np.ndarray, item: np.ndarray, rating: np.ndarray, client_of_user: np.ndarray, num_items: int,
    keep_client: np.ndarray | None = None,
) -> RoundData:
    """Group ratings by client (sorted by client, user, item). ``keep_client`` (bool per global client) drops the
    ratings of clients that do not take part."""
    user = np.asarray(user, dtype=np.int64)
    client = np.asarray(client_of_user, dtype=np.int64)[user]
    if keep_client is not None:
        keep = np.asarray(keep_client, dtype=bool)[client]
        user, item, rating, client = user[keep], np.asarray(item)[keep], np.asarray(rating)[keep], client[keep]
    item = np.asarray(item, dtype=np.int64)
    num_users = len(client_of_user)
    key = torch.from_numpy((client * num_users + user) * num_items + item)  # (client, user, item) as one number
    order = torch.sort(key, stable=True).indices.numpy()  # torch's stable sort: about twice numpy's speed
    user, item, client = user[order], item[order], client[order]
    first = np.r_[True, client[1:] != client[:-1]] if len(client) else np.zeros(0, dtype=bool)
    clients, entry_client = client[first], np.cumsum(first) - 1  # clients are sorted: their runs give the ids
    users = np.flatnonzero(np.bincount(user, minlength=num_users))  # the users present, by id
    position = np.zeros(num_users, dtype=np.int64)
    position[users] = np.arange(len(users))
    entry_user = position[user]
    rows, entry_row = _unique_inverse(entry_client * num_items + item, len(clients) * num_items)
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
    )


@dataclass
class LocalUpdates:
    """Every client's update: a gradient (one local step) or the pseudo-gradient ``(start − end) / lr`` of
    ``local_steps`` SGD steps, which is the gradient itself when ``local_steps == 1``."""

    shared: dict[str, Tensor]  # ω, each with a leading C
    rows: Tensor  # (R, k) item rows
    users: Tensor  # (S, k) user rows (stay on the client)
    loss: Tensor  # (C,) each client's loss before its local steps


def client_losses(
    model: FederatedRecommender, data: RoundData, shared: dict[str, Tensor], users: Tensor, rows: Tensor
) -> Tensor:
    """Each client's RMSE over its ratings, ``sqrt(mean (ŷ − y)²)`` (the authors' loss), given per-client ω
    copies (leading C, or shared), user rows ``(S, k)`` and item rows ``(R, k)``."""
    base = model.shared_parameters()
    per_user = {n: (v[data.user_client] if v.dim() > base[n].dim() else v) for n, v in shared.items()}
    item_vecs = rows[data.entry_row]
    h = model.represent(per_user, users, item_vecs, data.entry_user)
    pred = torch.sigmoid((h[data.entry_user] * item_vecs).sum(-1))
    sq = (pred - data.entry_rating.to(pred.dtype)) ** 2
    entry_client = data.entry_client
    sse = torch.zeros(data.num_clients, dtype=sq.dtype, device=sq.device).index_add(0, entry_client, sq)
    count = torch.bincount(entry_client, minlength=data.num_clients).to(sq.dtype)
    mse = sse / count
    # sqrt has an infinite slope at 0: a client predicted perfectly (sigmoid saturated at a rating of exactly
    # 1) would send inf/NaN gradients; its loss is at its minimum, so its gradient is 0
    positive = mse > 0
    return torch.where(positive, torch.sqrt(torch.where(positive, mse, torch.ones_like(mse))), torch.zeros_like(mse))


def local_updates(
    model: FederatedRecommender, data: RoundData, local_steps: int = 1, local_lr: float = 0.05
) -> LocalUpdates:
    """The updates of all participating clients, computed together (see the module docstring)."""
    C = data.num_clients
    start_shared = {n: p.detach().expand(C, *p.shape).clone() for n, p in model.shared_parameters().items()}
    start_users = model.user_emb.detach()[data.users]
    start_rows = model.item_emb.detach()[data.row_item]
    shared = {n: v.clone() for n, v in start_shared.items()}
    users, rows = start_users.clone(), start_rows.clone()
    first_loss = None
    for _ in range(local_steps):
        leaves = [*shared.values(), users, rows]
        for leaf in leaves:
            leaf.requires_grad_(True)
        loss = client_losses(model, data, shared, users, rows)
        grads = torch.autograd.grad(loss.sum(), leaves)
        if first_loss is None:
            first_loss = loss.detach()
        if local_steps == 1:
            return LocalUpdates(dict(zip(shared, grads[:-2])), grads[-1], grads[-2], first_loss)
        with torch.no_grad():
            shared = {n: v - local_lr * g for (n, v), g in zip(shared.items(), grads)}
            users = users - local_lr * grads[-2]
            rows = rows - local_lr * grads[-1]
    with torch.no_grad():
        return LocalUpdates(
            {n: (start_shared[n] - v) / local_lr for n, v in shared.items()},
            (start_rows - rows) / local_lr,
            (start_users - users) / local_lr,
            first_loss,
        )


def sample_pseudo_items(data: RoundData, num_items: int, count: int, key: int) -> tuple[Tensor, Tensor]:
    """``count`` items per client drawn uniformly without replacement from the items it has no rating of this
    round, from the client's own stream under ``key`` (:func:`fedrec.rng.keyed_sample_excluding`), so a client draws
    the same items in any shard. Returns ``(items (C, count), valid (C, count))``; ``valid`` is False where a
    client has fewer than ``count`` such items."""
    count = min(count, num_items)
    indptr = np.zeros(data.num_clients + 1, dtype=np.int64)
    np.cumsum(data.rows_per_client().numpy(), out=indptr[1:])
    items, valid = keyed_sample_excluding(np.uint64(key), data.clients.numpy(), indptr, data.row_item.numpy(),
                                          num_items, count)
    return torch.from_numpy(items), torch.from_numpy(valid)


def upload_item_ids(data: RoundData, pseudo: Tensor, valid: Tensor, num_clients: int) -> tuple[np.ndarray, np.ndarray]:
    """The item ids each client uploads this round, real and (``valid``) pseudo, as CSR ``(indptr, ids)`` over all
    ``num_clients`` global clients, each row's ids ascending: the pattern of BGTplanner's X^t. One merge per client
    of its real items (ascending in ``data``) with its sorted pseudo ones (which differ from them)."""
    rows = data.rows_per_client().numpy()
    counts = np.zeros(num_clients + 1, dtype=np.int64)
    counts[data.clients.numpy() + 1] = rows + valid.numpy().sum(1)
    index = np.int32 if counts.sum() < 2 ** 31 else np.int64  # scipy's: csr_matrix then takes the arrays as they are
    indptr = np.cumsum(counts).astype(index)
    row_start = np.zeros(data.num_clients + 1, dtype=np.int64)
    np.cumsum(rows, out=row_start[1:])
    absent = np.iinfo(np.int64).max
    pseudo_sorted = np.sort(np.where(valid.numpy(), pseudo.numpy(), absent), axis=1)
    ids = np.empty(int(indptr[-1]), dtype=index)
    _merge_upload_ids(data.clients.numpy(), row_start, data.row_item.numpy(), pseudo_sorted, absent, indptr, ids)
    return indptr, ids


@jit
def _merge_upload_ids(clients: np.ndarray, row_start: np.ndarray, row_item: np.ndarray, pseudo: np.ndarray,
                      absent: int, indptr: np.ndarray, ids: np.ndarray) -> None:  # pragma: no cover - compiled
    """Write each client's real items (``row_item[row_start[c]:row_start[c + 1]]``, ascending) merged with its
    pseudo items (row ``c`` of ``pseudo``: ascending, then ``absent``) into row ``clients[c]`` of ``indptr``."""
    width = pseudo.shape[1]
    for c in range(len(clients)):
        r, r_end, q = row_start[c], row_start[c + 1], 0
        for out in range(indptr[clients[c]], indptr[clients[c] + 1]):  # branch-free: the runs interleave at random
            a = row_item[r] if r < r_end else absent
            b = pseudo[c, q] if q < width else absent
            take_real = a < b
            ids[out] = a if take_real else b
            r += take_real
            q += 1 - take_real


def pseudo_item_rows(rows: Tensor, row_client: Tensor, clients: Tensor, valid: Tensor, key: int) -> Tensor:
    """FedGNN's synthesised gradient rows for pseudo items: i.i.d. ``N(mean, std)`` of the non-zero entries of
    the client's real item rows ``rows`` (whatever the client uploads for them), so pseudo rows look like real
    ones; client ``clients[c]`` draws from its own stream under ``key``. Returns ``(C, count, k)``, zero where not
    ``valid``."""
    num_clients, device = clients.numel(), rows.device
    flat = rows.reshape(rows.shape[0], -1).double()
    nz = (flat != 0).double()
    row_client = row_client.to(device)
    n = torch.zeros(num_clients, dtype=torch.float64, device=device).index_add(0, row_client, nz.sum(1))
    s1 = torch.zeros(num_clients, dtype=torch.float64, device=device).index_add(0, row_client, flat.sum(1))
    s2 = torch.zeros(num_clients, dtype=torch.float64, device=device).index_add(0, row_client, (flat * flat).sum(1))
    mean = s1 / n.clamp_min(1)
    std = (s2 / n.clamp_min(1) - mean * mean).clamp_min(0).sqrt()
    shape = (num_clients, valid.shape[1], rows.shape[-1])
    draw = torch.from_numpy(KeyedRows(key, clients.cpu().numpy()).draw("normal", shape[1] * shape[2]))
    out = mean.view(-1, 1, 1) + std.view(-1, 1, 1) * draw.view(shape).to(device)
    return (out * valid.to(device).unsqueeze(-1)).to(rows.dtype)


def upload_order(row_client: Tensor, clients: Tensor, key: int) -> Tensor:
    """A permutation of upload rows that groups them by client (in client order) and puts each client's rows in a
    uniformly random order, independently across clients, so a row's position in an upload says nothing about it.

    The rows are grouped stably by client, then each client's group is shuffled by Fisher–Yates on the client's
    stream under ``key`` (:func:`fedrec.rng.keyed_group_shuffle`): the same order in any shard.
    """
    rc = row_client.numpy()
    order = np.argsort(rc, kind="stable")
    indptr = np.zeros(clients.numel() + 1, dtype=np.int64)
    np.cumsum(np.bincount(rc, minlength=clients.numel()), out=indptr[1:])
    keyed_group_shuffle(np.uint64(key), clients.numpy(), indptr, order)
    return torch.from_numpy(order)
