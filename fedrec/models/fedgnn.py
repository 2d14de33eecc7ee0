"""FedGNN as BGTplanner's authors run it (their released code; the paper only names FedGNN): one single-head
graph-attention layer over each user's local star graph, and rating prediction ``sigmoid(h_u · e_i)``.

A user's local graph has the user as the centre and its rated items as neighbours, with edges item → user and a
self-loop; ``h_u`` is the GAT output at the centre. The layer is evaluated for all users at once over flat
entries with segment softmax, and it computes exactly what ``torch_geometric.nn.GATConv(k, k, heads=1)``
computes at the centre (tested). Its parameters may carry a leading per-user dimension, which is how every
client differentiates its own copy of ω in a single backward pass (see :mod:`fedrec.recsys.local`). The segment
softmax is written out rather than taken from ``torch_geometric.utils.softmax``, which does the same scatters (max,
sum of exponentials), was no faster on ML-100K rounds, and would make every FedGNN run import torch_geometric
(3.5-4 s of CPU).

With ``expansion=True`` (set by ``task.expansion``, :mod:`fedrec.recsys.expansion`) the local graph is FedGNN's
expanded user–item–user tree: each rated item also links the users that graph expansion found for it. A second
GAT layer represents each item at the centre of its own star (the user itself and its expansion neighbours), and
the user's layer attends over those item representations, so information flows neighbours → items → user, as in
FedPerGNN's model (attention over each item's neighbour embeddings, then over the user's items).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_float
from fedrec.models.recommender import FederatedRecommender, Neighbours


def _rows(p: Tensor, base_dim: int, index: Tensor | None = None) -> Tensor:
    """A parameter shared by all rows (``base_dim`` dims) as is, or its per-row copies (``index``-gathered)."""
    if p.dim() == base_dim:
        return p
    return p if index is None else p[index]


class StarGAT(nn.Module):
    """Single-head GAT (Veličković et al.) evaluated at the centres of star graphs given as flat entries."""

    def __init__(self, embed_dim: int, negative_slope: float = 0.2) -> None:
        super().__init__()
        k = int(embed_dim)
        self.negative_slope = check_float("model.negative_slope", negative_slope, low=0.0)
        self.lin_weight = nn.Parameter(torch.empty(k, k))
        self.att_src = nn.Parameter(torch.empty(k))
        self.att_dst = nn.Parameter(torch.empty(k))
        self.bias = nn.Parameter(torch.zeros(k))
        nn.init.xavier_uniform_(self.lin_weight)
        nn.init.xavier_uniform_(self.att_src.view(1, k))
        nn.init.xavier_uniform_(self.att_dst.view(1, k))

    def attend(self, params: dict[str, Tensor], centre: Tensor, neighbours: Tensor, owner: Tensor) -> Tensor:
        """Centre outputs ``(S, k)`` of ``S`` stars: ``centre`` ``(S, k)``, ``neighbours`` ``(E, k)`` belonging
        to star ``owner`` ``(E,)``. ``params`` are this layer's parameters, optionally with a leading ``S``."""
        W, a_src, a_dst = params["lin_weight"], params["att_src"], params["att_dst"]
        xc = (_rows(W, 2) @ centre.unsqueeze(-1)).squeeze(-1)  # (S, k)
        xn = (_rows(W, 2, owner) @ neighbours.unsqueeze(-1)).squeeze(-1)  # (E, k)
        dst = (xc * a_dst).sum(-1)  # (S,)
        self_logit = F.leaky_relu((xc * a_src).sum(-1) + dst, self.negative_slope)
        logit = F.leaky_relu((xn * _rows(a_src, 1, owner)).sum(-1) + dst[owner], self.negative_slope)
        # softmax over {centre} ∪ neighbours of each star; the shift only guards exp() and carries no gradient
        shift = self_logit.detach().scatter_reduce(0, owner, logit.detach(), "amax")
        w_self = torch.exp(self_logit - shift)
        w = torch.exp(logit - shift[owner])
        norm = w_self.index_add(0, owner, w)
        out = (w_self / norm).unsqueeze(-1) * xc
        out = out.index_add(0, owner, (w / norm[owner]).unsqueeze(-1) * xn)
        return out + params["bias"]

    def attend_dense(self, params: dict[str, Tensor], centre: Tensor, neighbours: Tensor, mask: Tensor,
                     owner: Tensor | None = None) -> Tensor:
        """Centre outputs ``(S, k)`` of ``S`` stars given densely: ``neighbours`` ``(S, K, k)``, of which ``mask``
        ``(S, K)`` marks the real ones; the same layer as :meth:`attend`. ``params`` may carry a leading dimension
        of copies, star ``s`` using copy ``owner[s]``.

        The layer is linear in its inputs before the softmax, so it is evaluated without transforming a
        neighbour: ``a · W x = (Wᵀ a) · x`` gives the attention logits, and ``Σ_j α_j W x_j = W Σ_j α_j x_j`` the
        output, one k × k product per star instead of one per neighbour."""
        W, a_src, a_dst = params["lin_weight"], params["att_src"], params["att_dst"]
        v_src = torch.einsum("...ij,...i->...j", W, a_src)  # Wᵀ a, per copy
        v_dst = torch.einsum("...ij,...i->...j", W, a_dst)
        bias = params["bias"] if params["bias"].dim() == 1 else params["bias"][owner]
        if W.dim() == 3:
            W, v_src, v_dst = W[owner], v_src[owner], v_dst[owner]
        dst = (centre * v_dst).sum(-1)  # (S,)
        self_logit = F.leaky_relu((centre * v_src).sum(-1) + dst, self.negative_slope)
        logit = F.leaky_relu((neighbours * v_src.unsqueeze(-2)).sum(-1) + dst.unsqueeze(1), self.negative_slope)
        logits = torch.cat([self_logit.unsqueeze(1), logit.masked_fill(~mask, -math.inf)], 1)
        w = torch.softmax(logits, 1)  # the centre's own logit is finite, so every row has a weight
        mixed = w[:, :1] * centre + (w[:, 1:].unsqueeze(-1) * neighbours).sum(1)  # (S, k)
        out = mixed @ W.T if W.dim() == 2 else (W @ mixed.unsqueeze(-1)).squeeze(-1)
        return out + bias


class FedGNN(FederatedRecommender):
    """FedGNN: ``h_u = GAT(star of u)[u]``, without graph expansion the authors' ``wo_neighbour`` setting; with
    ``expansion=True`` the star's items are first represented from their expansion neighbours (module docstring).
    ``residual=True`` adds each layer's centre vector to its output (``h_u = GAT(...) + p_u``, an item's likewise):
    FedPerGNN's model joins the user's own embedding to the attended items (and an item's to its attended
    neighbours) before a dense layer, where a GAT's centre competes with all of its neighbours in one softmax."""

    reads_neighbours = True

    def __init__(self, num_users: int, num_items: int, embed_dim: int = 8, negative_slope: float = 0.2,
                 expansion: bool = False, residual: bool = False, **parts: Any) -> None:
        super().__init__(num_users, num_items, embed_dim, **parts)
        self.gat = StarGAT(self.embed_dim, negative_slope)
        for name, value in (("expansion", expansion), ("residual", residual)):
            if not isinstance(value, bool):
                raise ConfigError(f"model.{name} must be true or false, got {value!r}")
        self.expansion, self.residual = expansion, residual
        if expansion:  # after the user layer, so the default model draws its initial values as before
            self.item_gat = StarGAT(self.embed_dim, negative_slope)

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The tables' bytes (:meth:`FederatedRecommender.memory_estimate`) and each star's copy of its layer's k × k
        weights, gathered per edge (a user's and, with graph expansion's ``neighbours``, an item's) with its gradient:
        8 k² bytes per training rating and user and layer of the clients that train at once (``chunk_training``,
        ``chunk_users``; all of them without ``task.client_chunk``). Measured: width 128 on ML-100K (80,943 edges
        and users) raised the peak by 10.6 GB over width 8, and this says 10.6 GB."""
        layers = 2 if sizes.get("neighbours") else 1
        k = sizes["embed_dim"]
        at_once = sizes.get("chunk_training", sizes["training"]) + sizes.get("chunk_users", sizes["users"])
        return super().memory_estimate(sizes) + layers * 8 * k * k * at_once

    def represent(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor,
                  neighbours: Neighbours | None = None) -> Tensor:
        params = {name.removeprefix("gat."): p for name, p in shared.items() if name.startswith("gat.")}
        items = self._expanded_items(shared, user_vecs, item_vecs, entry_user, neighbours) if self.expansion \
            else item_vecs
        h = self.gat.attend(params, user_vecs, items, entry_user)
        return h + user_vecs if self.residual else h

    def _expanded_items(self, shared: dict[str, Tensor], user_vecs: Tensor, item_vecs: Tensor, entry_user: Tensor,
                        neighbours: Neighbours | None) -> Tensor:
        """Each entry's item represented at the centre of its star: the entry's user and its expansion neighbours
        (none when ``neighbours`` is None), each entry with its user's copy of the layer's parameters."""
        params = {name.removeprefix("item_gat."): p for name, p in shared.items() if name.startswith("item_gat.")}
        own = user_vecs[entry_user].unsqueeze(1)
        if neighbours is None:
            vecs, mask = own, torch.ones(own.shape[:2], dtype=torch.bool, device=own.device)
        else:
            vecs = torch.cat([own, neighbours.vecs.to(own.dtype)], 1)
            mask = torch.cat([torch.ones_like(neighbours.mask[:, :1]), neighbours.mask], 1)
        out = self.item_gat.attend_dense(params, item_vecs, vecs, mask, entry_user)
        return out + item_vecs if self.residual else out
