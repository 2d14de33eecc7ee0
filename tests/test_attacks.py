"""Malicious clients: who is malicious (the keyed stream, against plain-Python splitmix64), what each attack sends
(against formulas written out), the metrics that judge them (benign RMSE, target exposure, against numpy), and that
an attack does what it is for."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedrec.aggregation import FedAvgM
from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.models import MatrixFactorization
from fedrec.recsys import FedSGD, GaussianNoise, ItemPromotion, NormBound, ScaledUpdates
from fedrec.recsys.data import round_data
from fedrec.recsys.evaluate import benign_test_rmse, target_exposure
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.utils.rng import stream_key
from tests.helpers import random_uploads, tiny_fixture, with_malicious
from tests.reference.keyed import reference_uniform

tiny = tiny_fixture(users=60, items=40, seed=7, rounds=4, num_clients=33)


def _round(data: RatingData, r: int = 0):
    tr = data.training_until(r)
    return round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items)


# ------------------------------------------------------------------------------------------------ who
@pytest.mark.parametrize(("fraction", "seed"), [(0.0, 0), (0.05, 0), (0.2, 3), (0.5, 1), (0.99, 2)])
def test_the_malicious_clients_are_the_smallest_draws_of_the_keyed_stream(tiny: RatingData, fraction: float,
                                                                          seed: int) -> None:
    attack = ScaledUpdates(fraction)
    attack.setup(tiny, seed)
    key = int(stream_key(seed, "attack.clients"))
    draws = [reference_uniform(key, c, 0) for c in range(tiny.num_clients)]
    count = math.floor(fraction * tiny.num_clients + 1e-9)
    want = sorted(sorted(range(tiny.num_clients), key=lambda c: draws[c])[:count])
    assert torch.nonzero(attack.malicious).reshape(-1).tolist() == want
    again = GaussianNoise(fraction)  # another attack of the same fraction and seed: the same clients
    again.setup(tiny, seed)
    assert torch.equal(again.malicious, attack.malicious)
    benign = attack.benign_users(tiny)
    assert benign.tolist() == [not attack.malicious[c] for c in tiny.client_of_user]


@pytest.mark.parametrize(("build", "field"), [
    (lambda: ScaledUpdates(fraction=1.0), "attack.fraction"),
    (lambda: ScaledUpdates(fraction=-0.05), "attack.fraction"),
    (lambda: GaussianNoise(fraction=0.1, norm=0.0), "attack.norm"),
    (lambda: ItemPromotion(fraction=0.1, norm=-1.0), "attack.norm"),
    (lambda: ItemPromotion(fraction=0.1, target_item=-1), "attack.target_item"),
])
def test_bad_attack_settings_are_one_line_errors_naming_the_field(build, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        build()
    assert "\n" not in str(info.value)


def test_a_target_beyond_the_items_is_refused(tiny: RatingData) -> None:
    with pytest.raises(ConfigError, match=r"attack\.target_item must be an item index below 40"):
        ItemPromotion(0.1, target_item=40).setup(tiny, 0)


# ------------------------------------------------------------------------------------------------ what they send
@pytest.mark.parametrize("factor", [-1.0, 10.0])
def test_scaled_updates_multiply_the_malicious_uploads_alone(tiny: RatingData, factor: float) -> None:
    up = random_uploads(0)
    attack = ScaledUpdates(0.1, factor)
    bad = with_malicious(attack, tiny, up)
    got = attack(up, 0, None, None)
    assert torch.equal(got.shared[bad], factor * up.shared[bad]) and torch.equal(got.shared[~bad], up.shared[~bad])
    row_bad = bad[up.row_client]
    assert torch.equal(got.rows[row_bad], factor * up.rows[row_bad])
    assert torch.equal(got.rows[~row_bad], up.rows[~row_bad]) and torch.equal(got.row_item, up.row_item)


def test_noise_replaces_every_malicious_part_by_a_direction_of_the_given_norm(tiny: RatingData) -> None:
    up = random_uploads(1)
    attack = GaussianNoise(0.1, norm=2.5)
    bad = with_malicious(attack, tiny, up)
    got = attack(up, 3, None, None)
    row_bad = bad[up.row_client]
    torch.testing.assert_close(got.shared[bad].norm(dim=1), torch.full((3,), 2.5, dtype=torch.float64))
    torch.testing.assert_close(got.rows[row_bad].norm(dim=1), torch.full((int(row_bad.sum()),), 2.5,
                                                                         dtype=torch.float64))
    assert torch.equal(got.shared[~bad], up.shared[~bad]) and torch.equal(got.rows[~row_bad], up.rows[~row_bad])
    assert torch.equal(attack(up, 3, None, None).rows, got.rows)  # keyed: the same round draws the same
    assert not torch.equal(attack(up, 4, None, None).rows[row_bad], got.rows[row_bad])
    # the directions are independent across rows: no two malicious rows are parallel
    unit = got.rows[row_bad] / 2.5
    cos = unit @ unit.T - torch.eye(unit.shape[0], dtype=unit.dtype)
    assert float(cos.abs().max()) < 0.999


def test_item_promotion_sends_the_step_towards_the_attackers_mean_user(tiny: RatingData) -> None:
    """With MF, h_u is the user's row: the crafted row is −norm · mean(p_u) / ‖mean(p_u)‖ over the malicious
    clients' users with ratings in the round; every malicious client uploads it once, as the target's row."""
    torch.manual_seed(0)
    model = MatrixFactorization(tiny.num_users, tiny.num_items, 4)
    attack = ItemPromotion(0.3, norm=3.0, target_item=7)
    attack.setup(tiny, 5)
    task = FedRecTask(tiny, model, FedSGD(), rounds=tiny.rounds, pseudo_items=4, seed=5)
    task.run_round(0)
    honest = task.last_uploads
    d = task._prepare(0).data
    got = attack(honest, 0, model, d)
    present = set(d.users.tolist())
    users = [u for u in range(tiny.num_users) if attack.malicious[tiny.client_of_user[u]] and u in present]
    mean = model.user_emb.detach()[users].mean(0)
    crafted = -3.0 * mean / mean.norm()
    bad = attack.malicious[got.clients]
    for c in range(got.clients.numel()):
        mine = got.row_client == c
        target_rows = got.rows[mine & (got.row_item == 7)]
        if bad[c]:
            assert target_rows.shape[0] == 1
            torch.testing.assert_close(target_rows[0], crafted)
        else:  # a benign client's upload is untouched
            assert torch.equal(got.rows[mine], honest.rows[honest.row_client == c])
    assert bool((got.row_client[1:] >= got.row_client[:-1]).all())  # rows stay grouped by client
    assert attack.summary() == {"attack": "ItemPromotion", "malicious_clients": 9, "target_item": 7}


def test_the_default_target_is_a_less_popular_item_fixed_by_the_seed(data_dir) -> None:
    data = load_ratings("ml-100k", data_dir, seed=0, rounds=3)
    counts = np.bincount(data.training.item, minlength=data.num_items)
    targets = set()
    for seed in range(6):
        attack = ItemPromotion(0.05)
        attack.setup(data, seed)
        again = ItemPromotion(0.2)
        again.setup(data, seed)
        assert again.target == attack.target
        assert counts[attack.target] <= np.median(counts)
        targets.add(attack.target)
    assert len(targets) > 1


# ------------------------------------------------------------------------------------------------ metrics
def test_exposure_and_benign_rmse_equal_numpy(tiny: RatingData) -> None:
    torch.manual_seed(2)
    model = MatrixFactorization(tiny.num_users, tiny.num_items, 4)
    d = _round(tiny, 1)
    P, Q = model.user_emb.detach().numpy(), model.item_emb.detach().numpy()
    rated = np.zeros((tiny.num_users, tiny.num_items), dtype=bool)
    rated[d.users[d.entry_user].numpy(), d.row_item[d.entry_row].numpy()] = True
    users = np.array([0, 3, 4, 9, 11, 20, 33, 41, 59])
    for target in (0, 5, 17):
        hits, eligible = 0, 0
        for u in users:
            if rated[u, target]:
                continue
            eligible += 1
            scores = P[u] @ Q.T
            above = sum(1 for i in range(tiny.num_items) if not rated[u, i] and scores[i] > scores[target])
            hits += above < 10
        assert target_exposure(model, d, target, torch.from_numpy(users)) == pytest.approx(hits / eligible, abs=0)
    benign = np.zeros(tiny.num_users, dtype=bool)
    benign[users] = True
    test = tiny.test
    keep = benign[test.user]
    pred = 1 / (1 + np.exp(-(P[test.user[keep]] * Q[test.item[keep]]).sum(1)))
    want = float(np.sqrt(np.mean((pred - test.rating[keep]) ** 2)))
    assert benign_test_rmse(model, tiny, d, benign) == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------------------------------------ effect
def _exposure_after(data: RatingData, fraction: float, aggregator) -> float:
    torch.manual_seed(0)
    model = MatrixFactorization(data.num_users, data.num_items, 4)
    with torch.no_grad():  # users share a direction, as a trained model's do (so the attacker's users stand for all)
        model.user_emb += torch.tensor([3.0, 0.0, 0.0, 0.0])
    task = FedRecTask(data, model, aggregator, rounds=data.rounds, pseudo_items=4, seed=1,
                      server=FedAvgM(lr=1.0, beta1=0.0), attack=ItemPromotion(fraction, norm=50.0, target_item=3))
    return FederatedTrainer(enable_progress_bar=False).fit(task)[-1]["test_target_exposure"]


def test_item_promotion_raises_exposure_and_norm_bounding_blunts_it(tiny: RatingData) -> None:
    """Under plain averaging (FedAvgM without momentum) the crafted rows' size counts: 30% malicious clients put
    the target in every benign user's top-10, which few had without them; rows bounded to norm 0.01 keep it out."""
    clean = _exposure_after(tiny, 0.0, FedSGD())
    attacked = _exposure_after(tiny, 0.3, FedSGD())
    bounded = _exposure_after(tiny, 0.3, NormBound(0.01))
    assert clean < 0.1 and attacked == 1.0 and bounded < 0.1
