"""task.user_solve: clients set their user rows to the ridge solution of their ratings (federated collaborative
filtering's local step) before computing their uploads. Checked against numpy's least squares per user, against the
stationarity of the model's own summed loss, in the round (who is solved, when, at one and two processes) and for
the settings it refuses."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedAvg, FedSGD, Strategy
from fedrec.recsys.data import round_data
from fedrec.recsys.local import solve_user_rows
from fedrec.recsys.objectives import sse_losses
from fedrec.tasks import FedRecTask
from tests.helpers import play_sharded, tiny_fixture

ROUNDS = 3
grouped = tiny_fixture(users=60, items=50, seed=2, rounds=ROUNDS, num_clients=13)
WD = 0.8


def _model(data: RatingData, bias: bool = True) -> MatrixFactorization:
    torch.manual_seed(5)
    model = MatrixFactorization(data.num_users, data.num_items, 3, bias=bias, head="linear", init_std=0.5)
    if bias:
        with torch.no_grad():
            model.global_bias.fill_(0.55)
            model.item_emb[:, -1] = 0.1 * torch.randn(data.num_items)
    return model


def _first_round(data: RatingData):
    tr = data.training_until(0)
    return round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items)


@pytest.mark.parametrize("bias", [False, True])
def test_each_row_is_numpys_ridge_least_squares_fit(grouped: RatingData, bias: bool) -> None:
    model, d = _model(grouped, bias), _first_round(grouped)
    got = solve_user_rows(model, d, WD).double().numpy()
    q = model.item_emb.detach().double().numpy()
    k = model.embed_dim
    for s in range(d.users.numel()):
        mine = (d.entry_user == s).numpy()
        items = d.row_item[d.entry_row].numpy()[mine]
        y = d.entry_rating.double().numpy()[mine]
        a = q[items, :k]
        if bias:
            y = y - 0.55 - q[items, k]
            a = np.hstack([a, np.ones((len(y), 1))])
        width = a.shape[1]
        stacked = np.vstack([a, np.sqrt(WD / 2) * np.eye(width)])  # ridge as least squares on extra rows
        want = np.linalg.lstsq(stacked, np.concatenate([y, np.zeros(width)]), rcond=None)[0]
        np.testing.assert_allclose(got[s], want, rtol=1e-5, atol=1e-6)


def test_the_rows_are_stationary_for_the_models_own_summed_loss(grouped: RatingData) -> None:
    """The gradient of Σ (ŷ − y)² + (wd / 2) ‖x‖², through the model's prediction, vanishes at the solved rows."""
    model, d = _model(grouped).double(), _first_round(grouped)
    users = solve_user_rows(model, d, WD).requires_grad_(True)
    shared = {n: p.detach() for n, p in model.shared_parameters().items()}
    loss = sse_losses(model, d, shared, users, model.item_emb.detach()[d.row_item]).sum() + WD / 2 * (
        users ** 2).sum()
    (grad,) = torch.autograd.grad(loss, users)
    assert float(grad.abs().max()) < 1e-9
    assert float(users.detach().abs().max()) > 1e-3  # not the trivial zero


def _task(data: RatingData, model: object = None, aggregator: object = None, **kw: object) -> FedRecTask:
    """Matrix factorisation with biases on the summed loss, users solving their rows, half the clients a round."""
    settings = dict(strategy=Strategy("poisson", sample_rate=0.5), objective="sse", weight_decay=WD,
                    user_solve=True, privacy=None)
    settings.update(kw)
    privacy = settings.pop("privacy")
    return FedRecTask(data, model or _model(data), aggregator or FedSGD("uniform", reduce="sum"), privacy,
                      rounds=data.rounds, pseudo_items=0, seed=3, **settings)


def test_the_round_solves_its_clients_rows_first_and_leaves_the_others(grouped: RatingData) -> None:
    task = _task(grouped)
    before = task.model.user_emb.detach().clone()
    start = _model(grouped)  # the model the clients download
    task.run_round(0)
    d = _first_round(grouped)
    trained = torch.zeros(grouped.num_users, dtype=torch.bool)
    trained[torch.from_numpy(np.flatnonzero(np.isin(grouped.client_of_user, task.last_uploads.clients.numpy())))] \
        = True
    solved = dict(zip(d.users.tolist(), solve_user_rows(start, d, WD)))
    assert 0 < int(trained.sum()) < grouped.num_users  # sampling acted
    after = task.model.user_emb.detach()
    for user in range(grouped.num_users):
        if trained[user] and user in solved:
            torch.testing.assert_close(after[user], solved[user])
        else:
            assert torch.equal(after[user], before[user])


def test_the_uploads_are_gradients_at_the_solved_rows(grouped: RatingData) -> None:
    """A client's item-row gradient, 2 Σ (ŷ − y) p_u over its raters, uses the row it solved."""
    task = _task(grouped, strategy=Strategy())
    start = _model(grouped)
    task.run_round(0)
    d = _first_round(grouped)
    p = solve_user_rows(start, d, WD)
    up = task.last_uploads
    q, k = start.item_emb.detach(), start.embed_dim
    items = d.row_item[d.entry_row]
    err = (p[d.entry_user, :k] * q[items, :k]).sum(1) + p[d.entry_user, k] + q[items, k] + 0.55 - d.entry_rating
    client = d.user_client[d.entry_user]
    for c in range(0, d.num_clients, 3):
        mine = client == c
        grads = {int(i): 2 * (err[mine & (items == i)].unsqueeze(1) * p[d.entry_user[mine & (items == i)], :k]).sum(0)
                 for i in items[mine].unique()}
        rows = up.row_client == c
        for item, row in zip(up.row_item[rows].tolist(), up.rows[rows]):
            torch.testing.assert_close(row[:k], grads[item], rtol=1e-4, atol=1e-5)


def test_one_and_two_processes_hold_the_same_model(grouped: RatingData) -> None:
    def task():
        dp = ClientDP(grouped.num_clients, "gaussian", epsilon=8.0, delta=1e-5, clip=1.0, placement="server",
                      adjacency="add_remove", sensitivity_factor=1.0)
        return _task(grouped, privacy=dp)

    single = task()
    play_sharded([single], range(ROUNDS))
    tasks = [task(), task()]
    play_sharded(tasks, range(ROUNDS))
    for t in tasks:
        for name, v in single.model.state_dict().items():
            torch.testing.assert_close(t.model.state_dict()[name], v, rtol=5e-6, atol=5e-6)


@pytest.mark.parametrize(("change", "says"), [
    ({"model": "fedgnn"}, "needs model=mf"),
    ({"model": "sigmoid"}, "needs model=mf"),
    ({"objective": "rmse"}, "needs model=mf"),
    ({"weight_decay": 0.0}, "task.weight_decay > 0"),
    ({"user_solve": "yes"}, "task.user_solve must be true or false"),
    ({"aggregator": FedAvg()}, "local steps"),
])
def test_settings_without_the_closed_form_are_refused(grouped: RatingData, change: dict, says: str) -> None:
    models = {"fedgnn": FedGNN(grouped.num_users, grouped.num_items, 3, bias=True, head="linear"),
              "sigmoid": MatrixFactorization(grouped.num_users, grouped.num_items, 3, bias=True)}
    if "model" in change:
        change = {**change, "model": models[change["model"]]}
    with pytest.raises(ConfigError, match=says):
        _task(grouped, **change)


def test_the_sigmoid_head_is_refused_from_the_command_line(compose_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match=r"task.user_solve=true .* \+model.head=linear"):
        build_task(compose_cfg("+experiment=fedgnn_synthetic", "task.rounds=3", "data.users=150", "data.items=80",
                               "data.ratings=4000", "data.num_clients=15", "model=mf", "task.objective=sse",
                               "task.user_solve=true", "+model.bias=true"))
