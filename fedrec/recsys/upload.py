"""Upload assembly (steps ① and ③ of the round): what each client sends besides its trained update.

A client's upload is its ω update and one row per uploaded item: its real items' rows and, for FedGNN's
pseudo-interacted items (Wu et al.), synthesised rows that look like real ones. :func:`sample_pseudo_items` draws
the pseudo items and :func:`upload_item_ids` / :func:`upload_matrix` give the item ids X^t (known before the
round's budget is set); after privatisation, :func:`assemble_uploads` appends the pseudo rows
(:func:`pseudo_item_rows`) and shuffles every client's rows (:func:`upload_order`), so that neither position nor
order tells real items from pseudo ones. Every draw comes from the client's own stream under the round's key, so a
client draws the same in any shard.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.recsys.aggregate import Uploads
from fedrec.recsys.data import RoundData
from fedrec.utils.jit import jit
from fedrec.utils.rng import KeyedRows, keyed_group_shuffle, keyed_sample_excluding


def sample_pseudo_items(data: RoundData, num_items: int, count: int, key: int) -> tuple[Tensor, Tensor]:
    """``count`` items per client drawn uniformly without replacement from the items it has no rating of this
    round, from the client's own stream under ``key`` (:func:`fedrec.utils.rng.keyed_sample_excluding`), so a client
    draws the same items in any shard. Returns ``(items (C, count), valid (C, count))``; ``valid`` is False where a
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


def upload_matrix(data: RoundData, pseudo: Tensor, valid: Tensor, num_clients: int, num_items: int) -> Any:
    """X^t as a float64 ``scipy.sparse.csr_matrix`` (``num_clients`` × ``num_items``, 0/1): the items each client
    of ``data`` uploads, real and (``valid``) pseudo. Each row's item ids are stored sorted, so the matrix is the
    set of uploaded ids and nothing more."""
    import scipy.sparse as sp

    indptr, ids = upload_item_ids(data, pseudo, valid, num_clients)
    X = sp.csr_matrix((np.ones(len(ids)), ids, indptr), shape=(num_clients, num_items))
    X.has_sorted_indices = True
    return X


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
    draw = KeyedRows(key, clients.cpu().numpy()).tensor("normal", shape[1] * shape[2], device)  # drawn on the device
    out = mean.view(-1, 1, 1) + std.view(-1, 1, 1) * draw.view(shape)
    return (out * valid.to(device).unsqueeze(-1)).to(rows.dtype)


def upload_order(row_client: Tensor, clients: Tensor, key: int) -> Tensor:
    """A permutation of upload rows that groups them by client (in client order) and puts each client's rows in a
    uniformly random order, independently across clients, so a row's position in an upload says nothing about it.

    The rows are grouped stably by client, then each client's group is shuffled by Fisher–Yates on the client's
    stream under ``key`` (:func:`fedrec.utils.rng.keyed_group_shuffle`): the same order in any shard.
    """
    rc = row_client.numpy()
    order = np.argsort(rc, kind="stable")
    indptr = np.zeros(clients.numel() + 1, dtype=np.int64)
    np.cumsum(np.bincount(rc, minlength=clients.numel()), out=indptr[1:])
    keyed_group_shuffle(np.uint64(key), clients.numpy(), indptr, order)
    return torch.from_numpy(order)


def upload_scalars(data: RoundData, valid: Tensor, num_shared: int, dim: int) -> Tensor:
    """``(C,)``: the scalars each client of ``data`` uploads: ω's ``num_shared``, and its real and (``valid``) pseudo
    rows of ``dim`` values, each with its item id."""
    return num_shared + (data.rows_per_client() + valid.sum(1)) * (dim + 1)


def assemble_uploads(data: RoundData, shared: Tensor, rows: Tensor, pseudo: Tensor, valid: Tensor, rows_key: int,
                     order_key: int, private: bool) -> Uploads:
    """What the clients of ``data`` send: ω ``shared`` ``(C, P)``, and their real item ``rows`` (privatised, if
    ``private``) with the pseudo rows of ``pseudo`` (``valid``) appended and every client's rows shuffled, so real
    rows are not told apart by position. Rating counts go along only when not ``private`` (under DP they are
    private: only the uploaded item ids are seen)."""
    fake = pseudo_item_rows(rows.detach(), data.row_client, data.clients, valid, rows_key)
    pc = torch.arange(data.num_clients).unsqueeze(1).expand_as(pseudo)[valid]
    row_client = torch.cat([data.row_client, pc])
    order = upload_order(row_client, data.clients, order_key)
    return Uploads(
        clients=data.clients,
        shared=shared,
        row_client=row_client[order],
        row_item=torch.cat([data.row_item, pseudo[valid]])[order],
        rows=torch.cat([rows, fake[valid]])[order],
        num_ratings=None if private else data.ratings_per_client(),
    )
