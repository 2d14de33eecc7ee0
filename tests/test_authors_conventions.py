"""``privacy.conventions=authors`` (issue 14, item 1; spec bgtplanner.md §1.4): the authors' per-tensor noise and
linear budget, checked against hand-computed values and plain-loop references, the true ε against Opacus on the
same noise history, and the config switch with the paper's defaults unchanged."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from scipy import stats

from fedrec.app.cli import run
from fedrec.data import RatingData, load_ratings
from fedrec.errors import ConfigError
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.privacy.client_dp import rdp_conversion_cost
from fedrec.recsys import FedSGD
from fedrec.recsys.privatize import privatize_uploads
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.utils.rng import KeyedRows
from tests.helpers import write_ml1m

CLIP = 0.1


# ------------------------------------------------------------------------------------------------ noise
def test_the_authors_gaussian_sigma_by_hand() -> None:
    """σ = sqrt(Δ²·α/(2ε_t)) with Δ = 2C = 0.2, α = 2, ε_t = 0.1: sqrt(0.04·2/0.2) = sqrt(0.4)."""
    dp = ClientDP(3, "gaussian", epsilon=10.0, clip=CLIP, conventions="authors")
    assert dp.rdp_alpha == 2.0 and dp.total_budget == 10.0  # ε_total itself is the RDP budget
    sigma = dp.mechanism.noise_std(dp.levels(torch.tensor(0.1, dtype=torch.float64)))
    assert float(sigma) == pytest.approx(math.sqrt(0.4), rel=1e-12)
    assert float(dp.mechanism.noise_std(dp.levels(torch.tensor(0.125, dtype=torch.float64)))) == pytest.approx(
        math.sqrt(0.32), rel=1e-12)


def test_the_authors_laplace_scale_by_hand() -> None:
    """b = 2C/ε_t = 0.2/0.1 = 2 (std 2√2)."""
    dp = ClientDP(3, "laplace", epsilon=10.0, clip=CLIP, conventions="authors")
    assert float(dp.mechanism.noise_scale(dp.levels(torch.tensor(0.1, dtype=torch.float64)))) == pytest.approx(
        2.0, rel=1e-12)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_noise_is_there_at_the_authors_scale(mechanism: str) -> None:
    """Zero uploads (clipping leaves them alone): the noise added is the authors' distribution at their scale
    (Kolmogorov–Smirnov against N(0, σ²) or Laplace(0, b), and the sample variance within its 99.9% band)."""
    dp = ClientDP(4, mechanism, epsilon=10.0, clip=CLIP, conventions="authors")
    budget = torch.full((4,), 0.1, dtype=torch.float64)
    shared, rows = privatize_uploads(dp, torch.zeros(4, 3000), [1000, 2000], torch.zeros(4000, 8),
                                     torch.arange(4).repeat_interleave(1000), budget, torch.arange(4), key=0)
    noise = torch.cat([shared.flatten(), rows.flatten()]).double().numpy()
    if mechanism == "gaussian":
        scale = math.sqrt(0.4)
        assert stats.kstest(noise, "norm", args=(0, scale)).pvalue > 1e-3
        var = 1.0
    else:
        scale = 2.0
        assert stats.kstest(noise, "laplace", args=(0, scale)).pvalue > 1e-3
        var = 2.0
    n = noise.size
    ratio = noise.var() / (var * scale**2)
    assert abs(ratio - 1) < 3.3 * math.sqrt((stats.kurtosis(noise, fisher=True) + 2) / n)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_every_tensor_is_clipped_alone(mechanism: str) -> None:
    """Each ω tensor and each item row is scaled by 1/max(1, ‖g‖/C) on its own (L2 Gaussian, L1 Laplace): equal to
    a plain loop plus the same noise draws."""
    rng = np.random.default_rng(1)
    sizes = [6, 1, 5]
    shared = torch.from_numpy(rng.normal(size=(3, 12)) * 0.2).float()
    rows = torch.from_numpy(rng.normal(size=(7, 4)) * 0.1).float()
    row_client = torch.tensor([0, 0, 1, 2, 2, 2, 1])
    dp = ClientDP(3, mechanism, epsilon=10.0, clip=CLIP, conventions="authors")
    budget = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    clients = torch.tensor([4, 9, 2])  # global ids: each client's noise comes from its own stream
    got_shared, got_rows = privatize_uploads(dp, shared, sizes, rows, row_client, budget, clients, key=5)
    order = 2 if mechanism == "gaussian" else 1

    def clip(v: torch.Tensor) -> torch.Tensor:
        return v / max(1.0, float(torch.linalg.vector_norm(v.double(), ord=order)) / CLIP)

    ref_shared = torch.stack([torch.cat([clip(piece) for piece in row.split(sizes)]) for row in shared])
    ref_rows = torch.stack([clip(r) for r in rows])
    dist = "normal" if mechanism == "gaussian" else "laplace"

    def noise(client: int, start: int, width: int) -> torch.Tensor:  # draws start.. of the client's stream
        return torch.from_numpy(KeyedRows(5, [int(clients[client])], start).draw(dist, width)[0]).float()

    scale = dp.mechanism.noise_scale(dp.levels(budget)).float()
    P, k = shared.shape[1], rows.shape[1]
    ref_shared = torch.stack([ref_shared[c] + noise(c, 0, P) * scale[c] for c in range(3)])
    seen = [0, 0, 0]  # the client's j-th row takes draws P + j·k onwards
    for j, c in enumerate(row_client.tolist()):
        ref_rows[j] = ref_rows[j] + noise(c, P + seen[c] * k, k) * scale[c]
        seen[c] += 1
    assert torch.allclose(got_shared, ref_shared, atol=1e-6) and torch.allclose(got_rows, ref_rows, atol=1e-6)


# ------------------------------------------------------------------------------------------------ ledgers
def test_a_client_runs_while_it_has_budget_left_and_may_overspend_its_last_round() -> None:
    """The authors check the remaining budget before spending: at 0.3 a round, ε_total = 1 gives 4 rounds and a
    nominal 1.2."""
    dp = ClientDP(2, "laplace", epsilon=1.0, conventions="authors")
    budget, everyone = torch.full((2,), 0.3, dtype=torch.float64), torch.ones(2, dtype=torch.bool)
    rounds = 0
    while dp.affordable(budget, everyone):
        dp.record(budget, everyone, torch.tensor([1, 3]))
        rounds += 1
    assert rounds == 4 and torch.allclose(dp.nominal, torch.full((2,), 1.2, dtype=torch.float64))
    assert torch.equal(dp.admissible(budget, everyone), torch.zeros(2, dtype=torch.bool))
    # the true ε: k tensors at ε_t each, by basic composition
    assert torch.allclose(dp.spent(), torch.tensor([1.2, 3.6], dtype=torch.float64))
    paper = ClientDP(2, "laplace", epsilon=1.0)
    assert not paper.affordable(torch.full((2,), 1.2, dtype=torch.float64), everyone)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> RatingData:
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"), users=12, items=30, seed=3)
    return load_ratings("ml-1m", folder, seed=0, rounds=5, num_clients=12)


def fit(data: RatingData, mechanism: str, conventions: str, rounds: int | None = None) -> FedRecTask:
    torch.manual_seed(0)
    dp = ClientDP(data.num_clients, mechanism, epsilon=10.0, conventions=conventions)
    task = FedRecTask(data, FedGNN(data.num_users, data.num_items, 4), FedSGD(), dp, rounds=data.rounds,
                      pseudo_items=3, optimizer_state="reset", seed=2)
    FederatedTrainer(enable_progress_bar=False, max_rounds=rounds).fit(task)
    return task


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_true_epsilon_is_opacus_on_the_same_noise_history_and_exceeds_the_nominal(tiny, mechanism) -> None:
    """Each client's k_t noised tensors in round t (FedGNN's ω tensors plus its real item rows, counted here from
    the data) are one mechanism with multiplier z_t/√k_t (Gaussian, Opacus's RDP accountant) or ε = k_t·ε_t
    (Laplace); the summary's ε is the largest, above the authors' nominal Σ_t ε_t."""
    task = fit(tiny, mechanism, "authors")
    dp, T = task.privacy, tiny.rounds
    n_omega = len(task.model.shared_parameters())
    assert n_omega >= 1
    eps_t = dp.uniform_budget(T)
    expected = []
    for c in range(tiny.num_clients):
        k = [n_omega + int(np.sum(tiny.client_of_user[tiny.training_until(t).user] == c)) for t in range(T)]
        if mechanism == "gaussian":
            acc = RDPAccountant()
            acc.history = [(math.sqrt(1.0 / eps_t) / math.sqrt(kt), 1.0, 1) for kt in k]  # z = sqrt(α/(2ε)), α=2
            expected.append(acc.get_epsilon(1e-5))
        else:
            expected.append(sum(kt * eps_t for kt in k))
    spent = dp.spent().numpy()
    assert np.allclose(spent, expected, rtol=1e-9)
    s = task.summary()
    assert s["epsilon_spent"] == pytest.approx(max(expected), rel=1e-9)
    assert s["epsilon_nominal"] == pytest.approx(T * eps_t, rel=1e-12) and s["epsilon_nominal"] <= 10.0
    assert np.all(spent > dp.nominal.numpy())
    if mechanism == "gaussian":
        assert s["epsilon_nominal_rdp_converted"] == pytest.approx(s["epsilon_nominal"] + rdp_conversion_cost(2, 1e-5))


def test_paper_conventions_are_unchanged_by_the_switch(tiny) -> None:
    """The default is the paper's: whole-upload clipping and an accountant that never exceeds ε_total."""
    assert ClientDP(3).conventions == "paper"
    task = fit(tiny, "gaussian", "paper")
    assert task.privacy.nominal is None and float(task.privacy.spent().max()) <= 10.0
    assert "epsilon_nominal" not in task.summary() and task.summary()["privacy_conventions"] == "paper"


def test_resume_restores_the_nominal_ledger_and_refuses_other_conventions(tiny) -> None:
    full = fit(tiny, "laplace", "authors")
    part = fit(tiny, "laplace", "authors", rounds=2)
    state = part.state_dict()
    torch.manual_seed(0)
    resumed = FedRecTask(tiny, FedGNN(tiny.num_users, tiny.num_items, 4), FedSGD(),
                         ClientDP(tiny.num_clients, "laplace", epsilon=10.0, conventions="authors"), rounds=tiny.rounds,
                         pseudo_items=3, optimizer_state="reset", seed=2)
    resumed.load_state_dict(state)
    assert torch.equal(resumed.privacy.nominal, part.privacy.nominal)
    trainer = FederatedTrainer(enable_progress_bar=False)
    trainer.round = 2
    trainer.fit(resumed)
    assert torch.equal(resumed.privacy.nominal, full.privacy.nominal)
    assert torch.equal(resumed.privacy.spent(), full.privacy.spent())
    other = ClientDP(tiny.num_clients, "laplace", epsilon=10.0)
    with pytest.raises(ConfigError, match="conventions"):
        other.load_state_dict(state["privacy"])


def test_bad_conventions_are_named() -> None:
    with pytest.raises(ConfigError, match="privacy.conventions"):
        ClientDP(3, conventions="code")


# ------------------------------------------------------------------------------------------------ the switch
@pytest.mark.parametrize("experiment", ["bgtplanner_ml100k", "bgtplanner_filmtrust", "bgtplanner_ml1m"])
def test_one_switch_sets_the_authors_fields_and_explicit_values_win(compose_cfg, experiment: str) -> None:
    paper = compose_cfg(f"+experiment={experiment}")
    assert (paper.privacy.conventions, paper.planner.reward_split, paper.task.optimizer_state,
            paper.data.val_fraction) == ("paper", "val", "persistent", 0.1)
    authors = compose_cfg(f"+experiment={experiment}", "privacy.conventions=authors")
    assert (authors.planner.reward_split, authors.task.optimizer_state, authors.data.val_fraction) == \
        ("test", "reset", 0.0)
    mixed = compose_cfg(f"+experiment={experiment}", "privacy.conventions=authors", "planner.reward_split=val",
                        "data.val_fraction=0.1")
    assert (mixed.planner.reward_split, mixed.task.optimizer_state, mixed.data.val_fraction) == ("val", "reset", 0.1)
    for planner in ("uniform", "adpml", "adap"):
        cfg = compose_cfg(f"+experiment={experiment}", f"planner={planner}", "privacy.conventions=authors")
        assert cfg.planner.reward_split == "test"


def test_authors_run_through_the_cli_reports_both_epsilons(compose_cfg, data_dir: Path, tmp_path: Path) -> None:
    cfg = compose_cfg("+experiment=bgtplanner_ml100k", f"data_dir={data_dir}", "plots=false",
                      "logger.tensorboard=false", "planner=uniform", "privacy=laplace", "privacy.conventions=authors",
                      "task.rounds=3")
    s = run(cfg, output_dir=tmp_path)
    assert s["privacy_conventions"] == "authors" and s["rounds_run"] == 3
    assert s["epsilon_nominal"] == pytest.approx(10.0, rel=1e-6) and s["epsilon_spent"] > 10 * s["epsilon_nominal"]
