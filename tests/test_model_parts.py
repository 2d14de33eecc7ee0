"""The model parts of issue 40 (biases, initial scale, the rating-scale head), each a flag whose default is today's
model: the biased logit and its gradients against a hand-written model, the biases' rows going through the round
as item rows do, and the defaults leaving runs as they were."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.app.cli import run
from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization, NeuMF
from fedrec.recsys.local import local_updates
from fedrec.recsys.objectives import OBJECTIVES
from tests.helpers import tiny_round

QUICK = ("+experiment=fedgnn_synthetic", "task.rounds=3", "data.users=150", "data.items=80", "data.ratings=4000",
         "data.num_clients=15", "task.pseudo_items=10", "plots=false", "logger.tensorboard=false")


def test_the_biased_mf_logit_and_its_gradients_against_a_hand_written_model() -> None:
    torch.manual_seed(0)
    model = MatrixFactorization(6, 24, 3, bias=True, head="linear", init_std=0.1).double()
    assert model.user_emb.shape == (6, 4) and model.row_dim == 4 and set(model.shared_parameters()) == {"global_bias"}
    with torch.no_grad():
        model.global_bias.fill_(0.3)
        model.user_emb[:, 3].normal_()
        model.item_emb[:, 3].normal_()
    d = tiny_round()
    upd = local_updates(model, d)
    for c in range(d.num_clients):  # each client alone: sqrt(mean (mu + b_u + b_i + p_u.q_i - y)^2), by hand
        mu = model.global_bias.detach().clone().requires_grad_(True)
        users = d.users[d.user_client == c]
        items = d.row_item[d.row_client == c]
        p = model.user_emb.detach()[users].clone().requires_grad_(True)
        q = model.item_emb.detach()[items].clone().requires_grad_(True)
        sq = []
        for e in (d.entry_client == c).nonzero().flatten().tolist():
            u = int((users == d.users[d.entry_user[e]]).nonzero())
            i = int((items == d.row_item[d.entry_row[e]]).nonzero())
            pred = mu[0] + p[u, 3] + q[i, 3] + p[u, :3] @ q[i, :3]
            sq.append((pred - float(d.entry_rating[e])) ** 2)
        loss = torch.stack(sq).mean().sqrt()
        g_mu, g_p, g_q = torch.autograd.grad(loss, [mu, p, q])
        torch.testing.assert_close(upd.loss[c], loss.detach())
        torch.testing.assert_close(upd.shared["global_bias"][c], g_mu)
        torch.testing.assert_close(upd.users[d.user_client == c], g_p)
        torch.testing.assert_close(upd.rows[d.row_client == c], g_q)


@pytest.mark.parametrize("steps", [1, 2])
def test_row_l2_adds_its_closed_form_to_each_clients_loss_and_gradient(steps: int) -> None:
    """λ/2 (Σ‖p_u‖² + Σ‖q_i‖²) over a client's rows: its loss grows by that, its first gradient by λ·row."""
    torch.manual_seed(3)
    model = FedGNN(6, 24, 3).double()
    d, lam = tiny_round(), 0.3
    plain, reg = local_updates(model, d, 1), local_updates(model, d, 1, row_l2=lam)
    users, rows = model.user_emb.detach()[d.users], model.item_emb.detach()[d.row_item]
    for c in range(d.num_clients):
        penalty = lam / 2 * (users[d.user_client == c].pow(2).sum() + rows[d.row_client == c].pow(2).sum())
        torch.testing.assert_close(reg.loss[c], plain.loss[c] + penalty)
    torch.testing.assert_close(reg.users, plain.users + lam * users)
    torch.testing.assert_close(reg.rows, plain.rows + lam * rows)
    torch.testing.assert_close(reg.shared["gat.lin_weight"], plain.shared["gat.lin_weight"])  # ω is not penalised
    if steps > 1:  # several local steps: the penalty keeps acting (pseudo-gradients differ beyond the first step)
        a, b = local_updates(model, d, steps, 0.1), local_updates(model, d, steps, 0.1, row_l2=lam)
        assert not torch.allclose(a.rows, b.rows)


def test_fedgnn_with_biases_adds_them_to_its_own_score() -> None:
    torch.manual_seed(1)
    biased = FedGNN(6, 24, 3, bias=True)
    plain = FedGNN(6, 24, 3)
    plain.load_state_dict({k: (v[:, :3] if k.endswith("_emb") else v) for k, v in biased.state_dict().items()
                           if k != "global_bias"})
    with torch.no_grad():
        biased.global_bias.fill_(-0.2)
        biased.user_emb[:, 3].normal_()
        biased.item_emb[:, 3].normal_()
    d = tiny_round()
    items = d.row_item[d.entry_row]
    user_of_entry = d.entry_user
    got = biased.predict(biased.shared_parameters(), biased.user_emb[d.users], biased.item_emb[items],
                         user_of_entry, user_of_entry, biased.item_emb[items])
    logit = plain.pair_logits(plain.shared_parameters(), plain.user_states(
        plain.shared_parameters(), plain.user_emb[d.users], plain.item_emb[items], user_of_entry),
        plain.item_emb[items], user_of_entry)
    want = torch.sigmoid(logit - 0.2 + biased.user_emb[d.users][user_of_entry, 3] + biased.item_emb[items, 3])
    torch.testing.assert_close(got, want)


def test_the_initial_scale_scales_the_tables() -> None:
    torch.manual_seed(2)
    a = MatrixFactorization(50, 60, 4)
    torch.manual_seed(2)
    b = MatrixFactorization(50, 60, 4, init_std=0.01)
    torch.testing.assert_close(b.user_emb, 0.01 * a.user_emb)
    torch.testing.assert_close(b.item_emb, 0.01 * a.item_emb)


def test_the_initial_bias_starts_mu_and_nothing_else() -> None:
    """μ starts at ``init_bias``, the logit of a user with zero vector and bias (items start with zero bias); the tables
    draw the same values as with μ at 0 (no random number is taken for it)."""
    torch.manual_seed(3)
    a = MatrixFactorization(5, 7, 2, bias=True, head="linear")
    torch.manual_seed(3)
    b = MatrixFactorization(5, 7, 2, bias=True, head="linear", init_bias=0.6)
    assert a.global_bias.item() == 0.0 and b.global_bias.item() == pytest.approx(0.6)
    torch.testing.assert_close(a.user_emb, b.user_emb, rtol=0, atol=0)
    torch.testing.assert_close(a.item_emb, b.item_emb, rtol=0, atol=0)
    states = torch.zeros(3, b.row_dim)  # users with zero vectors and biases: their logit is μ alone
    shared = {n: p.detach() for n, p in b.shared_parameters().items()}
    logits = b.pair_logits(shared, states, b.item_emb.detach()[:3], torch.arange(3))
    torch.testing.assert_close(logits, torch.full_like(logits, 0.6))


@pytest.mark.parametrize(("field", "value", "says"), [
    ("bias", "1", "model.bias must be true or false"), ("head", "softmax", "model.head"),
    ("init_std", "0", "model.init_std"), ("init_bias", "nan", "model.init_bias must be a finite number"),
    ("init_bias", "0.6", r"model.init_bias .* \+model.bias=true")])
def test_bad_parts_are_refused(compose_cfg: Callable[..., DictConfig], field: str, value: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_task(compose_cfg(*QUICK, f"+model.{field}={value}"))


@pytest.mark.parametrize("model", ["fedgnn", "mf"])
def test_biased_models_train_in_the_private_round(compose_cfg: Callable[..., DictConfig], tmp_path: Path,
                                                  model: str) -> None:
    """The bias column is a row like the others: clipped, noised and aggregated with pseudo items under DP."""
    summary = run(compose_cfg(*QUICK, f"model={model}", "privacy=gaussian", "privacy.epsilon=8", "+model.bias=true",
                              "+model.head=linear", "+model.init_std=0.1"), output_dir=tmp_path)
    assert summary["rounds_run"] == 3 and 0 < summary["final_test_rmse"] < 2


def test_neumf_dropout_acts_in_training_only() -> None:
    torch.manual_seed(4)
    dropped = NeuMF(6, 24, 2, mlp_layers=[8, 6, 4], dropout=0.5).double()
    plain = NeuMF(6, 24, 2, mlp_layers=[8, 6, 4]).double()
    plain.load_state_dict(dropped.state_dict())
    d = tiny_round()
    users, items = dropped.user_emb.detach()[d.users[d.entry_user]], dropped.item_emb.detach()[d.row_item[d.entry_row]]
    pair = torch.arange(len(users))

    def logits(model: NeuMF) -> torch.Tensor:
        return model.pair_logits(model.shared_parameters(), users, items, pair)

    torch.testing.assert_close(logits(dropped.eval()), logits(plain.eval()))  # no dropout in evaluation
    dropped.train()
    a, b = logits(dropped), logits(dropped)
    assert not torch.allclose(a, b)  # a fresh mask each call
    with pytest.raises(ConfigError, match="model.dropout"):
        NeuMF(6, 24, 2, dropout=1.0)


def test_the_task_evaluates_with_dropout_off(compose_cfg: Callable[..., DictConfig]) -> None:
    task = build_task(compose_cfg(*QUICK, "model=neumf", "model.mlp_layers=[8,4]", "model.dropout=0.5"))
    first, again = task.evaluate_round(0), task.evaluate_round(0)
    assert first == again and task.model.training  # the same metrics, and the model back in training mode


def test_the_mse_objective_is_the_square_of_the_rmse_one() -> None:
    """Per client, the MSE loss is the RMSE loss squared, and its gradient 2·RMSE times the RMSE's."""
    torch.manual_seed(4)
    model = FedGNN(6, 24, 3).double()
    d = tiny_round()
    rmse = local_updates(model, d, objective=OBJECTIVES["rmse"])
    mse = local_updates(model, d, objective=OBJECTIVES["mse"])
    torch.testing.assert_close(mse.loss, rmse.loss ** 2)
    scale = 2 * rmse.loss
    torch.testing.assert_close(mse.rows, rmse.rows * scale[d.row_client].unsqueeze(1))
    torch.testing.assert_close(mse.users, rmse.users * scale[d.user_client].unsqueeze(1))
    for name, g in rmse.shared.items():
        torch.testing.assert_close(mse.shared[name], g * scale.view(-1, *[1] * (g.dim() - 1)))


@pytest.mark.parametrize("head", ["linear", "sigmoid"])
def test_mean_init_starts_mu_at_the_mean_training_rating(compose_cfg: Callable[..., DictConfig], head: str) -> None:
    task = build_task(compose_cfg(*QUICK, "+model.bias=true", f"+model.head={head}", "task.mean_init=true"))
    mean = float(task.data.training_until(0).rating.astype("float64").mean())
    before = task.channel.ledger.totals()["comm_upload_messages"].item()
    task.run_round(0)
    holding = len(set(task.data.client_of_user[task.data.training_until(0).user].tolist()))
    assert task.channel.ledger.totals()["comm_upload_messages"].item() - before == 2 * holding  # + the gradients
    # round 0 then moved μ by one optimiser step of size about task.lr
    start = mean if head == "linear" else float(torch.logit(torch.tensor(mean, dtype=torch.float64)))
    assert abs(float(task.model.global_bias.detach()) - start) <= 1.01 * task.strategy.server_step.lr


@pytest.mark.parametrize(("extra", "says"), [
    ((), "task.mean_init=true sets the model's global bias: add it with \\+model.bias=true"),
    (("+model.bias=true", "privacy=gaussian"), "clients would send the server without noise"),
])
def test_mean_init_is_refused_where_it_cannot_apply(compose_cfg: Callable[..., DictConfig], extra: tuple,
                                                    says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        build_task(compose_cfg(*QUICK, "task.mean_init=true", *extra))
