"""LightGCN: the whole-graph model against the dense closed form, the star-graph (federated) model against hand
computations and the module docstring's formulas, the two against each other, training, and runs in the task."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from torch import Tensor

from fedrec.app.schema import check_command_line
from fedrec.errors import ConfigError
from fedrec.models import CentralLightGCN, LightGCN
from fedrec.recsys.data import round_data
from fedrec.recsys.local import local_updates
from tests.helpers import CONF, central_losses, read_csv, run_two_rounds


def dense_lightgcn(adjacency: Tensor, e0: Tensor, layers: int) -> Tensor:
    """He et al. (2020) eq. 8 with dense matrices: ``mean_k Â^k E0``, ``Â = D^-1/2 A D^-1/2`` (degree 0 → 0)."""
    deg = adjacency.sum(1)
    inv = torch.where(deg > 0, deg.clamp(min=1).pow(-0.5), torch.zeros_like(deg))
    a_hat = inv[:, None] * adjacency * inv[None, :]
    out, x = e0.clone(), e0
    for _ in range(layers):
        x = a_hat @ x
        out = out + x
    return out / (layers + 1)


def bipartite(num_users: int, num_items: int, user: Tensor, item: Tensor) -> Tensor:
    n = num_users + num_items
    a = torch.zeros(n, n, dtype=torch.float64)
    a[user, item + num_users] = 1.0
    a[item + num_users, user] = 1.0
    return a


def central(num_users: int, num_items: int, user: Tensor, item: Tensor, e0: Tensor, layers: int) -> CentralLightGCN:
    model = CentralLightGCN(num_users, num_items, user, item, embed_dim=e0.shape[1], num_layers=layers)
    with torch.no_grad():
        model.gcn.embedding.weight.copy_(e0)
    return model


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_central_equals_the_dense_closed_form(layers: int) -> None:
    g = torch.Generator().manual_seed(layers)
    U, I = 6, 8
    user, item = torch.randint(0, U - 1, (20,), generator=g), torch.randint(0, I - 1, (20,), generator=g)
    user, item = torch.cat([user, user[:3]]), torch.cat([item, item[:3]])  # repeated interactions: one edge each
    e0 = torch.randn(U + I, 4, generator=g)  # user U-1 and item I-1 have no interactions
    model = central(U, I, user, item, e0, layers)
    users, items = model.embeddings()
    want = dense_lightgcn(bipartite(U, I, user, item), e0.double(), layers).float()
    torch.testing.assert_close(torch.cat([users, items]), want)
    torch.testing.assert_close(users[U - 1], e0[U - 1] / (layers + 1))
    pairs = torch.tensor([0, 3, 5]), torch.tensor([1, 7, 2])
    torch.testing.assert_close(model(*pairs), (want[pairs[0]] * want[U + pairs[1]]).sum(-1))  # eq. 5


def test_star_and_whole_graph_by_hand() -> None:
    """Users 0 and 1 rated items {0, 1} and {1, 2}; scalar embeddings p = (1, 3), q = (2, 4, -1)."""
    user, item = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 2])
    e0 = torch.tensor([[1.0], [3.0], [2.0], [4.0], [-1.0]])
    r2 = math.sqrt(2)
    for layers, star, whole in [
        # star: item 1 has degree 1, so e_u^(1) = (2 + 4)/√2; central: item 1 has degree 2, e_u^(1) = 2/√2 + 4/2
        (1, (1 + 6 / r2) / 2, (1 + 2 / r2 + 4 / 2) / 2),
        # star: e_u^(2) = p_u = 1; central: e^(1) of items 0, 1 = 1/√2 and (1 + 3)/2, e_u^(2) = (1/√2)/√2 + 2/2,
        # user 1's p = 3 arriving through item 1
        (2, (1 + 6 / r2 + 1) / 3, (1 + (2 / r2 + 2) + 1.5) / 3),
    ]:
        fed = LightGCN(2, 3, embed_dim=1, num_layers=layers)
        with torch.no_grad():
            fed.user_emb.copy_(e0[:2])
            fed.item_emb.copy_(e0[2:])
        h = fed.represent({}, fed.user_emb, fed.item_emb[item], user)
        assert h[0].item() == pytest.approx(star, rel=1e-6)
        assert central(2, 3, user, item, e0, layers).embeddings()[0][0].item() == pytest.approx(whole, rel=1e-6)
    # the star never sees another user: user 1's embedding changes user 0's central representation only
    other = e0.clone()
    other[1] = -7.0
    assert central(2, 3, user, item, other, 2).embeddings()[0][0].item() != pytest.approx(whole, rel=1e-3)
    with torch.no_grad():
        fed.user_emb[1] = -7.0
    assert fed.represent({}, fed.user_emb, fed.item_emb[item], user)[0].item() == pytest.approx(star, rel=1e-6)


@pytest.mark.parametrize("layers", [1, 2, 3, 4])
def test_star_representations_follow_the_docstrings_formula(layers: int) -> None:
    """h_u = [(⌊L/2⌋ + 1) p_u + ⌈L/2⌉ √d q̄_u]/(L+1) for d ≥ 1 items, p_u/(L+1) without; several users at once."""
    g = torch.Generator().manual_seed(layers)
    sizes = [3, 1, 0, 6]
    model = LightGCN(4, 10, embed_dim=5, num_layers=layers).double()
    entry_user = torch.repeat_interleave(torch.arange(4), torch.tensor(sizes))
    entry_item = torch.cat([torch.randperm(10, generator=g)[:n] for n in sizes])
    h = model.represent({}, model.user_emb, model.item_emb[entry_item], entry_user)
    for u, d in enumerate(sizes):
        q = model.item_emb[entry_item[entry_user == u]]
        if d:
            want = ((layers // 2 + 1) * model.user_emb[u] + (layers + 1) // 2 * math.sqrt(d) * q.mean(0)) / (layers + 1)
        else:
            want = model.user_emb[u] / (layers + 1)
        torch.testing.assert_close(h[u], want.detach())


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_one_user_federated_equals_central_on_its_star(layers: int) -> None:
    g = torch.Generator().manual_seed(10 + layers)
    d, k = 7, 4
    e0 = torch.randn(1 + d, k, generator=g)
    whole = central(1, d, torch.zeros(d, dtype=torch.long), torch.arange(d), e0, layers)
    users, items = whole.embeddings()
    fed = LightGCN(1, d, embed_dim=k, num_layers=layers)
    with torch.no_grad():
        fed.user_emb.copy_(e0[:1])
        fed.item_emb.copy_(e0[1:])
    h = fed.represent({}, fed.user_emb, fed.item_emb, torch.zeros(d, dtype=torch.long))
    torch.testing.assert_close(h, users)
    # the items on the star: q_i/(L+1) plus one offset c_u shared by all of them (the docstring's)
    offset = items - e0[1:] / (layers + 1)
    c_u = ((layers + 1) // 2 * e0[0] / math.sqrt(d) + layers // 2 * e0[1:].mean(0)) / (layers + 1)
    torch.testing.assert_close(offset, c_u.expand(d, k))


def test_batched_client_gradients_equal_a_per_user_star_loop() -> None:
    """Clients of two users each: the batched local update against each client's loss written with the dense
    closed form on each of its users' stars and differentiated alone."""
    rng = np.random.default_rng(0)
    user = np.repeat(np.arange(6), [3, 5, 2, 4, 1, 6])
    item = np.concatenate([rng.choice(12, n, replace=False) for n in [3, 5, 2, 4, 1, 6]])
    d = round_data(user, item, rng.uniform(0, 1, len(user)), np.array([0, 1, 2, 0, 1, 2]), 12)
    torch.manual_seed(0)
    model = LightGCN(6, 12, embed_dim=3, num_layers=2).double()
    upd = local_updates(model, d)
    assert upd.flat_shared().shape == (3, 0)  # no ω
    for c in range(d.num_clients):
        users = d.users[d.user_client == c]
        items = d.row_item[d.row_client == c]
        u_vecs = model.user_emb.detach()[users].clone().requires_grad_(True)
        i_vecs = model.item_emb.detach()[items].clone().requires_grad_(True)
        sq = []
        for j, u in enumerate(users.tolist()):
            e = (d.users[d.entry_user] == u).nonzero().flatten()
            pos = torch.searchsorted(items, d.row_item[d.entry_row[e]])
            star = torch.zeros(1 + len(e), 1 + len(e), dtype=torch.float64)
            star[0, 1:] = star[1:, 0] = 1.0
            h = dense_lightgcn(star, torch.cat([u_vecs[j:j + 1], i_vecs[pos]]), 2)[0]
            sq.append((torch.sigmoid(i_vecs[pos] @ h) - d.entry_rating[e].double()) ** 2)
        loss = torch.cat(sq).mean().sqrt()
        g_users, g_items = torch.autograd.grad(loss, [u_vecs, i_vecs])
        torch.testing.assert_close(upd.loss[c], loss.detach())
        torch.testing.assert_close(upd.users[d.user_client == c], g_users)
        torch.testing.assert_close(upd.rows[d.row_client == c], g_items)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"model\.num_layers"):
        LightGCN(3, 4, 8, num_layers=0)
    with pytest.raises(ConfigError, match=r"model\.num_layers"):
        CentralLightGCN(3, 4, torch.tensor([0]), torch.tensor([1]), 8, num_layers=1.5)


def test_central_training_reduces_the_loss() -> None:
    losses = central_losses(lambda *graph: CentralLightGCN(*graph, embed_dim=16, num_layers=3))
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])


def test_the_command_line_pre_check_reads_the_config() -> None:
    check_command_line(CONF, ["+experiment=fedgnn_ml100k", "model=lightgcn", "model.num_layers=1"])
    with pytest.raises(ConfigError, match="model.num_layer: model=lightgcn has no field 'num_layer'"):
        check_command_line(CONF, ["+experiment=fedgnn_ml100k", "model=lightgcn", "model.num_layer=1"])


def test_runs_in_the_federated_task(compose_cfg: Callable[..., DictConfig], data_dir: Path, tmp_path: Path) -> None:
    summary = run_two_rounds(compose_cfg, data_dir, tmp_path, "model=lightgcn", "model.num_layers=2")
    rmse = [float(row["test_rmse"]) for row in read_csv(tmp_path / "metrics.csv")]
    # the second round's training lowers the held-out error, and the summary reports the last round's
    assert summary["rounds_run"] == len(rmse) == 2 and summary["final_test_rmse"] == rmse[1] < rmse[0]
