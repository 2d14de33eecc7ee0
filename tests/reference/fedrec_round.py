"""Straightforward per-client reference for a federated recommendation round (tests and bench_fedgnn.py).

Each client is handled on its own, in a Python loop: its users' star graphs are built as PyG ``edge_index``
tensors and run through ``torch_geometric.nn.GATConv`` (for FedGNN), the loss is the RMSE over the client's
ratings, and plain autograd gives its gradients. Nothing is shared with the batched path in
``fedrec.recsys.local`` except the model's parameter values.
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedrec.models import FederatedRecommender, FedGNN
from fedrec.recsys.data import RoundData


def _gatconv(model: FedGNN) -> torch.nn.Module:
    from torch_geometric.nn import GATConv

    k = model.embed_dim
    conv = GATConv(k, k, heads=1, negative_slope=model.gat.negative_slope)
    with torch.no_grad():
        conv.lin.weight.copy_(model.gat.lin_weight)
        conv.att_src.copy_(model.gat.att_src.view(1, 1, k))
        conv.att_dst.copy_(model.gat.att_dst.view(1, 1, k))
        conv.bias.copy_(model.gat.bias)
    return conv


def reference_client_gradients(model: FederatedRecommender, data: RoundData) -> list[dict[str, Tensor]]:
    """Per client: its loss, gradients of ω (by the model's parameter names), of its users' rows (in
    ``data.users`` order) and of its item rows (sorted by item id)."""
    conv = _gatconv(model) if isinstance(model, FedGNN) else None
    out = []
    entry_client = data.entry_client
    for c in range(data.num_clients):
        user_idx = (data.user_client == c).nonzero().flatten()
        rows_c = (data.row_client == c).nonzero().flatten()
        items = data.row_item[rows_c]  # increasing
        user_vecs = model.user_emb.detach()[data.users[user_idx]].clone().requires_grad_(True)
        item_vecs = model.item_emb.detach()[items].clone().requires_grad_(True)
        params = list(conv.parameters()) if conv is not None else []
        sq = []
        for j, s in enumerate(user_idx.tolist()):
            e = ((data.entry_user == s) & (entry_client == c)).nonzero().flatten()
            pos = torch.searchsorted(items, data.row_item[data.entry_row[e]])
            neigh = item_vecs[pos]
            if conv is not None:
                x = torch.cat([user_vecs[j:j + 1], neigh])
                n = neigh.shape[0]
                edge_index = torch.stack([torch.arange(1, n + 1), torch.zeros(n, dtype=torch.long)])
                h = conv(x, edge_index)[0]
            else:
                h = user_vecs[j]
            pred = torch.sigmoid(neigh @ h)
            sq.append((pred - data.entry_rating[e]) ** 2)
        loss = torch.cat(sq).mean().sqrt()
        grads = torch.autograd.grad(loss, [*params, user_vecs, item_vecs])
        res = {"loss": loss.detach(), "users": grads[-2], "rows": grads[-1]}
        if conv is not None:
            k = model.embed_dim
            g_lin, g_src, g_dst, g_bias = (dict(zip([n for n, _ in conv.named_parameters()], grads[:-2]))[n]
                                          for n in ("lin.weight", "att_src", "att_dst", "bias"))
            res.update({"gat.lin_weight": g_lin, "gat.att_src": g_src.view(k), "gat.att_dst": g_dst.view(k),
                        "gat.bias": g_bias})
        out.append(res)
    return out
