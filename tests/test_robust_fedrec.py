"""Robust rules, server optimisers and FedProx in the recommendation round: each aggregator against a per-item loop
of numpy formulas, the server step against Algorithm 2 written out, FedProx against a per-client loop, exact
resume, ε unchanged by the rule, and the refusals of several processes."""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

from fedrec.aggregation import FedAdagrad, FedAdam, FedAvgM, FedYogi
from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.federation.collective import Collective
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import (
    AggregateSums,
    CoordinateMedian,
    FedAvg,
    FedSGD,
    ItemPromotion,
    Krum,
    MultiKrum,
    NormBound,
    Strategy,
    TrimmedMean,
    Uploads,
)
from fedrec.recsys.data import round_data
from fedrec.recsys.local import local_updates
from fedrec.recsys.server import AdaptiveServerStep
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from tests.helpers import StubTrainer, ThreadCollective, ThreadHub, make_task, random_uploads, tiny_fixture
from tests.reference.aggregation import algorithm_2, item_by_item, ref_krum
from tests.reference.fedrec_round import reference_client_gradients

ROUNDS = 5
tiny = tiny_fixture(users=40, items=30, seed=4, rounds=ROUNDS, num_clients=12)




def krum_group(f: int, m: int | None = None, multi: bool = False):
    """Krum (``multi=False``) or Multi-Krum of a group of n of C updates: f and m scaled to the group, the
    coordinate median below 3 updates."""
    def rule(u: np.ndarray, w: np.ndarray, C: int) -> np.ndarray:
        n = len(u)
        if n < 3:
            return np.median(u, axis=0)
        f_n = min(f * n // C, (n - 3) // 2)
        keep = 1 if not multi else n - f_n if m is None else min(n, max(1, m * n // C))
        return ref_krum(u, w, f_n, keep)
    return rule


CASES = [
    (CoordinateMedian(), lambda u, w, C: np.median(u, axis=0)),
    (TrimmedMean(beta=0.2), lambda u, w, C: scipy.stats.trim_mean(u, 0.2, axis=0)),
    (TrimmedMean(beta=0.4), lambda u, w, C: scipy.stats.trim_mean(u, 0.4, axis=0)),
    (Krum(f=2), krum_group(2)),
    (Krum(f=4), krum_group(4)),  # 11 clients: f = 4 is the limit (2f + 3 = 11)
    (MultiKrum(f=3), krum_group(3, multi=True)),
    (MultiKrum(f=1, m=5), krum_group(1, 5, multi=True)),
    (NormBound(bound=0.7), lambda u, w, C: np.average(
        [x * min(1.0, 0.7 / np.linalg.norm(x)) for x in u], axis=0, weights=w)),
]


@pytest.mark.parametrize(("aggregator", "group_rule"), CASES, ids=lambda c: type(c).__name__ if not callable(c)
                         or isinstance(c, type) else "")
@pytest.mark.parametrize("seed", range(4))
def test_each_rule_equals_its_item_by_item_loop(aggregator, group_rule, seed: int) -> None:
    up = random_uploads(seed)
    shared, items, rows = aggregator(up)
    want_shared, want_items, want_rows = item_by_item(up, group_rule)
    assert items.tolist() == want_items
    torch.testing.assert_close(shared, torch.from_numpy(want_shared), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rows, torch.from_numpy(want_rows), rtol=1e-10, atol=1e-12)
    # an item with one uploader gets its one row, one with two the mean of its two under the order statistics
    one = up.rows[up.row_item == 0][0]
    if not isinstance(aggregator, NormBound):
        torch.testing.assert_close(rows[0], one, rtol=0, atol=0)


@pytest.mark.parametrize("seed", range(3))
def test_norm_bound_sums_add_up_over_disjoint_clients(seed: int) -> None:
    up = random_uploads(seed)
    agg = NormBound(bound=0.5)
    keep = up.row_client < 5
    a = agg.partial(Uploads(up.clients[:5], up.shared[:5], up.row_client[keep], up.row_item[keep], up.rows[keep],
                            None), 9)
    b = agg.partial(Uploads(up.clients[5:], up.shared[5:], up.row_client[~keep] - 5, up.row_item[~keep],
                            up.rows[~keep], None), 9)
    total = agg.finish(AggregateSums(*(x + y for x, y in zip(a.tensors(), b.tensors()))), torch.float64)
    for got, want in zip(total, agg(up)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_krum_settings_too_large_for_the_run_are_refused_naming_the_field(tiny: RatingData) -> None:
    model = FedGNN(tiny.num_users, tiny.num_items, 4)
    with pytest.raises(ConfigError, match=r"aggregator\.f=5 is too large for 12 clients") as info:
        FedRecTask(tiny, model, Krum(f=5), rounds=ROUNDS)
    assert "\n" not in str(info.value)
    FedRecTask(tiny, model, Krum(f=4), rounds=ROUNDS)  # the limit: 2·4 + 3 = 11 ≤ 12
    with pytest.raises(ConfigError, match=r"aggregator\.m=13"):
        FedRecTask(tiny, model, MultiKrum(f=1, m=13), rounds=ROUNDS)
    with pytest.raises(ConfigError, match=r"aggregator\.beta"):
        TrimmedMean(beta=0.5)
    with pytest.raises(ConfigError, match=r"aggregator\.bound"):
        NormBound(bound=-1.0)
    with pytest.raises(ConfigError, match=r"task\.prox_mu"):
        FedRecTask(tiny, model, FedAvg(), rounds=ROUNDS, prox_mu=-0.1)


# ------------------------------------------------------------------------------------------------ server step
@pytest.mark.parametrize("optimizer", [FedAvgM(lr=1.0, beta1=0.9), FedAdagrad(lr=0.1), FedAdam(lr=0.05),
                                       FedYogi(lr=0.05, bias_correction=True)], ids=lambda o: type(o).__name__)
def test_the_server_step_is_algorithm_2_on_omega_and_on_each_uploaded_item(optimizer) -> None:
    """Δ = −local_lr · aggregate; ω steps as one vector, each item row over the rounds it was uploaded in, the
    others (and their moments) wait."""
    torch.manual_seed(0)
    model = FedGNN(10, 7, 3).double()
    step = AdaptiveServerStep(optimizer, local_lr=0.2)
    names = list(model.shared_parameters())
    omega0 = torch.cat([p.detach().reshape(-1) for p in model.shared_parameters().values()]).numpy()
    table0 = model.item_emb.detach().numpy().copy()
    rng = np.random.default_rng(0)
    g_omega, uploaded, g_rows = [], [], []
    for _ in range(6):
        items = np.sort(rng.choice(7, size=int(rng.integers(1, 7)), replace=False))
        g_omega.append(rng.normal(size=omega0.size) * 0.1)
        uploaded.append(items)
        g_rows.append(rng.normal(size=(len(items), 3)) * 0.1)
        step(model, torch.from_numpy(g_omega[-1]), torch.from_numpy(items), torch.from_numpy(g_rows[-1]))
    kind = type(optimizer).__name__.lower()
    o = optimizer
    b2 = getattr(o, "beta2", 0.0)
    tau = getattr(o, "tau", 0.0)
    bias = getattr(o, "bias_correction", False)
    want = algorithm_2(kind, omega0, [-0.2 * g for g in g_omega], o.lr, o.beta1, b2, tau, bias)[-1]
    got = torch.cat([model.shared_parameters()[n].detach().reshape(-1) for n in names])
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-12, atol=1e-14)
    for i in range(7):
        mine = [-0.2 * g[list(items).index(i)] for items, g in zip(uploaded, g_rows) if i in items]
        expect = algorithm_2(kind, table0[i], mine, o.lr, o.beta1, b2, tau, bias)[-1] if mine else table0[i]
        torch.testing.assert_close(model.item_emb.detach()[i], torch.from_numpy(expect), rtol=1e-12, atol=1e-14)


def test_a_used_optimiser_is_refused() -> None:
    opt = FedAdam()
    opt.step(torch.zeros(2), torch.ones(2))
    with pytest.raises(ConfigError, match="server"):
        AdaptiveServerStep(opt, 0.05)


# ------------------------------------------------------------------------------------------------ FedProx
def test_fedprox_local_steps_equal_a_per_client_loop(tiny: RatingData) -> None:
    """K local SGD steps on loss_c + μ/2 ‖w − w_global‖² (ω and item rows), client by client with PyG's GATConv
    gradients (tests/reference), against the batched path."""
    tr = tiny.training_until(2)
    d = round_data(tr.user, tr.item, tr.rating, tiny.client_of_user, tiny.num_items)
    torch.manual_seed(1)
    model = FedGNN(tiny.num_users, tiny.num_items, 4)
    K, lr, mu = 3, 0.3, 2.0
    got = local_updates(model, d, K, lr, prox_mu=mu)
    names = list(model.shared_parameters())
    for c in range(d.num_clients):
        dc = d.select(c, c + 1)
        local = copy.deepcopy(model)
        items = dc.row_item.sort().values
        w0 = {n: p.detach().clone() for n, p in local.shared_parameters().items()}
        rows0 = local.item_emb.detach()[items].clone()
        users0 = local.user_emb.detach()[dc.users].clone()
        for _ in range(K):
            g = reference_client_gradients(local, dc)[0]
            with torch.no_grad():
                for n, p in local.shared_parameters().items():
                    p -= lr * (g[n] + mu * (p - w0[n]))
                rows = local.item_emb[items]
                local.item_emb[items] = rows - lr * (g["rows"] + mu * (rows - rows0))
                local.user_emb[dc.users] -= lr * g["users"]
        for n in names:
            want = (w0[n] - local.shared_parameters()[n].detach()) / lr
            torch.testing.assert_close(got.shared[n][c], want, rtol=1e-4, atol=1e-5)
        mine = got.rows[d.row_client == c][torch.argsort(d.row_item[d.row_client == c])]
        torch.testing.assert_close(mine, (rows0 - local.item_emb.detach()[items]) / lr, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.users[d.user_client == c], (users0 - local.user_emb.detach()[dc.users]) / lr,
                                   rtol=1e-4, atol=1e-5)


def test_fedprox_with_mu_zero_is_fedavg(tiny: RatingData) -> None:
    runs = {}
    for name, kw in (("fedavg", {}), ("mu0", {"prox_mu": 0.0}), ("mu", {"prox_mu": 0.5})):
        task = make_task(tiny, aggregator=FedAvg(), strategy=Strategy(local_steps=3, local_lr=0.2), **kw)
        runs[name] = (FederatedTrainer(enable_progress_bar=False).fit(task), task.state_dict()["model"])
    assert runs["mu0"][0] == runs["fedavg"][0]
    assert all(torch.equal(v, runs["fedavg"][1][k]) for k, v in runs["mu0"][1].items())
    assert runs["mu"][0] != runs["fedavg"][0]  # μ > 0 changes the run


# ------------------------------------------------------------------------------------------------ runs
def test_a_run_with_a_server_optimiser_resumes_exactly(tiny: RatingData, tmp_path: Path) -> None:
    def fresh() -> FedRecTask:
        dp = ClientDP(tiny.num_clients, "gaussian", epsilon=8.0, delta=1e-5)
        return make_task(tiny, dp, MultiKrum(f=2), server=FedYogi(lr=0.05, bias_correction=True),
                         attack=ItemPromotion(fraction=0.25))

    full_task = fresh()
    full = FederatedTrainer(default_root_dir=tmp_path / "full", enable_progress_bar=False).fit(full_task)
    part = tmp_path / "part"
    FederatedTrainer(default_root_dir=part, max_rounds=2, enable_progress_bar=False).fit(fresh())
    resumed_task = fresh()
    resumed = FederatedTrainer(default_root_dir=tmp_path / "resumed", enable_progress_bar=False).fit(
        resumed_task, ckpt_path=part / "checkpoints" / "last.ckpt")
    assert resumed == full and len(full) == ROUNDS
    assert resumed_task.summary() == full_task.summary()
    for k, v in full_task.state_dict()["server_opt"]["items"].items():
        assert torch.equal(resumed_task.state_dict()["server_opt"]["items"][k], v)
    assert {"test_benign_rmse", "test_target_exposure"} <= set(full[-1])


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_the_rule_is_post_processing_epsilon_and_noised_uploads_are_unchanged(tiny: RatingData, mechanism: str) -> None:
    """Clients noise before uploading, so the same seed gives the same first uploads and the same ε under every
    rule and server optimiser."""
    runs = []
    for aggregator, server in ((FedSGD(), None), (CoordinateMedian(), None), (Krum(f=3), FedAdam()),
                               (TrimmedMean(0.2), None), (NormBound(0.05), FedAvgM())):
        dp = ClientDP(tiny.num_clients, mechanism, epsilon=4.0, delta=1e-5)
        task = make_task(tiny, dp, aggregator, server=server)
        task.run_round(0)
        first = task.last_uploads
        for r in range(1, ROUNDS):
            task.run_round(r)
        runs.append((first, dp.spent(), dp.accountant.state_dict()["history"], task.summary()["epsilon_spent"]))
    for first, spent, history, eps in runs[1:]:
        assert torch.equal(first.rows, runs[0][0].rows) and torch.equal(first.shared, runs[0][0].shared)
        assert torch.equal(spent, runs[0][1]) and torch.equal(history, runs[0][2]) and eps == runs[0][3]
    assert 0 < runs[0][3] <= 4.0


@pytest.fixture(scope="module")
def ml100k(data_dir: Path) -> RatingData:
    return load_ratings("ml-100k", data_dir, seed=1, rounds=4)


@pytest.mark.parametrize("model_cls", [FedGNN, MatrixFactorization])
@pytest.mark.parametrize("aggregator", [CoordinateMedian(), TrimmedMean(0.1), Krum(f=20), MultiKrum(f=20),
                                        NormBound(0.1)], ids=lambda a: type(a).__name__)
def test_every_rule_trains_on_ml100k(ml100k: RatingData, model_cls, aggregator) -> None:
    task = make_task(ml100k, aggregator=aggregator, model_cls=model_cls)
    hist = FederatedTrainer(enable_progress_bar=False).fit(task)
    assert all(np.isfinite(h["test_rmse"]) for h in hist) and hist[-1]["test_rmse"] < hist[0]["test_rmse"]


def test_rules_that_need_every_upload_and_attacks_refuse_several_processes(tiny: RatingData) -> None:
    hub = ThreadHub(2)
    for kw, message in (({"aggregator": CoordinateMedian()}, r"trainer\.devices=2: CoordinateMedian"),
                        ({"attack": ItemPromotion(0.1)}, r"trainer\.devices=2: attacks run in one process")):
        task = make_task(tiny, **kw)
        with pytest.raises(ConfigError, match=message):
            task.setup(StubTrainer(ThreadCollective(0, hub)))
    sums = make_task(tiny, aggregator=NormBound(0.1), server=FedAdam())
    sums.setup(StubTrainer(ThreadCollective(0, hub)))  # sums: sharded fine


def test_norm_bound_and_a_server_optimiser_sharded_equal_one_process(tiny: RatingData) -> None:
    import threading

    def fresh() -> FedRecTask:
        return make_task(tiny, aggregator=NormBound(0.05), server=FedAdam(lr=0.05))

    single = fresh()
    single.setup(StubTrainer(Collective()))
    want = [single.run_round(r) for r in range(ROUNDS)]
    hub, tasks = ThreadHub(2), [fresh(), fresh()]
    got: list[list[dict]] = [[], []]

    def work(rank: int) -> None:
        tasks[rank].setup(StubTrainer(ThreadCollective(rank, hub)))
        got[rank].extend(tasks[rank].run_round(r) for r in range(ROUNDS))

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for history in got:
        assert len(history) == ROUNDS
        for g, w in zip(history, want):
            assert g == pytest.approx(w, rel=1e-6, abs=1e-7)
