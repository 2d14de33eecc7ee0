"""NeuMF: the forward pass against the paper's formula written out, each client's gradient of its own ω copy against
a separate backward pass per client, central training, and runs in the federated task."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from fedrec.app.schema import check_command_line
from fedrec.errors import ConfigError
from fedrec.models import NeuMF
from fedrec.recsys.local import local_updates
from tests.helpers import CONF, central_losses, read_csv, run_two_rounds, tiny_round


def plain_logit(params: dict[str, torch.Tensor], gmf_dim: int, layers: int, p: torch.Tensor,
                q: torch.Tensor) -> torch.Tensor:
    """He et al. (2017) eq. 12 for one (user row p, item row q), written out layer by layer."""
    phi_gmf = p[:gmf_dim] * q[:gmf_dim]
    z = torch.cat([p[gmf_dim:], q[gmf_dim:]])
    for j in range(layers):
        z = torch.clamp(params[f"tower.{j}.weight"] @ z + params[f"tower.{j}.bias"], min=0)
    return params["output.weight"][0] @ torch.cat([phi_gmf, z])


def test_forward_equals_the_papers_formula() -> None:
    torch.manual_seed(0)
    model = NeuMF(5, 7, embed_dim=3, mlp_layers=[6, 4, 2])
    assert model.embed_dim == 3 + 3 and model.user_emb.shape == (5, 6) and model.item_emb.shape == (7, 6)
    assert set(model.shared_parameters()) == {"tower.0.weight", "tower.0.bias", "tower.1.weight", "tower.1.bias",
                                              "output.weight"}
    with torch.no_grad():
        for p in model.shared_parameters().values():
            p.normal_()  # biases too, so the ReLUs cut somewhere
    params = {n: p.detach() for n, p in model.shared_parameters().items()}
    g = torch.Generator().manual_seed(1)
    user, item = torch.randint(0, 5, (60,), generator=g), torch.randint(0, 7, (60,), generator=g)  # ~12 per user
    user[:20] = 3  # one user with more pairs than a block holds
    got = model(user, item)
    want = torch.stack([plain_logit(params, 3, 2, model.user_emb[u], model.item_emb[i]) for u, i in zip(user, item)])
    torch.testing.assert_close(got, want)
    # the federated path (user rows, item rows, ω per user: pairs in blocks per user) gives the same logits
    per_user = {n: p.detach().expand(5, *p.shape) for n, p in model.shared_parameters().items()}
    again = model.score(per_user, model.user_emb, model.item_emb[item], user)
    torch.testing.assert_close(again, want)
    # scores of all items (a ranking's, in chunks of users) are the pairwise ones
    everything = model.score_all(params, model.user_emb[user], model.item_emb, block=8)
    assert everything.shape == (60, 7)
    torch.testing.assert_close(everything[torch.arange(60), item], want)


def test_each_client_differentiates_its_own_copy_of_omega() -> None:
    torch.manual_seed(2)
    model = NeuMF(6, 24, embed_dim=2, mlp_layers=[4, 3]).double()
    d = tiny_round()
    upd = local_updates(model, d)
    params = {n: p.detach() for n, p in model.shared_parameters().items()}
    for c in range(d.num_clients):  # each client alone, with a plain loss and its own backward pass
        mine = {n: p.clone().requires_grad_(True) for n, p in params.items()}
        users = d.users[d.user_client == c]
        items = d.row_item[d.row_client == c]
        u_vecs = model.user_emb.detach()[users].clone().requires_grad_(True)
        i_vecs = model.item_emb.detach()[items].clone().requires_grad_(True)
        sq = []
        for e in (d.entry_client == c).nonzero().flatten().tolist():
            u = int((users == d.users[d.entry_user[e]]).nonzero())
            i = int((items == d.row_item[d.entry_row[e]]).nonzero())
            pred = torch.sigmoid(plain_logit(mine, 2, 1, u_vecs[u], i_vecs[i]))
            sq.append((pred - float(d.entry_rating[e])) ** 2)
        loss = torch.stack(sq).mean().sqrt()
        grads = torch.autograd.grad(loss, [*mine.values(), u_vecs, i_vecs])
        torch.testing.assert_close(upd.loss[c], loss.detach())
        for name, g in zip(mine, grads):
            torch.testing.assert_close(upd.shared[name][c], g)
        torch.testing.assert_close(upd.users[d.user_client == c], grads[-2])
        torch.testing.assert_close(upd.rows[d.row_client == c], grads[-1])  # both in item-id order
    # the clients' ω gradients differ: each is its own, not a sum over all of them
    assert not torch.allclose(upd.shared["tower.0.weight"][0], upd.shared["tower.0.weight"][1])


@pytest.mark.parametrize("layers", [[16, 8.5], [8], [5, 4], "16,8", [16, 0]])
def test_bad_tower_settings_are_refused(layers) -> None:
    with pytest.raises(ConfigError, match=r"model\.mlp_layers"):
        NeuMF(3, 4, 8, layers)


def test_central_training_reduces_the_loss() -> None:
    losses = central_losses(lambda num_users, num_items, *_: NeuMF(num_users, num_items))
    assert losses[-1] < 0.25 * losses[0], (losses[0], losses[-1])


def test_the_command_line_pre_check_reads_the_config() -> None:
    check_command_line(CONF, ["+experiment=fedgnn_ml100k", "model=neumf", "model.mlp_layers=[64,32,16,8]"])
    with pytest.raises(ConfigError, match="model.mlp_layer: model=neumf has no field 'mlp_layer'"):
        check_command_line(CONF, ["+experiment=fedgnn_ml100k", "model=neumf", "model.mlp_layer=[16,8]"])


def test_runs_in_the_federated_task(compose_cfg: Callable[..., DictConfig], data_dir: Path, tmp_path: Path) -> None:
    summary = run_two_rounds(compose_cfg, data_dir, tmp_path, "model=neumf", "model.mlp_layers=[16,8]")
    rmse = [float(row["test_rmse"]) for row in read_csv(tmp_path / "metrics.csv")]
    # the second round's training lowers the held-out error, and the summary reports the last round's
    assert summary["rounds_run"] == len(rmse) == 2 and summary["final_test_rmse"] == rmse[1] < rmse[0]
