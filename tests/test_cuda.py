"""Runs on a CUDA device equal the CPU runs: recommendation rounds (every model, client DP, robust rules, server
optimisers, ranking), bandit protocols on their torch path, and ``train.py`` with ``trainer.accelerator=cuda``.

Marked ``cuda`` and skipped without a device; ``scripts/test_cuda.sh`` runs them on a GPU machine. Metrics agree to
float32 rounding (the devices reduce in different orders); ledger counts, privacy spending and bandit decisions
agree exactly.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrec.aggregation import FedAdam, FedAvgM, FedYogi
from fedrec.data.implicit import load_implicit
from fedrec.data.synthetic import synthetic_ratings
from fedrec.federation.ledger import CommLedger
from fedrec.models import FedGNN, LightGCN, MatrixFactorization, NeuMF
from fedrec.privacy import ClientDP
from fedrec.recsys import FedAvg, FedSGD, Strategy
from fedrec.recsys.aggregate import CoordinateMedian, Krum, TrimmedMean
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.utils.rng import KeyedRows
from tests.helpers import write_ml1m

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA device (scripts/test_cuda.sh on a GPU machine)")]


@pytest.fixture(scope="module")
def ratings() -> Any:
    return synthetic_ratings(users=120, items=60, ratings=1800, num_clients=24, rounds=4, seed=3, val_fraction=0.1)


MODELS = {"fedgnn": FedGNN, "mf": MatrixFactorization, "neumf": NeuMF, "lightgcn": LightGCN}
CASES = {  # model, privacy, aggregator, server optimiser
    "fedgnn-plain": ("fedgnn", None, FedSGD, None),
    "fedgnn-gaussian": ("fedgnn", "gaussian", FedSGD, None),
    "mf-laplace-fedavg": ("mf", "laplace", FedAvg, None),
    "fedgnn-gaussian-median-fedadam": ("fedgnn", "gaussian", CoordinateMedian, lambda: FedAdam(lr=0.05)),
    "neumf-krum-fedavgm": ("neumf", None, lambda: Krum(f=2), lambda: FedAvgM(lr=0.5)),
    "lightgcn-trimmed-fedyogi": ("lightgcn", None, lambda: TrimmedMean(beta=0.2), lambda: FedYogi(lr=0.05)),
}


def _run(data: Any, device: str, case: tuple, rounds: int) -> tuple[list[dict[str, float]], FedRecTask]:
    model, privacy, aggregator, server = case
    torch.manual_seed(0)
    dp = None if privacy is None else ClientDP(data.num_clients, privacy, epsilon=5.0, clip=0.5)
    task = FedRecTask(data, MODELS[model](data.num_users, data.num_items, 4), aggregator(), dp, rounds=data.rounds,
                      pseudo_items=5, seed=11, server=None if server is None else server())
    task.setup(FederatedTrainer(accelerator=device))
    return [task.run_round(r) for r in range(rounds)], task


@pytest.mark.parametrize("name", list(CASES))
def test_a_recommendation_run_on_cuda_equals_the_cpu_run(ratings: Any, name: str) -> None:
    cpu, cpu_task = _run(ratings, "cpu", CASES[name], ratings.rounds)
    gpu, gpu_task = _run(ratings, "cuda", CASES[name], ratings.rounds)
    assert gpu_task.model.item_emb.device.type == "cuda"
    for got, want in zip(gpu, cpu):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    for (n, a), (_, b) in zip(gpu_task.model.state_dict().items(), cpu_task.model.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=n)
    assert {k: int(v.sum()) for k, v in gpu_task.channel.ledger.totals().items()} == \
        {k: int(v.sum()) for k, v in cpu_task.channel.ledger.totals().items()}
    if cpu_task.privacy is not None:
        assert torch.equal(gpu_task.privacy.spent().cpu(), cpu_task.privacy.spent())


def test_a_sampled_server_placed_run_on_cuda_equals_the_cpu_run(ratings: Any) -> None:
    """Poisson sampling, dropouts, stragglers, the drop policy and server-placed DP with adaptive clipping: the
    sample, the clipped sums and the one noise draw are the same on the device."""
    def run(device: str) -> tuple[list[dict[str, float]], FedRecTask]:
        torch.manual_seed(0)
        dp = ClientDP(ratings.num_clients, "gaussian", epsilon=5.0, clip=0.5, placement="server",
                      adjacency="add_remove", sensitivity_factor=1.0, adaptive_clip=True)
        strategy = Strategy("poisson", sample_rate=0.5, dropout=0.1, deadline=2.0, on_bad_update="drop")
        task = FedRecTask(ratings, FedGNN(ratings.num_users, ratings.num_items, 4), FedSGD("uniform"), dp,
                          rounds=ratings.rounds, pseudo_items=5, seed=11, strategy=strategy)
        task.setup(FederatedTrainer(accelerator=device))
        return [task.run_round(r) for r in range(ratings.rounds)], task

    cpu, cpu_task = run("cpu")
    gpu, gpu_task = run("cuda")
    assert any(m["clients"] < ratings.num_clients for m in cpu)
    for got, want in zip(gpu, cpu):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)
    for (n, a), (_, b) in zip(gpu_task.model.state_dict().items(), cpu_task.model.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=n)
    assert gpu_task.summary()["epsilon_spent"] == cpu_task.summary()["epsilon_spent"]


@pytest.mark.parametrize("ranking", ["full", "sampled"])
def test_an_implicit_ranking_run_on_cuda_equals_the_cpu_run(tmp_path: Path, ranking: str) -> None:
    data = load_implicit("ml-1m", write_ml1m(tmp_path, users=60, items=40, seed=5), seed=0, num_clients=15)

    def run(device: str) -> list[dict[str, float]]:
        torch.manual_seed(0)
        task = FedRecTask(data, LightGCN(data.num_users, data.num_items, 4), FedSGD(), rounds=3, pseudo_items=0,
                          seed=2, eval={"ranking": ranking, "ks": [5, 10], "negatives": 20})
        task.setup(FederatedTrainer(accelerator=device))
        return [task.run_round(r) for r in range(3)]

    cpu, gpu = run("cpu"), run("cuda")
    assert "test_hr@10" in cpu[-1]
    for got, want in zip(gpu, cpu):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("protocol", ["async", "sync", "fed"])
def test_a_bandit_protocol_on_cuda_plays_the_cpu_runs_arms(protocol: str) -> None:
    from fedrec.envs.synthetic import LinearEnv
    from fedrec.protocols import AsyncLinUCB, SyncLinUCB, paper_linucb
    from fedrec.protocols.fed_linucb import FedLinUCB
    from fedrec.tasks import BanditTask

    build = {"async": lambda: AsyncLinUCB(num_clients=4, dim=3, replicates=2, policy=paper_linucb(), backend="torch"),
             "sync": lambda: SyncLinUCB(num_clients=4, dim=3, replicates=2, policy=paper_linucb(), backend="torch"),
             "fed": lambda: FedLinUCB(num_clients=4, dim=3, replicates=2, period=20, backend="torch")}[protocol]

    def run(device: str) -> tuple[list[dict[str, float]], dict[str, Any]]:
        env = LinearEnv(num_clients=4, dim=3, num_arms=5, replicates=2, seed=0)
        task = BanditTask(env, build(), steps=200, steps_per_round=50)
        task.setup(FederatedTrainer(accelerator=device))
        history = [task.run_round(r) for r in range(task.num_rounds)]
        return history, {k: v.cpu() for k, v in task.protocol.ledger.totals().items()}

    (cpu, cpu_ledger), (gpu, gpu_ledger) = run("cpu"), run("cuda")
    for got, want in zip(gpu, cpu):  # the same arms give the same regret and reward
        assert got == pytest.approx(want, rel=1e-9)
    assert all(torch.equal(gpu_ledger[k], cpu_ledger[k]) for k in cpu_ledger)


def test_the_ledger_counts_ids_sent_from_another_device() -> None:
    ledger = CommLedger(2, {"client": 3, "server": 1}).to("cuda")
    ledger.record("upload", ("client", torch.tensor([0, 2])), ("server", torch.tensor([0, 0], device="cuda")),
                  torch.tensor([1, 0]), torch.tensor([5, 7], device="cuda"), 4)
    assert ledger.per_endpoint("client", "upload", "scalars").cpu().tolist() == [[0, 0, 7], [5, 0, 0]]


@pytest.mark.parametrize("distribution", ["uniform", "normal", "laplace"])
def test_keyed_draws_on_the_device_are_the_host_draws(distribution: str) -> None:
    """A round's noise and pseudo rows drawn on the GPU (:meth:`KeyedRows.tensor`): the uniforms bit for bit;
    normals and Laplace draws to the rounding of CUDA's log, cos and sin (within 2 ulp of the true values)."""
    keyed = KeyedRows(np.uint64(2**63 + 11), np.arange(0, 3000, 7), np.arange(0, 3000, 7) % 5)
    got, want = keyed.tensor(distribution, 33, "cuda"), keyed.draw(distribution, 33)
    assert got.device.type == "cuda"
    if distribution == "uniform":
        assert np.array_equal(got.cpu().numpy(), want)
    else:
        np.testing.assert_allclose(got.cpu().numpy(), want, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("experiment", ["fedgnn_synthetic", "quickstart"])
def test_train_py_on_cuda_reports_the_cpu_runs_results(tmp_path: Path, experiment: str) -> None:
    def run(accelerator: str) -> dict[str, Any]:
        folder = tmp_path / accelerator
        subprocess.run([sys.executable, "train.py", f"+experiment={experiment}", "quick=true",
                        f"trainer.accelerator={accelerator}", f"hydra.run.dir={folder}"],
                       cwd=ROOT, check=True, capture_output=True, text=True)
        return json.loads((folder / "summary.json").read_text())

    cpu, gpu = run("cpu"), run("cuda")
    numbers = {k: v for k, v in cpu.items() if isinstance(v, float) and "seconds" not in k}  # results, not timings
    assert numbers
    assert {k: gpu[k] for k in numbers} == pytest.approx(numbers, rel=1e-4, abs=1e-5)
