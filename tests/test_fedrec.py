"""Federated recommendation: the batched client computation, pseudo items, aggregation, DP uploads, budgets."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.metrics import rating_metrics
from fedrec.models import FedGNN, MatrixFactorization, StarGAT
from fedrec.privacy import ClientDP, GaussianMechanism, LaplaceMechanism
from fedrec.recsys import Aggregator, FedSGD, Strategy, Uploads
from fedrec.recsys.data import round_data
from fedrec.recsys.local import local_updates
from fedrec.recsys.upload import pseudo_item_rows, sample_pseudo_items
from tests.helpers import write_ml1m
from tests.reference.fedrec_round import reference_client_gradients


@pytest.fixture(scope="module")
def grouped(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
    """40 users in 10 clients (several users per client, as on ML-1M)."""
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"))
    return load_ratings("ml-1m", folder, seed=0, rounds=4, num_clients=10)


@pytest.fixture(scope="module")
def ml100k_small(data_dir: Path) -> RatingData:
    return load_ratings("ml-100k", data_dir, seed=1, rounds=6)


def _round(data: RatingData, r: int = 0):
    tr = data.training_until(r)
    return round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items)


# ------------------------------------------------------------------------------------------------ model
def test_star_gat_equals_pyg_gatconv_at_every_centre() -> None:
    from torch_geometric.nn import GATConv

    torch.manual_seed(0)
    k, sizes = 6, [3, 1, 5]
    ours = StarGAT(k)
    conv = GATConv(k, k, heads=1)
    with torch.no_grad():
        conv.lin.weight.copy_(ours.lin_weight)
        conv.att_src.copy_(ours.att_src.view(1, 1, k))
        conv.att_dst.copy_(ours.att_dst.view(1, 1, k))
        conv.bias.copy_(torch.randn(k))
        ours.bias.copy_(conv.bias)
    centres = torch.randn(len(sizes), k)
    neigh = [torch.randn(n, k) for n in sizes]
    owner = torch.cat([torch.full((n,), s) for s, n in enumerate(sizes)])
    got = ours.attend(dict(ours.named_parameters()), centres, torch.cat(neigh), owner)
    for s, n in enumerate(sizes):
        x = torch.cat([centres[s:s + 1], neigh[s]])
        edge_index = torch.stack([torch.arange(1, n + 1), torch.zeros(n, dtype=torch.long)])
        assert torch.allclose(got[s], conv(x, edge_index)[0], atol=1e-6)
    # per-star parameter copies: each star uses its own
    params = {n: p.detach().expand(len(sizes), *p.shape).clone() for n, p in ours.named_parameters()}
    params["bias"][1] += 1.0
    again = ours.attend(params, centres, torch.cat(neigh), owner)
    assert torch.allclose(again[0], got[0]) and torch.allclose(again[1], got[1] + 1.0)


@pytest.mark.parametrize("model_cls", [FedGNN, MatrixFactorization])
@pytest.mark.parametrize("which", ["grouped", "ml100k_small"])
def test_batched_client_gradients_equal_the_per_client_loop(model_cls, which, request) -> None:
    data: RatingData = request.getfixturevalue(which)
    d = _round(data, 2)
    if which == "ml100k_small":  # a slice of the clients keeps the reference loop short
        keep = np.zeros(data.num_clients, dtype=bool)
        keep[::25] = True
        tr = data.training_until(2)
        d = round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items, keep)
    torch.manual_seed(3)
    model = model_cls(data.num_users, data.num_items, 8)
    upd = local_updates(model, d)
    ref = reference_client_gradients(model, d)
    assert len(ref) == d.num_clients
    for c, r in enumerate(ref):
        assert torch.allclose(upd.loss[c], r["loss"], atol=1e-6)
        for name in model.shared_parameters():
            assert torch.allclose(upd.shared[name][c], r[name], atol=1e-5), name
        assert torch.allclose(upd.users[d.user_client == c], r["users"], atol=1e-5)
        assert torch.allclose(upd.rows[d.row_client == c], r["rows"], atol=1e-5)


def test_one_local_step_of_fedavg_is_the_gradient(grouped: RatingData) -> None:
    d = _round(grouped)
    torch.manual_seed(0)
    model = FedGNN(grouped.num_users, grouped.num_items, 4).double()
    g = local_updates(model, d, local_steps=1)
    # k local steps upload (start - end) / lr: k gradients summed along the path, 3 g as lr -> 0 (and not at lr 1)
    tiny = local_updates(model, d, local_steps=3, local_lr=1e-6)
    big = local_updates(model, d, local_steps=3, local_lr=1.0)
    for got, want in ((tiny.rows, g.rows), (tiny.users, g.users),
                      (tiny.shared["gat.att_src"], g.shared["gat.att_src"])):
        assert torch.allclose(got, 3 * want, rtol=1e-4, atol=1e-8)
    assert not torch.allclose(big.rows, 3 * g.rows, rtol=1e-2, atol=1e-4)
    assert torch.equal(tiny.loss, g.loss)


def test_a_perfectly_predicted_client_sends_finite_zero_gradients(grouped: RatingData) -> None:
    """Regression: a client whose only rating is 1.0 and whose prediction saturates at 1.0 in float32 has RMSE 0;
    d sqrt(x)/dx at 0 is infinite and once made a FilmTrust run NaN."""
    d = _round(grouped)
    torch.manual_seed(0)
    model = MatrixFactorization(grouped.num_users, grouped.num_items, 4)
    c0_users = d.users[d.user_client == 0]
    c0_items = d.row_item[d.row_client == 0]
    with torch.no_grad():
        model.user_emb[c0_users] = 30.0
        model.item_emb[c0_items] = 30.0  # sigmoid(3600) == 1.0 exactly
        d.entry_rating[d.entry_client == 0] = 1.0
    upd = local_updates(model, d)
    assert upd.loss[0] == 0
    assert torch.isfinite(upd.rows).all() and torch.isfinite(upd.users).all()
    assert torch.all(upd.rows[d.row_client == 0] == 0)
    assert torch.all(upd.loss[1:] > 0)


# ------------------------------------------------------------------------------------------------ pseudo items
def test_pseudo_items_avoid_real_items_and_are_resampled(ml100k_small: RatingData) -> None:
    d = _round(ml100k_small, 0)
    draws = []
    for r in range(2):
        items, valid = sample_pseudo_items(d, ml100k_small.num_items, 50, key=r)
        assert items.shape == (d.num_clients, 50) and bool(valid.all())
        real = set(zip(d.row_client.tolist(), d.row_item.tolist()))
        assert not any((c, i) in real for c, row in enumerate(items.tolist()) for i in row)
        assert all(len(set(row)) == 50 for row in items.tolist())  # without replacement
        draws.append(items)
    assert not torch.equal(draws[0], draws[1])


def test_pseudo_items_when_a_client_has_few_unrated_items(grouped: RatingData) -> None:
    d = _round(grouped)
    items, valid = sample_pseudo_items(d, grouped.num_items, grouped.num_items, key=0)
    n_real = d.rows_per_client()
    assert torch.equal(valid.sum(1), grouped.num_items - n_real)
    real = set(zip(d.row_client.tolist(), d.row_item.tolist()))
    assert not any((c, i) in real for c in range(d.num_clients) for i in items[c][valid[c]].tolist())


def test_pseudo_rows_follow_the_clients_real_row_statistics() -> None:
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.randn(400, 4, generator=g) * 2 + 1, torch.randn(300, 4, generator=g) * 0.5 - 3])
    row_client = torch.cat([torch.zeros(400, dtype=torch.long), torch.ones(300, dtype=torch.long)])
    valid = torch.ones(2, 5000, dtype=torch.bool)
    valid[1, 10:] = False
    fake = pseudo_item_rows(rows, row_client, torch.tensor([3, 8]), valid, key=0)
    assert fake.shape == (2, 5000, 4)
    real = rows[:400]
    # 20,000 draws: the sample mean and std are within ~0.03 and ~0.02 of the real rows' (3 standard errors)
    assert abs(float(fake[0].mean() - real.mean())) < 0.05
    assert abs(float(fake[0].std() / real.std(unbiased=False)) - 1) < 0.02
    assert torch.all(fake[1, 10:] == 0)


# ------------------------------------------------------------------------------------------------ aggregation
def test_itemwise_aggregation_matches_a_hand_computed_case() -> None:
    # client 0 uploads items 5, 7 (3 rows incl. a pseudo 9); client 1 uploads items 7, 9
    up = Uploads(
        clients=torch.tensor([0, 1]),
        shared=torch.tensor([[1.0, 2.0], [4.0, 8.0]]),
        row_client=torch.tensor([0, 0, 0, 1, 1]),
        row_item=torch.tensor([5, 7, 9, 7, 9]),
        rows=torch.tensor([[1.0], [2.0], [3.0], [10.0], [20.0]]),
        num_ratings=torch.tensor([1, 3]),
    )
    shared, items, rows = FedSGD()(up)  # weights = uploaded items: 3 and 2
    assert torch.allclose(shared, torch.tensor([(3 * 1 + 2 * 4) / 5, (3 * 2 + 2 * 8) / 5]))
    assert items.tolist() == [5, 7, 9]
    assert torch.allclose(rows.flatten(), torch.tensor([1.0, (3 * 2 + 2 * 10) / 5, (3 * 3 + 2 * 20) / 5]))
    shared, _, rows = Aggregator(weighting="ratings")(up)  # weights 1 and 3
    assert torch.allclose(shared, torch.tensor([(1 + 12) / 4, (2 + 24) / 4]))
    assert torch.allclose(rows.flatten(), torch.tensor([1.0, (2 + 30) / 4, (3 + 60) / 4]))
    _, _, rows = Aggregator(weighting="uniform")(up)
    assert torch.allclose(rows.flatten(), torch.tensor([1.0, 6.0, 11.5]))


def test_aggregator_rejects_bad_settings() -> None:
    with pytest.raises(ConfigError, match="aggregator.weighting"):
        Aggregator(weighting="size")
    with pytest.raises(ConfigError, match="strategy.local_steps"):
        Strategy(local_steps=0)
    with pytest.raises(ConfigError, match="strategy.local_lr"):
        Strategy(local_lr=0.0)


# ------------------------------------------------------------------------------------------------ DP uploads
@pytest.mark.parametrize("mech_cls", [GaussianMechanism, LaplaceMechanism])
def test_upload_noise_has_the_calibrated_std_on_multi_row_clients(mech_cls) -> None:
    mech = mech_cls(clip=0.5)
    g = torch.Generator().manual_seed(0)
    C, P, R, k = 6, 11, 3000, 8
    shared = torch.randn(C, P, generator=g)
    rows = torch.randn(R, k, generator=g)
    owner = torch.randint(0, C, (R,), generator=g)
    level = torch.linspace(0.5, 3.0, C, dtype=torch.float64)
    (n_sh, n_rows), (c_sh, c_rows) = mech.privatize_parts([shared, rows], [None, owner], C, level, g)
    expected = mech.noise_std(level)
    for c in range(C):
        noise = torch.cat([(n_sh - c_sh)[c], (n_rows - c_rows)[owner == c].flatten()]).double()
        assert noise.numel() > 3000
        assert abs(float(noise.std()) / float(expected[c]) - 1) < 0.05, c
    # the clipped upload (both parts) is within the bound in the mechanism's norm, with no tolerance
    norms = mech.client_norms([c_sh, c_rows], [None, owner], C)
    assert bool((norms <= 0.5).all())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), log_clip=st.floats(-3, 1), laplace=st.booleans())
def test_clipping_bounds_every_clients_whole_upload(seed, log_clip, laplace) -> None:
    clip = 10.0**log_clip
    mech = (LaplaceMechanism if laplace else GaussianMechanism)(clip=clip)
    g = torch.Generator().manual_seed(seed)
    C = 5
    shared = torch.randn(C, 7, generator=g) * 10.0 ** float(torch.randint(-3, 3, (1,), generator=g))
    rows = torch.randn(40, 3, generator=g)
    owner = torch.randint(0, C, (40,), generator=g)
    before = mech.client_norms([shared, rows], [None, owner], C)
    _, clipped = mech.privatize_parts([shared, rows], [None, owner], C, 1.0, g)
    after = mech.client_norms(clipped, [None, owner], C)
    assert bool((after <= clip).all())  # no tolerance: clipping holds exactly (test_privacy_hardening.py)
    small = before <= clip
    assert torch.allclose(after[small], before[small])


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"epsilon": 0.0}, "privacy.epsilon"),
    ({"epsilon": -1.0}, "privacy.epsilon"),
    ({"delta": 0.0}, "privacy.delta"),
    ({"delta": 1.0}, "privacy.delta"),
    ({"clip": 0.0}, "privacy.clip"),
    ({"clip": -0.1}, "privacy.clip"),
    ({"rdp_alpha": 2.0}, "privacy.rdp_alpha"),  # alpha = 2 leaves no budget at eps 10, delta 1e-5 (spec §1.4)
    ({"mechanism": "uniform"}, "privacy.mechanism"),
    ({"accountant": "moments"}, "accountant"),
])
def test_client_dp_rejects_bad_settings_by_name(kwargs, field) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        ClientDP(10, **{"mechanism": "gaussian", **kwargs})


def test_rdp_budget_converts_back_to_epsilon_total() -> None:
    from opacus.accountants import RDPAccountant

    dp = ClientDP(3, "gaussian", epsilon=10.0, delta=1e-5, rdp_alpha=4.0)
    rho = dp.uniform_budget(100)
    z = float(dp.levels(torch.tensor(rho)))
    acc = RDPAccountant()
    acc.history = [(z, 1.0, 100)]
    with pytest.warns(UserWarning, match="smallest alpha"):  # Opacus notes that a single order is a loose bound
        eps_at_4 = acc.get_epsilon(1e-5, alphas=[4.0])
    assert eps_at_4 == pytest.approx(10.0, rel=1e-6) and eps_at_4 <= 10.0


# ------------------------------------------------------------------------------------------------ metrics
def test_rating_metrics_hand_case() -> None:
    pred = torch.tensor([0.9, 0.4, 0.6, 0.2])
    target = torch.tensor([1.0, 0.6, 0.2, 0.2])
    m = rating_metrics(pred, target)
    assert m["rmse"] == pytest.approx(math.sqrt((0.01 + 0.04 + 0.16 + 0) / 4))
    assert m["mae"] == pytest.approx((0.1 + 0.2 + 0.4 + 0) / 4)
    # positives: pred {0, 2}, true {0, 1}: tp 1, fp 1, fn 1
    assert m["f1"] == pytest.approx(0.5)
