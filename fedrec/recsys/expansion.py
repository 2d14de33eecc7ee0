"""FedGNN's privacy-preserving user–item graph expansion (Wu et al. 2021, "FedGNN", §3.4) as a step of the round.

Every ``every`` rounds, before local training (``task.expansion``):

1. every user holding training ratings sends a third-party server each of its item ids encrypted under a key that
   all clients share and the server does not hold, with its user vector (the first ``model.embed_dim`` columns of
   its row). The encryption is simulated by a keyed hash, HMAC-SHA256 truncated to 64 bits under a key drawn per
   expansion (the authors sign ids with RSA for the same purpose): equal ids give equal hashes, so the server can
   match them without learning which items they are;
2. the server groups the messages by hash and, for every (user, hashed item), picks up to ``K`` other users who
   sent the same hash, at random (keyed per round), and returns their vectors to the user without their identities
   (:func:`server_match` sees only hashes and the senders' pseudonyms);
3. the user knows which of its items each hash stands for, so its local graph becomes user–item–user: the model
   (``FedGNN`` with ``expansion=True``) represents each rated item from the user and those neighbours.

The vectors are a snapshot taken at the expansion and reach the model as constants of the local graph, without
gradient, as the neighbour embeddings are an input of FedPerGNN's model; ratings that arrive between expansions
have no neighbours until the next one. The messages are counted in the ledger, to and from the role
``expansion_server``. They are not covered by client DP (the threat-model page says what each party learns).
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_int
from fedrec.federation.channel import Channel
from fedrec.models.recommender import Neighbours
from fedrec.recsys.data import RoundData
from fedrec.utils.jit import jit
from fedrec.utils.rng import substream, uniform

#: the ledger role of the third-party server that matches hashes
ROLE = "expansion_server"
#: a hash is 64 bits, two of the ledger's 4-byte scalars
HASH_SCALARS = 2


def keyed_hashes(key: int, num_items: int) -> np.ndarray:
    """``(num_items,)`` int64: every item id's HMAC-SHA256 under ``key`` (a client secret), truncated to 64 bits."""
    secret = int(key).to_bytes(8, "little")
    return np.array([int.from_bytes(hmac.new(secret, i.to_bytes(8, "little"), hashlib.sha256).digest()[:8],
                                    "little", signed=True) for i in range(num_items)], dtype=np.int64)


@jit
def _pick_others(key: np.uint64, first: np.ndarray, size: np.ndarray, position: np.ndarray, members: np.ndarray,
                 count: int) -> np.ndarray:
    """For every message ``e`` (sorted by hash), up to ``count`` distinct other members of its hash group
    ``members[first[e]:first[e] + size[e]]`` (all of them when there are few enough, else drawn uniformly by
    rejection from message e's stream); ``-1`` pads."""
    m = position.shape[0]
    out = np.full((m, count), -1, dtype=np.int64)
    for e in range(m):
        lo, n, p = first[e], size[e], position[e]
        others = n - 1
        if others <= count:
            k = 0
            for j in range(n):
                if j != p:
                    out[e, k] = members[lo + j]
                    k += 1
            continue
        state = substream(key, np.int64(e))
        k, c = 0, 0
        while k < count:
            j = min(np.int64(uniform(state, c) * others), others - 1)
            c += 1
            if j >= p:  # skip the message's own sender
                j += 1
            fresh = True
            for q in range(k):
                if out[e, q] == members[lo + j]:
                    fresh = False
                    break
            if fresh:
                out[e, k] = members[lo + j]
                k += 1
    return out


def server_match(sender: np.ndarray, hashed: np.ndarray, count: int, key: int) -> np.ndarray:
    """The third-party server's step: for every message (``sender`` pseudonym, ``hashed`` item), up to ``count``
    other senders of the same hash, ``(messages, count)`` int64 padded with ``-1``. A sender appears once per hash
    (a user rates an item once)."""
    sender, hashed = np.asarray(sender, dtype=np.int64), np.asarray(hashed, dtype=np.int64)
    order = np.lexsort((sender, hashed))
    h = hashed[order]
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]]) if len(h) else np.zeros(0, dtype=np.int64)
    sizes = np.diff(np.r_[starts, len(h)])
    group = np.repeat(np.arange(len(starts)), sizes)
    first = starts[group]
    picked = _pick_others(np.uint64(key), first, sizes[group], np.arange(len(h)) - first, sender[order], int(count))
    out = np.empty_like(picked)
    out[order] = picked
    return out


class GraphExpansion:
    """The expansion of a run: when it is due, running it (:meth:`expand`) and giving a round's entries their
    neighbours (:meth:`attach`).

    Args:
        neighbours: K, the most neighbours an item gets per user (FedPerGNN's ``NEIGHBOR_LEN``).
        every: expand in rounds 0, every, 2·every, ...
        num_users, num_items: the data's sizes.
    """

    def __init__(self, neighbours: int, every: int, num_users: int, num_items: int) -> None:
        self.count = check_int("task.expansion.neighbours", neighbours)
        self.every = check_int("task.expansion.every", every)
        self.num_users, self.num_items = num_users, num_items
        self.keys = torch.zeros(0, dtype=torch.long)  # the expanded entries, as user * num_items + item, sorted
        self.ids = torch.zeros(0, self.count, dtype=torch.long)  # their neighbours (users), -1 padded
        self.table: Tensor | None = None  # the user vectors the neighbours sent, at the last expansion
        self._attached: tuple[RoundData, RoundData] | None = None  # the last attach (a round's data twice)

    @staticmethod
    def from_config(cfg: Mapping[str, Any] | None, num_users: int, num_items: int) -> GraphExpansion | None:
        """The expansion ``task.expansion`` asks for (``neighbours`` > 0), or None."""
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - {"neighbours", "every"})
        if unknown:
            raise ConfigError(f"task.expansion has no field {unknown[0]!r} (it has neighbours, every)")
        count = check_int("task.expansion.neighbours", cfg.get("neighbours", 0), minimum=0)
        return GraphExpansion(count, cfg.get("every", 1), num_users, num_items) if count else None

    def due(self, round_idx: int) -> bool:
        return round_idx % self.every == 0

    def expand(self, user: np.ndarray, item: np.ndarray, client_of_user: np.ndarray, user_vecs: Tensor,
               channel: Channel, hash_key: int, match_key: int) -> None:
        """Run steps 1–3 (module docstring) over the training ratings ``(user, item)`` with the users' current
        vectors ``user_vecs`` ``(num_users, k)``, counting the messages in ``channel``."""
        user, item = np.asarray(user, dtype=np.int64), np.asarray(item, dtype=np.int64)
        hashed = keyed_hashes(hash_key, self.num_items)[item]  # 1: what the clients send
        ids = server_match(user, hashed, self.count, match_key)  # 2: what the server returns
        key = user * self.num_items + item  # 3: each client files the answers under its own items
        order = np.argsort(key, kind="stable")
        self.keys, self.ids = torch.from_numpy(key[order]), torch.from_numpy(ids[order])
        self.table = user_vecs.detach().cpu().clone()
        self._attached = None
        self._count(user, ids, client_of_user, channel, user_vecs.shape[1])

    def _count(self, user: np.ndarray, ids: np.ndarray, client_of_user: np.ndarray, channel: Channel,
               width: int) -> None:
        """One message each way per client that expanded: up, its users' hashes and vectors; down, the vectors
        of every neighbour returned."""
        client_of_user = np.asarray(client_of_user, dtype=np.int64)
        users = np.unique(user)
        clients, per_user = np.unique(client_of_user[users], return_inverse=True)
        up = np.bincount(client_of_user[user], minlength=len(client_of_user)).astype(np.int64) * HASH_SCALARS
        up = up[clients] + np.bincount(per_user, minlength=len(clients)) * width
        down = np.bincount(client_of_user[user], weights=(ids >= 0).sum(1), minlength=len(client_of_user))
        down = down[clients].astype(np.int64) * width
        ids_t = torch.from_numpy(clients)
        channel.send("upload", ("client", ids_t), (ROLE, 0), None, torch.from_numpy(up))
        channel.send("download", (ROLE, 0), ("client", ids_t), None, torch.from_numpy(down))

    def attach(self, data: RoundData) -> RoundData:
        """``data`` with every entry's neighbours from the last expansion (none for ratings it did not see); as it
        is before the first expansion (a planner's evaluation before round 0)."""
        if self.table is None:
            return data
        if self._attached is not None and self._attached[0] is data:  # training and evaluation of one round
            return self._attached[1]
        users, items = data.users[data.entry_user].cpu(), data.row_item[data.entry_row].cpu()
        key = users * self.num_items + items
        if len(self.keys):
            pos = torch.searchsorted(self.keys, key).clamp(max=len(self.keys) - 1)
            ids = torch.where((self.keys[pos] == key).unsqueeze(1), self.ids[pos], -1)
        else:
            ids = torch.full((len(key), self.count), -1, dtype=torch.long)
        mask = ids >= 0
        vecs = self.table[ids.clamp(min=0)] * mask.unsqueeze(-1).to(self.table.dtype)
        out = dataclasses.replace(data, neighbours=Neighbours(vecs, mask))
        self._attached = (data, out)
        return out

    def summary(self) -> dict[str, Any]:
        return {"expansion_neighbours": self.count, "expansion_every": self.every}

    def state_dict(self) -> dict[str, Any]:
        return {"keys": self.keys.clone(), "ids": self.ids.clone(),
                "table": None if self.table is None else self.table.clone()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.keys, self.ids, self.table = state["keys"], state["ids"], state["table"]
        self._attached = None
