"""The scripts in examples/ run as written: each is executed as ``python examples/NAME.py`` with small settings, and
the ``key=value`` results of its last printed line are checked to be finite and in range.

The selected examples start together, a few at a time, when the first of these tests runs (each is mostly
interpreter start-up and imports, so they overlap well); every test then waits for its own.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: example -> its small-settings flags, the slowest first (they start in this order)
SMALL = {
    "budget_schedule": ["--rounds", "3", "--epsilon", "5"],
    "custom_aggregator": ["--rounds", "2"],
    "robust_aggregation": ["--rounds", "30"],
    "early_stopping_callback": ["--rounds", "8", "--target", "0.315"],
    "new_protocol": ["--clients", "10", "--steps", "600", "--steps-per-round", "100", "--period", "50",
                     "--replicates", "1"],
    "federated_protocol": ["--clients", "20", "--steps", "1000", "--steps-per-round", "250", "--replicates", "1"],
    "linucb_standalone": ["--steps", "200"],
}
#: examples running at once (this machine has 2 cores)
PARALLEL = 2


def run_example(name: str, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FEDREC_DATA_DIR": str(data_dir)}
    return subprocess.run([sys.executable, f"examples/{name}.py", *SMALL[name]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


#: example -> its run in the background
Runs = dict[str, Future]


@pytest.fixture(scope="module")
def launched(request: pytest.FixtureRequest, data_dir: Path) -> Iterator[Runs]:
    """The examples of this module's selected tests (``test_NAME`` runs ``examples/NAME.py``), started in the
    background."""
    selected = {item.name.removeprefix("test_") for item in request.session.items if item.module is request.module}
    with ThreadPoolExecutor(PARALLEL) as pool:
        yield {name: pool.submit(run_example, name, data_dir) for name in SMALL if name in selected}


@pytest.fixture
def out(request: pytest.FixtureRequest, launched: Runs) -> dict[str, float]:
    """This test's example, its exit code checked, and its last line parsed as ``key=value`` numbers, all finite."""
    name = request.node.name.removeprefix("test_")
    done = launched[name].result()
    assert done.returncode == 0, f"examples/{name}.py failed:\n{done.stdout}\n{done.stderr}"
    last = done.stdout.strip().splitlines()[-1]
    values = {key: float(value) for key, value in (part.split("=", 1) for part in last.split())}
    assert values and all(math.isfinite(v) for v in values.values()), last
    return values


def test_linucb_standalone(out: dict[str, float]) -> None:
    assert 0 < out["linucb_regret"] < out["random_regret"] / 5
    assert 0 < out["lints_regret"] < out["random_regret"] / 5


def test_federated_protocol(out: dict[str, float]) -> None:
    assert 0 < out["cumulative_regret"] < out["isolated_regret"] < out["random_regret"]  # sharing helps
    assert out["uploads"] > 0 and out["downloads"] > 0
    assert out["comm_messages"] == out["uploads"] + out["downloads"]


def test_new_protocol(out: dict[str, float]) -> None:
    assert 0 < out["cumulative_regret"] < out["isolated_regret"]
    # each of the 12 synchronisations: an upload from every client that acted since the last one, 10 downloads
    assert 12 * 10 < out["comm_messages"] <= 12 * 2 * 10


def test_early_stopping_callback(out: dict[str, float]) -> None:
    assert 0 <= out["stopped_round"] < out["max_rounds"] - 1  # it fired, before the last round
    assert out["rounds_run"] == out["stopped_round"] + 1
    assert 0 < out["best_val_rmse"] <= 0.315  # stopped by reaching the target (ratings are r / 5)


def test_custom_aggregator(out: dict[str, float]) -> None:
    assert out["vote_test_rmse"] != out["fedsgd_test_rmse"]  # same seed, weights and split: the aggregator differs
    assert out["vote_test_rmse"] < 0.34  # the vote trains (the untrained model's test RMSE is 0.354)


def test_robust_aggregation(out: dict[str, float]) -> None:
    for rule in ("median", "trimmed", "krum", "multi_krum"):  # 8 far-away attackers of 40: the mean moves, they do not
        assert out[f"{rule}_error"] < 0.2 < 10 < out["mean_error"]
    assert out["norm_bounded_error"] < out["mean_error"] / 10
    for server in ("fedavg", "fedavgm", "fedadam", "fedyogi"):
        assert out[f"{server}_loss"] < out["initial_loss"] / 10


def test_budget_schedule(out: dict[str, float]) -> None:
    assert out["epsilon_total"] == 5
    assert 0 < out["epsilon_spent"] <= out["epsilon_total"]
    assert out["first_budget"] > out["last_budget"] > 0  # the geometric schedule spends most early


def test_an_example_without_its_dataset_ends_with_the_clis_error(tmp_path: Path) -> None:
    """The examples look for data where the CLI does (``FEDREC_DATA_DIR``, else ``data/``) and end as it does."""
    env = {**os.environ, "FEDREC_DATA_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "examples/custom_aggregator.py", "--rounds", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: dataset file not found: {tmp_path / 'ml-100k' / 'u.data'}")
    assert "Traceback" not in done.stderr
