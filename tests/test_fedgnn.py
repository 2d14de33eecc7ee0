"""FedGNN: the dense star-graph GAT equals PyG's GATConv; batched per-client gradients equal a per-client loop."""
from __future__ import annotations

import pytest
import torch

from fedrec.models import FedGNN, StarGAT, per_client_gradients
from fedrec.models.fedgnn import client_loss


def test_star_gat_equals_pyg_gatconv_at_the_centre():
    from torch_geometric.nn import GATConv

    torch.manual_seed(0)
    k, M = 6, 5
    ours = StarGAT(k)
    conv = GATConv(k, k, heads=1)
    with torch.no_grad():
        conv.lin.weight.copy_(ours.lin_weight)
        conv.att_src.copy_(ours.att_src.view(1, 1, k))
        conv.att_dst.copy_(ours.att_dst.view(1, 1, k))
        conv.bias.copy_(torch.randn(k))
        ours.bias.copy_(conv.bias)
    x = torch.randn(M + 1, k)
    edge_index = torch.stack([torch.arange(1, M + 1), torch.zeros(M, dtype=torch.long)])  # item -> user
    expected = conv(x, edge_index)[0]
    got = ours(x[0], x[1:], torch.ones(M, dtype=torch.bool))
    assert torch.allclose(got, expected, atol=1e-6)
    # padding is ignored
    padded = ours(x[0], torch.cat([x[1:], torch.randn(3, k)]), torch.tensor([True] * M + [False] * 3))
    assert torch.allclose(padded, expected, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_per_client_gradients_equal_a_per_client_loop(seed):
    g = torch.Generator().manual_seed(seed)
    U, I, k, M = 7, 20, 4, 6
    torch.manual_seed(seed)
    model = FedGNN(U, I, k)
    users = torch.arange(U)
    lengths = torch.randint(1, M + 1, (U,), generator=g)
    mask = torch.arange(M).expand(U, M) < lengths.unsqueeze(1)
    items = torch.stack([torch.randperm(I, generator=g)[:M] for _ in range(U)]) * mask
    ratings = torch.rand(U, M, generator=g) * mask
    g_gat, g_items, g_user, losses = per_client_gradients(model, users, items, ratings, mask)
    for c in range(U):
        model.zero_grad()
        n = int(lengths[c])
        gat = dict(model.gat.named_parameters())
        user = model.user_emb[c]
        rows = model.item_emb[items[c, :n]]
        loss = client_loss(gat, model.gat, user, rows, ratings[c, :n], torch.ones(n, dtype=torch.bool))
        grads = torch.autograd.grad(loss, [*gat.values(), model.user_emb, model.item_emb])
        assert torch.allclose(losses[c], loss, atol=1e-6)
        for (name, _), gr in zip(gat.items(), grads[: len(gat)]):
            assert torch.allclose(g_gat[name][c], gr, atol=1e-5), name
        assert torch.allclose(g_user[c], grads[len(gat)][c], atol=1e-5)
        assert torch.allclose(g_items[c, :n], grads[len(gat) + 1][items[c, :n]], atol=1e-5)
        assert torch.all(g_items[c, n:] == 0)
