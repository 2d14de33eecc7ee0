"""The new option files of the aggregator and attack groups (geometric median, Bulyan, centered clipping; A Little
Is Enough, min-max) compose and run a short FedGNN run on synthetic ratings through the CLI (60 clients, 3 of them
malicious)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedrec.app.cli import run

QUICK = ("task.rounds=2", "data.users=300", "data.items=120", "data.ratings=6000", "data.num_clients=60",
         "task.pseudo_items=20", "plots=false", "logger.tensorboard=false")

#: each new option of the two groups, in three runs
RUNS = [
    ("aggregator=geometric_median", "attack=alie"),
    ("aggregator=bulyan", "aggregator.f=3", "attack=min_max"),
    ("aggregator=centered_clipping", "aggregator.center=median", "attack=min_max", "attack.knowledge=all",
     "privacy=gaussian"),
]


@pytest.mark.parametrize("overrides", RUNS, ids=lambda o: o[0].split("=")[1])
def test_each_new_option_runs(compose_cfg, tmp_path: Path, overrides: tuple[str, ...]) -> None:
    cfg = compose_cfg("+experiment=fedgnn_synthetic", *QUICK, *overrides)
    summary = run(cfg, output_dir=tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["rounds_run"] == 2 and summary["final_test_rmse"] > 0
    assert summary["aggregator"] == cfg.aggregator._target_.rsplit(".", 1)[1]
    assert summary["attack"] == cfg.attack._target_.rsplit(".", 1)[1] and summary["malicious_clients"] == 3
    assert summary["final_test_benign_rmse"] > 0
