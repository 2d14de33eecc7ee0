"""task.item_solve: the server's Newton item step of alternating least squares. Its uploads against a plain loop
over each client's ratings; its step against a dense per-item solve, and against the exact ridge solution where
the shared second moment is exact (every user rates every item); its fixed point where the items' gradient
vanishes, with and without count weights; the weights themselves; the noise ridge against a dense solve and the
averaged counts against their precision-weighted mean; the averaging clock across a checkpoint and a resumed private
run; the noise that server placement adds to its sums, of the stated scale; and the settings it refuses."""
from __future__ import annotations

from collections.abc import Callable
from unittest import mock

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError
from fedrec.models import MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.privacy.central import clipped_sums
from fedrec.recsys import FedSGD, Strategy
from fedrec.recsys.data import round_data
from fedrec.recsys.item_solve import COUNT_WEIGHT, MOMENT_WEIGHT, ItemSolve, ItemSolveStep
from fedrec.recsys.local import solve_user_rows
from fedrec.tasks import FedRecTask
from tests.helpers import tiny_fixture

grouped = tiny_fixture(users=60, items=50, seed=2, rounds=3, num_clients=13)
WD, K, MU = 0.8, 3, 0.55


def _model(data: RatingData, seed: int = 5) -> MatrixFactorization:
    torch.manual_seed(seed)
    model = MatrixFactorization(data.num_users, data.num_items, K, bias=True, head="linear", init_std=0.5,
                                init_bias=MU)
    with torch.no_grad():
        model.item_emb[:, -1] = 0.1 * torch.randn(data.num_items)
        model.user_emb[:, -1] = 0.1 * torch.randn(data.num_users)
    return model.double()


def _round(data: RatingData):
    tr = data.training_until(0)
    return round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items)


@pytest.mark.parametrize("weighted", [False, True])
def test_the_uploads_are_each_clients_residual_sums_counts_and_moment(grouped: RatingData, weighted: bool) -> None:
    spec, model, d = ItemSolve(factor_scale=3.0), _model(grouped), _round(grouped)
    weights = torch.linspace(0.2, 3.0, grouped.num_items, dtype=torch.float64) if weighted else None
    up = spec.statistics(model, d, weights)
    users, items = model.user_emb.detach().numpy(), model.item_emb.detach().numpy()
    ratings = {(int(u), int(i)): float(r) for u, i, r in zip(*[np.asarray(x) for x in (
        d.users[d.entry_user], d.row_item[d.entry_row], d.entry_rating)])}
    clients = d.clients.numpy()
    for row in range(d.row_item.numel()):  # a plain loop over the client's users who rated the row's item
        c, item = clients[int(d.row_client[row])], int(d.row_item[row])
        want = np.zeros(K + 2)
        for u in np.flatnonzero(grouped.client_of_user == c):
            if (u, item) in ratings:
                pred = float(model.global_bias.detach()) + users[u, K] + items[item, K] + users[u, :K] @ items[item, :K]
                want[:K + 1] += (ratings[u, item] - pred) * np.append(3.0 * users[u, :K], 1.0)
                want[K + 1] += COUNT_WEIGHT
        np.testing.assert_allclose(up.rows[row].numpy(), want * (1.0 if weights is None else float(weights[item])),
                                   rtol=1e-10, atol=1e-12)
    moment = up.flat_shared().numpy()
    for j in range(len(clients)):
        feats = [np.append(3.0 * users[u, :K], 1.0) for u in d.users.numpy()[d.user_client.numpy() == j]]
        np.testing.assert_allclose(moment[j], MOMENT_WEIGHT * sum(np.outer(f, f) for f in feats).ravel(), rtol=1e-10)
    assert float(up.users.abs().max()) == 0.0  # the rows stay with the clients, solved


def _sums(spec: ItemSolve, model: MatrixFactorization, d, weights: torch.Tensor | None = None
          ) -> tuple[torch.Tensor, torch.Tensor]:
    up = spec.statistics(model, d, weights)
    rows = torch.zeros(model.num_items, K + 2, dtype=torch.float64).index_add_(0, d.row_item, up.rows)
    return up.flat_shared().sum(0), rows


def test_the_step_is_the_dense_newton_step_of_each_item(grouped: RatingData) -> None:
    spec, model, d = ItemSolve(ridge=2.0, factor_scale=3.0, average_from=None), _model(grouped), _round(grouped)
    shared, rows = _sums(spec, model, d)
    before = model.item_emb.detach().clone()
    ItemSolveStep(spec, 0.5)(model, shared, torch.arange(model.num_items), rows)
    m = shared.view(K + 1, K + 1) / MOMENT_WEIGHT
    m = m / m[K, K]
    lam = 2.0 * 0.5
    for i in range(model.num_items):
        v = torch.cat([before[i, :K] / 3.0, before[i, K:]])
        a = rows[i, K + 1] / COUNT_WEIGHT * m + lam * torch.eye(K + 1, dtype=torch.float64)
        new = v + torch.linalg.solve(a, rows[i, :K + 1] - lam * v)
        torch.testing.assert_close(model.item_emb.detach()[i], torch.cat([3.0 * new[:K], new[K:]]))


def test_one_step_is_the_exact_ridge_solution_when_every_user_rates_every_item() -> None:
    """Then every item's Hessian is n·M exactly, and the Newton step lands on numpy's ridge least squares."""
    rng = np.random.default_rng(0)
    users, items = 12, 7
    user, item = (a.ravel() for a in np.meshgrid(np.arange(users), np.arange(items), indexing="ij"))
    d = round_data(user, item, rng.uniform(0.2, 1.0, user.size).astype(np.float32), np.arange(users) % 4, items)
    model = MatrixFactorization(users, items, K, bias=True, head="linear", init_std=0.5, init_bias=MU).double()
    spec = ItemSolve(ridge=1.5, factor_scale=2.0, average_from=None)
    shared, rows = _sums(spec, model, d)
    ItemSolveStep(spec, 1.0)(model, shared, torch.arange(items), rows)
    u = model.user_emb.detach().numpy()
    feats = np.hstack([2.0 * u[:, :K], np.ones((users, 1))])
    rating = np.zeros((users, items))
    rating[d.users[d.entry_user].numpy(), d.row_item[d.entry_row].numpy()] = d.entry_rating.double().numpy()
    for i in range(items):
        y = rating[:, i] - float(model.global_bias.detach()) - u[:, K]
        stacked = np.vstack([feats, np.sqrt(1.5) * np.eye(K + 1)])
        want = np.linalg.lstsq(stacked, np.concatenate([y, np.zeros(K + 1)]), rcond=None)[0]
        got = model.item_emb.detach().numpy()[i]
        np.testing.assert_allclose(np.append(got[:K] / 2.0, got[K]), want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("power", [0.0, 0.5])
def test_items_where_the_gradient_vanishes_do_not_move(grouped: RatingData, power: float) -> None:
    """The approximate Hessian changes the path, not the fixed point: set every item to its ridge solution (numpy;
    with count weights f_i, the ridge λ / f_i) and the step leaves it there, averaging or not."""
    model, d = _model(grouped), _round(grouped)
    spec = ItemSolve(ridge=1.0, factor_scale=2.0, average_from=0, count_power=power)
    step = ItemSolveStep(spec, 1.0)
    step.counts = torch.linspace(0.5, 40.0, model.num_items, dtype=torch.float64)  # as if from an earlier step
    weights = step.item_weights()
    assert (weights is None) == (power == 0)
    ridge = np.ones(model.num_items) if weights is None else 1.0 / weights.numpy()
    u, k = model.user_emb.detach().numpy(), K
    user, item = d.users[d.entry_user].numpy(), d.row_item[d.entry_row].numpy()
    y = d.entry_rating.double().numpy() - float(model.global_bias.detach()) - u[user, k]
    with torch.no_grad():
        for i in range(model.num_items):
            mine = item == i
            a = np.hstack([2.0 * u[user[mine], :k], np.ones((int(mine.sum()), 1))])
            stacked = np.vstack([a, np.sqrt(ridge[i]) * np.eye(k + 1)])
            x = np.linalg.lstsq(stacked, np.concatenate([y[mine], np.zeros(k + 1)]), rcond=None)[0]
            model.item_emb[i] = torch.from_numpy(np.append(2.0 * x[:k], x[k]))
    before = model.item_emb.detach().clone()
    shared, rows = _sums(spec, model, d, weights)
    step(model, shared, torch.arange(model.num_items), rows)
    torch.testing.assert_close(model.item_emb.detach(), before, rtol=0, atol=1e-12)


def test_count_weights_follow_the_counts_power_at_unit_mean_square_over_ratings() -> None:
    """f_i ∝ max(n_i, 1)^(−a) with Σ n_i f_i² = Σ n_i; after a step the counts are the weighted count sums over
    the weights the clients used."""
    step = ItemSolveStep(ItemSolve(count_power=0.5), 1.0)
    assert step.item_weights() is None  # no counts before the first step
    step.counts = torch.tensor([0.0, 1.0, 4.0, 100.0], dtype=torch.float64)
    f = step.item_weights()
    torch.testing.assert_close(f / f[2], torch.tensor([2.0, 2.0, 1.0, 0.2], dtype=torch.float64))
    torch.testing.assert_close((step.counts * f ** 2).sum(), step.counts.sum())


def test_the_steps_average_from_their_round_and_the_clock_survives_a_checkpoint(grouped: RatingData) -> None:
    """From step ``average_from`` on, each step moves an item 1/2, 1/3, ... of its Newton step; a restored step
    continues the clock."""
    model, d = _model(grouped), _round(grouped)
    spec = ItemSolve(ridge=1.0, factor_scale=2.0, average_from=1)
    full = ItemSolve(ridge=1.0, factor_scale=2.0, average_from=None)
    shared, rows = _sums(spec, model, d)

    def moved(step: ItemSolveStep) -> torch.Tensor:
        m = model.double()
        m.load_state_dict(_model(grouped).state_dict())
        before = m.item_emb.detach().clone()
        step(m, shared, torch.arange(m.num_items), rows)
        return m.item_emb.detach() - before

    whole = moved(ItemSolveStep(full, 1.0))
    step = ItemSolveStep(spec, 1.0)
    for fraction in (1.0, 1 / 2, 1 / 3):  # steps 0 (before averaging), 1, 2
        torch.testing.assert_close(moved(step), fraction * whole)
    restored = ItemSolveStep(spec, 1.0)
    restored.load_state_dict(model, step.state_dict())
    torch.testing.assert_close(moved(restored), whole / 4)


def test_the_noise_ridge_is_each_items_ridge_along_the_moments_eigenvectors(grouped: RatingData) -> None:
    """With noise of std σ on the sums, item i's ridge along the moment's eigenvector k is λ + ρσ²/(n_i e_k): the
    step against a dense per-item solve with that ridge matrix (numpy's eigenbasis); without noise it is the plain
    step, bit for bit."""
    spec = ItemSolve(ridge=2.0, factor_scale=3.0, average_from=None, noise_ridge=0.7)
    model, d = _model(grouped), _round(grouped)
    shared, rows = _sums(spec, model, d)
    before = model.item_emb.detach().clone()
    ItemSolveStep(spec, 0.5, lambda: 1.3)(model, shared, torch.arange(model.num_items), rows)
    m = (shared.view(K + 1, K + 1) / MOMENT_WEIGHT).numpy()
    m = (m + m.T) / 2 / m[K, K]
    e, q = np.linalg.eigh(m)
    for i in range(model.num_items):
        n = float(rows[i, K + 1]) / COUNT_WEIGHT
        ridge = q @ np.diag(2.0 * 0.5 + 0.7 * 1.3 ** 2 / np.maximum(n * e, 1e-6)) @ q.T
        v = np.append(before[i, :K].numpy() / 3.0, before[i, K].numpy())
        new = v + np.linalg.solve(n * m + ridge, rows[i, :K + 1].numpy() - ridge @ v)
        np.testing.assert_allclose(model.item_emb.detach()[i].numpy(), np.append(3.0 * new[:K], new[K:]),
                                   rtol=1e-8, atol=1e-10)
    quiet, plain = _model(grouped), _model(grouped)
    ItemSolveStep(spec, 0.5, lambda: 0.0)(quiet, shared, torch.arange(model.num_items), rows)
    ItemSolveStep(ItemSolve(ridge=2.0, factor_scale=3.0, average_from=None), 0.5)(
        plain, shared, torch.arange(model.num_items), rows)
    assert torch.equal(quiet.item_emb, plain.item_emb)


def test_averaged_counts_are_the_mean_of_every_steps_and_survive_a_checkpoint(grouped: RatingData) -> None:
    """Under count_average each step's Hessians take the mean of the steps' count estimates so far (its sums' count
    over the weights the clients used, then the weights again), each weighted by its precision (f_i / σ_t)²: the
    third step against a dense Newton step at that mean, and a step restored after two continues it."""
    spec = ItemSolve(ridge=1.0, factor_scale=2.0, average_from=None, count_power=0.5, count_average=True)
    model, d = _model(grouped), _round(grouped)
    noise = torch.Generator().manual_seed(0)
    rounds, sigmas = [], iter([2.0, 2.0, 0.5, 0.5])  # the third step's σ, also for the restored one
    step = ItemSolveStep(spec, 1.0, lambda: next(sigmas))
    for _ in range(3):
        weights = step.item_weights()
        shared, rows = _sums(spec, model, d, weights)
        rows[:, K + 1] += 0.5 * torch.randn(model.num_items, generator=noise, dtype=torch.float64)  # noised counts
        rounds.append((weights, shared, rows))
        if len(rounds) == 3:
            before, restored = model.item_emb.detach().clone(), ItemSolveStep(spec, 1.0, lambda: next(sigmas))
            restored.load_state_dict(model, step.state_dict())
        step(model, shared, torch.arange(model.num_items), rows)
    raw = [r[:, K + 1] / COUNT_WEIGHT / (1.0 if w is None else w) for w, _, r in rounds]
    precision = [(1.0 if w is None else w) ** 2 / sigma ** 2 for (w, _, _), sigma in zip(rounds, (2.0, 2.0, 0.5))]
    mean = (sum(p * c for p, c in zip(precision, raw)) / sum(precision)).clamp(min=0.0)
    torch.testing.assert_close(step.counts, mean)
    weights, shared, rows = rounds[2]
    m = shared.view(K + 1, K + 1) / MOMENT_WEIGHT
    m = (m + m.T) / 2 / m[K, K]
    for i in range(model.num_items):
        v = torch.cat([before[i, :K] / 2.0, before[i, K:]])
        a = mean[i] * weights[i] * m + torch.eye(K + 1, dtype=torch.float64)
        new = v + torch.linalg.solve(a, rows[i, :K + 1] - v)
        torch.testing.assert_close(model.item_emb.detach()[i], torch.cat([2.0 * new[:K], new[K:]]))
    again = _model(grouped)
    with torch.no_grad():
        again.item_emb.copy_(before)
    restored(again, shared, torch.arange(model.num_items), rows)
    assert torch.equal(again.item_emb, model.item_emb)


def _task(data: RatingData, privacy: ClientDP | None = None, **kw: object) -> FedRecTask:
    settings = dict(strategy=Strategy(), objective="sse", weight_decay=WD, user_solve=True,
                    item_solve={"enabled": True, "ridge": 5.0, "factor_scale": 2.0, "average_from": 2})
    settings.update(kw)
    aggregator = settings.pop("aggregator", FedSGD("uniform", reduce="sum"))
    return FedRecTask(data, _model(data).float(), aggregator, privacy, rounds=data.rounds,
                      pseudo_items=settings.pop("pseudo_items", 0), seed=3, **settings)


def test_a_private_round_adds_one_noise_draw_of_the_stated_scale(grouped: RatingData) -> None:
    """Server placement: the step receives the clipped sums of the statistics plus N(0, (z·clip)²) in every
    coordinate, estimated over the ~550 coordinates of the sums (a DP step that adds no noise fails)."""
    dp = ClientDP(grouped.num_clients, "gaussian", epsilon=4.0, delta=1e-5, clip=0.5, placement="server",
                  adjacency="add_remove", sensitivity_factor=1.0)
    task = _task(grouped, privacy=dp, strategy=Strategy("poisson", sample_rate=1.0))
    seen = []
    step = task.strategy.server_step
    spy = mock.Mock(wraps=step, item_weights=step.item_weights)
    spy.side_effect = lambda model, *update: (seen.append(update), step(model, *update))
    task.strategy.server_step = spy
    task.run_round(0)
    up = task.last_uploads
    sums = clipped_sums(dp.mechanism, up.shared, up.rows, up.row_client, up.row_item, grouped.num_items)
    norms = dp.mechanism.client_norms([up.shared, up.rows], [None, up.row_client], up.clients.numel())
    assert float(norms.max()) > 0.5  # the clip acted
    g_shared, items, g_rows = seen[0]
    noise = torch.cat([g_shared.double() - sums.shared, (g_rows.double() - sums.rows[items]).ravel()])
    z = dp.server.update_multiplier
    assert z > 0.5
    assert abs(float(noise.std()) / (z * 0.5) - 1.0) < 0.15  # ≈ 6 standard errors of a ~550-sample std
    assert abs(float(noise.mean())) < 4 * z * 0.5 / noise.numel() ** 0.5
    assert step.noise_stddev() == pytest.approx(z * 0.5)  # what the noise ridge weighs by
    assert task.summary()["epsilon_spent"] <= 4.0


def test_every_client_holds_its_row_solved_against_the_new_table(grouped: RatingData) -> None:
    """After the item step, every client (sampled or not) solves its rows against the table it downloads, so the
    evaluation sees users fitted to the current items."""
    task = _task(grouped, strategy=Strategy("poisson", sample_rate=0.5))
    task.run_round(0)
    d = _round(grouped)
    torch.testing.assert_close(task.model.user_emb.detach()[d.users],
                               solve_user_rows(task.model, d, WD).to(task.model.user_emb.dtype))


@pytest.mark.parametrize("noise_settings", [{}, {"noise_ridge": 20.0, "count_average": True}])
def test_a_resumed_private_run_repeats_the_uninterrupted_one(grouped: RatingData, noise_settings: dict) -> None:
    """Three rounds straight, and two rounds, a checkpoint and the third in a new task: the same model and metrics
    (the averaging clock, the counts, the privacy ledger and the clip travel in the checkpoint)."""
    def task() -> FedRecTask:
        dp = ClientDP(grouped.num_clients, "gaussian", epsilon=4.0, delta=1e-5, clip=0.5, placement="server",
                      adjacency="add_remove", sensitivity_factor=1.0, adaptive_clip=True)
        return _task(grouped, privacy=dp, strategy=Strategy("poisson", sample_rate=0.6),
                     item_solve={"enabled": True, "ridge": 5.0, "factor_scale": 2.0, "average_from": 1,
                                 "count_power": 0.5, **noise_settings})

    full = task()
    want = [full.run_round(r) for r in range(3)]
    first = task()
    for r in range(2):
        first.run_round(r)
    resumed = task()
    resumed.load_state_dict(first.state_dict())
    assert resumed.strategy.server_step.steps == 2
    assert resumed.run_round(2) == want[2]
    for name, v in full.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], v), name


def test_a_checkpoint_of_an_optimiser_run_is_refused(grouped: RatingData) -> None:
    plain = _task(grouped, item_solve=None)
    plain.run_round(0)
    with pytest.raises(ConfigError, match="cannot resume: .*task.item_solve"):
        _task(grouped).load_state_dict(plain.state_dict())


@pytest.mark.parametrize(("change", "says"), [
    ({"user_solve": False}, "task.user_solve=true"),
    ({"pseudo_items": 3}, "task.pseudo_items=0"),
    ({"aggregator": FedSGD("uniform")}, "aggregator.reduce=sum"),
    ({"aggregator": FedSGD(reduce="sum")}, "aggregator.weighting=uniform"),
    ({"item_solve": {"enabled": "yes"}}, "task.item_solve.enabled must be true or false"),
    ({"item_solve": {"enabled": True, "ridge": 0.0}}, "task.item_solve.ridge"),
    ({"item_solve": {"enabled": True, "step": 1}}, "task.item_solve.step: not a field"),
    ({"item_solve": {"enabled": True, "average_from": -1}}, "task.item_solve.average_from"),
    ({"item_solve": {"enabled": True, "count_power": -0.5}}, "task.item_solve.count_power"),
    ({"item_solve": {"enabled": True, "noise_ridge": -1.0}}, "task.item_solve.noise_ridge"),
    ({"item_solve": {"enabled": True, "count_average": 1}}, "task.item_solve.count_average must be true or false"),
])
def test_settings_without_the_step_are_refused(grouped: RatingData, change: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        _task(grouped, **change)


def test_client_placement_is_refused(grouped: RatingData) -> None:
    dp = ClientDP(grouped.num_clients, "gaussian", epsilon=4.0, delta=1e-5, clip=0.5)
    with pytest.raises(ConfigError, match=r"privacy.placement=server"):
        _task(grouped, privacy=dp)


def test_a_run_from_the_command_line(compose_cfg: Callable[..., DictConfig]) -> None:
    args = ("+experiment=fedgnn_synthetic", "task.rounds=3", "data.users=150", "data.items=80", "data.ratings=4000",
            "data.num_clients=15", "model=mf", "+model.head=linear", "+model.bias=true", "+model.init_bias=0.6",
            "task.objective=sse", "task.user_solve=true", "task.weight_decay=2", "task.pseudo_items=0",
            "aggregator=fedsgd", "aggregator.reduce=sum", "aggregator.weighting=uniform")
    task = build_task(compose_cfg(*args, "task.item_solve.enabled=true"))
    assert isinstance(task.strategy.server_step, ItemSolveStep)
    for r in range(3):
        assert np.isfinite(task.run_round(r)["test_rmse"])
    with pytest.raises(ConfigError, match="task.item_solve: .*task.user_solve=true"):
        build_task(compose_cfg(*args[:-6], "task.pseudo_items=0", "aggregator=fedsgd", "aggregator.reduce=sum",
                               "aggregator.weighting=uniform", "task.item_solve.enabled=true"))


def test_a_private_scheduled_run_from_the_command_line(compose_cfg: Callable[..., DictConfig]) -> None:
    """Server placement with the noise schedule, the noise ridge and averaged counts from Hydra: each round draws at
    its scheduled multiplier, which the step weighs by, and the run spends at most its ε."""
    cfg = compose_cfg("+experiment=fedgnn_synthetic", "task.rounds=3", "data.users=150", "data.items=80",
                      "data.ratings=4000", "data.num_clients=15", "model=mf", "+model.head=linear", "+model.bias=true",
                      "+model.init_bias=0.6", "task.objective=sse", "task.user_solve=true", "task.weight_decay=2",
                      "task.pseudo_items=0", "aggregator=fedsgd", "aggregator.reduce=sum",
                      "aggregator.weighting=uniform", "task.item_solve.enabled=true", "task.item_solve.noise_ridge=5",
                      "task.item_solve.count_average=true",
                      "privacy=gaussian", "privacy.placement=server", "privacy.epsilon=4", "privacy.clip=1",
                      "strategy.participation=poisson", "strategy.sample_rate=1.0", "privacy.noise_schedule=[2,1,1]")
    task = build_task(cfg)
    step, server = task.strategy.server_step, task.privacy.server
    assert step.spec.noise_ridge == 5.0 and step.spec.count_average
    for r, g in enumerate((2.0, 1.0, 1.0)):
        assert np.isfinite(task.run_round(r)["test_rmse"])
        assert step.noise_stddev() == pytest.approx(server.base_multiplier * g * 1.0, rel=1e-12)
    summary = task.summary()
    assert summary["noise_schedule"] == [2.0, 1.0, 1.0] and 3.99 <= summary["epsilon_spent"] <= 4.0

