"""Side graphs (``task.side_graphs``): the Monti et al. files' user and item graphs as graph regularisation of the
model's vectors, the way GRALS (Rao et al. 2015), one of Monti et al.'s baselines, uses them:

    ½ λ_u tr(Uᵀ L_u U) + ½ λ_i tr(Vᵀ L_i V) = ½ λ_u Σ_{(u,v) ∈ E_u} ‖p_u − p_v‖² + ½ λ_i Σ_{(i,j) ∈ E_i} ‖q_i − q_j‖²,

with L = D − A each graph's Laplacian (A the file's symmetric 0/1 adjacency without self-loops, each undirected
edge once in the sums) and p_u, q_i the users' and items' vectors: the first ``model.embed_dim`` columns of their
rows, as GRALS smooths factors, or with ``biases`` (a model with ``model.bias``) the bias column too.

* The item term is the server's: the item graph is public side information (Flixster's and YahooMusic's are
  built from item features), so the server adds its gradient λ_i L_i V to the aggregate's item rows, over the
  whole table, before its optimiser step. No client sends anything for it; under DP it is post-processing.
* The user term is the clients': each client whose upload the server uses receives from every friend of its users
  who sits in another client the friend's current vector (one peer message of ``embed_dim`` scalars per friend and
  user, counted in the ledger) and adds λ_u Σ_v (p_u − p_v) = λ_u (L_u U)_u to its users' gradient. A friend's
  vector leaves its client, which client DP does not cover, so the user term is refused with privacy on.

Both terms are in the units of the round's aggregate: under ``aggregator.reduce=sum`` with ``task.objective=sse``
the round's update is the gradient of the summed squared error plus both terms, the central objective.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float
from fedrec.federation.channel import Channel
from fedrec.models.recommender import FederatedRecommender

#: the datasets whose files carry each graph (for the refusal's hint)
_HAVE = {"users": "douban, flixster", "items": "flixster, yahoo_music"}


def laplacian(graph: sp.spmatrix) -> Tensor:
    """L = D − A of a symmetric adjacency matrix (self-loops dropped), a float64 sparse COO tensor."""
    a = sp.csr_matrix(graph, dtype=np.float64)
    a.setdiag(0.0)
    a.eliminate_zeros()
    lap = (sp.diags(np.asarray(a.sum(1)).ravel()) - a).tocoo()
    index = torch.from_numpy(np.stack([lap.row, lap.col]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(lap.data), size=lap.shape, check_invariants=True).coalesce()


class SideGraphs:
    """A run's graph regularisation (module docstring).

    Args:
        user_graph, item_graph: the data's adjacency matrices (None where it has none).
        users, items: λ_u and λ_i ≥ 0 (0: that term off; a graph is needed for a positive weight).
        dataset: the data's name, for messages.
        biases: smooth the user and item biases too (the rows' last column, with ``model.bias``).
    """

    def __init__(self, user_graph: sp.spmatrix | None, item_graph: sp.spmatrix | None, users: float = 0.0,
                 items: float = 0.0, dataset: str = "the data", biases: bool = False) -> None:
        self.user_weight = check_float("task.side_graphs.users", users, low=0.0)
        self.item_weight = check_float("task.side_graphs.items", items, low=0.0)
        if not isinstance(biases, bool):
            raise ConfigError(f"task.side_graphs.biases must be true or false, got {biases!r}")
        self.biases = biases
        self.graphs: dict[str, sp.csr_matrix] = {}
        self.laplacians: dict[str, Tensor] = {}
        for side, weight, graph in (("users", self.user_weight, user_graph), ("items", self.item_weight, item_graph)):
            if not weight:
                continue
            if graph is None:
                raise ConfigError(f"task.side_graphs.{side}={weight:g}: data={dataset} has no "
                                  f"{side[:-1]} graph (the Monti files of {_HAVE[side]} have one); set it to 0")
            if (abs(graph - graph.T) > 0).nnz:
                raise ConfigError(f"task.side_graphs.{side}: the {side[:-1]} graph of data={dataset} is not "
                                  "symmetric")
            self.graphs[side] = sp.csr_matrix(graph)
            self.laplacians[side] = laplacian(graph)

    @staticmethod
    def from_config(cfg: Mapping[str, Any] | None, user_graph: sp.spmatrix | None, item_graph: sp.spmatrix | None,
                    dataset: str, private: bool) -> SideGraphs | None:
        """The regularisation ``task.side_graphs`` asks for (a positive weight), or None; the user term is refused
        when ``private``."""
        cfg = dict(cfg or {})
        unknown = sorted(set(cfg) - {"users", "items", "biases"})
        if unknown:
            raise ConfigError(f"task.side_graphs has no field {unknown[0]!r} (it has users, items, biases)")
        graphs = SideGraphs(user_graph, item_graph, cfg.get("users", 0.0), cfg.get("items", 0.0), dataset,
                            cfg.get("biases", False))
        if graphs.user_weight and private:
            raise ConfigError(f"task.side_graphs.users={graphs.user_weight:g} sends users' vectors to their "
                              "friends, which client DP does not cover: set it to 0 with privacy on (the item "
                              "term, the server's, is allowed)")
        return graphs if graphs.user_weight or graphs.item_weight else None

    def width(self, model: FederatedRecommender) -> int:
        """The columns of a row the terms smooth: the vector, and the bias with ``biases``."""
        if self.biases and not getattr(model, "bias", False):
            raise ConfigError("task.side_graphs.biases=true smooths the biases, and the model has none: add "
                              "+model.bias=true")
        return model.row_dim if self.biases else model.embed_dim

    def _smooth(self, side: str, table: Tensor, width: int) -> Tensor:
        """L · table[:, :width] (float64), on the table's device."""
        lap = self.laplacians[side]
        if lap.device != table.device:
            lap = self.laplacians[side] = lap.to(table.device)
        return torch.sparse.mm(lap, table.detach()[:, :width].double())

    def add_item_term(self, model: FederatedRecommender, update: tuple[Tensor, Tensor, Tensor]
                      ) -> tuple[Tensor, Tensor, Tensor]:
        """The server's update ``(ω, item ids, item rows)`` with λ_i L_i V added, as a whole-table update."""
        if not self.item_weight:
            return update
        g_shared, items, g_items = update
        table = model.item_emb
        full = torch.zeros_like(table.detach()).index_put_((items.to(table.device),), g_items.to(table.dtype))
        k = self.width(model)
        full[:, :k] += (self.item_weight * self._smooth("items", table, k)).to(table.dtype)
        return g_shared, torch.arange(table.shape[0], device=table.device), full

    def user_term(self, model: FederatedRecommender, users: Tensor, client_of_user: np.ndarray,
                  channel: Channel) -> Tensor | None:
        """``(len(users), row_dim)``: λ_u (L_u U) on the rows of ``users``, after their clients receive their
        friends' vectors from other clients (counted in ``channel``); None without the user term."""
        if not self.user_weight:
            return None
        table, k = model.user_emb, self.width(model)
        ids = users.cpu().numpy()
        friends = self.graphs["users"][ids]
        rows = np.repeat(ids, np.diff(friends.indptr))
        owner = np.asarray(client_of_user, dtype=np.int64)
        sender, receiver = owner[friends.indices], owner[rows]
        apart = (sender != receiver) & (friends.indices != rows)
        if apart.any():
            channel.send("peer", ("client", torch.from_numpy(sender[apart])),
                         ("client", torch.from_numpy(receiver[apart])), None, k)
        out = torch.zeros(len(ids), table.shape[1], dtype=table.dtype, device=table.device)
        out[:, :k] = (self.user_weight * self._smooth("users", table, k)[users.to(table.device)]).to(table.dtype)
        return out

    def summary(self) -> dict[str, float]:
        return {"side_graph_users": self.user_weight, "side_graph_items": self.item_weight,
                "side_graph_biases": self.biases}
