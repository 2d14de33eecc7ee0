"""FedRecTask under the trainer: budgets (the planner hook), accounting, the noise that really reaches the server,
X^t, local user rows and exact resume."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP, opacus_accountant
from fedrec.recsys import FedAvg, FedSGD, Strategy
from fedrec.recsys.data import round_data
from fedrec.recsys.local import local_updates
from fedrec.recsys.upload import sample_pseudo_items, upload_item_ids
from fedrec.tasks import FedRecTask
from fedrec.trainer import Callback, FederatedTrainer
from tests.helpers import make_task, tiny_fixture

ROUNDS = 6
tiny = tiny_fixture(users=30, items=40, seed=1, rounds=ROUNDS, num_clients=8)


class SetBudget(Callback):
    """Sets a per-round budget from a function of the round (the planner hook) and records the spending."""

    def __init__(self, budget_of_round):
        self.budget_of_round = budget_of_round
        self.spent: list[torch.Tensor] = []

    def on_round_start(self, trainer, task, round_idx):
        task.set_round_budget(self.budget_of_round(round_idx))

    def on_round_end(self, trainer, task, round_idx, metrics):
        self.spent.append(task.privacy.spent().clone())


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize("share", [0.3, 0.45])
def test_no_client_ever_exceeds_its_total_and_the_run_stops(tiny: RatingData, mechanism: str, share: float) -> None:
    dp = ClientDP(tiny.num_clients, mechanism, epsilon=2.0, delta=1e-5)
    task = make_task(tiny, dp)
    cb = SetBudget(lambda r: share * dp.total_budget)  # too generous: the budget runs out before round T
    trainer = FederatedTrainer(callbacks=[cb], enable_progress_bar=False)
    hist = trainer.fit(task)
    for spent in cb.spent:
        assert bool((spent <= dp.epsilon_total).all())
    assert trainer.should_stop and len(hist) < ROUNDS
    assert hist[-1]["clients"] == 0 and hist[0]["clients"] == tiny.num_clients
    assert float(dp.spent().max()) <= 2.0
    assert float(dp.spent().max()) > 2.0 * 0.5  # and the budget was really used


def test_heterogeneous_budgets_reach_the_accountant_and_match_opacus(tiny: RatingData) -> None:
    dp = ClientDP(tiny.num_clients, "gaussian", epsilon=8.0, delta=1e-5)
    base = dp.uniform_budget(ROUNDS)
    per_client = torch.linspace(0.5, 1.0, tiny.num_clients, dtype=torch.float64)
    task = make_task(tiny, dp)
    FederatedTrainer(callbacks=[SetBudget(lambda r: base * per_client * (1 + (r % 2) * 0.2) / 1.2)],
                     enable_progress_bar=False).fit(task)
    hist = dp.accountant.state_dict()["history"]
    assert hist.shape == (ROUNDS, tiny.num_clients)
    for r in range(ROUNDS):
        expect = dp.levels(base * per_client * (1 + (r % 2) * 0.2) / 1.2)
        assert torch.allclose(hist[r], expect, rtol=0, atol=0)
    spent = dp.spent()
    for c in (0, tiny.num_clients - 1):
        acc = opacus_accountant("rdp", dp.accountant.history(c))
        assert spent[c] == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-12)
    assert spent[0] < spent[-1] <= 8.0


def test_uniform_split_is_the_default_and_spends_the_whole_budget(tiny: RatingData) -> None:
    for mechanism in ("gaussian", "laplace"):
        dp = ClientDP(tiny.num_clients, mechanism, epsilon=3.0, delta=1e-5, accountant="rdp")
        hist = FederatedTrainer(enable_progress_bar=False).fit(make_task(tiny, dp))
        assert len(hist) == ROUNDS and all(h["clients"] == tiny.num_clients for h in hist)
        spent = dp.spent()
        assert bool((spent <= 3.0).all()) and float(spent.min()) > 3.0 * (0.999 if mechanism == "laplace" else 0.97)


def test_budget_hook_needs_privacy_and_rejects_bad_budgets(tiny: RatingData) -> None:
    with pytest.raises(ConfigError, match="privacy"):
        make_task(tiny).set_round_budget(0.1)
    task = make_task(tiny, ClientDP(tiny.num_clients, "laplace", epsilon=1.0))
    with pytest.raises(ConfigError, match="budget"):
        task.set_round_budget(0.0)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_the_server_receives_noise_at_the_calibrated_scale(data_dir: Path, mechanism: str) -> None:
    data = load_ratings("ml-100k", data_dir, seed=0, rounds=10)
    dp = ClientDP(data.num_clients, mechanism, epsilon=10.0, delta=1e-5, clip=0.1)
    task = make_task(data, dp)
    task.run_round(0)
    before = copy.deepcopy(task.model)
    prep = task._prepare(1)
    clean = local_updates(before, prep.data)
    task.run_round(1)
    up = task.last_uploads
    d, n = prep.data, data.num_items
    # the upload is shuffled: find each real row by its (client, item) pair
    key, wanted = up.clients[up.row_client] * n + up.row_item, d.clients[d.row_client] * n + d.row_item
    order = torch.argsort(key)
    at = order[torch.searchsorted(key[order], wanted)]
    assert torch.equal(key[at], wanted)
    real = up.rows[at]
    clipped = dp.mechanism.clip_parts([clean.rows], [d.row_client], d.num_clients)[0]
    noise = (real - clipped).double()
    expected = float(dp.mechanism.noise_std(dp.levels(torch.tensor(dp.uniform_budget(10)))))
    assert abs(float(noise.std()) / expected - 1) < 0.05
    assert abs(float(noise.mean())) < 0.05 * expected


def test_upload_items_is_x_t_real_and_pseudo(tiny: RatingData) -> None:
    task = make_task(tiny)
    X = task.upload_items(2)
    assert X.shape == (tiny.num_clients, tiny.num_items)
    task.run_round(0), task.run_round(1)
    task.run_round(2)
    up = task.last_uploads
    pairs = set(zip(up.clients[up.row_client].tolist(), up.row_item.tolist()))
    rows, cols = X.nonzero()
    assert set(zip(rows.tolist(), cols.tolist())) == pairs
    assert X.has_sorted_indices  # X^t lists item ids sorted: nothing tells real from pseudo items
    d = task._prepare(2).data
    assert torch.equal(torch.as_tensor(X.sum(1)).flatten().long()[d.clients], d.rows_per_client() + 5)


@pytest.mark.parametrize("pseudo_items", [0, 5, 40])
def test_upload_items_equals_a_plain_construction(tiny: RatingData, pseudo_items: int) -> None:
    """X^t against scipy's COO construction of the same (client, item) pairs: same 0/1 entries, each row's ids
    strictly increasing; 40 pseudo items exceed some clients' unrated items (invalid draws are left out)."""
    import scipy.sparse as sp

    task = FedRecTask(tiny, FedGNN(tiny.num_users, tiny.num_items, 4), FedSGD(), rounds=tiny.rounds,
                      pseudo_items=pseudo_items, seed=3)
    for r in (0, tiny.rounds - 1):
        X, prep = task.upload_items(r), task._prepare(r)
        d = prep.data
        owner = torch.cat([d.clients[d.row_client], d.clients.unsqueeze(1).expand_as(prep.pseudo)[prep.pseudo_valid]])
        items = torch.cat([d.row_item, prep.pseudo[prep.pseudo_valid]])
        ref = sp.coo_matrix((np.ones(len(items)), (owner.numpy(), items.numpy())), shape=X.shape).tocsr()
        assert (X != ref).nnz == 0 and np.all(X.data == 1.0) and X.dtype == np.float64
        assert all(np.all(np.diff(X.indices[a:b]) > 0) for a, b in zip(X.indptr[:-1], X.indptr[1:]))
        if pseudo_items == 40:
            assert not bool(prep.pseudo_valid.all())


@settings(max_examples=40, deadline=None)
@given(users=st.integers(1, 30), items=st.integers(1, 60), ratings=st.integers(0, 300), clients=st.integers(1, 12),
       pseudo=st.integers(0, 70), seed=st.integers(0, 10**6))
def test_upload_item_ids_are_each_clients_sorted_union_of_real_and_pseudo_items(users, items, ratings, clients,
                                                                                 pseudo, seed) -> None:
    """The compiled merge against Python sets: every client's row lists its rated items and its valid pseudo items,
    each once, ascending; clients without ratings this round have empty rows."""
    rng = np.random.default_rng(seed)
    client_of_user = rng.integers(0, clients, users)
    d = round_data(rng.integers(0, users, ratings), rng.integers(0, items, ratings), np.ones(ratings),
                   client_of_user, items)
    pseudo_items, valid = sample_pseudo_items(d, items, pseudo, int(rng.integers(2**62)))
    indptr, ids = upload_item_ids(d, pseudo_items, valid, clients)
    expected = {c: set() for c in range(clients)}
    for row, item in zip(d.row_client.tolist(), d.row_item.tolist()):
        expected[int(d.clients[row])].add(item)
    for c, (row, ok) in enumerate(zip(pseudo_items.tolist(), valid.tolist())):
        expected[int(d.clients[c])].update(i for i, v in zip(row, ok) if v)
    assert indptr[0] == 0 and len(indptr) == clients + 1 and len(ids) == indptr[-1]
    for c in range(clients):
        assert ids[indptr[c]:indptr[c + 1]].tolist() == sorted(expected[c])


@pytest.mark.parametrize("model_cls", [FedGNN, MatrixFactorization])
def test_user_rows_of_users_without_training_data_stay_put(tiny: RatingData, model_cls) -> None:
    task = make_task(tiny, model_cls=model_cls)
    start = task.model.user_emb.detach().clone()
    task.run_round(0)
    d = task._prepare(0).data
    moved = (task.model.user_emb.detach() != start).any(1)
    has_data = torch.zeros(tiny.num_users, dtype=torch.bool)
    has_data[d.users] = True
    assert torch.equal(moved, has_data)


def test_task_rejects_mismatched_settings(tiny: RatingData) -> None:
    model = FedGNN(tiny.num_users, tiny.num_items, 4)
    with pytest.raises(ConfigError, match="task.rounds"):
        FedRecTask(tiny, model, FedSGD(), rounds=ROUNDS + 1)
    with pytest.raises(ConfigError, match="task.optimizer"):
        FedRecTask(tiny, model, FedSGD(), rounds=ROUNDS, optimizer="lbfgs")
    with pytest.raises(ConfigError, match="model is sized"):
        FedRecTask(tiny, FedGNN(tiny.num_users + 1, tiny.num_items, 4), FedSGD(), rounds=ROUNDS)
    with pytest.raises(ConfigError, match="privacy is set up for"):
        FedRecTask(tiny, model, FedSGD(), ClientDP(tiny.num_clients + 1, "laplace"), rounds=ROUNDS)


def test_private_uploads_carry_no_rating_counts(tiny: RatingData) -> None:
    """Review finding: with several users per client the rating count is not visible in X^t, so DP runs must
    neither send it nor weight by it."""
    dp = ClientDP(tiny.num_clients, "gaussian", epsilon=4.0)
    with pytest.raises(ConfigError, match="aggregator.weighting=ratings"):
        make_task(tiny, dp, aggregator=FedAvg(weighting="ratings"))
    task = make_task(tiny, dp, aggregator=FedAvg(), strategy=Strategy(local_steps=2))
    task.run_round(0)
    assert task.last_uploads.num_ratings is None
    plain = make_task(tiny, aggregator=FedAvg(weighting="ratings"))
    plain.run_round(0)
    assert plain.last_uploads.num_ratings.sum() == len(tiny.training_until(0))


@pytest.mark.parametrize("optimizer_state", ["persistent", "reset"])
def test_dp_run_resumes_exactly(tiny: RatingData, tmp_path: Path, optimizer_state: str) -> None:
    def fresh():
        dp = ClientDP(tiny.num_clients, "gaussian", epsilon=4.0, delta=1e-5)
        return make_task(tiny, dp, aggregator=FedAvg(), strategy=Strategy(local_steps=2),
                         optimizer_state=optimizer_state)

    full_task = fresh()
    full = FederatedTrainer(default_root_dir=tmp_path / "full", enable_progress_bar=False).fit(full_task)
    part_dir = tmp_path / "part"
    FederatedTrainer(default_root_dir=part_dir, max_rounds=3, enable_progress_bar=False).fit(fresh())
    resumed_task = fresh()
    resumed = FederatedTrainer(default_root_dir=tmp_path / "resumed", enable_progress_bar=False).fit(
        resumed_task, ckpt_path=part_dir / "checkpoints" / "last.ckpt")
    assert resumed == full
    assert torch.equal(resumed_task.privacy.spent(), full_task.privacy.spent())
    assert resumed_task.summary() == full_task.summary()
    assert not any(math.isnan(h["test_rmse"]) for h in full)
